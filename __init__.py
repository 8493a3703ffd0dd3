"""graftkit: did GRPO teach the model anything, or just reshape it — and where in the weights?

The public API, re-exported. Subpackages: ``weights`` (checkpoints and the tensor taxonomy),
``graft`` (delta anatomy, splice, export), ``store`` (labelled HDF5 results), ``figures`` (the HTML
report and CSV export).
"""

from ._version import __version__
from .errors import GraftkitError
from .figures import build_report, export_csv, write_report
from .graft import GraftPlan, GraftSpec, delta_anatomy, export_graft, plan_graft, splice
from .store import Result, list_results, read_result, write_result
from .weights import (
    Checkpoint,
    Taxonomy,
    apply_lora,
    check_pair,
    classify,
    open_checkpoint,
    open_rl,
    parse_layers,
    save_model,
    write_checkpoint,
)

__all__ = [
    "__version__", "GraftkitError", "GraftPlan", "GraftSpec", "delta_anatomy", "export_graft",
    "plan_graft", "splice", "Result", "list_results", "read_result", "write_result", "Checkpoint",
    "Taxonomy", "apply_lora", "check_pair", "classify", "open_checkpoint", "open_rl", "parse_layers",
    "save_model", "write_checkpoint", "build_report", "write_report", "export_csv",
]
