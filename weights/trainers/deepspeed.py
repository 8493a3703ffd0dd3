"""DeepSpeed checkpoints (``latest`` + ``global_stepN/``), ZeRO 0–3, read at the trainer's own precision.

``engine.save_checkpoint`` writes, per tag (``global_stepN``):

- model states: ``mp_rank_00_model_states.pt`` (ZeRO ≤ 2), or one ``zero_pp_rank_R_mp_rank_00_model_states.pt`` per
  rank (ZeRO-3). ``module`` is the module's state dict in the engine's dtype (bf16/fp16 under mixed precision); under
  ZeRO-3 its parameters are empty placeholders, never weights. ``param_shapes`` (one ordered name → shape table
  per parameter group), ``shared_params``, ``frozen_param_shapes``/``frozen_param_fragments`` and ``buffer_names``
  say how the model is laid out;
- optimizer states, one file per rank (``*_optim_states.pt``): the fp32 master weights, flattened per parameter
  group and partitioned across ranks (``single_partition_of_fp32_groups`` for ZeRO 1–2 and bf16's optimizer,
  ``fp32_flat_groups`` for ZeRO-3), beside the Adam moments.

The master weights are rebuilt as DeepSpeed's own ``zero_to_fp32.py`` rebuilds them
(``_zero2_merge_trainable_params``, ``_zero3_merge_trainable_params``), but one tensor at a time: a ZeRO 1–2
parameter is the slice of its group's partitions (concatenated in rank order) at its offset, with the alignment
paddings the checkpoint records; a ZeRO-3 parameter is each rank's ``ceil(numel / world)`` slice at its offset,
concatenated in rank order and cut to its size. Files are memory-mapped (``torch.load(mmap=True,
weights_only=True)``), so a read touches one parameter's pages, never the moments. Where the checkpoint has no fp32
copy (no optimizer files, or ZeRO-0 in fp32), the module states are read, and a lower precision than the trainer's
is stated (:attr:`Checkpoint.below_trained`).

DeepSpeed's own classes in these pickles (its ZeRO stage enum, its loss scaler) are admitted only as graftkit's
inert stand-ins: nothing of DeepSpeed is imported and nothing else is unpickled.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import GraftkitError
from ..reader import Checkpoint, Found, Reader, TensorMeta
from ..safetensors_file import code_of
from .common import Remapped, config_near, load_mapped, with_tensors

CONVERT = "python CHECKPOINT_DIR/zero_to_fp32.py CHECKPOINT_DIR OUT_DIR --safe_serialization (DeepSpeed saves it there)"
MODEL_STATES = "*_model_states.pt"
OPTIM_STATES = "*_optim_states.pt"


class _ZeroStageStandIn(enum.IntEnum):
    """Stands in for ``deepspeed.runtime.zero.config.ZeroStageEnum`` (an IntEnum of the stage number)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class _InertStandIn:
    """Stands in for a DeepSpeed object in a checkpoint whose fields graftkit never uses (a loss scaler): its state
    is kept as data, nothing runs."""

    def __setstate__(self, state):
        self.__dict__["state"] = state


#: DeepSpeed globals these pickles may hold, each admitted as an inert stand-in under its own name.
STAND_INS = {
    "deepspeed.runtime.zero.config.ZeroStageEnum": _ZeroStageStandIn,
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _InertStandIn,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _InertStandIn,
    "deepspeed.utils.tensor_fragment.fragment_address": _InertStandIn,
}


def _natural(p: Path):
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", p.name)]


def _tag(path: Path) -> Path | None:
    """The ``global_stepN`` folder ``path`` is or points at (its ``latest`` file), else None."""
    if not path.is_dir():
        return None
    if any(path.glob(MODEL_STATES)):
        return path
    latest = path / "latest"
    if latest.is_file():
        try:
            tag = latest.read_text().strip()
        except OSError:
            return None
        if tag and (path / tag).is_dir() and any((path / tag).glob(MODEL_STATES)):
            return path / tag
    return None


def recognise(path: Path) -> Found | None:
    """The DeepSpeed tag ``path`` is or points at, else None."""
    folder = _tag(path)
    if folder is None:
        return None
    where = f"{folder.name}/" if folder == path else f"{path.name}/, tag {folder.name} in its latest file"
    return Found(folder, f"a DeepSpeed checkpoint ({where})")


def load(file: Path):
    """``torch.load(file, weights_only=True, mmap=True)`` with DeepSpeed's globals as :data:`STAND_INS`."""
    return load_mapped(file, [(cls, name) for name, cls in STAND_INS.items()], "DeepSpeed's known classes",
                       f"convert it with DeepSpeed: {CONVERT}")


@dataclass
class _Layout:
    """Where every tensor of one DeepSpeed tag lies."""

    folder: Path
    stage: int | None  # None: no optimizer partitions (module states only)
    world: int
    dtype: str  # the engine's dtype: "bf16" | "fp16" | "fp32"
    read: dict = field(default_factory=dict)  # name -> () -> tensor
    shapes: dict = field(default_factory=dict)  # name -> (torch dtype, shape)
    notes: list = field(default_factory=list)


def _engine_dtype(ms: dict) -> str:
    cfg = ms.get("ds_config") or {}
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        if isinstance(cfg.get(key), dict) and cfg[key].get("enabled"):
            return name
    floats = [t.dtype for t in (ms.get("module") or {}).values() if hasattr(t, "dtype") and t.is_floating_point()]
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(max(set(floats), key=floats.count) if floats else None,
                                                               "fp32")


def _shape_numel(shape) -> int:
    return int(math.prod(tuple(shape)))


def _slices(parts, offset: int, numel: int):
    """The pieces of ``numel`` entries from ``offset`` of the concatenation of flat tensors ``parts``."""
    out, start = [], 0
    for p in parts:
        n = p.numel()
        lo, hi = max(offset, start), min(offset + numel, start + n)
        if lo < hi:
            out.append(p[lo - start:hi - start])
        start += n
        if start >= offset + numel:
            break
    return out


def _cat(pieces, numel: int, what: str, folder: Path):
    import torch

    got = sum(p.numel() for p in pieces)
    if got < numel:
        raise GraftkitError(f"{folder}: {what} needs {numel:,} entries but the partitions hold {got:,}",
                            f"the checkpoint is incomplete (a rank's optimizer file is missing?): {CONVERT}")
    return pieces[0].clone() if len(pieces) == 1 else torch.cat(pieces)


def _master_stage12(lay: _Layout, ms: dict, optim: list[dict]) -> None:
    key = "single_partition_of_fp32_groups"
    groups = [o["optimizer_state_dict"].get(key) for o in optim]
    if any(g is None for g in groups):
        raise GraftkitError(f"{lay.folder}: ZeRO-{lay.stage} optimizer states without {key}", f"convert it: {CONVERT}")
    paddings = optim[0]["optimizer_state_dict"].get("param_alignment_paddings")
    align = 2 * lay.world
    for g, shapes in enumerate(ms["param_shapes"]):
        parts = [rank[g] for rank in groups]
        avail = sum(p.numel() for p in parts)
        offset = 0
        pads = paddings[g] if paddings is not None else None
        for i, (name, shape) in enumerate(shapes.items()):
            n = _shape_numel(shape)
            lay.read[name] = (lambda parts=parts, offset=offset, n=n, shape=tuple(shape), name=name:
                              _cat(_slices(parts, offset, n), n, name, lay.folder).view(shape))
            lay.shapes[name] = (parts[0].dtype, tuple(shape))
            offset += n + (pads[i] if pads is not None else 0)
        if align * math.ceil(offset / align) != align * math.ceil(avail / align):
            raise GraftkitError(f"{lay.folder}: parameter group {g} lays out {offset:,} entries but its partitions "
                                f"hold {avail:,}", f"this ZeRO-{lay.stage} layout is not one graftkit knows: {CONVERT}")


def _master_stage3(lay: _Layout, ms: dict, optim: list[dict]) -> None:
    groups = [o["optimizer_state_dict"].get("fp32_flat_groups") for o in optim]
    if any(g is None for g in groups):
        raise GraftkitError(f"{lay.folder}: ZeRO-3 optimizer states without fp32_flat_groups", f"convert it: {CONVERT}")
    shapes = {k: v for d in ms["param_shapes"] for k, v in d.items()}
    offset = 0
    for name, shape in shapes.items():
        n = _shape_numel(shape)
        part = math.ceil(n / lay.world)

        def read(offset=offset, part=part, n=n, shape=tuple(shape), name=name):
            pieces = [p for rank in groups for p in _slices(rank, offset, part)]
            return _cat(pieces, n, name, lay.folder)[:n].view(shape)

        lay.read[name] = read
        lay.shapes[name] = (groups[0][0].dtype, tuple(shape))
        offset += part
    avail = sum(p.numel() for p in groups[0])
    if offset != avail:
        raise GraftkitError(f"{lay.folder}: ZeRO-3 parameters take {offset:,} entries per rank but the partitions "
                            f"hold {avail:,}", f"this ZeRO-3 layout is not one graftkit knows: {CONVERT}")


def _frozen(lay: _Layout, states: list[dict]) -> None:
    shapes = states[0].get("frozen_param_shapes") or {}
    for name, shape in shapes.items():
        n = _shape_numel(shape)
        if lay.stage == 3:
            frags = [s["frozen_param_fragments"][name] for s in states]
            lay.read[name] = lambda frags=frags, n=n, shape=tuple(shape): _cat(frags, n, "frozen", lay.folder)[:n].view(shape)
        else:
            frag = states[0]["frozen_param_fragments"][name]
            lay.read[name] = lambda frag=frag: frag.clone()
        lay.shapes[name] = (states[0]["frozen_param_fragments"][name].dtype, tuple(shape))


def _buffers(lay: _Layout, ms: dict) -> None:
    """Buffers from the module states, floating ones upcast to float32 (as zero_to_fp32 restores them)."""
    import torch

    for name in ms.get("buffer_names") or ():
        t = (ms.get("module") or {}).get(name)
        if t is None:
            continue
        dtype = torch.float32 if t.is_floating_point() else t.dtype
        lay.read[name] = lambda t=t, dtype=dtype: t.to(dtype).clone()
        lay.shapes[name] = (dtype, tuple(t.shape))


def _shared(lay: _Layout, ms: dict) -> None:
    for alias, source in (ms.get("shared_params") or {}).items():
        if source in lay.read:
            lay.read[alias], lay.shapes[alias] = lay.read[source], lay.shapes[source]


def _module_states(lay: _Layout, ms: dict) -> None:
    module = ms.get("module") or {}
    if lay.stage == 3 or any(t.numel() == 0 < _shape_numel(s) for d in ms.get("param_shapes") or ()
                             for n, s in d.items() if (t := module.get(n)) is not None):
        raise GraftkitError(f"{lay.folder}: a ZeRO-3 checkpoint whose module states are placeholders (size 0) and "
                            "that holds no optimizer partitions: its weights are not in these files",
                            f"read the checkpoint whose optimizer files were saved, or convert it: {CONVERT}")
    for name, t in module.items():
        lay.read[name] = lambda t=t: t.clone()
        lay.shapes[name] = (t.dtype, tuple(t.shape))


def _stage_of(osd) -> int | None:
    """The ZeRO stage an optimizer state dict records; DeepSpeed's bf16 optimizer (ZeRO-1 under bf16) records none
    but keeps ZeRO-1's flat fp32 partitions (its parameters contiguous, the group padded at its end)."""
    if not isinstance(osd, dict):
        return None
    if "zero_stage" in osd:
        return int(osd["zero_stage"])
    return 1 if "single_partition_of_fp32_groups" in osd else None


def layout(folder: Path) -> _Layout:
    """Where every tensor of the tag in ``folder`` lies, and how it will be read."""
    models = sorted(folder.glob(MODEL_STATES), key=_natural)
    optims = sorted(folder.glob(OPTIM_STATES), key=_natural)
    states = [load(f) for f in models]
    ms = states[0]
    if not isinstance(ms, dict) or "module" not in ms:
        raise GraftkitError(f"{models[0]}: no 'module' state dict, so not DeepSpeed model states",
                            f"point at the global_stepN folder DeepSpeed wrote, or convert it: {CONVERT}")
    optim = [load(f) for f in optims]
    zero = [o for o in optim if isinstance(o, dict) and _stage_of(o.get("optimizer_state_dict")) is not None]
    stage = _stage_of(zero[0]["optimizer_state_dict"]) if zero and len(zero) == len(optim) else None
    world = 1
    if stage is not None:
        count = zero[0]["optimizer_state_dict"].get("partition_count", len(optim))
        world = max(count) if isinstance(count, (list, tuple)) else int(count)
        if world != len(optim):
            raise GraftkitError(f"{folder}: ZeRO-{stage} with {world} ranks but {len(optim)} optimizer files",
                                "a rank's file is missing or a stale one is left over: copy the whole checkpoint")
    lay = _Layout(folder, stage, world, _engine_dtype(ms))
    if stage is not None and stage >= 1 or (stage == 0 and "single_partition_of_fp32_groups" in
                                            zero[0]["optimizer_state_dict"]):
        _buffers(lay, ms)
        _frozen(lay, states)
        (_master_stage3 if stage == 3 else _master_stage12)(lay, ms, optim)
        _shared(lay, ms)
        recorded = all("zero_stage" in o["optimizer_state_dict"] for o in optim)
        kind = f"ZeRO-{stage}" if recorded else "ZeRO-1 bf16"
        lay.notes.append(f"fp32 master weights from {kind} optimizer partitions ({world} rank"
                         f"{'s' if world > 1 else ''}; the {lay.dtype} module states are not read)")
    else:
        _module_states(lay, ms)
        lay.notes.append(f"{lay.dtype} module states of {models[0].name}"
                         + (": no fp32 copy in this checkpoint" if lay.dtype != "fp32" else ""))
    return lay


def open_deepspeed(found: Found, path: Path) -> Checkpoint:
    """The :class:`~..reader.Checkpoint` of the DeepSpeed tag ``found.where``."""
    lay = layout(found.where)
    metas = {n: TensorMeta(n, code_of(dt), shape) for n, (dt, shape) in lay.shapes.items()}
    mapped = Remapped(lambda: layout(found.where), lay)
    config, config_from = config_near(found.where)
    below = None
    if lay.stage is None and lay.dtype != "fp32":
        below = (f"{lay.dtype} module states: DeepSpeed trained fp32 master weights, and this checkpoint holds none "
                 "(no optimizer files)")
    files = tuple(sorted(found.where.glob("*_states.pt"), key=_natural))
    return with_tensors(Checkpoint(path=Path(path), kind="deepspeed", metas=metas,
                                   reader=lambda n: mapped.read(lambda lay: lay.read[n]()), config=config,
                                   config_from=config_from, weight_files=files,
                                   notes=(f"{Path(path).name}: {found.name}: {lay.notes[0]}",), foreign_names=True,
                                   source=lay.notes[0], below_trained=below), found, CONVERT)


READER = Reader("deepspeed", recognise, open_deepspeed, pickled=True, layout=True, convert=CONVERT)

__all__ = ["CONVERT", "READER", "STAND_INS", "layout", "load", "open_deepspeed", "recognise"]
