"""A base checkpoint and an RL checkpoint, opened and checked as a pair.

Grafting and delta anatomy need the two to hold the same tensors with the same shapes and dtypes. Each
mismatch is one error that names the tensors and both shapes or dtypes. ``--base`` defaults to the SFT
parent recorded in the RL checkpoint's ``graftkit.json`` (``base_model.path``) or, for a LoRA adapter,
to its ``base_model_name_or_path`` when that is a local folder.

Either side may be a single-file PyTorch checkpoint (``--allow-pickle``): :func:`open_pair` maps its
names onto the other side's (:func:`.checkpoint.match_names`) and records what it mapped in
:attr:`Checkpoint.notes`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import GraftkitError
from .checkpoint import PROVENANCE, Checkpoint, match_names, open_checkpoint
from .fingerprint import fingerprint
from .lora import apply_lora, is_lora_folder
from .safetensors_file import dtype_name
from .taxonomy import Taxonomy


def recorded_base(rl_path: Path) -> Path | None:
    """The base model an RL checkpoint names: graftkit.json's base_model, or a LoRA's base folder."""
    rl_path = Path(rl_path)
    prov = rl_path / PROVENANCE
    if prov.is_file():
        base = (json.loads(prov.read_text()).get("base_model") or {}).get("path")
        if base:
            return Path(base)
    cfg = rl_path / "adapter_config.json"
    if cfg.is_file():
        base = json.loads(cfg.read_text()).get("base_model_name_or_path")
        if base and Path(base).is_dir():
            return Path(base)
    return None


def resolve_base(rl_path: Path, base: Path | None) -> Path:
    if base is not None:
        return Path(base)
    found = recorded_base(rl_path)
    if found is None:
        raise GraftkitError(
            f"{rl_path} records no SFT parent (no graftkit.json with base_model)", "pass --base SFT_FOLDER"
        )
    if not found.exists():
        raise GraftkitError(
            f"{rl_path} records its SFT parent as {found}, which no longer exists", "pass --base SFT_FOLDER"
        )
    return found


def open_rl(path: Path, base: Checkpoint, allow_pickle: bool = False) -> Checkpoint:
    """Open the RL side: a full checkpoint, or a LoRA adapter applied over ``base``."""
    path = Path(path)
    if is_lora_folder(path):
        return apply_lora(base, path)
    return open_checkpoint(path, allow_pickle=allow_pickle)


def open_one(path: Path, *, allow_pickle: bool = False, unknown: str = "error",
             config: Path | None = None) -> Checkpoint:
    """Open a checkpoint read alone; a single pickled file is named after the taxonomy tables."""
    return match_names(open_checkpoint(path, allow_pickle=allow_pickle), unknown=unknown, config_dir=config)


def open_pair(base_path: Path, rl_paths, *, allow_pickle: bool = False, unknown: str = "error",
              config: Path | None = None) -> tuple[Checkpoint, list[Checkpoint]]:
    """The base and every RL side, opened; a single pickled file among them is renamed onto the names of
    the first side that is no such file (or, when all are, onto the taxonomy's) and takes its config."""
    base = open_checkpoint(base_path, allow_pickle=allow_pickle)
    full = [None if is_lora_folder(Path(p)) else open_checkpoint(p, allow_pickle=allow_pickle) for p in rl_paths]
    ref = next((c for c in (base, *full) if c is not None and not c.loose), None)
    base = match_names(base, ref, unknown=unknown, config_dir=config)
    ref = ref or base  # all sides single files: the RL sides take the base's (taxonomy-matched) names
    rls = [apply_lora(base, Path(p)) if c is None else match_names(c, ref, unknown=unknown, config_dir=config)
           for p, c in zip(rl_paths, full)]
    return base, rls


def notes(*ckpts: Checkpoint) -> list[str]:
    """What reading the checkpoints mapped (containers, prefixes, config sources), one line each."""
    return [n for c in ckpts for n in c.notes]


def check_pair(base: Checkpoint, rl: Checkpoint, taxonomy: Taxonomy) -> None:
    """Raise a one-line error unless both hold the same tensors with equal shapes and dtypes."""
    only_base = [n for n in base.metas if n not in rl.metas]
    only_rl = [n for n in rl.metas if n not in base.metas]
    if only_base or only_rl:
        parts = []
        if only_base:
            parts.append(f"only in base: {', '.join(only_base[:5])}" + (" …" if len(only_base) > 5 else ""))
        if only_rl:
            parts.append(f"only in RL: {', '.join(only_rl[:5])}" + (" …" if len(only_rl) > 5 else ""))
        raise GraftkitError(
            f"base {base.path} and RL {rl.path} hold different tensors ({'; '.join(parts)})",
            "pass two checkpoints of the same architecture",
        )
    for n, mb in base.metas.items():
        mr = rl.metas[n]
        if mb.shape != mr.shape:
            if taxonomy.roles[n].group in ("embed", "lm_head") and mb.shape[1:] == mr.shape[1:]:
                raise GraftkitError(
                    f"vocabulary size differs: base {n} {list(mb.shape)} vs RL {list(mr.shape)}",
                    "graft only between checkpoints that share a tokenizer (resize one model's embeddings first)",
                )
            raise GraftkitError(
                f"tensor {n} has shape {list(mb.shape)} in base but {list(mr.shape)} in RL",
                "pass two checkpoints of the same architecture and size",
            )
        if mb.code != mr.code:
            raise GraftkitError(
                f"tensor {n} is {dtype_name(mb.code)} in base but {dtype_name(mr.code)} in RL",
                "save both checkpoints in the same dtype",
            )


def describe(ckpt: Checkpoint) -> dict:
    """Path, kind and content fingerprint of a checkpoint, for provenance records."""
    files = list(ckpt.weight_files)
    cfg = ckpt.folder / "config.json"
    if ckpt.path.is_dir() and cfg.is_file():
        files.append(cfg)
    desc = {"path": str(Path(ckpt.path).resolve()), "kind": ckpt.kind, "sha256": fingerprint(files)}
    return {**desc, "notes": list(ckpt.notes)} if ckpt.notes else desc
