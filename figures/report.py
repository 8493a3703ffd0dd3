"""The self-contained HTML report of one run: every result of the run's store, as sections of figures.

``build_report(run_dir)`` reads the run's results (``store.list_results`` / ``read_result``), turns them
into sections (plan: which figures, from which files), and renders one HTML page: plotly.js inlined once,
the figures as one JSON document in a ``<script type="application/json">`` element (every ``<``, ``>``
and ``&`` in it written as a ``\\u`` escape, so no text in a result can close the element), and a short
script that draws them. Nothing in the page refers to the network. Text from results is HTML-escaped in
the page and entity-escaped inside figures (figures/_common.py says why).

Sections, in order (``SECTIONS``: each a :class:`SectionSpec` of its key, title, the kinds of result it reads and
its builder), each present when its results exist and otherwise a one-line note naming the command that adds them:
the study at a glance (figures/summary.py: each regime's change against SFT with its
interval, the positive control, success and KL attribution per group), findings, training curves, success
with intervals, headroom, behavioural divergence (figures/kl.py: every ``kl`` result's KL(π_RL‖π_SFT) on RL's
rollouts and KL(π_SFT‖π_RL) on SFT's per task, per token and per episode, across models or checkpoint steps, and
the strings that moved most; captions state the conventions each result records), delta anatomy, graft effects
(success, and for sweeps scored by KL the fraction of RL's behavioural change each graft reproduces and its
attribution per group), rank by layer, rank–success coupling, then the list of result files (provenance).
A training run measured checkpoint by checkpoint (``kl`` and ``graft`` with ``--all-checkpoints``: one result per
checkpoint, each recording its ``step`` and ``trainer_run``) is one trajectory (figures/runs.py ``trajectories``):
the behavioural-divergence section draws both directions' KL over its steps (figures/kl.py ``kl_trajectory``), the
grafts section each swept group's effect over its steps (figures/grafts.py ``sweep_trajectory``), a menu picking the
run, and both say in a note which checkpoint's KL is exactly 0; the per-model and per-sweep menus list its
checkpoints in step order. A delta run bit-identical to its base (``DeltaResult.identical``) is one note naming its
file, left out of the heatmaps, largest movers and group shares (a trajectory's movement over steps keeps its 0).
Where a result records how many outputs parsed (a web action, or an answer in the task's answer format), the hover
of its scores gives the share, and its section's notes say, prefixed by the model or swept run, where most outputs
did not parse and how a user's file was covered (the results' own lines: ``EvalResult.action_notes`` and
``coverage_note``, ``KLResult.notes``, graft/commands.py ``unparsed_lines`` and ``file_coverage``).
Every figure and table names the result files it is drawn from (``data-sources``), so a result kind that no
section draws shows up (tests/test_report_kinds.py). Each measure is one figure: a figure drawn per run (anatomy heatmaps, largest
movers) or per graft sweep is one figure per result with a menu picking the run (``_common.selector``),
and every run has one colour throughout, its regime's hue in its seed's shade (figures/runs.py). A result file
that cannot be read (truncated, garbled attributes) is named with the reason in a notice at the top of the
page and in the report's notes; every section is drawn from the rest.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from .._version import __version__
from ..core.config import OnProgress, no_progress
from ..core.errors import GraftkitError
from ..study.findings import FindingsResult
from ..evaluation.kl import KLResult
from ..graft.anatomy import DeltaResult
from ..graft.experiments import SweepResult
from ..stats import Comparison
from ..core.files import write_atomic
from ..results.layout import (COUPLING, DELTA, EVAL, FINDINGS, FORGETTING, GRAFT_DISSOCIATION, GRAFT_SWEEP, HEADROOM,
                              KL, RANK_DELTA, RANK_KINDS, REPORT, TRAIN_GRPO, TRAIN_KINDS, TRAIN_SFT, TRAIN_TRAINER, result_labels)
from ..results.store import DamagedResult, Result, scan_results
from . import anatomy, curves, grafts, kl, rank, success, summary
from ._common import decode_key, fmt
from .runs import Trajectory, regime_groups, study_in, study_order, trajectories


@dataclass(frozen=True)
class Loaded:
    """One result file of the run, read, with the label its series carry in figures."""

    path: Path
    kind: str
    created: str
    result: Result
    label: str


@dataclass(frozen=True)
class Panel:
    """One figure, its caption (plain text; escaped when rendered) and the result files it is drawn from (named in
    the page: ``data-sources`` of its ``<figure>``)."""

    figure: go.Figure
    caption: str
    sources: tuple[Path, ...] = ()


@dataclass
class Section:
    """A report section: figures, optional HTML (already escaped), and notes."""

    key: str
    title: str
    #: Shown when the run has no result of this section's kinds.
    absent: str
    panels: list[Panel] = field(default_factory=list)
    html: str = ""
    #: Visible one-line notes (e.g. a result whose arrays could not be drawn, and why).
    notes: list[str] = field(default_factory=list)
    present: bool = False
    #: The result files ``html`` (a table) is drawn from.
    html_sources: list[Path] = field(default_factory=list)
    #: The result files a note states something of (a run that did not move), by the note's text.
    note_sources: dict[str, list[Path]] = field(default_factory=dict)

    def note(self, text: str, *sources: Path) -> None:
        """Add a note that states what ``sources`` hold (named in the page, like a figure's sources)."""
        self.notes.append(text)
        self.note_sources.setdefault(text, []).extend(sources)


# --------------------------------------------------------------------------------------------------
# Reading the run


def _model_path(attrs: dict) -> str | None:
    m = attrs.get("model")
    if isinstance(m, dict):
        m = m.get("path")
    return str(m) if isinstance(m, str) and m else None


def base_label(path: Path | None, kind: str, res: Result) -> str:
    """The label a result's series carry in figures: an eval or headroom result's recorded label or model
    folder name (`` (sampled)`` / `` [som]`` marked), a training or rank result's label or model folder
    name, a graft sweep's swept run (its recorded ``rl_label``; `` (KL)`` marks a sweep scored by KL only), a
    ``kl`` result's RL policy (its recorded ``labels["rl"]``: the run it measures against its base), anything
    else its file's stem (its kind when it has no file)."""
    model = _model_path(res.attrs)
    named = res.attrs.get("label") if isinstance(res.attrs.get("label"), str) and res.attrs.get("label") else None
    if kind in (EVAL, HEADROOM) and (named or model):
        label = named or result_labels([model])[0]
        decode = res.attrs.get("decode")
        if kind == EVAL and isinstance(decode, dict) and decode.get("greedy") is False:
            label += " (sampled)"
        if res.attrs.get("obs") == "som":
            label += " [som]"
        return label
    if kind in TRAIN_KINDS + RANK_KINDS and (named or model):
        return named or result_labels([model])[0]
    swept = res.attrs.get("rl_label")
    if kind == GRAFT_SWEEP and isinstance(swept, str) and swept:
        return swept + (" (KL)" if res.attrs.get("metric") == "kl" else "")
    pair = res.attrs.get("labels")
    if kind == KL and isinstance(pair, dict) and isinstance(pair.get("rl"), str) and pair["rl"]:
        return pair["rl"]
    return path.stem if path is not None else kind


def distinct_labels(items: Sequence[tuple[str, str, Path | None]]) -> list[str]:
    """``(kind, label, path)`` → labels unique within their kind: a label that two results of one kind
    share gets `` · <file stem>`` (`` · <position>`` for a result without a file)."""
    seen: dict[tuple[str, str], int] = {}
    for kind, label, _ in items:
        seen[(kind, label)] = seen.get((kind, label), 0) + 1
    return [label if seen[(kind, label)] == 1 else f"{label} · {path.stem if path is not None else i + 1}"
            for i, (kind, label, path) in enumerate(items)]


def training_label(label: str, kind: str) -> str:
    """A training run's legend entry: its label and the algorithm."""
    return label + {TRAIN_GRPO: " (GRPO)", TRAIN_TRAINER: " (trainer_state.json)"}.get(kind, " (SFT)")


def delta_label(run: str, path: Path | None, n_files: int) -> str:
    """An RL run of a delta result: its name, and the file's stem when the run has several delta files."""
    return run if n_files == 1 or path is None else f"{run} · {path.stem}"


def scan_run(run_dir: str | os.PathLike) -> tuple[list[Loaded], list[DamagedResult]]:
    """Every readable result of ``run_dir``, oldest first, each with a label unique within its kind; and
    every result file that could not be read, with the reason (:func:`graftkit.results.store.scan_results`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise GraftkitError(f"{run_dir}: no such run folder", "pass a run folder (e.g. runs/demo), or run `graftkit demo`")
    found, damaged = scan_results(run_dir)
    loaded = [Loaded(Path(row["path"]), row["kind"], row["created"], res, base_label(Path(row["path"]), row["kind"], res))
              for row, res in found]
    labels = distinct_labels([(x.kind, x.label, x.path) for x in loaded])
    return [Loaded(x.path, x.kind, x.created, x.result, lab) for x, lab in zip(loaded, labels)], damaged


def load_run(run_dir: str | os.PathLike) -> list[Loaded]:
    """Every readable result of ``run_dir``, oldest first, each with a label unique within its kind
    (:func:`scan_run` also names the damaged ones)."""
    return scan_run(run_dir)[0]


def _guard(section: Section, item: Loaded, build: Callable[[], None]) -> None:
    """Run one result's builders; a result missing a required array gets a visible note, not a crash."""
    try:
        build()
    except (KeyError, IndexError, ValueError) as exc:
        section.notes.append(f"{item.path.name}: could not be drawn ({type(exc).__name__}: {exc}); "
                             f"its {item.kind} arrays do not have the expected layout")


# --------------------------------------------------------------------------------------------------
# Sections (plan: results → panels)


@dataclass(frozen=True)
class SectionSpec:
    """One section of the report, declared: its key (the page's anchor), title, the line it shows when the run has
    none of its results, the kinds of result it reads, and the builder that draws them (``SECTIONS``)."""

    key: str
    title: str
    #: Shown when the run has no result of ``kinds``, naming the command that adds them.
    absent: str
    #: The kinds of result it reads (``results/layout.py``).
    kinds: tuple[str, ...]
    #: Draws the run's results of ``kinds`` (in the run's order) into the section.
    build: Callable[[Section, list[Loaded]], None]

    def section(self, loaded: Sequence[Loaded]) -> Section:
        """The section of the run's results ``loaded``: present when one is of ``kinds``, unless its builder says
        otherwise (the summary needs a regime to draw; success, an evaluation beside the SFT curves it reads)."""
        sec = Section(self.key, self.title, self.absent)
        items = [x for x in loaded if x.kind in self.kinds]
        sec.present = bool(items)
        self.build(sec, items)
        return sec


def _summary(sec: Section, items: list[Loaded]) -> None:
    try:
        inputs = summary.summary_inputs([(x.label, x.kind, x.result) for x in items],
                                        study_in(x.result for x in items))
    except (KeyError, IndexError, ValueError, GraftkitError) as exc:
        sec.present = False
        sec.notes.append(f"the summary could not be drawn ({type(exc).__name__}: {exc})")
        return
    sec.notes.extend(inputs.notes)
    sec.present = inputs.drawable
    if inputs.drawable:
        path_of = {(x.kind, x.label): x.path for x in items}
        sources = tuple(path_of[k] for k in inputs.drawn if k in path_of)
        sec.panels.append(Panel(summary.study_summary(inputs),
                                "Each regime's mean change in greedy success against the SFT policy over its runs, "
                                "with the 95% interval of the findings (hierarchical bootstrap, the training seed a "
                                "random effect; one run: conditional on its seed); dots: each run's own change; "
                                "the positive control when the findings have one. Beside it, per parameter group, "
                                "what grafting the group contributes to success (and to KL, where the sweeps record "
                                "it) in each swept run. Colours: a regime's hue, a shade per seed, in every figure.",
                                sources))


def _findings(sec: Section, items: list[Loaded]) -> None:
    for item in items:
        def build(item=item):
            view = FindingsResult.from_result(item.result)
            # header → cell: each header is written beside what fills its column
            columns = {"#": lambda f: f.number, **({"claim": lambda f: f.claim} if view.has_claim else {}),
                       "this run found": lambda f: f.statement, "estimate [interval]": _estimate_text,
                       "verdict": lambda f: f.verdict}
            rows = ["<tr>" + "".join(f"<td>{_h(cell(f))}</td>" for cell in columns.values()) + "</tr>"
                    for f in view.findings]
            notes = view.notes
            sec.html_sources.append(item.path)
            sec.html += (f"<table class='findings'><caption>{_h(item.path.name)}" + (f" — {_h(notes)}" if notes else "")
                         + "</caption><thead><tr>" + "".join(f"<th>{_h(h)}</th>" for h in columns)
                         + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")

        _guard(sec, item, build)


def _estimate_text(f) -> str:
    """A finding's estimate and, where one bound is finite, its interval."""
    return fmt(f.estimate, ".3g") + (f" [{fmt(f.low, '.3g')}, {fmt(f.high, '.3g')}]"
                                     if np.isfinite(f.low) or np.isfinite(f.high) else "")


def _training(sec: Section, items: list[Loaded]) -> None:
    runs = [(training_label(x.label, x.kind), x.result) for x in items]
    names = [x.label for x in items]
    menu = ("; a study's runs in their regime's colour, a shade per seed, and the menu shows one regime's runs"
            if len(regime_groups(names)) > 1 else "")
    for fam in curves.families_present(runs):
        logged = tuple(x.path for x, (_, res) in zip(items, runs) if curves.logs_family(res, fam))
        sec.panels.append(Panel(curves.training_curve(runs, fam, names),
                                f"{fam.title} per optimiser step, one line per training run ({', '.join(fam.metrics)})"
                                f"{menu}.", logged))


def _is_sft(item: Loaded, sft_paths: set[str]) -> bool:
    path = _model_path(item.result.attrs)
    if item.result.attrs.get("role") == "sft":
        return True
    return path is not None and (_resolved(path) in sft_paths)


def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def _success(sec: Section, items: list[Loaded]) -> None:
    evals = [x for x in items if x.kind == EVAL]
    sec.present = bool(evals)
    drawable = []
    for item in evals:
        _guard(sec, item, lambda item=item: (success.task_rates(item.result), drawable.append(item)))
    if not drawable:
        return
    sec.panels.append(Panel(success.success_rates([(x.label, x.result) for x in drawable]),
                            "Success rate per task for each evaluated model (bars), with 95% Wilson intervals "
                            "over all episodes; 'all tasks' pools every task of that model; the hover gives the "
                            "share of outputs that parsed (a web action, or an answer in the task's answer format).",
                            tuple(x.path for x in drawable)))
    # The SFT model: a model this run trained with `train sft`, or an eval result marked role = "sft";
    # failing both, the one model whose folder name says sft.
    sft_paths = {_resolved(p) for x in items if x.kind == TRAIN_SFT and (p := _model_path(x.result.attrs))}
    refs = [x for x in drawable if _is_sft(x, sft_paths)]
    if not refs:
        named = [x for x in drawable if "sft" in x.label.lower()]
        refs = named if len({_model_path(x.result.attrs) for x in named}) == 1 else []
    for item in refs or drawable[:1]:
        if line := success.item_line(item.result):
            sec.notes.append(f"{item.label}: {line}")
    _reader_notes(sec, drawable)
    by_ref: dict[str, list[tuple[str, dict[str, Comparison]]]] = {}
    paired: dict[str, list[Path]] = {}
    for item in drawable:
        if item in refs:
            continue
        for ref in refs:
            if decode_key(ref.result) != decode_key(item.result):
                continue
            rows: dict[str, Comparison] = {}
            _guard(sec, item, lambda ref=ref, item=item, rows=rows: rows.update(success.paired_vs(ref.result, item.result)))
            if rows:
                by_ref.setdefault(ref.label, []).append((item.label, rows))
                paired.setdefault(ref.label, [ref.path]).append(item.path)
            break
    for ref_label, rows in by_ref.items():
        sec.panels.append(Panel(success.paired_differences(ref_label, rows),
                                f"Paired difference in success against the SFT model {ref_label} on identical "
                                "episodes (same tasks, seeds and episodes), with the 95% paired bootstrap interval "
                                "(clusters of episodes: by item where the results kept items, else by seed); the verdict needs both the bootstrap and the Bayesian "
                                "interval to exclude zero.", tuple(paired[ref_label])))


def _reader_notes(sec: Section, items: Sequence[Loaded]) -> None:
    """Each evaluation's notes a reader of its figures needs (``success.reader_notes``: a user's file's coverage, and
    where most outputs did not parse), each prefixed by the model's label."""
    for item in items:
        _guard(sec, item, lambda item=item: sec.notes.extend(f"{item.label}: {n}"
                                                             for n in success.reader_notes(item.result)))


def _headroom(sec: Section, items: list[Loaded]) -> None:
    tables, paired = [], []
    for item in items:
        def build(item=item):
            fig = success.headroom_rates(item.label, item.result)
            sec.panels.append(Panel(fig, f"Greedy and sampled success per task for {item.label}, each with a 95% "
                                         "Wilson interval; the sampled bars' hover gives the share of outputs that "
                                         "parsed.", (item.path,)))
            if line := success.item_line(item.result):
                sec.notes.append(f"{item.label}: {line}")
            sec.notes.extend(f"{item.label}: {n}" for n in success.reader_notes(item.result))
            table = success.headroom_of(item.result)
            if table is None:
                sec.notes.append(f"{item.path.name}: greedy and sampled outcomes cannot be paired, so no headroom "
                                 "interval is drawn for it")
            else:
                tables.append((item.label, table))
                paired.append(item.path)

        _guard(sec, item, build)
    if tables:
        sec.panels.append(Panel(success.headroom_differences(tables),
                                "Headroom = sampled − greedy success per task, each greedy episode paired with its "
                                "k samples, with the 95% paired bootstrap interval; a task has headroom when both "
                                "the bootstrap and Bayesian intervals lie above zero.", tuple(paired)))


def _kl(sec: Section, items: list[Loaded]) -> None:
    ok: list[Loaded] = []
    for item in items:
        _guard(sec, item, lambda item=item: (kl.kl_means(item.result), kl.side_names(item.result), ok.append(item)))
    for item in ok:  # a user's file's coverage, and where most of one side's outputs did not parse
        _guard(sec, item, lambda item=item: sec.notes.extend(f"{item.label}: {n}"
                                                             for n in KLResult.from_result(item.result).notes()))
    if not ok:
        return
    conventions = kl.caption_conventions(ok[0].result)
    if any(kl.caption_conventions(x.result) != conventions for x in ok[1:]):
        conventions += " (as recorded by the first of these results; the others record other conventions)"
    fig = kl.kl_over_steps([(x.label, x.result) for x in ok])
    if fig is not None:
        traj = [x for x in ok if kl.steps_of(x.result)]
        sec.panels.append(Panel(fig, "Each trajectory's KL from its base at every checkpoint step, pooled over "
                                     f"tasks, one line per model and side: {conventions}", tuple(x.path for x in traj)))
    # kl --all-checkpoints: one result per checkpoint, a trajectory per training run and base
    runs, _, superseded = trajectories(ok, lambda x: kl.trajectory_point(x.result))
    for old, new in superseded:
        sec.notes.append(f"{old.path.name} and {new.path.name} both measure step {KLResult.from_result(new.result).step} "
                         f"of {KLResult.from_result(new.result).trainer_run}: the newer ({new.path.name}) is drawn "
                         "in its trajectory")
    if runs:
        for t in runs:
            for step in kl.still_steps(t.steps, [x.result for x in t.items]):
                (x,) = [x for st, x in zip(t.steps, t.items) if st == step]
                sec.note(f"{t.label}: at step {step} ({x.label}) KL is exactly 0 on both sides' rollouts — the "
                         "checkpoint's behaviour had not moved from its base's", x.path)
        sec.panels.append(Panel(kl.kl_trajectories([(t.label, t.steps, [x.result for x in t.items]) for t in runs]),
                                f"{_owner([t.label for t in runs])}: the training run's KL from its base at every "
                                "checkpoint step (kl --all-checkpoints: one result per checkpoint), pooled over tasks, "
                                "per action token (left) and per episode (right), one line per side with its interval "
                                "as a band; a ring at 0: KL exactly 0 on both sides (the checkpoint had not moved): "
                                f"{conventions}", tuple(x.path for t in runs for x in t.items)))
    drawn = {x.path for t in runs for x in t.items}
    single = [x for x in ok if not kl.steps_of(x.result) and x.path not in drawn]
    fig = kl.kl_by_model([(x.label, x.result) for x in single])
    if fig is not None:
        sec.panels.append(Panel(fig, f"{len(single)} RL models' KL from their base, pooled over tasks, in study order: "
                                     f"{conventions}", tuple(x.path for x in single)))
    per_task, top, top_from = [], [], []
    for item in _step_ordered(ok, runs):
        def build(item=item):
            fig, moved = kl.kl_per_task(item.label, item.result), kl.kl_top(item.label, item.result)
            per_task.append((item.label, fig))
            if moved is not None:
                top.append((item.label, moved))
                top_from.append(item.path)

        _guard(sec, item, build)
    if per_task:
        pair = ok[0].result.attrs.get("labels")
        against = f" against {pair['sft']}" if len(ok) == 1 and isinstance(pair, dict) and pair.get("sft") else ""
        sec.panels.append(Panel(grafts.by_sweep(per_task, "model"),
                                f"{_owner([lab for lab, _ in per_task])}{against}: KL per task and pooled over tasks, "
                                f"per action token (left) and per episode (right), the hover giving the share of each "
                                f"side's outputs that parsed: {conventions}",
                                tuple(x.path for x in ok if x.label in dict(per_task))))
    if top:
        sec.panels.append(Panel(grafts.by_sweep(top, "model"),
                                f"{_owner([lab for lab, _ in top])}: the token strings and action strings that gained "
                                "and lost the most probability under RL, by the mean over their occurrences on both "
                                "sides' rollouts of log π_RL − log π_SFT of the played tokens (an action: the sum over "
                                "its tokens), in nats (graftkit kl --top).", tuple(top_from)))


def _anatomy(sec: Section, items: list[Loaded]) -> None:
    bars, moved = [], []
    for item in items:
        def build(item=item):
            d = DeltaResult.from_result(item.result, item.path)
            if anatomy.trajectory_steps(item.result) is not None:
                label = item.path.stem if item.path is not None else "trajectory"
                for fig, cap in ((anatomy.movement_over_steps(label, item.result),
                                  "Relative change of each parameter group from the base at every saved checkpoint "
                                  "of the training run (delta --all-checkpoints): where the weights moved, when; "
                                  "the run's own logged curves are under Training curves."),
                                 (anatomy.layer_movement_over_steps(label, item.result),
                                  "‖Δ‖_F of each decoder layer's tensors from the base at every saved checkpoint."),
                                 (anatomy.path_geometry(label, item.result),
                                  "The shape of the weight path (graftkit trajectory): cos(Δ_t, Δ_T) of each group's "
                                  "delta at every checkpoint with the final one, the cosine between successive "
                                  "updates, and in the subtitle the R² of a straight line through the path (the base "
                                  "at step 0 included, pooled over entries) beside the R² a random walk of the same "
                                  "update sizes gets.")):
                    if fig is not None:
                        sec.panels.append(Panel(fig, cap, (item.path,)))
            # a run bit-identical to its base: one line, not heatmaps of zeros and undefined ratios
            still = anatomy.identical_runs(item.result)
            over_steps = " (the movement over steps shows its 0)" if anatomy.trajectory_steps(item.result) else ""
            for r in still:
                sec.note(("" if len(items) == 1 else f"{item.path.name}: ") + f"{d.identical_line(r)}; it is left "
                         f"out of the heatmaps, largest movers and group shares{over_steps}", item.path)
            runs = [(delta_label(run, item.path, len(items)), item.result, r) for r, run in enumerate(d.runs)
                    if r not in still]
            if not runs:
                return
            bars.extend(runs)
            moved.append(item.path)
            whose = _whose([label for label, _, _ in runs])
            if d.has("layer_group_share") and len(d.layers):
                sec.panels.append(Panel(anatomy.anatomy_heatmaps(runs, "share"),
                                        f"Share of {whose} total squared weight movement in each decoder layer × "
                                        "parameter group (cells of one run sum to the in-layer share).",
                                        (item.path,)))
            if d.has("layer_group_rel_delta") and len(d.layers):
                sec.panels.append(Panel(anatomy.anatomy_heatmaps(runs, "rel_delta"),
                                        f"Relative change ‖Δ‖_F/‖W‖_F of {whose} weights per decoder layer × "
                                        "parameter group, pooled over the cell's tensors.", (item.path,)))
            fig = anatomy.mask_overlap(item.result)
            if fig is not None:
                sec.panels.append(Panel(fig, "Whether runs move the same entries: the Jaccard overlap of two runs' "
                                             "masks over every tensor — the entries each moved, as stored and as "
                                             "bf16 copies would store them, and each run's top fraction of every "
                                             "tensor by |Δ| — beside independent masks of each tensor's own sizes "
                                             "(expectation and 95% interval); per group in graftkit delta's table "
                                             "and --json.", (item.path,)))
            fig = anatomy.top_tensors_by_run(runs)
            if fig is not None:
                sec.panels.append(Panel(fig, f"The tensors with the largest share of {whose} squared weight "
                                             "movement.", (item.path,)))

        _guard(sec, item, build)
    if bars:
        try:
            sec.panels.append(Panel(anatomy.group_shares(bars),
                                    "Share of each RL run's total squared weight movement per parameter group, over "
                                    "all tensors including embeddings and the output head.", tuple(dict.fromkeys(moved))))
        except KeyError as exc:
            sec.notes.append(f"group shares could not be drawn (missing array {exc})")


def _listed(labels: Sequence[str]) -> str:
    """The labels of a menu, in its order (figures/runs.py ``study_order``), when there are few enough to read."""
    ordered = [labels[i] for i in study_order(labels)]
    return f": {', '.join(ordered)}" if len(ordered) <= 8 else ""


def _whose(labels: Sequence[str]) -> str:
    """A caption's owner of a per-run figure: the one run's label, or every run's with the menu that picks one."""
    if len(labels) == 1:
        return f"{labels[0]}'s"
    return f"each of {len(labels)} runs' (the menu at the top right picks the run{_listed(labels)})"


def _owner(labels: Sequence[str]) -> str:
    """A caption's subject of a figure with one option per result: the one label, or the menu and its labels."""
    return labels[0] if len(labels) == 1 else f"The menu at the top right picks one of {len(labels)}{_listed(labels)}"


def _grafts(sec: Section, items: list[Loaded]) -> None:
    sweeps, dissoc = [x for x in items if x.kind == GRAFT_SWEEP], [x for x in items if x.kind == GRAFT_DISSOCIATION]
    # measure → (builder, caption); each measure is one figure, a menu picking the swept run
    measures = {
        "effects": (grafts.graft_effects, "success change of each grafted configuration against the base (SFT) and "
                                          "against the RL model, on identical episodes, with 95% paired intervals; "
                                          "the hover gives the share of the configuration's outputs that parsed."),
        "kl_reproduced": (grafts.kl_reproduced, "the fraction of RL's behavioural change each grafted configuration "
                                                "reproduces, by KL on fixed rollouts (sweeps scored with --metric kl "
                                                "or both): reproduced_RL(C) = 1 − KL(π_RL‖π_C)/KL(π_RL‖π_SFT) on RL's "
                                                "rollouts, reproduced_SFT(C) = KL(π_SFT‖π_C)/KL(π_SFT‖π_RL) on SFT's "
                                                "(KL summed over each episode's action tokens, nats, pooled over "
                                                "episodes); 0 for the empty graft, 100% for the full graft; 95% "
                                                "intervals from the bootstrap of the ratio's linearised "
                                                "per-episode values."),
        "attribution": (grafts.attribution, "the success change attributed to each parameter group (Shapley values "
                                            "and main effects over the factorial), 95% intervals."),
        "kl_attribution": (grafts.kl_attribution, "the fraction of RL's behavioural change (KL) attributed to each "
                                                  "parameter group, on RL's rollouts (solid) and SFT's (hatched), "
                                                  "with 95% intervals: Shapley values and main effects of a "
                                                  "factorial, or the effects a single / leave-one-out sweep stores. "
                                                  "The Shapley values sum to v(all swept groups) − v(∅): the swept "
                                                  "groups the subtitle names, which is the whole RL model only when "
                                                  "they are everything RL moved."),
        "sparsity": (grafts.sparsity_curve, "grafting only the fraction F of the swept groups' entries that moved the "
                                            "most (graft --top-frac F, --sweep sparsity): the success change from "
                                            "the base and the fraction of RL's behavioural change (KL) reproduced, "
                                            "each with its 95% interval, against F; the dotted line is RL's own "
                                            "success change."),
        "interaction": (grafts.interaction_heatmap, "pairwise interaction of grafting two groups together."),
        "movement": (grafts.movement_vs_effect, "how much each group moved (share of squared movement) against what "
                                                "it did to success; movement is not effect."),
    }
    figs: dict[str, list[tuple[str, go.Figure]]] = {k: [] for k in measures}
    froms: dict[str, list[Path]] = {k: [] for k in measures}
    for item in sweeps:  # where most outputs of some configurations did not parse, and a user's file's coverage
        _guard(sec, item, lambda item=item: sec.notes.extend(f"{item.label}: {n}"
                                                             for n in grafts.sweep_notes(item.result)))
    runs = _sweep_trajectories(sec, sweeps)
    for item in _step_ordered(sweeps, runs):
        def build(item=item):
            built = {k: build_(item.label, item.result) for k, (build_, _) in measures.items()}
            for k, fig in built.items():  # only once every builder has read the sweep
                if fig is not None:
                    figs[k].append((item.label, fig))
                    froms[k].append(item.path)

        _guard(sec, item, build)
    for k, (_, caption) in measures.items():
        if figs[k]:
            fig = grafts.by_sweep(figs[k])
            sec.panels.append(Panel(fig, f"{_owner([lab for lab, _ in figs[k]])}: {caption}", tuple(froms[k])))
    drawn, drawn_from = [], []
    for item in dissoc:
        _guard(sec, item, lambda item=item: (drawn.append((item.label, grafts.dissociation(item.label, item.result))),
                                             drawn_from.append(item.path)))
    if drawn:
        fig = grafts.by_sweep(drawn, "dissociation")
        sec.panels.append(Panel(fig, f"{_owner([lab for lab, _ in drawn])}: per group, the effect on success in RL "
                                     "run A and in RL run B and their difference (95% intervals); the verdict says "
                                     "which run's change the group carries.", tuple(drawn_from)))


def _step_ordered(items: Sequence[Loaded], runs: Sequence[Trajectory[Loaded]]) -> list[Loaded]:
    """``items`` with each trajectory's results in step order, at the place of its first (a menu of models or
    sweeps lists a training run's checkpoints in step order)."""
    of = {x.path: t for t in runs for x in t.items}
    out, done = [], set()
    for x in items:
        t = of.get(x.path)
        if t is None:
            out.append(x)
        elif t.key not in done:
            done.add(t.key)
            out.extend(t.items)
    return out


def _sweep_trajectories(sec: Section, sweeps: Sequence[Loaded]) -> list[Trajectory[Loaded]]:
    """The sweeps graft --all-checkpoints wrote, one per checkpoint: a figure per training run (a menu picking the
    run) of each swept group's effect over the steps, and a note for each step whose checkpoint had not moved.
    Returns the trajectories."""
    runs, _, superseded = trajectories(sweeps, lambda x: grafts.trajectory_point(x.result))
    for old, new in superseded:
        v = SweepResult.from_result(new.result)
        sec.notes.append(f"{old.path.name} and {new.path.name} both hold the {v.sweep} sweep of step {v.step} of "
                         f"{v.trainer_run}: the newer ({new.path.name}) is drawn in its trajectory")
    # panels → (label, figure, effect, files): trajectories scored alike share one figure, a menu picking the run
    built: dict[tuple[str, ...], list[tuple[str, go.Figure, str, list[Path]]]] = {}
    for t in runs:
        def build(t=t):
            results, names = [x.result for x in t.items], [x.label for x in t.items]
            fig = grafts.sweep_trajectory(t.label, t.steps, results, names)
            for step, name in grafts.unmoved_steps(grafts.trajectory_rows(t.steps, results, names)):
                (x,) = [x for st, x in zip(t.steps, t.items) if st == step]
                sec.note(f"{t.label}: at step {step} ({name}) KL(π_RL‖π_SFT) is exactly 0 on RL's rollouts — the "
                         "checkpoint's behaviour had not moved from SFT's, so the fraction of its change a graft "
                         "reproduces is undefined there", x.path)
            built.setdefault(grafts.trajectory_panels(results[0]), []).append(
                (t.label, fig, grafts.trajectory_effect(results[0]), [x.path for x in t.items]))

        _guard(sec, t.items[0], build)
    for panels, figs in built.items():
        measured = ("its effect on success in points, beside the checkpoint's own RL − base (dashed)"
                    if "success" in panels else "") + (", and " if len(panels) == 2 else "") + (
            "the fraction of the checkpoint's behavioural change it reproduces on RL's rollouts (by KL)"
            if "reproduced_rl" in panels else "")
        effects = "; ".join(f"{lab}: {e}" if len(figs) > 1 else e for lab, _, e, _ in figs)
        sec.panels.append(Panel(grafts.by_sweep([(lab, fig) for lab, fig, _, _ in figs], "training run"),
                                f"{_owner([lab for lab, *_ in figs])}: the sweep of every checkpoint of a training run "
                                "(graft --all-checkpoints), one line per swept group over the checkpoint steps with "
                                f"its 95% interval — {measured}; the numbers graft --all-checkpoints prints. The "
                                f"effect: {effects}.", tuple(p for *_, paths in figs for p in paths)))
    return runs


def _rank(sec: Section, items: list[Loaded]) -> None:
    for kind in RANK_KINDS:
        ok = []
        for item in (x for x in items if x.kind == kind):
            _guard(sec, item, lambda item=item: (rank.layer_values(item.result), ok.append(item)))
        if ok:
            target = rank.TARGETS[kind][0]
            sec.panels.append(Panel(rank.rank_by_layer(kind, [(x.label, x.result) for x in ok]),
                                    f"Rank of the {target} per layer, one line per checkpoint; the menu picks the "
                                    "measure and the subtitle states its convention as recorded.",
                                    tuple(x.path for x in ok)))
            if kind == RANK_DELTA:
                fig = rank.principal_directions([(x.label, x.result) for x in ok])
                if fig is not None:
                    sec.panels.append(Panel(fig, "Where each RL delta lies against the base weights' principal "
                                                 "directions: the share of ‖Δ‖² in W's top-8 left and right "
                                                 "singular subspaces, mean over the matrices RL moved, beside the "
                                                 "share a random Δ of the same shape puts there (exact: k/rows, "
                                                 "k/columns); the hover gives the top-8 subspace overlap of W and "
                                                 "W′ (rank --what delta).", tuple(x.path for x in ok)))


def _coupling(sec: Section, items: list[Loaded]) -> None:
    for item in items:
        def build(item=item):
            lab, res = item.label, item.result
            sec.panels.append(Panel(rank.coupling_by_layer(lab, res),
                                    f"{lab}: per layer, the correlation across checkpoints between rank and success "
                                    "(Spearman and Pearson) with pairs-bootstrap intervals.", (item.path,)))
            fig = rank.coupling_scatter(lab, res)
            if fig is not None:
                sec.panels.append(Panel(fig, f"{lab}: each checkpoint's late-layer rank against its success rate.",
                                        (item.path,)))
            fig = rank.both_directions(lab, res)
            if fig is not None:
                sec.panels.append(Panel(fig, f"{lab}: among runs that credibly improved and runs that credibly "
                                             "degraded against the SFT parent, the share whose rank moved the same "
                                             "way as success.", (item.path,)))

        _guard(sec, item, build)


#: The report's sections, in the page's order.
def _forgetting(sec: Section, items: list[Loaded]) -> None:
    for item in items:
        _guard(sec, item, lambda item=item: sec.panels.append(Panel(
            kl.forgetting(item.result),
            "Does KL predict forgetting (graftkit forgetting)? Each RL run's success change on the tasks it did not "
            "train on (against its SFT parent, identical episodes, 95% paired intervals) against KL(π_RL‖π_SFT) per "
            "token on the tasks it trained on, ‖Δ‖_F, the fraction of entries moved and the effective rank of Δ; each "
            "panel's title gives that predictor's R² with its pairs-bootstrap 95% interval over the runs fit (those "
            "with every predictor; hollow: left out).", (item.path,))))


SECTIONS: tuple[SectionSpec, ...] = (
    SectionSpec("summary", "The study at a glance",
                "no study regimes in this run (runs named <regime>-s<seed> evaluated beside an SFT evaluation, or the "
                "findings' positive control) — run `graftkit demo` to add them", (EVAL, FINDINGS, GRAFT_SWEEP), _summary),
    SectionSpec("findings", "Findings", "no findings results in this run — run `graftkit demo` to add them",
                (FINDINGS,), _findings),
    SectionSpec("training", "Training curves", "no training-curve results in this run — run `graftkit train sft` or "
                "`graftkit train grpo` to add them", TRAIN_KINDS, _training),
    SectionSpec("success", "Success with intervals",
                "no evaluation results in this run — run `graftkit eval --model M` to add them", (EVAL, TRAIN_SFT),
                _success),
    SectionSpec("headroom", "Headroom", "no headroom results in this run — run `graftkit headroom --model M` to add "
                "them", (HEADROOM,), _headroom),
    SectionSpec("kl", "Behavioural divergence", "no KL results in this run — run `graftkit kl --model RL` to add them "
                "(KL(π_RL‖π_SFT) on RL's rollouts and KL(π_SFT‖π_RL) on SFT's)", (KL,), _kl),
    SectionSpec("anatomy", "Delta anatomy", "no delta-anatomy results in this run — run `graftkit delta --base SFT "
                "--from RL` to add them", (DELTA,), _anatomy),
    SectionSpec("grafts", "Graft effects and attribution", "no graft-experiment results in this run — run `graftkit "
                "graft --from RL --sweep factorial` (add `--metric both` to score each graft by KL as well) to add them",
                (GRAFT_SWEEP, GRAFT_DISSOCIATION), _grafts),
    SectionSpec("rank", "Rank by layer", "no rank results in this run — run `graftkit rank` (weights, --what delta or "
                "activations) to add them", RANK_KINDS, _rank),
    SectionSpec("coupling", "Rank–success coupling", "no coupling results in this run — run `graftkit couple` to add "
                "them", (COUPLING,), _coupling),
    SectionSpec("forgetting", "Forgetting", "no forgetting results in this run — run `graftkit forgetting` (it reads "
                "the eval, kl, delta and rank --what delta results of the run's RL runs and their SFT parents)",
                (FORGETTING,), _forgetting),
)


def plan_report(loaded: Sequence[Loaded], on_section: Callable[[], None] = lambda: None) -> list[Section]:
    """The report's sections for the run's results (figures built, nothing rendered); ``on_section`` after each."""
    out = []
    for spec in SECTIONS:
        out.append(spec.section(loaded))
        on_section()
    return out


# --------------------------------------------------------------------------------------------------
# Rendering


def _h(text: object) -> str:
    return html.escape(str(text), quote=True)


def _script_json(text: str) -> str:
    """JSON safe inside a <script> element: no '<', '>', '&' or JS line separators appear literally."""
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _code(text: str) -> str:
    """Escape, then show `backticked` commands as code."""
    parts = _h(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0;background:#fafafa}
header{background:#1f2937;color:#fff;padding:18px 32px}header h1{margin:0 0 6px;font-size:1.5em}
header p{margin:2px 0;color:#d1d5db;font-size:.9em}main{max-width:1180px;margin:0 auto;padding:12px 32px 48px}
nav ol{columns:2;padding-left:1.2em}h2{border-bottom:2px solid #e5e7eb;padding-bottom:4px;margin-top:36px}
figure{background:#fff;border:1px solid #e5e7eb;border-radius:6px;margin:16px 0;padding:8px}
figcaption{font-size:.9em;color:#444;padding:4px 8px 2px}.graph{width:100%;min-height:300px}
.absent{color:#6b7280;font-style:italic}.damaged{border:2px solid #b91c1c;background:#fef2f2;padding:4px 12px;border-radius:6px}.note{color:#92400e;background:#fffbeb;padding:4px 8px;border-radius:4px}
table{border-collapse:collapse;background:#fff;margin:12px 0;font-size:.92em}
td,th{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}caption{text-align:left;color:#666}
code{background:#eef;padding:0 3px;border-radius:3px}
"""

_RENDER = """
(function () {
  "use strict";
  var figs = JSON.parse(document.getElementById("graftkit-figures").textContent);
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"],
                toImageButtonOptions: {format: "png", scale: 2}};
  var drawn = figs.map(function (f) {
    return Plotly.newPlot(f.id, f.figure.data, f.figure.layout, config);
  });
  Promise.all(drawn).then(function () { document.body.setAttribute("data-rendered", String(figs.length)); });
})();
"""


def _sources_attr(run_dir: Path, paths: Sequence[Path]) -> str:
    """The ``data-sources`` attribute naming the result files (relative to the run) a figure or table is drawn
    from: a JSON list, escaped."""
    names = [str(p.relative_to(run_dir) if p.is_relative_to(run_dir) else p) for p in dict.fromkeys(paths)]
    return f" data-sources='{_h(json.dumps(names))}'" if names else ""


def _damaged_html(run_dir: Path, damaged: Sequence[DamagedResult]) -> str:
    """The visible notice naming every result file the report could not read, and why."""
    if not damaged:
        return ""
    items = "".join(f"<li><code>{_h(d.path.relative_to(run_dir) if d.path.is_relative_to(run_dir) else d.path)}</code>: "
                    f"{_h(d.reason)}</li>" for d in damaged)
    return (f"<section id='damaged' class='damaged'><h2>Damaged result files ({len(damaged)})</h2><p>These files "
            "could not be read and are left out of every section below; rerun the command that wrote each, or "
            f"remove it.</p><ul>{items}</ul></section>")


def render_html(run_dir: Path, loaded: Sequence[Loaded], sections: Sequence[Section], created: str,
                damaged: Sequence[DamagedResult] = ()) -> str:
    """The page: header, the notice of damaged result files, table of contents, sections, provenance;
    plotly.js inlined once."""
    from plotly.offline import get_plotlyjs

    figs, body, toc = [], [_damaged_html(run_dir, damaged)], []
    if damaged:
        toc.append(f"<li><a href='#damaged'>Damaged result files</a> ({len(damaged)})</li>")
    for sec in sections:
        toc.append(f"<li><a href='#{sec.key}'>{_h(sec.title)}</a>{'' if sec.present else ' (none)'}</li>")
        body.append(f"<section id='{sec.key}'><h2>{_h(sec.title)}</h2>")
        if not sec.present:
            body.append(f"<p class='absent'>{_code(sec.absent[0].upper() + sec.absent[1:])}.</p>")
        if sec.html:
            body.append(f"<div class='tables'{_sources_attr(run_dir, sec.html_sources)}>{sec.html}</div>")
        for note in sec.notes:
            body.append(f"<p class='note'{_sources_attr(run_dir, sec.note_sources.get(note, ()))}>{_h(note)}</p>")
        for panel in sec.panels:
            fid = f"fig-{len(figs) + 1}"
            figs.append(f'{{"id":{json.dumps(fid)},"figure":{pio.to_json(panel.figure, validate=False)}}}')
            body.append(f"<figure{_sources_attr(run_dir, panel.sources)}><div class='graph' id='{fid}'></div>"
                        f"<figcaption>{_h(panel.caption)}</figcaption></figure>")
        body.append("</section>")
    columns = {"file": lambda x: x.path.relative_to(run_dir) if x.path.is_relative_to(run_dir) else x.path,
               "kind": lambda x: x.kind, "created": lambda x: x.created,
               "graftkit": lambda x: x.result.attrs.get("graftkit_version", ""),
               "dimensions": lambda x: ", ".join(f"{d}={len(c)}" for d, c in x.result.coords.items())}
    rows = "".join("<tr>" + "".join(f"<td>{_h(cell(x))}</td>" for cell in columns.values()) + "</tr>" for x in loaded)
    toc.append("<li><a href='#provenance'>Result files</a></li>")
    body.append("<section id='provenance'><h2>Result files</h2><p>Every figure above is drawn from these HDF5 files "
                "(labelled arrays with provenance; <code>graftkit results RUN --csv DIR</code> exports them as "
                "tables).</p><table><thead><tr>" + "".join(f"<th>{_h(h)}</th>" for h in columns)
                + f"</tr></thead><tbody>{rows}</tbody></table></section>")
    name = run_dir.resolve().name
    plotly_js = get_plotlyjs().replace("</script", "<\\/script").replace("<!--", "<\\!--")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>graftkit report — {_h(name)}</title><style>{_CSS}</style>"
        f"<script>{plotly_js}</script></head><body>"
        f"<header><h1>graftkit report — {_h(name)}</h1><p>run folder {_h(run_dir.resolve())}</p>"
        f"<p>graftkit {_h(__version__)} · created {_h(created)} · {len(loaded)} result file(s) · {len(figs)} figure(s)"
        "</p></header><main><nav><h2>Contents</h2><ol>" + "".join(toc) + "</ol></nav>" + "".join(body) + "</main>"
        f"<script type='application/json' id='graftkit-figures'>{_script_json('[' + ','.join(figs) + ']')}</script>"
        f"<script>{_RENDER}</script></body></html>\n"
    )


@dataclass(frozen=True)
class Report:
    """A rendered report and what it holds."""

    html: str
    #: Section keys with results.
    sections: tuple[str, ...]
    #: Section keys without results (the page says which command adds them).
    absent: tuple[str, ...]
    n_figures: int
    notes: tuple[str, ...]
    #: Result files that could not be read (named in the page and in ``notes``).
    damaged: tuple[DamagedResult, ...] = ()


def make_report(run_dir: str | os.PathLike, on_progress: OnProgress = no_progress) -> Report:
    """Read the run's results, plan the sections and render the page. A damaged result file is named at the
    top of the page and in the notes; the rest of the report is drawn without it. ``on_progress``: one step for
    reading the results, one per section, one for rendering."""
    run_dir = Path(run_dir)
    steps = len(SECTIONS) + 2
    loaded, damaged = scan_run(run_dir)
    on_progress("report", 1, steps, "steps")
    sections = plan_report(loaded, lambda: on_progress("report", 1, steps, "steps"))
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    page = render_html(run_dir, loaded, sections, created, damaged)
    on_progress("report", 1, steps, "steps")
    return Report(
        html=page,
        sections=tuple(s.key for s in sections if s.present),
        absent=tuple(s.key for s in sections if not s.present),
        n_figures=sum(len(s.panels) for s in sections),
        notes=tuple(f"damaged result file {d.path} left out of the report: {d.reason}" for d in damaged)
        + tuple(n for s in sections for n in s.notes),
        damaged=tuple(damaged),
    )


def build_report(run_dir: str | os.PathLike) -> str:
    """The report of ``run_dir`` as one self-contained HTML string."""
    return make_report(run_dir).html


def write_report(run_dir: str | os.PathLike, out_path: str | os.PathLike, flag: str | None = "--out",
                 on_progress: OnProgress = no_progress) -> Report:
    """Write the report of ``run_dir`` to ``out_path`` atomically (:func:`graftkit.core.files.write_atomic`:
    kind of path and free space checked, temporary sibling, fsync, rename, folder fsync)."""
    from ..core.files import check_file_dest

    check_file_dest(out_path, flag, REPORT)  # before the results are read and drawn
    report = make_report(run_dir, on_progress)
    write_atomic(out_path, report.html, flag=flag, example=REPORT, what="the report")
    return report
