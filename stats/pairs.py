"""Paired outcomes: the two layouts every paired statistic accepts, their validation, and the one flat
layout (:class:`_Paired`) the statistics compute on.

Data model: agents ``a`` and ``b`` are run on the same episodes and compared episode by episode, so every
statistic here is paired. Outcomes come in one of two layouts, accepted by every paired function:

- ``x[cluster, episode]``: a 0/1 array shaped [n_clusters, n_episodes_per_cluster] whose rows are the
  clusters (evaluation seeds; :func:`~graftkit.stats.fold_episodes` builds it from [task, seed, episode, ...]);
- ``x[episode]`` with ``clusters=labels``: 1-D 0/1 arrays and one cluster label per episode (ints or
  strings, any mix); clusters may have unequal sizes. :func:`~graftkit.stats.cluster_labels` builds labels
  that merge the evaluation seeds an item repeats across.

A cluster is the unit the intervals take as independent: episodes within one may be correlated (a seed
can favour one agent; an item seen twice is nearly the same episode). Below S is the number of clusters,
n_s the size of cluster s, N = Σ n_s, and d_e = b_e − a_e the per-episode difference, with cluster means
m_s and grand mean d̄ = Σ_s n_s m_s / N = mean(b) − mean(a). With equal sizes n_s = E every formula reduces
to the one for the rectangular layout.

Paired cells, counted over all N episodes::

    n00: both fail    n01: b succeeds, a fails    n10: a succeeds, b fails    n11: both succeed

so d̄ = (n01 − n10) / N, and the discordant pairs n01 + n10 carry all the information on the difference.

Several samples per episode (:func:`~graftkit.stats.headroom`): an agent with k samples on an episode has a
success *fraction* there, a multiple of 1/k. The episode, not the sample, stays the resampled unit, and the
Dirichlet model runs over the joint outcomes (a's successes, b's successes) of an episode.

Every interval for a difference is clipped to [−1, 1] (:func:`_clip`), the range of a difference of two
rates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import GraftkitError

#: Bound on elements per vectorised block, so memory stays flat for large n_boot × n_clusters.
_BLOCK_ELEMENTS = 1 << 22

_OUTCOMES = "a 0/1 success array shaped [n_seeds, n_episodes_per_seed]"
_LAYOUTS = f"{_OUTCOMES}, or a 1-d array of per-episode outcomes with clusters="


def _check_level(level: float) -> float:
    if not isinstance(level, (int, float, np.floating)) or not 0.0 < float(level) < 1.0:
        raise GraftkitError(
            f"level={level!r}: expected a confidence level strictly between 0 and 1", "e.g. level=0.95"
        )
    return float(level)


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise GraftkitError(f"{name}={value!r}: expected an integer ≥ {minimum}")
    return int(value)


def _zero_one(x, name: str, expected: str) -> np.ndarray:
    """``x`` as an int8 array of 0/1 (any shape, non-empty), or a GraftkitError naming ``expected``."""
    arr = np.asarray(x)
    if arr.size == 0:
        raise GraftkitError(f"{name}: expected {expected}; got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in "iuf":
            raise GraftkitError(f"{name}: expected {expected}; got dtype {arr.dtype}")
        if not np.isin(arr, (0, 1)).all():
            bad = arr[~np.isin(arr, (0, 1))].ravel()[0].item()
            raise GraftkitError(f"{name}: expected {expected}; found the value {bad!r}")
    return arr.astype(np.int8)


def _outcomes(x, name: str) -> np.ndarray:
    """``x`` as an int8 array [n_seeds, n_episodes_per_seed] of 0/1, or a GraftkitError."""
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.size == 0:
        raise GraftkitError(f"{name}: expected {_LAYOUTS}; got shape {arr.shape}")
    return _zero_one(arr, name, _OUTCOMES)


def _paired(a, b, names: tuple[str, str] = ("a", "b")) -> tuple[np.ndarray, np.ndarray]:
    a, b = _outcomes(a, names[0]), _outcomes(b, names[1])
    if a.shape != b.shape:
        raise GraftkitError(
            f"{names[0]} has shape {a.shape} but {names[1]} has {b.shape}: expected identical "
            f"[n_seeds, n_episodes_per_seed] arrays aligned episode by episode"
        )
    return a, b


@dataclass(frozen=True)
class _Paired:
    """Paired outcomes in one flat layout: episode e has a's and b's successes out of ``samples`` and a
    cluster index; every paired statistic works on this."""

    a: np.ndarray  # [N] int64, a's successes on the episode, 0..samples
    b: np.ndarray  # [N] int64
    cluster: np.ndarray  # [N] int64, 0..S − 1 in order of first appearance
    labels: tuple  # [S] the cluster labels, in that order
    samples: int = 1  # K: outcomes per episode

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.cluster, minlength=len(self.labels))

    @property
    def d(self) -> np.ndarray:
        """[N] b − a per episode, in success fraction."""
        return (self.b - self.a) / self.samples


def _label_index(labels: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Cluster index per episode (0..S − 1, in order of first appearance) and the labels in that order."""
    try:
        uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    except TypeError:  # labels of mixed types do not sort
        index: dict = {}
        idx = np.fromiter((index.setdefault(v, len(index)) for v in labels.tolist()), np.int64, labels.size)
        return idx, tuple(index)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse.ravel()].astype(np.int64), tuple(uniq[order].tolist())


def _as_pairs(a, b, clusters=None, names: tuple[str, str] = ("a", "b")) -> _Paired:
    """Either layout (2-d rows = clusters, or 1-d with ``clusters``) as :class:`_Paired`."""
    if clusters is None:
        a2, b2 = _paired(a, b, names)
        n_seeds, n_eps = a2.shape
        return _Paired(a2.ravel().astype(np.int64), b2.ravel().astype(np.int64),
                       np.repeat(np.arange(n_seeds, dtype=np.int64), n_eps), tuple(range(n_seeds)))
    labels = np.asarray(clusters)
    if labels.ndim != 1 or labels.size == 0:
        raise GraftkitError(f"clusters: expected a non-empty 1-d array of cluster labels, one per episode; got "
                            f"shape {labels.shape}")
    arrs = []
    for name, x in zip(names, (a, b)):
        arr = np.asarray(x)
        if arr.ndim != 1:
            raise GraftkitError(f"{name}: with clusters= expected a 1-d array of per-episode 0/1 outcomes; got "
                                f"shape {arr.shape}", "pass rows as clusters without clusters=, or ravel both")
        arrs.append(_zero_one(arr, name, "0/1 per-episode outcomes").astype(np.int64))
    if not arrs[0].size == arrs[1].size == labels.size:
        raise GraftkitError(f"{names[0]} has {arrs[0].size} episodes, {names[1]} {arrs[1].size} and clusters "
                            f"{labels.size}: expected one label per episode, aligned episode by episode")
    idx, uniq = _label_index(labels)
    return _Paired(arrs[0], arrs[1], idx, uniq)


def _cells(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int, int]:
    n = np.bincount((2 * a + b).ravel(), minlength=4)
    return int(n[0]), int(n[1]), int(n[2]), int(n[3])


def _four_cells(p: _Paired) -> tuple[float, float, float, float]:
    """(n00, n01, n10, n11); with K samples each episode adds (1 − a)(1 − b), (1 − a)b, a(1 − b), ab of
    its success fractions a, b (integers when K = 1)."""
    if p.samples == 1:
        return _cells(p.a, p.b)
    fa, fb = p.a / p.samples, p.b / p.samples
    return (float(((1 - fa) * (1 - fb)).sum()), float(((1 - fa) * fb).sum()), float((fa * (1 - fb)).sum()),
            float((fa * fb).sum()))


def _clip(x: float) -> float:
    """A bound of a difference of two rates, clipped to its range [−1, 1]."""
    return float(min(1.0, max(-1.0, x)))
