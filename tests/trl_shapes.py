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


def trl_run(out: Path, sft: Path, steps=(2, 4, 6), scale: float = 1e-3, seed: int = 0) -> Path:
    """A GRPOTrainer ``output_dir`` whose checkpoints move the SFT model at ``sft`` by ``scale`` per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(sft)
    g = torch.Generator().manual_seed(seed)
    noise = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    done = 0
    for s in steps:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.dim() == 2 and ("self_attn" in n or "mlp" in n):
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
