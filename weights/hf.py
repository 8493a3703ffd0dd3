"""An in-memory transformers model (and its tokenizer or processor) written as an HF folder through this
package, and HF folders loaded back as models: causal LMs (:func:`load_model`) and image-text-to-text
models with their processor (:func:`load_vlm`). Either also loads a single checkpoint file (a
``.safetensors`` file, or a pickled training checkpoint) over the config and tokenizer of another folder.

State dicts repeat tied parameters under every name (``lm_head.weight`` is ``embed_tokens.weight``);
like ``save_pretrained``, only the first name of each shared storage is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .writer import OutSpec, write_checkpoint


def save_model(
    dest: Path,
    model,
    tokenizer=None,
    *,
    provenance: dict,
    inputs: Sequence[Path] = (),
    force: bool = False,
    max_shard_size: int | str = "5GB",
    extra_files: dict[str, bytes] | None = None,
    extra_tensors: dict | None = None,
    processor=None,
    dtype=None,
    config: dict | None = None,
) -> Path:
    """Write ``model`` (a transformers ``PreTrainedModel``) and ``tokenizer`` atomically to ``dest``.

    ``processor`` (an image-text processor: anything with ``save_pretrained``) writes its files too
    (``preprocessor_config.json``, its tokenizer, chat template), after the tokenizer's.
    ``extra_files`` (name → bytes) go into the folder too; ``extra_tensors`` (name → tensor) are written
    as ``training_state.safetensors`` beside the weights (optimizer moments, RNG states: never pickled).
    ``dtype``: floating tensors are written cast to it (and config.json says so); default: as they are.
    ``config``: config.json's contents; default: ``model.config.to_dict()``."""
    seen: set[tuple[int, int]] = set()
    specs = []
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        t = t.detach().cpu().contiguous()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        specs.append(OutSpec(name, t.dtype, tuple(t.shape), (lambda t=t: [t])))
    config = model.config.to_dict() if config is None else dict(config)
    if dtype is not None:
        config["dtype"] = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as aux:
        if tokenizer is not None:
            tokenizer.save_pretrained(aux)
        if processor is not None:
            processor.save_pretrained(aux)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(aux)
        return write_checkpoint(
            dest, specs, provenance=provenance, inputs=inputs, aux_from=Path(aux), config=config,
            force=force, max_shard_size=max_shard_size,
            extra_files={**(extra_files or {}), **({"training_state.safetensors": tensors_bytes(extra_tensors)}
                                                   if extra_tensors else {})},
        )


def save_adapter(dest: Path, tensors: dict, adapter_config: dict, tokenizer=None, *, base: Path, provenance: dict,
                 inputs: Sequence[Path] = (), force: bool = False, extra_files: dict[str, bytes] | None = None,
                 extra_tensors: dict | None = None, dtype=None) -> Path:
    """Write a PEFT LoRA adapter folder atomically: ``adapter_config.json`` (``base_model_name_or_path`` set
    to ``base``, absolute, so graftkit and PEFT find the base without a hub), ``adapter_model.safetensors``
    (``tensors`` under PEFT's names, cast to ``dtype`` when given), the tokenizer, ``extra_files``,
    ``extra_tensors`` as ``training_state.safetensors``, and graftkit.json."""
    import json

    config = {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in adapter_config.items()}
    config["base_model_name_or_path"] = str(Path(base).resolve())
    if dtype is not None:
        tensors = {k: t.to(dtype) if t.is_floating_point() else t for k, t in tensors.items()}
    files = {"adapter_config.json": json.dumps(config, indent=2, default=str).encode(),
             "adapter_model.safetensors": tensors_bytes(tensors), **(extra_files or {})}
    if extra_tensors:
        files["training_state.safetensors"] = tensors_bytes(extra_tensors)
    with tempfile.TemporaryDirectory() as aux:
        if tokenizer is not None:
            tokenizer.save_pretrained(aux)
        return write_checkpoint(dest, [], provenance=provenance, inputs=inputs, aux_from=Path(aux), force=force,
                                extra_files=files)


def tensors_bytes(tensors: dict) -> bytes:
    """A safetensors file's bytes holding ``tensors`` (small: training state, not model weights)."""
    import io

    from .checkpoint import tensor_bits
    from .safetensors_file import OutTensor, code_of, header_bytes

    items = [(n, t.detach().cpu().contiguous()) for n, t in tensors.items()]
    buf = io.BytesIO()
    buf.write(header_bytes([OutTensor(n, code_of(t.dtype), tuple(t.shape)) for n, t in items]))
    for _, t in items:
        buf.write(tensor_bits(t.reshape(-1)).tobytes())
    return buf.getvalue()


def write_tensors(path: Path, tensors: Mapping) -> Path:
    """Write ``tensors`` (name → tensor, any device) to one safetensors file at ``path``, a tensor at a time
    (never a second copy of them all): files an engine or a tool reads at once, not checkpoints (those go through
    :func:`save_model`, atomically and with provenance)."""
    from .checkpoint import tensor_bits
    from .safetensors_file import OutTensor, code_of, header_bytes

    items = list(tensors.items())
    with open(path, "wb") as f:
        f.write(header_bytes([OutTensor(n, code_of(t.dtype), tuple(t.shape)) for n, t in items]))
        for _, t in items:
            f.write(tensor_bits(t.detach().cpu().contiguous().reshape(-1)).tobytes())
    return Path(path)


def storage_key(t) -> tuple:
    """Where ``t``'s values live: equal for two names that alias one storage (a tied head beside its embedding)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else ("empty", id(t))


def distinct_tensors(state: Mapping) -> dict:
    """``state`` (name → tensor) without the names that alias an earlier one's storage (:func:`storage_key`)."""
    seen, out = set(), {}
    for n, t in state.items():
        if (key := storage_key(t)) not in seen:
            seen.add(key)
            out[n] = t
    return out


def read_tensors(path: Path) -> dict:
    """Every tensor of a (small) safetensors file, copied out of the mapping."""
    from .safetensors_file import SafetensorsFile

    sf = SafetensorsFile(path)
    return {n: sf.read(n).clone() for n in sf.entries}


def load_model(path: Path, *, no_pickle: bool = False, dtype=None, need_tokenizer: bool = True,
               config_dir: Path | None = None, base: Path | None = None):
    """Load an HF causal LM folder and its tokenizer, never remote code; pickled weights are read through graftkit's
    restricted unpickler, or refused with ``no_pickle``. A single checkpoint file (``.safetensors``, or a
    ``.ckpt``/``.pt``/``.pth``/``.bin`` training checkpoint) holds no config: the model is built from
    ``config_dir``'s config.json and its tokenizer read from there (:func:`_from_single_file`).
    A PEFT LoRA adapter folder is merged into its base model in memory (:func:`.resolve.base_of` with ``base``;
    the tokenizer is the adapter folder's when it has one, else the base's).
    Returns ``(model, tokenizer)``; each failure is one clear error."""
    from transformers import AutoModelForCausalLM

    from ..core.errors import GraftkitError
    from .checkpoint import open_checkpoint
    from .lora import apply_lora, is_lora_folder
    from .resolve import base_of

    path = Path(path)
    if is_lora_folder(path):
        base_dir = base_of(path, base)
        model, tokenizer = load_model(base_dir, no_pickle=no_pickle, dtype=dtype, need_tokenizer=False)
        merged = apply_lora(open_checkpoint(base_dir, no_pickle=no_pickle), path)
        import torch

        state = model.state_dict()
        with torch.no_grad():
            for name in merged.provenance["lora"]["targets"]:
                if name in state:
                    state[name].copy_(merged.read(name).to(state[name].dtype))
        has_tok = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        return model, (_tokenizer(path if has_tok else base_dir) if need_tokenizer else None)
    src = single_file_config(path, config_dir, no_pickle) if path.is_file() else path
    ck = open_checkpoint(path, no_pickle=no_pickle)  # validates files (and refuses pickles with no_pickle)
    if path.is_dir() and ck.foreign_names:  # a trainer's own layout: built like a single file, from its config
        src = layout_config(ck, config_dir)
        tokenizer = _tokenizer(src) if need_tokenizer else None
        return _from_single_file(AutoModelForCausalLM, ck, src, dtype, "a causal LM"), tokenizer
    if path.is_dir() and ck.config is None:
        raise GraftkitError(f"{path}: a policy needs an HF model folder with config.json", "point at the model folder")
    tokenizer = _tokenizer(src) if need_tokenizer else None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if path.is_file():
        return _from_single_file(AutoModelForCausalLM, ck, src, dtype, "a causal LM"), tokenizer
    return _from_pretrained(AutoModelForCausalLM, ck, dtype, "a causal LM"), tokenizer


def stored_dtype(path: Path, *, no_pickle: bool = False, base: Path | None = None):
    """The floating torch dtype that holds most of a checkpoint's bytes (a LoRA adapter: its base's;
    float32 when it has no floating tensor)."""
    import torch

    from .checkpoint import open_checkpoint
    from .lora import is_lora_folder
    from .resolve import open_model

    path = Path(path)
    ck = open_model(path, base) if is_lora_folder(path) else open_checkpoint(path, no_pickle=no_pickle)
    by: dict = {}
    for m in ck.metas.values():
        if m.dtype.is_floating_point:
            by[m.dtype] = by.get(m.dtype, 0) + m.nbytes
    return max(by, key=by.get) if by else torch.float32


def save_dtype(name: str, init: Path | None):
    """The dtype a trained policy is written in: ``auto`` is the init checkpoint's (:func:`stored_dtype`;
    float32 for a policy built from scratch), else the named one."""
    import torch

    from ..core.devices import torch_dtype

    if name != "auto":
        return torch_dtype(name)
    return stored_dtype(Path(init)) if init is not None else torch.float32


def single_file_config(path: Path, config_dir: Path | None, no_pickle: bool = False) -> Path:
    """The HF folder whose config.json (and tokenizer or processor) a model loaded from the single
    checkpoint file ``path`` is built from: ``config_dir``, which must be given and hold a config.json.
    A pickled file with ``no_pickle`` is left to :func:`.checkpoint.open_checkpoint` to refuse."""
    from ..core.errors import GraftkitError
    from .state_dict import SUFFIXES

    path = Path(path)
    if config_dir is None:
        if path.suffix in SUFFIXES and no_pickle:
            return path.parent  # open_checkpoint refuses the pickle first, naming --no-pickle
        raise GraftkitError(
            f"{path}: a single checkpoint file holds no config.json or tokenizer, so a policy cannot be built "
            "from it alone", "pass --config with the HF folder of its config.json and tokenizer (e.g. the SFT folder)")
    config_dir = Path(config_dir).expanduser()
    if not (config_dir / "config.json").is_file():
        raise GraftkitError(f"--config {config_dir}: no config.json there", "point at the HF model folder")
    return config_dir


def layout_config(ck, config_dir: Path | None) -> Path:
    """The HF folder a model read from a trainer's own layout (:mod:`.trainers`) is built from: ``config_dir``
    (``--config``), else the config.json found with the layout (its folder or a parent, verl's ``huggingface/``)."""
    from ..core.errors import GraftkitError

    if config_dir is not None:
        return single_file_config(ck.path, config_dir)
    if ck.config_from is None:
        raise GraftkitError(f"{ck.path}: this {ck.kind} checkpoint has no config.json in its folder or the folders "
                            "above it, so a policy cannot be built from it alone",
                            "pass --config with the HF folder of its config.json and tokenizer (e.g. the SFT folder)")
    return Path(ck.config_from)


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    from ..core.errors import GraftkitError

    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise GraftkitError(
            f"{folder}: no tokenizer (tokenizer.json or tokenizer_config.json)",
            "save the tokenizer into the model folder (tokenizer.save_pretrained)",
        )
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a broken tokenizer folder
        raise GraftkitError(f"{folder}: cannot load its tokenizer ({exc})".splitlines()[0]) from None


def _from_single_file(auto_class, ck, config_dir: Path, dtype, what: str):
    """``auto_class`` built from ``config_dir``'s config.json (no remote code, float32 unless a dtype is
    asked for), its weights set from the single-file checkpoint ``ck``: the file's names are mapped onto
    the model's own (:func:`.checkpoint.match_names`: container and wrapper prefixes, tied duplicates).
    Every tensor of the model must come from the file, except a tied head the config shares with the
    embedding; a tensor of the wrong shape, a missing one, or a tied pair with different values is an error."""
    import torch
    from transformers import AutoConfig, GenerationConfig

    from ..core.errors import GraftkitError
    from .checkpoint import Checkpoint, TensorMeta, _alias_key, _read_json, match_names
    from .safetensors_file import code_of

    try:
        config = AutoConfig.from_pretrained(config_dir, trust_remote_code=False)
        model = auto_class.from_config(config, trust_remote_code=False,
                                       dtype=dtype if dtype is not None else torch.float32)
    except Exception as exc:  # transformers raises many types for an unknown or broken config
        raise GraftkitError(f"--config {config_dir}: cannot build {what} from its config.json ({exc})".splitlines()[0],
                            "check config.json's architecture") from None
    own = model.state_dict()  # views of the parameters: copying into them sets the model's weights
    ref = Checkpoint(path=config_dir, kind="hf-folder",
                     metas={n: TensorMeta(n, code_of(t.dtype), tuple(t.shape)) for n, t in own.items()},
                     reader=own.__getitem__, config=_read_json(config_dir / "config.json"))
    named = match_names(ck, ref, config_dir=config_dir)
    extra = [n for n in named.metas if n not in own]
    if extra:
        raise GraftkitError(f"{ck.path}: {len(extra)} tensor(s) the model of --config {config_dir} does not have: "
                            f"{', '.join(extra[:5])}", "pass the config the checkpoint was trained with")
    for n, m in named.metas.items():
        if m.shape != tuple(own[n].shape):
            raise GraftkitError(f"{ck.path}: tensor {n} has shape {list(m.shape)} but the model of --config "
                                f"{config_dir} expects {list(own[n].shape)}", "pass the config the checkpoint was trained with")
    by_storage: dict[tuple, list[str]] = {}
    for n, t in own.items():
        by_storage.setdefault(_alias_key(t), []).append(n)
    for names in by_storage.values():
        held = [n for n in names if n in named.metas]
        if not held:
            shown = ", ".join(names[:3])
            raise GraftkitError(f"{ck.path}: holds no tensor for {shown} of the model --config {config_dir} describes",
                                "save the whole model.state_dict(), or pass the config it was trained with")
        if any(not torch.equal(named.read(held[0]), named.read(n)) for n in held[1:]):
            raise GraftkitError(f"{ck.path}: {', '.join(held)} differ, but --config {config_dir} ties them",
                                "pass a config with tie_word_embeddings false")
    with torch.no_grad():
        for names in by_storage.values():
            n = next(n for n in names if n in named.metas)
            own[n].copy_(named.read(n))
    if (config_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(config_dir)
    return model.eval()


def _from_pretrained(auto_class, ck, dtype, what: str):
    """``auto_class.from_pretrained`` of the folder ``ck`` was opened from, the graftkit way: no remote code, its
    safetensors (in a folder of pickled weights, which ``ck`` has read through graftkit's restricted unpickler, its
    ``.bin`` files, loaded ``weights_only``), float32 unless a dtype is asked for, eval mode, and one clear error."""
    import torch

    from ..core.errors import GraftkitError

    path = ck.path
    try:
        model = auto_class.from_pretrained(
            path, trust_remote_code=False, use_safetensors=None if ck.kind == "pickle" else True,
            dtype=dtype if dtype is not None else torch.float32,
        )
    except Exception as exc:  # transformers raises many types for a broken model folder
        raise GraftkitError(f"{path}: cannot load as {what} ({exc})".splitlines()[0],
                            "check config.json's architecture") from None
    return model.eval()


# ------------------------------------------------------------------------- image-text-to-text models

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


@dataclass
class ImageTextProcessor:
    """The two halves of an image-text processor folder: its tokenizer and its image processor.

    Used where transformers cannot build the folder's own processor class: in transformers 5.x,
    Qwen2-VL's processor also holds a video processor, which needs torchvision; without it
    ``AutoProcessor`` fails although nothing about images needs it. The chat template is the
    tokenizer's (``chat_template.jinja`` is saved and loaded with it).
    """

    tokenizer: object
    image_processor: object

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def save_pretrained(self, folder) -> None:
        self.tokenizer.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)


def _model_type(path: Path) -> str | None:
    import json

    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def is_vision_folder(path: Path, need_processor: bool = True) -> bool:
    """True when ``path`` is an HF folder of an image-text-to-text model (by its config's
    ``model_type``) that carries an image processor's files (or need not: ``need_processor=False``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    path = Path(path)
    return (_model_type(path) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
            and (not need_processor or any((path / f).is_file() for f in PROCESSOR_FILES)))


def load_vlm(path: Path, *, no_pickle: bool = False, dtype=None, config_dir: Path | None = None):
    """Load an HF image-text-to-text folder and its processor, never remote code (pickled weights read as
    :func:`load_model` reads them). Returns ``(model, processor)``: the folder's own processor
    (``AutoProcessor``) where transformers can build it, else an :class:`ImageTextProcessor` of its
    tokenizer and image processor. A single checkpoint file is built from ``config_dir`` (config.json and
    processor), as in :func:`load_model`. Each failure is one clear error."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from ..core.errors import GraftkitError
    from .checkpoint import open_checkpoint

    path = Path(path)
    src = single_file_config(path, config_dir, no_pickle) if path.is_file() else path
    ck = open_checkpoint(path, no_pickle=no_pickle)
    if path.is_dir() and ck.config is None:
        raise GraftkitError(f"{path}: a policy needs an HF model folder with config.json", "point at the model folder")
    model_type = _model_type(src)
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise GraftkitError(f"{src}: model_type {model_type!r} is not an image-text-to-text model",
                            "point at a vision-language model folder (e.g. Qwen2-VL)")
    if not any((src / f).is_file() for f in PROCESSOR_FILES):
        raise GraftkitError(f"{src}: no image processor ({' or '.join(PROCESSOR_FILES)})",
                            "save the processor into the model folder (processor.save_pretrained)")
    processor = None
    try:
        processor = AutoProcessor.from_pretrained(src, trust_remote_code=False)
    except Exception:  # noqa: BLE001 — e.g. a video half that needs torchvision; assembled below instead
        pass
    if processor is None or getattr(processor, "image_processor", None) is None:
        try:
            processor = ImageTextProcessor(AutoTokenizer.from_pretrained(src, trust_remote_code=False),
                                           AutoImageProcessor.from_pretrained(src, trust_remote_code=False))
        except Exception as exc:  # transformers raises many types for a broken processor folder
            raise GraftkitError(f"{src}: cannot load its processor ({exc})".splitlines()[0],
                                "check preprocessor_config.json and the tokenizer files") from None
    if path.is_file():
        return _from_single_file(AutoModelForImageTextToText, ck, src, dtype, "an image-text-to-text model"), processor
    return _from_pretrained(AutoModelForImageTextToText, ck, dtype, "an image-text-to-text model"), processor
