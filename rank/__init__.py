"""Rank: exact spectral measures of weights, deltas and activations (pure functions in ``spectra``)."""

from .spectra import (
    CONVENTIONS, Intruders, Spectrum, delta_energy_in_topk, erank, erank_sq, intruder_dimensions, measures,
    numerical_rank, participation_ratio, principal_angles, rankme, singular_values, spectral_drift, spectrum,
    stable_rank, top1_energy, top1_energy_of,
)
from .weights import METRICS, PAIR_METRICS, delta_ranks, select_tensors, weight_ranks
from .coupling import BOTH_DIRECTIONS_RULE, both_directions, coupling, coupling_result
from .activations import Moments, activation_ranks, activation_spectrum, probe_prompts, prompts_from_file

__all__ = [
    "CONVENTIONS", "Intruders", "Spectrum", "delta_energy_in_topk", "erank", "erank_sq", "intruder_dimensions",
    "measures", "numerical_rank", "participation_ratio", "principal_angles", "rankme", "singular_values",
    "spectral_drift", "spectrum", "stable_rank", "top1_energy", "top1_energy_of",
    "METRICS", "PAIR_METRICS", "delta_ranks", "select_tensors", "weight_ranks",
    "BOTH_DIRECTIONS_RULE", "both_directions", "coupling", "coupling_result",
    "Moments", "activation_ranks", "activation_spectrum", "probe_prompts", "prompts_from_file",
]
