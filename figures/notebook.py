"""Every figure of the report as a function of results, for Jupyter: ``gk.figures.success_rates(ev).show()``.

Each function takes results — a :class:`~graftkit.results.store.Result`, a typed view (``DeltaResult``,
``SweepResult``, ``RankResult``, ``CouplingResult``, ``TrainingCurves``, ``EvalResult``…), what a command
function returns (``gk.eval``, ``gk.headroom``, ``gk.train_grpo``, a summary dict with a ``result_file``),
or the path of a result file — and returns the ``plotly.graph_objects.Figure`` the report draws for the
same results: it calls the builder the report calls (figures/success.py, kl.py, anatomy.py, grafts.py, rank.py,
curves.py, summary.py) with the arguments the report passes. A per-run figure draws every run of its result
with a menu picking the run, as the report does (``run=`` draws one); a graft figure of several sweeps is one
figure with a menu picking the swept run. Series are labelled as in the report (report.base_label: an eval's
model folder, a training or rank result's model folder, a graft sweep's swept run, any other result's file
stem; a label two results of one kind share gets the file stem appended) and coloured as in the report, by
the regime a run's name puts it in (figures/runs.py); ``label=`` / ``labels=`` override the labels. A result
of the wrong kind, or one that lacks the arrays a figure needs, raises a
:class:`~graftkit.core.errors.GraftkitError` naming the file and the command that writes what is missing
(where the report would leave the figure out, or write a note).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import plotly.graph_objects as go

from ..core.errors import GraftkitError
from ..evaluation.commands import EvalResult, EvalRun, HeadroomRun
from ..graft.anatomy import DeltaResult
from ..results.layout import (COUPLING, DELTA, EVAL, FINDINGS, FORGETTING, GRAFT_DISSOCIATION, GRAFT_SWEEP,
                              HEADROOM, KL, RANK_ACTIVATIONS, RANK_DELTA, RANK_WEIGHTS, TRAIN_GRPO, TRAIN_SFT)
from ..results.store import Result, View, read_result
from ..train.commands import TrainingCurves
from . import anatomy, curves, grafts, kl, rank, success, summary
from .report import base_label, decode_key, delta_label, distinct_labels, training_label
from .runs import study_in, trajectories

#: What every function here accepts as one result.
ResultLike = Union[Result, View, EvalResult, EvalRun, HeadroomRun, Mapping[str, Any], str, os.PathLike]

#: The command that writes each result kind (named when a result of another kind is passed).
PRODUCERS = {
    EVAL: "graftkit eval", HEADROOM: "graftkit headroom", DELTA: "graftkit delta",
    GRAFT_SWEEP: "graftkit graft --sweep factorial", GRAFT_DISSOCIATION: "graftkit graft --sweep dissociation",
    RANK_WEIGHTS: "graftkit rank", RANK_DELTA: "graftkit rank --what delta",
    RANK_ACTIVATIONS: "graftkit rank --what activations", COUPLING: "graftkit couple",
    TRAIN_SFT: "graftkit train sft", TRAIN_GRPO: "graftkit train grpo", KL: "graftkit kl",
    FORGETTING: "graftkit forgetting",
}


@dataclass(frozen=True)
class _Item:
    """One result, the file it came from (None: built in memory) and its label."""

    result: Result
    path: Path | None
    label: str
    #: The run-wide label, before the section's own suffix (the run's name, for colours and regimes).
    base: str = ""

    @property
    def kind(self) -> str:
        return self.result.kind

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else f"a {self.kind!r} result"


def _open(x: ResultLike) -> tuple[Result, Path | None]:
    """The result ``x`` holds or names, and its file (None for a result only in memory)."""
    if isinstance(x, Result):
        return x, None
    if isinstance(x, (str, os.PathLike)):
        return read_result(x), Path(x)
    if isinstance(x, View):
        return x.result, x.path
    if isinstance(x, EvalRun):  # gk.eval: the evaluated model's result, as written
        return read_result(x.files["model"]), Path(x.files["model"])
    if isinstance(x, HeadroomRun):
        return read_result(x.file), Path(x.file)
    if isinstance(getattr(x, "curves", None), TrainingCurves):  # gk.train_sft / gk.train_grpo
        return x.curves.result, x.curves.path
    if isinstance(x, Mapping) and isinstance(x.get("result_file"), (str, os.PathLike)):  # a command's summary
        return read_result(x["result_file"]), Path(x["result_file"])
    if isinstance(x, EvalResult):
        return x.to_result(), None
    raise GraftkitError(f"{type(x).__name__}: not a graftkit result",
                        "pass a Result, a typed view (e.g. DeltaResult), what gk.eval / gk.delta / gk.couple returned, "
                        "or the path of a result file (.h5)")


_ONE = (Result, View, EvalResult, EvalRun, HeadroomRun, Mapping, str, os.PathLike)


def _is_one(x: object) -> bool:
    return isinstance(x, _ONE) or isinstance(getattr(x, "curves", None), TrainingCurves)


def _as_is(label: str, kind: str) -> str:
    return label


def _items(results: ResultLike | Sequence[ResultLike], kinds: Sequence[str], labels: Sequence[str] | None = None,
           label_of: Callable[[str, str], str] = _as_is) -> list[_Item]:
    """The results, each checked to be of one of ``kinds`` and labelled as the report labels it
    (``label_of(label, kind)``: the section's own suffix on top of the run-wide label)."""
    opened = [_open(x) for x in ([results] if _is_one(results) or not isinstance(results, Iterable) else results)]
    if not opened:
        raise GraftkitError("no results given", f"pass at least one {' or '.join(kinds)} result")
    for res, path in opened:
        if res.kind not in kinds:
            raise GraftkitError(f"{path or 'result'}: a {res.kind!r} result, this figure draws "
                                f"{' or '.join(repr(k) for k in kinds)}",
                                f"pass a result written by `{PRODUCERS.get(kinds[0], 'graftkit')}`")
    if labels is not None:
        if isinstance(labels, str) or len(labels) != len(opened):
            raise GraftkitError(f"labels={labels!r}: {len(opened)} result(s) need one label each",
                                "pass a list of labels as long as the list of results")
        bases = names = [str(x) for x in labels]
    else:
        bases = distinct_labels([(r.kind, base_label(p, r.kind, r), p) for r, p in opened])
        names = [label_of(n, r.kind) for n, (r, _) in zip(bases, opened)]
    return [_Item(r, p, n, b) for (r, p), n, b in zip(opened, names, bases)]


def _one(result: ResultLike, kinds: Sequence[str], label: str | None) -> _Item:
    if isinstance(result, (list, tuple)):
        raise GraftkitError(f"a {type(result).__name__} of {len(result)}: this figure draws one result",
                            "pass a single result")
    return _items(result, kinds, None if label is None else [label])[0]


def _guarded(item: _Item, build: Callable[[], Any]) -> Any:
    """Run one of the report's builders on ``item``; a result whose arrays it cannot read raises what the
    report would write as a note."""
    try:
        return build()
    except (KeyError, IndexError, ValueError) as exc:
        raise GraftkitError(f"{item.name}: could not be drawn ({type(exc).__name__}: {exc}); its {item.kind} "
                            "arrays do not have the expected layout",
                            f"rewrite it with `{PRODUCERS.get(item.kind)}`") from None


def _optional(item: _Item, build: Callable[[], go.Figure | None], missing: str) -> go.Figure:
    """A figure the report leaves out when its arrays are missing (the builder returns None): raise instead."""
    fig = _guarded(item, build)
    if fig is None:
        raise GraftkitError(f"{item.name}: {missing}", f"the report leaves this figure out too; "
                            f"`{PRODUCERS.get(item.kind)}` writes the arrays it needs")
    return fig


# --------------------------------------------------------------------------------------------------
# Success and headroom (report section "success", "headroom")


def success_rates(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """Success per task and pooled for each eval result, with 95% Wilson intervals (the report's first
    success figure)."""
    items = _items(results, (EVAL,), labels)
    for x in items:
        _guarded(x, lambda x=x: success.task_rates(x.result))
    return success.success_rates([(x.label, x.result) for x in items])


def paired_differences(reference: ResultLike, models: ResultLike | Sequence[ResultLike],
                       reference_label: str | None = None, labels: Sequence[str] | None = None) -> go.Figure:
    """Per task, success(model) − success(reference) on identical episodes with the 95% paired bootstrap
    interval and verdict (the report's paired-difference figure, whose reference is the SFT model).

    Like the report, a model is paired with the reference only when both were decoded the same way
    (greedy or sampled, temperature, top-p, observation, backend) on the same seeds and episodes."""
    ref = _one(reference, (EVAL,), reference_label)
    items = _items(models, (EVAL,), labels)
    rows = []
    for x in items:
        if decode_key(x.result) != decode_key(ref.result):
            raise GraftkitError(f"{x.name}: decoded as {decode_key(x.result)}, the reference {ref.name} as "
                                f"{decode_key(ref.result)} (greedy, temperature, top-p, obs, backend)",
                                "compare results evaluated with the same decoding")
        comps = _guarded(x, lambda x=x: success.paired_vs(ref.result, x.result))
        if not comps:
            raise GraftkitError(f"{x.name}: not evaluated on the reference's seeds and episodes (or no shared task), "
                                "so no episode pairs with one of the reference",
                                "evaluate both with the same --tasks, --seeds and --episodes")
        rows.append((x.label, comps))
    return success.paired_differences(ref.label, rows)


def headroom_rates(result: ResultLike, label: str | None = None) -> go.Figure:
    """Greedy and sampled success per task of one headroom result, each with a 95% Wilson interval."""
    x = _one(result, (HEADROOM,), label)
    return _guarded(x, lambda: success.headroom_rates(x.label, x.result))


def headroom_differences(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """Headroom = sampled − greedy success per task for each headroom result, with the 95% paired
    bootstrap interval and verdict."""
    items = _items(results, (HEADROOM,), labels)
    tables = []
    for x in items:
        table = _guarded(x, lambda x=x: success.headroom_of(x.result))
        if table is None:
            raise GraftkitError(f"{x.name}: greedy and sampled outcomes cannot be paired (greedy samples per episode "
                                "neither 1 nor k)", "rewrite it with `graftkit headroom`")
        tables.append((x.label, table))
    return success.headroom_differences(tables)


# --------------------------------------------------------------------------------------------------
# Behavioural divergence (report section "kl")


def kl_per_task(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """KL(π_RL‖π_SFT) on RL's rollouts and KL(π_SFT‖π_RL) on SFT's, per task and pooled, per action token and per
    episode, with intervals (a trajectory: its last step); several ``kl`` results: one figure, a menu picking the
    model."""
    return _per_sweep(results, (KL,), _labels(label), kl.kl_per_task, "could not be drawn", "model")


def kl_by_model(results: Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """Two or more RL models' KL from their base pooled over tasks, both directions, per action token and per
    episode (the ``kl`` results without a step dimension)."""
    items = _items(results, (KL,), labels)
    for x in items:
        _guarded(x, lambda x=x: kl.kl_means(x.result))
    fig = kl.kl_by_model([(x.label, x.result) for x in items])
    if fig is None:
        raise GraftkitError(f"{len(items)} kl result(s) without a step dimension: nothing to compare",
                            "pass two or more `graftkit kl` results (a trajectory over steps: kl_over_steps)")
    return fig


def kl_over_steps(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """The KL from the base at every checkpoint step of each ``kl`` result with a ``step`` dimension, pooled over
    tasks: a line per model and direction."""
    items = _items(results, (KL,), labels)
    for x in items:
        _guarded(x, lambda x=x: kl.kl_means(x.result))
    fig = kl.kl_over_steps([(x.label, x.result) for x in items])
    if fig is None:
        raise GraftkitError("no kl result with a step dimension (one policy per checkpoint step)",
                            "compare single policies with kl_by_model")
    return fig


def kl_trajectory(results: Sequence[ResultLike]) -> go.Figure:
    """The KL from the base at every checkpoint of each training run among ``results`` — the ``kl`` results ``kl
    --all-checkpoints`` writes, one per checkpoint, each recording its step and trainer_run — pooled over tasks, per
    action token and per episode, a line per side with its interval as a band; several runs: a menu picking the
    run."""
    items = _items(results, (KL,))
    for x in items:
        _guarded(x, lambda x=x: kl.kl_means(x.result))
    runs, _, _ = trajectories(items, lambda x: kl.trajectory_point(x.result))
    if not runs:
        raise GraftkitError("no kl result of a training run's checkpoint (one that records its step and trainer_run)",
                            "pass the results `graftkit kl --model OUTPUT_DIR --all-checkpoints` writes")
    return kl.kl_trajectories([(t.label, t.steps, [x.result for x in t.items]) for t in runs])


def kl_top(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """The token and action strings that gained and lost the most probability under RL (``graftkit kl --top``);
    several results: a menu picking the model."""
    return _per_sweep(results, (KL,), _labels(label), kl.kl_top,
                      "no token or action strings listed (graftkit kl --top)", "model")


# --------------------------------------------------------------------------------------------------
# Delta anatomy (report section "anatomy")


def _run_index(x: _Item, run: int | str) -> tuple[int, str]:
    runs = DeltaResult.from_result(x.result, x.path).runs
    if isinstance(run, str):
        if run not in runs:
            raise GraftkitError(f"{x.name}: no RL run {run!r}", f"pick one of {', '.join(runs)}")
        return runs.index(run), run
    if not -len(runs) <= run < len(runs):
        raise GraftkitError(f"{x.name}: run {run} out of range, it holds {len(runs)} run(s)",
                            f"pick 0…{len(runs) - 1} or a name: {', '.join(runs)}")
    return run % len(runs), runs[run]


def _runs_of(x: _Item, run: int | str | None, label: str | Sequence[str] | None) -> list[tuple[str, Result, int]]:
    """``(label, result, run index)`` of the delta result's run ``run`` (None: every run but those bit-identical to
    the base, which the report states in a note), labelled as the report labels the runs of one delta file, or by
    ``label`` (one per run drawn)."""
    d = DeltaResult.from_result(x.result, x.path)
    still = set(anatomy.identical_runs(x.result))
    picked = [_run_index(x, run)] if run is not None else [(r, n) for r, n in enumerate(d.runs) if r not in still]
    if run is not None and picked[0][0] in still:
        raise GraftkitError(f"{x.name}: {d.identical_line(picked[0][0])}", "pick a run that moved")
    if not picked:
        raise GraftkitError(f"{x.name}: every run is bit-identical to its base, nothing moved",
                            "the report states it in one note; draw a checkpoint that moved")
    if label is None:
        return [(delta_label(name, x.path, 1), x.result, r) for r, name in picked]
    given = [label] if isinstance(label, str) else [str(lab) for lab in label]
    if len(given) != len(picked):
        raise GraftkitError(f"label={label!r}: {len(picked)} run(s) drawn, one label each",
                            "pass run= to draw one run, or one label per run")
    return [(lab, x.result, r) for lab, (r, _) in zip(given, picked)]


def anatomy_heatmap(result: ResultLike, run: int | str | None = None, metric: str = "share",
                    label: str | Sequence[str] | None = None) -> go.Figure:
    """The decoder layer × parameter group heatmap of ``metric``: "share" (of the run's squared weight
    movement) or "rel_delta" (‖Δ‖_F/‖W‖_F), of one RL run (``run``: its index or name) or, by default, of
    every run of the delta result with a menu picking the run (the report's figure). Runs are labelled by
    their names, as in the report of a run with one delta file (``label``: one per run drawn)."""
    if metric not in anatomy.HEATMAPS:
        raise GraftkitError(f"metric={metric!r}: no such heatmap", f"use one of {', '.join(anatomy.HEATMAPS)}")
    x = _one(result, (DELTA,), None)
    runs = _runs_of(x, run, label)
    d = DeltaResult.from_result(x.result, x.path)
    if not (d.has(f"layer_group_{metric}") and len(d.layers)):
        raise GraftkitError(f"{x.name}: no layer_group_{metric} over decoder layers",
                            "rewrite it with `graftkit delta`")
    return _guarded(x, lambda: anatomy.anatomy_heatmaps(runs, metric))


def group_shares(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """Each RL run's share of squared weight movement per parameter group, over every run of every delta
    result but those bit-identical to their base (``labels``: one per run drawn, in order). Runs are named as in
    the report: the run's name, with the file's stem when several delta results are drawn."""
    items = _items(results, (DELTA,))
    bars = [(delta_label(run, x.path, len(items)), x.result, r)
            for x in items for r, run in enumerate(DeltaResult.from_result(x.result, x.path).runs)
            if r not in anatomy.identical_runs(x.result)]
    if labels is not None:
        if isinstance(labels, str) or len(labels) != len(bars):
            raise GraftkitError(f"labels={labels!r}: the results hold {len(bars)} RL run(s), one label each",
                                "pass one label per run")
        bars = [(str(lab), res, r) for lab, (_, res, r) in zip(labels, bars)]
    for x in items:
        _guarded(x, lambda x=x: anatomy.group_shares([b for b in bars if b[1] is x.result]))
    return anatomy.group_shares(bars)


def top_tensors(result: ResultLike, run: int | str | None = None, n: int = 15,
                label: str | Sequence[str] | None = None) -> go.Figure:
    """The ``n`` tensors with the largest share of an RL run's squared weight movement: of one run (``run``)
    or, by default, of every run with any movement, a menu picking the run (the report's figure)."""
    x = _one(result, (DELTA,), None)
    runs = _runs_of(x, run, label)
    return _optional(x, lambda: anatomy.top_tensors_by_run(runs, n),
                     f"no run of {', '.join(lab for lab, _, _ in runs)} has a per-tensor share of movement above zero")


def _trajectory_delta(result: ResultLike, label: str | None) -> _Item:
    x = _one(result, (DELTA,), label)
    if anatomy.trajectory_steps(x.result) is None:
        raise GraftkitError(f"{x.name}: not a training run's delta (no checkpoint steps)",
                            "pass the result `graftkit trajectory` or `delta --all-checkpoints` writes")
    return x


def movement_over_steps(result: ResultLike, label: str | None = None) -> go.Figure:
    """Relative change of each parameter group from the base at every checkpoint of a training run (the result
    ``graftkit trajectory`` or ``delta --all-checkpoints`` writes)."""
    x = _trajectory_delta(result, label)
    return _optional(x, lambda: anatomy.movement_over_steps(x.label, x.result), "no per-group movement over steps")


def layer_movement_over_steps(result: ResultLike, label: str | None = None) -> go.Figure:
    """‖Δ‖_F of each decoder layer's tensors from the base at every checkpoint of a training run."""
    x = _trajectory_delta(result, label)
    return _optional(x, lambda: anatomy.layer_movement_over_steps(x.label, x.result),
                     "no per-layer movement over steps (a model without decoder layers)")


def path_geometry(result: ResultLike, label: str | None = None) -> go.Figure:
    """The shape of a training run's weight path (``graftkit trajectory``): cos(Δ_t, Δ_T) per group, the cosine
    between successive updates, and the R² of a straight line through the path beside a random walk's."""
    x = _trajectory_delta(result, label)
    return _optional(x, lambda: anatomy.path_geometry(x.label, x.result),
                     "no inner products of the checkpoints' deltas (rewrite it with `graftkit trajectory`)")


def mask_overlap(result: ResultLike) -> go.Figure:
    """Per pair of runs of a delta result of two runs or more, the Jaccard overlap of the entries each moved (as
    stored and as bf16 stores them) and of their top fractions by |Δ|, beside independent masks of the same sizes."""
    x = _one(result, (DELTA,), None)
    return _optional(x, lambda: anatomy.mask_overlap(x.result),
                     "no mask overlap (a delta result of two runs or more from one base writes it)")


# --------------------------------------------------------------------------------------------------
# Graft effects and attribution (report section "grafts")


def _per_sweep(results, kinds: Sequence[str], labels, build, missing: str, what: str = "swept run") -> go.Figure:
    """``build(label, result)`` of each sweep (or dissociation); several: one figure, a menu picking the sweep
    (the report's figure). A sweep without the figure's arrays raises, naming it."""
    items = _items(results, kinds, labels)
    figs = [(x.label, _optional(x, lambda x=x: build(x.label, x.result), missing)) for x in items]
    return grafts.by_sweep(figs, what)


def _labels(label: str | Sequence[str] | None) -> Sequence[str] | None:
    return [label] if isinstance(label, str) else label


def graft_effects(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """Success change of each grafted configuration against the base and against the RL model; several
    sweeps: one figure, a menu picking the swept run."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.graft_effects,
                      "no diff_vs_base or diff_vs_rl array (a sweep scored by KL only)")


def attribution(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """Shapley values and main effects of each parameter group on success, with 95% intervals."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.attribution,
                      "no shapley, main_effect or group_effect array (a factorial sweep writes them)")


def interactions(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """Pairwise interactions of grafting two groups together (factorial sweeps)."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.interaction_heatmap,
                      "no interaction array (a factorial sweep writes it)")


def movement_vs_effect(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None
                       ) -> go.Figure:
    """Each group's share of squared weight movement against its effect on success."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.movement_vs_effect,
                      "no movement_share array, or no per-group effect (attribution or single-group grafts)")


def kl_reproduced(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """The fraction of RL's behavioural change each grafted configuration reproduces (reproduced_RL on RL's rollouts,
    reproduced_SFT on SFT's), with 95% intervals; sweeps scored with ``--metric kl`` or ``both``."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.kl_reproduced,
                      "no KL arrays (a sweep scored with --metric kl or both writes them)")


def kl_attribution(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None
                   ) -> go.Figure:
    """The fraction of RL's behavioural change attributed to each parameter group on both sides' rollouts, the
    KL Shapley total named v(all swept groups) − v(∅)."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.kl_attribution,
                      "no KL attribution array (a complete single, loo or factorial sweep scored with --metric kl or "
                      "both writes them)")


def sparsity_curve(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None
                   ) -> go.Figure:
    """A ``--sweep sparsity``: the success change and the fraction of RL's behavioural change reproduced against the
    fraction F of the grafted groups' entries with the largest |Δ|, with 95% intervals."""
    return _per_sweep(results, (GRAFT_SWEEP,), _labels(label), grafts.sparsity_curve,
                      "not a sparsity sweep (graft --sweep sparsity writes one)")


def sweep_trajectory(results: Sequence[ResultLike]) -> go.Figure:
    """Per swept group, its effect on success and, scored by KL, the fraction of RL's behavioural change it
    reproduces, over the checkpoint steps of each training run among ``results`` — the sweeps ``graft
    --all-checkpoints`` writes, one per checkpoint; several runs (sweeps of one metric): a menu picking the run."""
    items = _items(results, (GRAFT_SWEEP,))
    runs, _, _ = trajectories(items, lambda x: grafts.trajectory_point(x.result))
    if not runs:
        raise GraftkitError("no sweep of a training run's checkpoint (one that records its step and trainer_run)",
                            "pass the results `graftkit graft --from OUTPUT_DIR --sweep … --all-checkpoints` writes")
    return _guarded(runs[0].items[0], lambda: grafts.sweep_trajectories(
        [(t.label, t.steps, [x.result for x in t.items], [x.label for x in t.items]) for t in runs]))


def dissociation(results: ResultLike | Sequence[ResultLike], label: str | Sequence[str] | None = None) -> go.Figure:
    """Per group, its effect in RL run A and in RL run B and their difference (double dissociation)."""
    return _per_sweep(results, (GRAFT_DISSOCIATION,), _labels(label), grafts.dissociation,
                      "could not be drawn", "dissociation")


# --------------------------------------------------------------------------------------------------
# Rank and coupling (report sections "rank", "coupling")


def rank_by_layer(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """One line per checkpoint over layers, a menu per metric; every result of one kind (rank-weights,
    rank-delta or rank-activations), as the report draws one figure per kind."""
    items = _items(results, tuple(rank.TARGETS), labels)
    kinds = sorted({x.kind for x in items})
    if len(kinds) > 1:
        raise GraftkitError(f"results of kinds {', '.join(kinds)}: one figure draws one kind", "call once per kind")
    for x in items:
        _guarded(x, lambda x=x: rank.layer_values(x.result))
    return rank.rank_by_layer(kinds[0], [(x.label, x.result) for x in items])


def principal_directions(results: ResultLike | Sequence[ResultLike], labels: Sequence[str] | None = None
                         ) -> go.Figure:
    """Per RL delta (``rank --what delta`` results), the share of ‖Δ‖² in W's top-k left and right singular
    subspaces beside a random Δ's exact share, and the subspace overlap of W and W′ on hover."""
    items = _items(results, (RANK_DELTA,), labels)
    fig = rank.principal_directions([(x.label, x.result) for x in items])
    if fig is None:
        raise GraftkitError(f"{', '.join(x.name for x in items)}: no principal-direction measures",
                            "rewrite them with `graftkit rank --what delta`")
    return fig


def coupling_by_layer(result: ResultLike, label: str | None = None) -> go.Figure:
    """Per layer, the correlation across checkpoints between rank and success, with bootstrap intervals."""
    x = _one(result, (COUPLING,), label)
    return _guarded(x, lambda: rank.coupling_by_layer(x.label, x.result))


def coupling_scatter(result: ResultLike, label: str | None = None) -> go.Figure:
    """Each checkpoint's late-layer rank against its success rate."""
    x = _one(result, (COUPLING,), label)
    return _optional(x, lambda: rank.coupling_scatter(x.label, x.result), "no per-checkpoint rank and success arrays")


def both_directions(result: ResultLike, label: str | None = None) -> go.Figure:
    """Per layer, the share of improved and of degraded runs whose rank moved the way success did."""
    x = _one(result, (COUPLING,), label)
    return _optional(x, lambda: rank.both_directions(x.label, x.result),
                 "no both-directions arrays (the run's checkpoints have no recorded SFT parent among them)")


def forgetting(result: ResultLike, label: str | None = None) -> go.Figure:
    """Does KL predict forgetting (``graftkit forgetting``)? Each RL run's success change on the tasks it did not
    train on against each predictor, the panels titled with the predictor's R² across runs."""
    x = _one(result, (FORGETTING,), label)
    return _guarded(x, lambda: kl.forgetting(x.result))


# --------------------------------------------------------------------------------------------------
# The study at a glance (report section "summary")


def study_summary(results: Sequence[ResultLike], labels: Sequence[str] | None = None) -> go.Figure:
    """The figure the report opens with (figures/summary.py): each regime's change in greedy success against
    SFT with its 95% interval and its runs, the findings' positive control, and per parameter group the graft
    sweeps' attribution of success (and of KL). ``results``: a study's eval results (SFT's, labelled "sft",
    and the runs', labelled by their names), its findings result (its recorded config says which run is in
    which regime; without it, the runs' names ``<regime>-s<seed>`` do) and its graft sweeps."""
    items = _items(results, (EVAL, FINDINGS, GRAFT_SWEEP), labels)
    inputs = summary.summary_inputs([(x.label, x.kind, x.result) for x in items], study_in(x.result for x in items))
    if not inputs.drawable:
        raise GraftkitError("no regime to draw: no SFT evaluation beside evaluations of runs in a regime (named "
                            "<regime>-s<seed>), and no positive control in the findings",
                            "pass the study's eval results (SFT's and every run's) and its findings result")
    return summary.study_summary(inputs)


# --------------------------------------------------------------------------------------------------
# Training curves (report section "training")


def training_curves(results: ResultLike | Sequence[ResultLike], family: str = "loss",
                    labels: Sequence[str] | None = None) -> go.Figure:
    """One line per training run of one metric family: "success", "reward", "loss", "kl", "entropy", "clip"
    or "grad_norm" (the report draws one figure per family some run logged). Runs are labelled
    "<label> (SFT)" / "<label> (GRPO)" as in the report."""
    fams = {f.key: f for f in curves.FAMILIES}
    if family not in fams:
        raise GraftkitError(f"family={family!r}: no such curve family", f"use one of {', '.join(fams)}")
    items = _items(results, (TRAIN_SFT, TRAIN_GRPO), labels, training_label)
    runs = [(x.label, x.result) for x in items]
    names = [x.base for x in items]
    present = [f.key for f in curves.families_present(runs)]
    if family not in present:
        raise GraftkitError(f"no run logged {', '.join(fams[family].metrics)}",
                            f"pick a family the runs logged: {', '.join(present) or 'none'}")
    return curves.training_curve(runs, fams[family], names)


__all__ = ["ResultLike", "success_rates", "paired_differences", "headroom_rates", "headroom_differences",
           "kl_per_task", "kl_by_model", "kl_over_steps", "kl_trajectory", "kl_top", "anatomy_heatmap", "group_shares",
           "top_tensors", "graft_effects", "kl_reproduced", "attribution", "kl_attribution", "interactions",
           "sweep_trajectory", "movement_vs_effect", "dissociation", "rank_by_layer", "coupling_by_layer", "coupling_scatter",
           "both_directions", "study_summary", "training_curves", "movement_over_steps", "layer_movement_over_steps",
           "path_geometry", "mask_overlap", "sparsity_curve", "principal_directions", "forgetting"]
