"""``train grpo --trainer trl`` against ``--trainer graftkit``: seconds per step on bench_grpo.py's shared setting.

The setting is bench_grpo.py's (benchmarks/grpo_setting.py): the random-init tiny policy ``tiny_policy(
task_words(), "micro", seed=0)`` saved once as an HF folder, ``click-button`` prompts drawn by
``train.grpo._prompts``, 2 prompts × 8 episodes × ≤ 16 new tokens per step, one turn per episode
(``--max-turns 1``), temperature 1, β = 0, loss dapo, ε 0.2, lr 1e-5, one torch thread. Both sides are the
same command line (bench_grpo.graftkit_argv) with ``--trainer graftkit`` or ``--trainer trl`` added, run
alternately; per-step time from the cumulative ``seconds`` of each run's train_log.jsonl, the first step
left out as warm-up; median and min over the remaining steps of all repetitions.

    python benchmarks/bench_engines.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_grpo import ENV, GRAFTKIT_EXE, REPO, WORK, graftkit_argv  # noqa: E402
from grpo_setting import Setting, make_policy_dir, read_jsonl  # noqa: E402
from measure import run_measured  # noqa: E402


def run_trainer(trainer: str, policy: Path, s: Setting, tag: str) -> dict:
    out = WORK / "out" / f"engines-{trainer}-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    argv = graftkit_argv(GRAFTKIT_EXE, policy, out, s, stages=0) + ["--trainer", trainer, "--device", "cpu"]
    m = run_measured(argv, env={**ENV, "TRL_EXPERIMENTAL_SILENCE": "1"}, cwd=REPO).check(f"--trainer {trainer}")
    log = read_jsonl(out / "train_log.jsonl")
    if len(log) != s.steps:
        raise RuntimeError(f"--trainer {trainer}: {len(log)} steps logged, expected {s.steps}")
    cum = [float(r["seconds"]) for r in log]
    return {"trainer": trainer, "step_seconds": [b - a for a, b in zip(cum, cum[1:])], "wall_s": m.wall_s,
            "peak_rss_bytes": m.peak_rss_bytes, "tokens_per_step": statistics.fmean(r["tokens"] for r in log),
            "reward_mean": statistics.fmean(r["reward"] for r in log)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=Setting.steps)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", type=Path, default=WORK / "engines_results.json")
    args = ap.parse_args(argv)
    s = Setting(steps=args.steps)
    (WORK / "out").mkdir(parents=True, exist_ok=True)
    policy = make_policy_dir(WORK, s)
    runs: dict[str, list[dict]] = {"graftkit": [], "trl": []}
    for r in range(args.repeats):
        for trainer in (("graftkit", "trl") if r % 2 == 0 else ("trl", "graftkit")):
            res = run_trainer(trainer, policy, s, f"r{r}")
            runs[trainer].append(res)
            print(f"  [{r + 1}/{args.repeats}] --trainer {trainer:<8} {statistics.median(res['step_seconds']):6.3f} s/step"
                  f"  wall {res['wall_s']:6.2f} s  tokens/step {res['tokens_per_step']:5.1f}", flush=True)
    summary = {}
    for trainer, rs in runs.items():
        xs = [x for r in rs for x in r["step_seconds"]]
        summary[trainer] = {"seconds_per_step_median": statistics.median(xs), "seconds_per_step_min": min(xs),
                           "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                           "peak_rss_bytes_median": statistics.median(r["peak_rss_bytes"] for r in rs),
                           "tokens_per_step": statistics.fmean(r["tokens_per_step"] for r in rs)}
    g, t = summary["graftkit"], summary["trl"]
    ratios = {"seconds_per_step_median": g["seconds_per_step_median"] / t["seconds_per_step_median"],
              "seconds_per_step_min": g["seconds_per_step_min"] / t["seconds_per_step_min"]}
    print(f"\n{'':<19} {'s/step median':>14} {'min':>8} {'tokens/step':>12} {'wall s':>8}")
    for trainer, sm in summary.items():
        print(f"--trainer {trainer:<9} {sm['seconds_per_step_median']:14.3f} {sm['seconds_per_step_min']:8.3f} "
              f"{sm['tokens_per_step']:12.1f} {sm['wall_s_median']:8.2f}")
    print(f"\ngraftkit / trl seconds per step: {ratios['seconds_per_step_median']:.2f}× (median), "
          f"{ratios['seconds_per_step_min']:.2f}× (min)")
    args.results.write_text(json.dumps({"setting": s.to_dict(), "repeats": args.repeats, "summary": summary,
                                        "ratios": ratios, "runs": runs}, indent=1))
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
