"""Every kind of result graftkit writes is drawn in the report, and the behavioural-divergence figures show what the
results hold.

Coverage: the kinds come from the run layout's table of result names (``results/layout.py`` ``NAMES``); a run
holding one result of each kind, each built by its producer's own function on tiny inputs, is reported, and
every file must be named by some figure or table of a section (``data-sources``), not only in the list of result
files. A new kind of result without a builder here, or without a section that draws it, fails.

KL: ``graftkit kl`` results (evaluation/kl.py) and graft sweeps scored by KL (graft/kl.py), built by their
producers from planted numbers (tests/report_results.py): each figure's values are the typed views', the titles
and captions say which direction and which units, a trajectory over checkpoint steps is drawn as lines, and text
from results is escaped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from graftkit.figures import make_report
from graftkit.results.layout import NAMES, parse_result_name, result_path
from graftkit.results.store import Result, write_result
from report_results import CARRIED, kl_run, kl_sweep, with_steps
from test_report import EVIL, _decode, _figures, _parse, _section

# ------------------------------------------------------------------------------- one result of each kind


def _eval(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.agent.evaluate import EvalOutcome
    from graftkit.agent.rollout import Decode
    from graftkit.evaluation.commands import eval_result

    rng = np.random.default_rng(0)
    shape = (2, 3, 2, 1)
    out = EvalOutcome(["click-button", "focus-text"], [0, 1, 2], 2, 1, Decode(greedy=True), rng.random(shape) < 0.5,
                      rng.random(shape), rng.integers(1, 5, shape).astype(np.int32),
                      rng.integers(0, 2, shape).astype(np.int32), 1.5)
    return [({"label": "sft", "decoding": "greedy", "obs": "text"}, eval_result(out, {"path": "/ckpt/sft"}))]


def _headroom(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.agent.evaluate import EvalOutcome
    from graftkit.agent.rollout import Decode
    from graftkit.evaluation.commands import HeadroomResult

    rng = np.random.default_rng(1)

    def outcome(samples: int, greedy: bool) -> EvalOutcome:
        shape = (2, 3, 2, samples)
        return EvalOutcome(["click-button", "focus-text"], [0, 1, 2], 2, samples, Decode(greedy=greedy, temperature=0.7),
                           rng.random(shape) < 0.5, rng.random(shape), rng.integers(1, 5, shape).astype(np.int32),
                           rng.integers(0, 2, shape).astype(np.int32), 1.5)

    res = HeadroomResult.from_outcomes(outcome(1, True), outcome(4, False), {"path": "/ckpt/sft"}, k=4).to_result()
    return [({"label": "sft", "obs": "text"}, res)]


def _findings(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.study.findings import Finding, findings_result
    from graftkit.study.pipeline import StudyConfig

    found = [Finding(1, "claim one", "stated", -0.2, -0.3, -0.1, "not reproduced")]
    return [({}, findings_result(found, StudyConfig()))]


def _pair(root: Path):
    from planted import planted_pair

    from graftkit.weights import open_checkpoint

    if not (root / "pair" / "rl").is_dir():
        planted_pair(root / "pair")
    b, r = open_checkpoint(root / "pair" / "sft"), open_checkpoint(root / "pair" / "rl")
    return b, r, b.taxonomy()


def _delta(root: Path) -> list[tuple[dict, Result]]:
    """A run that moved, and a run bit-identical to its base (drawn as a note, in no heatmap)."""
    from graftkit.graft import delta_anatomy
    from graftkit.weights import open_checkpoint

    b, r, tax = _pair(root)
    still = open_checkpoint(root / "pair" / "sft")
    return [({"labels": "rl"}, delta_anatomy(b, [r], ["rl"], tax)),
            ({"labels": "still"}, delta_anatomy(b, [still], ["still"], tax))]


def _study_delta(root: Path) -> list[tuple[dict, Result]]:
    return [({}, _delta(root)[0][1])]


def _trajectory(root: Path) -> list[tuple[dict, Result]]:
    """A training run's delta whose first checkpoint did not move."""
    from graftkit.graft import delta_anatomy
    from graftkit.weights import open_checkpoint

    b, r, tax = _pair(root)
    still = open_checkpoint(root / "pair" / "sft")
    return [({"label": "grpo"}, delta_anatomy(b, [still, r], ["checkpoint-1", "checkpoint-2"], tax,
                                              provenance={"steps": [1, 2]}))]


def _sweep_outcomes():
    from graftkit.graft.experiments import expand_sweep

    groups = ("attn", "mlp")
    exps = expand_sweep("factorial", groups, groups)
    rng = np.random.default_rng(2)
    return groups, exps, {e.label: (rng.random((2, 4, 3)) < 0.4 + 0.3 * ("attn" in e.groups)).astype(np.int8)
                          for e in exps}


def _sweep(root: Path) -> list[tuple[dict, Result]]:
    """An RL model's sweep, and the sweeps of two checkpoints of a training run (graft --all-checkpoints)."""
    from graftkit.graft.experiments import sweep_result

    groups, exps, s = _sweep_outcomes()
    res = sweep_result("factorial", exps, s, ["t1", "t2"], range(4), 3, groups, movement_share={"attn": 0.6},
                       attrs={"rl_label": "rl"}, n_boot=200)
    steps = [({"sweep": "factorial", "label": f"out-checkpoint-{k}"},
              sweep_result("factorial", exps, s, ["t1", "t2"], range(4), 3, groups, n_boot=200,
                           attrs={"rl_label": f"out-checkpoint-{k}", "step": k, "trainer_run": "/runs/out"}))
             for k in (2, 4)]
    return [({"sweep": "factorial", "label": "rl"}, res), *steps]


def _sweep_kl(root: Path) -> list[tuple[dict, Result]]:
    return [({"sweep": "factorial", "label": "rl"}, kl_sweep("factorial", "kl"))]


def _dissociation(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.graft import attribution as A
    from graftkit.graft.experiments import dissociation_result, subset_outcomes

    groups, exps, sa = _sweep_outcomes()
    sb = {k: 1 - v for k, v in sa.items()}
    d = A.dissociation(subset_outcomes(exps, sa), subset_outcomes(exps, sb), groups, n_boot=200)
    return [({"a": "rl", "b": "rl2"}, dissociation_result(d, {"A": {"path": "/x/rl"}, "B": {"path": "/x/rl2"}}))]


def _kl(root: Path) -> list[tuple[dict, Result]]:
    """An RL model's kl result, and those of two checkpoints of a training run (kl --all-checkpoints)."""
    return [({"a": "rl", "b": "sft"}, kl_run()),
            *(({"a": f"out-checkpoint-{k}", "b": "sft"},
               kl_run(f"out-checkpoint-{k}", seed=k, attrs={"step": k, "trainer_run": "/runs/out"})) for k in (2, 4))]


def _rank(root: Path) -> list[tuple[dict, Result]]:
    from conftest import make_tiny_lm, make_tiny_tokenizer

    from graftkit.rank import activation_ranks, delta_ranks, weight_ranks
    from graftkit.results.layout import RANK_KINDS

    b, r, tax = _pair(root)
    built = {"rank-weights": weight_ranks(b, tax, workers=1), "rank-delta": delta_ranks(b, r, tax),
             "rank-activations": activation_ranks(make_tiny_lm("qwen3"), make_tiny_tokenizer(),
                                                  ["w1 w2 w3", "w4 w5 w6 w7", "w8 w9"], "all", tokens="all")}
    assert set(built) == set(RANK_KINDS), "a rank result kind without a builder here"
    return [({"what": kind.removeprefix("rank-"), "label": "rl"}, res) for kind, res in built.items()]


def _coupling(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.rank.coupling import both_directions, coupling, coupling_result
    from graftkit.stats import BETTER, WORSE

    rng = np.random.default_rng(3)
    s, R = rng.random(6), rng.random((6, 3))
    c = coupling(R, s, n_boot=100, conventions={"metric": "erank"})
    b = both_directions(R, s, R[0], s[0], [BETTER, WORSE] * 3)
    return [({"what": "weights", "metric": "erank"}, coupling_result(c, b))]


def _forgetting(root: Path) -> list[tuple[dict, Result]]:
    from graftkit.graft.forgetting import ForgettingConfig, forgetting_result

    rows = [{"key": f"/runs/r{i}", "parent": "/runs/sft", "trained": ["click-tab"], "untrained": ["click-button"],
             "forgetting": (-0.1 * i, -0.2 * i, 0.0), "values": {"kl": 0.1 * i, "fro_delta": 1.0 + i, "moved": 0.5,
                                                              "erank_delta": 3.0 - i}} for i in range(3)]
    return [({}, forgetting_result(rows, ["r0", "r1", "r2"], ForgettingConfig(n_boot=100), root))]


def _train(root: Path) -> list[tuple[dict, Result]]:
    """SFT and GRPO curves from a train_log.jsonl, and a Trainer's trainer_state.json that logged one step."""
    import shutil

    from graftkit.results.layout import TRAIN_KINDS
    from graftkit.train.commands import trainer_curves_result, training_curves

    built = {}
    for kind in ("sft", "grpo"):
        folder = root / f"train-{kind}"
        folder.mkdir(exist_ok=True)
        rows = [{"step": i + 1, "loss": 1.0 / (i + 1), "reward": 0.1 * i} for i in range(4)]
        (folder / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "graftkit.json").write_text(json.dumps({"producer": f"test {kind}", "config": {}}))
        built[f"train-{kind}"] = training_curves(folder, kind).to_result()
    out = root / "trainer-out"
    _pair(root)
    if not (out / "checkpoint-5").is_dir():
        shutil.copytree(root / "pair" / "rl", out / "checkpoint-5")
    (out / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 5, "loss": 0.7}]}))
    built["train-trainer"] = trainer_curves_result(out)
    assert set(built) == set(TRAIN_KINDS), "a training-curve kind without a builder here"
    return [({"kind": kind.removeprefix("train-"), "label": "run"}, res) for kind, res in built.items()]


#: Each kind of result name (results/layout.py NAMES) → the results of that name its producers write.
BUILDERS = {
    "findings": _findings, "study-delta": _study_delta, "delta-trajectory": _trajectory, "delta": _delta,
    "eval": _eval, "headroom": _headroom, "graft-dissociation": _dissociation, "graft-sweep-kl": _sweep_kl,
    "graft-sweep": _sweep, "kl": _kl, "rank": _rank, "coupling": _coupling, "train": _train,
    "forgetting": _forgetting,
}


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> tuple[Path, dict[str, list[Path]], str]:
    """A run folder holding the results of every kind of name the layout table knows and has a builder here, and
    its report."""
    root = tmp_path_factory.mktemp("kinds")
    run = root / "run"
    files: dict[str, list[Path]] = {}
    for kind in NAMES:
        if kind not in BUILDERS:
            continue
        for fields, res in BUILDERS[kind](root):
            path = result_path(run / "results", kind, **fields)
            assert parse_result_name(path.name).kind == kind, path.name
            files.setdefault(kind, []).append(write_result(path, res))
    return run, files, make_report(run).html


def _drawn(page: str, key: str | None = None) -> dict[str, list[str]]:
    """Each result file (relative to the run) → the tags (figure, div of tables) that name it as a source, in the
    whole page or in the section ``key``."""
    part = page if key is None else _section(page, key)
    out: dict[str, list[str]] = {}
    for tag, attrs in _parse(part).tags:
        for name in json.loads(attrs.get("data-sources") or "[]"):
            out.setdefault(name, []).append(tag)
    return out


@pytest.mark.parametrize("kind", list(NAMES))
def test_every_kind_of_result_is_drawn_by_a_section(every_kind, kind):
    run, files, page = every_kind
    assert kind in BUILDERS, (f"result kind {kind!r} (results/layout.py NAMES) has no builder in "
                              "tests/test_report_kinds.py BUILDERS: add one, and a section of figures/report.py that "
                              "draws it")
    drawn = _drawn(page)
    for path in files[kind]:
        name = str(path.relative_to(run))
        assert name in page  # listed among the result files…
        assert name in drawn, f"{name} ({kind}) is in no figure or table of the report, only in its file list"


def test_sources_name_the_files_each_figure_reads(every_kind):
    """A figure's sources are the files of its own section's kinds: the KL figures name the kl results and nothing
    else; the training figures every curve that logged their metric."""
    run, files, page = every_kind
    kl = _drawn(page, "kl")
    assert set(kl) == {str(p.relative_to(run)) for p in files["kl"]}
    training = _drawn(page, "training")
    assert set(training) == {str(p.relative_to(run)) for p in files["train"]}
    grafts = _drawn(page, "grafts")
    assert {str(p.relative_to(run)) for k in ("graft-sweep", "graft-sweep-kl", "graft-dissociation")
            for p in files[k]} == set(grafts)


def test_a_curve_of_one_logged_step_draws_a_marker(every_kind):
    _, _, page = every_kind
    traces = [t for f in _figures(page) for t in f["figure"]["data"]
              if t.get("name", "").startswith("trainer-out")]  # the Trainer run: one logged step
    assert traces and all("markers" in t["mode"] for t in traces)
    for t in traces:
        assert _decode(t["marker"]["size"]).tolist() == [8] and _decode(t["y"]).tolist() == [0.7]
    # a curve of several steps stays a line
    loss = [t for f in _figures(page) for t in f["figure"]["data"] if t.get("name", "").startswith("train-sft")]
    assert loss and all(t["mode"] == "lines" for t in loss)


# ------------------------------------------------------------------------------------------------ KL


@pytest.fixture(scope="module")
def kl_report(tmp_path_factory):
    """Two RL models' kl results (one in a study regime), a trajectory over three checkpoint steps, a factorial sweep
    scored by success and KL, and a single-group sweep scored by KL alone; markup planted in strings."""
    run = tmp_path_factory.mktemp("kl") / "run"
    res = {"rl": kl_run("rl", tag=EVIL), "degrade-s0": kl_run("degrade-s0", scale=2.0, seed=1),
           "traj": with_steps([kl_run("traj", scale=k, seed=k) for k in (1, 2, 3)], [10, 20, 30])}
    for label, r in res.items():
        write_result(result_path(run / "results", "kl", a=label, b="sft"), r)
    sweeps = {"graft-factorial-rl.h5": kl_sweep("factorial", "both", "rl"),
              "graft-single-rl-kl.h5": kl_sweep("single", "kl", "rl", seed=4)}
    for name, r in sweeps.items():
        write_result(run / "results" / name, r)
    rep = make_report(run)
    return run, res, sweeps, rep


def _titled(page: str, key: str, start: str) -> dict:
    figs = _figures(page)
    ids = re.findall(r"id='(fig-\d+)'", _section(page, key))
    found = [figs[int(i.split("-")[1]) - 1]["figure"] for i in ids]
    (fig,) = [f for f in found if re.sub(r"<[^>]+>", "", f["layout"]["title"]["text"]).startswith(start)]
    return fig


def _option(fig: dict, label: str) -> list[dict]:
    """The traces a figure shows for menu option ``label`` (all traces of a figure without a menu)."""
    meta = fig["layout"].get("meta") or {}
    if not meta:
        return fig["data"]
    (opt,) = [o for o in meta["options"] if o["label"] == label]
    return [fig["data"][i] for i in opt["traces"]]


def test_kl_section_is_present_with_its_figures_and_named_conventions(kl_report):
    run, res, _, rep = kl_report
    assert "kl" in rep.sections and rep.notes == ()
    page = rep.html
    assert page.index("<section id='headroom'>") < page.index("<section id='kl'>") < page.index("<section id='anatomy'>")
    section = _section(page, "kl")
    assert "<h2>Behavioural divergence</h2>" in section
    titles = [re.sub(r"<[^>]+>", "", f["layout"]["title"]["text"]) for f in
              (_figures(page)[int(i.split("-")[1]) - 1]["figure"] for i in re.findall(r"id='(fig-\d+)'", section))]
    starts = ("Behavioural divergence from the base over training", "Behavioural divergence from the base, by model",
              "Behavioural divergence per task — ", "What moved most under RL — ")
    assert len(titles) == len(starts) and all(t.startswith(w) for t, w in zip(titles, starts)), titles
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", section)
    conv = res["rl"].attrs["conventions"]
    for cap in captions[:3]:  # every value figure states the direction, the units and the token selection
        text = cap.replace("&#x27;", "'")
        assert "KL(π_RL‖π_SFT) on RL's rollouts" in text and "KL(π_SFT‖π_RL) on SFT's rollouts" in text
        assert f"direction: {conv['direction']}" in text and f"log base {conv['log_base']}" in text
        assert f"tokens: {conv['tokens']}" in text and "95% intervals" in text
    assert "nats" in captions[3]
    for start in ("Behavioural divergence from the base over training", "Behavioural divergence from the base, by model",
                  "Behavioural divergence per task"):
        fig = _titled(page, "kl", start)
        sub = fig["layout"]["title"]["text"]
        assert "KL(π_RL‖π_SFT) on RL's rollouts" in sub and "KL(π_SFT‖π_RL) on SFT's rollouts" in sub
        assert "log base e (nats)" in sub and "forward KL" in sub
        assert fig["layout"]["yaxis"]["title"]["text"] == "KL (nats per action token)"
        assert fig["layout"]["yaxis2"]["title"]["text"] == "KL (nats per episode)"


def test_kl_per_task_figure_holds_the_views_values(kl_report):
    from graftkit.evaluation.kl import KLResult

    _, res, _, rep = kl_report
    fig = _titled(rep.html, "kl", "Behavioural divergence per task")
    assert [o["label"] for o in fig["layout"]["meta"]["options"]] == ["degrade-s0", "rl", "traj"]
    for label in ("rl", "degrade-s0"):
        v = KLResult.from_result(res[label])
        traces = _option(fig, label)
        assert len(traces) == 4  # 2 sides × (per token, per episode)
        for t in traces:
            side = "rl" if t["name"].startswith("KL(π_RL") else "sft"
            per = "token" if t.get("xaxis", "x") == "x" else "episode"
            assert t["name"] == res[label].attrs["sides"][side]
            assert t["x"] == ["click-button", "arithmetic", "all tasks"]
            want = np.array([v.summary(side, scope, per) for scope in v.scopes])
            np.testing.assert_allclose(_decode(t["y"]), want[:, 0])
            np.testing.assert_allclose(_decode(t["error_y"]["array"]), want[:, 2] - want[:, 0])
            np.testing.assert_allclose(_decode(t["error_y"]["arrayminus"]), want[:, 0] - want[:, 1])
    # the trajectory's option shows its last step
    last = KLResult.from_result(kl_run("traj", scale=3, seed=3))
    (t,) = [t for t in _option(fig, "traj") if t["name"].startswith("KL(π_RL") and t.get("xaxis", "x") == "x"]
    np.testing.assert_allclose(_decode(t["y"]), [last.summary("rl", s, "token")[0] for s in last.scopes])


def test_kl_by_model_compares_the_pooled_values_in_run_colours(kl_report):
    from graftkit.evaluation.kl import KLResult
    from graftkit.figures.runs import REGIME_COLOURS, run_colours

    _, res, _, rep = kl_report
    fig = _titled(rep.html, "kl", "Behavioural divergence from the base, by model")
    assert len(fig["data"]) == 4 and all(t["x"] == ["degrade-s0", "rl"] for t in fig["data"])  # no trajectory
    for t in fig["data"]:
        side = "rl" if t["name"].startswith("KL(π_RL") else "sft"
        per = "token" if t.get("xaxis", "x") == "x" else "episode"
        want = [KLResult.from_result(res[m]).summary(side, "all", per)[0] for m in ("degrade-s0", "rl")]
        np.testing.assert_allclose(_decode(t["y"]), want)
        assert t["marker"]["color"] == run_colours(["degrade-s0", "rl"])
        assert t["marker"]["pattern"]["shape"] == ("" if side == "rl" else "/")
    assert fig["data"][0]["marker"]["color"][0] == REGIME_COLOURS["degrade"]


def test_kl_trajectory_is_a_line_over_steps_wherever_its_step_dimension_sits(kl_report, tmp_path):
    from graftkit.evaluation.kl import KLResult
    from graftkit.figures import kl as K

    _, res, _, rep = kl_report
    fig = _titled(rep.html, "kl", "Behavioural divergence from the base over training")
    steps = [kl_run("traj", scale=k, seed=k) for k in (1, 2, 3)]
    assert len(fig["data"]) == 4
    for t in fig["data"]:
        side = "rl" if "KL(π_RL" in t["name"] else "sft"
        per = "token" if t.get("xaxis", "x") == "x" else "episode"
        assert t["name"].startswith("traj · ") and _decode(t["x"]).tolist() == [10, 20, 30]
        assert t["mode"] == "lines+markers" and t["line"]["dash"] == ("solid" if side == "rl" else "dot")
        np.testing.assert_allclose(_decode(t["y"]), [KLResult.from_result(r).summary(side, "all", per)[0]
                                                     for r in steps])
    # the step dimension last but one: the same figure
    moved = with_steps(steps, [10, 20, 30], ("side", "scope", "per", "step", "bound"))
    a, b = K.kl_over_steps([("traj", res["traj"])]), K.kl_over_steps([("traj", moved)])
    assert [list(t.y) for t in a.data] == [list(t.y) for t in b.data]
    # no step dimension: no trajectory figure, and a lone result has no comparison across models
    assert K.kl_over_steps([("rl", res["rl"])]) is None and K.kl_by_model([("rl", res["rl"])]) is None
    page = make_report(_one_kl_run(tmp_path)).html
    assert len(re.findall(r"id='fig-\d+'", _section(page, "kl"))) == 2  # per task, and what moved


def _one_kl_run(tmp_path: Path) -> Path:
    write_result(result_path(tmp_path / "one" / "results", "kl", a="rl", b="sft"), kl_run())
    return tmp_path / "one"


def test_kl_top_strings_are_the_views_lists(kl_report):
    from graftkit.evaluation.kl import KLResult

    _, res, _, rep = kl_report
    fig = _titled(rep.html, "kl", "What moved most under RL")
    v = KLResult.from_result(res["degrade-s0"])
    traces = _option(fig, "degrade-s0")
    for col, what in ((("x", "y"), "token"), (("x2", "y2"), "action")):
        for d in ("gained", "lost"):
            (t,) = [t for t in traces if t.get("xaxis", "x") == col[0] and t["name"] == f"{d} under RL"]
            rows = v.top(what, d)
            assert t["y"] == [repr(r["text"]) for r in rows]
            np.testing.assert_allclose(_decode(t["x"]), [r["log_ratio"] for r in rows])
            assert [c[0] for c in t["customdata"]] == [r["count"] for r in rows]
    assert all(r["log_ratio"] > 0 for r in v.top("token", "gained"))
    assert "nats" in fig["layout"]["xaxis"]["title"]["text"]


def test_kl_sweeps_draw_reproduced_fractions_and_their_attribution(kl_report):
    from graftkit.graft.experiments import SweepResult

    _, _, sweeps, rep = kl_report
    page = rep.html
    both = SweepResult.from_result(sweeps["graft-factorial-rl.h5"])
    only = SweepResult.from_result(sweeps["graft-single-rl-kl.h5"])
    fig = _titled(page, "grafts", "Behavioural change each graft reproduces (KL)")
    assert [o["label"] for o in fig["layout"]["meta"]["options"]] == ["rl", "rl (KL)"]
    for label, v in (("rl", both), ("rl (KL)", only)):
        traces = _option(fig, label)
        assert [t["name"] for t in traces] == ["reproduced_RL (RL's rollouts)", "reproduced_SFT (SFT's rollouts)"]
        for t, side in zip(traces, ("rl", "sft")):
            assert t["y"] == v.configs
            want = np.array([v.reproduced(c, side) for c in v.configs])
            np.testing.assert_allclose(_decode(t["x"]), 100 * want[:, 0])
            np.testing.assert_allclose(_decode(t["error_x"]["array"]), 100 * (want[:, 2] - want[:, 0]), atol=1e-9)
    assert "% of RL's behavioural change" in fig["layout"]["xaxis"]["title"]["text"]
    # the attribution: the factorial's Shapley values and main effects, the single sweep's single-group effects
    fig = _titled(page, "grafts", "Attribution of the behavioural change (KL) to parameter groups")
    names = {label: [t["name"] for t in _option(fig, label)] for label in ("rl", "rl (KL)")}
    assert names["rl"] == ["Shapley value · reproduced_RL (RL's rollouts)", "Shapley value · reproduced_SFT (SFT's rollouts)",
                           "main effect · reproduced_RL (RL's rollouts)", "main effect · reproduced_SFT (SFT's rollouts)"]
    assert names["rl (KL)"] == ["single effect · reproduced_RL (RL's rollouts)",
                                "single effect · reproduced_SFT (SFT's rollouts)"]
    for label, v, arrays in (("rl", both, ("kl_shapley", "kl_main_effect")), ("rl (KL)", only, ("kl_group_effect",))):
        traces = iter(_option(fig, label))
        for name in arrays:
            for side in ("rl", "sft"):
                t = next(traces)
                assert t["x"] == ["attn", "mlp"]
                np.testing.assert_allclose(_decode(t["y"]), 100 * v.kl_attribution(name, side)[:, 0])
    # the planted change: attn carries about 0.6 of it, mlp 0.3 — together not the whole RL model
    shap = both.kl_attribution("kl_shapley", "rl")[:, 0]
    assert shap == pytest.approx([CARRIED["attn"], CARRIED["mlp"]], abs=0.05)
    total = both.kl_total("rl")
    assert total[0] == pytest.approx(shap.sum()) and total[0] < 0.95
    meta = fig["layout"]["meta"]["options"]
    (button,) = [b for b in fig["layout"]["updatemenus"][0]["buttons"] if b["label"] == "rl"]
    sub = button["args"][1]["title.text"]
    assert meta[0]["label"] == "rl"
    assert f"Σ Shapley on RL's rollouts = v(all swept groups: attn, mlp) − v(∅) = {100 * total[0]:+.1f}%" in sub
    assert "Σ Shapley" not in [b for b in fig["layout"]["updatemenus"][0]["buttons"]
                               if b["label"] == "rl (KL)"][0]["args"][1]["title.text"]  # no Shapley in a single sweep
    # a sweep scored by KL alone draws no success figure; the factorial's success figures stay
    effects = _titled(page, "grafts", "Graft effects")
    assert "meta" not in effects["layout"] or [o["label"] for o in effects["layout"]["meta"]["options"]] == ["rl"]


def test_kl_text_from_results_is_escaped(kl_report):
    _, _, _, rep = kl_report
    page = rep.html
    p = _parse(page)
    assert "img" not in [t for t, _ in p.tags]
    data_text = [t for a, t in p.scripts if a.get("type") == "application/json"][0]
    assert "<" not in data_text and ">" not in data_text
    blob = json.dumps(json.loads(data_text), ensure_ascii=False)
    assert re.search(r"'tok\d+&lt;script&gt;alert\(1\)&lt;/script&gt;", blob)  # a token string from the result
    assert "'act0&lt;script&gt;alert(1)&lt;/script&gt;" in blob  # an action string
    assert set(re.findall(r"<(/?[a-zA-Z]+)", blob)) <= {"b", "/b", "br", "sup", "/sup", "extra", "/extra"}
