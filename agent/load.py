"""Loading a policy from a checkpoint: a causal-LM :class:`~graftkit.agent.policy.Policy` or a
:class:`~graftkit.agent.vlm.VisionPolicy`, on its device and in its dtype, with the generation engine it decodes
with (:mod:`graftkit.agent.engine`)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import GraftkitError
from .engine import resolve_engine, vllm_engine
from .policy import Policy
from .vlm import VisionPolicy


def load_policy(path: Path, *, no_pickle: bool = False, obs: str = "text", config: Path | None = None,
                base: Path | None = None, device: str = "auto", dtype: str = "auto", engine: str = "hf",
                allow_pickle: bool = False) -> Policy:
    """The policy in an HF folder: a :class:`~graftkit.agent.vlm.VisionPolicy` for an
    image-text-to-text model with its processor, else a causal-LM :class:`Policy`. ``obs="som"``
    refuses a text-only folder before loading any weights. A single checkpoint file (pickled ones refused with
    ``no_pickle``; ``allow_pickle`` is accepted and changes nothing) is built over ``config``, the HF folder of its
    config.json and tokenizer or
    processor (:func:`graftkit.weights.load_model`), which must then be given. ``device``/``dtype``: where
    and in what precision it runs (:mod:`graftkit.core.devices`: ``auto`` is the stored dtype on a GPU, float32
    on the CPU); the weights are loaded in that dtype, so a float32 checkpoint run in bfloat16 is rounded
    once, as ``from_pretrained(dtype=torch.bfloat16)`` rounds it. ``engine``: ``hf``, ``vllm`` or ``auto``
    (:mod:`graftkit.agent.engine`; a vision-language policy decodes with ``hf``)."""
    from ..core.devices import resolve_device, resolve_dtype
    from ..weights import is_vision_folder, load_model, load_vlm
    from ..weights.hf import single_file_config, stored_dtype

    path = Path(path)
    if obs not in ("text", "som"):
        raise GraftkitError(f"unknown observation {obs!r}", "use text or som")
    requested, engine = engine, resolve_engine(engine, obs)
    folder = single_file_config(path, config, no_pickle) if path.is_file() else path
    dev = resolve_device(device)
    want = resolve_dtype(dtype, dev, stored_dtype(path, no_pickle=no_pickle, base=base)
                         if dev.type != "cpu" and dtype == "auto" else None)
    if is_vision_folder(folder) or (obs == "som" and is_vision_folder(folder, need_processor=False)):
        if requested == "vllm":
            raise GraftkitError(f"--engine vllm decodes causal LMs; {path} is a vision-language policy",
                                "use --engine hf (or auto) for it")
        model, processor = load_vlm(path, no_pickle=no_pickle, config_dir=config, dtype=want)
        return VisionPolicy(model.to(dev), processor.tokenizer, path, processor=processor)
    if obs == "som":
        import json

        try:
            cfg = json.loads((folder / "config.json").read_text())
            arch = ", ".join(cfg.get("architectures") or []) or f"model_type {cfg.get('model_type')}"
        except (OSError, ValueError, AttributeError):
            arch = "no readable config.json"
        raise GraftkitError(
            f"--obs som needs a vision-language policy, but {path} is a text-only causal LM ({arch})",
            "pass an image-text-to-text model folder with its processor (e.g. Qwen2-VL), or use --obs text",
        )
    model, tok = load_model(path, no_pickle=no_pickle, config_dir=config, base=base, dtype=want)
    return with_engine(Policy(model.to(dev), tok, path), engine)


def with_engine(policy: Policy, engine: str = "hf") -> Policy:
    """``policy`` decoding with ``engine`` (already resolved: :func:`graftkit.agent.engine.resolve_engine`): ``hf``
    leaves it as it is; ``vllm`` builds a vLLM engine over its weights (free it with ``policy.close()``)."""
    if engine == "vllm" and policy.engine is None:
        policy.engine = vllm_engine(policy)
    return policy
