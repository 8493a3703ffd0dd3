"""PEFT LoRA adapters as the RL side of a pair.

A LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) stores, per target
module, ``A`` (r × in) and ``B`` (out × r). The module's weight delta is

    Δ = s · B @ A,   s = lora_alpha / r   (rsLoRA: s = lora_alpha / √r)

with per-module ``r`` and ``lora_alpha`` from ``rank_pattern`` / ``alpha_pattern`` when given,
transposed when ``fan_in_fan_out`` (GPT-2's Conv1D). Embedding adapters store ``lora_embedding_A``
(r × vocab) and ``lora_embedding_B`` (dim × r); their delta is (B @ A)ᵀ. Tensors listed in
``modules_to_save`` are full replacements, as are trained biases (``bias="all"``) and the base weight
PEFT saves with a targeted embedding (``<module>.base_layer.<param>``, the base's ``<module>.<param>``).
:func:`apply_lora` presents base + Δ as a :class:`~graftkit.weights.reader.Checkpoint`, each adapted
tensor merged in fp32 and cast to the base dtype (what ``merge_and_unload`` computes), every other tensor
the base's own bytes.
DoRA (a learned magnitude vector), trainable LoRA biases (``lora_bias``) and non-LoRA adapters are
refused. An adapter folder opened alone (:data:`ADAPTER`, the reader :func:`.checkpoint.open_checkpoint` consults) is
one error: it is read over its base.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import GraftkitError
from .reader import Checkpoint, Found, Reader, TensorMeta, _read_json
from .safetensors_file import SafetensorsFile

_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraModule:
    """One adapted base tensor: its A and B tensors in the adapter file and the scale s."""

    target: str  # base tensor name, e.g. model.layers.0.self_attn.q_proj.weight
    a: str
    b: str
    scale: float
    transpose: bool  # fan_in_fan_out, or an embedding


def is_lora_folder(path: Path) -> bool:
    return path.is_dir() and (path / "adapter_config.json").is_file()


def _pattern_value(patterns: dict, module: str, default):
    # PEFT's rule: a key matches a module whose dotted name ends with it.
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_adapter(path: Path) -> tuple[dict, SafetensorsFile, list[LoraModule], dict[str, str]]:
    """Parse an adapter folder: (config, file, adapted modules, full replacements target → key)."""
    cfg = _read_json(path / "adapter_config.json")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise GraftkitError(
            f"{path}: adapter type {cfg.get('peft_type')} is not supported", "only LoRA adapters are"
        )
    if cfg.get("use_dora"):
        raise GraftkitError(
            f"{path}: DoRA adapters are not supported (their delta depends on a learned magnitude "
            "normalisation of the merged weight)",
            "merge the adapter with PEFT's merge_and_unload() and pass the merged folder",
        )
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        if (path / "adapter_model.bin").is_file():
            raise GraftkitError(
                f"{path}/adapter_model.bin: pickled adapter weights are not read",
                "re-save the adapter with safe_serialization=True",
            )
        raise GraftkitError(f"{path}: adapter_model.safetensors is missing", "re-save the adapter")
    sf = SafetensorsFile(weights)
    r0, alpha0 = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    rank_pat, alpha_pat = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    bias_keys = [k for k in sf.entries if k.endswith(".lora_B.bias")]
    if cfg.get("lora_bias") or bias_keys:
        raise GraftkitError(
            f"{path}: LoRA adapters with lora_bias=True are not supported"
            + (f" (tensor {bias_keys[0]})" if bias_keys else ""),
            "merge the adapter with PEFT's merge_and_unload() and pass the merged folder",
        )
    modules: list[LoraModule] = []
    full: dict[str, str] = {}
    for key in sf.entries:
        if "lora_magnitude_vector" in key:
            raise GraftkitError(f"{path}: tensor {key} belongs to a DoRA adapter", "merge it with PEFT first")
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        for a_tag, b_tag, emb in ((".lora_A.weight", ".lora_B.weight", False),
                                  (".lora_embedding_A", ".lora_embedding_B", True)):
            if name.endswith(a_tag):
                module = name[: -len(a_tag)]
                b_key = key[: -len(a_tag)] + b_tag
                if b_key not in sf.entries:
                    raise GraftkitError(f"{weights}: {key} has no matching {b_key}", "re-save the adapter")
                r = int(_pattern_value(rank_pat, module, r0))
                alpha = float(_pattern_value(alpha_pat, module, alpha0))
                scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
                modules.append(LoraModule(module + ".weight", key, b_key, scale,
                                          emb or bool(cfg.get("fan_in_fan_out"))))
                break
        else:
            if ".lora_B." in name or name.endswith(".lora_embedding_B"):
                continue
            # modules_to_save, trained biases (bias="all"/"lora_only") and the saved base weight of a
            # targeted embedding: full replacements. PEFT saves a wrapped module's own tensors under
            # ``<module>.base_layer.<param>``, the base model's ``<module>.<param>``.
            full[name.replace(".base_layer.", ".")] = key
    paired = {m.b for m in modules}
    orphans = [k for k in sf.entries if (".lora_B." in k or k.endswith(".lora_embedding_B")) and k not in paired]
    if orphans:
        raise GraftkitError(f"{weights}: {orphans[0]} has no matching lora_A tensor", "re-save the adapter")
    return cfg, sf, modules, full


def lora_delta(a, b, scale: float, transpose: bool):
    """Δ = s · B @ A in float32 (transposed for fan_in_fan_out layers and embeddings)."""
    d = scale * (b.float() @ a.float())
    return d.T.contiguous() if transpose else d


def apply_lora(base: Checkpoint, adapter_path: Path, base_flag: str = "--base") -> Checkpoint:
    """The checkpoint base + Δ_LoRA, computed one tensor at a time on read (errors name ``base_flag``, the
    command's option for the base)."""
    cfg, sf, modules, full = read_adapter(adapter_path)
    by_target = {m.target: m for m in modules}
    missing = [t for t in [*by_target, *full] if t not in base.metas]
    if missing:
        raise GraftkitError(
            f"{adapter_path}: adapter targets tensor(s) the base {base.path} does not have: "
            f"{', '.join(missing[:5])}",
            f"pass the base model the adapter was trained on as {base_flag}",
        )
    for t, m in by_target.items():
        meta = base.metas[t]
        a, b = sf.entries[m.a].shape, sf.entries[m.b].shape
        shape = (a[1], b[0]) if m.transpose else (b[0], a[1])
        if len(meta.shape) != 2 or tuple(meta.shape) != shape:
            raise GraftkitError(
                f"{adapter_path}: LoRA for {t} gives a delta of shape {list(shape)} but the base tensor is "
                f"{list(meta.shape)}",
                f"pass the base model the adapter was trained on as {base_flag}",
            )
    for t, key in full.items():
        if tuple(sf.entries[key].shape) != base.metas[t].shape:
            raise GraftkitError(
                f"{adapter_path}: saved module {key} has shape {list(sf.entries[key].shape)}, base tensor "
                f"{t} has {list(base.metas[t].shape)}",
                f"pass the base model the adapter was trained on as {base_flag}",
            )

    def read(name: str):
        if name in by_target:
            m = by_target[name]
            w = sf.read(full[name]).to(base.metas[name].dtype) if name in full else base.read(name)
            return (w.float() + lora_delta(sf.read(m.a), sf.read(m.b), m.scale, m.transpose)).to(w.dtype)
        if name in full:
            return sf.read(full[name]).to(base.metas[name].dtype)
        return base.read(name)

    changed = set(by_target) | set(full)
    raw = {n: e for n, e in base.raw.items() if n not in changed}
    metas = {n: TensorMeta(n, m.code, m.shape) for n, m in base.metas.items()}
    def exact(name: str):
        m = by_target.get(name)
        if m is None or name in full:  # a saved replacement is no low-rank update of the base
            return None
        return lora_delta(sf.read(m.a), sf.read(m.b), m.scale, m.transpose)

    return Checkpoint(path=adapter_path, kind="lora-merged", metas=metas, reader=read, raw=raw, config=base.config,
                      provenance={"lora": {"config": cfg, "base": str(base.path), "targets": sorted(changed)}},
                      weight_files=(sf.path, *base.weight_files), arrays=base.arrays, deltas=exact,
                      stored="base + the adapter's float32 update s·B@A")


def _refuse_alone(found: Found, path: Path) -> Checkpoint:
    raise GraftkitError(f"{path} is a LoRA adapter, not a full checkpoint",
                        "pass it as the RL side (--from) with the full base model as --base")


#: A PEFT adapter folder opened alone: refused (:func:`apply_lora` reads it over its base).
ADAPTER = Reader("lora-adapter", lambda path: Found(path, "a PEFT LoRA adapter") if is_lora_folder(path) else None,
                 _refuse_alone, refuses=True)
