"""Behaviour over a training run: `kl` and graft sweeps with `--all-checkpoints` on a TRL-shaped output_dir.

The run (:func:`trl_shapes.trl_run`) moves its SFT parent's attention and MLP matrices a little further at every
step, except checkpoint-2, which did not move: its KL is exactly 0 both ways, its grafts are the base's. Each step's
result is the single-checkpoint command's bit for bit; SFT's KL rollouts (and a sweep's base outcomes) are played
once for every step; a killed sweep trajectory resumes per checkpoint; the printed trajectory tables show the
``--json`` rows; the flags that cannot go with ``--all-checkpoints`` are one line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from test_tables import cli, close, flat, flat_lines, parse_tables, shows, shows_all  # noqa: E402,F401

STEPS = (2, 4, 6)
LABELS = [f"out-checkpoint-{s}" for s in STEPS]
KL_ARGS = dict(tasks="click-button,arithmetic", seeds=2, episodes=1, max_new_tokens=4, n_boot=300)
SWEEP_ARGS = dict(sweep="single", groups="attn,mlp", tasks="click-button", seeds=2, episodes=1, max_new_tokens=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny SFT policy and a GRPOTrainer output_dir of it: checkpoint-2 unmoved, then attention and MLP moved by
    2e-3·N(0, 1) per step (ρ = ‖Δ‖/‖W‖ ≈ 0.1 per step: a fine-tune, though the checkpoints record no parent)."""
    from conftest import planted_policies
    from trl_shapes import trl_run

    root = tmp_path_factory.mktemp("trajectory")
    sft = planted_policies(root, children=())["sft"]
    return {"sft": sft, "out": trl_run(root / "out", sft, steps=STEPS, scale=2e-3, still=(2,))}


def _data(path) -> dict[str, np.ndarray]:
    from graftkit.results.store import read_result

    res = read_result(path)
    return {k: np.asarray(res[k]) for k in res.data}


def _same_data(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        if a[k].dtype.kind in "OUS":
            assert a[k].tolist() == b[k].tolist(), k
        else:
            assert np.array_equal(a[k], b[k], equal_nan=True), k


def _invoke(*args, tmp_path, monkeypatch):
    from graftkit.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return CliRunner().invoke(app, [str(a) for a in args])


# ---------------------------------------------------------------------------------------------------- kl


@pytest.mark.slow
def test_kl_trajectory_is_each_checkpoints_kl_with_sft_rollouts_played_once(trained, tmp_path, monkeypatch):
    import graftkit.agent.kl as agent_kl
    from graftkit.evaluation.kl import KLConfig, KLResult, KLRun, KLTrajectory, run_kl

    played = []
    real = agent_kl.play_fixed

    def counted(policy, side, *args, **kwargs):
        played.append(side)
        return real(policy, side, *args, **kwargs)

    monkeypatch.setattr(agent_kl, "play_fixed", counted)
    traj = run_kl(KLConfig(model=trained["out"], base=trained["sft"], all_checkpoints=True, run=tmp_path / "t",
                           **KL_ARGS))
    assert isinstance(traj, KLTrajectory) and traj.steps == STEPS
    assert played == ["rl", "sft", "rl", "rl"]  # SFT's rollouts once, each checkpoint's own
    rows = traj.rows()
    assert [r["step"] for r in rows] == list(STEPS) and [r["checkpoint"] for r in rows] == LABELS
    views = [r.result for r in traj.runs]
    assert [Path(r.file).name for r in traj.runs] == [f"kl-{lab}-vs-sft.h5" for lab in LABELS]
    for step, v in zip(STEPS, views):
        stored = KLResult.read(v.path)
        assert stored.step == step and stored.trainer_run == str(trained["out"]) and stored.attrs["step"] == step
        assert Path(stored.model_path).name == f"checkpoint-{step}" and stored.base_path == str(trained["sft"])
    # SFT's side is the same rollouts at every step: its items, tokens, outcomes and played token ids
    for v in views[1:]:
        for name in ("tokens", "success", "invalid", "turns"):
            assert np.array_equal(np.asarray(v.result[name][1]), np.asarray(views[0].result[name][1])), name
        assert np.array_equal(v.token_values("sft", "token_id"), views[0].token_values("sft", "token_id"))
    # checkpoint-2 did not move: KL 0 exactly, both ways; then it grows with the movement
    assert (views[0].episode_kl("rl") == 0).all() and (views[0].episode_kl("sft") == 0).all()
    kl_rl = [r["rl"]["kl_per_token"][0] for r in rows]
    assert 0 == kl_rl[0] < kl_rl[1] < kl_rl[2]
    assert 0 == rows[0]["sft"]["kl_per_token"][0] < rows[1]["sft"]["kl_per_token"][0]
    for r, v in zip(rows, views):
        assert r["rl"]["kl_per_token"] == list(v.summary("rl")) and r["sft"]["parsed"] == v.parsed("sft")
        won = np.asarray(v.result["success"][0])
        assert r["rl"]["success"]["rate"] == pytest.approx(won.mean(), abs=1e-15)
    # each step is `kl --model checkpoint-N` bit for bit (same base, same decode seed), the last `kl --model OUT`
    played.clear()
    one = run_kl(KLConfig(model=trained["out"] / "checkpoint-4", base=trained["sft"], run=tmp_path / "one",
                          **KL_ARGS))
    last = run_kl(KLConfig(model=trained["out"], base=trained["sft"], run=tmp_path / "last", **KL_ARGS))
    assert isinstance(one, KLRun) and isinstance(last, KLRun) and played == ["rl", "sft"] * 2
    _same_data(_data(one.file), _data(traj.runs[1].file))
    _same_data(_data(last.file), _data(traj.runs[2].file))
    assert "step" not in one.result.attrs and one.result.step is None
    j = traj.as_json()
    assert j["trajectory"] == rows and [s["file"] for s in j["steps"]] == j["files"] == [r["file"] for r in rows]
    assert j["steps"][1]["tasks"] == one.as_json()["tasks"]


@pytest.mark.slow
def test_kl_trajectory_table_shows_its_json(cli, trained):
    j, text = cli("run_kl", "kl", "--model", trained["out"], "--base", trained["sft"], "--all-checkpoints",
                  "--tasks", KL_ARGS["tasks"], "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4",
                  "--n-boot", "300")
    (t,) = parse_tables(text)
    assert flat(f"{j['run']} (RL, 3 checkpoints) vs {j['base']} (SFT): KL in nats per action token") in flat(t.above)
    kl = {"KL(RL‖SFT)/token [95%]": "rl", "KL(SFT‖RL)/token [95%]": "sft"}
    assert t.headers == ["step", "checkpoint", *kl, "RL parsed", "SFT parsed", "RL success (95% Wilson)"]
    assert len(t.rows) == len(j["trajectory"]) == len(STEPS)
    for row, r in zip(t.rows, j["trajectory"]):
        assert row["step"] == str(r["step"]) and row["checkpoint"] == r["checkpoint"]
        for header, side in kl.items():
            assert shows_all(row[header], r[side]["kl_per_token"], 1.0), (header, row, r)
        for side in ("rl", "sft"):
            assert row[f"{side.upper()} parsed"] == f"{100 * r[side]['parsed']:.0f}%"
        s = r["rl"]["success"]
        assert shows_all(row["RL success (95% Wilson)"], [s["rate"], s["low"], s["high"]])
    below = flat_lines(t.below)
    sft = j["trajectory"][0]["sft"]["success"]
    assert f"SFT's rollouts, played once and scored by every checkpoint: success {100 * sft['rate']:.1f}%" in below
    for f in j["files"]:
        assert f"saved {f}" in below


# ------------------------------------------------------------------------------------------ graft sweeps


@pytest.mark.slow
def test_sweep_trajectory_resumes_per_checkpoint_and_equals_each_checkpoints_sweep(trained, tmp_path):
    from graftkit.graft.commands import GraftConfig, run_graft
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL, SweepResult

    common = dict(base=trained["sft"], metric="both", **SWEEP_ARGS)
    configs = [BASE_LABEL, RL_LABEL, "attn", "mlp"]

    class Killed(Exception):
        pass

    before = []

    def kill(what, advance, total, unit):
        if what == f"{LABELS[2]}: attn":
            raise Killed
        before.append(what)

    cfg = GraftConfig(rl=trained["out"], all_checkpoints=True, run=tmp_path / "t", **common)
    with pytest.raises(Killed):
        run_graft(cfg, kill)
    # one base for every step: ∅ played for the first checkpoint only; each checkpoint's own configurations
    assert {w for w in before if w.split(": ")[-1] in configs} == {
        f"{LABELS[0]}: {BASE_LABEL}", *(f"{lab}: {c}" for lab in LABELS[:2] for c in configs[1:]), f"{LABELS[2]}: {RL_LABEL}"}
    results = tmp_path / "t" / "results"
    assert sorted(p.name for p in results.glob("graft-single-*.h5")) == [f"graft-single-{lab}.h5" for lab in LABELS[:2]]
    played = []
    got = run_graft(cfg, lambda what, advance, total, unit: played.append(what))
    # the finished checkpoints resume whole, the killed one from its partial result (∅ and RL were in)
    assert got.resumed == {LABELS[0]: sorted(configs), LABELS[1]: sorted(configs),
                           LABELS[2]: sorted([BASE_LABEL, RL_LABEL])}
    assert {w for w in played if w.split(": ")[-1] in configs} == {f"{LABELS[2]}: attn", f"{LABELS[2]}: mlp"}
    assert got.steps == dict(zip(LABELS, STEPS)) and list(got.sweeps) == LABELS
    assert not list(results.glob(".partial-*"))
    j = got.as_json()
    rows = j["trajectory"]["rows"]
    assert [r["step"] for r in rows] == list(STEPS) and [r["checkpoint"] for r in rows] == LABELS
    assert j["trajectory"]["columns"] == "group" and j["trajectory"]["names"] == ["attn", "mlp"]
    for step, label, row in zip(STEPS, LABELS, rows):
        v = SweepResult.read(got.files[label])
        assert Path(got.files[label]).name == f"graft-single-{label}.h5" == Path(row["file"]).name
        assert v.attrs["step"] == step and v.attrs["trainer_run"] == str(trained["out"])
        assert Path(v.attrs["config"]["rl"]).name == f"checkpoint-{step}" and v.configs == configs
        # each step's file is the single-checkpoint sweep's
        one = run_graft(GraftConfig(rl=trained["out"] / f"checkpoint-{step}", run=tmp_path / f"one-{step}", **common))
        _same_data(_data(got.files[label]), _data(one.files["A"]))
        # the row shows the step's own effects: a single group's graft minus base, and the fraction it reproduces
        for g in ("attn", "mlp"):
            assert row["effects"][g]["success"][0] == pytest.approx(v.success(g) - v.success(BASE_LABEL), abs=1e-12)
            assert row["effects"][g]["reproduced_rl"][0] == pytest.approx(v.reproduced(g, "rl")[0], abs=1e-12,
                                                                           nan_ok=True)
        assert row["kl_rl_sft_per_token"] == v.kl_per_token(BASE_LABEL, "rl")
        assert row["rl_vs_base"] == v.diff(RL_LABEL).tolist() and row["rl_success"] == v.success(RL_LABEL)
    # one base for every step: its outcomes are checkpoint-2's; checkpoint-2 did not move, so each of its grafts
    # plays the base's episodes and reproduces no change (there is none: KL 0, the fraction undefined)
    first = _data(got.files[LABELS[0]])
    for label in LABELS[1:]:
        assert np.array_equal(_data(got.files[label])["success"][0], first["success"][0])
    assert (first["success"] == first["success"][0]).all() and rows[0]["kl_rl_sft_per_token"] == 0
    assert np.isnan(rows[0]["effects"]["attn"]["reproduced_rl"][0])
    assert 0 < rows[2]["effects"]["attn"]["reproduced_rl"][0] < 1 and rows[2]["kl_rl_sft_per_token"] > 0


@pytest.mark.slow
def test_sweep_trajectory_table_shows_its_json(cli, trained):
    j, text = cli("run_graft", "graft", "--from", trained["out"], "--base", trained["sft"], "--all-checkpoints",
                  "--sweep", "single", "--groups", "attn,mlp", "--tasks", "click-button", "--seeds", "2",
                  "--episodes", "1", "--max-new-tokens", "4", "--metric", "both")
    (t,) = parse_tables(text)  # the trajectory alone: each step's own tables are in its file and in --json
    traj = j["trajectory"]
    assert flat(f"{traj['trainer_run']}: the single sweep at every checkpoint (3 steps;") in flat(t.above)
    assert t.headers == ["step", "checkpoint", "RL success", "RL − base [95%]", "verdict", "KL(RL‖SFT)/token",
                         "attn: success [95%]", "attn: reproduced RL [95%]", "mlp: success [95%]",
                         "mlp: reproduced RL [95%]"]
    assert len(t.rows) == len(traj["rows"]) == len(STEPS) and set(j["runs"]) == set(LABELS)
    for row, r in zip(t.rows, traj["rows"]):
        assert row["step"] == str(r["step"]) and row["checkpoint"] == r["checkpoint"] and row["verdict"] == r["verdict"]
        assert shows(row["RL success"], r["rl_success"]) and shows_all(row["RL − base [95%]"], r["rl_vs_base"])
        assert close(row["KL(RL‖SFT)/token"], r["kl_rl_sft_per_token"])
        for g in ("attn", "mlp"):
            assert shows_all(row[f"{g}: success [95%]"], r["effects"][g]["success"])
            want = r["effects"][g]["reproduced_rl"]
            if any(x is None for x in want):  # undefined where the checkpoint did not move
                assert row[f"{g}: reproduced RL [95%]"] == "—"
            else:
                assert shows_all(row[f"{g}: reproduced RL [95%]"], want)
    assert row["attn: reproduced RL [95%]"] != "—"  # the last step moved
    below = flat_lines(t.below)
    assert f"group effect: {traj['formula']}" in below
    for f in j["files"].values():
        assert f"saved {f}" in below


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("args, said", [
    (["graft", "--from", "OUT", "--sweep", "single", "--vs", "SFT", "--all-checkpoints"],
     "--all-checkpoints applies to --eval and --sweep, not to --vs — drop --all-checkpoints"),
    (["graft", "--from", "OUT", "--groups", "attn", "--all-checkpoints"],
     "--all-checkpoints applies to --eval and --sweep, not to an export — drop --all-checkpoints"),
    (["graft", "--from", "OUT", "--sweep", "single", "--all-checkpoints", "--save", "x.h5"],
     "--save names one result file, but --all-checkpoints writes one per checkpoint"),
    (["kl", "--model", "OUT", "--all-checkpoints", "--save", "x.h5"],
     "--save names one result file, but --all-checkpoints writes one per checkpoint"),
    (["kl", "--model", "SFT", "--base", "SFT", "--all-checkpoints"], "is not a trainer output_dir"),
])
def test_what_cannot_go_with_all_checkpoints_is_one_line(tmp_path, monkeypatch, args, said):
    paths = {"OUT": tmp_path / "out", "SFT": tmp_path / "sft"}  # refused before a weight is read
    for folder in paths.values():
        folder.mkdir()
    r = _invoke(*(paths.get(a, a) for a in args), tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert said in r.stderr
    assert not (tmp_path / "runs").exists()


def test_all_checkpoints_is_read_by_the_modes_that_sweep():
    from graftkit.evaluation.kl import KLConfig
    from graftkit.graft.commands import GraftConfig

    for fields in ({"sweep": "single"}, {"eval_": True, "groups": "attn"}, {"sweep": "alpha", "metric": "kl"}):
        assert GraftConfig(rl=Path("out"), all_checkpoints=True, **fields).all_checkpoints
    with pytest.raises(GraftkitError, match="not to an export"):
        GraftConfig(rl=Path("out"), groups="attn", dry_run=True, all_checkpoints=True)
    assert KLConfig(model=Path("out"), all_checkpoints=True).all_checkpoints
    assert json.loads(json.dumps(KLConfig(model=Path("out"), all_checkpoints=True).as_dict(), default=str))[
        "all_checkpoints"] is True
