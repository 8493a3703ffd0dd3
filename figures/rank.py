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

from ..store import Result
from ._common import base_layout, bounds, colour, esc, esc_all, integer_axis, interval_error, title, zero_line

TARGETS = {
    "rank-weights": ("weights", "decoder layer"),
    "rank-delta": ("RL delta Δ = W_RL − W_SFT", "decoder layer"),
    "rank-activations": ("activations (hidden states on probe prompts)", "hidden-state index (0 = embeddings)"),
}


def layer_values(res: Result) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(layers, metrics, values[layer, metric]) of a rank result: the "all" group for weights/delta."""
    metrics = [str(m) for m in res.coords["metric"]]
    if "value_layer" in res.data:
        dims = res.dims("value_layer")
        groups = [str(g) for g in res.coords["group"]]
        v = np.asarray(res["value_layer"], dtype=np.float64)
        v = np.moveaxis(v, [dims.index("layer"), dims.index("group"), dims.index("metric")], [0, 1, 2])
        v = v[:, groups.index("all") if "all" in groups else 0, :]
        return np.asarray(res.coords["layer"]), metrics, v
    dims = res.dims("value")
    v = np.moveaxis(np.asarray(res["value"], dtype=np.float64), [dims.index("layer"), dims.index("metric")], [0, 1])
    return np.asarray(res.coords["layer"]), metrics, v


#: Value-axis unit of each metric (rank/spectra.py and rank/weights.py names); others read "value".
UNITS = {
    "erank": "effective rank (dimensions)", "erank_sq": "effective rank (dimensions)",
    "stable_rank": "stable rank (dimensions)", "participation_ratio": "participation ratio (dimensions)",
    "rankme": "RankMe (dimensions)", "numerical_rank": "numerical rank (count of σ > tol)",
    "top1_energy": "top-1 energy σ₁²/Σσ² (fraction)", "spectral_drift": "spectral drift (relative)",
    "delta_energy_top8": "energy of Δ in W₀'s top-k subspace (fraction)",
    "intruders": "intruder dimensions (count)",
}


def unit(metric: str) -> str:
    """Axis title for ``metric`` (escaped)."""
    return UNITS.get(metric, f"{esc(metric)} (value)")


def _convention(results: Sequence[tuple[str, Result]], metric: str) -> str:
    for _, res in results:
        conv = res.attrs.get("conventions")
        if isinstance(conv, dict) and metric in conv:
            return str(conv[metric])
    return "convention not recorded"


def rank_by_layer(kind: str, results: Sequence[tuple[str, Result]]) -> go.Figure:
    """One line per checkpoint over layers; a menu picks the metric (first metric shown)."""
    target, x_title = TARGETS.get(kind, (kind, "layer"))
    per = [(label, *layer_values(res)) for label, res in results]
    metrics: list[str] = []
    for _, _, ms, _ in per:
        metrics += [m for m in ms if m not in metrics]
    agg = " (mean over the layer's matrices)" if kind != "rank-activations" else ""
    fig = go.Figure()
    owner = []  # metric of each trace
    for m in metrics:
        for i, (label, layers, ms, v) in enumerate(per):
            if m not in ms:
                continue
            fig.add_trace(go.Scatter(
                x=layers, y=v[:, ms.index(m)], mode="lines+markers", name=esc(label), visible=m == metrics[0],
                line={"color": colour(i)}, legendgroup=str(i), meta=esc(m),
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


def _what(res: Result) -> str:
    """The rank metric and target the coupling was computed on, as its attrs name them."""
    parts = [f"{k} {res.attrs[k]}" for k in ("what", "target", "metric") if isinstance(res.attrs.get(k), (str, int))]
    return esc(", ".join(parts)) if parts else "rank metric as recorded in the result"


def _layer_axis(res: Result) -> str:
    return TARGETS["rank-activations"][1] if res.attrs.get("what") == "activations" else "decoder layer"


def coupling_by_layer(label: str, res: Result) -> go.Figure:
    """Per layer, the correlation across checkpoints between rank and success, with bootstrap intervals."""
    layers = np.asarray(res.coords["layer"])
    stats_ = [str(s) for s in res.coords["stat"]]
    fig = go.Figure()
    for k, st in enumerate(stats_):
        e, lo, hi = bounds(np.asarray(res["corr_layer"])[:, k], res.coords["bound"])
        custom = [[f"{lo[i]:+.3f}", f"{hi[i]:+.3f}"] for i in range(len(e))]
        if "n_layer" in res.data:
            custom = [c + [str(int(n))] for c, n in zip(custom, res["n_layer"])]
        fig.add_trace(go.Scatter(
            x=layers, y=e, mode="lines+markers", name=esc(_STAT_NAMES.get(st, st)), line={"color": colour(k)},
            error_y={**interval_error(e, lo, hi), "color": colour(k)}, customdata=custom,
            hovertemplate="%{fullData.name}<br>layer %{x}<br>%{y:+.4f} [%{customdata[0]}, %{customdata[1]}]"
                          + ("<br>%{customdata[2]} runs" if "n_layer" in res.data else "") + "<extra></extra>",
        ))
    zero_line(fig)
    integer_axis(fig, layers)
    fig.update_yaxes(range=[-1.05, 1.05])
    level = res.attrs.get("level", 0.95)
    return base_layout(fig, f"Rank–success coupling by layer — {esc(label)}",
                       f"{_what(res)}; correlation across checkpoints, whiskers: {100 * float(level):g}% pairs "
                       "bootstrap", _layer_axis(res), "correlation of rank with success", legend_title="statistic")


def _late_band(res: Result) -> tuple[np.ndarray, str] | None:
    """Each run's rank in the late band: ``rank_band[run, "late"]``, else the mean over the last third."""
    if "rank_band" in res.data and "late" in [str(b) for b in res.coords.get("band", [])]:
        j = [str(b) for b in res.coords["band"]].index("late")
        return np.asarray(res["rank_band"], dtype=np.float64)[:, j], "late band (as stored)"
    if "rank" not in res.data:
        return None
    layers = np.asarray(res.coords["layer"])
    n = int(res.attrs.get("n_layers", len(layers)) or len(layers))
    late = [i for i, L in enumerate(layers) if (3 * int(L)) // max(n, 1) == 2]
    if not late:
        return None
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.asarray(res["rank"], dtype=np.float64)[:, late], axis=1), "late band (⌊3i/n⌋ = 2)"


def coupling_scatter(label: str, res: Result) -> go.Figure | None:
    """Each checkpoint's late-band rank against its success rate (None without rank and success)."""
    late = _late_band(res)
    if late is None or "success" not in res.data:
        return None
    x, how = late
    y = 100 * np.asarray(res["success"], dtype=np.float64)
    runs = esc_all(res.coords["run"])
    kw = {}
    if "success_interval" in res.data:
        e, lo, hi = bounds(res["success_interval"], res.coords["bound"])
        kw["error_y"] = interval_error(e, lo, hi, 100.0)
    fig = go.Figure(go.Scatter(
        x=x, y=y, mode="markers+text", text=runs, textposition="top center", textfont={"size": 10},
        marker={"size": 11, "color": colour(0)}, name="checkpoint", **kw,
        hovertemplate="%{text}<br>late-band rank %{x:.6g}<br>success %{y:.2f}%<extra></extra>",
    ))
    if "corr_band" in res.data and "late" in [str(b) for b in res.coords["band"]]:
        j = [str(b) for b in res.coords["band"]].index("late")
        parts = []
        for k, st in enumerate(str(s) for s in res.coords["stat"]):
            e, lo, hi = bounds(np.asarray(res["corr_band"])[j, k], res.coords["bound"])
            parts.append(f"{esc(_STAT_NAMES.get(st, st))} {float(e):+.3f} [{float(lo):+.3f}, {float(hi):+.3f}]")
        sub = f"{how}; " + "; ".join(parts)
    else:
        sub = how
    return base_layout(fig, f"Late-layer rank vs success — {esc(label)}", sub,
                       "late-band rank (mean over the band's layers)", "success rate (%)", legend_title="")


def both_directions(label: str, res: Result) -> go.Figure | None:
    """Per layer, the fraction of improved / degraded runs whose Δrank has the sign of their Δsuccess."""
    if "frac_layer" not in res.data:
        return None
    layers = np.asarray(res.coords["layer"])
    dirs = [str(d) for d in res.coords[res.dims("frac_layer")[1]]]
    frac = np.asarray(res["frac_layer"], dtype=np.float64)
    verdict = [str(v) for v in res["verdict_layer"]] if "verdict_layer" in res.data else [""] * len(layers)
    fig = go.Figure()
    for k, d in enumerate(dirs):
        e, lo, hi = bounds(frac[:, k], res.coords["bound"])
        agree = res["agree_layer"][:, k] if "agree_layer" in res.data else np.full(len(layers), -1)
        total = res["total_layer"][:, k] if "total_layer" in res.data else np.full(len(layers), -1)
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
