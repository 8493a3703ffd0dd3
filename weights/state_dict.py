"""Pickled PyTorch weights: one training checkpoint file, or a folder of ``.bin``/``.pt`` shards, and the state dict
inside a training checkpoint renamed onto a model's names.

What ``torch.save`` writes in the wild is rarely a bare HF state dict: PyTorch Lightning keeps it under
``state_dict`` with the LightningModule's attribute as a prefix (``model.model.layers.0…``), nanoGPT under
``model`` with torch.compile's ``_orig_mod.``, DDP adds ``module.``. Both are data here:
:data:`CONTAINERS` (the keys a state dict hides under, searched at most :data:`DEPTH` levels deep) and
:data:`PREFIXES` (what wrappers put in front of every name). Which prefixes to strip is decided against
the names the file must match — the other side of the pair, or the taxonomy tables for a checkpoint read
alone — never guessed from the names themselves (HF names start with ``model.`` too).

Loading is ``torch.load(weights_only=True)`` only (graftkit's restricted unpickler: tensors, containers and torch's
own allowlisted classes; anything else is refused, naming it), memory-mapped when the file is in the zip format. The
readers here (:data:`FILE`, :data:`FOLDER`) read pickles by default; ``--no-pickle`` refuses them. A trainer's own
files beside its weights (:data:`NOT_WEIGHTS`: optimizer, scheduler and random states, arguments) are never opened.
"""

from __future__ import annotations

import itertools
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ..core.errors import GraftkitError
from .hf_folder import shards_from_index
from .reader import PROVENANCE, Checkpoint, Found, Reader, TensorMeta, _read_json
from .safetensors_file import code_of

#: Keys under which training code keeps the model's state dict (Lightning, nanoGPT, DDP wrappers, common
#: RL scripts), tried in this order.
CONTAINERS = ("state_dict", "model", "module", "model_state_dict")
#: How deep a state dict may sit under :data:`CONTAINERS` (``{"model": {"state_dict": …}}`` is depth 2).
DEPTH = 2
#: Prefixes wrappers add to every parameter name: a LightningModule's ``self.model``, DDP, torch.compile.
PREFIXES = ("model.", "module.", "_orig_mod.")
#: Most wrapper prefixes stacked on one name (``module._orig_mod.model.``).
MAX_CHAIN = 3

_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")

#: How pickled weights become safetensors, where the file is trusted.
TO_SAFETENSORS = "safetensors.torch.save_file(model.state_dict(), 'model.safetensors')"
EXPORT_FIX = f"export the model's weights once where the file is trusted: {TO_SAFETENSORS}"
#: Suffixes of a single-file PyTorch checkpoint.
SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
INDEX = "pytorch_model.bin.index.json"
#: Files a trainer writes beside the weights that hold none (random states, arguments, optimizer and scheduler
#: states, other ranks' pieces): never opened as weights.
NOT_WEIGHTS = re.compile(r"(rng_state.*|random_states.*|training_args|trainer_state|optimizer.*|optim_.*|scheduler.*|"
                         r"scaler.*|lr_scheduler.*|.*_optim_states|.*_model_states|extra_state.*|"
                         r"model_world_size_\d+_rank_\d+)\.(bin|pt|pth|pkl)\Z")


def load_pickle(path: Path):
    """``torch.load(path, weights_only=True)``, memory-mapped for zip-format files; an object
    ``weights_only`` refuses is one error naming it, never a traceback and never an unsafe load."""
    import torch

    mmap = zipfile.is_zipfile(path)  # mmap needs the zip format; legacy pickles are read whole
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, … for an unsafe or broken pickle
        refused = _refused_globals(path, exc)
        if refused:
            raise GraftkitError(
                f"{path}: holds objects torch.load(weights_only=True) refuses to unpickle: {', '.join(refused)}",
                EXPORT_FIX,
            ) from None
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise GraftkitError(f"{path}: cannot load with torch.load(weights_only=True) ({first})",
                            "check that the file is a complete torch.save file") from None


def _refused_globals(path: Path, exc: Exception) -> list[str]:
    """The classes/functions in the pickle that the weights-only unpickler refuses (without loading any)."""
    import torch

    names: list[str] = []
    if zipfile.is_zipfile(path):
        try:
            names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # an older torch or a damaged archive: the error message still names one
            names = []
    return names or _UNSAFE_GLOBAL.findall(str(exc))[:1]


def _is_state_dict(obj) -> bool:
    import torch

    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def find_state_dict(obj, path: Path) -> tuple[Mapping, tuple[str, ...]]:
    """The state dict of tensors in a loaded checkpoint and the container keys it sat under
    (``()`` for a bare state dict)."""
    if _is_state_dict(obj):
        return obj, ()
    level = [((), obj)]
    for _ in range(DEPTH):
        level = [(where + (k,), o[k]) for where, o in level if isinstance(o, Mapping)
                 for k in CONTAINERS if k in o]
        for where, o in level:
            if _is_state_dict(o):
                return o, where
    keys = ", ".join(map(repr, list(obj)[:8])) if isinstance(obj, Mapping) else type(obj).__name__
    raise GraftkitError(
        f"{path}: not a state dict of tensors, nor holds one under {', '.join(map(repr, CONTAINERS))} "
        f"(top level: {keys})",
        "save model.state_dict() instead",
    )


@dataclass(frozen=True)
class Renaming:
    """How a file's tensor names map onto the names they must match."""

    chain: str  # the prefixes stripped, e.g. "module._orig_mod." ("" for none)
    names: dict[str, str]  # matched: name in the file -> name on the other side
    unmatched: tuple[str, ...]  # names in the file that match nothing (after stripping)


def _chains(names: list[str]) -> list[str]:
    """Every stack of :data:`PREFIXES` (shortest first) that at least one name starts with."""
    found = [""]
    for n in range(1, MAX_CHAIN + 1):
        found += ["".join(c) for c in itertools.product(PREFIXES, repeat=n)
                  if any(x.startswith("".join(c)) for x in names)]
    return found


def rename(names: list[str], known: Callable[[str], bool]) -> Renaming:
    """Strip the prefix stack that makes the most of ``names`` ``known`` (the fewest prefixes on a tie).
    A name that does not carry the stack is matched as it is."""

    def strip(n: str, chain: str) -> str:
        return n[len(chain):] if n.startswith(chain) else n

    best = max(_chains(names), key=lambda c: (sum(known(strip(n, c)) for n in names), -len(c)))
    matched = {n: strip(n, best) for n in names if known(strip(n, best))}
    return Renaming(best, matched, tuple(n for n in names if n not in matched))


# ------------------------------------------------------------------------------------------ the readers


def _recognise_file(path: Path) -> Found | None:
    return Found(path, "a single-file PyTorch checkpoint") if path.is_file() and path.suffix in SUFFIXES else None


def _open_file(found: Found, path: Path) -> Checkpoint:
    return _open_pickles(path, [path], None)


def _folder_files(path: Path) -> list[Path]:
    """The pickled weight files of folder ``path`` that no index lists (never a trainer's own: :data:`NOT_WEIGHTS`)."""
    return sorted(p for ext in ("*.bin", "*.pt", "*.pth") for p in path.glob(ext) if not NOT_WEIGHTS.match(p.name))


def _recognise_folder(path: Path) -> Found | None:
    if not path.is_dir():
        return None
    if (path / INDEX).is_file():
        return Found(path, f"PyTorch weights listed by {INDEX}")
    files = _folder_files(path)
    if not files:
        return None
    shown = ", ".join(p.name for p in files[:3]) + (" …" if len(files) > 3 else "")
    return Found(path, f"PyTorch weights files ({shown})")


def _open_folder(found: Found, path: Path) -> Checkpoint:
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    files = shards_from_index(path, INDEX) if (path / INDEX).is_file() else _folder_files(path)
    return _open_pickles(path, files, config)


def _open_pickles(path: Path, files: list[Path], config: dict | None) -> Checkpoint:
    """The state dicts of ``files`` (each loaded whole, :func:`load_pickle`) as one checkpoint."""
    tensors: dict = {}
    notes = []
    for f in files:
        sd, where = find_state_dict(load_pickle(f), f)
        if where:
            notes.append(f"{f.name}: state dict under {'/'.join(map(repr, where))}")
        tensors.update(sd)
    metas = {}
    for n, t in tensors.items():
        try:
            metas[n] = TensorMeta(n, code_of(t.dtype), tuple(t.shape))
        except KeyError:
            raise GraftkitError(f"{path}: tensor {n} has unsupported dtype {t.dtype}") from None
    prov_path = (path if path.is_dir() else path.parent) / PROVENANCE
    prov = _read_json(prov_path) if path.is_dir() and prov_path.is_file() else None
    return Checkpoint(path=path, kind="pickle", metas=metas, reader=tensors.__getitem__, config=config, provenance=prov,
                      weight_files=tuple(files), notes=tuple(notes), stored="a pickled state dict")


def _recognise_trainer_file(path: Path) -> Found | None:
    return Found(path, f"a trainer's {path.stem} file") if path.is_file() and NOT_WEIGHTS.match(path.name) else None


def _refuse_trainer_file(found: Found, path: Path) -> Checkpoint:
    raise GraftkitError(f"{path}: {found.name}, which holds no model weights",
                        "pass the folder or file that holds the model's weights")


#: One ``.ckpt``/``.pt``/``.pth``/``.bin`` training checkpoint (Lightning, nanoGPT, DDP, ``torch.save(state_dict)``).
FILE = Reader("pickle", _recognise_file, _open_file, pickled=True, convert=TO_SAFETENSORS)
#: A folder of pickled weights: ``pytorch_model.bin`` (or the shards its index lists), or other ``.bin``/``.pt``/``.pth``.
FOLDER = Reader("pickle", _recognise_folder, _open_folder, pickled=True, convert=TO_SAFETENSORS)
#: A trainer's own file that holds no weights (``optimizer.pt``, ``rng_state.pth``, ``training_args.bin``): refused.
TRAINER_FILE = Reader("trainer-state", _recognise_trainer_file, _refuse_trainer_file, refuses=True)

__all__ = ["CONTAINERS", "FILE", "FOLDER", "NOT_WEIGHTS", "PREFIXES", "Renaming", "SUFFIXES", "TRAINER_FILE",
           "find_state_dict", "load_pickle", "rename"]
