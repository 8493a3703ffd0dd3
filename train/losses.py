"""GRPO-family policy losses, one pure function per loss type, chosen by name from `LOSSES`.

Notation (row i = one sampled response, t = its token positions; B rows, T positions):

    logp      log π_θ(y_{i,t} | ·)       [B, T]   the only input that carries gradient
    old_logp  log π_old(y_{i,t} | ·)     [B, T]   the policy that sampled the rollouts (None: = sg[logp])
    ref_logp  log π_ref(y_{i,t} | ·)     [B, T]   the frozen SFT reference (None: no KL; needs β = 0)
    Â         advantages                 [B] or [B, T] (token-level, e.g. VeriGate's process path)
    m         mask                       [B, T]   1 on action tokens, 0 on prompt/observation/padding
    w         weight                     [B]      per-row weight: the focal coefficient (default 1)
    v         veto                       [B, T]   Mu-GRPO keep-mask from `advantages.veto_mask` (default m)

    ρ_{i,t}   = exp(logp − old_logp)                                  token importance ratio
    KL_{i,t}  = exp(ref − logp) − (ref − logp) − 1                    k3 estimator (Schulman 2020)
    ℓ_{i,t}   = w_i · v_{i,t} · ℓ^PG_{i,t} + β · KL_{i,t}             per-token loss
    ℓ^PG_{i,t} = −min(ρ Â, clip(ρ, 1 − ε_low, 1 + ε_high) Â)           PPO/GRPO clipped surrogate

Each variant changes ℓ^PG or the normaliser, exactly as TRL 1.16's `GRPOTrainer._compute_loss`:

    grpo      (1/B) Σ_i Σ_t m ℓ / max(Σ_t m, 1)        mean over sequences of per-sequence token means
    dr_grpo   Σ m ℓ / (B · L_max)                      Dr. GRPO (Liu et al. 2025), L_max = max_completion_length
    dapo      Σ m ℓ / N,  N = Σ m                      DAPO (Yu et al. 2025) token-level normaliser
    cispo     ℓ^PG = −sg[min(ρ, ε_max)] Â log π_θ,  ÷ N    CISPO (MiniMax-M1, 2025); ε_max = ``eps_high``
    gspo      ρ → s_i = exp(Σ_t m (logp − old_logp) / Σ_t m), grpo normaliser   GSPO (Zheng et al. 2025)
    gspo_token  s_{i,t} = sg[s_i] · π_θ / sg[π_θ], grpo normaliser              GSPO-token (same paper)

What is and is not TRL: TRL has no veto and no per-row weight. Both multiply the policy term only; the
KL term and every normaliser keep the full action mask m (TRL's precedent: its off-policy sequence mask
multiplies the per-token policy loss and leaves the normaliser alone). Not modelled: TRL's division by
gradient-accumulation steps (the trainer's job), ``delta`` two-sided clipping, ``use_bias_correction_kl``,
vLLM importance-sampling correction, entropy masks. ``token_normaliser`` reproduces TRL's dapo/cispo
normaliser when a generation batch is split into micro-batches (pass that batch's active-token count).

Every function returns ``(loss, metrics)``: ``loss`` a 0-d tensor differentiable in ``logp`` only, and
``metrics`` 0-d detached tensors named after what they are (see `_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..core.errors import GraftkitError

Tensor = torch.Tensor
LossOutput = tuple[Tensor, dict[str, Tensor]]


class _Batch(NamedTuple):
    logp: Tensor  # [B, T]  log π_θ, 0 off the mask (gradient flows only on m)
    d: Tensor  # [B, T]  logp − old_logp, 0 off the mask
    A: Tensor  # [B, 1] or [B, T]  Â, detached
    m: Tensor  # [B, T]  float action mask
    v: Tensor  # [B, T]  float veto keep-mask (= m without a veto)
    w: Tensor  # [B, 1]  per-row weight, detached
    kl: Tensor | None  # [B, T]  k3 KL, 0 off the mask; None without a reference
    vetoed: bool


def _prepare(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, ref_logp: Tensor | None,
             beta: float, weight: Tensor | None, veto: Tensor | None) -> _Batch:
    if logp.dim() != 2:
        raise GraftkitError(f"logp must be [B, T], got shape {tuple(logp.shape)}", "batch the responses as rows")
    if not logp.is_floating_point():
        raise GraftkitError(f"logp must be floating point, got {logp.dtype}", "pass log-probabilities")
    B, T = logp.shape
    for name, x in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask), ("veto", veto)):
        if x is not None and tuple(x.shape) != (B, T):
            raise GraftkitError(f"{name} has shape {tuple(x.shape)} but logp is {(B, T)}",
                                f"give {name} one entry per token of every row")
    if beta < 0:
        raise GraftkitError(f"KL weight beta must be ≥ 0, got {beta}", "use 0 to drop the KL term")
    if beta != 0 and ref_logp is None:
        raise GraftkitError(f"KL weight beta = {beta} but no reference log-probs were given",
                            "pass ref_logp from the frozen SFT reference, or set beta = 0")
    mb = mask.bool()
    m = mb.to(logp.dtype)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Zero every input off the mask first, so padding (even −inf log-probs) can neither leak into the
    # loss nor turn a gradient into NaN.
    lp = torch.where(mb, logp, zero)
    old = lp.detach() if old_logp is None else torch.where(mb, old_logp.detach().to(logp.dtype), zero)
    d = lp - old

    A = torch.as_tensor(advantages, dtype=logp.dtype, device=logp.device).detach()
    if A.shape == (B,):
        A = A.unsqueeze(1)
    elif A.shape != (B, T):
        raise GraftkitError(f"advantages have shape {tuple(A.shape)}; expected [B] = ({B},) or [B, T] = "
                            f"{(B, T)}", "give one advantage per row, or one per token")
    if not torch.isfinite(torch.where(mb, A, zero) if A.shape == (B, T) else A).all():
        raise GraftkitError("advantages contain NaN or inf", "check the reward normalisation (std + eps)")

    w = torch.ones(B, dtype=logp.dtype, device=logp.device) if weight is None else \
        torch.as_tensor(weight, dtype=logp.dtype, device=logp.device).detach()
    if w.shape != (B,):
        raise GraftkitError(f"weight has shape {tuple(w.shape)}; expected ({B},)", "give one weight per row")

    v = m if veto is None else (veto.bool() & mb).to(logp.dtype)
    kl = None
    if ref_logp is not None:
        ref = torch.where(mb, ref_logp.detach().to(logp.dtype), zero)
        kl = torch.exp(ref - lp) - (ref - lp) - 1.0  # [B, T], 0 off the mask
    return _Batch(lp, d, A, m, v, w.unsqueeze(1), kl, veto is not None)


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
        raise GraftkitError(f"clip range needs 0 ≤ eps_low < 1 and eps_high ≥ 0, got {eps_low}, {eps_high}",
                            "e.g. eps_low = 0.2, eps_high = 0.28 (DAPO)")


def _clipped_surrogate(ratio: Tensor, A: Tensor, eps_low: float, eps_high: float) -> Tensor:
    # ℓ^PG = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â)   [B, T] or [B, 1]
    return -torch.min(ratio * A, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * A)


def _per_token(x: _Batch, pg: Tensor, beta: float) -> Tensor:
    # ℓ_{i,t} = w_i v_{i,t} ℓ^PG_{i,t} + β KL_{i,t}   [B, T]
    out = x.w * x.v * pg
    if beta != 0.0:
        out = out + beta * x.kl
    return out


def _mean_of_sequence_means(per_token: Tensor, m: Tensor) -> Tensor:
    # (1/B) Σ_i Σ_t m ℓ / max(Σ_t m, 1)
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


def _token_sum_over(per_token: Tensor, m: Tensor, normaliser: Tensor | float) -> Tensor:
    return (per_token * m).sum() / normaliser


def _n_tokens(m: Tensor, token_normaliser: float | Tensor | None) -> Tensor | float:
    if token_normaliser is None:
        return m.sum().clamp(min=1.0)
    n = float(token_normaliser)
    if not n > 0:
        raise GraftkitError(f"token_normaliser must be > 0, got {n}",
                            "pass the number of action tokens in the generation batch")
    return n


def _mean_active(x: Tensor, m: Tensor) -> Tensor:
    """Mean over active tokens for a [B, T] quantity; over rows with ≥ 1 action token for a [B, 1] one
    (a sequence-level quantity; TRL averages over all rows, the same unless a row has no action token)."""
    if x.shape[1] == 1:
        rows = m.sum(-1) > 0
        return x[:, 0][rows].mean() if rows.any() else x.new_zeros(())
    return (x * m).sum() / m.sum().clamp(min=1.0)


def _metrics(x: _Batch, ratio: Tensor, low: Tensor, high: Tensor) -> dict[str, Tensor]:
    """The logged quantities, all detached 0-d tensors over the active (m = 1) tokens:

    ``ratio_mean``     mean importance ratio ρ (s_i per sequence for gspo);
    ``clip_frac_low``  fraction where the lower clip binds: ρ < 1 − ε_low and Â < 0 (TRL's clip_ratio/low);
    ``clip_frac_high`` fraction where the upper clip binds: ρ > 1 + ε_high and Â > 0 (TRL's clip_ratio/high;
                       for cispo ρ > ε_max and Â > 0, TRL's cispo_clip_ratio; cispo has no lower clip);
    ``kl_k3_mean``     mean k3 KL to the reference (only when ref_logp is given);
    ``veto_frac``      fraction of action tokens the veto dropped (only when a veto mask is given).
    """
    with torch.no_grad():
        out = {
            "ratio_mean": _mean_active(ratio.detach(), x.m),
            "clip_frac_low": _mean_active(low.to(x.m.dtype), x.m),
            "clip_frac_high": _mean_active(high.to(x.m.dtype), x.m),
        }
        if x.kl is not None:
            out["kl_k3_mean"] = _mean_active(x.kl.detach(), x.m)
        if x.vetoed:
            out["veto_frac"] = ((x.m - x.v).sum() / x.m.sum().clamp(min=1.0))
    return out


def _clip_indicators(ratio: Tensor, A: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    ratio = ratio.detach()
    return (ratio < 1.0 - eps_low) & (A < 0), (ratio > 1.0 + eps_high) & (A > 0)


def _token_ppo(x: _Batch, eps_low: float, eps_high: float, beta: float) -> tuple[Tensor, Tensor]:
    _check_eps(eps_low, eps_high)
    rho = torch.exp(x.d)  # ρ_{i,t} [B, T]
    return _per_token(x, _clipped_surrogate(rho, x.A, eps_low, eps_high), beta), rho


def grpo_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
              max_len: int | None = None, weight: Tensor | None = None, veto: Tensor | None = None,
              token_normaliser: float | None = None) -> LossOutput:
    """GRPO (DeepSeekMath, Shao et al. 2024): the clipped surrogate ℓ^PG with token ratios ρ_{i,t},
    averaged over each sequence's action tokens, then over sequences — TRL 1.16 ``loss_type="grpo"``:
    ``((ℓ·m).sum(-1) / m.sum(-1).clamp(min=1)).mean()``. Longer responses get less weight per token
    (the length bias Dr. GRPO removes). ``max_len`` and ``token_normaliser`` are unused."""
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    per_token, rho = _token_ppo(x, eps_low, eps_high, beta)
    return _mean_of_sequence_means(per_token, x.m), _metrics(x, rho, *_clip_indicators(rho, x.A, eps_low, eps_high))


def dr_grpo_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
                 ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
                 max_len: int | None = None, weight: Tensor | None = None, veto: Tensor | None = None,
                 token_normaliser: float | None = None) -> LossOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): the same per-token loss, summed
    and divided by a constant B · L_max (L_max = ``max_len``, the maximum completion length) instead of each
    sequence's length, removing GRPO's length bias — TRL 1.16 ``loss_type="dr_grpo"``:
    ``(ℓ·m).sum() / (B · max_completion_length)``. Pair with ``scale="none"`` advantages as the paper does."""
    if max_len is None or int(max_len) < 1:
        raise GraftkitError(f"dr_grpo needs max_len ≥ 1 (the maximum completion length), got {max_len}",
                            "pass the generation's max_new_tokens budget per response")
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    per_token, rho = _token_ppo(x, eps_low, eps_high, beta)
    B = logp.shape[0]
    loss = _token_sum_over(per_token, x.m, float(B * int(max_len)))
    return loss, _metrics(x, rho, *_clip_indicators(rho, x.A, eps_low, eps_high))


def dapo_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
              max_len: int | None = None, weight: Tensor | None = None, veto: Tensor | None = None,
              token_normaliser: float | None = None) -> LossOutput:
    """DAPO (Yu et al. 2025): the token-level loss — every action token of the batch weighs the same:
    Σ m ℓ / N with N the number of active tokens — TRL 1.16 ``loss_type="dapo"`` (its default). When one
    call sees a micro-batch of a larger generation batch, pass ``token_normaliser`` = TRL's
    ``num_items_in_batch / num_processes · gradient_accumulation_steps / steps_per_generation`` (the active
    tokens of one accumulation window) and do not divide the loss by the accumulation steps afterwards.
    DAPO's asymmetric "clip-higher" is ε_high > ε_low."""
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    per_token, rho = _token_ppo(x, eps_low, eps_high, beta)
    loss = _token_sum_over(per_token, x.m, _n_tokens(x.m, token_normaliser))
    return loss, _metrics(x, rho, *_clip_indicators(rho, x.A, eps_low, eps_high))


def cispo_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
               ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float = 5.0, beta: float = 0.0,
               max_len: int | None = None, weight: Tensor | None = None, veto: Tensor | None = None,
               token_normaliser: float | None = None) -> LossOutput:
    """CISPO (MiniMax-M1, 2025; the ScaleRL recipe): instead of clipping the update, clip the importance
    weight from above, stop its gradient and use it in a REINFORCE term, so no token loses its gradient:
    ℓ^PG = −sg[min(ρ, ε_max)] · Â · log π_θ, then Σ m ℓ / N as dapo — TRL 1.16 ``loss_type="cispo"``:
    ``-torch.clamp(coef_1, max=epsilon_high).detach() * advantages * per_token_logps``.

    Note ``eps_high`` is here the absolute cap ε_max on ρ (TRL reuses ``epsilon_high`` the same way and
    recommends 5.0), not 1 + ε. A cap below 1 is refused as a likely PPO-style ε. ``eps_low`` is unused."""
    if eps_high < 1.0:
        raise GraftkitError(f"cispo's eps_high is the cap ε_max on the importance ratio; got {eps_high} < 1",
                            "use a cap such as 5.0 (ScaleRL/TRL), not a PPO clip width like 0.2")
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    rho = torch.exp(x.d)  # ρ_{i,t} [B, T]
    pg = -torch.clamp(rho, max=eps_high).detach() * x.A * x.logp  # [B, T]
    loss = _token_sum_over(_per_token(x, pg, beta), x.m, _n_tokens(x.m, token_normaliser))
    high = (rho.detach() > eps_high) & (x.A > 0)
    return loss, _metrics(x, rho, torch.zeros_like(high), high)


def _sequence_log_ratio(x: _Batch) -> Tensor:
    # log s_i = Σ_t m (logp − old_logp) / max(Σ_t m, 1)   [B, 1]
    return ((x.d * x.m).sum(-1) / x.m.sum(-1).clamp(min=1.0)).unsqueeze(1)


def gspo_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None, eps_low: float = 3e-4, eps_high: float = 4e-4, beta: float = 0.0,
              max_len: int | None = None, weight: Tensor | None = None, veto: Tensor | None = None,
              token_normaliser: float | None = None) -> LossOutput:
    """GSPO (Group Sequence Policy Optimization, Zheng et al. 2025): one importance ratio per sequence,
    the length-normalised sequence likelihood ratio s_i = exp(mean_t(logp − old_logp)) [B, 1], clipped
    with (ε_low, ε_high) and applied to every token of the response; grpo normaliser. This is TRL 1.16's
    ``importance_sampling_level="sequence"`` with ``loss_type="grpo"``, the configuration its paper index
    gives for GSPO (defaults ε = 3e-4 / 4e-4, GSPO v2 §5.1). The gradient flows through s_i into every
    token's log-prob, ∂s_i/∂logp_{i,t} = s_i / |y_i|; no stop-gradient (that is `gspo_token_loss`)."""
    _check_eps(eps_low, eps_high)
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    s = torch.exp(_sequence_log_ratio(x))  # s_i [B, 1]
    per_token = _per_token(x, _clipped_surrogate(s, x.A, eps_low, eps_high), beta)  # [B, T]
    return _mean_of_sequence_means(per_token, x.m), _metrics(x, s, *_clip_indicators(s, x.A, eps_low, eps_high))


def gspo_token_loss(logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
                    ref_logp: Tensor | None = None, eps_low: float = 3e-4, eps_high: float = 4e-4,
                    beta: float = 0.0, max_len: int | None = None, weight: Tensor | None = None,
                    veto: Tensor | None = None, token_normaliser: float | None = None) -> LossOutput:
    """GSPO-token (Zheng et al. 2025, §4.3): the per-token ratio s_{i,t} = sg[s_i] · π_θ(y_{i,t}) /
    sg[π_θ(y_{i,t})] — the value of s_i with the gradient of one token — for token-level advantages
    (e.g. VeriGate's process path); grpo normaliser. TRL's experimental ``importance_sampling_level=
    "sequence_token"``: ``exp(logp − sg[logp] + sg[log s_i])``. With one advantage per row it equals
    `gspo_loss` in value and gradient."""
    _check_eps(eps_low, eps_high)
    x = _prepare(logp, old_logp, advantages, mask, ref_logp, beta, weight, veto)
    log_s = _sequence_log_ratio(x).detach()  # sg[log s_i] [B, 1]
    s_t = torch.exp(x.logp - x.logp.detach() + log_s)  # s_{i,t} [B, T]
    per_token = _per_token(x, _clipped_surrogate(s_t, x.A, eps_low, eps_high), beta)
    return _mean_of_sequence_means(per_token, x.m), _metrics(x, s_t, *_clip_indicators(s_t, x.A, eps_low, eps_high))


LOSSES: dict[str, Callable[..., LossOutput]] = {
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
    "cispo": cispo_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
}


def policy_loss(loss_type: str, logp: Tensor, old_logp: Tensor | None, advantages: Tensor, mask: Tensor,
                **kwargs) -> LossOutput:
    """``LOSSES[loss_type](logp, old_logp, advantages, mask, **kwargs)``, with a clear error for an unknown name."""
    if loss_type not in LOSSES:
        raise GraftkitError(f"unknown loss type {loss_type!r}", f"use one of {', '.join(LOSSES)}")
    return LOSSES[loss_type](logp, old_logp, advantages, mask, **kwargs)
