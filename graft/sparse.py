"""Element-level grafts: only the fraction F of the delta's entries that moved the most.

θ = θ_base + α · M ⊙ (θ_rl − θ_base), M the ⌈F·n⌉ entries of largest |Δ| among the n entries of the tensors the
graft selects — counted per tensor (``scope="tensor"``: each tensor keeps its own top fraction) or over all of
them together (``"global"``: a tensor that moved more keeps more). Entries outside M keep the graft's neutral
coefficient (base's value in a forward graft, RL's in a reverse one).

The selection is exact and depends on the two checkpoints and F alone:

- the ranking key of an entry is |θ_rl − θ_base| computed in float32 (float64 for float64 tensors, then rounded
  to float32), read as its IEEE-754 bit pattern: an int32 whose order is the order of the non-negative floats;
- exactly k = ⌈F·n⌉ entries are selected: every key above the k-th largest, and of the keys equal to it as many
  as k needs, in flat (row-major) order, tensor by tensor in the checkpoint's order;
- at α = 1 a selected entry is RL's value bit for bit and an unselected one base's, so F = 1 is the whole graft.

Memory stays bounded by one tensor: the global threshold comes from two histogram passes over the keys (their
high 16 bits, then the low 16 bits of the bin the threshold falls in), one tensor's delta at a time. A tensor's own
threshold is ranked among its keys at or above a bound :data:`SAMPLE` of its keys place (:func:`_bound`); should
the bound prove too high, its two histogram passes give it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..core.errors import GraftkitError

if TYPE_CHECKING:
    import numpy as np
    import torch

SCOPES = ("tensor", "global")
#: How an entry's movement is ranked (recorded with every top-fraction graft).
RANKING = ("|θ_rl − θ_base| in float32 (float64 tensors: float64, rounded to float32); ties at the threshold "
           "taken in flat row-major order, tensor by tensor in the checkpoint's order")
_FINITE = 0x7F800000  # the bit pattern of +inf: every finite non-negative float32 lies below it
_BINS = 1 << 16


@dataclass(frozen=True)
class Cut:
    """Which entries of one tensor a top-fraction graft moves: every entry whose key exceeds ``threshold``, and
    the first ``ties`` entries (flat order) whose key equals it."""

    threshold: int
    ties: int
    selected: int
    """Entries selected (k of this tensor)."""
    changed: int
    """Selected entries whose delta is not zero (the rest change nothing)."""

    @property
    def value(self) -> float:
        """The threshold as the float32 |Δ| it encodes."""
        import struct

        return struct.unpack("<f", struct.pack("<i", self.threshold))[0]


def delta_key(base: torch.Tensor, rl: torch.Tensor, name: str = "") -> torch.Tensor:
    """The ranking key of every entry, flat: |Δ| as float32 bits (see the module docstring)."""
    import torch

    if not base.dtype.is_floating_point:
        raise _not_float(name, base.dtype)
    work = torch.float64 if torch.float64 in (base.dtype, rl.dtype) else torch.float32
    d = (rl.to(work) - base.to(work)).abs_().to(torch.float32).reshape(-1)
    key = d.view(torch.int32)
    if key.numel() and int(key.max()) >= _FINITE:  # one reduction; the count only to name it
        raise _not_finite(name, int((key >= _FINITE).sum()), key.numel())
    return key


def _not_float(name: str, dtype) -> GraftkitError:
    return GraftkitError(f"tensor {name} holds {dtype} values, which --top-frac cannot rank by |Δ|",
                         "leave its group out of --groups, or graft it whole without --top-frac")


def _not_finite(name: str, bad: int, n: int) -> GraftkitError:
    return GraftkitError(f"tensor {name}: the delta is not finite at {bad} of {n} entries",
                         "--top-frac ranks finite deltas only: check the checkpoints (graftkit delta counts "
                         "n_nonfinite), or leave that tensor's group out")


def mask_of(key: torch.Tensor, cut: Cut) -> torch.Tensor:
    """The flat boolean mask ``cut`` selects over ``key``."""
    m = key > cut.threshold
    if cut.ties:  # the first ``ties`` entries at the threshold, in flat order
        m[(key == cut.threshold).nonzero().flatten()[:cut.ties]] = True
    return m


def top_fraction(keys: Callable[[str], "torch.Tensor"], sizes: Mapping[str, int], frac: float,
                 scope: str = "tensor") -> dict[str, Cut]:
    """The cut of every tensor of ``sizes`` (name → entries, in checkpoint order) for the top ``frac`` of the
    entries by key, per tensor or over all of them; ``keys(name)`` gives a tensor's flat keys (:func:`delta_key`)."""
    check_fraction(frac, scope)
    names = list(sizes)
    if scope == "tensor":
        return {n: _tensor_cut(keys(n), math.ceil(frac * sizes[n]), n) for n in names}
    return _cuts(keys, names, math.ceil(frac * sum(sizes.values())))


def _tensor_cut(key: torch.Tensor, k: int, name: str) -> Cut:
    """:func:`_cuts` of one tensor's flat keys, found among the keys at or above a sampled bound
    (:func:`_bound`); the whole tensor's histograms when the bound proves too high."""
    flat = key.numpy()
    positions = sample_positions(flat.size)
    vals = flat[flat >= _bound(flat if positions is None else flat[positions], k, flat.size)]
    return _cuts(lambda _n: key, [name], k)[name] if vals.size < k else _cut_among(vals, k)[0]


def check_fraction(frac: float, scope: str) -> None:
    if not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        raise GraftkitError(f"--top-frac {frac} is not a fraction in (0, 1]",
                            "pass e.g. --top-frac 0.01 for the 1% of entries that moved the most")
    if scope not in SCOPES:
        raise GraftkitError(f"--top-scope {scope!r} is not one of {', '.join(SCOPES)}",
                            "tensor: each tensor's own top fraction; global: the top fraction of all entries")


def _cuts(keys: Callable[[str], "torch.Tensor"], names: Sequence[str], k: int) -> dict[str, Cut]:
    """The cuts of ``names`` that select exactly the ``k`` largest keys over all of them (two passes)."""
    import torch

    hist = torch.zeros(_BINS, dtype=torch.int64)
    for n in names:  # pass 1: the high 16 bits
        hist += torch.bincount(keys(n) >> 16, minlength=_BINS)
    b, above_bin = _boundary(hist, k)
    lo_hist = torch.zeros(_BINS, dtype=torch.int64)
    per: dict[str, tuple[int, torch.Tensor]] = {}
    for n in names:  # pass 2: per tensor, entries above the bin, and the low bits of those in it
        key = keys(n)
        hi = key >> 16
        inside = torch.bincount(key[hi == b] & 0xFFFF, minlength=_BINS)
        per[n] = (int(torch.count_nonzero(hi > b)), inside)
        lo_hist += inside
    low, above_low = _boundary(lo_hist, k - above_bin)
    threshold, ties_left = (b << 16) | low, k - above_bin - above_low
    out = {}
    for n in names:
        over_bin, inside = per[n]
        over = over_bin + int(inside[low + 1:].sum())
        ties = min(int(inside[low]), ties_left)
        ties_left -= ties
        changed = over + ties if threshold > 0 else over
        out[n] = Cut(threshold, ties, over + ties, changed)
    return out


def _boundary(hist: torch.Tensor, k: int) -> tuple[int, int]:
    """The bin holding the k-th largest value of a histogram, and how many values lie in higher bins."""
    import torch

    desc = hist.flip(0).cumsum(0)
    i = int(torch.searchsorted(desc, torch.tensor([k], dtype=desc.dtype)))  # the first reaching k
    b = hist.numel() - 1 - i
    return b, int(desc[i] - hist[b])


def masked_value(base: torch.Tensor, rl: torch.Tensor, inside: float, outside: float, cut: Cut,
                 name: str = "") -> torch.Tensor:
    """One tensor of a top-fraction graft: coefficient ``inside`` on the entries ``cut`` selects, ``outside`` on
    the rest (θ = θ_base + c · Δ per entry; exact at c ∈ {0, 1})."""
    import torch

    from .splice import splice

    mask = mask_of(delta_key(base, rl, name), cut).reshape(base.shape)
    return torch.where(mask, splice(base, rl, inside), splice(base, rl, outside))


def tensor_top_counts(b_raw: np.ndarray, r_raws: Sequence[np.ndarray], code: str, rl_codes: Sequence[str],
                      frac: float, name: str = "") -> np.ndarray:
    """How far runs' top-``frac`` masks of one tensor coincide: ``[run, run2]`` counts of the entries both select
    (the tensor's own top fraction by |Δ|, as ``graft --top-frac`` selects it; the diagonal each run's own count).
    ``b_raw`` and ``r_raws`` are the tensor as :meth:`Checkpoint.array` gives it (the delta pass holds them), each
    upcast exactly as :func:`delta_key` upcasts, so the keys are its keys. A tensor that is not floating point or
    whose delta is not finite raises, naming it."""
    import numpy as np

    from ..weights.pair import FLOAT_CODES

    if any(c not in FLOAT_CODES for c in (code, *rl_codes)):
        raise _not_float(name, code)
    n, runs = b_raw.size, len(r_raws)
    sels = [top_indices(b_raw, r, code, c, frac, name)[1] for r, c in zip(r_raws, rl_codes)]
    counts = np.diag([float(s.size) for s in sels])
    mark = np.zeros(n, bool)  # untouched pages are never written: its cost is the selections'
    for i in range(runs):
        mark[sels[i]] = True
        for j in range(i + 1, runs):
            counts[i, j] = counts[j, i] = np.count_nonzero(mark[sels[j]])
        mark[sels[i]] = False
    return counts


def top_indices(b_raw: np.ndarray, r_raw: np.ndarray, code: str, rl_code: str, frac: float,
                name: str = "") -> tuple[Cut, np.ndarray]:
    """The cut of one tensor's top ``frac`` by |Δ| (:func:`top_fraction`'s, per tensor) and the flat indices it
    selects, ascending, from the tensor as :meth:`Checkpoint.array` gives it in base and RL (dtypes ``code`` and
    ``rl_code``).

    One pass of cache-sized chunks, with a bound below the threshold: ``|Δ|`` at :data:`SAMPLE` uniform positions
    (every entry of a smaller tensor) places it, so that the entries at or above it (≈ (F + 5√(F/SAMPLE))·n of
    them) hold the ⌈F·n⌉ largest with near certainty; the pass keeps those entries and their keys, and the cut is
    ranked among them. When the bound proves too high (fewer candidates than ⌈F·n⌉) the tensor's keys are ranked
    whole by :func:`_cuts`. Memory: the candidates (12 bytes each), or the whole keys in that fallback."""
    import numpy as np

    from ..weights.pair import upcast_code

    work = np.float64 if upcast_code(code, rl_code) == "F64" else np.float32
    flat_b, flat_r = b_raw.reshape(-1), r_raw.reshape(-1)
    n = flat_b.size
    k = math.ceil(frac * n)
    positions = sample_positions(n)
    sample = np.concatenate([x.copy() for _, x in _abs_deltas(flat_b, flat_r, code, rl_code, work, positions)])
    sample[~np.isfinite(sample)] = np.inf  # the pass names them
    bound = _bound(sample, k, n)
    idx, vals = [], []
    for i, d in _abs_deltas(flat_b, flat_r, code, rl_code, work):
        if not d.max() <= _MAX_FINITE:  # an infinite or NaN |Δ| (NaN fails every comparison)
            raise _not_finite(name, _count_not_finite(flat_b, flat_r, code, rl_code, work), n)
        hit = np.flatnonzero(d >= bound)
        idx.append(hit + i)
        vals.append(d[hit])
    idx, vals = np.concatenate(idx), np.concatenate(vals)
    if idx.size < k:  # the sample misled: rank every key
        import torch

        key = torch.from_numpy(np.concatenate([d.copy() for _, d in _abs_deltas(flat_b, flat_r, code, rl_code,
                                                                                  work)])).view(torch.int32)
        cut = _cuts(lambda _n: key, [name], k)[name]
        return cut, mask_of(key, cut).numpy().nonzero()[0]
    cut, chosen = _cut_among(vals, k)
    return cut, idx[chosen]


def _cut_among(vals: np.ndarray, k: int) -> tuple[Cut, np.ndarray]:
    """The cut selecting the ``k`` largest of ``vals`` — keys as float32 |Δ| or as their int32 bits, in flat order,
    holding every key at or above the tensor's k-th largest — and which of ``vals`` it selects: all above the
    threshold and, of those equal to it, the first."""
    import numpy as np

    thr = np.partition(vals, vals.size - k)[vals.size - k]  # the k-th largest
    chosen = vals > thr
    over = int(np.count_nonzero(chosen))
    chosen[np.flatnonzero(vals == thr)[: k - over]] = True
    threshold = int(np.asarray(thr, vals.dtype).view(np.int32))
    return Cut(threshold, k - over, k, k if threshold > 0 else over), chosen


def _bound(sample: np.ndarray, k: int, n: int):
    """A key at or below the k-th largest of an ``n``-entry tensor, with near certainty, from ``sample``: its keys
    at :func:`sample_positions` (all of them when ``n`` ≤ :data:`SAMPLE`: then the k-th largest itself). From a
    sample of s, the value at rank s·f + 5√(s·f) + 5 from the top, f = k/n: the sample's count above the threshold
    is binomial with mean ≤ s·f and standard deviation ≤ √(s·f). The smallest key (every entry a candidate) when
    that rank passes the sample's end."""
    import numpy as np

    s = sample.size
    rank = k if s == n else math.ceil(s * k / n + 5 * math.sqrt(s * k / n) + 5)
    return sample.dtype.type(0) if rank >= s else np.partition(sample, s - rank)[s - rank]


SAMPLE = 1 << 16
"""Entries of a tensor whose keys place the candidate bound of a per-tensor cut (drawn with a fixed seed)."""
_CHUNK = 1 << 16  # entries per chunk of the candidate pass: its buffers stay in the core's cache
_MAX_FINITE = 3.4028234663852886e38  # the largest float32


def _abs_deltas(flat_b: np.ndarray, flat_r: np.ndarray, code: str, rl_code: str, work,
                positions: np.ndarray | None = None):
    """(offset, |Δ| as float32) of each chunk of two flat raw tensors (or of their entries at ``positions``), Δ
    taken in ``work`` after the exact upcast (:func:`graftkit.weights.pair.exact_float`), as :func:`delta_key`
    takes it. The arrays yielded are reused from chunk to chunk."""
    import numpy as np

    from ..weights.pair import exact_float

    if positions is not None:
        flat_b, flat_r = flat_b[positions], flat_r[positions]
    m = min(_CHUNK, flat_b.size)
    b_buf, r_buf = np.empty(m, work), np.empty(m, work)
    k_buf = r_buf if work is np.float32 else np.empty(m, np.float32)
    for i in range(0, flat_b.size, _CHUNK):
        b = exact_float(flat_b[i:i + _CHUNK], code, b_buf)
        d = r_buf[:b.size]
        np.abs(np.subtract(exact_float(flat_r[i:i + _CHUNK], rl_code, r_buf), b, out=d), out=d)
        key = k_buf[:b.size]
        if key is not d:  # float64 work: |Δ| rounded to float32, as the keys are
            np.copyto(key, d, casting="same_kind")
        yield i, key


@functools.lru_cache(maxsize=16)
def sample_positions(n: int) -> np.ndarray | None:
    """Where a per-tensor cut samples an ``n``-entry tensor's keys (:func:`_bound`): ``SAMPLE`` positions drawn
    uniformly with a fixed seed, ascending (read-only, shared by the tensors of that size); None (every entry) when
    ``n`` ≤ ``SAMPLE``."""
    import numpy as np

    if n <= SAMPLE:
        return None
    out = np.sort(np.random.default_rng(0).integers(0, n, SAMPLE))
    out.flags.writeable = False
    return out


def _count_not_finite(flat_b, flat_r, code, rl_code, work) -> int:
    import numpy as np

    return sum(int(np.count_nonzero(~np.isfinite(d))) for _, d in _abs_deltas(flat_b, flat_r, code, rl_code, work))


def sparsity_summary(cuts: Mapping[str, Cut], sizes: Mapping[str, int], frac: float, scope: str) -> dict:
    """What a top-fraction graft selected, as a command reports it."""
    n = sum(sizes[k] for k in cuts)
    k = sum(c.selected for c in cuts.values())
    out = {"top_frac": frac, "scope": scope, "entries": n, "selected": k,
           "changed": sum(c.changed for c in cuts.values()), "ranking": RANKING}
    if scope == "global" and cuts:
        out["threshold"] = next(iter(cuts.values())).value  # the |Δ| every selected entry reaches
    return out


__all__ = ["Cut", "RANKING", "SCOPES", "check_fraction", "delta_key", "mask_of", "masked_value", "sparsity_summary",
           "tensor_top_counts", "top_fraction", "top_indices"]
