"""Paired statistics for two agents evaluated on identical episodes.

Data model: an agent's outcomes are a 0/1 success array ``x[seed, episode]`` shaped
``[n_seeds, n_episodes_per_seed]`` (evaluation seeds × episodes). Two agents ``a`` and ``b`` are
compared on the same array positions, episode by episode, so every statistic here is paired. For
per-task use call these functions once per task (:func:`headroom` does that for a table of tasks).

Paired cells, counted over all S·E positions (index = 2·a + b)::

    n00: both fail    n01: b succeeds, a fails    n10: a succeeds, b fails    n11: both succeed

and the per-position difference d[s, e] = b[s, e] − a[s, e] ∈ {−1, 0, 1}; the paired difference in
success rate is mean(b) − mean(a) = mean(d) = (n01 − n10) / (S·E).

What is computed, and from where:

- :func:`wilson_interval`   Wilson score interval for one rate (Wilson 1927; Newcombe 1998, method 3;
  Brown, Cai & DasGupta 2001). Equals R's ``prop.test(x, n, correct = FALSE)$conf.int``.
- :func:`paired_bootstrap`  two-stage (seeds, then episodes within seed) bootstrap of mean(d) with an
  expanded percentile interval (Efron & Tibshirani 1993, ch. 13; Hesterberg 2015; hierarchical data:
  Davison & Hinkley 1997, §3.8; Field & Welsh 2007). The two stages are variance-component adjusted so
  that within-seed noise is not counted twice — see the function's docstring for why, and the formula.
- :func:`bayes_paired_interval`  Dirichlet posterior over (p00, p01, p10, p11); the difference is
  p01 − p10. Counts are deflated by the design effect of the seed clustering (Rao & Scott 1992) before
  the conjugate update, so correlated episodes of one seed are not taken for independent ones; the
  design effect's own uncertainty (S − 1 degrees of freedom) is integrated out.
- :func:`mcnemar_exact`     exact conditional McNemar test (McNemar 1947): X = n01 ~ Bin(n01 + n10, ½)
  under H0; p = min(1, 2·P(X ≤ min(n01, n10))) (Fagerland, Lydersen & Laake 2013, "exact conditional").
- :func:`compare`           both rates with Wilson intervals, both difference intervals, McNemar, and a
  verdict by :data:`VERDICT_RULE`.
- :func:`headroom`          sampled − greedy success per task, through :func:`compare`.
- :func:`pass_at_k`         unbiased pass@k = 1 − C(n − c, k) / C(n, k) (Chen et al. 2021, §2.1).
- :func:`correlation_ci`    Pearson or Spearman (average ranks for ties) correlation with a pairs
  bootstrap percentile interval.

All randomness comes from ``numpy.random.default_rng(seed)`` (PCG64); every result records its level,
resample or draw count, seed and (where there is one) prior, and a ``method`` string naming its formula.

References
    Abramowitz & Stegun (1964), Handbook of Mathematical Functions, §26.7 (Student's t).
    Brown, Cai & DasGupta (2001), Interval estimation for a binomial proportion. Stat. Sci. 16:101–133.
    Chen et al. (2021), Evaluating large language models trained on code. arXiv:2107.03374.
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
    Rao & Scott (1992), A simple method for the analysis of clustered binary data. Biometrics 48:577–585.
    Wilson (1927), Probable inference, the law of succession, and statistical inference. JASA 22:209–212.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

from .errors import GraftkitError

BETTER, WORSE, NO_CHANGE = "credibly better", "credibly worse", "no credible change"

#: The one place the verdict of :func:`compare` (and so of :func:`headroom`) is defined.
VERDICT_RULE = (
    "credibly better / worse: the paired bootstrap interval AND the Bayesian credible interval for "
    "mean(b) − mean(a), both at the comparison's level (default 0.95), lie entirely above / below zero; "
    "otherwise no credible change"
)

#: Bound on elements per vectorised block, so memory stays flat for large n_boot × n_seeds.
_BLOCK_ELEMENTS = 1 << 22

_OUTCOMES = "a 0/1 success array shaped [n_seeds, n_episodes_per_seed]"


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
    n_seeds: int
    n_episodes: int
    #: c, the factor on seed-mean deviations (0: no seed stage; see :func:`paired_bootstrap`).
    seed_shrink: float
    #: k, the factor on within-seed resampling deviations.
    episode_scale: float
    #: Degrees of freedom of the variance the interval rests on: S − 1 (seed stage active) or S·(E − 1).
    df: int | None
    #: The percentiles read off: (tail, 1 − tail), tail = Φ(−t_df((1 + level)/2)).
    tail: float
    method: str = (
        "two-stage bootstrap: seeds with replacement, then episodes within each chosen seed with "
        "replacement (pairs kept together), variance-component adjusted (c, k); expanded percentile "
        "interval (t_df calibration)"
    )


@dataclass(frozen=True)
class BayesInterval:
    """Posterior of ``p01 − p10`` under a Dirichlet–multinomial model of the four paired cells."""

    mean: float
    low: float
    high: float
    #: Posterior probability that p01 − p10 > 0 (b better than a), estimated from the draws.
    p_positive: float
    level: float
    #: Dirichlet prior (α00, α01, α10, α11).
    prior: tuple[float, float, float, float]
    n_draws: int
    seed: int
    #: Observed (n00, n01, n10, n11).
    counts: tuple[int, int, int, int]
    #: Estimated design effect D̂ of the seed clustering (≥ 1; 1 = episodes treated as independent).
    design_effect: float
    #: Degrees of freedom of D̂ (S − 1) when D̂ > 1 and its uncertainty is integrated out, else None.
    design_effect_df: int | None
    method: str = (
        "Dirichlet(prior + counts / D) posterior over (p00, p01, p10, p11), D the design effect of the "
        "seed clustering (Rao & Scott 1992), D ~ D̂·df/χ²_df; Monte Carlo draws, equal-tailed interval"
    )


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


def _outcomes(x, name: str) -> np.ndarray:
    """``x`` as an int8 array [n_seeds, n_episodes_per_seed] of 0/1, or a GraftkitError."""
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.size == 0:
        raise GraftkitError(f"{name}: expected {_OUTCOMES}; got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in "iuf":
            raise GraftkitError(f"{name}: expected {_OUTCOMES}; got dtype {arr.dtype}")
        if not np.isin(arr, (0, 1)).all():
            bad = arr[~np.isin(arr, (0, 1))].ravel()[0].item()
            raise GraftkitError(f"{name}: expected {_OUTCOMES}; found the value {bad!r}")
    return arr.astype(np.int8)


def _paired(a, b, names: tuple[str, str] = ("a", "b")) -> tuple[np.ndarray, np.ndarray]:
    a, b = _outcomes(a, names[0]), _outcomes(b, names[1])
    if a.shape != b.shape:
        raise GraftkitError(
            f"{names[0]} has shape {a.shape} but {names[1]} has {b.shape}: expected identical "
            f"[n_seeds, n_episodes_per_seed] arrays aligned episode by episode"
        )
    return a, b


def _cells(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int, int]:
    n = np.bincount((2 * a + b).ravel(), minlength=4)
    return int(n[0]), int(n[1]), int(n[2]), int(n[3])


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def _percentile(draws: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


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
# Paired difference: bootstrap


def _resampled_sum_pmf(p_neg: np.ndarray, p_pos: np.ndarray, n_eps: int) -> np.ndarray:
    """``pmf[s, j]`` = P(sum of n_eps i.i.d. draws of d = j − n_eps), d = −1, 0, +1 with p_neg, 1 − p_neg
    − p_pos, p_pos (per seed s): the n_eps-fold convolution, built one draw at a time."""
    p_zero = np.maximum(0.0, 1.0 - p_neg - p_pos)
    pmf = np.zeros((p_neg.size, 2 * n_eps + 1))
    pmf[:, n_eps] = 1.0
    for _ in range(n_eps):
        nxt = pmf * p_zero[:, None]
        nxt[:, 1:] += pmf[:, :-1] * p_pos[:, None]
        nxt[:, :-1] += pmf[:, 1:] * p_neg[:, None]
        pmf = nxt
    return pmf


def cluster_bootstrap_factors(d: np.ndarray) -> tuple[float, float, int | None]:
    """(c, k, df) of the two-stage bootstrap of per-episode values ``d[seed, episode]``: the seed-stage
    shrink c, the episode-stage scale k and the degrees of freedom of the expanded percentiles (see
    :func:`paired_bootstrap`, whose docstring derives them)::

        SS_B = E Σ_s (m_s − m̄)²        SS_W = Σ_s Σ_e (d[s, e] − m_s)²
        k = √(E / (E − 1))  (0 when E = 1)
        c = √max(0, S/(S − 1) − SS_W / ((E − 1)·SS_B))  (0 when S = 1 or SS_B = 0; √(S/(S − 1)) when E = 1)
        df = S − 1 when c > 0, else S·(E − 1)  (None when 0)
    """
    n_seeds, n_eps = d.shape
    m = d.mean(axis=1)  # [S]
    m_bar = float(m.mean())
    ss_b = n_eps * float(((m - m_bar) ** 2).sum())
    ss_w = float(((d - m[:, None]) ** 2).sum())
    k = math.sqrt(n_eps / (n_eps - 1)) if n_eps > 1 else 0.0
    if n_seeds == 1 or ss_b == 0.0:
        c = 0.0
    elif n_eps == 1:
        c = math.sqrt(n_seeds / (n_seeds - 1))
    else:
        c = math.sqrt(max(0.0, n_seeds / (n_seeds - 1) - ss_w / ((n_eps - 1) * ss_b)))
    df = (n_seeds - 1 if c > 0 else n_seeds * (n_eps - 1)) or None
    return c, k, df


def paired_bootstrap(a, b, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> BootstrapInterval:
    """Two-stage bootstrap interval for mean(b) − mean(a) over identical episodes.

    With d[s, e] = b[s, e] − a[s, e], seed means m_s = mean_e d[s, e], grand mean m̄ (S seeds, E
    episodes each), one resample is::

        s*_1..s*_S            seeds drawn with replacement
        m*_j                  mean of E episodes drawn with replacement from seed s*_j's d values
        θ* = m̄ + (1/S) Σ_j [ c·(m_{s*_j} − m̄) + k·(m*_j − m_{s*_j}) ]

    and the interval is read off the distribution of θ* at the expanded percentiles (tail, 1 − tail)
    below. Pairs stay together because the resampled unit is the pair (its d).

    Why (c, k) and not (1, 1): (c, k) = (1, 1) is the plain two-stage bootstrap, θ* = mean_j m*_j. The
    spread of the seed means m_s already contains the within-seed noise, so resampling episodes again
    counts that noise twice: its variance is ≈ Var(m̄) + σ²_within/(S·E), up to twice the truth when
    seeds do not differ (Davison & Hinkley 1997 §3.8; Field & Welsh 2007). On simulated data (25 × 20,
    per-seed random effects) the plain version covered 98–99.5% at a nominal 95%. The factors make
    the bootstrap variance of θ* equal the unbiased one-way variance-component estimate
    σ̂²_seed/S + σ̂²_within/(S·E) = s²_m/S::

        SS_B = E Σ_s (m_s − m̄)²        SS_W = Σ_s Σ_e (d[s, e] − m_s)²
        k² = E / (E − 1)                 (plug-in within-seed variance → unbiased)
        c² = max(0, S/(S − 1) − SS_W / ((E − 1)·SS_B))

    c² < 0 means the estimated between-seed variance is negative; it is truncated at 0, so the
    interval never assumes seeds to be more alike than independent episodes. With one seed, c = 0
    (inference conditional on that seed); with one episode per seed, k = 0 (the seed stage alone).

    Small samples: with c > 0 that variance is s²_m/S, estimated from S seed means on df = S − 1
    degrees of freedom (with c = 0: S·(E − 1)), and a percentile interval at (1 ± level)/2 would act
    like z·SE where t_df·SE is due (≈ 94% coverage at S = 25, ≈ 93% at S = 10 in the tests'
    simulation). So the percentiles read are tail = Φ(−t_df((1 + level)/2)) and 1 − tail, the expanded
    percentile interval of Hesterberg (2015, §5) (its √(n/(n − 1)) factor is already in c and k).

    Stage two only matters through E·m*_j, the sum of E values drawn with replacement from the seed's
    d ∈ {−1, 0, +1}. Its exact distribution (:func:`_resampled_sum_pmf`) is tabulated once per seed and
    sampled by inverse CDF, one uniform per chosen seed: the same distribution as drawing E episode
    indices, in O(n_boot · S) work instead of O(n_boot · S · E).
    """
    a, b = _paired(a, b)
    level = _check_level(level)
    n_boot = _check_count(n_boot, "n_boot", 1)
    seed = _check_count(seed, "seed", 0)
    n_seeds, n_eps = a.shape
    d = b.astype(np.float64) - a
    m = d.mean(axis=1)  # [S]
    m_bar = float(m.mean())
    # Row s of `cdf`, shifted up by s, is P(Σ of E resampled d ≤ j − E): one sorted table for all seeds.
    pmf = _resampled_sum_pmf((d < 0).mean(axis=1), (d > 0).mean(axis=1), n_eps)  # [S, 2E + 1]
    cdf = np.minimum(np.cumsum(pmf, axis=1), 1.0)
    cdf[:, -1] = 1.0
    width = 2 * n_eps + 1
    table = (cdf + np.arange(n_seeds)[:, None]).ravel()

    c, k, df = cluster_bootstrap_factors(d)

    rng = np.random.default_rng(seed)
    theta = np.empty(n_boot)
    block = max(1, _BLOCK_ELEMENTS // n_seeds)
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pick = rng.integers(0, n_seeds, size=(rows, n_seeds))  # [boot, S] resampled seeds
        u = rng.random((rows, n_seeds))
        j = np.searchsorted(table, pick + u, side="right") - pick * width
        m_star = (np.minimum(j, width - 1) - n_eps) / n_eps  # [boot, S] within-seed resample means
        m_pick = m[pick]
        theta[start : start + rows] = m_bar + (c * (m_pick - m_bar) + k * (m_star - m_pick)).mean(axis=1)
    tail = _expanded_tail(level, df)
    low, high = (float(q) for q in np.quantile(theta, [tail, 1 - tail]))
    return BootstrapInterval(
        diff=m_bar, low=low, high=high, level=level, n_boot=n_boot, seed=seed, n_seeds=n_seeds,
        n_episodes=n_eps, seed_shrink=c, episode_scale=k, df=df, tail=tail,
    )


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


def _design_effect(a: np.ndarray, b: np.ndarray) -> float:
    """Var(mean d) under seed clustering ÷ Var(mean d) for independent pairs, floored at 1.

    Clustered: s²_m / S, the unbiased one-way estimate (s²_m = sample variance of the seed means).
    Independent: (p̂01 + p̂10 − (p̂01 − p̂10)²) / N, the multinomial variance of p̂01 − p̂10, N = S·E.
    """
    n_seeds = a.shape[0]
    if n_seeds < 2:
        return 1.0
    d = b.astype(np.float64) - a
    n_total = d.size
    p01, p10 = float((d > 0).mean()), float((d < 0).mean())
    var_iid = (p01 + p10 - (p01 - p10) ** 2) / n_total
    if var_iid <= 0.0:
        return 1.0
    var_clustered = float(d.mean(axis=1).var(ddof=1)) / n_seeds
    return max(1.0, var_clustered / var_iid)


def bayes_paired_interval(
    a, b, level: float = 0.95, prior: float | Sequence[float] = 1.0, n_draws: int = 20_000, seed: int = 0
) -> BayesInterval:
    """Credible interval for Δ = p01 − p10 = P(b succeeds, a fails) − P(a succeeds, b fails).

    Model: each paired episode falls in cell 00, 01, 10 or 11 with probabilities p = (p00, p01, p10,
    p11) ~ Dirichlet(α). With counts n, the conjugate posterior is Dirichlet(α + n) (BDA3 §3.4); Δ is
    a linear function of p, so draws of p give draws of Δ, and the interval is the equal-tailed
    (1 ± level)/2 quantiles, ``mean`` the exact posterior mean and ``p_positive`` = P(Δ > 0) estimated
    from the draws.

    Prior: ``prior`` is α, one number for all four cells or (α00, α01, α10, α11); the default α = 1 is
    uniform on the simplex (Bayes–Laplace), 0.5 is Jeffreys'. Its marginal prior on Δ is symmetric
    about 0, so it does not favour either agent.

    Clustering: the multinomial treats all S·E pairs as independent, but episodes of one evaluation seed
    are correlated (a seed can favour one agent), which makes that posterior too narrow — on simulated
    data with per-seed effects it covered 87–89% at a nominal 95%. Following Rao & Scott (1992), the
    counts are divided by the design effect D = (s²_m / S) / ((p̂01 + p̂10 − (p̂01 − p̂10)²) / N) —
    the ratio of the clustered variance of mean(d) (seed means m_s, N = S·E) to the independent-pairs
    one, floored at 1 — so the posterior is Dirichlet(α + n / D): the effective number of independent
    pairs is N / D. With one seed, or no excess variation between seeds, D = 1 and this is the plain
    conjugate posterior.

    D̂ rests on S seed means (S − 1 degrees of freedom), and plugging it in would act like z where t is
    due (≈ 94% coverage at 25 seeds). When D̂ > 1 its uncertainty is integrated out instead: each
    draw takes its own D = D̂·(S − 1)/χ²_{S−1}, the scaled-inverse-χ² posterior of a variance estimated on
    S − 1 degrees of freedom under p(σ²) ∝ 1/σ² (BDA3 §3.2), then p ~ Dirichlet(α + n / D). ``mean``
    is then the average of the conditional posterior means.
    """
    a, b = _paired(a, b)
    level = _check_level(level)
    alpha = _prior4(prior)
    n_draws = _check_count(n_draws, "n_draws", 1)
    seed = _check_count(seed, "seed", 0)
    counts = _cells(a, b)
    deff = _design_effect(a, b)
    rng = np.random.default_rng(seed)
    deff_df = a.shape[0] - 1 if deff > 1 else None
    d_draws = deff * deff_df / rng.chisquare(deff_df, n_draws) if deff_df else np.full(n_draws, deff)
    post = np.asarray(alpha) + np.asarray(counts, dtype=np.float64) / d_draws[:, None]  # [draw, cell]
    gam = rng.standard_gamma(post)  # Dirichlet(post) draws = normalised independent Gamma(post, 1)
    delta = (gam[:, 1] - gam[:, 2]) / gam.sum(axis=1)
    low, high = _percentile(delta, level)
    return BayesInterval(
        mean=float(((post[:, 1] - post[:, 2]) / post.sum(axis=1)).mean()), low=low, high=high,
        p_positive=float((delta > 0).mean()), level=level, prior=alpha, n_draws=n_draws, seed=seed,
        counts=counts, design_effect=deff, design_effect_df=deff_df,
    )


# --------------------------------------------------------------------------------------------------
# Paired difference: exact test


def mcnemar_exact(a, b) -> McNemarResult:
    """Exact two-sided McNemar test of H0: p01 = p10.

    Conditional on the m = n01 + n10 discordant pairs, n01 ~ Bin(m, ½) under H0, so::

        p = min(1, 2 · Σ_{i=0}^{min(n01, n10)} C(m, i) / 2^m)

    computed in exact integer arithmetic (p = 1 when there are no discordant pairs). The test ignores
    the seed clustering; use it beside the intervals, not instead of them.
    """
    a, b = _paired(a, b)
    n00, n01, n10, n11 = _cells(a, b)
    m, low = n01 + n10, min(n01, n10)
    tail, term = 0, 1
    for i in range(low + 1):
        tail += term
        term = term * (m - i) // (i + 1)
    p = min(1.0, 2 * tail / (1 << m)) if m else 1.0
    return McNemarResult(n00=n00, n01=n01, n10=n10, n11=n11, p_value=p)


# --------------------------------------------------------------------------------------------------
# Verdicts


def _verdict(*intervals: tuple[float, float]) -> str:
    """:data:`VERDICT_RULE` applied to (low, high) intervals for mean(b) − mean(a)."""
    if all(low > 0 for low, _ in intervals):
        return BETTER
    if all(high < 0 for _, high in intervals):
        return WORSE
    return NO_CHANGE


def compare(
    a, b, level: float = 0.95, n_boot: int = 10_000, n_draws: int = 20_000, seed: int = 0,
    prior: float | Sequence[float] = 1.0,
) -> Comparison:
    """Agent b against agent a on identical episodes: rates, difference intervals, McNemar, verdict.

    ``rate_a`` / ``rate_b`` are Wilson intervals over all S·E episodes (they ignore the seed
    clustering, so they describe each rate, not the comparison); the difference mean(b) − mean(a) gets
    :func:`paired_bootstrap` and :func:`bayes_paired_interval`, and ``verdict`` follows
    :data:`VERDICT_RULE`. Both intervals use the same ``seed``.
    """
    a, b = _paired(a, b)
    level = _check_level(level)
    boot = paired_bootstrap(a, b, level=level, n_boot=n_boot, seed=seed)
    bayes = bayes_paired_interval(a, b, level=level, prior=prior, n_draws=n_draws, seed=seed)
    return Comparison(
        rate_a=wilson_interval(int(a.sum()), a.size, level),
        rate_b=wilson_interval(int(b.sum()), b.size, level),
        bootstrap=boot,
        bayes=bayes,
        mcnemar=mcnemar_exact(a, b),
        level=level,
        verdict=_verdict((boot.low, boot.high), (bayes.low, bayes.high)),
    )


_HEADROOM_VERDICT = {BETTER: "headroom", NO_CHANGE: "no credible headroom", WORSE: "sampling credibly worse"}


def headroom(
    greedy: Mapping[str, object], sampled: Mapping[str, object], level: float = 0.95, n_boot: int = 10_000,
    n_draws: int = 20_000, seed: int = 0, prior: float | Sequence[float] = 1.0,
) -> HeadroomTable:
    """Per task, sampled success − greedy success, with :func:`compare` (a = greedy, b = sampled).

    ``greedy[task]`` and ``sampled[task]`` are outcome arrays [n_seeds, n_episodes_per_seed] paired by
    seed and episode. A task has headroom when the comparison's verdict is "credibly better" (both
    intervals above zero, :data:`VERDICT_RULE`). Every task uses the same ``seed``, so a task's result
    does not depend on which other tasks are in the table.
    """
    if set(greedy) != set(sampled) or not greedy:
        raise GraftkitError(
            f"greedy tasks {sorted(greedy)} and sampled tasks {sorted(sampled)}: expected the same "
            f"non-empty set of tasks"
        )
    rows = []
    for task in greedy:
        g, s = _paired(greedy[task], sampled[task], (f"greedy[{task!r}]", f"sampled[{task!r}]"))
        comp = compare(g, s, level=level, n_boot=n_boot, n_draws=n_draws, seed=seed, prior=prior)
        rows.append(Headroom(task=task, comparison=comp, verdict=_HEADROOM_VERDICT[comp.verdict]))
    return HeadroomTable(rows=tuple(rows))


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
    "BETTER", "WORSE", "NO_CHANGE", "VERDICT_RULE", "RateInterval", "BootstrapInterval", "BayesInterval",
    "McNemarResult", "Comparison", "Headroom", "HeadroomTable", "CorrelationInterval", "wilson_interval",
    "paired_bootstrap", "bayes_paired_interval", "mcnemar_exact", "compare", "headroom", "pass_at_k",
    "correlation_ci",
]
