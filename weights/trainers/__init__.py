"""Checkpoints as distributed trainers write them, read where they lie, at the trainer's own precision.

Each layout family is recognised by what is on disk (:func:`recognise`) and read by its own module, one tensor at a
time, without a process group, a GPU, or the trainer's library:

- :mod:`.dcp`: ``torch.distributed.checkpoint`` folders (FSDP2 + ``dcp.save``, torchtitan ``step-N/``, accelerate's
  and the Trainer's ``pytorch_model_fsdp_0/``);
- :mod:`.deepspeed`: DeepSpeed ``global_stepN/`` (ZeRO 0–3; the fp32 master weights from the optimizer partitions);
- :mod:`.verl`: verl's FSDP actor checkpoints (``global_step_N/actor/``: the ranks' fp32 shards joined).

A layout graftkit recognises but cannot read (Megatron-Core ``torch_dist``) is one error naming it and its
converter. Every layout here is pickled: each is read only with ``allow_pickle`` (``--allow-pickle``), and then
with ``torch.load(weights_only=True)`` (DCP's metadata with an unpickler that admits only DCP's own classes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import GraftkitError
from . import dcp, deepspeed, verl
from .common import dtype_words


@dataclass(frozen=True)
class Layout:
    """A trainer's checkpoint layout found on disk."""

    family: str  # "dcp" | "deepspeed" | "verl" | "megatron"
    name: str  # what it is, in words, for notes and errors
    folder: Path  # the folder whose files hold the weights
    convert: str  # the one command that converts it into a file or folder graftkit reads without it
    readable: bool = True


#: Folders a Trainer writes a DCP model into, inside ``checkpoint-N/`` (accelerate ``save_fsdp_model``).
FSDP_MODEL_DIRS = ("pytorch_model_fsdp_0", "model")
MEGATRON_CONVERT = ("python -m verl.model_merger merge --backend megatron --local_dir ACTOR_DIR --target_dir HF_DIR "
                    "(verl), or your framework's Megatron-to-HF exporter")


def _megatron(folder: Path) -> bool:
    md = folder / "metadata.json"
    if not md.is_file():
        return False
    try:
        return "sharded_backend" in json.loads(md.read_text())
    except (OSError, ValueError):
        return False


def recognise(path: Path) -> Layout | None:
    """The trainer layout ``path`` holds (itself, or the step it points at), else None."""
    path = Path(path)
    if not path.is_dir():
        return None
    if _megatron(path) or (path / "mp_rank_00" / "model_optim_rng.pt").is_file():
        return Layout("megatron", f"a Megatron-Core distributed checkpoint ({path.name}/)", path, MEGATRON_CONVERT,
                      readable=False)
    found = verl.recognise(path)
    if found is not None:
        return Layout("verl", f"a verl FSDP actor checkpoint ({verl.describe(path, found)})", found, verl.CONVERT)
    found = deepspeed.recognise(path)
    if found is not None:
        return Layout("deepspeed", f"a DeepSpeed checkpoint ({deepspeed.describe(path, found)})", found,
                      deepspeed.CONVERT)
    for sub in ("", *FSDP_MODEL_DIRS):
        folder = path / sub if sub else path
        if dcp.is_dcp(folder) and not _megatron(folder):
            where = f"{path.name}/{sub}/" if sub else f"{path.name}/"
            return Layout("dcp", f"a torch.distributed.checkpoint folder ({where})", folder, dcp.CONVERT)
    return None


def refuse_pickle(layout: Layout) -> GraftkitError:
    return GraftkitError(f"{layout.folder}: {layout.name} is stored as pickles, refused by default (loading a pickle "
                         "can run code)", "pass --allow-pickle to read it with torch.load(weights_only=True) and the "
                         f"format's own classes only, or convert it first: {layout.convert}")


def open_layout(layout: Layout, path: Path):
    """The :class:`~..checkpoint.Checkpoint` of ``layout`` (``path`` is what the user named)."""
    if not layout.readable:
        raise GraftkitError(f"{path}: {layout.name}, which graftkit does not read", f"convert it: {layout.convert}")
    reader = {"dcp": _open_dcp, "deepspeed": deepspeed.open_deepspeed, "verl": verl.open_verl}[layout.family]
    ck = reader(layout, path)
    if not ck.metas:
        raise GraftkitError(f"{path}: {layout.name} holds no model tensors", f"convert it: {layout.convert}")
    return ck


def config_near(folder: Path, levels: int = 3) -> tuple[dict | None, Path | None]:
    """The config.json of ``folder`` or of its nearest parent (a Trainer's ``checkpoint-N/`` above a DCP model folder,
    a run's folder above ``step-N/``), at most ``levels`` up."""
    folder = Path(folder).resolve()
    for f in [folder, *folder.parents][: levels + 1]:
        if (f / "config.json").is_file():
            from ..checkpoint import _read_json

            cfg = _read_json(f / "config.json")
            if "model_type" in cfg or "architectures" in cfg:
                return cfg, f
    return None, None


def _open_dcp(layout: Layout, path: Path):
    from ..checkpoint import Checkpoint, TensorMeta
    from ..safetensors_file import code_of

    entries, skipped = dcp.model_entries(layout.folder)
    metas = {}
    for n, e in entries.items():
        try:
            metas[n] = TensorMeta(n, code_of(e.dtype), e.size)
        except KeyError:
            raise GraftkitError(f"{layout.folder}: tensor {n} has dtype {e.dtype}, which graftkit does not read",
                                f"convert it: {dcp.CONVERT}") from None
    config, config_from = config_near(layout.folder)
    source = f"{dtype_words(m.code for m in metas.values())} tensors of the DCP folder, as saved (chunks joined)"
    files = tuple(sorted(layout.folder.glob("*.distcp")))
    note = f"{Path(path).name}: {layout.name}, {len(metas)} model tensors" + (
        f" (not read: {', '.join(skipped)})" if skipped else "")
    return Checkpoint(path=Path(path), kind="dcp", metas=metas,
                      reader=lambda n: dcp.read_entry(layout.folder, n, entries[n]), config=config,
                      config_from=config_from, weight_files=(layout.folder / dcp.METADATA, *files), notes=(note,),
                      foreign_names=True, source=source)


__all__ = ["Layout", "config_near", "open_layout", "recognise", "refuse_pickle"]
