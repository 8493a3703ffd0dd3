"""Clusters of episodes: the connected components of episodes linked by a shared evaluation seed or item
(union–find; Tarjan 1975), the ``clusters=`` labels of the paired statistics.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GraftkitError
from .pairs import _label_index


def cluster_labels(seed_ids, item_ids) -> np.ndarray:
    """Cluster index per episode: the connected component of the graph on episodes in which two episodes
    are linked when they share an evaluation seed OR an item.

    Episodes of one seed are correlated (the seed draws the environment), and so are two episodes of one
    item, whatever their seeds: an item repeated across seeds therefore merges those seeds into one
    cluster, transitively (seeds 1 and 2 share item x, seeds 2 and 3 share item y: one cluster {1, 2, 3}).
    The components are those of the bipartite graph seed — item with one edge per episode, found by
    union–find (union by size, path halving; Tarjan 1975). Labels are 0, 1, … in order of each
    component's first episode; with no item repeated across seeds they are the seeds, relabelled.

    ``seed_ids`` and ``item_ids`` are 1-d, one entry per episode (ints or strings). The result is the
    ``clusters=`` argument of the paired functions.
    """
    seeds, items = np.asarray(seed_ids), np.asarray(item_ids)
    if seeds.ndim != 1 or items.ndim != 1 or seeds.size != items.size or seeds.size == 0:
        raise GraftkitError(
            f"seed_ids has shape {seeds.shape} and item_ids {items.shape}: expected two non-empty 1-d arrays "
            f"with one entry per episode"
        )
    s_idx, s_labels = _label_index(seeds)
    i_idx, _ = _label_index(items)
    n_seeds = len(s_labels)
    parent = list(range(n_seeds + int(i_idx.max()) + 1))
    size = [1] * len(parent)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s, i in zip(s_idx.tolist(), (i_idx + n_seeds).tolist()):
        rs, ri = find(s), find(i)
        if rs != ri:
            if size[rs] < size[ri]:
                rs, ri = ri, rs
            parent[ri] = rs
            size[rs] += size[ri]
    root = np.array([find(s) for s in range(n_seeds)])
    return _label_index(root[s_idx])[0]
