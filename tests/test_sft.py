"""SFT demonstrations: the demonstrator's decoys, ambiguous episodes, and the recipe's validation."""

from __future__ import annotations

import pytest

from graftkit.agent import task_words, tiny_policy
from graftkit.core.errors import GraftkitError
from graftkit.train.sft import (
    DEFAULT_BUDGETS, DEFAULT_DECOYS, TRAIN_SEED_BASE, SFTConfig, decoy_action, episode_examples,
)
from graftkit.webenv import make_env
from graftkit.study.design import SUITES
from graftkit.webenv.tasks import TASKS


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(task_words(), "nano")


def _action(policy, ex) -> str:
    return policy.decode_action(ex.action_ids)


@pytest.mark.parametrize("task", ["focus-text-2", "click-tab", "click-button", "click-link"])
def test_decoy_is_the_first_element_of_the_target_kind(policy, task):
    """Position bias: the slip clicks the first element with the target's tag and classes; none when the
    target is that element (or a twin of it), so a slip always fails the episode."""
    env, found, none = make_env(task), 0, 0
    for i in range(60):
        obs = env.reset(TRAIN_SEED_BASE + i)
        target = TASKS[task].oracle(obs)[0]
        slip = decoy_action(obs, target)
        el = next(e for e in obs.elements if e.ref == int(target[6:-1]))
        first = next(e for e in obs.elements if e.ref > 0 and (e.tag, e.classes) == (el.tag, el.classes))
        twin = el.text != "" and first.text == el.text
        assert slip == (None if first is el or twin else f"click({first.ref})")
        found += slip is not None
        none += slip is None
        if slip is not None:  # the slip fails the episode: a demonstrator's mistake, not another answer
            env.reset(TRAIN_SEED_BASE + i)
            assert env.step(slip).done and not env.success
    assert found > 10 and none > 5
    assert decoy_action(obs, 'type(4, "x")') is None


def test_decoy_rate_is_fixed_by_the_seed_and_near_the_rate(policy):
    env, task = make_env("focus-text-2"), "focus-text-2"
    slipped = eligible = 0
    for i in range(300):
        a = episode_examples(policy, env, task, TRAIN_SEED_BASE + i, 0.6)
        b = episode_examples(policy, env, task, TRAIN_SEED_BASE + i, 0.6)
        clean = episode_examples(policy, env, task, TRAIN_SEED_BASE + i, 0.0)
        assert a == b  # the same episode always gets the same demonstration
        eligible += _action(policy, clean[0]) != "click(4)"  # the target is not the first box
        if a != clean:
            slipped += 1
            assert len(a) == 1 and _action(policy, a[0]) == "click(4)" != _action(policy, clean[0])
            assert a[0].prompt_ids == clean[0].prompt_ids
    # two thirds of the episodes ask for the 2nd or 3rd box; 60% of those slip
    assert 0.5 < slipped / eligible < 0.7 and 0.3 < eligible / 300 < 0.8  # training items only: one of three is held out


def test_default_recipe_plants_no_bias():
    """The default demonstrator never slips: a decoy is an explicit, controlled condition (--decoy)."""
    assert DEFAULT_DECOYS == {} and SFTConfig(out="x").decoys == {}
    assert set(SUITES["mastered"]) | set(SUITES["headroom"]) <= set(DEFAULT_BUDGETS)


@pytest.mark.parametrize("decoys", [{"click-link": 1.0}, {"click-link": -0.1}, {"nope": 0.5}])
def test_bad_decoy_rates_are_one_clear_error(decoys):
    with pytest.raises(GraftkitError, match="decoy rates"):
        SFTConfig(out="x", decoys=decoys)


@pytest.mark.slow
def test_the_study_sft_policy_sits_where_the_suites_say(tmp_path, monkeypatch):
    """The study's SFT policy (assets/study-sft), measured on held-out items as the suites were set: greedy success
    on the mastered suite below the ceiling, in 90–97%, so an improvement could show; on every headroom task a
    reward that sampling reaches (pass@8 at least 30 points above greedy) without mastery; every task with at least
    20 distinct items and none trained on; trained by the study's recipe, to its target."""
    import json

    from typer.testing import CliRunner

    from graftkit.cli import app
    from graftkit.study.design import STUDY_SFT
    from graftkit.study.pipeline import EMBEDDED_SFT

    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    tasks = ",".join((*SUITES["mastered"], *SUITES["headroom"]))
    res = CliRunner().invoke(app, ["headroom", "--model", str(EMBEDDED_SFT), "--tasks", tasks, "--json", "--seeds", "25",
                                   "--episodes", "4", "--save", str(tmp_path / "h.h5")])
    assert res.exit_code == 0, res.output
    rows = {r["task"]: r for r in json.loads(res.stdout)["tasks"]}
    for t in SUITES["mastered"]:
        assert 0.9 <= rows[t]["greedy"] <= 0.97, rows[t]
    for t in SUITES["headroom"]:
        assert rows[t]["greedy"] < 0.9 and rows[t]["pass@8"] >= rows[t]["greedy"] + 0.3, rows[t]
    for r in rows.values():
        assert r["items"] >= 20 and r["overlap"] == 0 and not r["too_few_items"], r
    prov = json.loads((EMBEDDED_SFT / "graftkit.json").read_text())
    assert prov["config"]["until"] == STUDY_SFT["stage2"]["until"] and prov["stopping"]["reached"]
    assert prov["config"]["lr"] == STUDY_SFT["stage2"]["lr"] and not prov["config"]["decoys"]  # nothing planted

