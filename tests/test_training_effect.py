"""Training changes the policy: an SFT step and a GRPO step move the parameters, a fixed batch's SFT loss
falls, a GRPO step raises the advantage-weighted log-likelihood of its own samples, and a GRPO run resumed
from a checkpoint ends where the uninterrupted run does, at weights other than its init.

Every check is also run against a no-op optimizer (``torch.optim.AdamW.step``, which both trainers
construct, replaced by a function that does nothing). There each check must report "no change", so the
checks can fail, and the comparison of resumed with uninterrupted weights, which holds trivially with a
no-op optimizer, is never the only evidence that resuming works.

GRPO rewards are planted: the rollout the trainer calls plays the episodes as usual, and then the even
samples of each group are marked successes and the odd ones failures. Each group then has rewards
(1, 0, 1, 0), so every advantage is ±0.866 (never 0), whatever the untrained policy sampled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from graftkit.agent import task_words, tiny_policy
from graftkit.train import grpo as grpo_mod
from graftkit.train import sft as sft_mod
from graftkit.train.grpo import GRPOConfig, action_logp, latest_checkpoint, run_grpo
from graftkit.train.sft import SFTConfig, action_loss, batch_tensors, demonstrations, run_sft
from graftkit.weights import load_model, save_model

Params = dict[str, torch.Tensor]
TASKS = ("click-button", "enter-text")
SFT_BUDGETS = {"click-button": 3, "enter-text": 3}


# ------------------------------------------------------------------------------------------ the checks


def parameters(source) -> Params:
    """Every parameter tensor of a model, or of the model in an HF folder, as detached fp32 copies."""
    model = load_model(Path(source), need_tokenizer=False)[0] if isinstance(source, (str, Path)) else source
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def changed(before: Params, after: Params) -> frozenset[str]:
    """The names of the tensors in which some element differs (exact comparison: any update counts)."""
    if set(before) != set(after):
        raise ValueError(f"different parameter names: {sorted(set(before) ^ set(after))[:5]}")
    return frozenset(n for n in before if not torch.equal(before[n], after[n]))


def moved(before: Params, after: Params, required: frozenset[str] | None = None) -> bool:
    """True iff every tensor named in ``required`` (default: all of them) differs between ``before`` and
    ``after``: the verdict "training changed these parameters"."""
    required = frozenset(before) if required is None else required
    if not required:
        raise ValueError("no parameters to check: an empty requirement holds vacuously")
    return required <= changed(before, after)


@pytest.fixture
def noop_optimizer(monkeypatch):
    """``AdamW.step`` does nothing (both trainers construct ``torch.optim.AdamW``); counts the calls, so
    a test can tell that the trainer did reach the step."""
    calls = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: calls.append(1))
    return calls


def test_the_checks_on_planted_parameters():
    a = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    b = {"w": a["w"].clone(), "b": a["b"].clone()}
    assert changed(a, b) == frozenset() and not moved(a, b)
    b["w"][1, 2] = 1e-7
    assert changed(a, b) == {"w"} and moved(a, b, frozenset({"w"})) and not moved(a, b)
    b["b"][0] = -1.0
    assert moved(a, b)
    with pytest.raises(ValueError, match="different parameter names"):
        changed(a, {"w": a["w"]})
    with pytest.raises(ValueError, match="vacuously"):
        moved(a, b, frozenset())


# ------------------------------------------------------------------------------------------------ SFT


@pytest.fixture(scope="module")
def sft_batch():
    """A fixed batch of demonstration turns, tokenised by the tokenizer ``run_sft``'s tiny policy uses."""
    policy = tiny_policy(task_words(), "nano", seed=0)
    batch = demonstrations(policy, SFT_BUDGETS)[:8]
    assert len(batch) == 8
    return batch


def sft_init() -> torch.nn.Module:
    """The model ``run_sft`` starts from with no ``init``: the seeded tiny policy (rebuilt here; the no-op
    runs show that it is the trainer's init bit for bit)."""
    return tiny_policy(task_words(), "nano", seed=0).model


def batch_loss(model, batch) -> float:
    """The SFT loss (mean action-token cross-entropy) of ``model`` on ``batch``."""
    with torch.no_grad():
        return float(action_loss(model.eval(), *batch_tensors(batch, model.config.pad_token_id)))


def receives_gradient(model, batch) -> frozenset[str]:
    """The parameters whose SFT-loss gradient on ``batch`` has a nonzero element."""
    model = model.train()
    model.zero_grad(set_to_none=True)
    action_loss(model, *batch_tensors(batch, model.config.pad_token_id)).backward()
    out = frozenset(n for n, p in model.named_parameters() if p.grad is not None and bool(p.grad.any()))
    model.zero_grad(set_to_none=True)
    return out


def train_sft(tmp_path: Path, monkeypatch, batch, steps: int) -> Path:
    """``run_sft`` for ``steps`` steps, every step on ``batch``."""
    monkeypatch.setattr(sft_mod.DemoStream, "next_batch", lambda self, steps_left: list(batch))
    cfg = SFTConfig(out=str(tmp_path / "sft"), budgets=SFT_BUDGETS, size="nano", steps=steps,
                    batch_size=len(batch), lr=3e-3, warmup=1, threads=1)
    return run_sft(cfg)


def test_one_sft_step_changes_every_parameter_that_receives_gradient(tmp_path, monkeypatch, sft_batch):
    init = sft_init()
    needs = receives_gradient(init, sft_batch)
    before = parameters(init)
    assert needs == frozenset(before)  # the batch reaches every tensor, norms and output head included
    after = parameters(train_sft(tmp_path, monkeypatch, sft_batch, steps=1))
    assert moved(before, after, needs)


def test_sft_loss_on_a_fixed_batch_falls(tmp_path, monkeypatch, sft_batch):
    init = sft_init()
    out = train_sft(tmp_path, monkeypatch, sft_batch, steps=3)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["loss"] == pytest.approx(batch_loss(init, sft_batch), rel=1e-5)  # the batch the trainer saw
    assert [m["loss"] for m in log] == sorted(m["loss"] for m in log)[::-1]
    assert batch_loss(load_model(out)[0], sft_batch) < 0.95 * batch_loss(init, sft_batch)  # 8.17 → 6.98


def test_sft_checks_report_no_change_under_a_noop_optimizer(tmp_path, monkeypatch, sft_batch, noop_optimizer):
    init = sft_init()
    needs = receives_gradient(init, sft_batch)
    out = train_sft(tmp_path, monkeypatch, sft_batch, steps=3)
    assert len(noop_optimizer) == 3
    after = parameters(out)
    assert not moved(parameters(init), after, needs) and changed(parameters(init), after) == frozenset()
    assert not batch_loss(load_model(out)[0], sft_batch) < batch_loss(init, sft_batch)


# ----------------------------------------------------------------------------------------------- GRPO


@pytest.fixture(scope="module")
def grpo_init(tmp_path_factory) -> Path:
    """An untrained nano policy as the GRPO init (rewards are planted, so it needs no skill)."""
    policy = tiny_policy(task_words(), "nano", seed=1)
    return save_model(tmp_path_factory.mktemp("init") / "init", policy.model, policy.tokenizer,
                      provenance={"producer": "test_training_effect"})


def grpo_cfg(init: Path, out: Path, **kw) -> GRPOConfig:
    base = dict(init=str(init), out=str(out), tasks=TASKS, steps=1, prompts_per_step=1, group_size=4,
                max_new_tokens=6, max_turns=1, lr=3e-4, threads=1)
    return GRPOConfig(**{**base, **kw})


@pytest.fixture
def planted(monkeypatch):
    """Plant rewards (1, 0, 1, 0) on every group, and record each step's rows and token advantages."""
    real_rollout, real_advantages = grpo_mod.rollout, grpo_mod.row_advantages
    seen: list[tuple] = []

    def rollout(*args, **kwargs):
        episodes = real_rollout(*args, **kwargs)
        for ep in episodes:
            ep.done, ep.reward = True, float(ep.sample % 2 == 0)
        return episodes

    def row_advantages(cfg, episodes, rows):
        out = real_advantages(cfg, episodes, rows)
        seen.append((rows, out[0]))
        return out

    monkeypatch.setattr(grpo_mod, "rollout", rollout)
    monkeypatch.setattr(grpo_mod, "row_advantages", row_advantages)
    return seen


def nonzero_advantages(rows, token_adv: torch.Tensor) -> bool:
    """Every action token carries a nonzero advantage."""
    return bool((token_adv[rows.mask.bool()] != 0).all()) and bool(rows.mask.any())


def likelihood_gain(before, after, rows, token_adv: torch.Tensor, temperature: float) -> float:
    """Σ Â·(log π_after(a) − log π_before(a)) over the step's action tokens: > 0 when the update moved
    probability toward the positively advantaged samples and away from the others."""
    with torch.no_grad():
        lp0 = action_logp(before.eval(), rows, temperature)[0]
        lp1 = action_logp(after.eval(), rows, temperature)[0]
    return float((token_adv * (lp1 - lp0) * rows.mask).sum())


def test_one_grpo_step_with_nonzero_advantages_changes_the_policy(grpo_init, tmp_path, planted):
    cfg = grpo_cfg(grpo_init, tmp_path / "rl")
    out = run_grpo(cfg)
    (rows, token_adv), = planted
    assert nonzero_advantages(rows, token_adv)
    assert json.loads((out / "train_log.jsonl").read_text())["frac_reward_zero_std"] == 0.0
    init, final = load_model(grpo_init)[0], load_model(out)[0]
    assert moved(parameters(init), parameters(final))
    assert likelihood_gain(init, final, rows, token_adv, cfg.temperature) > 0


def test_grpo_checks_report_no_change_under_a_noop_optimizer(grpo_init, tmp_path, planted, noop_optimizer):
    cfg = grpo_cfg(grpo_init, tmp_path / "rl")
    out = run_grpo(cfg)
    (rows, token_adv), = planted
    assert nonzero_advantages(rows, token_adv) and len(noop_optimizer) == 1  # a real gradient, not applied
    init, final = load_model(grpo_init)[0], load_model(out)[0]
    before, after = parameters(init), parameters(final)
    assert not moved(before, after) and changed(before, after) == frozenset()
    assert likelihood_gain(init, final, rows, token_adv, cfg.temperature) == 0.0


def test_nonzero_advantages_check_on_an_equal_reward_group(grpo_init, tmp_path, monkeypatch):
    """Without planting, an untrained policy fails every episode: equal rewards, zero advantages, which
    the check reports (so its passing above is the planted rewards' doing)."""
    seen, real = [], grpo_mod.row_advantages

    def row_advantages(cfg, episodes, rows):
        out = real(cfg, episodes, rows)
        seen.append((rows, out[0]))
        return out

    monkeypatch.setattr(grpo_mod, "row_advantages", row_advantages)
    run_grpo(grpo_cfg(grpo_init, tmp_path / "rl"))
    (rows, token_adv), = seen
    assert not nonzero_advantages(rows, token_adv)


# --------------------------------------------------------------------------------------------- resume


def interrupted_then_resumed(cfg: GRPOConfig, at: int) -> tuple[Params, Params]:
    """Run ``cfg`` to the end, keep its final weights, then cut the run back to its checkpoint at step
    ``at`` (no final model, no later checkpoint, as a kill after that checkpoint leaves it) and resume:
    ``(uninterrupted, resumed)`` final parameters."""
    straight = parameters(run_grpo(cfg))
    shutil.rmtree(cfg.out)
    for ck in Path(str(cfg.out) + ".checkpoints").glob("step-*"):
        if int(ck.name.split("-")[1]) > at:
            shutil.rmtree(ck)
    assert latest_checkpoint(cfg).name == f"step-{at:06d}"
    return straight, parameters(run_grpo(cfg, resume=True))


def test_resumed_grpo_run_equals_the_uninterrupted_one_and_left_its_init(grpo_init, tmp_path, planted):
    cfg = grpo_cfg(grpo_init, tmp_path / "rl", steps=3, checkpoint_every=1)
    straight, resumed = interrupted_then_resumed(cfg, at=1)
    assert all(nonzero_advantages(r, a) for r, a in planted) and len(planted) == 3 + 2
    assert changed(straight, resumed) == frozenset()
    assert moved(parameters(grpo_init), straight)  # what a no-op optimizer would fail (below)


def test_resume_equality_is_trivial_under_a_noop_optimizer_but_leaving_init_is_not(grpo_init, tmp_path, planted,
                                                                                   noop_optimizer):
    cfg = grpo_cfg(grpo_init, tmp_path / "rl", steps=3, checkpoint_every=1)
    straight, resumed = interrupted_then_resumed(cfg, at=1)
    assert len(noop_optimizer) == 3 + 2
    assert changed(straight, resumed) == frozenset()  # the equality holds with nothing trained
    assert not moved(parameters(grpo_init), straight)  # the check that tells
