"""graftkit from Python: one function per command, with the command's options as keyword arguments.

Each function builds the command's frozen config (so a bad option is the same one-line
:class:`~graftkit.core.errors.GraftkitError` the command line gives) and calls the same ``run_*`` function
the command line and the study call; results come back as typed views, ready for ``.to_xarray()``::

    import graftkit as gk

    d = gk.delta("runs/demo/degrade-s0")                  # base: the SFT parent recorded in graftkit.json
    d.group_shares(0)                                      # {"embed": 0.7, "attn": 0.1, ...}
    ev = gk.eval("runs/demo/sft", tasks="mastered", seeds=5)
    policy = gk.load_policy("runs/demo/sft")
    with gk.grafted(policy, base="runs/demo/sft", rl="runs/demo/degrade-s0", groups=["attn", "mlp"]):
        my_evaluation(policy)                              # the graft, in place; restored bit for bit after

``progress=True`` draws a progress bar (rich) for long work. ``graftkit.graft`` and ``graftkit.rank`` stay
the packages they are, and are callable too: ``gk.graft(...)`` and ``gk.rank(...)`` run the commands.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from .core.config import OnProgress, no_progress

PathLike = str | os.PathLike


def _bars(progress: bool) -> OnProgress:
    if not progress:
        return no_progress
    from rich.progress import Progress

    bar = Progress(transient=True)
    ids: dict[str, int] = {}

    def on_progress(what: str, advance: int, total: int, unit: str) -> None:
        if what not in ids:
            bar.start()
            ids[what] = bar.add_task(what, total=total)
        bar.advance(ids[what], advance)
        if all(t.finished for t in bar.tasks):
            bar.stop()

    return on_progress


def callable_module(module, fn) -> None:
    """Make ``module`` (a package that shares a command's name) callable as that command's function."""
    module.__class__ = type(f"{module.__name__}.command", (type(module),), {"__call__": staticmethod(fn)})


def _many(paths: PathLike | Sequence[PathLike]) -> tuple[Path, ...]:
    return (Path(paths),) if isinstance(paths, (str, os.PathLike)) else tuple(Path(p) for p in paths)


def _groups(groups: str | Sequence[str] | None) -> str | None:
    return groups if groups is None or isinstance(groups, str) else ",".join(groups)


def delta(rl: PathLike | Sequence[PathLike], base: PathLike | None = None, *, progress: bool = False, **options):
    """``graftkit delta``: where the RL checkpoint(s) moved the weights; returns a :class:`~graftkit.graft.DeltaResult`."""
    from .graft.anatomy import DeltaConfig, run_delta

    return run_delta(DeltaConfig(rl=_many(rl), base=base, **options), _bars(progress))


def graft(rl: PathLike, groups: str | Sequence[str] | None = None, *, progress: bool = False, **options):
    """``graftkit graft``: an exported graft (``out_dir=...``; returns its summary), or with ``eval_=True`` /
    ``sweep="single" | "loo" | "factorial" | "layers" | "alpha"`` in-place grafts evaluated on identical
    episodes (returns the experiments, whose ``.sweeps`` are :class:`~graftkit.graft.SweepResult` views; with
    ``all_checkpoints=True`` one per checkpoint of a trainer's output_dir, keyed by its label, and ``.steps``)."""
    from .graft.commands import GraftConfig, run_graft

    return run_graft(GraftConfig(rl=rl, groups=_groups(groups), **options), _bars(progress))


def eval(model: PathLike, *, progress: bool = False, **options):  # noqa: A001 - the command's name
    """``graftkit eval``: success per task with intervals (``compare_to=`` for the paired verdict); returns
    the run, whose ``.results["model"]`` is an :class:`~graftkit.evaluation.commands.EvalResult`."""
    from .evaluation.commands import EvalConfig, run_eval

    return run_eval(EvalConfig(model=model, **options), _bars(progress))


def kl(model: PathLike, base: PathLike | None = None, *, progress: bool = False, **options):
    """``graftkit kl``: per-token KL between a policy and its base (default: the recorded SFT parent), each on its
    own rollouts, and the tokens and actions that moved; returns the run, whose ``.result`` is a
    :class:`~graftkit.evaluation.kl.KLResult` (with ``all_checkpoints=True`` a trainer's output_dir is every one of
    its checkpoints: a :class:`~graftkit.evaluation.kl.KLTrajectory`, whose ``.runs`` are one run per step)."""
    from .evaluation.kl import KLConfig, run_kl

    return run_kl(KLConfig(model=model, base=base, **options), _bars(progress))


def headroom(model: PathLike, *, progress: bool = False, **options):
    """``graftkit headroom``: greedy vs sampled success and pass@k per task; ``.result`` is a
    :class:`~graftkit.evaluation.commands.HeadroomResult`."""
    from .evaluation.commands import HeadroomConfig, run_headroom

    return run_headroom(HeadroomConfig(model=model, **options), _bars(progress))


def rank(model: PathLike | Sequence[PathLike] = (), *, progress: bool = False, **options) -> dict:
    """``graftkit rank``: spectral ranks per layer of weights, deltas (``what="delta"``) or activations
    (``what="activations"``); returns the summary, whose models' ``result_file`` open as
    :class:`~graftkit.rank.RankResult` (``RankResult.read``)."""
    from .rank.commands import RankConfig, run_rank

    return run_rank(RankConfig(model=_many(model) if model else (), **options), _bars(progress))


def couple(run: PathLike | None = None, **options) -> dict:
    """``graftkit couple``: per-layer rank vs success across a run's checkpoints, and the both-directions test."""
    from .rank.commands import CoupleConfig, run_couple

    return run_couple(CoupleConfig(run=run, **options))


def train_sft(out: PathLike, *, force: bool = False, progress: bool = False, **options):
    """``graftkit train sft``: SFT on oracle demonstrations; returns the policy folder and its
    :class:`~graftkit.train.commands.TrainingCurves` (``.policy``, ``.curves``)."""
    from .train.commands import run_train_sft
    from .train.configs import SFTConfig

    return run_train_sft(SFTConfig(out=out, **options), _bars(progress), force=force)


def train_grpo(init: PathLike, out: PathLike, *, resume: bool = False, force: bool = False, progress: bool = False,
               **options):
    """``graftkit train grpo``: GRPO from an SFT policy with every knob of the control grid; returns the
    policy folder and its :class:`~graftkit.train.commands.TrainingCurves`."""
    from .train.configs import GRPOConfig
    from .train.commands import run_train_grpo

    return run_train_grpo(GRPOConfig(init=init, out=out, **options), _bars(progress), resume=resume, force=force)


def report(run: PathLike | None = None, **options) -> dict:
    """``graftkit report``: the run's self-contained HTML report; returns its path, sections and notes."""
    from .figures.commands import ReportConfig, run_report

    return run_report(ReportConfig(run=run, **options))


def load_policy(path: PathLike, **options):
    """The policy in an HF folder (its ``.model`` and ``.tokenizer``), as every command that runs a model loads it."""
    from .agent import load_policy as load

    return load(Path(path), **options)


@contextmanager
def grafted(model, *, base: PathLike, rl: PathLike, groups: str | Sequence[str], layers: str = "all",
            alpha: float = 1.0, reverse: bool = False, no_pickle: bool = False,
            allow_pickle: bool = False) -> Iterator[object]:
    """``with grafted(model, base=SFT, rl=RL, groups=["attn", "mlp"]):`` — inside the block ``model`` (a
    torch module loaded from ``base``, or a policy from :func:`load_policy`) holds
    θ_base + α·M⊙(θ_rl − θ_base) for the selected groups and layers; after it, exactly the base again, also
    when the block raises. Yields the in-place session (:class:`~graftkit.graft.InPlaceGraft`)."""
    from .graft import GraftSpec, grafted as in_place, plan_graft
    from .core.files import require
    from .weights import open_checkpoint, open_rl

    require(base, "base=", "the base model: an HF folder or a .safetensors file")
    require(rl, "rl=", "an HF folder, a .safetensors file or a LoRA adapter")
    b = open_checkpoint(base, no_pickle=no_pickle)
    r = open_rl(rl, b, no_pickle=no_pickle)
    plan = plan_graft(b.taxonomy(), GraftSpec.parse(_groups(groups), layers, alpha, reverse))
    with in_place(getattr(model, "model", model), b, r, plan) as session:
        yield session
