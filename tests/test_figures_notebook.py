"""The notebook figures (figures/notebook.py) are the report's figures: for the results of a run, every
function returns the very figure (same Plotly JSON) that the report's section planner builds, and together
they cover every figure of the report.

The results are the report tests' synthetic run (tests/test_report.py ``write_run``: one or more results
of every kind, with known values).
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import plotly.io as pio
import pytest
from test_report import write_run

import graftkit as gk
from graftkit import figures as F
from graftkit.core.errors import GraftkitError
from graftkit.figures.report import load_run, plan_report
from graftkit.graft.anatomy import DeltaResult
from graftkit.graft.experiments import SweepResult
from graftkit.results.store import Result, read_result, write_result


def _json(fig) -> str:
    return pio.to_json(fig, validate=False)  # what the report writes into its page


def _panels(run: Path) -> list[tuple[str, str]]:
    """(section key, figure JSON) of every figure the report of ``run`` draws."""
    return [(sec.key, _json(p.figure)) for sec in plan_report(load_run(run)) for p in sec.panels]


def _files(run: Path, kind: str) -> list[Path]:
    """The run's results of ``kind`` in the report's order (oldest first)."""
    return [x.path for x in load_run(run) if x.kind == kind]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "study")


def _notebook_figures(run: Path) -> dict[str, list]:
    """Every notebook function called on the run's results, per report section, with default labels."""
    r = run / "results"
    evals = _files(run, "eval")
    train = [x.path for x in load_run(run) if x.kind in ("train-sft", "train-grpo")]
    sweep, delta, coupling = r / "graft-factorial-rl.h5", r / "delta-rl.h5", r / "coupling-weights-erank.h5"
    return {
        "training": [F.training_curves(train, fam) for fam in
                     ("success", "reward", "loss", "kl", "entropy", "clip", "grad_norm")],
        "success": [F.success_rates(evals), F.paired_differences(r / "eval-sft-greedy.h5", [r / "eval-rl-greedy.h5"])],
        "headroom": [F.headroom_rates(r / "headroom-sft.h5"), F.headroom_differences([r / "headroom-sft.h5"])],
        "kl": [F.kl_per_task(r / "kl-rl-vs-sft.h5"), F.kl_top(r / "kl-rl-vs-sft.h5")],
        "anatomy": [F.anatomy_heatmap(delta), F.anatomy_heatmap(delta, metric="rel_delta"), F.top_tensors(delta),
                    F.group_shares(delta)],
        "grafts": [F.graft_effects(sweep), F.attribution(sweep), F.interactions(sweep), F.movement_vs_effect(sweep),
                   F.dissociation(r / "graft-dissociation-rl.h5"), F.kl_reproduced(r / "graft-single-rl-kl.h5"),
                   F.kl_attribution(r / "graft-single-rl-kl.h5")],
        "rank": [F.rank_by_layer(_files(run, kind)) for kind in ("rank-weights", "rank-delta", "rank-activations")],
        "coupling": [F.coupling_by_layer(coupling), F.coupling_scatter(coupling), F.both_directions(coupling)],
        "forgetting": [F.forgetting(r / "forgetting.h5")],
    }


@pytest.mark.slow
def test_every_notebook_figure_is_the_reports_figure(run):
    report = _panels(run)
    ours = _notebook_figures(run)
    for key, figs in ours.items():
        want = [j for k, j in report if k == key]
        got = [_json(f) for f in figs]
        for fig, j in zip(figs, got):
            assert j in want, (key, fig.layout.title.text)
        # …and each section's figures are exactly the report's, no more and no fewer.
        assert Counter(got) == Counter(want), key
    assert {k for k, _ in report} == set(ours)


def test_every_input_form_gives_the_same_figure(run):
    r = run / "results"
    path = r / "delta-rl.h5"
    want = _json(F.anatomy_heatmap(path))
    for form in (str(path), read_result(path), DeltaResult.read(path)):
        assert _json(F.anatomy_heatmap(form)) == want
    assert _json(F.anatomy_heatmap(path, run="rl")) == want
    sweep = r / "graft-factorial-rl.h5"
    assert _json(F.graft_effects(SweepResult.read(sweep))) == _json(F.graft_effects(sweep))
    # A Result in memory has no file: its label is what its attrs name (eval: the model folder) or its kind.
    sft = r / "eval-sft-greedy.h5"
    assert _json(F.success_rates([read_result(sft)])) == _json(F.success_rates(sft))
    assert "graft-sweep" in F.graft_effects(read_result(sweep)).layout.title.text
    # A command's summary dict with a result_file (gk.couple, a model of gk.rank's summary).
    coupling = r / "coupling-weights-erank.h5"
    assert _json(F.coupling_by_layer({"result_file": str(coupling)})) == _json(F.coupling_by_layer(coupling))
    assert gk.figures.success_rates is F.success_rates


def test_labels_shared_within_a_kind_get_the_file_stem_as_in_the_report(tmp_path):
    run = write_run(tmp_path / "r", kinds=("eval", "delta"))
    r = run / "results"
    shutil.copy(r / "eval-sft-greedy.h5", r / "eval-sft-again.h5")
    shutil.copy(r / "delta-rl.h5", r / "delta-rl-again.h5")
    report = dict.fromkeys(j for _, j in _panels(run))
    evals = _files(run, "eval")
    fig = F.success_rates(evals)
    assert _json(fig) in report
    assert sorted(t.name for t in fig.data) == ["rl", "sft · eval-sft-again", "sft · eval-sft-greedy"]
    deltas = _files(run, "delta")
    assert _json(F.group_shares(deltas)) in report
    # One delta result alone is labelled by its run; label= gives the report's label of a two-file run.
    assert _json(F.anatomy_heatmap(deltas[1], label=f"rl · {deltas[1].stem}")) in report
    assert _json(F.anatomy_heatmap(deltas[1])) not in report


def test_labels_override(run):
    r = run / "results"
    fig = F.success_rates([r / "eval-sft-greedy.h5", r / "eval-rl-greedy.h5"], labels=["SFT", "RL"])
    assert [t.name for t in fig.data] == ["SFT", "RL"]
    assert F.coupling_by_layer(r / "coupling-weights-erank.h5", label="mine").layout.title.text.startswith(
        "<b>Rank–success coupling by layer — mine</b>")
    with pytest.raises(GraftkitError, match="one label each"):
        F.success_rates([r / "eval-sft-greedy.h5"], labels=["a", "b"])


def test_bad_input_raises_a_specific_error(run, tmp_path):
    r = run / "results"
    with pytest.raises(GraftkitError, match=r"delta-rl\.h5: a 'delta' result, this figure draws 'eval'") as exc:
        F.success_rates(r / "delta-rl.h5")
    assert "graftkit eval" in exc.value.fix
    with pytest.raises(GraftkitError, match="one kind"):
        F.rank_by_layer([r / "rank-weights-sft.h5", r / "rank-delta-rl.h5"])
    with pytest.raises(GraftkitError, match="no RL run 'nope'"):
        F.anatomy_heatmap(r / "delta-rl.h5", run="nope")
    with pytest.raises(GraftkitError, match="no such curve family"):
        F.training_curves(r / "train-sft-sft.h5", "nope")
    with pytest.raises(GraftkitError, match="no run logged reward"):
        F.training_curves(r / "train-sft-sft.h5", "reward")
    with pytest.raises(GraftkitError, match="not a graftkit result"):
        F.graft_effects(42)
    with pytest.raises(GraftkitError, match=r"graft-factorial-rl\.h5: no KL arrays") as exc:
        F.kl_reproduced(r / "graft-factorial-rl.h5")  # a sweep scored by success alone
    assert "--metric kl or both" in str(exc.value)
    with pytest.raises(GraftkitError, match="nothing to compare"):
        F.kl_by_model(r / "kl-rl-vs-sft.h5")
    with pytest.raises(GraftkitError, match="no kl result with a step dimension"):
        F.kl_over_steps(r / "kl-rl-vs-sft.h5")
    # A figure the report leaves out (its optional arrays missing) raises, naming the file.
    res = read_result(r / "graft-factorial-rl.h5")
    bare = write_result(tmp_path / "bare.h5", Result(res.kind, res.coords, {
        k: v for k, v in res.data.items() if k not in ("shapley", "main_effect", "interaction")}, res.attrs))
    with pytest.raises(GraftkitError, match=r"bare\.h5: no shapley, main_effect or group_effect"):
        F.attribution(bare)
    with pytest.raises(GraftkitError, match=r"bare\.h5: no interaction array"):
        F.interactions(bare)
    # A required array missing: the report's note, as an error.
    broken = write_result(tmp_path / "broken.h5", Result(
        res.kind, {k: v for k, v in res.coords.items() if k != "config"},
        {k: v for k, v in res.data.items() if "config" not in v[0]}, res.attrs))
    with pytest.raises(GraftkitError, match=r"broken\.h5: could not be drawn"):
        F.graft_effects(broken)
