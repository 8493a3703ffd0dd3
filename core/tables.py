"""What a command prints, as data: a :class:`Table` is a title, its columns as header → cell(row) (each header
written beside the one function that fills its column, so no reordering can put one column's values under
another's header), the rows, and which columns align left or wrap. A command whose display its producer owns
(``graft`` sweeps, ``kl``) builds its tables here from its ``--json`` payload; the command line draws them with
rich (``cli._specs``), escaping markup, so every title, header and cell is plain text. This module is a leaf.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence


class Table(NamedTuple):
    """One printed table."""

    title: str
    columns: Mapping[str, Callable[[Any], str]]
    """Header → the function that writes its cell from a row."""
    rows: Sequence
    left: tuple[str, ...] = ()
    """Headers of the left-aligned columns (the others align right)."""
    fold: tuple[str, ...] = ()
    """Headers of the columns that wrap (long text)."""


def bounds_text(b, *, scale: float = 1.0, spec: str = ".4g", unit: str = "") -> str:
    """(estimate, low, high) as ``E{unit} [L, H]``, each ``scale·x`` written by the format ``spec``; ``—`` when
    a bound is missing or not finite. ``spec="+.1f", scale=100``: percentage points of a difference."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return "—"
    e, lo, hi = (format(scale * v, spec) for v in b)
    return f"{e}{unit} [{lo}, {hi}]"


def points(b) -> str:
    """A difference of rates or fractions, in signed percentage points: ``+1.0 [-2.0, +3.0]``."""
    return bounds_text(b, scale=100.0, spec="+.1f")


__all__ = ["Table", "bounds_text", "points"]
