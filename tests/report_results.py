"""KL results for the report's tests, built by their producers' own functions from planted numbers (no model runs).

:func:`kl_run` is a ``graftkit kl`` result (:func:`graftkit.evaluation.kl.kl_result` over fixed episodes and pair
scores with known values); :func:`kl_sweep` a graft sweep scored by KL (:func:`graftkit.graft.experiments.sweep_result`
over a :class:`~graftkit.graft.kl.SweepKL` whose configurations reproduce known fractions of the behavioural change:
attn carries about 0.6 of it, mlp 0.3, so the swept groups together about 0.9 — not the whole RL model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from graftkit.results.store import Result

KL_TASKS = ("click-button", "arithmetic")
#: The share of the behavioural change each swept group carries in :func:`kl_sweep`.
CARRIED = {"attn": 0.6, "mlp": 0.3}


def kl_run(label: str = "rl", base: str = "sft", scale: float = 1.0, seeds: int = 3, tag: str = "",
           seed: int = 0, unparsed: Mapping[str, Mapping[str, int]] | None = None,
           attrs: Mapping | None = None) -> Result:
    """A ``kl`` result of RL policy ``label`` against ``base``: 2 turns of 3 action tokens per episode, per-token KL
    ``scale`` × uniform(0, 1) on RL's rollouts and half that on SFT's; ``tag`` appended to every token and action
    string (markup planted in text that comes from results); ``unparsed[side][task]``: how many of that side's
    turns on the task (the first ones) did not parse; ``attrs`` added to the result's (e.g. a user's file's
    ``file_items`` and ``whole_files``)."""
    from graftkit.agent.kl import FixedEpisode, FixedEpisodes, FixedTurn, PairScores
    from graftkit.evaluation.kl import KLConfig, kl_result

    cfg = KLConfig(model=Path(f"/runs/{label}"), base=Path(f"/runs/{base}"), tasks=",".join(KL_TASKS), seeds=seeds,
                   episodes=1, top=3, n_boot=200)
    rng = np.random.default_rng(seed)

    def fixed(side: str) -> FixedEpisodes:
        played = []
        for t in KL_TASKS:
            bad = ((unparsed or {}).get(side) or {}).get(t, 0)
            for s in range(seeds):
                turns = tuple(FixedTurn((1, 2, 3), tuple(int(x) for x in rng.integers(5, 12, 3)), f"act{k}{tag}",
                                        valid=2 * s + k >= bad) for k in range(2))
                played.append(FixedEpisode(t, s, 0, 1000 * s, f"{t}-{s:04d}", bool(rng.random() < 0.5), turns))
        return FixedEpisodes(side, KL_TASKS, tuple(range(seeds)), 1, tuple(played))

    fx = {s: fixed(s) for s in ("rl", "sft")}
    scores = {s: PairScores((scale * (1.0 if s == "rl" else 0.5) * rng.random(fx[s].n_tokens)).astype(np.float32),
                            -rng.random(fx[s].n_tokens).astype(np.float32), -rng.random(fx[s].n_tokens).astype(np.float32))
              for s in fx}
    token_text = {s: [f"tok{i}{tag}" for i in fx[s].token_ids()] for s in fx}
    action_text = {s: [t.action for _, t in fx[s].turns()] for s in fx}
    return kl_result(fx, scores, token_text, action_text, cfg, {
        "model": {"path": f"/runs/{label}"}, "base": {"path": f"/runs/{base}"}, "labels": {"rl": label, "sft": base},
        **(attrs or {})})


def with_steps(results: list[Result], steps: list[int], dims: tuple[str, ...] = ("step", "side", "scope", "per", "bound")
               ) -> Result:
    """A trajectory: the ``kl_mean`` of ``results`` (one per checkpoint step) stacked over a ``step`` dimension placed
    as ``dims`` says, beside the first result's other arrays."""
    first = results[0]
    stacked = np.stack([np.asarray(r["kl_mean"]) for r in results])  # [step, side, scope, per, bound]
    order = ("step", "side", "scope", "per", "bound")
    data = {**first.data, "kl_mean": (dims, np.transpose(stacked, [order.index(d) for d in dims]))}
    return Result("kl", {**first.coords, "step": np.array(steps)}, data, first.attrs, first.var_attrs)


def kl_sweep(kind: str = "factorial", metric: str = "both", rl_label: str = "rl", groups: tuple[str, ...] = ("attn", "mlp"),
             seeds: int = 4, episodes: int = 2, seed: int = 0, unparsed: Mapping[str, float] | None = None,
             kl_unparsed: Mapping[str, float] | None = None, attrs: Mapping | None = None) -> Result:
    """A graft sweep of ``kind`` scored by ``metric`` (kl or both) whose configuration C reproduces about
    Σ_{g ∈ C} :data:`CARRIED`[g] of the behavioural change (the full graft all of it), with per-episode noise.
    With ``unparsed`` ({configuration: share}), every configuration records its parse counts: that share of its
    turns (4 per episode; the rest 0) did not parse; ``kl_unparsed`` ({side: share}) the same for the KL rollouts;
    ``attrs`` added to the result's (e.g. a user's file's ``file_items`` and ``whole``)."""
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL, Played, expand_sweep, sweep_result
    from graftkit.graft.kl import SweepKL

    rng = np.random.default_rng(seed)
    exps = expand_sweep(kind, groups, ("embed", "attn", "mlp", "norm"))
    shape = (len(KL_TASKS), seeds, episodes)
    ref = {"rl": 0.5 + rng.random(shape), "sft": 0.5 + rng.random(shape)}  # KL(π_RL‖π_SFT), KL(π_SFT‖π_RL) per episode
    kl = np.zeros((len(exps), 2, *shape))
    for i, e in enumerate(exps):
        carried = 1.0 if e.role == "rl" else sum(CARRIED.get(g, 0.0) for g in e.groups)
        noise = 1.0 if e.role in ("rl", "base") else 1.0 + 0.1 * rng.standard_normal(shape)
        kl[i, 0] = ref["rl"] * (1.0 - carried) * noise  # what is left of RL's distance on RL's rollouts
        kl[i, 1] = ref["sft"] * carried * noise  # how far C has moved from SFT on SFT's rollouts
    tokens = rng.integers(3, 9, (2, *shape))
    items = np.array([[[f"{t}-{s}-{e}" for e in range(episodes)] for s in range(seeds)] for t in KL_TASKS], dtype=object)
    rollouts = {} if kl_unparsed is None else {
        "invalid": np.stack([_first_turns(kl_unparsed.get(s, 0.0), shape) for s in ("rl", "sft")]),
        "turns": np.full((2, *shape), 4, np.int16)}
    sk = SweepKL(tuple(e.label for e in exps), BASE_LABEL, RL_LABEL, KL_TASKS, tuple(range(seeds)), episodes, kl,
                 tokens, items, (rng.random((2, *shape)) < 0.5).astype(np.int8), {"rollouts": 0.1, "scoring": 0.1}, 99,
                 **rollouts)
    success = ({} if metric == "kl" else
               {e.label: (rng.random(shape) < 0.3 + 0.3 * ("attn" in e.groups)).astype(np.int8) for e in exps})
    played = None if unparsed is None else {
        lab: Played(x, _first_turns(unparsed.get(lab, 0.0), shape), np.full(shape, 4, np.int16))
        for lab, x in success.items()}
    return sweep_result(kind, exps, success, KL_TASKS, range(seeds), episodes, groups, metric=metric, kl=sk,
                        attrs={"rl_label": rl_label, "base": {"path": "/runs/sft"}, "rl": {"path": f"/runs/{rl_label}"},
                               **(attrs or {})}, n_boot=200, played=played)


def _first_turns(share: float, shape: tuple[int, ...], turns: int = 4) -> np.ndarray:
    """Turns per episode that did not parse when ``share`` of all ``turns``-turn episodes' turns did not: the first
    ones, in episode order (exact where ``share`` × the turns is whole)."""
    total = np.zeros(int(np.prod(shape)) * turns, np.int16)
    total[: round(share * total.size)] = 1
    return total.reshape(-1, turns).sum(axis=1).reshape(shape).astype(np.int16)
