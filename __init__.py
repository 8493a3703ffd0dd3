"""graftkit: did GRPO teach the model anything, or just reshape it — and where in the weights?

The public API, re-exported. One function per command (:mod:`graftkit.api`), with the command's options
as keyword arguments; results as typed views and as xarray datasets; every report figure as a function
(:mod:`graftkit.figures`); see ``docs/tour.ipynb``::

    import graftkit as gk

    d = gk.delta("runs/demo/degrade-s0")                    # base: the SFT parent recorded in graftkit.json
    gk.figures.anatomy_heatmap(d).show()                     # the report's layer × group heatmap
    with gk.grafted(policy := gk.load_policy("runs/demo/sft"), base="runs/demo/sft",
                    rl="runs/demo/degrade-s0", groups=["attn", "mlp"]):
        my_evaluation(policy)                                # the graft in place, restored bit for bit after
    ev = gk.eval("runs/demo/sft", tasks="mastered", seeds=5)
    gk.open_result("runs/demo/results/delta.h5")             # an xarray.Dataset (or read_result / DeltaResult.read)

Underneath each function is the command's frozen config and one run function, the same ones the command
line and the study (:func:`run_study`) call:

| command | config | run | result view |
|---|---|---|---|
| inspect | :class:`InspectConfig` | :func:`run_inspect` | (a dict) |
| delta | :class:`DeltaConfig` | :func:`run_delta` | :class:`DeltaResult` |
| graft | :class:`GraftConfig` | :func:`run_graft` | :class:`SweepResult`, :class:`DissociationResult` |
| eval, headroom | :class:`EvalConfig`, :class:`HeadroomConfig` | :func:`run_eval`, :func:`run_headroom` | :class:`EvalResult`, :class:`HeadroomResult` |
| kl | :class:`KLConfig` | :func:`run_kl` | :class:`KLResult` |
| rank, couple | :class:`RankConfig`, :class:`CoupleConfig` | :func:`run_rank`, :func:`run_couple` | :class:`RankResult`, :class:`CouplingResult` |
| train sft, train grpo, sweep | :class:`SFTConfig`, :class:`GRPOConfig`, :class:`SweepConfig` | :func:`run_train_sft`, :func:`run_train_grpo`, :func:`run_sweep_grid` | :class:`TrainingCurves` |
| report, results | :class:`ReportConfig`, :class:`ResultsConfig` | :func:`run_report`, :func:`run_results` | |
| demo | :class:`StudyConfig` | :func:`run_study` | the findings (:mod:`graftkit.study.findings`) |

Underneath: ``weights`` (checkpoints, PEFT LoRA, the tensor taxonomy), ``graft`` (delta anatomy, the
splice, export and in-place grafts, sweeps and attribution), ``rank`` (spectral measures, weight /
delta / activation ranks, coupling), ``agent``, ``webenv`` and ``verifiable`` (the policy, the web tasks and the
verifiable ones), ``train`` (SFT, GRPO and its variants), ``evaluation`` (eval, headroom and kl), ``stats`` (paired
statistics), ``results`` (labelled HDF5 results and the run folder's layout), ``figures`` (the HTML report and CSV
export), ``study`` (the study's design, findings and the demo's pipeline) and ``core`` (errors, configs, files,
progress). Importing graftkit loads neither torch nor plotly; running a model or drawing a figure does.
"""

from ._version import __version__
from . import api as _api
from .api import couple, delta, eval, grafted, headroom, kl, load_policy, report, train_grpo, train_sft  # noqa: A004
from .core.config import CommandConfig, OnProgress
from .core.errors import GraftkitError
from .evaluation.commands import EvalConfig, EvalResult, HeadroomConfig, HeadroomResult, run_eval, run_headroom
from .evaluation.kl import KLConfig, KLResult, run_kl
from .figures.commands import ReportConfig, ResultsConfig, run_report, run_results
from .graft import (
    DeltaConfig,
    DeltaResult,
    DissociationResult,
    GraftPlan,
    GraftSpec,
    SweepResult,
    delta_anatomy,
    export_graft,
    plan_graft,
    run_delta,
    splice,
)
from .graft.commands import GraftConfig, run_graft
from .rank.commands import CoupleConfig, RankConfig, run_couple, run_rank
from .rank.coupling import CouplingResult
from .rank.results import RankResult
from .results.layout import current_run
from .results.store import Result, list_results, open_result, open_run, read_result, write_result
from .demo import run_study
from .study.pipeline import StudyConfig
from .train.configs import GRPOConfig, SFTConfig, SweepConfig
from .train.commands import TrainingCurves, run_sweep_grid, run_train_grpo, run_train_sft
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
from .weights.commands import InspectConfig, run_inspect

from . import figures, graft, rank  # noqa: E402 - graft and rank are made callable as their commands below

_api.callable_module(graft, _api.graft)
_api.callable_module(rank, _api.rank)


def __getattr__(name: str):
    # The report builders live with the figures, which import plotly: loaded on first use (figures/__init__.py).
    if name in ("build_report", "write_report", "export_csv"):
        return getattr(figures, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__", "CommandConfig", "OnProgress", "GraftkitError",
    # one function per command (graft and rank are their packages, callable): gk.delta(...), gk.graft(...)
    "delta", "graft", "eval", "headroom", "kl", "rank", "couple", "train_sft", "train_grpo", "report", "grafted",
    "load_policy", "figures",
    # commands: config, run function, result view
    "InspectConfig", "run_inspect", "DeltaConfig", "run_delta", "DeltaResult", "GraftConfig", "run_graft",
    "SweepResult", "DissociationResult", "EvalConfig", "run_eval", "EvalResult", "HeadroomConfig", "run_headroom",
    "HeadroomResult", "KLConfig", "run_kl", "KLResult", "RankConfig", "run_rank", "RankResult", "CoupleConfig", "run_couple", "CouplingResult",
    "SFTConfig", "run_train_sft", "GRPOConfig", "run_train_grpo", "SweepConfig", "run_sweep_grid",
    "TrainingCurves", "ReportConfig", "run_report", "ResultsConfig", "run_results", "StudyConfig", "run_study",
    # the library underneath
    "GraftPlan", "GraftSpec", "delta_anatomy", "export_graft", "plan_graft", "splice", "Result", "current_run",
    "list_results", "read_result", "write_result", "open_result", "open_run", "Checkpoint", "Taxonomy",
    "apply_lora", "check_pair", "classify",
    "open_checkpoint", "open_rl", "parse_layers", "save_model", "write_checkpoint", "build_report", "write_report",
    "export_csv",
]
