"""graftkit's GRPO trainer against TRL 1.16 GRPOTrainer, side by side; Mu-GRPO stages against on-policy.

The setting (benchmarks/grpo_setting.py, imported by both sides): the tiny policy
``tiny_policy(task_words(), "micro", seed=0)`` (random init, graftkit's word-level task tokenizer) saved
once as an HF folder that both trainers load; prompts = the plain prompt of the first observation of
``click-button`` for the environment seeds graftkit's trainer draws (``GRPO_SEED_BASE + k``, checked
against ``train.grpo._prompts``); 2 prompts × 8 generations × ≤ 16 new tokens per step, temperature 1,
β = 0 (no reference model), loss ``dapo``, ε 0.2, lr 1e-5, AdamW (β₂ 0.99, no weight decay), grad clip
1, 20 steps, one torch thread; reward 1 when the action solves the episode, else 0.

What runs, alternating the order on each repetition:

- TRL: ``benchmarks/trl_grpo.py`` in benchmarks/.venv-trl (``bash benchmarks/setup_trl.sh`` sets it
  up): GRPOTrainer on CPU, fp32, no gradient checkpointing, one generation per step; per-step time
  from ``on_step_end`` callbacks;
- graftkit: ``graftkit train grpo --init POLICY --tasks click-button --prompts-per-step 2
  --group-size 8 --max-new-tokens 16 --steps 20 --threads 1 --lr 1e-5 --beta 0 --loss dapo
  --epsilon 0.2 --seed 0 --json``; per-step time from the cumulative ``seconds`` of its
  ``train_log.jsonl``;
- graftkit Mu-GRPO: the same with ``--stages 4`` (four generation→optimisation stages over the same
  320 sampled episodes); the plain run above (``--stages 0``) is its near-on-policy counterpart;
- TRL with ``steps_per_generation`` = steps / stages, TRL's own staged counterpart (informational).

Seconds per step: the first step of each run is warm-up and left out; the median and min are over the
remaining steps of all repetitions. Peak RSS is the process tree's (measure.run_measured), imports
included. The Mu-GRPO ratio is the on-policy run's training-loop seconds over the staged run's (the
published claim: ≈ 2× faster), median over repetitions.

A difference the harness cannot remove and reports: graftkit's trainer plays multi-turn episodes
(``click-button`` allows 3 turns; an action that does not end the episode is followed by another
turn), while TRL samples one completion per episode. A random-init policy rarely ends an episode in one
turn, so graftkit then generates and trains on up to 3× the tokens; the table shows the generated
tokens per step of each side and a per-token ratio beside the per-step one. ``--policy DIR`` runs the
same comparison from another checkpoint (an SFT policy ends most episodes in one turn).

Target (ratio graftkit / TRL in the same run): seconds per step ≤ 0.5× (median). A missed target is
reported, not failed (benchmarks are not tests); exit status 1 when a tool fails or the two sides do
not see the same prompts. Output: the table and benchmarks/.work/grpo_results.json.

    python benchmarks/bench_grpo.py [--quick] [--repeats 3] [--skip-trl] [--policy DIR] [--stages 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from grpo_setting import Setting, load_policy, make_policy_dir, prompt_rows, read_jsonl  # noqa: E402
from measure import Measurement, gb, run_measured  # noqa: E402

# Read by benchmarks/run.py (with ast, without importing this module): the optional anchor.
ANCHOR = {
    "name": "TRL 1.16",
    "check": ".venv-trl/bin/python",
    "setup": "setup_trl.sh",
    "skip_flag": "--skip-trl",
}

WORK = HERE / ".work"
TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
TRL_SIDE = HERE / "trl_grpo.py"
GRAFTKIT_EXE = REPO / ".venv" / "bin" / "graftkit"
TARGETS = {"seconds_per_step_median": 0.5}
PUBLISHED_MU_SPEEDUP = 2.0
# One thread on both sides (each also calls torch.set_num_threads); nothing from the network.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "WANDB_DISABLED": "true", "WANDB_MODE": "disabled"}


class ToolFailed(RuntimeError):
    """A measured command exited non-zero or wrote no usable record."""


def _checked(m: Measurement, what: str) -> Measurement:
    try:
        return m.check(what)
    except RuntimeError as e:
        raise ToolFailed(str(e)) from None


# ------------------------------------------------------------------------------------------- sides

def graftkit_argv(exe: Path, policy: Path, out: Path, s: Setting, stages: int) -> list[str]:
    return [str(exe), "train", "grpo", "--init", str(policy), "--out", str(out), "--tasks", s.task,
            "--prompts-per-step", str(s.prompts_per_step), "--group-size", str(s.group_size),
            "--max-new-tokens", str(s.max_new_tokens), "--steps", str(s.steps), "--threads", str(s.threads),
            "--lr", str(s.lr), "--beta", str(s.beta), "--loss", s.loss, "--epsilon", str(s.epsilon),
            "--temperature", str(s.temperature), "--seed", str(s.seed), "--stages", str(stages),
            "--max-turns", "1",  # TRL samples one completion per prompt: one turn per episode here too
            "--force", "--json"]


def run_graftkit(exe: Path, policy: Path, s: Setting, stages: int, tag: str) -> dict:
    out = WORK / "out" / f"grpo-graftkit-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    argv = graftkit_argv(exe, policy, out, s, stages)
    m = _checked(run_measured(argv, env=ENV, cwd=REPO), f"graftkit train grpo ({' '.join(argv)})")
    log_path = out / "train_log.jsonl"
    if not log_path.is_file():
        raise ToolFailed(f"graftkit train grpo wrote no {log_path}")
    log = read_jsonl(log_path)
    if len(log) != s.steps:
        raise ToolFailed(f"{log_path}: {len(log)} steps logged, expected {s.steps}")
    cum = [float(r["seconds"]) for r in log]
    step_s = [cum[0]] + [b - a for a, b in zip(cum, cum[1:])]
    return {
        "side": "graftkit", "stages": stages, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
        "peak_rss_bytes": m.peak_rss_bytes, "peak_anon_bytes": m.peak_anon_bytes,
        "loop_s": cum[-1], "step_seconds": step_s,
        "generate_seconds": [float(r.get("gen_seconds", 0.0)) for r in log],
        "tokens": sum(int(r.get("tokens", 0)) for r in log),
        "episodes": sum(int(r.get("episodes", 0)) for r in log),
        "reward_mean": statistics.fmean(float(r.get("reward", 0.0)) for r in log),
        "max_staleness": max(int(r.get("staleness", 0)) for r in log),
    }


def run_trl(policy: Path, s: Setting, steps_per_generation: int, tag: str, trl_defaults: bool) -> dict:
    out = WORK / "out" / f"grpo-trl-{tag}.json"
    out.unlink(missing_ok=True)
    argv = [str(TRL_PYTHON), str(TRL_SIDE), "--policy", str(policy), "--out", str(out),
            "--setting", json.dumps(s.to_dict()), "--steps-per-generation", str(steps_per_generation)]
    if trl_defaults:
        argv.append("--trl-defaults")
    m = run_measured(argv, env=ENV, cwd=REPO)
    if m.returncode == 1 and out.is_file() and not json.loads(out.read_text())["prompts_match"]:
        raise ToolFailed(f"TRL trained on other prompts than planned: see {out}")
    _checked(m, f"TRL GRPOTrainer ({' '.join(argv)})")
    rec = json.loads(out.read_text())
    return {
        "side": "trl", "steps_per_generation": steps_per_generation, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
        "peak_rss_bytes": m.peak_rss_bytes, "peak_anon_bytes": m.peak_anon_bytes,
        "loop_s": rec["train_s"], "step_seconds": rec["step_seconds"],
        "generate_seconds": rec["generate_seconds"], "tokens": rec["completion_tokens"],
        "episodes": rec["episodes"], "reward_mean": rec["reward_mean"], "import_s": rec["import_s"],
        "bf16": rec["bf16"], "gradient_checkpointing": rec["gradient_checkpointing"],
        "versions": rec["versions"],
    }


def graftkit_has_grpo(exe: Path) -> bool:
    res = subprocess.run([str(exe), "train", "grpo", "--help"], env=ENV, capture_output=True, text=True)
    return res.returncode == 0


def check_prompt_plan(policy_dir: Path, s: Setting) -> str:
    """The harness's prompt seeds against graftkit's trainer, and their text round trip."""
    prompt_rows(load_policy(policy_dir), s)  # raises when text → ids does not give graftkit's ids
    try:
        from graftkit.train.grpo import GRPOConfig, _prompts
    except ImportError as e:
        return f"unchecked (graftkit.train.grpo: {e})"
    cfg = GRPOConfig(init=str(policy_dir), out=str(WORK / "unused"), tasks=(s.task,), steps=s.steps,
                     prompts_per_step=s.prompts_per_step, group_size=s.group_size, seed=s.seed)
    theirs = [(t, seed) for step in range(s.steps) for t, seed, _ in _prompts(cfg, step)]
    ours = [(s.task, seed) for seed in s.env_seeds()]
    if theirs != ours:
        raise ToolFailed(f"graftkit's trainer draws other prompts than the harness: {theirs[:3]} vs {ours[:3]}")
    return "ok"


# ----------------------------------------------------------------------------------------- summary

def _after_warmup(runs: list[dict]) -> list[float]:
    return [x for r in runs for x in r["step_seconds"][1:]]


def side_summary(runs: list[dict], steps: int) -> dict:
    xs = _after_warmup(runs)
    per_step_tokens = statistics.fmean(r["tokens"] for r in runs) / steps
    gen = [x for r in runs for x in r["generate_seconds"]]
    return {
        "runs": len(runs),
        "seconds_per_step_median": statistics.median(xs),
        "seconds_per_step_min": min(xs),
        "run_medians": [statistics.median(r["step_seconds"][1:]) for r in runs],
        "loop_s_median": statistics.median(r["loop_s"] for r in runs),
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
        "peak_rss_bytes_median": statistics.median(r["peak_rss_bytes"] for r in runs),
        "peak_anon_bytes_median": statistics.median(r["peak_anon_bytes"] for r in runs),
        "generated_tokens_per_step": per_step_tokens,
        "episodes_per_run": runs[0]["episodes"],
        "generate_seconds_per_step": sum(gen) / (len(runs) * steps),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in runs if r["reward_mean"] is not None)
        if any(r["reward_mean"] is not None for r in runs) else None,
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["git_commit"] = None
    for pkg in ("graftkit", "torch", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _row(name: str, sm: dict) -> str:
    return (f"{name:<34} {sm['seconds_per_step_median']:8.3f} {sm['seconds_per_step_min']:8.3f} "
            f"{sm['generate_seconds_per_step']:8.3f} {sm['generated_tokens_per_step']:8.0f} "
            f"{sm['loop_s_median']:8.2f} {sm['cpu_s_median']:8.2f} {sm['peak_rss_bytes_median'] / 1e9:8.2f} "
            f"{sm['peak_anon_bytes_median'] / 1e9:8.2f}")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except ToolFailed as e:
        print(f"\nFAILED: {e}", flush=True)
        return 1


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repetition instead of --repeats")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions (alternating order); default 3")
    ap.add_argument("--skip-trl", action="store_true", help="measure graftkit alone")
    ap.add_argument("--skip-graftkit", action="store_true", help="measure TRL alone")
    ap.add_argument("--policy", type=Path, default=None,
                    help="start both trainers from this HF folder instead of the tiny random-init policy")
    ap.add_argument("--size", default=Setting.size, help="tiny policy size (nano, micro, small)")
    ap.add_argument("--steps", type=int, default=Setting.steps)
    ap.add_argument("--stages", type=int, default=4, help="Mu-GRPO stages (0: skip the Mu-GRPO runs)")
    ap.add_argument("--no-trl-staged", action="store_true",
                    help="skip TRL with steps_per_generation = steps / stages")
    ap.add_argument("--trl-defaults", action="store_true",
                    help="run TRL with its bf16 autocast and gradient checkpointing defaults")
    ap.add_argument("--graftkit", type=Path, default=GRAFTKIT_EXE, help="graftkit executable")
    ap.add_argument("--results", type=Path, default=WORK / "grpo_results.json")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        ap.error("--repeats must be ≥ 1")
    if args.stages and args.steps % args.stages:
        ap.error(f"--stages {args.stages} must divide --steps {args.steps}")

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not args.skip_trl and not TRL_PYTHON.exists():
        log(f"TRL anchor missing: {TRL_PYTHON}\n  set it up with: bash {HERE / 'setup_trl.sh'}"
            "   (or pass --skip-trl)")
        return 2
    use_graftkit = not args.skip_graftkit
    if use_graftkit and not (args.graftkit.exists() and graftkit_has_grpo(args.graftkit)):
        log(f"graftkit side unavailable: `{args.graftkit} train grpo --help` fails; measuring TRL alone")
        use_graftkit = False
    if args.skip_trl and not use_graftkit:
        log("nothing to measure")
        return 2

    s = Setting(size=args.size, steps=args.steps)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "out").mkdir(exist_ok=True)
    policy = args.policy.resolve() if args.policy else make_policy_dir(WORK, s)
    plan = check_prompt_plan(policy, s)
    trl_staged = bool(args.stages) and not args.no_trl_staged and not args.skip_trl
    log(f"policy {policy}\n{s.prompts_per_step} prompts × {s.group_size} generations × ≤{s.max_new_tokens} "
        f"tokens per step, {s.steps} steps, task {s.task}, one thread; prompt plan vs graftkit's trainer: {plan}")

    # Each repetition runs every configuration once; the order reverses on alternate repetitions.
    configs: list[tuple[str, Callable[[int], dict]]] = []
    if not args.skip_trl:
        configs.append(("trl", lambda r: run_trl(policy, s, 1, f"r{r}", args.trl_defaults)))
    if use_graftkit:
        configs.append(("graftkit", lambda r: run_graftkit(args.graftkit, policy, s, 0, f"s0-r{r}")))
        if args.stages:
            configs.append((f"graftkit stages {args.stages}",
                            lambda r: run_graftkit(args.graftkit, policy, s, args.stages, f"s{args.stages}-r{r}")))
    if trl_staged:
        spg = s.steps // args.stages
        configs.append((f"trl steps_per_generation {spg}",
                        lambda r: run_trl(policy, s, spg, f"spg{spg}-r{r}", args.trl_defaults)))
    runs: dict[str, list[dict]] = {name: [] for name, _ in configs}
    for r in range(repeats):
        order = configs if r % 2 == 0 else configs[::-1]
        for name, fn in order:
            res = fn(r)
            runs[name].append(res)
            log(f"  [{r + 1}/{repeats}] {name:<30} {statistics.median(res['step_seconds'][1:]):6.3f} s/step"
                f"  loop {res['loop_s']:6.2f} s  wall {res['wall_s']:6.2f} s  rss {gb(res['peak_rss_bytes'])}"
                f"  tokens/step {res['tokens'] / s.steps:5.0f}")

    summary = {name: side_summary(rs, s.steps) for name, rs in runs.items()}
    ratios: dict = {}
    verdicts: dict = {}
    if "trl" in summary and "graftkit" in summary:
        g, t = summary["graftkit"], summary["trl"]
        ratios["seconds_per_step_median"] = _ratio(g["seconds_per_step_median"], t["seconds_per_step_median"])
        ratios["seconds_per_step_min"] = _ratio(g["seconds_per_step_min"], t["seconds_per_step_min"])
        ratios["seconds_per_token_median"] = _ratio(
            g["seconds_per_step_median"] / g["generated_tokens_per_step"],
            t["seconds_per_step_median"] / t["generated_tokens_per_step"])
        ratios["generated_tokens_per_step"] = _ratio(g["generated_tokens_per_step"], t["generated_tokens_per_step"])
        ratios["peak_rss_median"] = _ratio(g["peak_rss_bytes_median"], t["peak_rss_bytes_median"])
        ratios["process_cpu_s_median"] = _ratio(g["cpu_s_median"], t["cpu_s_median"])
        verdicts["seconds_per_step_median"] = ratios["seconds_per_step_median"] <= TARGETS["seconds_per_step_median"]
    mu_key = f"graftkit stages {args.stages}"
    if mu_key in runs:
        on, mu = runs["graftkit"], runs[mu_key]
        if on[0]["episodes"] != mu[0]["episodes"]:
            raise ToolFailed(f"Mu-GRPO sampled {mu[0]['episodes']} episodes, on-policy {on[0]['episodes']}")
        ratios["mu_grpo_speedup"] = _ratio(statistics.median(r["loop_s"] for r in on),
                                           statistics.median(r["loop_s"] for r in mu))
        ratios["mu_grpo_speedup_wall"] = _ratio(statistics.median(r["wall_s"] for r in on),
                                                statistics.median(r["wall_s"] for r in mu))
    trl_staged_key = next((k for k in runs if k.startswith("trl steps_per_generation")), None)
    if trl_staged_key and "trl" in runs:
        ratios["trl_staged_speedup"] = _ratio(statistics.median(r["loop_s"] for r in runs["trl"]),
                                              statistics.median(r["loop_s"] for r in runs[trl_staged_key]))

    log(f"\n{'':<34} {'s/step':>8} {'min':>8} {'gen s':>8} {'tok/step':>8} {'loop s':>8} {'cpu s':>8}"
        f" {'RSS GB':>8} {'anon GB':>8}")
    log(f"{'':<34} {'median':>8} {'':>8} {'/step':>8} {'':>8} {'median':>8} {'process':>8} {'median':>8}"
        f" {'median':>8}")
    for name, sm in summary.items():
        log(_row(name, sm))
    log("")
    if "seconds_per_step_median" in ratios:
        ok = "ok" if verdicts["seconds_per_step_median"] else "MISSED"
        log(f"graftkit / TRL seconds per step (median)   {ratios['seconds_per_step_median']:6.2f}×   "
            f"target ≤ {TARGETS['seconds_per_step_median']}×  {ok}")
        log(f"graftkit / TRL seconds per step (min)      {ratios['seconds_per_step_min']:6.2f}×")
        log(f"graftkit / TRL seconds per generated token {ratios['seconds_per_token_median']:6.2f}×   "
            f"(graftkit generates {ratios['generated_tokens_per_step']:.2f}× TRL's tokens per step)")
        log(f"graftkit / TRL peak RSS (median)           {ratios['peak_rss_median']:6.2f}×")
        log(f"graftkit / TRL process CPU seconds         {ratios['process_cpu_s_median']:6.2f}×   "
            "(whole process, imports and loading included; steadier than wall time on shared cores)")
        if ratios["generated_tokens_per_step"] > 1.2:
            log("  note: graftkit plays multi-turn episodes (an action that does not end the episode is followed "
                "by another turn); TRL samples one completion per episode")
    if "mu_grpo_speedup" in ratios:
        log(f"Mu-GRPO ({args.stages} stages) speed-up over on-policy, same {runs['graftkit'][0]['episodes']} "
            f"episodes: {ratios['mu_grpo_speedup']:.2f}× (training loop), {ratios['mu_grpo_speedup_wall']:.2f}× "
            f"(process wall); published ≈ {PUBLISHED_MU_SPEEDUP:.0f}×")
    if "trl_staged_speedup" in ratios:
        log(f"TRL {trl_staged_key.removeprefix('trl ')} speed-up over 1: {ratios['trl_staged_speedup']:.2f}× "
            "(informational)")

    record = {
        "benchmark": "grpo",
        "setting": s.to_dict(),
        "policy": str(policy),
        "prompt_plan": plan,
        "repeats": repeats,
        "targets": TARGETS,
        "ratios": ratios,
        "target_met": verdicts,
        "summary": summary,
        "runs": runs,
        "versions": {**_versions(), "trl_side": next((r["versions"] for r in runs.get("trl", [])), None)},
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=1, default=float))
    log(f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
