"""Verdicts: agent b against agent a on identical episodes (both rates, both difference intervals, McNemar,
and the verdict by :data:`~graftkit.stats.VERDICT_RULE`), sampled against greedy decoding per task, and
the smallest improvement the verdict detects.

- :func:`compare`           both rates with Wilson intervals, both difference intervals of
  :mod:`graftkit.stats.paired`, McNemar, and a verdict by :data:`~graftkit.stats.VERDICT_RULE`.
- :func:`headroom`          sampled − greedy success per task, through the comparison above, the k
  samples of an episode paired with its one greedy outcome as one unit.
- :func:`detectable_improvement`  the smallest improvement that :func:`compare` calls credibly better
  with a given power, when the treatment only fixes failures.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from .paired import _bootstrap, _mcnemar, _posterior, _prior4
from .pairs import _as_pairs, _check_count, _check_level, _label_index, _Paired, _zero_one
from .rates import wilson_interval
from .results import (
    BETTER,
    NO_CHANGE,
    WORSE,
    Comparison,
    DetectableImprovement,
    Headroom,
    HeadroomTable,
    RateInterval,
)


def _verdict(*intervals: tuple[float, float]) -> str:
    """:data:`VERDICT_RULE` applied to (low, high) intervals for mean(b) − mean(a)."""
    if all(low > 0 for low, _ in intervals):
        return BETTER
    if all(high < 0 for _, high in intervals):
        return WORSE
    return NO_CHANGE


def _rate(units: np.ndarray, res: int, level: float) -> RateInterval:
    """Wilson interval of one agent's success: over episodes when it has one outcome per episode (or the
    same outcome on all K of them), else over all N·K samples."""
    if res == 1 or np.isin(units, (0, res)).all():
        return wilson_interval(int((units // res).sum()), int(units.size), level)
    return wilson_interval(int(units.sum()), int(units.size) * res, level)


def compare(
    a, b, level: float = 0.95, n_boot: int = 10_000, n_draws: int = 20_000, seed: int = 0,
    prior: float | Sequence[float] = 1.0, *, clusters=None,
) -> Comparison:
    """Agent b against agent a on identical episodes: rates, difference intervals, McNemar, verdict.

    Layouts as :func:`paired_bootstrap` (rows as clusters, or 1-d with ``clusters``). ``rate_a`` /
    ``rate_b`` are Wilson intervals over all N episodes (they ignore the clustering, so they describe
    each rate, not the comparison); the difference mean(b) − mean(a) gets :func:`paired_bootstrap` (the
    posterior interval when fewer than :data:`MIN_DISCORDANT` pairs are discordant, see ``source``) and
    :func:`bayes_paired_interval`, and ``verdict`` follows :data:`VERDICT_RULE`. Both intervals use the
    same ``seed``.
    """
    return _compare(_as_pairs(a, b, clusters), _check_level(level), n_boot, n_draws, seed, prior)


def _compare(p: _Paired, level: float, n_boot, n_draws, seed, prior) -> Comparison:
    n_boot, n_draws = _check_count(n_boot, "n_boot", 1), _check_count(n_draws, "n_draws", 1)
    seed = _check_count(seed, "seed", 0)
    boot = _bootstrap(p, level, n_boot, seed)
    bayes = _posterior(p, level, _prior4(prior), n_draws, seed)
    return Comparison(
        rate_a=_rate(p.a, p.samples, level),
        rate_b=_rate(p.b, p.samples, level),
        bootstrap=boot,
        bayes=bayes,
        mcnemar=_mcnemar(p),
        level=level,
        verdict=_verdict((boot.low, boot.high), (bayes.low, bayes.high)),
    )


_HEADROOM_VERDICT = {BETTER: "headroom", NO_CHANGE: "no credible headroom", WORSE: "sampling credibly worse"}


def _headroom_pairs(g, s, labels, samples: int | None, names: tuple[str, str]) -> _Paired:
    """Greedy and sampled outcomes of one task as :class:`_Paired` with K = samples per episode.

    Accepted: ``g, s [cluster, episode]`` (one sample each; with ``samples=k``, [cluster, episode·k],
    each episode's k columns adjacent and the greedy outcome repeated over them, as ``fold_episodes`` of
    [..., episode, sample] gives), ``s [cluster, episode, k]`` with ``g [cluster, episode]`` or
    ``[cluster, episode, 1 or k]``; with ``labels``, the same less the cluster axis.
    """
    g = _zero_one(g, names[0], "0/1 greedy outcomes")
    s = _zero_one(s, names[1], "0/1 sampled outcomes")
    lead = 1 if labels is None else 0  # the cluster axis, when there is one
    if samples is not None:
        k = _check_count(samples, "samples", 1)
        for name, x in zip(names, (g, s)):
            if x.ndim != lead + 1 or x.shape[-1] % k:
                raise GraftkitError(f"{name}: with samples={k} expected a [{'cluster, ' * lead}episode·{k}] array "
                                    f"(each episode's {k} columns adjacent); got shape {x.shape}")
        g = g.reshape(*g.shape[:-1], -1, k)
        s = s.reshape(*s.shape[:-1], -1, k)
    if s.ndim == lead + 1 and g.ndim == lead + 1:
        s, g = s[..., None], g[..., None]
    if s.ndim != lead + 2:
        raise GraftkitError(f"{names[1]}: expected [{'cluster, ' * lead}episode] or [{'cluster, ' * lead}episode, "
                            f"sample] outcomes; got shape {s.shape}")
    if g.ndim == lead + 1:
        g = g[..., None]
    k = s.shape[-1]
    if g.ndim != lead + 2 or g.shape[:-1] != s.shape[:-1] or g.shape[-1] not in (1, k):
        raise GraftkitError(f"{names[0]} has shape {g.shape} and {names[1]} {s.shape}: expected the same episodes, "
                            f"and 1 or {k} greedy samples per episode")
    g_units = g.sum(axis=-1).astype(np.int64) * (k if g.shape[-1] == 1 else 1)
    s_units = s.sum(axis=-1).astype(np.int64)
    if labels is None:
        n_clusters, n_eps = s.shape[:2]
        return _Paired(g_units.ravel(), s_units.ravel(), np.repeat(np.arange(n_clusters, dtype=np.int64), n_eps),
                       tuple(range(n_clusters)), k)
    lab = np.asarray(labels)
    if lab.shape != (s.shape[0],):
        raise GraftkitError(f"clusters for {names[1]}: expected one label per episode ({s.shape[0]}); got shape "
                            f"{lab.shape}")
    idx, uniq = _label_index(lab)
    return _Paired(g_units, s_units, idx, uniq, k)


def headroom(
    greedy: Mapping[str, object], sampled: Mapping[str, object], level: float = 0.95, n_boot: int = 10_000,
    n_draws: int = 20_000, seed: int = 0, prior: float | Sequence[float] = 1.0, *, samples: int | None = None,
    clusters=None,
) -> HeadroomTable:
    """Per task, sampled success − greedy success, with the comparison of :func:`compare` (a = greedy,
    b = sampled).

    ``sampled[task]`` holds k samples per episode, ``[cluster, episode, sample]``, and ``greedy[task]``
    the greedy outcome of the same episodes, ``[cluster, episode]`` or ``[cluster, episode, 1 or k]``.
    The folded layout ``[cluster, episode·k]`` (each episode's k columns adjacent, the greedy outcome
    repeated over them) needs ``samples=k``; without it a 2-d pair is compared position by position
    with one sample per episode. With ``clusters`` (a mapping task → labels, or one label array for
    every task) the arrays lack the cluster axis: ``[episode]`` / ``[episode, sample]``.

    The unit is the episode: its greedy outcome g_e ∈ {0, 1} against its sampled success fraction
    s̄_e ∈ {0, 1/k, …, 1}, d_e = s̄_e − g_e. Pairing each sample with a copy of the greedy outcome as if
    the k pairs were independent (what the folded layout means without ``samples``) is wrong twice over,
    and near the ceiling it made "sampling credibly worse" come out in 13% (k = 4) and 25% (k = 8) of
    datasets with equal true rates p = 0.97 (20% at p = 0.99, k = 8; 25 × 2 episodes; nominal 2.5%):
    (1) greedy's uncertainty is that of S·E outcomes, not S·E·k, but the Dirichlet counted each greedy
    outcome k times, and the design effect, read off cluster means in which greedy failures are rare,
    cannot undo that; (2) a greedy failure is rare and lumpy (one failure = k discordant pairs of one
    sign in one cluster), so in most datasets none is seen, d̄ < 0 from the sampled failures alone, and
    a spread estimated from the data misses the greedy side altogether (the episode-level bootstrap
    alone still said "worse" in 25% of datasets). With the episode as the unit the Dirichlet runs over
    the 2·(k + 1) joint outcomes (greedy's 0/1 × the number of successful samples; greedy's uncertainty
    then rests on its own S·E outcomes and the prior), the bootstrap resamples episodes with their k
    samples, and below :data:`MIN_DISCORDANT` (here Σ_e |d_e|) it takes the posterior's interval: at most
    2.5% a side in the same simulation.

    Calibration at a high baseline, side by side: even with the episode as the unit, d_e is right-skewed
    when greedy rarely fails (a rare large d when it does, many small negative ones from the sampled
    failures), and intervals accurate to first order only then say "sampling credibly worse" more often
    than "headroom" with no true effect. At p0 = 0.9, k = 8, with seed- and item-level random effects
    (tests/test_stats_coverage.py, 1600 datasets), the expanded percentile bootstrap alone lay below 0 in
    2.9% (25 seeds × 4 episodes, finding 2's layout) and 3.6% (100 × 1) of datasets and above it in 0.9%
    and 1.6%; the verdict said worse in 1.7% and 2.4%, headroom in 0.9% and 1.5%; with equal rates and
    no random effects at 25 × 2 episodes, worse in 2.5% and headroom in 0.0% (600 datasets). Both
    intervals are now second-order accurate (:func:`paired_bootstrap`'s BCa reading,
    :func:`bayes_paired_interval`'s matching factor), and the sides agree: headroom / worse 1.8% / 1.8%
    (100 × 1), 1.0% / 1.1% (25 × 4), 0.5% / 1.5% (25 × 2, equal rates). Where both sides stay below 2.5%
    the design holds too few greedy failures for more: at 25 × 2 episodes and p0 = 0.9 about 5 are
    expected, and even an exact test of greedy's 50 outcomes against a known sampled rate could say worse
    only on none (P = 0.5%; one or none has P = 3.4% > 2.5%); at 25 × 4 the posterior's prior and the
    design-effect floor keep both sides near 1%, as they do at p0 = 0.5, where d is symmetric.

    A task has headroom when the verdict is "credibly better" (both intervals above zero,
    :data:`VERDICT_RULE`). ``rate_a`` is over the S·E greedy episodes, ``rate_b`` over the S·E·k samples;
    McNemar pairs each sample with its episode's greedy outcome (see :func:`mcnemar_exact`: it ignores
    the dependence). Every task uses the same ``seed``, so a task's result does not depend on which other
    tasks are in the table.
    """
    if set(greedy) != set(sampled) or not greedy:
        raise GraftkitError(
            f"greedy tasks {sorted(greedy)} and sampled tasks {sorted(sampled)}: expected the same "
            f"non-empty set of tasks"
        )
    level = _check_level(level)
    rows = []
    for task in greedy:
        labels = clusters.get(task) if isinstance(clusters, Mapping) else clusters
        if isinstance(clusters, Mapping) and labels is None:
            raise GraftkitError(f"clusters has no labels for task {task!r}: expected one label array per task")
        p = _headroom_pairs(greedy[task], sampled[task], labels, samples,
                            (f"greedy[{task!r}]", f"sampled[{task!r}]"))
        comp = _compare(p, level, n_boot, n_draws, seed, prior)
        rows.append(Headroom(task=task, comparison=comp, verdict=_HEADROOM_VERDICT[comp.verdict]))
    return HeadroomTable(rows=tuple(rows))


def _binomial_sf(n: int, p: float, m: int) -> float:
    """P(Bin(n, p) ≥ m)."""
    if m <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0 if m <= n else 0.0
    log_q = math.log1p(-p)
    term = math.exp(n * log_q)  # P(X = 0)
    below = 0.0
    for i in range(min(m, n + 1)):
        below += term
        term *= (n - i) / (i + 1) * p / (1 - p)
    return max(0.0, 1.0 - below)


def detectable_improvement(
    p0: float, n_clusters: int, n_episodes: int, level: float = 0.95, power: float = 0.8,
    n_boot: int = 2_000, n_draws: int = 4_000, seed: int = 0,
) -> DetectableImprovement:
    """The smallest true improvement Δ that :func:`compare` calls credibly better with probability
    ``power``, for ``n_clusters`` × ``n_episodes`` paired episodes at baseline success ``p0``, when the
    treatment only fixes failures (pairs discordant one way: n10 = 0).

    Model: each of a's failures (probability 1 − p0) is fixed with probability q, so an episode is 01
    with probability Δ = q·(1 − p0) and n01 ~ Bin(N, Δ), N = n_clusters·n_episodes. The verdict depends on
    the data only through d (both intervals are functions of the discordant pairs and their clusters),
    so it is a threshold in n01: m* is found by running :func:`compare` (``level``, ``n_boot``,
    ``n_draws``, ``seed``) on m = 1, 2, … one-way pairs spread evenly over the clusters (cluster
    t mod S takes pair t), and Δ solves P(Bin(N, Δ) ≥ m*) = power by bisection. Spreading the pairs
    evenly is the least clustered arrangement, so Δ is the best case; between-cluster variation in
    the effect raises it.

    Δ depends on p0 only through the cap Δ ≤ 1 − p0: n01 ~ Bin(N, Δ) whatever p0. Near the ceiling the
    cap binds — with p0 = 0.99 and 50 episodes fewer than m* failures exist to fix — and the result is
    ``detectable=False``, Δ = inf. ``fixed_share`` = Δ/(1 − p0), the share of failures that must be
    fixed, grows with p0. Deterministic for a given ``seed``.
    """
    if not isinstance(p0, (int, float, np.floating)) or not 0.0 <= float(p0) < 1.0:
        raise GraftkitError(f"p0={p0!r}: expected a baseline success rate in [0, 1)")
    n_clusters = _check_count(n_clusters, "n_clusters", 1)
    n_episodes = _check_count(n_episodes, "n_episodes", 1)
    level = _check_level(level)
    if not isinstance(power, (int, float, np.floating)) or not 0.0 < float(power) < 1.0:
        raise GraftkitError(f"power={power!r}: expected a power strictly between 0 and 1", "e.g. power=0.8")
    p0, power = float(p0), float(power)
    n_total = n_clusters * n_episodes
    min_pairs = None
    for m in range(1, n_total + 1):
        a = np.ones((n_clusters, n_episodes), dtype=np.int8)
        t = np.arange(m)
        a[t % n_clusters, t // n_clusters] = 0  # a fails, b (all ones) succeeds: one-way discordant
        if compare(a, np.ones_like(a), level=level, n_boot=n_boot, n_draws=n_draws, seed=seed).verdict == BETTER:
            min_pairs = m
            break
    cap = 1.0 - p0
    common = dict(min_pairs=min_pairs, p0=p0, n_clusters=n_clusters, n_episodes=n_episodes, level=level, power=power)
    if min_pairs is None or _binomial_sf(n_total, cap, min_pairs) < power:
        return DetectableImprovement(delta=math.inf, fixed_share=math.inf, detectable=False, **common)
    lo, hi = 0.0, cap
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _binomial_sf(n_total, mid, min_pairs) < power else (lo, mid)
    return DetectableImprovement(delta=hi, fixed_share=hi / cap, detectable=True, **common)
