"""`graftkit eval` and `graftkit headroom` end to end on a tiny saved policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from graftkit.agent import Policy, task_words, tiny_policy
from graftkit.cli import app
from graftkit.results.store import read_result
from graftkit.weights import load_model, save_model

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    paths = {}
    for seed in (0, 1):
        p = tiny_policy(task_words(), "nano", seed=seed)
        paths[seed] = save_model(root / f"policy{seed}", p.model, p.tokenizer, provenance={"producer": "test"})
    return paths


def _run(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    res = runner.invoke(app, args)
    return res


def test_saved_policy_loads_with_the_same_tokenizer_behaviour(saved):
    model, tok = load_model(saved[0])
    pol = Policy(model, tok)
    fresh = tiny_policy(task_words(), "nano", seed=0)
    action = 'type(7, "Zq9 Agustina")'
    assert pol.action_ids(action) == fresh.action_ids(action)
    assert pol.decode_action(pol.action_ids(action)) == fresh.decode_action(fresh.action_ids(action))


def test_eval_json_and_store(saved, tmp_path, monkeypatch):
    res = _run(["eval", "--model", str(saved[0]), "--tasks", "click-button,focus-text", "--seeds", "3",
                "--episodes", "2", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert [r["task"] for r in payload["tasks"]] == ["click-button", "focus-text", "all"]
    stored = read_result(payload["files"]["model"])
    assert stored.kind == "eval" and stored["success"].shape == (2, 3, 2, 1)
    assert stored.dims("success") == ("task", "seed", "episode", "sample")
    assert list(stored.coords["task"]) == ["click-button", "focus-text"]
    all_row = payload["tasks"][-1]["model"]
    assert all_row["n"] == 12 and all_row["successes"] == int(stored["success"].sum())
    assert stored.attrs["model"]["fingerprint"] and stored.attrs["decode"]["greedy"] is True


def test_eval_compare_pairs_identical_episodes(saved, tmp_path, monkeypatch):
    import graftkit.agent

    played = []
    real = graftkit.agent.evaluate

    def counting(policy, *args, **kwargs):
        played.append(policy)
        return real(policy, *args, **kwargs)

    monkeypatch.setattr(graftkit.agent, "evaluate", counting)
    res = _run(["eval", "--model", str(saved[0]), "--compare", str(saved[1]), "--tasks", "click-button",
                "--seeds", "2", "--episodes", "2", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["tasks"][0]
    assert row["verdict"] in ("credibly better", "credibly worse", "no credible change")
    assert row["bootstrap"][0] <= row["diff"] <= row["bootstrap"][1]
    assert 0 <= row["mcnemar_p"] <= 1
    assert len(played) == 2
    # the same model against itself: evaluated once, zero difference, no credible change
    res = _run(["eval", "--model", str(saved[0]), "--compare", str(saved[0]), "--tasks", "click-button",
                "--seeds", "2", "--episodes", "2", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert len(played) == 3
    payload = json.loads(res.stdout)
    row = payload["tasks"][0]
    assert row["diff"] == 0 and row["verdict"] == "no credible change" and row["mcnemar_p"] == 1
    model, compare = (read_result(payload["files"][k]) for k in ("model", "compare"))
    assert (model["success"] == compare["success"]).all()


def test_headroom_json(saved, tmp_path, monkeypatch):
    res = _run(["headroom", "--model", str(saved[0]), "--tasks", "click-button", "--k", "3", "--seeds", "2",
                "--episodes", "2", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    (row,) = payload["tasks"]
    assert row["headroom"] == pytest.approx(row["sampled"] - row["greedy"])
    assert row["sampled"] <= row["pass@3"] + 1e-12
    stored = read_result(payload["file"])
    assert stored["success"].shape == (1, 2, 2, 3) and stored["greedy_success"].shape == (1, 2, 2, 1)
    assert np.isclose(stored["success"].mean(), row["sampled"])


@pytest.mark.parametrize("args, message", [
    (["--tasks", "nope"], "unknown task or suite 'nope'"),
    (["--obs", "som"], "vision-language policy"),
    (["--backend", "chrome"], "unknown --backend"),
    (["--seeds", "0"], "--seeds 0 must be"),
    (["--sample", "--temperature", "0"], "temperature"),
])
def test_eval_bad_input_is_one_line(saved, tmp_path, monkeypatch, args, message):
    res = _run(["eval", "--model", str(saved[0]), *args], tmp_path, monkeypatch)
    assert res.exit_code == 2
    assert message in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_eval_model_without_tokenizer(tmp_path, monkeypatch, saved):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(saved[0], bare)
    for f in bare.glob("tokenizer*"):
        f.unlink()
    res = _run(["eval", "--model", str(bare), "--tasks", "click-button", "--seeds", "1"], tmp_path, monkeypatch)
    assert res.exit_code == 2 and "no tokenizer" in res.stderr
