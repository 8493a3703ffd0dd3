"""``graftkit train grpo --trainer trl``: TRL's GRPOTrainer, with graftkit's web episodes as its rollout function.

TRL (1.16, the ``trl`` extra) owns the optimisation: advantages, the loss (``loss_type``, clipping, β·KL),
AdamW, the scheduler, gradient clipping and, under ``accelerate launch`` (configs/accelerate/), DDP, ZeRO-3
or FSDP. graftkit owns the data: its prompts (``train.grpo._prompts``, the same task instances per step as
``--trainer graftkit``), its episodes (``agent.rollout`` with the trainer's current model, graftkit's
per-episode sampling seeds) and its reward (``episode_rewards``: success 1/0, or the raw reward).

TRL 1.16's ``rollout_func(prompts, trainer)`` gets the rows of this process's generation batch (each prompt
``num_generations`` times, in groups) and returns one ``prompt_ids``/``completion_ids``/``logprobs`` per row;
``env_mask`` (1 = model token, 0 = environment token) keeps tokens out of the loss; other fields go to the
reward functions. One episode is one TRL completion (:func:`flatten_episode`)::

    prompt_ids      = P₁                      the first turn's prompt
    completion_ids  = a₁ P₂ a₂ … P_K a_K      each action aₖ (its end token included), each later prompt Pₖ
    env_mask        = 1…1 0…0 1…1 … 0…0 1…1   1 on action tokens, 0 on the prompts between turns
    logprobs        = the sampling log-probs on action tokens, 0 on environment tokens

What that means for a multi-turn episode, exactly: graftkit's agent reads a fresh prompt every turn (the
observation and the previous actions, what evaluation plays), so action aₖ (k ≥ 2) was sampled given Pₖ
alone, while TRL, which scores a completion as one continuation of its prompt, takes aₖ's log-prob, ratio
and gradient given the whole transcript P₁ a₁ … Pₖ. The first turn is scored in exactly the context it was
sampled in; with ``--max-turns 1`` (single-turn GRPO) every token is. The alternative — sampling every
turn after the transcript — would train a prompt format that evaluation never shows the policy.
(``--trainer graftkit`` scores every turn in its own prompt.)

Differences from ``--trainer graftkit`` besides that: TRL's constant-with-warmup schedule starts at lr 0
(graftkit's at lr/warmup); dr_grpo's normaliser is ``max_completion_length`` = ``--max-new-tokens`` even
where a multi-turn completion is longer; ``--loss gspo_token`` has no TRL counterpart (an error).
One graftkit step is one generation batch with ``num_iterations`` TRL optimiser steps (``max_steps`` =
steps × num_iterations); its log row is that batch's last update. Not offered: Mu-GRPO stages and veto,
focal scaling, VeriGate (configs.py refuses them), resumable checkpoints and ``--resume`` (TRL's
checkpoints hold optimizer pickles, which graftkit never loads), and ``--engine vllm`` generation through TRL's
vLLM integration (graftkit's rollout decodes with the trained model itself: ``--engine hf``, which ``auto`` means
here).

The final policy is written as ``--trainer graftkit`` writes it (an HF folder in ``save_dtype`` with
graftkit.json, train_log.jsonl, train_items.tsv), by the main process only; TRL's output_dir is a
scratch folder ``<out>.trl`` beside it, removed after the run.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import torch

from .._version import __version__
from ..agent import Decode, Episode, Policy, rollout
from ..core.devices import TRAINING_CONVENTION, autocast, dtype_name, resolve_device, training_dtype
from ..core.errors import GraftkitError
from ..webenv.items import SPLIT_RULE
from ..weights import load_model, save_model
from ..weights.hf import save_dtype
from .configs import GRPOConfig
from .grpo import ITEMS, LOG, _prompts, check_tokenizer_fits, episode_rewards, prompt_items

#: TRL's name of a logged quantity → graftkit's (train/grpo.py's log rows).
METRIC_NAMES = {
    "loss": "loss",
    "reward": "reward",
    "success": "success",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "kl": "kl_k3_mean",
    "entropy": "entropy",
    "clip_ratio/low_mean": "clip_frac_low",
    "clip_ratio/high_mean": "clip_frac_high",
    "cispo_clip_ratio": "clip_frac_high",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
}
#: graftkit's loss name → TRL's (loss_type, importance_sampling_level).
TRL_LOSSES = {
    "grpo": ("grpo", "token"),
    "dr_grpo": ("dr_grpo", "token"),
    "dapo": ("dapo", "token"),
    "cispo": ("cispo", "token"),
    "gspo": ("grpo", "sequence"),  # GSPO as TRL's paper index gives it: sequence-level ratio, grpo normaliser
}


# ------------------------------------------------------------------------------------ pure pieces


def trl_args(cfg: GRPOConfig, output_dir: str, world_size: int = 1) -> dict:
    """The keyword arguments of TRL's ``GRPOConfig`` that run ``cfg`` on ``world_size`` processes."""
    if cfg.loss not in TRL_LOSSES:
        raise GraftkitError(f"--loss {cfg.loss}: TRL's GRPOTrainer has no such loss",
                            f"use --trainer graftkit, or one of {', '.join(TRL_LOSSES)}")
    batch = cfg.prompts_per_step * cfg.group_size
    if batch % world_size:
        raise GraftkitError(f"--prompts-per-step × --group-size = {batch} episodes per step do not split over "
                            f"{world_size} processes", f"make it a multiple of {world_size}")
    dev = resolve_device(cfg.device)
    compute = training_dtype(cfg.dtype, dev)
    loss_type, level = TRL_LOSSES[cfg.loss]
    vllm = {}
    if cfg.trl_vllm_mode is not None:  # --engine vllm: TRL's vLLM integration, in --vllm-mode
        vllm = {"use_vllm": True, "vllm_mode": cfg.trl_vllm_mode}
        if cfg.vllm_server is not None:
            host, _, port = cfg.vllm_server.rpartition(":")
            if not host or not port.isdigit():
                raise GraftkitError(f"--vllm-server {cfg.vllm_server!r} is not HOST:PORT", "e.g. --vllm-server 10.0.0.5:8000")
            vllm.update(vllm_server_host=host, vllm_server_port=int(port))
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": batch // world_size,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_generations": cfg.group_size,
        "num_iterations": cfg.num_iterations,
        "max_steps": cfg.steps * cfg.num_iterations,
        "max_completion_length": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": 0,
        "learning_rate": cfg.lr,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": cfg.warmup,
        "weight_decay": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.99,
        "max_grad_norm": cfg.grad_clip,
        "beta": cfg.beta,
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "epsilon": cfg.epsilon,
        "epsilon_high": cfg.eps_high,
        "scale_rewards": cfg.scale_rewards,
        "seed": cfg.seed,
        "data_seed": cfg.seed,
        "shuffle_dataset": False,
        "bf16": compute == torch.bfloat16,
        "fp16": compute == torch.float16,
        "gradient_checkpointing": False,
        "use_cpu": dev.type == "cpu",
        "report_to": "none",
        "push_to_hub": False,
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "log_completions": False,
        "dataloader_num_workers": 0,
        **vllm,
    }


def flatten_episode(ep: Episode) -> dict:
    """One episode as one TRL completion (see the module docstring): ``prompt_ids``, ``completion_ids``,
    ``env_mask`` and ``logprobs``."""
    first, *later = ep.turns
    ids, mask, logps = list(first.action_ids), [1] * len(first.action_ids), list(first.logprobs)
    for turn in later:
        ids += list(turn.prompt_ids) + list(turn.action_ids)
        mask += [0] * len(turn.prompt_ids) + [1] * len(turn.action_ids)
        logps += [0.0] * len(turn.prompt_ids) + list(turn.logprobs)
    return {"prompt_ids": list(first.prompt_ids), "completion_ids": ids, "env_mask": mask, "logprobs": logps}


def episode_key(task: str, env_seed: int) -> str:
    """TRL's ``prompt`` of an episode: the task and environment seed it starts from (the rollout renders it)."""
    return f"{task}@{env_seed}"


def dataset_rows(cfg: GRPOConfig) -> list[dict]:
    """The run's prompts in order, ``prompts_per_step`` per step: ``prompt`` (:func:`episode_key`), task, env seed."""
    return [{"prompt": episode_key(t, s), "task": t, "env_seed": s}
            for step in range(cfg.steps) for t, s, _ in _prompts(cfg, step)]


def log_row(cfg: GRPOConfig, logs: dict, seconds: float, gen_seconds: float) -> dict:
    """A TRL log dict of the last update of graftkit step ``logs['step']`` as a graftkit log row."""
    row = {"step": logs["step"]}
    row.update({ours: float(logs[theirs]) for theirs, ours in METRIC_NAMES.items() if theirs in logs})
    episodes = cfg.prompts_per_step * cfg.group_size
    if "completions/mean_length" in logs:  # model tokens only (TRL counts env_mask = 1)
        row["tokens"] = round(float(logs["completions/mean_length"]) * episodes)
    row.update(episodes=episodes, gen_seconds=gen_seconds, seconds=seconds)
    return row


# ----------------------------------------------------------------------------------------- rollouts


def make_rollout(cfg: GRPOConfig, tokenizer, init: Path, gen_seconds: list[float]) -> Callable:
    """TRL's ``rollout_func``: plays this process's rows as graftkit episodes with the trainer's model.

    Row i of process p is sample (p·n + i) mod G of its group — graftkit's sample index, so episodes draw
    the per-episode seeds ``--trainer graftkit`` draws for the same step."""
    from trl.models import unwrap_model_for_generation

    def rollout_func(prompts: Sequence[str], trainer) -> dict:
        t0 = time.perf_counter()
        offset = trainer.accelerator.process_index * len(prompts)
        jobs = []
        for i, key in enumerate(prompts):
            task, _, seed = key.rpartition("@")
            jobs.append((task, int(seed), (offset + i) % cfg.group_size))
        step = trainer.state.global_step // cfg.num_iterations
        decode = Decode(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p,
                        max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 1_000_003 + step)
        dev = trainer.accelerator.device
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=trainer.args.ds3_gather_for_generation) as model, \
                torch.no_grad(), autocast(dev, training_dtype(cfg.dtype, dev)):
            episodes = rollout(Policy(model, tokenizer, init), jobs, decode,
                               batch_size=max(64, len(jobs)), max_turns=cfg.max_turns)
        flat = [flatten_episode(e) for e in episodes]
        gen_seconds.append(time.perf_counter() - t0)
        out = {k: [f[k] for f in flat] for k in ("prompt_ids", "completion_ids", "env_mask", "logprobs")}
        out["episode_reward"] = episode_rewards(episodes, cfg.reward).tolist()
        out["episode_success"] = [float(e.success) for e in episodes]
        return out

    return rollout_func


def web_task_reward(prompts=None, completions=None, episode_reward=None, episode_success=None,
                    log_metric=None, **_) -> list[float]:
    """The reward TRL sees: each completion's episode reward, from the rollout (success logged beside it)."""
    if log_metric is not None:
        log_metric("success", sum(episode_success) / len(episode_success))
    return list(episode_reward)


# -------------------------------------------------------------------------------------------- the run


def run_grpo_trl(cfg: GRPOConfig, *, resume: bool = False, force: bool = False,
                 on_step: Callable[[dict], None] = lambda m: None) -> Path:
    """Train per ``cfg`` with TRL's GRPOTrainer; returns the final policy folder (as ``train.grpo.run_grpo``)."""
    if resume:
        raise GraftkitError("--resume with --trainer trl: TRL's resumable checkpoints hold optimizer pickles, which "
                            "graftkit never loads", "run again without --resume, or use --trainer graftkit")
    if cfg.checkpoint_every:
        raise GraftkitError("--checkpoint-every with --trainer trl: TRL's resumable checkpoints hold optimizer "
                            "pickles, which graftkit never loads", "drop --checkpoint-every, or use --trainer graftkit")
    if cfg.trl_vllm_mode is not None:
        raise GraftkitError(f"--engine vllm (--vllm-mode {cfg.trl_vllm_mode}) with --trainer trl: graftkit's "
                            "multi-turn rollout decodes with the trained model itself; it does not generate through "
                            "TRL's vLLM integration",
                            "use --engine hf (TRL scales the training over accelerate launch without vLLM), or "
                            "--trainer graftkit --engine vllm")
    try:
        import trl
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
    except ImportError as e:
        raise GraftkitError(f"--trainer trl needs TRL: {e}", "pip install 'graftkit[trl]'") from None
    from accelerate import PartialState

    # First, so that a CPU run started by accelerate launch (torchrun) joins its process group over gloo.
    state = PartialState(cpu=resolve_device(cfg.device).type == "cpu")
    main = state.is_main_process
    if Path(cfg.out).exists() and not force:
        raise GraftkitError(f"output folder {cfg.out} already exists", "pass --force to replace it")
    torch.set_num_threads(cfg.threads)
    init = Path(cfg.init)
    model, tok = load_model(init)  # float32 master weights
    check_tokenizer_fits(Policy(model, tok, init), cfg.tasks)
    scratch = Path(str(Path(cfg.out)) + ".trl")
    # TRL builds the KL reference from the init folder, reading its class from config.json's "architectures",
    # which a tiny policy's config lacks: name the class the policy loaded as.
    ref = {"model_init_kwargs": {"architecture": type(model)}} if cfg.beta > 0 else {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated")
        args = trl.GRPOConfig(**trl_args(cfg, str(scratch), state.num_processes), **ref)
    gen_seconds: list[float] = []
    log: list[dict] = []

    class Log(TrainerCallback):
        def on_train_begin(self, a, st, control, **kw):
            self.t0 = time.perf_counter()

        def on_log(self, a, st, control, logs=None, **kw):
            if not (main and logs and "loss" in logs and st.global_step % cfg.num_iterations == 0):
                return
            row = log_row(cfg, {**logs, "step": st.global_step // cfg.num_iterations},
                          time.perf_counter() - self.t0, gen_seconds[-1] if gen_seconds else 0.0)
            log.append(row)
            on_step(row)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
        warnings.filterwarnings("ignore", message=".*model_init_kwargs.*ignored")
        trainer = trl.GRPOTrainer(model=model, reward_funcs=web_task_reward, args=args,
                                  train_dataset=Dataset.from_list(dataset_rows(cfg)), processing_class=tok,
                                  rollout_func=make_rollout(cfg, tok, init, gen_seconds), callbacks=[Log()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:  # sharded: gather a full copy (every process)
        full = trainer.accelerator.get_state_dict(trainer.model_wrapped)
        if main:
            model, _ = load_model(init)
            model.load_state_dict(full)
    else:
        model = trainer.accelerator.unwrap_model(trainer.model)
    trainer.accelerator.wait_for_everyone()
    dest = Path(cfg.out)
    if main:
        dest = _save(cfg, model.eval(), tok, log, trl.__version__, state.num_processes)
        shutil.rmtree(scratch, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    return dest


def _save(cfg: GRPOConfig, model, tok, log: list[dict], trl_version: str, processes: int) -> Path:
    """The final policy, as ``train.grpo._save`` writes it, with the producer naming TRL and its version."""
    from ..weights import describe, open_checkpoint

    parent = describe(open_checkpoint(cfg.init))
    dtype = save_dtype(cfg.save_dtype, Path(cfg.init))
    provenance = {
        "producer": f"graftkit train grpo --trainer trl (trl {trl_version})",
        "graftkit_version": __version__,
        "trl_version": trl_version,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.as_dict(),
        "step": cfg.steps,
        "parents": [{"role": "sft", **parent}],
        "base_model": {"path": parent["path"], "fingerprint": parent["fingerprint"]},
        "items": {"split": SPLIT_RULE, "prompts": f"{ITEMS} (task and item of every prompt, in order)"},
        "precision": {"compute_dtype": dtype_name(training_dtype(cfg.dtype, resolve_device(cfg.device))),
                      "saved_dtype": dtype_name(dtype), "convention": TRAINING_CONVENTION,
                      "device": str(next(model.parameters()).device)},
        "processes": processes,
    }
    log_bytes = "".join(json.dumps(m) + "\n" for m in log).encode()
    items = "".join(f"{t}\t{i}\n" for t, i in prompt_items(cfg, cfg.steps)).encode()
    return save_model(Path(cfg.out), model, tok, provenance=provenance, force=True, inputs=[Path(cfg.init)],
                      extra_files={LOG: log_bytes, ITEMS: items}, dtype=dtype)
