"""Training curves: the per-step metrics that `graftkit train sft|grpo` logs, one figure per family.

Input: results of kind ``train-sft`` / ``train-grpo`` / ``train-trainer`` (one array per metric over ``step``,
written from ``train_log.jsonl`` or a Trainer's ``trainer_state.json``), read through
:class:`~graftkit.train.commands.TrainingCurves`. A family is drawn when at least one run logged one of its
metrics; a logged value with no finite neighbour (a run that logged one step) is drawn as a marker. Given the runs' names, the runs are ordered and
coloured by study regime and a menu shows one regime's runs at a time (figures/runs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..results.store import Result
from ..train.commands import TrainingCurves
from ._common import base_layout, colour, esc
from .runs import regime_groups, run_colours, study_order


@dataclass(frozen=True)
class CurveFamily:
    """Metrics drawn on one shared axis."""

    key: str
    #: Figure title.
    title: str
    #: Logged metric names (keys of train_log.jsonl) in this family.
    metrics: tuple[str, ...]
    #: Value-axis title, with its unit.
    y_title: str
    #: Factor from the logged value to the plotted one (100 for fractions shown in %).
    scale: float = 1.0
    #: Hover number format (d3-format).
    hover: str = ".6g"


FAMILIES = (
    CurveFamily("success", "Success rate of the training batches", ("success",), "success rate (%)", 100.0, ".2f"),
    CurveFamily("reward", "Mean reward of the training batches", ("reward",), "mean reward per episode"),
    CurveFamily("loss", "Training loss (SFT: cross-entropy; GRPO: the surrogate objective)", ("loss",),
                "loss (SFT: nats/token)"),
    CurveFamily("kl", "KL to the reference policy", ("kl_k3_mean",), "KL, k3 estimator (nats/token)"),
    CurveFamily("entropy", "Policy entropy on action tokens", ("entropy",), "entropy (nats/token)"),
    CurveFamily("clip", "Clip fractions", ("clip_frac_low", "clip_frac_high"), "action tokens clipped (%)",
                100.0, ".3f"),
    CurveFamily("grad_norm", "Gradient norm", ("grad_norm",), "‖∇‖₂ before clipping"),
)
_DASH = ("solid", "dash", "dot", "dashdot")


def logs_family(res: Result, family: CurveFamily) -> bool:
    """Whether the run ``res`` logged at least one metric of ``family``."""
    c = TrainingCurves.from_result(res)
    return any(c.has(m) for m in family.metrics)


def families_present(runs: Sequence[tuple[str, Result]]) -> list[CurveFamily]:
    """The families with at least one metric logged by at least one run."""
    return [f for f in FAMILIES if any(logs_family(r, f) for _, r in runs)]


def training_curve(runs: Sequence[tuple[str, Result]], family: CurveFamily,
                   names: Sequence[str] | None = None) -> go.Figure:
    """One line per (run, metric of the family) against the optimiser step.

    ``names``: each run's name (the report's: its label without the algorithm), which orders and colours the
    runs by study regime (figures/runs.py) and, when they fall in two or more groups, adds a menu showing all
    runs or one regime's; without names, the runs in order in the plain palette."""
    fig = go.Figure()
    if names is not None and len(names) != len(runs):
        raise ValueError(f"{len(names)} names for {len(runs)} training runs")
    order = study_order(names) if names is not None else list(range(len(runs)))
    colours = run_colours(names) if names is not None else [colour(i) for i in range(len(runs))]
    owner = []  # run index of each trace
    for i in order:
        label, res = runs[i]
        c = TrainingCurves.from_result(res)
        for j, metric in enumerate(m for m in family.metrics if c.has(m)):
            y = c.values(metric) * family.scale
            step = c.steps
            name = esc(label) + (f" · {metric}" if len(family.metrics) > 1 else "")
            unit = "%" if family.scale == 100.0 else ""
            window = smoothing_window(len(y))
            line = {"color": colours[i], "dash": _DASH[j % len(_DASH)]}
            alone = isolated(y)  # logged values a line cannot join: drawn as markers
            fig.add_trace(go.Scatter(
                x=step, y=y, mode="lines+markers" if alone.any() else "lines", name=name, line={**line, "width": 1},
                opacity=0.35 if window else 1.0,
                **({"marker": {"color": colours[i], "size": np.where(alone, 8, 0)}} if alone.any() else {}),
                legendgroup=f"{i}-{j}",
                hovertemplate=f"%{{fullData.name}}<br>step %{{x}}<br>{metric} %{{y:{family.hover}}}{unit}<extra></extra>",
            ))
            owner.append(i)
            if window:
                fig.add_trace(go.Scatter(
                    x=step, y=moving_mean(y, window), mode="lines", name=f"{name} · mean of {window} steps",
                    line={**line, "width": 2}, legendgroup=f"{i}-{j}", showlegend=False,
                    hovertemplate=f"%{{fullData.name}}<br>step %{{x}}<br>{metric} %{{y:{family.hover}}}{unit}"
                                  "<extra></extra>",
                ))
                owner.append(i)
    sub = f"{len(runs)} run(s), one colour per run" + (
        "; faint: every step, solid: centred moving mean" if any(smoothing_window(len(TrainingCurves.from_result(r).steps))
                                                              for _, r in runs) else "")
    # the regimes of the runs that logged this family (a run without its metrics draws nothing)
    groups = [(g, members) for g, members in (regime_groups(names) if names is not None else [])
              if set(members) & set(owner)]
    if len(groups) > 1:
        sub += "; the menu shows one regime's runs"
        options = [("all runs", list(range(len(runs))))] + [(esc(g), members) for g, members in groups]
        fig.update_layout(
            updatemenus=[{"buttons": [{"label": label, "method": "restyle",
                                       "args": [{"visible": [o in members for o in owner]}]}
                                      for label, members in options],
                          "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
                          "showactive": True, "active": 0, "pad": {"t": 4, "b": 4}}],
            meta={"selector": "regime", "options": [{"label": label, "traces": [k for k, o in enumerate(owner)
                                                                                 if o in members]}
                                                    for label, members in options]})
    fig = base_layout(fig, family.title, sub, "optimiser step", family.y_title, legend_title="run")
    if len(groups) > 1:
        fig.update_layout(margin={"t": 110})
    return fig


def isolated(y: np.ndarray) -> np.ndarray:
    """The finite values of a curve with no finite neighbour (a run that logged one step, a step between NaNs):
    a line alone does not draw them."""
    ok = np.isfinite(np.asarray(y, dtype=np.float64))
    joined = np.zeros_like(ok)
    joined[1:] |= ok[1:] & ok[:-1]
    joined[:-1] |= ok[:-1] & ok[1:]
    return ok & ~joined


def smoothing_window(n: int) -> int:
    """Steps in the moving mean drawn over a long curve: n/50 (odd), none below 200 steps."""
    return (n // 50) | 1 if n >= 200 else 0


def moving_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving mean over ``window`` steps, NaN-aware, shrinking at the ends (no padding)."""
    ok = np.isfinite(y)
    kernel = np.ones(window)
    num = np.convolve(np.where(ok, y, 0.0), kernel, mode="same")
    den = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
