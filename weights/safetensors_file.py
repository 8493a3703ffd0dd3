"""The safetensors format, read lazily and written as a stream.

A safetensors file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets relative
to the end of the header), then the raw little-endian tensor bytes.

Reading validates the whole header before any tensor is touched (a truncated file, a corrupt or oversized
header, offsets that do not fit the shape are each one clear error) and memory-maps the file, so a tensor
is a zero-copy view whose pages the kernel can drop again. Writing is a stream: :func:`header_bytes` lays
out the header from the tensor list first, so every tensor's offset is known before any byte is written
(``weights/writer.py`` then fills the file in parallel, copying unchanged byte ranges in the kernel).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable

import torch

from ..errors import GraftkitError

MAX_HEADER_BYTES = 100_000_000  # the limit of the reference implementation

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
}
CODES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes live: file, absolute byte range, dtype code and shape."""

    name: str
    dtype: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def _itemsize(code: str) -> int:
    return DTYPES[code].itemsize


class SafetensorsFile:
    """One validated safetensors file; tensors are read as zero-copy views of a private mmap."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.entries, self.metadata, self.data_start = read_header(self.path)

    @cached_property
    def _map(self) -> mmap.mmap:
        with open(self.path, "rb") as f:
            # ACCESS_COPY: a writable private mapping, so torch can wrap it without copying, while no
            # write can ever reach the file.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as a view of the mapped file (treat it as read-only)."""
        e = self.entries[name]
        if e.numel == 0:
            return torch.empty(e.shape, dtype=e.torch_dtype)
        flat = torch.frombuffer(self._map, dtype=torch.uint8, count=e.nbytes, offset=e.start)
        return flat.view(e.torch_dtype).reshape(e.shape)


def read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str], int]:
    """Parse and validate a safetensors header: (entries by name, metadata, data start offset)."""
    if not path.is_file():
        raise GraftkitError(f"{path}: no such file", "check the checkpoint path")
    size = path.stat().st_size
    if size < 8:
        raise GraftkitError(
            f"{path}: truncated safetensors file ({size} bytes, shorter than its 8-byte header length)",
            "re-download or re-save the checkpoint",
        )
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise GraftkitError(
                f"{path}: safetensors header claims {n:,} bytes (limit {MAX_HEADER_BYTES:,}); "
                "the file is corrupt or not safetensors",
                "re-download or re-save the checkpoint",
            )
        if 8 + n > size:
            raise GraftkitError(
                f"{path}: truncated safetensors file (header needs {8 + n:,} bytes, file has {size:,})",
                "re-download or re-save the checkpoint",
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraftkitError(
            f"{path}: corrupt safetensors header ({exc})", "re-download or re-save the checkpoint"
        ) from None
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    entries: dict[str, TensorEntry] = {}
    for name, spec in header.items():
        try:
            code, shape, (b, e) = spec["dtype"], tuple(spec["shape"]), spec["data_offsets"]
            # JSON numbers only: a string, null or negative size would fail later, inside torch
            if type(code) is not str or not all(type(x) is int and x >= 0 for x in (*shape, b, e)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise GraftkitError(
                f"{path}: corrupt safetensors header entry for tensor {name}: {spec!r}",
                "re-download or re-save the checkpoint",
            ) from None
        if code not in DTYPES:
            raise GraftkitError(
                f"{path}: tensor {name} has unsupported dtype {code}", f"supported: {', '.join(DTYPES)}"
            )
        if not (0 <= b <= e) or e - b != math.prod(shape) * _itemsize(code):
            raise GraftkitError(
                f"{path}: tensor {name} {code}{list(shape)} has data_offsets [{b}, {e}] that do not fit "
                "its shape; the header is corrupt",
                "re-download or re-save the checkpoint",
            )
        if data_start + e > size:
            raise GraftkitError(
                f"{path}: truncated safetensors file (tensor {name} ends at byte {data_start + e:,}, "
                f"file has {size:,})",
                "re-download or re-save the checkpoint",
            )
        entries[name] = TensorEntry(name, code, shape, path, data_start + b, data_start + e)
    return entries, metadata, data_start


# ------------------------------------------------------------------------------------------ writing


@dataclass(frozen=True)
class OutTensor:
    """One tensor of a file being written: its name, dtype code and shape (the bytes come later)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return _itemsize(self.dtype) * math.prod(self.shape)


def header_bytes(tensors: Iterable[OutTensor], metadata: dict[str, str] | None = None) -> bytes:
    """The header (length prefix included) for ``tensors`` laid out in order, padded to 8 bytes."""
    head: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in tensors:
        head[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
