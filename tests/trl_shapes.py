"""Trainer output folders as TRL 1.x and transformers write them, built without TRL or a download.

``trl_run(out, sft)``: ``out/checkpoint-{2,4,6}/`` each with ``model.safetensors`` (the SFT model moved a
little further at every step, saved in float32 as TRL does for a model loaded in float32),
``config.json``, the tokenizer, ``trainer_state.json`` (a GRPOTrainer-shaped ``log_history``) and the
trainer's pickles — written as bytes that are not a pickle at all, so that any attempt to read one fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

NOT_A_PICKLE = b"\x00not a pickle: a trainer's state that graftkit must never open\x00"
PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


def grpo_log(steps: list[int]) -> list[dict]:
    """A GRPOTrainer-shaped log_history: one train row per step, an eval row, the final summary row."""
    rows = []
    for s in range(1, max(steps) + 1):
        rows.append({"step": s, "epoch": s / max(steps), "loss": 0.1 / s, "grad_norm": 1.0 + s, "learning_rate": 1e-5,
                     "reward": 0.2 + 0.1 * s, "reward_std": 0.3, "kl": 0.001 * s, "entropy": 1.5 - 0.1 * s,
                     "completions/mean_length": 12.0, "clip_ratio/low_mean": 0.0, "rewards/success/mean": 0.2 + 0.1 * s})
    rows.append({"step": max(steps), "epoch": 1.0, "eval_loss": 0.5})
    rows.append({"step": max(steps), "epoch": 1.0, "train_runtime": 12.5, "train_loss": 0.05, "total_flos": 0.0})
    return rows


def trl_run(out: Path, sft: Path, steps=(2, 4, 6), scale: float = 1e-3, seed: int = 0, still=()) -> Path:
    """A GRPOTrainer ``output_dir`` whose checkpoints move the SFT model at ``sft`` by ``scale`` per step, except
    the steps up to each checkpoint in ``still`` (steps whose groups all scored the same reward: no gradient)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(sft)
    g = torch.Generator().manual_seed(seed)
    noise = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    done = 0
    for s in steps:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.dim() == 2 and ("self_attn" in n or "mlp" in n) and s not in still:
                    p.add_(scale * (s - done) * noise[n])
        done = s
        ck = out / f"checkpoint-{s}"
        model.save_pretrained(ck, safe_serialization=True)
        tok.save_pretrained(ck)
        state = {"global_step": s, "max_steps": max(steps), "log_history": [r for r in grpo_log(list(steps))
                                                                               if r["step"] <= s]}
        (ck / "trainer_state.json").write_text(json.dumps(state))
        for name in PICKLES:
            (ck / name).write_bytes(NOT_A_PICKLE)
    return out


def sft_log(steps: list[int]) -> list[dict]:
    """An SFTTrainer-shaped log_history (transformers' Trainer plus TRL's token statistics)."""
    rows = [{"step": s, "epoch": s / max(steps), "loss": 2.0 / s, "grad_norm": 0.5, "learning_rate": 2e-5,
             "mean_token_accuracy": 0.5 + 0.05 * s, "num_tokens": 1000.0 * s, "entropy": 1.0} for s in range(1, max(steps) + 1)]
    return rows + [{"step": max(steps), "epoch": 1.0, "train_runtime": 3.0, "train_loss": 0.7, "total_flos": 0.0}]


def _trainer_files(ck: Path, s: int, steps, log) -> None:
    state = {"global_step": s, "max_steps": max(steps), "log_history": [r for r in log(list(steps)) if r["step"] <= s]}
    (ck / "trainer_state.json").write_text(json.dumps(state))
    for name in PICKLES:
        (ck / name).write_bytes(NOT_A_PICKLE)


def sft_trainer_run(out: Path, sft: Path, steps=(3, 6), seed: int = 1) -> Path:
    """An SFTTrainer ``output_dir``: full checkpoints, its own log keys."""
    trl_run(out, sft, steps=steps, seed=seed)
    for s in steps:
        _trainer_files(out / f"checkpoint-{s}", s, steps, sft_log)
    return out


def trl_lora_run(out: Path, sft: Path, steps=(2, 4), rank: int = 4, seed: int = 2) -> Path:
    """A GRPOTrainer ``output_dir`` with ``peft_config``: each checkpoint an adapter (rank ``rank`` on q_proj
    and v_proj, growing with the step) whose ``base_model_name_or_path`` is the local SFT folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(sft)
    pm = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                                          init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    direction = {n: torch.randn(p.shape, generator=g) for n, p in pm.named_parameters() if "lora_" in n}
    for s in steps:
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_A" in n:
                    p.copy_(0.3 * direction[n])
                elif "lora_B" in n:
                    p.copy_(0.01 * s * direction[n])  # B grows along one direction: Δ = s·B@A has rank ``rank``
        ck = out / f"checkpoint-{s}"
        pm.save_pretrained(ck, safe_serialization=True)
        tok.save_pretrained(ck)
        _trainer_files(ck, s, steps, grpo_log)
    return out
