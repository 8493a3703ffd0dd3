"""HF folders out, atomically and as a stream.

:func:`write_checkpoint` writes a list of tensors, each given as the raw bytes of a file range (copied in
the kernel) or as a function yielding the tensor in row chunks, into a new HF folder:

- sharded by HF's rule (tensors in order; a new shard starts when the next tensor would push the current
  one past ``max_shard_size``; one shard is ``model.safetensors``, more are
  ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``);
- dtypes kept as given; config, tokenizer, processor and generation files copied from a source folder;
- ``graftkit.json`` recording what produced it;
- atomically: everything goes to a hidden sibling folder, is fsynced, then renamed into place and the
  parent folder fsynced. An interrupted write leaves the destination as it was; the next writer removes
  what a killed one left (``graftkit.core.files``). Free space is checked against the output's size first. The destination may never be, contain, or lie
  inside an input, and an existing one is replaced only with ``force`` (and only if graftkit wrote it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from ..core.errors import GraftkitError
from ..core.files import (check_folder_dest, check_space, check_writable, fsync_dir, sweep_stale, temp_path, translated,
                          write_all, write_atomic)
from .hf_folder import INDEX
from .reader import PROVENANCE, tensor_bits
from .safetensors_file import OutTensor, TensorEntry, code_of, header_bytes

# Files that describe a model rather than hold its weights; copied into every output.
AUX_PATTERNS = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")
_NOT_AUX = {INDEX, PROVENANCE, "pytorch_model.bin.index.json", "adapter_config.json"}


@dataclass(frozen=True)
class OutSpec:
    """One tensor to write: its name, dtype and shape, and where its bytes come from.

    ``dtype`` is a torch dtype or a safetensors code (``"BF16"``). ``source`` is either a
    :class:`TensorEntry` (an exact byte range of an existing file) or a function returning an iterable of
    tensors whose concatenated row-major bytes are the tensor.
    """

    name: str
    dtype: object
    shape: tuple[int, ...]
    source: TensorEntry | Callable[[], Iterable[object]]

    @property
    def code(self) -> str:
        return self.dtype if isinstance(self.dtype, str) else code_of(self.dtype)

    @property
    def out(self) -> OutTensor:
        return OutTensor(self.name, self.code, tuple(self.shape))


def parse_size(size: str | int) -> int:
    """HF's size strings: ``"5GB"`` = 5·10⁹ bytes, ``"5GiB"`` = 5·2³⁰, a bare int is bytes."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", size, re.IGNORECASE)
    if not m:
        raise GraftkitError(f"--max-shard-size {size!r} is not a size", "write e.g. 5GB, 500MB or 2GiB")
    unit = (m[2] or "B").upper()
    base = 1024 if "I" in unit else 1000
    power = "BKMGT".index(unit[0])
    return int(float(m[1]) * base**power)


def plan_shards(specs: Sequence[OutSpec], max_shard_size: int) -> list[list[OutSpec]]:
    """HF's rule: fill shards in order; start a new one when the next tensor would overflow it."""
    shards: list[list[OutSpec]] = [[]]
    size = 0
    for s in specs:
        n = s.out.nbytes
        if shards[-1] and size + n > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards if shards[0] else []


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_destination(dest: Path, inputs: Iterable[Path], force: bool, files: Iterable[Path] = ()) -> Path:
    """Refuse a destination that is, contains or lies in an input, or that exists without ``force``.

    An input file stands for its folder (a model folder's ``model.safetensors``); ``files`` are inputs that
    stand alone (a training checkpoint ``rl.ckpt``): only the file itself and the folders holding it are
    refused."""
    dest = Path(dest).expanduser().resolve()
    for f in files:
        f = Path(f).expanduser().resolve()
        if _inside(f, dest):
            raise GraftkitError(f"output folder {dest} overlaps the input {f}",
                                "choose an output folder outside every input")
    for i in inputs:
        i = Path(i).expanduser().resolve()
        folder = i if i.is_dir() else i.parent
        if _inside(dest, folder) or _inside(folder, dest):
            raise GraftkitError(
                f"output folder {dest} overlaps the input {i}", "choose an output folder outside every input"
            )
    if dest.exists() and not dest.is_dir():
        raise GraftkitError(f"{dest} is a file, not an output folder, and was not written by graftkit",
                            "remove it yourself or choose another output folder")
    check_folder_dest(dest)  # a parent that is a file
    if dest.exists():
        if not force:
            raise GraftkitError(f"output folder {dest} already exists", "pass --force to replace it")
        if any(dest.iterdir()) and not (dest / PROVENANCE).is_file():
            raise GraftkitError(
                f"{dest} exists and was not written by graftkit; --force only replaces graftkit outputs",
                "remove it yourself or choose another output folder",
            )
    return dest


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(folder)


@contextlib.contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """Yield a hidden sibling folder to fill; on success it replaces ``dest`` in one rename, and the parent
    folder is fsynced. Stale temporaries of dead processes beside ``dest`` are removed first
    (:func:`graftkit.core.files.sweep_stale`); what the operating system refuses is one GraftkitError."""
    with translated(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(dest.parent)
        tmp = temp_path(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    try:
        with translated(dest):
            yield tmp
            _fsync_tree(tmp)
            if dest.exists():
                old = dest.parent / f".{dest.name}.old-{os.getpid()}"
                os.replace(dest, old)
                try:
                    os.replace(tmp, dest)
                except BaseException:
                    os.replace(old, dest)  # put the earlier output back before reporting the failure
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, dest)
            fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json_atomic(path: Path, obj: object) -> None:
    """``obj`` as indented JSON at ``path``, atomically (:func:`graftkit.core.files.write_atomic`)."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def output_bytes(specs: Sequence[OutSpec], aux_from: Path | None, extra_files: dict[str, bytes] | None) -> int:
    """What a checkpoint folder of ``specs`` will take: the tensors, their headers, the copied files."""
    tensors = sum(s.out.nbytes for s in specs) + sum(len(s.name) + 96 for s in specs)
    aux = sum(p.stat().st_size for p in aux_files(aux_from))
    return tensors + aux + sum(len(v) for v in (extra_files or {}).values())


def aux_files(folder: Path | None) -> list[Path]:
    if folder is None or not folder.is_dir():
        return []
    found = {p for pat in AUX_PATTERNS for p in folder.glob(pat) if p.is_file()}
    return sorted(p for p in found if p.name not in _NOT_AUX)


def _libc_sync_file_range():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE = _libc_sync_file_range()


def _start_writeback(fd: int, pos: int, nbytes: int) -> None:
    """Ask the kernel to start writing a just-written range to disk now (Linux ``sync_file_range``
    with ``SYNC_FILE_RANGE_WRITE``, asynchronous), so the final fsync finds little left to do: disk
    writes overlap the copying instead of following it. A no-op where unavailable."""
    if _SYNC_FILE_RANGE is not None and nbytes >= 1 << 20:
        _SYNC_FILE_RANGE(fd, pos, nbytes, 2)


def _copy_at(src_fd: int, src_pos: int, dst_fd: int, dst_pos: int, nbytes: int, src: Path | None = None) -> None:
    """Copy a byte range between files at explicit offsets (thread-safe: no file position moves).

    ``copy_file_range`` keeps the bytes in the kernel (and shares extents on file systems that can);
    where it is unavailable the copy goes through a 16 MB buffer.
    """
    done = 0
    try:
        while done < nbytes:
            n = os.copy_file_range(src_fd, dst_fd, nbytes - done, src_pos + done, dst_pos + done)
            if n == 0:
                break
            done += n
    except OSError:
        pass  # EXDEV, ENOSYS, EINVAL on some file systems: finish below
    while done < nbytes:
        chunk = os.pread(src_fd, min(16 << 20, nbytes - done), src_pos + done)
        if not chunk:
            raise GraftkitError(f"{src or 'an input file'}: the file is {os.fstat(src_fd).st_size:,} bytes now, a tensor "
                                f"needs bytes up to {src_pos + nbytes:,}; the checkpoint changed while it was read",
                                "rerun when it is complete")
        done += write_all(dst_fd, chunk, dst_pos + done)


def _write_shard(
    path: Path, specs: Sequence[OutSpec], on_tensor: Callable[[OutSpec], None], workers: int = 2
) -> None:
    """Write one safetensors file: header first, then every tensor at its known offset, two at a time.

    Offsets follow from the header, so tensors are written in parallel with positional I/O: kernel
    copies for byte ranges, ``pwrite`` of row chunks for computed tensors.
    """
    head = header_bytes([s.out for s in specs])
    starts, pos = [], len(head)
    for s in specs:
        starts.append(pos)
        pos += s.out.nbytes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sources: dict[Path, int] = {}
    lock = threading.Lock()

    def source_fd(file: Path) -> int:
        with lock:
            if file not in sources:
                sources[file] = os.open(file, os.O_RDONLY)
            return sources[file]

    def job(i: int) -> OutSpec:
        s, at = specs[i], starts[i]
        if isinstance(s.source, TensorEntry):
            _copy_at(source_fd(s.source.file), s.source.start, fd, at, s.source.nbytes, s.source.file)
            written = s.source.nbytes
        else:
            written = 0
            for chunk in s.source():
                if code_of(chunk.dtype) != s.code:
                    raise AssertionError(f"{s.name}: chunk dtype {chunk.dtype} != {s.dtype}")
                flat = chunk.detach().contiguous().reshape(-1)
                if flat.numel():
                    written += write_all(fd, tensor_bits(flat), at + written)
        if written != s.out.nbytes:
            raise AssertionError(f"{s.name}: wrote {written} bytes, expected {s.out.nbytes}")
        _start_writeback(fd, at, written)
        return s

    try:
        write_all(fd, head, 0)
        os.ftruncate(fd, pos)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for s in pool.map(job, range(len(specs))):
                on_tensor(s)
    finally:
        os.close(fd)
        for sfd in sources.values():
            os.close(sfd)


def check_output_room(dest: Path, nbytes: int, flag: str = "--out", what: str = "the output") -> None:
    """Before long work that ends in writing ``nbytes`` at folder ``dest``: a folder path (no file in the
    way), writable (a probe file is created and removed), and room for it on its disk."""
    check_folder_dest(dest, flag)
    check_writable(dest, flag)  # in the folder its temporary sibling goes to
    check_space(dest, nbytes, flag, what)


def write_checkpoint(
    dest: Path,
    specs: Sequence[OutSpec],
    *,
    provenance: dict | Callable[[], dict],
    inputs: Sequence[Path],
    aux_from: Path | None = None,
    config: dict | None = None,
    force: bool = False,
    max_shard_size: int | str = "5GB",
    on_tensor: Callable[[OutSpec], None] = lambda s: None,
    extra_files: dict[str, bytes] | None = None,
    input_files: Sequence[Path] = (),
) -> Path:
    """Write ``specs`` as a new HF folder at ``dest`` (see the module docstring); returns its path.

    ``extra_files``: more files (name → bytes) to place in the folder, e.g. a training log or state.
    ``input_files``: inputs that are single files standing alone (see :func:`check_destination`).
    ``provenance`` may be a function, called once the weights are written (a fingerprint hashed meanwhile)."""
    dest = check_destination(dest, inputs, force, input_files)
    shards = plan_shards(specs, parse_size(max_shard_size))
    # known before the first byte: refuse a disk that cannot hold it, rather than fill it and fail
    check_space(dest, output_bytes(specs, aux_from, extra_files), what="the checkpoint")
    with atomic_folder(dest) as tmp:
        for p in aux_files(aux_from):
            shutil.copy2(p, tmp / p.name)
        if config is not None:
            write_json_atomic(tmp / "config.json", config)
        if len(shards) == 1:
            _write_shard(tmp / "model.safetensors", shards[0], on_tensor)
        elif shards:
            weight_map, n = {}, len(shards)
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{n:05d}.safetensors"
                _write_shard(tmp / fname, shard, on_tensor)
                weight_map.update({s.name: fname for s in shard})
            total = sum(s.out.nbytes for s in specs)
            write_json_atomic(tmp / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
        for name, data in (extra_files or {}).items():
            if "/" in name or name.startswith("."):
                raise GraftkitError(f"extra file name {name!r} must be a plain file name")
            (tmp / name).write_bytes(data)
        write_json_atomic(tmp / PROVENANCE, provenance() if callable(provenance) else provenance)
    return dest
