"""Checkpoints in, one tensor at a time.

:func:`open_checkpoint` reads what a researcher has: an HF folder (``config.json`` with a single
``model.safetensors`` or shards listed by ``model.safetensors.index.json``), a single ``.safetensors``
file, a PEFT LoRA adapter folder (only as the ``rl`` side of a pair, over its base: see
:func:`apply_lora`), or — only with ``allow_pickle`` — pickled ``.bin``/``.pt`` weights, loaded with
``torch.load(weights_only=True)``. Every kind answers the same questions (:class:`Checkpoint`): which
tensors, their dtype and shape, a tensor's values, and where its raw bytes lie when they lie in a file
unchanged (so an exact copy never passes through Python).

Nothing here loads a whole model: safetensors are memory-mapped and a tensor is a view of its pages.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from ..errors import GraftkitError
from .safetensors_file import ITEMSIZE, NUMPY, SafetensorsFile, TensorEntry, code_of, torch_dtype
from .taxonomy import Taxonomy, classify

INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PROVENANCE = "graftkit.json"


@dataclass(frozen=True)
class TensorMeta:
    name: str
    code: str  # safetensors dtype code, e.g. "BF16"
    shape: tuple[int, ...]

    @property
    def dtype(self):
        """The torch dtype (imports torch on first use)."""
        return torch_dtype(self.code)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.code]


def tensor_bits(t) -> np.ndarray:
    """A torch tensor as the numpy array :meth:`Checkpoint.array` gives (bfloat16/float8 as raw bits)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy()
    return t.numpy()


@dataclass
class Checkpoint:
    """A set of named tensors with its folder's config and provenance, read lazily."""

    path: Path
    kind: str  # "hf-folder" | "safetensors-file" | "pickle" | "lora-merged"
    metas: dict[str, TensorMeta]
    reader: Callable[[str], object]  # name -> torch.Tensor
    raw: Mapping[str, TensorEntry] = field(default_factory=dict)  # bytes on disk, where unchanged
    config: dict | None = None
    provenance: dict | None = None  # the folder's graftkit.json, if any
    weight_files: tuple[Path, ...] = ()
    arrays: Callable[[str], np.ndarray] | None = None  # name -> numpy view, without torch

    @property
    def names(self) -> list[str]:
        return list(self.metas)

    def read(self, name: str):
        """The values of tensor ``name`` as a torch tensor (a read-only view where possible)."""
        return self.reader(name)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as numpy, typed by its dtype code (bfloat16 and float8 as raw bits): a view of
        the mapped file for safetensors, so reading needs no torch."""
        if self.arrays is not None and name in self.raw:
            return self.arrays(name)
        return tensor_bits(self.read(name))

    def readinto(self, name: str, out: np.ndarray) -> bool:
        """Read tensor ``name``'s bytes from its file straight into ``out`` (a C-contiguous array of the same
        byte size, e.g. :func:`tensor_bits` of a parameter): one ``pread``, no page faults on a mapping.
        Returns False, reading nothing, when the tensor is not stored as raw bytes or the sizes differ."""
        e = self.raw.get(name)
        if e is None or out.nbytes != e.nbytes or not out.flags.c_contiguous or not out.flags.writeable:
            return False
        view = memoryview(out).cast("B")
        fd = os.open(e.file, os.O_RDONLY)
        try:
            done = 0
            while done < e.nbytes:
                n = os.preadv(fd, [view[done:]], e.start + done)
                if n <= 0:
                    raise GraftkitError(f"{e.file}: tensor {name} ends early (short read)",
                                        "the file changed or is truncated; re-create it")
                done += n
        finally:
            os.close(fd)
        return True

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def model_type(self) -> str | None:
        return (self.config or {}).get("model_type")

    @property
    def tied(self) -> bool | None:
        """Whether the output head shares the embedding, from the config (None if it does not say)."""
        cfg = self.config or {}
        for c in (cfg, cfg.get("text_config") or {}):
            if "tie_word_embeddings" in c:
                return bool(c["tie_word_embeddings"])
        return None

    def taxonomy(self, unknown: str = "error") -> Taxonomy:
        return classify(self.metas, self.model_type, tied=self.tied, unknown=unknown)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.metas.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.metas)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GraftkitError(f"{path}: cannot read JSON ({exc})", "fix or restore the file") from None


def _from_safetensors(path: Path, kind: str, files: list[Path], config: dict | None) -> Checkpoint:
    opened = [SafetensorsFile(f) for f in files]
    entries: dict[str, TensorEntry] = {}
    by_name: dict[str, SafetensorsFile] = {}
    for sf in opened:
        for name, e in sf.entries.items():
            if name in entries:
                raise GraftkitError(
                    f"{path}: tensor {name} appears in both {entries[name].file.name} and {sf.path.name}",
                    "remove the stale shard",
                )
            entries[name], by_name[name] = e, sf
    metas = {n: TensorMeta(n, e.dtype, e.shape) for n, e in entries.items()}
    folder = path if path.is_dir() else path.parent
    prov = _read_json(folder / PROVENANCE) if (path.is_dir() and (folder / PROVENANCE).is_file()) else None
    return Checkpoint(
        path, kind, metas, lambda n: by_name[n].read(n), entries, config, prov, tuple(files),
        lambda n: by_name[n].array(n),
    )


def _shards_from_index(folder: Path, index_name: str) -> list[Path]:
    index = _read_json(folder / index_name)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise GraftkitError(f"{folder / index_name}: no weight_map", "re-save the checkpoint")
    files = list(dict.fromkeys(weight_map.values()))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise GraftkitError(
            f"{folder}: shard(s) listed in {index_name} are missing: {', '.join(missing)}",
            "download or copy the missing shards",
        )
    return [folder / f for f in files]


def _check_index(index_path: Path, ckpt: Checkpoint) -> None:
    """Every tensor the index lists must lie in the shard it names: a stale or partial shard would
    otherwise drop a tensor without a word."""
    for name, fname in _read_json(index_path)["weight_map"].items():
        entry = ckpt.raw.get(name)
        if entry is None or entry.file != index_path.parent / fname:
            found = f"it is in {entry.file.name}" if entry else "no shard holds it"
            raise GraftkitError(
                f"{index_path}: tensor {name} is listed in {fname} but {found}",
                "re-download or re-save the checkpoint",
            )


def open_checkpoint(path: str | os.PathLike, allow_pickle: bool = False) -> Checkpoint:
    """Open an HF folder, a single ``.safetensors`` file, or (``allow_pickle``) pickled weights."""
    path = Path(path).expanduser()
    if not path.exists():
        raise GraftkitError(f"{path}: no such file or folder", "check the checkpoint path")
    if path.is_file():
        if path.suffix == ".safetensors":
            return _from_safetensors(path, "safetensors-file", [path], None)
        if path.suffix in (".bin", ".pt", ".pth"):
            return _open_pickle(path, [path], None, allow_pickle)
        raise GraftkitError(
            f"{path}: not a checkpoint (expected a folder, a .safetensors file, or .bin/.pt with --allow-pickle)",
            "point at the model folder",
        )
    if (path / "adapter_config.json").is_file():
        raise GraftkitError(
            f"{path} is a LoRA adapter, not a full checkpoint",
            "pass it as the RL side (--from) with the full base model as --base",
        )
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if (path / INDEX).is_file():
        ckpt = _from_safetensors(path, "hf-folder", _shards_from_index(path, INDEX), config)
        _check_index(path / INDEX, ckpt)
        return ckpt
    if (path / "model.safetensors").is_file():
        return _from_safetensors(path, "hf-folder", [path / "model.safetensors"], config)
    singles = sorted(path.glob("*.safetensors"))
    if singles:
        return _from_safetensors(path, "hf-folder", singles, config)
    if (path / PICKLE_INDEX).is_file():
        return _open_pickle(path, _shards_from_index(path, PICKLE_INDEX), config, allow_pickle)
    pickles = sorted(p for ext in ("*.bin", "*.pt", "*.pth") for p in path.glob(ext))
    if pickles:
        return _open_pickle(path, pickles, config, allow_pickle)
    raise GraftkitError(
        f"{path}: no weights found (expected model.safetensors, {INDEX}, or *.safetensors)",
        "point at the folder that holds the model's weights",
    )


def _open_pickle(path: Path, files: list[Path], config: dict | None, allow: bool) -> Checkpoint:
    if not allow:
        raise GraftkitError(
            f"{files[0]}: pickled weights are refused by default (loading a pickle can run arbitrary code)",
            "convert to safetensors, or pass --allow-pickle to load with torch.load(weights_only=True)",
        )
    import torch

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises many types for a bad or unsafe pickle
            raise GraftkitError(f"{f}: cannot load with weights_only=True ({exc})".splitlines()[0]) from None
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise GraftkitError(f"{f}: not a state dict of tensors", "save model.state_dict() instead")
        tensors.update(sd)
    metas = {}
    for n, t in tensors.items():
        try:
            metas[n] = TensorMeta(n, code_of(t.dtype), tuple(t.shape))
        except KeyError:
            raise GraftkitError(f"{path}: tensor {n} has unsupported dtype {t.dtype}") from None
    prov_path = (path if path.is_dir() else path.parent) / PROVENANCE
    prov = _read_json(prov_path) if path.is_dir() and prov_path.is_file() else None
    return Checkpoint(path, "pickle", metas, tensors.__getitem__, {}, config, prov, tuple(files))


__all__ = ["Checkpoint", "TensorMeta", "open_checkpoint", "tensor_bits", "PROVENANCE", "NUMPY"]
