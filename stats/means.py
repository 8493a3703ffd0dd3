"""The mean of real-valued per-episode values, and a ratio of two sums, with a clustered bootstrap interval:
the one-sample counterpart of :func:`~graftkit.stats.paired_bootstrap` for values that are not 0/1 (a KL
divergence summed over an episode's tokens, a token count).

Notation as :mod:`graftkit.stats.pairs`: clusters s = 1..S of sizes n_s (N = Σ n_s), values x_e, cluster means
m_s, size weights w_s = S·n_s/N and the grand mean x̄ = Σ_s n_s m_s / N.

- :func:`mean_interval`   x̄ with the two-stage bootstrap of :func:`~graftkit.stats.paired_bootstrap`: clusters
  drawn with replacement, then episodes within each chosen cluster, one resample being
  θ* = x̄ + (1/S) Σ_j w_{s*_j} [c·(m_{s*_j} − x̄) + k_{s*_j}·(m*_j − m_{s*_j})], with the same variance-component
  factors (c, k) (so the bootstrap variance is max(V̂_clu, V̂_iid)) and the same expanded percentiles
  Φ(−t_df((1 + level)/2)) (Hesterberg 2015, §5). Stage two draws episode indices (the values are real, so
  there is no table of resampled sums to read). No clipping: the values have no fixed range.
- :func:`ratio_interval`  R = Σ_e a_e / Σ_e b_e (a pooled mean per token: a the episode's sum, b its token
  count) through its linearisation u_e = R + (a_e − R·b_e)/b̄, whose mean is R and whose variance is the
  ratio estimator's (Cochran 1977, ch. 6); the interval is :func:`mean_interval`'s of u, the estimate R itself.

Layouts: ``x[cluster, episode]`` (rows are the clusters) or 1-d ``x[episode]`` with ``clusters=`` (one label per
episode; clusters of any sizes), as the paired functions take. Randomness: ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import GraftkitError
from .pairs import _BLOCK_ELEMENTS, _check_count, _check_level, _label_index
from .paired import _cluster_factors
from .quantiles import expanded_tail

MEAN_METHOD = ("two-stage cluster bootstrap (clusters, then episodes within each), variance-component adjusted "
               "(c, k) with expanded percentiles (t_df tails; no BCa adjustment); real-valued episodes")
RATIO_METHOD = ("Σa/Σb through its linearisation u_e = R + (a_e − R·b_e)/mean(b) (ratio estimator, Cochran 1977 "
                "ch. 6), interval of mean(u) by " + MEAN_METHOD)


@dataclass(frozen=True)
class MeanInterval:
    """A mean (or ratio of sums) and its bootstrap interval, with what produced it."""

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int
    seed: int
    n_clusters: int
    n_episodes: int
    df: int | None
    """Degrees of freedom of the expanded percentiles (S − 1 when the clusters carry the variance, else N − 1)."""
    method: str

    @property
    def bounds(self) -> tuple[float, float, float]:
        """(estimate, low, high)."""
        return self.estimate, self.low, self.high


def _flat(x, clusters, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Values [N] float64 and cluster indices [N] from either layout."""
    arr = np.asarray(x, dtype=np.float64)
    if clusters is None:
        if arr.ndim != 2 or arr.size == 0:
            raise GraftkitError(f"{name}: expected values [cluster, episode], or 1-d values with clusters=; got shape "
                                f"{arr.shape}")
        return arr.ravel(), np.repeat(np.arange(arr.shape[0], dtype=np.int64), arr.shape[1])
    labels = np.asarray(clusters)
    if arr.ndim != 1 or arr.size == 0 or labels.shape != arr.shape:
        raise GraftkitError(f"{name} has shape {arr.shape} and clusters {labels.shape}: expected two non-empty 1-d "
                            "arrays with one cluster label per episode")
    return arr, _label_index(labels)[0]


def _interval(x: np.ndarray, cluster: np.ndarray, level: float, n_boot: int, seed: int) -> tuple[float, float, float, int | None]:
    """(x̄, low, high, df) of the two-stage bootstrap (module docstring)."""
    if not np.isfinite(x).all():
        return float(np.mean(x)), float("nan"), float("nan"), None
    n_clusters = int(cluster.max()) + 1
    sizes = np.bincount(cluster, minlength=n_clusters)
    m = np.bincount(cluster, weights=x, minlength=n_clusters) / sizes
    ss_w = np.bincount(cluster, weights=(x - m[cluster]) ** 2, minlength=n_clusters)
    c, k, df, x_bar, w = _cluster_factors(m, sizes, ss_w)
    n_max = int(sizes.max())
    order = np.argsort(cluster, kind="stable")
    start_of = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    padded = np.zeros((n_clusters, n_max))
    padded[cluster[order], np.arange(x.size) - start_of[cluster[order]]] = x[order]
    rng = np.random.default_rng(seed)
    theta = np.empty(n_boot)
    block = max(1, _BLOCK_ELEMENTS // (n_clusters * n_max))
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        pick = rng.integers(0, n_clusters, size=(rows, n_clusters))  # [boot, S] resampled clusters
        n_pick = sizes[pick]
        idx = (rng.random((rows, n_clusters, n_max)) * n_pick[..., None]).astype(np.int64)
        inside = np.arange(n_max) < n_pick[..., None]
        m_star = np.where(inside, padded[pick[..., None], idx], 0.0).sum(axis=-1) / n_pick  # [boot, S]
        m_pick = m[pick]
        theta[start : start + rows] = x_bar + (w[pick] * (c * (m_pick - x_bar) + k[pick] * (m_star - m_pick))).mean(
            axis=1)
    tail = expanded_tail(level, df)
    low, high = np.quantile(theta, [tail, 1 - tail])
    return x_bar, float(low), float(high), df


def mean_interval(x, level: float = 0.95, n_boot: int = 10_000, seed: int = 0, *, clusters=None) -> MeanInterval:
    """The mean of real-valued per-episode values ``x`` and its clustered bootstrap interval (module docstring).
    A value that is not finite makes the interval NaN (the estimate is still the mean)."""
    level, n_boot, seed = _check_level(level), _check_count(n_boot, "n_boot", 1), _check_count(seed, "seed", 0)
    values, cluster = _flat(x, clusters, "x")
    est, low, high, df = _interval(values, cluster, level, n_boot, seed)
    return MeanInterval(est, low, high, level, n_boot, seed, int(cluster.max()) + 1, values.size, df, MEAN_METHOD)


def ratio_interval(numerator, denominator, level: float = 0.95, n_boot: int = 10_000, seed: int = 0, *,
                   clusters=None) -> MeanInterval:
    """R = Σ numerator / Σ denominator (e.g. a pooled mean per token: per-episode sums over per-episode token
    counts) and its interval through the linearisation of the module docstring. NaN when Σ denominator = 0."""
    level, n_boot, seed = _check_level(level), _check_count(n_boot, "n_boot", 1), _check_count(seed, "seed", 0)
    a, cluster = _flat(numerator, clusters, "numerator")
    b, _ = _flat(denominator, clusters, "denominator")
    if a.shape != b.shape:
        raise GraftkitError(f"numerator has {a.size} episodes but denominator {b.size}: expected one of each per episode")
    n_clusters = int(cluster.max()) + 1
    if not b.sum() > 0:
        nan = float("nan")
        return MeanInterval(nan, nan, nan, level, n_boot, seed, n_clusters, a.size, None, RATIO_METHOD)
    ratio = float(a.sum() / b.sum())
    u = ratio + (a - ratio * b) / b.mean()
    _, low, high, df = _interval(u, cluster, level, n_boot, seed)
    return MeanInterval(ratio, low, high, level, n_boot, seed, n_clusters, a.size, df, RATIO_METHOD)


__all__ = ["MEAN_METHOD", "RATIO_METHOD", "MeanInterval", "mean_interval", "ratio_interval"]
