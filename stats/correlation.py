"""Correlation of paired samples: Pearson, or Spearman (average ranks for ties; Spearman 1904), with a
pairs-bootstrap percentile interval (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GraftkitError
from .pairs import _BLOCK_ELEMENTS, _check_count, _check_level
from .quantiles import _percentile
from .results import CorrelationInterval


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
