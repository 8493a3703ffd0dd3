"""The checkpoint-reading options every command shares, and ``graftkit inspect``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..core.config import CommandConfig, check_choice, opt
from .lora import is_lora_folder
from .resolve import checkpoint_of, open_model
from .runs import trainer_run
from .taxonomy import DECODER, GROUPS, band_rule

UNKNOWN = ("error", "keep-base")


@dataclass(frozen=True, kw_only=True)
class ReadOptions(CommandConfig):
    """How checkpoints are read (fields shared by every command that opens one)."""

    allow_pickle: bool = False
    """Accepted and changes nothing: pickled weights (.bin/.pt folders, one .ckpt/.pt/.pth/.bin file, DCP, DeepSpeed
    and verl checkpoints) are read by default, through graftkit's restricted unpickler (weights_only, allowlisted
    classes)."""
    no_pickle: bool = False
    """Read safetensors only: refuse pickled weights (.bin/.pt folders, one .ckpt/.pt/.pth/.bin file, DCP, DeepSpeed
    and verl checkpoints), naming the file."""
    unknown: str = "error"
    """Tensors no taxonomy table claims (or, in a single-file checkpoint, that match nothing on the other
    side): error | keep-base."""
    config: Path | None = None
    """HF folder whose config.json (and tokenizer) a single-file checkpoint uses (default: the other side's
    folder; a policy run from one file needs it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.unknown, UNKNOWN, "--unknown")


@dataclass(frozen=True, kw_only=True)
class InspectConfig(ReadOptions):
    """``graftkit inspect``: what every tensor of a checkpoint is."""

    command = "inspect"
    model: Path = opt(argument=True)
    """HF folder, .safetensors file, PEFT LoRA adapter (merged over --base) or a trainer's output_dir (its last
    checkpoint)."""
    base: Path | None = opt(None, flags=("--base",))
    """Base model folder of a LoRA adapter (default: the parent its graftkit.json records, else the adapter's
    base_model_name_or_path when local)."""


def run_inspect(cfg: InspectConfig) -> dict:
    """Groups, layers, bytes and tied embeddings of ``cfg.model``, and its taxonomy table (``family``) with
    how it was found (``matched_by``: model_type, names or generic); nothing is written."""
    model = checkpoint_of(cfg.model, "MODEL")
    run = trainer_run(Path(cfg.model))
    ck = open_model(model, cfg.base, no_pickle=cfg.no_pickle, unknown=cfg.unknown, config=cfg.config)
    if is_lora_folder(model):
        ck = dataclasses.replace(ck, notes=(*ck.notes, f"LoRA adapter {model} merged over {ck.provenance['lora']['base']}: "
                                                       f"{len(ck.provenance['lora']['targets'])} tensors adapted"))
    tax = ck.taxonomy(cfg.unknown)
    rows = {}
    for g in [*GROUPS, "unknown"]:
        names = [n for n, r in tax.roles.items() if r.group == g]
        if names:
            rows[g] = {"tensors": len(names), "params": sum(ck.metas[n].numel for n in names),
                       "bytes": sum(ck.metas[n].nbytes for n in names)}
    n_dec = tax.n_layers.get(DECODER, 0)
    return {"path": str(ck.path), "kind": ck.kind, "family": tax.family, "matched_by": tax.matched_by,
            "model_type": ck.model_type, "precision": ck.precision, "tied_embeddings": tax.tied, "layers": dict(tax.n_layers), "groups": rows,
            "band_rule": band_rule(n_dec) if n_dec else None, "unknown": list(tax.unknown),
            "checkpoints": {str(s): str(p) for s, p in run.checkpoints} if run else None,
            "notes": list(ck.notes) + ([f"training run {cfg.model}: checkpoints at steps "
                                        f"{', '.join(map(str, run.steps))}; this is the last (delta --all-checkpoints "
                                        "takes every one)"] if run else [])}
