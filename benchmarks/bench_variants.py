"""The three GRPO variants' own claims, in miniature, on single-turn verifiable tasks: each paper's figure
printed beside graftkit's, measured in the same run.

The claims (each paper's abstract) and what stands for them here:

1. **Mu-GRPO** — "matches or exceeds the performance of standard GRPO while achieving around 2× speedup in
   wall-clock training time". Staged GRPO (``stages=4``: four generation→optimisation stages, every
   rollout of a stage sampled at its start, up to steps/stages − 1 policy versions stale) with relaxed
   clipping (``epsilon_high=0.28``, DAPO's clip-higher value, ε_low 0.2) and the negative-advantage veto
   against near-on-policy GRPO (``stages=0``, ε 0.2 both sides, no veto), at EQUAL samples: the same
   steps × prompts × group, checked from the logs' ``episodes`` (both arms consume exactly the same
   number of sampled completions). The veto's ε_v: in a response with Â < 0, every token after the
   first one whose ratio π_θ/π_old leaves [1 − ε_v, 1 + ε_v] is dropped (``advantages.veto_mask``).
   The abstract gives no value; this benchmark takes ε_v = 0.5 — outside the clip range
   [0.8, 1.28], so relaxed clipping still shapes every token the stale policy has not clearly left, and
   the veto only cuts the suffix after a token whose probability has halved or risen 1.5×: the
   "destabilising post-trigger suffix" where the dual-unbounded negative update (ρ > 1 + ε_high, Â < 0,
   unclipped) acts. ``--veto-epsilon`` changes it.
   Figures: the wall-clock ratio (on-policy training-loop seconds / staged, the logs' cumulative
   ``seconds``; median over ``--repeats`` repetitions in alternating order), the generation share of
   the on-policy step (Σ ``gen_seconds`` / ``seconds``), and both arms' held-out greedy success with a
   paired comparison (``stats.compare``, staged − on-policy, on identical items). Why few prompts per
   step: graftkit's trainer decodes a stage's rollouts in batches of max(64, P·G) episodes, so staging
   saves only where one step's P·G = 16 leaves the batch underfilled (plus one policy switch per stage
   instead of per step); the paper's saving is mostly the switching between an inference engine and
   the trainer, which an in-process trainer does not pay.
2. **VeriGate** — "substantially reduces zero-gradient failures" and improves accuracy (≈ +20% relative
   at 1.5B). With and without ``verigate`` at equal steps from the same SFT policy on ``arithmetic-2``,
   where the SFT policy rarely succeeds, so most groups have all-equal outcome rewards. Zero-gradient
   share: without, the mean ``frac_reward_zero_std`` (groups with all-equal rewards); with, the mean
   ``verigate_none`` (groups whose process scores — the share of right digit columns — are all equal
   too). Also held-out greedy success after equal steps, paired (VeriGate − plain).
3. **Focal difficulty scaling** — Qwen2.5-7B at N = 8, pass@256 64.1 → 70.3 (GRPO → focal). GRPO against
   focal weights (1 − p̂)^γ, γ ∈ ``--gammas`` (1, 2), at N = 8 on ``multiples`` (K = 6 correct answers per
   item, the SFT demonstrator gives the i-th smallest with probability ∝ 2^−i: common and rare correct
   answers). Per held-out item, ``--samples`` n = 16 samples at temperature 1: pass@k for k = 1, 2, 4, 8
   (the unbiased estimator 1 − C(n − c, k)/C(n, k), ``stats.pass_at_k``) and the number of distinct
   correct answers among the n samples, for the SFT policy, GRPO and each focal arm.

Every GRPO arm: G = 8, lr 3e-4, the trainer's default loss (dapo) and ε_low 0.2, temperature 1, ≤ 12 new
tokens, β = 0, one torch thread (``--threads``), seed 0, in this process (``run_grpo``); Mu-GRPO 80 steps,
VeriGate and focal 160 steps. Held-out evaluation: 20 seeds × 20 episodes (400 items drawn from the
evaluation split, ``agent.evaluate``), greedy or 16 samples at temperature 1.

The starting SFT policy is trained here on the benchmark's tasks (``multiples``, ``arithmetic-2``) with a
recipe that leaves partial success (a nano policy, 1500 steps; its held-out greedy success is printed),
cached under ``benchmarks/.work/variants-sft-<hash of its config>`` and reused when present, or given with
``--policy DIR``. Every GRPO arm starts from it with the same seed, so the first step of two arms on one
task samples identical groups.

Verdicts (``verdicts``: pure functions of the figures, each can come out either way; intervals are 95%):

- Mu-GRPO speed-up: reproduced when the median ratio is ≥ 1.5 (nearer the paper's 2× than to none).
- Mu-GRPO quality: "equal quality" when ``stats.compare``'s verdict on staged − on-policy is not
  "credibly worse" (its bootstrap and Bayesian intervals not both below 0: the interval includes 0 or
  favours staged).
- VeriGate zero-gradient groups: reproduced when the share with VeriGate is at most half the share without.
- VeriGate accuracy: reproduced when ``stats.compare`` calls VeriGate − plain "credibly better".
- Focal: for each γ, "more distinct correct answers" and "higher pass@8" than GRPO, each reproduced when
  the paired interval of focal − GRPO per item lies above 0. Per-item pass@8 from 16 samples and distinct
  counts are not 0/1 outcomes, so their interval is a cluster bootstrap here (:func:`paired_mean_interval`:
  percentile interval of Σd/Σn over resampled clusters).

Every paired interval clusters by item, as ``graftkit eval`` does (``EvalResult.clustered``): on a verifiable
task an evaluation seed only draws problems, so the resampled unit is the distinct item, and an item drawn
twice is one cluster. (``stats.cluster_labels``, which also links episodes of one seed, would merge all ten
seeds of ``multiples`` into one component through a handful of repeated items.)

A benchmark, not a test: the figures are printed, all of them go to ``benchmarks/.work/variants_results.json``,
and the status is 0 whatever the verdicts say (1 when the equal-samples invariant fails).

    python benchmarks/bench_variants.py [--quick] [--policy DIR] [--threads 1] [--repeats 3] [--results PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"

PAPER = {
    "mu_grpo": {"speedup": 2.0, "quality": "matches or exceeds standard GRPO",
                "source": "Mu-GRPO abstract: around 2x speedup in wall-clock training time, five models, math"},
    "verigate": {"zero_gradient": "substantially reduces zero-gradient failures", "relative_accuracy": 0.20,
                 "source": "VeriGate abstract: ≈ +20% relative accuracy at 1.5B"},
    "focal": {"model": "Qwen2.5-7B", "group_size": 8, "metric": "average math pass@256", "grpo": 64.1,
              "focal": 70.3, "source": "focal difficulty scaling abstract"},
}
#: Mu-GRPO's speed-up counts as reproduced from this ratio on (the midpoint between 1× and the paper's 2×).
SPEEDUP_REPRODUCED = 1.5
#: VeriGate's "substantially fewer zero-gradient groups": at most this share of the plain run's.
ZERO_GRADIENT_REPRODUCED = 0.5


@dataclass(frozen=True)
class Setting:
    """Every knob of one benchmark run (saved with the figures)."""

    size: str = "nano"
    sft_steps: int = 1500
    sft_lr: float = 3e-3
    sft_batch: int = 32
    sft_tasks: tuple[str, ...] = ("multiples", "arithmetic-2")
    mu_task: str = "multiples"
    mu_steps: int = 80
    mu_prompts: int = 2
    stages: int = 4
    epsilon_high: float = 0.28
    veto_epsilon: float = 0.5
    repeats: int = 5
    verigate_task: str = "arithmetic-2"
    verigate_steps: int = 160
    verigate_prompts: int = 4
    focal_task: str = "multiples"
    focal_steps: int = 160
    focal_prompts: int = 4
    gammas: tuple[float, ...] = (1.0, 2.0)
    group_size: int = 8
    lr: float = 3e-4
    max_new_tokens: int = 12
    temperature: float = 1.0
    eval_seeds: int = 20
    eval_episodes: int = 20
    samples: int = 16
    ks: tuple[int, ...] = (1, 2, 4, 8)
    threads: int = 1
    seed: int = 0


QUICK = dict(sft_steps=400, mu_steps=8, verigate_steps=8, focal_steps=8, repeats=1, eval_seeds=4, eval_episodes=10,
             samples=8, gammas=(1.0,))


# ------------------------------------------------------------------------------------------ pure figures


def training_seconds(log: list[dict]) -> float:
    """The training loop's wall-clock seconds: the last step's cumulative ``seconds``."""
    return float(log[-1]["seconds"])


def generation_share(log: list[dict]) -> float:
    """Σ ``gen_seconds`` / training seconds: the share of the loop spent sampling (with old log-probs)."""
    return sum(float(m["gen_seconds"]) for m in log) / training_seconds(log)


def sampled_completions(log: list[dict]) -> int:
    """Σ ``episodes``: sampled completions the run consumed (one per episode on a single-turn task)."""
    return sum(int(m["episodes"]) for m in log)


def log_mean(log: list[dict], key: str) -> float:
    """Mean of ``key`` over the steps."""
    return statistics.fmean(float(m[key]) for m in log)


def pass_at_k_per_item(correct: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k per item from ``correct [item, n]`` (0/1 per sample): ``stats.pass_at_k(n, c, k)``."""
    from graftkit.stats import pass_at_k

    n = correct.shape[1]
    return np.array([pass_at_k(n, int(c), k) for c in correct.sum(1)])


def distinct_correct(answers: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Distinct correct answers per item among its samples: ``answers [item, n]`` (str), ``correct [item, n]``."""
    return np.array([len({a for a, ok in zip(row, oks) if ok}) for row, oks in zip(answers, correct)], float)


def paired_mean_interval(a, b, clusters, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict:
    """mean(b) − mean(a) over paired items with a cluster bootstrap percentile interval.

    d_i = b_i − a_i; clusters s (labels, one per item) drawn S times with replacement; θ* = Σ_{s*} Σ_{i∈s*} d_i /
    Σ_{s*} n_s (the ratio estimator over the resampled clusters); interval = the (1 ∓ level)/2 quantiles of θ*.
    ``numpy.random.default_rng(seed)``."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    labels = np.asarray(clusters)
    if a.shape != b.shape or a.ndim != 1 or labels.shape != a.shape or a.size == 0:
        raise ValueError(f"paired_mean_interval: a {a.shape}, b {b.shape}, clusters {labels.shape}: expected equal 1-d")
    _, idx = np.unique(labels, return_inverse=True)
    d = b - a
    sums, sizes = np.bincount(idx, weights=d), np.bincount(idx).astype(float)
    draws = np.random.default_rng(seed).integers(0, sums.size, (n_boot, sums.size))
    theta = sums[draws].sum(1) / sizes[draws].sum(1)
    lo, hi = np.quantile(theta, [(1 - level) / 2, (1 + level) / 2])
    return {"diff": float(d.mean()), "low": float(lo), "high": float(hi), "level": level, "n_boot": n_boot,
            "seed": seed, "n_items": int(a.size), "n_clusters": int(sums.size),
            "method": "cluster bootstrap percentile interval of Σd/Σn over resampled clusters (items)"}


def comparison_figures(cmp) -> dict:
    """A ``stats.Comparison`` (b against a) as JSON-ready figures."""
    return {"rate_a": cmp.rate_a.rate, "rate_b": cmp.rate_b.rate, "diff": cmp.diff,
            "bootstrap": [cmp.bootstrap.low, cmp.bootstrap.high], "bayes": [cmp.bayes.low, cmp.bayes.high],
            "mcnemar_p": cmp.mcnemar.p_value, "verdict": cmp.verdict, "n": cmp.rate_a.n, "level": cmp.level}


def config_hash(d: dict) -> str:
    """12 hex digits of the sha256 of ``d`` as sorted JSON: the SFT cache key."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------ verdicts


def _iv(x: list[float] | dict) -> str:
    lo, hi = (x["low"], x["high"]) if isinstance(x, dict) else x
    return f"[{lo:+.3f}, {hi:+.3f}]"


def mu_verdicts(mu: dict) -> list[tuple[str, str, bool]]:
    """Mu-GRPO: (claim, measured, reproduced) for the speed-up and for equal quality (see the docstring)."""
    on, st = mu["arms"]["on_policy"], mu["arms"]["staged"]
    c = mu["comparison"]
    return [
        (f"paper: Mu-GRPO ≈ {PAPER['mu_grpo']['speedup']:.0f}× faster in wall-clock at equal samples",
         f"{mu['speedup']:.2f}× (median of paired repetitions; on-policy {statistics.median(on['seconds']):.2f} s / staged "
         f"{statistics.median(st['seconds']):.2f} s, {mu['episodes']} completions each; generation "
         f"{mu['generation_share_on_policy']:.0%} of the on-policy loop)", mu["speedup"] >= SPEEDUP_REPRODUCED),
        ("paper: Mu-GRPO matches or exceeds GRPO (held-out greedy success)",
         f"on-policy {c['rate_a']:.3f} → staged {c['rate_b']:.3f}, diff {c['diff']:+.3f} "
         f"bootstrap {_iv(c['bootstrap'])} bayes {_iv(c['bayes'])}: {c['verdict']}", c["verdict"] != "credibly worse"),
    ]


def verigate_verdicts(vg: dict) -> list[tuple[str, str, bool]]:
    """VeriGate: (claim, measured, reproduced) for zero-gradient groups and for accuracy."""
    off, on = vg["arms"]["plain"], vg["arms"]["verigate"]
    c = vg["comparison"]
    rel = f"{c['rate_b'] / c['rate_a'] - 1:+.0%} relative" if c["rate_a"] else "relative change undefined (plain 0)"
    return [
        ("paper: VeriGate substantially reduces zero-gradient groups",
         f"zero-advantage groups {off['zero_std_share']:.3f} without (frac_reward_zero_std) → "
         f"{on['none_share']:.3f} with (verigate_none; outcome rewards were all equal in {on['zero_std_share']:.3f} "
         "of its groups, which fell back to process scores)",
         off["zero_std_share"] > 0 and on["none_share"] <= ZERO_GRADIENT_REPRODUCED * off["zero_std_share"]),
        (f"paper: VeriGate improves accuracy (≈ +{PAPER['verigate']['relative_accuracy']:.0%} relative at 1.5B)",
         f"plain {c['rate_a']:.3f} → VeriGate {c['rate_b']:.3f} ({rel}), diff {c['diff']:+.3f} bootstrap "
         f"{_iv(c['bootstrap'])} bayes {_iv(c['bayes'])}: {c['verdict']}", c["verdict"] == "credibly better"),
    ]


def focal_verdicts(fo: dict) -> list[tuple[str, str, bool]]:
    """Focal: per γ arm, (claim, measured, reproduced) for distinct correct answers and pass@8 over GRPO."""
    out = []
    k = max(fo["ks"])
    for name, cmp in fo["comparisons"].items():
        label = fo["arms"][name]["label"]
        for key, claim in (("distinct_correct", "keeps more distinct correct answers per item"),
                           (f"pass@{k}", f"reaches a higher pass@{k}")):
            x = cmp[key]
            out.append((f"paper: focal {claim} than GRPO [{label}]",
                        f"GRPO {fo['arms']['grpo'][key]:.3f} vs {label} {fo['arms'][name][key]:.3f}, diff "
                        f"{x['diff']:+.3f} {_iv(x)}", x["low"] > 0))
    return out


def verdicts(figures: dict) -> list[tuple[str, str, bool]]:
    """Every claim's (claim, measured, reproduced), from the figures alone."""
    return mu_verdicts(figures["mu_grpo"]) + verigate_verdicts(figures["verigate"]) + focal_verdicts(figures["focal"])


# ------------------------------------------------------------------------------------------ running


def sft_config(s: Setting, out: Path):
    from graftkit.train.sft import SFTConfig

    return SFTConfig(out=str(out), budgets={t: 1_000_000 for t in s.sft_tasks}, size=s.size, steps=s.sft_steps,
                     batch_size=s.sft_batch, lr=s.sft_lr, warmup=20, threads=s.threads, seed=s.seed, device="cpu")


def sft_policy(s: Setting, work: Path) -> tuple[Path, bool, str]:
    """The cached SFT policy of ``s`` (trained when absent): (folder, was cached, config hash)."""
    from graftkit.train.sft import run_sft

    key = {k: v for k, v in sft_config(s, Path(".")).recorded().items() if k != "out"}
    h = config_hash(key)
    out = work / f"variants-sft-{h}"
    if (out / "graftkit.json").is_file():
        return out, True, h
    run_sft(sft_config(s, out), force=True)
    return out, False, h


def grpo_config(s: Setting, init: Path, out: Path, task: str, steps: int, prompts: int, **variant):
    from graftkit.train.grpo import GRPOConfig

    return GRPOConfig(init=str(init), out=str(out), tasks=(task,), steps=steps, prompts_per_step=prompts,
                      group_size=s.group_size, lr=s.lr, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                      threads=s.threads, seed=s.seed, device="cpu", **variant)


def train(cfg) -> list[dict]:
    """Run one GRPO arm; its per-step log."""
    from graftkit.train.grpo import run_grpo

    out = run_grpo(cfg, force=True)
    return [json.loads(line) for line in (Path(out) / "train_log.jsonl").read_text().splitlines() if line]


@dataclass
class Scored:
    """One policy's held-out outcomes on one task: flat over (seed, episode) items, samples as columns."""

    success: np.ndarray  # [item, n] bool
    answers: np.ndarray  # [item, n] str: the stated number of a correct completion, else ""
    clusters: np.ndarray  # [item] the item id: the unit paired intervals resample


def score(path: Path, task: str, s: Setting, greedy: bool) -> Scored:
    """Held-out items of ``task`` (``s.eval_seeds`` × ``s.eval_episodes``), greedy or ``s.samples`` samples."""
    from graftkit.agent import Decode, evaluate, load_policy
    from graftkit.verifiable import extract_answer, parse_number

    policy = load_policy(path, device="cpu")
    decode = Decode(greedy=greedy, temperature=s.temperature, max_new_tokens=s.max_new_tokens, seed=s.seed + 1)
    texts: dict[tuple[int, int], str] = {}
    keep = lambda ep: texts.__setitem__((ep.seed, ep.sample), ep.turns[0].action if ep.turns else "")  # noqa: E731
    out = evaluate(policy, [task], list(range(s.eval_seeds)), s.eval_episodes, decode,
                   samples=1 if greedy else s.samples, on_episode=keep)
    success = out.success[0].reshape(s.eval_seeds * s.eval_episodes, -1)
    env_seeds = out.env_seed[0].ravel()
    answers = np.empty(success.shape, object)
    for i, env_seed in enumerate(env_seeds):
        for k in range(success.shape[1]):
            value = parse_number(extract_answer(texts[(int(env_seed), k)])) if success[i, k] else None
            answers[i, k] = "" if value is None else str(int(value))
    return Scored(success, answers, np.array([f"{task}/{x}" for x in out.item[0].ravel()], dtype=object))


def greedy_compare(a: Scored, b: Scored) -> dict:
    from graftkit.stats import compare

    return comparison_figures(compare(a.success[:, 0].astype(int), b.success[:, 0].astype(int), clusters=a.clusters))


def rate(x: Scored) -> dict:
    from graftkit.stats import wilson_interval

    w = wilson_interval(int(x.success[:, 0].sum()), int(x.success.shape[0]))
    return {"success": w.rate, "low": w.low, "high": w.high, "n": w.n}


def measure_mu(s: Setting, init: Path, work: Path, log) -> dict:
    arms = {"on_policy": {}, "staged": {"stages": s.stages, "epsilon_high": s.epsilon_high,
                                        "veto_epsilon": s.veto_epsilon}}
    seconds: dict[str, list[float]] = {a: [] for a in arms}
    logs: dict[str, list[dict]] = {}
    for r in range(s.repeats):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            cfg = grpo_config(s, init, work / f"mu-{name}", s.mu_task, s.mu_steps, s.mu_prompts, **arms[name])
            got = train(cfg)
            seconds[name].append(training_seconds(got))
            if name in logs and [m["reward"] for m in logs[name]] != [m["reward"] for m in got]:
                raise RuntimeError(f"Mu-GRPO {name}: repetition {r} trained differently from the first")
            logs[name] = got
            log(f"  Mu-GRPO {name} repetition {r + 1}: {seconds[name][-1]:.2f} s")
    scored = {name: score(work / f"mu-{name}", s.mu_task, s, greedy=True) for name in arms}
    ratios = [a / b for a, b in zip(seconds["on_policy"], seconds["staged"])]
    episodes = {name: sampled_completions(logs[name]) for name in arms}
    return {
        "task": s.mu_task,
        "arms": {name: {"variant": arms[name], "seconds": seconds[name], "episodes": episodes[name],
                        "generation_share": generation_share(logs[name]), "greedy": rate(scored[name]),
                        "max_staleness": max(int(m["staleness"]) for m in logs[name])} for name in arms},
        # each repetition runs both arms back to back (order alternating), so its ratio cancels the machine's drift
        # between repetitions; the median of those paired ratios is the figure
        "speedup": statistics.median(ratios),
        "speedup_repeats": ratios,
        "generation_share_on_policy": generation_share(logs["on_policy"]),
        "episodes": episodes["on_policy"],
        "equal_samples": episodes["on_policy"] == episodes["staged"]
        == s.mu_steps * s.mu_prompts * s.group_size,
        "comparison": greedy_compare(scored["on_policy"], scored["staged"]),
    }


def measure_verigate(s: Setting, init: Path, work: Path, log) -> dict:
    logs, scored = {}, {}
    for name, on in (("plain", False), ("verigate", True)):
        logs[name] = train(grpo_config(s, init, work / f"vg-{name}", s.verigate_task, s.verigate_steps,
                                       s.verigate_prompts, verigate=on))
        scored[name] = score(work / f"vg-{name}", s.verigate_task, s, greedy=True)
        log(f"  VeriGate {name}: {training_seconds(logs[name]):.2f} s")
    v = logs["verigate"]
    return {
        "task": s.verigate_task,
        "arms": {"plain": {"zero_std_share": log_mean(logs["plain"], "frac_reward_zero_std"),
                           "train_success": log_mean(logs["plain"], "success"), "greedy": rate(scored["plain"])},
                 "verigate": {"zero_std_share": log_mean(v, "frac_reward_zero_std"),
                              "none_share": log_mean(v, "verigate_none"),
                              "process_share": log_mean(v, "verigate_process"),
                              "outcome_share": log_mean(v, "verigate_outcome"),
                              "train_success": log_mean(v, "success"), "greedy": rate(scored["verigate"])}},
        "comparison": greedy_compare(scored["plain"], scored["verigate"]),
    }


def sampled_figures(x: Scored, ks: tuple[int, ...]) -> tuple[dict, dict[str, np.ndarray]]:
    per_item = {f"pass@{k}": pass_at_k_per_item(x.success, k) for k in ks}
    per_item["distinct_correct"] = distinct_correct(x.answers, x.success)
    return {key: float(v.mean()) for key, v in per_item.items()}, per_item


def measure_focal(s: Setting, init: Path, work: Path, log) -> dict:
    arms = {"grpo": 0.0, **{f"focal_gamma{g:g}": g for g in s.gammas}}
    per_item, figures = {}, {}
    sft = score(init, s.focal_task, s, greedy=False)
    figures["sft"], per_item["sft"] = sampled_figures(sft, s.ks)
    figures["sft"]["label"] = "SFT"
    for name, gamma in arms.items():
        got = train(grpo_config(s, init, work / f"focal-{name}", s.focal_task, s.focal_steps, s.focal_prompts,
                                focal_gamma=gamma))
        figures[name], per_item[name] = sampled_figures(score(work / f"focal-{name}", s.focal_task, s, greedy=False),
                                                        s.ks)
        figures[name].update(label="GRPO" if not gamma else f"focal γ={gamma:g}", gamma=gamma,
                             focal_weight_mean=log_mean(got, "focal_weight_mean"))
        log(f"  focal {name}: {training_seconds(got):.2f} s")
    comparisons = {name: {key: paired_mean_interval(per_item["grpo"][key], per_item[name][key], sft.clusters,
                                                    seed=s.seed)
                          for key in ("distinct_correct", f"pass@{max(s.ks)}")}
                   for name in arms if name != "grpo"}
    return {"task": s.focal_task, "ks": list(s.ks), "samples": s.samples, "group_size": s.group_size,
            "arms": figures, "comparisons": comparisons}


def measure(s: Setting, work: Path, policy: Path | None = None, log=lambda m: None) -> dict:
    """All figures of one run as a JSON-ready dict (see the module docstring)."""
    import torch

    torch.set_num_threads(s.threads)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if policy is None:
        init, cached, h = sft_policy(s, work)
    else:
        init, cached, h = policy.resolve(), True, None
    log(f"SFT policy {init} ({'cached' if cached else 'trained'})")
    tasks = list(dict.fromkeys((s.mu_task, s.verigate_task, s.focal_task)))
    sft = {"path": str(init), "cached": cached, "config_hash": h,
           "greedy": {t: rate(score(init, t, s, greedy=True)) for t in tasks}}
    runs = work / "variants"
    figures = {"benchmark": "variants", "setting": asdict(s), "paper": PAPER, "sft": sft,
               "mu_grpo": measure_mu(s, init, runs, log), "verigate": measure_verigate(s, init, runs, log),
               "focal": measure_focal(s, init, runs, log)}
    figures["verdicts"] = [{"claim": c, "measured": m, "reproduced": ok} for c, m, ok in verdicts(figures)]
    figures["seconds"] = time.perf_counter() - t0
    return figures


# ------------------------------------------------------------------------------------------ output


def render(fig: dict) -> str:
    s, mu, vg, fo = fig["setting"], fig["mu_grpo"], fig["verigate"], fig["focal"]
    lines = [f"SFT policy {fig['sft']['path']} ({'cached' if fig['sft']['cached'] else 'trained'}): held-out greedy "
             "success " + ", ".join(f"{t} {r['success']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (n={r['n']})"
                                    for t, r in fig["sft"]["greedy"].items()), ""]
    on, st = mu["arms"]["on_policy"], mu["arms"]["staged"]
    lines += [f"Mu-GRPO on {mu['task']}: {s['mu_steps']} steps × {s['mu_prompts']} prompts × G {s['group_size']} = "
              f"{mu['episodes']} completions per arm (equal samples: {'yes' if mu['equal_samples'] else 'NO'}); staged "
              f"= {s['stages']} stages, ε_high {s['epsilon_high']}, veto ε_v {s['veto_epsilon']}, staleness ≤ "
              f"{st['max_staleness']}",
              f"  {'':<36} {'paper':>16}   graftkit",
              f"  {'wall-clock ratio on-policy/staged':<36} {'≈ 2×':>16}   {mu['speedup']:.2f}× (repeats "
              + ", ".join(f"{r:.2f}" for r in mu["speedup_repeats"]) + ")",
              f"  {'generation share, on-policy step':<36} {'—':>16}   {mu['generation_share_on_policy']:.2f} "
              f"(staged {st['generation_share']:.2f}, with old log-probs)",
              f"  {'held-out greedy success':<36} {'matches/exceeds':>16}   on-policy {on['greedy']['success']:.3f}, "
              f"staged {st['greedy']['success']:.3f}", ""]
    p, v = vg["arms"]["plain"], vg["arms"]["verigate"]
    lines += [f"VeriGate on {vg['task']}: {s['verigate_steps']} steps × {s['verigate_prompts']} prompts × G "
              f"{s['group_size']}, same SFT policy and seed",
              f"  {'':<36} {'paper':>16}   graftkit",
              f"  {'zero-advantage groups':<36} {'substantially ↓':>16}   {p['zero_std_share']:.3f} without → "
              f"{v['none_share']:.3f} with (process path {v['process_share']:.3f}, outcome {v['outcome_share']:.3f})",
              f"  {'held-out greedy success':<36} {'≈ +20% relative':>16}   plain {p['greedy']['success']:.3f}, "
              f"VeriGate {v['greedy']['success']:.3f}", ""]
    lines += [f"Focal on {fo['task']}: N = {fo['group_size']}, {s['focal_steps']} steps × {s['focal_prompts']} "
              "prompts; "
              f"{fo['samples']} samples per held-out item (paper: {PAPER['focal']['model']} pass@256 "
              f"{PAPER['focal']['grpo']} → {PAPER['focal']['focal']})",
              f"  {'arm':<14}" + "".join(f"{'pass@' + str(x):>9}" for x in fo["ks"]) + f"{'distinct':>10}"]
    for arm in fo["arms"].values():
        lines.append(f"  {arm['label']:<14}" + "".join(f"{arm[f'pass@{x}']:>9.3f}" for x in fo["ks"])
                     + f"{arm['distinct_correct']:>10.3f}")
    lines.append("")
    for v_ in fig["verdicts"]:
        outcome = "reproduced" if v_["reproduced"] else "not reproduced"
        lines.append(f"{v_['claim']} — measured: {v_['measured']}: {outcome}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run (≤ 3 min): 400 SFT steps, 8 GRPO steps per arm")
    ap.add_argument("--policy", type=Path, default=None, help="start every arm from this SFT policy folder")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every run (default 1: steadier timing)")
    ap.add_argument("--repeats", type=int, default=None, help="Mu-GRPO timing repetitions (default 5, --quick 1)")
    ap.add_argument("--veto-epsilon", type=float, default=Setting.veto_epsilon, help="Mu-GRPO veto ε_v")
    ap.add_argument("--gammas", default=None, help="focal γ values, comma-separated (default 1,2; --quick 1)")
    ap.add_argument("--work", type=Path, default=WORK, help="cache and run folder")
    ap.add_argument("--results", type=Path, default=WORK / "variants_results.json")
    args = ap.parse_args(argv)
    s = replace(Setting(), **QUICK) if args.quick else Setting()
    s = replace(s, threads=args.threads, veto_epsilon=args.veto_epsilon)
    if args.repeats is not None:
        s = replace(s, repeats=args.repeats)
    if args.gammas:
        s = replace(s, gammas=tuple(float(g) for g in args.gammas.split(",")))
    if s.threads < 1 or s.repeats < 1 or not s.veto_epsilon > 0 or any(g <= 0 for g in s.gammas):
        ap.error("--threads and --repeats must be ≥ 1, --veto-epsilon and every γ > 0")
    if args.policy is not None and not (args.policy / "config.json").is_file():
        ap.error(f"--policy {args.policy}: not an HF model folder (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    figures = run(s, args.work, args.policy, args.results)
    return 0 if figures["mu_grpo"]["equal_samples"] else 1


def run(s: Setting, work: Path, policy: Path | None, results: Path) -> dict:
    """Measure, print the table and verdicts, write every figure to ``results``; the figures."""
    figures = measure(s, work, policy, log=lambda m: print(m, flush=True))
    print("\n" + render(figures))
    print(f"\n{figures['seconds']:.0f} s")
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(figures, indent=1, default=float))
    print(f"wrote {results}")
    return figures


if __name__ == "__main__":
    sys.exit(main())
