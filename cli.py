"""The ``graftkit`` command line: thin commands, each builds a config and calls one function.

Every command prints a readable summary, or JSON with ``--json``; progress goes to stderr; bad input is
one line on stderr (what, which file or tensor, how to fix) and exit status 2, never a traceback.
"""

from __future__ import annotations

import inspect as inspect_
import json
import math
import os
import sys
import time
from pathlib import Path
from dataclasses import fields
from typing import Callable, Iterable

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._version import __version__
from .core.config import cli_parameters
from .core.errors import GraftkitError
from .core.files import fmt_size, os_error
from .core.progress import Bars, err, step_printer
from .results.layout import mark_current_run
from .results.store import CleanConfig, run_clean
from .weights.commands import InspectConfig, run_inspect
from .weights.gguf import ImportConfig, run_import
from .core.files import require
from .graft.anatomy import (LABELS as DELTA_LABELS, DeltaConfig, DeltaResult, overlap_tables, precision_sentence,
                            run_delta)
from .train.commands import run_sweep_grid, run_train_grpo, run_train_sft, sweep_plan
from .train.configs import GRPOConfig, SFTConfig, SweepConfig
from .demo import run_study
from .study.pipeline import StudyConfig
from .figures.commands import ReportConfig, ResultsConfig, run_report, run_results
from .graft.forgetting import ForgettingConfig, run_forgetting
from .graft.path import TrajectoryConfig, run_trajectory
from .graft.commands import GraftConfig, GraftExperiments, run_graft, sweep_tables, trajectory_tables
from .core.tables import points as _pts
from .rank.commands import CoupleConfig, RankConfig, run_couple, run_rank
from .rank.results import principal_tables
from .evaluation.commands import EvalConfig, HeadroomConfig, run_eval, run_headroom
from .evaluation.kl import KLConfig, run_kl

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Weight-delta analysis of RL fine-tunes: where did GRPO move the weights, and did it matter?",
)
# Pipes and files get wide tables (rich's default of 80 columns would truncate tensor and run names).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def command(parent: typer.Typer, cls: type, name: str | None = None, *, defaults: dict | None = None,
            extra: tuple[inspect_.Parameter, ...] = (), as_json: bool = True) -> Callable:
    """Register ``render(cfg, **extras)`` as a command whose options are generated from ``cls``'s fields
    (plus ``extra`` options that are no config field, and ``--json``). Bad input, the config's validation
    included, is one line on stderr and exit 2."""

    def deco(render: Callable) -> Callable:
        params = cli_parameters(cls, defaults) + list(extra)
        if as_json:
            params.append(flag("as_json", "--json", "Print JSON."))
        names = {f.name for f in fields(cls)}

        def callback(**kw):
            try:
                cfg = cls(**{k: v for k, v in kw.items() if k in names})
                return render(cfg, **{k: v for k, v in kw.items() if k not in names})
            except (GraftkitError, OSError) as e:  # the operating system's faults too: one line, exit 2
                e = os_error(e, doing="accessing") if isinstance(e, OSError) else e
                err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
                raise typer.Exit(e.exit_code) from None

        callback.__signature__ = inspect_.Signature(params)
        callback.__doc__, callback.__name__ = render.__doc__, render.__name__
        parent.command(name)(callback)
        return render

    return deco


def flag(name: str, option: str, help: str, default=False, annotation=bool) -> inspect_.Parameter:
    """A command-line option that is no config field (``--json``, ``--open``, ``--force``)."""
    return inspect_.Parameter(name, inspect_.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=typer.Option(default, option, help=help))


def _print_json(obj) -> None:
    # Strict JSON: NaN/±Inf (an undefined cosine, a ratio over a zero norm) are written as null.
    sys.stdout.write(json.dumps(_finite(obj), indent=2, default=str, allow_nan=False) + "\n")


def _finite(o):
    """numpy values as Python ones, and non-finite floats as None (paths and the rest become strings)."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, np.ndarray)):
        return [_finite(v) for v in (o.tolist() if isinstance(o, np.ndarray) else o)]
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _table(title: str, columns, left=(), fold=(), **kw) -> Table:
    """A table of right-aligned columns, except those named in ``left``; those in ``fold`` wrap."""
    t = Table(title=title, **kw)
    for c in columns:
        t.add_column(c, justify="left" if c in left or c in fold else "right",
                     overflow="fold" if c in fold else "ellipsis")
    return t


def _rows_table(title: str, columns: dict[str, Callable], rows: Iterable, left=(), fold=(), **kw) -> Table:
    """A table of ``rows`` whose columns are ``header → cell(row)``: each header is written beside the one
    function that fills its column, so no reordering can put one column's values under another's header."""
    t = _table(title, tuple(columns), left, fold, **kw)
    for row in rows:
        t.add_row(*(cell(row) for cell in columns.values()))
    return t


def _notes(notes) -> None:
    for note in notes:
        out.print(f"note: {escape(note)}", soft_wrap=True)


# ------------------------------------------------------------------------------------------- inspect


@command(app, InspectConfig, "inspect")
def inspect(cfg: InspectConfig, as_json: bool):
    """What every tensor of a checkpoint is: groups, layers, bytes, tied embeddings."""
    info = run_inspect(cfg)
    if as_json:
        return _print_json(info)
    n_dec = info["layers"].get("decoder", 0)
    out.print(_rows_table(
        f"{escape(info['path'])} — {info['family']} table (matched by {info['matched_by']}), {n_dec} decoder layers, "
        f"{'tied' if info['tied_embeddings'] else 'untied'} embeddings",
        {"group": lambda g: g, "tensors": lambda g: str(info["groups"][g]["tensors"]),
         "params": lambda g: f"{info['groups'][g]['params']:,}", "bytes": lambda g: fmt_size(info["groups"][g]["bytes"])},
        info["groups"], left=("group",)))
    if info["band_rule"]:
        out.print(info["band_rule"])
    p = info["precision"]
    out.print(escape(f"precision: {p['dtype']}, {p['source']}"
                     + (f"; below the precision it was trained in: {p['below_trained']}" if p["below_trained"] else "")))
    _notes(info["notes"])


@command(app, ImportConfig, "import")
def import_gguf(cfg: ImportConfig, as_json: bool):
    """Write a GGUF checkpoint (llama.cpp's format, quantised or not) as an HF folder graftkit and transformers read."""
    with Bars() as bars:
        info = run_import(cfg, bars)
    if as_json:
        return _print_json(info)
    quant = ", ".join(f"{n} {k}" for k, n in info["quantisation"].items())
    out.print(f"{escape(str(cfg.source))} ({escape(info['architecture'])}; {escape(quant)} tensors"
              f"{', dequantised' if info['dequantised'] else ''}) → {escape(info['out'])}: {info['params']:,} parameters "
              f"in {info['dtype']}, {info['seconds']:.1f} s")
    _notes(info["notes"])


# --------------------------------------------------------------------------------------------- delta


def _top_table(title: str, labels, values: Callable[[str], np.ndarray], order: np.ndarray, limit: int,
               shown_as=DELTA_LABELS) -> Table:
    """Rows ``order[:limit]`` of ``labels`` with every delta metric, ``values(metric) [row]``; each column is
    named and formatted by the metric's entry in ``shown_as`` (the result's :attr:`DeltaResult.labels`: the
    tolerance column names its tolerance)."""
    def column(metric: str) -> Callable[[int], str]:
        v, shown = values(metric), shown_as[metric]
        return lambda i: shown.cell(v[i])

    return _rows_table(title, {"name": lambda i: escape(str(labels[i])),
                               **{escape(shown.header): column(m) for m, shown in shown_as.items()}},
                       order[:limit], fold=("name",))


@command(app, DeltaConfig, "delta", extra=(flag("top", "--top", "Rows of the largest-movers table.", 15, int),))
def delta(cfg: DeltaConfig, as_json: bool, top: int):
    """Where the RL fine-tune moved the weights: per tensor, layer and group."""
    t0 = time.perf_counter()
    with Bars() as bars:
        d = run_delta(cfg, bars)
    seconds = time.perf_counter() - t0
    _print_json(d.as_json(seconds)) if as_json else _delta_tables(d, top, seconds)
    if not cfg.allow_nonfinite:
        d.check_finite()


def _delta_tables(d: DeltaResult, top: int, seconds: float) -> None:
    shown_as = d.labels

    def total(metric: str, run: int) -> str:
        return shown_as[metric].cell(d.total(metric, run))

    said = set()  # a run that did not move is one line, not tables of zeros
    for i, lab in enumerate(d.runs):
        if (line := d.identical_line(i)) is not None:
            out.print(escape(line), soft_wrap=True)
            said.add(line)
            continue
        out.print(_top_table(f"{escape(lab)} vs {escape(d.base_path)}: groups", d.groups, lambda m: d.group(m, i),
                             np.argsort(-d.group("share", i), kind="stable"), len(d.groups), shown_as))
        out.print(_top_table(f"largest movers (top {min(top, len(d.tensors))} of {len(d.tensors)} tensors)",
                             d.tensors, lambda m: d.tensor(m, i), np.argsort(-d.tensor("share", i), kind="stable"), top,
                             shown_as))
        out.print("total " + ", ".join(f"{shown_as[m].header} {total(m, i)}" for m in ("fro_delta", "rel_delta"))
                  + f"; entries: {total('frac_unchanged', i)} bitwise unchanged, {total('frac_within_tol', i)} with "
                  + escape(d.within_tol))
        out.print(f"precision{f' of {escape(lab)}' if len(d.runs) > 1 else ''}: "
                  + escape(precision_sentence(d.precision(i))))
    if len(d.runs) > 1:
        t = _table("cosine between runs' deltas (all tensors)", ("run", *map(escape, d.runs)), left=("run",),
                   caption="— undefined: a run that did not move has no direction" if said else None)
        for i, lab in enumerate(d.runs):
            t.add_row(escape(lab), *(f"{c:.3f}" if np.isfinite(c) else "—" for c in d.cosine_total()[i]))
        out.print(t)
        _specs(overlap_tables(d.as_json(seconds).get("overlap")))
    _notes(n for n in d.notes if n not in said)
    out.print(f"saved {escape(str(d.path))} ({seconds:.1f} s)")


@command(app, ForgettingConfig, "forgetting")
def forgetting(cfg: ForgettingConfig, as_json: bool):
    """Does KL on the trained task predict forgetting on the others, better than ‖Δ‖, moved entries or Δ's rank?
    Across the run's RL runs, with intervals."""
    got = run_forgetting(cfg)
    _print_json(got.as_json()) if as_json else _specs(got.tables())


@command(app, TrajectoryConfig, "trajectory")
def trajectory(cfg: TrajectoryConfig, as_json: bool):
    """How a run's weights moved from the SFT base, checkpoint by checkpoint: norms, directions, the straight-line
    fit of the path, sparsity at fp32 and bf16 (with --tasks, KL from SFT at every step)."""
    with Bars() as bars:
        got = run_trajectory(cfg, bars)
    _print_json(got.as_json()) if as_json else _specs(got.tables())


# --------------------------------------------------------------------------------------------- graft


@command(app, GraftConfig, "graft")
def graft(cfg: GraftConfig, as_json: bool):
    """Splice the RL model's delta for some groups and layers into the base: θ = θ_base + α·M⊙Δ.

    With --eval or --sweep nothing is written but a result: the base policy is loaded once, each graft is
    written into it in place, evaluated on identical episodes and compared with base and RL."""
    with Bars() as bars:
        got = run_graft(cfg, bars)
    if as_json:
        return _print_json(got.as_json() if isinstance(got, GraftExperiments) else got)
    if isinstance(got, GraftExperiments):
        return _graft_experiment_tables(got)
    if "experiments" in got:  # the plan of a sweep
        out.print(_rows_table(
            f"dry run: {got['sweep']} sweep over {escape(','.join(got['groups']) or 'nothing')} — "
            f"{got['count']} configurations" + (" per run" if cfg.vs else " per checkpoint" if cfg.all_checkpoints
                                                else ""),
            {"config": lambda e: escape(e["label"]), "groups": lambda e: escape(",".join(e["groups"]) or "—"),
             "layers": lambda e: escape(e["layers"]), "α": lambda e: f"{e['alpha']:g}", "role": lambda e: e["role"]},
            got["experiments"], left=("config", "groups", "layers", "role")))
        return _notes(got["notes"])
    selected, total = fmt_size(got["selected_bytes"]), fmt_size(got["total_bytes"])
    sparse = got.get("sparsity")
    entries = "" if sparse is None else (
        f"; the top {sparse['top_frac']:g} of their entries by |Δ| ({sparse['scope']}): {sparse['selected']:,} of "
        f"{sparse['entries']:,} entries, {sparse['changed']:,} of them moved")
    if not got.get("dry_run"):
        _notes(got["notes"])
        n = sum(row["tensors"] for row in got["selected"])
        return out.print(f"grafted {n} tensors ({selected} of {total}){entries} → {escape(got['out'])} in "
                         f"{got['seconds']:.1f} s", soft_wrap=True)
    out.print(_rows_table(
        f"dry run: {'revert in RL' if cfg.reverse else 'graft into base'} "
        f"{escape(','.join(got['spec']['groups']) or 'nothing')} (layers {escape(cfg.layers)}, α={cfg.alpha:g})",
        {"group": lambda r: r["group"], "layer": lambda r: "—" if r["layer"] is None else str(r["layer"]),
         "tensors": lambda r: str(r["tensors"]), "bytes": lambda r: fmt_size(r["bytes"]),
         **({"entries": lambda r: f"{r['selected_entries']:,} of {r['entries']:,}"} if sparse else {})},
        got["selected"], left=("group",)))
    out.print(f"{selected} of {total} selected{entries}", soft_wrap=True)
    _notes(got["notes"])


def _graft_experiment_tables(got: GraftExperiments) -> None:
    j, labels = got.as_json(), got.labels
    if "trajectory" in j:  # --all-checkpoints: one row per step; each step's own tables are in its file and --json
        _specs(trajectory_tables(j))
    else:
        for key, run in j["runs"].items():  # success and/or KL tables (graft.commands.sweep_tables)
            _specs(sweep_tables(run, labels[key], j["seeds"], j["episodes"]))
    dis = j["dissociation"]
    if dis is not None:
        rows = dis["groups"]
        out.print(_rows_table(
            f"double dissociation ({dis['effect']} effects): A = {escape(labels['A'])}, "
            f"B = {escape(labels['B'])} — {'yes' if dis['double_dissociation'] else 'no'}",
            {"group": lambda g: g, "effect A": lambda g: _pts(rows[g]["A"]), "effect B": lambda g: _pts(rows[g]["B"]),
             "A − B": lambda g: _pts(rows[g]["difference"]), "verdict": lambda g: rows[g]["verdict"]},
            rows, left=("group", "verdict")))
        out.print(f"rule: {escape(dis['rule'])}", soft_wrap=True)
    _notes(got.notes)
    for k, f in got.files.items():
        note = f" (resumed {len(got.resumed[k])} configurations)" if got.resumed.get(k) else ""
        out.print(f"saved {escape(f)}{note}")
    out.print(f"{got.seconds:.1f} s")


def _specs(specs) -> None:
    """Tables (:class:`~graftkit.core.tables.Table`) and lines as their producer built them, markup escaped."""
    for t in specs:
        out.print(escape(t), soft_wrap=True) if isinstance(t, str) else out.print(_rows_table(escape(t.title), {
            escape(h): lambda r, c=c: escape(c(r)) for h, c in t.columns.items()}, t.rows, left=t.left, fold=t.fold))


# ------------------------------------------------------------------------------------ eval, headroom


@command(app, EvalConfig, "eval")
def eval_cmd(cfg: EvalConfig, as_json: bool):
    """Success per task with intervals over tasks × seeds × episodes; with --compare, the paired verdict."""
    with Bars() as bars:
        run = run_eval(cfg, bars)
    _print_json(run.as_json(cfg)) if as_json else _specs(run.printed(cfg))


@command(app, KLConfig, "kl")
def kl(cfg: KLConfig, as_json: bool):
    """Per-token KL between a policy and its base, each on its own rollouts (T=1), and what gained or lost probability
    (with --all-checkpoints: every checkpoint of a trainer run, one row per step)."""
    with Bars() as bars:
        run = run_kl(cfg, bars)
    _print_json(run.as_json()) if as_json else _specs(run.tables())


@command(app, HeadroomConfig, "headroom")
def headroom(cfg: HeadroomConfig, as_json: bool):
    """Greedy vs sampled success per task, pass@k, and whether GRPO has room to climb (headroom)."""
    with Bars() as bars:
        run = run_headroom(cfg, bars)
    _print_json(run.as_json(cfg)) if as_json else _specs(run.printed(cfg))


# --------------------------------------------------------------------------------------------- train

train_app = typer.Typer(no_args_is_help=True, help="Train the policies the study analyses: SFT, then GRPO.")
app.add_typer(train_app, name="train")
_FORCE = flag("force", "--force/--no-force", "Replace an existing output folder written by graftkit.")
_RESUME = flag("resume", "--resume/--no-resume", "Continue from the newest checkpoint of this run.")


@command(train_app, SFTConfig, "sft", extra=(_FORCE,))
def train_sft(cfg: SFTConfig, as_json: bool, force: bool):
    """Supervised fine-tuning on oracle demonstrations (loss on action tokens only)."""
    t0 = time.perf_counter()
    p, on_step = step_printer(cfg.steps, "sft", ("loss", "lr"))
    with p:
        run = run_train_sft(cfg, force=force, on_step=on_step)
    info = {"out": str(run.policy), "steps": int(run.curves.steps[-1]), "final_loss": run.curves.last("loss"),
            "seconds": time.perf_counter() - t0, "budgets": cfg.pools, "curves": str(run.curves.path),
            **({"stop": run.stop.outcome()} if run.stop else {})}
    if as_json:
        return _print_json(info)
    out.print(f"SFT policy → {escape(str(run.policy))}: {info['steps']} steps, final action loss "
              f"{info['final_loss']:.4f}, {info['seconds']:.0f} s")
    if run.stop:  # the stop, or loudly that the target was not reached
        out.print(("" if run.stop.reached else "[bold red]") + escape(run.stop.summary()))


@command(train_app, GRPOConfig, "grpo", extra=(_RESUME, _FORCE))
def train_grpo(cfg: GRPOConfig, as_json: bool, resume: bool, force: bool):
    """GRPO from an SFT policy, with every knob of the control grid and the Mu-GRPO/focal/VeriGate switches."""
    t0 = time.perf_counter()
    p, on_step = step_printer(cfg.steps, "grpo", ("success", "loss", "entropy"))
    with p:
        run = run_train_grpo(cfg, resume=resume, force=force, on_step=on_step)
    c = run.curves
    info = {"out": str(run.policy), "steps": cfg.steps, "seconds": time.perf_counter() - t0, "curves": str(c.path),
            "seconds_per_step": c.last("seconds") / len(c.steps),
            "final": {k: c.last(k) for k in ("success", "loss", "entropy", "frac_reward_zero_std")}}
    if as_json:
        return _print_json(info)
    out.print(f"GRPO policy → {escape(str(run.policy))}: {cfg.steps} steps, {info['seconds_per_step']:.2f} s/step, "
              f"last batch success {c.last('success'):.2f}")


@command(app, SweepConfig, "sweep")
def sweep(cfg: SweepConfig, as_json: bool):
    """Run a control grid of GRPO runs: completed runs are skipped, partial runs resumed."""
    with Bars() as bars:
        info = run_sweep_grid(cfg, bars, on_run=lambda name, status: err.print(f"{escape(name)}: {status}"))
    if as_json:
        return _print_json(info)
    if not cfg.dry_run:
        for r in info["runs"]:
            out.print(f"{escape(r['name'])}: {r['status']} → {escape(r['out'])}")
        return
    _specs([sweep_plan(info)])


# ---------------------------------------------------------------------------------------------- rank


#: rank's base is --base, as in delta, graft and kl; --vs names a second RL run (graft --vs) and is refused here.
_RANK_VS = inspect_.Parameter("vs", inspect_.Parameter.KEYWORD_ONLY, annotation=Path | None,
                              default=typer.Option(None, "--vs", hidden=True, help="Not an option of rank: use --base."))


@command(app, RankConfig, "rank", extra=(_RANK_VS,))
def rank(cfg: RankConfig, as_json: bool, vs: Path | None):
    """Spectral ranks of every weight matrix (or of the RL delta), per tensor and per decoder layer, or of
    the hidden states on probe prompts, per layer."""
    if vs is not None:
        raise GraftkitError("rank takes its base as --base, not --vs (--vs names a second RL run, in graft)",
                            f"pass --base {vs}")
    with Bars() as bars:
        payload = run_rank(cfg, bars)
    if as_json:
        return _print_json(payload)
    metrics = {k: (lambda r, k=k: f"{r[k]:.4g}") for k in payload["metrics"]}  # each column headed by its metric
    for lab, m in payload["models"].items():
        if cfg.what == "activations":
            out.print(_rows_table(
                f"{escape(lab)}: activation ranks per hidden state ({escape(cfg.backend)}, {escape(cfg.tokens)} "
                f"tokens, {'centred' if cfg.centred else 'uncentred'}; layers {escape(cfg.layers)})",
                {"layer": lambda r: str(r["layer"]), "block": lambda r: "emb" if r["block"] is None else str(r["block"]),
                 "tokens": lambda r: str(r["n_tokens"]), **metrics}, m["layers"], left=("layer",),
                caption="layer L = output of decoder block L-1 (0 = embedding output); fp64 covariance, "
                "position 0 dropped"))
            _notes(m["notes"])
            out.print(f"saved {escape(m['result_file'])} ({m['n_prompts']} prompts)")
            continue
        out.print(_rows_table(
            f"{escape(lab)}: {cfg.what} ranks per layer (every measure a mean over one set of the layer's matrices, "
            f"named in --json; layers {escape(cfg.layers)})",
            {"layer": lambda r: str(r["layer"]) if "layer" in r else escape(r["tensor"]), **metrics},
            m["layers"] + m["outside_decoder"], fold=("layer",)))
        _specs(principal_tables(lab, m.get("principal")))
        _notes(m["notes"])
        out.print(f"saved {escape(m['result_file'])} ({m['matrices']} matrices, {m['skipped']} 1-D tensors skipped; "
                  f"spectra on {escape(payload['device'])})")
    if cfg.what == "activations":
        out.print(escape(payload["band_rule"]))


# -------------------------------------------------------------------------------------------- couple


@command(app, CoupleConfig, "couple")
def couple(cfg: CoupleConfig, as_json: bool):
    """Does per-layer rank track success across checkpoints? Correlations, and the both-directions test vs SFT."""
    from .rank.coupling import DIRECTIONS

    with Bars() as bars:
        p = run_couple(cfg, bars)
    if as_json:
        return _print_json(p)
    bd = p["both_directions"]

    def fmt(c: dict) -> str:
        return "—" if not np.isfinite(c["estimate"]) else f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]"

    columns = {"layer": lambda r: str(r["layer"]) if "layer" in r else f"[bold]{r['band']}[/]",
               "band": lambda r: r.get("band", "band mean") if "layer" in r else "band mean",
               "Spearman ρ": lambda r: fmt(r["spearman"]), "Pearson r": lambda r: fmt(r["pearson"]),
               "runs": lambda r: str(r["n"])}
    if "note" not in bd:  # one column per direction, headed by its name
        columns |= {f"{d} agree": (lambda r, d=d: f"{r[d]['agree']}/{r[d]['total']}") for d in DIRECTIONS}
        columns["both directions"] = lambda r: r["verdict"]
    out.print(_rows_table(f"{escape(cfg.metric)} ({escape(cfg.what)}) vs greedy success across {len(p['checkpoints'])} "
                          f"checkpoints ({int(100 * cfg.level)}% bootstrap intervals)", columns,
                          p["per_layer"] + p["per_band"], left=("layer", "band", "both directions")))
    _notes(f"{'layer ' + str(r['layer']) if 'layer' in r else r['band'] + ' band'}: {r['reason']}"
           for r in p["per_layer"] + p["per_band"] if r["reason"])
    out.print(escape(p["band_rule"]))
    if "note" in bd:
        out.print(f"note: {escape(bd['note'])}")
    else:
        out.print(f"both directions vs SFT parent: {bd['improved']} improved, {bd['degraded']} degraded, "
                  f"{len(bd['excluded'])} with no credible change (excluded); rule: see attrs['both_directions']")
    out.print(f"saved {escape(p['result_file'])}")


# ---------------------------------------------------------------------------------------------- demo


@command(app, StudyConfig, "demo")
def demo(cfg: StudyConfig, as_json: bool):
    """The whole study in miniature: SFT → headroom → GRPO grid → evaluation → anatomy → grafts → rank →
    coupling → findings → report."""
    if cfg.sft is not None:
        require(cfg.sft, "--sft", "the SFT policy folder")
    cfg = StudyConfig.preset(cfg.out, cfg.quick, cfg.policy, cfg.domain, sft=cfg.sft, train_sft=cfg.train_sft or None,
                             mastered_tasks=cfg.mastered_tasks, headroom_tasks=cfg.headroom_tasks, engine=cfg.engine,
                             workers=cfg.workers, **cfg.placement)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    mark_current_run(cfg.out)
    t0 = time.perf_counter()

    def on_stage(name: str, status: str, detail: str) -> None:
        mark = {"start": "…", "done": "[green]✓[/]", "skip": "[dim]↷ done before[/]"}[status]
        if status != "start" or not err.is_terminal:
            err.print(f"{mark} {escape(name)} [dim]{escape(detail)} ({time.perf_counter() - t0:.0f} s)[/]")

    with Bars() as bars:
        info = run_study(cfg, bars, on_stage)
    if as_json:
        return _print_json(info)
    t = _rows_table(f"the study's four findings, as this run found them ({escape(cfg.out)})",
                    {"#": lambda f: str(f["number"]), "claim": lambda f: escape(f["claim"]),
                     "this run": lambda f: escape(f["statement"]), "verdict": lambda f: escape(f["verdict"])},
                    info["findings"], fold=("#", "claim", "this run", "verdict"), show_lines=True)
    out.print(t, escape(info["items_line"]), soft_wrap=True)
    rl = next((v for k, v in info["models"].items() if k.startswith("degrade")), None)
    out.print(f"report: {escape(info['report'])}  ({info['seconds'] / 60:.1f} min)")
    if rl:
        out.print(f"next: graftkit graft --from {escape(rl)} --groups attn,mlp ; graftkit rank --layers late ; "
                  f"graftkit report {escape(cfg.out)} --open")


@command(app, ReportConfig, "report", extra=(flag("open_it", "--open", "Open the report in the default web browser."),))
def report(cfg: ReportConfig, as_json: bool, open_it: bool):
    """One self-contained HTML report of a run's results (plotly.js inlined, no network needed)."""
    with Bars() as bars:
        info = run_report(cfg, bars)
    if open_it:
        import webbrowser

        webbrowser.open(Path(info["path"]).resolve().as_uri())
    if as_json:
        return _print_json(info)
    out.print(f"[bold]report[/] {escape(info['path'])} ({fmt_size(info['bytes'])}, {info['figures']} figures)")
    out.print("[bold]sections[/] " + (escape(", ".join(info["sections"])) or "none"))
    if info["absent"]:
        out.print("[bold]no results for[/] " + escape(", ".join(info["absent"])))
    for note in info["notes"]:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if info["screenshot"]:
        out.print(f"[bold]screenshot[/] {escape(info['screenshot'])}")


@command(app, ResultsConfig, "results")
def results(cfg: ResultsConfig, as_json: bool):
    """List a run's results (kind, file, created, dimensions); with --csv, export them as tables."""
    info = run_results(cfg)
    if as_json:
        return _print_json(info)
    columns = {"kind": lambda r: escape(r["kind"]), "file": lambda r: escape(r["file"]),
               "created": lambda r: escape(r["created"]),
               "dimensions": lambda r: escape(" ".join(f"{d}={n}" for d, n in r["dims"].items()))}
    t = _rows_table(f"results of {escape(info['run'])}", columns, info["results"], fold=tuple(columns))
    for r in info["damaged"]:  # a file that could not be read: the reason where its dimensions would be
        cells = {"kind": "[bold red]damaged[/]", "file": escape(r["file"]), "created": "—",
                 "dimensions": escape(r["reason"])}
        t.add_row(*(cells[h] for h in columns))
    out.print(t)
    if info["csv"] is not None:
        out.print(f"wrote {len(info['csv'])} CSV files to {escape(str(cfg.csv))}")


@command(app, CleanConfig, "clean")
def clean(cfg: CleanConfig, as_json: bool):
    """List and remove the temporaries (.NAME.tmp-PID) that killed graftkit processes left in a run."""
    info = run_clean(cfg)
    if as_json:
        return _print_json(info)
    for s in info["stale"]:
        out.print(f"{'would remove' if cfg.dry_run else 'removed'} {escape(s['path'])} (pid {s['pid']}, {fmt_size(s['bytes'])})")
    out.print(f"{len(info['stale'])} stale temporaries ({fmt_size(info['bytes'])}) in {escape(info['run'])}"
              + (" (dry run: nothing removed)" if cfg.dry_run else ""))


@app.command()
def version():
    """Print graftkit's version."""
    out.print(__version__)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app()


if __name__ == "__main__":
    main()
