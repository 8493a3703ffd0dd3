"""Attribution of a success change to parameter groups, from grafts evaluated on identical episodes.

Every quantity here is a linear contrast of configuration success rates, θ = Σ_C w_C · v(C), where
v(C) is the success rate of configuration C (a set of grafted groups) over the same S evaluation seeds ×
E episodes (tasks folded into episodes: ``[task, seed, episode]`` → ``[seed, task·episode]``, so the
seed stays the cluster). For k groups N, with 0/1 coding of "grafted or not":

- main effect of g (factorial)   ME_g  = 2^−(k−1) Σ_{S ⊆ N∖g} [v(S ∪ g) − v(S)]
  (the mean, over the other groups' settings, of success with g minus success without g);
- interaction of g, h            I_gh  = 2^−(k−2) Σ_{S ⊆ N∖{g,h}} [v(S∪gh) − v(S∪g) − v(S∪h) + v(S)]
  (the mean difference of differences; > 0 when g and h together do more than apart);
- Shapley value of g             φ_g   = Σ_{S ⊆ N∖g} |S|!(k−|S|−1)!/k! · [v(S ∪ g) − v(S)]
  (exact over all subsets; Σ_g φ_g = v(N) − v(∅) exactly — efficiency);
- single-group effect            v({g}) − v(∅)      (the graft of g alone into base);
- leave-one-out effect           v(N) − v(N ∖ g)    (what is lost when g alone stays at base).

Intervals: the two-stage paired bootstrap of :func:`graftkit.stats.paired_bootstrap` — evaluation seeds
with replacement, then episodes within each chosen seed, the same resampled positions for every
configuration (so contrasts stay paired), variance-component adjusted by (c, k) and read at the expanded
percentiles (t_df tails). Two differences: a contrast's per-episode value d = Σ_C w_C x_C[s, e] is
real-valued rather than in {−1, 0, 1}, so episode indices are drawn directly; and the percentiles are not
bias-corrected and accelerated (``paired_bootstrap`` reads its own at BCa-adjusted levels, for the skew of a
0/1 greedy outcome against a mean of samples). For a two-configuration contrast b − a the resamples are the
same as ``paired_bootstrap(a, b)``'s (the tests check the intervals agree on planted grafts).

Double dissociation between RL runs A and B (same base, same episodes): per group, effect_A(g),
effect_B(g) (single-group or Shapley, as recorded) and their difference, each with an interval from one
joint bootstrap. A group *carries* a run's change when its effect interval excludes zero; the verdict
per group is :data:`DISSOCIATION_RULE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Hashable, Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..stats import cluster_bootstrap_factors, fold_episodes
from ..stats.quantiles import expanded_tail

BOUNDS = ("estimate", "low", "high")

INTERVAL_METHOD = (
    "two-stage paired bootstrap over evaluation seeds then episodes (tasks folded into episodes), the same "
    "resampled positions for every configuration, variance-component adjusted (c, k) with expanded "
    "percentiles (t_df tails; no BCa adjustment)"
)
MAIN_EFFECT = "2^-(k-1) Σ_{S⊆N∖g} [v(S∪g) − v(S)]: success with g minus without, averaged over the other groups"
INTERACTION = ("2^-(k-2) Σ_{S⊆N∖{g,h}} [v(S∪gh) − v(S∪g) − v(S∪h) + v(S)]: mean difference of differences "
               "(0/1 coding); diagonal undefined (NaN)")
SHAPLEY = "Σ_{S⊆N∖g} |S|!(k−|S|−1)!/k! [v(S∪g) − v(S)], exact; Σ_g φ_g = v(N) − v(∅)"
SINGLE = "v({g}) − v(∅): graft of g alone into base, minus base"
LOO = "v(N) − v(N∖g): all chosen groups grafted, minus all but g"
EFFECTS = {"single": SINGLE, "loo": LOO, "shapley": SHAPLEY}
CREDIBLE = "credible: the bootstrap interval at the stated level excludes zero"
DISSOCIATION_RULE = (
    "per group: 'A only' / 'B only' when that run's effect is credible, the other's is not, and the difference "
    "A − B is credible; 'both' when both effects are credible; 'neither' when none is; otherwise 'not "
    "separable' (one effect credible but the difference is not). A double dissociation: one group 'A only' "
    "and another 'B only'."
)

Subset = frozenset


def fold_tasks(success: np.ndarray) -> np.ndarray:
    """``[task, seed, episode]`` (or with a trailing sample axis of 1) → ``[seed, task·episode]``."""
    x = np.asarray(success)
    if x.ndim == 4:
        x = x[..., 0]
    if x.ndim != 3:
        raise GraftkitError(f"expected success [task, seed, episode]; got shape {x.shape}")
    return fold_episodes(x)


# ------------------------------------------------------------------------------------- contrasts


def main_effect_weights(groups: Sequence[str], g: str) -> dict[Subset, float]:
    others = [x for x in groups if x != g]
    w = 1.0 / 2 ** len(others)
    out: dict[Subset, float] = {}
    for r in range(len(others) + 1):
        for s in combinations(others, r):
            out[Subset(s) | {g}] = out.get(Subset(s) | {g}, 0.0) + w
            out[Subset(s)] = out.get(Subset(s), 0.0) - w
    return out


def interaction_weights(groups: Sequence[str], g: str, h: str) -> dict[Subset, float]:
    others = [x for x in groups if x not in (g, h)]
    w = 1.0 / 2 ** len(others)
    out: dict[Subset, float] = {}
    for r in range(len(others) + 1):
        for s in combinations(others, r):
            for extra, sign in (({g, h}, 1.0), ({g}, -1.0), ({h}, -1.0), (set(), 1.0)):
                key = Subset(s) | extra
                out[key] = out.get(key, 0.0) + sign * w
    return out


def shapley_weights(groups: Sequence[str], g: str) -> dict[Subset, float]:
    k = len(groups)
    others = [x for x in groups if x != g]
    out: dict[Subset, float] = {}
    for r in range(len(others) + 1):
        w = math.factorial(r) * math.factorial(k - r - 1) / math.factorial(k)
        for s in combinations(others, r):
            out[Subset(s) | {g}] = out.get(Subset(s) | {g}, 0.0) + w
            out[Subset(s)] = out.get(Subset(s), 0.0) - w
    return out


def effect_weights(kind: str, groups: Sequence[str], g: str) -> dict[Subset, float]:
    """The per-group effect ``kind`` (single, loo, shapley) as weights over subsets."""
    if kind == "single":
        return {Subset({g}): 1.0, Subset(): -1.0}
    if kind == "loo":
        full = Subset(groups)
        return {full: 1.0, full - {g}: -1.0}
    if kind == "shapley":
        return shapley_weights(groups, g)
    raise GraftkitError(f"unknown effect {kind!r}", f"use one of {', '.join(EFFECTS)}")


def contrast_value(values: Mapping[Hashable, float], weights: Mapping[Hashable, float]) -> float:
    """Σ w_C · values[C] (a point estimate; each key must be present)."""
    return float(sum(w * values[c] for c, w in weights.items() if w != 0))


# ------------------------------------------------------------------------------------- intervals


def _check_outcomes(outcomes: Mapping[Hashable, np.ndarray], needed) -> tuple[list, np.ndarray]:
    missing = [c for c in needed if c not in outcomes]
    if missing:
        shown = ", ".join("{" + ",".join(sorted(c)) + "}" if isinstance(c, frozenset) else str(c) for c in missing[:4])
        raise GraftkitError(f"attribution needs configuration(s) {shown} that were not evaluated",
                            "run the full sweep (a factorial needs every subset of the chosen groups)")
    keys = list(dict.fromkeys(needed))
    arrs = [np.asarray(outcomes[c], dtype=np.float64) for c in keys]
    shape = arrs[0].shape
    if len(shape) != 2 or any(a.shape != shape for a in arrs):
        raise GraftkitError(f"outcomes must be [seed, episode] arrays of one shape; got {[a.shape for a in arrs][:4]}")
    return keys, np.stack(arrs)


def contrast_intervals(
    outcomes: Mapping[Hashable, np.ndarray],
    contrasts: Mapping[Hashable, Mapping[Hashable, float]],
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> dict[Hashable, tuple[float, float, float]]:
    """(estimate, low, high) of each contrast θ = Σ_C w_C · mean(x_C) (see the module docstring).

    ``outcomes[C]``: 0/1 (or real) arrays ``[seed, episode]`` on identical episodes; ``contrasts[name]``:
    weights by configuration key. One set of resampled positions serves every contrast.
    """
    needed = [c for w in contrasts.values() for c, v in w.items() if v != 0]
    if not contrasts:
        return {}
    if not needed:
        return {name: (0.0, 0.0, 0.0) for name in contrasts}
    keys, x = _check_outcomes(outcomes, needed)  # x [config, S, E]
    index = {c: i for i, c in enumerate(keys)}
    n_cfg, n_seeds, n_eps = x.shape
    W = np.zeros((len(contrasts), n_cfg))
    for j, w in enumerate(contrasts.values()):
        for c, v in w.items():
            if v != 0:
                W[j, index[c]] += v
    m_cfg = x.mean(axis=2)  # [config, S]
    # Per configuration and resample: A = mean_j m_{s*_j}, B = mean_j (mean of E episodes drawn in s*_j).
    rng = np.random.default_rng(seed)
    A = np.empty((n_cfg, n_boot))
    B = np.empty((n_cfg, n_boot))
    block = max(1, (1 << 21) // max(1, n_cfg * n_seeds * n_eps))
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pick = rng.integers(0, n_seeds, size=(rows, n_seeds))
        epi = rng.integers(0, n_eps, size=(rows, n_seeds, n_eps))
        A[:, start : start + rows] = m_cfg[:, pick].mean(axis=2)
        drawn = x[:, pick[..., None], epi]  # [config, rows, S, E]
        B[:, start : start + rows] = drawn.mean(axis=(2, 3))
    out = {}
    for j, name in enumerate(contrasts):
        # contractions summed by numpy, not BLAS: the same bits in every process (BLAS blocking follows alignment)
        Aw, Bw = ((W[j][:, None] * M).sum(axis=0) for M in (A, B))  # [boot]
        d = (W[j][:, None, None] * x).sum(axis=0)  # [S, E]
        m_bar = float(d.mean(axis=1).mean())
        c, k, df = cluster_bootstrap_factors(d)
        theta = m_bar + c * (Aw - m_bar) + k * (Bw - Aw)
        tail = expanded_tail(level, df)
        low, high = np.quantile(theta, [tail, 1 - tail])
        est = float((W[j] * m_cfg.mean(axis=1)).sum())
        out[name] = (est, float(low), float(high))
    return out


def credible(bounds: Sequence[float]) -> bool:
    """:data:`CREDIBLE` for (estimate, low, high)."""
    return bounds[1] > 0 or bounds[2] < 0


# ----------------------------------------------------------------------------------- attribution


@dataclass(frozen=True)
class FactorialAttribution:
    """Main effects, pairwise interactions and Shapley values, each ``[..., bound]`` (estimate, low, high)."""

    groups: tuple[str, ...]
    main_effect: np.ndarray  # [group, bound]
    interaction: np.ndarray  # [group, group2, bound], NaN on the diagonal
    shapley: np.ndarray  # [group, bound]
    total: tuple[float, float, float]  # v(N) − v(∅)
    level: float
    n_boot: int
    seed: int


def attribute_factorial(
    outcomes: Mapping[Subset, np.ndarray], groups: Sequence[str], level: float = 0.95, n_boot: int = 10_000,
    seed: int = 0,
) -> FactorialAttribution:
    """Attribution from a full factorial: ``outcomes[frozenset(S)]`` is ``[seed, episode]`` for every S ⊆ groups."""
    groups = tuple(groups)
    k = len(groups)
    contrasts: dict[Hashable, Mapping[Subset, float]] = {}
    for g in groups:
        contrasts[("main", g)] = main_effect_weights(groups, g)
        contrasts[("shapley", g)] = shapley_weights(groups, g)
    for g, h in combinations(groups, 2):
        contrasts[("interaction", g, h)] = interaction_weights(groups, g, h)
    contrasts[("total",)] = {Subset(groups): 1.0, Subset(): -1.0}
    iv = contrast_intervals(outcomes, contrasts, level, n_boot, seed)
    inter = np.full((k, k, 3), np.nan)
    for (a, g), (b, h) in combinations(enumerate(groups), 2):
        inter[a, b] = inter[b, a] = iv[("interaction", g, h)]
    return FactorialAttribution(
        groups, np.array([iv[("main", g)] for g in groups]).reshape(k, 3), inter,
        np.array([iv[("shapley", g)] for g in groups]).reshape(k, 3), iv[("total",)], level, n_boot, seed,
    )


def group_effects(
    outcomes: Mapping[Subset, np.ndarray], groups: Sequence[str], kind: str, level: float = 0.95,
    n_boot: int = 10_000, seed: int = 0,
) -> np.ndarray:
    """Per-group effect ``kind`` (single, loo, shapley) with intervals: ``[group, bound]``."""
    iv = contrast_intervals(outcomes, {g: effect_weights(kind, groups, g) for g in groups}, level, n_boot, seed)
    return np.array([iv[g] for g in groups]).reshape(len(groups), 3)


@dataclass(frozen=True)
class Dissociation:
    """Per group: each run's effect, their difference A − B, and the verdict by :data:`DISSOCIATION_RULE`."""

    groups: tuple[str, ...]
    effect: np.ndarray  # [run (A, B), group, bound]
    difference: np.ndarray  # [group, bound]
    verdict: tuple[str, ...]
    double_dissociation: bool
    kind: str
    level: float


def _verdict(a, b, d) -> str:
    ca, cb, cd = credible(a), credible(b), credible(d)
    if ca and cb:
        return "both"
    if not (ca or cb):
        return "neither"
    if not cd:
        return "not separable"
    return "A only" if ca else "B only"


def dissociation(
    outcomes_a: Mapping[Subset, np.ndarray], outcomes_b: Mapping[Subset, np.ndarray], groups: Sequence[str],
    kind: str = "single", level: float = 0.95, n_boot: int = 10_000, seed: int = 0,
) -> Dissociation:
    """Double-dissociation test between RL runs A and B grafted into one base (identical episodes).

    ``outcomes_a`` / ``outcomes_b``: success ``[seed, episode]`` per subset of grafted groups for each run
    (the empty subset is the shared base). Effects are ``kind`` (see :data:`EFFECTS`); A's, B's and the
    difference come from one joint bootstrap, so the difference is paired.
    """
    groups = tuple(groups)
    joint = {("A", s): v for s, v in outcomes_a.items()} | {("B", s): v for s, v in outcomes_b.items()}
    contrasts: dict[Hashable, dict] = {}
    for g in groups:
        w = effect_weights(kind, groups, g)
        wa = {("A", s): v for s, v in w.items()}
        wb = {("B", s): v for s, v in w.items()}
        contrasts[("A", g)], contrasts[("B", g)] = wa, wb
        contrasts[("diff", g)] = wa | {key: -v for key, v in wb.items()}
    iv = contrast_intervals(joint, contrasts, level, n_boot, seed)
    effect = np.array([[iv[(r, g)] for g in groups] for r in ("A", "B")]).reshape(2, len(groups), 3)
    diff = np.array([iv[("diff", g)] for g in groups]).reshape(len(groups), 3)
    verdict = tuple(_verdict(effect[0, i], effect[1, i], diff[i]) for i in range(len(groups)))
    return Dissociation(groups, effect, diff, verdict, "A only" in verdict and "B only" in verdict, kind, level)


__all__ = [
    "BOUNDS", "DISSOCIATION_RULE", "EFFECTS", "INTERVAL_METHOD", "Dissociation", "FactorialAttribution",
    "attribute_factorial", "contrast_intervals", "contrast_value", "credible", "dissociation", "effect_weights",
    "fold_tasks", "group_effects", "interaction_weights", "main_effect_weights", "shapley_weights",
]
