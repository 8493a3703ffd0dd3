"""SFT and GRPO with LoRA (``--lora-r``): PEFT adapters trained, written as PEFT adapter folders that
graftkit's weights/ and PEFT itself read, resumable bit for bit."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graftkit.agent import load_policy
from graftkit.core.errors import GraftkitError
from graftkit.train.configs import GRPOConfig
from graftkit.train.grpo import latest_checkpoint, run_grpo
from graftkit.train.sft import SFTConfig, run_sft
from graftkit.weights import open_checkpoint
from graftkit.weights.resolve import open_model

TASKS = ("click-button", "click-link")
#: The embedded SFT policy: its groups have successes and failures, so GRPO has a signal to follow.
EMBEDDED = Path(__import__("graftkit").__file__).parent / "assets" / "sft"


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "sft"
    return run_sft(SFTConfig(out=str(out), budgets={"click-button": 30, "enter-text": 30}, size="nano", steps=40,
                             batch_size=16, lr=3e-3, warmup=5, threads=1))


@pytest.fixture(scope="module")
def lora_sft(sft, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "lora-sft"
    return run_sft(SFTConfig(out=str(out), init=str(sft), budgets={"click-button": 20}, steps=6, batch_size=8,
                             lr=1e-2, warmup=1, threads=1, lora_r=4, lora_alpha=8, lora_targets="qv"))


def _changed(a, b) -> set[str]:
    return {n for n in a.names if not torch.equal(a.read(n), b.read(n))}


def test_lora_sft_writes_a_peft_adapter_whose_exact_delta_touches_only_its_targets(sft, lora_sft):
    files = {p.name for p in lora_sft.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "graftkit.json", "tokenizer.json"} <= files
    assert "model.safetensors" not in files
    acfg = json.loads((lora_sft / "adapter_config.json").read_text())
    assert acfg["base_model_name_or_path"] == str(sft.resolve()) and acfg["r"] == 4 and acfg["lora_alpha"] == 8
    prov = json.loads((lora_sft / "graftkit.json").read_text())
    assert prov["lora"] == {"r": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"], "base": str(sft.resolve())}
    merged, base = open_model(lora_sft), open_checkpoint(sft)
    moved = _changed(merged, base)
    assert moved and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in moved)


def test_peft_loads_the_adapter_and_agrees_with_graftkit(sft, lora_sft):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sft), lora_sft).eval()
    ours = load_policy(lora_sft)
    ids = torch.tensor([ours.prompt_ids("button ONE", [])])
    with torch.no_grad():
        want, got = peft(input_ids=ids).logits, ours.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)


def test_train_sft_merges_its_adapter_and_resume_keeps_only_the_same_config(sft, tmp_path):
    """``merged``: the adapter merged into its base, a full-weight policy whose parent is the adapter. ``resume``
    keeps an adapter trained with this very config (a study stopped before the merge) and trains a changed one."""
    from graftkit.train.commands import run_train_sft

    cfg = SFTConfig(out=tmp_path / "adapter", merged=tmp_path / "merged", init=sft, budgets={"click-button": 20},
                    steps=3, batch_size=8, lr=1e-2, warmup=1, threads=1, lora_r=4, lora_alpha=8, lora_targets="qv")
    run = run_train_sft(cfg, results=tmp_path / "results")
    assert run.policy.resolve() == (tmp_path / "merged").resolve() and run.curves.last("loss") > 0
    merged, want = open_checkpoint(run.policy), open_model(tmp_path / "adapter")
    assert set(merged.names) == set(want.names) and not _changed(merged, want)
    assert _changed(merged, open_checkpoint(sft))  # the adapter moved it
    prov = json.loads((run.policy / "graftkit.json").read_text())
    assert prov["parents"] == [{"role": "adapter", "path": str((tmp_path / "adapter").resolve())}]
    assert prov["lora"]["r"] == 4 and prov["config"] == cfg.recorded()
    adapter = (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes()

    steps: list = []
    run_train_sft(cfg, resume=True, force=True, results=tmp_path / "results", on_step=steps.append)
    assert steps == [] and not _changed(open_checkpoint(tmp_path / "merged"), want)
    run_train_sft(replace(cfg, lr=1e-3), resume=True, force=True, results=tmp_path / "results", on_step=steps.append)
    assert len(steps) == 3 and (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes() != adapter
    with pytest.raises(GraftkitError, match="lora_r is 0"):
        replace(cfg, lora_r=0)


def _grpo(sft, out, **kw) -> GRPOConfig:
    base = dict(init=str(sft), out=str(out), tasks=TASKS, steps=3, prompts_per_step=2, group_size=4,
                max_new_tokens=12, lr=2e-2, threads=1, temperature=1.5, lora_r=4, lora_targets="attn")
    return GRPOConfig(**{**base, **kw})


def _bytes(folder: Path) -> bytes:
    return (folder / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
def test_lora_grpo_trains_an_adapter_and_resumes_bit_identically(tmp_path):
    sft = EMBEDDED
    cfg = _grpo(sft, tmp_path / "rl", checkpoint_every=1)
    straight = run_grpo(cfg)
    want = _bytes(straight)
    assert json.loads((straight / "graftkit.json").read_text())["lora"]["r"] == 4
    moved = _changed(open_model(straight), open_checkpoint(sft))
    assert moved and all(".self_attn." in n for n in moved)  # GRPO moved the adapter, nothing else
    # the run interrupted after step 1: only that checkpoint is left
    shutil.rmtree(straight)
    for ck in sorted(Path(str(straight) + ".checkpoints").glob("step-*"))[1:]:
        shutil.rmtree(ck)
    assert latest_checkpoint(cfg).name == "step-000001"
    assert (latest_checkpoint(cfg) / "training_state.safetensors").is_file()
    assert _bytes(run_grpo(cfg, resume=True)) == want


@pytest.mark.parametrize("kw, message", [
    (dict(lora_targets="nope_proj"), "has no such module"),
    (dict(lora_r=-1), "--lora-r -1 must be ≥ 0"),
])
def test_bad_lora_settings_are_one_clear_error(sft, tmp_path, kw, message):
    with pytest.raises(GraftkitError, match=message):
        run_grpo(_grpo(sft, tmp_path / "bad", steps=1, **kw))


def test_lora_needs_a_full_model_to_adapt(sft, lora_sft, tmp_path):
    with pytest.raises(GraftkitError, match="no --init was given"):
        SFTConfig(out=str(tmp_path / "x"), lora_r=4)
    with pytest.raises(GraftkitError, match="is a LoRA adapter"):
        run_grpo(replace(_grpo(sft, tmp_path / "y", steps=1), init=str(lora_sft)))
