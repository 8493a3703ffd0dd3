"""Items: evaluation plays only held-out items, training (SFT demonstrations, GRPO prompts) only the others."""

from __future__ import annotations

import numpy as np
import pytest

from graftkit.agent.evaluate import plan_episodes
from graftkit.core.errors import GraftkitError
from graftkit.webenv import make_env
from graftkit.webenv.items import HELDOUT_MOD, NoItems, draw, is_heldout, item_id, too_few
from graftkit.webenv.render import render_text


def test_item_is_what_the_policy_sees():
    env = make_env("focus-text")
    a, b = env.reset(0), env.reset(1)  # different seeds, the same text: one item
    assert render_text(a) == render_text(b) and item_id(a) == item_id(b)
    env = make_env("click-button")
    assert item_id(env.reset(0)) != item_id(env.reset(1))
    assert len(item_id(env.reset(0))) == 16 and item_id(env.reset(0), "som") != item_id(env.reset(0))


def test_split_is_about_one_in_mod():
    env = make_env("click-button")
    held = [is_heldout(item_id(env.reset(s))) for s in range(400)]
    assert abs(np.mean(held) - 1 / HELDOUT_MOD) < 0.07


@pytest.mark.parametrize("task", ["click-button", "enter-text", "click-tab"])
def test_evaluation_and_training_draw_disjoint_items(task):
    env = make_env(task)
    train = {draw(env, 10_000_000 + i, heldout=False)[1] for i in range(150)}
    kept, seeds, items, dropped = plan_episodes([task], range(40), 2)
    assert kept == [task] and not dropped
    held = set(items.ravel())
    assert held and not held & train
    assert all(is_heldout(i) for i in held) and not any(is_heldout(i) for i in train)
    for s, i in zip(seeds.ravel(), items.ravel()):  # the recorded seed shows the recorded item
        assert item_id(env.reset(int(s))) == i


def test_plan_is_identical_for_every_policy_and_all_mode_keeps_seeds():
    a = plan_episodes(["click-link"], range(5), 2)
    b = plan_episodes(["click-link"], range(5), 2)
    assert (a[1] == b[1]).all() and (a[2] == b[2]).all()
    _, seeds, items, _ = plan_episodes(["click-link"], range(5), 2, items="all")
    assert seeds.ravel().tolist() == [1000 * s + e for s in range(5) for e in range(2)]
    _, tseeds, titems, _ = plan_episodes(["click-link"], range(5), 2, items="train")
    assert not any(is_heldout(i) for i in titems.ravel())


def test_a_task_with_too_few_items_is_left_out_or_refused():
    env = make_env("focus-text")  # one item: either evaluation or training has none
    (item,) = {item_id(env.reset(s)) for s in range(5)}
    split = "train" if is_heldout(item) else "heldout"
    with pytest.raises(NoItems):
        draw(env, 0, heldout=split == "heldout")
    kept, _, _, dropped = plan_episodes(["click-tab", "focus-text"], range(3), 1, items=split)
    assert kept == ["click-tab"] and dropped == ["focus-text"]
    with pytest.raises(GraftkitError, match="focus-text"):
        plan_episodes(["focus-text"], range(3), 1, items=split)


def test_too_few():
    assert too_few(1, 50) and too_few(12, 50) and not too_few(40, 50) and not too_few(10, 10)


def test_sft_demonstrations_are_training_items():
    from graftkit.agent import task_words, tiny_policy
    from graftkit.train.sft import TRAIN_SEED_BASE, episode_examples

    policy = tiny_policy(task_words(), "nano")
    env = make_env("enter-text")
    seen = []
    for i in range(80):
        ex = episode_examples(policy, env, "enter-text", TRAIN_SEED_BASE + i)
        assert ex
        seen.append(policy.tokenizer.decode(list(ex[0].prompt_ids)))
    held = {item_id(env.reset(int(s))) for s in plan_episodes(["enter-text"], range(30), 2)[1].ravel()}
    names = {render_text(env.reset(int(s))).splitlines()[0] for s in plan_episodes(["enter-text"], range(30), 2)[1].ravel()}
    assert held and names
    # no demonstrated prompt shows a held-out instruction
    assert not any(n.split(": ", 1)[1].split('"')[1] in p for n in names for p in seen)


def test_grpo_prompts_are_training_items():
    from graftkit.train.configs import GRPOConfig
    from graftkit.train.grpo import prompt_items

    cfg = GRPOConfig(init="x", out="y", tasks=("enter-text", "click-tab"), steps=30, prompts_per_step=4)
    items = prompt_items(cfg, 30)
    assert len(items) == 120 and not any(is_heldout(i) for _, i in items)
    held = set(plan_episodes(["enter-text"], range(25), 2)[2].ravel())
    assert not held & {i for t, i in items if t == "enter-text"}


def _eval_with_items(items, success):
    from graftkit.evaluation.commands import EvalResult

    tasks = ("click-tab",)
    return EvalResult(tasks, np.arange(items.shape[0]), success[None, ..., None].astype(np.int8),
                      attrs={"items": "heldout"}, item=items[None].astype(object)).to_result()


def test_report_states_items_and_refuses_to_pair_other_items():
    from graftkit.figures.success import item_line, paired_vs

    held = [f"{4 * k:016x}" for k in range(40)]  # digests ≡ 0 mod 4: held out
    items = np.array(held[:20]).reshape(10, 2)
    a = _eval_with_items(items, np.ones((10, 2)))
    b = _eval_with_items(items, np.zeros((10, 2)))
    line = item_line(a)
    assert "click-tab 20/20" in line and "held-out split: 0" in line
    assert paired_vs(a, b)["click-tab"].diff == -1.0
    other = _eval_with_items(np.array(held[20:]).reshape(10, 2), np.zeros((10, 2)))
    assert paired_vs(a, other) == {}  # other items: no pairing, nothing claimed
    few = _eval_with_items(np.array([held[0]] * 20).reshape(10, 2), np.ones((10, 2)))
    assert "click-tab 1/20 (too few)" in item_line(few)
    trained = _eval_with_items(np.array([f"{4 * k + 1:016x}" for k in range(20)]).reshape(10, 2), np.ones((10, 2)))
    assert "held-out split: 20" in item_line(trained)
