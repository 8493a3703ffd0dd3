"""Batched KV-cached rollouts against a loop that calls ``generate`` once per episode and turn.

Same tiny policy (the embedded default's "micro" Qwen3 with the task tokenizer), same episodes (every
mirrored task × the same environment seeds), same greedy decoding: both sides produce identical actions
(checked), so the ratio is the speed of the rollout engine alone. Target: batched ≥ 5× the episodes per
second of the loop.

    python benchmarks/bench_rollout.py [--quick] [--episodes 8] [--size micro]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from graftkit.agent import Decode, rollout, task_words, tiny_policy
from graftkit.webenv import ParseError, make_env
from graftkit.webenv.render import render_text
from graftkit.webenv.tasks import TASKS

HERE = Path(__file__).resolve().parent


def loop_generate(policy, jobs, decode: Decode) -> list[list[str]]:
    """The baseline: one ``model.generate`` call per episode and turn."""
    actions = []
    for task, seed, _ in jobs:
        env, history, acts = make_env(task), [], []
        obs = env.reset(seed)
        for _ in range(TASKS[task].max_steps):
            ids = torch.tensor([policy.prompt_ids(render_text(obs), history)])
            out = policy.model.generate(ids, max_new_tokens=decode.max_new_tokens, do_sample=False,
                                        pad_token_id=policy.pad_id, eos_token_id=sorted(policy.eos_ids))
            action = policy.decode_action(out[0, ids.shape[1]:].tolist())
            acts.append(action)
            try:
                step = env.step(action)
            except ParseError:
                history.append("invalid")
                continue
            history.append(action)
            if step.done:
                break
            obs = step.observation
        actions.append(acts)
    return actions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--episodes", type=int, default=8, help="environment seeds per task")
    ap.add_argument("--size", default="micro")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128, help="episodes live at once (continuous batching)")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.repeats = 3, 1
    torch.set_num_threads(1)  # steadier on shared cores; the same for both sides
    policy = tiny_policy(task_words(), args.size, seed=0)
    jobs = [(t, s, 0) for t in TASKS for s in range(args.episodes)]
    decode = Decode(greedy=True, max_new_tokens=12)

    batched_actions = [[t.action for t in e.turns] for e in rollout(policy, jobs, decode, batch_size=args.batch_size)]
    looped_actions = loop_generate(policy, jobs, decode)
    same = batched_actions == looped_actions

    times = {"batched": [], "loop": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rollout(policy, jobs, decode, batch_size=args.batch_size)
        times["batched"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loop_generate(policy, jobs, decode)
        times["loop"].append(time.perf_counter() - t0)
    eps = {k: len(jobs) / min(v) for k, v in times.items()}
    ratio = eps["batched"] / eps["loop"]
    print(f"rollouts: {len(jobs)} episodes ({len(TASKS)} tasks × {args.episodes} seeds), {args.size} policy, "
          f"greedy, ≤12 new tokens per turn, 1 torch thread")
    for k in ("batched", "loop"):
        print(f"  {k:8s} min {min(times[k]):7.2f} s  median {statistics.median(times[k]):7.2f} s  "
              f"{eps[k]:8.1f} episodes/s")
    print(f"  identical actions: {same}")
    print(f"  ratio batched / loop: {ratio:.1f}x  (target ≥ 5x) {'OK' if ratio >= 5 else 'MISSED'}")
    out = HERE / ".work"
    out.mkdir(exist_ok=True)
    (out / "rollout_results.json").write_text(json.dumps(
        {"episodes": len(jobs), "times": times, "episodes_per_s": eps, "ratio": ratio, "identical": same}, indent=2))
    if not same:
        raise SystemExit("batched and looped rollouts chose different actions")


if __name__ == "__main__":
    main()
