"""Behavioural attribution of a graft sweep: the fraction of RL's behavioural change each graft reproduces.

Success counts what a configuration achieves; KL measures how close its behaviour is to RL's, token by
token, with forward passes only. Two fixed sets of teacher-forced episodes are played once per sweep
(:func:`graftkit.agent.kl.play_fixed`): RL's own rollouts and SFT's own rollouts (sampled at temperature 1, the
same tasks × seeds × episodes as the success path). Every configuration C — written into the loaded model by the
same in-place graft the success path uses (:class:`~graftkit.graft.inplace.InPlaceGraft`, restored bit for bit)
— scores both sets, and with K_e the sum over episode e's action tokens of the per-token KL
(:data:`graftkit.agent.kl.CONVENTIONS`)::

    reproduced_RL(C)  = 1 − Σ_e K_e(π_RL‖π_C) / Σ_e K_e(π_RL‖π_SFT)     on RL's rollouts
    reproduced_SFT(C) =     Σ_e K_e(π_SFT‖π_C) / Σ_e K_e(π_SFT‖π_RL)    on SFT's rollouts

(pooled over tokens: a ratio of sums, so per token or per episode gives the same fraction). Both are 0 for
the empty graft (C = SFT) and 1 for the full graft (C = RL), exactly: graft(∅) is SFT and graft(all) is RL
bit for bit, so a side's own reference scores KL = 0 by definition (it is not recomputed) and the other is the
denominator itself (x/x = 1). reproduced_RL asks how much of the way from SFT towards RL's behaviour on
RL's own trajectories C goes; reproduced_SFT how far C moves away from SFT's behaviour on SFT's trajectories,
in units of RL's move.

Attribution: main effects, interactions, Shapley values and single / leave-one-out effects are the linear
contrasts of :mod:`graftkit.graft.attribution` applied to v(C) = reproduced_side(C), with the same two-stage
bootstrap over evaluation seeds then episodes (tasks folded into episodes, the seed the cluster, as the
success path). A ratio is not linear in the episodes, so the bootstrap runs on its linearisation (the ratio
estimator's influence values, Cochran 1977 ch. 6), one value per episode whose mean is v(C)::

    u_e(C) = R_C + (K_e(C) − R_C · K_e(ref)) / mean_e K_e(ref),   R_C = Σ_e K_e(C) / Σ_e K_e(ref)
    z_e(C) = 1 − u_e(C) on RL's rollouts (ref = SFT),   z_e(C) = u_e(C) on SFT's rollouts (ref = RL)

z is exactly 0 at ∅ and 1 at the full graft in every episode, so the contrasts keep Σ_g φ_g = v(N) − v(∅).
When RL and SFT do not differ on the episodes (Σ K(ref) = 0) the fractions are undefined (NaN).

Memory: the references' full distributions ([tokens, V] float32 on the CPU) are held one chunk of turns at a time
(:func:`graftkit.agent.kl.token_chunks`, ``budget_bytes``), and every configuration is scored on a chunk before
the next; configurations switch once per chunk.

References: per-token KL between a base model and its fine-tune on fixed text (science-of-finetuning's
diffing-toolkit), and forward KL on the new task as the predictor of forgetting where weight-change norms were
not (Shenfeld et al. 2025, "RL's Razor"); neither attributes the divergence to parameter groups by grafting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from . import attribution as A

SIDES = ("rl", "sft")
#: Bytes of reference distributions held at once (both sides together).
REFERENCE_BYTES = 2 << 30

REPRODUCED = {
    "rl": "reproduced_RL(C) = 1 − Σ_e K_e(π_RL‖π_C) / Σ_e K_e(π_RL‖π_SFT) on RL's rollouts",
    "sft": "reproduced_SFT(C) = Σ_e K_e(π_SFT‖π_C) / Σ_e K_e(π_SFT‖π_RL) on SFT's rollouts",
}
ENDPOINTS = ("0 for the empty graft (C = SFT) and 1 for the full graft (C = RL), exactly: a side's own reference "
             "scores KL 0 by definition (graft(∅) = SFT and graft(all) = RL bit for bit)")
LINEARISED = ("intervals from the two-stage bootstrap of graftkit.graft.attribution on the ratio's linearised "
              "per-episode values z_e (Cochran 1977 ch. 6): z_e = 1 − u_e on RL's rollouts, u_e on SFT's, "
              "u_e = R + (K_e(C) − R·K_e(ref))/mean K(ref), R = ΣK(C)/ΣK(ref); z is 0 at ∅ and 1 at the full graft")


@dataclass(frozen=True)
class SweepKL:
    """Every configuration's KL on the fixed rollouts of both sides: ``kl_episode[config, side, task, seed,
    episode]`` = Σ over the episode's action tokens of KL(π_side‖π_config) in nats (float64), the action tokens
    per episode ``tokens[side, task, seed, episode]``, the rollouts' items and outcomes."""

    labels: tuple[str, ...]
    base: str
    """The label of the empty graft (SFT)."""
    rl: str
    """The label of the full graft (RL)."""
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    episodes: int
    kl_episode: np.ndarray
    tokens: np.ndarray
    items: np.ndarray
    """[task, seed, episode]: both sides play the same items."""
    success: np.ndarray
    """[side, task, seed, episode]: each rollout's outcome (sampled at temperature 1)."""
    seconds: dict
    """Wall time of the rollouts and of the scoring."""
    scored_tokens: int
    """Action tokens scored by forward passes (references included)."""
    invalid: np.ndarray | None = None
    """[side, task, seed, episode]: turns of each rollout whose output did not parse."""
    turns: np.ndarray | None = None
    """[side, task, seed, episode]: turns of each rollout."""

    def episode(self, label: str, side: str) -> np.ndarray:
        """K_e(π_side‖π_label) ``[task, seed, episode]``."""
        return self.kl_episode[self.labels.index(label), SIDES.index(side)]

    def per_token(self) -> np.ndarray:
        """Σ K / Σ tokens per configuration and side ``[config, side]``, nats per action token."""
        n = self.tokens.reshape(len(SIDES), -1).sum(-1)
        return self.kl_episode.reshape(len(self.labels), len(SIDES), -1).sum(-1) / np.maximum(n, 1)[None, :]


def score_configurations(model, pad_id: int, apply: Callable[[str], None], labels: Sequence[str], base: str, rl: str,
                         rollouts: Mapping, *, batch_size: int = 16, budget_bytes: int = REFERENCE_BYTES,
                         on_tokens: Callable[[int], None] = lambda n: None) -> dict[str, dict[str, np.ndarray]]:
    """Per configuration label and side, KL(π_side‖π_label) at every action token of that side's rollouts
    (``rollouts[side]``: :class:`~graftkit.agent.kl.FixedEpisodes`) ``[N_side]`` float32. ``apply(label)`` makes
    ``model`` that configuration (an in-place graft). Each side's reference (RL for RL's rollouts, SFT = ``base``
    for SFT's) is scored once per chunk of turns and kept on the CPU; its own entry is 0 by definition."""
    import torch

    from ..agent.kl import log_softmax_batches, token_chunks, token_kl

    reference = {"rl": rl, "sft": base}
    turns = {s: [t for _, t in rollouts[s].turns()] for s in SIDES}
    first_token = {s: np.concatenate([[0], np.cumsum([len(t.action_ids) for t in turns[s]])]) for s in SIDES}
    out = {lab: {s: np.zeros(int(first_token[s][-1]), np.float32) for s in SIDES} for lab in labels}
    vocab = int(model.get_output_embeddings().weight.shape[0])
    chunks = {s: token_chunks(list(enumerate(turns[s])), vocab, budget_bytes // len(SIDES)) for s in SIDES}
    # the base first (it is applied last for the references), RL last (the next chunk starts with it)
    order = [base, *(lab for lab in labels if lab not in (base, rl)), rl]
    dev = next(model.parameters()).device
    for r in range(max(len(c) for c in chunks.values())):
        part = {s: chunks[s][r] if r < len(chunks[s]) else [] for s in SIDES}
        refs: dict[str, list] = {}
        for s in ("rl", "sft"):  # RL's reference, then SFT's: the model is then the base
            apply(reference[s])
            refs[s] = []
            for _, logp in log_softmax_batches(model, [turns[s][i] for i in part[s]], pad_id, batch_size=batch_size):
                refs[s].append(logp.cpu())
                on_tokens(logp.shape[0])
        for lab in order:
            apply(lab)
            for s in SIDES:
                if lab == reference[s] or not part[s]:
                    continue
                offset = int(first_token[s][part[s][0]])
                batches = log_softmax_batches(model, [turns[s][i] for i in part[s]], pad_id, batch_size=batch_size)
                for (start, logq), ref in zip(batches, refs[s]):
                    kl = token_kl(ref.to(dev), logq)
                    out[lab][s][offset + start : offset + start + kl.shape[0]] = kl.cpu().numpy()
                    on_tokens(kl.shape[0])
        del refs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def sweep_kl(labels: Sequence[str], base: str, rl: str, rollouts: Mapping, per_token: Mapping[str, Mapping[str, np.ndarray]],
             seconds: Mapping[str, float], scored_tokens: int) -> SweepKL:
    """The per-token scores of :func:`score_configurations` summed per episode (:class:`SweepKL`)."""
    fixed = [rollouts[s] for s in SIDES]
    if fixed[0].shape != fixed[1].shape or fixed[0].tasks != fixed[1].tasks:
        raise GraftkitError("RL's and SFT's rollouts cover different episodes", "play both on one grid of tasks × seeds")
    kl = np.stack([np.stack([f.per_episode(per_token[lab][s]) for s, f in zip(SIDES, fixed)]) for lab in labels])
    f0 = fixed[0]
    return SweepKL(tuple(labels), base, rl, f0.tasks, f0.seeds, f0.episodes, kl,
                   np.stack([f.tokens() for f in fixed]), f0.items(), np.stack([f.success() for f in fixed]),
                   dict(seconds), int(scored_tokens), np.stack([f.invalid() for f in fixed]),
                   np.stack([f.n_turns() for f in fixed]))


# ------------------------------------------------------------------------------------------ fractions


def _reference_of(side: str, kl: SweepKL) -> str:
    """The configuration a side's fraction divides by: SFT (∅) on RL's rollouts, RL on SFT's."""
    return kl.base if side == "rl" else kl.rl


def reproduced(kl: SweepKL) -> np.ndarray:
    """reproduced_side(C) ``[config, side]`` (:data:`REPRODUCED`; NaN where the reference KL is 0)."""
    out = np.full((len(kl.labels), len(SIDES)), np.nan)
    for j, s in enumerate(SIDES):
        den = float(kl.episode(_reference_of(s, kl), s).sum())
        if not den > 0:
            continue
        for i, lab in enumerate(kl.labels):
            ratio = float(kl.episode(lab, s).sum()) / den
            out[i, j] = 1.0 - ratio if s == "rl" else ratio
    return out


def linearised(kl: SweepKL, label: str, side: str) -> np.ndarray:
    """z_e(label) ``[task, seed, episode]``, the ratio's linearised per-episode values (module docstring): their
    mean is reproduced_side(label); NaN where the reference KL is 0."""
    ref = kl.episode(_reference_of(side, kl), side)
    den = float(ref.sum())
    if not den > 0:
        return np.full(ref.shape, np.nan)
    k = kl.episode(label, side)
    ratio = float(k.sum()) / den
    u = ratio + (k - ratio * ref) / (den / ref.size)
    return 1.0 - u if side == "rl" else u


def kl_arrays(kl: SweepKL, labels: Sequence[str], subsets: Mapping[frozenset, str] | None, groups: Sequence[str],
              *, factorial: bool, effect: str | None, level: float, n_boot: int, seed: int
              ) -> tuple[dict[str, tuple], dict[str, dict]]:
    """The KL arrays a sweep result stores for configurations ``labels`` (its config axis), and their formulas:
    per-episode KL and tokens, the items and rollout outcomes, KL per token and the reproduced fractions with
    intervals per configuration; with ``subsets`` (subset of groups → label; None while configurations are
    missing) the attribution — factorial: main effects, interactions and Shapley values; ``effect`` (single,
    loo, shapley): ``kl_group_effect``."""
    idx = [kl.labels.index(lab) for lab in labels]
    k = len(groups)
    z = {s: {lab: A.fold_tasks(linearised(kl, lab, s)) for lab in kl.labels} for s in SIDES}
    defined = {s: bool(np.isfinite(next(iter(z[s].values()))).all()) for s in SIDES}
    bounds = np.full((len(labels), len(SIDES), 3), np.nan)
    for j, s in enumerate(SIDES):
        if defined[s]:
            iv = A.contrast_intervals(z[s], {lab: {lab: 1.0} for lab in labels}, level, n_boot, seed)
            bounds[:, j] = [iv[lab] for lab in labels]
    point = reproduced(kl)[idx]
    bounds[..., 0] = point  # the ratio itself (equal to the mean of z up to rounding)
    data: dict[str, tuple] = {
        "kl_episode": (("config", "side", "task", "seed", "episode"), kl.kl_episode[idx]),
        "kl_tokens": (("side", "task", "seed", "episode"), kl.tokens.astype(np.int64)),
        "kl_item": (("task", "seed", "episode"), np.asarray(kl.items, dtype=object)),
        "kl_rollout_success": (("side", "task", "seed", "episode"), kl.success.astype(np.int8)),
        "kl_per_token": (("config", "side"), kl.per_token()[idx]),
        "kl_reproduced": (("config", "side", "bound"), bounds),
        **({"kl_rollout_invalid": (("side", "task", "seed", "episode"), kl.invalid.astype(np.int16)),
            "kl_rollout_turns": (("side", "task", "seed", "episode"), kl.turns.astype(np.int16))}
           if kl.invalid is not None else {}),
    }
    var_attrs: dict[str, dict] = {
        "kl_episode": {"what": "Σ over the episode's action tokens of KL(π_side‖π_config), nats; side = whose "
                               "rollouts (rl: RL's, sft: SFT's)", "unit": "nats"},
        "kl_tokens": {"what": "action tokens per episode of each side's rollouts (turn-end tokens included)"},
        "kl_item": {"what": "each episode's item id (both sides play the same items)"},
        "kl_rollout_success": {"what": "outcome of each side's rollout, sampled at temperature 1"},
        "kl_rollout_invalid": {"what": "turns of each side's rollout whose output did not parse"},
        "kl_rollout_turns": {"what": "turns of each side's rollout"},
        "kl_per_token": {"what": "Σ_e K_e / Σ_e tokens_e: KL(π_side‖π_config) per action token, pooled", "unit": "nats"},
        "kl_reproduced": {"formula": REPRODUCED, "endpoints": ENDPOINTS, "interval": LINEARISED, "level": level,
                          "unit": "fraction"},
    }
    if subsets is None:
        return data, var_attrs
    outcomes = {s: {sub: z[s][lab] for sub, lab in subsets.items()} for s in SIDES}
    nan_k = np.full((k, 3), np.nan)
    if factorial:
        main, inter, shap, total = [], [], [], []
        for s in SIDES:
            if defined[s]:
                fa = A.attribute_factorial(outcomes[s], groups, level, n_boot, seed)
                main.append(fa.main_effect), inter.append(fa.interaction), shap.append(fa.shapley)
                total.append(list(fa.total))
            else:
                main.append(nan_k), inter.append(np.full((k, k, 3), np.nan)), shap.append(nan_k)
                total.append([np.nan] * 3)
        data["kl_main_effect"] = (("side", "group", "bound"), np.stack(main))
        data["kl_interaction"] = (("side", "group", "group2", "bound"), np.stack(inter))
        data["kl_shapley"] = (("side", "group", "bound"), np.stack(shap))
        var_attrs["kl_main_effect"] = {"formula": A.MAIN_EFFECT, "v": REPRODUCED, "unit": "fraction"}
        var_attrs["kl_interaction"] = {"formula": A.INTERACTION, "v": REPRODUCED, "unit": "fraction"}
        var_attrs["kl_shapley"] = {"formula": A.SHAPLEY, "v": REPRODUCED, "unit": "fraction",
                                   "total_v_all_minus_v_none": dict(zip(SIDES, total))}
    if effect is not None:
        eff = [A.group_effects(outcomes[s], groups, effect, level, n_boot, seed) if defined[s] else nan_k
               for s in SIDES]
        data["kl_group_effect"] = (("side", "group", "bound"), np.stack(eff).reshape(len(SIDES), k, 3))
        var_attrs["kl_group_effect"] = {"kind": effect, "formula": A.EFFECTS[effect], "v": REPRODUCED,
                                        "unit": "fraction"}
    return data, var_attrs


def kl_conventions() -> dict:
    """What a sweep result records about its KL arrays (stored beside them)."""
    from ..agent.kl import CONVENTIONS

    return {**CONVENTIONS, "reproduced": REPRODUCED, "endpoints": ENDPOINTS, "interval": LINEARISED,
            "outcomes": "tasks folded into episodes: [seed, task·episode], seeds are the clusters (as success)"}


__all__ = ["ENDPOINTS", "LINEARISED", "REFERENCE_BYTES", "REPRODUCED", "SIDES", "SweepKL", "kl_arrays",
           "kl_conventions", "linearised", "reproduced", "score_configurations", "sweep_kl"]
