"""The configs of ``graftkit train grpo`` and ``graftkit sweep``, importable without torch.

The command line generates its options from these fields, so they live apart from the training code
(``train/grpo.py`` and ``train/sweep.py`` re-export them): building the CLI never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..core.config import CommandConfig, DeviceOption, ExecutorOption, LoraOption, check_choice, opt
from ..core.errors import GraftkitError


#: The GRPO trainers ``train grpo --engine`` runs.
ENGINES = ("graftkit", "trl")
#: Fields that say where a run trains or where its results go, not how it trains: a resumed run may differ in them.
NOT_TRAINING = ("run", "device")


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
    engine: str = "graftkit"
    """graftkit (this trainer, every variant) or trl (TRL's GRPOTrainer with graftkit's environment as its
    rollout function; multi-GPU under accelerate launch; needs the trl extra)."""
    vllm: str | None = None
    """--engine trl: generate with TRL's vLLM integration, colocate or server (default: no vLLM)."""
    vllm_server: str | None = None
    """--vllm server: the trl vllm-serve address, HOST:PORT (default: TRL's, localhost:8000)."""

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
        check_choice(self.engine, ENGINES, "--engine")
        if self.vllm is not None:
            check_choice(self.vllm, ("colocate", "server"), "--vllm")
        if self.engine != "trl" and (self.vllm is not None or self.vllm_server is not None):
            raise GraftkitError("--vllm and --vllm-server need --engine trl", "add --engine trl")
        if self.vllm_server is not None and self.vllm != "server":
            raise GraftkitError("--vllm-server names the server of --vllm server", "add --vllm server")
        if self.engine == "trl":
            own = [f for f, on in (("--stages", self.stages), ("--veto-epsilon", self.veto_epsilon is not None),
                                   ("--focal-gamma", self.focal_gamma > 0), ("--verigate", self.verigate)) if on]
            if own:
                raise GraftkitError(f"{', '.join(own)}: TRL's GRPOTrainer has no such variant",
                                    "use --engine graftkit for Mu-GRPO, focal scaling and VeriGate")
        if self.max_turns is not None and self.max_turns < 1:
            raise GraftkitError(f"--max-turns {self.max_turns} must be ≥ 1")

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


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
