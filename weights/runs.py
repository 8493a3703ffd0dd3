"""Training runs as inputs: the ``output_dir`` of a TRL or transformers ``Trainer`` run, a DeepSpeed engine's save
folder, a verl run's ``checkpoints/<project>/<experiment>/`` and a torchtitan checkpoint folder.

A Trainer saves ``output_dir/checkpoint-N/`` every ``save_steps``: the weights (``model*.safetensors``,
or ``adapter_model.safetensors`` + ``adapter_config.json`` with PEFT), ``config.json``, the tokenizer,
``trainer_state.json`` (its ``log_history``: loss, reward, KL, ... per logged step) and the pickles
``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` and ``training_args.bin``. Those pickles are never
opened here (nor warned about: they are the trainer's, not weights); ``trainer_state.json`` is JSON.

:func:`trainer_run` recognises such a folder and lists its checkpoints by step number (``checkpoint-10``
after ``checkpoint-9``); :func:`.resolve.checkpoints_of` turns a path a command was given into the
checkpoints it means.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import GraftkitError
from .checkpoint import layout_of

#: A run's step folder: a Trainer's ``checkpoint-N`` (``save_steps``), accelerate's ``checkpoint_N`` (``save_state``
#: with automatic naming), DeepSpeed's ``global_stepN`` (a raw engine's or OpenRLHF's save dir; under a Trainer it
#: sits inside ``checkpoint-N``), verl's ``global_step_N``, torchtitan's ``step-N``.
CHECKPOINT_DIR = re.compile(r"(?:checkpoint[-_]|global_step_?|step-)(\d+)\Z")
#: Files that make a folder a checkpoint (full weights, sharded or not, or a PEFT adapter).
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
            "pytorch_model.bin", "pytorch_model.bin.index.json", "adapter_model.bin")
STATE = "trainer_state.json"


def _hf_weights(folder: Path) -> bool:
    return any((folder / f).is_file() for f in _WEIGHTS) or any(folder.glob("model-*-of-*.safetensors"))


def holds_weights(folder: Path) -> bool:
    """True when ``folder`` holds a model's or an adapter's weights: HF files, or a trainer's own layout
    (:func:`.checkpoint.layout_of`: a DCP folder, a DeepSpeed tag, a verl actor) in it or at its ``latest`` tag."""
    folder = Path(folder)
    return folder.is_dir() and (_hf_weights(folder) or layout_of(folder) is not None)


@dataclass(frozen=True)
class TrainerRun:
    """A Trainer ``output_dir``: its checkpoints in step order and the ``trainer_state.json`` that logs
    the run furthest (the last checkpoint's, else the root's)."""

    root: Path
    checkpoints: tuple[tuple[int, Path], ...]
    state: Path | None

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.checkpoints)

    @property
    def last(self) -> Path:
        return self.checkpoints[-1][1]

    def step_of(self, path: Path) -> int | None:
        return next((s for s, p in self.checkpoints if p == Path(path)), None)


#: Suffix of the folder beside a graftkit RL run's output that holds its resumable checkpoints (``step-N``).
CHECKPOINTS = ".checkpoints"


def rl_checkpoints(out: str | os.PathLike) -> Path:
    """The folder of a graftkit RL run's resumable checkpoints: ``<out>.checkpoints``, beside its output folder (so
    the output folder holds a finished policy only)."""
    return Path(str(Path(out)) + CHECKPOINTS)


def recorded_step(path: Path) -> int | None:
    """The optimiser step of one checkpoint of a trajectory: N of its step folder, else the ``step`` its
    graftkit.json records (a graftkit policy, the last step of its run), else None."""
    step = checkpoint_step(path)
    if step is not None:
        return step
    record = Path(path) / "graftkit.json"
    try:
        step = json.loads(record.read_text()).get("step") if record.is_file() else None
    except (OSError, ValueError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def checkpoint_step(path: Path) -> int | None:
    """N of a step folder (``checkpoint-N``, ``global_stepN``, ``global_step_N``, ``step-N``), else None."""
    m = CHECKPOINT_DIR.match(Path(path).name)
    return int(m[1]) if m else None


def _is_checkpoint(path: Path) -> bool:
    """``path`` is one checkpoint, not a run of them: a step folder, HF weights, or a trainer layout whose weights lie
    in it (not in one of its step folders, as a DeepSpeed save dir's or a verl run's ``latest`` points)."""
    if checkpoint_step(path) is not None or _hf_weights(path):
        return True
    layout = layout_of(path)
    if layout is None:
        return False
    below = layout.where.relative_to(path).parts  # "" itself, "pytorch_model_fsdp_0", "global_step_4/actor", …
    return not below or checkpoint_step(Path(below[0])) is None


def trainer_run(path: Path) -> TrainerRun | None:
    """The training run whose output folder is ``path``: a folder that is no checkpoint itself but holds step
    folders that are (a Trainer's ``checkpoint-N``, a DeepSpeed engine's ``global_stepN``, verl's
    ``global_step_N``, torchtitan's ``step-N``), else None."""
    path = Path(path)
    if not path.is_dir() or _is_checkpoint(path):
        return None
    found = sorted((checkpoint_step(p), p) for p in path.iterdir() if checkpoint_step(p) is not None and holds_weights(p))
    if not found:
        return None
    states = [p / STATE for _, p in reversed(found)] + [path / STATE]
    return TrainerRun(path, tuple(found), next((s for s in states if s.is_file()), None))


def trainer_log(state: Path) -> list[dict[str, float]]:
    """``log_history`` of a ``trainer_state.json``: one dict per logged step (``step`` and every finite
    numeric value; ``epoch`` and the final summary row, which has no loss of its own, included as given)."""
    try:
        history = json.loads(Path(state).read_text())["log_history"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GraftkitError(f"{state}: not a readable trainer_state.json with a log_history ({e})",
                            "pass a Trainer output_dir whose checkpoints hold trainer_state.json") from None
    rows = []
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        row = {k: float(v) for k, v in entry.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        rows.append(row)
    return rows


#: ``trainer_state.json`` keys (TRL GRPOTrainer / SFTTrainer, transformers Trainer) that name a quantity
#: graftkit's curves already draw, under graftkit's name: TRL's ``kl`` is the mean k3 estimator, as ours.
TRAINER_METRICS = {"kl": "kl_k3_mean", "clip_ratio/low_mean": "clip_frac_low", "clip_ratio/high_mean": "clip_frac_high"}
#: Bookkeeping keys, not curves (the final summary row's ``train_*`` too).
_NOT_CURVES = ("step", "epoch", "total_flos")


def trainer_series(state: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(steps, metric → values over those steps) of a ``trainer_state.json``: every numeric metric its
    ``log_history`` logs, NaN at the steps that did not log it (train and eval rows log different keys);
    names as in ``TRAINER_METRICS``, others with ``/`` written as ``.`` (an HDF5 name cannot hold one)."""
    log = trainer_log(state)
    steps = sorted({int(r["step"]) for r in log})
    where = {s: i for i, s in enumerate(steps)}
    series: dict[str, np.ndarray] = {}
    for row in log:
        for k, v in row.items():
            if k in _NOT_CURVES or k.startswith("train_"):
                continue
            name = TRAINER_METRICS.get(k, k.replace("/", "."))
            series.setdefault(name, np.full(len(steps), np.nan))[where[int(row["step"])]] = v
    return np.array(steps, dtype=np.int64), series
