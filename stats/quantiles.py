"""Quantiles the intervals read: the two-sided normal z, Student's t CDF and quantile in closed form
(Abramowitz & Stegun 1964, §26.7), the expanded percentile tail Φ(−t_df((1 + level)/2)) of a bootstrap
distribution (Hesterberg 2015, §5), the bias-corrected and accelerated (BCa) percentiles that read a skewed
bootstrap distribution to second order (Efron 1987; DiCiccio & Efron 1996) with their two constants — the
acceleration â of influence values and the bias correction ẑ0 of a set of draws — and the equal-tailed
percentile interval of a set of draws, plain or weighted.
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


def acceleration(u: np.ndarray) -> float:
    """BCa acceleration â = Σ_i u_i³ / (6 (Σ_i u_i²)^{3/2}) of influence values ``u`` [n] (Efron 1987, eq. 6.6;
    DiCiccio & Efron 1996, eq. 6.6), 0 when all are 0.

    For a mean of n independent units, u_i = x_i − x̄ and â = γ̂ / (6√n), γ̂ the units' plug-in skewness
    (Σu³/n) / (Σu²/n)^{3/2}. Since |γ̂| ≤ (n − 2)/√(n − 1), |â| < 1/6.
    """
    u = np.asarray(u, dtype=np.float64)
    ss = float((u * u).sum())
    return float((u**3).sum()) / (6 * ss**1.5) if ss > 0 else 0.0


def bias_correction(draws: np.ndarray, estimate: float) -> float:
    """BCa bias correction ẑ0 = Φ⁻¹(#{θ* < θ̂}/B + ½·#{θ* = θ̂}/B) of bootstrap draws θ* [B] about the
    estimate θ̂ (Efron 1987, eq. 2.8). Ties count half: resamples of outcomes that are multiples of 1/K land
    on θ̂ itself, up to rounding, so a draw within 10⁻⁹·max(|θ̂|, range of the draws) of θ̂ is a tie. The
    proportion is held inside [1/(2B), 1 − 1/(2B)], so ẑ0 is finite."""
    draws = np.asarray(draws, dtype=np.float64)
    n = draws.size
    tol = 1e-9 * max(abs(estimate), float(np.ptp(draws)))
    ties = np.abs(draws - estimate) <= tol
    share = (float((~ties & (draws < estimate)).sum()) + 0.5 * float(ties.sum())) / n
    share = min(max(share, 0.5 / n), 1 - 0.5 / n)
    return NormalDist().inv_cdf(share)


def bca_levels(tail: float, z0: float, accel: float) -> tuple[float, float]:
    """Percentiles (lower, upper) of the BCa interval whose plain percentiles would be (tail, 1 − tail)::

        α(z) = Φ(ẑ0 + (ẑ0 + z) / (1 − â(ẑ0 + z))),   z = Φ⁻¹(tail) and −Φ⁻¹(tail)

    (Efron 1987, eq. 2.3). With ``tail`` = :func:`expanded_tail` this is the expanded BCa interval (the t_df
    calibration of the expanded percentile interval carried into BCa, Hesterberg 2015 §5). ẑ0 = â = 0 gives
    (tail, 1 − tail) exactly. α(z) increases in z up to the pole at â(ẑ0 + z) = 1, where it reaches 0 or 1; a
    z beyond the pole (only with a tail far smaller than any n_boot resolves) takes that limit.
    """
    if z0 == 0.0 and accel == 0.0:
        return tail, 1.0 - tail
    z = NormalDist().inv_cdf(tail)

    def level(zq: float) -> float:
        shifted = z0 + zq
        den = 1.0 - accel * shifted
        if den <= 0.0:
            return 1.0 if shifted > 0 else 0.0
        return NormalDist().cdf(z0 + shifted / den)

    return level(z), level(-z)


def weighted_percentile(draws: np.ndarray, weights: np.ndarray, level: float) -> tuple[float, float]:
    """Equal-tailed ((1 ± level)/2) quantiles of ``draws`` [n] under ``weights`` [n] (≥ 0, not all 0): the
    weighted empirical CDF with each draw at the middle of its own weight, (W_{<i} + w_i/2)/W, interpolated
    linearly (Hazen's rule; with equal weights the positions are (i + ½)/n). Used for importance-weighted
    posterior draws."""
    order = np.argsort(draws, kind="stable")
    x, w = np.asarray(draws, dtype=np.float64)[order], np.asarray(weights, dtype=np.float64)[order]
    cum = np.cumsum(w)
    pos = (cum - w / 2) / cum[-1]
    lo, hi = np.interp([(1 - level) / 2, (1 + level) / 2], pos, x)
    return float(lo), float(hi)
