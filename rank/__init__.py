"""Rank: exact spectral measures of weights, deltas and activations (pure functions in ``spectra``)."""

from .spectra import (
    CONVENTIONS, Intruders, Spectrum, delta_energy_in_topk, erank, erank_sq, intruder_dimensions, measures,
    numerical_rank, participation_ratio, principal_angles, rankme, singular_values, spectral_drift, spectrum,
    stable_rank, top1_energy, top1_energy_of,
)

__all__ = [
    "CONVENTIONS", "Intruders", "Spectrum", "delta_energy_in_topk", "erank", "erank_sq", "intruder_dimensions",
    "measures", "numerical_rank", "participation_ratio", "principal_angles", "rankme", "singular_values",
    "spectral_drift", "spectrum", "stable_rank", "top1_energy", "top1_energy_of",
]
