"""Training as commands: ``graftkit train sft``, ``train grpo`` and ``sweep``, and their training curves.

Each run function trains through ``train/`` (which may not import the store), then writes the run's
``train_log.jsonl`` as a labelled result, ``train-<kind>-<folder>.h5`` (every numeric metric over
``[step]``), read back through :class:`TrainingCurves`. ``train/`` is imported lazily, so building the
command line (these configs) never imports torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.config import CommandConfig, OnProgress, RunOption, DeviceOption, LoraOption, no_progress
from ..core.errors import GraftkitError
from ..results.store import Result, View, current_run, result_labels, write_result
from .configs import GRPOConfig, SweepConfig

TRAIN_KINDS = ("train-sft", "train-grpo", "train-trainer")


# ------------------------------------------------------------------------------------ training curves


@dataclass(frozen=True)
class TrainingCurves(View):
    """A training run's per-step metrics (kind ``train-sft`` / ``train-grpo``): ``metric[step]``.

    ``attrs``: ``model`` (the policy folder), ``label`` (its name), ``config`` and ``producer`` (from its
    graftkit.json). ``path`` is the file it was read from or written to."""

    KINDS = TRAIN_KINDS
    PRODUCER = "graftkit train"

    @property
    def kind(self) -> str:
        """``sft``, ``grpo`` or ``trainer`` (another trainer's ``trainer_state.json``)."""
        return self.result.kind.removeprefix("train-")

    @property
    def label(self) -> str:
        return str(self.result.attrs.get("label", ""))

    @property
    def steps(self) -> np.ndarray:
        return np.asarray(self.result.coords["step"])

    @property
    def metrics(self) -> list[str]:
        return list(self.result.data)

    def has(self, metric: str) -> bool:
        return metric in self.result.data

    def values(self, metric: str) -> np.ndarray:
        """``metric`` over the steps, as float64."""
        return np.asarray(self.result[metric], dtype=np.float64)

    def last(self, metric: str) -> float:
        return float(self.result[metric][-1])


def training_curves(folder: Path, kind: str) -> TrainingCurves:
    """A run's train_log.jsonl as a labelled result: every numeric metric over [step]."""
    log = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines() if x]
    keys = [k for k in log[0] if k != "step" and all(isinstance(m.get(k), (int, float)) for m in log)]
    data = {k: (("step",), np.array([float(m[k]) for m in log])) for k in keys}
    prov = json.loads((folder / "graftkit.json").read_text())
    return TrainingCurves(Result(f"train-{kind}", {"step": np.array([m["step"] for m in log])}, data,
                                 {"model": str(folder.resolve()), "label": folder.name, "config": prov.get("config"),
                                  "producer": prov.get("producer")}))


def trainer_curves(output_dir: Path) -> TrainingCurves:
    """A Trainer run's ``trainer_state.json`` log as training curves (:func:`trainer_curves_result`)."""
    return TrainingCurves(trainer_curves_result(output_dir))


def trainer_curves_result(output_dir: Path) -> Result:
    """The labelled result of a Trainer ``output_dir``'s log (``weights.runs.trainer_series``: every numeric
    metric over [step], NaN where a step did not log it), kind ``train-trainer``."""
    from ..weights.runs import trainer_run, trainer_series

    run = trainer_run(Path(output_dir))
    if run is None or run.state is None:
        raise GraftkitError(f"{output_dir}: no trainer_state.json in a Trainer output_dir",
                            "pass the output_dir of a TRL / transformers Trainer run (its checkpoint-N folders)")
    steps, series = trainer_series(run.state)
    return Result("train-trainer", {"step": steps}, {k: (("step",), v) for k, v in series.items()},
                  {"model": str(run.root.resolve()), "label": result_labels([run.root])[0], "state": str(run.state),
                   "checkpoints": [int(s) for s in run.steps], "producer": "trainer_state.json"})


def write_curves(folder: Path, kind: str, results: Path | None = None) -> TrainingCurves:
    """Write ``folder``'s training curves to ``results`` (default: the current run's results/)."""
    curves = training_curves(Path(folder), kind)
    dest = (results or current_run() / "results") / f"train-{kind}-{result_labels([folder])[0]}.h5"
    return TrainingCurves(curves.result, write_result(dest, curves.result))


@dataclass(frozen=True)
class Trained:
    """What a training command wrote: the final policy folder and its training curves."""

    policy: Path
    curves: TrainingCurves


def _steps(what: str, total: int, on_progress: OnProgress, on_step: Callable[[dict], None] | None):
    """The train loop's per-step callback: progress in steps, and the step's metrics to ``on_step``."""
    done = [0]

    def step(m: dict) -> None:
        on_progress(what, m["step"] - done[0], total, "steps")
        done[0] = m["step"]
        if on_step is not None:
            on_step(m)

    return step


# ------------------------------------------------------------------------------------------------ SFT


def parse_budgets(items: tuple[str, ...], tasks: str | None) -> dict[str, int]:
    """Demonstration pools: the default recipe's (restricted to ``tasks``), then each ``TASK=N``."""
    from .sft import DEFAULT_BUDGETS

    budgets = dict(DEFAULT_BUDGETS)
    if tasks:
        from ..agent import is_problem, resolve_tasks

        keep = set(resolve_tasks(tasks))
        fresh = {t: 1_000_000 if is_problem(t) else 400 for t in keep - set(budgets)}  # problems: fresh items
        budgets = {t: n for t, n in budgets.items() if t in keep} | fresh
    for item in items:
        task, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise GraftkitError(f"--budget {item!r}: expected TASK=N", "e.g. --budget click-tab=200")
        budgets[task.strip()] = int(n)
    return budgets


def parse_decoys(items: tuple[str, ...]) -> dict[str, float]:
    """Demonstrator slip rates: the default recipe's, then each ``TASK=RATE``."""
    from .sft import DEFAULT_DECOYS

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
class TrainSFTConfig(RunOption, DeviceOption, LoraOption):
    """``graftkit train sft``: the command line's form of :class:`~graftkit.train.sft.SFTConfig` (budgets and
    decoys as ``TASK=N`` / ``TASK=RATE`` strings over the default recipe); :meth:`sft` builds it."""

    command = "train sft"
    out: Path
    """Output folder of the SFT policy."""
    tasks: str | None = None
    """Suite(s) or tasks to demonstrate (default: both suites)."""
    budget: tuple[str, ...] = ()
    """Demonstration pool of a task: TASK=N episodes (repeatable)."""
    decoy: tuple[str, ...] = ()
    """Demonstrator slip rate of a task: TASK=RATE (repeatable; default: none — a decoy plants a position bias)."""
    size: str = "micro"
    """Tiny policy size: nano, micro, small."""
    init: Path | None = None
    """Fine-tune this HF causal LM folder instead of a tiny policy."""
    steps: int = 6000
    """Optimizer steps."""
    batch_size: int = 32
    """Turns per step."""
    lr: float = 3e-3
    """Peak learning rate."""
    seed: int = 0
    """Seed."""
    threads: int = 2
    """torch threads."""
    save_dtype: str = "auto"
    """dtype of the written policy: auto (the init checkpoint's; float32 for a tiny policy), float32, bfloat16 or
    float16."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "budget", tuple(self.budget or ()))
        object.__setattr__(self, "decoy", tuple(self.decoy or ()))
        self.sft()  # a malformed TASK=N, an unknown task or a bad setting is an error now, not mid-run

    def sft(self):
        """The :class:`~graftkit.train.sft.SFTConfig` this command trains (what its checkpoint records)."""
        from .sft import SFTConfig

        return SFTConfig(out=str(self.out), budgets=parse_budgets(self.budget, self.tasks),
                         decoys=parse_decoys(self.decoy), size=self.size, init=str(self.init) if self.init else None,
                         steps=self.steps, batch_size=self.batch_size, lr=self.lr, seed=self.seed,
                         threads=self.threads, device=self.device, dtype=self.dtype, save_dtype=self.save_dtype,
                         lora_r=self.lora_r, lora_alpha=self.lora_alpha, lora_targets=self.lora_targets)


def run_train_sft(cfg: TrainSFTConfig, on_progress: OnProgress = no_progress, *, force: bool = False,
                  results: Path | None = None, on_step: Callable[[dict], None] | None = None) -> Trained:
    """Train the SFT policy of ``cfg``; write it and its training curves (to ``results``, default the
    current run's results/). ``on_step`` gets each step's metrics."""
    from .sft import run_sft
    from ..weights import check_destination

    check_destination(cfg.out, [cfg.init] if cfg.init else [], force)
    sft = cfg.sft()
    dest = run_sft(sft, on_step=_steps("sft", sft.steps, on_progress, on_step), force=force)
    return Trained(dest, write_curves(dest, "sft", results or current_run(cfg.run) / "results"))


# ----------------------------------------------------------------------------------------------- GRPO


def run_train_grpo(cfg: GRPOConfig, on_progress: OnProgress = no_progress, *, resume: bool = False,
                   force: bool = False, results: Path | None = None,
                   on_step: Callable[[dict], None] | None = None) -> Trained:
    """GRPO per ``cfg`` (``resume``: from the run's newest checkpoint); write the policy and its training
    curves (to ``results``, default the current run's results/)."""
    if not Path(cfg.init).exists():
        raise GraftkitError(f"--init {cfg.init}: no such folder", "pass the SFT policy folder")
    steps = _steps("grpo", cfg.steps, on_progress, on_step)
    if cfg.engine == "trl":
        from accelerate import PartialState

        from .trl_engine import run_grpo_trl

        dest = run_grpo_trl(cfg, resume=resume, force=force, on_step=steps)
        if not PartialState().is_main_process:  # under accelerate launch the main process writes the curves
            return Trained(dest, training_curves(dest, "grpo"))
    else:
        from .grpo import run_grpo

        dest = run_grpo(cfg, resume=resume, force=force, on_step=steps)
    return Trained(dest, write_curves(dest, "grpo", results or current_run(cfg.run) / "results"))

# ---------------------------------------------------------------------------------------------- sweep

#: The settings a sweep's run rows show beside name, status and out.
SWEEP_COLUMNS = ("init", "lr", "beta", "seed", "epsilon", "epsilon_high", "loss", "steps", "stages")


def run_sweep_grid(cfg: SweepConfig, on_progress: OnProgress = no_progress,
                   on_run: Callable[[str, str], None] = lambda name, status: None) -> dict[str, Any]:
    """Expand ``cfg.grid`` and (unless ``dry_run``) run it: completed runs skipped, partial ones resumed.

    Returns ``{"grid", "runs"}``: per run its name, status, settings, out and (dry run) full config; or
    the executed runs' records. ``on_run(name, status)`` is called as each run starts. ``cfg.device``, when
    set, is every run's device; with ``cfg.executor == "ray"`` each run trains on a Ray worker."""
    from dataclasses import replace

    from .sweep import RunSpec, expand, run_sweep

    specs = expand(cfg.grid)
    if cfg.device is not None:
        specs = [RunSpec(s.name, replace(s.config, device=cfg.device)) for s in specs]
    if cfg.dry_run:
        runs = [{"name": s.name, "status": s.status(), **{k: v for k, v in s.config.as_dict().items()
                                                           if k in SWEEP_COLUMNS},
                 "out": s.config.out, "config": s.config.as_dict()} for s in specs]
        return {"grid": str(cfg.grid), "runs": runs}
    for s in specs:
        if not Path(s.config.init).exists():
            raise GraftkitError(f"run {s.name}: init {s.config.init} does not exist",
                                "train the SFT policy first (graftkit train sft) or fix the grid's inits")
    steps = {s.name: _steps(f"grpo {s.name}", s.config.steps, on_progress, None) for s in specs}
    records = run_sweep(specs, on_run=lambda s, st: on_run(s.name, st), on_step=lambda s, m: steps[s.name](m),
                        executor=cfg.executor, ray_address=cfg.ray_address, workers=cfg.workers,
                        on_done=lambda s: steps[s.name]({"step": s.config.steps}))
    return {"grid": str(cfg.grid), "runs": records}
