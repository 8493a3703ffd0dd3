"""A real TRL GRPOTrainer run's output_dir (full and PEFT LoRA), for graftkit to read as a user's would.

Runs in benchmarks/.venv-trl (``bash benchmarks/setup_trl.sh``): TRL 1.16 trains the shared tiny policy of
grpo_setting.py for a few steps with ``save_steps`` so that ``OUT/full/checkpoint-N/`` and
``OUT/lora/checkpoint-N/`` hold what TRL writes (weights or adapter, config, tokenizer,
``trainer_state.json``, the trainer's pickles). Then, from the project's venv:

    graftkit inspect OUT/full ; graftkit delta --base POLICY --from OUT/full --all-checkpoints
    graftkit graft --base POLICY --from OUT/lora --groups attn --out G ; graftkit rank --model OUT/lora --base POLICY
    graftkit eval --model OUT/full ; graftkit report

    .venv-trl/bin/python benchmarks/trl_output_dir.py --policy DIR --out OUT [--steps 4 --save-steps 2]
"""

from __future__ import annotations

import os

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "WANDB_DISABLED": "true", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}.items():
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from grpo_setting import Reward, Setting, load_policy, prompt_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--save-steps", type=int, default=2)
    args = ap.parse_args(argv)
    s = Setting.from_dict({**Setting().to_dict(), "steps": args.steps})

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(s.threads)
    for kind in ("full", "lora"):
        policy = load_policy(args.policy)
        rows = prompt_rows(policy, s)
        dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "task", "env_seed")} for r in rows])
        reward = Reward(policy)

        def web_task_success(prompts=None, completions=None, completion_ids=None, task=None, env_seed=None, **kw):
            return reward(task=task, env_seed=env_seed, completion_ids=completion_ids)

        config = GRPOConfig(
            output_dir=str(args.out / kind), use_cpu=True, bf16=False, gradient_checkpointing=False,
            per_device_train_batch_size=s.prompts_per_step * s.group_size, num_generations=s.group_size,
            max_completion_length=s.max_new_tokens, temperature=s.temperature, learning_rate=1e-3 if kind == "lora" else s.lr,
            max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps, logging_steps=1,
            report_to="none", disable_tqdm=True, seed=s.seed, beta=0.0, shuffle_dataset=False,
        )
        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None
        trainer = GRPOTrainer(model=policy.model, reward_funcs=web_task_success, args=config, train_dataset=dataset,
                              processing_class=policy.tokenizer, peft_config=peft)
        trainer.train()
        print(kind, sorted(p.name for p in (args.out / kind).iterdir()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
