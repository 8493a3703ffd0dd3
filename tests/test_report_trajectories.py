"""The report draws a training run's trajectory over its checkpoint steps, and says when a checkpoint did not move.

``kl`` and ``graft --sweep`` with ``--all-checkpoints`` write one result per checkpoint, each recording its ``step``
and ``trainer_run``: the report draws the results of one run as one trajectory — KL(π_RL‖π_SFT) and KL(π_SFT‖π_RL)
over the steps, and per swept group its effect on success and the fraction of RL's behavioural change it
reproduces — whatever order the files were written in, beside unrelated results drawn as before. A delta run
bit-identical to its base is one note, not heatmaps of zeros. Planted results (tests/report_results.py) check each
figure's values against each step's own view; a TRL-shaped output_dir (tests/trl_shapes.py) whose first checkpoint
did not move goes through the real commands into the report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from graftkit.figures import make_report, write_report
from graftkit.figures.browser import browser_available
from graftkit.results.layout import result_path
from graftkit.results.store import Result, write_result
from report_results import kl_run, kl_sweep, with_steps
from test_report import _decode, _figures, _section
from test_report_kinds import _drawn, _option, _titled

TRAINER, LATE, OTHER = "/runs/out", "/runs/late", "/runs/other"
STEPS = (2, 4, 6)
#: The steps of a second training run measured the same way (its own ticks in the menu's option).
LATE_STEPS = (5, 10)
#: The order the checkpoints' files are written in (not their steps' order).
WRITTEN = (6, 2, 4)
STILL = 2



pytestmark = pytest.mark.slow  # three trajectories written and drawn: the full lane's

def _kl_step(step: int) -> Result:
    """checkpoint-``step``'s kl result; checkpoint-2 did not move (KL 0 on every token, both ways)."""
    return kl_run(f"out-checkpoint-{step}", scale=0.0 if step == STILL else step / 2, seed=step,
                  attrs={"step": step, "trainer_run": TRAINER})


def _sweep_step(step: int) -> Result:
    return kl_sweep("single", "both", f"out-checkpoint-{step}", seed=step, attrs={"step": step, "trainer_run": TRAINER})


def _late_kl(step: int) -> Result:
    return kl_run(f"late-checkpoint-{step}", scale=step / 3, seed=10 + step, attrs={"step": step, "trainer_run": LATE})


def _late_sweep(step: int) -> Result:
    return kl_sweep("single", "both", f"late-checkpoint-{step}", seed=10 + step,
                    attrs={"step": step, "trainer_run": LATE})


def _other_step(step: int) -> Result:
    return kl_sweep("loo", "kl", f"other-checkpoint-{step}", seed=step, attrs={"step": step, "trainer_run": OTHER})


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    """A results folder mixing trajectories and unrelated results: the kl results of three checkpoints of one run
    (written out of step order) and of two of another, two RL models' kl results and a kl result with a step
    dimension; the single sweeps (success and KL) of the same checkpoints, the leave-one-out sweeps (KL alone) of a
    third run's two checkpoints, and a factorial sweep of an unrelated RL model."""
    run = tmp_path_factory.mktemp("traj") / "run"
    R = run / "results"
    files: dict[str, Path] = {}
    res: dict[str, Result] = {}

    def put(key: str, path: Path, r: Result) -> None:
        files[key], res[key] = write_result(path, r), r

    put("kl rl", result_path(R, "kl", a="rl", b="sft"), kl_run("rl"))
    put("kl degrade-s0", result_path(R, "kl", a="degrade-s0", b="sft"), kl_run("degrade-s0", scale=2.0, seed=1))
    put("kl traj", result_path(R, "kl", a="traj", b="sft"),
        with_steps([kl_run("traj", scale=k, seed=k) for k in (1, 2, 3)], [10, 20, 30]))
    for s in WRITTEN:
        put(f"kl {s}", result_path(R, "kl", a=f"out-checkpoint-{s}", b="sft"), _kl_step(s))
        put(f"sweep {s}", result_path(R, "graft-sweep", sweep="single", label=f"out-checkpoint-{s}"), _sweep_step(s))
    for s in LATE_STEPS:
        put(f"kl late {s}", result_path(R, "kl", a=f"late-checkpoint-{s}", b="sft"), _late_kl(s))
        put(f"late {s}", result_path(R, "graft-sweep", sweep="single", label=f"late-checkpoint-{s}"), _late_sweep(s))
    for s in (20, 10):
        put(f"other {s}", result_path(R, "graft-sweep-kl", sweep="loo", label=f"other-checkpoint-{s}"), _other_step(s))
    put("sweep rl", result_path(R, "graft-sweep", sweep="factorial", label="rl"), kl_sweep("factorial", "both", "rl"))
    rep = make_report(run)
    return run, files, res, rep


def _sources(page: str, fig_id: str) -> set[str]:
    (attrs,) = re.findall(rf"<figure data-sources='([^']*)'><div class='graph' id='{fig_id}'>", page)
    return set(json.loads(attrs.replace("&quot;", '"')))


def _id_of(page: str, key: str, start: str) -> str:
    figs = _figures(page)
    for i in re.findall(r"id='(fig-\d+)'", _section(page, key)):
        if re.sub(r"<[^>]+>", "", figs[int(i.split("-")[1]) - 1]["figure"]["layout"]["title"]["text"]).startswith(start):
            return i
    raise AssertionError(start)


def _holding(page: str, key: str, start: str, label: str) -> tuple[str, dict]:
    """(id, figure) of the figure of section ``key`` titled ``start``… that draws ``label``: its menu's option, or its
    title when it has no menu (the first option's title is the figure's: which run is first follows the files' ages)."""
    figs = _figures(page)
    for i in re.findall(r"id='(fig-\d+)'", _section(page, key)):
        fig = figs[int(i.split("-")[1]) - 1]["figure"]
        title = re.sub(r"<[^>]+>", "", fig["layout"]["title"]["text"])
        options = [o["label"] for o in (fig["layout"].get("meta") or {}).get("options", [])]
        if title.startswith(start) and (label in options or not options and f"— {label}" in title):
            return i, fig
    raise AssertionError(f"no figure {start}… drawing {label}")


def _rel(run: Path, *paths: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in paths}


# ---------------------------------------------------------------------------------------------------- KL


def _lines(traces: list[dict]) -> list[tuple[str, str, dict]]:
    """(side, per, trace) of each line of a KL trajectory (not its bands or rings)."""
    return [("rl" if t["name"].startswith("KL(π_RL") else "sft", "token" if t.get("xaxis", "x") == "x" else "episode", t)
            for t in traces if t["mode"] == "lines+markers"]


def test_kl_trajectory_draws_each_checkpoints_file_in_step_order(traj):
    from graftkit.evaluation.kl import KLResult
    from graftkit.figures import kl as K
    from graftkit.figures.runs import run_colours

    run, files, res, rep = traj
    page = rep.html
    fid, fig = _holding(page, "kl", "Behavioural divergence over training", "out")
    labels = [o["label"] for o in fig["layout"]["meta"]["options"]]
    assert sorted(labels) == ["late", "out"]  # one option per training run, each in its run colour
    colours = dict(zip(labels, run_colours(labels)))
    for label, steps in (("out", STEPS), ("late", LATE_STEPS)):
        traces = _option(fig, label)
        views = [KLResult.from_result(res[f"kl {s}" if label == "out" else f"kl late {s}"]) for s in steps]
        lines = _lines(traces)
        assert len(lines) == 4  # 2 sides × (per token, per episode)
        for side, per, t in lines:
            assert list(t["x"]) == list(steps) and t["line"]["color"] == colours[label]
            assert t["line"]["dash"] == ("solid" if side == "rl" else "dot")
            want = np.array([v.summary(side, "all", per) for v in views])
            np.testing.assert_allclose(_decode(t["y"]), want[:, 0])
            assert [c[0] for c in t["customdata"]] == [f"{label}-checkpoint-{s}" for s in steps]
            # the interval: a band from high down to low, in the line's colour
            hi, lo = [b for b in traces if b.get("legendgroup") == side and b.get("xaxis", "x") == t.get("xaxis", "x")
                      and b["mode"] == "lines"]
            np.testing.assert_allclose(_decode(hi["y"]), want[:, 2])
            np.testing.assert_allclose(_decode(lo["y"]), want[:, 1])
            assert lo["fill"] == "tonexty" and hi["hoverinfo"] == "skip"
        # each option brings its own steps as ticks and names its run in the title
        (button,) = [b for b in fig["layout"]["updatemenus"][0]["buttons"] if b["label"] == label]
        assert button["args"][1]["xaxis.tickvals"] == button["args"][1]["xaxis2.tickvals"] == list(steps)
        assert f"Behavioural divergence over training — {label}" in button["args"][1]["title.text"]
    assert colours["out"] != colours["late"]
    # checkpoint-2 did not move: KL 0 both ways, a ring at 0 and one note naming it and its file
    views = [KLResult.from_result(res[f"kl {s}"]) for s in STEPS]
    assert views[0].summary("rl")[0] == views[0].summary("sft")[0] == 0.0 < views[1].summary("rl")[0]
    rings = [t for t in _option(fig, "out") if t["name"] == K.STILL]
    assert len(rings) == 2 and all(list(t["x"]) == [STILL] and _decode(t["y"]).tolist() == [0.0] for t in rings)
    assert not [t for t in _option(fig, "late") if t["name"] == K.STILL]
    (note,) = [n for n in rep.notes if "KL is exactly 0" in n]
    assert note.startswith(f"out: at step {STILL} (out-checkpoint-{STILL})")
    assert _drawn(page, "kl")[str(files[f"kl {STILL}"].relative_to(run))].count("p") == 1
    # the figure is drawn from every checkpoint's file, and says so
    assert _sources(page, fid) == _rel(
        run, *(files[f"kl {s}"] for s in STEPS), *(files[f"kl late {s}"] for s in LATE_STEPS))


def test_unrelated_kl_results_beside_a_trajectory_are_drawn_as_before(traj):
    from graftkit.evaluation.kl import KLResult

    run, files, res, rep = traj
    page = rep.html
    # the models compared are the two RL models: no checkpoint of the trajectory, no step dimension
    fig = _titled(page, "kl", "Behavioural divergence from the base, by model")
    assert all(t["x"] == ["degrade-s0", "rl"] for t in fig["data"])
    for t in fig["data"]:
        side = "rl" if t["name"].startswith("KL(π_RL") else "sft"
        per = "token" if t.get("xaxis", "x") == "x" else "episode"
        np.testing.assert_allclose(_decode(t["y"]), [KLResult.from_result(res[f"kl {m}"]).summary(side, "all", per)[0]
                                                     for m in ("degrade-s0", "rl")])
    assert _sources(page, _id_of(page, "kl", "Behavioural divergence from the base, by model")) == _rel(
        run, files["kl degrade-s0"], files["kl rl"])
    # the result with a step dimension keeps its own figure
    over = _titled(page, "kl", "Behavioural divergence from the base over training")
    assert all(_decode(t["x"]).tolist() == [10, 20, 30] and t["name"].startswith("traj · ") for t in over["data"])
    # the per-task figure: every model, the trajectory's checkpoints in step order
    per_task = _titled(page, "kl", "Behavioural divergence per task")
    labels = [o["label"] for o in per_task["layout"]["meta"]["options"]]
    assert sorted(labels) == sorted(["rl", "degrade-s0", "traj", *(f"out-checkpoint-{s}" for s in STEPS),
                                     *(f"late-checkpoint-{s}" for s in LATE_STEPS)])
    assert [lab for lab in labels if lab.startswith("out-")] == [f"out-checkpoint-{s}" for s in STEPS]
    (t,) = [t for t in _option(per_task, "out-checkpoint-6") if t["name"].startswith("KL(π_RL")
            and t.get("xaxis", "x") == "x"]
    v = KLResult.from_result(res["kl 6"])
    np.testing.assert_allclose(_decode(t["y"]), [v.summary("rl", s, "token")[0] for s in v.scopes])


# ---------------------------------------------------------------------------------------------- grafts


def test_sweep_trajectory_is_one_line_per_group_of_each_steps_values(traj):
    from graftkit.graft import attribution as A
    from graftkit.graft.experiments import RL_LABEL, SweepResult
    from graftkit.graft.kl import REPRODUCED
    from graftkit.figures.grafts import RL_VS_BASE

    run, files, res, rep = traj
    page = rep.html
    # the runs scored by success and KL share a figure, a menu picking the run; the run scored by KL alone has its own
    fid, fig = _holding(page, "grafts", "Graft effects over training", "out · single sweep")
    assert sorted(o["label"] for o in fig["layout"]["meta"]["options"]) == ["late · single sweep", "out · single sweep"]
    for label, steps, key in (("out", STEPS, "sweep"), ("late", LATE_STEPS, "late")):
        views = [SweepResult.from_result(res[f"{key} {s}"]) for s in steps]
        traces = _option(fig, f"{label} · single sweep")
        success = [t for t in traces if t.get("xaxis", "x") == "x"]
        kl = [t for t in traces if t.get("xaxis") == "x2"]
        assert [t["name"] for t in success] == ["attn", "mlp", RL_VS_BASE] and [t["name"] for t in kl] == ["attn", "mlp"]
        for t in traces:
            assert list(t["x"]) == list(steps)
            assert [c[0] for c in t["customdata"]] == [f"{label}-checkpoint-{s}" for s in steps]
        for j, g in enumerate(("attn", "mlp")):
            # success: the single effect v({g}) − v(∅) each step's sweep stores, in points, with its interval
            want = 100 * np.array([v.array("group_effect")[v.groups.index(g)] for v in views])
            np.testing.assert_allclose(_decode(success[j]["y"]), want[:, 0])
            np.testing.assert_allclose(_decode(success[j]["error_y"]["array"]), want[:, 2] - want[:, 0], atol=1e-9)
            np.testing.assert_allclose(_decode(success[j]["error_y"]["arrayminus"]), want[:, 0] - want[:, 1],
                                       atol=1e-9)
            assert np.allclose(want[:, 0], [100 * (v.success(g) - v.success("∅ (base)")) for v in views])
            # KL: the fraction of RL's behavioural change the group reproduces on RL's rollouts
            want = 100 * np.array([v.kl_attribution("kl_group_effect", "rl")[v.groups.index(g)] for v in views])
            np.testing.assert_allclose(_decode(kl[j]["y"]), want[:, 0])
            assert success[j]["line"]["color"] == kl[j]["line"]["color"]  # a group has one colour in both panels
        np.testing.assert_allclose(_decode(success[2]["y"]), [100 * v.diff(RL_LABEL)[0] for v in views])
        (button,) = [b for b in fig["layout"]["updatemenus"][0]["buttons"] if b["label"] == f"{label} · single sweep"]
        assert button["args"][1]["xaxis.tickvals"] == button["args"][1]["xaxis2.tickvals"] == list(steps)
        assert f"single effect of each swept group: {A.SINGLE}" in button["args"][1]["title.text"]
    (caption,) = re.findall(rf"id='{fid}'></div><figcaption>(.*?)</figcaption>", page)
    caption = caption.replace("&#x27;", "'")
    assert f"the single effect of each swept group, {A.SINGLE}" in caption and REPRODUCED["rl"] in caption
    assert _sources(page, fid) == _rel(run, *(files[f"sweep {s}"] for s in STEPS),
                                       *(files[f"late {s}"] for s in LATE_STEPS))
    # the KL-only leave-one-out trajectory: one panel, its steps in order, its loo effects, their formula
    others = [SweepResult.from_result(res[f"other {s}"]) for s in (10, 20)]
    fid, fig = _holding(page, "grafts", "Graft effects over training", "other · loo sweep (KL)")
    assert "meta" not in fig["layout"] and "xaxis2" not in fig["layout"]
    assert [t["name"] for t in fig["data"]] == ["attn", "mlp"]
    for t, g in zip(fig["data"], ("attn", "mlp")):
        assert list(t["x"]) == [10, 20]
        np.testing.assert_allclose(_decode(t["y"]), [100 * v.kl_attribution("kl_group_effect", "rl")[v.groups.index(g), 0]
                                                     for v in others])
    assert f"loo effect of each swept group: {A.LOO}" in fig["layout"]["title"]["text"]
    (caption,) = re.findall(rf"id='{fid}'></div><figcaption>(.*?)</figcaption>", page)
    assert f"the loo effect of each swept group, {A.LOO}" in caption.replace("&#x27;", "'")
    assert _sources(page, fid) == _rel(run, files["other 10"], files["other 20"])


def test_sweeps_beside_a_trajectory_keep_their_menus_in_step_order(traj):
    run, files, res, rep = traj
    fig = _titled(rep.html, "grafts", "Graft effects — ")
    labels = [o["label"] for o in fig["layout"]["meta"]["options"]]
    assert sorted(labels) == sorted(["rl", *(f"out-checkpoint-{s}" for s in STEPS),
                                     *(f"late-checkpoint-{s}" for s in LATE_STEPS)])
    assert [lab for lab in labels if lab.startswith("out-")] == [f"out-checkpoint-{s}" for s in STEPS]
    assert [lab for lab in labels if lab.startswith("late-")] == [f"late-checkpoint-{s}" for s in LATE_STEPS]
    kl = _titled(rep.html, "grafts", "Behavioural change each graft reproduces (KL)")
    assert [o["label"] for o in kl["layout"]["meta"]["options"] if o["label"].startswith("other-")] == [
        "other-checkpoint-10 (KL)", "other-checkpoint-20 (KL)"]


def test_every_file_of_a_mixed_folder_is_drawn(traj):
    run, files, _, rep = traj
    drawn = _drawn(rep.html)
    assert {str(p.relative_to(run)) for p in files.values()} <= set(drawn)
    assert rep.sections == ("kl", "grafts")


def test_a_step_measured_twice_draws_the_newer_and_says_so(tmp_path):
    from graftkit.figures import kl as K

    R = tmp_path / "run" / "results"
    for s in STEPS:
        write_result(result_path(R, "kl", a=f"out-checkpoint-{s}", b="sft"), _kl_step(s))
    again = kl_run("out-checkpoint-4", scale=5.0, seed=9, attrs={"step": 4, "trainer_run": TRAINER})
    newer = write_result(R / "kl-rerun.h5", again)  # a rerun of step 4 saved under its own name (--save)
    rep = make_report(tmp_path / "run")
    (note,) = [n for n in rep.notes if "both measure step 4" in n]
    assert newer.name in note
    fig = _titled(rep.html, "kl", "Behavioural divergence over training — out")
    (t,) = [t for t in fig["data"] if t["mode"] == "lines+markers" and t["name"].startswith("KL(π_RL")
            and t.get("xaxis", "x") == "x"]
    assert _decode(t["y"])[1] == pytest.approx(K.pooled(again, "rl", "token")[0])


# --------------------------------------------------------------------------------------------- anatomy


@pytest.fixture(scope="module")
def still_delta(tmp_path_factory):
    """A trajectory's delta whose first checkpoint is a copy of the base, and a delta of that copy alone."""
    import shutil

    from _pairs import make_pair

    from graftkit.graft import delta_anatomy
    from graftkit.weights import open_checkpoint

    root = tmp_path_factory.mktemp("still")
    pair = make_pair(root / "pair")
    copy_ = shutil.copytree(pair.base, root / "copy")
    base = open_checkpoint(pair.base)
    tax = base.taxonomy()
    R = root / "run" / "results"
    files = {
        "trajectory": write_result(result_path(R, "delta-trajectory", label="out"), delta_anatomy(
            base, [open_checkpoint(copy_), open_checkpoint(pair.rl)], ["out-checkpoint-2", "out-checkpoint-4"], tax,
            provenance={"steps": [2, 4], "base_path": str(pair.base)})),
        "alone": write_result(result_path(R, "delta", labels="copy"), delta_anatomy(
            base, [open_checkpoint(copy_)], ["copy"], tax, provenance={"base_path": str(pair.base)})),
    }
    return root / "run", files, make_report(root / "run"), pair


def test_a_run_identical_to_its_base_is_a_note_not_a_heatmap(still_delta):
    from graftkit.graft.anatomy import DeltaResult

    run, files, rep, pair = still_delta
    page = rep.html
    section = _section(page, "anatomy")
    for run_name, key in (("out-checkpoint-2", "trajectory"), ("copy", "alone")):
        line = DeltaResult.read(files[key]).identical_line(0)
        assert line.startswith(f"{run_name} is bit-identical to base {pair.base}")
        (note,) = [n for n in rep.notes if line in n]
        assert note == f"{files[key].name}: {line}; it is left out of the heatmaps, largest movers and group shares" + (
            " (the movement over steps shows its 0)" if key == "trajectory" else "")
        assert str(files[key].relative_to(run)) in _drawn(page, "anatomy")  # the note names its file
    assert "bit-identical" in section
    # heatmaps, largest movers and group shares: only the run that moved
    figs = _figures(page)
    ids = re.findall(r"id='(fig-\d+)'", section)
    drawn = {re.sub(r"<[^>]+>", "", figs[int(i.split("-")[1]) - 1]["figure"]["layout"]["title"]["text"]): figs[
        int(i.split("-")[1]) - 1]["figure"] for i in ids}
    per_run = [t for t in drawn if t.startswith(("Share of squared weight movement —", "Relative change ‖Δ‖_F / ‖W‖_F —",
                                                 "Largest movers —"))]
    assert len(per_run) == 3 and all("out-checkpoint-4" in t for t in per_run)
    assert all("meta" not in drawn[t]["layout"] for t in per_run)  # one run each: no menu
    (shares,) = [f for t, f in drawn.items() if t.startswith("Where the weights moved: share per parameter group")]
    assert [t["name"] for t in shares["data"]] == ["out-checkpoint-4 · delta-out-trajectory"]
    # the trajectory's movement over steps still shows the unmoved checkpoint's 0
    movement = [f for t, f in drawn.items() if t.startswith("Where the weights moved, when")]
    assert len(movement) == 1
    for t in movement[0]["data"]:
        assert list(t["x"]) == [2, 4] and _decode(t["y"])[0] == 0.0
    assert any(_decode(t["y"])[1] > 0 for t in movement[0]["data"])


# -------------------------------------------------------------------------------------------- notebook


def test_the_notebook_draws_the_reports_trajectory_figures(traj, still_delta):
    import plotly.io as pio

    from graftkit import figures as F
    from graftkit.core.errors import GraftkitError
    from graftkit.figures.report import load_run, plan_report

    def js(fig) -> str:
        return pio.to_json(fig, validate=False)

    for folder in (traj[0], still_delta[0]):
        loaded = load_run(folder)
        panels = {js(p.figure) for sec in plan_report(loaded) for p in sec.panels}
        of = {kind: [x.path for x in loaded if x.kind == kind] for kind in ("kl", "graft-sweep", "delta")}
        if folder == traj[0]:
            assert js(F.kl_trajectory(of["kl"])) in panels
            both = [p for p in of["graft-sweep"] if not p.name.endswith("-kl.h5")]
            assert js(F.sweep_trajectory(both)) in panels
            assert js(F.sweep_trajectory([p for p in of["graft-sweep"] if p.name.startswith("graft-loo")])) in panels
            with pytest.raises(GraftkitError, match="different panels"):
                F.sweep_trajectory(of["graft-sweep"])
            with pytest.raises(GraftkitError, match="no kl result of a training run's checkpoint"):
                F.kl_trajectory([p for p in of["kl"] if p.name == "kl-rl-vs-sft.h5"])
        else:
            (trajectory,) = [p for p in of["delta"] if "trajectory" in p.name]
            moved = "out-checkpoint-4 · delta-out-trajectory"  # the report's label of a run among two delta files
            for metric in ("share", "rel_delta"):
                assert js(F.anatomy_heatmap(trajectory, metric=metric, label=moved)) in panels
            assert js(F.top_tensors(trajectory, label=moved)) in panels and js(F.group_shares(of["delta"])) in panels
            with pytest.raises(GraftkitError, match="out-checkpoint-2 is bit-identical to base"):
                F.anatomy_heatmap(trajectory, run="out-checkpoint-2")
            with pytest.raises(GraftkitError, match="every run is bit-identical"):
                F.anatomy_heatmap([p for p in of["delta"] if p is not trajectory][0])


# ------------------------------------------------------------------------------------- a real training run


@pytest.mark.slow
def test_a_trl_run_with_a_checkpoint_that_did_not_move_is_drawn_over_its_steps(tmp_path):
    """A GRPOTrainer output_dir whose checkpoint-2 did not move, through delta, kl and a single sweep scored by
    success and KL, each with --all-checkpoints, then the report: each trajectory figure holds each step's file in
    step order; checkpoint-2 is said to be bit-identical (anatomy) and to have KL 0 (behaviour, grafts)."""
    from conftest import planted_policies
    from trl_shapes import trl_run

    from graftkit.evaluation.kl import KLConfig, KLResult, run_kl
    from graftkit.graft.anatomy import DeltaConfig, run_delta
    from graftkit.graft.commands import GraftConfig, run_graft
    from graftkit.graft.experiments import SweepResult

    sft = planted_policies(tmp_path, children=())["sft"]
    out = trl_run(tmp_path / "out", sft, steps=STEPS, scale=2e-3, still=(STILL,))
    run = tmp_path / "run"
    run_delta(DeltaConfig(rl=(out,), base=sft, all_checkpoints=True, run=run))
    kl = run_kl(KLConfig(model=out, base=sft, all_checkpoints=True, run=run, tasks="click-button,arithmetic", seeds=2,
                         episodes=1, max_new_tokens=4, n_boot=300))
    sweep = run_graft(GraftConfig(rl=out, base=sft, all_checkpoints=True, run=run, sweep="single", groups="attn,mlp",
                                  tasks="click-button", seeds=2, episodes=1, max_new_tokens=4, metric="both"))
    labels = [f"out-checkpoint-{s}" for s in STEPS]
    rep = make_report(run)
    page = rep.html
    # behaviour: each step's kl file in step order, checkpoint-2 at 0
    fig = _titled(page, "kl", "Behavioural divergence over training — out")
    for t in (t for t in fig["data"] if t["mode"] == "lines+markers"):
        side = "rl" if t["name"].startswith("KL(π_RL") else "sft"
        per = "token" if t.get("xaxis", "x") == "x" else "episode"
        assert list(t["x"]) == list(STEPS)
        np.testing.assert_allclose(_decode(t["y"]), [KLResult.read(r.file).summary(side, "all", per)[0]
                                                     for r in kl.runs])
    assert any(n.startswith(f"out: at step {STILL} (out-checkpoint-{STILL}) KL is exactly 0") for n in rep.notes)
    # grafts: per group its single effect at each step
    fig = _titled(page, "grafts", "Graft effects over training — out · single sweep")
    views = [SweepResult.read(sweep.files[lab]) for lab in labels]
    for t in (t for t in fig["data"] if t["name"] in ("attn", "mlp")):
        assert list(t["x"]) == list(STEPS)
        if t.get("xaxis", "x") == "x":
            want = [100 * v.array("group_effect")[v.groups.index(t["name"]), 0] for v in views]
        else:
            want = [100 * v.kl_attribution("kl_group_effect", "rl")[v.groups.index(t["name"]), 0] for v in views]
        np.testing.assert_allclose(_decode(t["y"]), want)  # NaN at checkpoint-2 on KL: no change to reproduce
    assert any(n.startswith(f"out · single sweep: at step {STILL} (out-checkpoint-{STILL}) KL(π_RL‖π_SFT) is exactly 0")
               for n in rep.notes)
    # anatomy: checkpoint-2 is one note; the movement over steps starts at 0
    assert any(f"out-checkpoint-{STILL} is bit-identical to base {sft}" in n for n in rep.notes)
    movement = _titled(page, "anatomy", "Where the weights moved, when")
    assert all(list(t["x"]) == list(STEPS) and _decode(t["y"])[0] == 0.0 for t in movement["data"])
    heat = _titled(page, "anatomy", "Share of squared weight movement")
    assert [o["label"] for o in heat["layout"]["meta"]["options"]] == labels[1:]
    drawn = _drawn(page)
    assert {str(p.relative_to(run)) for p in (run / "results").glob("*.h5")} <= set(drawn)


# ---------------------------------------------------------------------------------------------- Chromium


@pytest.mark.slow
@pytest.mark.skipif(not browser_available(), reason="needs selenium, chromium and chromium-driver")
def test_trajectory_figures_render_in_chromium_and_their_menu_switches_the_run(traj, tmp_path):
    """The trajectory figures draw every trace (bands included) without a script error, and picking the other
    training run in the grafts' trajectory menu shows its lines, its own steps as ticks and its name in the title."""
    from selenium.webdriver.common.by import By

    from graftkit.figures.browser import chromium, screenshot, wait_rendered
    from graftkit.figures.grafts import RL_VS_BASE
    from test_report import _open_catching_errors

    run = traj[0]
    out = tmp_path / "report.html"
    rep = write_report(run, out)
    page = out.read_text()
    ids = [_holding(page, "kl", "Behavioural divergence over training", "out")[0],
           _holding(page, "grafts", "Graft effects over training", "out · single sweep")[0]]
    driver = chromium()
    try:
        _open_catching_errors(driver, out)
        assert wait_rendered(driver) == rep.n_figures
        state = driver.execute_script("""
            return arguments[0].map(function (id) {
              var g = document.getElementById(id), drawn = 0;
              g.querySelectorAll('.cartesianlayer .trace').forEach(function (t) {
                var b = t.getBoundingClientRect(); if (b.width > 0 && b.height > 0) { drawn++; } });
              return {traces: g._fullData.filter(function (t) { return t.visible === true; }).length, drawn: drawn};
            });""", ids)
        assert all(s["traces"] > 0 and s["drawn"] > 0 for s in state), state
        graph = driver.find_element(By.ID, ids[1])
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", graph)
        graph.find_element(By.CSS_SELECTOR, ".updatemenu-header").click()
        buttons = graph.find_elements(By.CSS_SELECTOR, ".updatemenu-dropdown-button")
        [b for b in buttons if b.text.startswith("late")][0].click()  # late's option, whichever is first
        shown = driver.execute_script("""
            var g = document.getElementById(arguments[0]);
            return {names: g._fullData.filter(function (t) { return t.visible === true; }).map(function (t) {
                      return t.name; }), title: g.querySelector('.gtitle').textContent,
                    ticks: Array.from(g.querySelectorAll('.xaxislayer-above .xtick text')).map(function (t) {
                      return t.textContent; })};""", ids[1])
        errors = driver.execute_script("return window.__errors;")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert shown["names"] == ["attn", "mlp", RL_VS_BASE, "attn", "mlp"] and "late · single sweep" in shown["title"]
    assert shown["ticks"] == [str(s) for s in LATE_STEPS]
    assert errors == [] and severe == []
    png = screenshot(out, tmp_path / "report.png")
    assert png.stat().st_size > 0
