"""The study's findings rules: each of the four findings of docs/design.md stated from finished results, with its
interval and a verdict from :data:`VERDICTS`, and the positive control that says whether the pipeline can learn at all.

Each rule is written from its claim and reads results only through their typed views (eval and headroom
results, graft sweeps, the coupling result); its docstring says when it gives each verdict, and
``tests/test_findings.py`` plants outcomes for every one of them. The pipeline that produces the results
is :mod:`graftkit.study.pipeline`.

Statistics (:mod:`graftkit.stats`), the same in every rule:

- one run against SFT: :func:`~graftkit.stats.compare` on identical episodes, one entry per episode,
  clustered by item (``task/item``: episodes that show the same first observation are one cluster) where
  the evaluation records items, else by evaluation seed (:func:`suite_episodes`);
- a regime, every run sharing an :attr:`RLRun.regime` whatever else of the grid varies between them
  (training seed, KL weight, initialisation, clipping): :func:`~graftkit.stats.regime_interval`, a
  hierarchical bootstrap over the runs and then the evaluation clusters within each, so the training seed
  is a random effect and the estimate is the mean of the runs' changes, never the worst run's;
- credibly below / above zero: that interval lies entirely below / above zero; equivalence within a
  margin: :func:`~graftkit.stats.regime_tost`.

Verdicts: "reproduced", "partly reproduced" (some of a claim's parts hold), "not reproduced", "not
testable here" (this run's design could not have shown the claim: no headroom to gain, a baseline that
cannot improve, too few runs in a direction), "not measured" (the results it reads were not produced); the
positive control (:func:`finding_control`, the row numbered "control") "learns", "does not learn" or is
"undecided" (too few episodes or runs to tell). A statement names every run or the SFT policy trained with decoys.

Behaviour as well as success: where the graft sweeps were scored by KL (``graft --metric both``), finding 3 decides
each of its sub-rules on the fraction of RL's behavioural change a graft reproduces
(:mod:`graftkit.graft.kl`: reproduced_RL(g) = 1 − KL(π_RL‖π_g)/KL(π_RL‖π_SFT) on RL's rollouts, 0 at the empty
graft and 1 at the full one) as well as on success, and finding 4 correlates the late-layer rank change with each
run's KL from SFT as well as with success.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..evaluation.commands import EvalResult, HeadroomResult
from ..graft.experiments import BASE_LABEL, RL_LABEL, SweepResult
from ..rank.coupling import DIRECTIONS, TOO_FEW, TRACKS_BOTH, CouplingResult, both_directions
from ..stats import BETTER, WORSE, compare, correlation_ci, detectable_improvement, regime_interval, regime_tost
from ..stats import headroom as headroom_table
from ..results.layout import FINDINGS, SFT, SFT_CONTROL
from ..results.store import Result, View
from .design import SUITES

REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly reproduced", "not reproduced"
NOT_TESTABLE, NOT_MEASURED = "not testable here", "not measured"
#: The positive control's own verdicts (:func:`finding_control`): it is a check of the pipeline, not a claim.
CONTROL_LEARNS, CONTROL_FAILS, CONTROL_UNDECIDED = "learns", "does not learn", "undecided"
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_TESTABLE, NOT_MEASURED, CONTROL_LEARNS, CONTROL_FAILS,
            CONTROL_UNDECIDED)
#: The positive control does not learn when its interval rules out a gain of this share of the room its planted
#: bias leaves (1 − the control SFT policy's greedy success): a working trainer removes the bias.
CONTROL_MIN_SHARE = 0.5

#: The positive control's suite (``suites["control"]``), the ``suite`` of its runs, and its findings row.
CONTROL = "control"

#: Finding 1 is a claim about a strong SFT baseline: greedy success on the mastered suite in this range.
STRONG_BASELINE = (0.90, 0.97)
#: Finding 1: a regime has collapsed when its mean success is at most this fraction of SFT's.
COLLAPSE_FRACTION = 0.5
#: Finding 1: power at which the smallest detectable improvement is reported.
DETECTION_POWER = 0.8
#: Finding 2: the mastered-suite regime whose change on the headroom suite is the negative control (the headroom
#: runs use its learning rate: the same recipe, trained on other tasks).
CONTROL_REGIME = "degrade"
#: Finding 3: the groups the degrade regime is localised to.
LOCALISED_GROUPS = ("attn", "mlp")
#: Finding 3: a set of groups is sufficient when its graft alone carries at least this share of the RL
#: change, v(S) − v(∅) ≥ SUFFICIENT_SHARE · (v(RL) − v(∅)).
SUFFICIENT_SHARE = 0.5
#: Finding 3: a set of groups is necessary when reverting it (grafting every other swept group) removes at
#: least this share: v(G ∖ S) − v(∅) ≤ (1 − NECESSARY_SHARE) · (v(RL) − v(∅)).
NECESSARY_SHARE = 0.5
#: Finding 3: the embed-only graft is causally inert when a TOST bounds its change vs SFT within ± this.
INERT_MARGIN = 0.02
#: Finding 3 on KL: the embed-only graft is behaviourally inert when its reproduced fraction's interval lies within ±
#: this (a fraction of RL's whole behavioural change). Set from the claim: grafting the embedding alone moves the
#: policy less than a twentieth of the way from SFT's behaviour to RL's, a tenth of SUFFICIENT_SHARE (the share that
#: makes a set of groups carry the change), so an "inert" group carries at most a tenth of what a "carrying" one
#: does. INERT_MARGIN (2 points of success) is on another scale: this one is relative to RL's own change.
KL_INERT_MARGIN = 0.05
#: Finding 3 on KL: whose rollouts decide (reproduced_RL: how far towards RL's behaviour on RL's own trajectories a
#: graft goes); the other side (reproduced_SFT, on SFT's trajectories) is stated beside it.
KL_SIDE = "rl"
#: Finding 3: a group carrying more than this share of a run's squared weight movement must be swept.
MOVED_SHARE = 0.01
#: Finding 4: credibly improved and credibly degraded runs needed to test "both directions". With n runs of
#: which all n agree, the 95% Wilson lower bound of the agreement is n / (n + z²), z² = 3.84: at most 1/2
#: for n ≤ 3, so fewer than 4 runs in a direction could not show agreement whatever they did.
MIN_RUNS_PER_DIRECTION = 4


@dataclass(frozen=True)
class RLRun:
    """One GRPO run of the study."""

    name: str
    """Label of the run: its policy folder, its eval result (``evals[name]``), its graft sweep's ``rl_label``."""
    suite: str
    """The suite it was trained on (``mastered``, ``headroom`` or ``control``: the positive control's runs, trained
    from the control's own SFT policy :data:`SFT_CONTROL`)."""
    regime: str
    """Its regime: null, degrade or collapse on the mastered suite, headroom on the headroom suite, control on the
    control suite. Runs that differ in another axis of the grid (seed, KL, init, clipping) share their regime."""
    lr: float
    """Learning rate."""
    seed: int
    """Training seed."""
    decoy: bool = False
    """Trained on data with decoys (planted headroom), or from an SFT policy that was (every control run); every
    finding that reads the run says so."""


# ------------------------------------------------------------------------------------------ episodes


@dataclass(frozen=True)
class Episodes:
    """One policy's outcomes on a set of tasks, one entry per played episode (and sample), each with the
    cluster that paired statistics resample."""

    outcomes: np.ndarray
    """[episode] int8 0/1, in [task, seed, episode, sample] order."""
    clusters: np.ndarray
    """[episode] str: ``task/item`` where the evaluation records items, else the evaluation seed."""
    by: str
    """What the clusters are: "item" or "seed"."""

    @property
    def rate(self) -> float:
        return float(self.outcomes.mean())

    @property
    def n_clusters(self) -> int:
        return int(np.unique(self.clusters).size)


def _episodes(success: np.ndarray, item: np.ndarray | None, tasks: Sequence[str], seeds) -> Episodes:
    """``success [task, seed, episode, sample]`` with ``item [task, seed, episode]`` (or None) as Episodes."""
    if item is not None:
        lab = np.array([f"{t}/" for t in tasks], dtype=object)[:, None, None] + np.asarray(item, dtype=object)
    else:
        lab = np.broadcast_to(np.array([str(s) for s in seeds], dtype=object)[None, :, None], success.shape[:3])
    clusters = np.broadcast_to(lab[..., None], success.shape)
    return Episodes(np.asarray(success, dtype=np.int8).ravel(), np.asarray(clusters, dtype=object).ravel(),
                    "seed" if item is None else "item")


def _view(res, cls=EvalResult):
    return res if isinstance(res, cls) else cls.from_result(res)


def _task_index(ev: EvalResult, tasks: Sequence[str], what: str) -> list[int]:
    missing = [t for t in tasks if t not in ev.tasks]
    if missing:
        raise GraftkitError(f"{what} has no outcomes for task(s) {', '.join(missing)} (it has {', '.join(ev.tasks)})",
                            "evaluate every policy of the study on every task of both suites")
    return [ev.tasks.index(t) for t in tasks]


def _items(ev: EvalResult, idx: list[int]) -> np.ndarray | None:
    item = getattr(ev, "item", None)
    return None if item is None else np.asarray(item, dtype=object)[idx]


def suite_episodes(res: Result | EvalResult, tasks: Sequence[str], what: str = "an evaluation") -> Episodes:
    """Outcomes of ``tasks`` from an eval result, one entry per episode, clustered by item where the
    result records items (``EvalResult.item [task, seed, episode]``), else by evaluation seed."""
    ev = _view(res)
    idx = _task_index(ev, tasks, what)
    return _episodes(ev.success[idx], _items(ev, idx), [ev.tasks[i] for i in idx], ev.seeds)


def headroom_episodes(res: Result | HeadroomResult, tasks: Sequence[str]) -> tuple[Episodes, np.ndarray]:
    """The episodes of ``tasks`` in a headroom result: greedy outcomes as Episodes (one entry per episode,
    clustered as :func:`suite_episodes`) and the sampled outcomes ``[episode, k]`` of the same episodes,
    the episode the unit that :func:`~graftkit.stats.headroom` compares."""
    hv = _view(res, HeadroomResult)
    idx = _task_index(hv, tasks, "the headroom result")
    g, s = hv.greedy, hv.success
    if g is None or g.shape[:3] != s.shape[:3]:
        raise GraftkitError("the headroom result has no greedy outcomes of its sampled episodes",
                            "measure headroom again with `graftkit headroom`")
    greedy = _episodes(g[idx][..., :1], _items(hv, idx), [hv.tasks[i] for i in idx], hv.seeds)
    return greedy, np.asarray(s[idx], dtype=np.int8).reshape(-1, s.shape[-1])


def suite_outcomes(res, tasks) -> np.ndarray:
    """Greedy outcomes of ``tasks`` from an eval result as [seed, task·episode] (rows are the seeds)."""
    return EvalResult.from_result(res).outcomes(tasks)


def suite_tasks(res: Result | EvalResult, suite: str,
                suites: Mapping[str, Sequence[str]] = SUITES) -> tuple[list[str], list[str]]:
    """The tasks of ``suite`` (in ``suites``, the study's two suites) that an evaluation played, and those it
    left out (a task with no evaluation item is not played held-out; its evaluation's ``tasks_without_items``
    says so)."""
    ev = _view(res)
    return [t for t in suites[suite] if t in ev.tasks], [t for t in suites[suite] if t not in ev.tasks]


def _left_out(left: Sequence[str], suite: str, where: str = "the SFT evaluation") -> str:
    return f" Left out of the {suite} suite (not in {where}): {', '.join(left)}." if left else ""


def _pair(sft: Episodes, run: Episodes, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(SFT outcomes, run outcomes, clusters) of identical episodes, or an error naming the run."""
    if sft.outcomes.shape != run.outcomes.shape or not np.array_equal(sft.clusters, run.clusters):
        raise GraftkitError(f"the evaluation of {name} did not play the SFT policy's episodes "
                            f"({run.outcomes.size} vs {sft.outcomes.size} episodes, or other {sft.by}s)",
                            "evaluate every policy with the same tasks, seeds and episodes")
    return sft.outcomes, run.outcomes, sft.clusters


# --------------------------------------------------------------------------------------- statements


def _pts(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:+.1f}"


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.1f}%"


def _iv(diff: float, low: float, high: float) -> str:
    return f"{_pts(diff)} points [{_pts(low)}, {_pts(high)}]"


def _share(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{int(round(100 * x))}%"


def _regime_iv(ri) -> str:
    """A regime interval as text; a conditional one (one run, or too few discordant pairs to estimate the
    training-seed variance) says so."""
    text = f"{_iv(ri.diff, ri.low, ri.high)} over {ri.n_runs} run{'s' * (ri.n_runs != 1)}"
    if not ri.conditional:
        return text
    return text + (" (conditional on its training seed)" if ri.n_runs == 1 else
                   " (too few discordant pairs to estimate the training-seed variance: conditional on these runs)")


def decoy_note(runs: Sequence[RLRun], sft_decoy: bool) -> str:
    """The sentence a finding's statement ends with when the SFT policy or any of ``runs`` was trained
    with decoys (else ''). A control run (``suite == "control"``) is named whatever its ``decoy`` flag: it is
    trained from :data:`SFT_CONTROL`, whose demonstrations plant a position bias, and the note says so."""
    who = (["the SFT policy"] if sft_decoy else []) + [r.name for r in runs if r.decoy and r.suite != CONTROL]
    control = [r.name for r in runs if r.suite == CONTROL]
    if control:
        who.append(f"{', '.join(control)} (the positive control's runs, trained from {SFT_CONTROL}: the SFT policy "
                   "fine-tuned on demonstrations with a planted position bias)")
    return f" Trained with decoys (planted headroom): {', '.join(who)}." if who else ""


def _combine(parts: Sequence[bool | None], capped: bool = False) -> str:
    """Sub-verdicts (None: not measured) → reproduced (all measured and true, unless ``capped``), partly
    reproduced (some true), not reproduced (none true), not measured (none measured)."""
    measured = [p for p in parts if p is not None]
    if not measured:
        return NOT_MEASURED
    if len(measured) == len(parts) and all(measured) and not capped:
        return REPRODUCED
    return PARTLY if any(measured) else NOT_REPRODUCED


@dataclass(frozen=True)
class Finding:
    """One of the study's four findings as this run found it."""

    number: int | str
    """1–4, or "control" for the positive control (:func:`finding_control`)."""
    claim: str
    statement: str
    estimate: float
    low: float
    high: float
    verdict: str  # one of VERDICTS


def _unmeasured(number: int | str, claim: str, why: str) -> Finding:
    return Finding(number, claim, why, math.nan, math.nan, math.nan, NOT_MEASURED)


# ---------------------------------------------------------------------------------- positive control


FINDING_CONTROL = ("The pipeline learns where reward is reachable: GRPO with the headroom recipe raises greedy success "
                   "on a task whose reward sampling reaches (positive control)")


def finding_control(evals: Mapping[str, Result | EvalResult], runs: Sequence[RLRun], *, level: float = 0.95,
                    suites: Mapping[str, Sequence[str]] = SUITES) -> Finding:
    """The positive control: GRPO with the headroom recipe raises greedy success on the control suite, where the
    control's SFT policy fails greedily and sampling reaches the reward.

    ``evals``: label → greedy eval result (:data:`SFT_CONTROL` and every control run's name); ``runs``: the study's
    runs (those with ``suite == "control"`` are read, their regime "control"); ``suites``: the study's task suites
    (``suites["control"]`` is read). Each control run is paired with :data:`SFT_CONTROL` — the study's SFT policy
    fine-tuned on demonstrations with a planted position bias on the control task, a decoy: it is the control's
    own SFT policy, never the study's — on identical episodes of the control suite (:func:`suite_episodes`).
    Estimate: ``regime_interval`` over the control runs (the training seed a random effect, as finding 2's gain).

    Verdict: the interval lies above 0 → "learns" (:data:`CONTROL_LEARNS`); its upper end below
    :data:`CONTROL_MIN_SHARE` of the room the bias leaves (1 − p₀, p₀ the control SFT's success) → "does not learn"
    (:data:`CONTROL_FAILS`); an interval that spans 0 and reaches such a gain → "undecided"
    (:data:`CONTROL_UNDECIDED`: too few episodes or runs to tell); the control's SFT policy at 100% greedy success
    on the suite (the bias was not planted: nothing to raise) → not testable here; no control run, no evaluation of
    :data:`SFT_CONTROL` or no control suite → not measured. Findings 1 and 2 cite it (:func:`control_learnt`): a
    null result of a pipeline whose own control does not learn, or is undecided, says nothing about GRPO.
    """
    ctrl = [r for r in runs if r.suite == CONTROL]
    if not ctrl:
        return _unmeasured(CONTROL, FINDING_CONTROL, "no control-suite GRPO run")
    if SFT_CONTROL not in evals:
        return _unmeasured(CONTROL, FINDING_CONTROL, f"no evaluation of the control's SFT policy ({SFT_CONTROL})")
    if CONTROL not in suites:
        return _unmeasured(CONTROL, FINDING_CONTROL, "the study's suites have no control suite")
    tasks, left = suite_tasks(evals[SFT_CONTROL], CONTROL, suites)
    if not tasks:
        return _unmeasured(CONTROL, FINDING_CONTROL, f"the evaluation of {SFT_CONTROL} has no task of the control suite")
    sft = suite_episodes(evals[SFT_CONTROL], tasks, f"the evaluation of {SFT_CONTROL}")
    pairs = [_pair(sft, suite_episodes(evals[r.name], tasks, r.name), r.name) for r in ctrl]
    gain = regime_interval(pairs, level=level)
    p0 = sft.rate
    study = ""
    if SFT in evals and all(t in _view(evals[SFT]).tasks for t in tasks):
        study = f"; the study's SFT policy {_pct(suite_episodes(evals[SFT], tasks).rate)}"
    per_run = ", ".join(f"{r.name} {_pts(d)}" for r, d in zip(ctrl, gain.run_diffs))
    text = (f"Control suite ({', '.join(tasks)}): greedy success of {SFT_CONTROL}, the control's SFT policy (the "
            f"study's SFT fine-tuned on demonstrations with a planted position bias, a decoy), {_pct(p0)} "
            f"({sft.outcomes.size} episodes in {sft.n_clusters} {sft.by} clusters{study}). GRPO from it on the "
            f"control suite changes greedy success by {_regime_iv(gain)} (runs: {per_run}); the control learns when "
            f"that interval lies above 0")
    if p0 >= 1:
        text += f": at 100% {SFT_CONTROL} leaves nothing to raise (the bias was not planted), so the control is no test"
        verdict = NOT_TESTABLE
    else:
        least = CONTROL_MIN_SHARE * (1 - p0)
        text += (f", and does not learn when it rules out a gain of {100 * least:.1f} points ({CONTROL_MIN_SHARE:.0%} "
                 f"of the room the bias leaves)")
        verdict = CONTROL_LEARNS if gain.low > 0 else CONTROL_FAILS if gain.high < least else CONTROL_UNDECIDED
        text += (": it is undecided, the interval spans 0 and reaches that gain (too few episodes or runs to tell)"
                 if verdict == CONTROL_UNDECIDED else f": it {verdict}")
    text += "." + _left_out(left, CONTROL, f"the evaluation of {SFT_CONTROL}") + decoy_note(ctrl, False)
    return Finding(CONTROL, FINDING_CONTROL, text, gain.diff, gain.low, gain.high, verdict)


def control_learnt(control: Finding | None) -> bool | None:
    """Whether the pipeline's positive control (:func:`finding_control`) learnt: True (learns), False (does not
    learn), None (no control finding, or it was undecided, not measured or not testable)."""
    if control is None:
        return None
    return True if control.verdict == CONTROL_LEARNS else False if control.verdict == CONTROL_FAILS else None


def control_note(control: Finding | None, null: str = "") -> str:
    """The sentence a finding cites the positive control with ('' when none was given); ``null``: the finding's
    null result in words ('' when its result is not null), which a control that does not learn leaves meaningless."""
    if control is None:
        return ""
    learnt = control_learnt(control)
    iv = _iv(control.estimate, control.low, control.high)
    if learnt is None:
        return f" The pipeline's positive control is {control.verdict}, so whether this pipeline can learn is not shown."
    if learnt:
        return f" The pipeline's positive control learns ({iv} on the control suite): the pipeline can raise success."
    return (f" The pipeline's own positive control does not learn ({iv} on the control suite)"
            + (f", so {null} says nothing about GRPO: this pipeline did not learn where it must." if null else
               ": this pipeline did not learn where it must."))


# ---------------------------------------------------------------------------------------- finding 1


def degrades(ri, p0: float) -> bool:
    """A regime degrades SFT (success ``p0``): its interval lies below 0 and its mean loss −diff is
    smaller than the collapse threshold (1 − COLLAPSE_FRACTION)·p0 (it has not collapsed)."""
    return bool(ri.high < 0 and -ri.diff < (1 - COLLAPSE_FRACTION) * p0)


def collapses(ri, p0: float) -> bool:
    """A regime collapses SFT: its mean success p0 + diff is at most COLLAPSE_FRACTION·p0 and its
    interval lies below 0."""
    return bool(ri.high < 0 and p0 + ri.diff <= COLLAPSE_FRACTION * p0)


FINDING_1 = ("No GRPO configuration credibly improves a strong SFT baseline on mastered tasks; a middle learning "
             "rate degrades it and a high one collapses it.")


def finding_1(evals: Mapping[str, Result | EvalResult], runs: Sequence[RLRun], *, sft_decoy: bool = False,
              level: float = 0.95, suites: Mapping[str, Sequence[str]] = SUITES,
              control: Finding | None = None) -> Finding:
    """No configuration credibly improves the SFT baseline on the mastered suite; the middle learning rate
    degrades it and the highest collapses it.

    ``evals``: label → greedy eval result ("sft" and every run's name); ``runs``: the study's runs (those
    with ``suite == "mastered"`` are read); ``suites``: the study's task suites. Rule:

    - improves: a mastered-suite run whose paired comparison with SFT is "credibly better" (every run of
      the grid counts, whatever its regime);
    - per regime (the runs' ``regime`` attribute) its change Δ from ``regime_interval`` over all its runs;
      the "degrade" regime degrades (:func:`degrades`), the "collapse" regime collapses (:func:`collapses`);
    - power: the smallest improvement the evaluation detects, ``detectable_improvement(p0, C, ⌊N/C⌉)``
      at SFT's rate p0 (N episodes in C clusters) with :data:`DETECTION_POWER`; "no run improves" is a
      test only when p0 < 1 and an improvement of at most the 1 − p0 it could gain is detectable.

    Verdict: a run improves → not reproduced; else not a test of "no run improves" → not testable here;
    else degrade and collapse both shown → reproduced; one of them → partly reproduced; neither → not
    reproduced. The statement says when p0 lies outside :data:`STRONG_BASELINE`, and cites ``control`` (the
    positive control, :func:`finding_control`) when given: "no run improves" from a pipeline whose own control
    does not learn says nothing. Estimate: the best run's change against SFT and its paired interval.
    """
    grid = [r for r in runs if r.suite == "mastered"]
    if not grid:
        return _unmeasured(1, FINDING_1, "no mastered-suite GRPO run")
    tasks, left = suite_tasks(evals[SFT], "mastered", suites)
    if not tasks:
        return _unmeasured(1, FINDING_1, "the SFT evaluation has no task of the mastered suite")
    sft = suite_episodes(evals[SFT], tasks, "the SFT evaluation")
    pairs = {r.name: _pair(sft, suite_episodes(evals[r.name], tasks, r.name), r.name) for r in grid}
    comps = {n: compare(a, b, level=level, clusters=c) for n, (a, b, c) in pairs.items()}
    better = [n for n, c in comps.items() if c.verdict == BETTER]
    best = max(comps, key=lambda n: comps[n].diff)
    p0 = sft.rate
    names = list(dict.fromkeys(r.regime for r in grid))
    regimes = {g: regime_interval([pairs[r.name] for r in grid if r.regime == g], level=level) for g in names}
    shown = {"degrade": "degrade" in regimes and degrades(regimes["degrade"], p0),
             "collapse": "collapse" in regimes and collapses(regimes["collapse"], p0)}
    # the evaluation as n_clusters clusters of its mean cluster size (the design detectable_improvement models)
    per_cluster = max(1, round(sft.outcomes.size / sft.n_clusters))
    power = (detectable_improvement(p0, sft.n_clusters, per_cluster, level=level, power=DETECTION_POWER)
             if p0 < 1 else None)
    mde = power.delta if power is not None else math.nan
    testable = power is not None and power.detectable and mde <= 1 - p0

    lo, hi = STRONG_BASELINE
    parts = [f"SFT greedy success on the mastered suite {_pct(p0)} ({sft.outcomes.size} episodes in "
             f"{sft.n_clusters} {sft.by} clusters)"]
    if not lo <= p0 <= hi:
        parts.append(f"outside the {100 * lo:.0f}–{100 * hi:.0f}% of the strong baseline the claim is about")
    how = f"{100 * DETECTION_POWER:.0f}% power, {100 * level:.0f}% level"
    if p0 >= 1:
        parts.append("at 100% it cannot be improved, so 'no run improves' is no test here")
    elif testable:
        parts.append(f"the smallest improvement this evaluation detects ({how}) is {_pts(mde)} points")
    else:
        parts.append(f"this evaluation could not detect ({how}) any improvement up to the {_pts(1 - p0)} points it "
                     "could gain, so 'no run improves' is no test here")
    text = "; ".join(parts) + (f". {len(better)}/{len(grid)} GRPO runs credibly improve it (best, {best}: "
                               f"{_iv(comps[best].diff, comps[best].bootstrap.low, comps[best].bootstrap.high)}). ")

    def regime_text(g: str) -> str:
        ri = regimes[g]
        how = ("degrades" if degrades(ri, p0) else "collapses" if collapses(ri, p0) else
               "credibly worse" if ri.high < 0 else "credibly better" if ri.low > 0 else "no credible change")
        return f"{g}: {_regime_iv(ri)}, mean success {_pct(p0 + ri.diff)} ({how})"

    text += "Regimes (training seed a random effect): " + "; ".join(regime_text(g) for g in names)
    missing = [g for g in ("degrade", "collapse") if g not in regimes]
    text += "." + (f" No run of the {' or '.join(missing)} regime." if missing else "")
    text += (f" Degrade: change below 0 and success above {100 * COLLAPSE_FRACTION:.0f}% of SFT's; collapse: "
             f"change below 0 and success at most {100 * COLLAPSE_FRACTION:.0f}% of SFT's.")
    verdict = (NOT_REPRODUCED if better else NOT_TESTABLE if not testable else
               REPRODUCED if all(shown.values()) else PARTLY if any(shown.values()) else NOT_REPRODUCED)
    c = comps[best]
    text += control_note(control, "" if better else "'no run improves'")
    text += _left_out(left, "mastered") + decoy_note(grid, sft_decoy)
    return Finding(1, FINDING_1, text, c.diff, c.bootstrap.low, c.bootstrap.high, verdict)


# ---------------------------------------------------------------------------------------- finding 2


FINDING_2 = "On tasks with headroom (sampled success above greedy), GRPO raises success."


def finding_2(evals: Mapping[str, Result | EvalResult], runs: Sequence[RLRun],
              headroom: Result | HeadroomResult | None, *, sft_decoy: bool = False, level: float = 0.95,
              suites: Mapping[str, Sequence[str]] = SUITES, control: Finding | None = None) -> Finding:
    """On the headroom suite (sampled success above greedy), the same recipe raises greedy success.

    ``evals`` and ``runs`` as :func:`finding_1`; ``headroom``: the SFT policy's headroom result. Rule:

    - headroom: SFT's sampled − greedy success on the headroom suite, pooled over its tasks, is "credibly
      better" (:func:`~graftkit.stats.headroom`: each episode's greedy outcome against its k samples);
    - gain: ``regime_interval`` of the headroom-suite runs (``suite == "headroom"``) on the headroom suite,
      credible when it lies above 0;
    - negative control: the same interval of the mastered-suite runs of :data:`CONTROL_REGIME` on the
      headroom suite (the recipe trained on other tasks); the gain is larger than it when the gain's interval
      lies entirely above the control's estimate (low_gain > Δ_control);
    - reported beside them: the headroom runs' change on the mastered suite (the side effect);
    - ``control``: the positive control (:func:`finding_control`), cited when given: a gain that is not credible
      from a pipeline whose own positive control does not learn says nothing about GRPO, and the statement says so.

    Verdict: no credible headroom → not testable here; a credible gain larger than the negative control's →
    reproduced; a credible gain that is not (or no negative-control run) → partly reproduced; no credible gain →
    not reproduced; no headroom result or no headroom-suite run → not measured. Estimate: the gain.
    """
    hr = [r for r in runs if r.suite == "headroom"]
    if headroom is None:
        return _unmeasured(2, FINDING_2, "no headroom measurement of the SFT policy")
    if not hr:
        return _unmeasured(2, FINDING_2, "no headroom-suite GRPO run")
    hv = _view(headroom, HeadroomResult)
    tasks = {s: suite_tasks(evals[SFT], s, suites) for s in ("headroom", "mastered")}
    H = [t for t in tasks["headroom"][0] if t in hv.tasks]
    if not H or not tasks["mastered"][0]:
        return _unmeasured(2, FINDING_2, "the SFT evaluation or its headroom result has no task of a suite")
    greedy, sampled = headroom_episodes(hv, H)
    room = headroom_table({"headroom suite": greedy.outcomes}, {"headroom suite": sampled}, level=level,
                          clusters=greedy.clusters).rows[0]
    has_room = room.has_headroom
    played = {"headroom": H, "mastered": tasks["mastered"][0]}
    sft = {s: suite_episodes(evals[SFT], played[s], "the SFT evaluation") for s in played}

    def interval(suite: str, rs: Sequence[RLRun]):
        return regime_interval([_pair(sft[suite], suite_episodes(evals[r.name], played[suite], r.name), r.name)
                                for r in rs], level=level)

    gain, side = interval("headroom", hr), interval("mastered", hr)
    ctrl_runs = [r for r in runs if r.suite == "mastered" and r.regime == CONTROL_REGIME]
    negative = interval("headroom", ctrl_runs) if ctrl_runs else None
    credible = gain.low > 0
    beyond = negative is not None and gain.low > negative.diff
    text = (f"SFT headroom on the headroom suite ({', '.join(H)}; sampled − greedy, k = {hv.k}): "
            f"{_iv(room.headroom, room.comparison.bootstrap.low, room.comparison.bootstrap.high)} ({room.verdict}). "
            f"GRPO on that suite changes its greedy success by {_regime_iv(gain)}, and the mastered suite's by "
            f"{_regime_iv(side)} (side effect). Negative control, the {CONTROL_REGIME} runs trained on the mastered "
            f"suite, on the headroom suite: "
            + (_regime_iv(negative) if negative is not None else f"no {CONTROL_REGIME}-regime run")
            + ". Reproduced when the gain lies above 0 and above the negative control's estimate: gain "
            + ("credible" if credible else "not credible")
            + ("" if negative is None else
               f", {'above' if beyond else 'not above'} the negative control's {_pts(negative.diff)}")
            + ".")
    verdict = (NOT_TESTABLE if not has_room else REPRODUCED if credible and beyond else PARTLY if credible
               else NOT_REPRODUCED)
    text += control_note(control, "" if credible else "a gain that is not credible")
    left = [t for t in suites["headroom"] if t not in H]
    text += (_left_out(left, "headroom", "the SFT evaluation or its headroom result")
             + _left_out(tasks["mastered"][1], "mastered"))
    return Finding(2, FINDING_2, text + decoy_note([*hr, *ctrl_runs], sft_decoy), gain.diff, gain.low, gain.high,
                   verdict)


# ---------------------------------------------------------------------------------------- finding 3


def subset_labels(sweep: SweepResult) -> dict[frozenset, str]:
    """The sweep's plain subset configurations (all layers, α = 1), by set of grafted groups: ∅ is the
    base, the RL reference is the set of every group the model has."""
    out: dict[frozenset, str] = {}
    alphas = sweep.array("config_alpha")
    alphas = np.ones(len(sweep.configs)) if alphas is None else alphas
    for label, groups, role, layers, alpha in zip(sweep.configs, sweep.strings("config_groups"),
                                                  sweep.strings("config_role"), sweep.strings("config_layers", "all"),
                                                  alphas):
        plain = role in ("base", "rl") or (alpha == 1 and layers == "all" and not label.startswith("rl−"))
        if plain:
            out.setdefault(frozenset(g for g in groups.split(",") if g), label)
    return out


def _flat(sweep: SweepResult, label: str) -> np.ndarray:
    return np.asarray(sweep.outcomes(label), dtype=np.int8).ravel()


def _seed_clusters(sweep: SweepResult) -> np.ndarray:
    shape = sweep.outcomes(sweep.configs[0]).shape  # [task, seed, episode]
    seeds = np.array([str(s) for s in sweep.result.coords["seed"]], dtype=object)
    return np.broadcast_to(seeds[None, :, None], shape).ravel()


def config_label(sweep: SweepResult, groups) -> str | None:
    """The label of the plain graft of ``groups`` in ``sweep`` (RL_LABEL: the RL reference), None if absent."""
    if groups == RL_LABEL:
        return RL_LABEL if RL_LABEL in sweep.configs else None
    return subset_labels(sweep).get(frozenset(groups))


def complement(sweep: SweepResult, groups: Sequence[str]) -> frozenset:
    """The sweep's groups other than ``groups``: their graft is the RL model with ``groups`` reverted."""
    return frozenset(sweep.groups) - frozenset(groups)


def graft_pairs(sweeps: Sequence[SweepResult], groups) -> list[tuple]:
    """Per sweep (base outcomes, outcomes of the graft of ``groups``, seed clusters), the pairs that
    :func:`~graftkit.stats.regime_interval` takes."""
    return [(_flat(sw, BASE_LABEL), _flat(sw, config_label(sw, groups)), _seed_clusters(sw)) for sw in sweeps]


def has_configs(sweeps: Sequence[SweepResult], *group_sets) -> bool:
    """Whether every sweep has the base and the plain graft of every one of ``group_sets`` (a callable
    entry is applied to the sweep first, for sets that depend on its groups)."""
    return bool(sweeps) and all(
        BASE_LABEL in sw.configs and config_label(sw, gs(sw) if callable(gs) else gs) is not None
        for sw in sweeps for gs in group_sets)


def change(sweep: SweepResult, groups) -> float:
    """v(S) − v(∅): success of the graft of ``groups`` (RL_LABEL: the RL model) minus the base's."""
    return sweep.success(config_label(sweep, groups)) - sweep.success(BASE_LABEL)


def shares(sweeps: Sequence[SweepResult], groups: Sequence[str]) -> tuple[float, float]:
    """(carried, kept) of the groups S = ``groups``: mean over the sweeps of v(S) − v(∅), and of
    v(G ∖ S) − v(∅) (G: the sweep's groups), each over the mean of v(RL) − v(∅). S is sufficient when
    carried ≥ SUFFICIENT_SHARE, necessary when kept ≤ 1 − NECESSARY_SHARE (reverting S removes at least
    NECESSARY_SHARE); NaN when the RL change is 0."""
    rl = float(np.mean([change(sw, RL_LABEL) for sw in sweeps]))
    if rl == 0:
        return math.nan, math.nan
    carried = float(np.mean([change(sw, groups) for sw in sweeps]))
    kept = float(np.mean([change(sw, complement(sw, groups)) for sw in sweeps]))
    return carried / rl, kept / rl


def movement_of(sweep: SweepResult, movement: Mapping[str, Mapping[str, float]] | None
                ) -> tuple[dict[str, float], float] | None:
    """(group → share of the run's squared weight movement, share not assigned to a named group) of the
    swept run: from ``movement[rl_label]`` (every group, delta anatomy) when given, else from the sweep's
    own ``movement_share`` (its groups only: the rest is what groups outside the sweep moved); None when
    neither records it."""
    label = str(sweep.attrs.get("rl_label", ""))
    known = dict(movement[label]) if movement is not None and label in movement else sweep.movement_share
    if known is None:
        return None
    return known, max(0.0, 1.0 - float(sum(known.values())))


def unswept(sweep: SweepResult, moved: tuple[dict[str, float], float]) -> dict[str, float]:
    """Groups (and "groups outside the sweep", their unassigned share) carrying more than MOVED_SHARE of
    the run's movement that the sweep does not graft."""
    known, rest = moved
    out = {g: s for g, s in known.items() if g not in sweep.groups and s > MOVED_SHARE}
    if rest > MOVED_SHARE:
        out["groups outside the sweep"] = rest
    return out


def dominates(moved: tuple[dict[str, float], float], group: str = "embed") -> bool:
    """``group`` has the largest movement share of all groups: above every other named group's and above
    the unassigned share (which bounds any single unnamed group's)."""
    known, rest = moved
    mine = known.get(group, 0.0)
    return all(mine > s for g, s in known.items() if g != group) and mine > rest


FINDING_3 = ("Grafting localises the degrade regime to attention + MLP; the collapse regime is not traceable to any "
             "single group; the embedding change dominates weight movement yet is causally inert.")


def sweep_list(sweeps: "Sweeps") -> list[SweepResult]:
    """A regime's sweeps as a list: None is no sweep, one SweepResult is one."""
    return [] if sweeps is None else [sweeps] if isinstance(sweeps, SweepResult) else list(sweeps)


Sweeps = SweepResult | Sequence[SweepResult] | None


def finding_3(degrade: Sweeps, collapse: Sweeps, *,
              movement: Mapping[str, Mapping[str, float]] | None = None, runs: Sequence[RLRun] = (),
              sft_decoy: bool = False, level: float = 0.95) -> Finding:
    """Grafting localises the degrade regime to attention + MLP; the collapse regime is not traceable to
    any single group; the embedding dominates weight movement yet is causally inert — on success, and on
    behaviour (KL) where the sweeps were scored by it.

    ``degrade`` / ``collapse``: the factorial graft sweeps of the regime's runs (one per swept run, or a run's
    success and KL sweeps as two files; one sweep, or None / empty for none: :func:`sweep_list`); ``movement``:
    run label (a sweep's ``rl_label``) → group → share of that run's squared weight movement over every group
    (delta anatomy; default: each sweep's own ``movement_share``); ``runs``: the study's runs (for the decoy note).

    On success (the sweeps that hold success), v(S): success of the graft of groups S into SFT, the RL change
    v(RL) − v(∅); shares are of means over a regime's sweeps (:func:`shares`):

    - localised (degrade): the RL change's ``regime_interval`` lies below 0, and attn+mlp is sufficient
      (its graft carries ≥ SUFFICIENT_SHARE of the change) and necessary (reverting it, the graft of every
      other swept group, removes ≥ NECESSARY_SHARE of it);
    - not traceable (collapse): the RL change lies below 0 and no single group is sufficient or necessary;
    - inert (degrade): the embed-only graft is equivalent to SFT (``regime_tost`` over every swept run,
      margin ± INERT_MARGIN) and the embedding has the largest movement share of all groups (lm_head
      included) in every swept run (:func:`dominates`).

    On KL (the sweeps that hold ``kl_reproduced``, ``graft --metric kl|both``), f(S): the fraction of RL's
    behavioural change the graft of S reproduces on RL's rollouts (:data:`KL_SIDE`: reproduced_RL(S) =
    1 − KL(π_RL‖π_S)/KL(π_RL‖π_SFT), 0 at ∅ and 1 at the full graft), with the interval the sweep stores (its
    clustered bootstrap over evaluation seeds, at the sweep's level); the SFT side's value (reproduced_SFT, on
    SFT's rollouts) is stated beside it; ``level`` applies to success only. No regime-level interval exists for a
    real-valued fraction over runs (the hierarchical bootstrap of ``regime_interval`` takes 0/1 outcomes;
    :func:`~graftkit.stats.mean_interval` resamples one run's clusters), so each swept run is decided on its own
    interval and a sub-rule holds on KL when it holds in every swept run of the regime:

    - localised: f(attn+mlp)'s interval lies at or above SUFFICIENT_SHARE, and f(G ∖ {attn, mlp}) (attn+mlp
      reverted)'s at or below 1 − NECESSARY_SHARE;
    - not traceable: for every single group g of the run's sweep, f(g)'s interval lies below SUFFICIENT_SHARE and
      f(G ∖ {g})'s above 1 − NECESSARY_SHARE;
    - inert: f(embed)'s interval lies within ± :data:`KL_INERT_MARGIN` (TOST-style; the stored interval is the
      sweep's two-sided one at its level, stricter than the 1 − 2α interval a TOST needs) and the embedding has
      the largest movement share of the run.

    A swept run of the regime without KL leaves that sub-rule's KL verdict unmeasured.

    Coverage: a group moving more than MOVED_SHARE of a swept run's movement but not in its sweep (an untied
    lm_head left out) is named, and then the finding cannot be "reproduced"; without movement shares coverage
    is unknown, with the same consequence.

    Verdict (:func:`_combine` over the sub-verdicts of both measures; without KL in any sweep, of success alone and
    the statement says KL was not measured): every sub-rule measured and true on both measures, coverage complete →
    reproduced; some true (a sub-rule on one measure only included) → partly reproduced; none → not reproduced;
    none measurable → not measured. The statement gives each sub-rule's verdict on success and on KL. Estimate:
    the degrade regime's attn+mlp graft change in success against SFT (regime interval; NaN without success).
    """
    degrade, collapse = sweep_list(degrade), sweep_list(collapse)
    if not degrade and not collapse:
        return _unmeasured(3, FINDING_3, "no graft sweep of a degrade- or collapse-regime run")
    per_run = {"degrade": _per_run(degrade), "collapse": _per_run(collapse)}
    first = {**per_run["degrade"], **per_run["collapse"]}
    moved = {label: movement_of(sw, movement) for label, sw in first.items()}
    succ = {g: [sw for sw in sws if sw.has_success] for g, sws in (("degrade", degrade), ("collapse", collapse))}
    localised, localised_text, est = _localised(succ["degrade"], level)
    traceless, traceless_text = _traceless(succ["collapse"], level)
    inert, inert_text = _inert(succ["degrade"], [moved[_label(sw)] for sw in succ["degrade"]], level)
    with_kl = any(sw.has_kl for sw in degrade + collapse)
    kl = {"localised": _kl_localised(degrade), "traceless": _kl_traceless(collapse),
          "inert": _kl_inert(degrade, moved)} if with_kl else {}

    def sub_rule(name: str, key: str, on_success: tuple[bool | None, str]) -> str:
        if not with_kl:
            return f"{name}: {on_success[1]}"
        on_kl = kl[key]
        return f"{name} — on success: {on_success[1]}; on KL: {on_kl[1]} ({_agreement(on_success[0], on_kl[0])})"

    n = {g: len(per_run[g]) for g in per_run}
    parts = [sub_rule(f"Degrade regime ({n['degrade']} swept run{'s' * (n['degrade'] != 1)})", "localised",
                      (localised, localised_text)),
             sub_rule(f"Collapse regime ({n['collapse']} swept run{'s' * (n['collapse'] != 1)})", "traceless",
                      (traceless, traceless_text)),
             sub_rule("Embed (degrade regime)", "inert", (inert, inert_text))]
    text = ". ".join(parts) + "."
    if not with_kl:
        text += (" KL not measured: the sweeps were scored by success alone (graft --metric both adds the fraction of "
                 "the behavioural change each graft reproduces).")
    gaps = _coverage_gaps(list(first), list(first.values()), list(moved.values()))
    if gaps:
        text += " Not every moving group is in the attribution (so not reproduced as a whole): " + "; ".join(gaps) + "."
    swept = [r for r in runs if r.name in first]
    verdicts = [localised, traceless, inert] + [kl[k][0] for k in ("localised", "traceless", "inert") if with_kl]
    verdict = _combine(verdicts, capped=bool(gaps))
    return Finding(3, FINDING_3, text + decoy_note(swept, sft_decoy), float(est[0]), float(est[1]), float(est[2]),
                   verdict)


def _label(sweep: SweepResult) -> str:
    """The swept run a sweep took apart (its ``rl_label``), else its file."""
    return str(sweep.attrs.get("rl_label", "") or sweep.path or "?")


def _per_run(sweeps: Sequence[SweepResult]) -> dict[str, SweepResult]:
    """Each swept run's first sweep, by the run's label (a run's success and KL sweeps may be two files)."""
    out: dict[str, SweepResult] = {}
    for sw in sweeps:
        out.setdefault(_label(sw), sw)
    return out


def _agreement(on_success: bool | None, on_kl: bool | None) -> str:
    """A sub-rule's two sub-verdicts in words."""
    if on_success is not None and on_kl is not None:
        return ("holds on both measures" if on_success and on_kl else
                "holds on neither measure" if not (on_success or on_kl) else
                f"the measures disagree: it holds on {'success' if on_success else 'KL'} only")
    if on_success is None and on_kl is None:
        return "measured on neither"
    shown, measured, unmeasured = ((on_success, "success", "KL") if on_kl is None else (on_kl, "KL", "success"))
    return f"{'holds' if shown else 'does not hold'} on {measured}, not measured on {unmeasured}"


def _localised(degrade: list[SweepResult], level: float) -> tuple[bool | None, str, tuple[float, float, float]]:
    """Finding 3's first sub-rule on success: the degrade regime's change lies below 0 and attn+mlp is sufficient
    and necessary for it. Returns (verdict or None when not measured, its sentence, the attn+mlp graft's interval)."""
    am_set = LOCALISED_GROUPS
    if not has_configs(degrade, RL_LABEL, am_set, lambda sw: complement(sw, am_set)):
        return None, ("no factorial sweep scored by success with the attn+mlp graft and its complement, so "
                      "localisation is not measured"), (math.nan,) * 3
    rl = regime_interval(graft_pairs(degrade, RL_LABEL), level=level)
    am = regime_interval(graft_pairs(degrade, am_set), level=level)
    carried, kept = shares(degrade, am_set)
    localised = bool(rl.high < 0 and carried >= SUFFICIENT_SHARE and kept <= 1 - NECESSARY_SHARE)
    text = (f"RL changes success by {_regime_iv(rl)}; the attn+mlp graft alone by {_iv(am.diff, am.low, am.high)}, "
            f"{_share(carried)} of it (sufficient: ≥ {100 * SUFFICIENT_SHARE:.0f}%); reverting attn+mlp leaves "
            f"{_share(kept)} (necessary: ≤ {100 * (1 - NECESSARY_SHARE):.0f}%) — "
            + ("localised to attn+mlp" if localised else
               "no credible change to localise" if rl.high >= 0 else "not localised to attn+mlp"))
    return localised, text, (am.diff, am.low, am.high)


def _traceless(collapse: list[SweepResult], level: float) -> tuple[bool | None, str]:
    """Finding 3's second sub-rule on success: the collapse regime's change lies below 0 and no single group is
    sufficient or necessary for it."""
    singles = sorted(set.intersection(*(set(sw.groups) for sw in collapse)), key=collapse[0].groups.index) \
        if collapse else []
    if not (singles and has_configs(collapse, RL_LABEL, *((g,) for g in singles),
                                    *(lambda sw, g=g: complement(sw, (g,)) for g in singles))):
        return None, ("no factorial sweep scored by success with every single-group graft and its complement, so "
                      "traceability is not measured")
    rl = regime_interval(graft_pairs(collapse, RL_LABEL), level=level)
    rows = {g: shares(collapse, (g,)) for g in singles}
    top = max(rows, key=lambda g: rows[g][0] if np.isfinite(rows[g][0]) else -math.inf)
    need = min(rows, key=lambda g: rows[g][1] if np.isfinite(rows[g][1]) else math.inf)
    traceless = bool(rl.high < 0 and all(c < SUFFICIENT_SHARE and k > 1 - NECESSARY_SHARE
                                         for c, k in rows.values()))
    return traceless, (f"RL changes success by {_regime_iv(rl)}; the strongest single-group graft ({top}) carries "
                       f"{_share(rows[top][0])} of it, reverting one group leaves at least {_share(rows[need][1])} "
                       f"({need}) — "
                       + ("not traceable to a single group" if traceless else
                          "no credible change to trace" if rl.high >= 0 else "traceable to a single group"))


def _inert(degrade: list[SweepResult], moved: list, level: float) -> tuple[bool | None, str]:
    """Finding 3's third sub-rule on success: the embed-only graft is equivalent to SFT and the embedding has the
    largest movement share in every swept degrade run (``moved``: each run's movement shares, or None)."""
    if not has_configs(degrade, ("embed",)):
        return None, "no embed-only graft of a degrade run scored by success, so inertness is not measured"
    tost = regime_tost(graft_pairs(degrade, ("embed",)), INERT_MARGIN, level=level)
    n_dom = sum(m is not None and dominates(m) for m in moved)
    embed = [f"{100 * m[0].get('embed', 0.0):.0f}%" for m in moved if m is not None]
    inert = bool(tost.equivalent and n_dom == len(degrade))
    return inert, (f"{', '.join(embed) or 'unrecorded'} of the weight movement (the largest of all groups in "
                   f"{n_dom}/{len(degrade)} degrade runs); the embed-only graft vs SFT [{_pts(tost.interval.low)}, "
                   f"{_pts(tost.interval.high)}] points, {'within' if tost.equivalent else 'not within'} "
                   f"±{100 * INERT_MARGIN:.0f} (TOST over every swept degrade run) — "
                   + ("dominant yet inert" if inert else "not shown dominant and inert"))


# ---------------------------------------------------------------------------- finding 3 on KL


def _kl_sweeps(sweeps: Sequence[SweepResult]) -> tuple[dict[str, SweepResult], list[str]]:
    """The regime's sweeps with KL, one per swept run (by label), and the swept runs that have none."""
    kl = _per_run([sw for sw in sweeps if sw.has_kl])
    return kl, [label for label in _per_run(sweeps) if label not in kl]


def _fraction(sweep: SweepResult, groups) -> tuple[np.ndarray, float] | None:
    """(reproduced_RL (estimate, low, high), reproduced_SFT estimate) of the plain graft of ``groups``, None when
    the sweep has no such configuration."""
    label = config_label(sweep, groups)
    if label is None:
        return None
    other = float(sweep.reproduced(label, "sft")[0]) if "sft" in sweep.sides else math.nan
    return np.asarray(sweep.reproduced(label, KL_SIDE), dtype=np.float64), other


def _frac(f: tuple[np.ndarray, float]) -> str:
    (e, lo, hi), other = f
    return f"{_share(e)} [{_share(lo)}, {_share(hi)}] (SFT side {_share(other)})"


def _kl_decided(sweeps: Sequence[SweepResult], regime: str, what: str, rows: Sequence[tuple[str, bool | None, str]],
                holds: str, fails: str) -> tuple[bool | None, str]:
    """A KL sub-verdict from per-run rows (label, holds or None when not measured, its words): it holds when it
    holds in every swept run of the regime; a run without KL or without the configurations leaves it unmeasured."""
    _, missing = _kl_sweeps(sweeps)
    if not rows:
        return None, f"no {regime} sweep scored by KL, so {what} is not measured"
    text = "; ".join(f"{label}: {words}" for label, _, words in rows)
    unmeasured = [label for label, ok, _ in rows if ok is None] + missing
    if unmeasured:
        return None, text + f"; not scored by KL with these grafts: {', '.join(unmeasured)}, so {what} is not measured"
    ok = all(r[1] for r in rows)
    return ok, text + " — " + (holds if ok else fails)


def _kl_localised(degrade: list[SweepResult]) -> tuple[bool | None, str]:
    """Finding 3's first sub-rule on KL, per swept degrade run (finding_3's docstring)."""
    kl, _ = _kl_sweeps(degrade)
    am = LOCALISED_GROUPS
    rows = []
    for label, sw in kl.items():
        a, r = _fraction(sw, am), _fraction(sw, complement(sw, am))
        if a is None or r is None:
            rows.append((label, None, "no attn+mlp graft and its complement"))
            continue
        ok = bool(a[0][1] >= SUFFICIENT_SHARE and r[0][2] <= 1 - NECESSARY_SHARE)
        rows.append((label, ok, f"the attn+mlp graft reproduces {_frac(a)} of the behavioural change, reverting "
                                f"attn+mlp leaves {_frac(r)}"))
    head = (f"the fraction of RL's behavioural change each graft reproduces on RL's rollouts, per swept run "
            f"(sufficient: interval ≥ {100 * SUFFICIENT_SHARE:.0f}%; necessary: reverting leaves an interval ≤ "
            f"{100 * (1 - NECESSARY_SHARE):.0f}%): ")
    ok, text = _kl_decided(degrade, "degrade", "localisation", rows, "localised to attn+mlp in every swept run",
                           "not shown localised to attn+mlp in every swept run")
    return ok, (head + text) if rows else text


def _kl_traceless(collapse: list[SweepResult]) -> tuple[bool | None, str]:
    """Finding 3's second sub-rule on KL, per swept collapse run (finding_3's docstring)."""
    kl, _ = _kl_sweeps(collapse)
    rows = []
    for label, sw in kl.items():
        single = {g: _fraction(sw, (g,)) for g in sw.groups}
        reverted = {g: _fraction(sw, complement(sw, (g,))) for g in sw.groups}
        if not single or any(f is None for f in (*single.values(), *reverted.values())):
            rows.append((label, None, "no single-group graft and its complement for every group"))
            continue
        top = max(single, key=lambda g: single[g][0][0] if np.isfinite(single[g][0][0]) else -math.inf)
        need = min(reverted, key=lambda g: reverted[g][0][0] if np.isfinite(reverted[g][0][0]) else math.inf)
        ok = all(single[g][0][2] < SUFFICIENT_SHARE and reverted[g][0][1] > 1 - NECESSARY_SHARE for g in sw.groups)
        rows.append((label, ok, f"the strongest single-group graft ({top}) reproduces {_frac(single[top])}; "
                                f"reverting {need}, the least of any group, leaves {_frac(reverted[need])}"))
    head = (f"per swept run, every single group's graft must reproduce an interval below "
            f"{100 * SUFFICIENT_SHARE:.0f}% and reverting it leave one above {100 * (1 - NECESSARY_SHARE):.0f}%: ")
    ok, text = _kl_decided(collapse, "collapse", "traceability", rows, "not traceable to a single group in any swept "
                           "run", "not shown untraceable in every swept run")
    return ok, (head + text) if rows else text


def _kl_inert(degrade: list[SweepResult], moved: Mapping[str, tuple | None]) -> tuple[bool | None, str]:
    """Finding 3's third sub-rule on KL, per swept degrade run (finding_3's docstring)."""
    kl, _ = _kl_sweeps(degrade)
    rows = []
    for label, sw in kl.items():
        e = _fraction(sw, ("embed",))
        if e is None:
            rows.append((label, None, "no embed-only graft"))
            continue
        within = bool(-KL_INERT_MARGIN < e[0][1] and e[0][2] < KL_INERT_MARGIN)
        m = moved.get(label)
        dom = m is not None and dominates(m)
        rows.append((label, within and dom, f"the embed-only graft reproduces {_frac(e)}, "
                                            f"{'within' if within else 'not within'} ±{100 * KL_INERT_MARGIN:.0f}%"
                                            + ("" if dom else "; the embedding not shown the largest mover")))
    ok, text = _kl_decided(degrade, "degrade", "inertness", rows, "dominant yet behaviourally inert in every swept run",
                           "not shown dominant and inert in every swept run")
    return ok, text


def _coverage_gaps(labels: list[str], sweeps: list[SweepResult], moved: list) -> list[str]:
    """The swept runs whose sweep leaves out a moving group, or whose movement shares are unrecorded."""
    gaps = []
    for label, sw, m in zip(labels, sweeps, moved):
        if m is None:
            gaps.append(f"{label}: movement shares not recorded, so whether every moving group was swept is unknown")
        elif left := unswept(sw, m):
            out = ", ".join(f"{g} ({100 * x:.1f}% of the movement)" for g, x in left.items())
            gaps.append(f"{label}: the sweep leaves out {out}")
    return gaps


# ---------------------------------------------------------------------------------------- finding 4


FINDING_4 = "Late-layer effective rank tracks capability in both directions (at 4B; at 8B the two come apart)."


def finding_4(coupling: CouplingResult | None, *, runs: Sequence[RLRun] = (), sft_decoy: bool = False,
              missing: str = "no coupling result",
              kl_from_sft: Mapping[str, tuple[float, float, float]] | None = None) -> Finding:
    """Late-layer effective rank tracks capability in both directions — against success, and against each run's
    behavioural change (KL from its SFT policy) where given.

    ``coupling``: the study's coupling result with its both-directions arrays (None if not computed, and
    ``missing`` says why); ``runs``: the study's runs; ``kl_from_sft``: run name → (KL(π_RL‖π_SFT) per action token
    on the run's own rollouts, low, high), against the same SFT policy the coupling pairs the run with (for a control
    run, :data:`SFT_CONTROL`; ``KLResult.summary("rl")`` of ``graftkit kl``).

    Which runs the both-directions test counts (:func:`counted_runs`). Without ``runs``: the coupling's own counts.
    With ``runs``: only the study's RL runs (the SFT policies, :data:`SFT_CONTROL` included, are coupled policies but
    no runs), each in the direction of its paired verdict against the parent the coupling paired it with
    (``direction_run``). A control run (``suite == "control"``) counts — as improved when it credibly improved —
    only when its pair in the coupling is against its own SFT policy :data:`SFT_CONTROL`: the coupling's
    ``base_rank`` and ``base_success`` rows of the run equal :data:`SFT_CONTROL`'s ``rank`` and ``success`` rows
    (so that policy must be among the coupled ones, and the coupling must pair each run with its recorded parent).
    Against the study's SFT its change would be the decoy's undoing plus training, not a change from its parent,
    so it is left out and the statement names it. When a row the coupling counted is not counted here, the late
    band's counts and verdict are recomputed by :func:`~graftkit.rank.coupling.both_directions` (the coupling's own
    rule) on the stored rank, success and parent rows of the counted runs alone.

    Rule on success: "both directions" is testable when the late band has at least
    :data:`MIN_RUNS_PER_DIRECTION` credibly improved AND credibly degraded counted runs; it then needs the late
    band's Spearman interval (rank vs success across the coupled policies) above zero and its both-directions
    verdict 'tracks in both directions'. Rule on KL (with ``kl_from_sft``): Spearman ρ between |Δ late-band rank|
    (each counted run against its parent, ``delta_rank_band``) and KL from SFT across the counted runs that have
    both, with the pairs-bootstrap interval over runs of :func:`~graftkit.stats.correlation_ci` at the coupling's
    level, resamples and seed (what the coupling itself uses); "tracks behavioural change" when that interval lies
    above 0 (fewer than 3 such runs, or a constant column: not measured).

    Verdict (:func:`_combine`): fewer counted runs in a direction → not testable here (the KL result is still
    stated); else reproduced when the success correlation, the both-directions verdict and (when ``kl_from_sft`` is
    given) the KL correlation all hold, partly reproduced when some hold, not reproduced when none; a KL
    correlation that cannot be computed keeps it from reproduced. No coupling result, no late band or no
    both-directions arrays → not measured. Estimate: the late band's Spearman ρ of rank vs success.
    """
    if coupling is None:
        return _unmeasured(4, FINDING_4, missing)
    res = coupling
    if "late" not in res.bands:
        return _unmeasured(4, FINDING_4, "the model has no late layer band")
    b = res.bands.index("late")
    rho = res.corr("band")[b, res.stats.index("spearman")]
    used = [r for r in runs if r.name in res.runs]
    estimate = (float(rho[0]), float(rho[1]), float(rho[2]))
    text = (f"late-band activation {res.metric} vs greedy success across {len(res.runs)} policies: Spearman ρ "
            f"{rho[0]:+.2f} [{rho[1]:+.2f}, {rho[2]:+.2f}]")
    if not res.has_both:
        text += ("; the both-directions test was not computed"
                 + ("" if kl_from_sft is None else ", nor Δrank against KL from SFT (it needs each run's Δrank)") + ".")
        return Finding(4, FINDING_4, text + decoy_note(used, sft_decoy), *estimate, NOT_MEASURED)
    counted, left_out = counted_runs(res, runs)
    direction = _direction(res)
    # the coupling's own counts hold unless it counted a row that is not counted here (a policy that is no run of
    # the study, a control run paired with the wrong SFT)
    recount = any(d in DIRECTIONS for i, d in enumerate(direction) if i not in counted)
    agree, total, verdict_band = _late_both(res, counted, b, recount=recount)
    up, down = DIRECTIONS.index("improved"), DIRECTIONS.index("degraded")
    n_up, n_down = int(total[up]), int(total[down])
    n_ctrl = sum(1 for i in counted if direction[i] == "improved"
                 and any(r.name == res.runs[i] and r.suite == CONTROL for r in runs))
    text += (f"; {n_up} credibly improved" + (f" ({n_ctrl} of them control runs, against {SFT_CONTROL})" if n_ctrl else "")
             + f" and {n_down} credibly degraded runs (the test needs {MIN_RUNS_PER_DIRECTION} of each: with fewer, "
             "even full agreement is not credible)")
    if left_out:
        text += (f"; left out, as the coupling paired them with another policy than their own SFT ({SFT_CONTROL}): "
                 f"{', '.join(left_out)}")
    kl_ok, kl_text = _kl_tracking(res, counted, b, kl_from_sft)
    kl_text = f" On KL: {kl_text}." if kl_text else ""
    if min(n_up, n_down) < MIN_RUNS_PER_DIRECTION:
        return Finding(4, FINDING_4, text + "." + kl_text + decoy_note(used, sft_decoy), *estimate, NOT_TESTABLE)
    text += (f"; sign of Δrank agrees with Δsuccess in {int(agree[up])}/{n_up} improved and {int(agree[down])}/"
             f"{n_down} degraded runs ({verdict_band}).")
    checks = [bool(rho[1] > 0), verdict_band == TRACKS_BOTH] + ([kl_ok] if kl_from_sft is not None else [])
    return Finding(4, FINDING_4, text + kl_text + decoy_note(used, sft_decoy), *estimate, _combine(checks))


def _both_array(res: CouplingResult, name: str) -> np.ndarray:
    """A per-run both-directions array of the coupling (``base_rank``, ``direction_run`` ...), under its
    clash-prefixed name too."""
    for key in (name, f"both_{name}"):
        if res.has(key):
            return np.asarray(res.result[key])
    raise GraftkitError(f"the coupling result has no {name} array", "compute the coupling again with `graftkit couple`")


def _direction(res: CouplingResult) -> list[str]:
    """Each coupled policy's direction against its parent: improved, degraded, or why it is excluded."""
    return [str(d) for d in _both_array(res, "direction_run")]


def _paired_with(res: CouplingResult, row: int, parent: str) -> bool:
    """Whether the coupling paired row ``row`` with policy ``parent``: its parent rank and success rows are that
    policy's own (copies of them, so equal exactly)."""
    if parent not in res.runs:
        return False
    j = res.runs.index(parent)
    rank = np.asarray(res.result["rank"], dtype=np.float64)
    return bool(np.array_equal(_both_array(res, "base_rank")[row].astype(np.float64), rank[j], equal_nan=True)
                and float(_both_array(res, "base_success")[row]) == float(res.success[j]))


def counted_runs(res: CouplingResult, runs: Sequence[RLRun]) -> tuple[list[int], list[str]]:
    """The coupling's rows the both-directions test counts (:func:`finding_4`'s docstring), and the control runs
    left out because the coupling paired them with another policy than :data:`SFT_CONTROL`. Without ``runs``:
    every row (the coupling's own counts)."""
    if not runs:
        return list(range(len(res.runs))), []
    study = {r.name: r for r in runs}
    counted, left_out = [], []
    for i, name in enumerate(res.runs):
        run = study.get(name)
        if run is None:
            continue
        if run.suite == CONTROL and not _paired_with(res, i, SFT_CONTROL):
            left_out.append(name)
            continue
        counted.append(i)
    return counted, left_out


def _late_both(res: CouplingResult, rows: list[int], b: int, *, recount: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """(agree [direction], total [direction], verdict) of the late band (index ``b``): the coupling's own, or with
    ``recount`` those of :func:`~graftkit.rank.coupling.both_directions` on ``rows`` alone."""
    if not recount:
        return res.both("agree", "band")[b], res.both("total", "band")[b], str(res.both("verdict", "band")[b])
    if not rows:
        return np.zeros(len(DIRECTIONS), np.int64), np.zeros(len(DIRECTIONS), np.int64), TOO_FEW
    direction = _direction(res)
    verdicts = [BETTER if direction[i] == "improved" else WORSE if direction[i] == "degraded" else "excluded"
                for i in rows]
    bd = both_directions(np.asarray(res.result["rank"], dtype=np.float64)[rows], res.success[rows],
                         _both_array(res, "base_rank")[rows].astype(np.float64),
                         _both_array(res, "base_success")[rows].astype(np.float64), verdicts, res.level,
                         runs=[res.runs[i] for i in rows], layers=res.layers, n_layers=res.n_layers)
    late = [str(x) for x in bd.coords["band"]].index("late")
    return np.asarray(bd["agree_band"])[late], np.asarray(bd["total_band"])[late], str(bd["verdict_band"][late])


def _kl_tracking(res: CouplingResult, rows: list[int], b: int,
                 kl_from_sft: Mapping[str, tuple[float, float, float]] | None) -> tuple[bool | None, str]:
    """Finding 4's rule on KL (:func:`finding_4`'s docstring): (tracks, or None when not measured; its words, ''
    when no KL was given)."""
    if kl_from_sft is None:
        return None, ""
    delta = _both_array(res, "delta_rank_band")[:, b].astype(np.float64)
    use = [i for i in rows if res.runs[i] in kl_from_sft and np.isfinite(delta[i])
           and np.isfinite(float(kl_from_sft[res.runs[i]][0]))]
    how = f"Spearman ρ of |Δ late-band {res.metric}| (each run against its SFT parent) vs KL(π_RL‖π_SFT) per token"
    if len(use) < 3:
        return None, f"{how}: {len(use)} run(s) with both (a correlation needs 3), so not measured"
    x = np.abs(delta[use])
    y = np.array([float(kl_from_sft[res.runs[i]][0]) for i in use])
    try:
        ci = correlation_ci(x, y, method="spearman", level=res.level, n_boot=int(res.attrs.get("n_boot", 10_000)),
                            seed=int(res.attrs.get("seed", 0)))
    except GraftkitError as e:
        return None, f"{how} across {len(use)} runs is undefined ({e.what}), so not measured"
    tracks = bool(ci.low > 0)
    return tracks, (f"{how} across {len(use)} runs: {ci.estimate:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] — "
                    + ("tracks behavioural change" if tracks else "does not credibly track behavioural change"))


# ------------------------------------------------------------------------------------------ results


def findings_result(findings: list[Finding], cfg) -> Result:
    """The findings as a labelled result; ``cfg`` (the study's config) is its provenance."""
    # the numbered findings in order, then named rows (the positive control)
    f = sorted(findings, key=lambda x: (0, x.number, "") if isinstance(x.number, int) else (1, 0, str(x.number)))
    arr = lambda key, dt=float: np.array([getattr(x, key) for x in f], dtype=dt)  # noqa: E731
    return Result(FINDINGS, {"finding": np.array([str(x.number) for x in f], dtype=object)},
                  {"claim": (("finding",), arr("claim", object)), "statement": (("finding",), arr("statement", object)),
                   "estimate": (("finding",), arr("estimate")), "low": (("finding",), arr("low")),
                   "high": (("finding",), arr("high")), "verdict": (("finding",), arr("verdict", object))},
                  {"config": cfg.as_dict(),
                   "interval": "95%: one run vs SFT, paired bootstrap over evaluation clusters (items, else seeds); "
                               "a regime, hierarchical bootstrap over its runs, then clusters within each run",
                   "verdicts": list(VERDICTS),
                   "units": "estimate/low/high: success-rate difference (fraction) unless the statement says otherwise"})


@dataclass(frozen=True)
class FindingsResult(View):
    """A ``findings`` result read by name: the findings in order, whether they state their claims (results
    written before claims were stored do not), and the notes on units and intervals."""

    KINDS = (FINDINGS,)
    PRODUCER = "graftkit demo"

    @property
    def has_claim(self) -> bool:
        return "claim" in self.result.data

    @property
    def findings(self) -> tuple[Finding, ...]:
        res, ids = self.result, [str(f) for f in self.result.coords["finding"]]
        col = {k: (list(res[k]) if k in res.data else [default] * len(ids))
               for k, default in (("claim", ""), ("statement", ""), ("estimate", np.nan), ("low", np.nan),
                                  ("high", np.nan), ("verdict", ""))}
        return tuple(Finding(int(n) if n.isdigit() else n, str(col["claim"][i]), str(col["statement"][i]),
                             float(col["estimate"][i]), float(col["low"][i]), float(col["high"][i]),
                             str(col["verdict"][i])) for i, n in enumerate(ids))

    @property
    def notes(self) -> str:
        return "; ".join(str(self.result.attrs[k]) for k in ("units", "interval")
                         if isinstance(self.result.attrs.get(k), str))
