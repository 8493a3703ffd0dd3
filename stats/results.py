"""The results of the paired statistics: frozen dataclasses, each recording its value with the level,
resample or draw count, seed and (where there is one) prior it was computed with, and a ``method`` string
naming its formula; the verdict labels and :data:`VERDICT_RULE`, the one place the verdict is defined.
"""

from __future__ import annotations

from dataclasses import dataclass

BETTER, WORSE, NO_CHANGE = "credibly better", "credibly worse", "no credible change"

#: The one place the verdict of :func:`compare` (and so of :func:`headroom`) is defined.
VERDICT_RULE = (
    "credibly better / worse: the paired bootstrap interval AND the Bayesian credible interval for "
    "mean(b) − mean(a), both at the comparison's level (default 0.95), lie entirely above / below zero; "
    "otherwise no credible change"
)

_BOOT_METHOD = (
    "two-stage bootstrap: clusters with replacement, then episodes within each chosen cluster with "
    "replacement (pairs kept together), variance-component adjusted (c, k), clusters weighted by size; "
    "expanded BCa interval: percentiles Φ(z0 + (z0 + z)/(1 − a(z0 + z))) at z = ±Φ⁻¹(Φ(−t_df((1 + level)/2))), "
    "z0 from the resamples, a = Σu³/(6(Σu²)^1.5) over the influence values of the clusters (or episodes) "
    "the variance rests on (Efron 1987); clipped to [−1, 1]"
)
_BAYES_METHOD = (
    "posterior over the paired cells under the prior Dirichlet(α) × σ_d(p) (the probability-matching factor "
    "for Δ, Datta & Ghosh 1995), likelihood counts / D, D the design effect of the clustering (Rao & Scott "
    "1992), D ~ D̂·df/χ²_df; Dirichlet(α + counts / D) Monte Carlo draws weighted by σ_d(p), equal-tailed "
    "weighted interval"
)
_BOOT_FALLBACK = (
    "Bayesian posterior interval in place of the bootstrap: fewer than MIN_DISCORDANT discordant pairs "
    "(α = 1; see bayes_paired_interval: " + _BAYES_METHOD + "), widened where needed to contain the observed "
    "difference"
)


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
    #: The expanded tail Φ(−t_df((1 + level)/2)): the percentiles (tail, 1 − tail) a symmetric bootstrap
    #: distribution is read at; BCa moves them to ``percentiles``.
    tail: float
    method: str = _BOOT_METHOD
    #: Discordant pairs n01 + n10 (Σ|b − a| over episodes with several samples per episode).
    n_discordant: float = 0.0
    #: "bootstrap", or "posterior" when fewer than MIN_DISCORDANT pairs are discordant.
    source: str = "bootstrap"
    #: Episodes per cluster, in cluster order (first appearance of each label).
    cluster_sizes: tuple[int, ...] = ()
    #: BCa acceleration â = Σu³ / (6 (Σu²)^{3/2}) of the influence values u of the clusters (or, when the
    #: episodes carry the variance, of the episodes): γ̂/(6√n) for n units of skewness γ̂. Reported either way.
    acceleration: float = 0.0
    #: BCa bias correction ẑ0 = Φ⁻¹(share of resamples below diff, ties half); None for the posterior.
    z0: float | None = None
    #: The percentiles of the resamples read as (low, high): :func:`~graftkit.stats.quantiles.bca_levels` of
    #: (tail, z0, acceleration); None for the posterior.
    percentiles: tuple[float, float] | None = None


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
    #: Effective number of the weighted draws, (Σ σ_d)² / Σ σ_d² (≤ n_draws; the Monte Carlo error of the
    #: bounds is that of this many independent draws).
    effective_draws: float | None = None


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
