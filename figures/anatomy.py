"""Delta anatomy: where each RL run moved the weights, as layer × group heatmaps and group shares.

Input: results of kind ``delta`` (graft/anatomy.py ``delta_anatomy``): ``layer_group_share[run, layer,
group]`` (fraction of the run's total squared movement ‖Δ‖²_F), ``layer_group_rel_delta`` (‖Δ‖_F/‖W‖_F
pooled over the cell's tensors), ``group_share[run, group]``; ``tensor_group`` / ``tensor_layer`` say
which groups have tensors inside the decoder layers (only those get a heatmap column).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..store import Result
from ._common import base_layout, colour, esc, esc_all, integer_axis

#: Heatmap metrics: (array, colour-bar title, factor, hover format, title).
HEATMAPS = {
    "share": ("layer_group_share", "share of squared movement (%)", 100.0, ".4f", "Share of squared weight movement"),
    "rel_delta": ("layer_group_rel_delta", "‖Δ‖_F / ‖W‖_F", 1.0, ".4g", "Relative change ‖Δ‖_F / ‖W‖_F"),
}


def layered_groups(res: Result) -> list[int]:
    """Indices (into the ``group`` coordinate) of groups with at least one tensor inside a decoder layer."""
    groups = [str(g) for g in res.coords["group"]]
    if "tensor_group" not in res.data or "tensor_layer" not in res.data:
        return list(range(len(groups)))
    tg = np.asarray(res["tensor_group"]).astype(str)
    tl = np.asarray(res["tensor_layer"])
    return [j for j, g in enumerate(groups) if np.any((tg == g) & (tl >= 0))]


def anatomy_heatmap(label: str, res: Result, run: int, metric: str = "share") -> go.Figure:
    """One run's layer × group heatmap of ``metric`` ("share" or "rel_delta")."""
    name, bar, scale, spec, main = HEATMAPS[metric]
    cols = layered_groups(res)
    z = np.asarray(res[name], dtype=np.float64)[run][:, cols] * scale  # [layer, group]
    groups = esc_all(np.asarray(res.coords["group"])[cols])
    layers = np.asarray(res.coords["layer"])
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
        groups = [str(g) for g in res.coords["group"]]
        share = np.asarray(res["group_share"], dtype=np.float64)[r]
        extra = []
        for j in range(len(groups)):
            rel = res["group_rel_delta"][r, j] if "group_rel_delta" in res.data else np.nan
            fro = res["group_fro_delta"][r, j] if "group_fro_delta" in res.data else np.nan
            extra.append([f"{float(rel):.4g}", f"{float(fro):.4g}"])
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
    if "share" not in res.data:
        return None
    share = np.asarray(res["share"], dtype=np.float64)[run]
    names = [str(t) for t in res.coords["tensor"]]
    order = [i for i in np.argsort(-np.nan_to_num(share, nan=-1.0), kind="stable")[:n] if share[i] > 0]
    if not order:
        return None
    rel = np.asarray(res["rel_delta"], dtype=np.float64)[run] if "rel_delta" in res.data else np.full(len(names), np.nan)
    group = [str(g) for g in res["tensor_group"]] if "tensor_group" in res.data else [""] * len(names)
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
