"""The agent: prompts and action text, batched KV-cached decoding, rollouts and evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graftkit.agent import Decode, canonical_action, evaluate, resolve_tasks, rollout, task_words, tiny_policy
from graftkit.agent.rollout import generate
from graftkit.core.errors import GraftkitError
from graftkit.webenv import make_env, parse_action
from graftkit.webenv.render import render_text
from graftkit.webenv.tasks import TASKS


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(task_words(), "nano", seed=0)


@pytest.mark.parametrize("action", ["click(8)", 'type(5, "Agustina")', 'type(12, "x1 Zq9")', "click(0)"])
def test_action_text_round_trips_through_the_tiny_tokenizer(policy, action):
    ids = policy.action_ids(action)
    assert ids[-1] == policy.tokenizer.eos_token_id
    assert parse_action(policy.decode_action(ids)) == parse_action(action)


def test_canonical_action_only_removes_decoder_spacing():
    assert canonical_action('type ( 5 , " John Smith " )') == 'type(5,"John Smith")'
    assert canonical_action("click ( 12 )\nclick(3)") == "click(12)"
    assert canonical_action('type(3, "a , b")') == 'type(3,"a , b")'  # inside quotes: untouched


def test_every_observation_and_oracle_action_is_known_to_the_tiny_vocabulary(policy):
    unk = policy.tokenizer.unk_token_id
    for task, spec in TASKS.items():
        env = make_env(task)
        for seed in range(40, 45):  # seeds outside those the vocabulary was built from
            obs = env.reset(seed)
            assert unk not in policy.prompt_ids(render_text(obs), []), task
            for a in spec.oracle(obs):
                assert unk not in policy.action_ids(a)


def test_batched_greedy_decoding_equals_hf_generate_one_prompt_at_a_time(policy):
    prompts = []
    for task in ("click-button", "enter-text", "click-checkboxes"):
        env = make_env(task)
        for seed in range(3):
            prompts.append(policy.prompt_ids(render_text(env.reset(seed)), ["click(3)"] * (seed % 2)))
    decode = Decode(greedy=True, max_new_tokens=6)
    toks, logps = generate(policy, prompts, decode, [torch.Generator() for _ in prompts])
    for p, t, lp in zip(prompts, toks, logps):
        ref = policy.model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False,
                                    pad_token_id=policy.pad_id, eos_token_id=sorted(policy.eos_ids))
        want = ref[0, len(p):].tolist()
        assert t == want[: len(t)] and len(t) == min(len(want), 6)
        # log-probs are those of the chosen tokens under the full-sequence forward pass
        full = torch.tensor([p + t])
        with torch.no_grad():
            logits = policy.model(full).logits[0, len(p) - 1 : -1].float()
        ref_lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(t)[:, None])[:, 0]
        assert np.allclose(lp, ref_lp.numpy(), atol=1e-4)


def test_sampling_is_reproducible_and_independent_of_batching(policy):
    jobs = [("click-button", s, k) for s in range(3) for k in range(2)]
    decode = Decode(greedy=False, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=7)
    a = rollout(policy, jobs, decode, batch_size=6)
    b = rollout(policy, jobs[::-1], decode, batch_size=2)[::-1]
    assert [[t.action_ids for t in e.turns] for e in a] == [[t.action_ids for t in e.turns] for e in b]
    c = rollout(policy, jobs, Decode(greedy=False, top_p=0.9, max_new_tokens=8, seed=8), batch_size=6)
    assert [e.turns[0].action_ids for e in a] != [e.turns[0].action_ids for e in c]


def test_rollout_keeps_turns_counts_invalid_and_stops_at_max_steps(policy):
    (ep,) = rollout(policy, [("click-checkboxes", 0, 0)], Decode(greedy=True, max_new_tokens=4))
    assert 1 <= len(ep.turns) <= TASKS["click-checkboxes"].max_steps
    for t in ep.turns:
        assert len(t.action_ids) == len(t.logprobs) <= 4 and t.prompt_ids[0] == policy.tokenizer.bos_token_id
    assert ep.invalid == sum(not t.valid for t in ep.turns)
    if not ep.done:
        assert len(ep.turns) == TASKS["click-checkboxes"].max_steps and not ep.success


def test_evaluate_shapes_pairing_and_determinism(policy):
    decode = Decode(greedy=True, max_new_tokens=6)
    out = evaluate(policy, ["click-button", "focus-text"], [0, 1, 2], 2, decode)
    assert out.success.shape == (2, 3, 2, 1) and out.turns.min() >= 1
    again = evaluate(policy, ["focus-text", "click-button"], [0, 1, 2], 2, decode, batch_size=5)
    assert np.array_equal(out.success[0], again.success[1]) and np.array_equal(out.reward[1], again.reward[0])


def test_resolve_tasks_and_bad_input():
    assert resolve_tasks("click-button, enter-text") == ["click-button", "enter-text"]
    assert set(resolve_tasks("all")) == set(TASKS)
    with pytest.raises(GraftkitError, match="unknown task or suite 'nope'"):
        resolve_tasks("nope")
    with pytest.raises(GraftkitError, match="temperature"):
        Decode(greedy=False, temperature=0)
    with pytest.raises(GraftkitError, match="greedy"):
        evaluate(tiny_policy(task_words(), "nano"), ["click-button"], [0], 1, Decode(), samples=2)


@pytest.mark.parametrize("task, unreadable", [("click-button", "click the button"), ("arithmetic", "912")])
def test_web_and_problem_envs_play_through_one_episode_interface(task, unreadable):
    """Rollouts read both kinds of environment through core.env.Env: the same members, the same Step."""
    from graftkit.agent import make_task_env
    from graftkit.core.env import Env, Step

    env = make_task_env(task)
    members = {n for n in vars(Env) if not n.startswith("_")} | set(Env.__annotations__)
    assert {"reset", "step", "parseable", "demonstration", "success", "close", "spec", "done", "raw_reward"} <= members
    assert all(hasattr(env, m) for m in members), [m for m in members if not hasattr(env, m)]
    obs = env.reset(0)
    plan = env.demonstration(obs)
    assert env.parseable(plan[0]) and not env.parseable(unreadable)
    step = env.step(plan[0])
    assert type(step) is Step and step.done and step.reward == 1.0 and env.success and step.observation.empty
    assert env.spec.progress(obs, step.observation, step.reward, step.done) == 1.0
