"""Which checkpoint a path given to a command means, and which base model it is measured against.

Every command that takes a model resolves it here, so that one path means one thing everywhere:

- :func:`require` (from :mod:`graftkit.core.files`): a path that must exist; otherwise one error naming the
  path, what was expected there and the command's flag.
- :func:`checkpoints_of` / :func:`checkpoint_of`: a trainer's ``output_dir`` (``checkpoint-N/`` folders,
  :mod:`.runs`) means its last checkpoint by step number (or, with ``all_checkpoints``, every one in step
  order); any other path means itself.
- :func:`base_of`: the base a model's delta is taken against, or a LoRA adapter is merged over.
- :func:`open_model`: a LoRA adapter merged over :func:`base_of`, or any other checkpoint read alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import GraftkitError
from ..core.files import require
from .checkpoint import A_MODEL, Checkpoint, _read_json, open_checkpoint
from .lora import apply_lora, is_lora_folder
from .pair import open_one, parent_record
from .runs import recorded_step, rl_checkpoints, trainer_run

#: What a base path may be, for the error that names a missing one.
A_BASE = "the base model: an HF folder or a .safetensors file"


def checkpoints_of(path: str | os.PathLike, *, all_checkpoints: bool = False, flag: str | None = None) -> list[Path]:
    """The checkpoints ``path`` names: itself when it holds weights (or is a file); for a trainer ``output_dir``
    its last ``checkpoint-N`` by step number, or with ``all_checkpoints`` every one in step order (the
    training trajectory; for a graftkit RL policy, the ``step-N`` folders of ``<policy>.checkpoints`` and then
    the policy). A missing path, or ``all_checkpoints`` on a folder that is no trainer run, is an error."""
    path = require(path, flag, A_MODEL)
    run = trainer_run(path)
    if run is None and all_checkpoints and (own := trainer_run(rl_checkpoints(path))) is not None:
        # a graftkit RL run's policy: the step folders of its checkpoints beside it, then the policy itself
        last = recorded_step(path)
        return [p for _, p in own.checkpoints] + ([path] if last is None or last > own.checkpoints[-1][0] else [])
    if run is None:
        if all_checkpoints and not path.is_file():
            raise GraftkitError(f"{path} is not a trainer output_dir (no checkpoint-N folders with weights)",
                                "pass the folder that holds checkpoint-N/, or drop --all-checkpoints")
        return [path]
    return [p for _, p in run.checkpoints] if all_checkpoints else [run.last]


def checkpoint_of(path: str | os.PathLike, flag: str | None = None) -> Path:
    """The one checkpoint ``path`` names (:func:`checkpoints_of`): a trainer's ``output_dir`` is its last."""
    return checkpoints_of(path, flag=flag)[0]


def _adapter_base_name(model: Path) -> str | None:
    return _read_json(model / "adapter_config.json").get("base_model_name_or_path") or None


def _graftkit_parent(model: Path) -> Path | None:
    parent = (parent_record(model) or {}).get("path")
    return Path(parent) if parent else None


def recorded_base(model: str | os.PathLike) -> Path | None:
    """The base ``model`` records, in :func:`base_of`'s order (graftkit.json's parent, whether or not it still
    exists; else a LoRA adapter's ``base_model_name_or_path`` when that is a local folder); None when it
    records none that is local."""
    model = Path(model)
    parent = _graftkit_parent(model)
    if parent is not None:
        return parent
    if is_lora_folder(model):
        named = _adapter_base_name(model)
        if named and Path(named).is_dir():
            return Path(named)
    return None


def base_of(model: str | os.PathLike, explicit: str | os.PathLike | None = None, *, flag: str = "--base") -> Path:
    """The base model folder ``model`` is measured against (a delta, a graft, a delta's rank) or, for a LoRA
    adapter, merged over. The first of:

    1. ``explicit``, the command's ``flag`` (``--base``), which must exist;
    2. for a trainer's ``output_dir``, what its last checkpoint records (:func:`checkpoint_of`), as below;
    3. the parent recorded in ``model``'s graftkit.json (``base_model.path``), which must still exist;
    4. a PEFT adapter's ``base_model_name_or_path`` when it is a local folder;
    5. else one error naming ``flag``: a hub id or a path relative to where the adapter was trained
       (graftkit never downloads a model), an adapter that names no base, or a model that records none.

    graftkit.json comes before adapter_config.json: graftkit writes it with the resolved path (and
    fingerprint) of the very model it trained from, where PEFT records whatever name the base was loaded by."""
    if explicit is not None:
        return require(explicit, flag, A_BASE)
    model = checkpoint_of(model)
    parent = _graftkit_parent(model)
    if parent is not None:
        if not parent.exists():
            raise GraftkitError(f"{model} records its SFT parent as {parent}, which no longer exists",
                                f"pass the SFT base as {flag} SFT_FOLDER")
        return parent
    if is_lora_folder(model):
        named = _adapter_base_name(model)
        if named and Path(named).is_dir():
            return Path(named)
        if named:
            raise GraftkitError(f"{model} is a LoRA adapter over {named!r}, which is no folder from here (a hub id, or "
                                "a path relative to where it was trained; graftkit never downloads a model)",
                                f"pass the local folder of {named} as {flag} DIR")
        raise GraftkitError(f"{model} is a LoRA adapter that names no base model",
                            f"pass its base model folder as {flag} DIR")
    raise GraftkitError(f"{model} records no SFT parent (no graftkit.json with base_model, no LoRA adapter_config.json)",
                        f"pass the SFT base as {flag} SFT_FOLDER")


def open_model(path: str | os.PathLike, base: str | os.PathLike | None = None, *, flag: str = "--base",
               no_pickle: bool = False, unknown: str = "error", config: Path | None = None) -> Checkpoint:
    """The checkpoint at ``path`` read alone: a LoRA adapter merged over its base (:func:`base_of` with
    ``base``, the command's ``flag``), one tensor at a time; any other checkpoint as :func:`.pair.open_one`
    reads it (``unknown`` and ``config`` apply to it, not to an adapter's base; ``no_pickle`` to both)."""
    path = Path(path)
    if is_lora_folder(path):
        return apply_lora(open_checkpoint(base_of(path, base, flag=flag), no_pickle=no_pickle), path, flag)
    return open_one(path, no_pickle=no_pickle, unknown=unknown, config=config)


__all__ = ["A_BASE", "A_MODEL", "base_of", "checkpoint_of", "checkpoints_of", "open_model", "recorded_base"]
