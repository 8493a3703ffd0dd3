"""The four findings' rules and the positive control on planted outcomes, each of their verdicts (finding 3 on
success and on KL, finding 4 against success and against KL from SFT), and the findings result's view.

Outcomes are planted through the classes the study writes (eval and headroom results, graft sweeps with their KL
arrays, the coupling result). Every model of a test plays the same episodes and meets them in one fixed order per
task, so a model with a higher planted rate succeeds on a superset of the episodes (changes are exact); a planted
KL fraction is exact too (the per-episode noise around it sums to zero)."""

from __future__ import annotations

import numpy as np
import pytest

from graftkit.agent.evaluate import EvalOutcome
from graftkit.agent.rollout import Decode
from graftkit.core.errors import GraftkitError
from graftkit.evaluation.commands import EvalResult, eval_result
from graftkit.study.findings import (
    CONTROL_FAILS, CONTROL_LEARNS, CONTROL_MIN_SHARE, CONTROL_UNDECIDED, KL_INERT_MARGIN, MIN_RUNS_PER_DIRECTION,
    NOT_MEASURED, NOT_REPRODUCED, NOT_TESTABLE, PARTLY, REPRODUCED, VERDICTS, Finding, FindingsResult, RLRun,
    control_learnt, control_note, finding_1, finding_2, finding_3, finding_4, finding_control, findings_result,
    suite_episodes,
)
from graftkit.graft.experiments import BASE_LABEL, RL_LABEL, SweepResult, expand_sweep, label_for, sweep_result
from graftkit.graft.kl import SweepKL
from graftkit.rank.coupling import CouplingResult, both_directions, coupling, coupling_result
from graftkit.stats import BETTER, NO_CHANGE, WORSE, wilson_interval
from graftkit.results.layout import SFT_CONTROL
from graftkit.results.store import Result, read_result, write_result
from graftkit.study.design import SUITES
from graftkit.study.pipeline import StudyConfig

S, E = 25, 8
#: The suites the rules are planted on, fixed here so the planted outcomes do not depend on the shipped suites.
MASTERED, HEADROOM = ("enter-text", "click-tab", "click-checkboxes"), ("click-button", "click-link")
CONTROL_TASKS = (MASTERED[1],)  # the control suite: a mastered task under a planted position bias
TASKS = [*MASTERED, *HEADROOM]


@pytest.fixture(autouse=True)
def planted_suites(monkeypatch):
    monkeypatch.setitem(SUITES, "mastered", MASTERED)
    monkeypatch.setitem(SUITES, "headroom", HEADROOM)
    monkeypatch.setitem(SUITES, "control", CONTROL_TASKS)


# ------------------------------------------------------------------------------------------ planting


#: Per task, the fixed order in which episodes succeed as a model's rate rises (shared by every model).
_ORDER = np.stack([np.random.default_rng(i).permutation(S * E).reshape(S, E) for i in range(len(TASKS))])


def planted(rates, default: float = 0.5) -> np.ndarray:
    """success [task, seed, episode]: task t succeeds on exactly round(rate_t · S·E) episodes."""
    k = np.array([round(min(1.0, max(0.0, rates.get(t, default))) * S * E) for t in TASKS])
    return (_ORDER < k[:, None, None]).astype(np.int8)


def items(n: int) -> np.ndarray:
    """item [task, seed, episode]: ``n`` distinct first observations per task, repeating across seeds."""
    return np.array([[[f"{(s * E + e) % n:016x}" for e in range(E)] for s in range(S)] for _ in TASKS], dtype=object)


def eval_of(rates, name: str = "m", item: np.ndarray | None = None, tasks=TASKS) -> Result:
    keep = [TASKS.index(t) for t in tasks]
    success = planted(rates)[keep][..., None]
    z = np.zeros(success.shape)
    o = EvalOutcome(list(tasks), list(range(S)), E, 1, Decode(greedy=True), success, z, z.astype(np.int32),
                    z.astype(np.int32), 1.0, item=None if item is None else item[keep])
    return eval_result(o, {"path": f"/runs/x/{name}"})


def study(sft: dict, runs: dict[str, tuple[str, str, dict]], decoys=(), **eval_kw):
    """evals and RLRuns: ``runs[name] = (suite, regime, rates)``, rates as changes from ``sft``'s."""
    evals, out = {"sft": eval_of(sft, "sft", **eval_kw)}, []
    for i, (name, (suite, regime, change)) in enumerate(runs.items()):
        out.append(RLRun(name, suite, regime, 1e-3, i, decoy=name in decoys))
        evals[name] = eval_of({t: sft.get(t, 0.5) + change.get(t, 0.0) for t in TASKS}, name, **eval_kw)
    return evals, out


def mastered_grid(changes: dict[str, list[float]], extra: dict[str, tuple[str, float]] | None = None):
    """Runs ``<regime>-s<i>`` on the mastered suite with the given changes on every mastered task, plus
    ``extra[name] = (regime, change)`` (runs of the grid's other axes)."""
    named = [(f"{g}-s{i}", g, d) for g, ds in changes.items() for i, d in enumerate(ds)]
    named += [(n, g, d) for n, (g, d) in (extra or {}).items()]
    return {n: ("mastered", g, {t: d for t in MASTERED}) for n, g, d in named}


def headroom_of(greedy: float, sampled: float, k: int = 4) -> Result:
    g = planted({t: greedy for t in TASKS})[..., None]
    s = np.concatenate([planted({t: sampled for t in TASKS})[..., None]] * k, axis=-1)
    coords = {"task": np.array(TASKS, dtype=object), "seed": np.arange(S), "episode": np.arange(E),
              "sample": np.arange(k), "greedy_sample": np.arange(1)}
    return Result("headroom", coords, {"success": (("task", "seed", "episode", "sample"), s),
                                       "greedy_success": (("task", "seed", "episode", "greedy_sample"), g)}, {})


SFT = {t: 0.90 for t in MASTERED} | {t: 0.30 for t in HEADROOM}
GRID = {"null": [0.0, 0.0, -0.01], "degrade": [-0.30, -0.25, -0.35], "collapse": [-0.85, -0.80, -0.90]}


# ----------------------------------------------------------------------------------------- finding 1


def test_finding_1_reproduced_when_no_run_improves_and_regimes_degrade_then_collapse():
    evals, runs = study(SFT, mastered_grid(GRID, {"kl0.1-s0": ("degrade", -0.3)}))
    f = finding_1(evals, runs)
    assert f.verdict == REPRODUCED, f.statement
    assert f.low <= f.estimate <= f.high and f.high < 0.05
    assert "90.0%" in f.statement and "0/10 GRPO runs credibly improve" in f.statement
    assert "smallest improvement this evaluation detects" in f.statement
    assert "degrade: " in f.statement and "over 4 runs" in f.statement  # the KL run counts in its regime
    assert "outside" not in f.statement and "decoys" not in f.statement


def test_finding_1_not_reproduced_when_any_run_of_the_grid_improves():
    evals, runs = study(SFT, mastered_grid(GRID, {"clip-s0": ("null", 0.08)}))
    f = finding_1(evals, runs)
    assert f.verdict == NOT_REPRODUCED and f.low > 0 and "best, clip-s0" in f.statement


@pytest.mark.parametrize("changes, verdict", [
    ({"degrade": [-0.30, -0.25, -0.35], "collapse": [-0.30, -0.30, -0.35]}, PARTLY),   # collapse only degrades
    ({"degrade": [-0.80, -0.85, -0.80], "collapse": [-0.85, -0.80, -0.90]}, PARTLY),   # degrade collapses too
    ({"degrade": [-0.30, -0.25, -0.35], "collapse": [-0.90, -0.10, -0.10]}, PARTLY),   # one run collapsed, not all
    ({"degrade": [0.0, 0.0, 0.0], "collapse": [0.0, -0.01, 0.0]}, NOT_REPRODUCED),      # neither
    ({"null": [0.0, 0.0]}, NOT_REPRODUCED),                                             # no degrade or collapse run
])
def test_finding_1_judges_each_regime_on_the_mean_of_all_its_runs(changes, verdict):
    evals, runs = study(SFT, mastered_grid(changes))
    f = finding_1(evals, runs)
    assert f.verdict == verdict, f.statement


def test_finding_1_regime_mean_not_worst_run_decides_collapse():
    evals, runs = study(SFT, mastered_grid({"degrade": [-0.3] * 3, "collapse": [-0.90, -0.10, -0.10]}))
    f = finding_1(evals, runs)
    assert f.verdict == PARTLY and "collapse: -36.7 points" in f.statement and "mean success 53.3%" in f.statement


@pytest.mark.parametrize("rate, verdict, says", [
    (1.0, NOT_TESTABLE, "cannot be improved"),
    ((S * E - 1) / (S * E), NOT_TESTABLE, "could not detect"),
    (0.80, REPRODUCED, "outside the 90–97%"),
])
def test_finding_1_states_the_baseline_and_what_the_design_could_detect(rate, verdict, says):
    evals, runs = study({t: rate for t in MASTERED}, mastered_grid(
        {"null": [0.0] * 3, "degrade": [-0.3 * rate] * 3, "collapse": [-0.9 * rate] * 3}))
    f = finding_1(evals, runs)
    assert f.verdict == verdict and says in f.statement, f.statement


def test_finding_1_not_measured_without_mastered_runs_and_refuses_other_episodes():
    evals, runs = study(SFT, {"headroom-s0": ("headroom", "headroom", {})})
    assert finding_1(evals, runs).verdict == NOT_MEASURED
    evals, runs = study(SFT, mastered_grid(GRID))
    shape = (len(TASKS), S - 1, E, 1)  # one seed fewer: not the SFT policy's episodes
    other = eval_result(EvalOutcome(TASKS, list(range(S - 1)), E, 1, Decode(greedy=True), np.ones(shape, np.int8),
                                    *(np.zeros(shape),) * 3, 1.0), {"path": "/x"})
    evals["null-s0"] = other
    with pytest.raises(GraftkitError, match="null-s0"):
        finding_1(evals, runs)


def test_findings_name_runs_trained_with_decoys():
    runs_ = mastered_grid(GRID) | {"headroom-s0": ("headroom", "headroom", {t: 0.4 for t in HEADROOM})}
    evals, runs = study(SFT, runs_, decoys=("degrade-s1",))
    assert "Trained with decoys (planted headroom): degrade-s1." in finding_1(evals, runs).statement
    f2 = finding_2(evals, runs, headroom_of(0.3, 0.6), sft_decoy=True)
    assert "Trained with decoys (planted headroom): the SFT policy, degrade-s1." in f2.statement
    evals, runs = study(SFT, runs_)
    assert "decoys" not in finding_1(evals, runs).statement


# ----------------------------------------------------------------------------------------- finding 2


def _f2_runs(gain: float, control: float, side: float = 0.0, n_control: int = 3):
    runs = {f"headroom-s{i}": ("headroom", "headroom", {t: gain for t in HEADROOM} | {t: side for t in MASTERED})
            for i in range(3)}
    runs |= {f"degrade-s{i}": ("mastered", "degrade", {t: control for t in HEADROOM} | {t: -0.3 for t in MASTERED})
             for i in range(n_control)}
    return study(SFT, runs)


@pytest.mark.parametrize("gain, control, n_control, verdict", [
    (0.4, 0.0, 3, REPRODUCED),
    (0.4, 0.4, 3, PARTLY),        # the control gains as much: not specific to training on the suite
    (0.4, 0.0, 0, PARTLY),        # no control run to compare with
    (0.0, 0.0, 3, NOT_REPRODUCED),
])
def test_finding_2_needs_a_credible_gain_beyond_the_control(gain, control, n_control, verdict):
    evals, runs = _f2_runs(gain, control, side=-0.2, n_control=n_control)
    f = finding_2(evals, runs, headroom_of(0.3, 0.6))
    assert f.verdict == verdict, f.statement
    assert (f.low > 0) == (gain > 0)
    assert "mastered suite's by -20.0 points" in f.statement and "(side effect)" in f.statement
    if n_control:
        assert f"on the headroom suite: {100 * control:+.1f} points" in f.statement


def test_finding_2_not_testable_without_headroom_and_not_measured_without_its_inputs():
    evals, runs = _f2_runs(0.4, 0.0)
    f = finding_2(evals, runs, headroom_of(0.3, 0.3))
    assert f.verdict == NOT_TESTABLE and "no credible headroom" in f.statement
    assert finding_2(evals, runs, None).verdict == NOT_MEASURED
    assert finding_2(evals, [r for r in runs if r.suite != "headroom"], headroom_of(0.3, 0.6)).verdict == NOT_MEASURED


# ---------------------------------------------------------------------------------- positive control


def control_study(rate: float, changes: list[float], with_sft_control: bool = True):
    """The study's SFT and runs plus the positive control: ``sft-control`` at greedy ``rate`` on the control task
    (SFT's elsewhere) and runs ``control-s<i>`` changing it by ``changes[i]`` (decoy runs, as the pipeline sets)."""
    evals, runs = study(SFT, {})
    if with_sft_control:
        evals[SFT_CONTROL] = eval_of(SFT | {CONTROL_TASKS[0]: rate}, SFT_CONTROL)
    for i, d in enumerate(changes):
        runs.append(RLRun(f"control-s{i}", "control", "control", 3e-4, i, decoy=True))
        evals[f"control-s{i}"] = eval_of(SFT | {CONTROL_TASKS[0]: rate + d}, f"control-s{i}")
    return evals, runs


@pytest.mark.parametrize("changes, verdict", [
    ([0.40, 0.35, 0.45], CONTROL_LEARNS),
    ([0.0, 0.0, -0.01], CONTROL_FAILS),
    ([-0.20, -0.25, -0.15], CONTROL_FAILS),  # unlearning is no learning
    ([0.60, -0.30, 0.50], CONTROL_UNDECIDED),  # the runs disagree: the interval spans 0 and a gain of half the room
])
def test_finding_control_learns_only_on_a_credible_gain_over_its_own_sft(changes, verdict):
    evals, runs = control_study(0.30, changes)
    f = finding_control(evals, runs)
    assert f.number == "control" and f.verdict == verdict, f.statement
    assert control_learnt(f) is {CONTROL_LEARNS: True, CONTROL_FAILS: False, CONTROL_UNDECIDED: None}[verdict]
    assert f.estimate == pytest.approx(np.mean(changes), abs=0.01) and (f.low > 0) == (verdict == CONTROL_LEARNS)
    least = CONTROL_MIN_SHARE * (1 - 0.30)  # half the room the bias leaves: 35 points
    assert (f.high < least) == (verdict == CONTROL_FAILS), (f.low, f.high)
    assert "does not learn when it rules out a gain of 35.0 points (50% of the room the bias leaves)" in f.statement
    assert (": it is undecided, the interval spans 0 and reaches that gain" if verdict == CONTROL_UNDECIDED
            else f": it {verdict}.") in f.statement
    cited = control_note(f, "no change")  # how findings 1 and 2 cite it
    assert cited.startswith({CONTROL_LEARNS: " The pipeline's positive control learns (",
                             CONTROL_FAILS: " The pipeline's own positive control does not learn (",
                             CONTROL_UNDECIDED: " The pipeline's positive control is undecided, so whether this "
                                                "pipeline can learn is not shown."}[verdict]), cited
    assert f"{SFT_CONTROL}, the control's SFT policy" in f.statement and "planted position bias, a decoy" in f.statement
    assert "30.0%" in f.statement and "the study's SFT policy 90.0%" in f.statement and "over 3 runs" in f.statement
    assert "Trained with decoys (planted headroom): control-s0, control-s1, control-s2 (the positive control's runs, "\
           f"trained from {SFT_CONTROL}" in f.statement


def test_finding_control_not_testable_at_a_ceiling_and_not_measured_without_its_inputs():
    evals, runs = control_study(1.0, [0.0, 0.0])
    f = finding_control(evals, runs)
    assert f.verdict == NOT_TESTABLE and "nothing to raise" in f.statement and control_learnt(f) is None
    evals, runs = control_study(0.3, [])
    assert finding_control(evals, runs).verdict == NOT_MEASURED  # no control run
    evals, runs = control_study(0.3, [0.4, 0.4], with_sft_control=False)
    f = finding_control(evals, runs)
    assert f.verdict == NOT_MEASURED and SFT_CONTROL in f.statement and control_learnt(f) is None
    assert control_learnt(None) is None
    # control runs are named as decoy-trained whatever their flag: they start from the biased SFT
    evals, runs = control_study(0.3, [0.4])
    plain = [RLRun(r.name, r.suite, r.regime, r.lr, r.seed) for r in runs]
    assert "control-s0 (the positive control's runs" in finding_control(evals, plain).statement


def test_findings_1_and_2_cite_the_positive_control():
    ctrl_evals, ctrl_runs = control_study(0.30, [0.0, 0.0, -0.01])
    fails = finding_control(ctrl_evals, ctrl_runs)
    learns = finding_control(*control_study(0.30, [0.4, 0.4, 0.4]))
    evals, runs = _f2_runs(0.0, 0.0)
    f = finding_2(evals, runs, headroom_of(0.3, 0.6), control=fails)
    assert f.verdict == NOT_REPRODUCED and "own positive control does not learn" in f.statement, f.statement
    assert "so a gain that is not credible says nothing about GRPO" in f.statement
    f = finding_2(evals, runs, headroom_of(0.3, 0.6), control=learns)
    assert f.verdict == NOT_REPRODUCED and "positive control learns (+40.0 points" in f.statement
    assert "positive control" not in finding_2(evals, runs, headroom_of(0.3, 0.6)).statement
    evals, runs = study(SFT, mastered_grid(GRID))
    f = finding_1(evals, runs, control=fails)
    assert f.verdict == REPRODUCED and "so 'no run improves' says nothing about GRPO" in f.statement, f.statement


# ----------------------------------------------------------------------------------------- finding 3

GROUPS4 = ("embed", "attn", "mlp", "norm")
SW_S, SW_E = 25, 4


def sweep_of(effect, groups=GROUPS4, present=GROUPS4, *, name="degrade-s0", movement=None, base=0.95,
             kind="factorial", full=False, kl=None, metric=None) -> SweepResult:
    """A graft sweep of run ``name`` whose configuration S succeeds at ``base + effect(S)`` on every task
    (``full``: with the comparisons and attribution the study's sweeps store; the rules read neither); with ``kl``
    (S → planted fraction of the behavioural change) also scored by KL (:func:`planted_kl`), ``metric`` "both",
    or "kl" for a sweep scored by KL alone."""
    exps = expand_sweep(kind, groups, present)
    order = np.random.default_rng(1).permutation(len(MASTERED) * SW_S * SW_E).reshape(len(MASTERED), SW_S, SW_E)

    def outcomes(gs):
        return (order < round((base + effect(frozenset(gs))) * order.size)).astype(np.int8)

    metric = metric or ("both" if kl is not None else "success")
    success = {e.label: outcomes(e.groups) for e in exps} if metric != "kl" else {}
    share = {"embed": 0.8, "attn": 0.1, "mlp": 0.08, "norm": 0.02} if movement is None else movement
    res = sweep_result(kind, exps, success, MASTERED, range(SW_S), SW_E, groups, movement_share=share,
                       attrs={"rl_label": name}, n_boot=200, compare_configs=full, metric=metric,
                       kl=None if kl is None else planted_kl(exps, kl))
    return SweepResult.from_result(res)


def planted_kl(exps, fraction, noise: float = 0.2) -> SweepKL:
    """Per-episode KL whose reproduced fractions are exactly ``fraction(S)`` on both sides (0 at ∅, 1 at the full
    graft): on RL's rollouts K_e(π_RL‖π_S) = (1 − f(S))·d_e·(1 + noise·u_e), on SFT's K_e(π_SFT‖π_S) = f(S)·d'_e·(1 +
    noise·u'_e), with the references d, d' > 0 and each configuration's own noise u centred so that Σ_e d_e·u_e = 0."""
    rng = np.random.default_rng(5)
    shape = (len(MASTERED), SW_S, SW_E)
    ref = {side: rng.gamma(4.0, 0.5, shape) for side in ("rl", "sft")}

    def wobble(d):
        u = rng.uniform(-1, 1, shape)
        return 1 + noise * (u - (d * u).sum() / d.sum())

    kl = np.zeros((len(exps), 2, *shape))
    for i, e in enumerate(exps):
        f = 0.0 if e.role == "base" else 1.0 if e.role == "rl" else fraction(frozenset(e.groups))
        if e.role != "rl":
            kl[i, 0] = (1 - f) * ref["rl"] * (wobble(ref["rl"]) if e.role == "graft" else 1)
        if e.role != "base":
            kl[i, 1] = f * ref["sft"] * (wobble(ref["sft"]) if e.role == "graft" else 1)
    items = np.array([[[f"{s:04x}{k}" for k in range(SW_E)] for s in range(SW_S)]] * len(MASTERED), dtype=object)
    return SweepKL(tuple(e.label for e in exps), BASE_LABEL, RL_LABEL, MASTERED, tuple(range(SW_S)), SW_E, kl,
                   np.full((2, *shape), 6), items, np.ones((2, *shape), np.int8), {}, 0)


def attn_mlp(s):
    return -0.15 * ("attn" in s) - 0.15 * ("mlp" in s)


def spread(s):
    return -0.8 if len(s & set(GROUPS4)) >= 3 else 0.0


def test_finding_3_reproduced_on_a_planted_double_dissociation():
    f = finding_3([sweep_of(attn_mlp, full=True), sweep_of(attn_mlp, name="degrade-s1")],
                  [sweep_of(spread, name="collapse-s0")])
    assert f.verdict == REPRODUCED, f.statement
    assert f.estimate == pytest.approx(-0.3, abs=0.01) and f.high < 0
    assert "100% of it" in f.statement and "leaves 0%" in f.statement and "localised to attn+mlp" in f.statement
    assert "not traceable to a single group" in f.statement and "dominant yet inert" in f.statement
    assert "2 swept runs" in f.statement


@pytest.mark.parametrize("degrade, collapse, verdict, says", [
    (lambda s: -0.3 * ("norm" in s), spread, PARTLY, "not localised to attn+mlp"),
    # sufficient but not necessary: norm alone does the same, so reverting attn+mlp leaves all of it
    (lambda s: -0.3 if {"attn", "mlp"} <= s or "norm" in s else 0.0, spread, PARTLY, "leaves 100%"),
    (attn_mlp, lambda s: -0.8 * ("mlp" in s), PARTLY, "traceable to a single group"),
    # reverting embed alone would undo the collapse: embed is necessary
    (attn_mlp, lambda s: -0.8 if "embed" in s and len(s) >= 2 else 0.0, PARTLY, "traceable to a single group"),
    (lambda s: attn_mlp(s) - 0.1 * ("embed" in s), spread, PARTLY, "not within ±2"),
    (lambda s: -0.3 * ("norm" in s) - 0.1 * ("embed" in s), lambda s: -0.8 * ("mlp" in s), NOT_REPRODUCED, ""),
    # nothing changed: nothing to localise or trace (the embed graft is still inert)
    (lambda s: 0.0, lambda s: 0.0, PARTLY, "no credible change to localise"),
])
def test_finding_3_each_sub_rule_can_fail(degrade, collapse, verdict, says):
    f = finding_3([sweep_of(degrade)], [sweep_of(collapse, name="collapse-s0")])
    assert f.verdict == verdict and says in f.statement, f.statement


def test_finding_3_the_embedding_must_dominate_the_movement_of_every_swept_run():
    odd = {"embed": 0.3, "attn": 0.5, "mlp": 0.18, "norm": 0.02}
    f = finding_3([sweep_of(attn_mlp), sweep_of(attn_mlp, name="degrade-s1", movement=odd)],
                  [sweep_of(spread, name="collapse-s0")])
    assert f.verdict == PARTLY and "1/2 degrade runs" in f.statement, f.statement


def test_finding_3_judges_the_regime_on_the_mean_over_its_swept_runs():
    weak = lambda s: -0.05 * ("attn" in s) - 0.05 * ("mlp" in s) - 0.2 * ("norm" in s)  # noqa: E731
    alone = finding_3([sweep_of(weak)], [])
    pooled = finding_3([sweep_of(attn_mlp), sweep_of(weak, name="degrade-s1")], [])
    assert "not localised to attn+mlp" in alone.statement and "33% of it" in alone.statement
    assert "localised to attn+mlp —" not in alone.statement
    assert "67% of it" in pooled.statement and "— localised to attn+mlp" in pooled.statement
    assert pooled.verdict == PARTLY  # the collapse regime was not swept


def test_finding_3_an_unswept_moving_group_keeps_it_from_reproduced():
    everything = {"embed": 0.75, "attn": 0.1, "mlp": 0.08, "norm": 0.02, "lm_head": 0.05}
    present = (*GROUPS4, "lm_head")
    sw = [sweep_of(attn_mlp, present=present), sweep_of(spread, present=present, name="collapse-s0")]
    f = finding_3(sw[:1], sw[1:], movement={"degrade-s0": everything, "collapse-s0": everything})
    assert f.verdict == PARTLY and "leaves out lm_head (5.0% of the movement)" in f.statement, f.statement
    # the sweep's own shares: what it does not name is what groups outside it moved
    f = finding_3([sweep_of(attn_mlp, present=present, movement={"embed": 0.8, "attn": 0.1})],
                  [sweep_of(spread, name="collapse-s0")])
    assert f.verdict == PARTLY and "groups outside the sweep (10.0% of the movement)" in f.statement, f.statement


def test_finding_3_with_an_untied_head_in_the_factorial():
    five = (*GROUPS4, "lm_head")
    share = {"embed": 0.75, "attn": 0.1, "mlp": 0.08, "norm": 0.02, "lm_head": 0.05}
    d, c = (sweep_of(fx, groups=five, present=five, name=n, movement=share)
            for fx, n in ((attn_mlp, "degrade-s0"), (lambda s: -0.8 if len(s) >= 4 else 0.0, "collapse-s0")))
    assert label_for(("embed", "norm", "lm_head")) in d.configs  # reverting attn+mlp: every other group
    f = finding_3([d], [c])
    assert f.verdict == REPRODUCED, f.statement


def test_finding_3_not_measured_without_sweeps_and_partly_measured_from_single_grafts():
    assert finding_3([], []).verdict == NOT_MEASURED
    f = finding_3([sweep_of(attn_mlp, kind="single")], [])
    assert f.verdict == PARTLY and "localisation is not measured" in f.statement and "dominant yet inert" in f.statement
    f = finding_3([sweep_of(attn_mlp, kind="single")], [], runs=[RLRun("degrade-s0", "mastered", "degrade", 1e-3, 0,
                                                                        decoy=True)])
    assert "Trained with decoys (planted headroom): degrade-s0." in f.statement


def kl_attn_mlp(s):
    """Behaviour: attn and mlp carry 90% of RL's change, the norms 10%, the embedding none."""
    return 0.45 * ("attn" in s) + 0.45 * ("mlp" in s) + 0.1 * ("norm" in s)


def kl_spread(s):
    """Behaviour: every group carries a quarter, so no single group is sufficient or necessary."""
    return len(s & set(GROUPS4)) / 4


def test_finding_3_reproduced_when_success_and_kl_agree():
    f = finding_3([sweep_of(attn_mlp, kl=kl_attn_mlp), sweep_of(attn_mlp, name="degrade-s1", kl=kl_attn_mlp)],
                  [sweep_of(spread, name="collapse-s0", kl=kl_spread)])
    assert f.verdict == REPRODUCED, f.statement
    assert f.statement.count("holds on both measures") == 3 and "KL not measured" not in f.statement
    assert "degrade-s0: the attn+mlp graft reproduces 90% [" in f.statement  # the planted fractions, exactly
    assert "reverting attn+mlp leaves 10% [" in f.statement and "(SFT side 90%)" in f.statement
    assert "the strongest single-group graft (embed) reproduces 25% [" in f.statement
    assert f"within ±{100 * KL_INERT_MARGIN:.0f}%" in f.statement
    assert "dominant yet behaviourally inert in every swept run" in f.statement


def test_finding_3_without_kl_is_decided_on_success_and_says_kl_was_not_measured():
    f = finding_3([sweep_of(attn_mlp)], [sweep_of(spread, name="collapse-s0")])
    assert f.verdict == REPRODUCED and "KL not measured" in f.statement and "on KL" not in f.statement, f.statement


@pytest.mark.parametrize("degrade, collapse, says", [
    # success localises the degrade regime to attn+mlp, behaviour to the norms
    ((attn_mlp, lambda s: 1.0 * ("norm" in s)), (spread, kl_spread),
     "the measures disagree: it holds on success only"),
    # behaviour localises it to attn+mlp, success to the norms
    ((lambda s: -0.3 * ("norm" in s), kl_attn_mlp), (spread, kl_spread), "the measures disagree: it holds on KL only"),
    # the mlp alone carries the collapse's behaviour
    ((attn_mlp, kl_attn_mlp), (spread, lambda s: 1.0 * ("mlp" in s)), "not shown untraceable in every swept run"),
    # the embed-only graft reproduces a tenth of the behavioural change: not inert on KL
    ((attn_mlp, lambda s: 0.5 * ("attn" in s) + 0.4 * ("mlp" in s) + 0.1 * ("embed" in s)), (spread, kl_spread),
     f"not within ±{100 * KL_INERT_MARGIN:.0f}%"),
])
def test_finding_3_is_partly_reproduced_when_kl_disagrees_with_success(degrade, collapse, says):
    f = finding_3([sweep_of(degrade[0], kl=degrade[1])], [sweep_of(collapse[0], name="collapse-s0", kl=collapse[1])])
    assert f.verdict == PARTLY and says in f.statement, f.statement


def test_finding_3_not_reproduced_when_neither_measure_shows_any_sub_rule():
    f = finding_3([sweep_of(lambda s: -0.3 * ("norm" in s) - 0.1 * ("embed" in s),
                            kl=lambda s: 0.8 * ("norm" in s) + 0.2 * ("embed" in s))],
                  [sweep_of(lambda s: -0.8 * ("mlp" in s), name="collapse-s0", kl=lambda s: 1.0 * ("mlp" in s))])
    assert f.verdict == NOT_REPRODUCED and f.statement.count("holds on neither measure") == 3, f.statement


def test_finding_3_kl_must_hold_in_every_swept_run_and_be_measured_in_all():
    collapse = [sweep_of(spread, name="collapse-s0", kl=kl_spread)]
    one_off = [sweep_of(attn_mlp, kl=kl_attn_mlp), sweep_of(attn_mlp, name="degrade-s1", kl=lambda s: 1.0 * ("norm" in s))]
    f = finding_3(one_off, collapse)
    assert f.verdict == PARTLY and "not shown localised to attn+mlp in every swept run" in f.statement, f.statement
    unscored = [sweep_of(attn_mlp, kl=kl_attn_mlp), sweep_of(attn_mlp, name="degrade-s1")]
    f = finding_3(unscored, collapse)
    assert f.verdict == PARTLY and "not scored by KL with these grafts: degrade-s1" in f.statement, f.statement
    assert "holds on success, not measured on KL" in f.statement


def test_finding_3_reads_a_runs_success_and_kl_sweeps_as_two_files_or_kl_alone():
    two_files = [sweep_of(attn_mlp), sweep_of(attn_mlp, kl=kl_attn_mlp, metric="kl")]
    f = finding_3(two_files, [sweep_of(spread, name="collapse-s0", kl=kl_spread)])
    assert f.verdict == REPRODUCED and "Degrade regime (1 swept run)" in f.statement, f.statement
    f = finding_3(two_files[1:], [sweep_of(spread, name="collapse-s0", kl=kl_spread, metric="kl")])
    assert f.verdict == PARTLY and np.isnan(f.estimate), f.statement  # success not measured: never reproduced
    assert f.statement.count("holds on KL, not measured on success") == 3


# ----------------------------------------------------------------------------------------- finding 4


def coupling_of(success: dict[str, float], rank: dict[str, float], verdicts: dict[str, str], both=True):
    names = ["sft", *success]
    s = np.array([0.6, *success.values()])
    r = np.array([10.0, *rank.values()])
    R = np.stack([r + 0.01 * j for j in range(6)], axis=1)  # [run, layer]
    kw = dict(runs=names, layers=list(range(6)), n_layers=6, conventions={"metric": "erank"})
    corr = coupling(R, s, n_boot=2000, **kw)
    if not both:
        return CouplingResult.from_result(corr)
    bd = both_directions(R, s, R[0], s[0], [NO_CHANGE, *(verdicts[n] for n in success)], **kw)
    return CouplingResult.from_result(coupling_result(corr, bd))


def _grid4(n_up: int, n_down: int, up_rank=+1.0, down_rank=+1.0):
    success = {f"up{i}": 0.65 + 0.04 * i for i in range(n_up)} | {f"down{i}": 0.5 - 0.06 * i for i in range(n_down)}
    rank = {n: 10 + (up_rank if n.startswith("up") else down_rank) * 20 * (s - 0.6) for n, s in success.items()}
    return success, rank, {n: BETTER if n.startswith("up") else WORSE for n in success}


@pytest.mark.parametrize("grid, verdict", [
    (_grid4(5, 5), REPRODUCED),
    (_grid4(4, 8, up_rank=-0.2), PARTLY),         # Δrank has the wrong sign on the improved runs
    (_grid4(5, 5, -1.0, -1.0), NOT_REPRODUCED),   # rank moves against success
    (_grid4(3, 8), NOT_TESTABLE),                 # too few improved runs to show anything
    (_grid4(5, 2), NOT_TESTABLE),
])
def test_finding_4_needs_enough_runs_in_both_directions(grid, verdict):
    f = finding_4(coupling_of(*grid))
    n_up = sum(k.startswith("up") for k in grid[0])
    assert f.verdict == verdict, f.statement
    assert f"{n_up} credibly improved" in f.statement


def test_finding_4_min_runs_is_the_fewest_that_can_agree_credibly():
    n = MIN_RUNS_PER_DIRECTION
    assert wilson_interval(n - 1, n - 1).low <= 0.5 < wilson_interval(n, n).low


def test_finding_4_not_measured_without_coupling_or_both_directions():
    assert finding_4(None).verdict == NOT_MEASURED
    why = finding_4(None, missing="no coupling result: success is constant (1) across runs")
    assert why.verdict == NOT_MEASURED and "success is constant (1)" in why.statement
    assert finding_4(coupling_of(*_grid4(5, 5), both=False)).verdict == NOT_MEASURED
    runs = [RLRun("up0", "headroom", "headroom", 1e-3, 0, decoy=True)]
    assert "up0." in finding_4(coupling_of(*_grid4(5, 5)), runs=runs).statement


def kl_from(success: dict[str, float], tracks: bool = True) -> dict[str, tuple[float, float, float]]:
    """KL(π_RL‖π_SFT) per token of each run: rising with |Δsuccess| (so with |Δ late rank|), or falling with it."""
    out = {}
    for n, s_ in success.items():
        kl = 0.02 + abs(s_ - 0.6) if tracks else 0.01 / (0.01 + abs(s_ - 0.6))
        out[n] = (kl, 0.9 * kl, 1.1 * kl)
    return out


@pytest.mark.parametrize("grid, tracks, verdict, says", [
    (_grid4(5, 5), True, REPRODUCED, "tracks behavioural change"),
    (_grid4(5, 5), False, PARTLY, "does not credibly track behavioural change"),  # rank tracks success, not KL
    (_grid4(5, 5, -1.0, -1.0), True, PARTLY, "tracks behavioural change"),        # KL only: |Δrank| still tracks it
    (_grid4(5, 5, -1.0, -1.0), False, NOT_REPRODUCED, "does not credibly track"),
    (_grid4(3, 8), True, NOT_TESTABLE, "tracks behavioural change"),             # too few improved: KL still stated
])
def test_finding_4_against_success_and_against_kl_from_sft(grid, tracks, verdict, says):
    f = finding_4(coupling_of(*grid), kl_from_sft=kl_from(grid[0], tracks))
    assert f.verdict == verdict and says in f.statement, f.statement
    assert f"across {len(grid[0])} runs" in f.statement and "On KL: Spearman ρ of |Δ late-band erank|" in f.statement


def test_finding_4_kl_with_too_few_runs_is_not_measured_and_keeps_it_from_reproduced():
    grid = _grid4(5, 5)
    f = finding_4(coupling_of(*grid), kl_from_sft=dict(list(kl_from(grid[0]).items())[:2]))
    assert f.verdict == PARTLY and "2 run(s) with both (a correlation needs 3), so not measured" in f.statement
    assert "On KL" not in finding_4(coupling_of(*grid)).statement


def coupling_with_control(control_parent: str):
    """The coupling of SFT, the control's SFT (its own parent SFT: credibly worse, as the decoy made it) and the
    runs: 3 improved and 5 degraded mastered runs against SFT, and 2 control runs that credibly improved against
    ``control_parent`` (their own SFT, or the study's), each paired with it as the coupling records."""
    rows = {"sft": (0.6, 10.0, "sft", "reference (SFT)"), SFT_CONTROL: (0.3, 4.0, "sft", WORSE)}
    rows |= {f"up{i}": (0.65 + 0.04 * i, 11.0 + 0.8 * i, "sft", BETTER) for i in range(3)}
    rows |= {f"down{i}": (0.5 - 0.06 * i, 8.0 - 1.2 * i, "sft", WORSE) for i in range(5)}
    rows |= {f"control-s{i}": (0.7 + 0.05 * i, 12.0 + i, control_parent, BETTER) for i in range(2)}
    names = list(rows)
    s_ = np.array([v[0] for v in rows.values()])
    R = np.stack([np.array([v[1] for v in rows.values()]) + 0.01 * j for j in range(6)], axis=1)  # [run, layer]
    parent = [names.index(v[2]) for v in rows.values()]
    kw = dict(runs=names, layers=list(range(6)), n_layers=6, conventions={"metric": "erank"})
    corr = coupling(R, s_, n_boot=2000, **kw)
    bd = both_directions(R, s_, R[parent], s_[parent], [v[3] for v in rows.values()], **kw)
    runs = [RLRun(n, "control" if n.startswith("control") else "mastered", "control" if n.startswith("control")
                  else "degrade", 1e-3, i, decoy=n.startswith("control")) for i, n in enumerate(names[2:])]
    return CouplingResult.from_result(coupling_result(corr, bd)), runs


def test_finding_4_counts_control_runs_paired_with_their_own_sft():
    res, runs = coupling_with_control(SFT_CONTROL)
    f = finding_4(res, runs=runs)
    assert f.verdict == REPRODUCED, f.statement
    # sft-control is coupled (credibly worse than SFT) but is no run: only the 5 degraded runs count
    assert f"5 credibly improved (2 of them control runs, against {SFT_CONTROL}) and 5 credibly degraded" in f.statement
    assert "control-s0, control-s1 (the positive control's runs" in f.statement


def test_finding_4_leaves_out_control_runs_paired_with_the_studys_sft():
    res, runs = coupling_with_control("sft")
    assert int(res.both("total", "band")[-1][0]) == 5  # the coupling itself counted them improved
    f = finding_4(res, runs=runs)
    assert f.verdict == NOT_TESTABLE and "3 credibly improved and 5 credibly degraded" in f.statement, f.statement
    assert f"the coupling paired them with another policy than their own SFT ({SFT_CONTROL}): control-s0, control-s1" \
        in f.statement
    assert finding_4(res).verdict != NOT_TESTABLE  # without the study's runs: the coupling's own counts


# ------------------------------------------------------------------------------------------- episodes


def test_episodes_cluster_by_item_where_recorded_else_by_seed(tmp_path):
    ev = EvalResult.from_result(eval_of({}))
    seeds = suite_episodes(ev, MASTERED[:2])
    assert seeds.by == "seed" and seeds.n_clusters == S and seeds.outcomes.size == 2 * S * E
    assert (seeds.outcomes == planted({})[:2].ravel()).all() and seeds.clusters[E] == "1"
    by_item = suite_episodes(read_result(write_result(tmp_path / "e.h5", eval_of({}, item=items(5)))), MASTERED[:2])
    assert by_item.by == "item" and by_item.n_clusters == 2 * 5 and by_item.clusters[0] == f"{MASTERED[0]}/{0:016x}"
    with pytest.raises(GraftkitError, match="no-such-task"):
        suite_episodes(ev, ["no-such-task"])


def test_findings_cluster_by_item_and_leave_out_tasks_the_evaluation_lacks():
    evals, runs = study(SFT, mastered_grid(GRID), item=items(7))
    f = finding_1(evals, runs)
    assert f.verdict == REPRODUCED and f"in {len(MASTERED) * 7} item clusters" in f.statement, f.statement
    played = [t for t in TASKS if t != MASTERED[1]]
    evals, runs = study(SFT, mastered_grid(GRID), tasks=played)
    f = finding_1(evals, runs)
    assert f.verdict == REPRODUCED and f"(not in the SFT evaluation): {MASTERED[1]}." in f.statement, f.statement
    assert f"{len(MASTERED[:-1]) * S * E} episodes" in f.statement


# ----------------------------------------------------------------------------------------- the result


def test_findings_view_round_trips(tmp_path):
    found = [Finding("control", "the pipeline learns", "stated", 0.4, 0.3, 0.5, CONTROL_LEARNS),
             Finding(2, "claim two", "stated <b>", 0.1, 0.05, 0.15, "reproduced"),
             Finding(1, "claim one", "stated", -0.2, -0.3, -0.1, "not reproduced")]
    res = findings_result(found, StudyConfig())
    path = write_result(tmp_path / "findings.h5", res)
    view = FindingsResult.from_result(read_result(path))
    assert view.has_claim and view.findings == (found[2], found[1], found[0])  # numbered first, then the control
    assert "paired bootstrap" in view.notes
    assert {CONTROL_LEARNS, CONTROL_FAILS, CONTROL_UNDECIDED} <= set(VERDICTS) and res.attrs["verdicts"] == list(VERDICTS)


def test_finding_3_reads_sweeps_as_written(tmp_path):
    sw = [sweep_of(attn_mlp, full=True), sweep_of(spread, name="collapse-s0", full=True)]
    back = [SweepResult.read(write_result(tmp_path / f"{i}.h5", s.result)) for i, s in enumerate(sw)]
    assert finding_3(back[:1], back[1:]) == finding_3(sw[:1], sw[1:])

