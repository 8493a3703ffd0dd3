"""The pure-Python mirror's step against real MiniWoB++ (Chromium) on the same episodes.

For every task both backends have, the oracle plays the same seeded episodes on each backend; every
``step`` call is timed (the real backend's includes its 20-30 ms browser round trip; use-autocomplete's
also its 300 ms search delay, which the mirror settles instantly). Reported: median step time per task
and backend, and the ratio real / mirror. Target: the mirror's step ≥ 100× faster on every task.

    python benchmarks/bench_webenv.py [--quick] [--seeds 10] [--skip-browser]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from graftkit.webenv import make_env
from graftkit.webenv.tasks import TASKS

HERE = Path(__file__).resolve().parent

# Read by benchmarks/run.py: the anchor is Debian's Chromium with the miniwob package.
ANCHOR = {"name": "real MiniWoB++ (Chromium)", "check": "/usr/bin/chromedriver", "setup": "setup_browser.sh",
          "skip_flag": "--skip-browser"}


def step_times(task: str, backend: str, seeds: range) -> tuple[list[float], list[float]]:
    """(step seconds, reset seconds) of the oracle's episodes."""
    steps, resets = [], []
    with make_env(task, backend) as env:
        for seed in seeds:
            t0 = time.perf_counter()
            obs = env.reset(seed)
            resets.append(time.perf_counter() - t0)
            plan: list[str] = []
            while not env.done and len(steps) < 10_000:
                plan = plan or TASKS[task].oracle(obs)  # planned again where a task hides its answer
                t0 = time.perf_counter()
                obs = env.step(plan.pop(0)).observation
                steps.append(time.perf_counter() - t0)
            assert env.success, f"{task} seed {seed}: the oracle failed on {backend}"
    return steps, resets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--skip-browser", action="store_true")
    args = ap.parse_args()
    seeds = range(3 if args.quick else args.seeds)
    browser = not args.skip_browser and shutil.which("chromium") and shutil.which("chromedriver")
    tasks = [t for t, spec in TASKS.items() if spec.in_miniwob]
    results = {}
    print(f"{'task':24s} {'mirror step':>12s} {'real step':>12s} {'ratio':>8s}   (median over oracle steps, {len(seeds)} seeds)")
    for task in tasks:
        mirror, _ = step_times(task, "py", seeds)
        row = {"mirror_step_s": statistics.median(mirror)}
        if browser:
            real, _ = step_times(task, "miniwob", seeds)
            row["real_step_s"] = statistics.median(real)
            row["ratio"] = row["real_step_s"] / row["mirror_step_s"]
        results[task] = row
        real_txt = f"{1e3 * row['real_step_s']:9.2f} ms" if browser else "   (skipped)"
        ratio_txt = f"{row['ratio']:7.0f}x" if browser else ""
        print(f"{task:24s} {1e3 * row['mirror_step_s']:9.3f} ms {real_txt} {ratio_txt}")
    if browser:
        worst = min(r["ratio"] for r in results.values())
        print(f"slowest ratio {worst:.0f}x (target ≥ 100x) {'OK' if worst >= 100 else 'MISSED'}")
    else:
        print("real backend skipped: install chromium chromium-driver (make browser) to compare")
    (HERE / ".work").mkdir(exist_ok=True)
    (HERE / ".work" / "webenv_results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
