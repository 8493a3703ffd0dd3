"""Checkpoints in: what a path on disk is, opened by the one reader that recognises it.

:func:`open_checkpoint` asks the readers of :data:`READERS` in order whether they recognise a path, from what is on
disk alone (file names, an index, a trainer's ``latest`` file), and the first that does opens it (:mod:`.reader`:
the protocol every reader implements, and the :class:`Checkpoint` it opens). What a researcher has:

- an HF folder (``config.json`` with a single ``model.safetensors`` or shards listed by
  ``model.safetensors.index.json``) or a single ``.safetensors`` file (:mod:`.hf_folder`);
- pickled weights (:mod:`.state_dict`): a folder of ``.bin``/``.pt`` shards, or one training checkpoint file
  (``.ckpt``/``.pt``/``.pth``/``.bin`` of Lightning, nanoGPT, DDP or ``torch.save(model.state_dict())``), whose state
  dict and wrapper prefixes :func:`match_names` maps onto the other side's names;
- a distributed trainer's own layout (:mod:`.trainers`: torch DCP, DeepSpeed ZeRO, verl FSDP actors), at the
  trainer's own precision;
- a PEFT LoRA adapter folder, refused here: it is the ``rl`` side of a pair, read over its base
  (:func:`.lora.apply_lora`).

Pickles are read by default, always through graftkit's restricted unpickler (``torch.load(weights_only=True)`` with
only each format's own classes admitted, :data:`.reader.RESTRICTED`): a pickle that holds anything else is refused,
naming it, and the precision line of every result says how the values were read. ``no_pickle`` (``--no-pickle``)
refuses every reader that loads pickles: safetensors only.

Nothing here loads a whole model: a safetensors tensor is read from its file when asked for.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Iterator

from ..core.errors import GraftkitError
from ..core.files import require
from . import hf_folder, lora, state_dict
from .hf_folder import INDEX
from .reader import PROVENANCE, RESTRICTED, Checkpoint, Found, Reader, TensorMeta, _read_json, tensor_bits
from .state_dict import PREFIXES, rename
from .taxonomy import tables
from .trainers import dcp, deepspeed, megatron, verl

#: What a model path may be, for the error that names a missing one.
A_MODEL = "an HF folder, a .safetensors file, a LoRA adapter or a trainer's output_dir"


def layout_of(path: Path) -> Found | None:
    """The trainer's layout (:mod:`.trainers`) folder ``path`` holds, itself or at the tag its ``latest`` file names,
    else None."""
    return next((f for r in READERS if r.layout and (f := r.recognise(Path(path))) is not None), None)


def _layout_piece(path: Path) -> Found | None:
    """A file that is one piece of a trainer's layout (a ``.distcp`` file, one rank's states): not a model alone."""
    if not path.is_file():
        return None
    whole = layout_of(path.parent)
    if whole is not None and whole.where == path.parent:
        return Found(path, whole.name)
    if path.suffix == ".distcp" or path.name == dcp.METADATA:
        return Found(path, "a torch.distributed.checkpoint folder")
    return None


def _refuse_piece(found: Found, path: Path) -> Checkpoint:
    raise GraftkitError(f"{path} is one file of {found.name}, not a whole model", f"pass the folder {path.parent}")


#: A file of a trainer's layout, refused: its folder is the checkpoint.
LAYOUT_PIECE = Reader("layout-piece", _layout_piece, _refuse_piece, refuses=True)

#: Every kind of checkpoint graftkit recognises, in the order it looks for them: the first reader that recognises a
#: path opens it. A new kind is one module with a :class:`~.reader.Reader`, listed here.
READERS: tuple[Reader, ...] = (
    LAYOUT_PIECE,                # a .distcp file, one rank's states: refused, naming the folder to pass
    state_dict.TRAINER_FILE,     # optimizer.pt, rng_state.pth, training_args.bin: refused, no weights
    hf_folder.FILE,              # one .safetensors file
    state_dict.FILE,             # one .ckpt/.pt/.pth/.bin training checkpoint
    lora.ADAPTER,                # a PEFT adapter folder alone: refused (it is read over its base)
    hf_folder.FOLDER,            # model.safetensors, shards listed by their index, other *.safetensors
    megatron.READER,             # Megatron-Core torch_dist: refused, naming its converter
    verl.READER,                 # global_step_N/actor/: the ranks' fp32 FSDP shards
    deepspeed.READER,            # global_stepN/: ZeRO 0-3, the fp32 masters from the optimizer partitions
    dcp.READER,                  # torch.distributed.checkpoint folders
    state_dict.FOLDER,           # pytorch_model.bin (and shards listed by its index), other .bin/.pt/.pth files
)


def _recognised(path: Path) -> Iterator[tuple[Reader, Found]]:
    for r in READERS:
        found = r.recognise(path)
        if found is not None:
            yield r, found


def recognise(path: str | os.PathLike) -> tuple[Reader, Found] | None:
    """The reader that opens ``path`` and what it recognised there, else None."""
    return next(_recognised(Path(path)), None)


def open_checkpoint(path: str | os.PathLike, *, no_pickle: bool = False, allow_pickle: bool = False) -> Checkpoint:
    """Open ``path`` with the first reader of :data:`READERS` that recognises it; ``no_pickle`` refuses the readers
    that load pickles. (``allow_pickle`` is accepted and changes nothing: pickles are read by default, through
    graftkit's restricted unpickler.)

    Where a folder holds the weights twice — bf16/fp16 HF weights and, beside them, a trainer's own layout (a
    Trainer's ``checkpoint-N/`` with DeepSpeed's states) — the layout's fp32 weights are read, and a note says so;
    with ``no_pickle`` the HF weights are, said to be below the trained precision."""
    path = require(Path(path).expanduser(), expected=A_MODEL)
    hits = _recognised(path)
    first = next(hits, None)
    if first is None:
        raise _unrecognised(path)
    reader, found = first
    ck = _open(reader, found, path, no_pickle)
    lower = sorted({m.code for m in ck.metas.values() if m.code in ("BF16", "F16")})
    if reader.layout or not lower:
        return ck
    beside = next(((r, f) for r, f in hits if r.layout and not r.refuses), None)
    if beside is None:
        return ck  # the trainer's weights, as saved: nothing more precise lies beside them
    words = "/".join(lower).lower()
    if no_pickle:
        return dataclasses.replace(ck, below_trained=(
            f"{words} weights of the HF file; {beside[1].name} beside it may hold the trainer's fp32 weights: "
            "drop --no-pickle to read them"))
    masters = _open(*beside, path, no_pickle)
    if not any(m.code == "F32" for m in masters.metas.values()):
        return ck
    return dataclasses.replace(masters, notes=(*masters.notes, f"{path.name}: read from {beside[1].where.name}/, not "
                                                               f"its {words} HF weights file (rounded copies)"))


def _open(reader: Reader, found: Found, path: Path, no_pickle: bool) -> Checkpoint:
    if reader.pickled and no_pickle:
        raise GraftkitError(f"{found.where}: {found.name}, stored as pickles: refused by --no-pickle (safetensors only)",
                            f"drop --no-pickle to read it through {RESTRICTED}, or convert it where it is trusted: "
                            f"{reader.convert}")
    ck = reader.open(found, path)
    return dataclasses.replace(ck, unpickled=True) if reader.pickled else ck


def _unrecognised(path: Path) -> GraftkitError:
    if path.is_file():
        return GraftkitError(f"{path}: not a checkpoint (expected a folder, a .safetensors file or a "
                             f"{'/'.join(state_dict.SUFFIXES)} training checkpoint)", "point at the model folder")
    others = sorted(p.name for ext in ("*.bin", "*.pt", "*.pth", "*.pkl") for p in path.glob(ext))
    seen = f" (only a trainer's own files: {', '.join(others[:4])}{' …' if len(others) > 4 else ''})" if others else ""
    return GraftkitError(
        f"{path}: no weights found{seen} (expected model.safetensors, {INDEX}, *.safetensors, pytorch_model.bin, a DCP "
        "folder, a DeepSpeed global_stepN/ or a verl global_step_N/actor/)",
        "point at the folder that holds the model's weights",
    )


def _alias_key(t) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def match_names(ck: Checkpoint, reference: Checkpoint | None = None, *, unknown: str = "error",
                config_dir: Path | None = None) -> Checkpoint:
    """A single-file checkpoint (:attr:`Checkpoint.loose`) under the names of ``reference`` (the other
    side of a pair), or of the taxonomy tables when it is read alone: the wrapper prefixes that make its
    names match are stripped (:func:`.state_dict.rename`), and its config comes from ``config_dir``, else
    from the reference's folder. A tensor that matches nothing is an error, or with ``unknown="keep-base"``
    left out of a pair (the base's own tensor is kept) and kept as unknown when read alone. Any other
    checkpoint is returned as it is."""
    if not ck.loose:
        return ck
    if config_dir is not None:
        config_dir = Path(config_dir).expanduser()
        if not (config_dir / "config.json").is_file():
            raise GraftkitError(f"--config {config_dir}: no config.json there", "point at the HF model folder")
        config, config_from = _read_json(config_dir / "config.json"), config_dir
    elif ck.config is not None:  # a trainer layout's own (its folder's, or its huggingface/ copy)
        config, config_from = ck.config, ck.config_from
    elif reference is not None and reference.config is not None:
        config, config_from = reference.config, reference.config_from or reference.folder
    else:
        config, config_from = None, None
    if reference is not None:
        known, against = (lambda n: n in reference.metas), str(reference.path)
    else:
        model_type = (config or {}).get("model_type")
        table = next((t for t in tables() if model_type in t.model_types), None) if model_type else None
        known = (lambda n: bool(table.matches(n))) if table else (lambda n: any(t.matches(n) for t in tables()))
        against = (f"{model_type}'s tensor names (taxonomy table {table.family})" if table
                   else "the taxonomy tables")
    r = rename(ck.names, known)
    stripped = f"prefix {r.chain!r}" if r.chain else "no prefix"
    head = ck.notes[0] if ck.notes else f"{ck.path.name}: a bare state dict"
    notes = [f"{head}, {stripped} stripped ({len(r.names)} tensors matched to {against})"]
    dropped = []
    if r.unmatched and reference is not None:
        # a tied head saved twice (state_dict() lists both names of one tensor) is the same tensor
        dropped = _tied_copies(ck, list(r.names), list(r.unmatched), config)
        if dropped:
            notes.append(f"{ck.path.name}: {', '.join(dropped)} left out (the same tensor as a matched one: tied)")
    unmatched = [n for n in r.unmatched if n not in dropped]
    if unmatched and (unknown == "error" or not r.names):
        shown = ", ".join(unmatched[:5]) + (f", … ({len(unmatched) - 5} more)" if len(unmatched) > 5 else "")
        example = f" (expected names like {next(iter(reference.metas))})" if reference is not None else ""
        raise GraftkitError(
            f"{ck.path}: {len(unmatched)} of {len(ck.metas)} tensors match no tensor of {against} after "
            f"stripping {stripped} (known prefixes: {', '.join(PREFIXES)}): {shown}{example}",
            "pass a checkpoint of the same architecture"
            + (", or --unknown keep-base to keep those from the base" if r.names else ""),
        )
    names = dict(r.names)
    if unmatched and reference is None:
        names.update({n: n for n in unmatched})  # kept as unknown tensors: the taxonomy records them
    elif unmatched:
        notes.append(f"{ck.path.name}: {len(unmatched)} tensor(s) match nothing and are ignored "
                     f"(--unknown keep-base): {', '.join(unmatched[:5])}")
    inverse = {}
    for old, new in names.items():
        if new in inverse:
            raise GraftkitError(f"{ck.path}: tensors {inverse[new]} and {old} both map to {new}",
                                "save one state dict without wrapper duplicates")
        inverse[new] = old
    if config_from is not None:
        notes[0] += f", config from {config_from}"
    metas = {new: TensorMeta(new, ck.metas[old].code, ck.metas[old].shape) for new, old in inverse.items()}
    named = dataclasses.replace(ck, metas=metas, reader=lambda n: ck.read(inverse[n]), raw={}, arrays=None, deltas=None,
                                config=config, notes=tuple(notes), config_from=config_from, foreign_names=False)
    # read alone, a trainer's state dict lists a tied head under both names: keep the embedding's
    return drop_tied_head(named) if reference is None and ck.foreign_names else named


_HEAD = re.compile(r"(^|\.)(lm_head|output|embed_out)\.weight$")


def drop_tied_head(ck: Checkpoint, other: Checkpoint | None = None) -> Checkpoint:
    """``ck`` without the output head it stores beside the embedding it is tied to (its config ties them and the
    values are equal, as a Trainer's gathered 16-bit ``model.safetensors`` stores them) when ``other`` has no such
    tensor (or ``ck`` is read alone); ``ck`` itself otherwise."""
    heads = [n for n in ck.metas if _HEAD.search(n) and (other is None or n not in other.metas)]
    if not heads or not _tied(ck.config):
        return ck
    dropped = _tied_copies(ck, [n for n in ck.metas if n not in heads], heads, ck.config)
    if not dropped:
        return ck
    keep = {n: m for n, m in ck.metas.items() if n not in dropped}
    return dataclasses.replace(ck, metas=keep, raw={n: e for n, e in ck.raw.items() if n in keep}, notes=(
        *ck.notes, f"{ck.path.name}: {', '.join(dropped)} left out (the same values as the tied embedding)"))


def _tied(config: dict | None) -> bool:
    cfg = config or {}
    return any(bool(c.get("tie_word_embeddings")) for c in (cfg, cfg.get("text_config") or {}))


def _tied_copies(ck: Checkpoint, kept: list[str], candidates: list[str], config: dict | None) -> list[str]:
    """The ``candidates`` that are a second name of a ``kept`` tensor: the same storage (a pickled state dict), or,
    in a model whose config ties the head to the embedding, the same shape and bit-equal values (a trainer layout,
    whose reads are fresh tensors)."""
    import torch

    storage = {_alias_key(ck.read(n)): n for n in kept} if ck.kind == "pickle" else {}
    out = []
    for n in candidates:
        if storage and _alias_key(ck.read(n)) in storage:
            out.append(n)
            continue
        if not _tied(config):
            continue
        m = ck.metas[n]
        twins = [k for k in kept if ck.metas[k].shape == m.shape and ck.metas[k].code == m.code]
        if twins:
            t = ck.read(n)
            if any(torch.equal(t, ck.read(k)) for k in twins):
                out.append(n)
    return out


__all__ = ["A_MODEL", "INDEX", "LAYOUT_PIECE", "PROVENANCE", "READERS", "Checkpoint", "TensorMeta", "drop_tied_head",
           "layout_of", "match_names", "open_checkpoint", "recognise", "tensor_bits"]
