"""What the layout readers share."""

from __future__ import annotations


def load_error_cause(exc: Exception) -> str:
    """The line of a failed ``torch.load`` that says why (weights_only's "WeightsUnpickler error: Unsupported global:
    …", not its boilerplate first line)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "WeightsUnpickler error" in ln), lines[0] if lines else type(exc).__name__)
    return why[:300]
