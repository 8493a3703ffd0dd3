"""Where a model runs and in what precision: ``--device`` and ``--dtype`` (a leaf: torch is imported lazily).

- ``--device auto`` is the first CUDA device when torch sees one, else the CPU; ``cuda`` is ``cuda:0``;
  ``cuda:N`` must exist. A CUDA request on a machine without CUDA is one error, before any model loads.
- ``--dtype auto`` is the checkpoint's stored floating dtype on a GPU (bf16 stays bf16) and float32 on
  the CPU; ``float32``, ``bfloat16`` and ``float16`` are what they say, on either device (bfloat16 on a
  GPU that lacks it is an error).
- Evaluation runs the model's weights in that dtype (logits and log-probs are always taken in float32).
  Training keeps float32 master weights and optimiser state and runs forward and backward passes under
  ``torch.autocast`` in the compute dtype (:data:`TRAINING_CONVENTION`, recorded in graftkit.json); its
  checkpoints are written in ``--save-dtype``.
- Sampling draws each episode's uniforms from its own CPU generator, so a sampled episode is the same on
  every device and batch (up to the arithmetic of the device itself).
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

from .errors import GraftkitError

if TYPE_CHECKING:
    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")

TRAINING_CONVENTION = ("float32 master weights and AdamW state; forward and backward under torch.autocast in the "
                       "compute dtype (none in float32); log-probs and losses in float32; the checkpoint cast to "
                       "save_dtype when written")


def check_device(device: str, flag: str = "--device") -> None:
    """Validate the spelling of a device (no torch import): auto, cpu, cuda or cuda:N."""
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise GraftkitError(f"{flag} {device!r} is not a device", "use auto, cpu, cuda or cuda:N")


def check_dtype(dtype: str, flag: str = "--dtype", choices=DTYPES) -> None:
    if dtype not in choices:
        raise GraftkitError(f"{flag} {dtype!r} is not an option", f"use one of {', '.join(choices)}")


def resolve_device(device: str = "auto", flag: str = "--device") -> "torch.device":
    """The torch device ``device`` names (see the module docstring)."""
    import torch

    check_device(device, flag)
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise GraftkitError(f"{flag} {device}: torch sees no CUDA device on this machine "
                            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})",
                            f"use {flag} cpu, or {flag} auto to take a GPU only where there is one")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise GraftkitError(f"{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s)",
                            f"use cuda:0 … cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


def torch_dtype(name: str) -> "torch.dtype":
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def resolve_dtype(dtype: str, device: "torch.device", stored: "torch.dtype | None" = None,
                  flag: str = "--dtype") -> "torch.dtype":
    """The dtype a model runs in on ``device``: ``auto`` is ``stored`` (the checkpoint's floating dtype)
    on a GPU and float32 on the CPU; bfloat16 on a GPU without it is an error."""
    import torch

    check_dtype(dtype, flag)
    if dtype == "auto":
        floating = (torch.float32, torch.bfloat16, torch.float16)
        out = stored if device.type != "cpu" and stored in floating else torch.float32
    else:
        out = torch_dtype(dtype)
    if out == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise GraftkitError(f"{flag} bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16",
                            f"use {flag} float16 or float32")
    return out


def training_dtype(dtype: str, device: "torch.device", flag: str = "--dtype") -> "torch.dtype":
    """Training's compute dtype: ``auto`` is bfloat16 on a GPU that has it (float16 has no loss scaling
    here, so it is only what the user asks for), float32 on the CPU."""
    import torch

    check_dtype(dtype, flag)
    if dtype == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return resolve_dtype(dtype, device, flag=flag)


def autocast(device: "torch.device", dtype: "torch.dtype"):
    """``torch.autocast`` in ``dtype`` on ``device``, or nothing for float32 (training's compute dtype)."""
    import torch

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def describe(device: "torch.device", dtype: "torch.dtype") -> dict:
    """What a result records about where its model ran."""
    import torch

    out = {"device": str(device), "dtype": dtype_name(dtype), "torch": torch.__version__}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
