"""A base checkpoint and an RL checkpoint, opened and checked as a pair.

Grafting and delta anatomy need the two to hold the same tensors with the same shapes. Each mismatch is
one error that names the tensors and both shapes. Which base a pair takes when ``--base`` is not given is
:func:`.resolve.base_of`'s answer.

Dtypes (:func:`check_pair`, ``dtypes=``, one of :data:`DTYPE_POLICIES`): a bfloat16 SFT base and a float32
checkpoint of another trainer are one pair. An analysis (``delta``, ``rank --what delta``) takes the
difference after an exact upcast of both sides (``"upcast"``: every float8/float16/bfloat16 value is a
float32 value, every float32 value a float64 one); a graft keeps the base's dtype and casts RL's values to
it (``"cast"``, :func:`cast_like`: round to nearest, as torch's ``.to``). Each dtype pair is stated in one
note. Integer or boolean tensors must agree exactly.

Is it a fine-tune at all (:class:`PairDistance`, :data:`FINE_TUNE_RULE`)? A random init analysed against
an unrelated base moves every matrix by about its own norm; :func:`check_fine_tune` refuses such a pair
with the figures, unless RL's own ``graftkit.json`` records this very base as its parent (its ``blake3:``
fingerprint equal to the base's, :func:`judge_pair`: a high-learning-rate GRPO run may move that far, and one
note states the figures), or unless told (``--force-pair``). A pair in which no matrix moved is said to be
one (:attr:`PairDistance.unmoved`).

Either side may be a single-file PyTorch checkpoint: :func:`open_pair` maps its
names onto the other side's (:func:`.checkpoint.match_names`) and records what it mapped in
:attr:`Checkpoint.notes`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.errors import GraftkitError
from .checkpoint import PROVENANCE, Checkpoint, TensorMeta, _read_json, drop_tied_head, match_names, open_checkpoint
from .fingerprint import ALGORITHMS, combine, file_digests, fingerprint, fingerprint_later
from .lora import apply_lora, is_lora_folder
from .safetensors_file import dtype_name, torch_dtype
from .taxonomy import Taxonomy


def open_rl(path: Path, base: Checkpoint, *, no_pickle: bool = False, allow_pickle: bool = False) -> Checkpoint:
    """Open the RL side: a full checkpoint, or a LoRA adapter applied over ``base`` (``allow_pickle`` is accepted and
    changes nothing, as in :func:`.checkpoint.open_checkpoint`)."""
    path = Path(path)
    if is_lora_folder(path):
        return apply_lora(base, path)
    return open_checkpoint(path, no_pickle=no_pickle)


def open_one(path: Path, *, no_pickle: bool = False, unknown: str = "error",
             config: Path | None = None) -> Checkpoint:
    """Open a checkpoint read alone; a single pickled file is named after the taxonomy tables."""
    return match_names(open_checkpoint(path, no_pickle=no_pickle), unknown=unknown, config_dir=config)


def open_pair(base_path: Path, rl_paths, *, no_pickle: bool = False, unknown: str = "error",
              config: Path | None = None, base_flag: str = "--base") -> tuple[Checkpoint, list[Checkpoint]]:
    """The base and every RL side, opened; a single pickled file among them is renamed onto the names of
    the first side that is no such file (or, when all are, onto the taxonomy's) and takes its config."""
    base = open_checkpoint(base_path, no_pickle=no_pickle)
    full = [None if is_lora_folder(Path(p)) else open_checkpoint(p, no_pickle=no_pickle) for p in rl_paths]
    ref = next((c for c in (base, *full) if c is not None and not c.loose), None)
    base = match_names(base, ref, unknown=unknown, config_dir=config)
    ref = ref or base  # all sides single files: the RL sides take the base's (taxonomy-matched) names
    rls = [apply_lora(base, Path(p), base_flag) if c is None else match_names(c, ref, unknown=unknown, config_dir=config)
           for p, c in zip(rl_paths, full)]
    rls = [drop_tied_head(r, base) for r in rls]
    return (drop_tied_head(base, rls[0]) if rls else base), rls


def notes(*ckpts: Checkpoint) -> list[str]:
    """What reading the checkpoints mapped (containers, prefixes, config sources), one line each."""
    return [n for c in ckpts for n in c.notes]


# ------------------------------------------------------------------------------------------ dtypes

#: How :func:`check_pair` treats a tensor that base and RL store in different floating-point dtypes.
DTYPE_POLICIES: dict[str, str] = {
    "same": "refuse: every tensor must have one dtype in both checkpoints",
    "upcast": "compare after an exact upcast of both sides to float32 (float64 when either is float64)",
    "cast": "cast RL's values to base's dtype, rounding to nearest (torch .to): base's dtype is kept",
}
FLOAT_CODES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
#: dtype → the dtypes every value of which it holds exactly (a cast from them into it loses nothing).
EXACT_INTO: dict[str, frozenset[str]] = {
    "F64": frozenset(FLOAT_CODES),
    "F32": frozenset({"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}),
    "F16": frozenset({"F16", "F8_E4M3", "F8_E5M2"}),
    "BF16": frozenset({"BF16", "F8_E4M3", "F8_E5M2"}),
    "F8_E4M3": frozenset({"F8_E4M3"}),
    "F8_E5M2": frozenset({"F8_E5M2"}),
}


def upcast_code(*codes: str) -> str:
    """The dtype a difference of tensors stored in ``codes`` is taken in: float64 when one is float64, else
    float32 (which holds every float16, bfloat16 and float8 value exactly)."""
    return "F64" if "F64" in codes else "F32"


def _dtype_groups(base: Checkpoint, rl: Checkpoint) -> dict[tuple[str, str], list[str]]:
    """(base dtype, RL dtype) → the tensors stored so, for every tensor whose two dtypes differ."""
    groups: dict[tuple[str, str], list[str]] = {}
    for n, mb in base.metas.items():
        mr = rl.metas.get(n)
        if mr is not None and mr.code != mb.code:
            groups.setdefault((mb.code, mr.code), []).append(n)
    return groups


def _scope(names: list[str], total: int) -> str:
    if len(names) == total:
        return f"all {total} tensors"
    return f"{len(names)} of {total} tensors: {', '.join(names[:3])}" + (" …" if len(names) > 3 else "")


def dtype_notes(base: Checkpoint, rl: Checkpoint, dtypes: str) -> tuple[str, ...]:
    """One line per (base dtype, RL dtype) pair that differs: what ``dtypes`` (``"upcast"`` or ``"cast"``)
    does with those tensors."""
    out = []
    total = len(base.metas)
    for (b, r), names in _dtype_groups(base, rl).items():
        bn, rn, scope = dtype_name(b), dtype_name(r), _scope(names, total)
        if dtypes == "upcast":
            out.append(f"base {bn}, RL {rn} ({scope}): both upcast to {dtype_name(upcast_code(b, r))}, exactly")
        else:
            how = (f"exactly (every {rn} value is a {bn} value)" if r in EXACT_INTO.get(b, ())
                   else f"rounded to the nearest {bn} value")
            below = ("; graftkit delta says how much of the movement rounding to bf16 erases (its precision line)"
                     if b == "BF16" and r not in EXACT_INTO.get(b, ()) else "")
            out.append(f"RL {rn} cast to base {bn} ({scope}), {how}: the graft keeps base's dtype, and "
                       f"graft(all groups) == RL cast to {bn}{below}")
    return tuple(out)


def check_pair(base: Checkpoint, rl: Checkpoint, taxonomy: Taxonomy, *, dtypes: str = "same",
               dtype_flag: str | None = None) -> tuple[str, ...]:
    """Raise a one-line error unless both hold the same tensors with equal shapes, and dtypes that
    ``dtypes`` (:data:`DTYPE_POLICIES`) accepts; return one note per differing dtype pair.

    Integer and boolean tensors must have one dtype in both under every policy. ``dtype_flag`` is the
    command's option that allows differing floating dtypes, named in the ``"same"`` refusal."""
    if dtypes not in DTYPE_POLICIES:
        raise GraftkitError(f"dtypes={dtypes!r} is not a dtype policy", f"use one of {', '.join(DTYPE_POLICIES)}")
    only_base = [n for n in base.metas if n not in rl.metas]
    only_rl = [n for n in rl.metas if n not in base.metas]
    if only_base or only_rl:
        parts = []
        if only_base:
            parts.append(f"only in base: {', '.join(only_base[:5])}" + (" …" if len(only_base) > 5 else ""))
        if only_rl:
            parts.append(f"only in RL: {', '.join(only_rl[:5])}" + (" …" if len(only_rl) > 5 else ""))
        raise GraftkitError(
            f"base {base.path} and RL {rl.path} hold different tensors ({'; '.join(parts)})",
            "pass two checkpoints of the same architecture",
        )
    for n, mb in base.metas.items():
        mr = rl.metas[n]
        if mb.shape != mr.shape:
            if taxonomy.roles[n].group in ("embed", "lm_head") and mb.shape[1:] == mr.shape[1:]:
                raise GraftkitError(
                    f"vocabulary size differs: base {n} {list(mb.shape)} vs RL {list(mr.shape)}",
                    "pass --shared-vocab to compare and graft over the rows both share (the extra rows reported), "
                    "or pass two checkpoints that share a tokenizer",
                )
            raise GraftkitError(
                f"tensor {n} has shape {list(mb.shape)} in base but {list(mr.shape)} in RL",
                "pass two checkpoints of the same architecture and size",
            )
    groups = _dtype_groups(base, rl)
    if not groups:
        return ()
    for (b, r), names in groups.items():
        if b not in FLOAT_CODES or r not in FLOAT_CODES:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise GraftkitError(
                f"tensor {names[0]}{more} is {dtype_name(b)} in base but {dtype_name(r)} in RL",
                "only floating-point tensors may differ in dtype: save both checkpoints with the same integer dtypes",
            )
    if dtypes == "same":
        n_diff = sum(len(v) for v in groups.values())
        pairs = "; ".join(f"{dtype_name(b)} in base, {dtype_name(r)} in RL: {', '.join(names[:3])}"
                          + (f" … ({len(names)} tensors)" if len(names) > 3 else "")
                          for (b, r), names in groups.items())
        raise GraftkitError(
            f"{n_diff} of {len(base.metas)} tensors differ in dtype between base {base.path} and RL {rl.path} "
            f"({pairs})",
            f"the output keeps base's dtype: pass {dtype_flag} to round RL's values to it" if dtype_flag
            else "save both checkpoints in the same dtype",
        )
    return dtype_notes(base, rl, dtypes)


def cast_like(rl: Checkpoint, base: Checkpoint) -> Checkpoint:
    """``rl`` read in ``base``'s dtypes: each tensor whose dtype differs is cast on reading (round to
    nearest, torch's ``.to``, one tensor at a time), the others are ``rl``'s own, bytes included; the
    casts are stated in :attr:`Checkpoint.notes`. ``rl`` itself when no dtype differs. Call it after
    ``check_pair(base, rl, tax, dtypes="cast")``, which refuses integer mismatches."""
    differ = {n: mb.code for n, mb in base.metas.items() if n in rl.metas and rl.metas[n].code != mb.code}
    if not differ:
        return rl
    metas = {n: TensorMeta(n, differ[n], m.shape) if n in differ else m for n, m in rl.metas.items()}

    def read(name: str):
        t = rl.read(name)
        return t.to(torch_dtype(differ[name])) if name in differ else t

    return dataclasses.replace(rl, metas=metas, reader=read, raw={n: e for n, e in rl.raw.items() if n not in differ},
                               notes=(*rl.notes, *dtype_notes(base, rl, "cast")))


def shared_vocab(rl: Checkpoint, base: Checkpoint, taxonomy: Taxonomy) -> Checkpoint:
    """``rl`` with its token-indexed tensors (``embed`` / ``lm_head`` matrices whose other dimensions match
    the base's) cut to the rows both models share, the first ``min(V_base, V_rl)``: a vocabulary resized
    in RL (added tokens) is compared and grafted over the common rows. The cut and the extra rows (their
    count and mean row norm) are stated in :attr:`Checkpoint.notes`; a base with more rows than RL is
    refused (those rows have no RL counterpart to graft). ``rl`` itself when no vocabulary differs."""
    cut: dict[str, int] = {}
    for n, mb in base.metas.items():
        mr = rl.metas.get(n)
        if mr is None or mr.shape == mb.shape or taxonomy.roles[n].group not in ("embed", "lm_head"):
            continue
        if mr.shape[1:] != mb.shape[1:] or len(mb.shape) < 1:
            continue  # not a vocabulary difference: check_pair names it
        if mr.shape[0] < mb.shape[0]:
            raise GraftkitError(f"{n}: the base has {mb.shape[0]} token rows but RL only {mr.shape[0]}",
                                "pass the model with the larger vocabulary as --from (RL), or resize the base")
        cut[n] = mb.shape[0]
    if not cut:
        return rl
    notes = []
    for n, rows in cut.items():
        extra = rl.read(n)[rows:].float()
        norm = float(extra.norm(dim=-1).mean()) if extra.numel() else 0.0
        notes.append(f"{n}: RL has {rl.metas[n].shape[0] - rows} extra token rows (vocabulary {rl.metas[n].shape[0]} "
                     f"vs base {rows}; mean row norm {norm:.4g}): compared and grafted over the {rows} shared rows")
    metas = {n: TensorMeta(n, m.code, (cut[n], *m.shape[1:])) if n in cut else m for n, m in rl.metas.items()}

    def read(name: str):
        t = rl.read(name)
        return t[: cut[name]] if name in cut else t

    return dataclasses.replace(rl, metas=metas, reader=read, raw={n: e for n, e in rl.raw.items() if n not in cut},
                               notes=(*rl.notes, *notes), deltas=None)


# --------------------------------------------------------------------------- is it a fine-tune at all?

#: ρ = ‖Δ‖_F/‖W_base‖_F above which a matrix has moved "far" (by its own norm or more). Not 0.5: the tiny
#: demo's collapse runs (GRPO at lr 1e-2 for 40 steps) reach a median ρ of 0.40–0.47 with up to 11 of 30
#: matrices above 0.5 yet keep cos(W, W+Δ) ≈ 0.91, while an unrelated initialisation has ρ ≈ 1.0–1.4 and cos
#: ≈ 0.01: the cosine separates them, and ρ > 1 in most matrices only backs it up.
FAR_RHO = 1.0
#: The share of 2-D matrices that must be far (strictly more than it) to make a pair implausible.
FAR_SHARE = 0.5
#: The median cos(W_base, W_rl) below which a pair is implausible.
MIN_MEDIAN_COS = 0.5
FINE_TUNE_RULE = (f"not a fine-tune when rho = ||W_rl - W_base||_F/||W_base||_F > {FAR_RHO} in more than "
                  f"{FAR_SHARE:.0%} of the 2-D floating-point matrices, or the median over them of "
                  f"cos(W_base, W_rl) = <W_base, W_rl>/(||W_base|| ||W_rl||) is below {MIN_MEDIAN_COS}")
"""The rule :class:`PairDistance` applies. Fine-tunes move a matrix by a small fraction of its norm (RL
runs ρ ~ 1e-4–1e-2, SFT ~1e-2–1e-1) and keep it pointing where it pointed (cos ≈ 1); an independent
initialisation of the same shapes moves every matrix by about its own norm (ρ ≈ √2 for equal scales, ≈ 1
against a trained base) and is orthogonal to it (cos ≈ 0). The thresholds sit far from both: a genuine RL
run fails neither, an unrelated model fails both. Matrices where one side is zero have no cosine (NaN,
left out of the median); 1-D tensors (norms, biases) are not judged."""

CHUNK = 1 << 18  # 256K entries: 1 MB of float32 per operand
_ROW = 1024


def blocked_dot(x: np.ndarray, y: np.ndarray) -> float:
    """⟨x, y⟩ summed in blocks of 1024 (float32 within a block, float64 across): ~1e-9 relative."""
    n = x.size - x.size % _ROW
    head = np.einsum("ij,ij->i", x[:n].reshape(-1, _ROW), y[:n].reshape(-1, _ROW)).sum(dtype=np.float64)
    return float(head) + float(np.dot(x[n:].astype(np.float64), y[n:].astype(np.float64)))


def exact_float(x: np.ndarray, code: str, out: np.ndarray) -> np.ndarray:
    """Chunk ``x`` (typed as :meth:`Checkpoint.array` gives it, dtype ``code``) converted exactly to
    ``out``'s float dtype, written into ``out``.

    bfloat16 → float32 is the 16-bit pattern shifted into the high half of a float32 — exact for every
    value, NaN and ±Inf included. Conversions run in numpy into preallocated buffers: on a shared CPU
    torch's threaded conversions and fresh 1 MB allocations (page faults each time) cost more than the
    arithmetic. float8 goes through torch (numpy has no float8).
    """
    o = out[: x.size]
    if code == "BF16" and o.dtype == np.float32:
        np.left_shift(x, 16, out=o.view(np.uint32), dtype=np.uint32)
    elif code == "BF16":
        np.copyto(o, np.left_shift(x.astype(np.uint32), 16).view(np.float32))
    elif code.startswith("F8"):
        import torch

        np.copyto(o, torch.from_numpy(np.ascontiguousarray(x)).view(torch_dtype(code)).to(torch.float64).numpy())
    else:
        np.copyto(o, x)
    return o


def _chunk_sums(b_raw: np.ndarray, r_raw: np.ndarray, code_base: str, code_rl: str, b_buf: np.ndarray,
                r_buf: np.ndarray) -> tuple[float, float, float]:
    """(‖W‖², ‖Δ‖², ⟨W, Δ⟩) of one chunk pair, NaN/±Inf entries left out (see :func:`matrix_sums`)."""
    b = exact_float(b_raw, code_base, b_buf)
    d = np.subtract(exact_float(r_raw, code_rl, r_buf), b, out=r_buf[: b.size])
    s = (blocked_dot(b, b), blocked_dot(d, d), blocked_dot(b, d))
    if not all(np.isfinite(s)):
        bad = ~(np.isfinite(b) & np.isfinite(d))
        b[bad], d[bad] = 0.0, 0.0
        s = (blocked_dot(b, b), blocked_dot(d, d), blocked_dot(b, d))
    return s


def _sums_of_chunks(pairs, code_base: str, code_rl: str, chunk: int) -> tuple[float, float, float]:
    work = np.float64 if upcast_code(code_base, code_rl) == "F64" else np.float32
    b_buf, r_buf = np.empty(chunk, work), np.empty(chunk, work)
    sb = sd = dbd = 0.0
    for b_raw, r_raw in pairs:
        s = _chunk_sums(b_raw, r_raw, code_base, code_rl, b_buf, r_buf)
        sb, sd, dbd = sb + s[0], sd + s[1], dbd + s[2]
    return sb, sd, dbd


def matrix_sums(w_base: np.ndarray, w_rl: np.ndarray, code_base: str, code_rl: str,
                chunk: int = CHUNK) -> tuple[float, float, float]:
    """(‖W‖², ‖Δ‖², ⟨W, Δ⟩) of W = ``w_base``, Δ = ``w_rl`` − W, both typed as :meth:`Checkpoint.array`
    gives them (dtypes ``code_base``, ``code_rl``), upcast exactly to :func:`upcast_code` before
    subtracting. Entries where W or Δ is NaN/±Inf are left out. Chunk by chunk: memory stays bounded."""
    fb, fr = w_base.reshape(-1), w_rl.reshape(-1)
    m = max(1, min(chunk, fb.size))
    return _sums_of_chunks(((fb[i:i + chunk], fr[i:i + chunk]) for i in range(0, fb.size, chunk)),
                           code_base, code_rl, m)


def streamed_matrix_sums(base: Checkpoint, rl: Checkpoint, name: str, chunk: int = CHUNK,
                         every: int = 1) -> tuple[float, float, float]:
    """:func:`matrix_sums` of tensor ``name`` of two checkpoints, read a chunk at a time
    (:meth:`Checkpoint.array_chunks`): the same chunks, so the same sums bit for bit, with memory of one
    read buffer per side whatever the tensor's size. ``every`` = k sums chunks 0, k, 2k, … only."""
    m = max(1, min(chunk, base.metas[name].numel))
    return _sums_of_chunks(zip(base.array_chunks(name, chunk, every=every), rl.array_chunks(name, chunk, every=every)),
                           base.metas[name].code, rl.metas[name].code, m)


def judged_matrices(base: Checkpoint) -> list[str]:
    """The tensors :class:`PairDistance` judges: every 2-D floating-point tensor of ``base``."""
    return [n for n, m in base.metas.items() if len(m.shape) == 2 and m.code in FLOAT_CODES]


@dataclass(frozen=True)
class PairDistance:
    """How far RL is from base, per 2-D matrix: ρ = ‖Δ‖_F/‖W_base‖_F and cos(W_base, W_rl), judged by
    :data:`FINE_TUNE_RULE` (:attr:`plausible`)."""

    names: tuple[str, ...]
    rho: np.ndarray
    """[matrix] ‖Δ‖_F/‖W_base‖_F (inf where the base matrix is zero and RL's is not)."""
    cos: np.ndarray
    """[matrix] ⟨W_base, W_rl⟩/(‖W_base‖ ‖W_rl‖), NaN where either is zero."""

    @property
    def n_far(self) -> int:
        return int(np.count_nonzero(self.rho > FAR_RHO))

    @property
    def median_rho(self) -> float:
        r = self.rho[~np.isnan(self.rho)]
        return float(np.median(r)) if r.size else float("nan")

    @property
    def median_cos(self) -> float:
        c = self.cos[~np.isnan(self.cos)]
        return float(np.median(c)) if c.size else float("nan")

    @property
    def unmoved(self) -> bool:
        """Whether no judged matrix moved at all (‖Δ‖_F = 0 in each; there are some): RL equals base there."""
        return bool(self.names) and bool(np.all(self.rho == 0))

    @property
    def plausible(self) -> bool:
        """Whether the pair can be a fine-tune by :data:`FINE_TUNE_RULE` (no matrices: nothing refutes it)."""
        if not self.names:
            return True
        return not (self.n_far > FAR_SHARE * len(self.names) or self.median_cos < MIN_MEDIAN_COS)

    @property
    def clearly_plausible(self) -> bool:
        """:attr:`plausible` with both thresholds halved towards a fine-tune: ρ > FAR_RHO/2 in at most
        FAR_SHARE/2 of the matrices and a median cos of at least (1 + MIN_MEDIAN_COS)/2. RL and SFT
        fine-tunes (ρ ≤ 0.1, cos ≈ 1) sit far inside; an estimate from a sample of entries that passes this
        cannot be one whose whole pair fails :attr:`plausible` unless the sample missed most of what moved."""
        if not self.names:
            return True
        near = int(np.count_nonzero(self.rho > FAR_RHO / 2))
        return near <= FAR_SHARE / 2 * len(self.names) and self.median_cos >= (1 + MIN_MEDIAN_COS) / 2

    def summary(self) -> str:
        """The figures, one phrase: ‖Δ‖/‖W‖ > 0.5 in 84 of 84 matrices (median 1.01), median cos(W, W+Δ) 0.01."""
        return (f"‖Δ‖/‖W‖ > {FAR_RHO:g} in {self.n_far} of {len(self.names)} matrices (median "
                f"{self.median_rho:.3g}), median cos(W, W+Δ) {self.median_cos:.2f}")

    def as_dict(self) -> dict:
        return {"matrices": len(self.names), "far": self.n_far, "far_rho": FAR_RHO,
                "median_rel_delta": self.median_rho, "median_cos": self.median_cos,
                "plausible": self.plausible, "unmoved": self.unmoved, "rule": FINE_TUNE_RULE}


def pair_distance(names, sumsq_base, sumsq_delta, dot_base_delta) -> PairDistance:
    """:class:`PairDistance` from per-matrix sums ‖W‖², ‖Δ‖², ⟨W, Δ⟩ (``[matrix]`` each), with
    ‖W_rl‖² = ‖W‖² + 2⟨W, Δ⟩ + ‖Δ‖² and ⟨W, W_rl⟩ = ‖W‖² + ⟨W, Δ⟩."""
    sb, sd, dbd = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (sumsq_base, sumsq_delta, dot_base_delta))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(sb > 0, np.sqrt(sd / sb), np.where(sd > 0, np.inf, 0.0))
        srl = np.maximum(sb + 2 * dbd + sd, 0.0)
        cos = np.where((sb > 0) & (srl > 0), (sb + dbd) / np.sqrt(sb * srl), np.nan)
    return PairDistance(tuple(names), rho, np.clip(cos, -1.0, 1.0))


def stream_pair_distance(base: Checkpoint, rl: Checkpoint, workers: int = 2, every: int = 1,
                         chunk: int = CHUNK) -> PairDistance:
    """:class:`PairDistance` of a checked pair, from :func:`streamed_matrix_sums` of each matrix pair (numpy,
    no torch; one read buffer per side in memory), ``workers`` matrices at a time in threads (``pread`` and
    numpy's loops release the GIL). The sums of a matrix do not depend on ``workers``. ``every`` = k judges
    each matrix on every k-th chunk of its entries (:func:`guard_pair_distance`)."""
    names = judged_matrices(base)
    if workers > 1 and len(names) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graftkit-pair") as ex:
            rows = list(ex.map(lambda n: streamed_matrix_sums(base, rl, n, chunk, every), names))
    else:
        rows = [streamed_matrix_sums(base, rl, n, chunk, every) for n in names]
    sums = np.array(rows, dtype=np.float64).reshape(len(names), 3)
    return pair_distance(names, sums[:, 0], sums[:, 1], sums[:, 2])


#: The share of each matrix's entries the graft's guard reads first (every k-th chunk of CHUNK entries).
GUARD_EVERY = 8


def guard_pair_distance(base: Checkpoint, rl: Checkpoint, every: int = GUARD_EVERY,
                        chunk: int = CHUNK) -> tuple[PairDistance, bool]:
    """(:class:`PairDistance`, whether it is a sample): the fine-tune guard of a command that needs only the
    verdict (``graft``'s export). Each matrix is first judged on an evenly spread 1/``every`` of its entries
    (every ``every``-th chunk; a matrix of one chunk whole); a pair the sample shows to be a fine-tune by a
    wide margin (:attr:`PairDistance.clearly_plausible`) passes on it; any other pair is judged again on
    every entry, so a refusal and the figures it states always come from the whole pair. So is a sample in
    which nothing moved: "RL equals base" (:attr:`PairDistance.unmoved`) is said only of the whole pair."""
    sample = stream_pair_distance(base, rl, every=every, chunk=chunk)
    if every > 1 and sample.clearly_plausible and not sample.unmoved:
        return sample, True
    return stream_pair_distance(base, rl, chunk=chunk), False


def parent_record(model: Path) -> dict | None:
    """The parent a model folder's ``graftkit.json`` records (``base_model``: ``path`` and, where graftkit wrote it,
    ``fingerprint``), None when it records none. The one reader of that record (:func:`.resolve.base_of` too)."""
    model = Path(model)
    if not (model.is_dir() and (model / PROVENANCE).is_file()):
        return None
    record = _read_json(model / PROVENANCE).get("base_model") or {}
    return dict(record) if record.get("path") or record.get("fingerprint") else None


def _fingerprint_as(ckpt: Checkpoint, recorded: str) -> str | None:
    """``ckpt``'s fingerprint computed the way ``recorded`` (``"<algorithm>:<hex>"``) was; None for an algorithm
    graftkit does not compute."""
    algorithm = recorded.split(":", 1)[0] if ":" in recorded else ""
    if algorithm not in ALGORITHMS:
        return None
    return combine(file_digests(_fingerprinted_files(ckpt), algorithm), algorithm)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@dataclass(frozen=True)
class PairVerdict:
    """How :func:`judge_pair` took a pair."""

    accepted: str
    """``"fine-tune"`` (:data:`FINE_TUNE_RULE` finds it one), ``"recorded parent"`` (the rule finds it far, but RL's
    graftkit.json records this very base as its parent, fingerprint equal) or ``"forced"`` (``--force-pair``)."""
    notes: tuple[str, ...] = ()
    """One note for a pair analysed although the rule finds it far (its figures and why it was analysed)."""


#: How a pair the distance rule finds far is still analysed: the record that names the base.
RECORDED_PARENT_RULE = ("a pair the fine-tune rule calls implausible is analysed when the RL checkpoint's graftkit.json "
                        "records a parent (base_model) whose fingerprint equals the given base's; without such a "
                        "record, or with one that names another base, it is refused unless --force-pair")


def judge_pair(dist: PairDistance, base: Checkpoint, rl: Checkpoint, *, force: bool, base_flag: str = "--base",
               force_flag: str = "--force-pair") -> PairVerdict:
    """:data:`FINE_TUNE_RULE` applied to ``dist`` with RL's record (:data:`RECORDED_PARENT_RULE`): a plausible pair
    passes silently; a far one whose graftkit.json records this base (fingerprint equal) is analysed with one note
    of its figures; any other far pair is refused with its figures and what would help, unless ``force`` (then
    one note says it was analysed anyway). ``base_flag`` and ``force_flag`` are the command's options."""
    if dist.plausible:
        return PairVerdict("fine-tune")
    # Fingerprinting the base reads every byte of it (blake3; cached per file afterwards): it is done only here,
    # where the rule would refuse, never for the plausible pairs nearly every command sees.
    record = parent_record(rl.path) or {}
    recorded_fp, recorded_path = record.get("fingerprint"), record.get("path")
    actual = _fingerprint_as(base, recorded_fp) if recorded_fp else None
    if actual is not None and actual == recorded_fp:
        return PairVerdict("recorded parent", (
            f"RL {rl.path} moved far from base {base.path}: {dist.summary()}; analysed as a fine-tune because its "
            f"graftkit.json records this base as its parent (fingerprint {recorded_fp[:19]}… equal)",))
    what = f"RL {rl.path} is not a fine-tune of base {base.path}: {dist.summary()}"
    here = recorded_path is not None and _same_path(Path(recorded_path), base.path)
    anyway = f"{force_flag} to analyse it against this base anyway"
    if not record:
        why = "and it records no parent (no graftkit.json base_model) that could show it was trained from this base"
        fix = (f"if RL was trained from this base (a high learning rate can move it this far), pass {force_flag}; "
               f"if not, pass the base it was trained from as {base_flag}")
    elif recorded_fp is None or actual is None:
        named = "this base" if here else f"{recorded_path}"
        how = "without a fingerprint" if recorded_fp is None else f"by a fingerprint graftkit cannot compute ({recorded_fp})"
        why = f"and its graftkit.json records {named} as its parent {how}, which cannot show it is this base's weights"
        fix = f"pass {anyway}" if here or not recorded_path or not Path(recorded_path).exists() else \
            f"pass its recorded parent {recorded_path} as {base_flag}, or {anyway}"
    elif here:
        why = (f"and the base at the path its graftkit.json records has changed since (fingerprint {actual[:19]}…, "
               f"recorded {recorded_fp[:19]}…)")
        fix = f"restore the base RL was trained from at {recorded_path}, or pass {anyway}"
    else:
        where = f"{recorded_path} " if recorded_path else ""
        why = (f"and its graftkit.json records another parent, {where}(fingerprint {recorded_fp[:19]}…; this base is "
               f"{actual[:19]}…)")
        fix = (f"pass its recorded parent {recorded_path} as {base_flag}, or {anyway}"
               if recorded_path and Path(recorded_path).exists() else
               f"pass the base it was trained from (fingerprint {recorded_fp[:19]}…) as {base_flag}, or {anyway}")
    if force:
        return PairVerdict("forced", (f"{what}, {why} (analysed anyway: {force_flag})",))
    raise GraftkitError(f"{what}, {why}", fix)


def check_fine_tune(dist: PairDistance, base: Checkpoint, rl: Checkpoint, *, force: bool,
                    base_flag: str = "--base", force_flag: str = "--force-pair") -> tuple[str, ...]:
    """:func:`judge_pair`'s refusal, or its notes: none for a plausible pair, one for a far pair analysed (its
    recorded parent is this base, or ``force``); and one that says so where no matrix moved at all
    (:attr:`PairDistance.unmoved`: every measure that divides by ‖Δ‖ is undefined there). ``base_flag`` and
    ``force_flag`` are the command's options, named in the hint."""
    notes = judge_pair(dist, base, rl, force=force, base_flag=base_flag, force_flag=force_flag).notes
    if dist.unmoved:
        notes += (f"RL {rl.path} has not moved from base {base.path} in any of its {len(dist.names)} matrices "
                  "(‖Δ‖_F = 0 in each; 1-D tensors are not judged): their delta is a zero matrix (rank 0, every "
                  "ratio over ‖Δ‖ undefined) and a graft of them copies the base",)
    return notes


def _fingerprinted_files(ckpt: Checkpoint) -> list[Path]:
    files = list(ckpt.weight_files)
    cfg = ckpt.folder / "config.json"
    if ckpt.path.is_dir() and cfg.is_file():
        files.append(cfg)
    return files


def _description(ckpt: Checkpoint, fingerprint_value: str) -> dict:
    desc = {"path": str(Path(ckpt.path).resolve()), "kind": ckpt.kind, "fingerprint": fingerprint_value,
            "precision": ckpt.precision}
    return {**desc, "notes": list(ckpt.notes)} if ckpt.notes else desc


def describe(ckpt: Checkpoint) -> dict:
    """Path, kind, content fingerprint (``"blake3:<hex>"``, :mod:`.fingerprint`) and precision (dtype read, source,
    :attr:`Checkpoint.precision`) of a checkpoint, for provenance records."""
    return _description(ckpt, fingerprint(_fingerprinted_files(ckpt)))


def describe_later(ckpt: Checkpoint) -> Callable[[], dict]:
    """:func:`describe`, its fingerprint computed in a background thread from now on; call the returned
    function for the description (it waits for the hash). For work that reads the checkpoint anyway
    (a graft's export): the hash overlaps it instead of preceding it."""
    wait = fingerprint_later(_fingerprinted_files(ckpt))
    return lambda: _description(ckpt, wait())
