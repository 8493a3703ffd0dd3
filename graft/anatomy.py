"""Delta anatomy: where an RL fine-tune moved the weights, per tensor, layer and group.

For base W and RL W' with Δ = W' − W (both upcast to float32 before subtracting, float64 when either is
float64; base and RL may store a tensor in different floating dtypes, e.g. a bfloat16 SFT base and a
float32 checkpoint of another trainer: the upcast is exact, and one note per dtype pair says so):

- ``fro_delta``      ‖Δ‖_F
- ``rel_delta``      ‖Δ‖_F / ‖W‖_F
- ``share``          ‖Δ‖²_F / Σ_all-tensors ‖Δ‖²_F, the fraction of the run's total squared movement
- ``max_abs_delta``  max |Δ|
- ``frac_unchanged`` fraction of entries whose bits are identical in W and W' (stored in different dtypes:
  identical after the exact upcast, i.e. equal values)
- ``frac_within_tol`` fraction with |Δ| ≤ atol + rtol·|W| entrywise (numpy.isclose's convention: ``tol`` is atol,
  default 1e-5, ``rtol`` default 0; both are recorded with the result, in ``attrs["conventions"]``)
- ``cosine``         ⟨Δ_a, Δ_b⟩ / (‖Δ_a‖ ‖Δ_b‖) between two runs' deltas (same base)

Where ‖Δ‖ = 0 a ratio over it has no value, and each says so rather than drawing one: ``share`` is 0 (the run
moved nothing), ``cosine`` is NaN (undefined; null in JSON), ``round_to_delta_bf16`` ∞ where bf16 would round the
unmoved tensor and 0 where it would not. A run bit-identical to its base (every entry unchanged: a trainer's
checkpoint after steps with zero reward) is stated in one line (``attrs["identical"]``,
:meth:`DeltaResult.identical`), not drawn as a table of zeros.

``graftkit delta`` is :class:`DeltaConfig` + :func:`run_delta`; readers go through :class:`DeltaResult`, and
tables and figures name each metric through :data:`LABELS` (header, axis title, unit).

Is RL a fine-tune of this base at all? The same pass sums ⟨W, Δ⟩ per tensor (``dot_base_delta``), which
with ‖W‖² and ‖Δ‖² gives ρ = ‖Δ‖/‖W‖ and cos(W, W') of every 2-D matrix (:class:`graftkit.weights.PairDistance`);
a pair that :data:`graftkit.weights.FINE_TUNE_RULE` calls implausible is refused after the pass unless
``force_pair`` (no second read of the checkpoints). The figures are in ``attrs["fine_tune"]``.

Aggregates over a set of tensors (a group, a layer, a layer × group cell) are computed from sums, never
by averaging ratios: ‖Δ‖_F = √Σ‖Δ_t‖², rel = √(Σ‖Δ_t‖² / Σ‖W_t‖²), fractions weighted by entry count,
cosine = Σ⟨Δ_a,Δ_b⟩ / √(Σ‖Δ_a‖² Σ‖Δ_b‖²). Entries where Δ is NaN or ±Inf are counted in
``n_nonfinite`` and left out of every other statistic, so a broken tensor is reported, never hidden.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..core.config import OnProgress, RunOption, no_progress, opt
from ..core.errors import GraftkitError
from ..results.layout import DELTA
from ..results.store import Result, View
from ..weights import Checkpoint, PairDistance, Taxonomy, check_pair, judge_pair, pair_distance
from ..weights.pair import (FLOAT_CODES as _FLOATS, blocked_dot as _dot, exact_float as _to_float, judged_matrices,
                            upcast_code)
from ..weights.commands import ReadOptions
from ..weights.taxonomy import DECODER
from .sparse import tensor_top_counts

#: Per tensor and run: the sums every aggregate is built from.
SUMS = ("sumsq_delta", "max_abs_delta", "n_unchanged", "n_within_tol", "n_nonfinite", "dot_base_delta",
        "n_erased_bf16", "sumsq_round_bf16")

#: The storage precision every delta is measured against: bfloat16, in which RL checkpoints are published and
#: converters (verl's merger, a Trainer's ``model.safetensors``) write them. For an RL side read above it (float32
#: master weights, an fp32 export), exactly: ``n_erased_bf16`` counts the entries that moved but whose bf16 roundings
#: equal base's, ``sumsq_round_bf16`` is ‖bf16(W') − W'‖². For an RL side stored in bf16 (rounded already) only a
#: bound is known: ``sumsq_round_bf16`` is Σ (u/2)² over its entries, u each value's bf16 spacing (a rounding moves
#: a value by at most u/2; an update much smaller than u is rounded away whole, so no finer estimate holds), and the
#: erased count is unknown (NaN).
PROBE = "bf16"
#: The masks whose overlap between runs a delta measures: the entries each moved (Δ ≠ 0 as stored, after the exact
#: upcast), the entries bf16 copies of both sides would show moved, and each tensor's top fraction by |Δ| (the
#: entries ``graft --top-frac`` would move; ``attrs["overlap_top_frac"]``).
MASKS = ("moved", "moved_bf16", "top")
#: What two runs' moved-entry masks would share by chance (the overlap's baseline).
OVERLAP_CHANCE = ("independent masks of each tensor's own sizes, each placed uniformly in that tensor: "
                  "E|A∩B| = Σ_t a_t b_t / n_t and Var|A∩B| = Σ_t a_t b_t (n_t − a_t)(n_t − b_t) / (n_t² (n_t − 1)) "
                  "(hypergeometric, exact); Jaccard |A∩B| / (|A| + |B| − |A∩B|) at E and at the 95% interval "
                  "E ± 1.96·√Var (normal approximation, clipped to the possible overlaps)")
#: (bf16 spacing / 2)² per exponent field (subnormals share exponent 1's spacing; Inf/NaN count nothing)
_ROUND_BOUND_BF16 = np.array([2.0 ** (2 * (max(e, 1) - 127 - 7 - 1)) if e < 255 else 0.0 for e in range(256)])


def round_bf16_bits(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16 (nearest, ties to even, as torch's ``.to(torch.bfloat16)``), as float32 bit
    patterns in the uint32 ``out``."""
    u = x.view(np.uint32)
    np.right_shift(u, 16, out=out)
    np.bitwise_and(out, 1, out=out)
    np.add(out, 0x7FFF, out=out)
    np.add(out, u, out=out)
    np.bitwise_and(out, np.uint32(0xFFFF0000), out=out)
    return out


STATS_CHUNK = 1 << 18  # 256K entries: 1 MB of float32, cache-resident through every pass


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.itemsize}") if x.dtype.kind != "b" else x.view(np.uint8)


def tensor_delta_stats(
    base, rls: Sequence, tol: float, chunk: int = STATS_CHUNK, code: str | None = None,
    rl_codes: Sequence[str] | None = None, rtol: float = 0.0, both: np.ndarray | None = None,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Statistics of Δ_r = rls[r] − base for one tensor.

    ``base`` and ``rls`` are numpy arrays typed as :meth:`Checkpoint.array` gives them, with the
    tensor's safetensors dtype ``code`` in base and ``rl_codes[r]`` in each RL run (default: ``code``;
    or torch tensors, whose codes are read off them). Every side is upcast exactly to float32 (float64
    when one is float64) before subtracting. Returns ``(sumsq_base, sums[r, SUMS], dots[r, s])`` with
    ``dots[r, s] = ⟨Δ_r, Δ_s⟩`` over finite entries; ``n_unchanged`` compares stored bits, or for a run
    stored in another dtype the bits after the upcast (equal values); ``n_erased_bf16`` and ``sumsq_round_bf16``
    are the bf16 probe (:data:`PROBE`); ``n_within_tol`` counts the finite entries with |Δ| ≤ tol + rtol·|W|
    (``numpy.isclose(W', W, rtol, tol)`` on the upcast values). With ``both`` [run, run, 2] the moved-entry masks'
    overlaps are added to it: ``both[r, s, 0]`` counts the entries Δ_r and Δ_s both moved (finite, nonzero),
    ``both[r, s, 1]`` those both would show moved as bf16 copies store them (bf16(W'_r) ≠ bf16(W) for each; a
    non-float tensor: as [..., 0]); the diagonal is each run's own count.
    Works through the flattened tensor in chunks, so memory stays bounded. The reductions run in numpy
    (single-threaded SIMD; torch's bool reductions are far slower on a shared CPU); dot products
    accumulate in float32 over blocks of 1024 entries and in float64 across blocks.
    """
    if code is None:  # torch tensors
        from ..weights import code_of, tensor_bits

        code, rl_codes = code_of(base.dtype), [code_of(r.dtype) for r in rls]
        base, rls = tensor_bits(base), [tensor_bits(r) for r in rls]
    rl_codes = [code] * len(rls) if rl_codes is None else list(rl_codes)
    k = len(rls)
    sums = np.zeros((k, len(SUMS)))
    dots = np.zeros((k, k))
    sumsq_base = 0.0
    # integers of 32 and 64 bits are exact only in float64
    exact64 = ("F64", "I64", "U64", "I32", "U32")
    work = np.float64 if code in exact64 or upcast_code(code, *rl_codes) == "F64" else np.float32
    flat_b = base.reshape(-1)
    flat_r = [r.reshape(-1) for r in rls]
    m = min(chunk, flat_b.size)
    b_buf, r_buf, a_buf = (np.empty(m, work) for _ in range(3))
    d_buf = np.empty((k, m), work)
    mask = np.empty(m, bool)
    t_buf = np.empty(m, work) if rtol else None  # atol + rtol·|W| per entry
    # the bf16 probe: exact where a run is stored above bf16, bounded where it is bf16
    floats = code in _FLOATS and all(c in _FLOATS for c in rl_codes)
    exact = [floats and c != "BF16" for c in rl_codes]
    if floats and not all(exact):
        sums[[r for r in range(k) if not exact[r]], 6] = np.nan
    rounds = any(exact) or (both is not None and floats)  # base's bf16 rounding is needed
    if rounds:
        bb_buf, rb_buf = np.empty(m, np.uint32), np.empty(m, np.uint32)
        e_buf, same_round, moved = np.empty(m, np.float32), np.empty(m, bool), np.empty(m, bool)
    if both is not None:
        mv, mvb = np.empty((k, m), bool), np.empty((k, m), bool)
    for i in range(0, flat_b.size, chunk):
        b_raw = flat_b[i : i + chunk]
        n = b_raw.size
        b = _to_float(b_raw, code, b_buf)
        b_bits = _bits(b_raw)
        sb = _dot(b, b)
        b_nonfinite = not np.isfinite(sb)
        if b_nonfinite:
            finite_b = np.where(np.isfinite(b), b, 0.0)
            sb = _dot(finite_b, finite_b)
        sumsq_base += sb
        if rtol:  # numpy.isclose's right side, in its order: atol + rtol·|W|
            thr = np.abs(b, out=t_buf[:n])
            np.multiply(thr, rtol, out=thr)
            np.add(thr, tol, out=thr)
            if b_nonfinite:  # a non-finite W makes Δ non-finite: counted in n_nonfinite, not here
                thr[~np.isfinite(thr)] = np.inf
        else:
            thr = tol
        if rounds:
            b_round = round_bf16_bits(b if work is np.float32 else b.astype(np.float32), bb_buf[:n])
        for r, fr in enumerate(flat_r):
            r_raw = fr[i : i + chunk]
            r_val = _to_float(r_raw, rl_codes[r], r_buf)
            if exact[r]:
                r32 = r_val if work is np.float32 else r_val.astype(np.float32)
                r_round = round_bf16_bits(r32, rb_buf[:n])
                with np.errstate(invalid="ignore"):  # inf − inf where RL is ±Inf: counted in n_nonfinite, zeroed below
                    e = np.subtract(r_round.view(np.float32), r32, out=e_buf[:n])
                se = _dot(e, e)
                if not np.isfinite(se):
                    e[~np.isfinite(e)] = 0.0
                    se = _dot(e, e)
                sums[r, 7] += se
                np.equal(r_round, b_round, out=same_round[:n])
            elif floats:  # stored in bf16: a bound on the rounding it went through
                sums[r, 7] += float(np.bincount(np.right_shift(r_raw, 7) & 0xFF, minlength=256) @ _ROUND_BOUND_BF16)
                if both is not None:  # its values are bf16 already: rounding keeps them
                    r32 = r_val if work is np.float32 else r_val.astype(np.float32)
                    np.equal(round_bf16_bits(r32, rb_buf[:n]), b_round, out=same_round[:n])
            if rl_codes[r] != code:  # bits of the upcast values; r_buf is reused by the next run
                sums[r, 2] += np.count_nonzero(np.equal(_bits(b), _bits(r_val), out=mask[:n]))
            d = np.subtract(r_val, b, out=d_buf[r, :n])
            ss = _dot(d, d)
            bad = 0
            if not np.isfinite(ss):
                finite = np.isfinite(d)
                bad = int(n - np.count_nonzero(finite))
                d[~finite] = 0.0
                ss = _dot(d, d)
            if both is not None:  # moved (finite, nonzero); and still moved once both sides are rounded to bf16
                np.not_equal(d, 0, out=mv[r, :n])
                if floats:
                    np.logical_and(mv[r, :n], np.logical_not(same_round[:n], out=mvb[r, :n]), out=mvb[r, :n])
                else:
                    mvb[r, :n] = mv[r, :n]
            if exact[r]:  # moved (finite, nonzero) and equal once both sides are rounded to bf16
                np.not_equal(d, 0, out=moved[:n])
                sums[r, 6] += np.count_nonzero(np.logical_and(same_round[:n], moved[:n], out=moved[:n]))
            a = np.abs(d, out=a_buf[:n])
            sums[r, 0] += ss
            if n:
                sums[r, 1] = max(sums[r, 1], float(a.max()))
            if rl_codes[r] == code:
                sums[r, 2] += np.count_nonzero(np.equal(b_bits, _bits(r_raw), out=mask[:n]))
            bd = _dot(b, d)
            if not np.isfinite(bd):  # d's non-finite entries are zero by now: b's remain
                bd = _dot(np.where(np.isfinite(b), b, 0.0), d)
            sums[r, 5] += bd
            sums[r, 3] += np.count_nonzero(np.less_equal(a, thr, out=mask[:n])) - bad
            sums[r, 4] += bad
        for r in range(k):
            dots[r, r] = sums[r, 0]
            for s in range(r + 1, k):
                v = _dot(d_buf[r, :n], d_buf[s, :n])
                dots[r, s] += v
                dots[s, r] += v
        if both is not None:
            for r in range(k):
                for s in range(r, k):
                    for j, masks in enumerate((mv, mvb)):
                        c = np.count_nonzero(masks[r, :n] & masks[s, :n]) if s != r else np.count_nonzero(masks[r, :n])
                        both[r, s, j] += c
                        if s != r:
                            both[s, r, j] += c
    return sumsq_base, sums, dots


def summarise(
    sumsq_base: np.ndarray, numel: np.ndarray, sums: np.ndarray, dots: np.ndarray, total_sumsq: np.ndarray
) -> dict[str, np.ndarray]:
    """Named metrics from sums over some set of tensors (the last axis of each input is that set).

    Shapes: ``sumsq_base [n]``, ``numel [n]``, ``sums [run, n, SUMS]``, ``dots [run, run, n]``,
    ``total_sumsq [run]`` (the run's movement over all tensors, for ``share``).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ssd = sums[..., 0]
        fro = np.sqrt(ssd)
        out = {
            "fro_delta": fro,
            "rel_delta": np.where(sumsq_base > 0, np.sqrt(ssd / sumsq_base), np.where(ssd > 0, np.inf, 0.0)),
            "share": np.where(total_sumsq[:, None] > 0, ssd / total_sumsq[:, None], 0.0),
            "max_abs_delta": sums[..., 1],
            "frac_unchanged": sums[..., 2] / numel,
            "frac_within_tol": sums[..., 3] / numel,
            "n_nonfinite": sums[..., 4],
        }
        norms = np.sqrt(np.einsum("rrn->rn", dots))
        denom = norms[:, None, :] * norms[None, :, :]
        out["cosine"] = np.where(denom > 0, dots / denom, np.nan)
        if sums.shape[-1] < len(SUMS):  # sums without the probe's
            return out
        # the bf16 probe (:data:`PROBE`): of the entries that moved, the share bf16 copies of both sides would show
        # unchanged; what such copies would show unchanged in all; and the rounding's norm against ‖Δ‖
        moved = numel - sums[..., 2] - sums[..., 4]
        erased = sums[..., 6]
        out["frac_erased_bf16"] = np.where(moved > 0, erased / np.where(moved > 0, moved, 1), np.where(np.isnan(erased),
                                                                                                     np.nan, 0.0))
        out["frac_unchanged_bf16"] = (sums[..., 2] + erased) / numel
        rnd = np.sqrt(sums[..., 7])
        out["round_to_delta_bf16"] = np.where(fro > 0, rnd / np.where(fro > 0, fro, 1), np.where(rnd > 0, np.inf, 0.0))
    return out


def jaccard_overlap(both: np.ndarray, numel: np.ndarray, member: np.ndarray) -> dict[str, np.ndarray]:
    """The Jaccard overlap of runs' moved-entry masks over sets of tensors, beside chance (:data:`OVERLAP_CHANCE`).

    ``both [run, run2, tensor, mask]`` (:data:`MASKS`), ``numel [tensor]``, ``member [set, tensor]``; every array
    returned is ``[run, run2, set, mask]``: ``jaccard`` (NaN where neither run moved anything),
    ``jaccard_chance`` and its interval ``jaccard_chance_low`` / ``_high``."""
    a = np.einsum("rrtp->rtp", both)  # each run's own moved count per tensor
    m = member.astype(np.float64)
    inter = np.einsum("rstp,gt->rsgp", both, m)
    size = np.einsum("rtp,gt->rgp", a, m)
    n = numel[None, None, :, None]
    e_t = a[:, None] * a[None, :] / np.maximum(n, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        v_t = np.where(n > 1, e_t * (n - a[:, None]) * (n - a[None, :]) / (n * np.maximum(n - 1, 1)), 0.0)
        expect, var = np.einsum("rstp,gt->rsgp", e_t, m), np.einsum("rstp,gt->rsgp", v_t, m)
        sizes = size[:, None] + size[None, :]  # |A| + |B|
        total = (m @ numel)[None, None, :, None]
        low_bound, high_bound = np.maximum(0.0, sizes - total), np.minimum(size[:, None], size[None, :])

        def jac(i):
            return np.where(sizes - i > 0, i / (sizes - i), np.nan)

        spread = 1.96 * np.sqrt(var)
        return {"jaccard": jac(inter), "jaccard_chance": jac(expect),
                "jaccard_chance_low": jac(np.clip(expect - spread, low_bound, high_bound)),
                "jaccard_chance_high": jac(np.clip(expect + spread, low_bound, high_bound))}


def _pool(values: np.ndarray, member: np.ndarray, op: str) -> np.ndarray:
    """Reduce the last axis of ``values`` over tensors, per key: ``member[k, n]`` marks membership."""
    if op == "max":
        masked = np.where(member, values[..., None, :], -np.inf)
        return np.where(member.any(-1), masked.max(-1), 0.0)
    return values @ member.T.astype(values.dtype)


@dataclass(frozen=True)
class TensorSums:
    """What one pass over the checkpoints yields, per tensor of ``names`` (the anatomy's order): ``sumsq_base
    [tensor]`` = ‖W‖²_F, ``numel [tensor]``, ``sums [run, tensor, SUMS]`` and ``dots [run, run2, tensor]`` =
    ⟨Δ_r, Δ_s⟩ (:func:`tensor_delta_stats`). Every metric of every scope is built from these."""

    names: list[str]
    sumsq_base: np.ndarray
    numel: np.ndarray
    sums: np.ndarray
    dots: np.ndarray
    both: np.ndarray | None = None
    """With two runs or more: the moved-entry masks' overlaps [run, run2, tensor, mask] (moved, moved_bf16, and with
    a top fraction top), the diagonal each run's own count (:func:`tensor_delta_stats`, :func:`tensor_top_counts`)."""
    top_left_out: tuple[str, ...] = ()
    """The tensors the top-fraction overlap leaves out (not floating point, or a non-finite delta: counted 0)."""

    @property
    def total_sumsq(self) -> np.ndarray:
        """Σ_all-tensors ‖Δ‖²_F of each run [run], the denominator of ``share``."""
        return self.sums[..., 0].sum(-1)


@dataclass(frozen=True)
class TensorPlaces:
    """Where each tensor sits: ``groups`` (first-seen order), ``group_of [tensor]``, ``layer_of [tensor]``
    (the decoder layer, −1 outside the decoder) and ``n_layers`` (decoder layers)."""

    groups: list[str]
    group_of: np.ndarray
    layer_of: np.ndarray
    n_layers: int


def anatomy_tensors(tax: Taxonomy) -> list[str]:
    """The tensors an anatomy covers, in its order: every claimed tensor, then the unknown ones."""
    return [n for n in tax.roles if tax.roles[n].group != "unknown"] + list(tax.unknown)


def tensor_places(names: Sequence[str], tax: Taxonomy) -> TensorPlaces:
    """Group and decoder layer of each of ``names`` (:class:`TensorPlaces`)."""
    return TensorPlaces(
        groups=list(dict.fromkeys(tax.roles[x].group for x in names)),
        group_of=np.array([tax.roles[x].group for x in names], dtype=object),
        layer_of=np.array([tax.roles[x].layer if tax.roles[x].stack == DECODER else -1 for x in names], dtype=np.int64),
        n_layers=tax.n_layers.get(DECODER, 0),
    )


def stream_sums(base: Checkpoint, rls: Sequence[Checkpoint], names: Sequence[str], tol: float,
                on_tensor: Callable[[str, int], None] = lambda name, nbytes: None, workers: int = 2,
                rtol: float = 0.0, top_frac: float | None = None) -> TensorSums:
    """Read every tensor of ``names`` once from ``base`` and each RL checkpoint; their :class:`TensorSums`
    (``n_within_tol``: |Δ| ≤ tol + rtol·|W|; with two runs or more and ``top_frac``, the overlap of their
    top-fraction masks too, from the same read)."""
    k, n = len(rls), len(names)
    sumsq_base, numel = np.zeros(n), np.zeros(n)
    sums, dots = np.zeros((k, n, len(SUMS))), np.zeros((k, k, n))
    top = bool(top_frac) and k > 1
    both = np.zeros((k, k, n, 3 if top else 2)) if k > 1 else None
    left_out: list[tuple[int, str]] = []

    def one(j: int):
        name = names[j]
        b, rs = base.array(name), [r.array(name) for r in rls]
        code, rl_codes = base.metas[name].code, [r.metas[name].code for r in rls]
        got = tensor_delta_stats(b, rs, tol, code=code, rl_codes=rl_codes, rtol=rtol,
                                 both=None if both is None else both[:, :, j, :2])
        if top:
            try:
                both[:, :, j, 2] = tensor_top_counts(b, rs, code, rl_codes, top_frac, name)
            except GraftkitError as e:
                left_out.append((j, f"{name}: {e.message}"))
        return j, b.size, got

    # numpy releases the GIL in every reduction: two threads keep two cores busy. Largest tensors
    # first, so the last one to finish is small.
    order = sorted(range(n), key=lambda j: -base.metas[names[j]].numel)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for j, count, (sb, s, d) in pool.map(one, order):
            sumsq_base[j], numel[j], sums[:, j], dots[..., j] = sb, count, s, d
            on_tensor(names[j], base.metas[names[j]].nbytes * (1 + k))
    return TensorSums(list(names), sumsq_base, numel, sums, dots, both, tuple(x for _, x in sorted(left_out)))


def run_distance(s: TensorSums, run: int, judged: Sequence[str]) -> PairDistance:
    """How far run ``run`` is from base over the ``judged`` matrices (:func:`graftkit.weights.pair_distance`),
    from the pass's sums: no second read."""
    judged = set(judged)
    mats = [j for j, x in enumerate(s.names) if x in judged]
    return pair_distance([s.names[j] for j in mats], s.sumsq_base[mats], s.sums[run, mats, 0], s.sums[run, mats, 5])


def pooled_metrics(s: TensorSums, member: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`summarise` over sets of tensors, ``member[set, tensor]``: sums added, ``max_abs_delta`` maxed."""
    agg_sums = np.stack([_pool(s.sums[..., i], member, "max" if f == "max_abs_delta" else "sum")
                         for i, f in enumerate(SUMS)], -1)
    return summarise(_pool(s.sumsq_base, member, "sum"), _pool(s.numel, member, "sum"), agg_sums,
                     _pool(s.dots, member, "sum"), s.total_sumsq)


def scope_metrics(s: TensorSums, places: TensorPlaces) -> dict[str, dict[str, np.ndarray]]:
    """Every metric per scope: ``tensor``, ``group``, ``total`` (all tensors) and ``cell`` (decoder layer ×
    group, flattened layer-major; empty without decoder layers)."""
    g_of, l_of, groups, n_layers = places.group_of, places.layer_of, places.groups, places.n_layers
    cells = np.stack([(l_of == L) & (g_of == g) for L in range(n_layers) for g in groups]) if n_layers else None
    return {
        "tensor": summarise(s.sumsq_base, s.numel, s.sums, s.dots, s.total_sumsq),
        "group": pooled_metrics(s, np.stack([g_of == g for g in groups])),
        "cell": pooled_metrics(s, cells) if n_layers else {},
        "total": pooled_metrics(s, np.ones((1, len(s.names)), bool)),
    }


#: The layer × group cell metrics a delta result stores (``layer_group_<metric>``).
CELL_METRICS = ("share", "rel_delta", "fro_delta", "frac_unchanged")


def anatomy_arrays(s: TensorSums, places: TensorPlaces, scopes: dict[str, dict[str, np.ndarray]],
                   both: np.ndarray | None = None) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """The labelled arrays of a ``delta`` result: the sums, every metric of every scope, and with two runs or more
    the overlaps of their masks ``both [run, run2, tensor, mask]`` (:data:`MASKS`) per group and in all."""
    sums = s.sums
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {
        "tensor_group": (("tensor",), places.group_of),
        "tensor_layer": (("tensor",), places.layer_of),
        "numel": (("tensor",), s.numel),
        "sumsq_base": (("tensor",), s.sumsq_base),
        "sumsq_delta": (("run", "tensor"), sums[..., 0]),
        "n_unchanged": (("run", "tensor"), sums[..., 2]),
        "n_within_tol": (("run", "tensor"), sums[..., 3]),
        "dot_base_delta": (("run", "tensor"), sums[..., 5]),
        "n_erased_bf16": (("run", "tensor"), sums[..., 6]),
        "sumsq_round_bf16": (("run", "tensor"), sums[..., 7]),
        "dot_delta": (("run", "run2", "tensor"), s.dots),
    }
    if both is not None:  # two runs or more: how far their masks coincide, per group and in all
        data["n_both"] = (("run", "run2", "tensor", "mask"), both)
        for prefix, dim, member in (("group_", "group", np.stack([places.group_of == g for g in places.groups])),
                                    ("total_", "all", np.ones((1, len(s.names)), bool))):
            for name, values in jaccard_overlap(both, s.numel, member).items():
                data[f"{prefix}{name}"] = (("run", "run2", dim, "mask"), values)
    for prefix, scope, dims in (("", "tensor", ("tensor",)), ("group_", "group", ("group",)),
                                ("total_", "total", ("all",))):
        for metric, values in scopes[scope].items():
            if metric == "cosine":
                data[f"{prefix}cosine"] = (("run", "run2", *dims), values)
            else:
                data[f"{prefix}{metric}"] = (("run", *dims), values)
    if places.n_layers:
        cell = scopes["cell"]
        shape = (sums.shape[0], places.n_layers, len(places.groups))
        for metric in CELL_METRICS:
            data[f"layer_group_{metric}"] = (("run", "layer", "group"), cell[metric].reshape(shape))
        data["layer_group_rel_delta"] = (("run", "layer", "group"),
                                         np.where(cell["fro_delta"].reshape(shape) > 0,
                                                  cell["rel_delta"].reshape(shape), 0.0))
    return data


def _per_run(labels: Sequence[str], notes: Sequence[str], lab: str) -> list[str]:
    """Notes about run ``lab``, named by it when there are several runs."""
    return [f"{lab}: {x}" if len(labels) > 1 else x for x in notes]


def tolerance_rule(atol: float, rtol: float) -> str:
    """What ``frac_within_tol`` counts, with the tolerances filled in: "|Δ| ≤ 1e-05" or
    "|Δ| ≤ 1e-05 + 0.001·|W_base|"."""
    return f"|Δ| ≤ {atol:g}" + (f" + {rtol:g}·|W_base|" if rtol else "")


def conventions(atol: float, rtol: float) -> dict:
    """The conventions a ``delta`` result stores beside its fractions (``attrs["conventions"]``)."""
    return {"frac_unchanged": "entries whose stored bits are identical in base and RL (stored in different dtypes: "
                              "equal after the exact upcast)",
            "frac_within_tol": f"finite entries with |Δ| ≤ atol + rtol·|W_base| ({tolerance_rule(atol, rtol)}), "
                               "numpy.isclose(W_rl, W_base, rtol, atol) on the upcast values",
            "atol": atol, "rtol": rtol,
            "undefined": "a ratio over ‖Δ‖ = 0 has no value: share 0, cosine NaN (null in JSON), "
                         "round_to_delta_bf16 ∞ where bf16 would round the unmoved tensor, else 0"}


def identical_sentence(label: str, base: str, n_tensors: int, bitwise: bool = True) -> str:
    """The one line that says run ``label`` did not move from its base at all."""
    same = "bit-identical to" if bitwise else "equal in every value (stored in other dtypes) to"
    return (f"{label} is {same} base {base} in all {n_tensors} tensors: nothing moved, so every movement figure "
            "is 0 and the ratios over ‖Δ‖ (its cosine with another run, bf16 rounding against its movement) are "
            "undefined")


def delta_anatomy(
    base: Checkpoint,
    rls: Sequence[Checkpoint],
    labels: Sequence[str],
    tax: Taxonomy,
    tol: float = 1e-5,
    on_tensor: Callable[[str, int], None] = lambda name, nbytes: None,
    provenance: dict | None = None,
    workers: int = 2,
    force_pair: bool = False,
    rtol: float = 0.0,
    top_frac: float | None = None,
) -> Result:
    """Stream every tensor of ``base`` and each RL checkpoint once; return the labelled anatomy.

    Base and RL may store tensors in different floating dtypes (compared after an exact upcast; one note
    per dtype pair in ``attrs["pair_notes"]``). After the pass, an RL run that is no fine-tune of ``base``
    (:data:`graftkit.weights.FINE_TUNE_RULE`, from the pass's own sums) is refused, unless its graftkit.json
    records this base as its parent (:func:`graftkit.weights.judge_pair`) or ``force_pair`` (then a note says
    which); the figures of every run, and how it was accepted, are in ``attrs["fine_tune"]``. A run
    bit-identical to the base is named in ``attrs["identical"]`` and stated in one note.
    ``n_within_tol`` counts |Δ| ≤ tol + rtol·|W| (:data:`conventions`). With two runs or more, the overlaps of
    their moved-entry masks (and with ``top_frac`` of their top-fraction masks, from the same read) per group
    (:func:`jaccard_overlap`)."""
    pair_notes: list[str] = []
    for lab, r in zip(labels, rls):
        # one clear error (e.g. a vocabulary mismatch), not a shape error mid-way
        pair_notes += _per_run(labels, check_pair(base, r, tax, dtypes="upcast"), lab)
    s = stream_sums(base, rls, anatomy_tensors(tax), tol, on_tensor, workers, rtol=rtol, top_frac=top_frac)
    judged = judged_matrices(base)
    fine_tune, identical = {}, {}
    for i, (lab, r) in enumerate(zip(labels, rls)):
        dist = run_distance(s, i, judged)
        verdict = judge_pair(dist, base, r, force=force_pair)
        pair_notes += _per_run(labels, verdict.notes, lab)
        fine_tune[lab] = {**dist.as_dict(), "accepted": verdict.accepted}
        if s.names and np.array_equal(s.sums[i, :, 2], s.numel):  # every entry unchanged
            bitwise = all(r.metas[n].code == base.metas[n].code for n in s.names)
            identical[lab] = identical_sentence(lab, str(base.path), len(s.names), bitwise)
            pair_notes.append(identical[lab])
    places = tensor_places(s.names, tax)
    both, left_out = s.both, list(s.top_left_out)
    coords = {
        "run": np.array(labels, dtype=object),
        "run2": np.array(labels, dtype=object),
        "tensor": np.array(s.names, dtype=object),
        "group": np.array(places.groups, dtype=object),
        "layer": np.arange(places.n_layers),
        "all": np.array(["all"], dtype=object),
        **({"mask": np.array(MASKS[:both.shape[-1]], dtype=object)} if both is not None else {}),
    }
    attrs = {
        "tol": tol,
        "rtol": rtol,
        "conventions": {**conventions(tol, rtol), **({"overlap_chance": OVERLAP_CHANCE} if both is not None else {})},
        **({"overlap_top_frac": top_frac, "overlap_left_out": left_out} if both is not None and top_frac else {}),
        "identical": identical,
        "delta_dtype": "float32 (float64 when either tensor is float64), both upcast exactly before subtracting",
        "pair_notes": pair_notes,
        "fine_tune": fine_tune,
        "family": tax.family,
        "tied_embeddings": tax.tied,
        **(provenance or {}),
    }
    return Result(DELTA, coords, anatomy_arrays(s, places, scope_metrics(s, places), both), attrs)


# --------------------------------------------------------------------------------------------------
# the command: graftkit delta


@dataclass(frozen=True, kw_only=True)
class DeltaConfig(ReadOptions, RunOption):
    """``graftkit delta``: where the RL fine-tune(s) moved the weights, against their SFT base."""

    command = "delta"
    rl: tuple[Path, ...] = opt(flags=("--from",))
    """RL checkpoint(s): HF folder, .safetensors, LoRA adapter, or a trainer's output_dir (its last checkpoint)."""
    all_checkpoints: bool = False
    """With a trainer's output_dir: every checkpoint-N in step order (the training trajectory: movement per group
    and layer over steps, beside the run's trainer_state.json curves)."""
    base: Path | None = None
    """The SFT base (default: the parent recorded in graftkit.json)."""
    tol: float = 1e-5
    """Absolute tolerance (numpy.isclose's atol): frac_within_tol counts entries with |Δ| ≤ tol + rtol·|W_base|."""
    rtol: float = 0.0
    """Relative tolerance (numpy.isclose's rtol): adds rtol·|W_base| entrywise to tol, so a small learning rate's
    moves are judged against the weights' own size (e.g. --rtol 1e-3 --tol 0). Default 0: tol alone, as before."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/delta-*.h5)."""
    allow_nonfinite: bool = False
    """Exit 0 even if a delta has NaN/Inf entries."""
    shared_vocab: bool = False
    """RL's vocabulary was resized (extra token rows): compare over the rows both share, reporting the
    extra ones; refused by default."""
    force_pair: bool = False
    """Analyse a pair that is no fine-tune (RL moved most matrices by their own norm or more, or points
    elsewhere); refused by default. Not --force, which elsewhere replaces an output folder (graft)."""
    top_frac: float = 0.01
    """With two runs or more: also the overlap of each run's top fraction of every tensor's entries by |Δ| (those
    graft --top-frac would move; counted in the same read); 0 skips it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.top_frac <= 1:
            raise GraftkitError(f"--top-frac {self.top_frac:g} is not a fraction in [0, 1]",
                                "pass e.g. --top-frac 0.01, or 0 to skip the top-fraction overlap")
        if not self.rl:
            raise GraftkitError("no RL checkpoint given", "pass --from RL (repeatable)")
        for flag, value in (("--tol", self.tol), ("--rtol", self.rtol)):
            if not value >= 0:
                raise GraftkitError(f"{flag} {value:g} is not a tolerance", f"pass {flag} 0 or more")


#: The per-tensor metrics of every scope (tensor, group, total), in the order readers list them.
METRICS = ("fro_delta", "rel_delta", "share", "max_abs_delta", "frac_unchanged", "frac_within_tol", "n_nonfinite")


@dataclass(frozen=True)
class MetricLabel:
    """How people see one metric: its column header in printed tables, its axis title in figures, and the
    text of its value in a table cell."""

    header: str
    """Column header in printed tables (short)."""
    axis: str
    """Axis or colour-bar title in figures, with the unit."""
    percent: bool = False
    """A fraction, shown ×100 with a % sign."""
    count: bool = False
    """A count of entries: a whole number, blank when zero."""

    @property
    def scale(self) -> float:
        """Factor from the stored value to the one shown."""
        return 100.0 if self.percent else 1.0

    def cell(self, x: float) -> str:
        """``x`` as a table cell: percentages to 2 decimals, counts whole, anything else to 4 significant digits."""
        if self.percent:
            return f"{100 * x:.2f}%"
        if self.count:
            return f"{int(x)}" if x else ""
        return f"{x:.4g}"


#: metric → how tables and figures show it, in the order tables list the columns (share first: tables are
#: sorted by it). Every renderer names a column or axis through this table, never by position.
LABELS: dict[str, MetricLabel] = {
    "share": MetricLabel("share", "share of squared movement (%)", percent=True),
    "fro_delta": MetricLabel("‖Δ‖_F", "‖Δ‖_F"),
    "rel_delta": MetricLabel("‖Δ‖/‖W‖", "‖Δ‖_F / ‖W‖_F"),
    "max_abs_delta": MetricLabel("max|Δ|", "max |Δ|"),
    "frac_unchanged": MetricLabel("frac_same", "entries bitwise unchanged (%)", percent=True),
    "frac_within_tol": MetricLabel("frac_tol", "entries with |Δ| ≤ tol (%)", percent=True),
    "n_nonfinite": MetricLabel("nonfinite", "NaN/Inf entries (count)", count=True),
}


def delta_labels(atol: float, rtol: float = 0.0) -> dict[str, MetricLabel]:
    """:data:`LABELS` of a result measured with these tolerances: ``frac_within_tol``'s header and axis say which
    (|Δ|≤1e-05, or |Δ|≤1e-05+0.001|W| with a relative tolerance)."""
    header = f"|Δ|≤{atol:g}" + (f"+{rtol:g}|W|" if rtol else "")
    within = MetricLabel(header, f"entries with {tolerance_rule(atol, rtol)} (%)", percent=True)
    return {m: within if m == "frac_within_tol" else shown for m, shown in LABELS.items()}


#: The bf16 probe's figures (:meth:`DeltaResult.precision`) → the metric each is.
PRECISION_METRICS = {"frac_erased": "frac_erased_bf16", "frac_unchanged_bf16": "frac_unchanged_bf16",
                     "round_to_delta": "round_to_delta_bf16"}


def precision_sentence(p: dict) -> str:
    """One run's :meth:`DeltaResult.precision` in words, every figure the one stored."""
    read = f"read as {p.get('dtype', '?')} ({p.get('source', '?')})"
    if p.get("below_trained"):
        read += f"; below the precision it was trained in: {p['below_trained']}"
    if "round_to_delta" not in p:
        return read
    if p.get("moved") is False:  # ‖Δ‖ = 0: no movement for rounding to erase or swamp
        return f"{read}. Nothing moved, so there is no movement for bf16 rounding to erase"
    ratio = p["round_to_delta"]
    ratio_text = "∞" if ratio is None else f"{ratio:.3g}×"
    if p["exact"]:
        return (f"{read}. Stored in bf16, rounding would erase {100 * p['frac_erased']:.2f}% of the moved entries "
                f"(bf16 copies of both sides show {100 * p['frac_unchanged_bf16']:.2f}% of entries unchanged) and add "
                f"noise of {ratio_text} ‖Δ‖_F")
    text = (f"{read}. Its bf16 rounding may be up to {ratio_text} ‖Δ‖_F (half of each value's bf16 spacing); how "
            "many moved entries it erased cannot be counted from bf16 values")
    if ratio is None or ratio >= 0.1:
        text += (": the sparsity (frac_same) and rank figures of this delta may be rounding artefacts; read the "
                 "weights the trainer kept above bf16 to know")
    return text


@dataclass(frozen=True)
class DeltaResult(View):
    """A ``delta`` result (:func:`delta_anatomy`) read by name: per run, metrics over tensors, groups, the
    whole model and (decoder layer × group) cells, and the cosine between runs' deltas.
    ``path`` is the file it was read from or written to."""

    KINDS = (DELTA,)
    PRODUCER = "graftkit delta"

    def as_json(self, seconds: float) -> dict:
        """What ``graftkit delta --json`` prints: per run, totals, groups and tensors (largest share first)."""
        runs = {}
        for i, lab in enumerate(self.runs):
            group, tensor = ({m: get(m, i) for m in METRICS} for get in (self.group, self.tensor))
            runs[lab] = {"identical": self.identical(i), "precision": self.precision(i),
                         "total": {m: self.total(m, i) for m in METRICS},
                         "groups": {g: {m: float(v[j]) for m, v in group.items()} for j, g in enumerate(self.groups)},
                         "tensors": [{"name": n, "group": self.tensor_group[j], "layer": int(self.tensor_layer[j]),
                                      **{m: float(v[j]) for m, v in tensor.items()}}
                                     for j, n in sorted(enumerate(self.tensors), key=lambda x: -tensor["share"][x[0]])]}
        payload = {"base": self.base_path, "tol": self.tol, "rtol": self.rtol, "conventions": self.conventions,
                   "runs": runs, "result_file": str(self.path),
                   "seconds": seconds, "notes": self.notes,
                   "fine_tune": {lab: {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                                       for k, v in f.items()} for lab, f in self.fine_tune.items()}}
        if len(self.runs) > 1:
            payload["cosine"] = {"total": self.cosine_total(), "groups": self.cosine_groups(), "runs": self.runs}
        if self.has("total_jaccard"):
            payload["overlap"] = {"pairs": self.overlap(), "chance": self.conventions.get("overlap_chance"),
                                  "top_frac": self.attrs.get("overlap_top_frac"),
                                  "left_out": self.attrs.get("overlap_left_out", [])}
        return payload

    def overlap(self) -> list[dict]:
        """Per pair of runs and per group (then ``all``): the Jaccard overlap of their moved-entry masks at each
        precision, beside chance with its interval (:func:`jaccard_overlap`); empty with one run."""
        if not self.has("total_jaccard"):
            return []
        res, runs = self.result, self.runs
        masks = [str(x) for x in res.coords["mask"]]
        rows = []

        def num(x) -> float | None:
            return float(x) if np.isfinite(x) else None

        for i in range(len(runs)):
            for j in range(i + 1, len(runs)):
                for prefix, names in (("group_", self.groups), ("total_", ["all"])):
                    for g, name in enumerate(names):
                        cell = {p: {key: num(res[f"{prefix}{arr}"][i, j, g, q]) for key, arr in
                                    (("jaccard", "jaccard"), ("chance", "jaccard_chance"),
                                     ("chance_low", "jaccard_chance_low"), ("chance_high", "jaccard_chance_high"))}
                                for q, p in enumerate(masks)}
                        rows.append({"runs": [runs[i], runs[j]], "group": name, **cell})
        return rows

    @property
    def runs(self) -> list[str]:
        return [str(r) for r in self.result.coords["run"]]

    @property
    def tensors(self) -> list[str]:
        return [str(t) for t in self.result.coords["tensor"]]

    @property
    def groups(self) -> list[str]:
        return [str(g) for g in self.result.coords["group"]]

    @property
    def layers(self) -> np.ndarray:
        return np.asarray(self.result.coords["layer"])

    @property
    def tol(self) -> float:
        """The absolute tolerance of ``frac_within_tol`` (numpy.isclose's atol)."""
        return self.result.attrs["tol"]

    @property
    def rtol(self) -> float:
        """The relative tolerance of ``frac_within_tol`` (0 for results written before it existed)."""
        return float(self.result.attrs.get("rtol") or 0.0)

    @property
    def conventions(self) -> dict:
        """What the fractions count, with their tolerances (:func:`conventions`)."""
        return dict(self.result.attrs.get("conventions") or conventions(self.tol, self.rtol))

    @property
    def labels(self) -> dict[str, MetricLabel]:
        """How tables and figures show each metric of this result (:func:`delta_labels`)."""
        return delta_labels(self.tol, self.rtol)

    @property
    def within_tol(self) -> str:
        """What ``frac_within_tol`` counts here, e.g. "|Δ| ≤ 1e-05"."""
        return tolerance_rule(self.tol, self.rtol)

    def identical(self, run: int) -> bool:
        """Whether run ``run`` is bit-identical to the base (every entry of every tensor unchanged): nothing
        moved, and tables and the report say so in one line (:meth:`identical_line`) instead of drawing zeros."""
        if "identical" in self.result.attrs:
            return self.runs[run] in self.result.attrs["identical"]
        return bool(np.array_equal(np.asarray(self.result["n_unchanged"][run]), np.asarray(self.result["numel"])))

    def identical_line(self, run: int) -> str | None:
        """The one line that says run ``run`` did not move (None when it did)."""
        if not self.identical(run):
            return None
        lab = self.runs[run]
        return (self.result.attrs.get("identical") or {}).get(lab) or identical_sentence(lab, self.base_path,
                                                                                          len(self.tensors))

    @property
    def notes(self) -> list[str]:
        """How single-file checkpoints were read (state dict container, prefixes stripped, config source),
        how differing dtypes were compared, and a pair analysed although it is no fine-tune."""
        a = self.result.attrs
        read = [n for d in [a.get("base") or {}, *(a.get("runs") or [])] for n in d.get("notes", [])]
        return read + list(a.get("pair_notes") or [])

    @property
    def fine_tune(self) -> dict[str, dict]:
        """run → how far it is from base (:meth:`graftkit.weights.PairDistance.as_dict`); empty for results
        written before the check existed."""
        return dict(self.result.attrs.get("fine_tune") or {})

    @property
    def base_path(self) -> str:
        """The base checkpoint as it was given (else as recorded: resolved)."""
        return str(self.result.attrs.get("base_path") or self.result.attrs["base"]["path"])

    def has(self, array: str) -> bool:
        return array in self.result.data

    def tensor(self, metric: str, run: int) -> np.ndarray:
        """``metric`` of every tensor of run ``run`` [tensor]."""
        return np.asarray(self.result[metric][run])

    def group(self, metric: str, run: int) -> np.ndarray:
        """``metric`` of every parameter group of run ``run`` [group]."""
        return np.asarray(self.result[f"group_{metric}"][run])

    def total(self, metric: str, run: int) -> float:
        """``metric`` over every tensor of run ``run``."""
        return float(self.result[f"total_{metric}"][run, 0])

    def cells(self, metric: str, run: int) -> np.ndarray:
        """``metric`` of run ``run`` per decoder layer × group cell [layer, group]."""
        return np.asarray(self.result[f"layer_group_{metric}"][run], dtype=np.float64)

    def group_shares(self, run: int) -> dict[str, float]:
        """group → share of run ``run``'s squared movement."""
        return {g: float(v) for g, v in zip(self.groups, self.group("share", run))}

    @property
    def tensor_group(self) -> list[str]:
        return [str(g) for g in self.result["tensor_group"]]

    @property
    def tensor_layer(self) -> np.ndarray:
        return np.asarray(self.result["tensor_layer"])

    def cosine_total(self) -> np.ndarray:
        """Cosine between runs' deltas over every tensor [run, run2]."""
        return np.asarray(self.result["total_cosine"][..., 0])

    def cosine_groups(self) -> dict[str, np.ndarray]:
        """group → cosine between runs' deltas over the group's tensors [run, run2]."""
        return {g: np.asarray(self.result["group_cosine"][..., j]) for j, g in enumerate(self.groups)}

    def precision(self, run: int) -> dict:
        """How precise run ``run``'s RL weights were read and how much of its movement lies below bf16 (:data:`PROBE`):
        ``dtype``, ``source``, ``below_trained`` (:attr:`graftkit.weights.Checkpoint.precision`); ``exact`` (the RL
        side was read above bf16, so the figures are measured, not bounded); over all tensors ``frac_erased``
        (of the entries that moved, the share bf16 copies of both sides show unchanged; None when not exact),
        ``frac_unchanged_bf16`` (the entries such copies show unchanged; None when not exact) and
        ``round_to_delta`` (‖bf16 rounding of W'‖ / ‖Δ‖; not exact: its bound); ``moved`` (‖Δ‖ > 0: where it is
        not, the ratio has no value and :func:`precision_sentence` says nothing moved); and per group the same three."""
        runs = self.result.attrs.get("runs") or []
        read = dict((runs[run] if run < len(runs) else {}).get("precision") or {})
        if not self.has("total_round_to_delta_bf16"):  # a result written before the probe existed
            return read

        def num(x: float):
            return None if not np.isfinite(x) else float(x)

        erased = self.total("frac_erased_bf16", run)
        probe = {m: num(self.total(k, run)) for m, k in PRECISION_METRICS.items()}
        probe["moved"] = self.total("fro_delta", run) > 0
        groups = {g: {m: num(float(self.group(k, run)[j])) for m, k in PRECISION_METRICS.items()}
                  for j, g in enumerate(self.groups)}
        return {**read, "probe": PROBE, "exact": bool(np.isfinite(erased)), **probe, "groups": groups}

    def nonfinite(self) -> dict[str, dict[str, int]]:
        """run → {tensor: NaN/Inf delta entries}, for the runs that have any."""
        bad = {lab: {n: int(v) for n, v in zip(self.tensors, self.result["n_nonfinite"][i]) if v}
               for i, lab in enumerate(self.runs)}
        return {k: v for k, v in bad.items() if v}

    def check_finite(self) -> None:
        """Raise when a run's delta has NaN/Inf entries (they are excluded from every statistic)."""
        bad = self.nonfinite()
        if bad:
            run, counts = next(iter(bad.items()))
            tensors = ", ".join(f"{n} ({c})" for n, c in list(counts.items())[:3])
            raise GraftkitError(
                f"RL run {run} has NaN/Inf delta entries in {len(counts)} tensor(s): {tensors}; "
                "they are excluded from every statistic and counted in n_nonfinite",
                "check that checkpoint (diverged training?); pass --allow-nonfinite to exit 0",
            )


def run_delta(cfg: DeltaConfig, on_progress: OnProgress = no_progress) -> DeltaResult:
    """Delta anatomy of every ``cfg.rl`` against the base; written to ``cfg.save`` (default
    ``RUN/results/delta-<labels>.h5``). The result records ``cfg.as_dict()`` as its config."""
    from ..results.layout import delta_path, result_labels, run_layout, trajectory_path
    from ..results.store import write_result
    from ..train.commands import write_curves
    from ..weights import base_of, checkpoints_of, describe, open_pair, shared_vocab
    from ..weights.runs import checkpoint_step, recorded_step, trainer_run

    paths = [m for p in cfg.rl for m in checkpoints_of(p, all_checkpoints=cfg.all_checkpoints, flag="--from")]
    b, rls = open_pair(base_of(paths[0], cfg.base), paths, no_pickle=cfg.no_pickle,
                       unknown=cfg.unknown, config=cfg.config)
    tax = b.taxonomy(cfg.unknown)
    if cfg.shared_vocab:
        rls = [shared_vocab(r, b, tax) for r in rls]
    labels = result_labels(paths)
    total = b.nbytes * (1 + len(rls))
    prov = {"base": describe(b), "base_path": str(b.path), "runs": [describe(r) for r in rls], "config": cfg.as_dict(),
            "steps": [(recorded_step if cfg.all_checkpoints else checkpoint_step)(p) for p in paths]}
    res = delta_anatomy(b, rls, labels, tax, cfg.tol, provenance=prov, force_pair=cfg.force_pair,
                        on_tensor=lambda name, nbytes: on_progress("delta", nbytes, total, "bytes"), rtol=cfg.rtol,
                        top_frac=cfg.top_frac or None)
    results = run_layout(cfg.run).results
    default = trajectory_path(results, result_labels([cfg.rl[0]])[0]) if cfg.all_checkpoints else \
        delta_path(results, labels)
    written = write_result(cfg.save or default, res,
                           flag="--save" if cfg.save else None)
    for p in cfg.rl:  # a trainer run's own logged curves, for the report to draw beside its movement
        if (run := trainer_run(Path(p))) is not None and run.state is not None:
            write_curves(run.root, "trainer", results)
    return DeltaResult(res, written)


def overlap_tables(overlap: dict | None) -> list:
    """What ``graftkit delta`` prints of several runs' mask overlaps (``--json``'s ``overlap``): per pair of runs and
    group, the Jaccard overlap of the entries each moved (as stored, and as bf16 stores them) and of each run's top
    fraction by |Δ|, each beside what independent masks of the same sizes would share; then its key."""
    from ..core.tables import Table

    if not overlap or not overlap["pairs"]:
        return []

    def j(x) -> str:
        return "—" if x is None else f"{x:.4f}"

    def chance(c: dict) -> str:
        return "—" if c["chance"] is None else f"{c['chance']:.4f} [{j(c['chance_low'])}, {j(c['chance_high'])}]"

    heads = {"moved": "moved", "moved_bf16": "moved (bf16)", "top": f"top {overlap['top_frac'] or 0:g}"}
    columns = {"runs": lambda r: " · ".join(r["runs"]), "group": lambda r: r["group"]}
    for mask, head in heads.items():
        if mask in overlap["pairs"][0]:
            columns[head] = lambda r, m=mask: j(r[m]["jaccard"])
            columns[f"{head}: chance"] = lambda r, m=mask: chance(r[m])
    return [Table("overlap of the runs' masks (Jaccard |A∩B| / |A∪B|), beside independent masks of the same sizes",
                  columns, overlap["pairs"], left=("runs", "group")),
            "moved: Δ ≠ 0 as stored; moved (bf16): bf16(W_rl) ≠ bf16(W_base); top F: each tensor's fraction F of "
            "entries by |Δ|; chance: the expected overlap [95% interval] of masks placed independently and uniformly "
            "in each tensor; —: neither run has an entry there",
            *(f"top-fraction overlap left out {line}" for line in overlap.get("left_out") or ())]
