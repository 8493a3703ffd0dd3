"""Results as tidy tables: every array of every result of a run, one CSV file per array.

A table has one column per dimension of the array, holding that dimension's coordinate labels, and a
``value`` column: one row per element (0-d arrays: one row, one column). Floats are written with
Python's ``repr`` (shortest round-trip form; ``nan``/``inf`` as such), so a reader recovers every value
exactly. Files are named ``<result file stem>.<array>.csv`` (result files in sub-folders of the run keep
their relative path, ``/`` written as ``__``) and written atomically.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ..core.errors import GraftkitError
from ..core.files import check_folder_dest, translated, write_atomic
from ..results.store import Result, scan_results, tidy_columns


def _cell(v: object) -> object:
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


def tidy_rows(res: Result, name: str) -> tuple[list[str], Iterator[list[object]]]:
    """Header and rows of array ``name``: its dimension labels (one column each), then ``value``
    (:func:`~graftkit.results.store.tidy_columns`, with each cell as CSV text)."""
    header, cols = tidy_columns(res, name)
    return [*header[:-1], "value"], ([_cell(c[i]) for c in cols] for i in range(len(cols[-1])))


def export_csv(run_dir: str | os.PathLike, out_dir: str | os.PathLike) -> list[dict[str, str]]:
    """Write every array of every result under ``run_dir`` to ``out_dir``; returns what was written.

    ``out_dir`` may not be a folder that holds any of the run's result files (never write into an input
    folder)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise GraftkitError(f"{run_dir}: no such run folder", "pass a run folder (e.g. runs/demo)")
    check_folder_dest(out_dir, "--csv")
    found = scan_results(run_dir)[0]  # a damaged file has no arrays to export (`graftkit results` names it)
    inputs = {Path(r["path"]).resolve().parent for r, _ in found}
    if out_dir.resolve() in inputs:
        raise GraftkitError(f"--csv {out_dir}: this folder holds the run's result files",
                            "pick a separate folder, e.g. RUN/csv")
    with translated(out_dir, "--csv"):
        out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for row, res in found:
        path = Path(row["path"])
        stem = "__".join(path.relative_to(run_dir).with_suffix("").parts) if path.is_relative_to(run_dir) else path.stem
        for name in res.data:
            header, rows = tidy_rows(res, name)
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)
            dest = out_dir / f"{stem}.{name}.csv"
            write_atomic(dest, buf.getvalue(), flag="--csv", what="the table")
            written.append({"result": str(path), "kind": row["kind"], "array": name, "dims": ",".join(res.dims(name)),
                            "file": str(dest)})
    return written
