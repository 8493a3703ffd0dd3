"""stats at and away from the ceiling: coverage of a planted truth, and the headroom verdict's false positives.

Simulation (one cell per baseline p0 ∈ {0.3, 0.9, 0.99} × effect ∈ {0, small, −0.1}; small = +0.02, or
+0.005 at p0 = 0.99): 25 evaluation seeds × 2 episodes. Seed s has a random effect u_s ~ N(0, 0.5²) on the
logit scale, shared by both agents; given u_s, every episode of a and of b is an independent Bernoulli:
a with logit β_a + u_s, b with β_a + δ + u_s. β_a and δ are solved (Gauss–Hermite quadrature, 80 nodes)
so that the *population* rates are exact: E_u[expit(β_a + u)] = p0 and E_u[expit(β_a + δ + u)] − p0 =
effect, which is the truth each interval must contain.

Regimes: three RL runs against one SFT evaluation a (every run on the same episodes, as the study runs
them); run r has its own training-seed effect z_r ~ N(0, 0.3²) on the logit scale, b_r with logit
β_a + δ + z_r + u_s, δ solved so that the mean over training seeds of the population difference is the
effect.

Window: each interval must contain the truth in 93–97% of 1000 simulated datasets (standard error of a
coverage near 0.95: 0.7 points). Every seed is fixed, so the tests are deterministic; ``pytest -s`` prints
the table.

Two cells cannot reach the window, for any valid interval, and are marked xfail (strict, so a change
that moves them into it is noticed): p0 = 0.99 with effect 0 and with +0.005. With 50 episodes at
p0 = 0.99 the expected number of discordant pairs is about 1 (2·0.99·0.01·50, less with the effect one
way); in ≥ 99% of datasets there are at most 5, and with m ≤ 5 discordant pairs not even the exact
McNemar test can reject Δ = 0 at 5% (its smallest p-value is 2^(1 − m) ≥ 0.0625), so every interval
that is valid for small counts contains 0 and, being at least ±3.7/N wide, +0.005: coverage ≈ 100%
(≈ 99% for the regime: its three runs together still have fewer than MIN_DISCORDANT = 10 discordant
pairs in 99% of datasets, ≤ 5 in 84%, and its interval is then the pooled posterior's). ``test_ceiling_cells_have_too_few_discordant_pairs``
checks that premise, and every cell must still cover at least 93%.

One more cell of compare is checked side by side instead of in the window: p0 = 0.99 with effect −0.1
(POSTERIOR_CELLS). 93% of its datasets have fewer than MIN_DISCORDANT discordant pairs, so the interval
tested is the posterior's, which its prior keeps at or above nominal; a two-sided window there hid a
one-sided error: the posterior without its matching factor missed above the truth in 3.3% of datasets and
below it in 0.6% (coverage 96.1%, inside the window); with it, 1.8% and 0.9% (97.3%, above it). Each side's
miss rate is held to the binomial band of a calibrated side (``side_band``), above only.

Headroom at a 90% baseline (last section): the false-positive rate of each side of the headroom verdict,
and of each of its two intervals, with no true effect and seed- and item-level random effects; the
derivation of the tolerance is in that section.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from graftkit import stats

# one xdist worker runs the module: its simulated tables (module fixtures) are computed once, not on each worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("stats-coverage")]

N_SEEDS, N_EPS, SIGMA, TAU, RUNS, REPS = 25, 2, 0.5, 0.3, 3, 1000
CELLS = [(p0, effect) for p0 in (0.3, 0.9, 0.99) for effect in (0.0, 0.005 if p0 == 0.99 else 0.02, -0.1)]
CEILING = {(0.99, 0.0), (0.99, 0.005)}
POSTERIOR_CELLS = {(0.99, -0.1)}  # compare's interval is the posterior's in most datasets (module docstring)
CEILING_REASON = (
    "p0 = 0.99, 25 × 2 episodes: ≈ 1 discordant pair per dataset (≈ 3 per regime of 3 runs); with ≤ 5 no "
    "valid interval excludes the truth (exact McNemar p ≥ 0.0625), so coverage is ≈ 99–100% (module docstring)"
)

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()  # expectation under N(0, 1)


def expit(x):
    return 1.0 / (1.0 + np.exp(-x))


def population_rate(beta: float, sd: float) -> float:
    """E[expit(β + sd·Z)], Z ~ N(0, 1)."""
    return float((_WEIGHTS * expit(beta + sd * _NODES)).sum())


def solve(target: float, sd: float, offset: float = 0.0) -> float:
    """The β with population_rate(offset + β, sd) = target, by bisection."""
    lo, hi = -30.0, 30.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if population_rate(offset + mid, sd) < target else (lo, mid)
    return (lo + hi) / 2


def simulate(rng, p0, effect, runs=1, tau=0.0):
    """a [REPS, S, E] and one b [REPS, S, E] per run (see the module docstring)."""
    beta_a = solve(p0, SIGMA)
    delta = solve(p0 + effect, math.hypot(SIGMA, tau), offset=beta_a)
    u = rng.normal(0.0, SIGMA, (REPS, N_SEEDS, 1))
    a = (rng.random((REPS, N_SEEDS, N_EPS)) < expit(beta_a + u)).astype(np.int8)
    bs = []
    for _ in range(runs):
        z = tau * rng.standard_normal((REPS, 1, 1))
        bs.append((rng.random((REPS, N_SEEDS, N_EPS)) < expit(beta_a + delta + z + u)).astype(np.int8))
    return a, bs


def test_simulation_truth_is_exact():
    for p0, effect in CELLS:
        beta_a = solve(p0, SIGMA)
        assert population_rate(beta_a, SIGMA) == pytest.approx(p0, abs=1e-12)
        for tau in (0.0, TAU):
            delta = solve(p0 + effect, math.hypot(SIGMA, tau), offset=beta_a)
            assert population_rate(beta_a + delta, math.hypot(SIGMA, tau)) - p0 == pytest.approx(effect, abs=1e-12)
    # the quadrature against a large Monte Carlo draw
    z = np.random.default_rng(0).standard_normal(2_000_000)
    assert population_rate(2.0, 0.5) == pytest.approx(expit(2.0 + 0.5 * z).mean(), abs=5e-4)


@pytest.fixture(scope="module")
def coverage():
    """Per cell: coverage of compare's bootstrap interval and of regime_interval, and the datasets'
    discordant-pair counts."""
    table = {}
    for i, (p0, effect) in enumerate(CELLS):
        a, (b,) = simulate(np.random.default_rng([2024, i, 1]), p0, effect)
        hits = posterior = above = below = 0
        discordant = (a != b).sum(axis=(1, 2))
        for r in range(REPS):
            res = stats.paired_bootstrap(a[r], b[r], n_boot=1000, seed=r)
            hits += res.low <= effect <= res.high
            above += res.low > effect
            below += res.high < effect
            posterior += res.source == "posterior"
        a3, bs = simulate(np.random.default_rng([2024, i, 3]), p0, effect, runs=RUNS, tau=TAU)
        regime_discordant = sum((a3 != b).sum(axis=(1, 2)) for b in bs)
        regime_hits = conditional = 0
        for r in range(REPS):
            res = stats.regime_interval([(a3[r], b[r]) for b in bs], n_boot=1000, seed=r)
            regime_hits += res.low <= effect <= res.high
            conditional += res.conditional
        table[p0, effect] = {
            "compare": hits / REPS, "above": above / REPS, "below": below / REPS, "posterior": posterior / REPS,
            "regime": regime_hits / REPS,
            "regime_pooled": conditional / REPS, "discordant": discordant, "regime_discordant": regime_discordant,
        }
    print("\ncoverage of the true difference, 1000 datasets per cell, 25 seeds × 2 episodes (nominal 95%)")
    print(f"{'p0':>5} {'effect':>7} | {'compare':>8} {'(posterior)':>11} | {'regime, 3 runs':>14} {'(pooled)':>9} | "
          f"{'discordant pairs: mean':>22} {'≤ 5':>6} {'regime ≤ 5':>10}")
    for (p0, effect), row in table.items():
        print(f"{p0:>5} {effect:>+7.3f} | {row['compare']:>8.3f} {row['posterior']:>11.2f} | {row['regime']:>14.3f} "
              f"{row['regime_pooled']:>9.2f} | {row['discordant'].mean():>22.2f} {(row['discordant'] <= 5).mean():>6.3f} "
              f"{(row['regime_discordant'] <= 5).mean():>10.3f}")
    return table


def cell_params(skip=frozenset()):
    return [pytest.param(cell, id=f"p0={cell[0]}-effect={cell[1]:+}",
                         marks=[pytest.mark.xfail(strict=True, reason=CEILING_REASON)] if cell in CEILING else [])
            for cell in CELLS if cell not in skip]


def side_band(n: int, p: float = 0.025, mass: float = 0.997) -> tuple[float, float]:
    """The central ``mass`` of Bin(n, p) / n, exactly (log-gamma pmf): where a calibrated side's rate, p, lands
    in n simulated datasets with probability ≥ ``mass``. For n = 1000 and p = 2.5%: [1.2%, 4.1%]."""
    log_pmf = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
               + (n - i) * math.log1p(-p) for i in range(n + 1)]
    cdf = np.cumsum(np.exp(log_pmf))
    low, high = int(np.searchsorted(cdf, (1 - mass) / 2)), int(np.searchsorted(cdf, 1 - (1 - mass) / 2))
    return low / n, high / n


@pytest.mark.parametrize("cell", cell_params(skip=POSTERIOR_CELLS))
def test_compare_bootstrap_interval_covers_at_nominal_rate(coverage, cell):
    observed = coverage[cell]["compare"]
    assert 0.93 <= observed <= 0.97, f"compare bootstrap coverage {observed:.3f} at p0, effect = {cell}"


@pytest.mark.parametrize("cell", sorted(POSTERIOR_CELLS))
def test_compare_posterior_cells_miss_at_most_nominally_on_each_side(coverage, cell):
    """Where the posterior gives most intervals, each side misses at most as often as a calibrated side can
    by chance (the upper end of ``side_band``), and coverage is at least 93%."""
    row = coverage[cell]
    assert row["posterior"] >= 0.5, row["posterior"]  # the premise: mostly the posterior's interval
    upper = side_band(REPS)[1]
    assert row["above"] <= upper and row["below"] <= upper and row["compare"] >= 0.93, (cell, row)


@pytest.mark.parametrize("cell", cell_params())
def test_regime_interval_covers_at_nominal_rate(coverage, cell):
    observed = coverage[cell]["regime"]
    assert 0.93 <= observed <= 0.97, f"regime_interval coverage {observed:.3f} at p0, effect = {cell}"


def test_no_cell_undercovers(coverage):
    for cell, row in coverage.items():
        assert row["compare"] >= 0.93 and row["regime"] >= 0.93, (cell, row["compare"], row["regime"])


def test_ceiling_cells_have_too_few_discordant_pairs(coverage):
    """The xfail cells' premise: ≥ 99% of datasets have ≤ 5 discordant pairs, and an exact test cannot
    reject with ≤ 5 (p ≥ 2^(1 − 5)); the three runs of a regime together have fewer than MIN_DISCORDANT in
    ≥ 95% of datasets, so the pooled posterior gives the interval. Coverage there is above the window,
    never below it."""
    assert stats.mcnemar_exact(np.zeros((1, 5), int), np.ones((1, 5), int)).p_value == 0.0625
    for cell in CEILING:
        row = coverage[cell]
        assert (row["discordant"] <= 5).mean() >= 0.99 and row["compare"] >= 0.99
        assert (row["regime_discordant"] < stats.MIN_DISCORDANT).mean() >= 0.95 and row["regime_pooled"] >= 0.95
        assert row["regime"] > 0.97
    for cell in set(CELLS) - CEILING:  # elsewhere there is information, and coverage is in the window
        assert (coverage[cell]["discordant"] <= 5).mean() < 0.99


# --------------------------------------------------------------------------------------------------
# Headroom near the ceiling: false positives at equal true rates


HEADROOM_REPS = 600


def headroom_rates(p, k, folded=False):
    """Share of datasets (25 × 2 episodes, k samples each, greedy and sampled both at rate p) called
    "headroom" and "sampling credibly worse"."""
    rng = np.random.default_rng([7, int(p * 1000), k])
    counts = {"headroom": 0, "sampling credibly worse": 0}
    for r in range(HEADROOM_REPS):
        g = (rng.random((N_SEEDS, N_EPS)) < p).astype(np.int8)
        s = (rng.random((N_SEEDS, N_EPS, k)) < p).astype(np.int8)
        if folded:  # each sample paired with a copy of its greedy outcome, as if independent
            g, s = np.repeat(g, k, axis=1), s.reshape(N_SEEDS, -1)
        verdict = stats.headroom({"t": g}, {"t": s}, n_boot=1000, n_draws=2000, seed=r)["t"].verdict
        counts[verdict] = counts.get(verdict, 0) + 1
    return {v: counts[v] / HEADROOM_REPS for v in ("headroom", "sampling credibly worse")}


@pytest.fixture(scope="module")
def headroom_table():
    table = {(p, k): headroom_rates(p, k) for p in (0.9, 0.97, 0.99) for k in (4, 8)}
    print(f"\nheadroom verdicts at equal true rates, {HEADROOM_REPS} datasets, 25 × 2 episodes (nominal 2.5% a side)")
    print(f"{'p':>5} {'k':>2} | {'headroom':>9} {'credibly worse':>15}")
    for (p, k), row in table.items():
        print(f"{p:>5} {k:>2} | {row['headroom']:>9.3f} {row['sampling credibly worse']:>15.3f}")
    return table


def test_headroom_false_positives_stay_below_five_percent_a_side(headroom_table):
    for cell, row in headroom_table.items():
        assert row["headroom"] <= 0.05 and row["sampling credibly worse"] <= 0.05, (cell, row)


def test_pairing_each_sample_as_independent_inflates_the_false_positives():
    """The folded layout compared sample by sample (no ``samples=``) counts each greedy outcome k times."""
    row = headroom_rates(0.97, 8, folded=True)
    assert row["sampling credibly worse"] > 0.1, row


# --------------------------------------------------------------------------------------------------
# Headroom at a 90% baseline, k = 8, seed-clustered items: each side at its nominal 2.5%
#
# With no true effect, "headroom" (both intervals above 0) and "sampling credibly worse" (both below)
# must each come out in about 2.5% of datasets. Each episode's difference d_e = s̄_e − g_e pairs a 0/1
# greedy outcome with a mean of k samples, so at p0 = 0.9 it is strongly right-skewed (rare large d when
# greedy fails, frequent small negative d), which pushes first-order intervals below 0 too often and
# above it too rarely (stats.paired_bootstrap and stats.bayes_paired_interval, "Skewness").
#
# Tolerance: over R datasets a calibrated side's count is Bin(R, 0.025); side_band(R) is its central 99.7%
# (R = 1600: [1.44%, 3.75%], 23 to 60 datasets; standard error 0.39 points). Where a side must be nominal its rate must lie in
# the band; where an interval is conservative by design (the posterior's prior and design-effect floor
# at 25 × 4, as at p0 = 0.5 where d is symmetric) each side must stay below the band's top and the two
# sides must agree: under equal rates b and w the difference of the two shares of one multinomial has
# variance (b + w − (b − w)²)/R ≈ (b + w)/R, so |b̂ − ŵ| ≤ 3·√((b̂ + ŵ)/R).
#
# Measured (R = 1600, these seeds), % better / % worse, before → after (expanded BCa bootstrap, matching
# factor in the posterior):
#   25 × 4   verdict 0.9/1.7 → 1.0/1.1   bootstrap 0.9/2.9 → 1.5/1.7   posterior 1.0/1.7 → 1.1/1.1
#   100 × 1  verdict 1.5/2.4 → 1.8/1.8   bootstrap 1.6/3.6 → 2.6/2.4   posterior 1.7/2.4 → 1.9/1.8

HR_P0, HR_K, HR_SIGMA_SEED, HR_SIGMA_ITEM, HR_REPS = 0.9, 8, 0.5, 0.5, 1600
#: Finding 2's layout (two headroom tasks × 2 episodes per seed, 25 seeds), and a design with enough
#: clusters and greedy failures for every interval to be nominal.
HR_DESIGNS = {"25x4": (25, 4), "100x1": (100, 1)}
HR_SIDES = ("headroom", "sampling credibly worse")


def simulate_headroom(rng, n_seeds, n_eps):
    """Greedy outcomes g [R, S, E] and sampled s [R, S, E, k] with no true effect.

    Each episode plays its own item, whose success probability under sampling is p_e = expit(β + u_s + v_e):
    u_s ~ N(0, 0.5²) shared by the seed's episodes, v_e ~ N(0, 0.5²) the item's own, β solved so that
    E[p_e] = p0 exactly. Sampled: k independent Bernoulli(p_e). Greedy decoding is deterministic given the
    item, so its outcome is a fixed 0/1 per item; across items it succeeds with probability p_e, as one
    sample does. No true effect means E[g_e | p_e] = E[s̄_e | p_e] = p_e, modelled as g_e ~ Bernoulli(p_e),
    independent of the samples given p_e. (A greedy outcome that depends on p_e otherwise, such as
    1{p_e > ½}, is a real difference, not a null.)
    """
    beta = solve(HR_P0, math.hypot(HR_SIGMA_SEED, HR_SIGMA_ITEM))
    u = rng.normal(0.0, HR_SIGMA_SEED, (HR_REPS, n_seeds, 1))
    v = rng.normal(0.0, HR_SIGMA_ITEM, (HR_REPS, n_seeds, n_eps))
    p = expit(beta + u + v)
    g = (rng.random((HR_REPS, n_seeds, n_eps)) < p).astype(np.int8)
    s = (rng.random((HR_REPS, n_seeds, n_eps, HR_K)) < p[..., None]).astype(np.int8)
    return g, s


@pytest.fixture(scope="module")
def headroom_sides():
    """Per design: the share of datasets on each side (better, worse) for the verdict, the bootstrap
    interval alone and the posterior alone."""
    table = {}
    for name, (n_seeds, n_eps) in HR_DESIGNS.items():
        g, s = simulate_headroom(np.random.default_rng([90, n_seeds, n_eps]), n_seeds, n_eps)
        counts = np.zeros((3, 2))
        for r in range(HR_REPS):
            comp = stats.headroom({"t": g[r]}, {"t": s[r]}, n_boot=1000, n_draws=2000, seed=r)["t"]
            boot, bayes = comp.comparison.bootstrap, comp.comparison.bayes
            counts += [[comp.verdict == HR_SIDES[0], comp.verdict == HR_SIDES[1]],
                       [boot.low > 0, boot.high < 0], [bayes.low > 0, bayes.high < 0]]
        table[name] = dict(zip(("verdict", "bootstrap", "posterior"), counts / HR_REPS))
    band = side_band(HR_REPS)
    print(f"\nno true effect, p0 = {HR_P0}, k = {HR_K}, {HR_REPS} datasets: share better / worse "
          f"(nominal 2.5% a side; band {band[0]:.2%}–{band[1]:.2%})")
    for name, row in table.items():
        print(f"{name:>6} | " + " | ".join(f"{what} {b:.3f} / {w:.3f}" for what, (b, w) in row.items()))
    return table


def test_headroom_simulation_truth_is_exact():
    beta = solve(HR_P0, math.hypot(HR_SIGMA_SEED, HR_SIGMA_ITEM))
    assert population_rate(beta, math.hypot(HR_SIGMA_SEED, HR_SIGMA_ITEM)) == pytest.approx(HR_P0, abs=1e-12)
    assert side_band(1600) == (23 / 1600, 60 / 1600) and side_band(1000) == (0.012, 0.041)


@pytest.mark.parametrize("design", list(HR_DESIGNS))
def test_headroom_no_side_fires_above_its_nominal_rate(headroom_sides, design):
    """Verdict, bootstrap and posterior: no side above the band's top (a false "headroom" or "sampling
    credibly worse" more often than a calibrated side can show by chance)."""
    high = side_band(HR_REPS)[1]
    for what, (better, worse) in headroom_sides[design].items():
        assert better <= high and worse <= high, (design, what, better, worse)


@pytest.mark.parametrize("design", list(HR_DESIGNS))
def test_headroom_sides_agree(headroom_sides, design):
    """Verdict, bootstrap and posterior: the two sides fire equally often, within binomial error. The
    expanded percentile bootstrap, before BCa, failed this in both designs (below 0 about 2.5 times as
    often as above)."""
    for what, (better, worse) in headroom_sides[design].items():
        assert abs(better - worse) <= 3 * math.sqrt((better + worse) / HR_REPS), (design, what, better, worse)


def test_headroom_each_side_is_nominal_with_enough_clusters(headroom_sides):
    """100 seeds × 1 episode: verdict, bootstrap and posterior, each side inside the band. (At 25 × 4 the
    posterior, and so the verdict, and the bootstrap's max(V̂_clu, V̂_iid) are conservative on both sides,
    as at p0 = 0.5 where d is symmetric; the two tests above hold there.)"""
    low, high = side_band(HR_REPS)
    for what, (better, worse) in headroom_sides["100x1"].items():
        assert low <= better <= high and low <= worse <= high, (what, better, worse)
