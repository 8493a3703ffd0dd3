"""The weight path of a training run: how the weights moved from the SFT base, checkpoint by checkpoint.

For checkpoints at steps s_1 < … < s_T of one run, each with its delta Δ_t = θ_t − θ_base from the same base, every
measure here is a function of the Gram matrix G_st = ⟨Δ_s, Δ_t⟩ alone — over one parameter group, or over the whole
model (sums of the per-tensor inner products ``delta`` computes in one pass, :func:`graftkit.graft.delta_anatomy`
``dot_delta``). The path starts at the base: Δ_0 = 0 at step 0.

- ``norm``            ‖Δ_t‖_F = √G_tt
- ``cos_to_final``    cos(Δ_t, Δ_T) = G_tT / √(G_tt G_TT): whether early movement already points where training ends
- ``update_cos``      cos(u_t, u_{t−1}) between successive updates u_t = Δ_t − Δ_{t−1} (from step t−1 to t; NaN at
                      the first checkpoint, and where an update is zero): 1 on a straight path
- ``r2``              R² of the least-squares straight line Δ(s) ≈ a + b·s through the path's points (the base at
                      step 0 included), over every entry at once: 1 − SS_res/SS_tot, SS_tot = Σ_t ‖Δ_t − Δ̄‖²,
                      SS_res = SS_tot − ‖Σ_t x_t Δ_t‖² / Σ_t x_t², x_t = s_t − s̄ (exact: both are quadratic forms
                      in G). 1 when the weights moved along a line at a speed constant in steps.
- ``r2_random_walk``  the same R² for a path whose updates have these norms in independent directions (in high
                      dimension E G_st = Σ_{r ≤ min(s, t)} ‖u_r‖², to which a random walk's Gram concentrates): a
                      line fits a random walk of a few steps well too, so ``r2`` means little without it.

Linear dynamics in RLVR (arXiv 2601.04537) reports R² > 0.7 per weight; this is the energy-weighted R² of the
whole path (a tensor that moved more weighs more), stated as such. Extrapolating along the line is a graft with
α > 1 of the last delta (``graft --alpha``) when the fit's intercept is small (``intercept_share``:
‖a‖² / ‖a + b·s_T‖², the share of the fitted end point not explained by the slope).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.config import DeviceOption, EngineOption, OnProgress, RunOption, no_progress, opt
from ..core.errors import GraftkitError
from ..verifiable.format import PromptOption
from ..weights.commands import ReadOptions
from .anatomy import DeltaResult

#: What each measure is, as results and tables say it.
CONVENTIONS = {
    "norm": "||Delta_t||_F, Delta_t = theta_t - theta_base (float32 after an exact upcast)",
    "cos_to_final": "<Delta_t, Delta_T> / (||Delta_t|| ||Delta_T||), T the last checkpoint",
    "update_cos": "cos(u_t, u_{t-1}), u_t = Delta_t - Delta_{t-1} the update from the previous checkpoint (Delta_0 = 0)",
    "r2": "R^2 of the least-squares line Delta(s) = a + b*s over the checkpoints and the base (s = 0, Delta = 0), "
          "pooled over every entry: 1 - SS_res/SS_tot",
    "r2_random_walk": "the r2 of a path whose updates have the same norms in independent directions (E <u_s, u_t> = "
                      "0 for s != t): what a line fits to a random walk of these step sizes, the baseline of r2",
    "intercept_share": "||a||^2 / ||a + b*s_T||^2 of that line: the share of its end point the slope does not explain",
}


def with_origin(gram: np.ndarray, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """G and the steps with the base prepended (step 0, Δ = 0)."""
    T = len(steps)
    G = np.zeros((T + 1, T + 1))
    G[1:, 1:] = gram
    return G, np.concatenate([[0.0], np.asarray(steps, dtype=np.float64)])


def path_measures(gram: np.ndarray, steps: Sequence[int]) -> dict[str, np.ndarray | float]:
    """Every measure of the module docstring from ``gram [T, T]`` = ⟨Δ_s, Δ_t⟩ of checkpoints at ``steps``
    (ascending): arrays ``norm``, ``cos_to_final``, ``update_cos`` [T] and floats ``r2``, ``intercept_share``."""
    gram = np.asarray(gram, dtype=np.float64)
    steps = np.asarray(steps, dtype=np.float64)
    if gram.shape != (len(steps), len(steps)) or len(steps) == 0:
        raise ValueError(f"gram {gram.shape} for {len(steps)} steps")
    if np.any(np.diff(steps) <= 0):
        raise ValueError(f"steps must increase: {steps.tolist()}")
    G, s = with_origin(gram, steps)
    diag = np.diag(G)
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.sqrt(np.maximum(diag[1:], 0.0))
        cos_to_final = G[1:, -1] / (norm * norm[-1])
        # updates u_t = Δ_t − Δ_{t−1}: ⟨u_t, u_r⟩ = G_tr − G_t,r−1 − G_t−1,r + G_t−1,r−1
        D = np.eye(len(s))[1:] - np.eye(len(s))[:-1]  # [T, T+1]: row t is e_t − e_{t−1}
        U = D @ G @ D.T
        u = np.sqrt(np.maximum(np.diag(U), 0.0))
        update_cos = np.full(len(steps), np.nan)
        update_cos[1:] = np.diag(U, -1) / (u[1:] * u[:-1])
        x = s - s.mean()
        ss_tot = diag.sum() - G.sum() / len(s)
        explained = (x @ G @ x) / (x @ x)
        r2 = explained / ss_tot if ss_tot > 0 else np.nan
        # the line's coefficients as combinations of the Δ_t: b = Σ x_t Δ_t / Σ x², a = Δ̄ − b s̄
        b = x / (x @ x)
        a = np.full(len(s), 1.0 / len(s)) - b * s.mean()
        end = a + b * s[-1]
        intercept_share = (a @ G @ a) / (end @ G @ end) if end @ G @ end > 0 else np.nan
        # the same updates' sizes in independent directions: E G_st = Σ_{r ≤ min(s, t)} ‖u_r‖² (a random walk)
        cum = np.concatenate([[0.0], np.cumsum(np.diag(U))])
        walk = cum[np.minimum.outer(np.arange(len(s)), np.arange(len(s)))]
        walk_tot = np.trace(walk) - walk.sum() / len(s)
        r2_walk = ((x @ walk @ x) / (x @ x)) / walk_tot if walk_tot > 0 else np.nan
    return {"norm": norm, "cos_to_final": cos_to_final, "update_cos": update_cos, "r2": _unit(r2),
            "r2_random_walk": _unit(r2_walk), "intercept_share": float(intercept_share)}


def _unit(x: float) -> float:
    return float(np.clip(x, 0.0, 1.0)) if np.isfinite(x) else float("nan")


def group_grams(dots: np.ndarray, tensor_group: Sequence[str], groups: Sequence[str]) -> dict[str, np.ndarray]:
    """The Gram matrix ⟨Δ_s, Δ_t⟩ of each group and of the whole model (``"all"``) from ``dots [run, run2, tensor]``."""
    member = np.asarray(tensor_group, dtype=object)
    out = {g: dots[:, :, member == g].sum(-1) for g in groups}
    out["all"] = dots.sum(-1)
    return out


# --------------------------------------------------------------------------------------------------
# the command: graftkit trajectory


#: The fields of a trajectory's KL measurement, passed to ``graftkit kl --all-checkpoints`` as they are.
KL_FIELDS = ("tasks", "seeds", "episodes", "items", "max_new_tokens", "n_boot", "system", "template", "answer_format",
             "device", "dtype", "engine")


@dataclass(frozen=True, kw_only=True)
class TrajectoryConfig(ReadOptions, RunOption, DeviceOption, EngineOption, PromptOption):
    """``graftkit trajectory``: how a run's weights moved from the SFT base, checkpoint by checkpoint."""

    command = "trajectory"
    rl: Path = opt(flags=("--from",))
    """The run: a trainer's output_dir (its checkpoint-N folders), or a graftkit RL policy (the step folders of
    POLICY.checkpoints, then the policy)."""
    base: Optional[Path] = None
    """The SFT base (default: the parent recorded in graftkit.json)."""
    tasks: Optional[str] = None
    """KL(π_t‖π_SFT) per step on these tasks (suite or comma list; as graftkit kl --all-checkpoints); default none."""
    seeds: int = 10
    """With --tasks: evaluation seeds 0..N-1 of the KL rollouts."""
    episodes: int = 1
    """With --tasks: episodes per seed and task."""
    items: str = "auto"
    """With --tasks: which items play (as graftkit kl: auto, heldout, train or all)."""
    max_new_tokens: int = 32
    """With --tasks: longest output in tokens (raise it for a reasoning trainer's completions)."""
    n_boot: int = 10_000
    """With --tasks: bootstrap resamples of each KL interval (as graftkit kl)."""
    save: Optional[Path] = opt(None, flags=("--save",))
    """HDF5 result of the movement (default: RUN/results/delta-<run>-trajectory.h5, as delta --all-checkpoints)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tasks is None:
            from dataclasses import fields

            defaults = {f.name: f.default for f in fields(self)}
            given = [f"--{n.replace('_', '-')}" for n in KL_FIELDS if n != "tasks" and getattr(self, n) != defaults[n]]
            if given:
                raise GraftkitError(f"{', '.join(given)} say how KL is measured, and no --tasks was given",
                                    "pass --tasks (e.g. --tasks mastered), or drop " + ", ".join(given))


@dataclass(frozen=True)
class Trajectory:
    """What ``graftkit trajectory`` measured: the movement at every checkpoint (the delta result), the path's
    geometry per group and in all (:func:`path_measures`), and with ``--tasks`` each step's KL."""

    run: Path
    delta: DeltaResult
    steps: tuple[int, ...]
    measures: dict[str, dict]
    kl: object | None
    seconds: float

    def as_json(self) -> dict:
        d, m = self.delta, self.measures
        rows = []
        for t, (step, lab) in enumerate(zip(self.steps, d.runs)):
            rows.append({"step": step, "checkpoint": lab, "norm": _num(m["all"]["norm"][t]),
                         "rel_delta": _num(d.total("rel_delta", t)), "cos_to_final": _num(m["all"]["cos_to_final"][t]),
                         "update_cos": _num(m["all"]["update_cos"][t]),
                         "frac_unchanged": _num(d.total("frac_unchanged", t)),
                         "frac_unchanged_bf16": _num(d.total("frac_unchanged_bf16", t))
                         if d.has("total_frac_unchanged_bf16") else None})
        if self.kl is not None:
            for row, k in zip(rows, self.kl.rows()):
                row["kl_per_token"] = k["rl"]["kl_per_token"]
        groups = {g: {"r2": _num(v["r2"]), "r2_random_walk": _num(v["r2_random_walk"]),
                      "intercept_share": _num(v["intercept_share"]),
                      "share": _num(d.group("share", len(self.steps) - 1)[d.groups.index(g)]) if g != "all" else 1.0,
                      "norm": [_num(x) for x in v["norm"]], "cos_to_final": [_num(x) for x in v["cos_to_final"]],
                      "update_cos": [_num(x) for x in v["update_cos"]]} for g, v in m.items()}
        return {"run": str(self.run), "base": d.base_path, "steps": rows,
                "groups": groups, "conventions": CONVENTIONS, "result_file": str(d.path),
                "kl_files": [] if self.kl is None else [str(r.file) for r in self.kl.runs],
                "notes": d.notes + ([] if self.kl is None else self.kl.notes()), "seconds": self.seconds,
                "extrapolate": "graftkit graft --from RUN --groups all --alpha A (A > 1: further along Δ_T)"}

    def tables(self) -> list:
        """What ``graftkit trajectory`` prints (from :meth:`as_json`): a row per step, the path's fit per group, the
        notes and where the result was saved."""
        from ..core.tables import Table, bounds_text

        j = self.as_json()

        def f(x, spec=".4g") -> str:
            return "—" if x is None else format(x, spec)

        columns = {"step": lambda r: str(r["step"]), "checkpoint": lambda r: r["checkpoint"],
                   "‖Δ‖_F": lambda r: f(r["norm"]), "‖Δ‖/‖W‖": lambda r: f(r["rel_delta"]),
                   "cos(Δ_t, Δ_T)": lambda r: f(r["cos_to_final"], ".3f"),
                   "cos(u_t, u_t−1)": lambda r: f(r["update_cos"], ".3f"),
                   "unchanged": lambda r: f(None if r["frac_unchanged"] is None else 100 * r["frac_unchanged"], ".2f")
                   + "%", "unchanged (bf16)": lambda r: "—" if r["frac_unchanged_bf16"] is None
                   else f"{100 * r['frac_unchanged_bf16']:.2f}%"}
        if self.kl is not None:
            columns["KL(π_t‖π_SFT)/token [95%]"] = lambda r: bounds_text(r["kl_per_token"])
        fit = {"group": lambda g: g, "share of Δ_T": lambda g: f"{100 * j['groups'][g]['share']:.1f}%",
               "R² of a line": lambda g: f(j["groups"][g]["r2"], ".3f"),
               "R² of a random walk": lambda g: f(j["groups"][g]["r2_random_walk"], ".3f"),
               "intercept share": lambda g: f(j["groups"][g]["intercept_share"], ".3f")}
        return [Table(f"{Path(j['run']).name}: the weight path from {j['base']}, by step", columns, j["steps"],
                      left=("checkpoint",)),
                Table("the path's straight-line fit per group (the base at step 0 included; R² pooled over entries)",
                      fit, list(j["groups"]), left=("group",)),
                f"extrapolate along the last delta: {j['extrapolate']}", *(f"note: {n}" for n in j["notes"]),
                f"saved {self.delta.path} ({self.seconds:.1f} s)"]


def _num(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def delta_path(d: DeltaResult, steps: Sequence[int]) -> dict[str, dict]:
    """The path measures of a delta taken over a run's checkpoints at ``steps`` (:func:`path_measures`), per group
    and in all, from its stored inner products ``dot_delta``."""
    dots = np.asarray(d.result["dot_delta"], dtype=np.float64)
    return {g: path_measures(G, steps) for g, G in group_grams(dots, d.tensor_group, d.groups).items()}


def run_trajectory(cfg: TrajectoryConfig, on_progress: OnProgress = no_progress) -> Trajectory:
    """The delta of every checkpoint of ``cfg.rl`` against one base (one pass: ``delta --all-checkpoints``, whose
    result it writes), the path measures from its inner products, and with ``cfg.tasks`` KL at every step
    (``kl --all-checkpoints``)."""
    import time

    from ..evaluation.kl import KLConfig, run_kl
    from ..weights import base_of, checkpoints_of
    from ..weights.runs import recorded_step
    from .anatomy import DeltaConfig, run_delta

    t0 = time.perf_counter()
    follow = ("pass a trainer's output_dir (its checkpoint-N folders) or a graftkit RL policy whose "
              "POLICY.checkpoints folder holds its steps")
    try:
        paths = checkpoints_of(cfg.rl, all_checkpoints=True, flag="--from")
    except GraftkitError as e:
        raise GraftkitError(f"--from {cfg.rl}: no checkpoints of a run to follow ({e.what})", follow) from None
    if len(paths) < 2:
        raise GraftkitError(f"--from {cfg.rl}: one checkpoint ({paths[0]}) is a point, not a path", follow)
    steps = [recorded_step(p) for p in paths]
    if any(s is None for s in steps):
        raise GraftkitError(f"--from {cfg.rl}: {paths[steps.index(None)]} records no optimiser step", follow)
    base = base_of(paths[-1], cfg.base)
    d = run_delta(DeltaConfig(rl=(cfg.rl,), all_checkpoints=True, base=base, save=cfg.save, top_frac=0, run=cfg.run,
                              no_pickle=cfg.no_pickle, unknown=cfg.unknown, config=cfg.config), on_progress)
    measures = delta_path(d, steps)
    kl = None
    if cfg.tasks is not None:
        kl = run_kl(KLConfig(model=cfg.rl, base=base, all_checkpoints=True, run=cfg.run,
                             **{n: getattr(cfg, n) for n in KL_FIELDS}), on_progress)
    return Trajectory(Path(cfg.rl), d, tuple(steps), measures, kl, time.perf_counter() - t0)


__all__ = ["CONVENTIONS", "Trajectory", "TrajectoryConfig", "delta_path", "group_grams", "path_measures",
           "run_trajectory", "with_origin"]
