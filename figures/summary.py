"""The study at a glance: the figure the report opens with.

Left: each regime's change in greedy success against the SFT policy, with its 95% interval, as the findings
compute it (study/findings.py, finding 1 and 2): every run of the regime paired with SFT on identical episodes
(:func:`~graftkit.study.findings.suite_episodes`: one entry per episode, clustered by item where the
evaluation records items, else by seed), on the suite the regime trained on (mastered-suite regimes on the
mastered suite, the headroom runs on the headroom suite; a run known only by its name: every task SFT and
the regime's runs share), and :func:`~graftkit.stats.regime_interval` over the runs — a hierarchical
bootstrap with the training seed a random effect (one run: its paired bootstrap, conditional on its seed).
Each run's own change is a dot beside its regime; the findings' positive control (the row numbered
"control": the pipeline learns where reward is reachable) is the last row when the findings have one.

Right: what grafting each parameter group contributes to success (:func:`graftkit.figures.grafts.effect_per_group`:
Shapley values, else main effects, else single-group grafts; 95% intervals), one bar per swept run in its
colour, and beside it the same for KL when the sweeps record a KL attribution
(:func:`graftkit.figures.grafts.kl_per_group`).

Inputs are labelled results ``(label, result)``: the label of an eval result is its model's (the run's
name), of a graft sweep the swept run's. Which run belongs to which regime: figures/runs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.errors import GraftkitError
from ..evaluation.commands import EvalResult
from ..results.layout import EVAL, FINDINGS, GRAFT_SWEEP
from ..results.store import Result
from ..stats import RegimeInterval, regime_interval
from ..study.findings import Finding, FindingsResult, suite_episodes
from ._common import base_layout, decode_key, esc, esc_all, interval_error
from .grafts import effect_per_group, kl_per_group
from .runs import REFERENCE_NAMES, Study, membership, regime_colour, regime_order, run_colours, study_order

#: The findings row of the positive control (its ``number``).
CONTROL = "control"


@dataclass(frozen=True)
class RegimeEffect:
    """One regime's change in greedy success against SFT (fractions), over its runs."""

    regime: str
    #: The suite the change is measured on (None: every task SFT and the runs share).
    suite: str | None
    tasks: tuple[str, ...]
    #: The runs, in the order of ``interval.run_diffs``.
    runs: tuple[str, ...]
    interval: RegimeInterval


@dataclass(frozen=True)
class SummaryInputs:
    """What the summary figure draws, and why anything was left out."""

    effects: tuple[RegimeEffect, ...]
    control: Finding | None
    #: (swept run's label, its per-group effect on success: grafts.effect_per_group) of every sweep with one.
    success: tuple[tuple[str, tuple], ...]
    #: (swept run's label, its per-group KL attribution: grafts.kl_per_group) of every sweep with one.
    kl: tuple[tuple[str, tuple], ...]
    notes: tuple[str, ...]
    #: ``(kind, label)`` of every result drawn: the SFT evaluation and the runs' evaluations of the regimes drawn,
    #: the findings whose control is drawn, the sweeps whose attribution is drawn.
    drawn: tuple[tuple[str, str], ...] = ()

    @property
    def drawable(self) -> bool:
        """A summary needs a regime effect or the positive control: attribution alone is the grafts section's."""
        return bool(self.effects or self.control is not None)


def _reference(evals: Sequence[tuple[str, Result]]) -> tuple[str, Result] | None:
    """The SFT evaluation: the eval labelled as the study labels it (``sft``), else the one marked role=sft."""
    named = [(lab, r) for lab, r in evals if lab in REFERENCE_NAMES]
    if len(named) == 1:
        return named[0]
    marked = [(lab, r) for lab, r in evals if r.attrs.get("role") == "sft"]
    return marked[0] if len(marked) == 1 else None


def regime_effects(sft: Result, runs: Sequence[tuple[str, Result]], study: Study | None = None,
                   level: float = 0.95) -> tuple[list[RegimeEffect], list[str]]:
    """Each regime's change against ``sft`` over its runs' evaluations (``(run name, eval result)``; runs in
    no regime are not drawn), and a note per run left out (not paired with SFT's episodes)."""
    groups: dict[str, list[tuple[str, Result, str | None]]] = {}
    for name, res in runs:
        m = membership(name, study)
        if m is not None:
            groups.setdefault(m.regime, []).append((name, res, m.suite))
    sft_tasks = EvalResult.from_result(sft).tasks
    effects, notes = [], []
    for regime in regime_order(groups, study):
        members = groups[regime]
        suite = members[0][2] if len({s for _, _, s in members}) == 1 else None
        if suite is not None and study is not None and suite in study.suites:
            tasks = [t for t in study.suites[suite] if t in sft_tasks]
        else:
            suite = None
            tasks = [t for t in sft_tasks if all(t in EvalResult.from_result(r).tasks for _, r, _ in members)]
        if not tasks:
            notes.append(f"regime {regime}: its runs and SFT share no evaluated task, so its change is not drawn")
            continue
        a = suite_episodes(sft, tasks, "the SFT evaluation")
        pairs, names = [], []
        for name, res, _ in members:
            try:
                b = suite_episodes(res, tasks, name)
            except GraftkitError as exc:
                notes.append(f"{name}: not drawn in its regime ({exc.what})")
                continue
            if b.outcomes.shape != a.outcomes.shape or not np.array_equal(a.clusters, b.clusters):
                notes.append(f"{name}: not evaluated on the SFT policy's episodes, so not drawn in its regime")
                continue
            pairs.append((a.outcomes, b.outcomes, a.clusters))
            names.append(name)
        if pairs:
            effects.append(RegimeEffect(regime, suite, tuple(tasks), tuple(names), regime_interval(pairs, level=level)))
    return effects, notes


def _swept(res: Result) -> str:
    """The run a graft sweep took apart, as it records it (``rl_label``), '' when it records none."""
    label = res.attrs.get("rl_label")
    return label if isinstance(label, str) else ""


def summary_inputs(items: Sequence[tuple[str, str, Result]], study: Study | None = None) -> SummaryInputs:
    """The summary's inputs from a run's labelled results ``(label, kind, result)``: the SFT evaluation and
    every run's evaluation decoded the same way, the findings' control row, the graft sweeps."""
    evals = [(lab, r) for lab, kind, r in items if kind == EVAL]
    ref = _reference(evals)
    effects, notes = [], []
    if ref is not None:
        runs = [(lab, r) for lab, r in evals if r is not ref[1] and decode_key(r) == decode_key(ref[1])]
        effects, notes = regime_effects(ref[1], runs, study)
    drawn = [(EVAL, ref[0]), *((EVAL, run) for e in effects for run in e.runs)] if effects else []
    control, control_of = None, None
    for lab, kind, r in items:
        if kind == FINDINGS:
            found = next((f for f in FindingsResult.from_result(r).findings if str(f.number) == CONTROL), None)
            if found is not None:
                control, control_of = found, lab
    if control_of is not None:
        drawn.append((FINDINGS, control_of))
    # a sweep's bars are named after its swept run (a run's success and KL sweeps may be two files), unless two
    # sweeps of one panel share the run: then after their labels
    sweeps = [(_swept(r) or lab, lab, r) for lab, kind, r in items if kind == GRAFT_SWEEP]
    per_group: dict[str, list] = {"success": [], "kl": []}
    for run, lab, r in (sweeps[i] for i in study_order([run for run, _, _ in sweeps], study)):
        for key, read in (("success", effect_per_group), ("kl", kl_per_group)):
            try:
                found = read(r)
            except (KeyError, IndexError, ValueError) as exc:
                notes.append(f"{lab}: its {key} attribution could not be read ({type(exc).__name__}: {exc})")
                continue
            if found is not None:
                per_group[key].append((run, lab, found))
                drawn.append((GRAFT_SWEEP, lab))
    for key, rows in per_group.items():
        runs = [run for run, _, _ in rows]
        per_group[key] = [(run if runs.count(run) == 1 else lab, found) for run, lab, found in rows]
    return SummaryInputs(tuple(effects), control, tuple(per_group["success"]), tuple(per_group["kl"]), tuple(notes),
                         tuple(dict.fromkeys(drawn)))


# --------------------------------------------------------------------------------------------------
# The figure


def _effect_label(e: RegimeEffect) -> str:
    n = len(e.runs)
    return f"{e.regime} · {n} run{'s' * (n != 1)}" + (f" · {e.suite} suite" if e.suite else "")


def _iv(e: float, lo: float, hi: float) -> str:
    return f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" if np.isfinite(e) else "undefined"


def _group_bars(fig: go.Figure, col: int, rows: Sequence[tuple[str, tuple]], what: str, shown: set[str]) -> None:
    """One bar per swept run (its colour) over the groups of ``col``; a run's first bars carry its legend entry."""
    colours = run_colours([label for label, _ in rows])
    for (label, found), c in zip(rows, colours):
        source, groups, e, lo, hi = found[:5]
        fig.add_trace(go.Bar(
            x=esc_all(groups), y=e, name=esc(label), marker_color=c, legendgroup=f"sweep {esc(label)}",
            showlegend=label not in shown, error_y=interval_error(e, lo, hi), meta=esc(source),
            customdata=[[f"{e[i]:+.2f} [{lo[i]:+.2f}, {hi[i]:+.2f}]"] for i in range(len(e))],
            hovertemplate=f"%{{fullData.name}} · %{{x}}<br>{what}: %{{meta}}<br>%{{customdata[0]}} (95% interval)"
                          "<extra></extra>",
        ), row=1, col=col)
        shown.add(label)


def study_summary(inputs: SummaryInputs) -> go.Figure:
    """The study at a glance (module docstring): regime effects against SFT with intervals and their runs, the
    positive control, and the per-group attribution of success (and of KL) of the graft sweeps."""
    effects, control, sweeps, kl = inputs.effects, inputs.control, inputs.success, inputs.kl
    # panel → (column, title): the regimes first, then each attribution the sweeps record
    panels = {"regimes": "regimes against SFT", **({"success": "success attribution per group"} if sweeps else {}),
              **({"kl": "KL attribution per group"} if kl else {})}
    col = {key: i + 1 for i, key in enumerate(panels)}
    widths = {1: [1.0], 2: [0.55, 0.45], 3: [0.46, 0.27, 0.27]}[len(panels)]
    fig = make_subplots(rows=1, cols=len(panels), column_widths=widths, horizontal_spacing=0.09,
                        subplot_titles=list(panels.values()))
    rows = [_effect_label(e) for e in effects] + (["positive control"] if control is not None else [])
    for i, e in enumerate(effects):
        ri = e.interval
        note = ("conditional on its training seed" if ri.n_runs == 1 else
                "conditional on these runs" if ri.conditional else "training seed a random effect")
        fig.add_trace(go.Scatter(
            x=[100 * ri.diff], y=[i], mode="markers", name=esc(e.regime), legendgroup=f"regime {esc(e.regime)}",
            marker={"symbol": "diamond", "size": 14, "color": regime_colour(e.regime), "line": {"color": "#222", "width": 1}},
            error_x={**interval_error([ri.diff], [ri.low], [ri.high], 100.0), "color": regime_colour(e.regime)},
            customdata=[[_iv(ri.diff, ri.low, ri.high), esc(", ".join(e.tasks)), note, len(e.runs)]],
            hovertemplate="%{fullData.name}: %{customdata[3]} run(s) on %{customdata[1]}<br>change %{customdata[0]} "
                          "points (95%, %{customdata[2]})<extra></extra>",
        ), row=1, col=1)
        diffs = np.asarray(ri.run_diffs, dtype=np.float64)
        spread = np.linspace(-0.12, 0.12, len(diffs)) if len(diffs) > 1 else np.zeros(1)
        fig.add_trace(go.Scatter(
            x=100 * diffs, y=i + 0.3 + spread, mode="markers", name=f"{esc(e.regime)} · runs",
            legendgroup=f"regime {esc(e.regime)}", showlegend=False, text=esc_all(e.runs),
            marker={"size": 8, "color": run_colours(list(e.runs)), "line": {"color": "#222", "width": 0.5}},
            hovertemplate="%{text}<br>change %{x:+.1f} points<extra></extra>",
        ), row=1, col=1)
    if control is not None:
        i = len(effects)
        fig.add_trace(go.Scatter(
            x=[100 * control.estimate], y=[i], mode="markers", name="positive control",
            marker={"symbol": "star", "size": 16, "color": "#4d4d4d", "line": {"color": "#222", "width": 1}},
            error_x={**interval_error([control.estimate], [control.low], [control.high], 100.0), "color": "#4d4d4d"},
            customdata=[[_iv(control.estimate, control.low, control.high), esc(control.claim or control.statement),
                         esc(control.verdict)]],
            hovertemplate="positive control: %{customdata[1]}<br>change %{customdata[0]} points (95%)"
                          "<br>%{customdata[2]}<extra></extra>",
        ), row=1, col=1)
    fig.add_vline(x=0, line={"color": "#444", "width": 1}, row=1, col=1)
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=esc_all(rows), autorange="reversed",
                     zeroline=False, row=1, col=1)
    shown: set[str] = set()
    for key, rows_, axis in (("success", sweeps, "contribution to success (percentage points)"),
                             ("kl", kl, f"contribution to KL ({esc(kl[0][1][5])})" if kl else "")):
        if rows_:
            _group_bars(fig, col[key], rows_, key if key == "success" else "KL", shown)
            fig.update_xaxes(title_text="parameter group", row=1, col=col[key])
            # the axis spans at least ±1 unit, so float noise around zero (a sweep whose grafts all scored alike)
            # draws as zero instead of filling the panel
            fig.update_yaxes(title_text=axis, autorangeoptions={"include": [-1, 1]}, row=1, col=col[key])
    fig.update_layout(barmode="group")
    what = " and to ".join(w for w, rows_ in (("success", sweeps), ("KL", kl)) if rows_)
    base_layout(fig, "The study at a glance",
                "each regime's mean change in greedy success against SFT over its runs (diamond, 95% interval; "
                "dots: single runs)" + (f"; per parameter group, the graft's contribution to {what} in each swept run"
                                        if what else ""),
                "change in success vs SFT (percentage points)", "", height=max(380, 150 + 62 * len(rows)),
                legend_title="regime / swept run")
    return fig
