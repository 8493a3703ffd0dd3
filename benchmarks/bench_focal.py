"""Focal difficulty scaling in the paper's categorical abstraction: GRPO against focal weights, side by side.

The claims (the focal difficulty-scaling paper's abstract): at practical group sizes a GRPO update can
miss the rare-correct answers while its group still has mixed rewards, and then concentrates probability
on the common sampled solution; the probability of such a *tail-miss* is non-monotonic in the group size
N; in the categorical abstraction the unsampled-correct mass can shrink even as the total correct mass
grows; a focal coefficient w = (1 − p̂)^γ on each group's update (p̂ its sampled success rate) protects
the rare-correct answers. The paper's LLM figure — Qwen2.5-7B at N = 8, average math pass@256
64.1 → 70.3 (GRPO → GRPO + focal) — is printed as context; this simulation does not measure it.

The setting. One categorical "prompt": a softmax policy π_θ over M = 20 answers with logits θ, answers
0..K−1 (K = 4) correct. Answer 0 is the *common* correct answer, answers 1..K−1 the *rare* ones. The
initial policy is π₀ = (0.30 common, 0.02 for each rare one, 0.04 for each of the 16 incorrect ones),
θ₀ = log π₀. Why this initialisation: the common answer holds 5/6 of the correct mass and pass@1 is
0.36, so there is room to learn; each rare answer has half an incorrect answer's mass, so a group of 8
misses all three with probability 0.94⁸ ≈ 0.61 and most mixed-reward updates are the tail-miss updates
the paper describes (P ≈ 0.58 at N = 8, below), yet a group still holds 0.48 rare samples on average,
so a coefficient that protects them has samples to work with.

Each step of a run (graftkit's own functions from ``graftkit.train.advantages``):

    a_1..a_N ~ π_θ                       N = 8 samples, torch.multinomial with a seeded torch.Generator
    R_i = 1[a_i correct]
    Â_i = group_advantages(R, "group")   (R_i − mean R) / (σ + 1e-4), σ unbiased; 0 when all R_i equal
    w = focal_weight(p̂, γ)              (1 − p̂)^γ, p̂ = mean R; γ = 0 (w = 1) is plain GRPO
    θ ← θ + lr · w · (1/N) Σ_i Â_i (e_{a_i} − π_θ)   the exact softmax score ∇_θ log π_θ(a) = e_a − π_θ

with a fixed learning rate (``--lr``, default 0.2), ``--steps`` steps (200), ``--runs`` independent runs
per arm (200, rows of one batch drawn from one generator seeded with ``--seed``), arms γ ∈ {0, 1, 2}.
Every arm starts from the same generator seed.

Measures of the policy after each step, per run, all exact functions of π (c ranges over the correct
answers, k over 1, 8, 64, 256):

- correct mass        Σ_c π_c  (= pass@1)
- rare-correct mass   Σ_{c rare} π_c
- unsampled-correct   E[mass of the correct answers absent from a group of N] = Σ_c π_c (1 − π_c)^N
- pass@k              1 − (1 − Σ_c π_c)^k, the probability that k samples hold any correct answer
- coverage@k          (1/K) Σ_c [1 − (1 − π_c)^k], the expected number of distinct correct answers among
                      k samples over K: the multi-answer analogue of what pass@256 rewards. coverage@k ≤
                      pass@k, since the number of distinct correct answers is ≤ K · 1[any]. On one prompt
                      whose correct mass stays ≥ 0.36 (its start), pass@256 ≥ 1 − 0.64²⁵⁶ rounds to 1 in
                      float64, so pass@256 cannot separate the arms here; coverage@256 can.

Each is reported as its mean over runs with a 95% normal interval, mean ± 1.96 · s/√runs (s the
unbiased standard deviation over runs), clipped to [0, 1], where every measure lies.

The tail-miss probability under π₀, exact: with q_c the mass of the common correct answer and q_w the
incorrect mass, a group of N has mixed rewards and misses every rare-correct answer with probability
P(N) = (q_c + q_w)^N − q_c^N − q_w^N (all N samples outside the rare answers, not all common-correct and
not all incorrect), tabulated for N = 1..64.

The verdicts (``verdicts``, a pure function of the figures; each comes out either way): the tail-miss
curve rises and then falls; GRPO's correct mass grows while its unsampled-correct and rare-correct
masses shrink (step 0 against the last step, intervals separate); each focal arm keeps more rare-correct
mass, and more coverage@256 and pass@256, than GRPO at the last step (intervals separate). A control that
is no claim of the paper: a smaller step also loses rare mass more slowly, so each focal arm is also
compared with GRPO at equal total correct mass c* (the lowest last-step correct mass of the arms; each
arm's curves are interpolated linearly in the step at the first crossing of c*).

A benchmark, not a test: the figures are printed and the status is 0 whatever the verdicts say.

    python benchmarks/bench_focal.py [--quick] [--runs 200] [--steps 200] [--lr 0.2] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from graftkit.train.advantages import focal_weight, group_advantages

Tensor = torch.Tensor
DTYPE = torch.float64

N_ANSWERS = 20  # M
N_CORRECT = 4  # K: answer 0 common, answers 1..K−1 rare
COMMON_MASS = 0.30
RARE_MASS_EACH = 0.02
GROUP_SIZE = 8  # N
GAMMAS = (0.0, 1.0, 2.0)
PASS_KS = (1, 8, 64, 256)
TAIL_MISS_NS = tuple(range(1, 65))
TABLE_STEPS = (0, 50, 100, 200)
Z95 = 1.959963984540054
PAPER = {
    "model": "Qwen2.5-7B", "group_size": 8, "metric": "average math pass@256",
    "grpo": 64.1, "grpo_focal": 70.3,
    "note": "LLM figure from the paper's abstract, printed as context; this simulation does not measure it",
}


# ------------------------------------------------------------------------------------- the setting


def initial_policy(n_answers: int = N_ANSWERS, n_correct: int = N_CORRECT, common: float = COMMON_MASS,
                   rare_each: float = RARE_MASS_EACH) -> Tensor:
    """π₀ [M]: the common correct answer, the K − 1 rare ones, then the incorrect ones sharing the rest."""
    p = torch.empty(n_answers, dtype=DTYPE)
    p[0] = common
    p[1:n_correct] = rare_each
    p[n_correct:] = (1.0 - common - (n_correct - 1) * rare_each) / (n_answers - n_correct)
    return p


def answer_sets(n_answers: int = N_ANSWERS, n_correct: int = N_CORRECT) -> tuple[Tensor, Tensor]:
    """(correct [M] bool, rare [M] bool): answers 0..K−1 correct, 1..K−1 rare."""
    correct = torch.zeros(n_answers, dtype=torch.bool)
    correct[:n_correct] = True
    rare = correct.clone()
    rare[0] = False
    return correct, rare


# ------------------------------------------------------------------------------------- pure measures


def tail_miss_probability(pi: Tensor, correct: Tensor, rare: Tensor, n: int) -> float:
    """P(a group of n samples from π has mixed rewards and holds no rare-correct answer), exact."""
    q_c = float(pi[correct & ~rare].sum())  # correct, not rare
    q_w = float(pi[~correct].sum())
    return (q_c + q_w) ** n - q_c ** n - q_w ** n


def policy_measures(pi: Tensor, correct: Tensor, rare: Tensor, group_size: int = GROUP_SIZE,
                    ks: tuple[int, ...] = PASS_KS) -> dict[str, Tensor]:
    """Exact measures of categorical policies π [R, M] (see the module docstring), each [R]."""
    pc = pi[:, correct]  # [R, K]
    mass = pc.sum(1)  # [R]
    out = {
        "correct_mass": mass,
        "rare_correct_mass": pi[:, rare].sum(1),
        "unsampled_correct_mass": (pc * (1.0 - pc) ** group_size).sum(1),
    }
    for k in ks:
        out[f"pass@{k}"] = 1.0 - (1.0 - mass) ** k
    for k in ks:
        out[f"coverage@{k}"] = (1.0 - (1.0 - pc) ** k).sum(1) / pc.shape[1]
    return out


def policy_step(theta: Tensor, answers: Tensor, correct: Tensor, lr: float, gamma: float) -> Tensor:
    """One (focal-weighted) GRPO step of softmax policies θ [R, M] on sampled groups ``answers`` [R, N].

    θ' = θ + lr · w · (1/N) Σ_i Â_i (e_{a_i} − π_θ), Â from graftkit's ``group_advantages`` ("group"),
    w = graftkit's ``focal_weight(p̂, γ)``.
    """
    pi = theta.softmax(-1)  # [R, M]
    rewards = correct[answers].to(theta.dtype)  # R_i [R, N]
    adv = group_advantages(rewards, scale="group").advantages  # Â [R, N]
    w = focal_weight(rewards.mean(1), gamma)  # [R]
    score = torch.nn.functional.one_hot(answers, theta.shape[1]).to(theta.dtype) - pi[:, None, :]  # [R, N, M]
    grad = (adv[:, :, None] * score).mean(1)  # [R, M]
    return theta + lr * w[:, None] * grad


class Simulation(NamedTuple):
    theta: Tensor  # θ after the last step [R, M]
    curves: dict[str, Tensor]  # measure → per step and run [S + 1, R]; row 0 is the initial policy


def simulate(pi0: Tensor, correct: Tensor, rare: Tensor, *, gamma: float, lr: float, runs: int, steps: int,
             seed: int, group_size: int = GROUP_SIZE) -> Simulation:
    """``runs`` independent runs of ``steps`` policy steps from π₀, sampled from one generator seeded ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    theta = pi0.log().expand(runs, -1).clone()  # [R, M]
    rows = [policy_measures(theta.softmax(-1), correct, rare, group_size)]
    for _ in range(steps):
        answers = torch.multinomial(theta.softmax(-1), group_size, replacement=True, generator=gen)  # [R, N]
        theta = policy_step(theta, answers, correct, lr, gamma)
        rows.append(policy_measures(theta.softmax(-1), correct, rare, group_size))
    return Simulation(theta, {name: torch.stack([r[name] for r in rows]) for name in rows[0]})


def summarise(values: Tensor) -> dict[str, list[float]]:
    """Mean over runs and the clipped 95% normal interval of values [S + 1, R], per step."""
    mean = values.mean(1)
    half = Z95 * values.std(1) / math.sqrt(values.shape[1])
    return {"mean": mean.tolist(), "lo": (mean - half).clamp(0, 1).tolist(), "hi": (mean + half).clamp(0, 1).tolist()}


def arm_name(gamma: float) -> str:
    return "grpo" if gamma == 0 else f"focal_gamma{gamma:g}"


def arm_label(gamma: float) -> str:
    return "GRPO γ=0" if gamma == 0 else f"focal γ={gamma:g}"


def measure(*, runs: int, steps: int, lr: float, seed: int, gammas: tuple[float, ...] = GAMMAS) -> dict:
    """All figures of the benchmark as a JSON-ready dict: the setting, each arm's curves, the tail-miss curve."""
    pi0 = initial_policy()
    correct, rare = answer_sets()
    arms = {}
    for gamma in gammas:
        sim = simulate(pi0, correct, rare, gamma=gamma, lr=lr, runs=runs, steps=steps, seed=seed)
        arms[arm_name(gamma)] = {"gamma": gamma, "label": arm_label(gamma),
                                 "measures": {k: summarise(v) for k, v in sim.curves.items()}}
    figures = {
        "setting": {"answers": N_ANSWERS, "correct": N_CORRECT, "rare": N_CORRECT - 1,
                    "initial_policy": pi0.tolist(), "group_size": GROUP_SIZE, "runs": runs, "steps": steps,
                    "lr": lr, "seed": seed, "gammas": list(gammas), "pass_ks": list(PASS_KS),
                    "interval": "95% normal interval of the mean over runs, mean ± 1.96·s/√runs (s unbiased), "
                                "clipped to [0, 1]",
                    "advantages": "graftkit.train.advantages.group_advantages(scale='group', eps=1e-4)",
                    "weight": "graftkit.train.advantages.focal_weight(p_hat, gamma) = (1 − p̂)^γ"},
        "arms": arms,
        "tail_miss": {"N": list(TAIL_MISS_NS),
                      "p": [tail_miss_probability(pi0, correct, rare, n) for n in TAIL_MISS_NS],
                      "formula": "(q_c + q_w)^N − q_c^N − q_w^N under π₀"},
        "paper": PAPER,
    }
    figures["matched"] = matched_correct_mass(figures)
    return figures


# ------------------------------------------------------------------------------------- verdicts


def _at(m: dict, i: int) -> tuple[float, float, float]:
    return m["mean"][i], m["lo"][i], m["hi"][i]


def _fmt(x: tuple[float, float, float]) -> str:
    return f"{x[0]:.4f} [{x[1]:.4f}, {x[2]:.4f}]"


def matched_correct_mass(figures: dict) -> dict:
    """Each arm's rare-correct mass (mean, lo, hi) at the first step its mean correct mass reaches c*, the
    lowest last-step mean correct mass of the arms; linear in the step between the two steps around it."""
    arms = figures["arms"]
    target = min(a["measures"]["correct_mass"]["mean"][-1] for a in arms.values())
    out = {"correct_mass": target, "arms": {}}
    for name, arm in arms.items():
        c = arm["measures"]["correct_mass"]["mean"]
        rare = arm["measures"]["rare_correct_mass"]
        j = next(i for i, x in enumerate(c) if x >= target)
        t = 0.0 if j == 0 or c[j] == c[j - 1] else (target - c[j - 1]) / (c[j] - c[j - 1])
        i0 = max(j - 1, 0)
        lerp = {key: rare[key][i0] + t * (rare[key][j] - rare[key][i0]) for key in ("mean", "lo", "hi")}
        out["arms"][name] = {"step": i0 + t if j else 0.0, **lerp}
    return out


def verdicts(figures: dict) -> list[tuple[str, str, bool]]:
    """(claim, measured, reproduced) for each claim, computed from the figures alone (see the docstring).

    A claim starts with "paper:" (the paper's) or "control:" (the equal-correct-mass check). Apart from the
    tail-miss claim (exact: the curve rises and then falls), "reproduced" means the two 95% intervals named in
    ``measured`` are separate in the claimed direction.
    """
    out = []
    tm = figures["tail_miss"]
    ns, p = tm["N"], tm["p"]
    peak = max(range(len(p)), key=p.__getitem__)
    tol = 1e-9  # far above float64 rounding of the exact formula
    nonmono = p[peak] - p[0] > tol and p[peak] - p[-1] > tol
    out.append(("paper: tail-miss probability is non-monotonic in N",
                f"P(N={ns[0]}) = {p[0]:.4f}, peak P(N={ns[peak]}) = {p[peak]:.4f}, P(N={ns[-1]}) = {p[-1]:.2e}",
                nonmono))

    arms = figures["arms"]
    grpo = next(a for a in arms.values() if a["gamma"] == 0)
    g = grpo["measures"]
    c0, c1 = _at(g["correct_mass"], 0), _at(g["correct_mass"], -1)
    u0, u1 = _at(g["unsampled_correct_mass"], 0), _at(g["unsampled_correct_mass"], -1)
    r0, r1 = _at(g["rare_correct_mass"], 0), _at(g["rare_correct_mass"], -1)
    last = len(g["correct_mass"]["mean"]) - 1
    out.append(("paper: unsampled-correct mass shrinks as total correct mass grows (GRPO)",
                f"correct mass {_fmt(c0)} → {_fmt(c1)}, unsampled-correct {_fmt(u0)} → {_fmt(u1)} "
                f"(step 0 → {last})",
                c1[1] > c0[2] and u1[2] < u0[1]))
    out.append(("paper: GRPO concentrates on the common solution: rare-correct mass shrinks",
                f"rare-correct {_fmt(r0)} → {_fmt(r1)} (step 0 → {last})", r1[2] < r0[1]))

    matched = matched_correct_mass(figures)
    grpo_name = next(n for n, a in arms.items() if a["gamma"] == 0)
    for name, arm in arms.items():
        if arm["gamma"] == 0:
            continue
        f = arm["measures"]
        for key, claim in (("rare_correct_mass", "paper: focal keeps rare-correct mass GRPO loses"),
                           ("coverage@256", "paper: focal raises pass@256 over GRPO, as coverage@256"),
                           ("pass@256", "paper: focal raises pass@256 (any correct) over GRPO")):
            x, y = _at(g[key], -1), _at(f[key], -1)
            out.append((f"{claim} [{arm['label']}]",
                        f"{key} at step {last}: GRPO {_fmt(x)} vs {arm['label']} {_fmt(y)} "
                        f"(both {g[key]['mean'][0]:.4f} at step 0)", y[1] > x[2]))
        x, y = matched["arms"][grpo_name], matched["arms"][name]
        out.append((f"control: focal keeps more rare-correct mass at equal correct mass [{arm['label']}]",
                    f"rare-correct at correct mass {matched['correct_mass']:.4f}: "
                    f"GRPO {_fmt((x['mean'], x['lo'], x['hi']))}"
                    f" (step {x['step']:.1f}) vs {arm['label']} {_fmt((y['mean'], y['lo'], y['hi']))}"
                    f" (step {y['step']:.1f})", y["lo"] > x["hi"]))
    return out


# ------------------------------------------------------------------------------------- output


TABLE_MEASURES = ("correct_mass", "rare_correct_mass", "unsampled_correct_mass", "coverage@256", "pass@256")


def render(figures: dict) -> str:
    steps = figures["setting"]["steps"]
    shown = sorted({s for s in TABLE_STEPS if s <= steps} | {steps})
    s = figures["setting"]
    lines = [f"categorical policy: M = {s['answers']} answers, K = {s['correct']} correct "
             f"(1 common at {COMMON_MASS}, {s['rare']} rare at {RARE_MASS_EACH} each), N = {s['group_size']}, "
             f"lr {s['lr']}, {s['runs']} runs × {steps} steps per arm, seed {s['seed']}",
             f"interval: {s['interval']}", ""]
    head = f"{'arm':<12} {'step':>4}  " + "  ".join(f"{m:>26}" for m in TABLE_MEASURES)
    lines += [head, "-" * len(head)]
    for arm in figures["arms"].values():
        for step in shown:
            cells = "  ".join(f"{_fmt(_at(arm['measures'][m], step)):>26}" for m in TABLE_MEASURES)
            lines.append(f"{arm['label']:<12} {step:>4}  {cells}")
    tm = figures["tail_miss"]
    picks = [n for n in (1, 2, 4, 8, 16, 32, 64) if n in tm["N"]]
    lines += ["", "tail-miss P(mixed rewards ∧ every rare-correct missed) under π₀: "
              + ", ".join(f"N={n}: {tm['p'][tm['N'].index(n)]:.4f}" for n in picks), ""]
    for claim, measured, ok in verdicts(figures):
        lines.append(f"{claim} — measured: {measured}: {'reproduced' if ok else 'not reproduced'}")
    p = figures["paper"]
    lines += ["", f"paper's LLM figure ({p['model']}, N = {p['group_size']}): {p['metric']} {p['grpo']} (GRPO) → "
              f"{p['grpo_focal']} (GRPO + focal); this simulation does not measure it"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="independent runs per arm (≥ 2)")
    ap.add_argument("--steps", type=int, default=200, help="policy steps per run (≥ 1)")
    ap.add_argument("--lr", type=float, default=0.2, help="fixed learning rate on the logits")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (the same for every arm)")
    ap.add_argument("--json", type=Path, default=None, help="write all figures to this JSON file")
    ap.add_argument("--quick", action="store_true", help="50 runs × 100 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.steps = 50, 100
    if args.runs < 2:
        ap.error(f"--runs {args.runs}: an interval over runs needs at least 2")
    if args.steps < 1:
        ap.error(f"--steps {args.steps} must be ≥ 1")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        ap.error(f"--lr {args.lr} must be a positive number")
    torch.set_num_threads(1)
    start = time.perf_counter()
    figures = measure(runs=args.runs, steps=args.steps, lr=args.lr, seed=args.seed)
    figures["seconds"] = time.perf_counter() - start
    figures["verdicts"] = [{"claim": c, "measured": m, "reproduced": ok} for c, m, ok in verdicts(figures)]
    print(render(figures))
    print(f"\n{figures['seconds']:.1f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
