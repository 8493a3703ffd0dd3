"""The TRL side of bench_grpo.py: TRL 1.16 GRPOTrainer on the shared setting, timed per step.

Runs in benchmarks/.venv-trl (``bash benchmarks/setup_trl.sh``), where graftkit is installed editable,
so the policy folder, prompts and reward come from benchmarks/grpo_setting.py like the graftkit side's.

How TRL is configured to run what graftkit runs:

- the model and tokenizer are loaded from the shared folder (fp32) and passed as objects; prompts are a
  plain-text ``prompt`` column (TRL tokenizes text prompts itself with the tokenizer's defaults;
  grpo_setting.prompt_rows has checked that this gives graftkit's ids, BOS included), with the
  ``task`` and ``env_seed`` columns that TRL hands to the reward function;
- one step = ``per_device_train_batch_size`` 16 = 2 prompts × ``num_generations`` 8, one generation
  per optimisation step (``steps_per_generation`` 1, ``num_iterations`` 1), the dataset in order
  (``shuffle_dataset=False``), so step s sees the same two episodes as graftkit's step s;
- fp32 and no gradient checkpointing, as graftkit trains (TRL's own defaults are ``bf16=True`` —
  autocast, also on CPU — and ``gradient_checkpointing=True``; ``--trl-defaults`` keeps them);
- AdamW with β₂ 0.99 and no weight decay, constant learning rate, grad-norm clip 1 (graftkit's);
- CPU, no vLLM, no evaluation, no checkpoints, no Hub, ``report_to="none"``.

Per-step time is the gap between consecutive ``on_step_end`` callbacks (the first step from
``on_train_begin``), so it covers generation, reward, loss, backward and the optimiser, as the graftkit
side's cumulative ``seconds`` does. Writes a JSON record to ``--out``.

    .venv-trl/bin/python benchmarks/trl_grpo.py --policy DIR --out trl.json [--steps-per-generation 5]
"""

from __future__ import annotations

import os

# Before any Hugging Face import: nothing from the network, no trackers.
for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "WANDB_DISABLED": "true", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}.items():
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from grpo_setting import Reward, Setting, load_policy, prompt_rows  # noqa: E402


def _hwm() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, required=True, help="the shared HF policy folder")
    ap.add_argument("--out", type=Path, required=True, help="JSON record to write")
    ap.add_argument("--setting", default="{}", help="JSON overrides of grpo_setting.Setting")
    ap.add_argument("--steps-per-generation", type=int, default=1,
                    help="TRL's staleness knob: optimisation steps per generation batch (1: on-policy)")
    ap.add_argument("--trl-defaults", action="store_true",
                    help="keep TRL's bf16 autocast and gradient checkpointing defaults")
    args = ap.parse_args(argv)
    s = Setting.from_dict({**Setting().to_dict(), **json.loads(args.setting)})

    t_import = time.perf_counter()
    import torch

    torch.set_num_threads(s.threads)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import_s = time.perf_counter() - t_import
    hwm_imports = _hwm()

    policy = load_policy(args.policy)
    rows = prompt_rows(policy, s)
    dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "task", "env_seed")} for r in rows])
    reward = Reward(policy)
    seeds_per_call: list[list[int]] = []
    lengths: list[int] = []  # completion tokens (EOS included when sampled), one per episode

    def reward_fn(prompts=None, completions=None, completion_ids=None, task=None, env_seed=None, **kw):
        seeds_per_call.append(sorted(set(int(e) for e in env_seed)))
        lengths.extend(len(c) for c in completion_ids)
        return reward(task=task, env_seed=env_seed, completion_ids=completion_ids)

    reward_fn.__name__ = "web_task_success"

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin = None
            self.ends: list[float] = []
            self.hwm_begin = 0
            self.hwm: list[int] = []

        def on_train_begin(self, a, state, control, **kw):
            self.begin = time.perf_counter()
            self.hwm_begin = _hwm()

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(time.perf_counter())
            self.hwm.append(_hwm())

    timer = StepTimer()
    gen_s: list[float] = []
    logs: list[dict] = []

    class LogKeeper(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                kept.append({"step": state.global_step,
                             **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

    kept = logs  # the callback's own parameter is called logs
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as tmp:
        extra = {} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}
        config = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            per_device_train_batch_size=s.prompts_per_step * s.group_size,
            gradient_accumulation_steps=1,
            num_generations=s.group_size,
            steps_per_generation=args.steps_per_generation,
            num_iterations=1,
            max_completion_length=s.max_new_tokens,
            temperature=s.temperature,
            top_p=1.0,
            top_k=0,
            learning_rate=s.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.99,
            max_grad_norm=1.0,
            beta=s.beta,
            loss_type=s.loss,
            epsilon=s.epsilon,
            scale_rewards="group",
            max_steps=s.steps,
            shuffle_dataset=False,
            seed=s.seed,
            data_seed=s.seed,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            log_completions=False,
            **extra,
        )
        trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=reward_fn,
            args=config,
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            callbacks=[timer, LogKeeper()],
        )
        # With tqdm disabled the Trainer prints every log dict to stdout; the record keeps them instead.
        trainer.remove_callback(PrinterCallback)
        # Generation time per step (the sampling half of a step), for the breakdown beside graftkit's.
        generate = trainer._generate_single_turn

        def timed_generate(*a, **kw):
            t = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                gen_s.append(time.perf_counter() - t)

        trainer._generate_single_turn = timed_generate
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0

    edges = [timer.begin, *timer.ends]
    step_s = [b - a for a, b in zip(edges, edges[1:])]
    per_step = s.prompts_per_step
    # The prompts TRL actually trained on, step by step, against the plan both sides share.
    gens = s.steps // args.steps_per_generation
    planned = [sorted(s.env_seeds()[g * per_step * args.steps_per_generation:
                                   (g + 1) * per_step * args.steps_per_generation]) for g in range(gens)]
    record = {
        "tool": f"trl {trl.__version__}",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__},
        "setting": s.to_dict(),
        "steps_per_generation": args.steps_per_generation,
        "trl_defaults": args.trl_defaults,
        "bf16": bool(config.bf16),
        "gradient_checkpointing": bool(config.gradient_checkpointing),
        "threads": torch.get_num_threads(),
        "import_s": import_s,
        # This process's peak RSS (bytes) after the imports, at on_train_begin and after each step.
        "peak_rss_after_imports": hwm_imports,
        "peak_rss_train_begin": timer.hwm_begin,
        "peak_rss_per_step": timer.hwm,
        "train_s": train_s,
        "step_seconds": step_s,
        "steps": len(step_s),
        "episodes": len(lengths),
        "prompts_match": seeds_per_call == planned,
        "seeds_per_generation": seeds_per_call,
        "generate_seconds": gen_s,
        "completion_tokens": sum(lengths),
        "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else 0.0,
        "log": logs,
    }
    rewards = [m["reward"] for m in logs if "reward" in m]
    record["reward_mean"] = sum(rewards) / len(rewards) if rewards else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: record[k] for k in ("tool", "steps", "episodes", "train_s", "prompts_match",
                                              "mean_completion_tokens", "reward_mean")}))
    return 0 if len(step_s) == s.steps and record["prompts_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
