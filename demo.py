"""``graftkit demo``: the study's stages (:mod:`graftkit.study.pipeline`), then its report (:mod:`graftkit.figures`).

The study computes and the figures draw; this is the one place that does both, a layer above each, so no arrow of
the house runs from the study up to the figures.
"""

from __future__ import annotations

import time
from typing import Callable

from .core.config import OnProgress, no_progress
from .study.pipeline import StudyConfig, run_stages


def run_study(cfg: StudyConfig, on_progress: OnProgress = no_progress,
              on_stage: Callable[[str, str, str], None] = lambda name, status, detail: None) -> dict:
    """Every stage in order (finished ones are skipped), then the report; returns the findings and the output
    paths. ``on_stage(name, status, detail)``: a stage starts, is done, or is skipped (done before)."""
    from .figures import write_report  # plotly loads when a figure is drawn, not with graftkit

    t0 = time.perf_counter()
    info = run_stages(cfg, on_progress, on_stage)
    on_stage("report", "start", "")
    write_report(info["out"], info["report"])
    on_stage("report", "done", info["report"])
    info["seconds"] = time.perf_counter() - t0
    return info
