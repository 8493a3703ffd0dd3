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
high 16 bits, then the low 16 bits of the bin the threshold falls in), one tensor's delta at a time.
"""

from __future__ import annotations

import math
import threading
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
    bad = int((key >= _FINITE).sum())
    if bad:
        raise _not_finite(name, bad, key.numel())
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
        out = {}
        for n in names:
            key = keys(n)
            out.update(_cuts(lambda _n, key=key: key, [n], math.ceil(frac * sizes[n])))
        return out
    return _cuts(keys, names, math.ceil(frac * sum(sizes.values())))


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


def _tensor_cut(key: torch.Tensor, k: int, name: str, hi: torch.Tensor | None = None,
                inbin: torch.Tensor | None = None) -> tuple[Cut, int]:
    """:func:`_cuts` of one tensor's keys (the same cut), and how many keys equal its threshold: the count above the
    boundary bin comes from the histogram, and the boundary bin's few keys are ranked by sorting them. A key that is
    not finite raises, naming the tensor. ``hi`` and ``inbin``: buffers of the key's size for the work."""
    import torch

    hi = torch.bitwise_right_shift(key, 16, out=hi) if hi is not None else key >> 16
    hist = torch.bincount(hi, minlength=_BINS)
    bad = int(hist[_FINITE >> 16:].sum())
    if bad:
        raise _not_finite(name, bad, key.numel())
    b, above_bin = _boundary(hist, k)
    low = (key[torch.eq(hi, b, out=inbin) if inbin is not None else hi == b] & 0xFFFF).sort(descending=True).values
    need = k - above_bin  # 1 ≤ need ≤ the bin's count
    at = int(low[need - 1])
    over = above_bin + int(torch.count_nonzero(low > at))
    threshold = (b << 16) | at
    return Cut(threshold, k - over, k, k if threshold > 0 else over), int(torch.count_nonzero(low == at))


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
    import torch

    from ..weights.pair import FLOAT_CODES, exact_float, upcast_code

    if any(c not in FLOAT_CODES for c in (code, *rl_codes)):
        raise _not_float(name, code)
    work = np.float64 if upcast_code(code, *rl_codes) == "F64" else np.float32
    flat = b_raw.reshape(-1)
    n, k = flat.size, len(r_raws)
    same = work is np.float32 and code == "F32"  # stored as the keys' dtype: no upcast copy
    # the thread's scratch buffers, reused from tensor to tensor (the pass's largest tensor bounds them): fresh
    # whole-tensor arrays would cost a page fault per page of every one
    b = flat if same else exact_float(flat, code, _scratch("b", n, torch.float64 if work is np.float64
                                                             else torch.float32).numpy())
    d = _scratch("d", n, torch.float64 if work is np.float64 else torch.float32).numpy()
    hi, inbin = _scratch("hi", n, torch.int32), _scratch("inbin", n, torch.bool)
    masks, counts = [], np.zeros((k, k))
    for i, (r_raw, c) in enumerate(zip(r_raws, rl_codes)):
        r = r_raw.reshape(-1)
        np.abs(np.subtract(r if same and c == "F32" else exact_float(r, c, d), b, out=d), out=d)
        key = torch.from_numpy(d.astype(np.float32) if work is np.float64 else d).view(torch.int32)
        cut, at_threshold = _tensor_cut(key, math.ceil(frac * n), name, hi, inbin)
        # every entry at the threshold selected (the usual case): one comparison is the mask
        mask = _scratch(f"mask{i}", n, torch.bool)
        masks.append(torch.ge(key, cut.threshold, out=mask) if cut.ties == at_threshold else mask_of(key, cut))
        counts[i, i] = cut.selected
    both = _scratch("both", n, torch.bool)
    for i in range(k):
        for j in range(i + 1, k):
            counts[i, j] = counts[j, i] = int(torch.count_nonzero(torch.logical_and(masks[i], masks[j], out=both)))
    return counts


_SCRATCH = threading.local()


def _scratch(name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's buffer ``name`` of at least ``n`` entries of ``dtype``, its first ``n``."""
    import torch

    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.dtype != dtype or buf.numel() < n:
        buf = torch.empty(n, dtype=dtype)
        setattr(_SCRATCH, name, buf)
    return buf[:n]


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
           "tensor_top_counts", "top_fraction"]
