"""graftkit weight ranks against WeightWatcher 0.7.7 ``analyze()`` on a tiny Qwen2, side by side.

The model: a random Qwen2 built from its config class (hidden 512, 8 layers, vocab 64,000, intermediate
1536, 8 heads, 2 KV heads, untied lm_head, float32) and saved with ``save_pretrained`` to
benchmarks/.work. Both tools read that folder.

What runs, alternating the tools on each repetition after warming the page cache, each in its own process
so that neither's imports or allocator state colour the other's figures, with the timing taken *inside*
the process around the call alone (imports excluded), ``--inner`` calls per process:

- WeightWatcher (benchmarks/.venv-ww; ``bash benchmarks/setup_weightwatcher.sh`` sets it up):
  ``WeightWatcher().analyze(model=FOLDER, plot=False, randomize=False, mp_fit=False, vectors=False,
  detX=False)`` — its defaults otherwise (the power-law fit of every ESD is part of ``analyze`` and cannot
  be switched off). On a machine without CUDA it takes every spectrum with scipy's float64 SVD
  (``svd_method="fast"`` falls back to it), and it skips matrices with a side above ``max_N`` = 50,000:
  the embeddings and lm_head of any real vocabulary.
- graftkit: ``weight_ranks(open_checkpoint(FOLDER), taxonomy)``: every matrix, embeddings and lm_head
  included, all nine single-matrix measures from one float64 spectrum each.

Then stable rank Σσ²/σ₁² is compared on the matrices both cover (WeightWatcher's ``name`` + ".weight" is
the safetensors tensor name when it reads a folder; its ``stable_rank`` is Σλ/λ_max of the ESD λ = σ² of
the raw weight, no normalisation for linear layers). Target: max relative difference ≤ 1e-6, graftkit's
wall ≤ 0.35× WeightWatcher's (min over runs; the median is printed too). The table and a JSON record
(benchmarks/.work/rank_results.json) are the output. Exit status 1 when a tool fails, a matrix is missing
from graftkit's rows, or stable ranks disagree; a missed speed target is reported, not failed
(benchmarks are not tests).

    python benchmarks/bench_rank.py [--quick] [--repeats 3] [--inner 2] [--threads N] [--skip-weightwatcher]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Read by benchmarks/run.py (with ast, without importing this module): the optional anchor.
ANCHOR = {
    "name": "WeightWatcher 0.7.7",
    "check": ".venv-ww/bin/python",
    "setup": "setup_weightwatcher.sh",
    "skip_flag": "--skip-weightwatcher",
}

WORK = HERE / ".work"
WW_PYTHON = HERE / ".venv-ww" / "bin" / "python"
GK_PYTHON = REPO / ".venv" / "bin" / "python"
MODEL = {"hidden": 512, "layers": 8, "vocab": 64_000, "intermediate": 1536, "heads": 8, "kv_heads": 2}
TARGETS = {"wall_min_ratio": 0.35, "stable_rank_max_rel_diff": 1e-6}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "MPLBACKEND": "Agg"}
WW_OPTIONS = {"plot": False, "randomize": False, "mp_fit": False, "vectors": False, "detX": False}


# --------------------------------------------------------------------------------------------------
# workers: one process per tool and repetition, timing inside around the call


def _worker_ww(folder: str, inner: int) -> dict:
    import logging

    import weightwatcher as ww

    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    seconds, details = [], None
    for _ in range(inner):
        watcher = ww.WeightWatcher()
        t0 = time.perf_counter()
        details = watcher.analyze(model=folder, **WW_OPTIONS)
        seconds.append(time.perf_counter() - t0)
    rows = [{"name": str(r["name"]), "N": int(r["N"]), "M": int(r["M"]), "stable_rank": float(r["stable_rank"])}
            for _, r in details.iterrows()]
    return {"seconds": seconds, "rows": rows, "version": ww.__version__}


def _worker_graftkit(folder: str, inner: int) -> dict:
    from graftkit.rank import weight_ranks
    from graftkit.weights import open_checkpoint

    seconds, res = [], None
    for _ in range(inner):
        t0 = time.perf_counter()
        ckpt = open_checkpoint(folder)
        res = weight_ranks(ckpt, ckpt.taxonomy())
        seconds.append(time.perf_counter() - t0)
    # for reference only: the decoder matrices alone, i.e. the 56 WeightWatcher covers
    same = []
    for _ in range(inner):
        t0 = time.perf_counter()
        ckpt = open_checkpoint(folder)
        tax = ckpt.taxonomy()
        weight_ranks(ckpt, tax, layers=f"0-{tax.n_layers['decoder'] - 1}")
        same.append(time.perf_counter() - t0)
    k = list(res.coords["metric"]).index("stable_rank")
    rows = [{"name": str(n), "shape": [int(x) for x in res["tensor_shape"][i]],
             "stable_rank": float(res["value"][i, k])} for i, n in enumerate(res.coords["tensor"])]
    return {"seconds": seconds, "decoder_only_seconds": same, "rows": rows, "method": res.attrs["method"],
            "workers": res.attrs.get("workers"), "skipped": [s["tensor"] for s in res.attrs["skipped"]]}


# --------------------------------------------------------------------------------------------------
# the model


def build_model(folder: Path) -> Path:
    """The tiny Qwen2, saved once (reused when its config matches)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=MODEL["hidden"], num_hidden_layers=MODEL["layers"], vocab_size=MODEL["vocab"],
                      intermediate_size=MODEL["intermediate"], num_attention_heads=MODEL["heads"],
                      num_key_value_heads=MODEL["kv_heads"], tie_word_embeddings=False,
                      max_position_embeddings=512)
    stamp = folder / "bench_model.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == MODEL and (folder / "model.safetensors").is_file():
        return folder
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    stamp.write_text(json.dumps(MODEL))
    return folder


# --------------------------------------------------------------------------------------------------
# driver


def run_worker(tool: str, folder: Path, inner: int, env: dict) -> dict:
    python = WW_PYTHON if tool == "ww" else GK_PYTHON
    out = WORK / f".rank-{tool}.json"
    t0 = time.perf_counter()
    proc = subprocess.run([str(python), __file__, "--worker", tool, "--folder", str(folder), "--inner", str(inner),
                           "--out", str(out)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} worker failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
    rec = json.loads(out.read_text())
    rec["process_wall_s"] = wall
    return rec


def match(ww_rows: list[dict], gk_rows: list[dict]) -> dict:
    """Pair WeightWatcher's layers with graftkit's rows by tensor name; relative stable-rank differences."""
    gk = {r["name"]: r for r in gk_rows}
    pairs, unmatched = [], []
    for r in ww_rows:
        name = r["name"] if r["name"] in gk else f"{r['name']}.weight"
        if name not in gk:
            unmatched.append(r["name"])
            continue
        g = gk[name]["stable_rank"]
        pairs.append({"tensor": name, "ww": r["stable_rank"], "graftkit": g,
                      "rel_diff": abs(g - r["stable_rank"]) / abs(r["stable_rank"])})
    only_gk = sorted(set(gk) - {p["tensor"] for p in pairs})
    return {"pairs": pairs, "ww_unmatched": unmatched, "graftkit_only": only_gk,
            "max_rel_diff": max((p["rel_diff"] for p in pairs), default=float("nan"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repetition per tool, one call each")
    ap.add_argument("--repeats", type=int, default=3, help="processes per tool, alternating (default 3)")
    ap.add_argument("--inner", type=int, default=2, help="timed calls inside each process (default 2)")
    ap.add_argument("--skip-weightwatcher", action="store_true", help="measure graftkit alone")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP/MKL/OPENBLAS_NUM_THREADS for both tools (default: unset, each library's own "
                         "default); 1 spares WeightWatcher's multithreaded SVD the spin-waits of a busy machine")
    ap.add_argument("--results", type=Path, default=WORK / "rank_results.json")
    ap.add_argument("--worker", choices=("ww", "graftkit"), help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        rec = (_worker_ww if args.worker == "ww" else _worker_graftkit)(args.folder, args.inner)
        Path(args.out).write_text(json.dumps(rec))
        return 0

    repeats, inner = (1, 1) if args.quick else (args.repeats, args.inner)
    use_ww = not args.skip_weightwatcher
    if use_ww and not WW_PYTHON.exists():
        print(f"WeightWatcher venv missing ({WW_PYTHON}): bash {HERE / 'setup_weightwatcher.sh'}, "
              "or pass --skip-weightwatcher")
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    folder = build_model(WORK / "qwen2-h512-L8-v64000-f32")
    nbytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    for p in folder.glob("*.safetensors"):  # warm the page cache: time the tools, not the disk
        p.read_bytes()
    print(f"model {folder.name}: {nbytes / 1e6:.0f} MB float32; {repeats} process(es) × {inner} call(s) per tool, "
          f"alternating", flush=True)

    env = dict(ENV)
    if args.threads:
        env.update({k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    print(f"threads: {args.threads or 'library defaults'} (cores: {os.cpu_count()}, load average "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    runs: dict[str, list[dict]] = {"ww": [], "graftkit": []}
    for rep in range(repeats):
        for tool in (("ww", "graftkit") if use_ww else ("graftkit",)):
            rec = run_worker(tool, folder, inner, env)
            runs[tool].append(rec)
            print(f"  rep {rep + 1} {tool:>8}: " + ", ".join(f"{s:.2f} s" for s in rec["seconds"]), flush=True)

    def stat(tool):
        s = [x for r in runs[tool] for x in r["seconds"]]
        return {"min": min(s), "median": statistics.median(s), "values": s}

    gk = stat("graftkit")
    gk_rows = runs["graftkit"][-1]["rows"]
    names = {r["name"] for r in gk_rows}
    required = {"model.embed_tokens.weight", "lm_head.weight"}
    record = {"model": {**MODEL, "folder": str(folder), "bytes": nbytes}, "threads": args.threads,
              "cores": os.cpu_count(), "load_average_at_end": os.getloadavg(), "graftkit": {
        "wall_s": gk, "matrices": len(gk_rows), "method": runs["graftkit"][-1]["method"],
        "covers_embed_and_lm_head": required <= names}, "targets": TARGETS}
    ok = required <= names
    print(f"\ngraftkit weight_ranks ({runs['graftkit'][-1]['workers']} worker thread(s)): {len(gk_rows)} matrices "
          f"(embed_tokens and lm_head "
          f"{'included' if ok else 'MISSING'}), wall min {gk['min']:.2f} s, median {gk['median']:.2f} s "
          f"[{record['graftkit']['method']}]")
    if use_ww:
        w = stat("ww")
        m = match(runs["ww"][-1]["rows"], gk_rows)
        ratio_min, ratio_med = gk["min"] / w["min"], gk["median"] / w["median"]
        record["weightwatcher"] = {"version": runs["ww"][-1]["version"], "wall_s": w,
                                   "matrices": len(runs["ww"][-1]["rows"]), "options": WW_OPTIONS}
        record["ratio"] = {"wall_min": ratio_min, "wall_median": ratio_med}
        record["stable_rank"] = m
        print(f"WeightWatcher {record['weightwatcher']['version']} analyze(): {len(runs['ww'][-1]['rows'])} "
              f"matrices, wall min {w['min']:.2f} s, median {w['median']:.2f} s")
        print(f"ratio graftkit / WeightWatcher: min {ratio_min:.3f}, median {ratio_med:.3f} "
              f"(target ≤ {TARGETS['wall_min_ratio']}: {'met' if ratio_min <= TARGETS['wall_min_ratio'] else 'MISSED'})")
        dec = min(x for r in runs["graftkit"] for x in r["decoder_only_seconds"])
        record["graftkit"]["decoder_only_wall_min_s"] = dec
        print(f"for reference, graftkit on the decoder matrices alone (the ones WeightWatcher covers): wall min "
              f"{dec:.2f} s, ratio {dec / w['min']:.3f}")
        print(f"matrices only graftkit ranks ({len(m['graftkit_only'])}): {', '.join(m['graftkit_only'])}")
        if m["ww_unmatched"]:
            print(f"WeightWatcher layers with no graftkit row: {m['ww_unmatched']}")
        print(f"stable rank on the {len(m['pairs'])} matrices both cover: max relative difference "
              f"{m['max_rel_diff']:.2e} (target ≤ {TARGETS['stable_rank_max_rel_diff']:g})")
        ok = ok and not m["ww_unmatched"] and m["max_rel_diff"] <= TARGETS["stable_rank_max_rel_diff"]
    args.results.write_text(json.dumps(record, indent=2))
    print(f"record: {args.results}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
