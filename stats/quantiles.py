"""Quantiles the intervals read: the two-sided normal z, Student's t CDF and quantile in closed form
(Abramowitz & Stegun 1964, §26.7), the expanded percentile tail Φ(−t_df((1 + level)/2)) of a bootstrap
distribution (Hesterberg 2015, §5), and the equal-tailed percentile interval of a set of draws.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def _percentile(draws: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def t_cdf(t: float, df: int) -> float:
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


def t_quantile(p: float, df: int | None) -> float:
    """Student-t quantile (df = None: the normal one), by bisection on :func:`t_cdf`."""
    if df is None:
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    hi = 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2


def expanded_tail(level: float, df: int | None) -> float:
    """Lower percentile Φ(−t_df((1 + level)/2)) of the expanded percentile interval (Hesterberg 2015).

    A normal statistic whose variance is estimated on df degrees of freedom needs t_df, not z,
    multiples of its standard error: reading the bootstrap distribution at these percentiles does
    that. df = None gives the plain (1 − level)/2.
    """
    return NormalDist().cdf(-t_quantile((1 + level) / 2, df))
