"""LoRA fine-tuning (``--lora-r``): PEFT's LoRA layers injected into the policy, only they are trained.

The adapters are PEFT's own (``peft.get_peft_model``), so a run writes a standard PEFT adapter folder
(``adapter_config.json`` + ``adapter_model.safetensors``, :func:`graftkit.weights.save_adapter`) that
graftkit's weights/ reads as the exact delta s·B·A over its base, and any PEFT user can load. The policy
keeps running the plain transformers model (PEFT injects its layers into that model's modules), so
rollouts, log-probs and losses are the same code for full and LoRA fine-tuning. ``lora_dropout`` is 0:
the rollout and the update of one step must see the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import GraftkitError

#: ``--lora-targets`` shorthands.
TARGET_SETS = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "qv": ("q_proj", "v_proj"),
    "all-linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}


@dataclass(frozen=True)
class LoraSpec:
    """The adapter a run trains."""

    r: int
    alpha: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.r


def lora_spec(r: int, alpha: float, targets: str) -> LoraSpec | None:
    """``None`` for full fine-tuning (``r`` = 0), else the validated spec (targets: a shorthand of
    :data:`TARGET_SETS` or a comma list of module names)."""
    if r < 0 or not alpha > 0:
        raise GraftkitError(f"--lora-r {r} must be ≥ 0 and --lora-alpha {alpha} > 0", "e.g. --lora-r 8 --lora-alpha 16")
    if r == 0:
        return None
    names = TARGET_SETS.get(targets) or tuple(t.strip() for t in targets.split(",") if t.strip())
    if not names:
        raise GraftkitError("--lora-targets names no module", f"use {', '.join(TARGET_SETS)} or module names")
    return LoraSpec(r, float(alpha), names)


def check_lora_base(spec: LoraSpec | None, init) -> None:
    """An adapter is trained over a full model folder: refuse a LoRA adapter as ``--init`` of a LoRA run."""
    from pathlib import Path

    if spec is not None and init is not None and (Path(init) / "adapter_config.json").is_file():
        raise GraftkitError(f"--init {init} is a LoRA adapter; --lora-r trains a new adapter over a full model folder",
                            "pass the full model as --init (or drop --lora-r to fine-tune the merged model fully)")


def add_lora(model, spec: LoraSpec):
    """Inject ``spec``'s adapters into ``model`` (in place); returns the PEFT model that holds them.
    Only the adapters require gradients afterwards."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise GraftkitError("--lora-r needs PEFT", "pip install peft") from None
    have = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in spec.targets if t not in have]
    if missing:
        raise GraftkitError(f"--lora-targets {', '.join(missing)}: {type(model).__name__} has no such module",
                            f"choose among {', '.join(sorted(h for h in have if h.endswith('proj')))}")
    import warnings

    cfg = LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0,
                     bias="none", task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # PEFT asks the model about gradient checkpointing by a deprecated name
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, cfg)


def adapter_state(peft_model) -> dict:
    """The adapter's tensors under PEFT's file names (what ``adapter_model.safetensors`` holds)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}


def load_adapter_state(peft_model, tensors: dict) -> None:
    """Set the adapter's tensors from a saved ``adapter_model.safetensors`` (a resumed run)."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, tensors)
    bad = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if bad:
        raise GraftkitError(f"the checkpoint's adapter has tensors this run's adapter lacks: {bad[0]}",
                            "resume with the same --lora-r and --lora-targets")
