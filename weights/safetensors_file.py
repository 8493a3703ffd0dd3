"""The safetensors format, read lazily and written as a stream.

A safetensors file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets relative
to the end of the header), then the raw little-endian tensor bytes.

Reading validates the whole header before any tensor is touched (a truncated file, a corrupt or oversized
header, offsets that do not fit the shape are each one clear error), then reads one tensor at a time with
``pread``, checking the file's size first and the byte count after: no memory map, so a file truncated
while it is read is an error naming it, not a bus error that kills the process. Writing is a stream: :func:`header_bytes` lays
out the header from the tensor list first, so every tensor's offset is known before any byte is written
(``weights/writer.py`` then fills the file in parallel, copying unchanged byte ranges in the kernel).
"""

from __future__ import annotations

import json
import math
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..core.errors import GraftkitError

MAX_HEADER_BYTES = 100_000_000  # the limit of the reference implementation

#: Bytes per element of each safetensors dtype code.
ITEMSIZE: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}
#: The numpy view of each code's bytes; bfloat16 and float8 (which numpy lacks) as their raw bits.
NUMPY: dict[str, str] = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?", "F8_E4M3": "u1", "F8_E5M2": "u1", "U16": "<u2", "U32": "<u4",
    "U64": "<u8",
}
_TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


def dtype_name(code: str) -> str:
    """The dtype's usual name (``"BF16"`` → ``"bfloat16"``)."""
    return _TORCH_NAMES[code]


def torch_dtype(code: str):
    """The torch dtype of a safetensors code. torch is imported here, on first use, not with graftkit:
    reading headers, planning and byte-exact copies never need it."""
    import torch

    return getattr(torch, _TORCH_NAMES[code])


def code_of(dtype) -> str:
    """The safetensors code of a torch dtype; ``KeyError`` for a dtype safetensors cannot hold."""
    name = str(dtype).removeprefix("torch.")
    for code, n in _TORCH_NAMES.items():
        if n == name:
            return code
    raise KeyError(name)


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
    def torch_dtype(self):
        return torch_dtype(self.dtype)


def _itemsize(code: str) -> int:
    return ITEMSIZE[code]


class SafetensorsFile:
    """One validated safetensors file; each tensor is read with ``pread`` into memory of its own.

    The file stays open from its header on, so every tensor comes from the file whose header was read,
    and each read checks the file's size against the header's end of data first and counts the bytes it
    got: a file that shrinks while it is read (a checkpoint being rewritten, network storage) is one
    :class:`GraftkitError` naming it, never a ``SIGBUS`` through a memory map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.entries, self.metadata, self.data_start = read_header(self.path)
        self.data_end = max((e.end for e in self.entries.values()), default=self.data_start)
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def _changed(self, actual: int, name: str) -> GraftkitError:
        return GraftkitError(f"{self.path}: the file is {actual:,} bytes now, its header needs {self.data_end:,} "
                             f"(reading tensor {name}); the checkpoint changed while it was read",
                             "rerun when it is complete")

    def _pread_into(self, name: str, buf: memoryview) -> None:
        e = self.entries[name]
        size = os.fstat(self._fd).st_size
        if size < self.data_end:
            raise self._changed(size, name)
        done = 0
        while done < e.nbytes:
            n = os.preadv(self._fd, [buf[done:]], e.start + done)
            if n <= 0:
                raise self._changed(os.fstat(self._fd).st_size, name)
            done += n

    def read(self, name: str):
        """The tensor ``name`` (torch), read from the file into a tensor of its own."""
        import torch

        e = self.entries[name]
        if e.numel == 0:
            return torch.empty(e.shape, dtype=e.torch_dtype)
        flat = torch.empty(e.nbytes, dtype=torch.uint8)
        self._pread_into(name, memoryview(flat.numpy()))
        return flat.view(e.torch_dtype).reshape(e.shape)

    def array(self, name: str) -> np.ndarray:
        """The tensor ``name`` as numpy, typed by :data:`NUMPY` (bfloat16 and float8 as their raw bits).
        No torch involved."""
        e = self.entries[name]
        out = np.empty(e.shape, dtype=NUMPY[e.dtype])
        if e.numel:
            self._pread_into(name, memoryview(out.reshape(-1).view(np.uint8)))
        return out


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
        if code not in ITEMSIZE:
            raise GraftkitError(
                f"{path}: tensor {name} has unsupported dtype {code}", f"supported: {', '.join(ITEMSIZE)}"
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
