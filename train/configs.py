"""The configs of ``graftkit train sft``, ``train grpo`` and ``sweep``, and the SFT's default recipe, importable
without torch.

The command line generates its options from these fields, so they live apart from the training code
(``train/sft.py``, ``train/grpo.py`` and ``train/sweep.py`` re-export them): building the CLI never imports torch.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping

from ..core.config import (GENERATION_ENGINES, DeviceOption, ExecutorOption, LoraOption, RunOption, check_choice,
                           opt)
from ..core.errors import GraftkitError

# ------------------------------------------------------------------------------------------------ SFT

#: Demonstration pools per task in the default recipe: fresh episodes throughout for every task with a rich
#: item space (and the few-item tasks, whose items may all be held out), a small reused pool for the long
#: form tasks (see :class:`~graftkit.train.sft.DemoStream`). Only training items are demonstrated
#: (``webenv.items``).
DEFAULT_BUDGETS: dict[str, int] = {
    **{t: 1_000_000 for t in ("click-tab", "click-button", "click-link", "click-checkboxes", "use-autocomplete",
                              "enter-text", "enter-password", "login-user", "enter-text-2", "focus-text-2",
                              "focus-text")},
    **{t: 60 for t in ("click-checkboxes-large", "enter-text-long", "fill-form")},
}

#: The default recipe's demonstrator never slips. ``--decoy TASK=RATE`` makes it slip as a controlled
#: condition: in that fraction of its episodes (where a slip exists) its click goes to a decoy — the first
#: element of the target's kind (see :func:`~graftkit.train.sft.decoy_action`), a position bias that plants
#: headroom (greedy picks the decoy, sampling finds the target); every output of a study using it says so.
DEFAULT_DECOYS: dict[str, float] = {}

#: Fields of :class:`SFTConfig` that say where its outputs go or how the command line spelled the pools (recorded
#: as the pools they give, under ``budgets``), not how the policy trains: the policy's recorded config leaves them out.
SFT_NOT_RECORDED = ("command", "run", "tasks", "merged")
#: Fields of :class:`SFTConfig` that only matter with ``until`` (the stopping rule): without it a policy's recorded
#: config leaves them out, so it equals what a run without a stopping rule always recorded.
SFT_STOPPING = ("until", "check_every", "check_episodes")


def parse_until(text: str) -> tuple[tuple[str, ...], float]:
    """``SUITE_OR_TASKS=RATE`` (``--until``) as (task names, target rate in (0, 1])."""
    from ..agent import resolve_tasks

    spec, sep, rate = text.rpartition("=")
    try:
        target = float(rate) if sep and spec.strip() else math.nan
    except ValueError:
        target = math.nan
    if not 0 < target <= 1:
        raise GraftkitError(f"--until {text!r}: expected SUITE_OR_TASKS=RATE with 0 < RATE ≤ 1",
                            "e.g. --until mastered=0.93 or --until click-tab,click-button=0.9")
    try:
        tasks = resolve_tasks(spec)
    except GraftkitError as e:
        raise GraftkitError(f"--until {text!r}: {e.what}", e.fix) from None
    return tuple(tasks), target


def parse_budgets(items: tuple[str, ...], tasks: str | None) -> dict[str, int]:
    """Demonstration pools: the default recipe's (restricted to ``tasks``), then each ``TASK=N``."""
    budgets = dict(DEFAULT_BUDGETS)
    if tasks:
        from ..agent.tasks import resolve_tasks, task_spec

        keep = set(resolve_tasks(tasks))
        fresh = {t: task_spec(t).demo_pool for t in sorted(keep - set(budgets))}
        budgets = {t: n for t, n in budgets.items() if t in keep} | fresh
    for item in items:
        task, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise GraftkitError(f"--budget {item!r}: expected TASK=N", "e.g. --budget click-tab=200")
        budgets[task.strip()] = int(n)
    return budgets


def parse_decoys(items: tuple[str, ...]) -> dict[str, float]:
    """Demonstrator slip rates: the default recipe's, then each ``TASK=RATE``."""
    decoys = dict(DEFAULT_DECOYS)
    for item in items:
        task, sep, rate = item.partition("=")
        try:
            decoys[task.strip()] = float(rate) if sep else math.nan
        except ValueError:
            decoys[task.strip()] = math.nan
        if not 0 <= decoys[task.strip()] < 1:
            raise GraftkitError(f"--decoy {item!r}: expected TASK=RATE with 0 ≤ RATE < 1", "e.g. --decoy focus-text-2=0.5")
    return decoys


@dataclass(frozen=True, kw_only=True)
class SFTConfig(RunOption, DeviceOption, LoraOption):
    """``graftkit train sft``: supervised fine-tuning of a policy on oracle demonstrations (see train/sft.py).

    ``budgets`` and ``decoys`` are mappings (exactly these pools and slip rates), or, as the command line gives
    them, ``TASK=N`` / ``TASK=RATE`` strings that change the default recipe (its pools restricted to ``tasks``).
    The fields keep what was given, so a config derived with ``replace`` (another ``tasks``, say) resolves again;
    :attr:`pools` is the demonstration pools they resolve to, and decoys are a mapping once created. The policy's
    graftkit.json records :meth:`recorded` (its ``budgets``: the pools)."""

    command = "train sft"
    out: Path
    """Output folder of the SFT policy."""
    tasks: str | None = None
    """Suite(s) or tasks to demonstrate (default: both suites)."""
    budgets: Mapping[str, int] = opt(None, flags=("--budget",), cli_type=List[str])
    """Demonstration pool of a task: TASK=N episodes (repeatable)."""
    decoys: Mapping[str, float] = opt(None, flags=("--decoy",), cli_type=List[str])
    """Demonstrator slip rate of a task: TASK=RATE (repeatable; default: none — a decoy plants a position bias)."""
    size: str = "micro"
    """Tiny policy size: nano, micro, small."""
    init: Path | None = None
    """Fine-tune this HF causal LM folder instead of a tiny policy."""
    steps: int = 6000
    """Optimizer steps (with --until: the most it may take; the cosine schedule runs over these steps)."""
    until: str | None = None
    """Stop at the first check where the pooled greedy success on TRAINING items of these tasks reaches RATE:
    SUITE_OR_TASKS=RATE, e.g. mastered=0.93 (default: train all --steps)."""
    check_every: int = 10
    """With --until: optimizer steps between checks (and a last check at --steps)."""
    check_episodes: int = 32
    """With --until: greedy episodes per task at each check, on the same training items every check."""
    batch_size: int = 32
    """Turns per step."""
    lr: float = 3e-3
    """Peak learning rate."""
    warmup: int = opt(100, cli=False)
    """Linear warmup steps (then cosine decay to 10% of ``lr``)."""
    weight_decay: float = opt(0.01, cli=False)
    """AdamW weight decay (of the matrices; biases and norms get none)."""
    grad_clip: float = opt(1.0, cli=False)
    """Gradient-norm clip."""
    seed: int = 0
    """Seed."""
    threads: int = 2
    """torch threads."""
    save_dtype: str = "auto"
    """dtype of the written policy: auto (the init checkpoint's; float32 for a tiny policy), float32, bfloat16 or
    float16."""
    merged: Path | None = opt(None, cli=False)
    """With ``lora_r``: also write the adapter merged into ``init`` to this folder, a full-weight policy (what a
    study's grid, deltas and grafts read)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.budgets, Mapping) and self.tasks:
            raise GraftkitError("--tasks restricts the default recipe, but the pools were given whole (a mapping)",
                                "drop tasks, or give the pools as TASK=N changes to the default recipe")
        decoys = dict(self.decoys) if isinstance(self.decoys, Mapping) else parse_decoys(tuple(self.decoys or ()))
        object.__setattr__(self, "decoys", decoys)
        self._validate()

    @functools.cached_property
    def pools(self) -> dict[str, int]:
        """Demonstration episodes per task: ``budgets`` given whole, else the default recipe's pools restricted to
        ``tasks`` with each ``TASK=N`` change applied."""
        if isinstance(self.budgets, Mapping):
            return dict(self.budgets)
        return parse_budgets(tuple(self.budgets or ()), self.tasks)

    def _validate(self) -> None:
        from ..agent.tasks import HINT, known
        from ..webenv.tasks import TASKS
        from .lora import lora_spec

        unknown = [t for t in self.pools if not known(t)]
        if unknown:
            raise GraftkitError(f"unknown task(s) in budgets: {', '.join(unknown)}", HINT)
        bad = [f"{t}={r}" for t, r in self.decoys.items() if t not in TASKS or not 0 <= r < 1]
        if bad:
            raise GraftkitError(f"decoy rates {', '.join(bad)}: need a known task and a rate in [0, 1)",
                                "e.g. --decoy focus-text-2=0.6")
        if not any(v > 0 for v in self.pools.values()):
            raise GraftkitError("no demonstrations: every budget is 0", "give at least one task a budget > 0")
        if lora_spec(self.lora_r, self.lora_alpha, self.lora_targets) and not self.init:
            raise GraftkitError("--lora-r trains an adapter over a model folder, but no --init was given",
                                "pass the model to adapt as --init DIR, or drop --lora-r")
        if self.merged is not None and not self.lora_r:
            raise GraftkitError("merged names the folder of a LoRA adapter merged into its base, but lora_r is 0",
                                "set lora_r, or drop merged (a full fine-tune is the policy itself)")
        for name in ("steps", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise GraftkitError(f"--{name.replace('_', '-')} must be ≥ 1")
        if not self.lr > 0:
            raise GraftkitError(f"--lr {self.lr} must be > 0", "pass e.g. --lr 2e-3")
        self._validate_until()

    def _validate_until(self) -> None:
        from ..agent.evaluate import MAX_EPISODES_PER_SEED

        if self.check_every < 1:
            raise GraftkitError(f"--check-every {self.check_every} must be ≥ 1", "pass e.g. --check-every 10")
        if not 1 <= self.check_episodes <= MAX_EPISODES_PER_SEED:
            raise GraftkitError(f"--check-episodes {self.check_episodes} must be in 1..{MAX_EPISODES_PER_SEED}",
                                "pass e.g. --check-episodes 32")
        target = self.until_target()
        missing = [t for t in (target[0] if target else ()) if self.pools.get(t, 0) < 1]
        if missing:
            raise GraftkitError(f"--until {self.until!r}: {', '.join(missing)} not demonstrated (no budget)",
                                "add them with --tasks or --budget TASK=N, or drop them from --until")

    def until_target(self) -> tuple[tuple[str, ...], float] | None:
        """``until`` parsed: (the tasks whose pooled training-item success is checked, the target rate), or None."""
        return None if self.until is None else parse_until(self.until)

    def recorded(self) -> dict:
        """The config the trained policy's graftkit.json records: how it trained, as JSON-able data (the
        stopping rule's fields only with ``until``)."""
        skip = SFT_NOT_RECORDED + (SFT_STOPPING if self.until is None else ())
        return {k: dict(self.pools) if k == "budgets" else v for k, v in self.as_dict().items() if k not in skip}


# ----------------------------------------------------------------------------------------------- GRPO

#: The GRPO trainers ``train grpo --trainer`` runs (``--engine`` is what generates the rollouts, as in every command).
TRAINERS = ("graftkit", "trl")
#: How TRL's vLLM integration generates (``--vllm-mode``, TRL's ``vllm_mode``) with ``--trainer trl --engine vllm``.
VLLM_MODES = ("colocate", "server")
#: Fields that say where a run trains or where its results go, not how it trains: a resumed run may differ in them.
NOT_TRAINING = ("run", "device")


def recorded_grpo(config: Mapping) -> dict:
    """A GRPO run's recorded config (graftkit.json's ``config``) in today's field names. A record written before
    ``--trainer`` existed names the trainer ``engine`` (graftkit or trl), what generated graftkit's rollouts
    ``rollout_engine`` (hf or vllm), and TRL's vLLM generation ``vllm`` (colocate, server or null); those become
    ``trainer``, ``engine`` and ``vllm_mode``. Any other record is returned as it is (a copy)."""
    out = dict(config)
    if "trainer" in out or not (out.get("engine") in TRAINERS or "rollout_engine" in out or "vllm" in out):
        return out
    trainer = out.pop("engine") if out.get("engine") in TRAINERS else "graftkit"
    rollout, mode = out.pop("rollout_engine", "hf"), out.pop("vllm", None)
    engine = ("vllm" if mode is not None else "hf") if trainer == "trl" else rollout
    return {**out, "trainer": trainer, "engine": engine, "vllm_mode": mode}


@dataclass(frozen=True, kw_only=True)
class GRPOConfig(DeviceOption, LoraOption):
    """One GRPO run: the knobs of the control grid and the variant switches (see train/grpo.py)."""

    command = "train grpo"
    init: str = opt(cli_type=Path)
    """The SFT policy to start from."""
    out: str = opt(cli_type=Path)
    """Output folder of the RL policy."""
    run: str | None = opt(None, flags=("--run",), cli_type=Path)
    """Run folder whose results/ get the training curves (default: the run named in runs/.current, else runs/);
    where results go, not how the policy trains: a resumed run may name another."""
    tasks: tuple[str, ...] = opt("mastered", cli_type=str)
    """Suite(s) or tasks sampled as prompts."""
    steps: int = 40
    """Optimisation steps."""
    prompts_per_step: int = 4
    """Task instances (groups) per step."""
    item_pool: int = 0
    """Draw the prompts from the first N training items of each task, over and over (0: a fresh training item
    for every prompt). A few items is the RL version of overfitting one batch: a trainer that learns drives
    their success to 100% within a few dozen steps."""
    group_size: int = 8
    """Episodes per task instance (G)."""
    lr: float = 1e-4
    """Learning rate."""
    warmup: int = 0
    """Linear warmup steps."""
    beta: float = 0.0
    """KL weight to the SFT reference (k3); 0 loads no reference."""
    loss: str = "dapo"
    """grpo, dr_grpo, dapo, cispo, gspo."""
    epsilon: float = 0.2
    """Clip ε_low."""
    epsilon_high: float | None = None
    """Clip ε_high (default ε_low; cispo: the cap ε_max)."""
    scale_rewards: str = "group"
    """group, batch or none."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 32
    """Longest action in tokens."""
    num_iterations: int = 1
    """Optimiser updates per generated batch."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off)."""
    seed: int = 0
    """Training seed."""
    threads: int = 1
    """torch threads."""
    stages: int = 0
    """Mu-GRPO generation→optimisation stages (0: off)."""
    veto_epsilon: float | None = None
    """Mu-GRPO negative-advantage veto ε_v (default off)."""
    focal_gamma: float = 0.0
    """Focal difficulty scaling γ (0: off)."""
    verigate: bool = False
    """VeriGate process-reward fallback for equal-reward groups."""
    reward: str = "success"
    """success (1/0) or raw (MiniWoB++ raw reward)."""
    checkpoint_every: int = 0
    """Resumable checkpoint every N steps."""
    max_turns: int | None = None
    """End episodes after N turns (1: single-turn GRPO)."""
    save_dtype: str = "auto"
    """dtype of the written checkpoints: auto (the init checkpoint's), float32, bfloat16 or float16."""
    trainer: str = "graftkit"
    """The training backend: graftkit (this trainer, every variant) or trl (TRL's GRPOTrainer with graftkit's
    environment as its rollout function; multi-GPU under accelerate launch; needs the trl extra)."""
    engine: str = "hf"
    """What generates the rollouts, as in every command: hf (graftkit's batched decoder over the trained model),
    vllm (the vllm extra) or auto (vllm where it is installed; hf with --trainer trl). --trainer graftkit: a vLLM
    engine whose weights are synced from the trainer before each generation (every step on-policy, once per stage
    with --stages); --trainer trl: TRL's vLLM integration (--vllm-mode)."""
    vllm_mode: str | None = None
    """--trainer trl --engine vllm: how TRL's vLLM integration runs, colocate or server (default colocate)."""
    vllm_server: str | None = None
    """--vllm-mode server: the trl vllm-serve address, HOST:PORT (default: TRL's, localhost:8000)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("init", "out"):  # the command line gives paths; the recorded config keeps strings
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        from ..agent import resolve_tasks

        # a suite or comma list, as on the command line, or names (a user's task file loads here)
        object.__setattr__(self, "tasks", tuple(resolve_tasks(self.tasks)) if self.tasks else ())
        self._validate()

    def _validate(self) -> None:
        from .losses import LOSSES

        if not self.lr > 0:
            raise GraftkitError(f"--lr {self.lr} must be > 0", "pass e.g. --lr 1e-4")
        if self.group_size < 2:
            raise GraftkitError(f"--group-size {self.group_size} must be ≥ 2 (advantages compare a group)",
                                "pass e.g. --group-size 8")
        for name in ("steps", "prompts_per_step", "num_iterations", "max_new_tokens", "threads"):
            if getattr(self, name) < 1:
                raise GraftkitError(f"--{name.replace('_', '-')} must be ≥ 1")
        if self.item_pool < 0:
            raise GraftkitError(f"--item-pool {self.item_pool} must be ≥ 0",
                                "pass 0 (a fresh item for every prompt) or a few items, e.g. --item-pool 4")
        if self.loss not in LOSSES:
            raise GraftkitError(f"unknown --loss {self.loss!r}", f"use one of {', '.join(LOSSES)}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise GraftkitError(f"unknown --scale-rewards {self.scale_rewards!r}", "use group, batch or none")
        if self.reward not in ("success", "raw"):
            raise GraftkitError(f"unknown --reward {self.reward!r}", "use success or raw")
        from ..agent.tasks import HINT, known

        bad = [t for t in self.tasks if not known(t)]
        if bad or not self.tasks:
            raise GraftkitError(f"unknown task(s) {', '.join(bad) or '(none given)'}", HINT)
        if self.beta < 0 or self.focal_gamma < 0 or self.warmup < 0 or self.checkpoint_every < 0:
            raise GraftkitError("--beta, --focal-gamma, --warmup and --checkpoint-every must be ≥ 0")
        if self.stages < 0 or (self.stages and self.steps % self.stages):
            raise GraftkitError(f"--stages {self.stages} must divide --steps {self.steps}",
                                "pick a number of stages that divides the steps")
        if not self.temperature > 0:
            raise GraftkitError(f"--temperature {self.temperature} must be > 0")
        from ..core.devices import SAVE_DTYPES, check_dtype

        check_dtype(self.save_dtype, "--save-dtype", SAVE_DTYPES)
        check_choice(self.trainer, TRAINERS, "--trainer")
        if self.engine in TRAINERS:  # the training backend under the generation engine's flag
            raise GraftkitError(f"--engine {self.engine!r} is not an option of train grpo: --engine picks what "
                                "generates the rollouts (hf, vllm or auto)",
                                "the training backend is --trainer graftkit|trl")
        check_choice(self.engine, GENERATION_ENGINES, "--engine")
        if self.vllm_mode is not None:
            check_choice(self.vllm_mode, VLLM_MODES, "--vllm-mode")
        trl_vllm = (self.trainer, self.engine) == ("trl", "vllm")
        if (self.vllm_mode is not None or self.vllm_server is not None) and not trl_vllm:
            raise GraftkitError("--vllm-mode and --vllm-server need --trainer trl --engine vllm",
                                "add --trainer trl --engine vllm, or drop them")
        if self.vllm_server is not None and self.vllm_mode != "server":
            raise GraftkitError("--vllm-server names the server of --vllm-mode server", "add --vllm-mode server")
        if self.trainer == "graftkit" and self.lora_r and (self.engine == "vllm" or self.engine_name == "vllm"):
            auto = " (--engine auto picks vllm where it is installed)" if self.engine == "auto" else ""
            raise GraftkitError(f"--engine vllm syncs full weights into the engine; a LoRA run's adapters are not "
                                f"synced{auto}", "drop --lora-r, or use --engine hf")
        if self.trainer == "trl":
            own = [f for f, on in (("--stages", self.stages), ("--veto-epsilon", self.veto_epsilon is not None),
                                   ("--focal-gamma", self.focal_gamma > 0), ("--verigate", self.verigate)) if on]
            if own:
                raise GraftkitError(f"{', '.join(own)}: TRL's GRPOTrainer has no such variant",
                                    "use --trainer graftkit for Mu-GRPO, focal scaling and VeriGate")
        self.engine_name  # vllm where it is not installed: one error before any model loads
        if self.max_turns is not None and self.max_turns < 1:
            raise GraftkitError(f"--max-turns {self.max_turns} must be ≥ 1")

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def engine_name(self) -> str:
        """``engine`` resolved (:func:`graftkit.agent.engine.resolve_engine`): hf or vllm. With ``--trainer trl``,
        auto is hf: graftkit's rollout under TRL decodes with the trained model, not through TRL's vLLM."""
        if self.engine == "hf" or (self.engine == "auto" and self.trainer == "trl"):
            return "hf"  # no import of the agent's engine module for these
        from ..agent.engine import resolve_engine

        return resolve_engine(self.engine)

    @property
    def trl_vllm_mode(self) -> str | None:
        """How TRL's vLLM integration generates (``--trainer trl --engine vllm``): colocate or server; else None."""
        if self.trainer != "trl" or self.engine_name != "vllm":
            return None
        return self.vllm_mode or "colocate"


@dataclass(frozen=True, kw_only=True)
class SweepConfig(ExecutorOption):
    """``graftkit sweep``: a control grid of GRPO runs (see train/sweep.py for the grid file)."""

    command = "sweep"
    grid: Path = opt(argument=True)
    """Grid file (YAML): out, inits, base, product, runs."""
    dry_run: bool = False
    """Print the run specs; run nothing."""
    device: str | None = None
    """Device of every run (auto, cpu, cuda, cuda:N; default: each run's own, else auto); with --executor ray
    and a CUDA device each run holds one GPU."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device is not None:
            from ..core.devices import check_device

            check_device(self.device)
