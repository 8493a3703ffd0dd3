"""Exact spectral measures of one matrix (a weight, a delta) and of a pair W₀ → W₁.

Every function is pure: a tensor or array in, a number, an array or a small frozen dataclass out.
The literature uses several incompatible "effective rank" conventions, so each measure here has one
name and one formula, listed in ``CONVENTIONS`` and returned next to the value by ``measures``:

- ``erank``: Roy & Vetterli (2007), exp(H(p)), p_k = σ_k / Σσ.
- ``erank_sq``: the σ² variant exp(H(σ²/Σσ²)) (Diff-eRank; WeightWatcher's ``entropy`` before its
  normalisation by log rank). Always ≤ ``erank``.
- ``stable_rank``: Σσ² / σ₁² (WeightWatcher's ``stable_rank``).
- ``participation_ratio``: (Σλ)² / Σλ² on eigenvalues λ — σ² for a matrix, the covariance
  eigenvalues for activations (centring is the caller's choice and must be recorded there).
- ``rankme``: Garrido et al. (2023), exp(−Σ p_k log p_k) with p_k = σ_k / ‖σ‖₁ + ε, as in the paper:
  ε is added after normalising and p is *not* renormalised, which biases the value slightly upward.
- ``numerical_rank``: #{σ_k > tol} with an absolute tolerance; by default, for a matrix (a weight, an
  activation covariance) tol = max(m, n) · eps(dtype) · σ₁, where dtype is the dtype of the tensor as
  given (a bf16 matrix is ranked with bf16's eps, never with the eps of the fp64 copy the spectrum is
  computed from). A delta of two stored matrices has its own rule, below.

Numerical rank of a delta Δ = W₁ − W₀ of two stored matrices (``delta_spectrum``, ``measures(...,
stored=(W₀, W₁))``, ``delta_tolerance``):

    tol_Δ = eps(d) · (max_i ‖S_i,:‖₂ + max_j ‖S_:,j‖₂),   S_ij = max(|W₀_ij|, |W₁_ij|),

d the coarser (larger-eps) storage dtype of W₀ and W₁, whatever dtype Δ is computed in (fp32 arithmetic on
bf16 weights uses bf16's eps). Why: the noise in Δ is set by the stored weights, not by Δ. Storing a value
in d rounds it to nearest, an error of at most u·|x|, u = eps(d)/2 (Higham 2002, Thm 2.2), so with both
operands rounded Δ̂ = Δ + E, |E_ij| ≤ eps(d)·S_ij; the subtraction adds nothing (exact for bf16/fp16
operands upcast to fp32, and by Sterbenz's lemma, Thm 2.5, wherever |Δ_ij| ≤ |W_ij|). Rounding errors behave as
independent zero-mean variables (Higham & Mary 2019), and a matrix of independent zero-mean entries
|E_ij| ≤ β_ij has ‖E‖₂ of the order of its largest row plus largest column norm of β (Latała 2005;
Bandeira & van Handel 2016): here ≤ tol_Δ, and in practice about 5× below it (a rounding error uniform on
±u|x| has standard deviation u|x|/√3; measured on Gaussian and Student-t weights of 32×64 to 1024×1024). By Weyl's
inequality σ_{r+1}(Δ̂) ≤ ‖E‖₂, so an exact rank-r update reports at most r, and its directions with
σ_k > 2·tol_Δ are counted. The matrix rule max(m, n)·eps·σ₁(Δ) scales with Δ instead, so the rounding
noise of weights much larger than Δ lands above it (a merged rank-8 LoRA reads as nearly full rank);
max(m, n)·eps(d)·σ₁(W), the matrix rule on the stored weights, bounds tol_Δ from above (max(m, n) ≥ 4) but
is looser by a factor of about max(m, n) (in bf16 it exceeds σ₁ of any realistic update: rank 0); the
deterministic bound eps(d)·(‖W₀‖_F + ‖W₁‖_F) needs no independence but is looser by about √min(m, n).

Spectra: by default σ = sqrt(eigvalsh(G)) with G the float64 Gram matrix of the smaller side
(W Wᵀ when m ≤ n, else Wᵀ W), computed from an upcast copy; eigenvalues at or below the Gram's
rounding floor max(m, n)·eps64·λ₁ (tiny negative ones included) are set to 0, so this route resolves σ
down to about sqrt(max(m, n)·eps64)·σ₁ ≈ 1e-7·σ₁ (``Spectrum.floor``); ``measures`` counts the numerical
rank on the SVD when its tolerance lies below that floor (float64 inputs).
``method="svd"`` takes the float64 SVD instead. An fp32 Gram is never used (it is off by up to 4% on
near-low-rank matrices).

Singular vectors (principal angles, energy in the top-k subspace, intruder dimensions) come from the same
float64 Gram, one decomposition per matrix shared by every measure (:func:`left_singular`,
:func:`pair_measures`): W Wᵀ's eigenvectors (``eigh``) are W's left singular vectors; for a tall W, WᵀW's are
its right ones v_j, and u_j = W v_j / σ_j where the Gram resolves every σ_j divided by to ``VECTOR_RTOL``
(its floor at most 1e-6 of σ_j²); otherwise W is first reduced to its Householder QR and RRᵀ's eigenvectors
are carried back by Q, dividing by nothing. Precision: a Gram's eigenvector is resolved to about
eps64·σ₁²/|σ_j² − σ_k²| for its nearest σ_k, the SVD's to eps64·σ₁/|σ_j − σ_k|; measured against
numpy's float64 SVD, the cosines intruder dimensions are counted on agree within 1e-11 on spectra spanning
up to six decades (every route, with an intruder spread over the small σ; the tests require 1e-9) and 6e-14
on SmolLM2-135M's 211 matrices (an RL copy moved by 1e-4 of each matrix's RMS), the energy shares within
1e-13 relative, and every intruder count equals the SVD's. Where singular vectors are not unique (equal σ, or σ below the floor)
any basis is theirs, the SVD's included, and a measure that reads single vectors (intruders) depends on
the basis taken.

Pair measures, Δ = W₁ − W₀:
- ``principal_angles``: angles (radians, ascending) between the top-k left (or right) singular
  subspaces of W₀ and W₁ (Björck & Golub 1973; cosines from the SVD of U₀ᵀU₁, small angles from sines).
- ``spectral_drift``: ‖σ(W₁) − σ(W₀)‖₂ / ‖σ(W₀)‖₂.
- ``delta_energy_in_topk``: ‖U_kᵀ Δ‖_F² / ‖Δ‖_F², U_k the top-k left singular vectors of W₀.
- ``intruder_dimensions``: among the top-k left singular vectors of W₁, those whose largest |cos| with
  every left singular vector of W₀ is < ε (Shuttleworth et al. 2024, "LoRA vs full fine-tuning:
  an illusion of equivalence"; k = 10, ε = 0.5 by default).
- ``top1_energy``: σ₁(Δ)² / ‖Δ‖_F².

Devices: every function that computes a spectrum takes ``device`` (None or "cpu": the CPU; a torch device
or its name, e.g. "cuda:0"). The matrix stays where it is (a checkpoint tensor as read, on the host)
and goes to the device a block of rows at a time in its stored dtype, where the block is upcast to
float64 and added into the float64 Gram; ``eigvalsh`` runs there in float64 too, and only the eigenvalues
come back. Device memory is the Gram plus one block (plus, for the pair measures' singular vectors, the
Gram's eigenvectors, and for a tall matrix that needs its QR, two float64 copies of it). On the CPU the Gram's column tiles on or above the diagonal are multiplied
(:func:`_gram_upper`); on a GPU the whole product is taken at once. For float32, bfloat16 and float16
weights both give the same bits (their products are exact in float64, and so in practice are the sums);
what differs is the eigensolver's rounding (cuSOLVER against LAPACK): within 1e-10 relative on every
measure except erank and rankme, which weight σ itself and so take in the tail of small σ that the Gram
resolves only to about sqrt(n·eps64)·σ₁; those agree within 1e-8 (measured up to 9e-10 between two
LAPACKs on matrices whose σ span four to six decades; tested).

Matrices must be 2-D. A stacked 3-D tensor (e.g. MoE experts ``[n_experts, out, in]``) is refused:
pass one expert matrix at a time.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch

from ..core.errors import GraftkitError
# the measures' functions and conventions live in the registry (:mod:`.metrics`); re-exported here
from .metrics import (CONVENTIONS, RANKME_EPS, SPECTRUM, erank, erank_sq, participation_ratio,  # noqa: F401
                      rankme, stable_rank, top1_energy_of)
from .metrics import as_sigma as _sigma

METHODS = {"gram": "gram-eigvalsh-fp64", "svd": "svd-fp64"}
VECTORS_METHOD = "svd-fp64"
_EPS64 = float(np.finfo(np.float64).eps)

@dataclass(frozen=True, eq=False)
class Spectrum:
    """Singular values of one matrix and how they were obtained.

    ``sigma`` is float64, descending, length min(shape). ``dtype`` is the dtype whose rounding the default
    numerical-rank tolerance models and ``dtype_eps`` its machine epsilon: for a matrix, the dtype of the
    tensor as given (before the float64 upcast); for a delta (``ref_norm`` set), the coarser storage dtype
    of its two operands, whatever dtype the difference was computed in. ``ref_norm`` is, for a delta
    only, the rounding reference of the stored operands (:func:`rounding_reference`); None for a matrix.
    """

    sigma: np.ndarray
    shape: tuple[int, int]
    dtype: str
    dtype_eps: float
    method: str
    ref_norm: float | None = None

    @property
    def is_delta(self) -> bool:
        return self.ref_norm is not None

    def default_tol(self) -> float:
        """Absolute: max(m, n) · eps(dtype) · σ₁ for a matrix; eps(stored dtype) · ref_norm for a delta."""
        if self.is_delta:
            return float(self.dtype_eps * self.ref_norm)
        return float(max(self.shape) * self.dtype_eps * (self.sigma[0] if self.sigma.size else 0.0))

    def tol_rule(self) -> str:
        if self.is_delta:
            return delta_tol_rule(self.dtype)
        return f"max(shape)*eps({self.dtype})*sigma_1 (absolute)"

    def floor(self) -> float:
        """The smallest σ this method tells apart from 0: sqrt(max(m, n)·eps64)·σ₁ for the Gram route
        (it works on σ²), max(m, n)·eps64·σ₁ for the SVD."""
        s1 = float(self.sigma[0]) if self.sigma.size else 0.0
        rel = max(self.shape) * _EPS64
        return (np.sqrt(rel) if self.method == METHODS["gram"] else rel) * s1


@dataclass(frozen=True)
class Intruders:
    """Intruder dimensions of W₁ relative to W₀ (left singular vectors)."""

    indices: tuple[int, ...]  # positions among W₁'s top-k left singular vectors (0 = largest σ)
    max_abs_cos: tuple[float, ...]  # for each of the top-k: max |cos| with any W₀ singular vector
    k: int
    eps: float

    @property
    def count(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, eq=False)
class RowBlocks:
    """A tall matrix [rows, cols] (rows > cols) given as its row blocks in order, in a float dtype narrower
    than float64: a checkpoint tensor read from its file a block at a time, so the Gram route (WᵀW, summed
    over the blocks) never holds it whole. ``blocks(n)`` yields torch tensors of ``n`` rows (the last
    shorter), each valid until the next is taken. Anything that needs the matrix whole (the SVD) reads it
    whole (:meth:`whole`)."""

    shape: tuple[int, int]
    dtype: torch.dtype
    blocks: Callable[[int], Iterable[torch.Tensor]]

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or self.shape[0] <= self.shape[1]:
            raise GraftkitError(f"RowBlocks of shape {list(self.shape)}: expected a tall matrix [rows > cols]",
                                "pass the matrix itself")
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise GraftkitError(f"RowBlocks in {self.dtype}: expected float32, bfloat16 or float16",
                                "pass the matrix itself")

    def whole(self) -> torch.Tensor:
        return torch.cat([b.clone() for b in self.blocks(max(1, self.shape[0]))])


# ---------------------------------------------------------------------------------------------------
# input handling


def _validated(W: Any, name: str = "W", check_finite: bool = True) -> tuple[Any, str, float]:
    """(W itself, original dtype name, eps of the original dtype) of one 2-D, non-empty, finite float matrix.

    ``check_finite=False`` leaves the NaN/inf check to the caller (the Gram route does it on the Gram).
    """
    if isinstance(W, RowBlocks):
        if check_finite:  # only the Gram route, which checks its Gram, streams
            W = W.whole()
        else:
            dtype = str(W.dtype).removeprefix("torch.")
            return W, dtype, float(torch.finfo(W.dtype).eps)
    if isinstance(W, torch.Tensor):
        if not (W.is_floating_point()):
            raise GraftkitError(f"{name} has dtype {W.dtype}, expected a floating-point tensor",
                                "pass the weight as a float tensor")
        dtype, eps = str(W.dtype).removeprefix("torch."), float(torch.finfo(W.dtype).eps)
        shape = tuple(W.shape)
        finite = (lambda: bool(torch.isfinite(W).all()))
    elif isinstance(W, np.ndarray):
        if W.dtype.kind != "f":
            raise GraftkitError(f"{name} has dtype {W.dtype}, expected a floating-point array",
                                "pass the weight as a float array")
        dtype, eps = W.dtype.name, float(np.finfo(W.dtype).eps)
        shape = W.shape
        finite = (lambda: bool(np.isfinite(W).all()))
    else:
        raise GraftkitError(f"{name} is a {type(W).__name__}, expected a torch tensor or numpy array",
                            "pass one 2-D matrix")
    if len(shape) != 2:
        hint = ("a stacked tensor (e.g. MoE experts [n_experts, out, in]): pass one matrix W[i] at a time"
                if len(shape) > 2 else "pass a 2-D matrix [out, in]")
        raise GraftkitError(f"{name} has shape {list(shape)}, expected a 2-D matrix", hint)
    if 0 in shape:
        raise GraftkitError(f"{name} has shape {list(shape)}, an empty matrix", "pass a non-empty matrix")
    if check_finite and not finite():  # in the given dtype: an upcast neither creates nor removes NaN/inf
        raise GraftkitError(f"{name} (shape {list(shape)}) holds NaN or inf values",
                            "check the checkpoint or delta for overflow")
    return W, dtype, eps


def _float64(W: Any) -> np.ndarray:
    if isinstance(W, RowBlocks):
        W = W.whole()
    if isinstance(W, torch.Tensor):
        return W.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(W, dtype=np.float64)


# ---------------------------------------------------------------------------------------------------
# spectra


def spectrum(W: Any, method: str = "gram", device: Any = None) -> Spectrum:
    """The singular values of ``W`` (descending, float64) with dtype, shape and method recorded."""
    if method not in METHODS:
        raise GraftkitError(f"unknown spectrum method {method!r}", f"use one of {sorted(METHODS)}")
    return _spectrum(*_validated(W, check_finite=method != "gram"), method, device=device)


#: Entries of the longer side upcast to float64 at a time when accumulating a Gram on the CPU: 4 MB blocks,
#: which stay in cache between their upcast and their products (measured 20% faster than 32 MB ones on a
#: [64000, 512] float32 embedding, and no slower on [16384, 3072] bfloat16).
GRAM_BLOCK_ELEMENTS = 1 << 19
#: The same on a GPU: 128 MB float64 blocks, few enough that kernel launches and transfers stay efficient.
GRAM_BLOCK_ELEMENTS_DEVICE = 1 << 24
#: Column tiles of the Gram: only tiles on or above the diagonal are multiplied ((k + 1)/2k of the products).
GRAM_TILES = 8
GRAM_MIN_TILE = 64
#: Below this many multiply-adds (long·short²) one plain product beats several tile products' call overhead.
GRAM_TILE_MIN_WORK = 1 << 27


def as_device(device: Any = None) -> torch.device:
    """The torch device ``device`` names: None is the CPU; "auto", "cuda", "cuda:N" as ``--device`` reads them
    (:func:`graftkit.core.devices.resolve_device`, one error when CUDA is missing)."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        return device
    from ..core.devices import resolve_device

    return resolve_device(str(device))


def _gram_upper(X: torch.Tensor | RowBlocks, device: Any = None, tiles: bool | None = None) -> torch.Tensor:
    """The upper triangle (diagonal tiles whole) of the float64 Gram Xᵀ X of X [long, short], any float dtype
    (a tensor, or a tall matrix as :class:`RowBlocks`).

    X's rows go to ``device`` (default the CPU) and are upcast to float64 there a block at a time, and G
    accumulates Σ_b X_bᵀ X_b on the device, so a [vocab, hidden] embedding never exists as a whole float64
    copy: memory is one block plus the short × short Gram. G is symmetric, so on the CPU (``tiles``
    default) only its column tiles on or above the diagonal are computed (one product per tile row,
    G[a:b, a:] += X_b[:, a:b]ᵀ X_b[:, a:]): about (k + 1)/2k of the full product's flops. A GPU takes the
    whole product in one call (``tiles=False``), faster there than several smaller ones.
    """
    dev = as_device(device)
    long, short = X.shape
    rows = max(1, (GRAM_BLOCK_ELEMENTS if dev.type == "cpu" else GRAM_BLOCK_ELEMENTS_DEVICE) // short)
    if tiles is None:
        tiles = dev.type == "cpu"
    tile = (max(GRAM_MIN_TILE, -(-short // GRAM_TILES))
            if tiles and long * short * short >= GRAM_TILE_MIN_WORK else short)
    blocks = X.blocks(rows) if isinstance(X, RowBlocks) else (X[s:s + rows] for s in range(0, long, rows))
    G = torch.zeros(short, short, dtype=torch.float64, device=dev)
    # one float64 buffer for every block's upcast: a fresh one per block costs a page fault per 4 kB
    buf = torch.empty(min(rows, long), short, dtype=torch.float64, device=dev)
    for block in blocks:
        # to the device in the stored dtype (a bf16 block is a quarter of its float64 copy), upcast there
        B = buf[: block.shape[0]]
        B.copy_(block.to(device=dev))
        if short <= tile:
            G.addmm_(B.T, B)
            continue
        for a in range(0, short, tile):
            G[a:a + tile, a:].addmm_(B[:, a:a + tile].T, B[:, a:])
    return G


def _gram_eigenvalues(W: Any, device: Any = None, tiles: bool | None = None) -> np.ndarray:
    """Ascending eigenvalues of the float64 Gram of W's smaller side, from W in its own dtype.

    G = W Wᵀ when m ≤ n, else Wᵀ W (:func:`_gram_upper`, on ``device``; ``eigvalsh`` reads its upper
    triangle, in float64 on the same device). torch does the products and ``eigvalsh`` (LAPACK, or
    cuSOLVER on a GPU; eigenvalues only) and releases the GIL, so matrices can run in threads. W's
    finiteness is checked here, on G, for free: a NaN or inf entry of W makes a diagonal entry of G NaN or
    inf, and a finite float32/bfloat16 W cannot overflow a float64 Gram.
    """
    T = W if isinstance(W, RowBlocks) else _torch(W)
    with _stream(as_device(device)):
        G = _gram_upper(T if T.shape[0] > T.shape[1] else T.T, device, tiles)
        if not bool(torch.isfinite(G).all()):
            if isinstance(W, RowBlocks):  # float32 or narrower: its Gram cannot overflow
                raise GraftkitError(f"W (shape {list(W.shape)}) holds NaN or inf values",
                                    "check the checkpoint or delta for overflow")
            _validated(W)  # raises the NaN/inf error when W holds one
            raise GraftkitError(f"the float64 Gram of a {list(T.shape)} matrix overflows (entries near 1e154)",
                                "rescale the matrix, or use method='svd'")
        return torch.linalg.eigvalsh(G, UPLO="U").cpu().numpy()


_STREAMS = threading.local()


def _stream(dev: torch.device):
    """On a GPU, this thread's own CUDA stream (created once per thread), so the matrices that worker threads
    rank at once overlap on the device (one's transfer and Gram with another's ``eigvalsh``); on the CPU,
    nothing."""
    if dev.type != "cuda":
        return contextlib.nullcontext()
    streams = _STREAMS.__dict__.setdefault("by_device", {})
    if dev not in streams:
        streams[dev] = torch.cuda.Stream(device=dev)
    return torch.cuda.stream(streams[dev])


def _spectrum(A: Any, dtype: str, eps: float, method: str, ref_norm: float | None = None,
              device: Any = None) -> Spectrum:
    """σ of a validated matrix ``A`` (a torch tensor or numpy array in any float dtype; see ``_validated``;
    the Gram route checks finiteness itself) on ``device``. ``ref_norm`` marks a delta (see ``Spectrum``)."""
    m, n = A.shape
    if method == "gram":
        lam = _gram_eigenvalues(A, device)  # float64: an fp32 Gram loses the small end of the spectrum
        # eigenvalues below the Gram's rounding floor are indistinguishable from 0: set them to 0, so a
        # rank-r matrix has exactly min(m, n) − r zero σ (else they come out near sqrt(eps)·σ₁)
        lam[lam <= max(m, n) * _EPS64 * max(float(lam[-1]), 0.0)] = 0.0
        sigma = np.sqrt(lam)[::-1].copy()
    elif as_device(device).type == "cpu":
        sigma = np.linalg.svd(_float64(A), compute_uv=False)
    else:
        sigma = torch.linalg.svdvals(_torch(A).to(device=as_device(device), dtype=torch.float64)).cpu().numpy()
    return Spectrum(sigma=sigma, shape=(int(m), int(n)), dtype=dtype, dtype_eps=eps, method=METHODS[method],
                    ref_norm=ref_norm)


def singular_values(W: Any, method: str = "gram", device: Any = None) -> np.ndarray:
    """σ(W), float64, descending, length min(m, n). ``method``: "gram" (default) or "svd"."""
    return spectrum(W, method, device).sigma


# ---------------------------------------------------------------------------------------------------
# deltas of two stored matrices: Δ = W₁ − W₀ and the rounding noise of its operands


def delta_tol_rule(dtype: str) -> str:
    """The delta tolerance rule in words, for storage dtype ``dtype`` (stored next to every delta rank)."""
    return (f"delta rule: eps({dtype})*(max_i ||S_i,:||_2 + max_j ||S_:,j||_2), S = max(|W_base|, |W_rl|) "
            f"entrywise, {dtype} the coarser storage dtype of the two (absolute; the rounding noise of the "
            f"stored weights, not max(shape)*eps*sigma_1 of the delta)")


def _torch(W: Any) -> torch.Tensor:
    if isinstance(W, RowBlocks):
        W = W.whole()
    if isinstance(W, torch.Tensor):
        return W.detach()
    return torch.from_numpy(np.ascontiguousarray(W) if W.flags.writeable else np.array(W, order="C"))


def _operands(W0: Any, W1: Any) -> tuple[torch.Tensor, torch.Tensor, str, float]:
    """(W₀, W₁ as torch tensors, the coarser storage dtype's name, its eps) of two stored matrices."""
    A0, d0, e0 = _validated(W0, "W_base", check_finite=False)
    A1, d1, e1 = _validated(W1, "W_rl", check_finite=False)
    if tuple(A0.shape) != tuple(A1.shape):
        raise GraftkitError(f"W_base has shape {list(A0.shape)} but W_rl has {list(A1.shape)}",
                            "take the delta of the same tensor of two checkpoints")
    dtype, eps = (d1, e1) if e1 > e0 else (d0, e0)
    return _torch(A0), _torch(A1), dtype, eps


def delta_matrix(W0: Any, W1: Any) -> torch.Tensor:
    """Δ = W₁ − W₀, both upcast to float32 before subtracting (float64 when either is float64)."""
    A0, A1, _, _ = _operands(W0, W1)
    work = torch.float64 if torch.float64 in (A0.dtype, A1.dtype) else torch.float32
    return A1.to(work) - A0.to(work)


def rounding_reference(W0: Any, W1: Any, device: Any = None) -> float:
    """max_i ‖S_i,:‖₂ + max_j ‖S_:,j‖₂ with S = max(|W₀|, |W₁|) entrywise: the largest row norm plus the
    largest column norm of the per-entry rounding bound of two stored matrices (see the module docstring).

    Computed in float64 on ``device`` a block of rows at a time (memory: one block and one column vector)."""
    A0, A1, _, _ = _operands(W0, W1)
    dev = as_device(device)
    m, n = A0.shape
    rows = max(1, GRAM_BLOCK_ELEMENTS // n)
    col_sq = torch.zeros(n, dtype=torch.float64, device=dev)
    row_sq = torch.zeros((), dtype=torch.float64, device=dev)
    for start in range(0, m, rows):
        S = torch.maximum(A0[start:start + rows].to(device=dev).to(dtype=torch.float64).abs(),
                          A1[start:start + rows].to(device=dev).to(dtype=torch.float64).abs()).square_()
        row_sq = torch.maximum(row_sq, S.sum(1).max())
        col_sq += S.sum(0)
    return float(np.sqrt(float(row_sq)) + np.sqrt(float(col_sq.max())))


def delta_tolerance(W0: Any, W1: Any) -> tuple[float, str, float]:
    """(tol_Δ, the storage dtype it uses, the rounding reference) of Δ = W₁ − W₀:
    tol_Δ = eps(d) · :func:`rounding_reference`, d the coarser storage dtype of W₀ and W₁."""
    _, _, dtype, eps = _operands(W0, W1)
    ref = rounding_reference(W0, W1)
    return eps * ref, dtype, ref


def delta_spectrum(W0: Any, W1: Any, method: str = "gram", device: Any = None) -> Spectrum:
    """σ(W₁ − W₀) (the difference in float32, or float64) with the storage dtype and the rounding reference
    recorded, so its default numerical-rank tolerance is the delta rule (``Spectrum.tol_rule``)."""
    if method not in METHODS:
        raise GraftkitError(f"unknown spectrum method {method!r}", f"use one of {sorted(METHODS)}")
    _, _, dtype, eps = _operands(W0, W1)
    D, _, _ = _validated(delta_matrix(W0, W1), "delta", check_finite=method != "gram")
    return _spectrum(D, dtype, eps, method, ref_norm=rounding_reference(W0, W1, device), device=device)


# ---------------------------------------------------------------------------------------------------
# single-matrix measures (on σ or λ)


def numerical_rank(sigma: Any, tol: float | None = None, *, rtol: float | None = None) -> int:
    """#{σ_k > threshold}.

    threshold = ``tol`` (absolute) if given; else ``rtol`` · σ₁ (relative) if given; else, only when
    ``sigma`` is a ``Spectrum``, its ``default_tol()``: max(m, n) · eps(original dtype) · σ₁ for a matrix,
    the delta rule eps(stored dtype) · ref_norm for a ``delta_spectrum``. A Spectrum refuses a
    tolerance below its method's floor (a float64 matrix through the Gram route).
    """
    if tol is not None and rtol is not None:
        raise GraftkitError("numerical_rank got both tol and rtol", "pass one: tol (absolute) or rtol")
    s = _sigma(sigma)
    if tol is not None:
        threshold = float(tol)
    elif rtol is not None:
        threshold = float(rtol) * float(s.max())
    elif isinstance(sigma, Spectrum):
        threshold = sigma.default_tol()
    else:
        raise GraftkitError("numerical_rank needs a tolerance for bare singular values",
                            "pass tol= (absolute) or rtol=, or a Spectrum so the dtype-based default applies")
    if not threshold >= 0:
        raise GraftkitError(f"numerical_rank tolerance {threshold} must be >= 0", "pass a non-negative tol")
    if isinstance(sigma, Spectrum) and 0 < threshold < sigma.floor():
        raise GraftkitError(f"numerical_rank tolerance {threshold:.3g} lies below what {sigma.method} resolves "
                            f"({sigma.floor():.3g})", "take the spectrum with method='svd'")
    return int((s > threshold).sum())


def measures(W: Any, method: str = "gram", *, tol: float | None = None,
             rankme_eps: float = RANKME_EPS, stored: tuple[Any, Any] | None = None,
             device: Any = None) -> dict[str, Any]:
    """All single-matrix measures from one spectrum, with their conventions.

    For a zero matrix the ratio measures are NaN and the numerical rank is 0. ``tol`` overrides the
    default absolute numerical-rank tolerance. ``stored=(W₀, W₁)`` says ``W`` is the delta W₁ − W₀ of these
    two stored matrices (e.g. :func:`delta_matrix`): the default tolerance is then the delta rule, with
    the coarser storage dtype's eps and their rounding reference (module docstring), and ``dtype`` is that
    storage dtype (``computed_dtype`` the dtype of ``W``). ``device``: where the spectrum is computed (module
    docstring); ``W`` may stay on the host.
    """
    if method not in METHODS:
        raise GraftkitError(f"unknown spectrum method {method!r}", f"use one of {sorted(METHODS)}")
    # no float64 copy here (the Gram route upcasts block by block), and no separate finiteness pass for it
    A, computed, eps = _validated(W, check_finite=method != "gram")
    dtype, ref = computed, None
    if stored is not None:
        _, _, dtype, eps = _operands(*stored)
        if tuple(stored[0].shape) != tuple(A.shape):
            raise GraftkitError(f"the delta has shape {list(A.shape)} but its stored operands "
                                f"{list(stored[0].shape)}", "pass stored=(W_base, W_rl) of this delta")
        ref = rounding_reference(*stored, device=device)
    sp = _spectrum(A, dtype, eps, method, ref, device)
    s = sp.sigma
    zero = not s.any()
    threshold = sp.default_tol() if tol is None else float(tol)
    # a tolerance under the Gram route's floor (float64 inputs) cannot be resolved from σ²: count on
    # the float64 SVD instead
    rank_sp = sp if threshold >= sp.floor() else _spectrum(A, dtype, eps, "svd", ref, device)
    values = {name: (numerical_rank(rank_sp.sigma, tol=threshold) if name == "numerical_rank"
                     else rankme(s, rankme_eps) if name == "rankme" and not zero else m(s))
              for name, m in SPECTRUM.items()}  # every spectrum measure of :mod:`.metrics`, in its order
    return {
        **values,
        "conventions": dict(CONVENTIONS),
        "method": sp.method,
        "dtype": sp.dtype,
        "computed_dtype": computed,
        "shape": sp.shape,
        "rankme_eps": rankme_eps,
        "numerical_rank_tol": threshold,
        "numerical_rank_tol_rule": sp.tol_rule() if tol is None else "given (absolute)",
        "numerical_rank_ref_norm": ref,
        "numerical_rank_method": rank_sp.method,
        "device": str(as_device(device)),
    }


# ---------------------------------------------------------------------------------------------------
# pair measures


#: A tall matrix's left singular vectors u_j = W v_j / σ_j are taken from its Gram's eigenvectors v_j only where the
#: Gram resolves every σ_j they divide by to this relative precision: its rounding floor max(m, n)·eps64·λ₁ at
#: most this fraction of λ_j = σ_j². Else the matrix is reduced to its QR, which divides by nothing.
VECTOR_RTOL = 1e-6


@dataclass(frozen=True, eq=False)
class LeftSingular:
    """σ and the left singular vectors of one matrix W [m, n] in float64 on one device: the one decomposition of W
    that every pair measure shares (:func:`left_singular`).

    ``sigma`` [r] is descending, r = min(m, n). The vectors U [m, r] are held in one of three forms: ``U`` itself
    (m ≤ n: W Wᵀ's eigenvectors; or the SVD's); for a tall W, WᵀW's eigenvectors ``V`` beside W as given
    (U = W V Σ⁻¹, applied a block of rows at a time); or W = QR's Householder reflectors ``qr``, ``tau`` and
    RRᵀ's eigenvectors ``Y`` (U = Q [Y; 0], applied without forming Q). ``k``: how many leading vectors it
    serves (None: all r)."""

    sigma: torch.Tensor
    shape: tuple[int, int]
    method: str
    k: int | None = None
    U: torch.Tensor | None = None
    V: torch.Tensor | None = None
    W: torch.Tensor | None = None
    qr: torch.Tensor | None = None
    tau: torch.Tensor | None = None
    Y: torch.Tensor | None = None

    def _serves(self, k: int) -> None:
        if self.k is not None and k > self.k:
            raise GraftkitError(f"{k} left singular vectors asked of a decomposition made for {self.k}",
                                "decompose with k=None (all vectors)")

    def top(self, k: int) -> torch.Tensor:
        """The top-k left singular vectors [m, k]."""
        self._serves(k)
        if self.U is not None:
            return self.U[:, :k]
        if self.V is not None:  # W V_k Σ_k⁻¹
            Vk = self.V[:, :k] / self.sigma[:k]
            return torch.cat([B @ Vk for _, B in _blocks(self.W, Vk.device)])
        m, n = self.shape
        Z = self.Y.new_zeros(m, k)
        Z[:n] = self.Y[:, :k]
        return torch.ormqr(self.qr, self.tau, Z)  # Q [Y_k; 0]

    def cos(self, X: torch.Tensor) -> torch.Tensor:
        """Uᵀ X [r, k] for X [m, k]: the cosine of every left singular vector with each unit column of X."""
        self._serves(min(self.shape))
        if self.U is not None:
            return self.U.T @ X
        if self.V is not None:  # Σ⁻¹ Vᵀ (Wᵀ X)
            WtX = X.new_zeros(self.shape[1], X.shape[1])
            for rows, B in _blocks(self.W, X.device):
                WtX.addmm_(B.T, X[rows])
            return (self.V.T @ WtX) / self.sigma[:, None]
        return self.Y.T @ torch.ormqr(self.qr, self.tau, X, transpose=True)[: self.shape[1]]  # Yᵀ (QᵀX)[:n]


def _blocks(T: torch.Tensor, dev: torch.device):
    """(row slice, those rows of ``T`` upcast to float64 on ``dev``), a block of rows at a time, in order."""
    rows = max(1, (GRAM_BLOCK_ELEMENTS if dev.type == "cpu" else GRAM_BLOCK_ELEMENTS_DEVICE) // T.shape[1])
    for start in range(0, T.shape[0], rows):
        yield slice(start, start + rows), T[start:start + rows].to(device=dev, dtype=torch.float64)


def left_singular(W: Any, method: str = "gram", device: Any = None, name: str = "W",
                  k: int | None = None) -> LeftSingular:
    """σ and the left singular vectors of ``W`` (any float dtype, 2-D), float64 on ``device``; ``k``: only the
    top k vectors will be asked for (None: all, as :meth:`LeftSingular.cos` needs).

    ``method="gram"``: W Wᵀ's eigenvalues are σ² and its eigenvectors W's left singular vectors, so for m ≤ n
    one float64 ``eigh`` of that Gram (:func:`_gram_upper`, W streamed a block at a time) gives both. For a
    tall W (m > n) the Gram is WᵀW, whose eigenvectors v_j are the right singular vectors: u_j = W v_j / σ_j,
    taken so where the Gram resolves every σ_j divided by (``VECTOR_RTOL``); else W is reduced to its Householder
    QR in float64, and RRᵀ [n, n], which has the same eigenvalues, gives them with its eigenvectors carried back
    by Q (nothing divided). Eigenvalues at or below the Gram's rounding floor max(m, n)·eps64·λ₁ are set to 0,
    as in :func:`spectrum`. ``method="svd"``: torch's float64 SVD. Memory: the Gram and W as given; a QR adds
    two float64 copies of W, the SVD one and its vectors.
    """
    if method not in METHODS:
        raise GraftkitError(f"unknown spectrum method {method!r}", f"use one of {sorted(METHODS)}")
    A, _, _ = _validated(W, name, check_finite=False)  # finiteness: checked on the Gram (or the SVD's input)
    T = _torch(A)
    m, n = (int(x) for x in T.shape)
    dev = as_device(device)
    with _stream(dev):
        if method == "svd":
            X = T.to(device=dev, dtype=torch.float64)
            if not bool(torch.isfinite(X).all()):
                _validated(W, name)
            U, sigma, _ = torch.linalg.svd(X, full_matrices=False)
            return LeftSingular(sigma, (m, n), METHODS[method], k, U=U)
        lam, vectors = _gram_eigh(T.T if m <= n else T, dev, W, name)
        if m <= n:
            return LeftSingular(lam.sqrt(), (m, n), METHODS[method], k, U=vectors)
        if float(lam[(k or n) - 1]) * VECTOR_RTOL >= max(m, n) * _EPS64 * float(lam[0]) > 0.0:
            return LeftSingular(lam.sqrt(), (m, n), METHODS[method], k, V=vectors, W=T)
        qr, tau = torch.geqrf(T.to(device=dev, dtype=torch.float64))
        lam, Y = _gram_eigh(qr[:n].triu().T, dev, W, name, floor_rows=m)  # RRᵀ
        return LeftSingular(lam.sqrt(), (m, n), METHODS[method], k, qr=qr, tau=tau, Y=Y)


def _gram_eigh(X: torch.Tensor, dev: torch.device, W: Any, name: str, floor_rows: int | None = None):
    """(λ descending, eigenvectors) of the float64 Gram XᵀX of X [long, short] on ``dev``, λ at or below the Gram's
    rounding floor max(rows, short)·eps64·λ₁ set to 0 (``floor_rows``: the rows of the matrix X stands for)."""
    G = _gram_upper(X, dev)
    if not bool(torch.isfinite(G).all()):
        _validated(W, name)  # raises the NaN/inf error when W holds one
        raise GraftkitError(f"the float64 Gram of {name} {list(X.shape)} overflows (entries near 1e154)",
                            "rescale the matrix, or use method='svd'")
    lam, vectors = torch.linalg.eigh(G, UPLO="U")
    lam, vectors = lam.flip(0), vectors.flip(1)  # descending
    lam[lam <= max(floor_rows or X.shape[0], X.shape[1]) * _EPS64 * max(float(lam[0]), 0.0)] = 0.0
    return lam, vectors


def _shapes(*named: tuple[str, Any]) -> tuple[int, int]:
    """The one shape of several matrices (validated, not checked for finiteness), or one error naming two."""
    shapes = [(name, tuple(int(x) for x in _validated(W, name, check_finite=False)[0].shape)) for name, W in named]
    for name, shape in shapes[1:]:
        if shape != shapes[0][1]:
            raise GraftkitError(f"{shapes[0][0]} has shape {list(shapes[0][1])} but {name} has {list(shape)}",
                                "compare the same tensor of two checkpoints")
    return shapes[0][1]


def _check_k(k: int, limit: int, what: str) -> None:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= limit:
        raise GraftkitError(f"{what}: k={k!r} must be an integer in [1, {limit}]",
                            "pick k no larger than min(matrix shape)")


def _check_eps(eps: float) -> None:
    if not 0 < eps <= 1:
        raise GraftkitError(f"intruder_dimensions eps={eps} must be in (0, 1]", "use the usual 0.5")


def principal_angles(W0: Any, W1: Any, k: int, side: str = "left") -> np.ndarray:
    """Principal angles (radians, ascending) between the top-k ``side`` singular subspaces of W₀, W₁.

    ``side="left"``: column space (output side); ``"right"``: row space (parameter/input side; the left
    singular vectors of Wᵀ). Bases from :func:`left_singular`. Cosines are the singular values of Q₀ᵀQ₁; angles
    below π/4 come from the sines (singular values of Q₁ − Q₀Q₀ᵀQ₁), where arccos would lose precision.
    """
    if side not in ("left", "right"):
        raise GraftkitError(f"principal_angles side={side!r}", "use side='left' or side='right'")
    _check_k(k, min(_shapes(("W0", W0), ("W1", W1))), "principal_angles")
    Q0, Q1 = ((left_singular(W if side == "left" else W.T, name=name, k=k).top(k)).numpy()
              for name, W in (("W0", W0), ("W1", W1)))
    M = Q0.T @ Q1
    cos = np.clip(np.linalg.svd(M, compute_uv=False), 0.0, 1.0)  # descending
    sin = np.clip(np.linalg.svd(Q1 - Q0 @ M, compute_uv=False), 0.0, 1.0)[::-1]  # ascending
    return np.where(cos**2 >= 0.5, np.arcsin(sin), np.arccos(cos))


def spectral_drift(W0: Any, W1: Any, method: str = "gram", device: Any = None) -> float:
    """‖σ(W₁) − σ(W₀)‖₂ / ‖σ(W₀)‖₂ (σ descending, same length), from the eigenvalues alone (:func:`spectrum`)."""
    if method not in METHODS:
        raise GraftkitError(f"unknown spectrum method {method!r}", f"use one of {sorted(METHODS)}")
    _shapes(("W0", W0), ("W1", W1))
    s0, s1 = (torch.from_numpy(spectrum(W, method, device).sigma) for W in (W0, W1))
    return _drift(s0, s1)


def _drift(s0: torch.Tensor, s1: torch.Tensor) -> float:
    norm0 = float(torch.linalg.vector_norm(s0))
    if norm0 == 0.0:
        raise GraftkitError("spectral_drift: W0 is the zero matrix", "drift relative to zero is undefined")
    return float(torch.linalg.vector_norm(s1 - s0)) / norm0


def _energy_share(Uk: torch.Tensor, delta: Any, dev: torch.device) -> float:
    """‖U_kᵀ Δ‖_F² / ‖Δ‖_F², Δ sent to ``dev`` and upcast to float64 a block of rows at a time."""
    D = _torch(_validated(delta, "delta", check_finite=False)[0])
    P = torch.zeros(Uk.shape[1], D.shape[1], dtype=torch.float64, device=dev)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for rows, B in _blocks(D, dev):
        P.addmm_(Uk[rows].T, B)
        total += torch.tensordot(B, B, dims=2)
    if not bool(torch.isfinite(total)):  # a NaN or inf entry of Δ makes Σ Δ² one
        _validated(delta, "delta")
        raise GraftkitError("delta_energy_in_topk: ‖Δ‖²_F overflows float64 (entries near 1e154)",
                            "rescale the matrices")
    if float(total) == 0.0:
        raise GraftkitError("delta_energy_in_topk: delta is the zero matrix", "the share is undefined")
    return float(torch.tensordot(P, P, dims=2)) / float(total)


def _right_energy_share(L0: LeftSingular, W0: Any, k: int, delta: Any, dev: torch.device) -> float:
    """‖Δ V_k‖_F² / ‖Δ‖_F², V_k W₀'s top-k right singular vectors: Wᵀ U_k Σ_k⁻¹ (the right vectors of the same
    decomposition), orthonormalised by a QR; directions of σ = 0 are left out (no right vector is defined)."""
    Uk, sk = L0.top(k), L0.sigma[:k]
    T = _torch(_validated(W0, "W0", check_finite=False)[0])
    WtU = torch.zeros(T.shape[1], k, dtype=torch.float64, device=dev)
    for rows, B in _blocks(T, dev):
        WtU.addmm_(B.T, Uk[rows])
    Vk = torch.linalg.qr(WtU[:, sk > 0] / sk[sk > 0])[0]
    D = _torch(_validated(delta, "delta", check_finite=False)[0])
    inside = torch.zeros((), dtype=torch.float64, device=dev)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for _, B in _blocks(D, dev):
        P = B @ Vk
        inside += torch.tensordot(P, P, dims=2)
        total += torch.tensordot(B, B, dims=2)
    if float(total) == 0.0:
        raise GraftkitError("delta_energy_in_topk: delta is the zero matrix", "the share is undefined")
    return float(inside) / float(total)


def delta_energy_in_topk(W0: Any, delta: Any, k: int, method: str = "gram", device: Any = None,
                         side: str = "left") -> float:
    """‖U_kᵀ Δ‖_F² / ‖Δ‖_F², U_k the top-k left singular vectors of W₀ (:func:`left_singular`); ``side="right"``:
    ‖Δ V_k‖_F² / ‖Δ‖_F², V_k its top-k right singular vectors. A Δ drawn from any rotation-invariant law (i.i.d.
    Gaussian entries) puts k/m of its energy in the left subspace and k/n in the right one, W₀ [m, n], in
    expectation: :func:`chance_energy`."""
    if side not in ("left", "right"):
        raise GraftkitError(f"delta_energy_in_topk side={side!r}", "use side='left' or side='right'")
    _check_k(k, min(_shapes(("W0", W0), ("delta", delta))), "delta_energy_in_topk")
    dev = as_device(device)
    L0 = left_singular(W0, method, dev, "W0")
    with _stream(dev):
        if side == "right":
            return _right_energy_share(L0, W0, k, delta, dev)
        return _energy_share(L0.top(k), delta, dev)


def chance_energy(shape: tuple[int, int], k: int, side: str = "left") -> float:
    """The share of ‖Δ‖² a random Δ puts in a fixed k-dimensional left (k/m) or right (k/n) subspace, in
    expectation over any rotation-invariant law of Δ [m, n]: exact, the baseline of :func:`delta_energy_in_topk`."""
    m, n = shape
    return k / (m if side == "left" else n)


def subspace_overlap(W0: Any, W1: Any, k: int, method: str = "gram", device: Any = None) -> float:
    """‖U₀ₖᵀ U₁ₖ‖_F² / k: the mean squared cosine of the k principal angles between W₀'s and W₁'s top-k left
    singular subspaces (1: the same subspace; k/m in expectation for a random one)."""
    _check_k(k, min(_shapes(("W0", W0), ("W1", W1))), "subspace_overlap")
    dev = as_device(device)
    U0, U1 = (left_singular(W, method, dev, name, k).top(k) for name, W in (("W0", W0), ("W1", W1)))
    M = U0.T @ U1
    return float(torch.tensordot(M, M, dims=2)) / k


def _best_cos(L0: LeftSingular, U1k: torch.Tensor) -> np.ndarray:
    """For each column of U1k: its largest |cos| with any left singular vector of W₀ [k]."""
    return L0.cos(U1k).abs().amax(dim=0).cpu().numpy()


def intruder_dimensions(W0: Any, W1: Any, k: int = 10, eps: float = 0.5, method: str = "gram",
                        device: Any = None) -> Intruders:
    """Top-k left singular vectors of W₁ whose max |cos| with every left singular vector of W₀ is < eps
    (vectors from :func:`left_singular`)."""
    _check_eps(eps)
    _check_k(k, min(_shapes(("W0", W0), ("W1", W1))), "intruder_dimensions")
    dev = as_device(device)
    U1k = left_singular(W1, method, dev, "W1", k).top(k)
    best = _best_cos(left_singular(W0, method, dev, "W0"), U1k)
    idx = tuple(int(i) for i in np.flatnonzero(best < eps))
    return Intruders(indices=idx, max_abs_cos=tuple(float(c) for c in best), k=int(k), eps=float(eps))


def top1_energy(delta: Any, method: str = "gram") -> float:
    """σ₁(Δ)² / ‖Δ‖_F²: the share of the update's energy in its top direction."""
    return top1_energy_of(singular_values(delta, method))


def pair_measures(W0: Any, W1: Any, delta: Any, *, energy_k: int, intruder_k: int, intruder_eps: float = 0.5,
                  method: str = "gram", device: Any = None) -> dict[str, float]:
    """``spectral_drift``, ``delta_energy_topk`` and ``delta_energy_topk_right`` (:func:`delta_energy_in_topk` with
    ``energy_k``, left and right), ``subspace_overlap`` (:func:`subspace_overlap` with the smaller k) and
    ``intruders`` (the count of :func:`intruder_dimensions` with ``intruder_k``, ``intruder_eps``) of one pair,
    from one decomposition of each of W₀ and W₁ (:func:`left_singular`) shared by all three: σ for the drift,
    the vectors for the other two. The energy and the intruders equal the separate functions' bit for bit.
    The drift takes σ from ``eigh`` where :func:`spectral_drift` (values only) takes ``eigvalsh``: both resolve
    σ_j to about eps64·σ₁²/σ_j, so a drift is exact to that over ‖σ(W₁) − σ(W₀)‖ — on SmolLM2-135M and a copy
    moved by 1e-4 of each matrix's RMS (drifts down to 4e-6), the two agree to 1e-9 relative and each is within
    1.5e-8 of the drift of float64 SVD values (median 2e-11). On another ``device`` the Grams, QRs, eigensolvers
    and products run there; W₁ is decomposed first and only its top-k vectors kept, so one tall matrix's
    float64 QR is held at a time."""
    _check_eps(intruder_eps)
    lo = min(_shapes(("W0", W0), ("W1", W1), ("delta", delta)))
    _check_k(energy_k, lo, "delta_energy_in_topk")
    _check_k(intruder_k, lo, "intruder_dimensions")
    dev = as_device(device)
    L1 = left_singular(W1, method, dev, "W1", intruder_k)
    sigma1, U1k = L1.sigma, L1.top(intruder_k)
    del L1
    L0 = left_singular(W0, method, dev, "W0")
    with _stream(dev):
        drift = _drift(L0.sigma, sigma1)
        energy = _energy_share(L0.top(energy_k), delta, dev)
        right = _right_energy_share(L0, W0, energy_k, delta, dev)
        k = min(energy_k, intruder_k)
        M = L0.top(k).T @ U1k[:, :k]
        overlap = float(torch.tensordot(M, M, dims=2)) / k
        best = _best_cos(L0, U1k)
    return {"spectral_drift": drift, "delta_energy_topk": energy, "delta_energy_topk_right": right,
            "subspace_overlap": overlap, "intruders": float(int((best < intruder_eps).sum()))}
