"""Behavioural divergence: the figures of ``graftkit kl`` results.

Input: results of kind ``kl`` (evaluation/kl.py), read through :class:`~graftkit.evaluation.kl.KLResult`:
``kl_mean[side, scope, per, bound]`` — side: whose rollouts (``rl``: KL(π_RL‖π_SFT) on RL's own rollouts,
``sft``: KL(π_SFT‖π_RL) on SFT's, each forward from the policy that played, as the result's ``sides`` and
``conventions`` record it), scope: each task then ``all`` (pooled), per: ``token`` (Σ KL / Σ action tokens) or
``episode`` (mean over episodes of Σ KL), bound: estimate/low/high of the clustered interval over items — and the
strings that moved most (:meth:`~graftkit.evaluation.kl.KLResult.top`: mean log π_RL − log π_SFT of each token or
action string, gained and lost). Every value is in nats; figures name the direction beside every value.

A result whose ``kl_mean`` has a ``step`` dimension as well (a trajectory: one policy per checkpoint step, the
dimension anywhere among the others) is drawn as lines over the steps (:func:`kl_over_steps`); its per-task
figure shows its last step. The results ``kl --all-checkpoints`` writes, one per checkpoint (each recording its
``step`` and ``trainer_run``), are one trajectory per training run and base (:func:`trajectory_point`,
figures/runs.py ``trajectories``): :func:`kl_trajectory` draws both sides' KL at every step with its interval as a
band, in the run's colour, and :func:`still_steps` names the steps at which KL is exactly 0 on both sides' rollouts
(the checkpoint's behaviour had not moved from its base's). Without a step, several results (several RL models) are
compared pooled over tasks in :func:`kl_by_model`, and the report's per-task and strings figures get a menu
picking the model (``_common.selector``). A model has its run colour (figures/runs.py) in every figure; the side
is the fill: solid for RL's rollouts, hatched for SFT's (lines: solid and dotted). Hover text gives each side's
share of rollout outputs that parsed (:func:`parse_rates`); the report states ``KLResult.notes`` beside the
figures (a user's file's coverage, outputs that mostly did not parse).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..evaluation.kl import KLResult
from ..results.store import Result
from ._common import (base_layout, bounds, esc, esc_all, fmt, interval_error, parsed_text, step_axis,
                      translucent)
from .runs import run_colours, run_label, study_order

#: What ``per`` measures, as axis titles (the unit with it).
PER_AXIS = {"token": "KL (nats per action token)", "episode": "KL (nats per episode)"}
#: Fill pattern and line dash of each side (whose rollouts): solid for RL's, hatched / dotted for SFT's.
SIDE_PATTERN = {"rl": "", "sft": "/"}
SIDE_DASH = {"rl": "solid", "sft": "dot"}
#: The side's direction where the result records none (evaluation/kl.py ``SIDE_KL``).
SIDE_KL = {"rl": "KL(π_RL‖π_SFT) on RL's rollouts", "sft": "KL(π_SFT‖π_RL) on SFT's rollouts"}
#: The pooled scope, and how figures name it.
ALL, ALL_SHOWN = "all", "all tasks"


def side_names(res: Result) -> dict[str, str]:
    """Each side's direction and rollouts as the result records them (``attrs["sides"]``), else
    :data:`SIDE_KL`."""
    rec = res.attrs.get("sides")
    rec = rec if isinstance(rec, Mapping) else {}
    return {s: str(rec.get(s) or SIDE_KL.get(s, s)) for s in KLResult.from_result(res).sides}


def steps_of(res: Result) -> list[int]:
    """The checkpoint steps of a trajectory (``kl_mean`` over a ``step`` dimension), empty for one policy."""
    return [int(s) for s in res.coords["step"]] if "step" in res.dims("kl_mean") else []


def kl_means(res: Result) -> np.ndarray:
    """``kl_mean`` as ``[step, side, scope, per, bound]``, whatever the order of its named dimensions (one step
    for a result without a ``step`` dimension); sides, scopes, pers and bounds in the result's label order."""
    dims = list(res.dims("kl_mean"))
    arr = np.asarray(res["kl_mean"], dtype=np.float64)
    if "step" not in dims:
        arr, dims = arr[None], ["step", *dims]
    want = ("step", "side", "scope", "per", "bound")
    if sorted(dims) != sorted(want):
        raise ValueError(f"kl_mean over {dims}, expected {list(want)} (step optional)")
    return np.transpose(arr, [dims.index(d) for d in want])


def summary(res: Result, side: str, per: str, step: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) over the scopes (each task, then ``all``) of the KL on ``side``'s rollouts ``per``
    token or episode, at the ``step``-th step (a result without steps: its one)."""
    v = KLResult.from_result(res)
    return bounds(kl_means(res)[step, v.sides.index(side), :, v.labels("per").index(per)], v.labels("bound"))


def pooled(res: Result, side: str, per: str, step: int = -1) -> tuple[float, float, float]:
    """(estimate, low, high) of :func:`summary` pooled over tasks (scope ``all``)."""
    i = KLResult.from_result(res).scopes.index(ALL)
    e, lo, hi = summary(res, side, per, step)
    return float(e[i]), float(lo[i]), float(hi[i])


def parse_rates(res: Result, side: str) -> list[float]:
    """Per scope (each task, then ``all``), the share of ``side``'s rollout turns whose output parsed
    (``KLResult.parsed``); NaN where the result did not record it, and for a trajectory, whose per-episode arrays are
    not those of the step its per-task figure shows."""
    v = KLResult.from_result(res)
    if steps_of(res):
        return [float("nan")] * len(v.scopes)
    return [v.parsed(side, scope) for scope in v.scopes]


def _pooled_parsed(res: Result, side: str) -> float:
    """:func:`parse_rates` pooled over tasks (scope ``all``)."""
    return parse_rates(res, side)[KLResult.from_result(res).scopes.index(ALL)]


def _scope_labels(v: KLResult) -> list[str]:
    return [ALL_SHOWN if s == ALL else s for s in v.scopes]


def _iv(e: float, lo: float, hi: float, spec: str = ".4g") -> str:
    return f"{fmt(e, spec)} [{fmt(lo, spec)}, {fmt(hi, spec)}]"


def _sides_line(res: Result, lines: bool = False) -> str:
    """The first subtitle line: how each side is drawn (bars: solid or hatched; lines: solid or dotted) and what it
    measures, as the result records it."""
    mark = {"": "solid", "/": "hatched"} if not lines else {"solid": "solid", "dot": "dotted"}
    style = SIDE_PATTERN if not lines else SIDE_DASH
    return "; ".join(f"{mark.get(style.get(s, ''), s)}: {esc(n)}" for s, n in side_names(res).items())


def _convention_line(res: Result, marks: str = "whiskers") -> str:
    """The second subtitle line: the direction and units as the result records them, and the intervals' level (drawn
    as ``marks``)."""
    conv = KLResult.from_result(res).conventions
    level = res.var_attrs.get("kl_mean", {}).get("level", 0.95)
    return esc(f"{conv.get('direction') or 'forward KL from the policy that played its rollouts'}; "
               f"log base {conv.get('log_base') or 'e (nats)'}; {marks}: {fmt(100 * float(level), '.3g')}% intervals "
               "over items")


def _two_lines(fig: go.Figure) -> go.Figure:
    """Room for a two-line subtitle above the subplots' titles."""
    fig.update_layout(margin={"t": 125})
    return fig


def kl_per_task(label: str, res: Result) -> go.Figure:
    """One model's KL per task and pooled, both sides with their intervals: per action token (left) and per
    episode (right), the hover giving each side's share of outputs that parsed (:func:`parse_rates`); a trajectory's
    last step."""
    v = KLResult.from_result(res)
    steps = steps_of(res)
    names = side_names(res)
    c = run_colours([label])[0]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per action token", "per episode"), horizontal_spacing=0.1)
    x = esc_all(_scope_labels(v))
    n_tok = {s: v.tokens(s) for s in v.sides} if not steps else {}
    for col, per in enumerate(("token", "episode"), start=1):
        for s in v.sides:
            e, lo, hi = summary(res, s, per)
            tokens = ([int(n_tok[s].sum()) if scope == ALL else int(n_tok[s][v.tasks.index(scope)].sum())
                       for scope in v.scopes] if n_tok else ["—"] * len(v.scopes))
            parsed = parse_rates(res, s)
            fig.add_trace(go.Bar(
                x=x, y=e, name=esc(names[s]), legendgroup=s, showlegend=col == 1,
                marker={"color": c, "pattern": {"shape": SIDE_PATTERN.get(s, "x"), "fillmode": "overlay",
                                                "fgcolor": "#ffffff", "solidity": 0.4}},
                error_y={**interval_error(e, lo, hi), "color": "#222"},
                customdata=[[_iv(e[i], lo[i], hi[i]), tokens[i], parsed_text(parsed[i])] for i in range(len(e))],
                hovertemplate=f"%{{x}} · %{{fullData.name}}<br>%{{customdata[0]}} nats per {per} (95% interval)"
                              "<br>action tokens: %{customdata[1]}<br>outputs parsed on these rollouts: "
                              "%{customdata[2]}<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(title_text=PER_AXIS[per], rangemode="tozero", row=1, col=col)
        fig.update_xaxes(title_text="task", row=1, col=col)
    fig.update_layout(barmode="group")
    at = f" at step {steps[-1]}" if steps else ""
    base_layout(fig, f"Behavioural divergence per task — {esc(label)}{at}",
                f"{_sides_line(res)}<br>{_convention_line(res)}", "task", PER_AXIS["token"],
                legend_title="direction (whose rollouts)")
    return _two_lines(fig)


def kl_by_model(items: Sequence[tuple[str, Result]]) -> go.Figure | None:
    """Several models' KL from their base, pooled over tasks, both sides with intervals, per action token (left)
    and per episode (right); models in study order in their run colours. None for fewer than two results
    without a step dimension (a trajectory is :func:`kl_over_steps`'s)."""
    items = [(label, res) for label, res in items if not steps_of(res)]
    if len(items) < 2:
        return None
    order = study_order([label for label, _ in items])
    labels = [items[i][0] for i in order]
    colours = run_colours(labels)
    names = side_names(items[order[0]][1])
    sides = list(names)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per action token", "per episode"), horizontal_spacing=0.1)
    for col, per in enumerate(("token", "episode"), start=1):
        for s in sides:
            e, lo, hi = np.array([pooled(items[i][1], s, per) for i in order]).T
            fig.add_trace(go.Bar(
                x=esc_all(labels), y=e, name=esc(names[s]), legendgroup=s, showlegend=col == 1, text=esc_all(labels),
                textposition="none",
                marker={"color": colours, "pattern": {"shape": SIDE_PATTERN.get(s, "x"), "fillmode": "overlay",
                                                      "fgcolor": "#ffffff", "solidity": 0.4}},
                error_y={**interval_error(e, lo, hi), "color": "#222"},
                customdata=[[_iv(e[i], lo[i], hi[i]), parsed_text(_pooled_parsed(items[k][1], s))]
                            for i, k in enumerate(order)],
                hovertemplate=f"%{{x}} · %{{fullData.name}}<br>%{{customdata[0]}} nats per {per}, all tasks "
                              "(95% interval)<br>outputs parsed on these rollouts: %{customdata[1]}<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(title_text=PER_AXIS[per], rangemode="tozero", row=1, col=col)
        fig.update_xaxes(title_text="RL model (against its base)", row=1, col=col)
    fig.update_layout(barmode="group")
    first = items[order[0]][1]
    return _two_lines(base_layout(fig, "Behavioural divergence from the base, by model",
                                  f"pooled over tasks; {_sides_line(first)}<br>{_convention_line(first)}",
                                  "RL model (against its base)", PER_AXIS["token"],
                                  legend_title="direction (whose rollouts)"))


def kl_over_steps(items: Sequence[tuple[str, Result]]) -> go.Figure | None:
    """KL from the base at each checkpoint step of every trajectory (results with a ``step`` dimension), pooled
    over tasks, per action token (left) and per episode (right): a line per model and side, its interval a band
    of whiskers. None when no result has steps."""
    traj = [(label, res) for label, res in items if steps_of(res)]
    if not traj:
        return None
    order = study_order([label for label, _ in traj])
    colours = dict(zip([traj[i][0] for i in order], run_colours([traj[i][0] for i in order])))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per action token", "per episode"), horizontal_spacing=0.1)
    for col, per in enumerate(("token", "episode"), start=1):
        for i in order:
            label, res = traj[i]
            v = KLResult.from_result(res)
            steps, names = steps_of(res), side_names(res)
            for s in v.sides:
                e, lo, hi = np.array([pooled(res, s, per, k) for k in range(len(steps))]).T
                fig.add_trace(go.Scatter(
                    x=steps, y=e, mode="lines+markers", name=f"{esc(label)} · {esc(names[s])}",
                    legendgroup=f"{esc(label)} {s}", showlegend=col == 1,
                    line={"color": colours[label], "dash": SIDE_DASH.get(s, "dash")}, marker={"size": 6},
                    error_y={**interval_error(e, lo, hi), "color": colours[label]},
                    customdata=[[_iv(e[k], lo[k], hi[k])] for k in range(len(e))],
                    hovertemplate=f"%{{fullData.name}}<br>step %{{x}}<br>%{{customdata[0]}} nats per {per}, all "
                                  "tasks (95% interval)<extra></extra>",
                ), row=1, col=col)
        fig.update_yaxes(title_text=PER_AXIS[per], rangemode="tozero", row=1, col=col)
        fig.update_xaxes(title_text="checkpoint step", row=1, col=col)
    first = traj[order[0]][1]
    return _two_lines(base_layout(fig, "Behavioural divergence from the base over training",
                                  f"pooled over tasks; {_sides_line(first, lines=True)}<br>"
                                  f"{_convention_line(first)}", "checkpoint step", PER_AXIS["token"],
                                  legend_title="model · direction"))


def trajectory_point(res: Result) -> tuple[tuple[str, str], str, int] | None:
    """Where a ``kl`` result sits in a training run's trajectory: ((trainer_run, base), the run's label, step) for a
    result ``kl --all-checkpoints`` wrote (``KLResult.step`` and ``trainer_run``); None for any other (a result with
    a ``step`` dimension is a trajectory of its own, :func:`kl_over_steps`)."""
    v = KLResult.from_result(res)
    if steps_of(res) or v.step is None or v.trainer_run is None:
        return None
    return (v.trainer_run, v.base_path), run_label(v.trainer_run), v.step


def still_steps(steps: Sequence[int], results: Sequence[Result]) -> list[int]:
    """The steps of a trajectory at which KL is exactly 0 on every side's rollouts, pooled over tasks: each played
    token had the same distribution under the checkpoint and its base (KL ≥ 0 per token, so a mean of 0 is 0 on
    every token) — its behaviour had not moved."""
    out = []
    for step, res in zip(steps, results):
        v = KLResult.from_result(res)
        if all(v.summary(s, ALL, "token")[0] == 0.0 for s in v.sides):
            out.append(step)
    return out


#: The legend entry of the steps at which KL is exactly 0 both ways (:func:`still_steps`).
STILL = "not moved: KL exactly 0 both ways"
#: Opacity of each side's interval band (RL's rollouts darker, SFT's lighter).
SIDE_BAND = {"rl": 0.22, "sft": 0.12}


def kl_trajectory(label: str, steps: Sequence[int], results: Sequence[Result], colour: str | None = None) -> go.Figure:
    """One training run's KL from its base at every checkpoint step (one ``kl`` result per step, in step order),
    pooled over tasks, per action token (left) and per episode (right): a line per side (solid: RL's rollouts,
    dotted: SFT's) in the run's colour, its interval a band; the hover gives the checkpoint, the interval and the
    share of the side's outputs that parsed."""
    c = colour or run_colours([label])[0]
    first = results[0]
    names = side_names(first)
    views = [KLResult.from_result(r) for r in results]
    still = set(still_steps(steps, results))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per action token", "per episode"), horizontal_spacing=0.1)
    for col, per in enumerate(("token", "episode"), start=1):
        for s in views[0].sides:
            e, lo, hi = np.array([v.summary(s, ALL, per) for v in views], dtype=np.float64).T
            band = translucent(c, SIDE_BAND.get(s, 0.1))
            for y, fill in ((hi, None), (lo, "tonexty")):  # the band: high, then low filled up to it
                fig.add_trace(go.Scatter(x=list(steps), y=y, mode="lines", line={"width": 0, "color": band},
                                         fill=fill, fillcolor=band, hoverinfo="skip", showlegend=False,
                                         legendgroup=s, name=f"{esc(names[s])} · interval"), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=list(steps), y=e, mode="lines+markers", name=esc(names[s]), legendgroup=s, showlegend=col == 1,
                line={"color": c, "dash": SIDE_DASH.get(s, "dash")}, marker={"size": 7, "color": c},
                customdata=[[esc(v.attrs.get("labels", {}).get("rl", "")), _iv(e[k], lo[k], hi[k]),
                             parsed_text(v.parsed(s)), " — KL exactly 0: not moved" if steps[k] in still else ""]
                            for k, v in enumerate(views)],
                hovertemplate=f"%{{fullData.name}}<br>step %{{x}} (%{{customdata[0]}})<br>%{{customdata[1]}} nats "
                              f"per {per}, all tasks (95% interval)%{{customdata[3]}}<br>outputs parsed on these "
                              "rollouts: %{customdata[2]}<extra></extra>",
            ), row=1, col=col)
        if still:  # the checkpoints that had not moved: a ring at 0
            fig.add_trace(go.Scatter(
                x=sorted(still), y=[0.0] * len(still), mode="markers", name=STILL, legendgroup="still",
                showlegend=col == 1, cliponaxis=False, marker={"size": 15, "symbol": "circle-open", "color": "#222",
                                                               "line": {"width": 2}},
                hovertemplate="step %{x}: KL exactly 0 on both sides' rollouts<extra></extra>"), row=1, col=col)
        fig.update_yaxes(title_text=PER_AXIS[per], rangemode="tozero", row=1, col=col)
        fig.update_xaxes(title_text="checkpoint step", row=1, col=col)
    step_axis(fig, steps)
    return _two_lines(base_layout(fig, f"Behavioural divergence over training — {esc(label)}",
                                  f"each checkpoint against its base, pooled over tasks; "
                                  f"{_sides_line(first, lines=True)}<br>{_convention_line(first, 'bands')}",
                                  "checkpoint step", PER_AXIS["token"], legend_title="direction (whose rollouts)"))


def kl_trajectories(runs: Sequence[tuple[str, Sequence[int], Sequence[Result]]]) -> go.Figure:
    """:func:`kl_trajectory` of every training run ``(label, steps, results)``, each in its run colour
    (figures/runs.py), one shown at a time, a menu of the runs picking it (one run: its figure as it is)."""
    from ._common import selector

    colours = run_colours([label for label, _, _ in runs])
    order = study_order([label for label, _, _ in runs])
    return selector([(esc(runs[i][0]), kl_trajectory(*runs[i], colour=colours[i])) for i in order], "training run")


#: The strings figure's panels: (what, title).
TOP_PANELS = (("token", "tokens"), ("action", "actions"))


def top_rows(res: Result, what: str) -> list[tuple[str, dict]]:
    """``(direction, row)`` of every listed string of ``what`` (token, action): gained then lost, best first."""
    v = KLResult.from_result(res)
    return [(d, row) for d in ("gained", "lost") for row in v.top(what, d)]


def kl_top(label: str, res: Result) -> go.Figure | None:
    """The token strings (left) and action strings (right) that gained (green) and lost (red) the most
    probability under RL: mean log π_RL − log π_SFT over their occurrences on both sides' rollouts, in nats.
    None when the result lists none."""
    rows = {what: top_rows(res, what) for what, _ in TOP_PANELS}
    if not any(rows.values()):
        return None
    n = max(len(r) for r in rows.values())
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in TOP_PANELS], horizontal_spacing=0.28)
    for col, (what, _) in enumerate(TOP_PANELS, start=1):
        for d, c in (("gained", "#1a9850"), ("lost", "#d73027")):
            picked = [row for dd, row in rows[what] if dd == d]
            fig.add_trace(go.Bar(
                y=esc_all(repr(r["text"]) for r in picked), x=[r["log_ratio"] for r in picked], orientation="h",
                name=f"{d} under RL", legendgroup=d, showlegend=col == 1, marker_color=c,
                customdata=[[r["count"], what] for r in picked],
                hovertemplate="%{y}<br>log π_RL − log π_SFT = %{x:+.4g} nats (mean over %{customdata[0]} "
                              "occurrences of this %{customdata[1]})<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(autorange="reversed", type="category", automargin=True, row=1, col=col)
        fig.update_xaxes(title_text="log π_RL − log π_SFT (nats, mean)", zeroline=True, zerolinecolor="#444",
                         row=1, col=col)
    return base_layout(fig, f"What moved most under RL — {esc(label)}",
                       "token and action strings played on both sides' rollouts, by their mean log-probability ratio "
                       "log π_RL − log π_SFT (nats); green: gained probability, red: lost",
                       "log π_RL − log π_SFT (nats, mean)", "", height=max(360, 140 + 22 * n),
                       legend_title="direction")


def caption_conventions(res: Result) -> str:
    """The conventions a KL section's caption states, as the result records them (plain text)."""
    v = KLResult.from_result(res)
    conv, names = v.conventions, side_names(res)
    mean = v.result.var_attrs.get("kl_mean", {})
    level = mean.get("level")
    parts = [" and ".join(names.values()),
             f"direction: {conv['direction']}" if conv.get("direction") else "",
             f"units: nats, log base {conv['log_base']}" if conv.get("log_base") else "units: nats",
             f"tokens: {conv['tokens']}" if conv.get("tokens") else "",
             f"per token and per episode: {mean['what']}" if mean.get("what") else "",
             (f"{fmt(100 * float(level), '.3g')}% intervals" if level is not None else "intervals")
             + (f" {mean['interval']}" if mean.get("interval") else "")]
    return "; ".join(p for p in parts if p) + "."


__all__ = ["caption_conventions", "kl_by_model", "kl_means", "kl_over_steps", "kl_per_task", "kl_top", "kl_trajectory",
           "kl_trajectories", "parse_rates", "pooled", "side_names", "steps_of", "still_steps", "summary", "top_rows", "trajectory_point"]


def forgetting(res: Result) -> go.Figure:
    """Does KL predict forgetting (graft/forgetting.py)? One panel per predictor: each RL run's forgetting (success
    change on the tasks it did not train on, with its paired 95% interval) against the predictor, the panel titled
    with the predictor's R² [95%] across the runs fit (hollow: a run left out of the fits)."""
    from ..graft.forgetting import PREDICTORS, ForgettingResult

    v = ForgettingResult.from_result(res)
    rows, fits = v.rows(), {f["predictor"]: f for f in v.fits()}
    fitted = np.asarray(v.result["fitted"], dtype=bool)
    names = [p for p in PREDICTORS if p in v.predictors]
    titles = [f"R² {_iv(*[np.nan if x is None else x for x in fits[p]['r2']], '.3f')}" for p in names]
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=titles, shared_yaxes=True)
    f = np.array([[np.nan if x is None else x for x in r["forgetting"]] for r in rows], dtype=np.float64)
    colours = run_colours([r["run"] for r in rows])  # by regime, in the rows' order
    for c, p in enumerate(names, start=1):
        x = np.array([np.nan if r[p] is None else r[p] for r in rows], dtype=np.float64)
        fig.add_trace(go.Scatter(
            x=x, y=100 * f[:, 0], mode="markers", name=esc(PREDICTORS[p]), showlegend=False,
            error_y=interval_error(f[:, 0], f[:, 1], f[:, 2], 100.0),
            marker={"size": 10, "color": list(colours),
                    "symbol": ["circle" if ok else "circle-open" for ok in fitted]},
            text=esc_all(r["run"] for r in rows),
            hovertemplate="%{text}<br>" + esc(p) + " %{x:.4g}<br>forgetting %{y:+.1f} points<extra></extra>"),
            row=1, col=c)
        fig.update_xaxes(title_text=esc(PREDICTORS[p]), title_font={"size": 11}, row=1, col=c)
    fig.add_hline(y=0, line={"color": "#999", "width": 1})
    best = v.attrs.get("best")
    base_layout(fig, "Does KL predict forgetting?", "success change on the tasks each run did not train on (95% paired "
                f"intervals) against how far it moved; best predictor by R²: {esc(best or '—')}", "",
                "forgetting: success change (percentage points)", height=460)
    fig.update_layout(margin={"t": 120})
    fig.update_xaxes(title_font={"size": 11})
    for c in range(len(names)):  # base_layout titles the first x axis; each panel names its own predictor
        fig.layout[f"xaxis{c + 1 if c else ''}"].title.text = esc(PREDICTORS[names[c]])
    return fig
