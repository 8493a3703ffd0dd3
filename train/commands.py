"""Training as commands: ``graftkit train sft``, ``train grpo`` and ``sweep``, and their training curves.

Each run function trains through ``train/`` (which may not import the store), then writes the run's
``train_log.jsonl`` as a labelled result, ``train-<kind>-<folder>.h5`` (every numeric metric over ``[step]``; one
logged at some steps only, as an SFT run's checks, is NaN at the others), read back through
:class:`TrainingCurves`. ``train/`` is imported lazily, so building the command line (from the configs in
``train/configs.py``) never imports torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..core.config import OnProgress, no_progress
from ..core.errors import GraftkitError
from ..core.tables import Table
from ..results.layout import TRAIN_KINDS, TRAIN_TRAINER, TRAINING, result_labels, run_layout, training_path_of
from ..results.store import Result, View, write_result
from .configs import GRPOConfig, SFTConfig, SweepConfig, recorded_grpo

if TYPE_CHECKING:
    from .sft import Stopping


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
        return next(k for k, kind in TRAINING.items() if kind == self.result.kind)

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
    keys = dict.fromkeys(k for m in log for k in m if k != "step")
    # a metric logged at some steps only (an SFT run's checks) is NaN at the others
    keys = [k for k in keys if all(isinstance(m.get(k, math.nan), (int, float)) for m in log)]
    data = {k: (("step",), np.array([float(m.get(k, math.nan)) for m in log])) for k in keys}
    prov = json.loads((folder / "graftkit.json").read_text())
    if kind == "grpo" and isinstance(prov.get("config"), dict):  # a run from before --trainer: today's field names
        prov["config"] = recorded_grpo(prov["config"])
    stopping = prov.get("stopping")
    var_attrs = {}
    if stopping:  # the checked quantity's convention beside its values
        convention = {k: stopping[k] for k in ("tasks", "items", "decode", "check_episodes", "episodes")}
        var_attrs = {k: {**convention, "interval": f"Wilson {stopping['rate']['level']:g}"} for k in data
                     if k.startswith(stopping["metric"])}
    return TrainingCurves(Result(TRAINING[kind], {"step": np.array([m["step"] for m in log])}, data,
                                 {"model": str(folder.resolve()), "label": folder.name, "config": prov.get("config"),
                                  "producer": prov.get("producer"), **({"stopping": stopping} if stopping else {})},
                                 var_attrs))


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
    return Result(TRAIN_TRAINER, {"step": steps}, {k: (("step",), v) for k, v in series.items()},
                  {"model": str(run.root.resolve()), "label": result_labels([run.root])[0], "state": str(run.state),
                   "checkpoints": [int(s) for s in run.steps], "producer": "trainer_state.json"})


def write_curves(folder: Path, kind: str, results: Path | None = None) -> TrainingCurves:
    """Write ``folder``'s training curves to ``results`` (default: the current run's results/): ``kind`` sft or
    grpo (its ``train_log.jsonl``), or trainer (a Trainer ``output_dir``'s ``trainer_state.json``)."""
    curves = trainer_curves(Path(folder)) if kind == "trainer" else training_curves(Path(folder), kind)
    dest = training_path_of(results or run_layout().results, kind, folder)
    return TrainingCurves(curves.result, write_result(dest, curves.result))


@dataclass(frozen=True)
class Trained:
    """What a training command wrote: the final policy folder and its training curves (and, for an SFT run
    trained ``--until`` a target, its :class:`~graftkit.train.sft.Stopping`: the stop, or that it was not
    reached)."""

    policy: Path
    curves: TrainingCurves
    stop: "Stopping | None" = None


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


def run_train_sft(cfg: SFTConfig, on_progress: OnProgress = no_progress, *, resume: bool = False,
                  force: bool = False, results: Path | None = None,
                  on_step: Callable[[dict], None] | None = None) -> Trained:
    """Train the SFT policy of ``cfg``; write it and its training curves (to ``results``, default the
    current run's results/), then, with ``cfg.merged``, the LoRA adapter merged into its base (the policy
    returned). ``resume``: an output folder that already holds the policy of this very config is kept, not
    trained again (a study stopped between the adapter and its merge). ``on_step`` gets each step's metrics.
    With ``cfg.until`` the result's ``stop`` says where training stopped, or that the target was not reached."""
    from .sft import Stopping, run_sft
    from ..weights import check_destination

    if cfg.merged is not None:  # before training: the merge's folder can be written (the adapter, once it is)
        check_destination(cfg.merged, [cfg.init], force)
    if resume and _trained(cfg):
        dest = Path(cfg.out)
    else:
        check_destination(cfg.out, [cfg.init] if cfg.init else [], force)
        dest = run_sft(cfg, on_step=_steps("sft", cfg.steps, on_progress, on_step), force=force)
    curves = write_curves(dest, "sft", results or run_layout(cfg.run).results)
    stopping = curves.attrs.get("stopping")
    stop = Stopping.from_json(stopping) if stopping else None
    if cfg.merged is not None:
        return Trained(merge_adapter(dest, cfg.merged, cfg.init, force=force), curves, stop)
    return Trained(dest, curves, stop)


def _trained(cfg: SFTConfig) -> bool:
    """Whether ``cfg.out`` holds the policy ``cfg`` trains: its graftkit.json records this config."""
    from ..weights import PROVENANCE

    prov = Path(cfg.out) / PROVENANCE
    return prov.is_file() and json.loads(prov.read_text()).get("config") == cfg.recorded()


def merge_adapter(adapter: Path, dest: Path, base: Path, *, force: bool = False) -> Path:
    """The LoRA adapter folder ``adapter`` merged into ``base`` (the model it was trained over), written to
    ``dest`` as a full-weight policy: its graftkit.json is the adapter's, with the adapter as its parent, and
    its training log the adapter's."""
    from ..weights import PROVENANCE, load_model, save_model

    model, tok = load_model(adapter)
    prov = json.loads((adapter / PROVENANCE).read_text())
    prov.update(producer="graftkit demo (LoRA SFT merged)", parents=[{"role": "adapter", "path": str(adapter)}])
    return save_model(dest, model, tok, provenance=prov, force=force, inputs=[adapter, base],
                      extra_files={"train_log.jsonl": (adapter / "train_log.jsonl").read_bytes()})


# ----------------------------------------------------------------------------------------------- GRPO


def run_train_grpo(cfg: GRPOConfig, on_progress: OnProgress = no_progress, *, resume: bool = False,
                   force: bool = False, results: Path | None = None,
                   on_step: Callable[[dict], None] | None = None) -> Trained:
    """GRPO per ``cfg`` (``resume``: from the run's newest checkpoint); write the policy and its training
    curves (to ``results``, default the current run's results/)."""
    from ..core.files import require

    require(cfg.init, "--init", "the SFT policy folder")
    steps = _steps("grpo", cfg.steps, on_progress, on_step)
    if cfg.trainer == "trl":
        from accelerate import PartialState

        from .trl_engine import run_grpo_trl

        dest = run_grpo_trl(cfg, resume=resume, force=force, on_step=steps)
        if not PartialState().is_main_process:  # under accelerate launch the main process writes the curves
            return Trained(dest, training_curves(dest, "grpo"))
    else:
        from .grpo import run_grpo

        dest = run_grpo(cfg, resume=resume, force=force, on_step=steps)
    return Trained(dest, write_curves(dest, "grpo", results or run_layout(cfg.run).results))

# ---------------------------------------------------------------------------------------------- sweep

#: The settings a sweep's run rows show beside name, status and out (``sweep --dry-run`` prints them).
SWEEP_COLUMNS = ("init", "lr", "beta", "seed", "epsilon", "epsilon_high", "loss", "steps", "stages")


def sweep_plan(info: dict[str, Any]) -> Table:
    """What ``graftkit sweep --dry-run`` prints of :func:`run_sweep_grid`'s plan: each run's name, status and
    settings (:data:`SWEEP_COLUMNS`; its init folder by name)."""
    columns = {"name": lambda r: r["name"], "status": lambda r: r["status"],
               **{c: (lambda r, c=c: Path(str(r[c])).name if c == "init" else str(r[c])) for c in SWEEP_COLUMNS}}
    return Table(f"{info['grid']}: {len(info['runs'])} runs", columns, info["runs"], left=("name", "status", "init", "loss"))


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
