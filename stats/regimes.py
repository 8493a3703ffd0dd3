"""Regimes: the change of a regime (several RL runs from one SFT model, one per training seed) with the
training seed as a random effect.

- :func:`regime_interval`   a hierarchical bootstrap of runs, then evaluation clusters, variance-component
  adjusted at both levels (two-way clustering: Cameron, Gelbach & Miller 2011; Owen 2007), a t interval
  on Satterthwaite (1946) degrees of freedom.
- :func:`regime_tost`       the two one-sided tests of equivalence (Schuirmann 1987) on that interval.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GraftkitError
from .paired import MIN_DISCORDANT, _bootstrap, _cluster_summary, _posterior, _variances
from .pairs import _BLOCK_ELEMENTS, _as_pairs, _check_count, _check_level, _clip, _Paired
from .quantiles import t_quantile
from .results import _BAYES_METHOD, RegimeEquivalence, RegimeInterval


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
    t = t_quantile((1 + level) / 2, df) if df else 0.0
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
