"""Evaluation episodes/s of the micro tiny policy on the CPU in bfloat16 against float32.

The same policy (the embedded SFT policy, a "micro" Qwen3 with the task tokenizer, loaded by
``agent.load_policy(..., device="cpu", dtype=...)``), the same episodes (every task of both suites × the
same seeds, greedy), the same batch size: only the dtype differs. Each side is warmed up once, then timed
``--repeats`` times, interleaved, and the best time is kept (timings on shared cores swing; the ratio is the
point). Also printed: how many episodes end the same way in both precisions.

    python benchmarks/bench_dtype.py [--seeds 8] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from graftkit.agent import Decode, evaluate, load_policy

SFT = Path(__file__).resolve().parents[1] / "assets" / "sft"
TASKS = ["click-tab", "click-button", "click-link"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", type=Path, default=SFT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policies = {dt: load_policy(args.model, device="cpu", dtype=dt) for dt in ("float32", "bfloat16")}
    seeds, decode = list(range(args.seeds)), Decode(greedy=True)
    best = {dt: float("inf") for dt in policies}
    outcome = {}
    for dt, pol in policies.items():  # warm-up
        evaluate(pol, TASKS[:1], seeds[:1], 1, decode)
    for _ in range(args.repeats):
        for dt, pol in policies.items():
            t0 = time.perf_counter()
            out = evaluate(pol, TASKS, seeds, args.episodes, decode)
            best[dt] = min(best[dt], time.perf_counter() - t0)
            outcome[dt] = out.success
    n = outcome["float32"].size
    rate = {dt: n / best[dt] for dt in best}
    same = float(np.mean(outcome["float32"] == outcome["bfloat16"]))
    print(f"micro policy {args.model.name}: {len(TASKS)} tasks × {args.seeds} seeds × {args.episodes} episodes = {n}, "
          f"greedy, torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}")
    for dt in ("float32", "bfloat16"):
        print(f"  {dt:9s} {rate[dt]:7.1f} episodes/s  ({best[dt]:.2f} s)  success {outcome[dt].mean():.3f}")
    print(f"  bfloat16 / float32 episodes/s: {rate['bfloat16'] / rate['float32']:.2f}×; "
          f"same outcome on {same:.0%} of episodes")


if __name__ == "__main__":
    main()
