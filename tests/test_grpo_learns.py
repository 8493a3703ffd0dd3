"""GRPO learns what it must, and a broken GRPO does not.

The positive control of the study (``study/design.py`` CONTROL, with its HEADROOM_RECIPE): the shipped micro policy
fine-tuned on click-tab with a planted position bias (its demonstrator sends 60% of its clicks to the first tab), so its greedy policy
clicks the first tab and fails on most items while sampling still reaches the target. GRPO on training items
must remove the bias: greedy success on held-out items (never a prompt) rises credibly (a paired bootstrap
interval over items excluding zero). The same test fails for a trainer whose advantage sign is flipped, whose
optimiser does nothing, or whose loss credits the wrong tokens: each is planted below by patching one function
of ``train/grpo.py``, and each must show no credible gain.

Then the RL version of "overfit one batch": GRPO restricted to a handful of training items (``item_pool``)
drives their greedy and sampled success to 100% — on a web task and a verifiable one, on the micro policy; and on
a chat-templated model with a byte-level BPE tokenizer, whose rows hold exactly its sampled action tokens at their
sampling log-probabilities, one item (that tiny model does not read the instruction, so several items share one
learnable answer at most).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graftkit.agent import load_policy
from graftkit.agent.evaluate import evaluate
from graftkit.agent.rollout import Decode, rollout
from graftkit.stats import paired_bootstrap
from graftkit.study.design import CONTROL, EMBEDDED_SFT, HEADROOM_RECIPE
from graftkit.train import grpo as G
from graftkit.train.configs import GRPOConfig, SFTConfig
from graftkit.train.sft import run_sft

pytestmark = pytest.mark.slow
#: The tests of one trained policy (a module fixture) run on one xdist worker, so the policy is trained once.
ON_BIASED, ON_CHAT = pytest.mark.xdist_group("grpo-learns-biased"), pytest.mark.xdist_group("grpo-learns-chat")

HELD_OUT_SEEDS = list(range(40))  # 40 held-out click-tab items, one episode each


@pytest.fixture(scope="module")
def biased_sft(tmp_path_factory):
    """The study's positive-control policy, as the study trains it (study/pipeline.py sft_control_units): the shipped
    SFT policy trained further on click-tab demonstrations whose demonstrator sends 60% of its clicks to the first
    tab (CONTROL). Measured on this policy: greedy 52.5% on the held-out items; GRPO as it is 100% (+47.5 points
    [+32, +63]) after 20 steps and after 40; flipped advantage −30 points, no-op optimiser ±0, wrong tokens −22.5
    (20 steps) and −27.5 (40). (A policy trained from scratch for 100 steps, 22.5% greedy, did not move under GRPO
    at this learning rate: its training success stayed at 20–60% for 40 steps.)"""
    out = tmp_path_factory.mktemp("biased") / "sft"
    return run_sft(SFTConfig(out=out, init=EMBEDDED_SFT, tasks="click-tab",
                             decoys=(f"click-tab={CONTROL['decoy']}",), steps=int(CONTROL["steps"]), lr=CONTROL["lr"],
                             threads=1, seed=0))


def _greedy(path) -> np.ndarray:
    policy = load_policy(path)
    with torch.no_grad():
        return evaluate(policy, ["click-tab"], HELD_OUT_SEEDS, 1, Decode(greedy=True)).success[0, :, :, 0]


def _grpo(init, out, **kw):
    cfg = GRPOConfig(init=str(init), out=str(out), tasks="click-tab", steps=kw.pop("steps", 20),
                     lr=kw.pop("lr", HEADROOM_RECIPE["lr"]), temperature=HEADROOM_RECIPE["temperature"], prompts_per_step=4,
                     group_size=8, seed=0, **kw)
    return G.run_grpo(cfg, force=True)


def _flipped(monkeypatch):
    """The advantage's sign flipped: failures reinforced, successes suppressed."""
    real = G.row_advantages

    def flipped(cfg, episodes, rows):
        adv, weight, stats = real(cfg, episodes, rows)
        return -adv, weight, stats

    monkeypatch.setattr(G, "row_advantages", flipped)


def _no_op(monkeypatch):
    """An optimiser whose step does nothing (gradients computed, never applied)."""
    real = G.setup

    def setup(cfg):
        tr = real(cfg)
        tr.opt.step = lambda closure=None: None
        return tr

    monkeypatch.setattr(G, "setup", setup)


def _wrong_tokens(monkeypatch):
    """The loss's mask on the wrong tokens: each turn's last prompt tokens (as many as its action has) are
    trained on in place of the action."""
    real = G.episode_rows

    def rows(episodes, pad):
        shifted = []
        for ep in episodes:
            turns = []
            for t in ep.turns:
                n = len(t.action_ids)
                turns.append(dataclasses.replace(t, prompt_ids=list(t.prompt_ids[:-n]),
                                                 action_ids=list(t.prompt_ids[-n:])))
            shifted.append(dataclasses.replace(ep, turns=turns))
        return real(shifted, pad)

    monkeypatch.setattr(G, "episode_rows", rows)


@ON_BIASED
def test_the_planted_bias_leaves_reward_reachable(biased_sft):
    """The control's precondition: greedy fails on most held-out items, sampling often succeeds."""
    policy = load_policy(biased_sft)
    greedy = evaluate(policy, ["click-tab"], HELD_OUT_SEEDS, 1, Decode(greedy=True)).rate()
    sampled = evaluate(policy, ["click-tab"], HELD_OUT_SEEDS, 1, Decode(greedy=False, temperature=1.0), samples=8)
    pass_at_8 = sampled.success.any(-1).mean()
    assert greedy < 0.6 and pass_at_8 > greedy + 0.3, (greedy, pass_at_8)


@ON_BIASED
@pytest.mark.parametrize("broken", [None, _flipped, _no_op, _wrong_tokens],
                         ids=["grpo", "flipped-advantage", "no-op-optimiser", "wrong-tokens"])
def test_grpo_learns_where_reward_is_reachable(biased_sft, tmp_path, monkeypatch, broken):
    """A credible gain on held-out items for GRPO as it is; none for each broken trainer."""
    before = _greedy(biased_sft)
    if broken is not None:
        broken(monkeypatch)
    after = _greedy(_grpo(biased_sft, tmp_path / "rl"))
    ci = paired_bootstrap(before, after)  # [item, 1]: items as clusters, one episode each
    if broken is None:
        assert ci.low > 0 and after.mean() >= 0.9, ci
    else:
        assert not ci.low > 0, (broken.__name__, ci)


def _overfit(init, tasks: str, out, steps: int, pool: int = 4, **kw) -> tuple[float, float, float, float]:
    """(greedy, sampled) success on the pool's items before and after GRPO on ``item_pool`` of them."""
    cfg = GRPOConfig(init=str(init), out=str(out), tasks=tasks, steps=steps, item_pool=pool, prompts_per_step=4,
                     group_size=8, temperature=1.0, seed=kw.pop("seed", 0), **kw)
    jobs = list(dict.fromkeys((t, seed, 0) for t, seed, _ in G._prompts(cfg, 0)))  # the pool's items, once each
    per_item = 32 // len(jobs)  # 32 samples in all: 8 per item of a pool of 4, 32 of a pool of 1

    def rates(path):
        policy = load_policy(path)
        with torch.no_grad():
            greedy = np.mean([e.success for e in rollout(policy, jobs, Decode(greedy=True))])
            samples = [(t, s, k) for t, s, _ in jobs for k in range(per_item)]
            sampled = np.mean([e.success for e in rollout(policy, samples, Decode(greedy=False, temperature=1.0))])
        return float(greedy), float(sampled)

    return (*rates(init), *rates(G.run_grpo(cfg, force=True)))


@ON_BIASED
def test_grpo_overfits_a_few_web_items(biased_sft, tmp_path):
    """At the control's learning rate (HEADROOM_RECIPE): measured on training seeds 0/1/2, greedy 1.0 on every one
    and sampled 97-100% after 40 steps (from 50-75% greedy and 53-75% sampled). At 3e-4 the control's policy loses
    the action format on some seeds, as HEADROOM_CALIBRATION records."""
    g0, s0, g1, s1 = _overfit(biased_sft, "click-tab", tmp_path / "rl", steps=40, lr=HEADROOM_RECIPE["lr"])
    assert g0 < 1.0 and s0 < 0.8 and g1 == 1.0 and s1 >= 0.8, (g0, s0, g1, s1)


@pytest.fixture(scope="module")
def multiples_sft(tmp_path_factory):
    """A micro policy taught a verifiable task (multiples) in part: sampling solves some of its items."""
    out = tmp_path_factory.mktemp("multiples") / "sft"
    return run_sft(SFTConfig(out=out, tasks="multiples", steps=300, threads=1, seed=0))


def test_grpo_overfits_a_few_verifiable_items(multiples_sft, tmp_path):
    """Measured on training seeds 0/1/2 at 5e-4 and 40 steps: greedy 1.0 on every one, sampled 91-94% (at 1e-3
    and 20 steps, seed 0 stopped at 78%)."""
    g0, s0, g1, s1 = _overfit(multiples_sft, "multiples", tmp_path / "rl", steps=40, lr=5e-4, max_new_tokens=12)
    assert (g0 < 1.0 or s0 < 0.8) and g1 == 1.0 and s1 >= 0.8, (g0, s0, g1, s1)


@pytest.fixture(scope="module")
def chat_sft(tmp_path_factory):
    """A tiny Llama with a byte-level BPE tokenizer and ChatML's template, fine-tuned on click-tab demonstrations
    with the planted position bias: the policy reads the chat-templated prompt and ends its action with
    <|im_end|>."""
    from chat_models import chat_model_folder

    root = tmp_path_factory.mktemp("chat")
    init = chat_model_folder(root / "init", "chatml", hidden=64, layers=2)
    return run_sft(SFTConfig(out=root / "sft", init=init, tasks="click-tab", decoys=("click-tab=0.6",), steps=150,
                             threads=1, seed=0))


@ON_CHAT
def test_grpo_credits_a_chat_models_own_action_tokens(chat_sft):
    """On a chat-templated policy the trainer scores what the sampler drew: each row's targets are the generated
    action tokens, <|im_end|> last, and their log-probabilities under training equal the sampling ones."""
    policy = load_policy(chat_sft)
    cfg = GRPOConfig(init=str(chat_sft), out="unused", tasks="click-tab", item_pool=4, prompts_per_step=4,
                     group_size=8)
    episodes = rollout(policy, [(t, s, k) for t, s, _ in G._prompts(cfg, 0) for k in range(8)],
                       Decode(greedy=False, temperature=1.0, seed=1))
    rows = G.episode_rows(episodes, policy.pad_id)
    with torch.no_grad():
        logp, _ = G.action_logp(policy.model, rows, 1.0)
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [t for e in episodes for t in e.turns]
    for r, t in enumerate(turns):
        n = len(t.action_ids)
        assert rows.targets[r, :n].tolist() == t.action_ids and t.action_ids[-1] == end
        assert rows.mask[r].sum() == n
        assert torch.allclose(logp[r, :n], torch.tensor(t.logprobs), atol=1e-5)


@ON_CHAT
def test_grpo_overfits_one_item_on_a_chat_templated_model(chat_sft, tmp_path):
    """This tiny chat model does not read the instruction (its sampled tab is the same for every item), so on
    several items GRPO can only learn their most rewarded tab; on one item it must learn that item's. Measured on
    training seeds 0/1 (seed 2's item is solved before training): sampled success from 12% to 100% and 98% (64
    samples) after 100 steps; after 60 steps the same runs stood at 73% and 80%, still climbing."""
    g0, s0, g1, s1 = _overfit(chat_sft, "click-tab", tmp_path / "rl", steps=100, lr=3e-4, num_iterations=2, pool=1)
    assert g0 < 1.0 and s0 < 0.8 and g1 == 1.0 and s1 >= 0.8, (g0, s0, g1, s1)
