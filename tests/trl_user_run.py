"""A researcher's own GRPO run, as TRL's documentation writes one: TRL's ``GRPOTrainer`` on a JSONL file of
conversational prompts (each with its own system message) whose answers are plain numbers, a reward function of the
user's that reads the last number, ``save_steps`` checkpoints in ``output_dir``. Nothing of graftkit is imported:
graftkit meets the run as it would meet anybody's.

    python tests/trl_user_run.py MODEL_DIR PROBLEMS.jsonl OUTPUT_DIR [STEPS]
"""

from __future__ import annotations

import re
import sys


def last_number(text: str) -> float | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    return float(found[-1]) if found else None


def reward_correct(completions, answer, **kwargs):
    """1 for the right number last; a little for writing any number (so that a random policy's groups differ)."""
    out = []
    for completion, want in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        got = last_number(text)
        out.append(1.0 if got is not None and got == float(want) else 0.2 if got is not None else 0.0)
    return out


def main(model: str, problems: str, output_dir: str, steps: int = 4) -> None:
    import torch
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    data = load_dataset("json", data_files=problems, split="train")
    args = GRPOConfig(output_dir=output_dir, max_steps=steps, save_steps=2, logging_steps=1, learning_rate=5e-3,
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=8, beta=0.04,
                      use_cpu=True, report_to="none", seed=0, save_only_model=False, bf16=False,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_correct, args=args, train_dataset=data)
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(x) for x in sys.argv[4:5]))
