"""stats: intervals cover a planted truth at their nominal rate; exact pieces match independent references.

Coverage: paired outcomes are simulated from a two-level model with a known population difference
(per-seed random effects on both the success level and the difference, episodes i.i.d. within a seed),
and each 95% interval must contain the truth in 93–97% of repetitions. With 1000 repetitions the
standard error of a coverage near 0.95 is 0.7 points, so a calibrated method leaves the window about
once in a hundred simulation seeds (six other seeds gave 93.5–96.1%); the seeds here are fixed, so the
test is deterministic. Coverage at the ceiling and over training seeds is in test_stats_coverage.py.

Beyond coverage: equal clusters against a direct reference implementation (to 1e-12, same random
stream), unequal clusters against the cluster-robust variance, cluster_labels against a graph search,
the posterior fallback with few discordant pairs, the BCa pieces, the posterior's matching factor against
Jeffreys' posterior for one proportion, headroom's layouts, regimes against their two-way variance formula,
equivalence verdicts, and the detectable improvement.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from graftkit import stats
from graftkit.stats.correlation import _average_ranks
from graftkit.stats.quantiles import acceleration, bca_levels, bias_correction, t_cdf, t_quantile, weighted_percentile
from graftkit.stats.results import _BOOT_FALLBACK
from graftkit.stats.verdicts import _verdict
from graftkit.core.errors import GraftkitError

# --------------------------------------------------------------------------------------------------
# Simulated paired evaluations


def simulate_pairs(rng, reps, n_seeds, n_eps, delta, tau, discord=0.3):
    """``a, b [reps, n_seeds, n_eps]`` with E[p01 − p10] = delta exactly.

    Per seed: success level of a ℓ_s ~ U(0.3, 0.6) and difference δ_s = delta + τ·√3·U(−1, 1) (mean
    delta, sd τ); cell probabilities p01 = (D + δ_s)/2, p10 = (D − δ_s)/2, p11 = ℓ_s − p10,
    p00 = 1 − ℓ_s − p01 with discordance D. Episodes of a seed are i.i.d. draws of a cell.
    """
    level = rng.uniform(0.3, 0.6, (reps, n_seeds))
    d_s = delta + tau * math.sqrt(3) * rng.uniform(-1, 1, (reps, n_seeds))
    p01, p10 = (discord + d_s) / 2, (discord - d_s) / 2
    p = np.stack([1 - level - p01, p01, p10, level - p10], axis=-1)  # [reps, S, cell]
    assert (p > 0).all(), "simulation parameters leave the probability simplex"
    cum = np.cumsum(p, axis=-1)[:, :, None, :3]
    cell = (rng.random((reps, n_seeds, n_eps))[..., None] > cum).sum(-1)  # 0..3 = 00, 01, 10, 11
    return (cell >= 2).astype(np.int8), (cell % 2).astype(np.int8)


REPS = 1000
SCENARIOS = {"effect +0.1": 0.1, "no effect": 0.0}


@pytest.fixture(scope="module")
def coverage():
    """Coverage of both 95% difference intervals per scenario (25 seeds × 20 episodes, τ = 0.1)."""
    out = {}
    for i, (name, delta) in enumerate(SCENARIOS.items()):
        a, b = simulate_pairs(np.random.default_rng(100 + i), REPS, 25, 20, delta, tau=0.1)
        hits = {"bootstrap": 0, "bayes": 0}
        for r in range(REPS):
            boot = stats.paired_bootstrap(a[r], b[r], n_boot=1000, seed=r)
            bayes = stats.bayes_paired_interval(a[r], b[r], n_draws=2000, seed=r)
            hits["bootstrap"] += boot.low <= delta <= boot.high
            hits["bayes"] += bayes.low <= delta <= bayes.high
        out[name] = {k: v / REPS for k, v in hits.items()}
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("stats-difference-coverage")  # one worker simulates the table (module fixture) once
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("method", ["bootstrap", "bayes"])
def test_difference_intervals_cover_at_nominal_rate(coverage, scenario, method):
    observed = coverage[scenario][method]
    assert 0.93 <= observed <= 0.97, f"{method} coverage {observed:.3f} in '{scenario}' (all: {coverage})"


def test_seed_clustering_widens_both_intervals():
    """A per-seed effect on the difference shows up as c > 0 and a design effect > 1."""
    a, b = simulate_pairs(np.random.default_rng(7), 1, 25, 20, 0.1, tau=0.1)
    boot = stats.paired_bootstrap(a[0], b[0], n_boot=2000)
    bayes = stats.bayes_paired_interval(a[0], b[0], n_draws=2000)
    assert boot.seed_shrink > 0 and boot.df == 24
    assert bayes.design_effect > 1 and bayes.design_effect_df == 24


def test_bootstrap_variance_is_the_unbiased_variance_of_the_mean():
    """With c > 0 the resampling variance of θ* is s²_m / S (seed means m_s), by construction, and the
    interval is read at Φ(∓t_{S−1}): half-width ≈ t_{S−1} · sd."""
    a, b = simulate_pairs(np.random.default_rng(3), 1, 12, 15, 0.05, tau=0.15)
    a, b = a[0], b[0]
    boot = stats.paired_bootstrap(a, b, n_boot=400_000, seed=1, level=0.6827)
    assert boot.seed_shrink > 0 and boot.df == 11
    m = (b.astype(float) - a).mean(axis=1)
    sd = math.sqrt(m.var(ddof=1) / m.size)
    t11 = t_quantile((1 + 0.6827) / 2, 11)
    assert boot.tail == pytest.approx(NormalDist().cdf(-t11), rel=1e-12)
    assert (boot.high - boot.low) / 2 == pytest.approx(t11 * sd, rel=0.03)
    assert boot.diff == pytest.approx(b.mean() - a.mean())


@pytest.mark.parametrize(
    "p, df, t",
    # Student-t table values (e.g. Abramowitz & Stegun Table 26.10).
    [(0.975, 1, 12.7062047362), (0.975, 2, 4.3026527297), (0.975, 5, 2.5705818356), (0.975, 9, 2.2621571628),
     (0.975, 24, 2.0638985616), (0.995, 3, 5.8409093097), (0.9, 10, 1.3721836411), (0.975, 1000, 1.9623390808)],
)
def test_t_quantile_table_values(p, df, t):
    assert t_quantile(p, df) == pytest.approx(t, abs=1e-8)
    assert t_quantile(1 - p, df) == pytest.approx(-t, abs=1e-8)


@pytest.mark.parametrize("df", [1, 2, 3, 8, 31, 200, 201, 5000])
def test_t_cdf_matches_integrated_density(df):
    """Closed-form CDF against Simpson integration of the density from 0."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for t in (0.3, 1.0, 2.5):
        x = np.linspace(0.0, t, 20_001)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
        h = x[1] - x[0]
        area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
        assert t_cdf(t, df) == pytest.approx(0.5 + area, abs=1e-9)
        assert t_cdf(-t, df) == pytest.approx(0.5 - area, abs=1e-9)


def test_bca_pieces():
    """BCa levels reduce to (tail, 1 − tail) with ẑ0 = â = 0, follow Efron's formula, and reach 0 or 1 at the
    pole; â of a mean is the units' skewness / (6√n); ẑ0 counts ties half; equal weights give Hazen's
    quantiles."""
    assert bca_levels(0.02, 0.0, 0.0) == (0.02, 0.98)
    z = NormalDist().inv_cdf(0.025)
    want = [NormalDist().cdf(0.1 + (0.1 + q) / (1 - 0.05 * (0.1 + q))) for q in (z, -z)]
    assert bca_levels(0.025, 0.1, 0.05) == pytest.approx(want, abs=1e-15)
    low, high = bca_levels(0.025, 0.1, 0.05)
    assert 0.025 < low and 0.975 < high  # right skew: both percentiles move up
    assert bca_levels(1e-12, 0.0, 0.15)[1] == 1.0  # z = 7.03 lies past the pole at 1/â = 6.7
    x = np.random.default_rng(0).exponential(size=400)
    u = x - x.mean()
    gamma = (u**3).mean() / (u**2).mean() ** 1.5
    assert acceleration(u) == pytest.approx(gamma / (6 * math.sqrt(x.size)), rel=1e-12)
    assert acceleration(np.zeros(5)) == 0.0
    assert bias_correction(np.array([-1.0, 0.0, 0.0, 1.0]), 0.0) == 0.0
    assert bias_correction(np.array([-1.0, -0.5, 0.0, 1.0]), 0.0) == pytest.approx(NormalDist().inv_cdf(5 / 8))
    assert bias_correction(np.ones(10), 0.0) == pytest.approx(NormalDist().inv_cdf(1 / 20))  # held inside
    draws = np.random.default_rng(1).normal(size=1001)
    assert weighted_percentile(draws, np.ones_like(draws), 0.9) == pytest.approx(
        tuple(np.quantile(draws, [0.05, 0.95], method="hazen")), abs=1e-12)


def test_identical_agents_give_a_zero_difference_and_an_interval_around_it():
    """No discordant pair: the difference is 0, and the interval is the posterior's, not [0, 0]."""
    a = (np.random.default_rng(0).random((6, 9)) < 0.4).astype(int)
    boot = stats.paired_bootstrap(a, a.copy(), n_boot=20_000)
    assert boot.diff == 0.0 and boot.source == "posterior" and boot.n_discordant == 0
    assert boot.low < 0 < boot.high and boot.low == pytest.approx(-boot.high, abs=0.01)
    bayes = stats.bayes_paired_interval(a, a.copy(), n_draws=20_000)
    assert (boot.low, boot.high) == pytest.approx((bayes.low, bayes.high))  # same prior, draws and seed
    assert bayes.mean == pytest.approx(0.0, abs=1e-3)  # symmetric posterior; its mean is a Monte Carlo one
    assert bayes.low < 0 < bayes.high and bayes.low == pytest.approx(-bayes.high, abs=0.01)
    assert stats.mcnemar_exact(a, a).p_value == 1.0


def test_bayes_posterior_is_the_reweighted_conjugate_dirichlet_without_clustering():
    """One seed: D = 1, and the posterior is the conjugate Dirichlet(α + n) reweighted by the matching
    factor σ_d(p) = √(p01 + p10 − Δ²): against a large independent draw (numpy's dirichlet, another
    stream), its mean, bounds and P(Δ > 0). The factor moves the conjugate mean (α01 + n01 − α10 − n10) /
    (Σα + N) by O(1/N) only."""
    a, b = cells_to_arrays(30, 25, 10, 35)
    res = stats.bayes_paired_interval(a, b, prior=0.5, n_draws=200_000, seed=4)
    assert res.design_effect == 1.0 and res.design_effect_df is None
    assert res.counts == (30, 25, 10, 35) and res.prior == (0.5,) * 4
    p = np.random.default_rng(99).dirichlet([30.5, 25.5, 10.5, 35.5], 1_000_000)
    delta = p[:, 1] - p[:, 2]
    w = np.sqrt(p[:, 1] + p[:, 2] - delta**2)
    order = np.argsort(delta)
    cdf = np.cumsum(w[order]) / w.sum()
    low, high = delta[order][np.searchsorted(cdf, [0.025, 0.975])]
    assert res.mean == pytest.approx(w @ delta / w.sum(), abs=0.001)
    assert (res.low, res.high) == pytest.approx((low, high), abs=0.003)
    assert res.p_positive == pytest.approx(w @ (delta > 0) / w.sum(), abs=0.002)
    assert res.mean == pytest.approx((25.5 - 10.5) / 102, abs=0.01)
    assert 0.95 * 200_000 < res.effective_draws <= 200_000


def beta_quantiles(a, b, probs, grid=2_000_001):
    """Quantiles of Beta(a, b) by the trapezoid rule on a fine grid (a, b ≥ 1/2)."""
    x = np.linspace(0.0, 1.0, grid)[1:-1]
    log_f = (a - 1) * np.log(x) + (b - 1) * np.log1p(-x)
    f = np.exp(log_f - log_f.max())
    cdf = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2)])
    return np.interp(probs, cdf / cdf[-1], x)


@pytest.mark.parametrize("n01, n00", [(3, 47), (12, 38), (1, 9)])
def test_matching_factor_turns_the_haldane_dirichlet_into_jeffreys_for_one_proportion(n01, n00):
    """a always fails, so Δ = p01 − p10 with p10 → 0 and σ_d(p) → √(p01(1 − p01)): a near-zero Dirichlet
    prior times the matching factor is Beta(n01 + ½, n00 + ½), Jeffreys' posterior — the prior that is
    probability-matching for one proportion (Welch & Peers 1963)."""
    a = np.zeros((1, n01 + n00), dtype=np.int8)
    b = np.zeros_like(a)
    b[0, :n01] = 1
    res = stats.bayes_paired_interval(a, b, prior=1e-6, n_draws=400_000, seed=3)
    low, high = beta_quantiles(n01 + 0.5, n00 + 0.5, [0.025, 0.975])
    assert (res.low, res.high) == pytest.approx((low, high), abs=0.003)
    assert res.mean == pytest.approx((n01 + 0.5) / (n01 + n00 + 1), abs=0.002)


def test_results_are_deterministic_and_inputs_untouched():
    a, b = simulate_pairs(np.random.default_rng(5), 1, 8, 10, 0.1, tau=0.1)
    a0, b0 = a[0].copy(), b[0].copy()
    assert stats.compare(a[0], b[0], n_boot=300, n_draws=300, seed=9) == stats.compare(
        a[0], b[0], n_boot=300, n_draws=300, seed=9
    )
    assert (a[0] == a0).all() and (b[0] == b0).all()
    res = stats.paired_bootstrap(a[0], b[0], n_boot=300, seed=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.low = 0.0  # type: ignore[misc]
    assert (res.level, res.n_boot, res.seed, res.n_seeds, res.n_episodes) == (0.95, 300, 9, 8, 10)


def test_degenerate_shapes():
    """One seed: no seed stage (c = 0). One episode per seed: no episode stage (k = 0)."""
    rng = np.random.default_rng(2)
    a, b = (rng.random((1, 30)) < 0.5).astype(int), (rng.random((1, 30)) < 0.5).astype(int)
    assert stats.paired_bootstrap(a, b, n_boot=200).seed_shrink == 0.0
    a, b = (rng.random((30, 1)) < 0.5).astype(int), (rng.random((30, 1)) < 0.5).astype(int)
    res = stats.paired_bootstrap(a, b, n_boot=200)
    assert res.episode_scale == 0.0 and res.seed_shrink == pytest.approx(math.sqrt(30 / 29)) and res.df == 29
    one = stats.paired_bootstrap(np.ones((1, 1), int), np.zeros((1, 1), int), n_boot=500)
    assert (one.diff, one.df, one.source) == (-1.0, None, "posterior")
    assert -1.0 <= one.low < -0.5 and 0.0 < one.high <= 1.0  # one discordant pair says little either way


# --------------------------------------------------------------------------------------------------
# Wilson


def wilson_by_quadratic(x, n, z):
    """Roots in p of (p̂ − p)² = z² p(1 − p)/n, i.e. (1 + z²/n)p² − (2p̂ + z²/n)p + p̂² = 0."""
    ph = x / n
    qa, qb, qc = 1 + z * z / n, -(2 * ph + z * z / n), ph * ph
    disc = math.sqrt(qb * qb - 4 * qa * qc)
    return (-qb - disc) / (2 * qa), (-qb + disc) / (2 * qa)


@pytest.mark.parametrize(
    "x, n, low, high",
    # Newcombe (1998), Stat. Med. 17:857, Table I, method 3 (score, no continuity correction).
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_published_values(x, n, low, high):
    res = stats.wilson_interval(x, n)
    assert (round(res.low, 4), round(res.high, 4)) == (low, high)
    assert res.rate == x / n and res.level == 0.95


@pytest.mark.parametrize("level, z", [(0.9, 1.6448536269514722), (0.95, 1.959963984540054), (0.99, 2.5758293035489)])
def test_wilson_matches_the_score_quadratic(level, z):
    for n in (1, 2, 7, 40, 1000):
        for x in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            res = stats.wilson_interval(x, n, level)
            lo, hi = wilson_by_quadratic(x, n, z)
            assert res.low == pytest.approx(max(lo, 0.0), abs=1e-12)
            assert res.high == pytest.approx(min(hi, 1.0), abs=1e-12)
            assert 0.0 <= res.low <= x / n <= res.high <= 1.0


# --------------------------------------------------------------------------------------------------
# McNemar


def cells_to_arrays(n00, n01, n10, n11, n_seeds=1):
    cells = np.repeat([0, 1, 2, 3], [n00, n01, n10, n11])
    np.random.default_rng(0).shuffle(cells)
    cells = cells.reshape(n_seeds, -1)
    return (cells >= 2).astype(int), (cells % 2).astype(int)


def mcnemar_reference(n01, n10):
    m = n01 + n10
    if m == 0:
        return 1.0
    tail = Fraction(sum(math.comb(m, i) for i in range(min(n01, n10) + 1)), 2**m)
    return min(1.0, float(2 * tail))


def test_mcnemar_hand_checked():
    # m = 12: 2·(1 + 12 + 66)/4096 = 158/4096.
    res = stats.mcnemar_exact(*cells_to_arrays(5, 10, 2, 3))
    assert res.p_value == pytest.approx(158 / 4096, rel=1e-15) and round(res.p_value, 4) == 0.0386
    assert (res.n00, res.n01, res.n10, res.n11) == (5, 10, 2, 3)
    assert stats.mcnemar_exact(*cells_to_arrays(5, 2, 10, 3)).p_value == res.p_value
    assert stats.mcnemar_exact(*cells_to_arrays(1, 0, 0, 1)).p_value == 1.0  # no discordant pairs
    assert stats.mcnemar_exact(*cells_to_arrays(0, 6, 0, 0)).p_value == pytest.approx(2 / 64)
    assert stats.mcnemar_exact(*cells_to_arrays(0, 4, 4, 0)).p_value == 1.0


@pytest.mark.parametrize("n01, n10", [(0, 1), (3, 7), (20, 20), (31, 12), (150, 180), (700, 640)])
def test_mcnemar_matches_binomial_sum(n01, n10):
    res = stats.mcnemar_exact(*cells_to_arrays(40, n01, n10, 60))
    assert res.p_value == pytest.approx(mcnemar_reference(n01, n10), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# pass@k


def pass_at_k_enumerated(n, c, k):
    hits = [any(i < c for i in pick) for pick in itertools.combinations(range(n), k)]
    return sum(hits) / len(hits)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert stats.pass_at_k(n, c, k) == pytest.approx(pass_at_k_enumerated(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    assert stats.pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert stats.pass_at_k(200, 0, 100) == 0.0
    assert stats.pass_at_k(200, 150, 100) == 1.0
    exact = 1 - math.comb(10_000 - 37, 50) / math.comb(10_000, 50)
    assert stats.pass_at_k(10_000, 37, 50) == pytest.approx(exact, rel=1e-10)


# --------------------------------------------------------------------------------------------------
# Correlation


def average_ranks_reference(v):
    v = list(v)
    ranks = [0.0] * len(v)
    for i, vi in enumerate(v):
        below = sum(1 for w in v if w < vi)
        equal = sum(1 for w in v if w == vi)
        ranks[i] = below + (equal + 1) / 2
    return np.array(ranks)


def test_correlation_point_estimates():
    rng = np.random.default_rng(11)
    x = rng.integers(0, 6, 40).astype(float)  # many ties
    y = x + rng.integers(-3, 4, 40)
    r = stats.correlation_ci(x, y, "pearson", n_boot=50)
    assert r.estimate == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    s = stats.correlation_ci(x, y, "spearman", n_boot=50)
    ref = np.corrcoef(average_ranks_reference(x), average_ranks_reference(y))[0, 1]
    assert s.estimate == pytest.approx(ref, abs=1e-12)
    assert s.method == "spearman" and s.n == 40 and s.n_boot == 50


def test_average_ranks_rowwise_with_ties():
    rng = np.random.default_rng(12)
    x = rng.integers(0, 4, (20, 9)).astype(float)
    got = _average_ranks(x)
    for row, ranks in zip(x, got):
        np.testing.assert_allclose(ranks, average_ranks_reference(row))


def test_correlation_bootstrap_coverage():
    """Bivariate normal, ρ = 0.6, n = 40: loose bounds, the percentile interval under-covers slightly."""
    rho, reps = 0.6, 200
    truth = {"pearson": rho, "spearman": 6 / math.pi * math.asin(rho / 2)}
    rng = np.random.default_rng(21)
    cov = [[1, rho], [rho, 1]]
    hits = dict.fromkeys(truth, 0)
    for r in range(reps):
        x, y = rng.multivariate_normal([0, 0], cov, 40).T
        for method in truth:
            res = stats.correlation_ci(x, y, method, n_boot=500, seed=r)
            hits[method] += res.low <= truth[method] <= res.high
            assert res.low <= res.estimate <= res.high
    for method, h in hits.items():
        assert 0.85 <= h / reps <= 0.99, f"{method} coverage {h / reps:.3f}"


def test_correlation_resamples_without_a_correlation_are_left_out():
    x = np.array([0.0, 0.0, 0.0, 0.0, 1.0])
    res = stats.correlation_ci(x, np.arange(5.0), "pearson", n_boot=2000)
    assert 0 < res.n_valid < 2000 and np.isfinite([res.low, res.high]).all()


# --------------------------------------------------------------------------------------------------
# Verdicts


def test_verdicts_on_clear_cases():
    rng = np.random.default_rng(31)
    weak = (rng.random((10, 20)) < 0.3).astype(int)
    strong = np.maximum(weak, (rng.random((10, 20)) < 0.6).astype(int))
    better = stats.compare(weak, strong, n_boot=2000, n_draws=4000)
    assert better.verdict == stats.BETTER and better.diff > 0 and better.mcnemar.p_value < 1e-6
    assert better.rate_a.rate == weak.mean() and better.rate_b.rate == strong.mean()
    assert better.rule == stats.VERDICT_RULE
    assert stats.compare(strong, weak, n_boot=2000, n_draws=4000).verdict == stats.WORSE
    flip = (rng.random((10, 20)) < 0.05).astype(int)
    same = stats.compare(weak, weak ^ flip * (rng.random((10, 20)) < 0.5), n_boot=2000, n_draws=4000)
    assert abs(same.diff) < 0.05 and same.verdict == stats.NO_CHANGE


def test_verdict_needs_both_intervals():
    assert _verdict((0.01, 0.2), (0.02, 0.3)) == stats.BETTER
    assert _verdict((-0.3, -0.01), (-0.2, -0.05)) == stats.WORSE
    assert _verdict((0.01, 0.2), (-0.01, 0.3)) == stats.NO_CHANGE
    assert _verdict((-0.2, -0.01), (-0.3, 0.0)) == stats.NO_CHANGE


def test_headroom_per_task():
    rng = np.random.default_rng(41)
    greedy = {
        "click-button": (rng.random((8, 25)) < 0.4).astype(int),
        "enter-text": (rng.random((8, 25)) < 0.5).astype(int),
    }
    sampled = {
        "click-button": np.maximum(greedy["click-button"], (rng.random((8, 25)) < 0.5).astype(int)),
        "enter-text": greedy["enter-text"].copy(),
    }
    table = stats.headroom(greedy, sampled, n_boot=1000, n_draws=2000)
    assert table.tasks == ("click-button", "enter-text")
    assert table["click-button"].has_headroom and table["click-button"].verdict == "headroom"
    assert table["click-button"].headroom == pytest.approx(sampled["click-button"].mean() - greedy["click-button"].mean())
    assert not table["enter-text"].has_headroom and table["enter-text"].verdict == "no credible headroom"
    alone = stats.headroom({"click-button": greedy["click-button"]}, {"click-button": sampled["click-button"]},
                           n_boot=1000, n_draws=2000)
    assert alone["click-button"] == table["click-button"]  # a task's result ignores the other tasks
    with pytest.raises(GraftkitError, match="same non-empty set of tasks"):
        stats.headroom(greedy, {"click-button": sampled["click-button"]})


# --------------------------------------------------------------------------------------------------
# Bad input


GOOD = np.zeros((3, 4), dtype=int)


@pytest.mark.parametrize(
    "a, b, fragment",
    [
        (GOOD, np.zeros((3, 5), dtype=int), "identical"),
        (GOOD, np.zeros((4, 3), dtype=int), "identical"),
        (np.zeros(12, dtype=int), np.zeros(12, dtype=int), "shaped [n_seeds, n_episodes_per_seed]"),
        (np.zeros((0, 4), dtype=int), np.zeros((0, 4), dtype=int), "got shape (0, 4)"),
        (np.full((3, 4), 2), GOOD, "found the value 2"),
        (GOOD, np.full((3, 4), 0.5), "found the value 0.5"),
        (GOOD, np.full((3, 4), np.nan), "0/1"),
        (np.full((3, 4), "1"), GOOD, "dtype <U1"),
    ],
)
def test_bad_outcomes_are_rejected(a, b, fragment):
    for fn in (stats.paired_bootstrap, stats.bayes_paired_interval, stats.mcnemar_exact, stats.compare):
        with pytest.raises(GraftkitError) as err:
            fn(a, b)
        message = str(err.value)
        assert fragment in message and "expected" in message and "\n" not in message


def test_booleans_and_floats_are_accepted():
    a = np.array([[True, False, True], [False, False, True]])
    assert stats.mcnemar_exact(a, a.astype(float)).p_value == 1.0


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, float("nan"), "0.95"])
def test_bad_level(level):
    a = np.eye(3, dtype=int)
    calls = [
        lambda: stats.wilson_interval(3, 10, level),
        lambda: stats.paired_bootstrap(a, a, level=level),
        lambda: stats.bayes_paired_interval(a, a, level=level),
        lambda: stats.compare(a, a, level=level),
        lambda: stats.correlation_ci([1, 2, 3], [1, 3, 2], level=level),
    ]
    for call in calls:
        with pytest.raises(GraftkitError, match="expected a confidence level strictly between 0 and 1"):
            call()


def test_other_bad_arguments():
    a = np.eye(3, dtype=int)
    cases = [
        (lambda: stats.wilson_interval(11, 10), "0 ≤ successes ≤ n"),
        (lambda: stats.wilson_interval(1, 0), "n=0: expected an integer ≥ 1"),
        (lambda: stats.wilson_interval(1.5, 10), "expected an integer"),
        (lambda: stats.bayes_paired_interval(a, a, prior=(1, 1)), "four"),
        (lambda: stats.bayes_paired_interval(a, a, prior=0), "positive Dirichlet"),
        (lambda: stats.paired_bootstrap(a, a, n_boot=0), "n_boot=0"),
        (lambda: stats.paired_bootstrap(a, a, seed=None), "seed=None: expected an integer ≥ 0"),
        (lambda: stats.bayes_paired_interval(a, a, n_draws=10.0), "n_draws=10.0"),
        (lambda: stats.pass_at_k(5, 6, 1), "0 ≤ c ≤ n"),
        (lambda: stats.pass_at_k(5, 2, 0), "k=0"),
        (lambda: stats.pass_at_k(5, 2, 6), "1 ≤ k ≤ n"),
        (lambda: stats.correlation_ci([1, 2, 3], [1, 2], "pearson"), "same number of pairs"),
        (lambda: stats.correlation_ci([1, 2], [1, 2], "pearson"), "at least 3"),
        (lambda: stats.correlation_ci([1, 1, 1], [1, 2, 3]), "constant"),
        (lambda: stats.correlation_ci([1, 2, np.nan], [1, 2, 3]), "finite"),
        (lambda: stats.correlation_ci([[1, 2, 3]], [[1, 2, 3]]), "1-d"),
        (lambda: stats.correlation_ci([1, 2, 3], [1, 2, 3], "kendall"), "'pearson', 'spearman'"),
    ]
    for call, fragment in cases:
        with pytest.raises(GraftkitError) as err:
            call()
        assert fragment in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# Equal clusters: the general code reduces to the rectangular formulas


def reference_two_stage(a, b, level, n_boot, seed):
    """paired_bootstrap for [seed, episode] arrays with c² > 0, written out directly: c, k from SS_B and
    SS_W, each within-seed sum drawn by inverse CDF of its exact distribution (np.convolve), the same
    random stream (one block: seeds, then one uniform per chosen seed)."""
    d = b.astype(float) - a
    n_seeds, n_eps = d.shape
    m = d.mean(axis=1)
    m_bar = m.mean()
    ss_b, ss_w = n_eps * ((m - m_bar) ** 2).sum(), ((d - m[:, None]) ** 2).sum()
    c2 = n_seeds / (n_seeds - 1) - ss_w / ((n_eps - 1) * ss_b)
    assert c2 > 0, "the reference covers the clustered case"
    c, k = math.sqrt(c2), math.sqrt(n_eps / (n_eps - 1))
    cdf = []
    for row in d:
        pmf = np.array([1.0])
        for _ in range(n_eps):
            pmf = np.convolve(pmf, [(row < 0).mean(), (row == 0).mean(), (row > 0).mean()])
        cdf.append(np.cumsum(pmf))  # index j: P(sum ≤ j − E)
    cdf = np.array(cdf)
    cdf[:, -1] = 1.0
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    u = rng.random((n_boot, n_seeds))
    m_star = ((cdf[pick] <= u[..., None]).sum(axis=-1) - n_eps) / n_eps
    theta = m_bar + (c * (m[pick] - m_bar) + k * (m_star - m[pick])).mean(axis=1)
    # Expanded BCa: the t_{S−1} tail, z0 from the resamples, â from the seed means' skewness.
    tail = NormalDist().cdf(-t_quantile((1 + level) / 2, n_seeds - 1))
    tie = np.abs(theta - m_bar) <= 1e-9 * max(abs(m_bar), theta.max() - theta.min())  # equal up to rounding
    z0 = NormalDist().inv_cdf((~tie & (theta < m_bar)).mean() + 0.5 * tie.mean())
    u = m - m_bar
    accel = (u**3).sum() / (6 * (u**2).sum() ** 1.5)
    levels = [NormalDist().cdf(z0 + (z0 + z) / (1 - accel * (z0 + z))) for z in (NormalDist().inv_cdf(tail),
                                                                              NormalDist().inv_cdf(1 - tail))]
    return m_bar, c, k, np.quantile(theta, levels)


def reference_posterior(a, b, level, n_draws, seed, alpha=1.0):
    """bayes_paired_interval for [seed, episode] arrays: four cells, design effect from seed means."""
    d = b.astype(float) - a
    n_seeds, n = d.shape[0], d.size
    p01, p10 = (d > 0).mean(), (d < 0).mean()
    deff = max(1.0, d.mean(axis=1).var(ddof=1) / n_seeds / ((p01 + p10 - (p01 - p10) ** 2) / n))
    rng = np.random.default_rng(seed)
    draws = deff * (n_seeds - 1) / rng.chisquare(n_seeds - 1, n_draws) if deff > 1 else np.full(n_draws, deff)
    post = alpha + np.bincount((2 * a + b).ravel(), minlength=4) / draws[:, None]
    gam = rng.standard_gamma(post)
    p = gam / gam.sum(axis=1, keepdims=True)
    delta = p[:, 1] - p[:, 2]
    w = np.sqrt(p[:, 1] + p[:, 2] - delta**2)  # the matching factor σ_d(p)
    order = np.argsort(delta)
    cum = np.cumsum(w[order])
    return deff, np.interp([(1 - level) / 2, (1 + level) / 2], (cum - w[order] / 2) / cum[-1], delta[order])


def seed_effect_pairs(rng, n_seeds, n_eps, p_a=0.45, lift=0.12, sd=0.3):
    """0/1 arrays [seed, episode] whose difference varies between seeds (so c² > 0)."""
    lift_s = lift + sd * rng.standard_normal((n_seeds, 1))
    a = (rng.random((n_seeds, n_eps)) < p_a).astype(np.int8)
    b = (rng.random((n_seeds, n_eps)) < np.clip(p_a + lift_s, 0.02, 0.98)).astype(np.int8)
    return a, b


@pytest.mark.parametrize("shape", [(12, 15), (25, 4), (8, 30)])
def test_equal_clusters_reduce_to_the_rectangular_formulas(shape):
    rng = np.random.default_rng(sum(shape))
    a, b = seed_effect_pairs(rng, *shape)
    got = stats.paired_bootstrap(a, b, n_boot=3000, seed=5)
    m_bar, c, k, (low, high) = reference_two_stage(a, b, 0.95, 3000, 5)
    assert got.source == "bootstrap" and got.df == shape[0] - 1
    assert (got.diff, got.seed_shrink, got.episode_scale) == pytest.approx((m_bar, c, k), abs=1e-12)
    assert (got.low, got.high) == pytest.approx((low, high), abs=1e-12)
    bayes = stats.bayes_paired_interval(a, b, n_draws=3000, seed=5)
    deff, (blow, bhigh) = reference_posterior(a, b, 0.95, 3000, 5)
    assert bayes.design_effect == pytest.approx(deff, rel=1e-12)
    assert (bayes.low, bayes.high) == pytest.approx((blow, bhigh), abs=1e-12)
    # The 1-d layout with one label per row is the same computation.
    labels = np.repeat([f"seed-{i}" for i in range(shape[0])], shape[1])
    flat = stats.compare(a.ravel(), b.ravel(), n_boot=3000, n_draws=3000, seed=5, clusters=labels)
    assert flat == stats.compare(a, b, n_boot=3000, n_draws=3000, seed=5)


def test_cluster_factors_pool_when_clusters_do_not_differ():
    """MS_B < MS_W: no cluster stage, and the episode stage carries the pooled variance s²_d/N (N − 1 df)."""
    rng = np.random.default_rng(4)
    checked = set()
    for _ in range(40):
        d = (rng.random((10, 6)) < 0.3).astype(float) - (rng.random((10, 6)) < 0.3)
        n_seeds, n_eps = d.shape
        m = d.mean(axis=1)
        ss_b, ss_w = n_eps * ((m - m.mean()) ** 2).sum(), ((d - m[:, None]) ** 2).sum()
        ms_b, ms_w = ss_b / (n_seeds - 1), ss_w / (n_seeds * (n_eps - 1))
        c, k, df = stats.cluster_bootstrap_factors(d)
        if ms_b >= ms_w:
            ref = (math.sqrt(n_seeds / (n_seeds - 1) - ss_w / ((n_eps - 1) * ss_b)), math.sqrt(n_eps / (n_eps - 1)), 9)
        else:
            ref = (0.0, math.sqrt((ss_b + ss_w) / (d.size - 1) * d.size / ss_w), d.size - 1)
            # the bootstrap variance, k²·(plug-in within variance)/N, is the independent-episodes one
            assert k * k * ss_w / d.size**2 == pytest.approx(d.var(ddof=1) / d.size, rel=1e-12)
        assert (c, k) == pytest.approx(ref[:2], rel=1e-12, abs=1e-15) and df == ref[2]
        checked.add(ms_b >= ms_w)
    assert checked == {True, False}


# --------------------------------------------------------------------------------------------------
# Clusters of unequal size (1-d layout)


def unequal_clusters(rng, n_clusters=20, low=1, high=9, lift_sd=0.2):
    sizes = rng.integers(low, high, n_clusters)
    labels = np.repeat([f"item-{i}" for i in range(n_clusters)], sizes)
    lift = np.repeat(0.1 + lift_sd * rng.standard_normal(n_clusters), sizes)
    a = (rng.random(labels.size) < 0.4).astype(np.int8)
    b = (rng.random(labels.size) < np.clip(0.4 + lift, 0.02, 0.98)).astype(np.int8)
    return a, b, labels, sizes


def test_unequal_clusters_bootstrap_variance_is_the_cluster_robust_one():
    """Var*(θ*) = S/(S − 1) Σ n_s² (m_s − d̄)² / N² when clusters differ: read at level 0.6827, the
    half-width is t_{S−1} · that standard error."""
    a, b, labels, sizes = unequal_clusters(np.random.default_rng(8))
    d = b.astype(float) - a
    m = np.array([d[labels == f"item-{i}"].mean() for i in range(sizes.size)])
    n, s = d.size, sizes.size
    v_clu = s / (s - 1) * (sizes**2 * (m - d.mean()) ** 2).sum() / n**2
    assert v_clu > d.var(ddof=1) / n  # clustered: the cluster-robust variance is the one used
    res = stats.paired_bootstrap(a, b, level=0.6827, n_boot=400_000, seed=2, clusters=labels)
    assert res.diff == pytest.approx(b.mean() - a.mean(), abs=1e-12)
    assert res.df == s - 1 and res.seed_shrink > 0 and res.n_episodes is None and res.episode_scale is None
    assert res.cluster_sizes == tuple(sizes)
    t = t_quantile((1 + 0.6827) / 2, s - 1)
    assert (res.high - res.low) / 2 == pytest.approx(t * math.sqrt(v_clu), rel=0.03)


def test_unequal_clusters_shuffled_and_drawn_directly(monkeypatch):
    """Episode order does not matter beyond the random stream; drawing episode indices instead of the
    tabulated sums gives the same distribution."""
    rng = np.random.default_rng(9)
    a, b, labels, _ = unequal_clusters(rng)
    res = stats.paired_bootstrap(a, b, n_boot=50_000, seed=1, clusters=labels)
    perm = rng.permutation(a.size)
    shuffled = stats.paired_bootstrap(a[perm], b[perm], n_boot=50_000, seed=1, clusters=labels[perm])
    for field in ("diff", "seed_shrink", "df", "n_discordant"):
        assert getattr(shuffled, field) == pytest.approx(getattr(res, field), abs=1e-12)
    assert sorted(shuffled.cluster_sizes) == sorted(res.cluster_sizes)
    assert (shuffled.low, shuffled.high) == pytest.approx((res.low, res.high), abs=0.01)
    bayes = stats.bayes_paired_interval(a, b, clusters=labels)
    assert stats.bayes_paired_interval(a[perm], b[perm], clusters=labels[perm]).design_effect == pytest.approx(
        bayes.design_effect, rel=1e-12)
    monkeypatch.setattr(stats.paired, "_TABLE_WORK", 0)
    direct = stats.paired_bootstrap(a, b, n_boot=50_000, seed=1, clusters=labels)
    assert (direct.low, direct.high) == pytest.approx((res.low, res.high), abs=0.01)
    assert (direct.low, direct.high) != (res.low, res.high)  # it did take the other path


def test_design_effect_with_unequal_clusters():
    """D̂ = [S/(S − 1) Σ n_s² (m_s − d̄)² / N²] / [(mean(d²) − d̄²) / N], by hand."""
    a, b, labels, sizes = unequal_clusters(np.random.default_rng(10), lift_sd=0.3)
    d = b.astype(float) - a
    m = np.array([d[labels == f"item-{i}"].mean() for i in range(sizes.size)])
    n, s = d.size, sizes.size
    ref = (s / (s - 1) * (sizes**2 * (m - d.mean()) ** 2).sum() / n**2) / (((d * d).mean() - d.mean() ** 2) / n)
    res = stats.bayes_paired_interval(a, b, clusters=labels)
    assert ref > 1 and res.design_effect == pytest.approx(ref, rel=1e-12) and res.design_effect_df == s - 1


def test_mixed_label_types_and_mcnemar_in_the_flat_layout():
    a = np.array([0, 1, 0, 0, 1, 1])
    b = np.array([1, 1, 1, 0, 0, 1])
    labels = np.array([3, 3, "x", "x", 7.5, None], dtype=object)
    res = stats.mcnemar_exact(a, b, clusters=labels)
    assert (res.n00, res.n01, res.n10, res.n11) == (1, 2, 1, 2)
    boot = stats.paired_bootstrap(a, b, n_boot=200, clusters=labels)
    assert boot.cluster_sizes == (2, 2, 1, 1) and boot.n_seeds == 4


@pytest.mark.parametrize(
    "a, b, clusters, fragment",
    [
        (GOOD, GOOD, np.zeros(12), "with clusters= expected a 1-d array"),
        (np.zeros(12), np.zeros(12), np.zeros(11), "one label per episode"),
        (np.zeros(12), np.zeros(11), np.zeros(12), "one label per episode"),
        (np.zeros(12), np.zeros(12), np.zeros((3, 4)), "1-d array of cluster labels"),
        (np.zeros(3), np.array([0, 2, 1]), np.zeros(3), "found the value 2"),
    ],
)
def test_bad_clusters_are_rejected(a, b, clusters, fragment):
    for fn in (stats.paired_bootstrap, stats.bayes_paired_interval, stats.mcnemar_exact, stats.compare):
        with pytest.raises(GraftkitError) as err:
            fn(a, b, clusters=clusters)
        assert fragment in str(err.value) and "\n" not in str(err.value)


def test_cluster_labels_merge_seeds_that_share_an_item():
    #               seed 0    seed 1    seed 2    seed 3
    got = stats.cluster_labels([0, 0, 1, 1, 2, 2, 3, 3], ["x", "y", "z", "x", "w", "v", "u", "u"])
    assert got.tolist() == [0, 0, 0, 0, 1, 1, 2, 2]  # x links seeds 0 and 1; u repeats inside seed 3 only
    chain = stats.cluster_labels(["s0", "s1", "s1", "s2", "s3"], [10, 10, 11, 11, 12])
    assert chain.tolist() == [0, 0, 0, 0, 1]  # 0–1 share item 10, 1–2 share item 11: transitive
    assert stats.cluster_labels([5, 5, 3, 3, 9], ["a", "b", "c", "d", "e"]).tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(GraftkitError, match="one entry per episode"):
        stats.cluster_labels([0, 1], ["x"])


def components_by_search(seeds, items):
    """Reference: connected components of episodes (linked by equal seed or equal item) by graph search."""
    n = len(seeds)
    label = [-1] * n
    current = 0
    for start in range(n):
        if label[start] >= 0:
            continue
        stack, label[start] = [start], current
        while stack:
            e = stack.pop()
            for f in range(n):
                if label[f] < 0 and (seeds[f] == seeds[e] or items[f] == items[e]):
                    label[f] = current
                    stack.append(f)
        current += 1
    return label


def test_cluster_labels_match_a_graph_search():
    rng = np.random.default_rng(13)
    for trial in range(20):
        seeds = rng.integers(0, 12, 60).tolist()
        items = [f"item{v}" for v in rng.integers(0, 45, 60)]
        assert stats.cluster_labels(seeds, items).tolist() == components_by_search(seeds, items)


# --------------------------------------------------------------------------------------------------
# The ceiling: few or no discordant pairs


def test_posterior_takes_over_below_min_discordant():
    for m, source in ((stats.MIN_DISCORDANT - 1, "posterior"), (stats.MIN_DISCORDANT, "bootstrap")):
        a = np.ones((25, 4), dtype=np.int8)
        t = np.arange(m)
        a[t % 25, t // 25] = 0
        res = stats.paired_bootstrap(a, np.ones_like(a), n_boot=2000)
        assert res.source == source and res.n_discordant == m and res.diff == pytest.approx(m / 100)
        assert (res.method == _BOOT_FALLBACK) == (source == "posterior")
        assert 0 < res.low < res.diff < res.high  # m one-way pairs of 100: credibly positive either way


def ceiling_pairs(rng, reps, n_seeds, n_eps, p0=0.99, delta=0.005):
    """A at p0; b fixes each failure of a with probability delta/(1 − p0), breaks nothing."""
    a = (rng.random((reps, n_seeds, n_eps)) < p0).astype(np.int8)
    fixed = rng.random(a.shape) < delta / (1 - p0)
    return a, np.maximum(a, fixed).astype(np.int8)


@pytest.mark.slow
def test_a_small_improvement_at_the_ceiling_is_covered(monkeypatch):
    """p = 0.99, true +0.5 points, 25 × 2 and 25 × 20 episodes: covered ≥ 93%; the bootstrap alone
    (MIN_DISCORDANT = 0) collapses onto [0, 0] or past the truth and covers far less."""
    for n_eps in (2, 20):
        a, b = ceiling_pairs(np.random.default_rng(n_eps), 300, 25, n_eps)
        hits = 0
        for r in range(300):
            res = stats.paired_bootstrap(a[r], b[r], n_boot=500, seed=r)
            hits += res.low <= 0.005 <= res.high
        assert hits / 300 >= 0.93, (n_eps, hits / 300)
    monkeypatch.setattr(stats.paired, "MIN_DISCORDANT", 0)
    a, b = ceiling_pairs(np.random.default_rng(2), 300, 25, 2)
    hits = 0
    for r in range(300):
        res = stats.paired_bootstrap(a[r], b[r], n_boot=500, seed=r)
        hits += res.low <= 0.005 <= res.high
    assert hits / 300 < 0.5


def test_every_difference_interval_stays_inside_minus_one_one():
    # 29 of 30 one-episode seeds at +1: c = √(30/29) carries resamples past 1 before clipping.
    a = np.zeros((30, 1), dtype=np.int8)
    b = np.ones((30, 1), dtype=np.int8)
    b[0] = 0
    boot = stats.paired_bootstrap(a, b, n_boot=5000)
    assert boot.source == "bootstrap" and boot.seed_shrink > 1 and boot.high == 1.0
    unclipped = b.mean() + boot.seed_shrink * (1 - b.mean())
    assert unclipped > 1
    cases = [(np.zeros((5, 4)), np.ones((5, 4))), (np.ones((5, 4)), np.zeros((5, 4))), (a, b), (b, a),
             (np.ones((1, 1)), np.zeros((1, 1))), (np.zeros((2, 2)), np.zeros((2, 2)))]
    for x, y in cases:
        for res in (stats.compare(x, y, n_boot=500, n_draws=500).bootstrap,
                    stats.compare(x, y, n_boot=500, n_draws=500).bayes,
                    stats.regime_interval([(x, y), (x, y)], n_boot=500),
                    stats.regime_interval([(x, y)], n_boot=500)):
            assert -1.0 <= res.low <= res.high <= 1.0


# --------------------------------------------------------------------------------------------------
# Headroom: k samples per episode


def test_headroom_pairs_each_episode_with_its_samples():
    rng = np.random.default_rng(21)
    g = (rng.random((6, 10)) < 0.4).astype(np.int8)
    s = (rng.random((6, 10, 4)) < 0.6).astype(np.int8)
    kw = dict(n_boot=1000, n_draws=2000)
    cube = stats.headroom({"t": g}, {"t": s}, **kw)["t"]
    for greedy, sampled, extra in [
        (np.repeat(g, 4, axis=1), s.reshape(6, -1), {"samples": 4}),  # folded, as HeadroomResult.pairs() gives
        (g[..., None], s, {}),
        (np.repeat(g[..., None], 4, axis=-1), s, {}),
        (g.ravel(), s.reshape(60, 4), {"clusters": np.repeat(np.arange(6), 10)}),
        (g.ravel(), s.reshape(60, 4), {"clusters": {"t": np.repeat(np.arange(6), 10)}}),
    ]:
        assert stats.headroom({"t": greedy}, {"t": sampled}, **kw, **extra)["t"] == cube
    c = cube.comparison
    assert c.diff == pytest.approx(s.mean() - g.mean(), abs=1e-12)
    assert (c.rate_a.n, c.rate_b.n, c.rate_a.successes, c.rate_b.successes) == (60, 240, g.sum(), s.sum())
    assert c.bayes.samples == 4 and c.bootstrap.n_seeds == 6 and c.bootstrap.n_episodes == 10
    paired = stats.mcnemar_exact(np.repeat(g, 4, axis=1), s.reshape(6, -1))  # each sample against its greedy
    assert (c.mcnemar.n01, c.mcnemar.n10, c.mcnemar.p_value) == (paired.n01, paired.n10, paired.p_value)
    assert c.bayes.counts == pytest.approx((paired.n00 / 4, paired.n01 / 4, paired.n10 / 4, paired.n11 / 4))


def test_headroom_posterior_over_joint_outcomes():
    """One cluster (D = 1), K = 2: Dirichlet over cells (greedy ∈ {0, 1}) × (samples ∈ {0, 1, 2}), each
    corner's α spread over its side; posterior mean of Σ p (j/2 − i) in closed form."""
    g = np.array([[0, 0, 1, 1, 1, 1, 0, 1]])
    s = np.array([[[1, 1], [0, 1], [1, 1], [1, 0], [0, 0], [1, 1], [0, 0], [1, 1]]])
    res = stats.headroom({"t": g}, {"t": s}, n_boot=500, n_draws=200_000)["t"].comparison.bayes
    counts = np.zeros((2, 3))
    for gi, si in zip(g[0], s[0].sum(-1)):
        counts[gi, si] += 1
    prior = np.array([[1, 0.5, 0], [1, 0.5, 0]]) + np.array([[0, 0.5, 1], [0, 0.5, 1]])  # α00/α01 (row 0), α10/α11
    prior = prior * 4 / 6
    post = prior + counts
    value = (np.arange(3)[None, :] / 2 - np.arange(2)[:, None]).ravel()
    assert res.design_effect == 1.0 and prior.sum() == pytest.approx(4.0)
    p = np.random.default_rng(98).dirichlet(post.ravel(), 1_000_000)  # the conjugate posterior, reweighted
    delta = p @ value
    w = np.sqrt(p @ value**2 - delta**2)
    assert res.mean == pytest.approx(w @ delta / w.sum(), abs=0.002)


def test_headroom_verdicts_on_planted_tasks():
    rng = np.random.default_rng(22)
    g_low = (rng.random((10, 8)) < 0.3).astype(np.int8)
    g_high = (rng.random((10, 8)) < 0.9).astype(np.int8)
    greedy = {"climbs": g_low, "worse": g_high, "flat": g_low.copy()}
    sampled = {"climbs": (rng.random((10, 8, 4)) < 0.7).astype(np.int8),
               "worse": (rng.random((10, 8, 4)) < 0.4).astype(np.int8),
               "flat": np.repeat(g_low[..., None], 4, axis=-1)}
    table = stats.headroom(greedy, sampled, n_boot=2000, n_draws=4000)
    assert [table[t].verdict for t in ("climbs", "worse", "flat")] == [
        "headroom", "sampling credibly worse", "no credible headroom"]
    assert table["flat"].comparison.bootstrap.source == "posterior" and table["flat"].headroom == 0


@pytest.mark.parametrize(
    "greedy, sampled, extra, fragment",
    [
        (np.zeros((2, 6)), np.zeros((2, 6)), {"samples": 4}, "with samples=4"),
        (np.zeros((2, 3, 2)), np.zeros((2, 3, 4)), {}, "1 or 4 greedy samples"),
        (np.zeros((2, 4)), np.zeros((2, 3, 4)), {}, "the same episodes"),
        (np.zeros(3), np.zeros((3, 2)), {"clusters": {"other": np.zeros(3)}}, "no labels for task 't'"),
        (np.zeros(3), np.zeros((3, 2)), {"clusters": np.zeros(4)}, "one label per episode"),
    ],
)
def test_headroom_bad_layouts(greedy, sampled, extra, fragment):
    with pytest.raises(GraftkitError) as err:
        stats.headroom({"t": greedy}, {"t": sampled}, n_boot=10, n_draws=10, **extra)
    assert fragment in str(err.value)


# --------------------------------------------------------------------------------------------------
# Regimes: training seeds


def test_regime_with_one_run_is_the_paired_bootstrap_of_that_run():
    a, b = seed_effect_pairs(np.random.default_rng(30), 25, 8)
    res = stats.regime_interval([(a, b)], n_boot=3000, seed=3)
    ref = stats.paired_bootstrap(a, b, n_boot=3000, seed=3)
    assert (res.diff, res.low, res.high, res.df) == (ref.diff, ref.low, ref.high, ref.df) and res.run == ref
    assert res.n_runs == 1 and res.conditional and res.design == "one run" and "conditional" in res.method
    d = b.astype(float) - a
    assert res.sd**2 == pytest.approx(max(d.mean(axis=1).var(ddof=1) / 25, d.var(ddof=1) / d.size), rel=1e-12)
    labels = np.repeat(np.arange(25), 8)
    flat = stats.regime_interval([(a.ravel(), b.ravel(), labels)], n_boot=3000, seed=3)
    assert (flat.low, flat.high) == (ref.low, ref.high)


def regime_runs(rng, n_runs, n_seeds=25, n_eps=8, lift=0.05, run_sd=0.05, shared=True):
    """(a, b) per run: one SFT evaluation a shared by all runs (or one each), run r lifting by
    lift + run_sd·z_r, episodes independent given the seed's level."""
    level = rng.uniform(0.3, 0.6, (n_seeds, 1))
    a = (rng.random((n_seeds, n_eps)) < level).astype(np.int8)
    out = []
    for _ in range(n_runs):
        if not shared:
            a = (rng.random((n_seeds, n_eps)) < level).astype(np.int8)
        lift_r = lift + run_sd * rng.standard_normal()
        out.append((a, (rng.random((n_seeds, n_eps)) < level + lift_r).astype(np.int8)))
    return out


def test_regime_bootstrap_variance_is_its_two_way_formula():
    """Shared evaluation: Var*(θ*) = max(s²_R, V_int)/R + max(0, V_clu − V_int/R), by hand."""
    runs = regime_runs(np.random.default_rng(31), 4)
    res = stats.regime_interval(runs, n_boot=200_000, seed=1)
    cm = np.stack([(b.astype(float) - a).mean(axis=1) for a, b in runs])  # [R, S]
    n_runs, n_seeds = cm.shape
    delta, col, theta = cm.mean(axis=1), cm.mean(axis=0), cm.mean()
    resid = cm - col - delta[:, None] + theta
    s2 = delta.var(ddof=1)
    v_int = n_seeds / (n_seeds - 1) * (resid**2).sum() / ((n_runs - 1) * n_seeds**2)
    v_clu = n_seeds / (n_seeds - 1) * ((col - theta) ** 2).sum() / n_seeds**2
    parts = (max(s2, v_int) / n_runs, max(0.0, v_clu - v_int / n_runs))
    assert res.design == "shared evaluation" and not res.conditional and res.diff == pytest.approx(theta, abs=1e-12)
    assert res.variance == pytest.approx(parts, rel=1e-12)
    assert res.sd**2 == pytest.approx(sum(parts), rel=0.02)
    df1 = n_runs - 1 if s2 >= v_int else (n_runs - 1) * (n_seeds - 1)
    nu = sum(parts) ** 2 / (parts[0] ** 2 / df1 + parts[1] ** 2 / (n_seeds - 1))
    assert res.df == math.floor(nu) and parts[1] > 0
    t = t_quantile(0.975, res.df)
    assert (res.low, res.high) == pytest.approx((theta - t * res.sd, theta + t * res.sd), abs=1e-12)


def test_regime_separate_evaluations_resample_runs_then_their_clusters():
    runs = regime_runs(np.random.default_rng(32), 3, shared=False)
    labelled = [(a.ravel(), b.ravel(), np.repeat([f"run{i}-seed{s}" for s in range(25)], 8))
                for i, (a, b) in enumerate(runs)]
    res = stats.regime_interval(labelled, n_boot=200_000, seed=2)
    delta = np.array([b.mean() - a.mean() for a, b in runs])
    v_run = [25 / 24 * (((b.astype(float) - a).mean(axis=1) - d) ** 2).sum() / 25**2 for (a, b), d in zip(runs, delta)]
    target = max(delta.var(ddof=1), np.mean(v_run)) / 3
    assert res.design == "separate evaluations" and res.variance == pytest.approx((target, 0.0), rel=1e-12)
    assert res.sd**2 == pytest.approx(target, rel=0.02)
    assert res.run_diffs == pytest.approx(tuple(delta), abs=1e-12)


def test_regime_tost_both_verdicts():
    rng = np.random.default_rng(33)
    a = (rng.random((25, 40)) < 0.6).astype(np.int8)
    same = [(a, a ^ (rng.random(a.shape) < 0.05)) for _ in range(3)]  # flips both ways: Δ ≈ 0
    eq = stats.regime_tost(same, margin=0.08, n_boot=4000)
    assert eq.equivalent and eq.interval.level == pytest.approx(0.90) and eq.level == 0.95
    assert -0.08 < eq.interval.low < eq.interval.high < 0.08
    assert not stats.regime_tost(same, margin=0.002, n_boot=4000).equivalent  # too tight a margin
    worse = [(a, a * (rng.random(a.shape) > 0.35)) for _ in range(3)]  # loses ≈ 21 points
    ne = stats.regime_tost(worse, margin=0.08, n_boot=4000)
    assert not ne.equivalent and ne.interval.high < -0.08
    for margin, level in ((0.0, 0.95), (-0.1, 0.95), (0.1, 0.5)):
        with pytest.raises(GraftkitError):
            stats.regime_tost(same, margin=margin, level=level)


def test_regime_with_almost_no_discordance_uses_the_pooled_posterior():
    a = np.ones((25, 2), dtype=np.int8)
    res = stats.regime_interval([(a, a.copy())] * 3, n_boot=2000)
    assert res.conditional and res.diff == 0 and res.low < 0 < res.high and "pooled" in res.method
    with pytest.raises(GraftkitError, match="pairs is empty"):
        stats.regime_interval([])
    with pytest.raises(GraftkitError, match=r"pairs\[0\]"):
        stats.regime_interval([a])


# --------------------------------------------------------------------------------------------------
# Power


def binomial_tail(n, p, m):
    return float(sum(Fraction(math.comb(n, i)) * Fraction(p) ** i * (1 - Fraction(p)) ** (n - i)
                     for i in range(m, n + 1)))


def test_detectable_improvement_shrinks_with_n_and_is_capped_by_p0():
    by_n = [stats.detectable_improvement(0.5, 25, e) for e in (2, 4, 8, 20)]
    deltas = [r.delta for r in by_n]
    assert all(x > y for x, y in zip(deltas, deltas[1:])), deltas
    for r in by_n:
        n = r.n_clusters * r.n_episodes
        assert binomial_tail(n, r.delta, r.min_pairs) == pytest.approx(0.8, abs=1e-6)
        # m* is the fewest one-way pairs compare() calls credibly better
        a = np.ones((25, r.n_episodes), dtype=np.int8)
        t = np.arange(r.min_pairs - 1)
        a[t % 25, t // 25] = 0
        assert stats.compare(a, np.ones_like(a), n_boot=2000, n_draws=4000).verdict != stats.BETTER
    by_p0 = [stats.detectable_improvement(p0, 25, 8) for p0 in (0.3, 0.6, 0.9, 0.97, 0.99)]
    assert [r.detectable for r in by_p0] == [True, True, True, False, False]
    deltas = [r.delta for r in by_p0]
    assert all(x <= y for x, y in zip(deltas, deltas[1:])) and deltas[0] == deltas[2]  # capped only
    shares = [r.fixed_share for r in by_p0]
    assert all(x < y for x, y in zip(shares, shares[1:3])) and math.isinf(shares[-1])
    assert stats.detectable_improvement(0.9, 25, 8) == stats.detectable_improvement(0.9, 25, 8)
    with pytest.raises(GraftkitError):
        stats.detectable_improvement(1.0, 25, 2)
    with pytest.raises(GraftkitError):
        stats.detectable_improvement(0.5, 25, 2, power=1.0)


def test_the_posterior_interval_is_widened_to_reach_its_estimate():
    """Four episodes, all discordant one way: the prior pulls the posterior below d̄ = 1."""
    a, b = np.zeros((2, 2), dtype=np.int8), np.ones((2, 2), dtype=np.int8)
    bayes = stats.bayes_paired_interval(a, b, n_draws=5000)
    boot = stats.paired_bootstrap(a, b, n_boot=5000)
    assert bayes.high < 0.95 and boot.source == "posterior"
    assert (boot.low, boot.high) == (bayes.low, 1.0) and boot.diff == 1.0


def test_headroom_with_several_greedy_samples_that_differ():
    """Greedy with k samples that disagree: both sides are success fractions, k + 1 levels each."""
    rng = np.random.default_rng(23)
    g = (rng.random((5, 6, 3)) < 0.5).astype(np.int8)
    s = (rng.random((5, 6, 3)) < 0.7).astype(np.int8)
    c = stats.headroom({"t": g}, {"t": s}, n_boot=1000, n_draws=2000)["t"].comparison
    assert c.diff == pytest.approx(s.mean() - g.mean(), abs=1e-12) and c.rate_a.n == 90 and c.rate_b.n == 90
    fa, fb = g.mean(-1).ravel(), s.mean(-1).ravel()
    assert c.bayes.counts == pytest.approx(((1 - fa) @ (1 - fb), (1 - fa) @ fb, fa @ (1 - fb), fa @ fb))
    assert -1 <= c.bayes.low < c.bayes.mean < c.bayes.high <= 1
