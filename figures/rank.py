"""Rank by layer per checkpoint, and rank–success coupling across checkpoints.

Inputs: ``rank-weights`` / ``rank-delta`` (rank/weights.py: ``value_layer[layer, group, metric]``, group
"all" = every matrix of the layer), ``rank-activations`` (``value[layer, metric]`` over hidden-state
indices), each with ``attrs["conventions"][metric]`` naming the formula; ``coupling`` (``corr_layer[layer,
stat, bound]``, ``corr_band[band, stat, bound]``, ``rank[run, layer]``, ``success[run]``). The convention of
every plotted metric is written on the figure (subtitle and axis), as the results record it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..rank.coupling import CouplingResult
from ..rank.metrics import DELTA_TOPK, MEASURES
from ..rank.results import RankResult
from ..results.layout import RANK_ACTIVATIONS, RANK_DELTA, RANK_WEIGHTS
from ..results.store import Result
from ._common import base_layout, bounds, colour, esc, esc_all, integer_axis, interval_error, title, zero_line
from .runs import membership, run_colours, study_order

TARGETS = {
    RANK_WEIGHTS: ("weights", "decoder layer"),
    RANK_DELTA: ("RL delta Δ = W_RL − W_SFT", "decoder layer"),
    RANK_ACTIVATIONS: ("activations (hidden states on probe prompts)", "hidden-state index (0 = embeddings)"),
}


def layer_values(res: Result) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(layers, metrics, values[layer, metric]) of a rank result: the "all" group for weights/delta."""
    view = RankResult.from_result(res)
    layers, values = view.table()
    return layers, view.metrics, values


def unit(metric: str) -> str:
    """Axis title for ``metric``: the rank measure's label (:data:`graftkit.rank.metrics.MEASURES`); an unknown name
    read from a result is escaped."""
    return MEASURES[metric].label if metric in MEASURES else f"{esc(metric)} (value)"


def _convention(results: Sequence[tuple[str, Result]], metric: str) -> str:
    for _, res in results:
        conv = res.attrs.get("conventions")
        if isinstance(conv, dict) and metric in conv:
            return str(conv[metric])
    return "convention not recorded"


def rank_by_layer(kind: str, results: Sequence[tuple[str, Result]]) -> go.Figure:
    """One line per checkpoint over layers, in its run's colour (figures/runs.py); a menu picks the metric (first
    metric shown)."""
    target, x_title = TARGETS.get(kind, (kind, "layer"))
    order = study_order([label for label, _ in results])
    results = [results[i] for i in order]
    per = [(label, *layer_values(res)) for label, res in results]
    colours = run_colours([label for label, _ in results])
    metrics: list[str] = []
    for _, _, ms, _ in per:
        metrics += [m for m in ms if m not in metrics]
    agg = " (mean over the layer's matrices)" if kind != RANK_ACTIVATIONS else ""
    fig = go.Figure()
    owner = []  # metric of each trace
    for m in metrics:
        for i, (label, layers, ms, v) in enumerate(per):
            if m not in ms:
                continue
            fig.add_trace(go.Scatter(
                x=layers, y=v[:, ms.index(m)], mode="lines+markers", name=esc(label), visible=m == metrics[0],
                line={"color": colours[i]}, legendgroup=str(i), meta=esc(m),
                hovertemplate="%{fullData.name}<br>layer %{x}<br>%{meta} %{y:.6g}<extra></extra>",
            ))
            owner.append(m)
    main = f"Rank by layer — {esc(target)}"

    def sub(m: str) -> str:
        return f"{esc(m)}: {esc(_convention(results, m))}{agg}"

    buttons = [{"label": esc(m), "method": "update",
                "args": [{"visible": [o == m for o in owner]},
                         {"title.text": title(main, sub(m))["text"], "yaxis.title.text": unit(m)}]}
               for m in metrics]
    base_layout(fig, main, sub(metrics[0]) if metrics else None, x_title,
                unit(metrics[0]) if metrics else "rank", legend_title="checkpoint")
    integer_axis(fig, np.unique(np.concatenate([p[1] for p in per])) if per else [])
    if len(metrics) > 1:
        fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right",
                                        "y": 1.02, "yanchor": "bottom", "showactive": True}],
                          margin={"t": 100})
    return fig


# --------------------------------------------------------------------------------------------------
# Coupling

_STAT_NAMES = {"spearman": "Spearman ρ", "pearson": "Pearson r"}


def principal_directions(results: Sequence[tuple[str, Result]]) -> go.Figure | None:
    """Per RL delta (a ``rank-delta`` result each), the mean share of ‖Δ‖² in W's top-k left and right singular
    subspaces over the matrices RL moved, each beside the exact share of a random Δ (a hollow marker), and the
    top-k subspace overlap of W and W′ on hover (:meth:`RankResult.principal`, group "all"); None when no result
    holds the measures."""
    rows = []
    for label, res in results:
        got = {r["group"]: r for r in RankResult.from_result(res).principal()}
        if "all" in got:
            rows.append((label, got["all"]))
    if not rows:
        return None
    labels = esc_all(label for label, _ in rows)
    fig = go.Figure()
    for k, (side, name) in enumerate((("delta_energy_top8", "left (output) subspace"),
                                      ("delta_energy_top8_right", "right (input) subspace"))):
        fig.add_trace(go.Bar(x=labels, y=[100 * r[side] for _, r in rows], name=f"Δ's share, {name}",
                             marker_color=colour(k), offsetgroup=k,
                             customdata=[[100 * r[f"{side}_chance"], r["subspace_overlap_top8"], r["matrices"]]
                                         for _, r in rows],
                             hovertemplate="%{x}<br>%{y:.2f}% of ‖Δ‖² (a random Δ: %{customdata[0]:.2f}%)<br>"
                                           "top-k overlap of W and W′: %{customdata[1]:.4f}<br>mean over "
                                           "%{customdata[2]} moved matrices<extra></extra>"))
        fig.add_trace(go.Scatter(x=labels, y=[100 * r[f"{side}_chance"] for _, r in rows], mode="markers",
                                 name=f"a random Δ, {name}", offsetgroup=k,
                                 marker={"symbol": "line-ew-open", "size": 26, "color": "#222",
                                         "line": {"width": 2}}, hoverinfo="skip"))
    base_layout(fig, "Where RL moved W: along or off its principal directions",
                f"share of ‖Δ‖² in the top-{DELTA_TOPK} singular subspaces of the base weights, mean over the moved matrices; black ticks: a random "
                "direction's share (exact)", "RL run", "share of ‖Δ‖² (%)", legend_title="")
    fig.update_layout(barmode="group", scattermode="group")
    return fig


def _what(res: Result) -> str:
    """The rank metric and target the coupling was computed on, as its attrs name them."""
    parts = [f"{k} {res.attrs[k]}" for k in ("what", "target", "metric") if isinstance(res.attrs.get(k), (str, int))]
    return esc(", ".join(parts)) if parts else "rank metric as recorded in the result"


def _layer_axis(res: Result) -> str:
    return TARGETS[RANK_ACTIVATIONS][1] if res.attrs.get("what") == "activations" else "decoder layer"


def coupling_by_layer(label: str, res: Result) -> go.Figure:
    """Per layer, the correlation across checkpoints between rank and success, with bootstrap intervals."""
    view = CouplingResult.from_result(res)
    layers, n_runs = np.asarray(view.layers), view.n_runs("layer")
    fig = go.Figure()
    for k, st in enumerate(view.stats):
        e, lo, hi = bounds(view.corr("layer")[:, k], view.bound_labels)
        custom = [[f"{lo[i]:+.3f}", f"{hi[i]:+.3f}"] for i in range(len(e))]
        if n_runs is not None:
            custom = [c + [str(int(n))] for c, n in zip(custom, n_runs)]
        fig.add_trace(go.Scatter(
            x=layers, y=e, mode="lines+markers", name=esc(_STAT_NAMES.get(st, st)), line={"color": colour(k)},
            error_y={**interval_error(e, lo, hi), "color": colour(k)}, customdata=custom,
            hovertemplate="%{fullData.name}<br>layer %{x}<br>%{y:+.4f} [%{customdata[0]}, %{customdata[1]}]"
                          + ("<br>%{customdata[2]} runs" if n_runs is not None else "") + "<extra></extra>",
        ))
    zero_line(fig)
    integer_axis(fig, layers)
    fig.update_yaxes(range=[-1.05, 1.05])
    return base_layout(fig, f"Rank–success coupling by layer — {esc(label)}",
                       f"{_what(res)}; correlation across checkpoints, whiskers: {100 * view.level:g}% pairs "
                       "bootstrap", _layer_axis(res), "correlation of rank with success", legend_title="statistic")


def coupling_scatter(label: str, res: Result) -> go.Figure | None:
    """Each checkpoint's late-band rank against its success rate (None without rank and success)."""
    view = CouplingResult.from_result(res)
    late = view.late_rank()
    if late is None or view.success is None:
        return None
    x, how = late
    y = 100 * view.success
    runs = esc_all(view.runs)
    kw = {}
    if view.success_interval is not None:
        e, lo, hi = bounds(view.success_interval, view.bound_labels)
        kw["error_y"] = interval_error(e, lo, hi, 100.0)
    fig = go.Figure(go.Scatter(
        x=x, y=y, mode="markers+text", text=runs, textposition="top center", textfont={"size": 10},
        marker={"size": 11, "color": run_colours(view.runs) if any(map(membership, view.runs)) else colour(0)},
        name="checkpoint", **kw,
        hovertemplate="%{text}<br>late-band rank %{x:.6g}<br>success %{y:.2f}%<extra></extra>",
    ))
    if view.has("corr_band") and "late" in view.bands:
        j = view.bands.index("late")
        parts = []
        for k, st in enumerate(view.stats):
            e, lo, hi = bounds(view.corr("band")[j, k], view.bound_labels)
            parts.append(f"{esc(_STAT_NAMES.get(st, st))} {float(e):+.3f} [{float(lo):+.3f}, {float(hi):+.3f}]")
        sub = f"{how}; " + "; ".join(parts)
    else:
        sub = how
    return base_layout(fig, f"Late-layer rank vs success — {esc(label)}", sub,
                       "late-band rank (mean over the band's layers)", "success rate (%)", legend_title="")


def both_directions(label: str, res: Result) -> go.Figure | None:
    """Per layer, the fraction of improved / degraded runs whose Δrank has the sign of their Δsuccess."""
    view = CouplingResult.from_result(res)
    if view.both("frac", "layer") is None:
        return None
    layers = np.asarray(view.layers)
    frac = np.asarray(view.both("frac", "layer"), dtype=np.float64)
    found = view.both("verdict", "layer")
    verdict = [str(v) for v in found] if found is not None else [""] * len(layers)
    fig = go.Figure()
    for k, d in enumerate(view.directions):
        e, lo, hi = bounds(frac[:, k], view.bound_labels)
        agree, total = (view.both(w, "layer") for w in ("agree", "total"))
        agree = agree[:, k] if agree is not None else np.full(len(layers), -1)
        total = total[:, k] if total is not None else np.full(len(layers), -1)
        fig.add_trace(go.Scatter(
            x=layers, y=100 * e, mode="lines+markers", name=esc(f"{d} runs"), line={"color": colour(k)},
            error_y={**interval_error(e, lo, hi, 100.0), "color": colour(k)},
            customdata=[[f"{int(a)}/{int(t)}", esc(v)] for a, t, v in zip(agree, total, verdict)],
            hovertemplate="%{fullData.name}<br>layer %{x}<br>agree %{y:.1f}% (%{customdata[0]})<br>%{customdata[1]}"
                          "<extra></extra>",
        ))
    fig.add_hline(y=50, line={"color": "#444", "width": 1, "dash": "dot"})
    integer_axis(fig, layers)
    fig.update_yaxes(range=[-2, 102])
    return base_layout(fig, f"Both directions: does Δrank follow Δsuccess? — {esc(label)}",
                       "share of runs (vs the SFT parent) where sign(Δrank) = sign(Δsuccess); whiskers: 95% Wilson; "
                       "credible when the interval clears 50%", _layer_axis(res), "runs agreeing in sign (%)",
                       legend_title="runs that")
