"""`make bench`: run every benchmarks/bench_*.py in turn and print what each prints.

Each benchmark runs as its own process with this Python, so one benchmark's imports and memory never
colour the next one's figures. A benchmark may declare an optional anchor at module level, read here
with ``ast`` (without importing the benchmark):

    ANCHOR = {"name": "mergekit 0.1.5", "check": ".venv-mergekit/bin/mergekit-yaml",
              "setup": "setup_mergekit.sh", "skip_flag": "--skip-mergekit"}

``check`` is a path relative to benchmarks/ that exists once the anchor is installed; when it is
missing, ``setup`` (a script in benchmarks/) installs it, or with ``--no-setup`` the benchmark runs
with ``skip_flag`` and the command that would set the anchor up is printed.

    python benchmarks/run.py [--quick] [--only graft] [--no-setup]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def read_anchor(script: Path) -> dict | None:
    """The literal ``ANCHOR = {...}`` assigned at the top level of `script`, or None."""
    tree = ast.parse(script.read_text(), filename=str(script))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "ANCHOR"):
            anchor = ast.literal_eval(node.value)
            missing = {"name", "check", "setup", "skip_flag"} - set(anchor)
            if missing:
                raise ValueError(f"{script}: ANCHOR lacks {sorted(missing)}")
            return anchor
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    ap.add_argument("--only", action="append", default=[],
                    help="run bench_NAME.py only (repeatable)")
    ap.add_argument("--no-setup", action="store_true",
                    help="do not install missing anchors; run without them and say how to set them up")
    args = ap.parse_args(argv)

    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        wanted = {f"bench_{n.removeprefix('bench_').removesuffix('.py')}.py" for n in args.only}
        unknown = wanted - {s.name for s in scripts}
        if unknown:
            ap.error(f"no such benchmark(s): {sorted(unknown)}; have {[s.name for s in scripts]}")
        scripts = [s for s in scripts if s.name in wanted]
    if not scripts:
        print(f"no bench_*.py in {HERE}")
        return 0

    failed: list[str] = []
    for script in scripts:
        extra: list[str] = ["--quick"] if args.quick else []
        anchor = read_anchor(script)
        print(f"\n=== {script.name} ===", flush=True)
        if anchor is not None and not (HERE / anchor["check"]).exists():
            setup = HERE / anchor["setup"]
            if args.no_setup:
                print(f"anchor {anchor['name']} is not installed; running without it "
                      f"({anchor['skip_flag']}). To compare: bash {setup}", flush=True)
                extra.append(anchor["skip_flag"])
            else:
                print(f"anchor {anchor['name']} is not installed; setting it up: bash {setup}", flush=True)
                res = subprocess.run(["bash", str(setup)])
                if res.returncode != 0:
                    # the figures still print, but a benchmark without its anchor has no ratio: it fails
                    print(f"setting up {anchor['name']} failed (status {res.returncode}); running "
                          f"{script.name} without it, and counting it as failed", flush=True)
                    extra.append(anchor["skip_flag"])
                    failed.append(f"{script.name} (anchor {anchor['name']} could not be set up)")
        start = time.perf_counter()
        res = subprocess.run([sys.executable, str(script), *extra])
        took = time.perf_counter() - start
        print(f"=== {script.name}: {'ok' if res.returncode == 0 else f'FAILED (status {res.returncode})'}"
              f" in {took:.0f} s ===", flush=True)
        if res.returncode != 0:
            failed.append(script.name)

    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
