"""What a checkpoint reader is and what it gives: the :class:`Reader` protocol and the :class:`Checkpoint` it opens.

A reader is one kind of checkpoint on disk — an HF folder, a single ``.safetensors`` file, a pickled state dict, a
distributed trainer's own layout — and answers two questions: does a path hold its kind (``recognise``, from what is
on disk alone: file names, an index, a ``latest`` file, never a tensor), and what are its tensors (``open``, a
:class:`Checkpoint`). :data:`.checkpoint.READERS` lists every reader in the order they are tried; each lives in its
format's own module.

Every kind answers the same questions (:class:`Checkpoint`): which tensors, their dtype and shape, a tensor's values,
where its raw bytes lie when they lie in a file unchanged (so an exact copy never passes through Python), and how
precise the values read are (:attr:`Checkpoint.precision`, which every result's provenance records).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from ..core.errors import GraftkitError
from .safetensors_file import ITEMSIZE, NUMPY, TensorEntry, dtype_name, torch_dtype
from .taxonomy import Taxonomy, classify

PROVENANCE = "graftkit.json"
#: How every pickle a reader loads is read, in the words the precision line records.
RESTRICTED = "graftkit's restricted unpickler (weights_only, allowlisted classes)"


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


def _pread_exact(fd: int, view: memoryview, offset: int, e: TensorEntry, name: str) -> None:
    """Fill ``view`` from ``fd`` at ``offset``; a file that ends early (it shrank since its header was read)
    is one GraftkitError naming it and the tensor."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise GraftkitError(
                f"{e.file}: the file is {os.fstat(fd).st_size:,} bytes now, tensor {name} needs bytes up to "
                f"{e.end:,}; the checkpoint changed while it was read", "rerun when it is complete")
        done += n


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A set of named tensors with its folder's config and provenance, read lazily. Built by name and never
    changed after: a variant (renamed, cast, cut, annotated) is a new one (``dataclasses.replace``)."""

    path: Path
    kind: str  # its reader's kind (.checkpoint.READERS: "hf-folder", "dcp", …), or "lora-merged" (.lora.apply_lora)
    metas: dict[str, TensorMeta]
    reader: Callable[[str], object]  # name -> torch.Tensor
    raw: Mapping[str, TensorEntry] = field(default_factory=dict)  # bytes on disk, where unchanged
    config: dict | None = None
    provenance: dict | None = None  # the folder's graftkit.json, if any
    weight_files: tuple[Path, ...] = ()
    arrays: Callable[[str], np.ndarray] | None = None  # name -> numpy view, without torch
    notes: tuple[str, ...] = ()  # how the file was read: container, prefixes stripped, config source
    config_from: Path | None = None  # the folder config.json (and tokenizer files) came from, if not its own
    #: name -> the exact update from the base where the checkpoint is base + a stored update (a LoRA adapter:
    #: s·B@A in float32 from A and B, never the difference of two rounded matrices); None elsewhere
    deltas: Callable[[str], object | None] | None = None
    #: the names are the trainer's (a wrapper's or a container's prefixes): :func:`.checkpoint.match_names` maps them
    foreign_names: bool = False
    #: where the values come from, at which precision: "fp32 master weights from ZeRO-3 optimizer partitions"
    source: str | None = None
    #: what values read as stored lie in ("safetensors files"), for a :attr:`precision` source that states no more
    stored: str | None = None
    #: read from pickles, through graftkit's restricted unpickler (:data:`RESTRICTED`): the precision line says so
    unpickled: bool = False
    #: set when the checkpoint holds the weights only below the precision they were trained in: why, in words
    below_trained: str | None = None

    @property
    def loose(self) -> bool:
        """Names still to be mapped by :func:`.checkpoint.match_names` (a single pickled file, a trainer's own layout),
        and a config that may have to come from another folder."""
        return self.foreign_names or (self.kind == "pickle" and self.path.is_file())

    @property
    def names(self) -> list[str]:
        return list(self.metas)

    @property
    def precision(self) -> dict:
        """How precise the values read are, and why: ``dtype`` (the floating dtypes read, largest share of entries
        first, e.g. ``"float32"`` or ``"bfloat16+float32"``), ``source`` (where they come from, at that precision;
        pickles: through graftkit's restricted unpickler) and ``below_trained`` (set when the checkpoint holds the
        weights only below the precision they were trained in: why, in words)."""
        counts: dict[str, int] = {}
        for m in self.metas.values():
            if m.code.startswith(("F", "BF")):
                counts[m.code] = counts.get(m.code, 0) + m.numel
        dtype = "+".join(dtype_name(c) for c in sorted(counts, key=lambda c: -counts[c])) or "none"
        source = self.source or f"{dtype} tensors as stored ({self.stored or self.kind})"
        if self.unpickled:
            source += f", read through {RESTRICTED}"
        return {"dtype": dtype, "source": source, "below_trained": self.below_trained}

    def read(self, name: str):
        """The values of tensor ``name`` as a torch tensor (a read-only view where possible)."""
        return self.reader(name)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as numpy, typed by its dtype code (bfloat16 and float8 as raw bits): a view of
        the mapped file for safetensors, so reading needs no torch."""
        if self.arrays is not None and name in self.raw:
            return self.arrays(name)
        return tensor_bits(self.read(name))

    def array_chunks(self, name: str, chunk: int, read_bytes: int = 8 << 20, every: int = 1) -> Iterator[np.ndarray]:
        """Tensor ``name`` flattened, as consecutive numpy chunks of ``chunk`` entries (the last one shorter),
        typed as :meth:`array` types them; with ``every`` = k only chunks 0, k, 2k, … (an evenly spread
        sample of 1/k of the tensor). A tensor stored as raw bytes is read ``read_bytes`` (a whole number of
        chunks; one chunk when sampling) at a time into one reused buffer (memory: that buffer, whatever the
        tensor's size; each chunk is valid until the next is taken); any other is read whole and sliced."""
        e = self.raw.get(name) if self.arrays is not None else None
        if e is None:
            flat = self.array(name).reshape(-1)
            for i in range(0, flat.size, chunk * every):
                yield flat[i:i + chunk]
            return
        item = np.dtype(NUMPY[e.dtype]).itemsize
        if every > 1:
            yield from self._sampled_chunks(name, e, chunk, every, item)
            return
        per_read = chunk * max(1, read_bytes // (chunk * item))
        buf = np.empty(min(per_read, max(e.numel, 1)), dtype=NUMPY[e.dtype])
        raw = memoryview(buf.view(np.uint8))
        fd = os.open(e.file, os.O_RDONLY)
        try:
            for i in range(0, e.numel, per_read):
                k = min(per_read, e.numel - i)
                _pread_exact(fd, raw[:k * item], e.start + i * item, e, name)
                for j in range(0, k, chunk):
                    yield buf[j:min(j + chunk, k)]
        finally:
            os.close(fd)

    def _sampled_chunks(self, name: str, e: TensorEntry, chunk: int, every: int, item: int) -> Iterator[np.ndarray]:
        buf = np.empty(min(chunk, max(e.numel, 1)), dtype=NUMPY[e.dtype])
        raw = memoryview(buf.view(np.uint8))
        fd = os.open(e.file, os.O_RDONLY)
        try:
            for i in range(0, e.numel, chunk * every):
                k = min(chunk, e.numel - i)
                _pread_exact(fd, raw[:k * item], e.start + i * item, e, name)
                yield buf[:k]
        finally:
            os.close(fd)

    def readinto(self, name: str, out: np.ndarray) -> bool:
        """Read tensor ``name``'s bytes from its file straight into ``out`` (a C-contiguous array of the same
        byte size, e.g. :func:`tensor_bits` of a parameter): one ``pread``, no page faults on a mapping.
        Returns False, reading nothing, when the tensor is not stored as raw bytes or the sizes differ."""
        e = self.raw.get(name)
        if e is None or out.nbytes != e.nbytes or not out.flags.c_contiguous or not out.flags.writeable:
            return False
        view = memoryview(out.reshape(-1).view(np.uint8))
        fd = os.open(e.file, os.O_RDONLY)
        try:
            _pread_exact(fd, view, e.start, e, name)
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


@dataclass(frozen=True)
class Found:
    """What a reader recognised at a path."""

    where: Path  # the file or folder that holds the weights (a step's actor/ folder, a Trainer's DCP model folder)
    name: str  # what it is, in words, for notes and errors: "a DeepSpeed checkpoint (global_step4/)"


@dataclass(frozen=True)
class Reader:
    """One kind of checkpoint on disk: how it is recognised and how it is opened."""

    kind: str
    """The :attr:`Checkpoint.kind` of what it opens ("dcp"), recorded with every result's precision; for a reader that
    refuses, the kind it refuses ("megatron")."""
    recognise: Callable[[Path], Found | None]
    """What of ``path`` it would read, judged from what is on disk alone (no tensor is loaded, nothing raises); None
    when ``path`` holds none of its kind."""
    open: Callable[[Found, Path], Checkpoint]
    """The :class:`Checkpoint` of what ``recognise`` found (``path``: what the user named); for a reader that
    ``refuses``, the one error saying what to pass instead."""
    pickled: bool = False
    """It loads pickles, through graftkit's restricted unpickler (``torch.load(weights_only=True)`` with only its
    format's own classes admitted): the precision line says so, and ``--no-pickle`` refuses it."""
    layout: bool = False
    """A distributed trainer's own layout (:mod:`.trainers`): a folder of pieces, none of them a model alone. Where it
    lies beside bf16/fp16 HF weights (a Trainer's ``checkpoint-N/``), it holds the trainer's own, more precise copy."""
    refuses: bool = False
    """Recognised only to be refused (an adapter alone, a layout graftkit does not read): ``open`` raises."""
    convert: str = ""
    """How it is converted, where it is trusted, into what graftkit reads without it: named by the errors that
    refuse it."""


__all__ = ["Checkpoint", "Found", "PROVENANCE", "RESTRICTED", "Reader", "TensorMeta", "tensor_bits"]
