"""Spectral measures of every weight matrix of a checkpoint, and of the delta between two checkpoints.

Tensors are read one at a time per worker thread (``Checkpoint.read``, in their stored dtype) and upcast to
float64 inside :func:`rank.spectra.measures` (bfloat16 and float8 included) a block of rows at a time, so
memory holds, per worker, one tensor as stored, one float64 block and the Gram. With ``device`` set to a
GPU the blocks go there in their stored dtype and the Gram and its ``eigvalsh`` are computed there in
float64: device memory is, per worker, the largest Gram plus one block (deltas' pair measures add the Grams'
eigenvectors, and a tall matrix whose small σ its Gram cannot resolve two float64 copies of it for its QR:
:func:`rank.spectra.left_singular`); the result records ``device``, the GPU and its peak allocated bytes.
Each matrix of a delta's pair is decomposed once (W_rl, W_base: :func:`rank.spectra.pair_measures`; Δ: one
``eigvalsh``), and every measure reads those decompositions. Embeddings and lm_head are ranked at their real vocabulary size: the default
``method="gram"`` takes the eigenvalues of the Gram of the *smaller* side (hidden × hidden), so a
[vocab, hidden] matrix costs one vocab·hidden² product.

Conventions (also recorded in every result's attrs):

- Which tensors: every tensor with ndim ≥ 2. 1-D tensors (norms, biases) and 0-d scalars are skipped and
  listed in ``attrs["skipped"]`` with the reason. A 3-D tensor (stacked MoE experts
  ``[n_experts, out, in]``) is ranked expert by expert: one row per expert, labelled ``name[e]``, and the
  tensor is listed in ``attrs["expanded"]``. Tensors of more than 3 dimensions are skipped and listed.
- Layer selection: ``layers`` (``weights.parse_layers`` spec, e.g. ``"late"``, ``"0-3"``) picks decoder
  layers; tensors outside the decoder stack (embeddings, lm_head, final norm, vision tower) are included
  only for ``"all"``. Their ``tensor_layer`` is −1.
- Per-layer aggregates ``value_layer[layer, group, metric]``, with the extra group ``"all"`` over every
  matrix of the layer: every metric is the mean over one and the same set of matrices, the cell's
  matrices with a nonzero spectrum (``tensor_nonzero``; for a delta, the tensors RL moved, Δ ≠ 0).
  Matrices with a zero spectrum are left out of every measure alike, not only of those undefined for
  them: a layer where RL moved q_proj and v_proj reports, for erank and numerical_rank alike, the mean
  over those two. The set is named in ``averaged_layer[layer, group]`` ("all 7 matrices", or "moved
  tensors 2 of 7: self_attn.q_proj.weight, self_attn.v_proj.weight"), its size in
  ``n_averaged_layer``; ``count_layer[layer, group]`` is the number of matrices in the cell. A cell
  whose set is empty (nothing moved) is NaN for every metric.
- Delta: Δ = W_rl − W_base, both upcast to float32 before subtracting (float64 when either is float64),
  per tensor (:func:`rank.spectra.delta_matrix`).
  A zero Δ (a tensor RL did not move) has ``frobenius_sq = 0``, ``sigma_1 = 0``, ``numerical_rank = 0``,
  and NaN for every ratio measure (erank, erank_sq, stable_rank, participation_ratio, rankme,
  top1_energy) and for ``delta_energy_top8`` and ``delta_energy_top8_right``; its ``spectral_drift`` is 0,
  ``subspace_overlap_top8`` 1 and ``intruders`` 0.
- Pair measures (delta only), on base W₀ and RL W₁: ``spectral_drift`` ‖σ(W₁) − σ(W₀)‖/‖σ(W₀)‖;
  ``delta_energy_top8`` the share of ‖Δ‖²_F inside W₀'s top-k left singular subspace, k = min(8, min
  shape), and ``delta_energy_top8_right`` inside its top-k right singular subspace; beside each, the share a
  random Δ puts there in expectation (``…_chance``: k/rows and k/columns, exact for any rotation-invariant
  law of Δ); ``subspace_overlap_top8`` ‖U₀ₖᵀU₁ₖ‖²_F/k, the mean cos² of the principal angles between W₀'s and
  W₁'s top-k left subspaces; ``intruders`` the number of W₁'s top-k left singular vectors (k = min(10, min
  shape)) whose max |cos| with every W₀ left singular vector is < 0.5. ``top1_energy`` of Δ is σ₁(Δ)²/‖Δ‖²_F.
- Numerical rank of a weight: count σ > max(m, n)·eps(dtype)·σ₁, dtype the checkpoint's dtype of the
  matrix. Of a delta: count σ > eps(d)·(max_i ‖S_i,:‖₂ + max_j ‖S_:,j‖₂), S = max(|W_base|, |W_rl|)
  entrywise and d the coarser storage dtype of the two tensors (not the float32 Δ is computed in): the
  rounding noise of the stored weights, which a delta much smaller than its weights would otherwise
  count as rank (:mod:`rank.spectra`, "Numerical rank of a delta"). The reference norm (one pass over
  both tensors, a block of rows at a time, alongside the delta) is in ``tol_ref``; per-row tolerances
  in ``tol``; ``tensor_dtype`` is the storage dtype whose eps is used (for a delta: the coarser one).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..results.layout import RANK_DELTA, RANK_WEIGHTS
from ..results.store import Result
from ..weights import (Checkpoint, Taxonomy, band_rule, check_fine_tune, check_pair, describe_later, parse_layers,
                       stream_pair_distance)
from ..weights.taxonomy import DECODER
from .metrics import DELTA_TOPK, INTRUDER_EPS, INTRUDER_K, METRICS, PAIR_CONVENTIONS, PAIR_METRICS
from .spectra import (CONVENTIONS, RANKME_EPS, RowBlocks, as_device, delta_matrix, delta_tol_rule, measures,
                      pair_measures)

ZERO_CONVENTION = ("zero matrix (e.g. a tensor RL did not move): frobenius_sq=0, sigma_1=0, numerical_rank=0, "
                   "ratio measures and delta_energy_top8(_right) NaN, spectral_drift=0, subspace_overlap_top8=1, "
                   "intruders=0")
AGG_CONVENTION = ("value_layer[layer, group, metric]: for every metric the mean over the same set, the layer's "
                  "matrices in the group (group 'all': every matrix of the layer) with a nonzero spectrum (for a "
                  "delta: the tensors RL moved, delta != 0); zero matrices are left out of every measure alike; "
                  "the set is named in averaged_layer, its size in n_averaged_layer, the cell's size in "
                  "count_layer; NaN for every metric when the set is empty")
WEIGHT_TOL_RULE = "max(shape)*eps(dtype)*sigma_1 (absolute), dtype the checkpoint's dtype of the matrix"
SELECT_CONVENTION = ("ndim>=2 tensors; 3-D tensors ranked per leading index (MoE experts, rows 'name[e]'); "
                     "1-D and >3-D tensors skipped and listed; tensors outside the decoder stack only for layers=all")


def _check_metrics(metrics: Iterable[str] | None, allowed: Sequence[str]) -> tuple[str, ...]:
    if metrics is None:
        return tuple(allowed)
    out = tuple(dict.fromkeys(metrics))
    for m in out:
        if m not in allowed:
            raise GraftkitError(f"unknown metric '{m}'", f"use one of {', '.join(allowed)}")
    if not out:
        raise GraftkitError("no metric chosen", f"use one or more of {', '.join(allowed)}")
    return out


def select_tensors(ckpt: Checkpoint, tax: Taxonomy, layers: str | Iterable[int] | None = None
                   ) -> tuple[list[str], list[tuple[str, str]], frozenset[int] | None]:
    """(tensors to rank, [(skipped tensor, reason)], selected decoder layers or None for all)."""
    n_layers = tax.n_layers.get(DECODER, 0)
    if layers is None or isinstance(layers, str):
        chosen = parse_layers(layers or "all", n_layers)
    else:
        chosen = frozenset(int(i) for i in layers)
        bad = [i for i in chosen if not 0 <= i < n_layers]
        if bad:
            raise GraftkitError(f"layers {sorted(bad)} are outside the model's decoder layers 0–{n_layers - 1}",
                                "pick indices inside that range")
    names, skipped = [], []
    for name, meta in ckpt.metas.items():
        role = tax.roles.get(name)
        in_decoder = role is not None and role.stack == DECODER
        if chosen is not None and not (in_decoder and role.layer in chosen):
            continue
        if len(meta.shape) < 2:
            skipped.append((name, f"{len(meta.shape)}-D {list(meta.shape)} (norm, bias or scalar)"))
        elif len(meta.shape) > 3:
            skipped.append((name, f"{len(meta.shape)}-D {list(meta.shape)} (no matrix convention)"))
        else:
            names.append(name)
    return names, skipped, chosen


def _matrices(name: str, t) -> list[tuple[str, object]]:
    """One (label, 2-D tensor) per matrix of tensor ``name``: itself, or each expert of a 3-D stack."""
    if t.ndim == 3:
        return [(f"{name}[{e}]", t[e]) for e in range(t.shape[0])]
    return [(name, t)]


def _workers(workers: int | None, device=None) -> int:
    """Matrices ranked at once: ``workers``, else torch's intra-op thread count on the CPU and 2 on a GPU (one
    matrix read and sent while the other computes)."""
    import torch

    n = (torch.get_num_threads() if as_device(device).type == "cpu" else 2) if workers is None else workers
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GraftkitError(f"workers={workers!r} must be a positive integer", "e.g. workers=2, or None for all cores")
    return n


def _in_threads(items: Sequence[str], fn: Callable[[str], object], workers: int, size: Callable[[str], int],
                on_done: Callable[[str], None]) -> dict[str, object]:
    """{item: fn(item)}, computed by ``workers`` threads, largest ``size`` first; ``on_done`` in this thread."""
    if workers == 1 or len(items) < 2:
        out = {}
        for it in items:
            out[it] = fn(it)
            on_done(it)
        return out
    import torch
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, object] = {}
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graftkit-rank") as ex:
            order = sorted(items, key=size, reverse=True)  # longest first: no big matrix left for the end
            pending = {ex.submit(fn, it): it for it in order}
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        it = pending.pop(fut)
                        out[it] = fut.result()  # re-raises a worker's GraftkitError here
                        on_done(it)
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
    finally:
        torch.set_num_threads(threads)
    return out


def _row(m: dict, metrics: Sequence[str]) -> list[float]:
    return [float(m[k]) for k in metrics]


def _record(per_row: dict[str, list], m: dict) -> None:
    """Append one matrix's tolerance, storage dtype, shape, nonzero flag (and rounding reference)."""
    per_row["tol"].append(m["numerical_rank_tol"]), per_row["dtype"].append(m["dtype"])
    per_row["shape"].append(m["shape"]), per_row["nonzero"].append(m["frobenius_sq"] > 0.0)
    if "ref" in per_row:
        per_row["ref"].append(m["numerical_rank_ref_norm"])


#: Tensors smaller than this are read whole (a read per block would cost more than it saves).
STREAM_MIN_BYTES = 8 << 20


def _row_blocks(ckpt: Checkpoint, name: str) -> RowBlocks | None:
    """Tensor ``name`` as :class:`RowBlocks` read from its file (:meth:`Checkpoint.array_chunks`), where it is
    a tall 2-D float32/bfloat16/float16 matrix (rows > cols: its Gram is WᵀW, as when read whole) of at least
    ``STREAM_MIN_BYTES`` stored as raw bytes; else None (the caller reads it whole)."""
    import torch

    from ..weights import torch_dtype

    meta = ckpt.metas[name]
    if (len(meta.shape) != 2 or meta.shape[0] <= meta.shape[1] or meta.code not in ("F32", "BF16", "F16")
            or meta.nbytes < STREAM_MIN_BYTES or ckpt.arrays is None or name not in ckpt.raw):
        return None
    rows, cols = (int(x) for x in meta.shape)
    dtype = torch_dtype(meta.code)

    def blocks(n: int):
        for chunk in ckpt.array_chunks(name, n * cols):
            t = torch.from_numpy(chunk)
            yield (t if t.dtype == dtype else t.view(dtype)).view(-1, cols)

    return RowBlocks((rows, cols), dtype, blocks)


def _pair_row(W0, W1, D, zero: bool, method: str, device) -> dict[str, float]:
    rows, cols = (int(x) for x in W0.shape)
    k = min(DELTA_TOPK, rows, cols)
    chance = {"delta_energy_top8_chance": k / rows, "delta_energy_top8_right_chance": k / cols}
    if zero:
        return {"spectral_drift": 0.0, "delta_energy_top8": float("nan"), "delta_energy_top8_right": float("nan"),
                "subspace_overlap_top8": 1.0, "intruders": 0.0, **chance}
    m = pair_measures(W0, W1, D, energy_k=k, intruder_k=min(INTRUDER_K, rows, cols),
                      intruder_eps=INTRUDER_EPS, method=method, device=device)
    return {"spectral_drift": m["spectral_drift"], "delta_energy_top8": m["delta_energy_topk"],
            "delta_energy_top8_right": m["delta_energy_topk_right"], "subspace_overlap_top8": m["subspace_overlap"],
            "intruders": m["intruders"], **chance}


def _short_names(names: Sequence[str]) -> list[str]:
    """``names`` without the dotted prefix they all share ("model.layers.4."), so a layer's set reads
    "self_attn.q_proj.weight"; one name stays whole."""
    parts = [n.split(".") for n in names]
    k = 0
    while len(parts) > 1 and all(len(p) > k + 1 and p[k] == parts[0][k] for p in parts):
        k += 1
    return [".".join(p[k:]) for p in parts]


def _set_label(short: Sequence[str], averaged: np.ndarray, delta: bool) -> str:
    """Which matrices of a cell its means are taken over (see ``AGG_CONVENTION``)."""
    n, k = len(short), int(averaged.sum())
    if k == n:
        return f"all {n} matrices"
    kind = "moved tensors" if delta else "nonzero matrices"
    if k == 0:
        return f"no {kind} (0 of {n} matrices)"
    return f"{kind} {k} of {n}: " + ", ".join(name for name, a in zip(short, averaged) if a)


def _layer_means(values: np.ndarray, rows: Sequence[str], layer_of: np.ndarray, group_of: np.ndarray,
                 nonzero: np.ndarray, layer_ids: Sequence[int], groups: Sequence[str], delta: bool):
    """(value_layer[layer, group, metric], count_layer, n_averaged_layer, averaged_layer): each metric the
    plain mean over the cell's nonzero matrices, one set for every metric."""
    shape = (len(layer_ids), len(groups))
    agg = np.full(shape + (values.shape[1],), np.nan)
    count, n_avg = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    label = np.full(shape, "", dtype=object)
    for i, L in enumerate(layer_ids):
        in_layer = layer_of == L
        short = dict(zip(np.flatnonzero(in_layer), _short_names([rows[t] for t in np.flatnonzero(in_layer)])))
        for j, g in enumerate(groups):
            member = in_layer & ((group_of == g) if g != "all" else True)
            idx = np.flatnonzero(member)
            count[i, j], n_avg[i, j] = len(idx), int(nonzero[idx].sum())
            label[i, j] = _set_label([short[t] for t in idx], nonzero[idx], delta) if len(idx) else "no matrices"
            if n_avg[i, j]:
                agg[i, j] = values[idx[nonzero[idx]]].mean(0)
    return agg, count, n_avg, label


def _assemble(kind: str, rows: list[str], parents: list[str], values: np.ndarray, metrics: Sequence[str],
              per_row: dict[str, list], tax: Taxonomy, chosen: frozenset[int] | None,
              skipped: list[tuple[str, str]], attrs: dict) -> Result:
    """The Result of one weight or delta ranking; ``per_row`` holds, per row, ``tol``, ``dtype``,
    ``shape``, ``nonzero`` and, for a delta, ``ref`` (the rounding reference of its tolerance)."""
    delta = kind == RANK_DELTA
    group_of = np.array([tax.roles[p].group if p in tax.roles else "unknown" for p in parents], dtype=object)
    layer_of = np.array([tax.roles[p].layer if p in tax.roles and tax.roles[p].stack == DECODER else -1
                         for p in parents], dtype=np.int64)
    nonzero = np.array(per_row["nonzero"], dtype=bool).reshape(len(rows))
    n_layers = tax.n_layers.get(DECODER, 0)
    layer_ids = sorted(chosen) if chosen is not None else list(range(n_layers))
    decoder_groups = list(dict.fromkeys(g for g, L in zip(group_of, layer_of) if L >= 0))
    groups = decoder_groups + ["all"]
    agg, count, n_avg, label = _layer_means(values, rows, layer_of, group_of, nonzero, layer_ids, groups, delta)
    coords = {
        "tensor": np.array(rows, dtype=object),
        "metric": np.array(list(metrics), dtype=object),
        "layer": np.array(layer_ids, dtype=np.int64),
        "group": np.array(groups, dtype=object),
        "dim": np.array(["rows", "cols"], dtype=object),
    }
    dtypes = per_row["dtype"]
    data = {
        "value": (("tensor", "metric"), values),
        "tensor_group": (("tensor",), group_of),
        "tensor_layer": (("tensor",), layer_of),
        "tensor_source": (("tensor",), np.array(parents, dtype=object)),
        "tensor_dtype": (("tensor",), np.array(dtypes, dtype=object)),
        "tensor_shape": (("tensor", "dim"), np.array(per_row["shape"], dtype=np.int64).reshape(len(rows), 2)),
        "tensor_nonzero": (("tensor",), nonzero),
        "tol": (("tensor",), np.array(per_row["tol"], dtype=np.float64)),
        "value_layer": (("layer", "group", "metric"), agg),
        "count_layer": (("layer", "group"), count),
        "n_averaged_layer": (("layer", "group"), n_avg),
        "averaged_layer": (("layer", "group"), label),
    }
    if delta:
        data["tol_ref"] = (("tensor",), np.array(per_row["ref"], dtype=np.float64))
        stored = sorted(set(dtypes))
        tol_rule = (delta_tol_rule(stored[0]) if len(stored) == 1 else
                    delta_tol_rule("d") + f"; d per row in tensor_dtype ({', '.join(stored)})")
    else:
        tol_rule = WEIGHT_TOL_RULE
    full = {
        "conventions": {**CONVENTIONS, **PAIR_CONVENTIONS, "sigma_1": "largest singular value",
                        "frobenius_sq": "sum(sigma^2)"},
        "zero_matrix": ZERO_CONVENTION,
        "aggregate": AGG_CONVENTION,
        "selection": SELECT_CONVENTION,
        "numerical_rank_tol_rule": tol_rule,
        "rankme_eps": RANKME_EPS,
        "layers": "all" if chosen is None else sorted(chosen),
        "band_rule": band_rule(n_layers) if n_layers else "no decoder layers",
        "skipped": [{"tensor": n, "reason": r} for n, r in skipped],
        "expanded": sorted({p for p, r in zip(parents, rows) if p != r}),
        "family": tax.family,
        **attrs,
    }
    return Result(kind, coords, data, full)


def weight_ranks(
    ckpt: Checkpoint,
    tax: Taxonomy,
    layers: str | Iterable[int] | None = None,
    metrics: Iterable[str] | None = None,
    method: str = "gram",
    on_tensor: Callable[[str, int], None] = lambda name, nbytes: None,
    provenance: dict | None = None,
    workers: int | None = None,
    device=None,
) -> Result:
    """Spectral measures of every weight matrix of ``ckpt`` (streamed), per tensor and per layer.

    Returns a ``Result`` of kind ``"rank-weights"``: ``value[tensor, metric]``, ``tensor_group``,
    ``tensor_layer`` (−1 outside the decoder stack), ``value_layer[layer, group, metric]``, and attrs
    with every convention, the method, the tolerance rule, the device and ``describe(ckpt)``.

    ``workers`` tensors are ranked at once in threads (default: torch's intra-op thread count on the CPU,
    2 on a GPU), largest first; meanwhile torch's intra-op threads are set to 1 (process-wide, restored on
    return), so the cores work on different matrices instead of contending for one small ``eigvalsh``.
    ``device`` (None: the CPU; "cuda:0", a torch device): where each float64 Gram and its ``eigvalsh``
    run, the matrix streamed there a block at a time (:mod:`rank.spectra`). ``on_tensor`` is called from
    the calling thread as tensors finish. Values do not depend on ``workers``, and on the device only in
    the order of floating-point sums.
    """
    metrics = _check_metrics(metrics, METRICS)
    names, skipped, chosen = select_tensors(ckpt, tax, layers)
    t0 = time.perf_counter()
    dev = as_device(device)
    n_workers = _workers(workers, dev)
    peak = _peak_memory(dev)
    model = describe_later(ckpt)  # the fingerprint is hashed while the spectra are computed

    def rank_one(name: str) -> list[tuple[str, dict]]:
        streamed = _row_blocks(ckpt, name) if method == "gram" else None
        if streamed is not None:  # read a block at a time into one buffer: the tensor is never held whole
            return [(name, measures(streamed, method, device=dev))]
        t = ckpt.read(name)
        return [(label, measures(W, method, device=dev)) for label, W in _matrices(name, t)]

    done = _in_threads(names, rank_one, n_workers, size=lambda n: ckpt.metas[n].nbytes,
                       on_done=lambda n: on_tensor(n, ckpt.metas[n].nbytes))
    rows, parents, values = [], [], []
    per_row: dict[str, list] = {"tol": [], "dtype": [], "shape": [], "nonzero": []}
    method_name = None
    for name in names:
        for label, m in done[name]:
            method_name = m["method"]
            rows.append(label), parents.append(name), values.append(_row(m, metrics))
            _record(per_row, m)
    attrs = {"what": "weights", "method": method_name or method, "spectrum_dtype": "float64",
             "seconds": time.perf_counter() - t0, "workers": n_workers, **_placement(dev, peak),
             "model": model(), **(provenance or {})}
    vals = np.array(values, dtype=np.float64).reshape(len(rows), len(metrics))
    return _assemble(RANK_WEIGHTS, rows, parents, vals, metrics, per_row, tax, chosen, skipped, attrs)


def _peak_memory(dev) -> Callable[[], int | None]:
    """A function giving the device's peak allocated bytes since now (None on the CPU)."""
    import torch

    if dev.type != "cuda":
        return lambda: None
    torch.cuda.reset_peak_memory_stats(dev)
    return lambda: int(torch.cuda.max_memory_allocated(dev))


def _placement(dev, peak: Callable[[], int | None]) -> dict:
    """What a rank result records about where its spectra ran."""
    import torch

    out: dict = {"device": str(dev)}
    if dev.type == "cuda":
        out.update(gpu=torch.cuda.get_device_name(dev), peak_device_bytes=peak())
    return out


def delta_ranks(
    base: Checkpoint,
    rl: Checkpoint,
    tax: Taxonomy,
    layers: str | Iterable[int] | None = None,
    metrics: Iterable[str] | None = None,
    method: str = "gram",
    on_tensor: Callable[[str, int], None] = lambda name, nbytes: None,
    provenance: dict | None = None,
    force_pair: bool = False,
    workers: int | None = None,
    device=None,
) -> Result:
    """Spectral measures of Δ = rl − base per matrix, plus the pair measures (``PAIR_METRICS``).

    Base and RL may store tensors in different floating dtypes: each pair is read as stored, Δ taken after
    an exact upcast, and the tolerance uses the coarser storage dtype; one note per dtype pair is in
    ``attrs["pair_notes"]``. A pair that is no fine-tune (:data:`graftkit.weights.FINE_TUNE_RULE`, judged
    over every matrix of the model in one streaming pass before the spectra) is refused unless
    ``force_pair``; its figures are in ``attrs["fine_tune"]``.

    Same layout as :func:`weight_ranks` (kind ``"rank-delta"``); ``metrics`` may name any of
    ``METRICS + PAIR_METRICS``. Pairs of tensors are ranked ``workers`` at a time in threads, largest first,
    on ``device``, as :func:`weight_ranks` ranks matrices. The numerical rank counts σ(Δ)
    above the delta rule's tolerance, eps(coarser storage dtype) times the rounding reference of the two
    stored tensors (:func:`rank.spectra.rounding_reference`, taken from the same pair as it is read, a block
    of rows at a time), recorded per row in ``tol`` and ``tol_ref``; per-layer rows average every metric
    over the tensors RL moved, named in ``averaged_layer``. A LoRA adapter's tensors (``rl.deltas``) are
    ranked on the exact update s·B@A (float32, from A and B) with the matrix rule's tolerance, never on the
    difference of the merged and base matrices.
    """
    import torch

    metrics = _check_metrics(metrics, METRICS + PAIR_METRICS)
    pair_notes = list(check_pair(base, rl, tax, dtypes="upcast"))
    dist = stream_pair_distance(base, rl)
    pair_notes += check_fine_tune(dist, base, rl, force=force_pair)
    names, skipped, chosen = select_tensors(base, tax, layers)
    want_pair = any(m in PAIR_METRICS for m in metrics)
    t0 = time.perf_counter()
    dev = as_device(device)
    n_workers = _workers(workers, dev)
    peak = _peak_memory(dev)
    base_later, rl_later = describe_later(base), describe_later(rl)  # hashed while the spectra are computed

    def rank_pair(name: str) -> list[tuple[str, dict]]:
        b, r = base.read(name), rl.read(name)
        exact = rl.deltas(name) if rl.deltas is not None else None  # a LoRA's s·B@A, not a rounded difference
        out = []
        for (label, W0), (_, W1) in zip(_matrices(name, b), _matrices(name, r)):
            D = delta_matrix(W0, W1) if exact is None else exact
            if not torch.isfinite(D).all():
                raise GraftkitError(f"{label}: the delta holds NaN or inf values",
                                    "check the RL checkpoint (diverged training?); `graftkit delta` counts them")
            # the tolerance of a delta: the stored weights' rounding; of an exact update: its own (float32)
            m = (measures(D, method, stored=(W0, W1), device=dev) if exact is None
                 else measures(D, method, device=dev))
            if want_pair:
                m.update(_pair_row(W0, W1, D, m["frobenius_sq"] == 0.0, method, dev))
            out.append((label, m))
        return out

    done = _in_threads(names, rank_pair, n_workers, size=lambda n: base.metas[n].nbytes,
                       on_done=lambda n: on_tensor(n, base.metas[n].nbytes * 2))
    rows, parents, values = [], [], []
    per_row: dict[str, list] = {"tol": [], "dtype": [], "shape": [], "nonzero": [], "ref": []}
    method_name = None
    for name in names:
        for label, m in done[name]:
            method_name = m["method"]
            rows.append(label), parents.append(name), values.append(_row(m, metrics))
            _record(per_row, m)
    attrs = {"what": "delta", "method": method_name or method, "spectrum_dtype": "float64",
             "delta_dtype": "float32 (float64 when either tensor is float64), upcast before subtracting; "
                            "the tolerance uses the storage dtype (tensor_dtype)",
             "pair_k": {"delta_energy_top8": DELTA_TOPK, "delta_energy_top8_right": DELTA_TOPK,
                        "subspace_overlap_top8": DELTA_TOPK, "intruders": INTRUDER_K}, "intruder_eps": INTRUDER_EPS,
             "seconds": time.perf_counter() - t0, "workers": n_workers, **_placement(dev, peak),
             "base": base_later(), "model": rl_later(),
             "pair_notes": pair_notes, "fine_tune": dist.as_dict(),
             **(provenance or {})}
    vals = np.array(values, dtype=np.float64).reshape(len(rows), len(metrics))
    return _assemble(RANK_DELTA, rows, parents, vals, metrics, per_row, tax, chosen, skipped, attrs)
