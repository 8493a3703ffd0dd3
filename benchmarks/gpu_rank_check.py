"""GPU check of the weight side: spectra of a 3B-shape checkpoint on a CUDA device against the CPU path.

    python benchmarks/gpu_rank_check.py [--device cuda] [--out DIR]     # the Llama-3.2-3B shape, one GPU
    python benchmarks/gpu_rank_check.py --device cpu --small            # a tiny pair, the CPU on both sides

What it does:

1. writes a synthetic base/RL pair of Llama-3.2-3B shape with benchmarks/synth.py (hidden 3072, 28 layers,
   intermediate 8192, vocabulary 128,256, 24 heads / 8 KV heads, untied head, bfloat16: 7.2 GB per model;
   the RL side is base plus a small perturbation of every tensor);
2. ``weight_ranks`` of the whole base on ``--device``: wall time and peak device memory
   (``torch.cuda.max_memory_allocated``), every matrix including both [128256, 3072] embeddings.
   Target: ≤ ``WEIGHTS_TARGET_S`` seconds;
3. the same matrices of a subset (the embedding, the head and decoder layer 0) on the CPU: every measure of
   every row equal to the device's within ``REL`` relative (NaN where the other is NaN); the CPU's time
   for the subset, and that time scaled to the whole model by the matrices' multiply-adds (long·short²);
4. ``delta_ranks`` of ``--delta-layers`` decoder layers on the device and on the CPU (the pair measures'
   eigendecompositions included): equal within ``REL``; both times;
5. device memory bound: the peak of (2) against the largest Gram plus one block per worker.

Then a JSON record (``--out``/gpu_rank_check.json) and PASS/FAIL per check; exit status 1 if any fails,
2 when it cannot start.

The GPU machine has no package registry and no ``blake3`` (graftkit fingerprints each checkpoint it ranks).
``make gpu-wheels`` here puts its wheels for CPython 3.10–3.13 in ``.whl/``; carry that folder, and this
script installs the one that fits from it into a temporary folder (nothing is installed system-wide)::

    make gpu-wheels                                            # here, once
    # there (the pair, 14 GB, stays out of $OUT; only the record comes back)
    python benchmarks/gpu_rank_check.py --out /tmp/check; cp /tmp/check/gpu_rank_check.json $OUT/

Budget on one H200 with 16 CPU cores: writing the pair ≈ 2–3 minutes, the device ranks ≈ 30 s, the CPU
subset ≈ 1 minute, the delta layers ≈ 1 minute. It needs only torch, numpy, safetensors, transformers
(synth.py's config), h5py and blake3 (above); no plotly (nothing here draws).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEELS = HERE.parent / ".whl"  # `make gpu-wheels`
sys.path.insert(0, str(HERE))

from gpu_check import _importable  # noqa: E402
from synth import PairSpec, make_pair_from_spec  # noqa: E402

REL = 1e-10
TAIL = {"erank": 1e-8, "rankme": 1e-8}  # see rank/spectra.py: the Gram's floor under a tail of small σ
WEIGHTS_TARGET_S = 30.0
FULL = PairSpec(hidden=3072, layers=28, vocab=128_256, intermediate=8192, heads=24, kv_heads=8)
SMALL = PairSpec(hidden=64, layers=3, vocab=512, intermediate=192, heads=4, kv_heads=2)


def ensure_blake3(wheels: Path = WHEELS) -> str | None:
    """Make ``import blake3`` work: nothing where it is installed, else its wheel from ``wheels`` installed
    into a temporary folder put on ``sys.path`` (a note saying so). Exits with status 2 and one line naming
    the fix where neither works."""
    if importlib.util.find_spec("blake3") is not None:
        return None
    target = Path(tempfile.mkdtemp(prefix="gpu-rank-check-wheels-"))
    found = sorted(wheels.glob("blake3-*.whl")) if wheels.is_dir() else []
    if found:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                               "--find-links", str(wheels), "--target", str(target), "blake3"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            sys.path.insert(0, str(target))
            importlib.invalidate_caches()
            if importlib.util.find_spec("blake3") is not None:
                return f"blake3 installed from {wheels} into {target}"
        why = f"none of the {len(found)} blake3 wheel(s) in {wheels} installs here ({proc.stderr.strip()[-200:]})"
    else:
        why = f"no blake3 wheel in {wheels}"
    print(f"gpu_rank_check: blake3 is not installed and {why}: run `make gpu-wheels` where a package registry "
          "is reachable and carry .whl/ to this machine", file=sys.stderr)
    raise SystemExit(2)


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, ok: bool, name: str, detail: str) -> bool:
        self.rows.append({"ok": bool(ok), "check": name, "detail": detail})
        print(f"  {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        return bool(ok)


def same(x: float, y: float, metric: str) -> bool:
    """Whether two values of ``metric`` agree: both NaN, or within REL relative (TAIL for erank, rankme)."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= max(REL, TAIL.get(metric, 0.0)) * max(abs(x), abs(y))


def compare(a, b) -> list[str]:
    """Rows × metrics where two rank results disagree (:func:`same`)."""
    bad = []
    if list(a.coords["tensor"]) != list(b.coords["tensor"]):
        return [f"different rows: {len(a.coords['tensor'])} vs {len(b.coords['tensor'])}"]
    metrics = [str(m) for m in a.coords["metric"]]
    for i, name in enumerate(a.coords["tensor"]):
        for k, m in enumerate(metrics):
            x, y = float(a["value"][i, k]), float(b["value"][i, k])
            if not same(x, y, m):
                bad.append(f"{name} {m}: {x!r} vs {y!r}")
    return bad


def work(shape) -> int:
    """Multiply-adds of a matrix's Gram: long · short²."""
    m, n = (int(x) for x in shape)
    return max(m, n) * min(m, n) ** 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="the device under test (cuda, cuda:N, or cpu)")
    ap.add_argument("--small", action="store_true", help="a tiny pair (a CPU smoke run)")
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--delta-layers", default="0-1", help="decoder layers of the delta comparison (default 0-1)")
    args = ap.parse_args(argv)
    notes = _importable()
    if note := ensure_blake3():
        notes.append(note)

    import torch

    from graftkit.rank import delta_ranks, weight_ranks
    from graftkit.rank import spectra
    from graftkit.weights import open_checkpoint

    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-rank-check-"))
    out.mkdir(parents=True, exist_ok=True)
    spec = SMALL if args.small else FULL
    record: dict = {"device": args.device, "spec": spec.__dict__, "notes": notes, "torch": torch.__version__,
                    "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    c = Checks()

    t0 = time.perf_counter()
    base_dir, rl_dir = make_pair_from_spec(out / "pair", spec, verbose=True)
    record["write_pair_s"] = time.perf_counter() - t0
    base, rl = open_checkpoint(base_dir), open_checkpoint(rl_dir)
    tax = base.taxonomy()
    record["model_bytes"] = base.nbytes
    print(f"pair: {base.nbytes / 1e9:.2f} GB per model, written in {record['write_pair_s']:.0f} s", flush=True)

    # 2. every weight matrix on the device
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev_res = weight_ranks(base, tax, device=args.device)
    dev_s = time.perf_counter() - t0
    peak = dev_res.attrs.get("peak_device_bytes")
    record["weights"] = {"seconds": dev_s, "matrices": len(dev_res.coords["tensor"]), "peak_device_bytes": peak,
                         "workers": dev_res.attrs["workers"], "device": dev_res.attrs["device"]}
    target = WEIGHTS_TARGET_S if not args.small else math.inf
    c.add(dev_s <= target, "weights-time",
          f"{len(dev_res.coords['tensor'])} matrices in {dev_s:.1f} s on {dev_res.attrs['device']} (target ≤ "
          f"{target:g} s), peak device memory {peak / 1e9 if peak else 0:.2f} GB")

    # 3. a subset on the CPU, compared row by row
    subset_layers = "0"
    cpu_sub_t0 = time.perf_counter()
    cpu_layer = weight_ranks(base, tax, layers=subset_layers, device="cpu")
    outside = [n for n in base.metas if tax.roles.get(n) is None or tax.roles[n].stack != "decoder"]
    cpu_s = time.perf_counter() - cpu_sub_t0
    rows = list(dev_res.coords["tensor"])
    idx = {str(n): i for i, n in enumerate(rows)}
    bad = []
    for i, name in enumerate(cpu_layer.coords["tensor"]):
        j = idx[str(name)]
        for k, m in enumerate(cpu_layer.coords["metric"]):
            x, y = float(cpu_layer["value"][i, k]), float(dev_res["value"][j, k])
            if not same(x, y, str(m)):
                bad.append(f"{name} {m}: cpu {x!r} device {y!r}")
    # the embedding and head through the spectra directly (weight_ranks selects them only for layers=all)
    t1 = time.perf_counter()
    for name in [n for n in outside if len(base.metas[n].shape) == 2]:
        ref = spectra.measures(base.read(name), device="cpu")
        j = idx[name]
        for k, m in enumerate(dev_res.coords["metric"]):
            x, y = float(ref[str(m)]), float(dev_res["value"][j, k])
            if not same(x, y, str(m)):
                bad.append(f"{name} {m}: cpu {x!r} device {y!r}")
    cpu_s += time.perf_counter() - t1
    sub_names = [str(n) for n in cpu_layer.coords["tensor"]] + [n for n in outside if len(base.metas[n].shape) == 2]
    shapes = {str(n): tuple(dev_res["tensor_shape"][i]) for i, n in enumerate(rows)}
    scale = sum(work(s) for s in shapes.values()) / sum(work(shapes[n]) for n in sub_names)
    record["cpu_subset"] = {"matrices": len(sub_names), "seconds": cpu_s, "whole_model_estimate_s": cpu_s * scale,
                            "mismatches": bad[:20]}
    c.add(not bad, "weights-equal-cpu",
          f"{len(sub_names)} matrices (layer 0, embedding, head) on the CPU in {cpu_s:.1f} s (whole model ≈ "
          f"{cpu_s * scale:.0f} s by multiply-adds): {len(bad)} values beyond {REL:g} relative (erank, rankme "
          f"{TAIL['erank']:g})"
          + (f"; first: {bad[0]}" if bad else ""))

    # 4. deltas of a few layers, both sides
    t0 = time.perf_counter()
    d_dev = delta_ranks(base, rl, tax, layers=args.delta_layers, device=args.device)
    d_dev_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    d_cpu = delta_ranks(base, rl, tax, layers=args.delta_layers, device="cpu")
    d_cpu_s = time.perf_counter() - t0
    dbad = compare(d_cpu, d_dev)
    record["delta"] = {"layers": args.delta_layers, "matrices": len(d_dev.coords["tensor"]), "device_s": d_dev_s,
                       "cpu_s": d_cpu_s, "mismatches": dbad[:20],
                       "peak_device_bytes": d_dev.attrs.get("peak_device_bytes")}
    c.add(not dbad, "delta-equal-cpu",
          f"layers {args.delta_layers}: {len(d_dev.coords['tensor'])} matrices, device {d_dev_s:.1f} s, CPU "
          f"{d_cpu_s:.1f} s; {len(dbad)} values beyond {REL:g}" + (f"; first: {dbad[0]}" if dbad else ""))

    # where a GPU's time goes: one float64 eigvalsh of the largest Gram on each side (a diagnosis, no check)
    short = max(min(s) for s in shapes.values())
    G = torch.randn(short, short, dtype=torch.float64)
    G = G @ G.T
    timings = {}
    for where in dict.fromkeys(["cpu", args.device]):
        Gd = G.to(spectra.as_device(where))
        torch.linalg.eigvalsh(Gd)  # warm-up (library load, workspace)
        if Gd.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.linalg.eigvalsh(Gd).cpu()
        timings[where] = time.perf_counter() - t0
    record["eigvalsh_largest_gram_s"] = {"n": short, **timings}
    print(f"eigvalsh of a {short}² float64 Gram: " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items()))

    # 5. the device memory bound of the weight ranks
    if peak is not None:
        bound = dev_res.attrs["workers"] * (short * short * 8 * 3 + spectra.GRAM_BLOCK_ELEMENTS_DEVICE * (8 + 2))
        c.add(peak <= bound, "weights-device-memory",
              f"peak {peak / 1e6:.0f} MB ≤ {bound / 1e6:.0f} MB (per worker: the largest Gram {short}² float64, "
              f"eigvalsh's workspace and one block)")
    record["checks"] = c.rows
    (out / "gpu_rank_check.json").write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({k: record[k] for k in ("weights", "cpu_subset", "delta")}, indent=2, default=str))
    failed = [r for r in c.rows if not r["ok"]]
    print(f"{len(c.rows) - len(failed)} of {len(c.rows)} checks passed; record {out / 'gpu_rank_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
