"""Graft experiments: sweeps expand to frozen specs, and an executor's workers evaluate them in place.

Plan, then execute. :func:`expand_sweep` turns a sweep kind and the chosen groups into a list of frozen,
serialisable :class:`GraftExperiment` s (``--dry-run`` prints them); :func:`plan_sweep` turns each into a
:class:`~graftkit.graft.plan.GraftPlan` over the checkpoint's tensors, so a spec that selects nothing
fails before any evaluation; :func:`plan_units` splits the configurations still to play into
:class:`SweepUnit` s (a configuration on a block of evaluation seeds) for the workers of an executor
(:class:`graftkit.core.executor.Executor`: this process, or Ray workers). Each worker holds a
:class:`SweepWorker`, built once in its own process: the checkpoints opened, the base policy loaded, into
which it grafts each unit's spec in place (:class:`~graftkit.graft.inplace.InPlaceGraft`) and evaluates
it on the same tasks × seeds × episodes as every other spec (:class:`EpisodeGrid`);
:func:`execute_sweep` is the one loop that hands out units and streams each configuration's outcomes as
its last block finishes, whichever executor runs them. :func:`run_graft_sweep` is the same on a policy
already loaded in this process.

Sweeps over the chosen groups G (k = |G|), each with the base (∅) and the RL model (every group) as
references, both always included:

- ``single``     each group alone: k (+ 2 references)
- ``loo``        all chosen groups but one: k, plus all chosen groups when G is not every group present
- ``factorial``  every subset of G: 2^k (∅ is the base; G itself is the RL model when G is every group
                 present), k ≤ :data:`MAX_FACTORIAL`
- ``layers``     each group, and all of G together when k > 1, at each band early / mid / late and all
- ``alpha``      all of G together at each α of the curve (α = 0 is the base, α = 1 with G every group
                 present is the RL model)
- ``sparsity``   all of G together at each fraction F of the curve: only the ⌈F·n⌉ entries of largest |Δ|
                 (per tensor or global, :mod:`graftkit.graft.sparse`); F = 1 is G's whole graft

A spec equal to a reference is not repeated. Labels: ``attn+mlp`` (groups joined in taxonomy order),
``attn@late`` (a layer selection other than all), ``mlp×0.5`` (α ≠ 1), ``attn+mlp[top 0.01]`` (the top 1% of
the entries, per tensor; ``[top 0.01 global]`` over all of them), ``∅ (base)``, ``all (rl)``.
:func:`sweep_result` assembles the labelled result (kind ``graft-sweep``) with the paired comparisons and
the attribution of :mod:`graftkit.graft.attribution`; :class:`SweepResult` and :class:`DissociationResult`
are the typed views every reader goes through. With ``--metric kl`` or ``both`` (:data:`METRICS`) each
configuration is also (or only) scored by KL on fixed rollouts of RL and SFT, by forward passes through the same
in-place grafts (:meth:`SweepWorker.score_kl`, :mod:`graftkit.graft.kl`), and the result holds the ``kl_*`` arrays. An interrupted sweep resumes (:func:`resume_outcomes`):
partial results go to ``.partial-<name>`` beside the result (:func:`graftkit.results.layout.partial_path`),
never to the result itself.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..results.layout import GRAFT_DISSOCIATION, GRAFT_SWEEP, partial_path
from ..results.store import Result, View, read_result
from ..weights import BANDS, GROUPS, Checkpoint, Taxonomy
from ..weights.taxonomy import DECODER
from . import attribution as A
from .kl import SIDES as KL_SIDES, SweepKL, kl_arrays, kl_conventions
from .plan import GraftPlan, GraftSpec, plan_graft

SWEEPS = ("single", "loo", "factorial", "layers", "alpha", "sparsity")
#: What scores each configuration (``graft --metric``): success (episodes played per configuration), kl (the
#: fraction of RL's behavioural change it reproduces, by forward passes on fixed rollouts; :mod:`graftkit.graft.kl`)
#: or both.
METRICS = ("success", "kl", "both")
MAX_FACTORIAL = 6
DEFAULT_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_FRACS = (0.001, 0.01, 0.05, 0.2, 0.5, 1.0)
BASE_LABEL, RL_LABEL = "∅ (base)", "all (rl)"
ROLES = ("base", "rl", "graft")


@dataclass(frozen=True)
class GraftExperiment:
    """One configuration of a sweep: which groups, layers and α to graft from RL into base."""

    label: str
    """Unique name of the configuration within its sweep (see the module docstring)."""
    groups: tuple[str, ...]
    """Groups grafted; for the RL reference, every group the model has."""
    layers: str = "all"
    """Decoder layers: all | early | mid | late | indices (as --layers)."""
    alpha: float = 1.0
    """Scale of the grafted delta."""
    role: str = "graft"
    """base (nothing grafted), rl (everything grafted: the RL model exactly) or graft."""
    reverse: bool = False
    """Revert the groups in the RL model to base instead (an ablation; --eval of a --reverse graft)."""
    top_frac: float | None = None
    """Move only this fraction of the groups' entries, those of largest |Δ| (:mod:`graftkit.graft.sparse`)."""
    top_scope: str = "tensor"
    """Where ``top_frac`` counts: per tensor or over all the groups' entries (global)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise GraftkitError(f"experiment role {self.role!r}", f"use one of {', '.join(ROLES)}")
        self.spec()  # validates groups, α and the fraction

    def spec(self) -> GraftSpec:
        if self.role == "base":
            return GraftSpec(())
        if self.role == "rl":
            return GraftSpec(GROUPS)  # every group the model has, tied heads included
        return GraftSpec(self.groups, self.layers, self.alpha, self.reverse, self.top_frac, self.top_scope)

    def as_dict(self) -> dict:
        return {**asdict(self), "groups": list(self.groups)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "GraftExperiment":
        frac = d.get("top_frac")
        return cls(d["label"], tuple(d["groups"]), d.get("layers", "all"), float(d.get("alpha", 1.0)),
                   d.get("role", "graft"), bool(d.get("reverse", False)), None if frac is None else float(frac),
                   d.get("top_scope", "tensor"))


def grafted_delta_erank(base: Checkpoint, rl: Checkpoint, plan: GraftPlan) -> float:
    """The effective rank (Roy–Vetterli, of σ from the float64 Gram) of the delta a graft adds to the base, θ_graft −
    θ_base, mean over the 2-D tensors it moves (a sparsified plan: only the entries it selects, scaled by their
    coefficient); NaN when it moves no matrix. Reads each moved matrix of both once."""
    import numpy as np
    import torch

    from ..rank.metrics import erank
    from ..rank.spectra import singular_values
    from .sparse import masked_value
    from .splice import splice

    if plan.needs_cuts:
        raise ValueError("a top-fraction plan must be sparsified first")
    values = []
    for n in plan.moved():
        if len(base.metas[n].shape) != 2:
            continue
        b, r = base.read(n), rl.read(n)
        if n in plan.cuts:
            v = masked_value(b, r, plan.coef[n], plan.spec.neutral, plan.cuts[n], n)
        else:
            v = splice(b, r, plan.coef[n])
        work = torch.float64 if torch.float64 in (b.dtype, v.dtype) else torch.float32
        sigma = singular_values(v.to(work) - b.to(work))
        if sigma.any():
            values.append(erank(sigma))
    return float(np.mean(values)) if values else float("nan")


def _ordered(groups) -> tuple[str, ...]:
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise GraftkitError(f"unknown group(s) {', '.join(bad)}", f"choose from {', '.join(GROUPS)}")
    return tuple(g for g in GROUPS if g in set(groups))


def label_for(groups: Sequence[str], layers: str = "all", alpha: float = 1.0, reverse: bool = False,
              top_frac: float | None = None, top_scope: str = "tensor") -> str:
    """The display label of a configuration (see the module docstring)."""
    text = "+".join(_ordered(groups)) or "∅"
    if top_frac is not None:
        text += f"[top {top_frac:g}{' global' if top_scope == 'global' else ''}]"
    if reverse:
        text = f"rl−({text})"
    if layers.strip().lower() not in ("", "all"):
        text += f"@{layers}"
    if alpha != 1:
        text += f"×{alpha:g}"
    return text


def references(present: Sequence[str]) -> list[GraftExperiment]:
    """The base (∅) and RL (every group) configurations."""
    return [GraftExperiment(BASE_LABEL, (), role="base"), GraftExperiment(RL_LABEL, _ordered(present), role="rl")]


def expand_sweep(
    kind: str,
    groups: Sequence[str],
    present: Sequence[str],
    layers: str = "all",
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    fracs: Sequence[float] = DEFAULT_FRACS,
    scope: str = "tensor",
) -> list[GraftExperiment]:
    """The configurations of sweep ``kind`` over ``groups`` (see the module docstring); ``present``: every
    group the model has (the RL reference grafts them all); ``layers`` applies to single, loo, factorial,
    alpha and sparsity; ``alphas`` to alpha; ``fracs`` and ``scope`` to sparsity."""
    if kind not in SWEEPS:
        raise GraftkitError(f"unknown sweep {kind!r}", f"use one of {', '.join(SWEEPS)}")
    chosen, present = _ordered(groups), _ordered(present)
    if not chosen:
        raise GraftkitError("a sweep needs at least one group", "pass e.g. --groups attn,mlp")
    absent = [g for g in chosen if g not in present]
    if absent:
        raise GraftkitError(f"group(s) {', '.join(absent)} have no tensors in this model",
                            f"groups present: {', '.join(present)}")
    layers = layers.strip() or "all"
    out = references(present)

    def add(gs, lay=layers, alpha=1.0, frac=None) -> None:
        gs = _ordered(gs)
        frac = None if frac == 1 else frac  # every entry: the whole graft
        if not gs or alpha == 0:
            return  # the base
        if set(gs) == set(present) and lay.lower() == "all" and alpha == 1 and frac is None:
            return  # the RL model
        label = label_for(gs, lay, alpha, top_frac=frac, top_scope=scope)
        if all(e.label != label for e in out):
            out.append(GraftExperiment(label, gs, lay, float(alpha), top_frac=frac,
                                       top_scope=scope if frac is not None else "tensor"))

    k = len(chosen)
    if kind == "single":
        for g in chosen:
            add([g])
    elif kind == "loo":
        for g in chosen:
            add([x for x in chosen if x != g])
        add(chosen)
    elif kind == "factorial":
        if k > MAX_FACTORIAL:
            raise GraftkitError(
                f"a factorial over {k} groups is {2 ** k} configurations; at most {MAX_FACTORIAL} groups "
                f"({2 ** MAX_FACTORIAL})", "choose fewer groups with --groups (e.g. --groups attn,mlp,embed)")
        for mask in range(1, 2**k):
            add([g for i, g in enumerate(chosen) if mask >> i & 1])
    elif kind == "layers":
        sets = [[g] for g in chosen] + ([list(chosen)] if k > 1 else [])
        for gs in sets:
            for band in (*BANDS, "all"):
                add(gs, band)
    elif kind == "alpha":
        if not alphas:
            raise GraftkitError("--alphas is empty", "pass e.g. --alphas 0,0.25,0.5,0.75,1")
        for a in alphas:
            add(chosen, layers, float(a))
    else:  # sparsity
        if not fracs:
            raise GraftkitError("--fracs is empty", "pass e.g. --fracs 0.001,0.01,0.1,1")
        for f in sorted(set(fracs)):
            add(chosen, layers, 1.0, float(f))
    return out


def one_experiment(spec: GraftSpec, present: Sequence[str]) -> list[GraftExperiment]:
    """``--eval`` of one graft: the references and the graft ``spec`` (unless it is one of them)."""
    out = references(present)
    gs = _ordered(spec.groups) if set(spec.groups) != set(GROUPS) else _ordered(present)
    whole = set(gs) == set(present) and spec.layers.strip().lower() in ("", "all")
    nothing = not gs or spec.alpha == 0
    if spec.alpha == 1 and (whole or nothing) and spec.top_frac in (None, 1):
        return out  # the graft is base or RL itself
    label = label_for(gs, spec.layers, spec.alpha, spec.reverse, spec.top_frac, spec.top_scope)
    out.append(GraftExperiment(label, gs, spec.layers, spec.alpha, reverse=spec.reverse, top_frac=spec.top_frac,
                               top_scope=spec.top_scope))
    return out


def present_groups(tax: Taxonomy) -> tuple[str, ...]:
    """Groups with at least one tensor in the checkpoint."""
    return _ordered({r.group for r in tax.roles.values() if r.group in GROUPS})


def layered_groups(tax: Taxonomy) -> tuple[str, ...]:
    """Groups with tensors in decoder layers (the ones a layer band can select)."""
    return _ordered({r.group for r in tax.roles.values() if r.group in GROUPS and r.stack == DECODER})


def plan_sweep(tax: Taxonomy, experiments: Sequence[GraftExperiment]) -> dict[str, GraftPlan]:
    """Every experiment's plan (a bad spec fails here, before any evaluation)."""
    labels = [e.label for e in experiments]
    if len(set(labels)) != len(labels):
        raise GraftkitError(f"duplicate configuration labels in a sweep: {labels}")
    return {e.label: plan_graft(tax, e.spec()) for e in experiments}


# -------------------------------------------------------------------------------------- execute


@dataclass(frozen=True)
class EpisodeGrid:
    """The episodes every configuration of a sweep plays, and how: ``tasks`` × ``seeds`` × ``episodes``
    decoded by ``decode``, ``batch_size`` episodes advanced together."""

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    episodes: int
    decode: Any
    """How actions are decoded (:class:`graftkit.agent.Decode`)."""
    batch_size: int = 64
    backend: str = "py"
    obs: str = "text"
    items: str = "heldout"
    """Which items the episodes draw (:func:`graftkit.agent.evaluate.plan_episodes`): heldout, train or all."""
    whole: tuple[str, ...] = ()
    """Tasks played on every item whatever ``items`` says: a user's file (nothing in the sweep trains on it)."""

    @property
    def shape(self) -> tuple[int, int, int]:
        """``[task, seed, episode]``: the shape of one configuration's outcomes."""
        return len(self.tasks), len(self.seeds), self.episodes

    @property
    def count(self) -> int:
        """Episodes one configuration plays."""
        return len(self.tasks) * len(self.seeds) * self.episodes


@dataclass(frozen=True)
class Played:
    """One configuration's outcomes on a block of seeds ``[task, seed, episode]``: ``success`` (int8), and how
    many of each episode's turns did not parse (``invalid``) of the turns it played (``turns``) — a policy
    that writes answers in another format than the task reads scores 0 with every output unparsed."""

    success: np.ndarray
    invalid: np.ndarray
    turns: np.ndarray

    @classmethod
    def concat(cls, blocks: Sequence["Played"]) -> "Played":
        """Blocks of seeds put together (in seed order)."""
        return cls(*(np.concatenate([getattr(b, k) for b in blocks], axis=1) for k in ("success", "invalid", "turns")))


@dataclass(frozen=True)
class SweepUnit:
    """One unit of a sweep's plan: configuration ``experiment`` of RL run ``run`` (A: ``--from``, B: ``--vs``),
    played on the evaluation seeds at positions ``block`` of the grid's."""

    run: str
    experiment: GraftExperiment
    block: tuple[int, ...]


def plan_units(experiments: Sequence[GraftExperiment], n_seeds: int, width: int, *, run: str = "A",
               done: Collection[str] = ()) -> list[SweepUnit]:
    """The units of run ``run``'s sweep for a pool of ``width`` workers: every configuration not ``done``, each
    split into ``min(width, n_seeds)`` contiguous blocks of seeds. Episodes depend only on their seed, so a
    configuration's blocks put together are its outcomes, and no worker idles while another plays a sweep's
    last configuration alone; the serial executor's one worker plays each configuration whole."""
    blocks = [tuple(b.tolist()) for b in np.array_split(np.arange(n_seeds), min(width, n_seeds))]
    return [SweepUnit(run, e, b) for e in experiments if e.label not in done for b in blocks]


class SweepWorker:
    """What each worker of a sweep holds, built once in its own process (the serial executor's one worker is
    this process): the base and each RL run's checkpoint by run key, opened and checked; the base policy,
    loaded by ``load()`` when first needed (or given loaded, as ``policy``); one in-place graft session at a
    time (per RL run: a worker switches runs once, between ``--vs``'s two sweeps). :meth:`close` restores
    the base's weights."""

    def __init__(self, base: Checkpoint, rls: Mapping[str, Checkpoint], load: Callable[[], Any] | None = None, *,
                 policy=None, unknown: str = "keep-base", tax: Taxonomy | None = None):
        if load is None and policy is None:
            raise GraftkitError("a sweep worker needs its base policy, loaded or a way to load it")
        self.base, self.rls, self.unknown = base, dict(rls), unknown
        self.tax = tax or base.taxonomy(unknown)
        self._load, self._policy = load, policy
        self.key, self.session, self.plans = None, None, {}

    @property
    def policy(self):
        if self._policy is None:
            self._policy = self._load()
        return self._policy

    @property
    def placement(self) -> dict:
        return self.policy.placement

    def _session(self, key: str):
        from .inplace import InPlaceGraft

        if key != self.key:
            self.end_session()
            self.session = InPlaceGraft(self.policy.model, self.base, self.rls[key], unknown=self.unknown,
                                        mirror=self.policy.engine).__enter__()
            self.key = key
        return self.session

    def _plan(self, run: str, e: GraftExperiment) -> GraftPlan:
        """``e``'s plan for RL run ``run`` (a top-fraction graft's entries depend on the run), made once."""
        from .plan import sparsify

        if (run, e.label) not in self.plans:
            self.plans[run, e.label] = sparsify(plan_graft(self.tax, e.spec()), self.base, self.rls[run])
        return self.plans[run, e.label]

    def play(self, unit: SweepUnit, grid: EpisodeGrid, on_episode: Callable[[object], None] | None = None
             ) -> Played:
        """The outcomes ``[task, seed, episode]`` of ``unit``'s configuration on its block of seeds."""
        from ..agent import evaluate

        self._session(unit.run).apply(self._plan(unit.run, unit.experiment))
        outcome = evaluate(self.policy, list(grid.tasks), [grid.seeds[i] for i in unit.block], grid.episodes,
                           grid.decode, backend=grid.backend, batch_size=grid.batch_size,
                           on_episode=on_episode or (lambda ep: None), obs=grid.obs, items=grid.items,
                           whole=grid.whole)
        return Played(outcome.success[..., 0].astype(np.int8), outcome.invalid[..., 0].astype(np.int16),
                      outcome.turns[..., 0].astype(np.int16))

    def score_kl(self, run: str, experiments: Sequence[GraftExperiment], grid: EpisodeGrid, *,
                 on_progress: Callable[[str, int, int, str], None] | None = None) -> "SweepKL":
        """Every configuration's KL on fixed rollouts (:mod:`graftkit.graft.kl`): RL's and SFT's own rollouts are
        played once (the model grafted to RL, then to ∅: the in-place grafts every configuration uses), then each
        configuration is grafted in and scores both sets by forward passes only."""
        import time

        from ..agent.kl import SIDES, play_fixed
        from .kl import score_configurations, sweep_kl

        progress = on_progress or (lambda what, advance, total, unit: None)
        by_label = {e.label: e for e in experiments}
        base = next(e.label for e in experiments if e.role == "base")
        rl = next(e.label for e in experiments if e.role == "rl")

        def apply(label: str) -> None:
            self._session(run).apply(self._plan(run, by_label[label]))

        t0, fixed = time.perf_counter(), {}
        for side, label in zip(SIDES, (rl, base)):
            apply(label)
            what = f"{side.upper()} rollouts (T=1)"
            fixed[side] = play_fixed(self.policy, side, grid.tasks, grid.seeds, grid.episodes,
                                     max_new_tokens=grid.decode.max_new_tokens, backend=grid.backend,
                                     batch_size=grid.batch_size, items=grid.items, whole=grid.whole,
                                     on_episode=lambda ep, what=what: progress(what, 1, grid.count, "episodes"))
            if fixed[side].no_items:
                raise GraftkitError(f"{', '.join(fixed[side].no_items)}: no evaluation item, so no fixed episodes to "
                                    "score KL on", "drop those tasks from --tasks")
        t1 = time.perf_counter()
        labels = [e.label for e in experiments]
        total = len(labels) * sum(f.n_tokens for f in fixed.values())
        scored = []

        def tick(n: int) -> None:
            scored.append(n)
            progress("KL forward passes", n, total, "tokens")

        per_token = score_configurations(self.policy.model, self.policy.pad_id, apply, labels, base, rl, fixed,
                                         on_tokens=tick)
        return sweep_kl(labels, base, rl, fixed, per_token,
                        {"rollouts": t1 - t0, "scoring": time.perf_counter() - t1}, sum(scored))

    def end_session(self) -> None:
        """End the graft session: the model (and its engine) holds the base's weights again."""
        if self.session is not None:
            session, self.key, self.session = self.session, None, None
            session.__exit__(None, None, None)

    def close(self) -> None:
        """End the graft session and free the generation engine (a vLLM engine) of a policy this worker loaded
        (one given loaded stays its caller's)."""
        try:
            self.end_session()
        finally:
            if self._load is not None and self._policy is not None:
                self._policy.close()


def kl_unit(worker: SweepWorker, run: str, experiments: Sequence[GraftExperiment], grid: EpisodeGrid,
            on_progress: Callable[[str, int, int, str], None] | None = None) -> "SweepKL":
    """The KL scoring of a sweep's pool, one unit on one worker: :meth:`SweepWorker.score_kl`."""
    return worker.score_kl(run, experiments, grid, on_progress=on_progress)


def play_unit(worker: SweepWorker, unit: SweepUnit, grid: EpisodeGrid,
              on_episode: Callable[[object], None] | None = None) -> Played:
    """The work of a sweep's pool: :meth:`SweepWorker.play`."""
    return worker.play(unit, grid, on_episode)


def execute_sweep(pool, units: Sequence[SweepUnit], grid: EpisodeGrid, *, workers: int | None = None,
                  on_start: Callable[[SweepUnit], None] = lambda u: None,
                  on_episode: Callable[[object], None] | None = None,
                  on_result: Callable[[GraftExperiment, Played], None] = lambda e, s: None
                  ) -> dict[str, Played]:
    """Play the units of one run's sweep (:func:`plan_units`) on ``pool``, an executor's pool whose workers
    hold a :class:`SweepWorker` (:meth:`graftkit.core.executor.Executor.pool`; ``workers``: the width the
    units were planned for): one loop whichever executor it is. ``on_start(unit)`` as each unit is handed
    out; ``on_result(experiment, played)`` (:class:`Played` ``[task, seed, episode]``), in this process, as a
    configuration's last block finishes. ``on_episode`` is called for each episode a unit plays, in the worker's
    process: pass it only to an executor whose units run in this one. Returns the outcomes by label."""
    work = functools.partial(play_unit, grid=grid, on_episode=on_episode)
    blocks = Counter(u.experiment.label for u in units)
    pieces: dict[str, dict[tuple[int, ...], Played]] = {}
    out: dict[str, Played] = {}
    for i, s in pool.map(work, units, lambda i: on_start(units[i]), workers=workers):
        u = units[i]
        got = pieces.setdefault(u.experiment.label, {})
        got[u.block] = s
        if len(got) == blocks[u.experiment.label]:
            out[u.experiment.label] = Played.concat([got[b] for b in sorted(got)])
            on_result(u.experiment, out[u.experiment.label])
    return out


def run_graft_sweep(
    experiments: Sequence[GraftExperiment],
    policy,
    base: Checkpoint,
    rl: Checkpoint,
    tasks: Sequence[str],
    seeds: Sequence[int],
    episodes: int,
    decode,
    *,
    done: Mapping[str, np.ndarray] | None = None,
    on_start: Callable[[GraftExperiment], None] = lambda e: None,
    on_episode: Callable[[object], None] = lambda ep: None,
    on_result: Callable[[GraftExperiment, np.ndarray], None] = lambda e, s: None,
    unknown: str = "keep-base",
    batch_size: int = 64,
    backend: str = "py",
    obs: str = "text",
) -> dict[str, np.ndarray]:
    """Evaluate every experiment on identical episodes in this process (the serial executor), grafting in
    place into the already loaded ``policy.model`` (which must hold ``base``'s weights; it does again on
    return, also after an error).

    Returns success ``[task, seed, episode]`` (int8) per label, in ``experiments`` order; labels in
    ``done`` (outcomes of an earlier, interrupted run) are taken from there, not evaluated again.
    """
    from ..core.executor import Executor

    grid = EpisodeGrid(tuple(tasks), tuple(seeds), episodes, decode, batch_size, backend, obs)
    done = checked_done(done, grid.shape)
    tax = base.taxonomy(unknown)
    plan_sweep(tax, experiments)  # a bad spec fails here, before any evaluation
    with Executor().pool(lambda: SweepWorker(base, {"A": rl}, policy=policy, unknown=unknown, tax=tax)) as pool:
        played = execute_sweep(pool, plan_units(experiments, len(grid.seeds), 1, done=done), grid,
                               on_start=lambda u: on_start(u.experiment), on_episode=on_episode,
                               on_result=lambda e, p: on_result(e, p.success))
    return {e.label: played[e.label].success if e.label in played else np.asarray(done[e.label], dtype=np.int8)
            for e in experiments}


def checked_done(done: Mapping[str, np.ndarray] | None, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Stored outcomes of an earlier run, each checked to have this sweep's ``[task, seed, episode]`` shape."""
    done = dict(done or {})
    for label, s in done.items():
        if np.shape(s) != shape:
            raise GraftkitError(f"stored outcomes of {label} have shape {np.shape(s)}, expected {shape}",
                                "start the sweep afresh (remove the partial result)")
    return done


# -------------------------------------------------------------------------------------- results


def _subsets(experiments: Sequence[GraftExperiment], layers: str) -> dict[frozenset, str]:
    """Configurations that are plain subsets of groups at the sweep's layers and α = 1, by subset."""
    out: dict[frozenset, str] = {}
    for e in experiments:
        if e.role == "base" or (e.role == "rl" and layers == "all") or (
                e.role == "graft" and e.alpha == 1 and not e.reverse and e.layers == layers):
            out.setdefault(frozenset(e.groups), e.label)
    return out


GROUP_EFFECT = {"single": "single", "loo": "loo", "factorial": "shapley"}


def subset_outcomes(experiments, success: Mapping[str, np.ndarray], layers: str = "all") -> dict[frozenset, np.ndarray]:
    """Folded outcomes ``[seed, task·episode]`` by subset of grafted groups (for attribution)."""
    return {s: A.fold_tasks(success[label]) for s, label in _subsets(experiments, layers).items() if label in success}


def sweep_result(
    kind: str,
    experiments: Sequence[GraftExperiment],
    success: Mapping[str, np.ndarray],
    tasks: Sequence[str],
    seeds: Sequence[int],
    episodes: int,
    groups: Sequence[str],
    *,
    layers: str = "all",
    movement_share: Mapping[str, float] | None = None,
    attrs: Mapping | None = None,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
    compare_configs: bool = True,
    metric: str = "success",
    kl: SweepKL | None = None,
    played: Mapping[str, Played] | None = None,
    delta_erank: Mapping[str, float] | None = None,
) -> Result:
    """The labelled ``graft-sweep`` result: every completed configuration's outcomes, each compared with
    base and RL (:func:`graftkit.stats.compare`; ``compare_configs=False`` leaves NaN, for the partial
    results written while a sweep runs), and — once every configuration is in — the attribution
    (factorial: main effects, interactions, Shapley values; single / loo / factorial: ``group_effect``).

    ``metric`` (:data:`METRICS`): with kl or both, ``kl`` (:class:`~graftkit.graft.kl.SweepKL`) adds the KL arrays
    (``kl_*``, over a ``side`` axis: whose rollouts) and their attribution beside the success arrays; with kl
    alone there are no success arrays (``success`` is then unused). ``played``: each configuration's
    :class:`Played` where known, stored as ``invalid`` and ``turns`` (−1 for a configuration resumed from a result
    that did not record them), from which :meth:`SweepResult.parsed` reads the share of outputs that parsed."""
    from ..stats import VERDICT_RULE

    if metric not in METRICS:
        raise GraftkitError(f"unknown --metric {metric!r}", f"use one of {', '.join(METRICS)}")
    groups = _ordered(groups)
    scored = success if metric != "kl" else ({lab: None for lab in kl.labels} if kl is not None else {})
    configs = [e for e in experiments if e.label in scored]
    pending = [e.label for e in experiments if e.label not in scored]
    coords = {
        "config": np.array([e.label for e in configs], dtype=object),
        "task": np.array(list(tasks), dtype=object),
        "seed": np.array(list(seeds)),
        "episode": np.arange(episodes),
        "group": np.array(list(groups), dtype=object),
        "group2": np.array(list(groups), dtype=object),
        "bound": np.array(A.BOUNDS, dtype=object),
    }
    shape = (len(tasks), len(seeds), episodes)
    data: dict[str, tuple] = {**_config_arrays(configs)}
    var_attrs: dict[str, dict] = {}
    conventions = {"interval": A.INTERVAL_METHOD, "level": level, "n_boot": n_boot, "seed": seed,
                   "credible": A.CREDIBLE, "verdict_rule": VERDICT_RULE,
                   "outcomes": "tasks folded into episodes: [seed, task·episode], seeds are the clusters"}
    if metric != "kl":
        data["success"] = (("config", "task", "seed", "episode"),
                           np.stack([np.asarray(success[e.label], np.int8) for e in configs]) if configs
                           else np.zeros((0, *shape), np.int8))
        data.update(_comparisons(configs, success, compare_configs, level, n_boot, seed))
        if played and configs:
            for name in ("invalid", "turns"):
                data[name] = (("config", "task", "seed", "episode"),
                              np.stack([np.asarray(getattr(played[e.label], name), np.int16) if e.label in played
                                        else np.full(shape, -1, np.int16) for e in configs]))
            var_attrs["invalid"] = {"what": "turns of the episode whose output did not parse (a web action, or an "
                                            "answer in the task's answer format); -1: not recorded"}
            var_attrs["turns"] = {"what": "turns the episode played; -1: not recorded"}
        var_attrs.update({
            "diff_vs_base": {"what": "success(config) − success(base), paired bootstrap interval", "level": level},
            "diff_vs_rl": {"what": "success(config) − success(rl), paired bootstrap interval", "level": level},
            "diff_vs_base_bayes": {"what": "posterior mean and credible interval of the same difference",
                                   "level": level},
            "verdict_vs_base": {"rule": VERDICT_RULE},
            "verdict_vs_rl": {"rule": VERDICT_RULE},
        })
        if not pending and compare_configs:
            subsets = subset_outcomes(configs, success, layers)
            _add_attribution(data, var_attrs, kind, subsets, groups, level, n_boot, seed)
    if kl is not None:
        complete = not pending and compare_configs
        named = _subsets(configs, layers) if complete else None
        arrays, kl_attrs = kl_arrays(kl, [e.label for e in configs], named, groups, factorial=kind == "factorial",
                                     effect=GROUP_EFFECT.get(kind), level=level, n_boot=n_boot, seed=seed)
        coords["side"] = np.array(KL_SIDES, dtype=object)
        data.update(arrays)
        var_attrs.update(kl_attrs)
        conventions["kl"] = kl_conventions()
    if delta_erank:  # a sparsity sweep: the rank of what each configuration grafts
        data["config_delta_erank"] = (("config",), np.array([float(delta_erank.get(e.label, np.nan))
                                                             for e in configs], dtype=np.float64))
        var_attrs["config_delta_erank"] = {"convention": "Roy-Vetterli effective rank of the grafted delta "
                                           "theta_graft - theta_base (sigma from the float64 Gram), mean over the 2-D "
                                           "tensors the configuration moves; NaN for the base"}
    if movement_share is not None:
        data["movement_share"] = (("group",), np.array([float(movement_share.get(g, 0.0)) for g in groups]))
        var_attrs["movement_share"] = {
            "what": "share of the run's total squared weight movement ‖Δ‖²_F in the group (delta anatomy)"}
    return Result(GRAFT_SWEEP, coords, data, {
        "sweep": kind, "metric": metric, "layers": layers, "groups": list(groups), "complete": not pending,
        "pending": pending,
        **({"kl_timing": {**kl.seconds, "scored_tokens": kl.scored_tokens}} if kl is not None else {}),
        "experiments": [e.as_dict() for e in experiments], "tasks": list(tasks), "seeds": list(seeds),
        "episodes": episodes, "conventions": conventions, **(attrs or {}),
    }, var_attrs)


def _comparisons(configs: Sequence[GraftExperiment], success: Mapping[str, np.ndarray], compare_configs: bool,
                 level: float, n_boot: int, seed: int) -> dict[str, tuple]:
    """Each configuration's paired difference from base and from RL ``[config, bound]`` and the verdicts
    (:func:`graftkit.stats.compare` on the folded outcomes); NaN and "" where a reference is not in yet, or
    with ``compare_configs=False``."""
    from ..stats import compare

    n = len(configs)
    folded = {e.label: A.fold_tasks(success[e.label]) for e in configs}
    diff_base, diff_rl = np.full((n, 3), np.nan), np.full((n, 3), np.nan)
    bayes_base = np.full((n, 3), np.nan)
    verdict_base, verdict_rl = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
    for i, e in enumerate(configs):
        for ref, diff, verdicts, bayes in ((BASE_LABEL, diff_base, verdict_base, bayes_base),
                                           (RL_LABEL, diff_rl, verdict_rl, None)):
            if ref in folded and compare_configs:
                c = compare(folded[ref], folded[e.label], level=level, n_boot=n_boot, seed=seed)
                diff[i] = (c.diff, c.bootstrap.low, c.bootstrap.high)
                verdicts[i] = c.verdict
                if bayes is not None:
                    bayes[i] = (c.bayes.mean, c.bayes.low, c.bayes.high)
    return {"diff_vs_base": (("config", "bound"), diff_base), "diff_vs_rl": (("config", "bound"), diff_rl),
            "diff_vs_base_bayes": (("config", "bound"), bayes_base),
            "verdict_vs_base": (("config",), verdict_base), "verdict_vs_rl": (("config",), verdict_rl)}


def _config_arrays(configs: Sequence[GraftExperiment]) -> dict[str, tuple]:
    """What each configuration grafts: its groups, α (0 for base, 1 for RL), layers and role ``[config]``."""
    return {
        "config_groups": (("config",), np.array([",".join(e.groups) for e in configs], dtype=object)),
        "config_alpha": (("config",), np.array([e.alpha if e.role == "graft" else float(e.role == "rl")
                                               for e in configs], dtype=np.float64)),
        "config_layers": (("config",), np.array([e.layers for e in configs], dtype=object)),
        # the fraction of the groups' entries moved (1: every entry), and where it counts
        "config_top_frac": (("config",), np.array([1.0 if e.top_frac is None or e.role != "graft" else e.top_frac
                                                  for e in configs], dtype=np.float64)),
        "config_top_scope": (("config",), np.array([e.top_scope for e in configs], dtype=object)),
        "config_role": (("config",), np.array([e.role for e in configs], dtype=object)),
    }


def _add_attribution(data: dict, var_attrs: dict, kind: str, subsets: Mapping[frozenset, np.ndarray],
                     groups: tuple[str, ...], level: float, n_boot: int, seed: int) -> None:
    """The attribution a complete sweep of ``kind`` stores, added to ``data`` with its formulas: factorial's
    main effects, interactions and Shapley values; single / loo / factorial's ``group_effect``."""
    if kind == "factorial":
        fa = A.attribute_factorial(subsets, groups, level, n_boot, seed)
        data["main_effect"] = (("group", "bound"), fa.main_effect)
        data["interaction"] = (("group", "group2", "bound"), fa.interaction)
        data["shapley"] = (("group", "bound"), fa.shapley)
        var_attrs["main_effect"] = {"formula": A.MAIN_EFFECT}
        var_attrs["interaction"] = {"formula": A.INTERACTION}
        var_attrs["shapley"] = {"formula": A.SHAPLEY, "total_v_all_minus_v_none": list(fa.total)}
    if kind in GROUP_EFFECT:
        effect = GROUP_EFFECT[kind]
        data["group_effect"] = (("group", "bound"), A.group_effects(subsets, groups, effect, level, n_boot, seed))
        var_attrs["group_effect"] = {"kind": effect, "formula": A.EFFECTS[effect]}


def completed_outcomes(result: Result, experiments: Sequence[GraftExperiment], setup: Mapping) -> dict[str, np.ndarray]:
    """The outcomes a stored (partial) sweep already holds, if it was run with the same experiments and
    ``setup`` (base, rl, tasks, seeds, episodes, decode); else nothing."""
    if result.kind != GRAFT_SWEEP or "success" not in result.data:
        return {}
    same = json.dumps([e.as_dict() for e in experiments], sort_keys=True) == json.dumps(
        result.attrs.get("experiments"), sort_keys=True)
    for k, v in setup.items():
        same = same and json.dumps(result.attrs.get(k), sort_keys=True, default=str) == json.dumps(v, sort_keys=True, default=str)
    if not same:
        return {}
    return {str(label): result["success"][i] for i, label in enumerate(result.coords["config"])}


def stored_played(dest: str | Path, labels: Collection[str]) -> dict[str, Played]:
    """The :class:`Played` outcomes a sweep's partial (or finished) result at ``dest`` recorded for ``labels`` (a
    resume keeps what its configurations' outputs parsed); those it did not record are left out."""
    for path in (partial_path(dest), Path(dest)):
        if path.is_file():
            try:
                res = read_result(path)
            except GraftkitError:
                continue
            if not {"success", "invalid", "turns"} <= set(res.data):
                continue
            configs = [str(c) for c in res.coords["config"]]
            return {c: Played(*(np.asarray(res[k][i]) for k in ("success", "invalid", "turns")))
                    for i, c in enumerate(configs) if c in labels and int(np.min(res["turns"][i])) >= 0}
    return {}


def resume_outcomes(dest: str | Path, experiments: Sequence[GraftExperiment], setup: Mapping) -> dict[str, np.ndarray]:
    """The outcomes an earlier run of the same sweep (same experiments and ``setup``) left for ``dest``: its
    partial result if it was interrupted, else its finished result; else nothing."""
    for path in (partial_path(dest), Path(dest)):
        if path.is_file():
            try:
                done = completed_outcomes(read_result(path), experiments, setup)
            except GraftkitError:
                done = {}
            if done:
                return done
    return {}


# ----------------------------------------------------------------------------------- typed views


@dataclass(frozen=True)
class SweepResult(View):
    """A ``graft-sweep`` result (:func:`sweep_result`) read by name: per configuration its outcomes
    ``success[config, task, seed, episode]``, its paired differences ``diff_vs_base`` / ``diff_vs_rl``
    ``[config, bound]`` and verdicts; per group the optional attribution arrays (:data:`ATTRIBUTION`,
    ``interaction[group, group2, bound]``) and ``movement_share``; with KL (``--metric kl`` or ``both``) the
    ``kl_*`` arrays over a ``side`` axis (whose rollouts: rl, sft), read by :meth:`reproduced`,
    :meth:`kl_per_token`, :meth:`kl_episode` and :meth:`kl_attribution` (a sweep scored by KL alone has no
    ``success``). ``path``: the file it was read from."""

    KINDS = (GRAFT_SWEEP,)
    PRODUCER = "graftkit graft --sweep"

    ATTRIBUTION = ("group_effect", "main_effect", "shapley")

    @property
    def sweep(self) -> str:
        return str(self.attrs.get("sweep", ""))

    @property
    def configs(self) -> list[str]:
        return [str(c) for c in self.result.coords["config"]]

    @property
    def groups(self) -> list[str]:
        return [str(g) for g in self.result.coords["group"]]

    @property
    def bound_names(self) -> np.ndarray:
        return self.result.coords["bound"]

    def array(self, name: str) -> np.ndarray | None:
        """An array by name, or None when the result does not store it (the optional ones)."""
        return np.asarray(self.result[name]) if name in self.result.data else None

    def strings(self, name: str, default: str = "") -> list[str]:
        """A per-configuration string array (config_groups, config_layers, verdict_vs_base, ...) as strings."""
        v = self.array(name)
        return [str(x) for x in v] if v is not None else [default] * len(self.configs)

    def axis(self, name: str, i: int = 0) -> list[str]:
        """The labels along axis ``i`` of array ``name`` (its groups, for the attribution arrays)."""
        return [str(x) for x in self.result.coords[self.result.dims(name)[i]]]

    def var_attrs(self, name: str) -> Mapping[str, Any]:
        return self.result.var_attrs.get(name, {})

    @property
    def effect_kind(self) -> str | None:
        """The kind of ``group_effect`` (single, loo, shapley), None without one."""
        return self.var_attrs("group_effect").get("kind")

    @property
    def metric(self) -> str:
        """What scored the configurations (:data:`METRICS`): success, kl or both (success in results written
        before KL was measured)."""
        return str(self.attrs.get("metric", "success"))

    @property
    def step(self) -> int | None:
        """N of the checkpoint-N this sweep grafted from, where ``graft --all-checkpoints`` wrote it (else None)."""
        step = self.attrs.get("step")
        return None if step is None else int(step)

    @property
    def trainer_run(self) -> str | None:
        """The trainer's output_dir whose checkpoint this sweep grafted from, where ``graft --all-checkpoints``
        wrote it."""
        run = self.attrs.get("trainer_run")
        return None if run is None else str(run)

    @property
    def has_success(self) -> bool:
        return "success" in self.result.data

    @property
    def has_kl(self) -> bool:
        return "kl_reproduced" in self.result.data

    def outcomes(self, label: str) -> np.ndarray:
        """Success ``[task, seed, episode]`` (int8) of configuration ``label``."""
        if not self.has_success:
            raise GraftkitError(f"{self.path or 'this sweep'} was scored by KL only (--metric kl): it holds no success "
                                "outcomes", "run the sweep with --metric success or --metric both")
        return np.asarray(self.result["success"][self.configs.index(label)])

    def all_outcomes(self) -> dict[str, np.ndarray]:
        """Success of every configuration by label (empty for a sweep scored by KL only)."""
        return {label: self.outcomes(label) for label in self.configs} if self.has_success else {}

    def success(self, label: str) -> float:
        """Success rate of configuration ``label`` over every task, seed and episode."""
        return float(self.outcomes(label).mean())

    def parsed(self, label: str) -> float:
        """The share of configuration ``label``'s turns whose output parsed (NaN where the result did not
        record it: a sweep scored by KL alone, a configuration resumed from an older result)."""
        inv, turns = self.array("invalid"), self.array("turns")
        if inv is None or turns is None:
            return float("nan")
        i = self.configs.index(label)
        if int(turns[i].min()) < 0 or not int(turns[i].sum()):
            return float("nan")
        return 1.0 - float(inv[i].sum()) / float(turns[i].sum())

    def diff(self, label: str, ref: str = "base") -> np.ndarray | None:
        """(estimate, low, high) of success(label) − success(ref), ref base or rl; None if no such config."""
        configs = self.configs
        if label not in configs or f"diff_vs_{ref}" not in self.result.data:
            return None
        return np.asarray(self.result[f"diff_vs_{ref}"][configs.index(label)])

    def verdict(self, label: str, ref: str = "base") -> str:
        if f"verdict_vs_{ref}" not in self.result.data:
            return ""
        return str(self.result[f"verdict_vs_{ref}"][self.configs.index(label)])

    @property
    def movement_share(self) -> dict[str, float] | None:
        """Each group's share of the run's squared weight movement, None when not stored."""
        v = self.array("movement_share")
        return None if v is None else {g: float(x) for g, x in zip(self.axis("movement_share"), v)}

    # ----------------------------------------------------------------------- KL (--metric kl or both)

    #: The KL attribution arrays, each ``[side, group, bound]`` (``kl_interaction``: ``[side, group, group2, bound]``).
    KL_ATTRIBUTION = ("kl_group_effect", "kl_main_effect", "kl_shapley")

    @property
    def sides(self) -> list[str]:
        """Whose rollouts the KL arrays are over: rl (RL's own), sft (SFT's own); empty without KL."""
        return self.labels("side") if "side" in self.result.coords else []

    def _kl(self, name: str) -> np.ndarray:
        if not self.has_kl:
            raise GraftkitError(f"{self.path or 'this sweep'} holds no KL arrays",
                                "run the sweep with --metric kl or --metric both")
        return np.asarray(self.result[name])

    def reproduced(self, label: str, side: str) -> np.ndarray:
        """(estimate, low, high) of the fraction of the behavioural change configuration ``label`` reproduces on
        ``side``'s rollouts (:data:`graftkit.graft.kl.REPRODUCED`: 0 for ∅, 1 for the full graft)."""
        return self._kl("kl_reproduced")[self.configs.index(label), self.sides.index(side)]

    def kl_parsed(self, side: str) -> float:
        """The share of ``side``'s KL rollout turns whose output parsed (NaN where the result did not record it)."""
        if "kl_rollout_turns" not in self.result.data:
            return float("nan")
        i = self.sides.index(side)
        turns = int(np.asarray(self.result["kl_rollout_turns"][i]).sum())
        return 1.0 - int(np.asarray(self.result["kl_rollout_invalid"][i]).sum()) / turns if turns else float("nan")

    def kl_per_token(self, label: str, side: str) -> float:
        """KL(π_side‖π_label) per action token of ``side``'s rollouts, pooled (nats)."""
        return float(self._kl("kl_per_token")[self.configs.index(label), self.sides.index(side)])

    def kl_episode(self, label: str, side: str) -> np.ndarray:
        """Σ over each episode's action tokens of KL(π_side‖π_label) ``[task, seed, episode]`` (nats)."""
        return self._kl("kl_episode")[self.configs.index(label), self.sides.index(side)]

    def kl_tokens(self, side: str) -> np.ndarray:
        """Action tokens per episode of ``side``'s rollouts ``[task, seed, episode]``."""
        return self._kl("kl_tokens")[self.sides.index(side)]

    def kl_attribution(self, name: str, side: str) -> np.ndarray | None:
        """A KL attribution array (:attr:`KL_ATTRIBUTION`, or ``kl_interaction``) on ``side``'s rollouts:
        ``[group, bound]`` (``[group, group2, bound]``); None when the sweep did not store it."""
        v = self.array(name)
        return None if v is None else v[self.sides.index(side)]

    def kl_total(self, side: str) -> np.ndarray | None:
        """(estimate, low, high) of v(N) − v(∅) of the factorial's KL Shapley values on ``side``'s rollouts."""
        total = self.var_attrs("kl_shapley").get("total_v_all_minus_v_none")
        return None if not total else np.asarray(total[side], dtype=np.float64)


@dataclass(frozen=True)
class DissociationResult(View):
    """A ``graft-dissociation`` result (:func:`dissociation_result`): per run A, B and group the effect
    ``effect[run, group, bound]``, the paired difference ``difference[group, bound]`` and ``verdict[group]``."""

    KINDS = (GRAFT_DISSOCIATION,)
    PRODUCER = "graftkit graft --vs"

    @property
    def groups(self) -> list[str]:
        return [str(g) for g in self.result.coords["group"]]

    @property
    def runs(self) -> list[str]:
        return [str(r) for r in self.result.coords["run"]]

    @property
    def bound_names(self) -> np.ndarray:
        return self.result.coords["bound"]

    @property
    def effect(self) -> np.ndarray:
        return np.asarray(self.result["effect"])

    @property
    def difference(self) -> np.ndarray | None:
        return np.asarray(self.result["difference"]) if "difference" in self.result.data else None

    @property
    def verdicts(self) -> list[str] | None:
        return [str(v) for v in self.result["verdict"]] if "verdict" in self.result.data else None

    @property
    def effect_kind(self) -> str | None:
        return self.attrs.get("effect")

    @property
    def double_dissociation(self) -> bool:
        return bool(self.attrs.get("double_dissociation"))

    def run_name(self, run: str) -> str:
        """A run's name from attrs["runs"][run] (a label, a path, or a dict holding either)."""
        runs = self.attrs.get("runs")
        v = runs.get(run) if isinstance(runs, dict) else None
        if isinstance(v, dict):
            v = v.get("label") or v.get("path")
        return str(v) if v else ""


def dissociation_result(d: A.Dissociation, runs: Mapping[str, Mapping], attrs: Mapping | None = None) -> Result:
    """The labelled ``graft-dissociation`` result of :func:`graftkit.graft.attribution.dissociation`."""
    coords = {"group": np.array(d.groups, dtype=object), "run": np.array(["A", "B"], dtype=object),
              "bound": np.array(A.BOUNDS, dtype=object)}
    data = {"effect": (("run", "group", "bound"), d.effect), "difference": (("group", "bound"), d.difference),
            "verdict": (("group",), np.array(d.verdict, dtype=object))}
    return Result(GRAFT_DISSOCIATION, coords, data, {
        "runs": dict(runs), "effect": d.kind, "effect_formula": A.EFFECTS[d.kind], "level": d.level,
        "rule": A.DISSOCIATION_RULE, "double_dissociation": d.double_dissociation,
        "interval": A.INTERVAL_METHOD, **(attrs or {}),
    }, {"effect": {"formula": A.EFFECTS[d.kind]}, "difference": {"what": "effect_A − effect_B, paired"}})


__all__ = [
    "GROUPS", "GROUP_EFFECT", "BASE_LABEL", "DEFAULT_ALPHAS", "DEFAULT_FRACS", "MAX_FACTORIAL", "RL_LABEL", "SWEEPS", "GraftExperiment", "completed_outcomes",
    "dissociation_result", "expand_sweep", "label_for", "layered_groups", "one_experiment", "plan_sweep",
    "present_groups", "references", "run_graft_sweep", "subset_outcomes", "sweep_result", "SweepResult",
    "DissociationResult", "resume_outcomes", "EpisodeGrid", "SweepUnit", "SweepWorker", "checked_done",
    "execute_sweep", "plan_units", "play_unit", "kl_unit", "METRICS", "Played", "stored_played", "grafted_delta_erank",
]
