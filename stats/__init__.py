"""Paired statistics for two agents evaluated on identical episodes, and for GRPO regimes over training seeds.

Data model: agents ``a`` and ``b`` are run on the same episodes and compared episode by episode, so every
statistic here is paired. Outcomes come in one of two layouts, accepted by every paired function:

- ``x[cluster, episode]``: a 0/1 array shaped [n_clusters, n_episodes_per_cluster] whose rows are the
  clusters (evaluation seeds; :func:`fold_episodes` builds it from [task, seed, episode, ...]);
- ``x[episode]`` with ``clusters=labels``: 1-D 0/1 arrays and one cluster label per episode (ints or
  strings, any mix); clusters may have unequal sizes. :func:`cluster_labels` builds labels that merge
  the evaluation seeds an item repeats across.

A cluster is the unit the intervals take as independent: episodes within one may be correlated (a seed
can favour one agent; an item seen twice is nearly the same episode). Below S is the number of clusters,
n_s the size of cluster s, N = Σ n_s, and d_e = b_e − a_e the per-episode difference, with cluster means
m_s and grand mean d̄ = Σ_s n_s m_s / N = mean(b) − mean(a). With equal sizes n_s = E every formula reduces
to the one for the rectangular layout.

Paired cells, counted over all N episodes::

    n00: both fail    n01: b succeeds, a fails    n10: a succeeds, b fails    n11: both succeed

so d̄ = (n01 − n10) / N, and the discordant pairs n01 + n10 carry all the information on the difference.

Several samples per episode (:func:`headroom`): an agent with k samples on an episode has a success
*fraction* there, a multiple of 1/k. The episode, not the sample, stays the resampled unit, and the
Dirichlet model runs over the joint outcomes (a's successes, b's successes) of an episode.

What is computed, and from where:

- :func:`wilson_interval`   Wilson score interval for one rate (Wilson 1927; Newcombe 1998, method 3;
  Brown, Cai & DasGupta 2001). Equals R's ``prop.test(x, n, correct = FALSE)$conf.int``.
- :func:`paired_bootstrap`  two-stage (clusters, then episodes within cluster) bootstrap of d̄ with an
  expanded percentile interval (Efron & Tibshirani 1993, ch. 13; Hesterberg 2015; hierarchical data:
  Davison & Hinkley 1997, §3.8; Field & Welsh 2007), variance-component adjusted so within-cluster noise
  is not counted twice, clusters of unequal size weighted by size (the ratio estimator's linearisation,
  Cochran 1977, ch. 6 and 9A). With fewer than :data:`MIN_DISCORDANT` discordant pairs the interval is
  the Bayesian one instead (a bootstrap of a handful of rare events collapses; see the function).
- :func:`bayes_paired_interval`  Dirichlet posterior over the paired cells; the difference is
  p01 − p10. Counts are deflated by the design effect of the clustering (Rao & Scott 1992), whose own
  uncertainty (S − 1 degrees of freedom) is integrated out.
- :func:`mcnemar_exact`     exact conditional McNemar test (McNemar 1947): X = n01 ~ Bin(n01 + n10, ½)
  under H0; p = min(1, 2·P(X ≤ min(n01, n10))) (Fagerland, Lydersen & Laake 2013, "exact conditional").
- :func:`compare`           both rates with Wilson intervals, both difference intervals, McNemar, and a
  verdict by :data:`VERDICT_RULE`.
- :func:`headroom`          sampled − greedy success per task, through the comparison above, the k
  samples of an episode paired with its one greedy outcome as one unit.
- :func:`cluster_labels`    connected components of episodes linked by a shared seed or item
  (union–find; Tarjan 1975).
- :func:`regime_interval`, :func:`regime_tost`  the change of a regime (several RL runs from one SFT
  model, one per training seed) with the training seed as a random effect: a hierarchical bootstrap of
  runs, then evaluation clusters, variance-component adjusted at both levels (two-way clustering:
  Cameron, Gelbach & Miller 2011; Owen 2007), a t interval on Satterthwaite (1946) degrees of freedom,
  and the two one-sided tests of equivalence (Schuirmann 1987).
- :func:`detectable_improvement`  the smallest improvement that :func:`compare` calls credibly better
  with a given power, when the treatment only fixes failures.
- :func:`pass_at_k`         unbiased pass@k = 1 − C(n − c, k) / C(n, k) (Chen et al. 2021, §2.1).
- :func:`correlation_ci`    Pearson or Spearman (average ranks for ties) correlation with a pairs
  bootstrap percentile interval.

Every interval for a difference is clipped to [−1, 1], the range of a difference of two rates. All
randomness comes from ``numpy.random.default_rng(seed)`` (PCG64); every result records its level,
resample or draw count, seed and (where there is one) prior, and a ``method`` string naming its formula.

References
    Abramowitz & Stegun (1964), Handbook of Mathematical Functions, §26.7 (Student's t).
    Agresti & Min (2005), Simple improved confidence intervals for comparing matched proportions. Stat.
        Med. 24:729–740.
    Brown, Cai & DasGupta (2001), Interval estimation for a binomial proportion. Stat. Sci. 16:101–133.
    Cameron, Gelbach & Miller (2011), Robust inference with multiway clustering. J. Bus. Econ. Stat.
        29:238–249.
    Chen et al. (2021), Evaluating large language models trained on code. arXiv:2107.03374.
    Cochran (1977), Sampling Techniques, 3rd ed. Wiley.
    Davison & Hinkley (1997), Bootstrap Methods and their Application. Cambridge UP.
    Efron & Tibshirani (1993), An Introduction to the Bootstrap. Chapman & Hall.
    Fagerland, Lydersen & Laake (2013), The McNemar test for binary matched-pairs data. BMC Med. Res.
        Methodol. 13:91.
    Field & Welsh (2007), Bootstrapping clustered data. J. R. Stat. Soc. B 69:369–390.
    Gelman et al. (2013), Bayesian Data Analysis, 3rd ed. (BDA3). CRC.
    Hesterberg (2015), What teachers should know about the bootstrap. Am. Stat. 69:371–386.
    McNemar (1947), Note on the sampling error of the difference between correlated proportions or
        percentages. Psychometrika 12:153–157.
    Newcombe (1998), Two-sided confidence intervals for the single proportion. Stat. Med. 17:857–872.
    Owen (2007), The pigeonhole bootstrap. Ann. Appl. Stat. 1:386–411.
    Rao & Scott (1992), A simple method for the analysis of clustered binary data. Biometrics 48:577–585.
    Satterthwaite (1946), An approximate distribution of estimates of variance components. Biometrics
        Bull. 2:110–114.
    Schuirmann (1987), A comparison of the two one-sided tests procedure and the power approach for
        assessing the equivalence of average bioavailability. J. Pharmacokinet. Biopharm. 15:657–680.
    Tarjan (1975), Efficiency of a good but not linear set union algorithm. J. ACM 22:215–225.
    Wilson (1927), Probable inference, the law of succession, and statistical inference. JASA 22:209–212.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError

BETTER, WORSE, NO_CHANGE = "credibly better", "credibly worse", "no credible change"

#: The one place the verdict of :func:`compare` (and so of :func:`headroom`) is defined.
VERDICT_RULE = (
    "credibly better / worse: the paired bootstrap interval AND the Bayesian credible interval for "
    "mean(b) − mean(a), both at the comparison's level (default 0.95), lie entirely above / below zero; "
    "otherwise no credible change"
)

#: Below this many discordant pairs (n01 + n10; Σ|b − a| with several samples per episode) the paired
#: bootstrap takes its interval from the Bayesian posterior (see :func:`paired_bootstrap`).
MIN_DISCORDANT = 10

#: Bound on elements per vectorised block, so memory stays flat for large n_boot × n_clusters.
_BLOCK_ELEMENTS = 1 << 22

#: Above this many operations the within-cluster resampled sums are drawn episode by episode instead of
#: from their exact tabulated distribution (same distribution, different random stream).
_TABLE_WORK = 5e7

_OUTCOMES = "a 0/1 success array shaped [n_seeds, n_episodes_per_seed]"
_LAYOUTS = f"{_OUTCOMES}, or a 1-d array of per-episode outcomes with clusters="

_BOOT_METHOD = (
    "two-stage bootstrap: clusters with replacement, then episodes within each chosen cluster with "
    "replacement (pairs kept together), variance-component adjusted (c, k), clusters weighted by size; "
    "expanded percentile interval (t_df calibration), clipped to [−1, 1]"
)
_BOOT_FALLBACK = (
    "Bayesian posterior interval in place of the bootstrap: fewer than MIN_DISCORDANT discordant pairs "
    "(Dirichlet(1 + counts / D) over the paired cells, D the design effect; see bayes_paired_interval), "
    "widened where needed to contain the observed difference"
)
_BAYES_METHOD = (
    "Dirichlet(prior + counts / D) posterior over the paired cells, D the design effect of the clustering "
    "(Rao & Scott 1992), D ~ D̂·df/χ²_df; Monte Carlo draws, equal-tailed interval"
)


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class RateInterval:
    """A success rate ``successes / n`` with its interval."""

    successes: int
    n: int
    rate: float
    low: float
    high: float
    level: float
    method: str = "Wilson score interval, no continuity correction (Wilson 1927)"


@dataclass(frozen=True)
class BootstrapInterval:
    """Paired difference ``diff = mean(b) − mean(a)`` with a bootstrap percentile interval."""

    diff: float
    low: float
    high: float
    level: float
    n_boot: int
    seed: int
    #: S, the number of clusters (evaluation seeds in the rectangular layout).
    n_seeds: int
    #: Episodes per cluster when all clusters have the same size, else None (see ``cluster_sizes``).
    n_episodes: int | None
    #: c, the factor on cluster-mean deviations (0: no cluster stage; see :func:`paired_bootstrap`).
    seed_shrink: float
    #: k = √(E/(E − 1)), the factor on within-cluster deviations, when all clusters have size E; else
    #: None (each cluster s then has its own k_s = √(n_s/(n_s − 1))).
    episode_scale: float | None
    #: Degrees of freedom of the variance the interval rests on: S − 1 (clustered) or N − 1 (pooled).
    df: int | None
    #: The percentiles read off: (tail, 1 − tail), tail = Φ(−t_df((1 + level)/2)).
    tail: float
    method: str = _BOOT_METHOD
    #: Discordant pairs n01 + n10 (Σ|b − a| over episodes with several samples per episode).
    n_discordant: float = 0.0
    #: "bootstrap", or "posterior" when fewer than MIN_DISCORDANT pairs are discordant.
    source: str = "bootstrap"
    #: Episodes per cluster, in cluster order (first appearance of each label).
    cluster_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class BayesInterval:
    """Posterior of ``p01 − p10`` under a Dirichlet–multinomial model of the paired cells."""

    mean: float
    low: float
    high: float
    #: Posterior probability that p01 − p10 > 0 (b better than a), estimated from the draws.
    p_positive: float
    level: float
    #: Dirichlet prior on the four corner cells (α00, α01, α10, α11).
    prior: tuple[float, float, float, float]
    n_draws: int
    seed: int
    #: Observed (n00, n01, n10, n11); with several samples per episode, each episode split over the four
    #: cells by its success fractions (so the counts may be fractional).
    counts: tuple[float, float, float, float]
    #: Estimated design effect D̂ of the clustering (≥ 1; 1 = episodes treated as independent).
    design_effect: float
    #: Degrees of freedom of D̂ (S − 1) when D̂ > 1 and its uncertainty is integrated out, else None.
    design_effect_df: int | None
    method: str = _BAYES_METHOD
    #: Samples per episode k (1: one outcome each); a side with k samples has k + 1 levels, else 2.
    samples: int = 1


@dataclass(frozen=True)
class McNemarResult:
    """Exact conditional McNemar test of P(01) = P(10)."""

    n00: int
    n01: int
    n10: int
    n11: int
    p_value: float
    method: str = (
        "exact binomial on discordant pairs: p = min(1, 2·P(X ≤ min(n01, n10))), X ~ Bin(n01 + n10, ½)"
    )


@dataclass(frozen=True)
class Comparison:
    """Agent b against agent a on identical episodes."""

    rate_a: RateInterval
    rate_b: RateInterval
    bootstrap: BootstrapInterval
    bayes: BayesInterval
    mcnemar: McNemarResult
    level: float
    verdict: str
    rule: str = VERDICT_RULE

    @property
    def diff(self) -> float:
        """mean(b) − mean(a)."""
        return self.bootstrap.diff


@dataclass(frozen=True)
class Headroom:
    """One task: sampled − greedy success (``comparison`` has a = greedy, b = sampled)."""

    task: str
    comparison: Comparison
    #: "headroom", "no credible headroom" or "sampling credibly worse".
    verdict: str

    @property
    def has_headroom(self) -> bool:
        return self.verdict == "headroom"

    @property
    def headroom(self) -> float:
        """Sampled success rate − greedy success rate."""
        return self.comparison.diff


@dataclass(frozen=True)
class HeadroomTable:
    """Per-task headroom, in the order the tasks were given."""

    rows: tuple[Headroom, ...]

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(r.task for r in self.rows)

    def __getitem__(self, task: str) -> Headroom:
        for r in self.rows:
            if r.task == task:
                return r
        raise KeyError(task)


@dataclass(frozen=True)
class RegimeInterval:
    """The mean change over a regime's RL runs (one per training seed) against the SFT model."""

    #: mean over runs of mean(b_r) − mean(a_r).
    diff: float
    low: float
    high: float
    level: float
    n_runs: int
    #: Each run's mean(b_r) − mean(a_r), in the order given.
    run_diffs: tuple[float, ...]
    #: "one run", "shared evaluation" (every run on the same episodes and clusters) or
    #: "separate evaluations"; see :func:`regime_interval`.
    design: str
    #: True with one run: the interval is conditional on that run's training seed.
    conditional: bool
    #: Standard deviation of the bootstrap distribution (the standard error the interval uses).
    sd: float
    #: Degrees of freedom of the t multiple (Satterthwaite, rounded down), None when not used.
    df: int | None
    #: (run part, shared-evaluation part) of the variance the bootstrap reproduces (see the function).
    variance: tuple[float, float]
    n_boot: int
    seed: int
    method: str
    #: With one run, that run's :func:`paired_bootstrap`.
    run: BootstrapInterval | None = None


@dataclass(frozen=True)
class RegimeEquivalence:
    """Two one-sided tests of |Δ| < margin for a regime's mean change (Schuirmann 1987)."""

    #: The (1 − 2α) hierarchical interval, α = 1 − ``level``.
    interval: RegimeInterval
    margin: float
    #: 1 − α, the confidence of the equivalence claim.
    level: float
    #: True iff −margin < interval.low and interval.high < margin.
    equivalent: bool
    rule: str = (
        "equivalent: the (1 − 2α) hierarchical interval lies inside (−margin, +margin), i.e. both one-sided "
        "tests Δ ≤ −margin and Δ ≥ +margin reject at α"
    )


@dataclass(frozen=True)
class DetectableImprovement:
    """The smallest improvement :func:`compare` calls credibly better with the given power."""

    #: Δ, in success fraction; inf when no Δ ≤ 1 − p0 reaches the power.
    delta: float
    #: Δ / (1 − p0): the share of the baseline's failures the treatment must fix.
    fixed_share: float
    #: m*, the fewest one-way discordant pairs :func:`compare` calls credibly better.
    min_pairs: int | None
    p0: float
    n_clusters: int
    n_episodes: int
    level: float
    power: float
    detectable: bool
    method: str = (
        "n01 ~ Bin(N, Δ), n10 = 0 (the treatment fixes a share Δ/(1 − p0) of failures and breaks nothing); "
        "m* = fewest one-way pairs, spread evenly over the clusters, for which compare() says credibly "
        "better; Δ solves P(Bin(N, Δ) ≥ m*) = power (bisection)"
    )


@dataclass(frozen=True)
class CorrelationInterval:
    """A correlation with a pairs-bootstrap percentile interval."""

    method: str  # "pearson" or "spearman" (Pearson correlation of average ranks)
    estimate: float
    low: float
    high: float
    level: float
    n: int
    n_boot: int
    #: Resamples with a defined correlation (a resample whose x or y is constant has none).
    n_valid: int
    seed: int
    interval: str = "pairs bootstrap, percentile interval over resamples with a defined correlation"


# --------------------------------------------------------------------------------------------------
# Validation


def _check_level(level: float) -> float:
    if not isinstance(level, (int, float, np.floating)) or not 0.0 < float(level) < 1.0:
        raise GraftkitError(
            f"level={level!r}: expected a confidence level strictly between 0 and 1", "e.g. level=0.95"
        )
    return float(level)


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise GraftkitError(f"{name}={value!r}: expected an integer ≥ {minimum}")
    return int(value)


def _zero_one(x, name: str, expected: str) -> np.ndarray:
    """``x`` as an int8 array of 0/1 (any shape, non-empty), or a GraftkitError naming ``expected``."""
    arr = np.asarray(x)
    if arr.size == 0:
        raise GraftkitError(f"{name}: expected {expected}; got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in "iuf":
            raise GraftkitError(f"{name}: expected {expected}; got dtype {arr.dtype}")
        if not np.isin(arr, (0, 1)).all():
            bad = arr[~np.isin(arr, (0, 1))].ravel()[0].item()
            raise GraftkitError(f"{name}: expected {expected}; found the value {bad!r}")
    return arr.astype(np.int8)


def _outcomes(x, name: str) -> np.ndarray:
    """``x`` as an int8 array [n_seeds, n_episodes_per_seed] of 0/1, or a GraftkitError."""
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.size == 0:
        raise GraftkitError(f"{name}: expected {_LAYOUTS}; got shape {arr.shape}")
    return _zero_one(arr, name, _OUTCOMES)


def _paired(a, b, names: tuple[str, str] = ("a", "b")) -> tuple[np.ndarray, np.ndarray]:
    a, b = _outcomes(a, names[0]), _outcomes(b, names[1])
    if a.shape != b.shape:
        raise GraftkitError(
            f"{names[0]} has shape {a.shape} but {names[1]} has {b.shape}: expected identical "
            f"[n_seeds, n_episodes_per_seed] arrays aligned episode by episode"
        )
    return a, b


@dataclass(frozen=True)
class _Paired:
    """Paired outcomes in one flat layout: episode e has a's and b's successes out of ``samples`` and a
    cluster index; every paired statistic works on this."""

    a: np.ndarray  # [N] int64, a's successes on the episode, 0..samples
    b: np.ndarray  # [N] int64
    cluster: np.ndarray  # [N] int64, 0..S − 1 in order of first appearance
    labels: tuple  # [S] the cluster labels, in that order
    samples: int = 1  # K: outcomes per episode

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.cluster, minlength=len(self.labels))

    @property
    def d(self) -> np.ndarray:
        """[N] b − a per episode, in success fraction."""
        return (self.b - self.a) / self.samples


def _label_index(labels: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Cluster index per episode (0..S − 1, in order of first appearance) and the labels in that order."""
    try:
        uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    except TypeError:  # labels of mixed types do not sort
        index: dict = {}
        idx = np.fromiter((index.setdefault(v, len(index)) for v in labels.tolist()), np.int64, labels.size)
        return idx, tuple(index)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.ravel()].astype(np.int64), tuple(uniq[order].tolist())


def _as_pairs(a, b, clusters=None, names: tuple[str, str] = ("a", "b")) -> _Paired:
    """Either layout (2-d rows = clusters, or 1-d with ``clusters``) as :class:`_Paired`."""
    if clusters is None:
        a2, b2 = _paired(a, b, names)
        n_seeds, n_eps = a2.shape
        return _Paired(a2.ravel().astype(np.int64), b2.ravel().astype(np.int64),
                       np.repeat(np.arange(n_seeds, dtype=np.int64), n_eps), tuple(range(n_seeds)))
    labels = np.asarray(clusters)
    if labels.ndim != 1 or labels.size == 0:
        raise GraftkitError(f"clusters: expected a non-empty 1-d array of cluster labels, one per episode; got "
                            f"shape {labels.shape}")
    arrs = []
    for name, x in zip(names, (a, b)):
        arr = np.asarray(x)
        if arr.ndim != 1:
            raise GraftkitError(f"{name}: with clusters= expected a 1-d array of per-episode 0/1 outcomes; got "
                                f"shape {arr.shape}", "pass rows as clusters without clusters=, or ravel both")
        arrs.append(_zero_one(arr, name, "0/1 per-episode outcomes").astype(np.int64))
    if not arrs[0].size == arrs[1].size == labels.size:
        raise GraftkitError(f"{names[0]} has {arrs[0].size} episodes, {names[1]} {arrs[1].size} and clusters "
                            f"{labels.size}: expected one label per episode, aligned episode by episode")
    idx, uniq = _label_index(labels)
    return _Paired(arrs[0], arrs[1], idx, uniq)


def _cells(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int, int]:
    n = np.bincount((2 * a + b).ravel(), minlength=4)
    return int(n[0]), int(n[1]), int(n[2]), int(n[3])


def _four_cells(p: _Paired) -> tuple[float, float, float, float]:
    """(n00, n01, n10, n11); with K samples each episode adds (1 − a)(1 − b), (1 − a)b, a(1 − b), ab of
    its success fractions a, b (integers when K = 1)."""
    if p.samples == 1:
        return _cells(p.a, p.b)
    fa, fb = p.a / p.samples, p.b / p.samples
    return (float(((1 - fa) * (1 - fb)).sum()), float(((1 - fa) * fb).sum()), float((fa * (1 - fb)).sum()),
            float((fa * fb).sum()))


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def _percentile(draws: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _clip(x: float) -> float:
    """A bound of a difference of two rates, clipped to its range [−1, 1]."""
    return float(min(1.0, max(-1.0, x)))


def _t_cdf(t: float, df: int) -> float:
    """Student-t CDF for integer df, closed form (Abramowitz & Stegun 26.7.3–4); 26.7.5 for df > 200.

    With θ = atan(t/√df), P(|T| ≤ t) is (2/π)(θ + sin θ Σ_{j<(df−1)/2} a_j cos^{2j+1} θ) for odd df
    and sin θ Σ_{j<df/2} b_j cos^{2j} θ for even df, where a_j = (2·4···2j)/(3·5···(2j+1)) and
    b_j = (1·3···(2j−1))/(2·4···2j) (a_0 = b_0 = 1).
    """
    if df > 200:
        return NormalDist().cdf(_cornish_fisher_inverse(t, df))
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2:
        total, term = 0.0, cos
        for j in range((df - 1) // 2):
            total += term
            term *= cos * cos * (2 * j + 2) / (2 * j + 3)
        inside = 2 / math.pi * (theta + sin * total)
    else:
        total, term = 0.0, 1.0
        for j in range(df // 2):
            total += term
            term *= cos * cos * (2 * j + 1) / (2 * j + 2)
        inside = sin * total
    return 0.5 + math.copysign(inside / 2, t)


def _cornish_fisher_inverse(t: float, df: int) -> float:
    """The z with t_df(z) = t, where t_df(z) is the A&S 26.7.5 expansion of the t quantile in z."""
    def t_of_z(z: float) -> float:
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2) + (
            3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    lo, hi = -abs(t) - 1, abs(t) + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_of_z(mid) < t else (lo, mid)
    return (lo + hi) / 2


def _t_quantile(p: float, df: int | None) -> float:
    """Student-t quantile (df = None: the normal one), by bisection on :func:`_t_cdf`."""
    if df is None:
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -_t_quantile(1 - p, df)
    hi = 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2


def _expanded_tail(level: float, df: int | None) -> float:
    """Lower percentile Φ(−t_df((1 + level)/2)) of the expanded percentile interval (Hesterberg 2015).

    A normal statistic whose variance is estimated on df degrees of freedom needs t_df, not z,
    multiples of its standard error: reading the bootstrap distribution at these percentiles does
    that. df = None gives the plain (1 − level)/2.
    """
    return NormalDist().cdf(-_t_quantile((1 + level) / 2, df))


# --------------------------------------------------------------------------------------------------
# One rate


def fold_episodes(success, task_index=None) -> np.ndarray:
    """Outcomes ``[task, seed, episode, ...]`` of the tasks ``task_index`` (default: every task) as one
    outcome array ``[seed, task·episode·...]``: seeds stay the rows (the clusters that paired statistics
    resample), each row holds task 0's episodes, then task 1's, and so on."""
    x = np.asarray(success)
    if task_index is not None:
        x = x[list(task_index)]
    return np.moveaxis(x, 0, 1).reshape(x.shape[1], -1)


def wilson_interval(successes: int, n: int, level: float = 0.95) -> RateInterval:
    """Wilson score interval for a binomial rate p̂ = x/n.

    The set of p with |p̂ − p| ≤ z·√(p(1 − p)/n), z = Φ⁻¹((1 + level)/2), which is::

        centre = (p̂ + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · √(p̂(1 − p̂)/n + z²/4n²)

    Unlike the Wald interval it stays inside [0, 1] and keeps near-nominal coverage for rates near 0
    or 1 (Brown, Cai & DasGupta 2001). Same as R ``prop.test(x, n, correct = FALSE)``.
    """
    level = _check_level(level)
    n = _check_count(n, "n", 1)
    x = _check_count(successes, "successes", 0)
    if x > n:
        raise GraftkitError(f"successes={x} > n={n}: expected 0 ≤ successes ≤ n")
    z = _z(level)
    p = x / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The exact endpoints at x = 0 and x = n are 0 and 1; clip away rounding.
    low = 0.0 if x == 0 else max(0.0, centre - half)
    high = 1.0 if x == n else min(1.0, centre + half)
    return RateInterval(successes=x, n=n, rate=p, low=low, high=high, level=level)


# --------------------------------------------------------------------------------------------------
# Clusters


def cluster_labels(seed_ids, item_ids) -> np.ndarray:
    """Cluster index per episode: the connected component of the graph on episodes in which two episodes
    are linked when they share an evaluation seed OR an item.

    Episodes of one seed are correlated (the seed draws the environment), and so are two episodes of one
    item, whatever their seeds: an item repeated across seeds therefore merges those seeds into one
    cluster, transitively (seeds 1 and 2 share item x, seeds 2 and 3 share item y: one cluster {1, 2, 3}).
    The components are those of the bipartite graph seed — item with one edge per episode, found by
    union–find (union by size, path halving; Tarjan 1975). Labels are 0, 1, … in order of each
    component's first episode; with no item repeated across seeds they are the seeds, relabelled.

    ``seed_ids`` and ``item_ids`` are 1-d, one entry per episode (ints or strings). The result is the
    ``clusters=`` argument of the paired functions.
    """
    seeds, items = np.asarray(seed_ids), np.asarray(item_ids)
    if seeds.ndim != 1 or items.ndim != 1 or seeds.size != items.size or seeds.size == 0:
        raise GraftkitError(
            f"seed_ids has shape {seeds.shape} and item_ids {items.shape}: expected two non-empty 1-d arrays "
            f"with one entry per episode"
        )
    s_idx, s_labels = _label_index(seeds)
    i_idx, _ = _label_index(items)
    n_seeds = len(s_labels)
    parent = list(range(n_seeds + int(i_idx.max()) + 1))
    size = [1] * len(parent)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s, i in zip(s_idx.tolist(), (i_idx + n_seeds).tolist()):
        rs, ri = find(s), find(i)
        if rs != ri:
            if size[rs] < size[ri]:
                rs, ri = ri, rs
            parent[ri] = rs
            size[rs] += size[ri]
    root = np.array([find(s) for s in range(n_seeds)])
    return _label_index(root[s_idx])[0]


# --------------------------------------------------------------------------------------------------
# Paired difference: bootstrap


def _resampled_sum_pmf(probs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``pmf[s, j]`` = P(sum of n_s i.i.d. draws of v ∈ {−K, …, K}, P(v) = ``probs[s, v + K]``, equals
    j − K·max(n)), n_s = ``sizes[s]``: the n_s-fold convolution, built one draw at a time (cluster s stops
    after its own n_s draws)."""
    n_clusters, n_values = probs.shape
    k_max = (n_values - 1) // 2
    n_max = int(sizes.max())
    pmf = np.zeros((n_clusters, 2 * k_max * n_max + 1))
    pmf[:, k_max * n_max] = 1.0
    shifts = [v for j in range(1, k_max + 1) for v in (j, -j)]
    for step in range(n_max):
        rows = sizes > step
        every = bool(rows.all())
        cur, p = (pmf, probs) if every else (pmf[rows], probs[rows])
        nxt = cur * p[:, k_max, None]
        for v in shifts:
            if v > 0:
                nxt[:, v:] += cur[:, :-v] * p[:, k_max + v, None]
            else:
                nxt[:, :v] += cur[:, -v:] * p[:, k_max + v, None]
        if every:
            pmf = nxt
        else:
            pmf[rows] = nxt
    return pmf


def _cluster_factors(m: np.ndarray, sizes: np.ndarray, ss_within: np.ndarray):
    """(c, k_s, df, d̄, w_s) of the two-stage bootstrap from cluster means ``m``, sizes and within-cluster
    sums of squares Σ_e (d_e − m_s)²: the factors that make Var*(θ*) = max(V̂_clu, V̂_iid) (see
    :func:`paired_bootstrap` for the formulas)."""
    n_clusters = m.size
    n_total = int(sizes.sum())
    w = sizes * n_clusters / n_total  # [S] size weights, mean 1 (all 1.0 for equal sizes)
    d_bar = float((w * m).mean())
    between = float((sizes.astype(np.float64) ** 2 * (m - d_bar) ** 2).sum())  # B
    big = sizes > 1
    within = float((sizes[big] * ss_within[big] / (sizes[big] - 1)).sum())  # W
    k = np.where(big, np.sqrt(sizes / np.maximum(sizes - 1, 1)), 0.0)
    v_clu, v_iid = _variances(m, sizes, ss_within)
    clustered = n_clusters > 1 and v_clu >= v_iid and v_clu > 0
    target = max(v_clu, v_iid) * n_total**2  # N²·Var*(θ*) wanted
    if target >= within and between > 0:
        c = math.sqrt((target - within) / between)
    else:
        c = 0.0
        if within > 0:
            k = k * math.sqrt(min(1.0, target / within))
    df = (n_clusters - 1 if clustered else n_total - 1) or None
    return c, k, df, d_bar, w


def _variances(m: np.ndarray, sizes: np.ndarray, ss_within: np.ndarray) -> tuple[float, float]:
    """(V̂_clu, V̂_iid) of d̄: S/(S − 1) · Σ_s n_s² (m_s − d̄)² / N² (0 for one cluster) and
    Σ_e (d_e − d̄)² / ((N − 1)·N), the total sum of squares from the within- and between-cluster parts."""
    n_clusters, n_total = m.size, int(sizes.sum())
    d_bar = float((sizes * n_clusters / n_total * m).mean())
    ss_total = float(ss_within.sum()) + float((sizes * (m - d_bar) ** 2).sum())
    v_iid = ss_total / ((n_total - 1) * n_total) if n_total > 1 else 0.0
    between = float((sizes.astype(np.float64) ** 2 * (m - d_bar) ** 2).sum())
    v_clu = n_clusters / (n_clusters - 1) * between / n_total**2 if n_clusters > 1 else 0.0
    return v_clu, v_iid


def _cluster_summary(p: _Paired):
    """Cluster means m_s [S], sizes n_s [S] and within-cluster sums of squares [S] of d."""
    sizes = p.sizes
    d = p.d
    m = np.bincount(p.cluster, weights=d, minlength=sizes.size) / sizes
    ss_w = np.bincount(p.cluster, weights=(d - m[p.cluster]) ** 2, minlength=sizes.size)
    return m, sizes, ss_w


def cluster_bootstrap_factors(d: np.ndarray) -> tuple[float, float, int | None]:
    """(c, k, df) of the two-stage bootstrap of per-episode values ``d[seed, episode]``: the seed-stage
    shrink c, the episode-stage scale k and the degrees of freedom of the expanded percentiles, chosen so
    that the bootstrap variance is max(V̂_seed, V̂_iid) (see :func:`paired_bootstrap`, whose docstring
    derives them). With SS_B = E Σ_s (m_s − m̄)², SS_W = Σ_s Σ_e (d[s, e] − m_s)², MS_B = SS_B/(S − 1),
    MS_W = SS_W/(S(E − 1))::

        MS_B ≥ MS_W:  c = √(S/(S − 1) − SS_W / ((E − 1)·SS_B)),  k = √(E/(E − 1)),  df = S − 1
        MS_B < MS_W:  c = 0,  k = √((SS_B + SS_W) / (N − 1) · N / SS_W),  df = N − 1   (N = S·E)

    (k = 0 when E = 1, c = √(S/(S − 1)) then; c = 0, df = N − 1 when S = 1; df None when 0.)
    """
    d = np.asarray(d, dtype=np.float64)
    n_seeds, n_eps = d.shape
    m = d.mean(axis=1)
    c, k, df, _, _ = _cluster_factors(m, np.full(n_seeds, n_eps), ((d - m[:, None]) ** 2).sum(axis=1))
    return c, float(k[0]), df


def _two_stage_draws(p: _Paired, m, sizes, c, k, d_bar, w, n_boot: int, seed: int) -> np.ndarray:
    """θ* [n_boot] of :func:`paired_bootstrap` (its docstring has the formula)."""
    n_clusters, n_max, res = sizes.size, int(sizes.max()), p.samples
    du = p.b - p.a  # [N] integer differences, −K..K
    n_values, width = 2 * res + 1, 2 * res * n_max + 1
    rng = np.random.default_rng(seed)
    theta = np.empty(n_boot)
    tabulated = n_max * n_values * n_clusters * width <= _TABLE_WORK
    if tabulated:
        # Row s of `cdf`, shifted up by s, is P(Σ of n_s resampled values ≤ j − K·n_max): one sorted table.
        counts = np.bincount(p.cluster * n_values + du + res, minlength=n_clusters * n_values)
        pmf = _resampled_sum_pmf(counts.reshape(n_clusters, n_values) / sizes[:, None], sizes)
        cdf = np.minimum(np.cumsum(pmf, axis=1), 1.0)
        cdf[np.arange(width)[None, :] >= (res * (n_max + sizes))[:, None]] = 1.0
        table = (cdf + np.arange(n_clusters)[:, None]).ravel()
        block = max(1, _BLOCK_ELEMENTS // n_clusters)
    else:
        order = np.argsort(p.cluster, kind="stable")
        start_of = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        padded = np.zeros((n_clusters, n_max), dtype=np.int64)
        padded[p.cluster[order], np.arange(du.size) - start_of[p.cluster[order]]] = du[order]
        block = max(1, _BLOCK_ELEMENTS // (n_clusters * n_max))
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pick = rng.integers(0, n_clusters, size=(rows, n_clusters))  # [boot, S] resampled clusters
        n_pick = sizes[pick]
        if tabulated:
            u = rng.random((rows, n_clusters))
            j = np.searchsorted(table, pick + u, side="right") - pick * width
            sums = np.minimum(j, width - 1) - res * n_max
        else:
            idx = (rng.random((rows, n_clusters, n_max)) * n_pick[..., None]).astype(np.int64)
            inside = np.arange(n_max) < n_pick[..., None]
            sums = np.where(inside, padded[pick[..., None], idx], 0).sum(axis=-1)
        m_star = sums / (res * n_pick)  # [boot, S] within-cluster resample means
        m_pick = m[pick]
        theta[start : start + rows] = d_bar + (w[pick] * (c * (m_pick - d_bar) + k[pick] * (m_star - m_pick))).mean(
            axis=1)
    return theta


def paired_bootstrap(
    a, b, level: float = 0.95, n_boot: int = 10_000, seed: int = 0, *, clusters=None
) -> BootstrapInterval:
    """Two-stage bootstrap interval for mean(b) − mean(a) over identical episodes.

    Layouts: ``a, b [cluster, episode]`` (rows are the clusters), or 1-d ``a, b [episode]`` with
    ``clusters`` (one label per episode; clusters may differ in size).

    With d_e = b_e − a_e, cluster means m_s over its n_s episodes, N = Σ n_s, size weights
    w_s = S·n_s / N (mean 1) and d̄ = Σ_s n_s m_s / N = (1/S) Σ_s w_s m_s, one resample is::

        s*_1..s*_S            clusters drawn with replacement
        m*_j                  mean of n_{s*_j} episodes drawn with replacement from cluster s*_j's d values
        θ* = d̄ + (1/S) Σ_j w_{s*_j} [ c·(m_{s*_j} − d̄) + k_{s*_j}·(m*_j − m_{s*_j}) ]

    and the interval is read off the distribution of θ* at the expanded percentiles (tail, 1 − tail)
    below, clipped to [−1, 1] (the factors c, k can carry a resample past the range a difference of rates
    can take). Pairs stay together because the resampled unit is the pair (its d). The fixed denominator
    N (not the resample's own Σ n) is the linearisation of the ratio estimator Σ n m / Σ n (Cochran 1977,
    ch. 6); with equal sizes every w_s = 1 and this is the plain mean over the S resampled clusters.

    Why (c, k) and not (1, 1): (c, k) = (1, 1) is the plain two-stage bootstrap. The spread of the
    cluster means already contains the within-cluster noise, so resampling episodes again counts that
    noise twice: up to twice the true variance when clusters do not differ (Davison & Hinkley 1997 §3.8;
    Field & Welsh 2007). On simulated data (25 × 20, per-seed random effects) the plain version covered
    98–99.5% at a nominal 95%. The factors make the bootstrap variance of θ* equal
    V̂ = max(V̂_clu, V̂_iid), where V̂_clu = S/(S − 1) · B / N² is the cluster-robust variance of d̄ (the
    ratio estimator's over clusters of unequal size, Cochran 1977, ch. 9A; s²_m/S for equal sizes) and
    V̂_iid = Σ_e (d_e − d̄)² / ((N − 1)·N) the variance for independent episodes::

        B = Σ_s n_s² (m_s − d̄)²           W = Σ_s n_s · s²_s,  s²_s = Σ_e (d_e − m_s)² / (n_s − 1)
        Var*(θ*) = (c²·B + κ²·W) / N²      k_s = κ·√(n_s / (n_s − 1))  (0 when n_s = 1)
        c² = (N²·V̂ − W) / B,  κ = 1       when N²·V̂ ≥ W (the k_s² turn plug-in variances into s²_s)
        c = 0,  κ² = N²·V̂ / W              otherwise

    With equal sizes E and V̂_clu ≥ V̂_iid this is c² = S/(S − 1) − SS_W/((E − 1)·SS_B), k = √(E/(E − 1))
    (SS_B = E·Σ_s (m_s − m̄)², SS_W = Σ_s Σ_e (d_e − m_s)²; :func:`cluster_bootstrap_factors`). The max
    truncates the between-cluster variance component at zero, as the design effect of
    :func:`bayes_paired_interval` does (D ≥ 1): the interval never assumes clusters to be more alike than
    independent episodes. When the estimated component is negative (V̂_clu < V̂_iid; for equal sizes
    exactly MS_between < MS_within, i.e. c² < 0 in the formula above) the episodes are taken as
    independent and their variance is estimated on all N − 1 degrees of freedom, between and within
    clusters pooled. Using the within-cluster part W/N² alone there makes the variance the larger of two
    estimates of one quantity when clusters do not differ: at 25 × 2 episodes that covered 96–97%,
    pooling 95–96%. With one cluster, c = 0 (inference conditional on it); with one episode per cluster,
    W = 0 and the cluster stage alone carries the variance.

    Small samples: V̂ is estimated on df = S − 1 degrees of freedom when V̂_clu ≥ V̂_iid (else N − 1),
    and a percentile interval at (1 ± level)/2 would act like z·SE where t_df·SE is due (≈ 94% coverage
    at S = 25, ≈ 93% at S = 10 in the tests' simulation). So the percentiles read are
    tail = Φ(−t_df((1 + level)/2)) and 1 − tail, the expanded percentile interval of Hesterberg (2015,
    §5) (its √(n/(n − 1)) factor is already in V̂).

    Few discordant pairs: all the information on d̄ is in the m = n01 + n10 discordant pairs. With none,
    every resample is 0 and the interval collapses to [0, 0] whatever the truth; with a handful, all one
    way (a treatment that fixes a few failures near the ceiling), a resample often misses them all or
    keeps them all, so the bounds sit at 0 or past the truth: at p = 0.99 a true +0.5-point change that
    fixes failures was covered 22% of the time with 25 × 2 episodes, 40% with 25 × 4. The bootstrap reads the sampling spread off the
    observed events and has nothing to read it from when they are rare. So when m < :data:`MIN_DISCORDANT`
    the interval is the Bayesian posterior's (:func:`bayes_paired_interval` with the uniform prior α = 1,
    ``n_boot`` draws, the same seed): its prior is one pseudo-episode per cell, which, like the
    pseudo-pairs of Agresti & Min (2005), keeps the interval about as wide as the rule of three
    (≈ ±3.7/N when m = 0) instead of zero, and its design effect still accounts for the clustering.
    With very few episodes the prior's pull toward 0 can leave d̄ outside that interval (four episodes,
    all discordant one way: d̄ = 1, posterior interval below 0.95); the interval is then widened to
    reach d̄, so it always contains its own estimate. ``source`` records which interval was used ("bootstrap" or "posterior"), ``n_discordant`` the m;
    ``diff``, c, k and df are reported either way. The threshold was read off simulation (25 seeds × 2
    episodes, per-seed logit-normal effects, 4000 datasets a cell at p0 = 0.3–0.99): coverage
    95.5–96.6% with a threshold of 5, 96.0–96.6% with 10, 96.5–97.2% with 15; with none, 53% at the
    ceiling. 10 keeps a margin above the collapse for clustered or one-sided data at little cost.

    Stage two only matters through the sum of n_s values drawn with replacement from the cluster's d (a
    multiple of 1/K, K samples per episode; K = 1 for 0/1 outcomes). Its exact distribution
    (:func:`_resampled_sum_pmf`) is tabulated once per cluster and sampled by inverse CDF, one uniform per
    chosen cluster: the same distribution as drawing n_s episode indices, in O(n_boot · S) work instead of
    O(n_boot · N). Very large clusters (a table above 5·10⁷ operations) draw the indices instead.
    """
    return _bootstrap(_as_pairs(a, b, clusters), _check_level(level), _check_count(n_boot, "n_boot", 1),
                      _check_count(seed, "seed", 0))


def _bootstrap(p: _Paired, level: float, n_boot: int, seed: int) -> BootstrapInterval:
    m, sizes, ss_w = _cluster_summary(p)
    c, k, df, d_bar, w = _cluster_factors(m, sizes, ss_w)
    tail = _expanded_tail(level, df)
    equal = bool((sizes == sizes[0]).all())
    n_disc = float(np.abs(p.b - p.a).sum() / p.samples)
    common = dict(
        diff=d_bar, level=level, n_boot=n_boot, seed=seed, n_seeds=int(sizes.size),
        n_episodes=int(sizes[0]) if equal else None, seed_shrink=c, episode_scale=float(k[0]) if equal else None,
        df=df, tail=tail, n_discordant=n_disc, cluster_sizes=tuple(int(n) for n in sizes),
    )
    if n_disc < MIN_DISCORDANT:
        post = _posterior(p, level, (1.0, 1.0, 1.0, 1.0), n_boot, seed)
        return BootstrapInterval(low=min(post.low, d_bar), high=max(post.high, d_bar), method=_BOOT_FALLBACK,
                                 source="posterior", **common)
    theta = _two_stage_draws(p, m, sizes, c, k, d_bar, w, n_boot, seed)
    low, high = np.quantile(theta, [tail, 1 - tail])
    return BootstrapInterval(low=_clip(low), high=_clip(high), **common)


# --------------------------------------------------------------------------------------------------
# Paired difference: Bayesian


def _prior4(prior) -> tuple[float, float, float, float]:
    try:
        alpha = np.asarray(prior, dtype=np.float64)
    except (TypeError, ValueError):
        alpha = np.full(1, np.nan)
    if alpha.ndim == 0:
        alpha = np.full(4, float(alpha))
    if alpha.shape != (4,) or not np.all(np.isfinite(alpha)) or not np.all(alpha > 0):
        raise GraftkitError(
            f"prior={prior!r}: expected a positive Dirichlet concentration, one number or four "
            f"(α00, α01, α10, α11)", "e.g. prior=1.0 (uniform on the simplex) or prior=0.5 (Jeffreys)"
        )
    return tuple(float(v) for v in alpha)  # type: ignore[return-value]


def _cell_prior(alpha: tuple[float, float, float, float], res_a: int, res_b: int) -> np.ndarray:
    """Prior of the (K_a + 1)(K_b + 1) cells (i, j) = (a's successes of K_a, b's of K_b): the four corner
    α spread bilinearly in (x, y) = (i/K_a, j/K_b) and scaled by 4/((K_a + 1)(K_b + 1)), so each corner
    keeps its total mass and K_a = K_b = 1 gives (α00, α01, α10, α11) itself."""
    fa = (np.arange(res_a + 1) / res_a)[:, None]
    fb = (np.arange(res_b + 1) / res_b)[None, :]
    a00, a01, a10, a11 = alpha
    cells = a00 * (1 - fa) * (1 - fb) + a01 * (1 - fa) * fb + a10 * fa * (1 - fb) + a11 * fa * fb
    return (cells * 4 / ((res_a + 1) * (res_b + 1))).ravel()


def _design_effect(p: _Paired) -> float:
    """Var(d̄) under clustering ÷ Var(d̄) for independent episodes, floored at 1.

    Clustered: V̂ = S/(S − 1) · Σ_s n_s² (m_s − d̄)² / N² (= s²_m/S, the unbiased one-way estimate, for
    equal sizes). Independent: (mean(d²) − d̄²) / N, which for 0/1 outcomes is the multinomial variance
    (p̂01 + p̂10 − (p̂01 − p̂10)²) / N of p̂01 − p̂10.
    """
    m, sizes, _ = _cluster_summary(p)
    n_clusters = sizes.size
    if n_clusters < 2:
        return 1.0
    d = p.d
    n_total = d.size
    d_bar = float(d.mean())
    var_iid = (float((d * d).mean()) - d_bar**2) / n_total
    if var_iid <= 0.0:
        return 1.0
    w = sizes * n_clusters / n_total
    centre = float((w * m).mean())
    var_clustered = n_clusters / (n_clusters - 1) * float((w**2 * (m - centre) ** 2).sum()) / n_clusters**2
    return max(1.0, var_clustered / var_iid)


def bayes_paired_interval(
    a, b, level: float = 0.95, prior: float | Sequence[float] = 1.0, n_draws: int = 20_000, seed: int = 0,
    *, clusters=None,
) -> BayesInterval:
    """Credible interval for Δ = p01 − p10 = P(b succeeds, a fails) − P(a succeeds, b fails).

    Layouts as :func:`paired_bootstrap` (rows as clusters, or 1-d with ``clusters``).

    Model: each paired episode falls in cell 00, 01, 10 or 11 with probabilities p = (p00, p01, p10,
    p11) ~ Dirichlet(α). With counts n, the conjugate posterior is Dirichlet(α + n) (BDA3 §3.4); Δ is
    a linear function of p, so draws of p give draws of Δ, and the interval is the equal-tailed
    (1 ± level)/2 quantiles, ``mean`` the exact posterior mean and ``p_positive`` = P(Δ > 0) estimated
    from the draws. Δ ∈ [−1, 1] by construction.

    Prior: ``prior`` is α, one number for all four cells or (α00, α01, α10, α11); the default α = 1 is
    uniform on the simplex (Bayes–Laplace), 0.5 is Jeffreys'. Its marginal prior on Δ is symmetric
    about 0, so it does not favour either agent. With no discordant pair it still leaves Δ the width
    of about ±3.7/N (the prior's one pseudo-episode in each discordant cell), not zero.

    Clustering: the multinomial treats all N pairs as independent, but episodes of one cluster are
    correlated (a seed can favour one agent), which makes that posterior too narrow — on simulated data
    with per-seed effects it covered 87–89% at a nominal 95%. Following Rao & Scott (1992), the counts
    are divided by the design effect D = V̂ / ((mean(d²) − d̄²) / N) — the ratio of the cluster-robust
    variance of d̄, V̂ = S/(S − 1) · Σ_s n_s² (m_s − d̄)² / N² (= s²_m/S for equal sizes), to the
    independent-pairs one (for 0/1 outcomes (p̂01 + p̂10 − (p̂01 − p̂10)²)/N), floored at 1 — so the
    posterior is Dirichlet(α + n / D): the effective number of independent pairs is N / D. With one
    cluster, or no excess variation between clusters, D = 1 and this is the plain conjugate posterior.

    D̂ rests on S cluster means (S − 1 degrees of freedom), and plugging it in would act like z where t
    is due (≈ 94% coverage at 25 seeds). When D̂ > 1 its uncertainty is integrated out instead: each
    draw takes its own D = D̂·(S − 1)/χ²_{S−1}, the scaled-inverse-χ² posterior of a variance estimated on
    S − 1 degrees of freedom under p(σ²) ∝ 1/σ² (BDA3 §3.2), then p ~ Dirichlet(α + n / D). ``mean``
    is then the average of the conditional posterior means.

    Several samples per episode (:func:`headroom`): with K samples the cells are the joint outcomes
    (i, j) of an episode, i of K_a and j of K_b successes, where a side has K levels (K_a = K) when its
    outcomes differ between samples and 2 (K_a = 1: 0/1) when it has one outcome per episode, as
    greedy decoding does; Δ = Σ p_ij (j/K_b − i/K_a), and the prior spreads each corner α bilinearly
    over the cells (:func:`_cell_prior`), keeping its mass. K = 1 is the four-cell model above.
    """
    return _posterior(_as_pairs(a, b, clusters), _check_level(level), _prior4(prior),
                      _check_count(n_draws, "n_draws", 1), _check_count(seed, "seed", 0))


def _posterior(p: _Paired, level: float, alpha, n_draws: int, seed: int) -> BayesInterval:
    # An agent with one outcome per episode (or the same on all K samples) keeps two levels, 0 and 1.
    res_a, res_b = (1 if np.isin(x, (0, p.samples)).all() else p.samples for x in (p.a, p.b))
    i, j = p.a // (p.samples // res_a), p.b // (p.samples // res_b)
    counts = np.bincount(i * (res_b + 1) + j, minlength=(res_a + 1) * (res_b + 1)).astype(np.float64)
    value = (np.arange(res_b + 1)[None, :] / res_b - np.arange(res_a + 1)[:, None] / res_a).ravel()  # j/K_b − i/K_a
    deff = _design_effect(p)
    rng = np.random.default_rng(seed)
    deff_df = p.sizes.size - 1 if deff > 1 else None
    d_draws = deff * deff_df / rng.chisquare(deff_df, n_draws) if deff_df else np.full(n_draws, deff)
    post = _cell_prior(alpha, res_a, res_b) + counts / d_draws[:, None]  # [draw, cell]
    gam = rng.standard_gamma(post)  # Dirichlet(post) draws = normalised independent Gamma(post, 1)
    delta = (gam @ value) / gam.sum(axis=1)
    low, high = _percentile(delta, level)
    return BayesInterval(
        mean=float(((post @ value) / post.sum(axis=1)).mean()), low=_clip(low), high=_clip(high),
        p_positive=float((delta > 0).mean()), level=level, prior=alpha, n_draws=n_draws, seed=seed,
        counts=_four_cells(p), design_effect=deff, design_effect_df=deff_df, samples=p.samples,
    )


# --------------------------------------------------------------------------------------------------
# Paired difference: exact test


def mcnemar_exact(a, b, *, clusters=None) -> McNemarResult:
    """Exact two-sided McNemar test of H0: p01 = p10.

    Conditional on the m = n01 + n10 discordant pairs, n01 ~ Bin(m, ½) under H0, so::

        p = min(1, 2 · Σ_{i=0}^{min(n01, n10)} C(m, i) / 2^m)

    computed in exact integer arithmetic (p = 1 when there are no discordant pairs). The test ignores
    the clustering (``clusters`` is accepted for the 1-d layout and not used); use it beside the
    intervals, not instead of them.
    """
    return _mcnemar(_as_pairs(a, b, clusters))


def _mcnemar(p: _Paired) -> McNemarResult:
    # K samples per episode: each of b's samples is paired with the episode's a (K pairs per episode), as
    # if those pairs were independent; the intervals do not make that assumption.
    n00, n01, n10, n11 = (int(round(p.samples * x)) for x in _four_cells(p))
    m, low = n01 + n10, min(n01, n10)
    tail, term = 0, 1
    for i in range(low + 1):
        tail += term
        term = term * (m - i) // (i + 1)
    prob = min(1.0, 2 * tail / (1 << m)) if m else 1.0
    return McNemarResult(n00=n00, n01=n01, n10=n10, n11=n11, p_value=prob)


# --------------------------------------------------------------------------------------------------
# Verdicts


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


# --------------------------------------------------------------------------------------------------
# Regimes: several RL runs (training seeds) against one SFT model


def _regime_runs(pairs) -> list[_Paired]:
    runs = []
    for i, item in enumerate(pairs):
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise GraftkitError(f"pairs[{i}]: expected (a, b) or (a, b, clusters) for one RL run; got {type(item).__name__}")
        a, b, clusters = (*item, None)[:3]
        runs.append(_as_pairs(a, b, clusters, (f"pairs[{i}] a", f"pairs[{i}] b")))
    if not runs:
        raise GraftkitError("pairs is empty: expected one (a, b, clusters) per RL run of the regime")
    return runs


def _shared_evaluation(runs: list[_Paired]) -> bool:
    """Whether every run was evaluated on the same episodes in the same clusters (same labels per episode)."""
    first = runs[0]
    return all(r.cluster.size == first.cluster.size and r.labels == first.labels
               and np.array_equal(r.cluster, first.cluster) for r in runs[1:])


def _satterthwaite(parts: list[tuple[float, int]]) -> int | None:
    """⌊ν⌋ of (Σ v)² / Σ (v² / df) over variance parts (v, df) (Satterthwaite 1946); None when Σ v = 0."""
    parts = [(v, df) for v, df in parts if v > 0 and df]
    if not parts:
        return None
    nu = sum(v for v, _ in parts) ** 2 / sum(v * v / df for v, df in parts)
    return max(1, int(math.floor(nu + 1e-9)))


def _crossed_draws(runs: list[_Paired], n_boot: int, seed: int):
    """θ* of the shared-evaluation design and its variance parts ((v_run, df), (v_shared, df))."""
    n_runs = len(runs)
    sizes = runs[0].sizes
    n_clusters, n_total = sizes.size, int(sizes.sum())
    w = sizes * n_clusters / n_total
    cm = np.stack([np.bincount(r.cluster, weights=r.d, minlength=n_clusters) / sizes for r in runs])  # [R, S]
    delta = (w * cm).mean(axis=1)  # [R]
    theta = float(delta.mean())
    col = cm.mean(axis=0)  # [S] D_s
    resid = cm - col[None, :] - delta[:, None] + theta  # [R, S] e_rs
    ss_runs = float(((delta - theta) ** 2).sum())
    s2_runs = ss_runs / (n_runs - 1)
    b_clusters = float((w**2 * (col - theta) ** 2).sum())
    if n_clusters >= 2:
        v_clu = n_clusters / (n_clusters - 1) * b_clusters / n_clusters**2
        v_int = n_clusters / (n_clusters - 1) * float((w**2 * resid**2).sum()) / ((n_runs - 1) * n_clusters**2)
        k_int = math.sqrt(n_runs * n_clusters / ((n_clusters - 1) * (n_runs - 1)))
    else:
        v_clu = v_int = k_int = 0.0
    c_run = math.sqrt(max(0.0, n_runs / (n_runs - 1) - n_runs * v_int / ss_runs)) if ss_runs > 0 else 0.0
    c_clu = (math.sqrt(max(0.0, n_clusters / (n_clusters - 1) - v_int / n_runs * n_clusters**2 / b_clusters))
             if n_clusters >= 2 and b_clusters > 0 else 0.0)
    run_part = (max(s2_runs, v_int) / n_runs, n_runs - 1 if s2_runs >= v_int else (n_runs - 1) * (n_clusters - 1))
    shared_part = (max(0.0, v_clu - v_int / n_runs), n_clusters - 1)

    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot)
    block = max(1, _BLOCK_ELEMENTS // (n_clusters * (n_runs + 2)))
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pr = rng.integers(0, n_runs, size=(rows, n_runs))  # [boot, R] resampled runs
        ps = rng.integers(0, n_clusters, size=(rows, n_clusters))  # [boot, S] resampled clusters, shared by runs
        run_dev = (delta[pr] - theta).mean(axis=1)
        clu_dev = (w[ps] * (col[ps] - theta)).mean(axis=1)
        times = (pr[:, :, None] == np.arange(n_runs)).sum(axis=1)  # [boot, R] how often each run was drawn
        int_dev = (w[ps] * np.take_along_axis(times @ resid, ps, axis=1)).mean(axis=1) / n_runs
        draws[start : start + rows] = theta + c_run * run_dev + c_clu * clu_dev + k_int * int_dev
    return draws, [run_part, shared_part]


def _nested_draws(runs: list[_Paired], n_boot: int, seed: int):
    """θ* of the separate-evaluations design and its variance parts ((v_run, df),)."""
    n_runs = len(runs)
    tables = []
    for r in runs:
        sizes = r.sizes
        s = sizes.size
        w = sizes * s / sizes.sum()
        m = np.bincount(r.cluster, weights=r.d, minlength=s) / sizes
        delta = float((w * m).mean())
        v = s / (s - 1) * float((w**2 * (m - delta) ** 2).sum()) / s**2 if s >= 2 else 0.0
        tables.append((w, m, delta, v, s))
    delta = np.array([t[2] for t in tables])
    theta = float(delta.mean())
    mean_v = float(np.mean([t[3] for t in tables]))
    ss_runs = float(((delta - theta) ** 2).sum())
    s2_runs = ss_runs / (n_runs - 1)
    c_run = math.sqrt(max(0.0, n_runs / (n_runs - 1) - n_runs * mean_v / ss_runs)) if ss_runs > 0 else 0.0
    run_part = (max(s2_runs, mean_v) / n_runs,
                n_runs - 1 if s2_runs >= mean_v else sum(t[4] - 1 for t in tables))

    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot)
    s_max = max(t[4] for t in tables)
    block = max(1, _BLOCK_ELEMENTS // (n_runs * n_runs * s_max))
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pr = rng.integers(0, n_runs, size=(rows, n_runs))
        within = np.zeros((rows, n_runs))
        for r, (w, m, d_r, _, s) in enumerate(tables):
            if s < 2:
                continue
            ps = rng.integers(0, s, size=(rows, n_runs, s))  # a cluster resample for every slot run r could fill
            dev = math.sqrt(s / (s - 1)) * (w[ps] * (m[ps] - d_r)).mean(axis=-1)
            within += np.where(pr == r, dev, 0.0)
        draws[start : start + rows] = theta + c_run * (delta[pr] - theta).mean(axis=1) + within.mean(axis=1)
    return draws, [run_part]


_REGIME_METHOD = {
    "shared evaluation": (
        "hierarchical bootstrap: runs with replacement, then evaluation clusters with replacement shared by "
        "all runs (the runs share the episodes), variance-component adjusted (c_run, c_cluster, k_int); "
        "diff ± t_ν·sd*, ν Satterthwaite, clipped to [−1, 1]"
    ),
    "separate evaluations": (
        "hierarchical bootstrap: runs with replacement, then clusters with replacement within each resampled "
        "run, variance-component adjusted (c_run); diff ± t_ν·sd*, ν Satterthwaite, clipped to [−1, 1]"
    ),
}


def regime_interval(pairs, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> RegimeInterval:
    """Interval for a regime's mean change, the training seed a random effect.

    ``pairs`` has one ``(a, b, clusters)`` (or ``(a, b)``) per RL run of the regime: a = the SFT model's
    outcomes, b = that run's on the identical episodes, in either layout of :func:`paired_bootstrap`
    (``clusters=None`` for [cluster, episode] arrays). The estimate is θ̂ = (1/R) Σ_r Δ̂_r, the mean over
    the R runs of Δ̂_r = mean(b_r) − mean(a_r); the target is the population mean over training seeds.

    Variance: with R runs Var(θ̂) = σ²_run / R + (evaluation noise). When the runs share the evaluation
    (the same episodes in the same clusters — the usual design, every run against one SFT evaluation),
    part of that noise is common to all runs (a's outcomes, a seed that is hard for every policy) and
    does not average out over runs. With cluster means m_rs (cluster s of run r), w_s = S·n_s/N,
    Δ̂_r = (1/S) Σ_s w_s m_rs, D_s = (1/R) Σ_r m_rs and residuals e_rs = m_rs − D_s − Δ̂_r + θ̂::

        s²_R  = Σ_r (Δ̂_r − θ̂)² / (R − 1)                       runs' spread: σ²_run + per-run noise
        V_int = S/(S − 1) · Σ_rs w_s² e²_rs / ((R − 1)·S²)      per-run (run-specific) evaluation noise
        V_clu = S/(S − 1) · Σ_s w_s² (D_s − θ̂)² / S²            evaluation noise of the run-averaged D_s
        V̂     = max(s²_R, V_int) / R  +  max(0, V_clu − V_int / R)

    the two-way (runs × clusters) variance of a mean with the interaction counted once (Cameron, Gelbach
    & Miller 2011; the pigeonhole bootstrap's double count removed, Owen 2007). Each max is the
    truncation of a variance component at 0: the runs are never taken to agree more closely than their
    own evaluation noise allows, and the shared part is never negative. One resample draws R runs r*_j
    and S clusters s*_i (the same clusters for every run)::

        θ* = θ̂ + c_run·(1/R) Σ_j (Δ̂_{r*_j} − θ̂) + c_clu·(1/S) Σ_i w_{s*_i} (D_{s*_i} − θ̂)
               + k_int·(1/R) Σ_j (1/S) Σ_i w_{s*_i} e_{r*_j s*_i}
        c_run² = max(0, R/(R − 1) − R·V_int / Σ_r (Δ̂_r − θ̂)²),   k_int² = R·S / ((R − 1)(S − 1)),
        c_clu² = max(0, S/(S − 1) − (V_int / R)·S² / Σ_s w_s² (D_s − θ̂)²)

    whose three terms are uncorrelated (residuals sum to zero over runs and, weighted, over clusters),
    so Var*(θ*) = V̂: the correction of :func:`paired_bootstrap` (c, k) applied at both levels.
    When the runs were evaluated separately (cluster labels differ), their evaluation noise is
    independent and sits in s²_R already; runs are resampled, then clusters within each resampled run
    (factor √(S_r/(S_r − 1)), variance V_r = the run's cluster-robust variance of Δ̂_r), with
    c_run² = max(0, R/(R − 1) − R·mean_r V_r / Σ_r (Δ̂_r − θ̂)²), so V̂ = max(s²_R, mean_r V_r) / R.

    Interval: θ̂ ± t_ν · sd(θ*), clipped to [−1, 1]. ν is the Satterthwaite (1946) degrees of freedom of
    V̂'s parts: the run part rests on R − 1 (on the residual or within-run degrees of freedom when its
    floor is taken), the shared part on S − 1; rounded down. The expanded percentile interval of
    :func:`paired_bootstrap` is the same interval for a normal bootstrap distribution, but with a
    handful of runs the resampled run mean takes only C(2R − 1, R) values and its t-expanded tail
    (Φ(−t_2(0.975)) ≈ 8·10⁻⁶ at R = 3) lies past any feasible n_boot, so the t multiple is applied to
    the bootstrap standard deviation instead.

    One run: no training-seed variance can be estimated, so the result is :func:`paired_bootstrap` of
    that run, ``conditional=True`` (an interval for that training seed, not for the regime).
    Few discordant pairs over all runs (Σ_r Σ_e |b − a| < :data:`MIN_DISCORDANT`): the runs cannot show
    any spread; the interval is the posterior of all runs' pairs pooled (:func:`bayes_paired_interval`,
    α = 1, clusters as above; widened where needed to contain θ̂), also ``conditional=True``.
    """
    level = _check_level(level)
    n_boot = _check_count(n_boot, "n_boot", 1)
    seed = _check_count(seed, "seed", 0)
    runs = _regime_runs(pairs)
    n_runs = len(runs)
    if n_runs == 1:
        boot = _bootstrap(runs[0], level, n_boot, seed)
        var = max(_variances(*_cluster_summary(runs[0])))  # what its bootstrap reproduces
        return RegimeInterval(
            diff=boot.diff, low=boot.low, high=boot.high, level=level, n_runs=1, run_diffs=(boot.diff,),
            design="one run", conditional=True, sd=math.sqrt(var), df=boot.df, variance=(var, 0.0), n_boot=n_boot,
            seed=seed, method="paired_bootstrap of the one run: conditional on its training seed", run=boot,
        )
    shared = _shared_evaluation(runs)
    design = "shared evaluation" if shared else "separate evaluations"
    run_diffs = tuple(float(r.d.mean()) for r in runs)
    theta = float(np.mean(run_diffs))
    n_disc = sum(float(np.abs(r.b - r.a).sum()) for r in runs)
    if n_disc < MIN_DISCORDANT:
        cluster = (np.concatenate([r.cluster for r in runs]) if shared else
                   np.concatenate([r.cluster + sum(len(q.labels) for q in runs[:i]) for i, r in enumerate(runs)]))
        labels = runs[0].labels if shared else tuple((i, lab) for i, r in enumerate(runs) for lab in r.labels)
        pooled = _Paired(np.concatenate([r.a for r in runs]), np.concatenate([r.b for r in runs]), cluster, labels)
        post = _posterior(pooled, level, (1.0, 1.0, 1.0, 1.0), n_boot, seed)
        return RegimeInterval(
            diff=theta, low=min(post.low, theta), high=max(post.high, theta), level=level, n_runs=n_runs, run_diffs=run_diffs, design=design,
            conditional=True, sd=math.nan, df=None, variance=(math.nan, math.nan), n_boot=n_boot, seed=seed,
            method=f"posterior of all runs' pairs pooled (fewer than MIN_DISCORDANT = {MIN_DISCORDANT} discordant "
                   f"pairs over all runs; training-seed variance not estimable): {_BAYES_METHOD}",
        )
    draws, parts = (_crossed_draws if shared else _nested_draws)(runs, n_boot, seed)
    sd = float(draws.std())
    df = _satterthwaite(parts)
    t = _t_quantile((1 + level) / 2, df) if df else 0.0
    return RegimeInterval(
        diff=theta, low=_clip(theta - t * sd), high=_clip(theta + t * sd), level=level, n_runs=n_runs,
        run_diffs=run_diffs, design=design, conditional=False, sd=sd, df=df,
        variance=(parts[0][0], parts[1][0] if len(parts) > 1 else 0.0), n_boot=n_boot, seed=seed,
        method=_REGIME_METHOD[design],
    )


def regime_tost(pairs, margin: float, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> RegimeEquivalence:
    """Two one-sided tests (Schuirmann 1987) of equivalence |Δ| < ``margin`` for a regime's mean change.

    H0: Δ ≤ −margin or Δ ≥ +margin, each tested at α = 1 − ``level`` with the hierarchical bootstrap of
    :func:`regime_interval`; both reject exactly when the (1 − 2α) two-sided interval (0.90 at level
    0.95) lies inside (−margin, +margin), which is the rule applied. ``equivalent=False`` means "not
    shown equivalent", not "different".
    """
    level = _check_level(level)
    if level <= 0.5:
        raise GraftkitError(f"level={level!r}: expected a level above 0.5 (the interval used is at 1 − 2(1 − level))")
    if not isinstance(margin, (int, float, np.floating)) or not 0.0 < float(margin) <= 2.0:
        raise GraftkitError(f"margin={margin!r}: expected an equivalence margin in (0, 2] (success fraction)",
                            "e.g. margin=0.05 for ±5 points")
    interval = regime_interval(pairs, level=1 - 2 * (1 - level), n_boot=n_boot, seed=seed)
    margin = float(margin)
    return RegimeEquivalence(interval=interval, margin=margin, level=level,
                             equivalent=bool(-margin < interval.low and interval.high < margin))


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


# --------------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, §2.1).

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i), the probability that k samples
    drawn without replacement from the n include a correct one. The product form avoids huge binomial
    coefficients; it is 1 exactly when n − c < k.
    """
    n = _check_count(n, "n", 1)
    c = _check_count(c, "c", 0)
    k = _check_count(k, "k", 1)
    if c > n or k > n:
        raise GraftkitError(f"pass_at_k(n={n}, c={c}, k={k}): expected 0 ≤ c ≤ n and 1 ≤ k ≤ n")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


# --------------------------------------------------------------------------------------------------
# Correlation


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Row-wise ranks 1..n of ``x [rows, n]``, tied values sharing the mean of their ranks."""
    rows, n = x.shape
    order = np.argsort(x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    pos = np.broadcast_to(np.arange(n), (rows, n))
    starts = np.ones((rows, n), dtype=bool)
    starts[:, 1:] = xs[:, 1:] != xs[:, :-1]
    ends = np.ones((rows, n), dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, pos, n)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty((rows, n))
    np.put_along_axis(ranks, order, (first + last) / 2 + 1, axis=1)
    return ranks


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of ``x, y [rows, n]``; NaN where a row of x or y is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    sxy = (xc * yc).sum(axis=1)
    sxx, syy = (xc * xc).sum(axis=1), (yc * yc).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    # A constant row has sxx equal to zero only up to rounding; treat tiny spreads as constant.
    scale = np.maximum(np.abs(x).max(axis=1), np.abs(y).max(axis=1)) ** 2 * x.shape[1]
    r[(sxx <= 1e-24 * scale) | (syy <= 1e-24 * scale)] = np.nan
    return np.clip(r, -1.0, 1.0)


_CORRELATIONS = ("pearson", "spearman")


def correlation_ci(
    x, y, method: str = "spearman", level: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> CorrelationInterval:
    """Pearson or Spearman correlation of paired samples with a pairs-bootstrap percentile interval.

    Pearson r = Σ(x − x̄)(y − ȳ) / √(Σ(x − x̄)² Σ(y − ȳ)²). Spearman ρ = Pearson r of the ranks, tied
    values taking the average of their ranks (so ρ is defined with ties; Spearman 1904). The interval:
    resample the n pairs (x_i, y_i) with replacement ``n_boot`` times, recompute the statistic (ranks
    recomputed within each resample) and take the (1 ± level)/2 percentiles over the resamples where it
    is defined (Efron & Tibshirani 1993, ch. 13); ``n_valid`` says how many those were.
    """
    if method not in _CORRELATIONS:
        raise GraftkitError(f"method={method!r}: expected one of {_CORRELATIONS}")
    level = _check_level(level)
    n_boot = _check_count(n_boot, "n_boot", 1)
    seed = _check_count(seed, "seed", 0)
    xa, ya = np.asarray(x), np.asarray(y)
    for name, v in (("x", xa), ("y", ya)):
        if v.ndim != 1 or v.dtype.kind not in "biuf" or not np.all(np.isfinite(v)):
            raise GraftkitError(
                f"{name}: expected a 1-d array of finite numbers; got shape {v.shape}, dtype {v.dtype}"
            )
    if xa.shape != ya.shape or xa.size < 3:
        raise GraftkitError(
            f"x has {xa.size} values and y has {ya.size}: expected the same number of pairs, at least 3"
        )
    xa, ya = xa.astype(np.float64), ya.astype(np.float64)

    def statistic(xr: np.ndarray, yr: np.ndarray) -> np.ndarray:
        if method == "spearman":
            xr, yr = _average_ranks(xr), _average_ranks(yr)
        return _pearson_rows(xr, yr)

    estimate = float(statistic(xa[None], ya[None])[0])
    if not np.isfinite(estimate):
        raise GraftkitError("x or y is constant: expected both to vary, or the correlation is undefined")

    n = xa.size
    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot)
    block = max(1, _BLOCK_ELEMENTS // n)
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n))
        draws[start : start + rows] = statistic(xa[idx], ya[idx])
    valid = draws[np.isfinite(draws)]
    low, high = _percentile(valid, level) if valid.size else (math.nan, math.nan)
    return CorrelationInterval(
        method=method, estimate=estimate, low=low, high=high, level=level, n=n, n_boot=n_boot,
        n_valid=int(valid.size), seed=seed,
    )


__all__ = [
    "BETTER", "WORSE", "NO_CHANGE", "VERDICT_RULE", "MIN_DISCORDANT", "RateInterval", "BootstrapInterval",
    "BayesInterval", "McNemarResult", "Comparison", "Headroom", "HeadroomTable", "RegimeInterval",
    "RegimeEquivalence", "DetectableImprovement", "CorrelationInterval", "wilson_interval", "fold_episodes",
    "cluster_labels", "paired_bootstrap", "bayes_paired_interval", "mcnemar_exact", "compare", "headroom",
    "regime_interval", "regime_tost", "detectable_improvement", "pass_at_k", "correlation_ci",
]
