"""Rank: exact spectral measures of weights, deltas and activations (pure functions in ``spectra``), the
``rank`` and ``couple`` commands, and the typed views of their results.

Names load on first use (PEP 562), so a reader of results (the report, ``RankResult``) does not import
torch and the spectral code.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "metrics": ("CONVENTIONS", "MEASURES", "Measure", "erank", "erank_sq", "participation_ratio", "rankme",
                "stable_rank", "top1_energy_of"),
    "spectra": ("Intruders", "Spectrum", "delta_energy_in_topk", "intruder_dimensions", "measures", "numerical_rank",
                "pair_measures", "principal_angles", "singular_values", "spectral_drift", "spectrum", "top1_energy"),
    "weights": ("METRICS", "PAIR_METRICS", "delta_ranks", "select_tensors", "weight_ranks"),
    "coupling": ("BOTH_DIRECTIONS_RULE", "CouplingResult", "both_directions", "coupling", "coupling_result"),
    "activations": ("Moments", "activation_ranks", "activation_spectrum", "probe_prompts", "prompts_from_file"),
    "results": ("RankResult",),
    "commands": ("CoupleConfig", "RankConfig", "run_couple", "run_rank"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
