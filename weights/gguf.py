"""GGUF checkpoints in: a llama.cpp GGUF file (float or quantised tensors) written as an HF folder.

``graftkit import FILE.gguf --out DIR`` reads the file's metadata and tensors through transformers' GGUF
support and writes the model with this package's writer (:func:`.hf.save_model`: safetensors, config.json,
the tokenizer with its chat template, ``graftkit.json``), so every other command can read the result.

The path, and why it is this one:

1. config: ``AutoConfig.from_pretrained(folder, gguf_file=name)``, the config transformers' own GGUF loading
   builds from the file's ``<arch>.*`` metadata (never remote code);
2. model: built from that config on the ``meta`` device, so no weights are allocated or initialised;
3. tensors: ``modeling_gguf_pytorch_utils.load_gguf_checkpoint(path, return_tensors=True,
   model_to_load=model)`` maps llama.cpp's names (``blk.N.attn_q.weight``) onto the model's, dequantises
   each tensor with the ``gguf`` package, and undoes llama.cpp's q/k row permutation; each tensor is cast to
   the output dtype as it is read, then *assigned* into the meta model (one dequantised copy in memory, never
   two). Every tensor of the model must come from the file (a tied head from the embedding), and every
   tensor of the file must land in the model, except llama.cpp's precomputed ``rope_freqs`` (transformers
   derives rotary frequencies from the config);
4. tokenizer: ``AutoTokenizer.from_pretrained(folder, gguf_file=name)`` (transformers' conversion of
   ``tokenizer.ggml.*``), whose chat template is the file's ``tokenizer.chat_template``;
5. the folder holds what ``save_pretrained`` of the model's class writes (:func:`saved_config`): config.json with
   ``architectures`` (the class ``AutoModelForCausalLM`` builds, which TRL's ``create_model_from_path`` reads),
   ``dtype``, ``transformers_version``, only the values that differ from the config class's defaults and no
   ``_name_or_path`` (the folder holding the GGUF file, not the one written); generation_config.json; the
   tokenizer's files as ``tokenizer.save_pretrained`` writes them. It loads wherever a ``save_pretrained``
   folder loads (``from_pretrained``, TRL's trainers and their reference models).

``from_pretrained(folder, gguf_file=name)`` itself is not used: it needs accelerate and marks the model as
quantised by gguf, after which ``save_pretrained`` refuses to write it.

Quantised values are dequantised, not restored: a Q4_1 file imports as the Q4_1 values, not the weights it was
quantised from. ``graftkit.json`` records the file's sha256 and its tensors by ggml type.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.config import CommandConfig, OnProgress, check_choice, no_progress, opt
from ..core.errors import GraftkitError

MAGIC = b"GGUF"
DTYPES = ("auto", "float32", "bfloat16", "float16")
# ggml types that hold values rather than quantised blocks, and the torch dtype of each
FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# file tensors with no counterpart in a transformers model, and why they need none
DERIVED = {"rope_freqs.weight": "llama.cpp's precomputed rotary frequency factors; transformers derives them "
                                "from the config's rope_parameters"}
INSTALL = "pip install 'graftkit[gguf]'"


@dataclass(frozen=True, kw_only=True)
class ImportConfig(CommandConfig):
    """``graftkit import``: a GGUF checkpoint as an HF folder."""

    command = "import"
    source: Path = opt(argument=True)
    """The .gguf file (llama.cpp's format: float or quantised tensors, with its tokenizer and chat template)."""
    out: Path = opt(flags=("--out",))
    """HF folder to write (safetensors, config.json, tokenizer, graftkit.json); not the folder holding the file."""
    dtype: str = "auto"
    """auto (float32 when any tensor is quantised: the dequantised values exactly; else the file's float type, the
    half type when there is one, since llama.cpp keeps norms in F32 beside F16/BF16 weights), float32, bfloat16
    or float16."""
    force: bool = False
    """Replace an existing --out folder (only one graftkit wrote)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.dtype, DTYPES, "--dtype")


def quantisation(types: list[str]) -> dict[str, int]:
    """Tensor count per ggml type name (``{"Q4_1": 211, "F32": 61}``), most tensors first."""
    counts: dict[str, int] = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def import_dtype(name: str, counts: dict[str, int]) -> str:
    """The dtype the tensors are written in: ``name``, or for ``auto`` float32 when any tensor is quantised
    (every dequantised value is a float32), else the half type of the file (BF16, then F16) when it has one,
    else float32."""
    if name != "auto":
        return name
    if any(t not in FLOAT_TYPES for t in counts):
        return "float32"
    for t in ("BF16", "F16"):
        if t in counts:
            return FLOAT_TYPES[t]
    return "float32"


def check_source(path: Path) -> Path:
    """``path`` if it is a readable file that starts with the GGUF magic, else one clear error."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise GraftkitError(f"{path}: no such file" + (" (it is a folder)" if path.is_dir() else ""),
                            "pass the .gguf file itself")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise GraftkitError(f"{path}: not a GGUF file (it starts with {head!r}, not {MAGIC!r})",
                            "pass a llama.cpp .gguf checkpoint")
    return path


def _open_reader(source: Path):
    """gguf's memory-mapped reader of ``source`` (metadata and tensor table), or one clear error."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GraftkitError("importing a GGUF file needs the gguf package", INSTALL) from None
    try:
        return GGUFReader(source)
    except Exception as exc:  # gguf raises many types (ValueError, struct.error, IndexError) for a broken file
        raise GraftkitError(f"{source}: a GGUF header that cannot be read ({exc})".splitlines()[0],
                            "the file is truncated or corrupt; download or convert it again") from None


@contextlib.contextmanager
def _parsed_once(source: Path):
    """``source``'s metadata parsed once for the whole import: transformers' config, tensor and tokenizer readers
    each open the file again with ``gguf.GGUFReader``, and each parse walks every metadata field (≈7 s for a
    49,152-token vocabulary, most of an import's time). While the import runs, ``gguf.GGUFReader`` of ``source``
    hands them the reader this opened (read-only: a memory map and its parsed fields); any other file, or a
    writable open, gets a reader of its own. Undone on exit."""
    reader = _open_reader(source)  # one error line for a missing gguf package or an unreadable header
    import gguf

    real = gguf.GGUFReader

    def shared(path, mode="r"):
        return reader if mode == "r" and Path(path).resolve() == source else real(path, mode)

    gguf.GGUFReader = shared
    try:
        yield reader
    finally:
        gguf.GGUFReader = real


@contextlib.contextmanager
def _loader_hooks(on_progress: OnProgress, mapping: dict):
    """Three changes to transformers' GGUF reader while it runs, each undone on exit:

    - its tqdm bar over the tensors reports through ``on_progress`` instead (a run function never prints);
    - gguf's ``get_tensor_name_map(arch, n_layers)`` is memoised: the reader rebuilds that table once per
      submodule of the model (≈800 times, ≈26 s for a 30-layer model), always with the same arguments;
    - the GGUF → model name mapping it computes is copied into ``mapping``, so the caller can check that
      every tensor of the file found a place without computing it again.
    """
    import functools

    import gguf
    from transformers import modeling_gguf_pytorch_utils as mgu

    def bar(items, **_):
        items = list(items)
        for item in items:
            yield item
            on_progress("dequantise", 1, len(items), "tensors")

    weights_map = mgu.get_gguf_hf_weights_map

    def recorded(*args, **kwargs):
        found = weights_map(*args, **kwargs)
        if not kwargs.get("qual_name"):  # the outermost call (its recursion names submodules)
            mapping.update(found)
        return found

    saved = mgu.tqdm, mgu.get_gguf_hf_weights_map, gguf.get_tensor_name_map
    mgu.tqdm, mgu.get_gguf_hf_weights_map = bar, recorded
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved[2])
    try:
        yield
    finally:
        mgu.tqdm, mgu.get_gguf_hf_weights_map, gguf.get_tensor_name_map = saved


def _field_text(reader, key: str) -> str | None:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")


def run_import(cfg: ImportConfig, on_progress: OnProgress = no_progress) -> dict:
    """Write ``cfg.source`` (a GGUF file) as an HF folder at ``cfg.out`` (see the module docstring).

    Returns ``{out, architecture, tensors, params, quantisation, sha256, dtype, seconds, notes}``:
    ``tensors`` and ``params`` count the written model's own tensors (a tied head once), ``quantisation`` the
    file's tensors by ggml type. Progress: one bar over the steps of ``IMPORT_STEPS`` (the file's metadata is parsed
    once, :func:`_parsed_once`), and one over the tensors as they are dequantised."""
    import torch

    from .fingerprint import file_digests
    from .hf import save_model
    from .writer import check_destination

    t0 = time.perf_counter()
    step = lambda: on_progress("import", 1, len(IMPORT_STEPS), "steps")  # noqa: E731
    source = check_source(cfg.source).resolve()
    check_destination(cfg.out, (), cfg.force, [source])  # before any slow work; save_model checks again
    with _parsed_once(source) as reader:
        arch = _field_text(reader, "general.architecture")
        name = _field_text(reader, "general.name")
        file_names = [t.name for t in reader.tensors]
        counts = quantisation([t.tensor_type.name for t in reader.tensors])
        dtype = import_dtype(cfg.dtype, counts)
        torch_dtype = getattr(torch, dtype)
        step()

        model = _meta_model(source, arch)
        step()
        mapping: dict[str, str] = {}
        tensors = _load_tensors(source, arch, model, torch_dtype, on_progress, mapping)
        notes = _assign(model, tensors, file_names, mapping, source)
        step()
        tokenizer = _tokenizer(source)
        step()
    if getattr(tokenizer, "chat_template", None) is None:
        notes.append(f"{source.name} carries no tokenizer.chat_template: the tokenizer has no chat template")
    rounded = [t for t in counts if dtype != "float32" and FLOAT_TYPES.get(t) != dtype]
    if rounded:  # float32 holds every dequantised, F16 and BF16 value exactly; a half type does not
        notes.append(f"{sum(counts[t] for t in rounded)} tensor(s) stored as {', '.join(rounded)} rounded to {dtype}")

    digest = file_digests([source], "sha256")[source]  # sha256: what model hubs list for a file
    step()
    dequantised = any(t not in FLOAT_TYPES for t in counts)
    from .._version import __version__

    provenance = {
        "producer": "graftkit import",
        "graftkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.as_dict(),
        "source": {"path": str(source), "sha256": digest, "bytes": source.stat().st_size, "format": "gguf"},
        "gguf": {"architecture": arch, "name": name, "tensors": len(file_names)},
        "quantisation": counts,
        "dequantised": dequantised,
        "dtype": dtype,
        "parents": [{"role": "source", "path": str(source), "sha256": digest}],
        "notes": notes,
    }
    state = model.state_dict()
    seen = {(t.untyped_storage().data_ptr(), t.storage_offset()) for t in state.values()}
    out = save_model(Path(cfg.out), model, tokenizer, provenance=provenance, dtype=torch_dtype, force=cfg.force,
                     config=saved_config(model, dtype))
    step()
    return {"out": str(out), "architecture": arch, "tensors": len(seen),
            "params": sum(p.numel() for p in model.parameters()), "quantisation": counts, "sha256": digest,
            "dtype": dtype, "dequantised": dequantised, "seconds": time.perf_counter() - t0, "notes": notes}


#: The steps of an import its progress bar counts, in order.
IMPORT_STEPS = ("metadata", "model", "tensors", "tokenizer", "sha256", "write")


def saved_config(model, dtype: str) -> dict:
    """config.json of ``model`` as ``model.save_pretrained`` writes it: ``architectures`` set to the model's class,
    ``dtype`` to the written one, then ``to_diff_dict()`` (the values that differ from the defaults, and
    ``transformers_version``; no ``_name_or_path``, which for a config read from a GGUF file names the folder
    holding the file)."""
    model.config.architectures = [type(model).__name__]
    model.config.dtype = dtype
    return model.config.to_diff_dict()


def _meta_model(source: Path, arch: str | None):
    """The causal LM the file's metadata describes, built on the meta device (no weights allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GraftkitError(f"{source}: GGUF architecture {arch!r} has no transformers mapping",
                            f"transformers maps {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}")
    try:
        config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for metadata it cannot map
        raise GraftkitError(f"{source}: cannot build a config from its {arch} metadata ({exc})".splitlines()[0],
                            "check the file with gguf-dump") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as exc:  # e.g. an encoder-decoder architecture
        raise GraftkitError(f"{source}: GGUF architecture {arch!r} (model_type {config.model_type!r}) is not a "
                            f"causal LM transformers can build ({exc})".splitlines()[0],
                            "import a decoder-only model (llama, qwen2, gemma, phi3, ...)") from None
    return model.eval()


def _load_tensors(source: Path, arch: str | None, model, torch_dtype, on_progress: OnProgress,
                  mapping: dict) -> dict:
    """The file's tensors under the model's names, dequantised and cast to ``torch_dtype`` one at a time
    (``mapping`` receives the GGUF → model name mapping used)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        with _loader_hooks(on_progress, mapping):
            parsed = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model,
                                          torch_dtype=torch_dtype)
    except ImportError:
        raise GraftkitError("importing a GGUF file needs the gguf package", INSTALL) from None
    except (ValueError, NotImplementedError, KeyError) as exc:  # an unmappable name or an unknown ggml type
        raise GraftkitError(f"{source}: cannot read its {arch} tensors ({exc})".splitlines()[0],
                            "check the file with gguf-dump; a newer gguf or transformers may read it") from None
    return parsed["tensors"]


def _assign(model, tensors: dict, file_names: list[str], mapping: dict, source: Path) -> list[str]:
    """Put ``tensors`` into the meta ``model`` (the tensors become its parameters: no copy), tie its head, and
    check that every model tensor and every file tensor found its counterpart. Returns notes."""
    own = model.state_dict()
    wrong = [f"{n} {list(t.shape)} (model {list(own[n].shape)})" for n, t in tensors.items()
             if n in own and tuple(t.shape) != tuple(own[n].shape)]
    if wrong:
        raise GraftkitError(f"{source}: tensor shapes disagree with its own metadata: {', '.join(wrong[:3])}",
                            "the file is inconsistent; re-convert it with llama.cpp")
    unknown = [n for n in tensors if n not in own]
    if unknown:
        raise GraftkitError(f"{source}: tensors the model has no place for: {', '.join(unknown[:5])}")
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, t in model.state_dict().items() if t.is_meta]
    if missing:
        raise GraftkitError(f"{source}: holds no tensor for {len(missing)} of the model's: {', '.join(missing[:5])}",
                            "the file lacks weights its architecture needs; re-convert it with llama.cpp")
    notes = [f"{n} not imported: {DERIVED[n]}" for n in file_names if n not in mapping and n in DERIVED]
    unused = [n for n in file_names if n not in mapping and n not in DERIVED]
    if unused:
        raise GraftkitError(f"{source}: {len(unused)} tensor(s) transformers maps to nothing: {', '.join(unused[:5])}",
                            "this architecture's GGUF layout is not supported; convert the original HF model instead")
    return notes


def _tokenizer(source: Path):
    """The file's tokenizer through transformers' GGUF conversion, chat template included."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a tokenizer it cannot convert
        raise GraftkitError(f"{source}: cannot convert its tokenizer ({exc})".splitlines()[0],
                            "check tokenizer.ggml.* in the file with gguf-dump") from None
