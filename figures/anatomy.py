"""Delta anatomy: where each RL run moved the weights, as layer × group heatmaps and group shares.

Input: results of kind ``delta`` (graft/anatomy.py ``delta_anatomy``): ``layer_group_share[run, layer,
group]`` (fraction of the run's total squared movement ‖Δ‖²_F), ``layer_group_rel_delta`` (‖Δ‖_F/‖W‖_F
pooled over the cell's tensors), ``group_share[run, group]``; ``tensor_group`` / ``tensor_layer`` say
which groups have tensors inside the decoder layers (only those get a heatmap column). Every builder
reads its result through :class:`~graftkit.graft.anatomy.DeltaResult`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..graft.anatomy import DeltaResult
from ..store import Result
from ._common import base_layout, colour, esc, esc_all, integer_axis

#: Heatmap metrics: (colour-bar title, factor, hover format, title) of the layer × group cells.
HEATMAPS = {
    "share": ("share of squared movement (%)", 100.0, ".4f", "Share of squared weight movement"),
    "rel_delta": ("‖Δ‖_F / ‖W‖_F", 1.0, ".4g", "Relative change ‖Δ‖_F / ‖W‖_F"),
}


def layered_groups(res: Result) -> list[int]:
    """Indices (into the ``group`` coordinate) of groups with at least one tensor inside a decoder layer."""
    d = DeltaResult.from_result(res)
    if not (d.has("tensor_group") and d.has("tensor_layer")):
        return list(range(len(d.groups)))
    tg, tl = np.asarray(d.tensor_group), d.tensor_layer
    return [j for j, g in enumerate(d.groups) if np.any((tg == g) & (tl >= 0))]


def anatomy_heatmap(label: str, res: Result, run: int, metric: str = "share") -> go.Figure:
    """One run's layer × group heatmap of ``metric`` ("share" or "rel_delta")."""
    bar, scale, spec, main = HEATMAPS[metric]
    d = DeltaResult.from_result(res)
    cols = layered_groups(res)
    z = d.cells(metric, run)[:, cols] * scale  # [layer, group]
    groups = esc_all(np.asarray(d.groups)[cols])
    layers = d.layers
    unit = "%" if scale == 100.0 else ""
    fig = go.Figure(go.Heatmap(
        z=z, x=groups, y=layers, colorscale="Viridis", colorbar={"title": {"text": bar, "side": "right"}},
        zmin=0, hovertemplate=f"layer %{{y}} · %{{x}}<br>{metric} %{{z:{spec}}}{unit}<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed")
    integer_axis(fig, layers, "y")
    return base_layout(fig, f"{main} — {esc(label)}", "decoder layer × parameter group; tensors outside the "
                       "layers (embeddings, final norm, head) are in the group bars", "parameter group",
                       "decoder layer", height=max(320, 120 + 22 * len(layers)))


def group_shares(runs: Sequence[tuple[str, Result, int]]) -> go.Figure:
    """Share of each run's squared movement per parameter group (all layers and outside them)."""
    fig = go.Figure()
    for i, (label, res, r) in enumerate(runs):
        d = DeltaResult.from_result(res)
        groups = d.groups
        share = d.group("share", r).astype(np.float64)
        rel, fro = (d.group(m, r) if d.has(f"group_{m}") else np.full(len(groups), np.nan)
                    for m in ("rel_delta", "fro_delta"))
        extra = [[f"{float(rel[j]):.4g}", f"{float(fro[j]):.4g}"] for j in range(len(groups))]
        fig.add_trace(go.Bar(
            x=esc_all(groups), y=100 * share, name=esc(label), marker_color=colour(i), customdata=extra,
            hovertemplate="%{fullData.name} · %{x}<br>share %{y:.4f}%<br>‖Δ‖_F/‖W‖_F %{customdata[0]}"
                          "<br>‖Δ‖_F %{customdata[1]}<extra></extra>",
        ))
    fig.update_layout(barmode="group")
    return base_layout(fig, "Where the weights moved: share per parameter group",
                       "share of the run's total squared movement Σ‖Δ‖²_F; each run's bars sum to 100%",
                       "parameter group", "share of squared movement (%)", legend_title="RL run")


def top_tensors(label: str, res: Result, run: int, n: int = 15) -> go.Figure | None:
    """The ``n`` tensors with the largest share of one run's squared movement (None without ``share``)."""
    d = DeltaResult.from_result(res)
    if not d.has("share"):
        return None
    share = d.tensor("share", run).astype(np.float64)
    names = d.tensors
    order = [i for i in np.argsort(-np.nan_to_num(share, nan=-1.0), kind="stable")[:n] if share[i] > 0]
    if not order:
        return None
    rel = d.tensor("rel_delta", run).astype(np.float64) if d.has("rel_delta") else np.full(len(names), np.nan)
    group = d.tensor_group if d.has("tensor_group") else [""] * len(names)
    fig = go.Figure(go.Bar(
        y=esc_all(names[i] for i in order), x=100 * share[order], orientation="h", marker_color=colour(0),
        customdata=[[esc(group[i]), f"{rel[i]:.4g}"] for i in order], name=esc(label),
        hovertemplate="%{y}<br>group %{customdata[0]}<br>share %{x:.4f}%<br>‖Δ‖_F/‖W‖_F %{customdata[1]}"
                      "<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed", type="category")
    return base_layout(fig, f"Largest movers — {esc(label)}", f"the {len(order)} tensors with the largest share of "
                       "the run's squared movement", "share of squared movement (%)", "tensor",
                       height=max(300, 110 + 24 * len(order)))
