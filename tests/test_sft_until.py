"""SFT trained until a target success on training items (``train sft --until TASKS=RATE``): it stops at the first
check that reaches the target, runs to --steps and says so when none does, checks only training items in eval
mode, refuses bad rules in one line, and leaves the training trajectory bit for bit as it is without checks.

A nano policy on click-tab with lr 6e-3 (warmup 100, batch 32, seed 0) scores 28–34% greedy on training items
(chance: a third) until step 40 and 94% at step 50 (measured), so ``--until click-tab=0.5`` stops at step 50
(≈ 20 s on one core, most of it generating demonstrations); the other runs use batches of 8 (≈ 2 s)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.train import sft as sft_module
from graftkit.train.sft import CHECK_METRIC, SFTConfig, Stopping, run_sft
from graftkit.train.commands import TrainingCurves
from graftkit.results.store import read_result
from graftkit.weights import read_tensors

TINY = ["--tasks", "click-tab", "--size", "nano", "--threads", "1"]


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))

    def invoke(*args):
        return CliRunner().invoke(app, ["train", "sft", *map(str, args)], catch_exceptions=True)

    return invoke


def _prov(folder) -> dict:
    return json.loads((folder / "graftkit.json").read_text())


def _log(folder) -> list[dict]:
    return [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_until_stops_at_the_first_check_that_reaches_the_target(cli, tmp_path):
    out = tmp_path / "sft"
    res = cli("--out", out, *TINY, "--batch-size", "32", "--lr", "6e-3", "--steps", "80", "--until", "click-tab=0.5",
              "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    stop = _prov(out)["stopping"]
    # the stop: a check step before --steps, the rate there ≥ target, every earlier check below it
    assert stop["reached"] and stop["stopped_at"] == stop["steps_run"] < 80 and stop["stopped_at"] % 10 == 0
    assert stop["rate"]["rate"] >= 0.5 and all(c["rate"] < 0.5 for c in stop["checks"][:-1])
    assert [c["step"] for c in stop["checks"]] == list(range(10, stop["stopped_at"] + 1, 10))
    r = stop["rate"]
    assert r["n"] == 32 and r["rate"] == r["successes"] / 32 and r["low"] <= r["rate"] <= r["high"]
    assert stop["items"] == "train" and stop["tasks"] == ["click-tab"] and stop["target"] == 0.5
    assert stop["max_steps"] == 80 and "cosine over --steps" in stop["lr_schedule"] and stop["check_seconds"] > 0
    assert _prov(out)["config"]["until"] == "click-tab=0.5" and _prov(out)["config"]["steps"] == 80
    # the command's report is the recorded stop
    assert info["steps"] == stop["stopped_at"] and info["stop"]["reached"] is True
    assert (info["stop"]["step"], info["stop"]["rate"], info["stop"]["target"]) == (stop["stopped_at"], r["rate"], 0.5)
    # the log and the curves: the checked rate at each check step, NaN between
    log = _log(out)
    assert len(log) == stop["stopped_at"]
    logged = [(m["step"], m[CHECK_METRIC]) for m in log if CHECK_METRIC in m]
    assert logged == [(c["step"], c["rate"]) for c in stop["checks"]]
    curves = TrainingCurves(read_result(info["curves"]))
    y = curves.values(CHECK_METRIC)
    checked = np.isfinite(y)
    assert list(curves.steps[checked]) == [c["step"] for c in stop["checks"]] and checked.sum() < len(y)
    assert curves.result.var_attrs[CHECK_METRIC]["items"] == "train"
    assert curves.attrs["stopping"]["stopped_at"] == stop["stopped_at"]


@pytest.mark.slow
def test_an_unreached_target_runs_to_steps_says_so_and_checks_only_training_items(cli, tmp_path, monkeypatch):
    """--steps 10 with checks every 5 (--check-every) on a learning rate still warming up: 1.0 is not reached.
    Each check is a greedy evaluation on training items, in eval mode, without gradients."""
    seen = []
    evaluate = sft_module.evaluate

    def spy(policy, tasks, seeds, episodes, decode, **kw):
        seen.append({"items": kw.get("items"), "greedy": decode.greedy, "training": policy.model.training,
                     "grad": torch.is_grad_enabled(), "tasks": list(tasks), "seeds": list(seeds), "episodes": episodes})
        return evaluate(policy, tasks, seeds, episodes, decode, **kw)

    monkeypatch.setattr(sft_module, "evaluate", spy)
    out = tmp_path / "sft"
    res = cli("--out", out, *TINY, "--batch-size", "8", "--steps", "10", "--until", "click-tab=1.0",
              "--check-every", "5", "--check-episodes", "8")
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "TARGET NOT REACHED" in text and ": 10 steps" in text and "< target 100%" in text
    stop = _prov(out)["stopping"]
    assert not stop["reached"] and stop["stopped_at"] is None and stop["steps_run"] == 10
    assert [c["step"] for c in stop["checks"]] == [5, 10] and stop["rate"]["rate"] < 1.0 and stop["rate"]["n"] == 8
    assert len(_log(out)) == 10 and (out / "model.safetensors").is_file()  # the policy is written all the same
    assert seen == [{"items": "train", "greedy": True, "training": False, "grad": False, "tasks": ["click-tab"],
                     "seeds": [0], "episodes": 8}] * 2
    # the checks leave the trajectory alone: the same run without a stopping rule ends on the same weights
    plain = run_sft(SFTConfig(out=tmp_path / "plain", tasks="click-tab", size="nano", batch_size=8, threads=1,
                              steps=10))
    a, b = read_tensors(out / "model.safetensors"), read_tensors(plain / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [m["loss"] for m in _log(out)] == [m["loss"] for m in _log(plain)]
    assert "stopping" not in _prov(plain) and "until" not in _prov(plain)["config"]


@pytest.mark.parametrize("until, needle", [
    ("mastered", "expected SUITE_OR_TASKS=RATE"), ("click-tab=1.5", "0 < RATE ≤ 1"),
    ("click-tab=0", "0 < RATE ≤ 1"),
    ("nope=0.5", "unknown task or suite 'nope'"), ("click-link=0.5", "not demonstrated"),
])
def test_bad_until_is_one_clear_error(cli, until, needle):
    res = cli("--out", "x", "--tasks", "click-tab", "--until", until)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "--until" in err and needle in err, err
    with pytest.raises(GraftkitError, match="--until"):
        SFTConfig(out="x", tasks="click-tab", until=until)


@pytest.mark.parametrize("field, value", [("check_every", 0), ("check_episodes", 0), ("check_episodes", 1001)])
def test_bad_check_settings_are_one_clear_error(field, value):
    with pytest.raises(GraftkitError, match=f"--{field.replace('_', '-')}"):
        SFTConfig(out="x", tasks="click-tab", until="click-tab=0.5", **{field: value})


def test_the_stop_reads_back_from_its_record():
    c = sft_module.Check(20, 30, 32, 0.8, 0.98, 0.1, {"click-tab": 30 / 32})
    s = Stopping("click-tab=0.9", ("click-tab",), 0.9, 10, 32, 100, (c,))
    assert s.reached and s.due(20) and s.due(100) and not s.due(25)
    assert Stopping.from_json(json.loads(json.dumps(s.as_json()))) == s
    assert "stopped at step 20" in s.summary() and math.isclose(s.outcome()["rate"], 30 / 32)
    assert "NOT REACHED" in Stopping("click-tab=1", ("click-tab",), 1.0, 10, 32, 20, (c,)).summary()


def test_a_check_restores_every_global_generator_and_the_train_mode(monkeypatch):
    """The trajectory test above cannot see a check that draws from a global generator (the nano policy has no
    dropout, and the demonstrations draw from their own generator): here the evaluation draws from torch's,
    Python's and NumPy's, and the check hands them back as they were, with the model in train mode again."""
    import random

    from graftkit.agent import tiny_policy, tiny_words

    evaluate = sft_module.evaluate

    def drawing(*a, **kw):
        torch.rand(3), random.random(), np.random.rand(3)
        return evaluate(*a, **kw)

    monkeypatch.setattr(sft_module, "evaluate", drawing)
    policy = tiny_policy(tiny_words(("click-tab",)), "nano")
    policy.model.train()
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    check = sft_module.training_item_check(policy, ["click-tab"], 4, step=7)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2]) and policy.model.training
    assert (check.step, check.n) == (7, 4) and check.low <= check.rate <= check.high
