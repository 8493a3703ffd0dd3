"""One rate: the Wilson score interval of a success rate, the unbiased pass@k, and the fold of per-task
outcomes into the [seed, episode] layout the paired statistics take.

- :func:`wilson_interval`   Wilson score interval for one rate (Wilson 1927; Newcombe 1998, method 3;
  Brown, Cai & DasGupta 2001). Equals R's ``prop.test(x, n, correct = FALSE)$conf.int``.
- :func:`pass_at_k`         unbiased pass@k = 1 − C(n − c, k) / C(n, k) (Chen et al. 2021, §2.1).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GraftkitError
from .pairs import _check_count, _check_level
from .quantiles import _z
from .results import RateInterval


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
