"""Grafting: delta anatomy, the splice, exact export and in-place grafts, graft sweeps and attribution."""

from .anatomy import SUMS, DeltaConfig, DeltaResult, delta_anatomy, run_delta, summarise, tensor_delta_stats
from .attribution import Dissociation, FactorialAttribution, attribute_factorial, contrast_intervals, dissociation
from .experiments import (
    BASE_LABEL,
    RL_LABEL,
    SWEEPS,
    DissociationResult,
    GraftExperiment,
    SweepResult,
    dissociation_result,
    expand_sweep,
    one_experiment,
    plan_sweep,
    run_graft_sweep,
    sweep_result,
)
from .export import export_graft, graft_specs
from .inplace import InPlaceGraft, SwitchStats, bind_names, grafted
from .plan import GraftPlan, GraftSpec, plan_graft
from .splice import splice, splice_chunks

__all__ = [
    "SUMS", "DeltaConfig", "DeltaResult", "run_delta", "delta_anatomy", "summarise", "tensor_delta_stats", "export_graft", "graft_specs",
    "GraftPlan", "GraftSpec", "plan_graft", "splice", "splice_chunks", "InPlaceGraft", "SwitchStats",
    "bind_names", "grafted", "Dissociation", "FactorialAttribution", "attribute_factorial", "contrast_intervals",
    "dissociation", "BASE_LABEL", "RL_LABEL", "SWEEPS", "GraftExperiment", "dissociation_result", "expand_sweep",
    "one_experiment", "plan_sweep", "run_graft_sweep", "sweep_result", "SweepResult", "DissociationResult",
]
