"""Plotly figures of a run's results and the self-contained HTML report.

Reads results only through ``store`` (and computes intervals with ``stats``). One small pure builder per
figure (results in, ``plotly.graph_objects.Figure`` out) lives in the module of its topic; ``report``
plans the sections of a run and renders the page; ``tables`` exports results as tidy CSV; ``browser``
renders a report in headless Chromium (screenshots, and the browser test); ``notebook`` gives every
figure of the report as a function of results, for Jupyter (``success_rates(ev).show()``).
"""

import importlib

#: The module each public name lives in. Every figure module imports plotly, so names are imported on first
#: use: ``import graftkit`` (and ``graftkit.figures``) loads no plotly until a figure or the report is asked for.
_HOMES = {
    **dict.fromkeys(("Report", "build_report", "load_run", "make_report", "plan_report", "write_report"), "report"),
    **dict.fromkeys(("export_csv", "tidy_rows"), "tables"),
    **dict.fromkeys((
        "anatomy_heatmap", "attribution", "both_directions", "coupling_by_layer", "coupling_scatter", "dissociation",
        "graft_effects", "group_shares", "headroom_differences", "headroom_rates", "interactions", "kl_attribution",
        "kl_by_model", "kl_over_steps", "kl_per_task", "kl_reproduced", "kl_top", "kl_trajectory", "movement_vs_effect",
        "paired_differences", "rank_by_layer", "study_summary", "success_rates", "sweep_trajectory", "top_tensors",
        "training_curves", "movement_over_steps", "layer_movement_over_steps", "path_geometry", "mask_overlap",
        "sparsity_curve", "principal_directions", "forgetting"),
        "notebook"),
}
_SUBMODULES = ("anatomy", "browser", "commands", "curves", "grafts", "kl", "notebook", "rank", "report", "runs",
               "success", "summary", "tables")


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})


__all__ = list(_HOMES)
