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


def percent(x: float) -> str:
    """A share as a table shows it, ``37%`` (— where it is unknown)."""
    return "—" if x is None or x != x else f"{100 * x:.0f}%"


def items_text(row: Mapping) -> str:
    """A row's items as a table shows them: the distinct items played, and for a user's file (``file_items`` in the
    row) ``/`` its number of items: ``32/64`` is half the file."""
    if "items" not in row:
        return "?"
    return f"{row['items']}/{row['file_items']}" if row.get("file_items") is not None else str(row["items"])


__all__ = ["Table", "bounds_text", "items_text", "percent", "points"]
