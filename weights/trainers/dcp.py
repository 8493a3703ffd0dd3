"""torch.distributed.checkpoint (DCP) folders, read one tensor at a time without a process group.

``dcp.save`` writes a folder of ``.metadata`` (a pickled :class:`~torch.distributed.checkpoint.metadata.Metadata`:
every key's global shape, dtype and chunks, and where each chunk's bytes lie) and ``__R_K.distcp`` files, in which
each chunk is one ``torch.save`` blob at an offset (``filesystem._write_item``). FSDP2 (torchtitan, TRL/accelerate
``SHARDED_STATE_DICT``) and Megatron's ``torch_dist`` write this way. Reading here:

- the metadata through an unpickler that admits only DCP's own metadata classes, ``torch.Size`` and dtypes (where
  torch's own ``FileSystemReader`` calls a bare ``pickle.load``);
- a tensor's chunks each through ``torch.load(weights_only=True)`` (as torch's reader does) on a view of its bytes in
  the ``.distcp`` file, into the tensor's global shape: memory is that tensor and one chunk, never the model;
- only the model's keys: what a trainer saves beside them (``optimizer.*``, ``train_state``, ``lr_scheduler``,
  ``dataloader``, byte items) is skipped unread. Names are the trainer's (accelerate's ``model.`` container,
  torchtitan's flattened keys): :func:`..checkpoint.match_names` maps them onto the other side's.

A DCP folder is the path itself, or the model folder a Trainer's ``checkpoint-N/`` holds (:data:`FSDP_MODEL_DIRS`);
Megatron-Core's ``torch_dist`` folders look alike and are :mod:`.megatron`'s.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import GraftkitError
from ..reader import Checkpoint, Found, Reader, TensorMeta
from ..safetensors_file import code_of
from .common import config_near, dtype_words, with_tensors
from .megatron import is_megatron

METADATA = ".metadata"
#: Top-level keys a trainer saves beside the model in one DCP folder (torchtitan's CheckpointManager, accelerate's
#: save_state, verl's and NeMo's savers): never weights, never read.
NOT_MODEL = ("optimizer", "optim", "optimizers", "train_state", "lr_scheduler", "lr_schedulers", "scheduler",
             "dataloader", "rng", "rng_state", "extra_state")
#: The command that converts a DCP folder into one torch.save file (for the error when a folder cannot be read).
CONVERT = "python -m torch.distributed.checkpoint.format_utils dcp_to_torch DCP_FOLDER OUT.pt"

#: Folders a Trainer writes a DCP model into, inside ``checkpoint-N/`` (accelerate ``save_fsdp_model``).
FSDP_MODEL_DIRS = ("pytorch_model_fsdp_0", "model")

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                     "torch.distributed.checkpoint._hf_storage", "torch.distributed.checkpoint.planner")
_PATHS = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")


def is_dcp(folder: Path) -> bool:
    folder = Path(folder)
    return folder.is_dir() and (folder / METADATA).is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata classes, ``torch.Size``, dtypes, layouts and memory formats: nothing else is built."""

    def find_class(self, module: str, name: str):
        import torch

        allowed = "." not in name and (
            (module in _METADATA_MODULES and not name.startswith("__") and self._own_class(module, name))
            or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None),
                                                                  (torch.dtype, torch.layout, torch.memory_format))))
            or (module == "torch.serialization" and name == "_get_layout")
            or (module in ("pathlib", "pathlib._local") and name in _PATHS)
            or (module == "collections" and name == "OrderedDict")
        )
        if not allowed:
            raise GraftkitError(f"{self.path}: the metadata holds {module}.{name}, which is no class of DCP's metadata",
                                f"check the folder was written by torch.distributed.checkpoint, or convert it: {CONVERT}")
        return super().find_class(module, name)

    @staticmethod
    def _own_class(module: str, name: str) -> bool:
        """A class (dataclass or enum) defined in ``module`` itself: not a function, not a module it imports."""
        import importlib

        obj = getattr(importlib.import_module(module), name, None)
        return isinstance(obj, type) and obj.__module__ == module


def read_metadata(folder: Path):
    """The folder's :class:`Metadata`, unpickled with only DCP's own classes admitted."""
    path = Path(folder) / METADATA
    try:
        with open(path, "rb") as f:
            u = _MetadataUnpickler(f)
            u.path = path
            return u.load()
    except GraftkitError:
        raise
    except Exception as exc:  # a truncated or foreign file: unpickling raises many types
        raise GraftkitError(f"{path}: not a readable DCP metadata file ({type(exc).__name__}: {exc})".splitlines()[0],
                            "check that the save finished (the .metadata file is written last)") from None


@dataclass(frozen=True)
class _Entry:
    size: tuple[int, ...]
    dtype: object  # torch.dtype
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...], object], ...]  # (offsets, sizes, storage info)


def _top_key(fqn: str, planner_data) -> str:
    path = (planner_data or {}).get(fqn)
    if isinstance(path, (tuple, list)) and path:
        return str(path[0])
    return fqn.split(".", 1)[0]


def _is_model_key(fqn: str, planner_data) -> bool:
    top = _top_key(fqn, planner_data)
    return top not in NOT_MODEL and not top.startswith(("optimizer", "optim_"))


def model_entries(folder: Path) -> tuple[dict[str, _Entry], list[str]]:
    """fqn → its global shape, dtype and chunks, for every tensor key of the model (in the order saved), and the
    top-level keys skipped as no part of the model (``optimizer``, ``train_state``, …)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = read_metadata(folder)
    storage = {}
    for idx, info in (md.storage_data or {}).items():
        storage[(idx.fqn, tuple(idx.offset) if idx.offset is not None else None)] = info  # byte items: no offset
    planner = getattr(md, "planner_data", None)
    out: dict[str, _Entry] = {}
    skipped: dict[str, None] = {}
    for fqn, meta in md.state_dict_metadata.items():
        if not _is_model_key(fqn, planner):
            skipped[_top_key(fqn, planner)] = None
            continue
        if not isinstance(meta, TensorStorageMetadata):
            continue
        chunks = []
        for c in meta.chunks:
            info = storage.get((fqn, tuple(c.offsets)))
            if info is None:
                raise GraftkitError(f"{folder / METADATA}: tensor {fqn}'s chunk at {list(c.offsets)} has no storage entry",
                                    "the checkpoint is incomplete: save it again")
            if getattr(info, "transform_descriptors", None):
                raise GraftkitError(f"{folder}: tensor {fqn} is stored through DCP extensions "
                                    f"({', '.join(info.transform_descriptors)}), which graftkit does not decode",
                                    f"convert it: {CONVERT}")
            chunks.append((tuple(c.offsets), tuple(c.sizes), info))
        out[fqn] = _Entry(tuple(meta.size), meta.properties.dtype, tuple(chunks))
    return out, list(skipped)


class _FileView(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file as a file of their own, so that ``torch.load`` reads a
    chunk's blob straight from the ``.distcp`` file (no copy of the blob in memory beside the tensor)."""

    def __init__(self, f, start: int, length: int):
        super().__init__()
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence] + offset
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        if n == 0:
            return 0
        self.f.seek(self.start + self.pos)
        got = self.f.readinto(memoryview(b).cast("B")[:n])
        self.pos += got
        return got


def _load_chunk(folder: Path, info, fqn: str):
    import torch

    path = folder / info.relative_path
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise GraftkitError(f"{path}: cannot read tensor {fqn} ({exc.strerror or exc})",
                            "check that every .distcp file of the checkpoint is present") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < info.offset + info.length:
            raise GraftkitError(f"{path}: ends before tensor {fqn}'s bytes ({max(0, size - info.offset):,} of "
                                f"{info.length:,})", "the checkpoint is incomplete: copy or save it again")
        try:
            return torch.load(_FileView(f, info.offset, info.length), map_location="cpu", weights_only=True)
        except Exception as exc:  # a damaged blob: torch raises several types
            raise GraftkitError(f"{path}: tensor {fqn} cannot be loaded with torch.load(weights_only=True) "
                                f"({type(exc).__name__})", "the checkpoint is damaged: save it again") from None


def read_entry(folder: Path, fqn: str, e: _Entry):
    """Tensor ``fqn`` in its global shape and saved dtype, assembled from its chunks (one chunk in memory at a time)."""
    import torch

    if len(e.chunks) == 1 and e.chunks[0][1] == e.size:
        t = _load_chunk(folder, e.chunks[0][2], fqn)
        return t.reshape(e.size)
    out = torch.empty(e.size, dtype=e.dtype)
    covered = 0
    for offsets, sizes, info in e.chunks:
        t = _load_chunk(folder, info, fqn).reshape(sizes)
        view = out
        for dim, (o, s) in enumerate(zip(offsets, sizes)):
            view = view.narrow(dim, o, s)
        view.copy_(t)
        covered += t.numel()
    if covered != out.numel():
        raise GraftkitError(f"{folder}: tensor {fqn}'s chunks cover {covered:,} of its {out.numel():,} entries",
                            "the checkpoint is incomplete or overlapping: save it again")
    return out


def recognise(path: Path) -> Found | None:
    """The DCP folder ``path`` is or holds (a Trainer's ``checkpoint-N/pytorch_model_fsdp_0/``), else None."""
    for sub in ("", *FSDP_MODEL_DIRS):
        folder = path / sub if sub else path
        if is_dcp(folder) and not is_megatron(folder):
            where = f"{path.name}/{sub}/" if sub else f"{path.name}/"
            return Found(folder, f"a torch.distributed.checkpoint folder ({where})")
    return None


def open_dcp(found: Found, path: Path) -> Checkpoint:
    """The :class:`~..reader.Checkpoint` of the DCP folder ``found.where``: the model's tensors, as saved."""
    folder = found.where
    entries, skipped = model_entries(folder)
    metas = {}
    for n, e in entries.items():
        try:
            metas[n] = TensorMeta(n, code_of(e.dtype), e.size)
        except KeyError:
            raise GraftkitError(f"{folder}: tensor {n} has dtype {e.dtype}, which graftkit does not read",
                                f"convert it: {CONVERT}") from None
    config, config_from = config_near(folder)
    source = f"{dtype_words(m.code for m in metas.values())} tensors of the DCP folder, as saved (chunks joined)"
    files = tuple(sorted(folder.glob("*.distcp")))
    note = f"{Path(path).name}: {found.name}, {len(metas)} model tensors" + (
        f" (not read: {', '.join(skipped)})" if skipped else "")
    return with_tensors(Checkpoint(path=Path(path), kind="dcp", metas=metas,
                                   reader=lambda n: read_entry(folder, n, entries[n]), config=config,
                                   config_from=config_from, weight_files=(folder / METADATA, *files), notes=(note,),
                                   foreign_names=True, source=source), found, CONVERT)


READER = Reader("dcp", recognise, open_dcp, pickled=True, layout=True, convert=CONVERT)

__all__ = ["CONVERT", "FSDP_MODEL_DIRS", "METADATA", "NOT_MODEL", "READER", "is_dcp", "model_entries", "open_dcp",
           "read_entry", "read_metadata", "recognise"]
