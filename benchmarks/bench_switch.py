"""Switching a loaded model between graft configurations: graftkit in place vs mergekit + from_pretrained.

A graft sweep evaluates many configurations of one base/RL pair. What a user can do today for each
configuration: write the graft with mergekit 0.1.5 (a ``linear`` merge with per-tensor 0/1 weights chosen
by ``filter:`` substrings, the way benchmarks/bench_graft.py invokes it) and load the result with
transformers' ``from_pretrained``. graftkit instead keeps the base loaded and switches it in place
(:class:`graftkit.graft.InPlaceGraft`: restore the tensors the previous configuration moved and the next
one does not, write the ones the next one moves).

Configurations (Llama names; the same choice as graftkit's taxonomy): attn (``self_attn``), mlp
(``mlp``), attn+mlp, embed (``embed_tokens``; the Llama pair has an untied head), attn@late
(``layers.{i}.self_attn`` for the late band i with ⌊3i/L⌋ = 2). For each, in this order:

(a) ``mergekit-yaml`` writes the graft (timed as a process), then ``from_pretrained(dtype=bfloat16)``
    loads it (timed in this process): the anchor's time is the sum;
(b) the in-place session switches the loaded base model to the configuration (timed; the first switch
    into a tensor also verifies it against base and saves its original);

then the two models are compared tensor by tensor, bit for bit (every state_dict entry). The in-place
cycle runs a second time (warm: originals already saved) and its best is reported beside the first.
Target: median over configurations of (a) / (b, first pass) ≥ 20×. Exit status 1 when an output differs
or a tool fails; a missed target is reported, not failed (benchmarks are not tests).

    python benchmarks/bench_switch.py [--quick] [--layers 16] [--skip-mergekit]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from measure import gb, run_measured, warm_page_cache  # noqa: E402
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
MERGEKIT_FLAGS = ["--no-copy-tokenizer", "--lazy-unpickle", "--device", "cpu", "--quiet"]
TARGET = 20.0
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def configurations(n_layers: int) -> dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """label → (graftkit groups, graftkit layers, mergekit filter substrings)."""
    late = [i for i in range(n_layers) if 3 * i // n_layers == 2]
    return {
        "attn": (("attn",), "all", ("self_attn",)),
        "mlp": (("mlp",), "all", ("mlp",)),
        "attn+mlp": (("attn", "mlp"), "all", ("self_attn", "mlp")),
        "embed": (("embed",), "all", ("embed_tokens",)),
        "attn@late": (("attn",), "late", tuple(f"layers.{i}.self_attn" for i in late)),
    }


def mergekit_yaml(base: Path, rl: Path, substrings: tuple[str, ...]) -> str:
    """A linear merge taking the tensors whose names contain one of ``substrings`` from ``rl``."""
    def weights(rl_side: bool) -> str:
        chosen, other = (1, 0) if rl_side else (0, 1)
        lines = [f"        - filter: {s}\n          value: {chosen}\n" for s in substrings]
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


def load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()


def same_model(a, b) -> list[str]:
    """Names of state_dict entries whose bits differ (or that only one model has)."""
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    bad = sorted(set(sa) ^ set(sb))
    for n in sorted(set(sa) & set(sb)):
        x, y = sa[n], sb[n]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
            bad.append(n)
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="accepted for benchmarks/run.py; the run is already one pass")
    ap.add_argument("--layers", type=int, default=PairSpec.layers)
    ap.add_argument("--skip-mergekit", action="store_true", help="time the in-place switches alone")
    ap.add_argument("--results", type=Path, default=WORK / "switch_results.json")
    args = ap.parse_args(argv)
    os.environ.update({k: ENV[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")})

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not args.skip_mergekit and not MERGEKIT_YAML_EXE.exists():
        log(f"mergekit anchor missing: {MERGEKIT_YAML_EXE}\n  set it up with: bash {HERE / 'setup_mergekit.sh'}"
            "   (or pass --skip-mergekit)")
        return 2
    import torch
    from transformers.utils import logging as hf_logging

    from graftkit.graft import GraftSpec, InPlaceGraft, plan_graft
    from graftkit.weights import open_checkpoint

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    WORK.mkdir(parents=True, exist_ok=True)
    spec = PairSpec(layers=args.layers)
    base, rl = make_pair_from_spec(WORK / spec.default_dir_name(), spec)
    warm_page_cache([base, rl])
    log(f"pair: {spec.layers} layers, {gb(spec.model_bytes())} per model (bf16), torch threads {torch.get_num_threads()}")

    t = time.perf_counter()
    model = load(base)
    first_load = time.perf_counter() - t
    log(f"graftkit: base loaded once with from_pretrained in {first_load:.2f} s")
    b_ck, r_ck = open_checkpoint(base), open_checkpoint(rl)
    tax = b_ck.taxonomy()
    configs = configurations(spec.layers)
    plans = {k: plan_graft(tax, GraftSpec(g, lay)) for k, (g, lay, _) in configs.items()}
    rows: dict[str, dict] = {}
    failed = False
    session = InPlaceGraft(model, b_ck, r_ck)
    out = WORK / "out" / "switch-mergekit"
    with session:
        for label, (_, _, substrings) in configs.items():
            row = rows.setdefault(label, {})
            t = time.perf_counter()
            st = session.apply(plans[label])
            row["inplace_first_s"] = time.perf_counter() - t
            row["written_bytes"] = st.bytes
            if args.skip_mergekit:
                log(f"  {label:<10} in place {row['inplace_first_s']:7.3f} s ({gb(st.bytes)} written)")
                continue
            yaml_path = WORK / f"switch-{label.replace('@', '-').replace('+', '-')}.yaml"
            yaml_path.write_text(mergekit_yaml(base, rl, substrings))
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            m = run_measured([str(MERGEKIT_YAML_EXE), str(yaml_path), str(out), *MERGEKIT_FLAGS], env=ENV, cwd=REPO)
            try:
                m.check(f"mergekit-yaml {yaml_path}")
            except RuntimeError as e:
                log(f"FAILED: {e}")
                return 1
            t = time.perf_counter()
            loaded = load(out)
            row["load_s"] = time.perf_counter() - t
            row["mergekit_s"] = m.wall_s
            row["mergekit_peak_rss_gb"] = m.peak_rss_bytes / 1e9
            row["anchor_s"] = m.wall_s + row["load_s"]
            bad = same_model(model, loaded)
            row["identical"] = not bad
            row["first_differing"] = bad[:5]
            failed |= bool(bad)
            del loaded
            gc.collect()
            row["ratio_first"] = row["anchor_s"] / row["inplace_first_s"]
            log(f"  {label:<10} mergekit {m.wall_s:6.2f} s + from_pretrained {row['load_s']:5.2f} s = "
                f"{row['anchor_s']:6.2f} s | in place {row['inplace_first_s']:6.3f} s ({gb(st.bytes)} written) "
                f"| {row['ratio_first']:6.1f}× | {'bit-identical' if not bad else 'DIFFERS: ' + ', '.join(bad[:3])}")
        # a second, warm cycle: originals already saved and verified
        for label in configs:
            t = time.perf_counter()
            session.apply(plans[label])
            rows[label]["inplace_warm_s"] = time.perf_counter() - t
        saved = session.saved_bytes
    shutil.rmtree(out, ignore_errors=True)
    log("in-place warm cycle: " + ", ".join(f"{k} {v['inplace_warm_s']:.3f} s" for k, v in rows.items())
        + f"; originals held: {gb(saved)}")
    summary = {"pair": {"layers": spec.layers, "model_bytes": spec.model_bytes(), "base": str(base), "rl": str(rl)},
               "first_load_s": first_load, "configs": rows, "target": TARGET}
    if not args.skip_mergekit:
        ratios = [r["ratio_first"] for r in rows.values()]
        warm = [r["anchor_s"] / r["inplace_warm_s"] for r in rows.values()]
        summary["median_ratio_first"] = statistics.median(ratios)
        summary["median_ratio_warm"] = statistics.median(warm)
        summary["all_identical"] = not failed
        met = summary["median_ratio_first"] >= TARGET
        log(f"median (mergekit + from_pretrained) / in-place switch: {summary['median_ratio_first']:.1f}× "
            f"(first pass; warm {summary['median_ratio_warm']:.1f}×), target ≥ {TARGET:.0f}×: "
            f"{'met' if met else 'MISSED'}; min {min(ratios):.1f}×")
        log("in-place model == from_pretrained(mergekit graft), every tensor, every configuration: "
            + ("yes" if not failed else "NO"))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(summary, indent=2))
    log(f"wrote {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
