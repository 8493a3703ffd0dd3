"""Delta anatomy: where each RL run moved the weights, as layer × group heatmaps and group shares.

Input: results of kind ``delta`` (graft/anatomy.py ``delta_anatomy``): ``layer_group_share[run, layer,
group]`` (fraction of the run's total squared movement ‖Δ‖²_F), ``layer_group_rel_delta`` (‖Δ‖_F/‖W‖_F
pooled over the cell's tensors), ``group_share[run, group]``; ``tensor_group`` / ``tensor_layer`` say
which groups have tensors inside the decoder layers (only those get a heatmap column). Every builder
reads its result through :class:`~graftkit.graft.anatomy.DeltaResult`. The per-run figures (heatmaps, largest
movers) come one per run and, for the report, as one figure per delta result with a menu picking the run
(:func:`anatomy_heatmaps`, :func:`top_tensors_by_run`); runs are coloured by regime (figures/runs.py). A run
bit-identical to its base (:func:`identical_runs`: ``DeltaResult.identical``) has nothing to draw there — its cells
are all 0 and its ratios over ‖Δ‖ undefined — so the report states it in one line instead (its movement over steps,
in a trajectory, still shows its 0).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..graft.anatomy import LABELS, DeltaResult
from ..results.store import Result
from ._common import base_layout, colour, esc, esc_all, integer_axis, selector, step_axis
from .runs import run_colours, study_order

#: Heatmap metrics: (hover format, title) of the layer × group cells; the colour bar and the factor to the
#: plotted value are the metric's :data:`~graftkit.graft.anatomy.LABELS` entry.
HEATMAPS = {
    "share": (".4f", "Share of squared weight movement"),
    "rel_delta": (".4g", "Relative change ‖Δ‖_F / ‖W‖_F"),
}


def layered_groups(res: Result) -> list[int]:
    """Indices (into the ``group`` coordinate) of groups with at least one tensor inside a decoder layer."""
    d = DeltaResult.from_result(res)
    if not (d.has("tensor_group") and d.has("tensor_layer")):
        return list(range(len(d.groups)))
    tg, tl = np.asarray(d.tensor_group), d.tensor_layer
    return [j for j, g in enumerate(d.groups) if np.any((tg == g) & (tl >= 0))]


def identical_runs(res: Result) -> list[int]:
    """Indices of the runs bit-identical to the base (``DeltaResult.identical``), where the result records it
    (``attrs["identical"]``, or the unchanged counts it is read from); none where it records neither."""
    d = DeltaResult.from_result(res)
    if "identical" not in d.attrs and not (d.has("n_unchanged") and d.has("numel")):
        return []
    return [r for r in range(len(d.runs)) if d.identical(r)]


def anatomy_heatmap(label: str, res: Result, run: int, metric: str = "share") -> go.Figure:
    """One run's layer × group heatmap of ``metric`` ("share" or "rel_delta")."""
    spec, main = HEATMAPS[metric]
    bar, scale = LABELS[metric].axis, LABELS[metric].scale
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


def anatomy_heatmaps(runs: Sequence[tuple[str, Result, int]], metric: str = "share") -> go.Figure:
    """:func:`anatomy_heatmap` of every run ``(label, result, run index)``, one shown at a time, a menu of the
    runs' labels (in study order, figures/runs.py) picking it (one run: its figure as it is)."""
    runs = [runs[i] for i in study_order([label for label, _, _ in runs])]
    return selector([(esc(label), anatomy_heatmap(label, res, r, metric)) for label, res, r in runs])


def top_tensors_by_run(runs: Sequence[tuple[str, Result, int]], n: int = 15) -> go.Figure | None:
    """:func:`top_tensors` of every run that has them, one shown at a time, a menu of the runs' labels picking
    it (None when no run has a per-tensor share above zero)."""
    runs = [runs[i] for i in study_order([label for label, _, _ in runs])]
    options = [(esc(label), fig) for label, res, r in runs if (fig := top_tensors(label, res, r, n)) is not None]
    return selector(options) if options else None


def group_shares(runs: Sequence[tuple[str, Result, int]]) -> go.Figure:
    """Share of each run's squared movement per parameter group (all layers and outside them); each run in its
    colour (figures/runs.py: a regime's hue, a shade per seed)."""
    fig = go.Figure()
    colours = run_colours([label for label, _, _ in runs])
    for i in study_order([label for label, _, _ in runs]):
        label, res, r = runs[i]
        d = DeltaResult.from_result(res)
        groups = d.groups
        share = d.group("share", r).astype(np.float64)
        rel, fro = (d.group(m, r) if d.has(f"group_{m}") else np.full(len(groups), np.nan)
                    for m in ("rel_delta", "fro_delta"))
        extra = [[f"{float(rel[j]):.4g}", f"{float(fro[j]):.4g}"] for j in range(len(groups))]
        fig.add_trace(go.Bar(
            x=esc_all(groups), y=LABELS["share"].scale * share, name=esc(label), marker_color=colours[i],
            customdata=extra,
            hovertemplate="%{fullData.name} · %{x}<br>share %{y:.4f}%<br>‖Δ‖_F/‖W‖_F %{customdata[0]}"
                          "<br>‖Δ‖_F %{customdata[1]}<extra></extra>",
        ))
    fig.update_layout(barmode="group", scattermode="group")
    return base_layout(fig, "Where the weights moved: share per parameter group",
                       "share of the run's total squared movement Σ‖Δ‖²_F; each run's bars sum to 100%",
                       "parameter group", LABELS["share"].axis, legend_title="RL run")


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
        y=esc_all(names[i] for i in order), x=LABELS["share"].scale * share[order], orientation="h",
        marker_color=run_colours([label])[0],
        customdata=[[esc(group[i]), f"{rel[i]:.4g}"] for i in order], name=esc(label),
        hovertemplate="%{y}<br>group %{customdata[0]}<br>share %{x:.4f}%<br>‖Δ‖_F/‖W‖_F %{customdata[1]}"
                      "<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed", type="category")
    return base_layout(fig, f"Largest movers — {esc(label)}", f"the {len(order)} tensors with the largest share of "
                       "the run's squared movement", LABELS["share"].axis, "tensor",
                       height=max(300, 110 + 24 * len(order)))


def trajectory_steps(res: Result) -> list[int] | None:
    """The optimiser step of each run of a delta result taken over a training run's checkpoints (``delta
    --all-checkpoints``: ``attrs["steps"]``), when there are at least two; else None."""
    steps = res.attrs.get("steps")
    if not isinstance(steps, (list, tuple)) or len(steps) < 2 or any(not isinstance(s, int) for s in steps):
        return None
    return list(steps)


def movement_over_steps(label: str, res: Result) -> go.Figure | None:
    """‖Δ‖_F/‖W‖_F of each parameter group against the optimiser step of each checkpoint (None unless the
    result is a trajectory, see :func:`trajectory_steps`)."""
    steps = trajectory_steps(res)
    d = DeltaResult.from_result(res)
    if steps is None or not d.has("group_rel_delta"):
        return None
    fig = go.Figure()
    for j, g in enumerate(d.groups):
        y = [float(d.group("rel_delta", r)[j]) for r in range(len(d.runs))]
        fig.add_trace(go.Scatter(x=steps, y=y, mode="lines+markers", name=esc(g), marker_color=colour(j),
                                 hovertemplate="%{fullData.name}<br>step %{x}<br>‖Δ‖_F/‖W‖_F %{y:.4g}<extra></extra>"))
    step_axis(fig, steps)
    return base_layout(fig, f"Where the weights moved, when — {esc(label)}", "relative change of each parameter "
                       "group from the base, at each saved checkpoint", "optimiser step", LABELS["rel_delta"].axis,
                       legend_title="parameter group")


def path_geometry(label: str, res: Result) -> go.Figure | None:
    """The shape of a run's weight path (graftkit trajectory: graft/path.py): per parameter group and in all,
    cos(Δ_t, Δ_T) at each checkpoint, and in all the cosine between successive updates; the subtitle gives the R² of
    a straight line through the path beside a random walk's (None unless the result is a trajectory)."""
    from ..graft.path import delta_path

    steps = trajectory_steps(res)
    d = DeltaResult.from_result(res)
    if steps is None or not d.has("dot_delta"):
        return None
    m = delta_path(d, steps)
    fig = go.Figure()
    for j, g in enumerate([*d.groups, "all"]):
        fig.add_trace(go.Scatter(x=steps, y=m[g]["cos_to_final"], mode="lines+markers", name=esc(f"cos(Δ_t, Δ_T) {g}"),
                                 marker_color=colour(j), line={"width": 3 if g == "all" else 1.5},
                                 hovertemplate=f"{esc(g)}<br>step %{{x}}<br>cos(Δ_t, Δ_T) %{{y:.3f}}<br>R² of a line "
                                               f"{m[g]['r2']:.3f} (a random walk {m[g]['r2_random_walk']:.3f})"
                                               "<extra></extra>"))
    fig.add_trace(go.Scatter(x=steps, y=m["all"]["update_cos"], mode="lines+markers", name="cos(u_t, u_t−1) all",
                             line={"dash": "dash", "color": "#222"},
                             hovertemplate="step %{x}<br>cos between this update and the last %{y:.3f}<extra></extra>"))
    step_axis(fig, steps)
    return base_layout(fig, f"The shape of the weight path — {esc(label)}",
                       f"straight-line fit of the whole path: R² {m['all']['r2']:.3f}, a random walk of the same "
                       f"update sizes {m['all']['r2_random_walk']:.3f}; 1 = along one line", "optimiser step",
                       "cosine", legend_title="measure")


def mask_overlap(res: Result) -> go.Figure | None:
    """Per pair of runs of a delta result (two runs or more), the Jaccard overlap over all tensors of the entries
    each moved (as stored, as bf16 stores them) and of their top fractions by |Δ|, each beside what independent masks
    of the same sizes would share (a black tick with its 95% interval); None with one run."""
    d = DeltaResult.from_result(res)
    rows = [r for r in d.overlap() if r["group"] == "all"]
    if not rows:
        return None
    pairs = esc_all(" · ".join(r["runs"]) for r in rows)
    masks = [m for m in ("moved", "moved_bf16", "top") if m in rows[0]]
    names = {"moved": "moved entries", "moved_bf16": "moved as bf16 stores them",
             "top": f"top {d.attrs.get('overlap_top_frac', 0):g} by |Δ|"}

    def val(x):
        return np.nan if x is None else x

    fig = go.Figure()
    for k, m in enumerate(masks):
        fig.add_trace(go.Bar(x=pairs, y=[val(r[m]["jaccard"]) for r in rows], name=esc(names[m]), offsetgroup=k,
                             marker_color=colour(k),
                             customdata=[[val(r[m]["chance"]), val(r[m]["chance_low"]), val(r[m]["chance_high"])]
                                         for r in rows],
                             hovertemplate="%{x}<br>Jaccard %{y:.4f}<br>independent masks: %{customdata[0]:.4f} "
                                           "[%{customdata[1]:.4f}, %{customdata[2]:.4f}]<extra></extra>"))
        chance = np.array([val(r[m]["chance"]) for r in rows], dtype=np.float64)
        low = np.array([val(r[m]["chance_low"]) for r in rows], dtype=np.float64)
        high = np.array([val(r[m]["chance_high"]) for r in rows], dtype=np.float64)
        fig.add_trace(go.Scatter(x=pairs, y=chance, mode="markers", offsetgroup=k, showlegend=k == 0,
                                 name="independent masks (95%)", marker={"symbol": "line-ew-open", "size": 22,
                                                                         "color": "#222", "line": {"width": 2}},
                                 error_y={"type": "data", "symmetric": False, "array": high - chance,
                                          "arrayminus": chance - low, "color": "#222"}, hoverinfo="skip"))
    fig.update_layout(barmode="group", scattermode="group")
    return base_layout(fig, "Do runs move the same entries?", "Jaccard |A∩B| / |A∪B| of two runs' masks over every "
                       "tensor; black ticks: independent masks of each tensor's sizes", "pair of runs",
                       "Jaccard overlap", legend_title="mask")


def layer_movement_over_steps(label: str, res: Result) -> go.Figure | None:
    """‖Δ‖_F of each decoder layer (over all its groups) at each checkpoint's step, as a layer × step
    heatmap (None unless the result is a trajectory)."""
    steps = trajectory_steps(res)
    d = DeltaResult.from_result(res)
    if steps is None or not d.has("layer_group_share") or not len(d.layers):
        return None
    # a cell's share times the run's total Σ‖Δ‖² is the cell's Σ‖Δ‖²; a layer's movement pools its cells
    z = np.array([np.sqrt(np.nansum(d.cells("share", r), axis=1) * d.total("fro_delta", r) ** 2)
                  for r in range(len(d.runs))]).T  # [layer, step]
    layers = [int(x) for x in d.layers]
    fig = go.Figure(go.Heatmap(z=z, x=[str(s) for s in steps], y=layers, colorscale="Viridis",
                               colorbar={"title": LABELS["fro_delta"].axis},
                               hovertemplate="layer %{y}<br>step %{x}<br>‖Δ‖_F %{z:.4g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    integer_axis(fig, layers, "y")
    return base_layout(fig, f"Movement per decoder layer over training — {esc(label)}", "‖Δ‖_F of the layer's "
                       "tensors from the base, at each saved checkpoint", "optimiser step", "decoder layer",
                       height=max(320, 120 + 22 * len(layers)))
