"""The rank measures, one entry each: the function, its name, label, unit, format and convention.

Every reader of a rank measure — the spectral code that computes it (:mod:`.spectra`, :mod:`.weights`,
:mod:`.activations`), the typed view of a result (:mod:`.results`), the command line's columns and the report's
figures (``figures/rank.py``) — takes it from :data:`MEASURES`, so a measure is defined and labelled in one place.
Light on purpose (numpy only): the report reads it without loading torch.

Two families:

- **spectrum measures** (:data:`SPECTRUM`), functions of one matrix's singular values σ (descending, float64): of a
  weight matrix, of an RL delta, or of a layer's activations (σ² their covariance's eigenvalues). Ratio measures are
  undefined for a zero spectrum (NaN, ``zero`` None); counts and norms are 0 there. ``numerical_rank`` counts σ above
  a tolerance the spectrum itself decides (its dtype and shape: ``Spectrum.default_tol``), so it has no function of σ
  alone here.
- **pair measures** (:data:`PAIR`) of a base matrix W₀ and its fine-tune W₁ (``rank --what delta``), computed
  together from both matrices' decompositions (:func:`.spectra.pair_measures`).

Adding a measure: one :class:`Measure` entry here (and, for a spectrum measure, its function of σ); every command,
result and figure then carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.errors import GraftkitError

#: RankMe's ε, added after normalising (Garrido et al. 2023).
RANKME_EPS = 1e-7


# ---------------------------------------------------------------------------------------------------
# functions of σ (pure numpy)


def as_sigma(s: Any, name: str = "sigma") -> np.ndarray:
    """A 1-D float64 vector of non-negative values (singular values or eigenvalues): anything with a ``sigma``
    (a :class:`~.spectra.Spectrum`), a tensor, or an array."""
    if hasattr(s, "sigma"):
        return s.sigma
    if hasattr(s, "detach"):  # a torch tensor, without importing torch here
        s = s.detach().to(device="cpu").double().numpy()
    try:
        v = np.asarray(s, dtype=np.float64)
    except (TypeError, ValueError):
        raise GraftkitError(f"{name} is not a numeric vector", "pass a 1-D array of values") from None
    if v.ndim != 1 or v.size == 0:
        raise GraftkitError(f"{name} has shape {list(v.shape)}, expected a non-empty 1-D vector",
                            "pass singular values, e.g. singular_values(W)")
    if not np.isfinite(v).all():
        raise GraftkitError(f"{name} holds NaN or inf values", "check the matrix it came from")
    if (v < 0).any():
        raise GraftkitError(f"{name} has negative entries (min {v.min():.3g})",
                            "pass singular values or eigenvalues of a PSD matrix, which are >= 0")
    return v


def positive_total(v: np.ndarray, name: str, what: str) -> float:
    total = float(v.sum())
    if total <= 0.0:
        raise GraftkitError(f"{name}: all {what} are zero, the measure is undefined for a zero matrix",
                            "skip zero matrices or report them as rank 0")
    return total


def entropy(p: np.ndarray) -> float:
    p = p[p > 0]  # 0 log 0 = 0
    return float(-(p * np.log(p)).sum())


def erank(sigma: Any) -> float:
    """Roy–Vetterli effective rank exp(H(p)), p = σ/Σσ."""
    s = as_sigma(sigma)
    return float(np.exp(entropy(s / positive_total(s, "erank", "singular values"))))


def erank_sq(sigma: Any) -> float:
    """σ² effective rank exp(H(q)), q = σ²/Σσ²."""
    s2 = as_sigma(sigma) ** 2
    return float(np.exp(entropy(s2 / positive_total(s2, "erank_sq", "singular values"))))


def stable_rank(sigma: Any) -> float:
    """Σσ² / σ₁²."""
    s2 = as_sigma(sigma) ** 2
    return positive_total(s2, "stable_rank", "singular values") / float(s2.max())


def participation_ratio(eigenvalues: Any) -> float:
    """(Σλ)² / Σλ² on eigenvalues λ (σ² of a matrix, or covariance eigenvalues).

    A ``Spectrum`` is taken as its matrix: λ = σ².
    """
    lam = eigenvalues.sigma**2 if hasattr(eigenvalues, "sigma") else as_sigma(eigenvalues, "eigenvalues")
    total = positive_total(lam, "participation_ratio", "eigenvalues")
    return total**2 / float((lam**2).sum())


def rankme(sigma: Any, eps: float = RANKME_EPS) -> float:
    """RankMe (Garrido et al. 2023): exp(−Σ p log p), p_k = σ_k/‖σ‖₁ + ε, not renormalised."""
    if not eps >= 0:
        raise GraftkitError(f"rankme eps={eps} must be >= 0", "use the paper's 1e-7")
    s = as_sigma(sigma)
    p = s / positive_total(s, "rankme", "singular values") + eps
    return float(np.exp(entropy(p)))


def top1_energy_of(sigma: Any) -> float:
    """σ₁² / Σσ² (= 1 / stable rank)."""
    s2 = as_sigma(sigma) ** 2
    return float(s2.max()) / positive_total(s2, "top1_energy", "singular values")


# ---------------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class Measure:
    """One rank measure: how it is computed, named, labelled and shown."""

    name: str
    """Its one name: in results (the ``metric`` axis), ``--metric``, ``--json`` and column headers."""
    label: str
    """What it is, as an axis title says it (with its unit)."""
    unit: str
    """``dimensions``, ``count``, ``fraction``, ``relative`` or the value's own unit."""
    convention: str
    """Its formula and conventions, as every result records them beside its values."""
    of: Callable[[np.ndarray], float] | None = None
    """A spectrum measure's function of σ (None: computed elsewhere, see the module docstring)."""
    zero: float | None = None
    """Its value for a zero spectrum: None for a ratio measure (NaN: undefined)."""
    fmt: str = ".4g"
    """How a table writes it."""

    def __call__(self, sigma: np.ndarray) -> float:
        """The measure of the singular values ``sigma`` (NaN or ``zero`` for a zero spectrum)."""
        if self.of is None:
            raise GraftkitError(f"{self.name} is not a function of σ alone", "take it from spectra.measures")
        s = as_sigma(sigma)
        if not s.any():
            return float("nan") if self.zero is None else float(self.zero)
        return float(self.of(s))

    def text(self, value: float) -> str:
        """The value as a table writes it."""
        return format(value, self.fmt)


SPECTRUM: dict[str, Measure] = {m.name: m for m in (
    Measure("erank", "effective rank (dimensions)", "dimensions",
            "roy-vetterli sigma: exp(H(sigma/sum(sigma)))", erank),
    Measure("erank_sq", "effective rank (dimensions)", "dimensions",
            "sigma-squared: exp(H(sigma^2/sum(sigma^2)))", erank_sq),
    Measure("stable_rank", "stable rank (dimensions)", "dimensions", "sum(sigma^2)/sigma_1^2", stable_rank),
    Measure("participation_ratio", "participation ratio (dimensions)", "dimensions",
            "eigenvalues lambda=sigma^2: sum(lambda)^2/sum(lambda^2)", lambda s: participation_ratio(s**2)),
    Measure("rankme", "RankMe (dimensions)", "dimensions",
            "garrido-2023: exp(-sum(p log p)), p=sigma/sum(sigma)+eps, not renormalised", rankme),
    Measure("numerical_rank", "numerical rank (count of σ > tol)", "count",
            "count(sigma > tol), tol absolute: max(shape)*eps(dtype)*sigma_1 for a matrix, "
            "eps(stored dtype)*(max row + max column 2-norm of max(|W_base|,|W_rl|)) for a delta", zero=0.0),
    Measure("top1_energy", "top-1 energy σ₁²/Σσ² (fraction)", "fraction", "sigma_1^2/sum(sigma^2)", top1_energy_of),
    Measure("sigma_1", "largest singular value σ₁", "value", "the largest singular value", lambda s: s[0], zero=0.0),
    Measure("frobenius_sq", "squared Frobenius norm Σσ²", "value", "sum(sigma^2)", lambda s: (s**2).sum(),
            zero=0.0),
)}

#: The pair measures' parameters: W₀'s top-k subspace of the energy, W₁'s top-k vectors and the |cos| bound of intruders.
DELTA_TOPK, INTRUDER_K, INTRUDER_EPS = 8, 10, 0.5

PAIR: dict[str, Measure] = {m.name: m for m in (
    Measure("spectral_drift", "spectral drift (relative)", "relative",
            "||sigma(W1)-sigma(W0)||_2/||sigma(W0)||_2, W0 base, W1 rl", zero=0.0),
    Measure("delta_energy_top8", "energy of Δ in W₀'s top-k subspace (fraction)", "fraction",
            f"||U_k^T Delta||_F^2/||Delta||_F^2, U_k top-k left singular vectors of W0, k=min({DELTA_TOPK}, min(shape))"),
    Measure("delta_energy_top8_chance", "a random Δ's energy in W₀'s top-k subspace (fraction)", "fraction",
            "k/rows: the expected delta_energy_top8 of a delta drawn from any rotation-invariant law (exact)"),
    Measure("delta_energy_top8_right", "energy of Δ in W₀'s top-k right subspace (fraction)", "fraction",
            f"||Delta V_k||_F^2/||Delta||_F^2, V_k top-k right singular vectors of W0 (W0^T U_k / sigma_k, "
            f"orthonormalised), k=min({DELTA_TOPK}, min(shape))"),
    Measure("delta_energy_top8_right_chance", "a random Δ's energy in W₀'s top-k right subspace (fraction)",
            "fraction", "k/columns: the expected delta_energy_top8_right of a rotation-invariant random delta (exact)"),
    Measure("subspace_overlap_top8", "overlap of W₀'s and W₁'s top-k subspaces (fraction)", "fraction",
            f"||U0_k^T U1_k||_F^2/k: mean cos^2 of the k principal angles between the top-k left singular subspaces "
            f"of W0 and W1, k=min({DELTA_TOPK}, min(shape)); 1 the same subspace, k/rows a random one", zero=1.0),
    Measure("intruders", "intruder dimensions (count)", "count",
            f"count of W1's top-k left singular vectors (k=min({INTRUDER_K}, min(shape))) with max |cos| "
            f"< {INTRUDER_EPS} against every W0 left singular vector", zero=0.0),
)}
#: Every pair measure's convention, as delta results record them.
PAIR_CONVENTIONS: dict[str, str] = {m.name: m.convention for m in PAIR.values()}

#: Every rank measure by name.
MEASURES: dict[str, Measure] = {**SPECTRUM, **PAIR}
#: The spectrum measures' names, in the order results store them (the ``metric`` axis).
METRICS: tuple[str, ...] = tuple(SPECTRUM)
#: The pair measures' names, added by delta ranks.
PAIR_METRICS: tuple[str, ...] = tuple(PAIR)
#: Every spectrum measure's convention, as results record them.
CONVENTIONS: dict[str, str] = {m.name: m.convention for m in SPECTRUM.values() if m.name not in ("sigma_1",
                                                                                                 "frobenius_sq")}


def of_spectrum(sigma: np.ndarray, numerical_rank: float) -> dict[str, float]:
    """Every spectrum measure of ``sigma``, with its ``numerical_rank`` counted by the spectrum's own tolerance."""
    return {name: (float(numerical_rank) if name == "numerical_rank" else m(sigma)) for name, m in SPECTRUM.items()}


def label(name: str) -> str:
    """A measure's axis title (its name for one the registry does not hold)."""
    return MEASURES[name].label if name in MEASURES else f"{name} (value)"


__all__ = ["CONVENTIONS", "DELTA_TOPK", "INTRUDER_EPS", "INTRUDER_K", "MEASURES", "PAIR_CONVENTIONS", "METRICS", "Measure", "PAIR", "PAIR_METRICS", "RANKME_EPS", "SPECTRUM",
           "as_sigma", "erank", "erank_sq", "label", "of_spectrum", "participation_ratio", "rankme", "stable_rank",
           "top1_energy_of"]
