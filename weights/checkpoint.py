"""Checkpoints in, one tensor at a time.

:func:`open_checkpoint` reads what a researcher has: an HF folder (``config.json`` with a single
``model.safetensors`` or shards listed by ``model.safetensors.index.json``), a single ``.safetensors``
file, a PEFT LoRA adapter folder (only as the ``rl`` side of a pair, over its base: see
:func:`apply_lora`), or — only with ``allow_pickle`` — pickled weights loaded with
``torch.load(weights_only=True)``: a folder of ``.bin``/``.pt`` shards, or one training checkpoint file
(``.ckpt``/``.pt``/``.pth``/``.bin`` of Lightning, nanoGPT, DDP or ``torch.save(model.state_dict())``),
whose state dict and wrapper prefixes :func:`match_names` maps onto the other side's names
(:mod:`.state_dict`). Every kind answers the same questions (:class:`Checkpoint`): which
tensors, their dtype and shape, a tensor's values, and where its raw bytes lie when they lie in a file
unchanged (so an exact copy never passes through Python).

Nothing here loads a whole model: safetensors are memory-mapped and a tensor is a view of its pages.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from ..core.errors import GraftkitError
from ..core.files import require
from .safetensors_file import ITEMSIZE, NUMPY, SafetensorsFile, TensorEntry, code_of, torch_dtype
from .state_dict import PREFIXES, find_state_dict, load_pickle, rename
from .taxonomy import Taxonomy, classify, tables

INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PROVENANCE = "graftkit.json"
#: Suffixes of a single-file PyTorch checkpoint (read only with allow_pickle).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


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


#: Where a checkpoint of each kind that states no :attr:`Checkpoint.source` reads its values from.
SOURCE_OF_KIND = {"hf-folder": "safetensors files", "safetensors-file": "a safetensors file",
                  "pickle": "a pickled state dict", "lora-merged": "base + the adapter's float32 update s·B@A"}


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A set of named tensors with its folder's config and provenance, read lazily. Built by name and never
    changed after: a variant (renamed, cast, cut, annotated) is a new one (``dataclasses.replace``)."""

    path: Path
    kind: str  # "hf-folder" | "safetensors-file" | "pickle" | "lora-merged" | "dcp" | "deepspeed" | "verl"
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
    #: the names are the trainer's (a wrapper's or a container's prefixes): :func:`match_names` maps them
    foreign_names: bool = False
    #: where the values come from, at which precision: "fp32 master weights from ZeRO-3 optimizer partitions"
    source: str | None = None
    #: set when the checkpoint holds the weights only below the precision they were trained in: why, in words
    below_trained: str | None = None

    @property
    def loose(self) -> bool:
        """Names still to be mapped by :func:`match_names` (a single pickled file, a trainer's own layout), and a
        config that may have to come from another folder."""
        return self.foreign_names or (self.kind == "pickle" and self.path.is_file())

    @property
    def names(self) -> list[str]:
        return list(self.metas)

    @property
    def precision(self) -> dict:
        """How precise the values read are, and why: ``dtype`` (the floating dtypes read, largest share of entries
        first, e.g. ``"float32"`` or ``"bfloat16+float32"``), ``source`` (where they come from, at that precision)
        and ``below_trained`` (set when the checkpoint holds the weights only below the precision they were
        trained in: why, in words)."""
        from .safetensors_file import dtype_name

        counts: dict[str, int] = {}
        for m in self.metas.values():
            if m.code.startswith(("F", "BF")):
                counts[m.code] = counts.get(m.code, 0) + m.numel
        dtype = "+".join(dtype_name(c) for c in sorted(counts, key=lambda c: -counts[c])) or "none"
        source = self.source or f"{dtype} tensors as stored ({SOURCE_OF_KIND.get(self.kind, self.kind)})"
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


def _from_safetensors(path: Path, kind: str, files: list[Path], config: dict | None) -> Checkpoint:
    opened = [SafetensorsFile(f) for f in files]
    entries: dict[str, TensorEntry] = {}
    by_name: dict[str, SafetensorsFile] = {}
    for sf in opened:
        for name, e in sf.entries.items():
            if name in entries:
                raise GraftkitError(
                    f"{path}: tensor {name} appears in both {entries[name].file.name} and {sf.path.name}",
                    "remove the stale shard",
                )
            entries[name], by_name[name] = e, sf
    metas = {n: TensorMeta(n, e.dtype, e.shape) for n, e in entries.items()}
    folder = path if path.is_dir() else path.parent
    prov = _read_json(folder / PROVENANCE) if (path.is_dir() and (folder / PROVENANCE).is_file()) else None
    return Checkpoint(path=path, kind=kind, metas=metas, reader=lambda n: by_name[n].read(n), raw=entries,
                      config=config, provenance=prov, weight_files=tuple(files), arrays=lambda n: by_name[n].array(n))


def _shards_from_index(folder: Path, index_name: str) -> list[Path]:
    index = _read_json(folder / index_name)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise GraftkitError(f"{folder / index_name}: no weight_map", "re-save the checkpoint")
    files = list(dict.fromkeys(weight_map.values()))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise GraftkitError(
            f"{folder}: shard(s) listed in {index_name} are missing: {', '.join(missing)}",
            "download or copy the missing shards",
        )
    return [folder / f for f in files]


def _check_index(index_path: Path, ckpt: Checkpoint) -> None:
    """Every tensor the index lists must lie in the shard it names: a stale or partial shard would
    otherwise drop a tensor without a word."""
    for name, fname in _read_json(index_path)["weight_map"].items():
        entry = ckpt.raw.get(name)
        if entry is None or entry.file != index_path.parent / fname:
            found = f"it is in {entry.file.name}" if entry else "no shard holds it"
            raise GraftkitError(
                f"{index_path}: tensor {name} is listed in {fname} but {found}",
                "re-download or re-save the checkpoint",
            )


#: What a model path may be, for the error that names a missing one.
A_MODEL = "an HF folder, a .safetensors file, a LoRA adapter or a trainer's output_dir"


#: Files a trainer writes beside the weights that hold none (random states, arguments, optimizer and scheduler
#: states, other ranks' pieces): never opened as weights.
NOT_WEIGHTS = re.compile(r"(rng_state.*|random_states.*|training_args|trainer_state|optimizer.*|optim_.*|scheduler.*|"
                         r"scaler.*|lr_scheduler.*|.*_optim_states|.*_model_states|extra_state.*|"
                         r"model_world_size_\d+_rank_\d+)\.(bin|pt|pth|pkl)\Z")


def _part_of_layout(path: Path) -> GraftkitError | None:
    """A file that is one piece of a trainer layout (a .distcp file, one rank's states): the error naming the folder."""
    from .trainers import recognise

    layout = recognise(path.parent)
    if path.suffix == ".distcp" or path.name == ".metadata" or (layout is not None and layout.folder == path.parent):
        what = layout.name if layout is not None else "a torch.distributed.checkpoint folder"
        return GraftkitError(f"{path} is one file of {what}, not a whole model",
                             f"pass the folder {path.parent} (with --allow-pickle)")
    if NOT_WEIGHTS.match(path.name):
        return GraftkitError(f"{path}: a trainer's {path.stem} file, which holds no model weights",
                             "pass the folder or file that holds the model's weights")
    return None


def open_checkpoint(path: str | os.PathLike, allow_pickle: bool = False) -> Checkpoint:
    """Open an HF folder, a single ``.safetensors`` file, a trainer's own layout (:mod:`.trainers`: DCP, DeepSpeed,
    verl; with ``allow_pickle``), or (``allow_pickle``) pickled weights."""
    path = require(Path(path).expanduser(), expected=A_MODEL)
    if path.is_file():
        if (err := _part_of_layout(path)) is not None:
            raise err
        if path.suffix == ".safetensors":
            return _from_safetensors(path, "safetensors-file", [path], None)
        if path.suffix in PICKLE_SUFFIXES:
            return _open_pickle(path, [path], None, allow_pickle)
        raise GraftkitError(
            f"{path}: not a checkpoint (expected a folder, a .safetensors file, or "
            f"{'/'.join(PICKLE_SUFFIXES)} with --allow-pickle)",
            "point at the model folder",
        )
    if (path / "adapter_config.json").is_file():
        raise GraftkitError(
            f"{path} is a LoRA adapter, not a full checkpoint",
            "pass it as the RL side (--from) with the full base model as --base",
        )
    from .trainers import open_layout, recognise, refuse_pickle

    layout = recognise(path)
    hf = _open_hf_folder(path)
    if hf is None:
        if layout is None:
            return _open_pickle_folder(path, allow_pickle)
        if layout.readable and not allow_pickle:
            raise refuse_pickle(layout)
        return open_layout(layout, path)  # an unreadable layout: the error naming it and its converter
    if layout is None or not layout.readable:
        return hf
    lower = sorted({m.code for m in hf.metas.values() if m.code in ("BF16", "F16")})
    if not lower:
        return hf  # the trainer's weights, as saved: nothing more precise lies beside them
    if allow_pickle:
        ck = open_layout(layout, path)
        if any(m.code == "F32" for m in ck.metas.values()):
            return dataclasses.replace(ck, notes=(*ck.notes, f"{path.name}: read from {layout.folder.name}/, not its "
                                                  f"{'/'.join(lower).lower()} HF weights file (rounded copies)"))
        return hf
    return dataclasses.replace(hf, below_trained=(
        f"{'/'.join(lower).lower()} weights of the HF file; {layout.name} beside it may hold the trainer's fp32 "
        "weights: pass --allow-pickle to read them"))


def _open_hf_folder(path: Path) -> Checkpoint | None:
    """The folder's safetensors weights (an index, model.safetensors, or other *.safetensors), else None."""
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if (path / INDEX).is_file():
        ckpt = _from_safetensors(path, "hf-folder", _shards_from_index(path, INDEX), config)
        _check_index(path / INDEX, ckpt)
        return ckpt
    if (path / "model.safetensors").is_file():
        return _from_safetensors(path, "hf-folder", [path / "model.safetensors"], config)
    singles = sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("adapter_model"))
    if singles:
        return _from_safetensors(path, "hf-folder", singles, config)
    return None


def _open_pickle_folder(path: Path, allow_pickle: bool) -> Checkpoint:
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if (path / PICKLE_INDEX).is_file():
        return _open_pickle(path, _shards_from_index(path, PICKLE_INDEX), config, allow_pickle)
    pickles = sorted(p for ext in ("*.bin", "*.pt", "*.pth") for p in path.glob(ext) if not NOT_WEIGHTS.match(p.name))
    if pickles:
        return _open_pickle(path, pickles, config, allow_pickle)
    others = sorted(p.name for ext in ("*.bin", "*.pt", "*.pth", "*.pkl") for p in path.glob(ext))
    seen = f" (only a trainer's own files: {', '.join(others[:4])}{' …' if len(others) > 4 else ''})" if others else ""
    raise GraftkitError(
        f"{path}: no weights found{seen} (expected model.safetensors, {INDEX}, *.safetensors, a DCP folder, a "
        "DeepSpeed global_stepN/ or a verl global_step_N/actor/)",
        "point at the folder that holds the model's weights",
    )


def _open_pickle(path: Path, files: list[Path], config: dict | None, allow: bool) -> Checkpoint:
    if not allow:
        raise GraftkitError(
            f"{files[0]}: pickled weights are refused by default (loading a pickle can run arbitrary code)",
            "convert to safetensors, or pass --allow-pickle to load with torch.load(weights_only=True)",
        )
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
                      weight_files=tuple(files), notes=tuple(notes))


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


__all__ = ["Checkpoint", "TensorMeta", "drop_tied_head", "match_names", "open_checkpoint", "tensor_bits", "PROVENANCE", "NUMPY"]
