"""Plotly figures of a run's results and the self-contained HTML report.

Reads results only through ``store`` (and computes intervals with ``stats``). One small pure builder per
figure (results in, ``plotly.graph_objects.Figure`` out) lives in the module of its topic; ``report``
plans the sections of a run and renders the page; ``tables`` exports results as tidy CSV; ``browser``
renders a report in headless Chromium (screenshots, and the browser test).
"""

from .report import Report, build_report, load_run, make_report, plan_report, write_report
from .tables import export_csv, tidy_rows

__all__ = ["Report", "build_report", "load_run", "make_report", "plan_report", "write_report", "export_csv",
           "tidy_rows"]
