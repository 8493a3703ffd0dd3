"""Does KL predict forgetting? Across a run folder's RL runs, what each lost on the tasks it did not train on, against
how far it moved — in behaviour on the task it trained on, and in the weights.

RL's Razor (arXiv 2509.04259) finds forgetting tracks the forward KL to the base measured on the new task (R² 0.96 on
a toy, 0.71 for LLMs) while weight-change norms and rank did not. Here, per RL run r with SFT parent p (its recorded
base) and trained tasks T_r (its graftkit.json config, or ``--trained``):

- ``forgetting``  success(r) − success(p) on the evaluated tasks outside T_r, on identical episodes (greedy eval
                  results of both; negative: forgot), with its paired 95% interval (:func:`graftkit.stats.compare`);
- the predictors, each from a result the run already holds:
  ``kl``          KL(π_r‖π_p) per action token on r's own rollouts of the tasks in T_r (the ``kl`` result of r
                  against p, pooled over those tasks: Σ KL / Σ tokens),
  ``fro_delta``   ‖Δ‖_F over every tensor (a ``delta`` result of r against p),
  ``moved``       the fraction of entries Δ moved (1 − frac_unchanged, the same result),
  ``erank_delta`` the effective rank of Δ, mean over the matrices r moved (the ``rank-delta`` result of r).

Across runs, each predictor's R² (Pearson r² of the straight-line fit of forgetting on it) and Spearman ρ, each with a
pairs-bootstrap percentile interval over runs; the predictor with the largest R² is named, and its R² minus each
other's with a paired interval (the same resamples of runs), so "which predicts best" has an interval too. Every
predictor is fit on the same runs, those with every predictor's result; a run without one is shown, named and left
out of the fits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.config import CommandConfig, OnProgress, no_progress, opt
from ..core.errors import GraftkitError
from ..results.layout import FORGETTING, forgetting_path
from ..results.store import Result, View

#: The predictors, in the order results store them: name → (what it is, as tables and axes say it).
PREDICTORS = {
    "kl": "KL(π_RL‖π_SFT) per token on the trained tasks (nats)",
    "fro_delta": "‖Δ‖_F (all tensors)",
    "moved": "entries moved (fraction)",
    "erank_delta": "effective rank of Δ (mean over moved matrices)",
}
#: The result each predictor is read from (named when a run lacks it).
SOURCES = {"kl": "graftkit kl", "fro_delta": "graftkit delta", "moved": "graftkit delta",
           "erank_delta": "graftkit rank --what delta"}
STATS = ("r2", "spearman")
BOUNDS = ("estimate", "low", "high")
RULE = ("the best predictor has the largest R² across runs; its lead over another predictor is credible when the "
        "paired bootstrap interval of the R² difference lies above 0")


def _norm(path) -> str:
    return os.path.normpath(str(Path(path).resolve()))


def r2_and_spearman(x: np.ndarray, y: np.ndarray, level: float, n_boot: int, seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """[stat, bound] of R² (Pearson r²) and Spearman ρ of ``y`` on each column of ``x [run, predictor]`` (NaN rows
    left out per column), and the bootstrap R² ``[resample, predictor]`` on shared resamples of the runs (NaN where a
    resample leaves a column constant) for paired differences."""
    rng = np.random.default_rng(seed)
    n, k = x.shape
    idx = rng.integers(0, n, size=(n_boot, n))
    out = np.full((k, len(STATS), len(BOUNDS)), np.nan)
    boot = np.full((n_boot, k), np.nan)
    alpha = (1 - level) / 2
    for j in range(k):
        ok = np.isfinite(x[:, j]) & np.isfinite(y)
        if ok.sum() < 3 or np.ptp(x[ok, j]) == 0 or np.ptp(y[ok]) == 0:
            continue
        r2 = np.corrcoef(x[ok, j], y[ok])[0, 1] ** 2
        xs, ys, oks = x[idx, j], y[idx], ok[idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            xs, ys = np.where(oks, xs, np.nan), np.where(oks, ys, np.nan)
            xm, ym = xs - np.nanmean(xs, 1, keepdims=True), ys - np.nanmean(ys, 1, keepdims=True)
            r = np.nansum(xm * ym, 1) / np.sqrt(np.nansum(xm**2, 1) * np.nansum(ym**2, 1))
        boot[:, j] = np.where(np.isfinite(r), r**2, np.nan)
        valid = boot[np.isfinite(boot[:, j]), j]
        out[j, 0] = (r2, *np.quantile(valid, [alpha, 1 - alpha])) if valid.size else (r2, np.nan, np.nan)
        from ..stats import correlation_ci

        ci = correlation_ci(x[ok, j], y[ok], "spearman", level, n_boot, seed)
        out[j, 1] = (ci.estimate, ci.low, ci.high)
    return out, boot


def best_predictor(fit: np.ndarray, boot: np.ndarray, level: float) -> tuple[int | None, np.ndarray]:
    """The index of the largest R² (None when none is defined) and its R² minus each predictor's [predictor, bound]
    with a paired percentile interval over the shared resamples."""
    r2 = fit[:, 0, 0]
    if not np.isfinite(r2).any():
        return None, np.full((len(r2), len(BOUNDS)), np.nan)
    b = int(np.nanargmax(r2))
    alpha = (1 - level) / 2
    lead = np.full((len(r2), len(BOUNDS)), np.nan)
    for j in range(len(r2)):
        d = boot[:, b] - boot[:, j]
        d = d[np.isfinite(d)]
        if np.isfinite(r2[j]) and d.size:
            lead[j] = (r2[b] - r2[j], *np.quantile(d, [alpha, 1 - alpha]))
    return b, lead


# --------------------------------------------------------------------------------------------------
# reading a run folder's results


def _trained(model: Path) -> tuple[str, ...] | None:
    import json

    record = model / "graftkit.json"
    try:
        tasks = json.loads(record.read_text()).get("config", {}).get("tasks") if record.is_file() else None
    except (OSError, ValueError):
        return None
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    return tuple(tasks) if tasks else None


def _discover(results: Path) -> dict[str, dict]:
    """model key → its newest greedy eval, its kl results by base, its delta results by base, its rank-delta by base."""
    from ..evaluation.kl import KLResult
    from ..rank.results import RankResult
    from ..results.layout import DELTA, EVAL, KL, find_results
    from ..results.store import read_result
    from .anatomy import DeltaResult

    found: dict[str, dict] = {}
    for _, path in find_results(results, EVAL, decoding="greedy", obs="text"):
        res = read_result(path)
        key = _norm(res.attrs["model"]["path"])
        prev = found.setdefault(key, {}).get("eval")
        if prev is None or str(res.attrs.get("created")) > str(prev[1].attrs.get("created")):
            found[key]["eval"] = (path, res)
    for _, path in find_results(results, KL):
        v = KLResult.read(path)
        found.setdefault(_norm(v.model_path), {}).setdefault("kl", {})[_norm(v.base_path)] = v
    for _, path in [*find_results(results, "study-delta"), *find_results(results, DELTA)]:
        d = DeltaResult.read(path)
        for i, run in enumerate(d.attrs.get("runs", [])):
            if isinstance(run, dict) and run.get("path"):
                found.setdefault(_norm(run["path"]), {}).setdefault("delta", {})[_norm(d.base_path)] = (d, i)
    for _, path in find_results(results, "rank", what="delta"):
        v = RankResult.read(path)
        base = v.attrs.get("base", {}).get("path")
        if v.model_path and base:
            found.setdefault(_norm(v.model_path), {}).setdefault("rank", {})[_norm(base)] = v
    return found


def _success_by_task(res: Result) -> tuple[list[str], np.ndarray]:
    return [str(t) for t in res.coords["task"]], np.asarray(res["success"])


def _kl_on(v, tasks: Sequence[str]) -> float:
    """KL per action token on ``rl``'s rollouts, pooled over ``tasks`` (those the result covers)."""
    pick = [i for i, t in enumerate(v.tasks) if t in set(tasks)]
    if not pick:
        return float("nan")
    kl, tok = v.episode_kl("rl")[pick], v.tokens("rl")[pick]
    return float(np.nansum(kl) / tok.sum()) if tok.sum() else float("nan")


def _erank(v) -> float:
    metrics = v.metrics
    if "erank" not in metrics or "frobenius_sq" not in metrics:
        return float("nan")
    vals = np.asarray(v.result["value"], dtype=np.float64)
    moved = vals[:, metrics.index("frobenius_sq")] > 0
    return float(vals[moved, metrics.index("erank")].mean()) if moved.any() else float("nan")


# --------------------------------------------------------------------------------------------------
# the command


@dataclass(frozen=True, kw_only=True)
class ForgettingConfig(CommandConfig):
    """``graftkit forgetting``: does KL on the trained task predict forgetting on the others, better than movement?"""

    command = "forgetting"
    run: Optional[Path] = opt(None, argument=True)
    """Run folder (default: the current run)."""
    trained: Optional[str] = None
    """The tasks every run trained on (comma list), for runs whose graftkit.json does not say (another trainer's)."""
    level: float = 0.95
    """Interval level."""
    n_boot: int = 10_000
    """Bootstrap resamples of runs."""
    seed: int = 0
    """Seed of every bootstrap."""
    save: Optional[Path] = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/forgetting.h5)."""


@dataclass(frozen=True)
class ForgettingResult(View):
    """A ``forgetting`` result: per run its forgetting and predictors, per predictor its fit."""

    KINDS = (FORGETTING,)
    PRODUCER = "graftkit forgetting"

    @property
    def runs(self) -> list[str]:
        return self.labels("run")

    @property
    def predictors(self) -> list[str]:
        return self.labels("predictor")

    def rows(self) -> list[dict]:
        """Per run: its parent, trained and held-out tasks, forgetting with its interval, each predictor."""
        res, a = self.result, self.attrs
        out = []
        for i, run in enumerate(self.runs):
            f = np.asarray(res["forgetting"])[i]
            out.append({"run": run, "parent": a["parents"][run], "trained": a["trained"][run],
                        "untrained": a["untrained"][run], "forgetting": [_num(x) for x in f],
                        **{p: _num(res["predictor_value"][i, j]) for j, p in enumerate(self.predictors)}})
        return out

    def fits(self) -> list[dict]:
        res = self.result
        return [{"predictor": p, "label": PREDICTORS.get(p, p), "runs": int(res["n_runs"][j]),
                 **{s: [_num(x) for x in res["fit"][j, k]] for k, s in enumerate(STATS)},
                 "best_minus_this": [_num(x) for x in res["best_lead"][j]]} for j, p in enumerate(self.predictors)]

    def as_json(self) -> dict:
        a = self.attrs
        return {"run_folder": a.get("run_folder"), "runs": self.rows(), "fits": self.fits(), "best": a.get("best"),
                "rule": a.get("rule"), "conventions": a.get("conventions"), "left_out": a.get("left_out", []),
                "result_file": str(self.path)}

    def tables(self) -> list:
        """What ``graftkit forgetting`` prints: the runs, the fits, the rule, what was left out, where it was saved."""
        from ..core.tables import Table, bounds_text

        j = self.as_json()

        def f(x) -> str:
            return "—" if x is None else f"{x:.4g}"

        runs = Table("forgetting: success change on the tasks each run did not train on, beside how far it moved",
                     {"run": lambda r: r["run"], "trained on": lambda r: ",".join(r["trained"]),
                      "forgetting (points) [95%]": lambda r: bounds_text(r["forgetting"], scale=100, spec="+.1f"),
                      **{p: (lambda r, p=p: f(r[p])) for p in PREDICTORS}}, j["runs"], left=("run", "trained on"))
        fits = Table(f"which predicts forgetting best, fit on the {j['fits'][0]['runs']} runs with every predictor "
                     f"(best: {j['best'] or '—'})",
                     {"predictor": lambda r: r["label"], "runs": lambda r: str(r["runs"]),
                      "R² [95%]": lambda r: bounds_text(r["r2"], spec=".3f"),
                      "Spearman ρ [95%]": lambda r: bounds_text(r["spearman"], spec="+.2f"),
                      "best − this R² [95%]": lambda r: bounds_text(r["best_minus_this"], spec="+.3f")},
                     j["fits"], left=("predictor",))
        return [runs, fits, f"rule: {j['rule']}", *(f"left out: {x}" for x in j["left_out"]), f"saved {self.path}"]


def _num(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def forgetting_result(rows: list[dict], labels: Sequence[str], cfg: ForgettingConfig, run_dir: Path,
                      left_out: Sequence[str] = ()) -> Result:
    """The ``forgetting`` result of per-run ``rows`` (key, parent, trained, untrained, forgetting as (estimate, low,
    high), values: each predictor's value or NaN), named by ``labels``: each predictor fit across the runs with
    every predictor's value (at least 3)."""
    x = np.array([[r["values"][p] for p in PREDICTORS] for r in rows], dtype=np.float64)
    y = np.array([r["forgetting"][0] for r in rows], dtype=np.float64)
    complete = np.isfinite(x).all(1)  # every predictor is fit on the same runs, so their R² compare
    if complete.sum() < 3:
        raise GraftkitError(f"{int(complete.sum())} RL run(s) have every predictor's result; the fit needs at least 3",
                            "create the missing results named here: " + "; ".join(left_out[:4]))
    fit, boot = r2_and_spearman(x[complete], y[complete], cfg.level, cfg.n_boot, cfg.seed)
    best, lead = best_predictor(fit, boot, cfg.level)
    names = list(PREDICTORS)
    return Result(FORGETTING,
                  {"run": np.array(labels, dtype=object), "predictor": np.array(names, dtype=object),
                   "stat": np.array(STATS, dtype=object), "bound": np.array(BOUNDS, dtype=object)},
                  {"forgetting": (("run", "bound"), np.array([r["forgetting"] for r in rows], dtype=np.float64)),
                   "predictor_value": (("run", "predictor"), x),
                   "fit": (("predictor", "stat", "bound"), fit),
                   "best_lead": (("predictor", "bound"), lead),
                   "n_runs": (("predictor",), np.full(len(names), int(complete.sum()), dtype=np.int64)),
                   "fitted": (("run",), complete.astype(np.int8))},
                  {"run_folder": str(run_dir), "best": None if best is None else names[best], "rule": RULE,
                   "parents": {lab: Path(r["parent"]).name for lab, r in zip(labels, rows)},
                   "trained": {lab: r["trained"] for lab, r in zip(labels, rows)},
                   "untrained": {lab: r["untrained"] for lab, r in zip(labels, rows)},
                   "models": {lab: r["key"] for lab, r in zip(labels, rows)},
                   "conventions": {"forgetting": "success(run) - success(parent) on the evaluated tasks the run did not "
                                                 "train on, greedy, identical episodes; interval: paired bootstrap",
                                   **PREDICTORS, "r2": "Pearson r^2 of forgetting on the predictor across runs; "
                                   "pairs-bootstrap percentile interval", "spearman": "Spearman rho, pairs bootstrap",
                                   "level": cfg.level, "n_boot": cfg.n_boot, "seed": cfg.seed},
                   "left_out": list(left_out), "config": cfg.as_dict()})


def run_forgetting(cfg: ForgettingConfig, on_progress: OnProgress = no_progress) -> ForgettingResult:
    """Read the run folder's eval, kl, delta and rank-delta results, build every RL run's forgetting and predictors,
    fit each predictor across runs and write the ``forgetting`` result."""
    from ..results.layout import RunLayout, current_run, result_labels
    from ..results.store import write_result
    from ..stats import compare, fold_episodes
    from ..weights import recorded_base

    run_dir = current_run(cfg.run)
    results = RunLayout(run_dir).results
    if not results.is_dir():
        raise GraftkitError(f"{results}: no results folder", "pass a run folder, or run graftkit demo first")
    found = _discover(results)
    rows, left_out = [], []
    override = tuple(t for t in (cfg.trained or "").split(",") if t) or None
    for key in sorted(found):
        parent = recorded_base(Path(key))
        if parent is None or "eval" not in found[key]:
            continue
        pk = _norm(parent)
        if "eval" not in found.get(pk, {}):
            left_out.append(f"{Path(key).name}: its parent {Path(pk).name} has no greedy eval result")
            continue
        trained = override or _trained(Path(key))
        if not trained:
            left_out.append(f"{Path(key).name}: records no trained tasks (pass --trained)")
            continue
        (_, ev), (_, pev) = found[key]["eval"], found[pk]["eval"]
        tasks, succ = _success_by_task(ev)
        ptasks, psucc = _success_by_task(pev)
        if tasks != ptasks or succ.shape != psucc.shape:
            left_out.append(f"{Path(key).name}: its eval and its parent's cover different episodes")
            continue
        held = [i for i, t in enumerate(tasks) if t not in set(trained)]
        if not held:
            left_out.append(f"{Path(key).name}: every evaluated task is one it trained on")
            continue
        c = compare(fold_episodes(psucc, held), fold_episodes(succ, held), level=cfg.level, seed=cfg.seed)
        kl = found[key].get("kl", {}).get(pk)
        delta = found[key].get("delta", {}).get(pk)
        rank = found[key].get("rank", {}).get(pk)
        values = {"kl": _kl_on(kl, trained) if kl is not None else np.nan,
                  "fro_delta": delta[0].total("fro_delta", delta[1]) if delta else np.nan,
                  "moved": 1.0 - delta[0].total("frac_unchanged", delta[1]) if delta else np.nan,
                  "erank_delta": _erank(rank) if rank is not None else np.nan}
        for p, v in values.items():
            if not np.isfinite(v):
                left_out.append(f"{Path(key).name}: no {p} (its {SOURCES[p]} result against {Path(pk).name})")
        rows.append({"key": key, "parent": pk, "trained": list(trained), "untrained": [tasks[i] for i in held],
                     "forgetting": (c.diff, c.bootstrap.low, c.bootstrap.high), "values": values})
    if len(rows) < 3:
        raise GraftkitError(f"{len(rows)} RL run(s) in {results} have a greedy eval beside their parent's on tasks "
                            "they did not train on; the fit needs at least 3",
                            "evaluate each RL run and its SFT parent on tasks beyond the trained ones (graftkit eval "
                            "--tasks all), then rerun" + ("; " + "; ".join(left_out[:3]) if left_out else ""))
    res = forgetting_result(rows, result_labels([Path(r["key"]) for r in rows]), cfg, run_dir, left_out)
    dest = write_result(cfg.save or forgetting_path(results), res, flag="--save" if cfg.save else None)
    return ForgettingResult(res, dest)


__all__ = ["ForgettingConfig", "ForgettingResult", "PREDICTORS", "best_predictor", "forgetting_result",
           "r2_and_spearman", "run_forgetting"]
