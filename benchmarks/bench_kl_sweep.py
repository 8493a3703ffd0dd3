"""``graftkit graft --sweep factorial --metric kl`` beside ``--metric success`` over the same configurations.

A success sweep plays every configuration's episodes (greedy, up to ``--max-new-tokens`` decoded tokens per turn,
one KV-cached decoding step per token); a KL sweep plays two sets of rollouts once (RL's and SFT's own, at
temperature 1) and then scores every configuration on them by teacher forcing, one batched forward pass per
batch of turns (:mod:`graftkit.graft.kl`). Both run here, one after the other, on a tiny nano policy as the SFT
base and an RL child moved in every matrix (planted), with the same tasks × seeds × episodes and the same
in-place grafts. Printed: each sweep's wall time (the KL sweep's split into rollouts and scoring), the action
tokens scored, and the ratio KL / success. The KL sweep's endpoints are checked (0 at ∅, 1 at the full graft).

    python benchmarks/bench_kl_sweep.py [--quick] [--groups attn,mlp] [--seeds 4] [--episodes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
TASKS = "click-button,enter-text,arithmetic"


def make_policies(root: Path) -> dict[str, Path]:
    """A nano SFT policy and an RL child with a planted delta in every 2-D tensor (bench_ray_sweep's pair)."""
    sys.path.insert(0, str(HERE))
    from bench_ray_sweep import make_policies as planted

    return planted(root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run on a few episodes (the ratio means little)")
    ap.add_argument("--groups", default="embed,attn,mlp,norm")
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args(argv)
    if args.quick:
        args.groups, args.seeds, args.episodes = "attn,mlp", 2, 1

    from graftkit.graft.commands import GraftConfig, run_graft
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL

    WORK.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="kl-sweep-", dir=WORK))
    try:
        paths = make_policies(root)
        common = dict(rl=paths["rl"], base=paths["sft"], sweep="factorial", groups=args.groups, tasks=args.tasks,
                      seeds=args.seeds, episodes=args.episodes, max_new_tokens=args.max_new_tokens)
        t0 = time.perf_counter()
        success = run_graft(GraftConfig(run=root / "success", metric="success", **common))
        t_success = time.perf_counter() - t0
        t0 = time.perf_counter()
        kl = run_graft(GraftConfig(run=root / "kl", metric="kl", **common))
        t_kl = time.perf_counter() - t0
        v = kl.sweeps["A"]
        timing = v.attrs["kl_timing"]
        exact = all(v.reproduced(BASE_LABEL, s).tolist() == [0.0] * 3 and v.reproduced(RL_LABEL, s).tolist() == [1.0] * 3
                    for s in v.sides)
        n = len(v.configs)
        if success.sweeps["A"].configs != v.configs:
            raise SystemExit("the two sweeps scored different configurations")
        ratio = t_kl / t_success
        record = {"configurations": n, "groups": args.groups, "tasks": args.tasks, "seeds": args.seeds,
                  "episodes": args.episodes, "max_new_tokens": args.max_new_tokens, "success_s": t_success,
                  "kl_s": t_kl, "kl_rollouts_s": timing["rollouts"], "kl_scoring_s": timing["scoring"],
                  "scored_tokens": timing["scored_tokens"], "ratio_kl_over_success": ratio, "endpoints_exact": exact}
        episodes = len(args.tasks.split(",")) * args.seeds * args.episodes
        print(f"graft factorial sweep over {args.groups}: {n} configurations × {episodes} episodes")
        print(f"  --metric success   {t_success:7.2f} s   ({t_success / n:.2f} s per configuration)")
        print(f"  --metric kl        {t_kl:7.2f} s   (rollouts of RL and SFT {timing['rollouts']:.2f} s, forward "
              f"passes {timing['scoring']:.2f} s over {timing['scored_tokens']} action tokens)")
        print(f"  ratio kl / success {ratio:7.2f}×")
        print(f"  endpoints exact    {exact}  (reproduced 0 at ∅ and 1 at the full graft, both sides)")
        (WORK / "kl_sweep_results.json").write_text(json.dumps(record, indent=2))
        return 0 if exact else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
