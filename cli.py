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
from typing import Callable

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._version import __version__
from .core.config import cli_parameters
from .core.errors import GraftkitError
from .core.files import fmt_size, os_error
from .core.progress import Bars, err, fmt_bytes, step_printer
from .results.store import CleanConfig, run_clean, runs_root
from .weights.commands import InspectConfig, must_exist, run_inspect
from .weights.gguf import ImportConfig, run_import
from .graft.anatomy import METRICS as DELTA_METRICS, DeltaConfig, DeltaResult, run_delta
from .train.commands import TrainSFTConfig, run_sweep_grid, run_train_grpo, run_train_sft
from .train.configs import GRPOConfig, SweepConfig
from .study.pipeline import StudyConfig, run_study
from .figures.commands import ReportConfig, ResultsConfig, run_report, run_results
from .graft.commands import GraftConfig, GraftExperiments, run_graft
from .rank.commands import CoupleConfig, RankConfig, run_couple, run_rank
from .evaluation.commands import EvalConfig, HeadroomConfig, run_eval, run_headroom

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
    t = _table(f"{escape(info['path'])} — {info['family']} table (matched by {info['matched_by']}), {n_dec} decoder layers, "
               f"{'tied' if info['tied_embeddings'] else 'untied'} embeddings", ("group", "tensors", "params", "bytes"),
               left=("group",))
    for g, r in info["groups"].items():
        t.add_row(g, str(r["tensors"]), f"{r['params']:,}", fmt_bytes(r["bytes"]))
    out.print(t)
    if info["band_rule"]:
        out.print(info["band_rule"])
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


def _top_table(title: str, labels, cols: dict[str, np.ndarray], order: np.ndarray, limit: int) -> Table:
    t = _table(title, ("name", *cols), fold=("name",))
    for i in order[:limit]:
        cells = []
        for c, v in cols.items():
            x = v[i]
            if c.startswith("frac") or c == "share":
                cells.append(f"{100 * x:.2f}%")
            elif c == "nonfinite":
                cells.append(f"{int(x)}" if x else "")
            else:
                cells.append(f"{x:.4g}")
        t.add_row(escape(str(labels[i])), *cells)
    return t


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
    heads = dict(zip(("share", "‖Δ‖_F", "‖Δ‖/‖W‖", "max|Δ|", "frac_same", "frac_tol", "nonfinite"), DELTA_METRICS))
    for i, lab in enumerate(d.runs):
        out.print(_top_table(f"{escape(lab)} vs {escape(d.base_path)}: groups", d.groups,
                             {k: d.group(m, i) for k, m in heads.items()},
                             np.argsort(-d.group("share", i), kind="stable"), len(d.groups)))
        out.print(_top_table(f"largest movers (top {min(top, len(d.tensors))} of {len(d.tensors)} tensors)",
                             d.tensors, {k: d.tensor(m, i) for k, m in heads.items()},
                             np.argsort(-d.tensor("share", i), kind="stable"), top))
        out.print(f"total ‖Δ‖_F {d.total('fro_delta', i):.4g}, ‖Δ‖/‖W‖ {d.total('rel_delta', i):.4g}, "
                  f"{100 * d.total('frac_unchanged', i):.2f}% of entries bitwise unchanged (tol {d.tol:g})")
    if len(d.runs) > 1:
        t = _table("cosine between runs' deltas (all tensors)", ("run", *map(escape, d.runs)), left=("run",))
        for i, lab in enumerate(d.runs):
            t.add_row(escape(lab), *(f"{c:.3f}" for c in d.cosine_total()[i]))
        out.print(t)
    _notes(d.notes)
    out.print(f"saved {escape(str(d.path))} ({seconds:.1f} s)")


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
        t = _table(f"dry run: {got['sweep']} sweep over {escape(','.join(got['groups']) or 'nothing')} — "
                   f"{got['count']} configurations" + (" per run" if cfg.vs else ""),
                   ("config", "groups", "layers", "α", "role"), left=("config", "groups", "layers", "role"))
        for e in got["experiments"]:
            t.add_row(escape(e["label"]), escape(",".join(e["groups"]) or "—"), escape(e["layers"]),
                      f"{e['alpha']:g}", e["role"])
        out.print(t)
        return _notes(got["notes"])
    selected, total = fmt_bytes(got["selected_bytes"]), fmt_bytes(got["total_bytes"])
    if not got.get("dry_run"):
        _notes(got["notes"])
        n = sum(row["tensors"] for row in got["selected"])
        return out.print(f"grafted {n} tensors ({selected} of {total}) → {escape(got['out'])} in {got['seconds']:.1f} s")
    t = _table(f"dry run: {'revert in RL' if cfg.reverse else 'graft into base'} "
               f"{escape(','.join(got['spec']['groups']) or 'nothing')} (layers {escape(cfg.layers)}, α={cfg.alpha:g})",
               ("group", "layer", "tensors", "bytes"), left=("group",))
    for row in got["selected"]:
        t.add_row(row["group"], "—" if row["layer"] is None else str(row["layer"]), str(row["tensors"]),
                  fmt_bytes(row["bytes"]))
    out.print(t)
    out.print(f"{selected} of {total} selected")
    _notes(got["notes"])


def _graft_experiment_tables(got: GraftExperiments) -> None:
    j, labels = got.as_json(), got.labels
    for key, run in j["runs"].items():
        _sweep_tables(run, labels[key], j["seeds"], j["episodes"])
    dis = j["dissociation"]
    if dis is not None:
        t = _table(f"double dissociation ({dis['effect']} effects): A = {escape(labels['A'])}, "
                   f"B = {escape(labels['B'])} — {'yes' if dis['double_dissociation'] else 'no'}",
                   ("group", "effect A", "effect B", "A − B", "verdict"), left=("group", "verdict"))
        for g, row in dis["groups"].items():
            t.add_row(g, *(_pts(row[k]) for k in ("A", "B", "difference")), row["verdict"])
        out.print(t)
        out.print(f"rule: {escape(dis['rule'])}", soft_wrap=True)
    _notes(got.notes)
    for k, f in got.files.items():
        note = f" (resumed {len(got.resumed[k])} configurations)" if got.resumed.get(k) else ""
        out.print(f"saved {escape(f)}{note}")
    out.print(f"{got.seconds:.1f} s")


def _pts(b) -> str:
    """(estimate, low, high) as percentage points."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return "—"
    return f"{100 * b[0]:+.1f} [{100 * b[1]:+.1f}, {100 * b[2]:+.1f}]"


def _sweep_tables(run: dict, label: str, n_seeds: int, episodes: int) -> None:
    t = _table(f"{escape(label)}: grafts evaluated on identical episodes ({n_seeds} seeds × {episodes} episodes per task)",
               ("config", "success", "vs base \\[95%]", "verdict vs base", "vs RL \\[95%]", "verdict vs RL"),
               left=("config", "verdict vs base", "verdict vs RL"))
    for c in run["configs"]:
        t.add_row(escape(c["config"]), f"{100 * c['success']:.1f}%", _pts(c["diff_vs_base"]), c["verdict_vs_base"],
                  _pts(c["diff_vs_rl"]), c["verdict_vs_rl"])
    out.print(t)
    if any(run["attribution"].values()):
        cols = [c for c in ("group_effect", "main_effect", "shapley") if any(c in r for r in run["attribution"].values())]
        t = _table(f"attribution of the success change to groups ({escape(run['group_effect'])} effect) beside "
                   "weight movement" if run["group_effect"] else "weight movement of the grafted groups",
                   ("group", "movement share", *(c.replace("_", " ") for c in cols)), left=("group",))
        for g, r in run["attribution"].items():
            share = r.get("movement_share")
            t.add_row(g, "—" if share is None else f"{100 * share:.1f}%", *(_pts(r.get(c)) for c in cols))
        out.print(t)
    for row in run.get("interactions", []):
        out.print(f"interaction {'×'.join(row['groups'])}: {_pts(row['interaction'])}")


# ------------------------------------------------------------------------------------ eval, headroom


def _rate_text(r: dict) -> str:
    return f"{100 * r['rate']:.1f}% [{100 * r['low']:.1f}, {100 * r['high']:.1f}]"


def _diff_text(r: dict, key: str) -> str:
    return (f"{100 * r[key]:+.1f} [{100 * r['bootstrap'][0]:+.1f}, {100 * r['bootstrap'][1]:+.1f}] "
            f"[{100 * r['bayes'][0]:+.1f}, {100 * r['bayes'][1]:+.1f}]")


@command(app, EvalConfig, "eval")
def eval_cmd(cfg: EvalConfig, as_json: bool):
    """Success per task with intervals over tasks × seeds × episodes; with --compare, the paired verdict."""
    with Bars() as bars:
        run = run_eval(cfg, bars)
    if as_json:
        return _print_json(run.as_json(cfg))
    compared = (escape(Path(cfg.compare_to or "").name), "diff \\[bootstrap] \\[Bayes]", "McNemar p", "verdict")
    for role in run.models:  # one block per model
        t = _table(f"{escape(str(run.results[role].model_path))}: success over {cfg.seeds} seeds × {cfg.episodes} episodes "
                   f"({'sampled' if cfg.sample else 'greedy'}, {cfg.backend}, obs {cfg.obs})",
                   ("task", "items", "success (95% Wilson)", *(compared if cfg.compare_to else ())), left=("task", "verdict"))
        for row in run.tables[role]:
            t.add_row(escape(row["task"]), str(row.get("items", "?")), _rate_text(row["model"]), *(() if not cfg.compare_to else (
                _rate_text(row["compare"]), _diff_text(row, "diff"), f"{row['mcnemar_p']:.3g}", row["verdict"])))
        out.print(t)
    _notes(run.notes)
    for role, path in run.files.items():
        out.print(f"saved {escape(str(path))} ({run.results[role].seconds:.1f} s)")


@command(app, HeadroomConfig, "headroom")
def headroom(cfg: HeadroomConfig, as_json: bool):
    """Greedy vs sampled success per task, pass@k, and whether GRPO has room to climb (headroom)."""
    with Bars() as bars:
        run = run_headroom(cfg, bars)
    k = cfg.k
    if as_json:
        return _print_json(run.as_json(cfg))
    t = _table(f"headroom of {escape(str(cfg.model))}: {cfg.seeds} seeds × {cfg.episodes} episodes, k={k}, "
               f"T={cfg.temperature:g}", ("task", "items", "greedy", "sampled", f"pass@{k}", "headroom \\[bootstrap] \\[Bayes]",
                                          "verdict"), left=("task", "verdict"))
    for r in run.rows:
        t.add_row(escape(r["task"]), str(r.get("items", "?")), f"{100 * r['greedy']:.1f}%", f"{100 * r['sampled']:.1f}%",
                  f"{100 * r[f'pass@{k}']:.1f}%", _diff_text(r, "headroom"), r["verdict"])
    out.print(t)
    _notes(run.result.notes)
    out.print(f"saved {escape(str(run.file))}")


# --------------------------------------------------------------------------------------------- train

train_app = typer.Typer(no_args_is_help=True, help="Train the policies the study analyses: SFT, then GRPO.")
app.add_typer(train_app, name="train")
_FORCE = flag("force", "--force/--no-force", "Replace an existing output folder written by graftkit.")
_RESUME = flag("resume", "--resume/--no-resume", "Continue from the newest checkpoint of this run.")
_SWEEP_COLUMNS = ("name", "status", "init", "lr", "beta", "seed", "epsilon", "epsilon_high", "loss", "steps")


@command(train_app, TrainSFTConfig, "sft", extra=(_FORCE,))
def train_sft(cfg: TrainSFTConfig, as_json: bool, force: bool):
    """Supervised fine-tuning on oracle demonstrations (loss on action tokens only)."""
    t0 = time.perf_counter()
    p, on_step = step_printer(cfg.steps, "sft", ("loss", "lr"))
    with p:
        run = run_train_sft(cfg, force=force, on_step=on_step)
    info = {"out": str(run.policy), "steps": cfg.steps, "final_loss": run.curves.last("loss"),
            "seconds": time.perf_counter() - t0, "budgets": cfg.sft().budgets, "curves": str(run.curves.path)}
    if as_json:
        return _print_json(info)
    out.print(f"SFT policy → {escape(str(run.policy))}: {cfg.steps} steps, final action loss "
              f"{info['final_loss']:.4f}, {info['seconds']:.0f} s")


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
    t = _table(f"{escape(str(cfg.grid))}: {len(info['runs'])} runs", _SWEEP_COLUMNS, left=("name", "status", "init", "loss"))
    for r in info["runs"]:
        t.add_row(*(escape(Path(str(r[c])).name if c == "init" else str(r[c])) for c in _SWEEP_COLUMNS))
    out.print(t)


# ---------------------------------------------------------------------------------------------- rank


@command(app, RankConfig, "rank")
def rank(cfg: RankConfig, as_json: bool):
    """Spectral ranks of every weight matrix (or of the RL delta), per tensor and per decoder layer, or of
    the hidden states on probe prompts, per layer."""
    with Bars() as bars:
        payload = run_rank(cfg, bars)
    if as_json:
        return _print_json(payload)
    shown = payload["metrics"]
    for lab, m in payload["models"].items():
        if cfg.what == "activations":
            t = _table(f"{escape(lab)}: activation ranks per hidden state ({escape(cfg.backend)}, {escape(cfg.tokens)} "
                       f"tokens, {'centred' if cfg.centred else 'uncentred'}; layers {escape(cfg.layers)})",
                       ("layer", "block", "tokens", *shown), left=("layer",), caption="layer L = output of decoder "
                       "block L-1 (0 = embedding output); fp64 covariance, position 0 dropped")
            for r in m["layers"]:
                t.add_row(str(r["layer"]), "emb" if r["block"] is None else str(r["block"]), str(r["n_tokens"]),
                          *(f"{r[k]:.4g}" for k in shown))
            out.print(t)
            _notes(m["notes"])
            out.print(f"saved {escape(m['result_file'])} ({m['n_prompts']} prompts)")
            continue
        t = _table(f"{escape(lab)}: {cfg.what} ranks per layer (every measure a mean over one set of the layer's matrices, named in --json; layers "
                   f"{escape(cfg.layers)})", ("layer", *shown), fold=("layer",))
        for r in m["layers"]:
            t.add_row(str(r["layer"]), *(f"{r[k]:.4g}" for k in shown))
        for o in m["outside_decoder"]:
            t.add_row(escape(o["tensor"]), *(f"{o[k]:.4g}" for k in shown))
        out.print(t)
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

    p = run_couple(cfg)
    if as_json:
        return _print_json(p)
    bd = p["both_directions"]

    def fmt(c: dict) -> str:
        return "—" if not np.isfinite(c["estimate"]) else f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]"

    t = _table(f"{escape(cfg.metric)} ({escape(cfg.what)}) vs greedy success across {len(p['checkpoints'])} "
               f"checkpoints ({int(100 * cfg.level)}% bootstrap intervals)",
               ("layer", "band", "Spearman ρ", "Pearson r", "runs") + (
                   ("improved agree", "degraded agree", "both directions") if "note" not in bd else ()),
               left=("layer", "band", "both directions"))
    for r in p["per_layer"] + p["per_band"]:
        name = str(r["layer"]) if "layer" in r else f"[bold]{r['band']}[/]"
        cells = [name, r.get("band", "band mean") if "layer" in r else "band mean", fmt(r["spearman"]),
                 fmt(r["pearson"]), str(r["n"])]
        if "note" not in bd:
            cells += [f"{r[d]['agree']}/{r[d]['total']}" for d in DIRECTIONS] + [r["verdict"]]
        t.add_row(*cells)
    out.print(t)
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
        must_exist(cfg.sft, "--sft")
    cfg = StudyConfig.preset(cfg.out, cfg.quick, cfg.policy, cfg.domain, sft=cfg.sft, train_sft=cfg.train_sft or None,
                             mastered_tasks=cfg.mastered_tasks, headroom_tasks=cfg.headroom_tasks, **cfg.placement)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    runs_root().mkdir(parents=True, exist_ok=True)
    (runs_root() / ".current").write_text(str(Path(cfg.out).resolve()) + "\n")
    t0 = time.perf_counter()

    def on_stage(name: str, status: str, detail: str) -> None:
        mark = {"start": "…", "done": "[green]✓[/]", "skip": "[dim]↷ done before[/]"}[status]
        if status != "start" or not err.is_terminal:
            err.print(f"{mark} {escape(name)} [dim]{escape(detail)} ({time.perf_counter() - t0:.0f} s)[/]")

    with Bars() as bars:
        info = run_study(cfg, bars, on_stage)
    if as_json:
        return _print_json(info)
    t = _table(f"the study's four findings, as this run found them ({escape(cfg.out)})",
               ("#", "claim", "this run", "verdict"), fold=("#", "claim", "this run", "verdict"), show_lines=True)
    for f in info["findings"]:
        t.add_row(str(f["number"]), escape(f["claim"]), escape(f["statement"]), escape(f["verdict"]))
    out.print(t, escape(info["items_line"]), soft_wrap=True)
    rl = next((v for k, v in info["models"].items() if k.startswith("degrade")), None)
    out.print(f"report: {escape(info['report'])}  ({info['seconds'] / 60:.1f} min)")
    if rl:
        out.print(f"next: graftkit graft --from {escape(rl)} --groups attn,mlp ; graftkit rank --layers late ; "
                  f"graftkit report {escape(cfg.out)} --open")


@command(app, ReportConfig, "report", extra=(flag("open_it", "--open", "Open the report in the default web browser."),))
def report(cfg: ReportConfig, as_json: bool, open_it: bool):
    """One self-contained HTML report of a run's results (plotly.js inlined, no network needed)."""
    info = run_report(cfg)
    if open_it:
        import webbrowser

        webbrowser.open(Path(info["path"]).resolve().as_uri())
    if as_json:
        return _print_json(info)
    out.print(f"[bold]report[/] {escape(info['path'])} ({fmt_bytes(info['bytes'])}, {info['figures']} figures)")
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
    t = _table(f"results of {escape(info['run'])}", ("kind", "file", "created", "dimensions"),
               fold=("kind", "file", "created", "dimensions"))
    for r in info["results"]:
        t.add_row(escape(r["kind"]), escape(r["file"]), escape(r["created"]),
                  escape(" ".join(f"{d}={n}" for d, n in r["dims"].items())))
    for r in info["damaged"]:
        t.add_row("[bold red]damaged[/]", escape(r["file"]), "—", escape(r["reason"]))
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
