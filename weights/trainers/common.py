"""What the layout readers share: loading a trainer's pickle with only its format's classes, memory-mapped files mapped
anew as they are read, the config.json found near a layout, and the refusal of a layout that holds no model tensors."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Generic, TypeVar

from ...core.errors import GraftkitError
from ..reader import Checkpoint, Found, _read_json

#: torch's ``safe_globals`` is process-wide, not per thread: one load at a time, so that another thread's context
#: (another reader's, or another layout's) never ends in the middle of this one.
_LOAD_LOCK = threading.Lock()
#: Bytes read from memory-mapped files before they are mapped anew: the pages a read touched stay in the process's
#: resident set while a file is mapped (clean file pages, but counted), so the maps are renewed (their pickles parsed
#: again: milliseconds) after every this many bytes.
MAPPED_BUDGET = 1 << 30


def dtype_words(codes) -> str:
    """Safetensors dtype codes as a source names them: ``{"F32"}`` → ``"fp32"``, ``{"BF16", "F32"}`` → ``"bf16/fp32"``."""
    return "/".join(sorted({c.lower().replace("f32", "fp32") for c in codes}))


def load_error_cause(exc: Exception) -> str:
    """The line of a failed ``torch.load`` that says why (weights_only's "WeightsUnpickler error: Unsupported global:
    …", not its boilerplate first line)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "WeightsUnpickler error" in ln), lines[0] if lines else type(exc).__name__)
    return why[:300]


def load_mapped(file: Path, allowed: list, classes: str, fix: str, quiet: str | None = None):
    """``torch.load(file, weights_only=True, mmap=True)`` on the CPU with ``allowed`` globals admitted (``classes``
    names them in the error, ``fix`` is its advice); ``quiet``: a logger silenced meanwhile."""
    import torch

    with _LOAD_LOCK:
        log = logging.getLogger(quiet) if quiet else None
        level = log.level if log else None
        if log:
            log.setLevel(logging.ERROR)
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, … for a refused global or a broken file
            raise GraftkitError(f"{file}: cannot load with torch.load(weights_only=True) and {classes} "
                                f"({load_error_cause(exc)})", fix) from None
        finally:
            if log:
                log.setLevel(level)


S = TypeVar("S")


class Remapped(Generic[S]):
    """What ``open_`` builds from memory-mapped files (``state``), built anew after every :data:`MAPPED_BUDGET` bytes
    read through :meth:`read`; a reader still holding the old state keeps its maps until it is done."""

    def __init__(self, open_: Callable[[], S], state: S | None = None):
        self._open, self.state, self._read = open_, (open_() if state is None else state), 0
        self._lock = threading.Lock()

    def read(self, take: Callable[[S], object]):
        """``take(state)`` (a tensor), counted against the budget."""
        t = take(self.state)
        with self._lock:
            self._read += t.numel() * t.element_size()
            renew = self._read > MAPPED_BUDGET
            if renew:
                self._read = 0
        if renew:
            self.state = self._open()
        return t


def config_near(folder: Path, levels: int = 3) -> tuple[dict | None, Path | None]:
    """The config.json of ``folder`` or of its nearest parent (a Trainer's ``checkpoint-N/`` above a DCP model folder,
    a run's folder above ``step-N/``), at most ``levels`` up."""
    folder = Path(folder).resolve()
    for f in [folder, *folder.parents][: levels + 1]:
        if (f / "config.json").is_file():
            cfg = _read_json(f / "config.json")
            if "model_type" in cfg or "architectures" in cfg:
                return cfg, f
    return None, None


def with_tensors(ck: Checkpoint, found: Found, convert: str) -> Checkpoint:
    """``ck``, unless it holds no model tensors (a folder of a trainer's optimizer states alone): then one error."""
    if not ck.metas:
        raise GraftkitError(f"{ck.path}: {found.name} holds no model tensors", f"convert it: {convert}")
    return ck
