"""The splice itself: θ = θ_base + c · (θ_rl − θ_base), one tensor at a time.

c = 0 returns the base tensor and c = 1 the RL tensor, untouched (bit-exact); any other c computes in
float32 (float64 for float64 tensors) and rounds once to the tensor's dtype. Large tensors are processed
in row chunks so memory stays bounded by the chunk, not the tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ..core.errors import GraftkitError

if TYPE_CHECKING:
    import torch

CHUNK_ELEMENTS = 1 << 22  # 4M elements: 16 MB of float32 per operand


def splice(base: torch.Tensor, rl: torch.Tensor, c: float) -> torch.Tensor:
    """θ_base + c · (θ_rl − θ_base), exact at c ∈ {0, 1}. Shapes and dtypes must match."""
    if c == 0:
        return base
    if c == 1:
        return rl
    import torch

    if not base.dtype.is_floating_point:
        raise GraftkitError(
            f"cannot scale a delta of a {base.dtype} tensor by {c}", "use --alpha 0 or 1 for integer tensors"
        )
    work = torch.promote_types(base.dtype, torch.float32)
    b = base.to(work)
    return (b + c * (rl.to(work) - b)).to(base.dtype)


def row_chunks(t: torch.Tensor, max_elements: int = CHUNK_ELEMENTS) -> Iterator[slice]:
    """Slices over the first dimension covering ``t`` with about ``max_elements`` each."""
    if t.dim() == 0:
        yield slice(None)
        return
    per_row = max(1, t[0].numel()) if t.shape[0] else 1
    step = max(1, max_elements // per_row)
    for i in range(0, t.shape[0], step):
        yield slice(i, i + step)


def splice_chunks(base: torch.Tensor, rl: torch.Tensor, c: float) -> Iterator[torch.Tensor]:
    """:func:`splice` row chunk by row chunk; concatenated, the chunks are the spliced tensor."""
    for s in row_chunks(base):
        yield splice(base[s], rl[s], c)
