"""``graftkit rank`` and ``graftkit couple`` as configs and run functions.

:func:`run_rank` ranks every weight matrix of a checkpoint, the RL delta against its base, or the hidden
states on probe prompts, and writes one ``rank-<what>-<label>[-<layers>].h5`` per checkpoint under
``RUN/results``. :func:`run_couple` reads a run's rank and greedy eval results, couples per-layer rank to
success across the checkpoints (:func:`.coupling.coupling`) and tests both directions against a reference
(:func:`.coupling.both_directions`): each run's recorded SFT parent, or one fixed checkpoint
(``CoupleConfig.reference``, the study's SFT policy). Both return the summary the command line prints and
never print.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import CommandConfig, RunOption, DeviceOption, check_choice, no_progress, opt
from ..core.errors import GraftkitError
from ..stats import fold_episodes
from ..results.layout import (EVAL, RunLayout, coupling_path, current_run, find_results, glob_pattern, layer_tag,
                              rank_path, result_labels)
from ..results.store import Result, read_result, write_result
from ..weights.commands import ReadOptions
from .coupling import CouplingResult
from .results import BACKENDS, METRICS, PAIR_METRICS, TOKENS, RankResult

WHAT = ("weights", "delta", "activations")


@dataclass(frozen=True, kw_only=True)
class RankConfig(ReadOptions, RunOption, DeviceOption):
    """``graftkit rank``: spectral ranks of weights, of the RL delta, or of activations."""

    command = "rank"
    model: tuple[Path, ...] = opt((), flags=("--model",))
    """Checkpoint(s) (default: every model folder of the current run)."""
    base: Path | None = opt(None, flags=("--base",))
    """Base for --what delta, and of a LoRA adapter (default: what each model records: its graftkit.json parent,
    else the adapter's local base_model_name_or_path)."""
    what: str = opt("weights", flags=("--what",))
    """weights | delta | activations."""
    layers: str = "all"
    """all | early | mid | late | indices like 0-3,10."""
    metric: str | None = opt(None, flags=("--metric",))
    """Comma list shown in the table (default erank,stable_rank[,spectral_drift,intruders | ,participation_ratio])."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file, one model only (default: RUN/results/rank-*.h5)."""
    shared_vocab: bool = False
    """RL's vocabulary was resized (extra token rows): compare (--what delta) over the rows both share, reporting the
    extra ones; refused by default."""
    force_pair: bool = False
    """--what delta: rank a pair that is no fine-tune (RL moved most matrices by their own norm or more, or
    points elsewhere); refused by default."""
    backend: str = opt("hooks", flags=("--backend",))
    """activations: hooks (forward hooks, any HF causal LM) | lens (TransformerLens bridge)."""
    tokens: str = opt("last", flags=("--tokens",))
    """activations: last | all tokens of each prompt (position 0 always dropped)."""
    centred: bool = opt(True, flags=("--centred/--no-centred",))
    """activations: covariance (centred) or uncentred second moment."""
    probes: int = opt(64, flags=("--probes",))
    """activations: number of probe prompts drawn from --tasks."""
    probe_file: Path | None = opt(None, flags=("--probe-file",))
    """activations: text file, one prompt per line (replaces --probes)."""
    tasks: str = opt("all", flags=("--tasks",))
    """activations: suite (mastered, headroom, all) or tasks the probes come from."""
    batch_size: int = opt(8, flags=("--batch-size",))
    """activations: prompts per forward pass."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.what == "activations":
            check_choice(self.tokens, TOKENS, "--tokens")
            check_choice(self.backend, BACKENDS, "--backend")
            if self.batch_size < 1:
                raise GraftkitError(f"--batch-size {self.batch_size} must be at least 1", "use e.g. 8")
            from ..weights.hf import single_file_config

            for p in self.model or ():  # a policy run from one file is built over --config: refused before any load
                if Path(p).is_file():
                    single_file_config(Path(p), self.config, self.no_pickle)
        elif self.what not in ("weights", "delta"):
            raise GraftkitError(f"--what {self.what!r} is not an option", "use weights, delta or activations")
        allowed = METRICS + (PAIR_METRICS if self.what == "delta" else ())
        for m in self.shown:
            if m not in allowed:
                hint = " (pair measures need --what delta)" if m in PAIR_METRICS else ""
                raise GraftkitError(f"--metric: unknown metric '{m}'{hint}", f"use one of {', '.join(allowed)}")
        if not self.shown:
            raise GraftkitError("--metric names no metric", f"use one of {', '.join(allowed)}")

    @property
    def shown(self) -> list[str]:
        """The metrics shown in the table (``metric``, else the default of ``what``)."""
        default = {"weights": "erank,stable_rank", "delta": "erank,stable_rank,spectral_drift,intruders",
                   "activations": "erank,stable_rank,participation_ratio"}[self.what]
        return [m.strip() for m in (self.metric or default).split(",") if m.strip()]

    @property
    def tag(self) -> str:
        """The result-file suffix naming a layer selection ('' for all layers)."""
        return layer_tag(self.layers)


def run_checkpoints(run: Path) -> list[Path]:
    """Every model folder of ``run`` that graftkit wrote (a provenance record and weight files)."""
    from ..weights import PROVENANCE

    weight_globs = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")
    return sorted(p for p in run.iterdir() if p.is_dir() and (p / PROVENANCE).is_file()
                  and any(any(p.glob(g)) for g in weight_globs)) if run.is_dir() else []


def _models(cfg: RankConfig, run: Path) -> list[Path]:
    from ..weights import checkpoint_of, recorded_base

    if cfg.model:
        models = [checkpoint_of(p, "--model") for p in cfg.model]  # a trainer's output_dir: its last checkpoint
    else:
        models = run_checkpoints(run)
        if cfg.what == "delta" and cfg.base is None:
            models = [p for p in models if recorded_base(p) is not None]
    if not models:
        raise GraftkitError(f"no checkpoints found in {run}" + (" with a recorded SFT parent" if cfg.what == "delta"
                                                                else ""), "pass --model PATH, or run `graftkit demo` first")
    if cfg.save is not None and len(models) > 1:
        raise GraftkitError(f"--save names one file but {len(models)} models are ranked", "rank one --model, or drop --save")
    return models


def run_rank(cfg: RankConfig, on_progress=no_progress) -> dict:
    """Rank every checkpoint of ``cfg`` and write one result each; returns the summary ``graftkit rank
    --json`` prints (per model: its per-layer rows, each with the set of matrices its means are over, the
    numerical-rank tolerance rule, the result file, ...). Progress in matrices ranked (weights, delta: one bar
    per model, advanced as each tensor's matrices are done) or prompts run (activations)."""
    t0 = time.perf_counter()
    run = current_run(cfg.run)
    models = _models(cfg, run)
    rank = _rank_activations if cfg.what == "activations" else _rank_weights
    payload = rank(cfg, models, result_labels(models), run, on_progress)
    payload["seconds"] = time.perf_counter() - t0
    return payload


def _matrix_counts(ckpt, tax, layers: str) -> dict[str, int]:
    """{tensor: the matrices it is ranked as} over the tensors ranked (a 3-D stack: one per expert)."""
    from . import select_tensors

    names, _, _ = select_tensors(ckpt, tax, layers)
    return {n: int(ckpt.metas[n].shape[0]) if len(ckpt.metas[n].shape) == 3 else 1 for n in names}


def _rank_weights(cfg: RankConfig, models: list[Path], labels: list[str], run: Path, on_progress) -> dict:
    from . import delta_ranks, weight_ranks
    from ..weights import band_rule, base_of, notes, open_model, open_pair, shared_vocab
    from ..weights.taxonomy import DECODER

    from ..core.devices import resolve_device

    device = resolve_device(cfg.device)  # where the float64 Grams and eigvalsh run (a GPU when auto finds one)
    payload: dict = {"what": cfg.what, "layers": cfg.layers, "metrics": cfg.shown, "device": str(device), "models": {}}
    placed = [] if cfg.dtype == "auto" else [
        f"--dtype {cfg.dtype} applies to --what activations: weight and delta spectra are always computed from "
        "the stored values in float64"]
    read = dict(no_pickle=cfg.no_pickle, unknown=cfg.unknown, config=cfg.config)
    for path, lab in zip(models, labels):
        prov = {"config": cfg.as_dict()}
        base_ck = None
        if cfg.what == "delta":
            base_ck, (ckpt,) = open_pair(base_of(path, cfg.base), [path], **read)
            if cfg.shared_vocab:
                ckpt = shared_vocab(ckpt, base_ck, base_ck.taxonomy(cfg.unknown))
        else:
            ckpt = open_model(path, cfg.base, **read)
        tax = (base_ck or ckpt).taxonomy(cfg.unknown)
        matrices = _matrix_counts(base_ck or ckpt, tax, cfg.layers)
        total = sum(matrices.values())
        tick = lambda n, nbytes: on_progress(f"rank {lab}", matrices[n], total, "matrices")  # noqa: E731
        res = (delta_ranks(base_ck, ckpt, tax, cfg.layers, on_tensor=tick, provenance=prov, force_pair=cfg.force_pair,
                           device=device)
               if base_ck
               else weight_ranks(ckpt, tax, cfg.layers, on_tensor=tick, provenance=prov, device=device))
        dest = write_result(cfg.save or rank_path(RunLayout(run).results, cfg.what, lab, cfg.layers), res,
                            flag="--save" if cfg.save else None)
        view = RankResult.from_result(res, dest)
        payload["models"][lab] = {"path": str(path), "base": str(base_ck.path) if base_ck else None,
                                  "result_file": str(dest), "layers": view.layer_rows(cfg.shown),
                                  "outside_decoder": view.outside_rows(cfg.shown),
                                  "skipped": len(res.attrs["skipped"]), "matrices": len(res.coords["tensor"]),
                                  "numerical_rank_tol_rule": res.attrs["numerical_rank_tol_rule"],
                                  "aggregate": res.attrs["aggregate"],
                                  **({"principal": view.principal()} if cfg.what == "delta" else {}),
                                  "notes": notes(*filter(None, (base_ck, ckpt))) + list(res.attrs.get("pair_notes", []))
                                  + placed}
        payload["band_rule"] = band_rule(tax.n_layers.get(DECODER, 0)) if tax.n_layers.get(DECODER) else None
    return payload


def _rank_activations(cfg: RankConfig, models: list[Path], labels: list[str], run: Path, on_progress) -> dict:
    from ..agent import load_policy
    from ..weights import describe, open_model
    from .activations import activation_ranks, probe_prompts, prompts_from_file

    prompts = prompts_from_file(cfg.probe_file) if cfg.probe_file is not None else probe_prompts(cfg.tasks, cfg.probes)
    source = {"file": str(cfg.probe_file)} if cfg.probe_file is not None else {"tasks": cfg.tasks, "seed": 0}
    payload: dict = {"what": "activations", "layers": cfg.layers, "metrics": cfg.shown, "backend": cfg.backend,
                     "tokens": cfg.tokens, "centred": cfg.centred, "probes": {"n": len(prompts), **source},
                     "models": {}}
    for path, lab in zip(models, labels):
        # opened first: a LoRA adapter whose base is not found is refused naming --base, before any loading
        desc = describe(open_model(path, cfg.base, no_pickle=cfg.no_pickle, config=cfg.config))
        policy = load_policy(Path(path), no_pickle=cfg.no_pickle, config=cfg.config, base=cfg.base,
                             device=cfg.device, dtype=cfg.dtype)
        tick = lambda n: on_progress(f"rank activations {lab}", n, len(prompts), "prompts")  # noqa: E731
        # the model was loaded for the measurement alone: TransformerBridge may rewire it in place
        res = activation_ranks(policy, None, prompts, cfg.layers, tokens=cfg.tokens, centred=cfg.centred,
                               backend=cfg.backend, batch_size=cfg.batch_size, on_batch=tick, give_model=True,
                               checkpoint=desc, provenance={"config": cfg.as_dict(), "probes": payload["probes"]})
        del policy
        dest = write_result(cfg.save or rank_path(RunLayout(run).results, "activations", lab, cfg.layers), res,
                            flag="--save" if cfg.save else None)
        payload["models"][lab] = {"path": str(path), "base": None, "result_file": str(dest),
                                  "layers": RankResult.from_result(res, dest).layer_rows(cfg.shown),
                                  "outside_decoder": [], "n_prompts": len(prompts),
                                  "notes": desc.get("notes", [])}
        payload["band_rule"] = res.attrs["band_rule"]
    return payload


# -------------------------------------------------------------------------------------------- couple


@dataclass(frozen=True, kw_only=True)
class CoupleConfig(CommandConfig):
    """``graftkit couple``: does per-layer rank track success across a run's checkpoints?"""

    command = "couple"
    run: Path | None = opt(None, argument=True)
    """Run folder (default: the current run)."""
    metric: str = opt("erank", flags=("--metric",))
    """Rank metric to couple (any metric of the rank results)."""
    what: str = opt("weights", flags=("--what",))
    """weights | activations: which rank results to read."""
    layers: str = "all"
    """Decoder layers: all | early | mid | late | indices like 0-3,10."""
    level: float = 0.95
    """Interval level (correlations, paired verdicts, agreement)."""
    n_boot: int = 10_000
    """Bootstrap resamples of the correlations."""
    seed: int = 0
    """Seed of every bootstrap and posterior draw."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/coupling-<what>-<metric>.h5)."""
    models: tuple[Path, ...] = opt((), cli=False)
    """The checkpoints to couple, in this order (default: every checkpoint of the run with both a rank and an
    eval result, by path)."""
    reference: Path | None = opt(None, cli=False)
    """Test both directions against this one checkpoint, its own row kept as the reference (default: each
    run against its recorded SFT parent, runs without one left out)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.what not in ("weights", "activations"):
            raise GraftkitError(f"--what {self.what!r} is not an option", "use weights or activations")


def _key(path) -> str:
    return os.path.normpath(str(Path(path).resolve()))


def _model_key(res: Result, path: Path) -> str:
    model = res.attrs.get("model")
    if not isinstance(model, dict) or not model.get("path"):
        raise GraftkitError(f"{path}: records no model path (attrs['model'])", "re-create it with graftkit")
    return os.path.normpath(str(model["path"]))


def _newest(found: dict, key: str, entry: dict, better) -> None:
    if key not in found or better(entry, found[key]):
        found[key] = entry


def _discover(results: Path, what: str) -> tuple[dict, dict]:
    """model key → the rank result (most layers, then newest) and the newest greedy eval result."""
    ranks, evals = {}, {}
    for _, p in find_results(results, "rank", what=what):
        view = RankResult.read(p)
        _newest(ranks, _model_key(view.result, p), {"path": p, "res": view},
                lambda a, b: (len(a["res"].layer_ids), str(a["res"].attrs.get("created")))
                > (len(b["res"].layer_ids), str(b["res"].attrs.get("created"))))
    for _, p in find_results(results, EVAL, decoding="greedy", obs="text"):
        res = read_result(p)
        if res.kind != EVAL:
            continue
        _newest(evals, _model_key(res, p), {"path": p, "res": res},
                lambda a, b: str(a["res"].attrs.get("created")) > str(b["res"].attrs.get("created")))
    return ranks, evals


def _coupled(cfg: CoupleConfig, ranks: dict, evals: dict, results: Path) -> list[str]:
    """The checkpoints with both results (at least 3, evaluated on identical episodes)."""
    both = ([k for k in map(_key, cfg.models) if k in ranks and k in evals] if cfg.models
            else sorted(set(ranks) & set(evals)))
    if len(both) < 3:
        no_eval = [f"{ranks[k]['path'].name} (make it: graftkit eval --model {k})" for k in sorted(set(ranks) - set(evals))]
        no_rank = [f"{evals[k]['path'].name} (make it: graftkit rank --model {k} --what {cfg.what})"
                   for k in sorted(set(evals) - set(ranks))]
        parts = [f"{len(both)} checkpoint(s) in {results} have both a {glob_pattern('rank', what=cfg.what)} and an "
                 f"{glob_pattern(EVAL, decoding='greedy', obs='text')} result; coupling needs at least 3"]
        if no_eval:
            parts.append("rank results without an eval: " + "; ".join(no_eval))
        if no_rank:
            parts.append("eval results without a rank: " + "; ".join(no_rank))
        raise GraftkitError(". ".join(parts), "create the missing results with the commands named, then rerun couple")
    ref_eval = evals[both[0]]
    for k in both[1:]:
        for dim in ("task", "seed", "episode", "sample"):
            if list(evals[k]["res"].coords[dim]) != list(ref_eval["res"].coords[dim]):
                raise GraftkitError(f"{evals[k]['path'].name} and {ref_eval['path'].name} cover different "
                                    f"episodes ({dim} differs)",
                                    "evaluate every checkpoint with the same --tasks, --seeds and --episodes")
    return both


def _rank_matrix(cfg: CoupleConfig, ranks: dict, both: list[str]) -> tuple[np.ndarray, list[int], int]:
    """rank[checkpoint, layer] of ``cfg.metric`` at the decoder layers every result ranks, and the depth."""
    from ..weights import parse_layers

    n_layers = ranks[both[0]]["res"].n_layers
    chosen = parse_layers(cfg.layers, n_layers)
    common = set.intersection(*(set(ranks[k]["res"].layer_ids) for k in both))
    layer_ids = sorted(common if chosen is None else common & chosen)
    if not layer_ids:
        raise GraftkitError(f"--layers {cfg.layers}: none of these decoder layers is ranked in every rank-{cfg.what} "
                            "result", f"rerun graftkit rank --what {cfg.what} --layers all, or pick layers they share")
    R = np.empty((len(both), len(layer_ids)))
    for i, k in enumerate(both):
        view = ranks[k]["res"]
        if view.n_layers != n_layers:
            raise GraftkitError(f"{ranks[k]['path'].name} ranks a {view.n_layers}-layer model, "
                                f"{ranks[both[0]]['path'].name} a {n_layers}-layer one", "couple checkpoints of one model")
        vals = view.layer_values(cfg.metric)
        pos = {L: j for j, L in enumerate(view.layer_ids)}
        R[i] = [vals[pos[L]] for L in layer_ids]
    return R, layer_ids, n_layers


def _parents(cfg: CoupleConfig, both: list[str]) -> dict[str, str]:
    """checkpoint → its reference among the coupled checkpoints (the fixed one, or its recorded parent)."""
    from ..weights import recorded_base

    if cfg.reference is not None:
        ref = _key(cfg.reference)
        if ref not in both:
            raise GraftkitError(f"{cfg.reference}: the reference has no rank and eval result among the checkpoints",
                                "rank and evaluate the reference too")
        return {k: ref for k in both if k != ref}
    parent = {}
    for k in both:
        b = recorded_base(Path(k))
        if b is not None and _key(b) in both:
            parent[k] = _key(b)
    return parent


def _both_directions(cfg, both, parent, R, success, outcome, labels, layer_ids, n_layers):
    """The both-directions result over every coupled run (None when no run has a reference) and each
    run's paired comparison with its reference."""
    from ..stats import compare
    from .coupling import both_directions

    index = {k: i for i, k in enumerate(both)}
    verdicts, diffs = ["no recorded SFT parent among the checkpoints"] * len(both), {}
    for k, pk in parent.items():
        c = compare(outcome[pk], outcome[k], level=cfg.level, seed=cfg.seed)
        verdicts[index[k]] = c.verdict
        diffs[k] = {"diff": c.diff, "bootstrap": [c.bootstrap.low, c.bootstrap.high],
                    "bayes": [c.bayes.low, c.bayes.high], "verdict": c.verdict}
    conventions = {"reference": "each run's recorded SFT parent (graftkit.json base_model)" if cfg.reference is None
                   else f"the checkpoint {cfg.reference}", "verdict_source": "stats.compare(parent eval, run eval) on "
                   "identical episodes, seed " + str(cfg.seed)}
    if not parent:
        return None, diffs
    if cfg.reference is not None:  # the reference's own row is kept, excluded from both directions
        r = index[_key(cfg.reference)]
        verdicts[r] = "reference (SFT)"
        return both_directions(R, success, R[r], success[r], verdicts, cfg.level, runs=labels, layers=layer_ids,
                               n_layers=n_layers, conventions=conventions), diffs
    rows = [index[k] for k in both if k in parent]
    prow = [index[parent[k]] for k in both if k in parent]
    bd = both_directions(R[rows], success[rows], R[prow], success[prow], [verdicts[i] for i in rows], cfg.level,
                         runs=[labels[i] for i in rows], layers=layer_ids, n_layers=n_layers, conventions=conventions)
    full = {}  # keep the run coordinate of the correlation: rows of runs without a parent stay NaN / "no parent"
    for name, (dims, arr) in bd.data.items():
        if dims and dims[0] == "run":
            shape = (len(both),) + arr.shape[1:]
            fill = np.full(shape, "no parent", dtype=object) if arr.dtype == object else np.full(shape, np.nan)
            fill[rows] = arr
            arr = fill
        full[name] = (dims, arr)
    return Result(bd.kind, {**bd.coords, "run": np.array(labels, dtype=object)}, full, bd.attrs, bd.var_attrs), diffs


def run_couple(cfg: CoupleConfig, on_progress=no_progress) -> dict:
    """Couple the run's per-layer ranks to greedy success and write the ``coupling`` result; returns the
    summary ``graftkit couple --json`` prints (per layer and band, per checkpoint, both directions). Progress
    in layers and bands correlated (each ``n_boot`` bootstrap resamples)."""
    from .coupling import coupling, coupling_result
    from ..weights import band_rule

    t0 = time.perf_counter()
    run_dir = current_run(cfg.run)
    results = RunLayout(run_dir).results
    if not results.is_dir():
        raise GraftkitError(f"{results}: no results folder", "pass a run folder, or run `graftkit demo` first")
    ranks, evals = _discover(results, cfg.what)
    both = _coupled(cfg, ranks, evals, results)
    R, layer_ids, n_layers = _rank_matrix(cfg, ranks, both)
    outcome = {k: fold_episodes(evals[k]["res"]["success"]) for k in both}
    success = np.array([outcome[k].mean() for k in both])
    n_success = np.array([outcome[k].size for k in both], dtype=np.int64)
    labels = result_labels([Path(k) for k in both])
    conventions = {
        "metric": cfg.metric, "what": cfg.what, "rank_value": "value_layer[layer, group='all', metric]: mean over "
        "the layer's matrices" if cfg.what == "weights" else f"value_layer of the rank-{cfg.what} results",
        "layer_indexing": "decoder layer index, 0-based (value_layer's layer coordinate)",
        "success": "greedy success rate over every task, seed and episode of the eval result",
        "runs": "every checkpoint of the run with both results (its SFT parent included)",
        "checkpoints": dict(zip(labels, both)),
        "rank_files": {lab: str(ranks[k]["path"]) for lab, k in zip(labels, both)},
        "eval_files": {lab: str(evals[k]["path"]) for lab, k in zip(labels, both)},
        "config": cfg.as_dict(),
    }
    corr = coupling(R, success, n_success, level=cfg.level, n_boot=cfg.n_boot, seed=cfg.seed, runs=labels,
                    layers=layer_ids, n_layers=n_layers, conventions=conventions,
                    on_column=lambda total: on_progress(f"couple {cfg.metric}", 1, total, "layers and bands"))
    parent = _parents(cfg, both)
    bd, diffs = _both_directions(cfg, both, parent, R, success, outcome, labels, layer_ids, n_layers)
    res = CouplingResult(coupling_result(corr, bd))
    dest = write_result(cfg.save or coupling_path(results, cfg.what, cfg.metric), res.to_result(),
                        flag="--save" if cfg.save else None)
    index = {k: i for i, k in enumerate(both)}
    checkpoints = [{"label": lab, "model": k, "success": float(success[i]), "episodes": int(n_success[i]),
                    "parent": labels[index[parent[k]]] if k in parent else None, "vs_parent": diffs.get(k),
                    "rank_file": str(ranks[k]["path"]), "eval_file": str(evals[k]["path"])}
                   for i, (lab, k) in enumerate(zip(labels, both))]
    note = ("no checkpoint's recorded SFT parent (graftkit.json base_model) is among the coupled checkpoints: the "
            "both-directions test needs the SFT's rank and eval")
    return {"run": str(run_dir), "what": cfg.what, "metric": cfg.metric, "layers": cfg.layers, "level": cfg.level,
            "band_rule": band_rule(n_layers), "checkpoints": checkpoints, "per_layer": res.rows("layer"),
            "per_band": res.rows("band"), "both_directions": (
                {"rule": bd.attrs["rule"], "improved": bd.attrs["n_improved"], "degraded": bd.attrs["n_degraded"],
                 "excluded": bd.attrs["excluded_runs"]} if bd is not None else {"note": note}),
            "result_file": str(dest), "seconds": time.perf_counter() - t0}
