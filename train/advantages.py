"""Advantages and token masks for GRPO and its variants: pure functions, tensors in, tensors out.

What each function computes (notation: a *group* is the G responses sampled for one task instance,
R_i the outcome reward of response i, Â the advantage):

- `group_advantages` — GRPO's group-relative advantage Â_i = (R_i − mean_g R) / (std_g R + eps)
  (DeepSeekMath, Shao et al. 2024), with TRL 1.16's three `scale_rewards` modes and its
  ``frac_reward_zero_std`` indicator.
- `focal_weight` — the difficulty-aware coefficient (1 − p̂)^γ of focal difficulty scaling
  (seed abstract "…a difficulty-aware scaling coefficient, inspired by Focal loss, that down-weights
  updates on high-success sampled groups"), p̂ the group's sampled success rate.
- `verigate_advantages` — VeriGate (Verifier-Gated Step-Level GRPO, seed abstract): outcome
  advantages when the verifier separates the group, else process-reward step scores → future-cumulated
  rewards → group-normalised token-level advantages.
- `scatter_token_advantages` — places per-trajectory token advantages into the [B, T] action-token layout.
- `veto_trigger`, `veto_mask` — Mu-GRPO's negative-advantage veto (seed abstract: "negative-advantage
  veto, which removes destabilizing post-trigger suffix updates in negative-advantage responses").

The standard deviation is everywhere the unbiased one (Bessel, n − 1: `torch.std`'s default), as TRL 1.16
computes it (`rewards.view(-1, G).std(dim=1)`); a group therefore needs G ≥ 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch

from ..core.errors import GraftkitError

Tensor = torch.Tensor
RewardScale = Literal["group", "batch", "none"]
SCALES: tuple[str, ...] = ("group", "batch", "none")


def _is_zero_std(std: Tensor) -> Tensor:
    # TRL's test: torch.isclose(std, 0) with default tolerances, i.e. std <= 1e-8.
    return torch.isclose(std, torch.zeros_like(std))


class GroupAdvantages(NamedTuple):
    advantages: Tensor  # Â [B, G] (or [G] for one group), same shape as the rewards
    zero_std: Tensor  # [B] (or 0-d) bool: the group's rewards are all equal, so its Â is exactly 0


def group_advantages(rewards: Tensor, scale: RewardScale = "group", eps: float = 1e-4) -> GroupAdvantages:
    """GRPO advantages Â_{g,i} = (R_{g,i} − mean_i R_{g,·}) / (σ + eps) for groups of sampled responses.

    ``rewards`` is [G] (one group) or [B, G] (B groups of G responses each). ``scale`` chooses σ, exactly as
    TRL 1.16's ``scale_rewards``:

    - ``"group"``: σ = std of the group's rewards (GRPO, Shao et al. 2024);
    - ``"batch"``: σ = std of all B·G rewards, the mean still per group (PPO-Lite; TRL's "batch");
    - ``"none"``: no division, Â = R − mean (Dr. GRPO, Liu et al. 2025).

    σ is the unbiased standard deviation (n − 1), as TRL's ``Tensor.std``; eps defaults to TRL's 1e-4.
    ``zero_std`` marks groups whose own rewards are all equal (TRL's ``frac_reward_zero_std`` is its mean).
    Deliberate differences from TRL: (1) the advantage of a zero-std group is set to exactly 0 (TRL leaves
    the rounding residue of R − mean, divided by 1e-4); (2) ``zero_std`` is always the per-group test, while
    TRL in "batch" mode tests the batch std.
    """
    if scale not in SCALES:
        raise GraftkitError(f"unknown reward scale {scale!r}", f"use one of {', '.join(SCALES)}")
    if not torch.is_tensor(rewards):
        rewards = torch.as_tensor(rewards, dtype=torch.get_default_dtype())
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if rewards.dim() not in (1, 2):
        raise GraftkitError(f"rewards must be [G] or [B, G], got shape {tuple(rewards.shape)}",
                            "stack each group's rewards as one row")
    R = rewards.unsqueeze(0) if rewards.dim() == 1 else rewards  # [B, G]
    if R.shape[1] < 2:
        raise GraftkitError(f"group size G = {R.shape[1]} is too small for group-relative advantages",
                            "sample at least 2 responses per task instance")
    if not torch.isfinite(R).all():
        raise GraftkitError("rewards contain NaN or inf", "check the reward function's outputs")
    mean = R.mean(dim=1, keepdim=True)  # [B, 1]
    std_group = R.std(dim=1, keepdim=True)  # [B, 1], unbiased
    zero_std = _is_zero_std(std_group)  # [B, 1]
    A = R - mean  # [B, G]
    if scale == "group":
        A = A / (std_group + eps)
    elif scale == "batch":
        A = A / (R.std() + eps)
    A = torch.where(zero_std, torch.zeros_like(A), A)
    zero_std = zero_std.squeeze(1)  # [B]
    if rewards.dim() == 1:
        return GroupAdvantages(A.squeeze(0), zero_std.squeeze(0))
    return GroupAdvantages(A, zero_std)


def focal_weight(p_hat: Tensor | float, gamma: float) -> Tensor:
    """Focal difficulty coefficient w = (1 − p̂)^γ per group; p̂ = the group's sampled success rate.

    Focal difficulty scaling (seed abstract): at small group sizes GRPO concentrates probability on the
    common sampled solutions of easy groups and can miss rare-correct trajectories, so updates on
    high-success groups are down-weighted, Focal-loss style (Lin et al. 2017). γ = 0 gives w = 1
    (plain GRPO); γ > 0 with p̂ = 1 gives 0, but such a group's advantages are already 0.
    Any shape in, same shape out; give the loss one weight per row with ``w.repeat_interleave(G)``.
    """
    p = torch.as_tensor(p_hat, dtype=torch.get_default_dtype()) if not torch.is_tensor(p_hat) else p_hat
    if not p.is_floating_point():
        p = p.to(torch.get_default_dtype())
    if gamma < 0:
        raise GraftkitError(f"focal gamma must be ≥ 0, got {gamma}", "use 0 to switch focal scaling off")
    if ((p < 0) | (p > 1) | ~torch.isfinite(p)).any():
        raise GraftkitError("focal p̂ must be a success rate in [0, 1]",
                            "pass the fraction of the group's sampled episodes that succeeded")
    if gamma == 0:
        return torch.ones_like(p)
    return (1.0 - p) ** gamma


def _reward_to_go(r: Tensor, gamma: float) -> Tensor:
    # G_k = Σ_{k'≥k} γ^{k'−k} r_{k'}  [K]
    out = torch.empty_like(r)
    acc = torch.zeros((), dtype=r.dtype)
    for k in range(r.numel() - 1, -1, -1):
        acc = r[k] + gamma * acc
        out[k] = acc
    return out


class VeriGateAdvantages(NamedTuple):
    token_advantages: list[Tensor]  # per trajectory: Â per action token [n_tokens_i], turns concatenated
    path: str  # "outcome" | "process" | "none" (process fallback degenerate too: all returns equal)


VERIGATE_PATHS: tuple[str, ...] = ("outcome", "process", "none")


def verigate_advantages(
    outcome_rewards: Tensor | Sequence[float],
    step_scores: Sequence[Sequence[float] | Tensor],
    step_token_counts: Sequence[Sequence[int]],
    *,
    eps: float = 1e-4,
    gamma: float = 1.0,
    scale: Literal["group", "none"] = "group",
) -> VeriGateAdvantages:
    """VeriGate token-level advantages for one group of G trajectories (Verifier-Gated Step-Level GRPO).

    Inputs, per trajectory i of the group: ``outcome_rewards[i]`` the verifier reward R_i;
    ``step_scores[i]`` the process-reward score r_{i,k} of each step (turn) k; ``step_token_counts[i]`` the
    number of action tokens the policy emitted in each step (its tokens, in order, make up the trajectory's
    action tokens). Returns one tensor per trajectory with an advantage per action token, and the path taken.

    The gate (seed abstract: "keeps the verifier in charge whenever verifier rewards induce a meaningful
    preference among sampled trajectories, and uses process supervision only when verifier rewards are
    degenerate"):

    - **outcome** — the group's rewards differ: Â_i = `group_advantages` (same σ and eps as GRPO) on every
      action token of trajectory i.
    - **process** — all R_i equal (GRPO's zero-gradient case): future-cumulated rewards
      G_{i,k} = Σ_{k' ≥ k} γ^{k'−k} r_{i,k'} (γ = 1 by default: plain reward-to-go), normalised over all steps
      of all trajectories of the group, Â_{i,k} = (G_{i,k} − mean) / (std + eps) (unbiased std;
      ``scale="none"`` keeps only the centring), and Â_{i,k} broadcast onto step k's action tokens.
    - **none** — the process path is degenerate too (all G_{i,k} equal, or a single step in the group):
      every advantage is exactly 0, never NaN.
    """
    if not torch.is_tensor(outcome_rewards):
        outcome_rewards = torch.as_tensor(list(outcome_rewards), dtype=torch.get_default_dtype())
    R = outcome_rewards.to(torch.get_default_dtype()) if not outcome_rewards.is_floating_point() \
        else outcome_rewards
    if R.dim() != 1:
        raise GraftkitError(f"VeriGate takes one group's rewards [G], got shape {tuple(R.shape)}",
                            "call it once per group")
    G = R.numel()
    if len(step_scores) != G or len(step_token_counts) != G:
        raise GraftkitError(
            f"VeriGate got {G} rewards, {len(step_scores)} step-score lists and {len(step_token_counts)} "
            "token-count lists", "give one of each per trajectory of the group")
    if scale not in ("group", "none"):
        raise GraftkitError(f"VeriGate scale must be 'group' or 'none', got {scale!r}",
                            "batch scaling has no meaning inside one group")
    if not 0.0 <= gamma <= 1.0:
        raise GraftkitError(f"VeriGate discount gamma must be in [0, 1], got {gamma}", "use 1 for reward-to-go")
    counts = []
    for i, c in enumerate(step_token_counts):
        c = [int(n) for n in c]
        if any(n < 0 for n in c):
            raise GraftkitError(f"trajectory {i} has a negative step token count {c}", "count action tokens")
        if len(c) != len(step_scores[i]):
            raise GraftkitError(f"trajectory {i} has {len(step_scores[i])} step scores but {len(c)} steps "
                                "of action tokens", "give one process score per step")
        counts.append(c)

    dtype = R.dtype
    A_outcome, zero_std = group_advantages(R, scale=scale, eps=eps)  # [G], 0-d
    if not bool(zero_std):
        toks = [torch.full((sum(c),), float(A_outcome[i]), dtype=dtype) for i, c in enumerate(counts)]
        return VeriGateAdvantages(toks, "outcome")

    scores = [torch.as_tensor(s, dtype=dtype).reshape(-1) for s in step_scores]  # [K_i] each
    if any(not torch.isfinite(s).all() for s in scores):
        raise GraftkitError("VeriGate step scores contain NaN or inf", "check the process-reward scorer")
    returns = [_reward_to_go(s, gamma) for s in scores]  # G_{i,k} [K_i] each
    pooled = torch.cat(returns) if returns else torch.zeros(0, dtype=dtype)  # all steps of the group
    path = "process"
    if pooled.numel() < 2 or bool(_is_zero_std(pooled.std())):
        A_steps = [torch.zeros_like(g) for g in returns]
        path = "none"
    else:
        mean, std = pooled.mean(), pooled.std()
        A_steps = [(g - mean) / (std + eps) if scale == "group" else g - mean for g in returns]
    toks = [torch.repeat_interleave(a, torch.as_tensor(c, dtype=torch.long)) if c else torch.zeros(0, dtype=dtype)
            for a, c in zip(A_steps, counts)]
    return VeriGateAdvantages(toks, path)


def scatter_token_advantages(token_advantages: Sequence[Tensor], mask: Tensor) -> Tensor:
    """Place per-row token advantages into the action-token positions of a [B, T] batch.

    Row i's ``token_advantages[i]`` ([n_i], in order) fills the positions where ``mask[i] == 1``; every other
    position gets 0. n_i must equal the row's number of action tokens.
    """
    if mask.dim() != 2 or len(token_advantages) != mask.shape[0]:
        raise GraftkitError(f"{len(token_advantages)} advantage rows for a mask of shape {tuple(mask.shape)}",
                            "give one token-advantage tensor per row of the batch")
    m = mask.bool()
    dtype = token_advantages[0].dtype if len(token_advantages) else torch.get_default_dtype()
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    for i, a in enumerate(token_advantages):
        n = int(m[i].sum())
        if a.numel() != n:
            raise GraftkitError(f"row {i} has {n} action tokens but {a.numel()} token advantages",
                                "count the action tokens of every turn of the trajectory")
        out[i, m[i]] = a.to(device=mask.device, dtype=dtype)
    return out


def veto_trigger(logp_new: Tensor, logp_old: Tensor, mask: Tensor, eps_v: float) -> Tensor:
    """Index of each row's veto trigger, −1 where none: the first action token whose importance ratio
    ρ_t = exp(logp_new − logp_old) leaves [1 − ε_v, 1 + ε_v] (the bounds themselves are inside).

    ``logp_new``, ``logp_old``, ``mask`` are [T] (→ 0-d) or [B, T] (→ [B]); padding never triggers.
    """
    if eps_v <= 0:
        raise GraftkitError(f"veto threshold eps_v must be > 0, got {eps_v}", "e.g. 0.2 (ratio outside [0.8, 1.2])")
    if not (logp_new.shape == logp_old.shape == mask.shape) or logp_new.dim() not in (1, 2):
        raise GraftkitError(f"veto inputs must share a [T] or [B, T] shape, got {tuple(logp_new.shape)}, "
                            f"{tuple(logp_old.shape)}, {tuple(mask.shape)}", "pass per-token log-probs and mask")
    with torch.no_grad():
        m = mask.bool()
        log_ratio = torch.where(m, logp_new.detach() - logp_old.detach(), torch.zeros_like(logp_new))
        rho = torch.exp(log_ratio)
        out = m & ((rho < 1.0 - eps_v) | (rho > 1.0 + eps_v))  # [.., T]
        first = out.int().argmax(dim=-1)  # first True (0 when none)
        return torch.where(out.any(dim=-1), first, torch.full_like(first, -1))


def veto_mask(logp_new: Tensor, logp_old: Tensor, advantages: Tensor | float, mask: Tensor, eps_v: float,
              *, keep_trigger: bool = True) -> Tensor:
    """Mu-GRPO's negative-advantage veto: the keep-mask v (bool, shape of ``mask``) of tokens that stay in
    the update.

    In a response with Â < 0, every token after the trigger (`veto_trigger`: the first action token whose
    ratio ρ_t leaves [1 − ε_v, 1 + ε_v]) is dropped, v = 0. Rows with Â ≥ 0 and rows without a trigger
    are untouched (v = mask).

    The trigger token itself is kept by default (``keep_trigger=True``): the abstract vetoes the
    "post-trigger suffix", i.e. the tokens after it, whose contexts the current policy has already left at
    the trigger and whose negative updates are the destabilising ones; the trigger's own update is still
    bounded by the loss's ratio clip. ``keep_trigger=False`` also drops the trigger.

    ``logp_*`` and ``mask`` are [T] with a scalar advantage, or [B, T] with per-row advantages [B]
    (the trajectory's outcome advantage: the veto is a per-response decision). No gradient flows.
    """
    A = torch.as_tensor(advantages, device=mask.device)
    batched = logp_new.dim() == 2
    if (batched and A.shape != (logp_new.shape[0],)) or (not batched and A.dim() != 0):
        raise GraftkitError(f"veto needs one advantage per response, got shape {tuple(A.shape)} for log-probs "
                            f"{tuple(logp_new.shape)}", "pass the response's (per-row) outcome advantage")
    trig = veto_trigger(logp_new, logp_old, mask, eps_v)  # [B] or 0-d
    m = mask.bool()
    pos = torch.arange(m.shape[-1], device=m.device)  # [T]
    first_dropped = trig + (1 if keep_trigger else 0)
    drop = (trig.unsqueeze(-1) >= 0) & (pos >= first_dropped.unsqueeze(-1)) & (A.unsqueeze(-1) < 0)  # [.., T]
    return m & ~drop
