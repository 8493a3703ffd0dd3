"""``graftkit report`` and ``graftkit results``: a run's HTML report, and its list of results (or CSV tables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import CommandConfig, OnProgress, no_progress, opt
from ..core.errors import GraftkitError
from ..results.layout import RunLayout, current_run
from ..results.store import scan_results


@dataclass(frozen=True, kw_only=True)
class ReportConfig(CommandConfig):
    """``graftkit report``: one self-contained HTML page of a run's results."""

    command = "report"
    run: Path | None = opt(None, argument=True)
    """Run folder (default: the current run)."""
    out: Path | None = opt(None, flags=("--out",))
    """HTML file (default: RUN/report.html)."""
    screenshot: Path | None = opt(None, flags=("--screenshot",))
    """Also save a PNG of the page rendered in headless Chromium."""


def run_report(cfg: ReportConfig, on_progress: OnProgress = no_progress) -> dict[str, Any]:
    """Write the report (and the screenshot); returns the page's path, sections, figures, notes and size."""
    from .report import write_report

    run = cfg.run or current_run()
    dest = cfg.out or RunLayout(run).report
    rep = write_report(run, dest, on_progress=on_progress)
    if cfg.screenshot is not None:
        from .browser import screenshot

        screenshot(dest, cfg.screenshot)
    return {"path": str(dest), "run": str(run), "sections": list(rep.sections), "absent": list(rep.absent),
            "figures": rep.n_figures, "notes": list(rep.notes), "bytes": len(rep.html.encode()),
            "screenshot": str(cfg.screenshot) if cfg.screenshot else None}


@dataclass(frozen=True, kw_only=True)
class ResultsConfig(CommandConfig):
    """``graftkit results``: what results a run holds, optionally exported as tidy CSV tables."""

    command = "results"
    run: Path | None = opt(None, argument=True)
    """Run folder (default: the current run)."""
    csv: Path | None = opt(None, flags=("--csv",))
    """Export every array of every result as a tidy CSV file into this folder."""


def run_results(cfg: ResultsConfig) -> dict[str, Any]:
    """Per result of the run: kind, file (relative to the run), created, dimensions, arrays; the files that
    could not be read (``damaged``: file and reason); and the CSV files written (``csv``: None without
    ``cfg.csv``)."""
    from .tables import export_csv

    run = cfg.run or current_run()
    if not run.is_dir():
        raise GraftkitError(f"{run}: no such run folder", "pass a run folder (e.g. runs/demo), or run `graftkit demo`")
    rows = []
    found, damaged = scan_results(run)
    for r, res in found:
        path = Path(r["path"])
        rows.append({"kind": r["kind"], "file": str(path.relative_to(run) if path.is_relative_to(run) else path),
                     "created": r["created"], "dims": {d: len(c) for d, c in res.coords.items()},
                     "arrays": list(res.data)})
    written = export_csv(run, cfg.csv) if cfg.csv is not None else None
    return {"run": str(run), "results": rows, "csv": written,
            "damaged": [{"file": str(d.path.relative_to(run) if d.path.is_relative_to(run) else d.path),
                         "reason": d.reason} for d in damaged]}
