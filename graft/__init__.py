"""Grafting: delta anatomy, the splice, and exact export of per-group grafts."""

from .anatomy import SUMS, delta_anatomy, summarise, tensor_delta_stats
from .export import export_graft, graft_specs
from .inplace import InPlaceGraft, SwitchStats, bind_names, grafted
from .plan import GraftPlan, GraftSpec, plan_graft
from .splice import splice, splice_chunks

__all__ = [
    "SUMS", "delta_anatomy", "summarise", "tensor_delta_stats", "export_graft", "graft_specs",
    "GraftPlan", "GraftSpec", "plan_graft", "splice", "splice_chunks", "InPlaceGraft", "SwitchStats",
    "bind_names", "grafted",
]
