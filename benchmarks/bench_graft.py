"""graftkit graft / delta against mergekit 0.1.5 on a synthetic Llama pair, side by side.

The anchor: mergekit 0.1.5 expresses "attention and MLP from RL, everything else from base" as a
``linear`` merge with per-tensor 0/1 weights chosen by ``filter:`` substrings (base_model set; the
first matching filter wins). With ``normalize: false`` the result is 1·x + 0·y, exactly the chosen
tensor (mergekit computes it in fp32 and casts back to bf16, which is lossless for a bf16 input).

What runs, alternating the tools on each repetition after warming the page cache:

- ``mergekit-yaml graft.yaml OUT`` (from benchmarks/.venv-mergekit; ``bash
  benchmarks/setup_mergekit.sh`` sets it up);
- ``graftkit graft --base BASE --from RL --groups attn,mlp --out OUT --force``;
- ``graftkit delta --base BASE --from RL --json``;
- graftkit graft and delta again on a pair with fewer layers, to show that anonymous memory does not
  grow with model size.

Then every tensor of graftkit's output is compared bit for bit with mergekit's, and both with an
independent reference (the RL tensor where the name contains ``self_attn`` or ``mlp``, the base tensor
otherwise), and with the inputs' tensor list (a tool that drops a tensor is reported).

The pair (benchmarks/synth.py defaults: hidden 2048, 16 layers, vocab 32000, intermediate 5632,
16 heads, no GQA, bf16, untied lm_head) is 1.91 GB per model. mergekit's default output shard (5B
parameters) holds the whole merged model in memory before writing; with ``--out-shard-size 500M``
its peak RSS drops from ≈3.6 GB to ≈2.5 GB. The anchor keeps the default, as users run it.

Targets (ratios graftkit / mergekit in the same run): graft wall ≤ 0.2× (min over runs), graft peak
RSS ≤ 0.5× (median), delta wall ≤ 0.3× of mergekit's graft wall (min). The table and a JSON record
(benchmarks/.work/graft_results.json) are the output. Exit status 1 when a tool fails or an output is
wrong; a missed speed target is reported, not failed (benchmarks are not tests).

    python benchmarks/bench_graft.py [--quick] [--layers 16] [--skip-mergekit] [--stand-in]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from measure import Measurement, gb, run_measured, summarize, warm_page_cache  # noqa: E402
from synth import PairSpec, make_pair_from_spec  # noqa: E402

# Read by benchmarks/run.py (with ast, without importing this module): the optional anchor.
ANCHOR = {
    "name": "mergekit 0.1.5",
    "check": ".venv-mergekit/bin/mergekit-yaml",
    "setup": "setup_mergekit.sh",
    "skip_flag": "--skip-mergekit",
}

WORK = HERE / ".work"
MERGEKIT_YAML_EXE = HERE / ".venv-mergekit" / "bin" / "mergekit-yaml"
GRAFTKIT_EXE = REPO / ".venv" / "bin" / "graftkit"
GROUPS = "attn,mlp"
# The same choice as mergekit filters and as the reference: substrings of Llama tensor names that
# graftkit's taxonomy puts in the attn and mlp groups (weights/architectures/llama.json).
FROM_RL_SUBSTRINGS = ("self_attn", "mlp")
# mergekit options: CPU, no tokenizer (the synthetic pair has none), its own low-memory loader,
# no progress bars. Output shard size left at its default (5B parameters), as users run it.
MERGEKIT_FLAGS = ["--no-copy-tokenizer", "--lazy-unpickle", "--device", "cpu", "--quiet"]
TARGETS = {
    "graft_wall_min": 0.2,
    "graft_peak_rss_median": 0.5,
    "delta_wall_min_vs_mergekit_graft": 0.3,
}
# Anonymous memory of the larger pair over the smaller one; the models differ ≈1.8× in size.
ANON_GROWTH_LIMIT = 1.25
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


def mergekit_yaml(base: Path, rl: Path) -> str:
    """The linear merge that is a graft of attention and MLP from `rl` onto `base`."""
    def weights(rl_side: bool) -> str:
        chosen, other = (1, 0) if rl_side else (0, 1)
        lines = [f"        - filter: {s}\n          value: {chosen}\n" for s in FROM_RL_SUBSTRINGS]
        return "".join(lines) + f"        - value: {other}\n"

    return (
        "merge_method: linear\n"
        f"base_model: {base}\n"
        "models:\n"
        f"  - model: {base}\n    parameters:\n      weight:\n{weights(False)}"
        f"  - model: {rl}\n    parameters:\n      weight:\n{weights(True)}"
        "parameters:\n  normalize: false\n"
        "dtype: bfloat16\n"
    )


# ---------------------------------------------------------------------------------------- commands

@dataclasses.dataclass(frozen=True)
class Tool:
    """One measured command: a name, and how to build its argv for a pair and an output folder."""

    name: str
    argv: list[str]
    out: Path | None  # folder the command writes, removed (untimed) before each run


def tools_for(args, base: Path, rl: Path, tag: str, yaml_path: Path | None) -> dict[str, Tool]:
    out = WORK / "out"
    tools: dict[str, Tool] = {}
    if yaml_path is not None:
        tools["mergekit graft"] = Tool(
            "mergekit graft",
            [str(MERGEKIT_YAML_EXE), str(yaml_path), str(out / f"mergekit-{tag}"), *MERGEKIT_FLAGS],
            out / f"mergekit-{tag}")
    g_out = out / f"graftkit-{tag}"
    if args.stand_in:
        # Harness self-test without graftkit: a copy of RL (so the identity check must fail on every
        # base-side tensor) and a read of both inputs.
        tools["graftkit graft"] = Tool("graftkit graft", ["cp", "-r", str(rl), str(g_out)], g_out)
        tools["graftkit delta"] = Tool(
            "graftkit delta", ["bash", "-c", f'cat "{base}"/* "{rl}"/* > /dev/null; echo {{}}'], None)
    else:
        exe = str(args.graftkit)
        tools["graftkit graft"] = Tool(
            "graftkit graft",
            [exe, "graft", "--base", str(base), "--from", str(rl), "--groups", GROUPS,
             "--out", str(g_out), "--force"], g_out)
        tools["graftkit delta"] = Tool(
            "graftkit delta", [exe, "delta", "--base", str(base), "--from", str(rl), "--json"], None)
    return tools


class ToolFailed(RuntimeError):
    """A measured command exited non-zero (the message holds its command and stderr tail)."""


def run_tool(tool: Tool) -> Measurement:
    if tool.out is not None:
        shutil.rmtree(tool.out, ignore_errors=True)
    # Flush the previous run's dirty pages so that writeback does not land in this run's time.
    os.sync()
    m = run_measured(tool.argv, env=ENV, cwd=REPO)
    try:
        return m.check(f"{tool.name} ({' '.join(tool.argv)})")
    except RuntimeError as e:
        raise ToolFailed(str(e)) from None


def run_alternating(tools: list[Tool], repeats: int, log) -> dict[str, list[Measurement]]:
    """Run each tool `repeats` times, alternating the order each round (A B C, C B A, ...)."""
    runs: dict[str, list[Measurement]] = {t.name: [] for t in tools}
    for r in range(repeats):
        order = tools if r % 2 == 0 else tools[::-1]
        for t in order:
            m = run_tool(t)
            runs[t.name].append(m)
            log(f"  [{r + 1}/{repeats}] {t.name:<16} {m.wall_s:7.2f} s  rss {gb(m.peak_rss_bytes)}"
                f"  anon {gb(m.peak_anon_bytes)}")
    return runs


# ------------------------------------------------------------------------------- output comparison
# safetensors is read directly here, not through graftkit's weights/: this check must stay independent
# of the code under test.

class Checkpoint:
    """Lazy tensor access to an HF folder (sharded with an index, or one model.safetensors)."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{folder}: no model.safetensors.index.json and no *.safetensors")
            weight_map = None
        self._handles = {f: safe_open(str(folder / f), framework="pt") for f in files}
        if weight_map is None:
            weight_map = {k: f for f, h in self._handles.items() for k in h.keys()}
        self.weight_map: dict[str, str] = weight_map

    def names(self) -> set[str]:
        return set(self.weight_map)

    def get(self, name: str):
        return self._handles[self.weight_map[name]].get_tensor(name)


def _same_bits(a, b) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def _describe(t) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def compare_outputs(base: Path, rl: Path, outputs: dict[str, Path], max_listed: int = 5) -> dict:
    """Bit-for-bit comparison of each output with the reference graft, and of the outputs pairwise."""
    b, r = Checkpoint(base), Checkpoint(rl)
    inputs = b.names()
    if r.names() != inputs:
        raise ValueError(f"{base} and {rl} hold different tensor names: {sorted(inputs ^ r.names())[:5]}")
    outs = {k: Checkpoint(p) for k, p in outputs.items()}
    report: dict = {"tensors_in_input": len(inputs), "outputs": {}, "pairwise": {}}
    for k, ck in outs.items():
        names = ck.names()
        wrong = []
        for name in sorted(inputs & names):
            src = r if any(s in name for s in FROM_RL_SUBSTRINGS) else b
            want, got = src.get(name), ck.get(name)
            if not _same_bits(want, got):
                wrong.append(f"{name} (want {_describe(want)} from {'rl' if src is r else 'base'},"
                             f" got {_describe(got)})")
        report["outputs"][k] = {
            "folder": str(outputs[k]),
            "tensors": len(names),
            "dropped": sorted(inputs - names),
            "extra": sorted(names - inputs),
            "wrong_vs_reference": len(wrong),
            "first_wrong": wrong[:max_listed],
            "matches_reference": not wrong and names == inputs,
        }
    keys = list(outs)
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            x, y = outs[keys[i]], outs[keys[j]]
            common = sorted(x.names() & y.names())
            differing = [n for n in common if not _same_bits(x.get(n), y.get(n))]
            report["pairwise"][f"{keys[i]} vs {keys[j]}"] = {
                "identical": not differing and x.names() == y.names(),
                "compared": len(common),
                "only_in_first": sorted(x.names() - y.names())[:max_listed],
                "only_in_second": sorted(y.names() - x.names())[:max_listed],
                "differing": len(differing),
                "first_differing": differing[:max_listed],
            }
    return report


# ----------------------------------------------------------------------------------------- report

def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _versions() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count()}
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["git_commit"] = None
    import importlib.metadata as md

    for pkg in ("graftkit", "torch", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    py = HERE / ".venv-mergekit" / "bin" / "python"
    if py.exists():
        res = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('mergekit'),"
                              " m.version('transformers'))"], capture_output=True, text=True)
        if res.returncode == 0:
            out["mergekit"], out["mergekit_transformers"] = res.stdout.split()
    return out


def _row(name: str, s) -> str:
    return (f"{name:<22} {s.wall_s.min:8.2f} {s.wall_s.median:8.2f} {s.cpu_s.min:8.2f} "
            f"{s.peak_rss_bytes.median / 1e9:9.2f} {s.peak_anon_bytes.median / 1e9:9.2f}")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except ToolFailed as e:
        print(f"\nFAILED: {e}", flush=True)
        return 1


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one run per tool instead of --repeats")
    ap.add_argument("--repeats", type=int, default=3, help="runs per tool (alternating); default 3")
    ap.add_argument("--layers", type=int, default=PairSpec.layers, help="layers of the main pair")
    ap.add_argument("--hidden", type=int, default=PairSpec.hidden)
    ap.add_argument("--intermediate", type=int, default=PairSpec.intermediate)
    ap.add_argument("--vocab", type=int, default=PairSpec.vocab)
    ap.add_argument("--small-layers", type=int, default=8,
                    help="layers of the smaller pair for the memory-growth check (0: skip it)")
    ap.add_argument("--skip-mergekit", action="store_true", help="measure graftkit alone")
    ap.add_argument("--graftkit", type=Path, default=GRAFTKIT_EXE, help="graftkit executable")
    ap.add_argument("--stand-in", action="store_true",
                    help="harness self-test: `cp -r RL OUT` and `cat` in place of graftkit")
    ap.add_argument("--results", type=Path, default=WORK / "graft_results.json")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        ap.error("--repeats must be ≥ 1")

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not args.skip_mergekit and not MERGEKIT_YAML_EXE.exists():
        log(f"mergekit anchor missing: {MERGEKIT_YAML_EXE}\n"
            f"  set it up with: bash {HERE / 'setup_mergekit.sh'}   (or pass --skip-mergekit)")
        return 2
    if not args.stand_in and not args.graftkit.exists():
        log(f"graftkit executable missing: {args.graftkit}\n  run `make setup` (or pass --graftkit"
            " PATH, or --stand-in to test the harness alone)")
        return 2

    WORK.mkdir(parents=True, exist_ok=True)
    spec = PairSpec(layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
                    vocab=args.vocab)
    base, rl = make_pair_from_spec(WORK / spec.default_dir_name(), spec)
    pairs = {"main": (spec, base, rl)}
    if args.small_layers:
        small = dataclasses.replace(spec, layers=args.small_layers)
        pairs["small"] = (small, *make_pair_from_spec(WORK / small.default_dir_name(), small))

    yaml_path = None
    yaml_text = None
    if not args.skip_mergekit:
        yaml_text = mergekit_yaml(base, rl)
        yaml_path = WORK / "mergekit_graft.yaml"
        yaml_path.write_text(yaml_text)

    t0 = time.perf_counter()
    warmed = warm_page_cache([p for _, b_, r_ in pairs.values() for p in (b_, r_)])
    log(f"page cache warmed: {gb(warmed)} in {time.perf_counter() - t0:.1f} s")

    main_tools = tools_for(args, base, rl, f"L{spec.layers}", yaml_path)
    log(f"main pair: {spec.layers} layers, {gb(spec.model_bytes())} per model; {repeats} run(s) each")
    runs = run_alternating(list(main_tools.values()), repeats, log)
    summaries = {k: summarize(v) for k, v in runs.items()}

    small_summaries = {}
    if "small" in pairs:
        sspec, sbase, srl = pairs["small"]
        small_tools = tools_for(args, sbase, srl, f"L{sspec.layers}", None)
        log(f"small pair: {sspec.layers} layers, {gb(sspec.model_bytes())} per model")
        small_runs = run_alternating(list(small_tools.values()), repeats, log)
        small_summaries = {k: summarize(v) for k, v in small_runs.items()}
        # Not compared (the main pair's output is): free the disk.
        if small_tools["graftkit graft"].out is not None:
            shutil.rmtree(small_tools["graftkit graft"].out, ignore_errors=True)

    delta_json_ok = _parses_as_json(runs["graftkit delta"][-1].stdout)

    log("comparing outputs tensor by tensor ...")
    outputs = {"graftkit": main_tools["graftkit graft"].out}
    if "mergekit graft" in main_tools:
        outputs["mergekit"] = main_tools["mergekit graft"].out
    identity = compare_outputs(base, rl, outputs)

    # ------------------------------------------------------------------ table
    log("")
    log(f"{'main pair (L' + str(spec.layers) + ')':<22} {'wall min':>8} {'wall med':>8} {'cpu min':>8} "
        f"{'RSS GB':>9} {'anon GB':>9}   (memory: median of peaks)")
    for k, s in summaries.items():
        log(_row(k, s))
    if small_summaries:
        log(f"{'small pair (L' + str(pairs['small'][0].layers) + ')':<22}")
        for k, s in small_summaries.items():
            log(_row(k, s))

    ratios: dict[str, dict] = {}
    if "mergekit graft" in summaries:
        mk, g, d = summaries["mergekit graft"], summaries["graftkit graft"], summaries["graftkit delta"]
        measured = {
            "graft_wall_min": _ratio(g.wall_s.min, mk.wall_s.min),
            "graft_peak_rss_median": _ratio(g.peak_rss_bytes.median, mk.peak_rss_bytes.median),
            "delta_wall_min_vs_mergekit_graft": _ratio(d.wall_s.min, mk.wall_s.min),
        }
        log("")
        log("ratio graftkit / mergekit               measured   target")
        for k, v in measured.items():
            ok = v <= TARGETS[k]
            ratios[k] = {"ratio": v, "target": TARGETS[k], "met": ok}
            log(f"  {k:<36} {v:7.3f}×  ≤ {TARGETS[k]:.1f}×  {'met' if ok else 'MISSED'}")
        log(f"  (graft wall median {_ratio(g.wall_s.median, mk.wall_s.median):.3f}×, graft CPU min "
            f"{_ratio(g.cpu_s.min, mk.cpu_s.min):.3f}×, delta CPU min / mergekit graft CPU min "
            f"{_ratio(d.cpu_s.min, mk.cpu_s.min):.3f}×: CPU seconds suffer less from other load)")

    growth = {}
    if small_summaries:
        log("")
        log(f"peak anon, L{pairs['small'][0].layers} → L{spec.layers} "
            f"(models {_ratio(spec.model_bytes(), pairs['small'][0].model_bytes()):.2f}× larger)")
        for k in ("graftkit graft", "graftkit delta"):
            small_anon = small_summaries[k].peak_anon_bytes.median
            big_anon = summaries[k].peak_anon_bytes.median
            r = _ratio(big_anon, small_anon)
            flat = r <= ANON_GROWTH_LIMIT
            growth[k] = {"small_anon_bytes": small_anon, "main_anon_bytes": big_anon, "ratio": r,
                         "limit": ANON_GROWTH_LIMIT, "flat": flat}
            log(f"  {k:<16} {gb(small_anon)} → {gb(big_anon)}  ({r:.2f}×, "
                f"{'flat' if flat else 'GROWS'}; limit {ANON_GROWTH_LIMIT}×)")

    log("")
    ok = True
    for k, o in identity["outputs"].items():
        status = "matches the reference graft" if o["matches_reference"] else "DIFFERS from the reference"
        ok &= o["matches_reference"]
        log(f"{k} output: {o['tensors']}/{identity['tensors_in_input']} tensors, {status}"
            + (f"; dropped {o['dropped'][:5]}" if o["dropped"] else "")
            + (f"; extra {o['extra'][:5]}" if o["extra"] else "")
            + (f"; first wrong: {o['first_wrong']}" if o["first_wrong"] else ""))
    for k, p in identity["pairwise"].items():
        ok &= p["identical"]
        log(f"{k}: {'bit-identical' if p['identical'] else 'NOT identical'} over {p['compared']} tensors"
            + (f"; first differing: {p['first_differing']}" if p["first_differing"] else "")
            + (f"; only in first: {p['only_in_first']}" if p["only_in_first"] else "")
            + (f"; only in second: {p['only_in_second']}" if p["only_in_second"] else ""))
    if not delta_json_ok:
        log("graftkit delta --json: stdout is NOT valid JSON")
        ok = False

    record = {
        "benchmark": "graft",
        "stand_in": args.stand_in,
        "repeats": repeats,
        "pairs": {k: {"spec": dataclasses.asdict(v[0]), "model_bytes": v[0].model_bytes(),
                      "base": str(v[1]), "rl": str(v[2])} for k, v in pairs.items()},
        "commands": {k: t.argv for k, t in main_tools.items()},
        "mergekit_yaml": yaml_text,
        "main": {k: s.to_dict() for k, s in summaries.items()},
        "small": {k: s.to_dict() for k, s in small_summaries.items()},
        "ratios": ratios,
        "anon_growth": growth,
        "identity": identity,
        "delta_json_ok": delta_json_ok,
        "versions": _versions(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2) + "\n")
    log(f"\nresults: {args.results}")
    return 0 if ok else 1


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
