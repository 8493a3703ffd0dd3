"""The ``graftkit`` command line: thin commands, each builds a config and calls one function.

Every command prints a readable summary, or JSON with ``--json``; progress goes to stderr; bad input is
one line on stderr (what, which file or tensor, how to fix) and exit status 2, never a traceback.
"""

from __future__ import annotations

import functools
import inspect as inspect_
import json
import math
import os
import sys
import time
from pathlib import Path
from dataclasses import fields
from typing import Callable, List, Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ._version import __version__
from .config import cli_parameters
from .errors import GraftkitError
from .store import current_run, result_labels, runs_root
from .weights.commands import InspectConfig, run_inspect
from .study import eval_result, training_curves

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Weight-delta analysis of RL fine-tunes: where did GRPO move the weights, and did it matter?",
)
# Pipes and files get wide tables (rich's default of 80 columns would truncate tensor and run names).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)


def _handled(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GraftkitError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper


def _progress(total: int, what: str) -> Progress:
    p = Progress(
        TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )
    p.add_task(what, total=total)
    return p


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
            cfg = cls(**{k: v for k, v in kw.items() if k in names})
            return render(cfg, **{k: v for k, v in kw.items() if k not in names})

        callback.__signature__ = inspect_.Signature(params)
        callback.__doc__, callback.__name__ = render.__doc__, render.__name__
        parent.command(name)(_handled(callback))
        return render

    return deco


def flag(name: str, option: str, help: str, default=False, annotation=bool) -> inspect_.Parameter:
    """A command-line option that is no config field (``--json``, ``--open``, ``--force``)."""
    return inspect_.Parameter(name, inspect_.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=typer.Option(default, option, help=help))


class Bars:
    """An :class:`~graftkit.config.OnProgress` drawn as rich progress bars on stderr, one per ``what``."""

    def __init__(self):
        self.p = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), _Count(), TimeRemainingColumn(),
                          console=err, transient=True, disable=not err.is_terminal)
        self.ids: dict[str, int] = {}

    def __enter__(self) -> "Bars":
        self.p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.p.__exit__(*exc)

    def __call__(self, what: str, advance: int, total: int, unit: str) -> None:
        if what not in self.ids:
            self.ids[what] = self.p.add_task(escape(what), total=total, unit=unit)
        self.p.advance(self.ids[what], advance)


class _Count(ProgressColumn):
    def render(self, task) -> Text:
        unit = task.fields.get("unit", "")
        if unit == "bytes":
            return Text(f"{_fmt_bytes(task.completed)}/{_fmt_bytes(task.total or 0)}")
        return Text(f"{task.completed:.0f}/{task.total:.0f} {unit}")


def _print_json(obj) -> None:
    # Strict JSON: NaN/±Inf (an undefined cosine, a ratio over a zero norm) are written as null.
    sys.stdout.write(json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False) + "\n")


def _finite(o):
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, np.ndarray)):
        return [_finite(v) for v in (o.tolist() if isinstance(o, np.ndarray) else o)]
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _must_exist(path: Path, flag: str = "--from") -> Path:
    """A checkpoint path that exists (else resolving its recorded base would mislead)."""
    if not Path(path).exists():
        raise GraftkitError(f"{path}: no such file or folder", f"check the {flag} path")
    return path


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


# ------------------------------------------------------------------------------------------- inspect


@command(app, InspectConfig, "inspect")
def inspect(cfg: InspectConfig, as_json: bool):
    """What every tensor of a checkpoint is: groups, layers, bytes, tied embeddings."""
    info = run_inspect(cfg)
    if as_json:
        return _print_json(info)
    n_dec = info["layers"].get("decoder", 0)
    t = Table(title=f"{escape(info['path'])} — {info['family']}, {n_dec} decoder layers, "
                    f"{'tied' if info['tied_embeddings'] else 'untied'} embeddings")
    for c in ("group", "tensors", "params", "bytes"):
        t.add_column(c, justify="left" if c == "group" else "right")
    for g, r in info["groups"].items():
        t.add_row(g, str(r["tensors"]), f"{r['params']:,}", _fmt_bytes(r["bytes"]))
    out.print(t)
    if info["band_rule"]:
        out.print(info["band_rule"])


# --------------------------------------------------------------------------------------------- delta


def _top_table(title: str, labels, cols: dict[str, np.ndarray], order: np.ndarray, limit: int) -> Table:
    t = Table(title=title)
    t.add_column("name", overflow="fold")
    for c in cols:
        t.add_column(c, justify="right")
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


@app.command()
@_handled
def delta(
    rl: List[Path] = typer.Option(..., "--from", help="RL checkpoint(s): HF folder, .safetensors, or LoRA adapter."),
    base: Optional[Path] = typer.Option(None, help="The SFT base (default: the parent recorded in graftkit.json)."),
    tol: float = typer.Option(1e-5, help="Count entries with |Δ| ≤ tol as (nearly) unchanged."),
    top: int = typer.Option(15, help="Rows of the largest-movers table."),
    save: Optional[Path] = typer.Option(None, "--save", help="HDF5 result file (default: RUN/results/delta-*.h5)."),
    allow_pickle: bool = typer.Option(False, help="Load pickled .bin/.pt weights (weights_only=True)."),
    allow_nonfinite: bool = typer.Option(False, help="Exit 0 even if a delta has NaN/Inf entries."),
    unknown: str = typer.Option("error", help="Tensors no taxonomy table claims: error | keep-base."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Where the RL fine-tune moved the weights: per tensor, layer and group."""
    from .graft import delta_anatomy
    from .store import write_result
    from .weights import check_pair, describe, open_checkpoint, open_rl, resolve_base

    t0 = time.perf_counter()
    for p in rl:
        _must_exist(p)
    base_path = resolve_base(rl[0], base)
    b = open_checkpoint(base_path, allow_pickle=allow_pickle)
    rls = [open_rl(p, b, allow_pickle=allow_pickle) for p in rl]
    tax = b.taxonomy(unknown)
    for r in rls:
        check_pair(b, r, tax)
    labels = result_labels(rl)
    prov = {"base": describe(b), "runs": [describe(r) for r in rls],
            "config": {"tol": tol, "unknown": unknown, "command": "delta"}}
    with _progress(b.nbytes * (1 + len(rls)), "delta") as p:
        res = delta_anatomy(b, rls, labels, tax, tol,
                            on_tensor=lambda n, nbytes: p.advance(p.task_ids[0], nbytes), provenance=prov)
    dest = save or current_run() / "results" / f"delta-{'+'.join(labels)}.h5"
    write_result(dest, res)
    seconds = time.perf_counter() - t0
    bad = {lab: {str(n): int(v) for n, v in zip(res.coords["tensor"], res["n_nonfinite"][i]) if v}
           for i, lab in enumerate(labels)}
    bad = {k: v for k, v in bad.items() if v}

    if as_json:
        _print_json(_delta_json(res, labels, b, dest, seconds))
    else:
        _delta_tables(res, labels, top, base_path)
        out.print(f"saved {escape(str(dest))} ({seconds:.1f} s)")
    if bad and not allow_nonfinite:
        first = next(iter(bad.items()))
        tensors = ", ".join(f"{n} ({c})" for n, c in list(first[1].items())[:3])
        raise GraftkitError(
            f"RL run {first[0]} has NaN/Inf delta entries in {len(first[1])} tensor(s): {tensors}; "
            "they are excluded from every statistic and counted in n_nonfinite",
            "check that checkpoint (diverged training?); pass --allow-nonfinite to exit 0",
        )


def _delta_json(res, labels, b, dest, seconds) -> dict:
    groups = list(res.coords["group"])
    tensors = list(res.coords["tensor"])
    metrics = ("fro_delta", "rel_delta", "share", "max_abs_delta", "frac_unchanged", "frac_within_tol", "n_nonfinite")
    out_runs = {}
    for i, lab in enumerate(labels):
        out_runs[lab] = {
            "total": {m: float(res[f"total_{m}"][i, 0]) for m in metrics},
            "groups": {g: {m: float(res[f"group_{m}"][i, j]) for m in metrics} for j, g in enumerate(groups)},
            "tensors": [
                {"name": n, "group": res["tensor_group"][j], "layer": int(res["tensor_layer"][j]),
                 **{m: float(res[m][i, j]) for m in metrics}}
                for j, n in sorted(enumerate(tensors), key=lambda x: -res["share"][i, x[0]])
            ],
        }
    payload = {"base": str(b.path), "tol": res.attrs["tol"], "runs": out_runs, "result_file": str(dest),
               "seconds": seconds}
    if len(labels) > 1:
        payload["cosine"] = {
            "total": res["total_cosine"][..., 0],
            "groups": {g: res["group_cosine"][..., j] for j, g in enumerate(groups)},
            "runs": labels,
        }
    return payload


def _delta_tables(res, labels, top, base_path) -> None:
    tensors, groups = res.coords["tensor"], res.coords["group"]
    for i, lab in enumerate(labels):
        cols = {"share": res["share"][i], "‖Δ‖_F": res["fro_delta"][i], "‖Δ‖/‖W‖": res["rel_delta"][i],
                "max|Δ|": res["max_abs_delta"][i], "frac_same": res["frac_unchanged"][i],
                "frac_tol": res["frac_within_tol"][i], "nonfinite": res["n_nonfinite"][i]}
        order = np.argsort(-res["share"][i], kind="stable")
        out.print(_top_table(f"{escape(lab)} vs {escape(str(base_path))}: groups", groups,
                             {k: res[f"group_{m}"][i] for k, m in zip(cols, (
                                 "share", "fro_delta", "rel_delta", "max_abs_delta", "frac_unchanged",
                                 "frac_within_tol", "n_nonfinite"))},
                             np.argsort(-res["group_share"][i], kind="stable"), len(groups)))
        out.print(_top_table(f"largest movers (top {min(top, len(tensors))} of {len(tensors)} tensors)",
                             tensors, cols, order, top))
        tot = {m: res[f"total_{m}"][i, 0] for m in ("fro_delta", "rel_delta", "frac_unchanged")}
        out.print(f"total ‖Δ‖_F {tot['fro_delta']:.4g}, ‖Δ‖/‖W‖ {tot['rel_delta']:.4g}, "
                  f"{100 * tot['frac_unchanged']:.2f}% of entries bitwise unchanged (tol {res.attrs['tol']:g})")
    if len(labels) > 1:
        t = Table(title="cosine between runs' deltas (all tensors)")
        t.add_column("run")
        for lab in labels:
            t.add_column(escape(lab), justify="right")
        for i, lab in enumerate(labels):
            t.add_row(escape(lab), *(f"{res['total_cosine'][i, j, 0]:.3f}" for j in range(len(labels))))
        out.print(t)


# --------------------------------------------------------------------------------------------- graft


def _default_graft_out(rl: Path, groups: str, layers: str, alpha: float, reverse: bool) -> Path:
    tag = f"{Path(rl).name}-{groups.replace(',', '+') or 'none'}-{layers.replace(',', '_')}"
    if alpha != 1:
        tag += f"-a{alpha:g}"
    if reverse:
        tag += "-reverse"
    return current_run() / "grafts" / tag


@app.command()
@_handled
def graft(
    rl: Path = typer.Option(..., "--from", help="RL checkpoint: HF folder, .safetensors, or LoRA adapter."),
    groups: Optional[str] = typer.Option(None, help="Groups to move: comma list of embed,attn,mlp,norm,lm_head,vision,projector | all | none (a sweep: the groups it varies, default every group present)."),
    base: Optional[Path] = typer.Option(None, help="The SFT base (default: the parent recorded in graftkit.json)."),
    layers: str = typer.Option("all", help="Decoder layers: all | early | mid | late | 0-3,10."),
    alpha: float = typer.Option(1.0, help="Scale of the grafted delta (1 = exact copy of RL's tensors)."),
    reverse: bool = typer.Option(False, help="Revert the selection in the RL model to base (ablation)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output folder (default: RUN/grafts/<name>)."),
    force: bool = typer.Option(False, help="Replace an existing output folder written by graftkit."),
    dry_run: bool = typer.Option(False, help="List what would move, per group and layer; write nothing."),
    max_shard_size: str = typer.Option("5GB", help="HF max shard size of the output."),
    allow_pickle: bool = typer.Option(False, help="Load pickled .bin/.pt weights (weights_only=True)."),
    unknown: str = typer.Option("error", help="Tensors no taxonomy table claims: error | keep-base."),
    eval_: bool = typer.Option(False, "--eval", help="Graft in memory and evaluate against base and RL on identical episodes (no export)."),
    sweep: Optional[str] = typer.Option(None, help="Evaluate a sweep of in-memory grafts: single | loo | factorial | layers | alpha."),
    alphas: str = typer.Option("0,0.25,0.5,0.75,1", help="α values of --sweep alpha."),
    vs: Optional[Path] = typer.Option(None, "--vs", help="A second RL run of the same base: run the sweep for it too and test a double dissociation."),
    tasks: str = typer.Option("mastered", help="With --eval/--sweep: suite (mastered, headroom, all) or comma list of tasks."),
    seeds: int = typer.Option(25, help="With --eval/--sweep: evaluation seeds 0..N-1."),
    episodes: int = typer.Option(4, help="With --eval/--sweep: episodes per seed and task."),
    sample: bool = typer.Option(False, help="With --eval/--sweep: sample actions instead of greedy decoding."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    max_new_tokens: int = typer.Option(32, help="With --eval/--sweep: longest action in tokens (longer turns are cut and count invalid)."),
    batch_size: int = typer.Option(64, help="Episodes advanced together."),
    save: Optional[Path] = typer.Option(None, "--save", help="With --eval/--sweep: HDF5 result (default: RUN/results/graft-<sweep>-<rl>.h5)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Splice the RL model's delta for some groups and layers into the base: θ = θ_base + α·M⊙Δ.

    With --eval or --sweep nothing is written but a result: the base policy is loaded once, each graft is
    written into it in place, evaluated on identical episodes and compared with base and RL."""
    from .graft import GraftSpec, export_graft, plan_graft
    from .weights import check_pair, open_checkpoint, open_rl, parse_size, resolve_base

    t0 = time.perf_counter()
    if eval_ or sweep or vs is not None:
        return _graft_experiments(
            rl=rl, groups=groups, base=base, layers=layers, alpha=alpha, reverse=reverse, dry_run=dry_run,
            allow_pickle=allow_pickle, unknown=unknown, sweep=sweep, alphas=alphas, vs=vs, tasks=tasks,
            seeds=seeds, episodes=episodes, sample=sample, temperature=temperature, max_new_tokens=max_new_tokens,
            batch_size=batch_size, save=save, as_json=as_json)
    if groups is None:
        raise GraftkitError("--groups is required to export a graft", "pass e.g. --groups attn,mlp (or --sweep single)")
    spec = GraftSpec.parse(groups, layers, alpha, reverse)
    parse_size(max_shard_size)
    base_path = resolve_base(_must_exist(rl), base)
    b = open_checkpoint(base_path, allow_pickle=allow_pickle)
    r = open_rl(rl, b, allow_pickle=allow_pickle)
    tax = b.taxonomy(unknown)
    check_pair(b, r, tax)
    plan = plan_graft(tax, spec)
    neutral = 1.0 if spec.reverse else 0.0  # the coefficient of an unselected tensor
    moved = {}
    for n in plan.selected:
        role = tax.roles[n]
        key = (role.group, role.layer if role.stack == "decoder" else None)
        row = moved.setdefault(key, {"tensors": 0, "bytes": 0, "names": []})
        row["tensors"] += 1
        row["bytes"] += b.metas[n].nbytes
        row["names"].append(n)
    summary = {
        "base": str(base_path), "rl": str(rl), "spec": spec.as_dict(), "notes": list(plan.notes),
        "selected": [{"group": g, "layer": L, **v} for (g, L), v in sorted(moved.items(), key=lambda x: (x[0][0], x[0][1] if x[0][1] is not None else -1))],
        "selected_bytes": sum(v["bytes"] for v in moved.values()),
        "total_bytes": b.nbytes, "neutral_coefficient": neutral,
    }
    if dry_run:
        if as_json:
            return _print_json({**summary, "dry_run": True})
        t = Table(title=f"dry run: {'revert in RL' if reverse else 'graft into base'} "
                        f"{escape(','.join(spec.groups) or 'nothing')} (layers {escape(layers)}, α={alpha:g})")
        for c in ("group", "layer", "tensors", "bytes"):
            t.add_column(c, justify="left" if c in ("group",) else "right")
        for row in summary["selected"]:
            t.add_row(row["group"], "—" if row["layer"] is None else str(row["layer"]), str(row["tensors"]),
                      _fmt_bytes(row["bytes"]))
        out.print(t)
        out.print(f"{_fmt_bytes(summary['selected_bytes'])} of {_fmt_bytes(b.nbytes)} selected")
        for note in plan.notes:
            out.print(f"note: {escape(note)}", soft_wrap=True)
        return
    dest = out_dir or _default_graft_out(rl, groups, layers, alpha, reverse)
    with _progress(b.nbytes, "graft") as p:
        written = export_graft(
            b, r, plan, dest, force=force, max_shard_size=max_shard_size,
            command={"unknown": unknown, "max_shard_size": max_shard_size},
            on_tensor=lambda s: p.advance(p.task_ids[0], s.out.nbytes),
        )
    seconds = time.perf_counter() - t0
    if as_json:
        return _print_json({**summary, "out": str(written), "seconds": seconds})
    for note in plan.notes:
        out.print(f"note: {escape(note)}", soft_wrap=True)
    out.print(f"grafted {len(plan.selected)} tensors ({_fmt_bytes(summary['selected_bytes'])} of "
              f"{_fmt_bytes(b.nbytes)}) → {escape(str(written))} in {seconds:.1f} s")


def _graft_experiments(*, rl, groups, base, layers, alpha, reverse, dry_run, allow_pickle, unknown, sweep, alphas,
                       vs, tasks, seeds, episodes, sample, temperature, max_new_tokens, batch_size, save, as_json):
    """`graft --eval` / `--sweep`: expand the specs, graft each into the loaded base in place, evaluate,
    compare, attribute; with `--vs`, the same for a second run and the double-dissociation test."""
    from dataclasses import asdict

    from .agent import Decode, resolve_tasks
    from .graft import GraftSpec, delta_anatomy
    from .graft import attribution as attr
    from .graft import experiments as X
    from .store import read_result, write_result
    from .weights import check_pair, describe, open_checkpoint, open_rl, resolve_base

    t0 = time.perf_counter()
    kind = sweep or "eval"
    if sweep is not None and sweep not in X.SWEEPS:
        raise GraftkitError(f"unknown --sweep {sweep!r}", f"use one of {', '.join(X.SWEEPS)}")
    if vs is not None and kind not in X.GROUP_EFFECT:
        raise GraftkitError(f"--vs needs --sweep single, loo or factorial (got {kind})",
                            "pass e.g. --sweep single --vs RL2")
    base_path = resolve_base(_must_exist(rl), base)
    b = open_checkpoint(base_path, allow_pickle=allow_pickle)
    tax = b.taxonomy(unknown)
    runs = [("A", rl, open_rl(rl, b, allow_pickle=allow_pickle))]
    if vs is not None:
        runs.append(("B", vs, open_rl(_must_exist(vs, "--vs"), b, allow_pickle=allow_pickle)))
    for _, _, r in runs:
        check_pair(b, r, tax)
    present = X.present_groups(tax)
    if kind == "eval":
        if groups is None:
            raise GraftkitError("--eval needs --groups", "pass e.g. --groups attn,mlp")
        spec = GraftSpec.parse(groups, layers, alpha, reverse)
        exps = X.one_experiment(spec, present)
        chosen = tuple(g for g in spec.groups if g in present) if set(spec.groups) != set(X.GROUPS) else present
    else:
        if reverse:
            raise GraftkitError("--reverse applies to one graft, not a sweep", "drop --reverse or --sweep")
        default = X.layered_groups(tax) if kind == "layers" else present
        chosen = default if groups in (None, "all") else GraftSpec.parse(groups).groups
        try:
            alpha_list = [float(a) for a in alphas.split(",") if a.strip()]
        except ValueError:
            raise GraftkitError(f"--alphas {alphas!r}: expected a comma list of numbers", "e.g. --alphas 0,0.5,1") from None
        exps = X.expand_sweep(kind, chosen, present, layers=layers if kind != "layers" else "all", alphas=alpha_list)
    X.plan_sweep(tax, exps)  # every spec must select something, before any model loads
    sweep_layers = layers if kind not in ("layers", "eval") else "all"
    labels = dict(zip((k for k, _, _ in runs), result_labels([p for _, p, _ in runs])))
    if dry_run:
        payload = {"sweep": kind, "base": str(base_path), "rl": {k: str(p) for k, p, _ in runs},
                   "groups": list(chosen), "count": len(exps), "experiments": [e.as_dict() for e in exps],
                   "dry_run": True}
        if as_json:
            return _print_json(payload)
        t = Table(title=f"dry run: {kind} sweep over {escape(','.join(chosen) or 'nothing')} — {len(exps)} configurations"
                        + (" per run" if vs else ""))
        for c in ("config", "groups", "layers", "α", "role"):
            t.add_column(c, justify="right" if c == "α" else "left")
        for e in exps:
            t.add_row(escape(e.label), escape(",".join(e.groups) or "—"), escape(e.layers), f"{e.alpha:g}", e.role)
        out.print(t)
        return
    task_list, seed_list = resolve_tasks(tasks), _seed_list(seeds)
    decode = Decode(greedy=not sample, temperature=temperature, max_new_tokens=max_new_tokens)
    policy = _load_policy(base_path, allow_pickle)
    base_desc = describe(b)
    outcomes: dict[str, dict[str, np.ndarray]] = {}
    files, resumed, payload_runs = {}, {}, {}
    for key, path, r in runs:
        label = labels[key]
        dest = save if (save and key == "A") else current_run() / "results" / f"graft-{kind}-{label}.h5"
        if vs is not None and save and key == "B":
            dest = save.with_name(f"{save.stem}-vs{save.suffix}")
        setup = {"base": base_desc, "rl": describe(r), "tasks": task_list, "seeds": seed_list, "episodes": episodes,
                 "decode": asdict(decode), "unknown": unknown}
        done = {}
        if dest.is_file():
            try:
                done = X.completed_outcomes(read_result(dest), exps, setup)
            except GraftkitError:
                done = {}
        resumed[key] = sorted(done)
        if key == "B" and X.BASE_LABEL in outcomes.get("A", {}):
            done.setdefault(X.BASE_LABEL, outcomes["A"][X.BASE_LABEL])  # one base for both runs
        share = delta_anatomy(b, [r], [label], tax)
        movement = {g: float(v) for g, v in zip(share.coords["group"], share["group_share"][0])}
        common = dict(layers=sweep_layers, movement_share=movement,
                      attrs={**setup, "rl_label": label, "command": "graft --" + ("sweep " + kind if sweep else "eval")})
        partial: dict[str, np.ndarray] = dict(done)

        def stream(e, s, dest=dest, partial=partial, common=common):
            partial[e.label] = s  # a partial result after every configuration: an interrupted sweep resumes
            write_result(dest, X.sweep_result(kind, exps, partial, task_list, seed_list, episodes, chosen,
                                              compare_configs=False, **common))

        per = len(task_list) * len(seed_list) * episodes
        with Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} episodes"), TimeRemainingColumn(),
                      console=err, transient=True, disable=not err.is_terminal) as p:
            current = {}

            def start(e, p=p, current=current):
                current["id"] = p.add_task(f"{label}: {e.label}", total=per)

            outcomes[key] = X.run_sweep(
                exps, policy, b, r, task_list, seed_list, episodes, decode, done=done, on_start=start,
                on_episode=lambda ep, p=p, current=current: p.advance(current["id"]), on_result=stream,
                unknown=unknown, batch_size=batch_size)
        res = X.sweep_result(kind, exps, outcomes[key], task_list, seed_list, episodes, chosen, **common)
        files[key] = str(write_result(dest, res))
        payload_runs[key] = _sweep_json(res, path)
    dis = None
    if vs is not None:
        effect = X.GROUP_EFFECT[kind]
        subsets = {k: X.subset_outcomes(exps, outcomes[k], sweep_layers) for k in outcomes}
        d = attr.dissociation(subsets["A"], subsets["B"], chosen, kind=effect)
        dest = current_run() / "results" / f"graft-dissociation-{labels['A']}-vs-{labels['B']}.h5"
        files["dissociation"] = str(write_result(dest, X.dissociation_result(
            d, {"A": {"path": str(rl), "label": labels["A"], "result": files["A"]},
                "B": {"path": str(vs), "label": labels["B"], "result": files["B"]}},
            attrs={"base": base_desc, "sweep": kind})))
        dis = {"effect": effect, "double_dissociation": d.double_dissociation, "rule": attr.DISSOCIATION_RULE,
               "groups": {g: {"A": d.effect[0, i].tolist(), "B": d.effect[1, i].tolist(),
                              "difference": d.difference[i].tolist(), "verdict": d.verdict[i]}
                          for i, g in enumerate(d.groups)}}
    seconds = time.perf_counter() - t0
    if as_json:
        return _print_json({"sweep": kind, "base": str(base_path), "runs": payload_runs, "dissociation": dis,
                            "files": files, "resumed": resumed, "tasks": task_list, "seeds": len(seed_list),
                            "episodes": episodes, "decode": asdict(decode), "seconds": seconds})
    for key, _, _ in runs:
        _sweep_tables(payload_runs[key], labels[key], len(seed_list), episodes)
    if dis is not None:
        t = Table(title=f"double dissociation ({dis['effect']} effects): A = {escape(labels['A'])}, "
                        f"B = {escape(labels['B'])} — {'yes' if dis['double_dissociation'] else 'no'}")
        for c in ("group", "effect A", "effect B", "A − B", "verdict"):
            t.add_column(c, justify="left" if c in ("group", "verdict") else "right")
        for g, row in dis["groups"].items():
            t.add_row(g, *(_pts(row[k]) for k in ("A", "B", "difference")), row["verdict"])
        out.print(t)
        out.print(f"rule: {escape(attr.DISSOCIATION_RULE)}", soft_wrap=True)
    for k, f in files.items():
        note = f" (resumed {len(resumed[k])} configurations)" if resumed.get(k) else ""
        out.print(f"saved {escape(f)}{note}")
    out.print(f"{seconds:.1f} s")


def _pts(b) -> str:
    """(estimate, low, high) as percentage points."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return "—"
    return f"{100 * b[0]:+.1f} [{100 * b[1]:+.1f}, {100 * b[2]:+.1f}]"


def _sweep_json(res, rl_path) -> dict:
    configs = []
    for i, label in enumerate(res.coords["config"]):
        configs.append({
            "config": str(label), "groups": str(res["config_groups"][i]), "layers": str(res["config_layers"][i]),
            "alpha": float(res["config_alpha"][i]), "success": float(res["success"][i].mean()),
            "diff_vs_base": res["diff_vs_base"][i].tolist(), "verdict_vs_base": str(res["verdict_vs_base"][i]),
            "diff_vs_rl": res["diff_vs_rl"][i].tolist(), "verdict_vs_rl": str(res["verdict_vs_rl"][i]),
        })
    groups = [str(g) for g in res.coords["group"]]
    attribution = {}
    for j, g in enumerate(groups):
        row = {name: res[name][j].tolist() for name in ("group_effect", "main_effect", "shapley") if name in res.data}
        if "movement_share" in res.data:
            row["movement_share"] = float(res["movement_share"][j])
        attribution[g] = row
    payload = {"rl": str(rl_path), "configs": configs, "attribution": attribution,
               "group_effect": res.var_attrs.get("group_effect", {}).get("kind")}
    if "interaction" in res.data:
        payload["interactions"] = [{"groups": [groups[a], groups[c]], "interaction": res["interaction"][a, c].tolist()}
                                   for a in range(len(groups)) for c in range(a + 1, len(groups))]
    return payload


def _sweep_tables(run: dict, label: str, n_seeds: int, episodes: int) -> None:
    t = Table(title=f"{escape(label)}: grafts evaluated on identical episodes ({n_seeds} seeds × {episodes} episodes per task)")
    for c in ("config", "success", "vs base \\[95%]", "verdict vs base", "vs RL \\[95%]", "verdict vs RL"):
        t.add_column(c, justify="right" if c in ("success",) or c.startswith("vs") else "left")
    for c in run["configs"]:
        t.add_row(escape(c["config"]), f"{100 * c['success']:.1f}%", _pts(c["diff_vs_base"]), c["verdict_vs_base"],
                  _pts(c["diff_vs_rl"]), c["verdict_vs_rl"])
    out.print(t)
    if any(run["attribution"].values()):
        t = Table(title=(f"attribution of the success change to groups ({escape(run['group_effect'])} effect) beside "
                         "weight movement" if run["group_effect"] else "weight movement of the grafted groups"))
        cols = [c for c in ("group_effect", "main_effect", "shapley") if any(c in r for r in run["attribution"].values())]
        t.add_column("group")
        t.add_column("movement share", justify="right")
        for c in cols:
            t.add_column(c.replace("_", " "), justify="right")
        for g, r in run["attribution"].items():
            share = r.get("movement_share")
            t.add_row(g, "—" if share is None else f"{100 * share:.1f}%", *(_pts(r.get(c)) for c in cols))
        out.print(t)
    for row in run.get("interactions", []):
        out.print(f"interaction {'×'.join(row['groups'])}: {_pts(row['interaction'])}")


# ------------------------------------------------------------------------------------ eval, headroom


def _episode_progress(total: int, what: str) -> Progress:
    p = Progress(TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total} episodes"),
                 TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    p.add_task(what, total=total)
    return p


def _load_policy(path: Path, allow_pickle: bool, obs: str = "text"):
    """A causal-LM policy, or a vision-language one for an image-text-to-text folder (``--obs som``
    refuses a text-only folder before loading it)."""
    from .agent import load_policy

    return load_policy(Path(path), allow_pickle=allow_pickle, obs=obs)


def _run_eval(policy, tasks, seeds, episodes, decode, samples, backend, batch_size, label, obs: str = "text"):
    from .agent import evaluate

    total = len(tasks) * len(seeds) * episodes * samples
    with _episode_progress(total, label) as p:
        return evaluate(policy, tasks, seeds, episodes, decode, samples=samples, backend=backend,
                        batch_size=batch_size, on_episode=lambda e: p.advance(p.task_ids[0]), obs=obs)


def _seed_list(n: int) -> list[int]:
    if n < 1:
        raise GraftkitError(f"--seeds {n} must be ≥ 1", "pass e.g. --seeds 25")
    return list(range(n))


def _check_obs(obs: str, backend: str) -> None:
    """Validate --backend and --obs before any model loads. ``som`` needs a vision-language policy
    folder; ``_load_policy`` refuses a text-only one, naming it. ``text`` works with either kind."""
    if backend not in ("py", "miniwob"):
        raise GraftkitError(f"unknown --backend {backend!r}", "use py (the mirror) or miniwob (Chromium)")
    if obs not in ("text", "som"):
        raise GraftkitError(f"unknown --obs {obs!r}", "use text (element list) or som (Set-of-Marks screenshot)")


@app.command("eval")
@_handled
def eval_cmd(
    model: Path = typer.Option(..., "--model", help="Policy: an HF causal LM folder with its tokenizer, or an "
                                                     "image-text-to-text folder with its processor (for --obs som)."),
    tasks: str = typer.Option("mastered", help="Suite (mastered, headroom, all) or comma list of tasks."),
    seeds: int = typer.Option(25, help="Evaluation seeds 0..N-1."),
    episodes: int = typer.Option(4, help="Episodes per seed and task."),
    backend: str = typer.Option("py", help="py (the pure-Python mirror) or miniwob (real MiniWoB++ in Chromium)."),
    obs: str = typer.Option("text", help="Observation: text (element list) or som (Set-of-Marks screenshot)."),
    compare_to: Optional[Path] = typer.Option(None, "--compare", help="A second policy to compare on identical episodes."),
    sample: bool = typer.Option(False, help="Sample actions instead of greedy decoding."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
    batch_size: int = typer.Option(64, help="Episodes advanced together."),
    save: Optional[Path] = typer.Option(None, "--save", help="HDF5 result file (default: RUN/results/eval-*.h5)."),
    allow_pickle: bool = typer.Option(False, help="Load pickled .bin/.pt weights (weights_only=True)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Success per task with intervals over tasks × seeds × episodes; with --compare, the paired verdict."""
    from .agent import Decode, resolve_tasks
    from .stats import compare, wilson_interval
    from .store import write_result
    from .weights import describe, open_checkpoint

    _check_obs(obs, backend)
    task_list, seed_list = resolve_tasks(tasks), _seed_list(seeds)
    decode = Decode(greedy=not sample, temperature=temperature, top_p=top_p)
    runs = [("model", model)] + ([("compare", compare_to)] if compare_to else [])
    outcomes = {}
    for role, path in runs:
        policy = _load_policy(path, allow_pickle, obs)
        outcomes[role] = _run_eval(policy, task_list, seed_list, episodes, decode, 1, backend, batch_size,
                                   f"eval {Path(path).name}", obs)
        desc = describe(open_checkpoint(path, allow_pickle=allow_pickle))
        dest = (save if role == "model" and save else
                current_run() / "results"
                / f"eval-{Path(path).name}-{'sampled' if sample else 'greedy'}{'-som' if obs == 'som' else ''}.h5")
        write_result(dest, eval_result(outcomes[role], desc))
        outcomes[role].extra["file"] = str(dest)
    rows = []
    for i, t in enumerate(task_list + ["all"]):
        pick = (lambda o: o.success[..., 0].transpose(1, 0, 2).reshape(len(seed_list), -1)) if t == "all" else \
               (lambda o, i=i: o.success[i, :, :, 0])
        a = pick(outcomes["model"])
        row = {"task": t, "model": _rate_json(wilson_interval(int(a.sum()), a.size))}
        if compare_to:
            bse = pick(outcomes["compare"])
            c = compare(bse, a)  # a = the comparison base, b = the model
            row.update({"compare": _rate_json(c.rate_a), "diff": c.diff,
                        "bootstrap": [c.bootstrap.low, c.bootstrap.high], "bayes": [c.bayes.low, c.bayes.high],
                        "mcnemar_p": c.mcnemar.p_value, "verdict": c.verdict})
        rows.append(row)
    if as_json:
        return _print_json({"model": str(model), "compare": str(compare_to) if compare_to else None,
                            "tasks": rows, "seeds": len(seed_list), "episodes": episodes, "backend": backend,
                            "obs": obs,
                            "decode": decode.__dict__, "files": {k: o.extra["file"] for k, o in outcomes.items()}})
    t = Table(title=f"{escape(str(model))}: success over {len(seed_list)} seeds × {episodes} episodes "
                    f"({'sampled' if sample else 'greedy'}, {backend}, obs {obs})")
    t.add_column("task")
    t.add_column("success (95% Wilson)", justify="right")
    if compare_to:
        t.add_column(f"{escape(Path(compare_to).name)}", justify="right")
        t.add_column("diff \\[bootstrap] \\[Bayes]", justify="right")
        t.add_column("McNemar p", justify="right")
        t.add_column("verdict")
    for row in rows:
        cells = [escape(row["task"]), _rate_text(row["model"])]
        if compare_to:
            cells += [_rate_text(row["compare"]),
                      f"{100 * row['diff']:+.1f} [{100 * row['bootstrap'][0]:+.1f}, {100 * row['bootstrap'][1]:+.1f}] "
                      f"[{100 * row['bayes'][0]:+.1f}, {100 * row['bayes'][1]:+.1f}]",
                      f"{row['mcnemar_p']:.3g}", row["verdict"]]
        t.add_row(*cells)
    out.print(t)
    for k, o in outcomes.items():
        out.print(f"saved {escape(o.extra['file'])} ({o.seconds:.1f} s)")


def _rate_json(r) -> dict:
    return {"rate": r.rate, "low": r.low, "high": r.high, "successes": r.successes, "n": r.n}


def _rate_text(r: dict) -> str:
    return f"{100 * r['rate']:.1f}% [{100 * r['low']:.1f}, {100 * r['high']:.1f}]"


@app.command()
@_handled
def headroom(
    model: Path = typer.Option(..., "--model", help="Policy: an HF causal LM folder with its tokenizer, or an "
                                                     "image-text-to-text folder with its processor (for --obs som)."),
    tasks: str = typer.Option("all", help="Suite (mastered, headroom, all) or comma list of tasks."),
    k: int = typer.Option(8, help="Samples per episode (pass@k uses all k)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
    seeds: int = typer.Option(25, help="Evaluation seeds 0..N-1."),
    episodes: int = typer.Option(2, help="Episodes per seed and task."),
    backend: str = typer.Option("py", help="py (the mirror) or miniwob (Chromium)."),
    obs: str = typer.Option("text", help="Observation: text (element list) or som (Set-of-Marks screenshot)."),
    batch_size: int = typer.Option(64, help="Episodes advanced together."),
    save: Optional[Path] = typer.Option(None, "--save", help="HDF5 result file (default: RUN/results/headroom-*.h5)."),
    allow_pickle: bool = typer.Option(False, help="Load pickled .bin/.pt weights (weights_only=True)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Greedy vs sampled success per task, pass@k, and whether GRPO has room to climb (headroom)."""
    from .agent import Decode, resolve_tasks
    from .stats import headroom as headroom_table
    from .stats import pass_at_k
    from .store import write_result
    from .weights import describe, open_checkpoint

    _check_obs(obs, backend)
    if k < 2:
        raise GraftkitError(f"--k {k} must be ≥ 2", "pass e.g. --k 8")
    task_list, seed_list = resolve_tasks(tasks), _seed_list(seeds)
    policy = _load_policy(model, allow_pickle, obs)
    greedy = _run_eval(policy, task_list, seed_list, episodes, Decode(greedy=True), 1, backend, batch_size, "greedy",
                       obs)
    sampled = _run_eval(policy, task_list, seed_list, episodes,
                        Decode(greedy=False, temperature=temperature, top_p=top_p), k, backend, batch_size, "sampled",
                        obs)
    S = len(seed_list)
    g = {t: np.repeat(greedy.success[i, :, :, 0], k, axis=1).reshape(S, -1) for i, t in enumerate(task_list)}
    s_ = {t: sampled.success[i].reshape(S, -1) for i, t in enumerate(task_list)}
    table = headroom_table(g, s_)
    rows = []
    for i, t in enumerate(task_list):
        c = sampled.success[i].sum(-1)  # successes among k samples, per (seed, episode)
        h = table[t]
        rows.append({"task": t, "greedy": float(greedy.success[i].mean()), "sampled": float(sampled.success[i].mean()),
                     f"pass@{k}": float(np.mean([pass_at_k(k, int(x), k) for x in c.ravel()])),
                     "headroom": h.headroom, "bootstrap": [h.comparison.bootstrap.low, h.comparison.bootstrap.high],
                     "bayes": [h.comparison.bayes.low, h.comparison.bayes.high], "verdict": h.verdict})
    desc = describe(open_checkpoint(model, allow_pickle=allow_pickle))
    dest = save or current_run() / "results" / f"headroom-{Path(model).name}{'-som' if obs == 'som' else ''}.h5"
    write_result(dest, eval_result(
        sampled, desc, {"k": k, "temperature": temperature, "top_p": top_p}, kind="headroom",
        more={"greedy_success": (("task", "seed", "episode", "greedy_sample"), greedy.success.astype(np.int8))},
    ))
    if as_json:
        return _print_json({"model": str(model), "k": k, "temperature": temperature, "obs": obs, "tasks": rows,
                            "file": str(dest)})
    t = Table(title=f"headroom of {escape(str(model))}: {S} seeds × {episodes} episodes, k={k}, T={temperature:g}")
    for col in ("task", "greedy", "sampled", f"pass@{k}", "headroom \\[bootstrap] \\[Bayes]", "verdict"):
        t.add_column(col, justify="left" if col in ("task", "verdict") else "right")
    for r in rows:
        t.add_row(escape(r["task"]), f"{100 * r['greedy']:.1f}%", f"{100 * r['sampled']:.1f}%", f"{100 * r[f'pass@{k}']:.1f}%",
                  f"{100 * r['headroom']:+.1f} [{100 * r['bootstrap'][0]:+.1f}, {100 * r['bootstrap'][1]:+.1f}] "
                  f"[{100 * r['bayes'][0]:+.1f}, {100 * r['bayes'][1]:+.1f}]", r["verdict"])
    out.print(t)
    out.print(f"saved {escape(str(dest))}")


# --------------------------------------------------------------------------------------------- train

train_app = typer.Typer(no_args_is_help=True, help="Train the policies the study analyses: SFT, then GRPO.")
app.add_typer(train_app, name="train")


def _step_printer(total: int, what: str, as_json: bool, keys: tuple[str, ...]):
    """A progress bar on stderr whose description shows the latest metrics."""
    p = Progress(TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                 TextColumn("{task.description}"), TimeRemainingColumn(), console=err, transient=True,
                 disable=not err.is_terminal)
    task = p.add_task("", total=total)

    def on_step(m: dict) -> None:
        p.update(task, completed=m["step"], description=" ".join(f"{k} {m[k]:.3g}" for k in keys if k in m))

    return p, on_step


def _save_training_curves(folder: Path, kind: str) -> Path:
    """A run's train_log.jsonl as a labelled result in the current run's store."""
    from .store import write_result

    return write_result(current_run() / "results" / f"train-{kind}-{folder.name}.h5", training_curves(folder, kind))


def _parse_budgets(items: list[str], tasks: str | None) -> dict[str, int]:
    from .train.sft import DEFAULT_BUDGETS

    budgets = dict(DEFAULT_BUDGETS)
    if tasks:
        from .agent import resolve_tasks

        keep = set(resolve_tasks(tasks))
        budgets = {t: n for t, n in budgets.items() if t in keep} | {t: 400 for t in keep - set(budgets)}
    for item in items:
        task, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise GraftkitError(f"--budget {item!r}: expected TASK=N", "e.g. --budget click-tab=200")
        budgets[task.strip()] = int(n)
    return budgets


def _parse_decoys(items: list[str]) -> dict[str, float]:
    from .train.sft import DEFAULT_DECOYS

    decoys = dict(DEFAULT_DECOYS)
    for item in items:
        task, sep, rate = item.partition("=")
        try:
            decoys[task.strip()] = float(rate) if sep else math.nan
        except ValueError:
            decoys[task.strip()] = math.nan
        if not 0 <= decoys[task.strip()] < 1:
            raise GraftkitError(f"--decoy {item!r}: expected TASK=RATE with 0 ≤ RATE < 1", "e.g. --decoy focus-text-2=0.5")
    return decoys


@train_app.command("sft")
@_handled
def train_sft(
    out_dir: Path = typer.Option(..., "--out", help="Output folder of the SFT policy."),
    tasks: Optional[str] = typer.Option(None, help="Suite(s) or tasks to demonstrate (default: both suites)."),
    budget: List[str] = typer.Option([], help="Demonstration pool of a task: TASK=N episodes (repeatable)."),
    decoy: List[str] = typer.Option([], help="Demonstrator slip rate of a task: TASK=RATE (repeatable; default: "
                                             "0.7 on the headroom suite, 0 elsewhere)."),
    size: str = typer.Option("micro", help="Tiny policy size: nano, micro, small."),
    init: Optional[Path] = typer.Option(None, help="Fine-tune this HF causal LM folder instead of a tiny policy."),
    steps: int = typer.Option(6000, help="Optimizer steps."),
    batch_size: int = typer.Option(32, help="Turns per step."),
    lr: float = typer.Option(3e-3, help="Peak learning rate."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(2, help="torch threads."),
    force: bool = typer.Option(False, help="Replace an existing output folder written by graftkit."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Supervised fine-tuning on oracle demonstrations (loss on action tokens only)."""
    from .train.sft import SFTConfig, run_sft
    from .weights import check_destination

    check_destination(out_dir, [init] if init else [], force)
    cfg = SFTConfig(out=str(out_dir), budgets=_parse_budgets(budget, tasks), decoys=_parse_decoys(decoy), size=size,
                    init=str(init) if init else None, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                    threads=threads)
    t0 = time.perf_counter()
    p, on_step = _step_printer(steps, "sft", as_json, ("loss", "lr"))
    with p:
        dest = run_sft(cfg, on_step=on_step, force=force)
    log = [json.loads(x) for x in (dest / "train_log.jsonl").read_text().splitlines()]
    info = {"out": str(dest), "steps": steps, "final_loss": log[-1]["loss"], "seconds": time.perf_counter() - t0,
            "budgets": cfg.budgets, "curves": str(_save_training_curves(dest, "sft"))}
    if as_json:
        return _print_json(info)
    out.print(f"SFT policy → {escape(str(dest))}: {steps} steps, final action loss {log[-1]['loss']:.4f}, "
              f"{info['seconds']:.0f} s")


@train_app.command("grpo")
@_handled
def train_grpo(
    init: Path = typer.Option(..., help="The SFT policy to start from."),
    out_dir: Path = typer.Option(..., "--out", help="Output folder of the RL policy."),
    tasks: str = typer.Option("mastered", help="Suite(s) or tasks sampled as prompts."),
    steps: int = typer.Option(40, help="Optimisation steps."),
    prompts_per_step: int = typer.Option(4, help="Task instances (groups) per step."),
    group_size: int = typer.Option(8, help="Episodes per task instance (G)."),
    lr: float = typer.Option(1e-4, help="Learning rate."),
    warmup: int = typer.Option(0, help="Linear warmup steps."),
    beta: float = typer.Option(0.0, help="KL weight to the SFT reference (k3); 0 loads no reference."),
    loss: str = typer.Option("dapo", help="grpo, dr_grpo, dapo, cispo, gspo."),
    epsilon: float = typer.Option(0.2, help="Clip ε_low."),
    epsilon_high: Optional[float] = typer.Option(None, help="Clip ε_high (default ε_low; cispo: the cap ε_max)."),
    scale_rewards: str = typer.Option("group", help="group, batch or none."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
    max_new_tokens: int = typer.Option(32, help="Longest action in tokens."),
    num_iterations: int = typer.Option(1, help="Optimiser updates per generated batch."),
    grad_clip: float = typer.Option(1.0, help="Gradient-norm clip (0: off)."),
    seed: int = typer.Option(0, help="Training seed."),
    threads: int = typer.Option(1, help="torch threads."),
    stages: int = typer.Option(0, help="Mu-GRPO generation→optimisation stages (0: off)."),
    veto_epsilon: Optional[float] = typer.Option(None, help="Mu-GRPO negative-advantage veto ε_v (default off)."),
    focal_gamma: float = typer.Option(0.0, help="Focal difficulty scaling γ (0: off)."),
    verigate: bool = typer.Option(False, help="VeriGate process-reward fallback for equal-reward groups."),
    reward: str = typer.Option("success", help="success (1/0) or raw (MiniWoB++ raw reward)."),
    checkpoint_every: int = typer.Option(0, help="Resumable checkpoint every N steps."),
    max_turns: Optional[int] = typer.Option(None, help="End episodes after N turns (1: single-turn GRPO)."),
    resume: bool = typer.Option(False, help="Continue from the newest checkpoint of this run."),
    force: bool = typer.Option(False, help="Replace an existing output folder written by graftkit."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """GRPO from an SFT policy, with every knob of the control grid and the Mu-GRPO/focal/VeriGate switches."""
    from .agent import resolve_tasks
    from .train.grpo import GRPOConfig, run_grpo

    if not init.exists():
        raise GraftkitError(f"--init {init}: no such folder", "pass the SFT policy folder")
    cfg = GRPOConfig(
        init=str(init), out=str(out_dir), tasks=tuple(resolve_tasks(tasks)), steps=steps,
        prompts_per_step=prompts_per_step, group_size=group_size, lr=lr, warmup=warmup, beta=beta, loss=loss,
        epsilon=epsilon, epsilon_high=epsilon_high, scale_rewards=scale_rewards, temperature=temperature,
        top_p=top_p, max_new_tokens=max_new_tokens, num_iterations=num_iterations, grad_clip=grad_clip,
        seed=seed, threads=threads, stages=stages, veto_epsilon=veto_epsilon, focal_gamma=focal_gamma,
        verigate=verigate, reward=reward, checkpoint_every=checkpoint_every, max_turns=max_turns,
    )
    t0 = time.perf_counter()
    p, on_step = _step_printer(steps, "grpo", as_json, ("success", "loss", "entropy"))
    with p:
        dest = run_grpo(cfg, resume=resume, force=force, on_step=on_step)
    log = [json.loads(x) for x in (dest / "train_log.jsonl").read_text().splitlines()]
    info = {"out": str(dest), "steps": steps, "seconds": time.perf_counter() - t0,
            "curves": str(_save_training_curves(dest, "grpo")),
            "seconds_per_step": log[-1]["seconds"] / len(log),
            "final": {k: log[-1][k] for k in ("success", "loss", "entropy", "frac_reward_zero_std")}}
    if as_json:
        return _print_json(info)
    out.print(f"GRPO policy → {escape(str(dest))}: {steps} steps, {info['seconds_per_step']:.2f} s/step, "
              f"last batch success {log[-1]['success']:.2f}")


@app.command()
@_handled
def sweep(
    grid: Path = typer.Argument(..., help="Grid file (YAML): out, inits, base, product, runs."),
    dry_run: bool = typer.Option(False, help="Print the run specs; run nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run a control grid of GRPO runs: completed runs are skipped, partial runs resumed."""
    from .train.sweep import expand, run_sweep

    specs = expand(grid)
    rows = [{"name": s.name, "status": s.status(), **{k: v for k, v in s.config.as_dict().items()
                                                       if k in ("init", "lr", "beta", "seed", "epsilon",
                                                                "epsilon_high", "loss", "steps", "stages")},
             "out": s.config.out} for s in specs]
    if dry_run:
        if as_json:
            return _print_json({"grid": str(grid), "runs": [{**r, "config": s.config.as_dict()}
                                                              for r, s in zip(rows, specs)]})
        t = Table(title=f"{escape(str(grid))}: {len(specs)} runs")
        for c in ("name", "status", "init", "lr", "beta", "seed", "epsilon", "epsilon_high", "loss", "steps"):
            t.add_column(c, justify="left" if c in ("name", "status", "init", "loss") else "right")
        for r in rows:
            t.add_row(*(escape(Path(str(r[c])).name if c == "init" else str(r[c])) for c in
                        ("name", "status", "init", "lr", "beta", "seed", "epsilon", "epsilon_high", "loss", "steps")))
        out.print(t)
        return
    for s in specs:
        if not Path(s.config.init).exists():
            raise GraftkitError(f"run {s.name}: init {s.config.init} does not exist",
                                "train the SFT policy first (graftkit train sft) or fix the grid's inits")
    records = run_sweep(specs, on_run=lambda s, st: err.print(f"{escape(s.name)}: {st}"))
    if as_json:
        return _print_json({"grid": str(grid), "runs": records})
    for r in records:
        out.print(f"{escape(r['name'])}: {r['status']} → {escape(r['out'])}")


# ---------------------------------------------------------------------------------------------- rank


def _run_checkpoints(run: Path) -> list[Path]:
    """Every model folder of ``run`` that graftkit wrote (a provenance record and weight files)."""
    from .weights import PROVENANCE

    weight_globs = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")
    return sorted(p for p in run.iterdir() if p.is_dir() and (p / PROVENANCE).is_file()
                  and any(any(p.glob(g)) for g in weight_globs)) if run.is_dir() else []


def _prompt_progress(total: int, what: str) -> Progress:
    p = Progress(TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total} prompts"),
                 TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    p.add_task(what, total=total)
    return p


def _rank_activations(model, layers, metric, save, backend, tokens, centred, probes, probe_file, tasks, batch_size,
                      as_json) -> None:
    """`graftkit rank --what activations`: hidden-state ranks per layer on probe prompts, per checkpoint."""
    from .rank import METRICS, PAIR_METRICS
    from .rank.activations import BACKENDS, TOKENS, activation_ranks, probe_prompts, prompts_from_file
    from .store import write_result
    from .weights import band_rule

    t0 = time.perf_counter()
    if tokens not in TOKENS:
        raise GraftkitError(f"--tokens {tokens!r} is not an option", f"use one of {', '.join(TOKENS)}")
    if backend not in BACKENDS:
        raise GraftkitError(f"--backend {backend!r} is not an option", f"use one of {', '.join(BACKENDS)}")
    if batch_size < 1:
        raise GraftkitError(f"--batch-size {batch_size} must be at least 1", "use e.g. 8")
    shown = [m.strip() for m in (metric or "erank,stable_rank,participation_ratio").split(",") if m.strip()]
    for m in shown:
        if m not in METRICS:
            hint = " (pair measures need --what delta)" if m in PAIR_METRICS else ""
            raise GraftkitError(f"--metric: unknown metric '{m}'{hint}", f"use one of {', '.join(METRICS)}")
    if not shown:
        raise GraftkitError("--metric names no metric", f"use one of {', '.join(METRICS)}")
    run = current_run()
    models = [_must_exist(Path(p), "--model") for p in model] if model else _run_checkpoints(run)
    if not models:
        raise GraftkitError(f"no checkpoints found in {run}", "pass --model PATH, or run `graftkit demo` first")
    if save is not None and len(models) > 1:
        raise GraftkitError(f"--save names one file but {len(models)} models are ranked", "rank one --model, or drop --save")
    prompts = prompts_from_file(probe_file) if probe_file is not None else probe_prompts(tasks, probes)
    source = {"file": str(probe_file)} if probe_file is not None else {"tasks": tasks, "seed": 0}
    labels = result_labels(models)
    tag = "" if layers.strip().lower() in ("", "all") else "-" + layers.strip().lower().replace(",", "+")
    payload: dict = {"what": "activations", "layers": layers, "metrics": shown, "backend": backend, "tokens": tokens,
                     "centred": centred, "probes": {"n": len(prompts), **source}, "models": {}}
    for path, lab in zip(models, labels):
        policy = _load_policy(path, allow_pickle=False)
        prov = {"config": {"command": "rank", "what": "activations", "layers": layers, "backend": backend,
                           "tokens": tokens, "centred": centred, "probes": payload["probes"], "batch_size": batch_size}}
        with _prompt_progress(len(prompts), f"rank activations {lab}") as p:
            tick = lambda n: p.advance(p.task_ids[0], n)  # noqa: E731
            # the CLI loaded this model for the measurement alone: TransformerBridge may rewire it in place
            res = activation_ranks(policy, None, prompts, layers, tokens=tokens, centred=centred, backend=backend,
                                   batch_size=batch_size, on_batch=tick, give_model=True, provenance=prov)
        del policy
        dest = save or run / "results" / f"rank-activations-{lab}{tag}.h5"
        write_result(dest, res)
        mi = [list(res.coords["metric"]).index(m) for m in shown]
        rows = [{"layer": int(L), "block": int(res["block"][i]) if res["block"][i] >= 0 else None,
                 "n_tokens": int(res["n_tokens"][i]), **{m: float(res["value"][i, k]) for m, k in zip(shown, mi)}}
                for i, L in enumerate(res.coords["layer"])]
        payload["models"][lab] = {"path": str(path), "base": None, "result_file": str(dest), "layers": rows,
                                  "outside_decoder": [], "n_prompts": len(prompts)}
        payload["band_rule"] = res.attrs["band_rule"]
        if not as_json:
            title = (f"{escape(lab)}: activation ranks per hidden state ({escape(backend)}, {escape(tokens)} tokens, "
                     f"{'centred' if centred else 'uncentred'}; layers {escape(layers)})")
            t = Table(title=title, caption="layer L = output of decoder block L-1 (0 = embedding output); "
                                           "fp64 covariance, position 0 dropped")
            for c in ("layer", "block", "tokens", *shown):
                t.add_column(c, justify="left" if c == "layer" else "right")
            for r in rows:
                t.add_row(str(r["layer"]), "emb" if r["block"] is None else str(r["block"]), str(r["n_tokens"]),
                          *(f"{r[m]:.4g}" for m in shown))
            out.print(t)
            out.print(f"saved {escape(str(dest))} ({len(prompts)} prompts)")
    if not as_json:
        out.print(escape(payload["band_rule"]))
    payload["seconds"] = time.perf_counter() - t0
    if as_json:
        _print_json(payload)


@app.command()
@_handled
def rank(
    model: Optional[List[Path]] = typer.Option(None, "--model", help="Checkpoint(s) (default: every model folder of the current run)."),
    vs: Optional[Path] = typer.Option(None, "--vs", help="Base for --what delta (default: each model's recorded SFT parent)."),
    what: str = typer.Option("weights", "--what", help="weights | delta | activations."),
    layers: str = typer.Option("all", help="all | early | mid | late | indices like 0-3,10."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Comma list shown in the table (default erank,stable_rank[,spectral_drift,intruders | ,participation_ratio])."),
    save: Optional[Path] = typer.Option(None, "--save", help="HDF5 result file, one model only (default: RUN/results/rank-*.h5)."),
    backend: str = typer.Option("hooks", "--backend", help="activations: hooks (forward hooks, any HF causal LM) | lens (TransformerLens bridge)."),
    tokens: str = typer.Option("last", "--tokens", help="activations: last | all tokens of each prompt (position 0 always dropped)."),
    centred: bool = typer.Option(True, "--centred/--no-centred", help="activations: covariance (centred) or uncentred second moment."),
    probes: int = typer.Option(64, "--probes", help="activations: number of probe prompts drawn from --tasks."),
    probe_file: Optional[Path] = typer.Option(None, "--probe-file", help="activations: text file, one prompt per line (replaces --probes)."),
    tasks: str = typer.Option("all", "--tasks", help="activations: suite (mastered, headroom, all) or tasks the probes come from."),
    batch_size: int = typer.Option(8, "--batch-size", help="activations: prompts per forward pass."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Spectral ranks of every weight matrix (or of the RL delta), per tensor and per decoder layer, or of
    the hidden states on probe prompts, per layer."""
    from .rank import METRICS, PAIR_METRICS, delta_ranks, weight_ranks
    from .store import write_result
    from .weights import band_rule, open_checkpoint, recorded_base, resolve_base
    from .weights.taxonomy import DECODER

    t0 = time.perf_counter()
    if what == "activations":
        return _rank_activations(model, layers, metric, save, backend, tokens, centred, probes, probe_file, tasks,
                                 batch_size, as_json)
    if what not in ("weights", "delta"):
        raise GraftkitError(f"--what {what!r} is not an option", "use weights, delta or activations")
    allowed = METRICS + (PAIR_METRICS if what == "delta" else ())
    default = "erank,stable_rank" + (",spectral_drift,intruders" if what == "delta" else "")
    shown = [m.strip() for m in (metric or default).split(",") if m.strip()]
    for m in shown:
        if m not in allowed:
            hint = " (pair measures need --what delta)" if m in PAIR_METRICS else ""
            raise GraftkitError(f"--metric: unknown metric '{m}'{hint}", f"use one of {', '.join(allowed)}")
    if not shown:
        raise GraftkitError("--metric names no metric", f"use one of {', '.join(allowed)}")
    run = current_run()
    if model:
        models = [_must_exist(Path(p), "--model") for p in model]
    else:
        models = _run_checkpoints(run)
        if what == "delta" and vs is None:
            models = [p for p in models if recorded_base(p) is not None]
        if not models:
            raise GraftkitError(f"no checkpoints found in {run}" + (" with a recorded SFT parent" if what == "delta" else ""),
                                "pass --model PATH, or run `graftkit demo` first")
    if save is not None and len(models) > 1:
        raise GraftkitError(f"--save names one file but {len(models)} models are ranked", "rank one --model, or drop --save")
    labels = result_labels(models)
    tag = "" if layers.strip().lower() in ("", "all") else "-" + layers.strip().lower().replace(",", "+")
    payload: dict = {"what": what, "layers": layers, "metrics": shown, "models": {}}
    for path, lab in zip(models, labels):
        ckpt = open_checkpoint(path)
        tax = ckpt.taxonomy()
        prov = {"config": {"command": "rank", "what": what, "layers": layers}}
        base_ck = None
        if what == "delta":
            base_ck = open_checkpoint(resolve_base(path, vs))
            tax = base_ck.taxonomy()
        total = (base_ck or ckpt).nbytes * (2 if base_ck else 1)
        with _progress(total, f"rank {lab}") as p:
            tick = lambda n, nbytes: p.advance(p.task_ids[0], nbytes)  # noqa: E731
            res = (delta_ranks(base_ck, ckpt, tax, layers, on_tensor=tick, provenance=prov) if base_ck
                   else weight_ranks(ckpt, tax, layers, on_tensor=tick, provenance=prov))
        dest = save or run / "results" / f"rank-{what}-{lab}{tag}.h5"
        write_result(dest, res)
        mi = [list(res.coords["metric"]).index(m) for m in shown]
        groups = list(res.coords["group"])
        rows = [{"layer": int(L), **{m: float(res["value_layer"][i, -1, k]) for m, k in zip(shown, mi)},
                 "groups": {g: {m: float(res["value_layer"][i, j, k]) for m, k in zip(shown, mi)}
                            for j, g in enumerate(groups[:-1]) if res["count_layer"][i, j]}}
                for i, L in enumerate(res.coords["layer"])]
        outside = [{"tensor": str(n), "group": str(res["tensor_group"][t]),
                    **{m: float(res["value"][t, k]) for m, k in zip(shown, mi)}}
                   for t, n in enumerate(res.coords["tensor"]) if res["tensor_layer"][t] < 0]
        payload["models"][lab] = {"path": str(path), "base": str(base_ck.path) if base_ck else None,
                                  "result_file": str(dest), "layers": rows, "outside_decoder": outside,
                                  "skipped": len(res.attrs["skipped"]), "matrices": len(res.coords["tensor"])}
        payload["band_rule"] = band_rule(tax.n_layers.get(DECODER, 0)) if tax.n_layers.get(DECODER) else None
        if not as_json:
            title = f"{escape(lab)}: {what} ranks per layer (mean over the layer's matrices; layers {escape(layers)})"
            t = Table(title=title)
            t.add_column("layer", overflow="fold")
            for m in shown:
                t.add_column(m, justify="right")
            for r in rows:
                t.add_row(str(r["layer"]), *(f"{r[m]:.4g}" for m in shown))
            for o in outside:
                t.add_row(escape(o["tensor"]), *(f"{o[m]:.4g}" for m in shown))
            out.print(t)
            out.print(f"saved {escape(str(dest))} ({len(res.coords['tensor'])} matrices, "
                      f"{len(res.attrs['skipped'])} 1-D tensors skipped)")
    payload["seconds"] = time.perf_counter() - t0
    if as_json:
        _print_json(payload)


# -------------------------------------------------------------------------------------------- couple


def _couple_layer_ids(res) -> list[int]:
    """Decoder layer indices of a rank result's rows: its layer coordinate, or for activation ranks the
    decoder block whose output each hidden state is (the embedding output, block −1, is left out)."""
    if res.kind == "rank-activations":
        return [int(b) for b in res["block"] if b >= 0]
    return [int(L) for L in res.coords["layer"]]


def _couple_n_layers(res) -> int:
    """The model's decoder depth as a rank result records it (attrs n_layers, else its band rule)."""
    import re

    if res.kind == "rank-activations":
        return len(_couple_layer_ids(res))
    if res.attrs.get("n_layers"):
        return int(res.attrs["n_layers"])
    m = re.search(r"with n = (\d+)", str(res.attrs.get("band_rule", "")))
    return int(m[1]) if m else int(max(res.coords["layer"], default=-1)) + 1


def _couple_layer_values(res, metric: str, path: Path) -> np.ndarray:
    """value_layer[:, group "all", metric] (or value_layer[:, metric] for a result without groups); for
    activation ranks, value[:, metric] of the decoder blocks' outputs (see :func:`_couple_layer_ids`)."""
    metrics = [str(m) for m in res.coords.get("metric", [])]
    if res.kind == "rank-activations" and metric in metrics:
        return np.asarray(res["value"])[np.asarray(res["block"]) >= 0, metrics.index(metric)]
    if "value_layer" not in res.data or metric not in metrics:
        raise GraftkitError(f"{path}: no per-layer '{metric}' (metrics: {', '.join(metrics) or 'none'})",
                            f"pass --metric one of {', '.join(metrics)}" if metrics else "re-run graftkit rank")
    dims, v = res.dims("value_layer"), res["value_layer"]
    k = metrics.index(metric)
    if dims == ("layer", "group", "metric"):
        return v[:, [str(g) for g in res.coords["group"]].index("all"), k]
    if dims == ("layer", "metric"):
        return v[:, k]
    raise GraftkitError(f"{path}: value_layer has dims {list(dims)}", "expected [layer, group, metric] or [layer, metric]")


def _couple_newest(found: dict, key: str, entry: dict, better) -> None:
    if key not in found or better(entry, found[key]):
        found[key] = entry


@app.command()
@_handled
def couple(
    run: Optional[Path] = typer.Argument(None, help="Run folder (default: the current run)."),
    metric: str = typer.Option("erank", "--metric", help="Rank metric to couple (any metric of the rank results)."),
    what: str = typer.Option("weights", "--what", help="weights | activations: which rank results to read."),
    layers: str = typer.Option("all", help="Decoder layers: all | early | mid | late | indices like 0-3,10."),
    level: float = typer.Option(0.95, help="Interval level (correlations, paired verdicts, agreement)."),
    n_boot: int = typer.Option(10_000, help="Bootstrap resamples of the correlations."),
    seed: int = typer.Option(0, help="Seed of every bootstrap and posterior draw."),
    save: Optional[Path] = typer.Option(None, "--save", help="HDF5 result file (default: RUN/results/coupling-<what>-<metric>.h5)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Does per-layer rank track success across checkpoints? Correlations, and the both-directions test vs SFT."""
    from .rank.coupling import DIRECTIONS, both_directions, coupling, coupling_result
    from .stats import compare
    from .store import read_result, write_result
    from .weights import band_of, band_rule, parse_layers, recorded_base

    t0 = time.perf_counter()
    if what not in ("weights", "activations"):
        raise GraftkitError(f"--what {what!r} is not an option", "use weights or activations")
    run_dir = Path(run) if run is not None else current_run()
    results = run_dir / "results"
    if not results.is_dir():
        raise GraftkitError(f"{results}: no results folder", "pass a run folder, or run `graftkit demo` first")

    def key_of(res, path: Path) -> str:
        model = res.attrs.get("model")
        if not isinstance(model, dict) or not model.get("path"):
            raise GraftkitError(f"{path}: records no model path (attrs['model'])", "re-create it with graftkit")
        return os.path.normpath(str(model["path"]))

    ranks, evals = {}, {}
    for p in sorted(results.glob(f"rank-{what}-*.h5")):
        res = read_result(p)
        _couple_newest(ranks, key_of(res, p), {"path": p, "res": res},
                       lambda a, b: (len(_couple_layer_ids(a["res"])), str(a["res"].attrs.get("created")))
                       > (len(_couple_layer_ids(b["res"])), str(b["res"].attrs.get("created"))))
    for p in sorted(results.glob("eval-*-greedy.h5")):
        res = read_result(p)
        if res.kind != "eval":
            continue
        _couple_newest(evals, key_of(res, p), {"path": p, "res": res},
                       lambda a, b: str(a["res"].attrs.get("created")) > str(b["res"].attrs.get("created")))
    both = sorted(set(ranks) & set(evals))
    if len(both) < 3:
        no_eval = [f"{ranks[k]['path'].name} (make it: graftkit eval --model {k})" for k in sorted(set(ranks) - set(evals))]
        no_rank = [f"{evals[k]['path'].name} (make it: graftkit rank --model {k} --what {what})"
                   for k in sorted(set(evals) - set(ranks))]
        parts = [f"{len(both)} checkpoint(s) in {results} have both a rank-{what}-*.h5 and an eval-*-greedy.h5 "
                 "result; coupling needs at least 3"]
        if no_eval:
            parts.append("rank results without an eval: " + "; ".join(no_eval))
        if no_rank:
            parts.append("eval results without a rank: " + "; ".join(no_rank))
        raise GraftkitError(". ".join(parts), "create the missing results with the commands named, then rerun couple")

    # every checkpoint must be evaluated on the same episodes and ranked at the same layers
    ref_eval = evals[both[0]]
    for k in both[1:]:
        for dim in ("task", "seed", "episode", "sample"):
            if list(evals[k]["res"].coords[dim]) != list(ref_eval["res"].coords[dim]):
                raise GraftkitError(f"{evals[k]['path'].name} and {ref_eval['path'].name} cover different "
                                    f"episodes ({dim} differs)",
                                    "evaluate every checkpoint with the same --tasks, --seeds and --episodes")
    n_layers = _couple_n_layers(ranks[both[0]]["res"])
    chosen = parse_layers(layers, n_layers)
    common = set.intersection(*(set(_couple_layer_ids(ranks[k]["res"])) for k in both))
    layer_ids = sorted(common if chosen is None else common & chosen)
    if not layer_ids:
        raise GraftkitError(f"--layers {layers}: none of these decoder layers is ranked in every rank-{what} result",
                            f"rerun graftkit rank --what {what} --layers all, or pick layers they share")
    R = np.empty((len(both), len(layer_ids)))
    for i, k in enumerate(both):
        res = ranks[k]["res"]
        if _couple_n_layers(res) != n_layers:
            raise GraftkitError(f"{ranks[k]['path'].name} ranks a {_couple_n_layers(res)}-layer model, "
                                f"{ranks[both[0]]['path'].name} a {n_layers}-layer one", "couple checkpoints of one model")
        vals = _couple_layer_values(res, metric, ranks[k]["path"])
        pos = {L: j for j, L in enumerate(_couple_layer_ids(res))}
        R[i] = [vals[pos[L]] for L in layer_ids]
    outcome = {k: np.asarray(evals[k]["res"]["success"]).transpose(1, 0, 2, 3).reshape(
        len(ref_eval["res"].coords["seed"]), -1) for k in both}
    success = np.array([outcome[k].mean() for k in both])
    n_success = np.array([outcome[k].size for k in both], dtype=np.int64)
    labels = result_labels([Path(k) for k in both])
    conventions = {
        "metric": metric, "what": what, "rank_value": "value_layer[layer, group='all', metric]: mean over the "
        "layer's matrices" if what == "weights" else f"value_layer of the rank-{what} results",
        "layer_indexing": "decoder layer index, 0-based (value_layer's layer coordinate)",
        "success": "greedy success rate over every task, seed and episode of the eval result",
        "runs": "every checkpoint of the run with both results (its SFT parent included)",
        "checkpoints": {lab: k for lab, k in zip(labels, both)},
        "rank_files": {lab: str(ranks[k]["path"]) for lab, k in zip(labels, both)},
        "eval_files": {lab: str(evals[k]["path"]) for lab, k in zip(labels, both)},
        "config": {"command": "couple", "metric": metric, "what": what, "layers": layers, "level": level,
                   "n_boot": n_boot, "seed": seed},
    }
    corr = coupling(R, success, n_success, level=level, n_boot=n_boot, seed=seed, runs=labels, layers=layer_ids,
                    n_layers=n_layers, conventions=conventions)

    # both directions: every checkpoint whose recorded SFT parent is itself among the coupled checkpoints
    index = {k: i for i, k in enumerate(both)}
    parent = {}
    for k in both:
        b = recorded_base(Path(k))
        if b is not None and os.path.normpath(str(Path(b).resolve())) in index:
            parent[k] = os.path.normpath(str(Path(b).resolve()))
    verdicts, diffs = ["no recorded SFT parent among the checkpoints"] * len(both), {}
    for k, pk in parent.items():
        c = compare(outcome[pk], outcome[k], level=level, seed=seed)
        verdicts[index[k]] = c.verdict
        diffs[k] = {"diff": c.diff, "bootstrap": [c.bootstrap.low, c.bootstrap.high],
                    "bayes": [c.bayes.low, c.bayes.high], "verdict": c.verdict}
    bd = None
    if parent:
        sub = [k for k in both if k in parent]
        rows = [index[k] for k in sub]
        prow = [index[parent[k]] for k in sub]
        bd = both_directions(R[rows], success[rows], R[prow], success[prow], [verdicts[i] for i in rows], level,
                             runs=[labels[i] for i in rows], layers=layer_ids, n_layers=n_layers,
                             conventions={"reference": "each run's recorded SFT parent (graftkit.json base_model)",
                                          "verdict_source": "stats.compare(parent eval, run eval) on identical "
                                                            "episodes, seed " + str(seed)})
        # keep the run coordinate of the correlation: rows of runs without a parent stay NaN / "excluded"
        full = {}
        for name, (dims, arr) in bd.data.items():
            if dims and dims[0] == "run":
                shape = (len(both),) + arr.shape[1:]
                fill = np.full(shape, "no parent", dtype=object) if arr.dtype == object else np.full(shape, np.nan)
                fill[rows] = arr
                arr = fill
            full[name] = (dims, arr)
        from .store import Result

        bd = Result(bd.kind, {**bd.coords, "run": corr.coords["run"]}, full, bd.attrs, bd.var_attrs)
    res = coupling_result(corr, bd)
    dest = save or results / f"coupling-{what}-{metric}.h5"
    write_result(dest, res)

    def ci(arr, j, s):
        return {"estimate": arr[j, s, 0], "low": arr[j, s, 1], "high": arr[j, s, 2]}

    def rows_of(kind: str, names) -> list[dict]:
        out_rows = []
        for j, name in enumerate(names):
            row = {kind: name, "spearman": ci(res[f"corr_{kind}"], j, 0), "pearson": ci(res[f"corr_{kind}"], j, 1),
                   "n": int(res[f"n_{kind}"][j]), "reason": str(res[f"reason_{kind}"][j]) or None}
            if kind == "layer":
                row["band"] = band_of(int(name), n_layers)
            if bd is not None:
                for d, direction in enumerate(DIRECTIONS):
                    row[direction] = {"agree": int(res[f"agree_{kind}"][j, d]), "total": int(res[f"total_{kind}"][j, d]),
                                      "frac": res[f"frac_{kind}"][j, d, 0], "low": res[f"frac_{kind}"][j, d, 1],
                                      "high": res[f"frac_{kind}"][j, d, 2]}
                row["verdict"] = str(res[f"verdict_{kind}"][j])
            out_rows.append(row)
        return out_rows

    layer_rows = rows_of("layer", [int(L) for L in res.coords["layer"]])
    band_rows = rows_of("band", [str(b) for b in res.coords["band"]])
    checkpoints = [{"label": lab, "model": k, "success": float(success[i]), "episodes": int(n_success[i]),
                    "parent": labels[index[parent[k]]] if k in parent else None, "vs_parent": diffs.get(k),
                    "rank_file": str(ranks[k]["path"]), "eval_file": str(evals[k]["path"])}
                   for i, (lab, k) in enumerate(zip(labels, both))]
    note = None if bd is not None else ("no checkpoint's recorded SFT parent (graftkit.json base_model) is among the "
                                        "coupled checkpoints: the both-directions test needs the SFT's rank and eval")
    payload = {"run": str(run_dir), "what": what, "metric": metric, "layers": layers, "level": level,
               "band_rule": band_rule(n_layers), "checkpoints": checkpoints, "per_layer": layer_rows,
               "per_band": band_rows, "both_directions": (
                   {"rule": bd.attrs["rule"], "improved": bd.attrs["n_improved"], "degraded": bd.attrs["n_degraded"],
                    "excluded": bd.attrs["excluded_runs"]} if bd is not None else {"note": note}),
               "result_file": str(dest), "seconds": time.perf_counter() - t0}
    if as_json:
        return _print_json(payload)

    def fmt(c: dict) -> str:
        return "—" if not np.isfinite(c["estimate"]) else f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]"

    t = Table(title=f"{escape(metric)} ({escape(what)}) vs greedy success across {len(both)} checkpoints "
                    f"({int(100 * level)}% bootstrap intervals)")
    for c in ("layer", "band", "Spearman ρ", "Pearson r", "runs") + (
            ("improved agree", "degraded agree", "both directions") if bd is not None else ()):
        t.add_column(c, justify="left" if c in ("layer", "band", "both directions") else "right")
    for r in layer_rows + band_rows:
        name = str(r["layer"]) if "layer" in r else f"[bold]{r['band']}[/]"
        cells = [name, r.get("band", "band mean") if "layer" in r else "band mean", fmt(r["spearman"]),
                 fmt(r["pearson"]), str(r["n"])]
        if bd is not None:
            cells += [f"{r[d]['agree']}/{r[d]['total']}" for d in DIRECTIONS] + [r["verdict"]]
        t.add_row(*cells)
    out.print(t)
    for r in layer_rows + band_rows:
        if r["reason"]:
            out.print(f"note: {'layer ' + str(r['layer']) if 'layer' in r else r['band'] + ' band'}: "
                      f"{escape(r['reason'])}")
    out.print(escape(band_rule(n_layers)))
    if bd is not None:
        out.print(f"both directions vs SFT parent: {bd.attrs['n_improved']} improved, {bd.attrs['n_degraded']} degraded, "
                  f"{bd.attrs['n_excluded']} with no credible change (excluded); rule: see attrs['both_directions']")
    else:
        out.print(f"note: {escape(note)}")
    out.print(f"saved {escape(str(dest))}")


# ---------------------------------------------------------------------------------------------- demo


@app.command()
@_handled
def demo(
    out_dir: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder (finished stages are skipped)."),
    quick: bool = typer.Option(False, help="The CI-sized study: fewer steps, seeds and probes (≈5 minutes)."),
    train_sft: bool = typer.Option(False, "--train-sft", help="Train the SFT policy with the default recipe instead "
                                                              "of starting from the embedded one."),
    sft: Optional[Path] = typer.Option(None, "--sft", help="Start from this SFT policy folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The whole study in miniature: SFT → headroom → GRPO grid → evaluation → anatomy → grafts → rank →
    coupling → findings → report."""
    from .study import StudyConfig, run_study

    if sft is not None:
        _must_exist(sft, "--sft")
    cfg = StudyConfig.preset(str(out_dir), quick, sft=str(sft) if sft else None, train_sft=train_sft or None)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_root().mkdir(parents=True, exist_ok=True)
    (runs_root() / ".current").write_text(str(out_dir.resolve()) + "\n")
    p = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                 TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    bar = p.add_task("", total=1, visible=False)
    t0 = time.perf_counter()

    def on_stage(name: str, status: str, detail: str) -> None:
        if status == "start":
            p.update(bar, description=name, completed=0, total=1, visible=True)
        mark = {"start": "…", "done": "[green]✓[/]", "skip": "[dim]↷ done before[/]"}[status]
        if status != "start" or not err.is_terminal:
            err.print(f"{mark} {escape(name)} [dim]{escape(detail)} ({time.perf_counter() - t0:.0f} s)[/]")

    def on_work(stage: str, done: int, total: int) -> None:
        p.update(bar, description=stage, completed=done, total=total, visible=True)

    with p:
        info = run_study(cfg, on_stage, on_work)
    if as_json:
        return _print_json(info)
    t = Table(title=f"the study's four findings, as this run found them ({escape(str(out_dir))})", show_lines=True)
    for c in ("#", "claim", "this run", "verdict"):
        t.add_column(c, overflow="fold")
    for f in info["findings"]:
        t.add_row(str(f["number"]), escape(f["claim"]), escape(f["statement"]), escape(f["verdict"]))
    out.print(t)
    rl = next((v for k, v in info["models"].items() if k.startswith("degrade")), None)
    out.print(f"report: {escape(info['report'])}  ({info['seconds'] / 60:.1f} min)")
    if rl:
        out.print(f"next: graftkit graft --from {escape(rl)} --groups attn,mlp ; graftkit rank --layers late ; "
                  f"graftkit report {escape(str(out_dir))} --open")


@app.command()
@_handled
def report(
    run: Optional[Path] = typer.Argument(None, help="Run folder (default: the current run)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="HTML file (default: RUN/report.html)."),
    open_it: bool = typer.Option(False, "--open", help="Open the report in the default web browser."),
    screenshot: Optional[Path] = typer.Option(None, "--screenshot", help="Also save a PNG of the page rendered "
                                                                         "in headless Chromium."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """One self-contained HTML report of a run's results (plotly.js inlined, no network needed)."""
    from .figures import write_report

    run = run or current_run()
    dest = out_file or run / "report.html"
    rep = write_report(run, dest)
    if screenshot is not None:
        from .figures.browser import screenshot as take

        take(dest, screenshot)
    if open_it:
        import webbrowser

        webbrowser.open(Path(dest).resolve().as_uri())
    info = {"path": str(dest), "run": str(run), "sections": list(rep.sections), "absent": list(rep.absent),
            "figures": rep.n_figures, "notes": list(rep.notes), "bytes": len(rep.html.encode()),
            "screenshot": str(screenshot) if screenshot else None}
    if as_json:
        return _print_json(info)
    out.print(f"[bold]report[/] {escape(str(dest))} ({_fmt_bytes(info['bytes'])}, {rep.n_figures} figures)")
    out.print("[bold]sections[/] " + (escape(", ".join(rep.sections)) or "none"))
    if rep.absent:
        out.print("[bold]no results for[/] " + escape(", ".join(rep.absent)))
    for note in rep.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if screenshot:
        out.print(f"[bold]screenshot[/] {escape(str(screenshot))}")


@app.command()
@_handled
def results(
    run: Optional[Path] = typer.Argument(None, help="Run folder (default: the current run)."),
    csv_dir: Optional[Path] = typer.Option(None, "--csv", help="Export every array of every result as a tidy CSV "
                                                               "file into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """List a run's results (kind, file, created, dimensions); with --csv, export them as tables."""
    from .figures import export_csv
    from .store import list_results, read_result

    run = run or current_run()
    if not run.is_dir():
        raise GraftkitError(f"{run}: no such run folder", "pass a run folder (e.g. runs/demo), or run `graftkit demo`")
    rows = []
    for r in list_results(run):
        res = read_result(r["path"])
        path = Path(r["path"])
        rows.append({"kind": r["kind"], "file": str(path.relative_to(run) if path.is_relative_to(run) else path),
                     "created": r["created"], "dims": {d: len(c) for d, c in res.coords.items()},
                     "arrays": list(res.data)})
    written = export_csv(run, csv_dir) if csv_dir is not None else None
    if as_json:
        return _print_json({"run": str(run), "results": rows, "csv": written})
    t = Table(title=f"results of {escape(str(run))}")
    for col in ("kind", "file", "created", "dimensions"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(escape(r["kind"]), escape(r["file"]), escape(r["created"]),
                  escape(" ".join(f"{d}={n}" for d, n in r["dims"].items())))
    out.print(t)
    if written is not None:
        out.print(f"wrote {len(written)} CSV files to {escape(str(csv_dir))}")


@app.command()
def version():
    """Print graftkit's version."""
    out.print(__version__)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app()


if __name__ == "__main__":
    main()
