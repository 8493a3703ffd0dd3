"""Megatron-Core distributed checkpoints (``torch_dist``), recognised and refused: one error naming the converter.

Megatron-Core writes ``metadata.json`` (``sharded_backend``) beside a DCP-like folder, or, in its legacy format,
``mp_rank_00/model_optim_rng.pt``. graftkit reads neither; verl and the frameworks that train with Megatron export
them as an HF folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.errors import GraftkitError
from ..reader import Checkpoint, Found, Reader

CONVERT = ("python -m verl.model_merger merge --backend megatron --local_dir ACTOR_DIR --target_dir HF_DIR "
           "(verl), or your framework's Megatron-to-HF exporter")


def is_megatron(folder: Path) -> bool:
    """``folder`` holds Megatron-Core's ``metadata.json`` (a ``torch_dist`` checkpoint, which DCP's reader must not
    take for its own)."""
    md = Path(folder) / "metadata.json"
    if not md.is_file():
        return False
    try:
        return "sharded_backend" in json.loads(md.read_text())
    except (OSError, ValueError):
        return False


def recognise(path: Path) -> Found | None:
    if path.is_dir() and (is_megatron(path) or (path / "mp_rank_00" / "model_optim_rng.pt").is_file()):
        return Found(path, f"a Megatron-Core distributed checkpoint ({path.name}/)")
    return None


def _refuse(found: Found, path: Path) -> Checkpoint:
    raise GraftkitError(f"{path}: {found.name}, which graftkit does not read", f"convert it: {CONVERT}")


READER = Reader("megatron", recognise, _refuse, layout=True, refuses=True, convert=CONVERT)

__all__ = ["CONVERT", "READER", "is_megatron", "recognise"]
