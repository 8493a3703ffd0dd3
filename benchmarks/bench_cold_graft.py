"""The first graftkit graft of a pair (empty fingerprint cache) against a repeat one and against ``cp``.

graftkit records each parent's content fingerprint in the output's ``graftkit.json``, and caches each
file's digest under ``$GRAFTKIT_CACHE`` keyed by path, size, inode and modification time. The first
("cold") graft of a pair hashes every input byte; a repeat ("warm") graft finds the digests cached.
This measures what the cold run costs over the warm one, and both against copying one model, the floor
for writing a model-sized folder on this disk. All three run in one process, alternating, so that
drift of the disk's speed spreads over all of them.

What runs: before every run, untimed, the command's output folder is removed, both inputs are read into
the page cache and ``os.sync()`` is called; after it, its output is dropped from the page cache (three
model-sized outputs and the two inputs do not fit in memory together: without this, the inputs were
partly evicted and later runs read them from disk; this machine also pages out memory left untouched for
a while, page cache included, hence the reading before every run). The order is rotated on every repetition (A B C,
B C A, C A B, ...), so that each command takes each place equally often and none runs twice in a row (a
command that deletes the output it wrote just before and writes it again ran up to 2.4× slower on this
virtual disk, whichever command it was; the untimed graft that fills the warm cache writes into the warm
command's folder for the same reason). Python writes and reuses compiled bytecode, as an installed
graftkit does:

- ``cp``: ``bash -c 'cp -r BASE OUT && sync'``;
- ``graft cold``: ``graftkit graft --base BASE --from RL --groups attn,mlp --out OUT --force`` with
  ``GRAFTKIT_CACHE`` a fresh empty folder on every run;
- ``graft warm``: the same command with ``GRAFTKIT_CACHE`` a folder that one untimed graft of the same
  pair filled before the loop.

The pair is benchmarks/synth.py's at the Llama-3.2-3B shape (hidden 3072, 28 layers, vocab 128256,
intermediate 8192, 24 heads, 8 KV heads, bf16, untied lm_head): 7.21 GB per model; ``--quick`` takes
4 layers (2.38 GB per model; the embeddings and lm_head are 1.58 GB of it) and one repetition. The run
needs free disk for both models (unless already written) and three outputs, and refuses to start
without it.

Ratios are medians of the ratios paired within each repetition (so a slow spell that hits one
repetition hits both sides of its ratio); ratios of the minima are printed beside them. Targets:
cold / warm ≤ 1.3, cold / cp ≤ 1.5, warm / cp ≤ 1.0. Checked after the loop: the last cold and the
last warm output hold byte-identical weight files, and their ``graftkit.json`` record the same
non-empty fingerprint for each parent. The table and a JSON record
(benchmarks/.work/cold_graft_results.json) are the output. Exit status 1 when a command fails or an
output is wrong, 2 when the run cannot start (no graftkit, not enough disk); a missed target is
reported, not failed (benchmarks are not tests).

    python benchmarks/bench_cold_graft.py [--quick] [--layers 28] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from measure import Measurement, evict_page_cache, gb, run_measured, summarize, warm_page_cache  # noqa: E402
from synth import INDEX, PairSpec, _is_complete, make_pair_from_spec  # noqa: E402

WORK = HERE / ".work"
GRAFTKIT_EXE = REPO / ".venv" / "bin" / "graftkit"
GROUPS = "attn,mlp"
LLAMA_3B = PairSpec(hidden=3072, layers=28, vocab=128256, intermediate=8192, heads=24, kv_heads=8,
                    dtype="bfloat16")
QUICK_LAYERS = 4
CP, COLD, WARM = "cp", "graft cold", "graft warm"
# ratio name → (numerator tool, denominator tool)
RATIOS = {"cold/warm": (COLD, WARM), "cold/cp": (COLD, CP), "warm/cp": (WARM, CP)}
TARGETS = {"cold/warm": 1.3, "cold/cp": 1.5, "warm/cp": 1.0}
OUTPUTS = 3  # cp, the last cold and the last warm output exist at once
# graftkit does not cache the digest of a file modified in its last 2 s (weights/fingerprint.py); the
# fill run must see settled inputs, or the warm cache stays empty.
SETTLE_S = 2.5
# Python writes and reuses compiled bytecode, as on an installed graftkit (pip compiles it at install), so
# that startup compiling graftkit's modules afresh on every run is not timed.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}
_CHUNK = 16 << 20


# ------------------------------------------------------------------------------------ pure parts

def paired_ratios(runs: Mapping[str, Sequence[Measurement]]) -> dict[str, dict]:
    """Each ratio of `RATIOS` over wall time: the ratio within each repetition, their median, and
    min(numerator) / min(denominator) for reference. Repetition i of every tool is ``runs[tool][i]``."""
    lengths = {len(runs[t]) for pair in RATIOS.values() for t in pair}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"paired_ratios() needs the same number (≥ 1) of runs per tool, got "
                         f"{ {t: len(v) for t, v in runs.items()} }")
    out = {}
    for name, (num, den) in RATIOS.items():
        paired = [_ratio(a.wall_s, b.wall_s) for a, b in zip(runs[num], runs[den])]
        out[name] = {
            "numerator": num,
            "denominator": den,
            "paired": paired,
            "median_paired": statistics.median(paired),
            "min_based": _ratio(min(m.wall_s for m in runs[num]), min(m.wall_s for m in runs[den])),
        }
    return out


def verdicts(ratios: Mapping[str, float], targets: Mapping[str, float] = TARGETS) -> dict[str, dict]:
    """For each target, whether its ratio is at most the target (a NaN ratio misses it)."""
    missing = sorted(set(targets) - set(ratios))
    if missing:
        raise ValueError(f"verdicts(): no ratio for target(s) {missing}; ratios given: {sorted(ratios)}")
    return {k: {"ratio": ratios[k], "target": t, "met": bool(ratios[k] <= t)} for k, t in targets.items()}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _weight_files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted(folder.iterdir())
            if p.is_file() and (p.name.endswith(".safetensors") or p.name == INDEX)}


def _first_difference(a: Path, b: Path) -> int | None:
    """Offset of the first byte where two files differ (the shorter one's end counts), or None."""
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        offset = 0
        while True:
            x, y = fa.read(_CHUNK), fb.read(_CHUNK)
            if x != y:
                lo, hi = 0, min(len(x), len(y))  # invariant: x[:lo] == y[:lo]
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if x[lo:mid] == y[lo:mid]:
                        lo = mid
                    else:
                        hi = mid - 1
                return offset + lo
            if not x:
                return None
            offset += len(x)


def _parent_fingerprints(folder: Path, label: str, problems: list[str]) -> dict[str, str]:
    path = folder / "graftkit.json"
    try:
        parents = json.loads(path.read_text())["parents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        problems.append(f"{label}: cannot read parents from {path} ({type(e).__name__}: {e})")
        return {}
    found: dict[str, str] = {}
    for role in ("base", "rl"):
        entries = [p for p in parents if isinstance(p, dict) and p.get("role") == role]
        if len(entries) != 1:
            problems.append(f"{label}: {path} lists {len(entries)} parents with role {role!r}, expected 1")
            continue
        value = entries[0].get("fingerprint", entries[0].get("sha256"))
        if not isinstance(value, str) or not value:
            problems.append(f"{label}: {path} records no fingerprint for parent {role!r} "
                            f"(neither 'fingerprint' nor 'sha256' is a non-empty string: {value!r})")
            continue
        found[role] = value
    return found


def check_outputs(cold_out: Path, warm_out: Path) -> list[str]:
    """What is wrong between a cold and a warm graft output (empty: nothing): their weight files
    (``*.safetensors`` and the index) must be byte-identical, and their ``graftkit.json`` must record
    the same non-empty fingerprint for the base and for the RL parent."""
    cold_out, warm_out = Path(cold_out), Path(warm_out)
    problems: list[str] = []
    for label, folder in (("cold", cold_out), ("warm", warm_out)):
        if not folder.is_dir():
            problems.append(f"{label}: output folder {folder} is missing")
    if problems:
        return problems
    cold_w, warm_w = _weight_files(cold_out), _weight_files(warm_out)
    if not cold_w:
        problems.append(f"cold: {cold_out} holds no weight files")
    if set(cold_w) != set(warm_w):
        problems.append(f"weight files differ by name: only in cold {sorted(set(cold_w) - set(warm_w))}, "
                        f"only in warm {sorted(set(warm_w) - set(cold_w))}")
    for name in sorted(set(cold_w) & set(warm_w)):
        at = _first_difference(cold_w[name], warm_w[name])
        if at is not None:
            problems.append(f"weight file {name}: cold and warm outputs differ from byte {at} "
                            f"(sizes {cold_w[name].stat().st_size} and {warm_w[name].stat().st_size})")
    cold_fp = _parent_fingerprints(cold_out, "cold", problems)
    warm_fp = _parent_fingerprints(warm_out, "warm", problems)
    for role in ("base", "rl"):
        if role in cold_fp and role in warm_fp and cold_fp[role] != warm_fp[role]:
            problems.append(f"parent {role!r} fingerprint differs: "
                            f"cold {cold_fp[role]} vs warm {warm_fp[role]}")
    return problems


def disk_needed(spec: PairSpec, pair_written: bool) -> int:
    """Bytes of free disk a run needs: the two models unless already written, and `OUTPUTS` outputs,
    each a model's tensor bytes plus 2% and 64 MB for headers, configs and the file system."""
    one = int(spec.model_bytes() * 1.02) + 64_000_000
    return (0 if pair_written else 2 * one) + OUTPUTS * one


# ---------------------------------------------------------------------------------------- commands

@dataclasses.dataclass(frozen=True)
class Tool:
    """One measured command: its argv, the folder it writes (removed, untimed, before each run), its
    GRAFTKIT_CACHE: a folder, "fresh" (a new empty folder per run), or None (left unset), and the inputs
    it reads (read into the page cache, untimed, before each run)."""

    name: str
    argv: list[str]
    out: Path
    cache: Path | str | None = None
    inputs: tuple[Path, ...] = ()


class ToolFailed(RuntimeError):
    """A measured command exited non-zero (the message holds its command and stderr tail)."""


def run_tool(tool: Tool, scratch: Path) -> Measurement:
    """One timed run of ``tool``, from the same state each time: its output removed, its inputs in the page
    cache, no dirty pages; afterwards its output is dropped from the page cache (:func:`evict_page_cache`),
    so that outputs never push the inputs out of memory."""
    shutil.rmtree(tool.out, ignore_errors=True)
    warm_page_cache(tool.inputs)
    env = {k: v for k, v in ENV.items() if k != "GRAFTKIT_CACHE"}
    fresh = None
    if tool.cache == "fresh":
        scratch.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix="cache-cold-", dir=scratch))
        env["GRAFTKIT_CACHE"] = str(fresh)
    elif tool.cache is not None:
        env["GRAFTKIT_CACHE"] = str(tool.cache)
    # Flush the previous run's dirty pages so that writeback does not land in this run's time.
    os.sync()
    try:
        m = run_measured(tool.argv, env=env, cwd=REPO)
    finally:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        evict_page_cache([tool.out])
    try:
        return m.check(f"{tool.name} ({' '.join(tool.argv)})")
    except RuntimeError as e:
        raise ToolFailed(str(e)) from None


def rotation(tools: Sequence, r: int) -> list:
    """The order of repetition ``r``: ``tools`` rotated by r (A B C, B C A, C A B, ...), so that no tool runs
    twice in a row and over len(tools) repetitions each takes each place once."""
    k = r % len(tools)
    return list(tools[k:]) + list(tools[:k])


def run_alternating(tools: list[Tool], repeats: int, scratch: Path, log) -> dict[str, list[Measurement]]:
    """Run each tool `repeats` times in a rotated order each round (:func:`rotation`)."""
    runs: dict[str, list[Measurement]] = {t.name: [] for t in tools}
    for r in range(repeats):
        for t in rotation(tools, r):
            m = run_tool(t, scratch)
            runs[t.name].append(m)
            log(f"  [{r + 1}/{repeats}] {t.name:<11} {m.wall_s:7.2f} s  rss {gb(m.peak_rss_bytes)}")
    return runs


def _graft_argv(exe: Path, base: Path, rl: Path, out: Path) -> list[str]:
    return [str(exe), "graft", "--base", str(base), "--from", str(rl), "--groups", GROUPS,
            "--out", str(out), "--force"]


def _wait_until_settled(folders: Sequence[Path]) -> float:
    """Sleep until every file under `folders` was last modified `SETTLE_S` ago; return seconds slept."""
    newest = max(p.stat().st_mtime for d in folders for p in d.rglob("*") if p.is_file())
    wait = max(0.0, newest + SETTLE_S - time.time())
    time.sleep(wait)
    return wait


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for pkg in ("graftkit", "torch", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


# ------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None, spec: PairSpec | None = None) -> int:
    """Run the benchmark; `spec` replaces the Llama-3.2-3B shape (``--layers`` and ``--quick`` still
    set its layer count)."""
    try:
        return _main(argv, spec)
    except ToolFailed as e:
        print(f"\nFAILED: {e}", flush=True)
        return 1


def _main(argv: list[str] | None, spec: PairSpec | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_LAYERS} layers and one repetition")
    ap.add_argument("--repeats", type=int, default=3,
                    help="repetitions, each in a rotated order (a multiple of 3 balances the places); default 3")
    ap.add_argument("--layers", type=int, default=None, help="layers of the pair (default 28)")
    ap.add_argument("--graftkit", type=Path, default=GRAFTKIT_EXE, help="graftkit executable")
    ap.add_argument("--work", type=Path, default=WORK, help="folder for the pair, outputs and caches")
    ap.add_argument("--results", type=Path, default=None,
                    help="JSON record (default WORK/cold_graft_results.json)")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        ap.error("--repeats must be ≥ 1")
    spec = spec or LLAMA_3B
    layers = args.layers if args.layers is not None else (QUICK_LAYERS if args.quick else spec.layers)
    spec = dataclasses.replace(spec, layers=layers)
    work: Path = args.work
    results = args.results or work / "cold_graft_results.json"

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not args.graftkit.exists():
        log(f"graftkit executable missing: {args.graftkit}\n  run `make setup` (or pass --graftkit PATH)")
        return 2

    pair_dir = work / spec.default_dir_name()
    pair_written = _is_complete(pair_dir, spec)
    needed, free = disk_needed(spec, pair_written), _free_bytes(work)
    state = "already written" if pair_written else "to write"
    log(f"pair: {spec.model_bytes() / 1e9:.2f} GB per model ({state}); disk needed {gb(needed)}, "
        f"free {gb(free)} on the file system of {work}")
    if needed > free:
        log(f"not enough free disk: this run needs {gb(needed)} (2 models unless written, {OUTPUTS} "
            f"outputs), {gb(free)} are free on the file system of {work}\n"
            "  free space there, pass --work on a larger disk, or fewer --layers")
        return 2

    work.mkdir(parents=True, exist_ok=True)
    base, rl = make_pair_from_spec(pair_dir, spec)
    out = work / "out-cold-graft"
    caches = work / "caches-cold-graft"
    shutil.rmtree(caches, ignore_errors=True)
    warm_cache = caches / "warm"
    warm_cache.mkdir(parents=True)

    log(f"page cache: read {gb(warm_page_cache([base, rl]))} of inputs")
    slept = _wait_until_settled([base, rl])
    if slept:
        log(f"waited {slept:.1f} s for the inputs to settle (graftkit skips caching newer files)")
    # into the warm command's own folder, which it first deletes two runs later (see the module docstring)
    fill_tool = Tool("warm-cache fill", _graft_argv(args.graftkit, base, rl, out / "warm"), out / "warm",
                     warm_cache, (base, rl))
    fill = run_tool(fill_tool, caches)
    if not any(warm_cache.iterdir()):
        log(f"\nFAILED: the fill graft ({fill.wall_s:.2f} s) left GRAFTKIT_CACHE={warm_cache} empty: "
            "the warm runs would be cold")
        return 1
    log(f"warm cache filled by one untimed graft ({fill.wall_s:.2f} s): "
        f"{', '.join(sorted(p.name for p in warm_cache.iterdir()))}")

    tools = [
        Tool(CP, ["bash", "-c", f'cp -r "{base}" "{out / "cp"}" && sync'], out / "cp", None, (base, rl)),
        Tool(COLD, _graft_argv(args.graftkit, base, rl, out / "cold"), out / "cold", "fresh", (base, rl)),
        Tool(WARM, _graft_argv(args.graftkit, base, rl, out / "warm"), out / "warm", warm_cache, (base, rl)),
    ]
    log(f"{repeats} repetition(s), the order rotated each time:")
    runs = run_alternating(tools, repeats, caches, log)
    summaries = {k: summarize(v) for k, v in runs.items()}
    ratios = paired_ratios(runs)
    verdict = verdicts({k: r["median_paired"] for k, r in ratios.items()})
    problems = check_outputs(out / "cold", out / "warm")

    log("")
    log(f"{'tool':<12} {'wall min':>9} {'wall med':>9} {'cpu min':>8} {'peak RSS med':>13}")
    for k, s in summaries.items():
        log(f"{k:<12} {s.wall_s.min:8.2f}s {s.wall_s.median:8.2f}s {s.cpu_s.min:7.2f}s "
            f"{s.peak_rss_bytes.median / 1e9:10.2f} GB")
    log("")
    log(f"{'ratio':<10} {'median paired':>14} {'min-based':>10}  target")
    for k, r in ratios.items():
        v = verdict[k]
        log(f"{k:<10} {r['median_paired']:13.3f}× {r['min_based']:9.3f}×  ≤ {v['target']:.1f}×  "
            f"{'met' if v['met'] else 'MISSED'}")
    log("")
    if problems:
        log("outputs WRONG (kept in " + str(out) + "):")
        for p in problems:
            log(f"  {p}")
    else:
        log("cold and warm outputs: weight files byte-identical, same parent fingerprints")

    record = {
        "benchmark": "cold_graft",
        "repeats": repeats,
        "spec": dataclasses.asdict(spec),
        "model_bytes": spec.model_bytes(),
        "base": str(base),
        "rl": str(rl),
        "disk": {"needed_bytes": needed, "free_bytes": free, "pair_already_written": pair_written},
        "commands": {t.name: {"argv": t.argv, "graftkit_cache": str(t.cache) if t.cache else None}
                     for t in tools},
        "warm_cache_fill_wall_s": fill.wall_s,
        "summaries": {k: s.to_dict() for k, s in summaries.items()},
        "ratios": ratios,
        "verdicts": verdict,
        "checks": {"passed": not problems, "problems": problems},
        "versions": _versions(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(record, indent=2) + "\n")
    log(f"\nresults: {results}")
    if problems:
        return 1
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(caches, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
