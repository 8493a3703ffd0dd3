"""Shared pieces of the figure builders: label escaping, the house layout, intervals as error bars.

Plotly.js draws every label (titles, tick labels, legend entries, hover text) through its own
pseudo-HTML reader: ``<b>``, ``<i>``, ``<br>``, ``<sup>``, ``<a href>``… become markup and ``&lt;``,
``&gt;``, ``&amp;`` become ``<``, ``>``, ``&``. Text that comes from results (run, task, tensor and
model names, statements) therefore goes through :func:`esc` before it reaches a figure, so it shows
literally; markup that the builders add themselves is written around already-escaped text.
Hover templates substitute ``%{…}`` in their own text, so data-derived strings never go into a
template: they travel as ``x``/``y``/``customdata``/trace names and the template refers to them.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import plotly.graph_objects as go

#: Colours of a paired verdict (stats.BETTER / WORSE / anything else).
VERDICT_COLOURS = {"credibly better": "#1a9850", "credibly worse": "#d73027", "headroom": "#1a9850",
                   "sampling credibly worse": "#d73027"}
NEUTRAL = "#737373"
#: One colour per series, in order (Plotly's default qualitative palette, extended).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd")


def esc(text: object) -> str:
    """``text`` made literal for Plotly's label renderer (``&``, ``<``, ``>`` as entities)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def esc_all(items: Iterable[object]) -> list[str]:
    return [esc(x) for x in items]


def decode_key(res) -> tuple:
    """How an evaluation decoded (greedy, temperature, top-p, observation, backend), as its result records it:
    two evaluations are paired only when their keys are equal."""
    d = res.attrs.get("decode") if isinstance(res.attrs.get("decode"), dict) else {}
    return (d.get("greedy"), d.get("temperature"), d.get("top_p"), res.attrs.get("obs"), res.attrs.get("backend"))


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def translucent(hex_colour: str, alpha: float) -> str:
    """``#rrggbb`` as ``rgba(r, g, b, alpha)``: an interval band in its line's colour."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha:g})"


def verdict_colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(str(verdict), NEUTRAL)


def title(main: str, sub: str | None = None) -> dict:
    """A figure title; ``main`` and ``sub`` are already escaped (builders escape data they put in)."""
    text = f"<b>{main}</b>" + (f"<br><sup>{sub}</sup>" if sub else "")
    return {"text": text, "x": 0.0, "xanchor": "left"}


def base_layout(fig: go.Figure, main: str, sub: str | None, x_title: str, y_title: str, height: int = 440,
                legend_title: str | None = None) -> go.Figure:
    """The house style: white template, left title, labelled axes, a legend with a title."""
    fig.update_layout(
        template="plotly_white", title=title(main, sub), height=height,
        margin={"l": 70, "r": 30, "t": 80 if sub else 60, "b": 60},
        xaxis_title=x_title, yaxis_title=y_title, hoverlabel={"align": "left"},
        legend={"title": {"text": legend_title or ""}},
        # Plotly hides a one-trace legend; keep it, so every line and bar says which run it is.
        showlegend=any(t.type != "heatmap" for t in fig.data),
    )
    return fig


def integer_axis(fig: go.Figure, values, axis: str = "x") -> None:
    """Whole-number ticks (layers, indices): every value up to 40 of them."""
    spec = {"tickformat": "d", **({"dtick": 1} if len(values) <= 40 else {})}
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(**spec)


def step_axis(fig: go.Figure, steps: Sequence[int], most: int = 20) -> None:
    """Checkpoint steps on every x axis: a tick at each step, or at every k-th (the last included) where there are
    more than ``most``. Always explicit, so a menu's option brings its own ticks (:func:`selector`)."""
    steps = list(steps)
    k = -(-len(steps) // most) if steps else 1
    ticks = steps[::-1][::k][::-1]
    fig.update_xaxes(tickmode="array", tickvals=ticks, tickformat="d")


def fmt(x: float, spec: str = ".4g") -> str:
    """A number for hover text and tables; NaN/±inf as words (never a bare 'nan')."""
    x = float(x)
    if math.isnan(x):
        return "undefined"
    if math.isinf(x):
        return "+inf" if x > 0 else "−inf"
    return format(x, spec)


def pct(x: float, spec: str = ".2f") -> str:
    return fmt(100 * float(x), spec) + ("%" if math.isfinite(float(x)) else "")


def parsed_text(share: float) -> str:
    """A parse rate for hover text: the share of outputs that parsed (a web action, or an answer in the task's answer
    format) in percent, or "not recorded" where the result holds no parse counts (NaN)."""
    return pct(share) if math.isfinite(float(share)) else "not recorded"


def interval_error(est: Sequence[float], low: Sequence[float], high: Sequence[float], scale: float = 1.0) -> dict:
    """Asymmetric error bars from (estimate, low, high); NaN bounds draw no bar."""
    e, lo, hi = (np.asarray(v, dtype=np.float64) * scale for v in (est, low, high))
    plus = np.where(np.isfinite(hi) & np.isfinite(e), np.maximum(hi - e, 0.0), np.nan)
    minus = np.where(np.isfinite(lo) & np.isfinite(e), np.maximum(e - lo, 0.0), np.nan)
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1.5, "width": 4}


def bounds(values: np.ndarray, bound_labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split an array whose last axis is the ``bound`` coordinate into (estimate, low, high)."""
    labels = [str(b) for b in bound_labels]
    v = np.asarray(values, dtype=np.float64)
    return tuple(v[..., labels.index(k)] for k in ("estimate", "low", "high"))  # type: ignore[return-value]


def zero_line(fig: go.Figure, axis: str = "y") -> None:
    """A thin line at zero on the value axis (differences, correlations)."""
    if axis == "y":
        fig.add_hline(y=0, line={"color": "#444", "width": 1})
    else:
        fig.add_vline(x=0, line={"color": "#444", "width": 1})


#: Layout keys a selector sets for the option it shows (those that name or size what is drawn, and explicit ticks:
#: a training run's checkpoint steps, :func:`step_axis`).
_PER_OPTION = ("title.text", "height", "xaxis.title.text", "yaxis.title.text", "xaxis.tickvals", "xaxis2.tickvals")


def _layout_value(fig: go.Figure, key: str):
    node = fig.layout
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def selector(options: Sequence[tuple[str, go.Figure]], what: str = "run") -> go.Figure:
    """One figure of several options (``(label, figure)``: one figure per run, each from the same builder), a
    dropdown menu picking the option shown: its traces become visible, and the title, height, axis titles and
    explicit x ticks become that option's own (the rest of the layout — subplots, their titles, lines — is the first
    option's, so options share one). ``label`` is already escaped. One option is returned as it is (no menu).

    The traces of option k are the traces of its figure, in order; ``layout.meta`` records each option's
    label and its trace indices (``{"selector": what, "options": [{"label", "traces"}]}``), which is what the
    buttons show."""
    if not options:
        raise ValueError("a selector needs at least one option")
    if len(options) == 1:
        return options[0][1]
    first = options[0][1]
    if any(f.layout.updatemenus for _, f in options):
        raise ValueError("a selector's options must not have menus of their own")
    data, owner = [], []
    for k, (_, f) in enumerate(options):
        for t in f.data:
            data.append({**t.to_plotly_json(), "visible": k == 0})
            owner.append(k)
    fig = go.Figure(data=data, layout=first.layout)
    buttons = []
    for k, (label, f) in enumerate(options):
        changes = {key: v for key in _PER_OPTION if (v := _layout_value(f, key)) is not None}
        buttons.append({"label": label, "method": "update", "args": [{"visible": [o == k for o in owner]}, changes]})
    fig.update_layout(
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.0,
                      "yanchor": "bottom", "showactive": True, "active": 0, "pad": {"t": 4, "b": 4}}],
        meta={"selector": what, "options": [{"label": label, "traces": [i for i, o in enumerate(owner) if o == k]}
                                            for k, (label, _) in enumerate(options)]},
        margin={"t": max(int(first.layout.margin.t or 60), 60) + 30},
    )
    return fig
