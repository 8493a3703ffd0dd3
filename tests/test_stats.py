"""stats: intervals cover a planted truth at their nominal rate; exact pieces match independent references.

Coverage: paired outcomes are simulated from a two-level model with a known population difference
(per-seed random effects on both the success level and the difference, episodes i.i.d. within a seed),
and each 95% interval must contain the truth in 93–97% of repetitions. With 1000 repetitions the
standard error of a coverage near 0.95 is 0.7 points, so a calibrated method leaves the window about
once in a hundred simulation seeds (six other seeds gave 93.5–96.1%); the seeds here are fixed, so the
test is deterministic.
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
from graftkit.errors import GraftkitError

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
    t11 = stats._t_quantile((1 + 0.6827) / 2, 11)
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
    assert stats._t_quantile(p, df) == pytest.approx(t, abs=1e-8)
    assert stats._t_quantile(1 - p, df) == pytest.approx(-t, abs=1e-8)


@pytest.mark.parametrize("df", [1, 2, 3, 8, 31, 200, 201, 5000])
def test_t_cdf_matches_integrated_density(df):
    """Closed-form CDF against Simpson integration of the density from 0."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    for t in (0.3, 1.0, 2.5):
        x = np.linspace(0.0, t, 20_001)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
        h = x[1] - x[0]
        area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
        assert stats._t_cdf(t, df) == pytest.approx(0.5 + area, abs=1e-9)
        assert stats._t_cdf(-t, df) == pytest.approx(0.5 - area, abs=1e-9)


def test_identical_agents_give_a_zero_difference():
    a = (np.random.default_rng(0).random((6, 9)) < 0.4).astype(int)
    boot = stats.paired_bootstrap(a, a.copy(), n_boot=500)
    assert (boot.diff, boot.low, boot.high) == (0.0, 0.0, 0.0)
    bayes = stats.bayes_paired_interval(a, a.copy(), n_draws=20_000)
    assert bayes.mean == 0.0 and bayes.low < 0 < bayes.high and bayes.low == pytest.approx(-bayes.high, abs=0.01)
    assert stats.mcnemar_exact(a, a).p_value == 1.0


def test_bayes_posterior_is_the_conjugate_dirichlet_without_clustering():
    """One seed: D = 1, posterior mean (α01 + n01 − α10 − n10) / (Σα + N), draws match it."""
    a, b = cells_to_arrays(30, 25, 10, 35)
    res = stats.bayes_paired_interval(a, b, prior=0.5, n_draws=200_000, seed=4)
    assert res.design_effect == 1.0 and res.design_effect_df is None
    assert res.counts == (30, 25, 10, 35) and res.prior == (0.5,) * 4
    assert res.mean == pytest.approx((25.5 - 10.5) / 102)
    alpha = np.array([30.5, 25.5, 10.5, 35.5])
    a0 = alpha.sum()
    var = (alpha[1] * (a0 - alpha[1]) + alpha[2] * (a0 - alpha[2]) + 2 * alpha[1] * alpha[2]) / (a0**2 * (a0 + 1))
    z = 1.959963984540054
    assert res.low == pytest.approx(res.mean - z * math.sqrt(var), abs=0.006)
    assert res.high == pytest.approx(res.mean + z * math.sqrt(var), abs=0.006)
    assert 0.98 < res.p_positive <= 1.0


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
    one = stats.paired_bootstrap(np.ones((1, 1), int), np.zeros((1, 1), int), n_boot=50)
    assert (one.diff, one.low, one.high, one.df) == (-1.0, -1.0, -1.0, None)


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
    got = stats._average_ranks(x)
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
    assert stats._verdict((0.01, 0.2), (0.02, 0.3)) == stats.BETTER
    assert stats._verdict((-0.3, -0.01), (-0.2, -0.05)) == stats.WORSE
    assert stats._verdict((0.01, 0.2), (-0.01, 0.3)) == stats.NO_CHANGE
    assert stats._verdict((-0.2, -0.01), (-0.3, 0.0)) == stats.NO_CHANGE


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
