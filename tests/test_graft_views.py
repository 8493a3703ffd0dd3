"""The typed views of graft results (SweepResult, DissociationResult) and the one resume mechanism of a
graft sweep, shared by `graftkit graft --sweep` and the study."""

from __future__ import annotations

import numpy as np
import pytest

from graftkit.core.errors import GraftkitError
from graftkit.graft import attribution as A
from graftkit.graft.experiments import (
    BASE_LABEL,
    RL_LABEL,
    DissociationResult,
    SweepResult,
    dissociation_result,
    expand_sweep,
    resume_outcomes,
    subset_outcomes,
    sweep_result,
)
from graftkit.results.layout import partial_path
from graftkit.results.store import read_result, write_result
from test_graft_experiments import TASKS as E2E_TASKS, policies  # noqa: F401 (the fixture)

GROUPS = ("attn", "mlp")
TASKS, SEEDS, EPISODES = ["t1", "t2"], list(range(5)), 3
SETUP = {"base": {"path": "/b"}, "rl": {"path": "/r"}, "tasks": TASKS, "seeds": SEEDS, "episodes": EPISODES}


def _outcomes(exps, shift: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {e.label: (rng.random((2, 5, 3)) < 0.5 + shift * ("attn" in e.groups)).astype(np.int8) for e in exps}


def _sweep(exps, success, **kw):
    return sweep_result("factorial", exps, success, TASKS, SEEDS, EPISODES, GROUPS, movement_share={"attn": 0.7},
                        attrs=SETUP, n_boot=200, **kw)


def test_sweep_view_round_trips_and_reads_every_array(tmp_path):
    exps = expand_sweep("factorial", GROUPS, GROUPS)
    success = _outcomes(exps, 0.3)
    path = write_result(tmp_path / "graft-factorial-rl.h5", _sweep(exps, success))
    v = SweepResult.read(path)
    again = SweepResult.from_result(v.to_result())
    assert v.path == path and again.to_result() is v.to_result()
    assert v.sweep == "factorial" and v.configs == [BASE_LABEL, RL_LABEL, "attn", "mlp"] and v.groups == list(GROUPS)
    for label in v.configs:
        assert np.array_equal(v.outcomes(label), success[label]) and v.outcomes(label).dtype == np.int8
        assert v.success(label) == pytest.approx(success[label].mean())
    res = read_result(path)
    i = v.configs.index("attn")
    assert v.diff("attn").tolist() == res["diff_vs_base"][i].tolist()
    assert v.diff("attn", "rl").tolist() == res["diff_vs_rl"][i].tolist()
    assert v.verdict("attn") == res["verdict_vs_base"][i] and v.diff("nothing") is None
    assert v.strings("config_groups") == ["", "attn,mlp", "attn", "mlp"]
    assert np.array_equal(v.array("shapley"), res["shapley"]) and v.array("no such array") is None
    assert v.effect_kind == "shapley" and v.axis("shapley") == list(GROUPS) and v.axis("interaction", 1) == list(GROUPS)
    assert v.movement_share == {"attn": 0.7, "mlp": 0.0}
    assert list(v.all_outcomes()) == v.configs


def test_views_refuse_the_wrong_kind_and_read_dissociations(tmp_path):
    exps = expand_sweep("factorial", GROUPS, GROUPS)
    sa, sb = _outcomes(exps, 0.3, 1), _outcomes(exps, 0.0, 2)
    d = A.dissociation(subset_outcomes(exps, sa), subset_outcomes(exps, sb), GROUPS, kind="shapley", n_boot=200)
    res = dissociation_result(d, {"A": {"path": "/x/a", "label": "a"}, "B": {"path": "/x/b", "label": "b"}})
    v = DissociationResult.read(write_result(tmp_path / "dis.h5", res))
    assert v.groups == list(GROUPS) and v.runs == ["A", "B"] and v.run_name("A") == "a"
    assert np.array_equal(v.effect, d.effect) and np.array_equal(v.difference, d.difference)
    assert v.verdicts == list(d.verdict) and v.double_dissociation == d.double_dissociation
    assert v.effect_kind == "shapley"
    with pytest.raises(GraftkitError, match="graft-sweep"):
        SweepResult.from_result(res)
    with pytest.raises(GraftkitError, match="graft-dissociation"):
        DissociationResult.from_result(_sweep(exps, sa))


def test_resume_prefers_the_partial_result_and_never_mixes_setups(tmp_path):
    exps = expand_sweep("factorial", GROUPS, GROUPS)
    success = _outcomes(exps)
    dest = tmp_path / "graft-factorial-rl.h5"
    assert resume_outcomes(dest, exps, SETUP) == {}
    # an interrupted sweep: its partial result beside the result, which does not exist yet
    first = {k: success[k] for k in list(success)[:2]}
    write_result(partial_path(dest), _sweep(exps, first, compare_configs=False))
    assert partial_path(dest).name == ".partial-graft-factorial-rl.h5" and not dest.exists()
    done = resume_outcomes(dest, exps, SETUP)
    assert list(done) == list(first) and all(np.array_equal(done[k], first[k]) for k in first)
    # another setup (other seeds) is not resumed
    assert resume_outcomes(dest, exps, {**SETUP, "seeds": [0, 1]}) == {}
    # a finished result (no partial left) gives every configuration
    write_result(dest, _sweep(exps, success))
    partial_path(dest).unlink()
    assert sorted(resume_outcomes(dest, exps, SETUP)) == sorted(success)
    # an unreadable partial result is no resume point, and the finished one still is
    partial_path(dest).write_bytes(b"not hdf5")
    assert sorted(resume_outcomes(dest, exps, SETUP)) == sorted(success)


def test_an_interrupted_sweep_resumes_without_replaying_finished_configurations(policies, tmp_path):
    from graftkit.graft.commands import GraftConfig, run_graft_experiments

    cfg = GraftConfig(rl=policies["rl"], sweep="single", groups="attn,mlp", tasks=E2E_TASKS[0], seeds=2, episodes=1,
                      max_new_tokens=4, results=tmp_path)
    started: list[str] = []

    def stop_at_the_third(what, advance, total, unit):
        if what not in started:
            started.append(what)
        if len(started) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_graft_experiments(cfg, stop_at_the_third)
    dest = tmp_path / "graft-single-rl.h5"
    assert not dest.exists() and partial_path(dest).is_file()  # only the partial result: never taken as finished
    got = run_graft_experiments(cfg)
    assert got.resumed["A"] == sorted([BASE_LABEL, RL_LABEL]) and got.files["A"] == str(dest)
    assert not partial_path(dest).exists() and SweepResult.read(dest).attrs["complete"]
    assert got.sweeps["A"].configs == [BASE_LABEL, RL_LABEL, "attn", "mlp"]
    assert got.sweeps["A"].attrs["config"]["sweep"] == "single"
