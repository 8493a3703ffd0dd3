"""Plotly figures of a run's results and the self-contained HTML report.

Reads results only through ``store`` (and computes intervals with ``stats``). One small pure builder per
figure (results in, ``plotly.graph_objects.Figure`` out) lives in the module of its topic; ``report``
plans the sections of a run and renders the page; ``tables`` exports results as tidy CSV; ``browser``
renders a report in headless Chromium (screenshots, and the browser test); ``notebook`` gives every
figure of the report as a function of results, for Jupyter (``success_rates(ev).show()``).
"""

from .notebook import (
    anatomy_heatmap,
    attribution,
    both_directions,
    coupling_by_layer,
    coupling_scatter,
    dissociation,
    graft_effects,
    group_shares,
    headroom_differences,
    headroom_rates,
    interactions,
    movement_vs_effect,
    paired_differences,
    rank_by_layer,
    success_rates,
    top_tensors,
    training_curves,
)
from .report import Report, build_report, load_run, make_report, plan_report, write_report
from .tables import export_csv, tidy_rows

__all__ = ["Report", "build_report", "load_run", "make_report", "plan_report", "write_report", "export_csv",
           "tidy_rows",
           # every figure of the report, as a function of results (figures/notebook.py)
           "success_rates", "paired_differences", "headroom_rates", "headroom_differences", "anatomy_heatmap",
           "group_shares", "top_tensors", "graft_effects", "attribution", "interactions", "movement_vs_effect",
           "dissociation", "rank_by_layer", "coupling_by_layer", "coupling_scatter", "both_directions",
           "training_curves"]
