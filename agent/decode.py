"""graftkit's own decoder (the ``hf`` engine): one action per prompt, batched, with a KV cache.

The prompts are left-padded into one batch; one forward pass fills the KV cache (prefill), then the batch
decodes token by token reusing that cache, each row stopping at its end token. Decoding is greedy (argmax) or
sampled (softmax of logits / temperature, then nucleus top-p). Every row draws from its own generator (the
rollout seeds it from ``(decode seed, task, episode seed, sample)``: :func:`graftkit.agent.rollout.row_seed`), so
an episode's sample does not depend on which other episodes share its batch. Each action token's log-prob is
under the sampling distribution (temperature applied, before top-p truncation; TRL's convention) — GRPO needs them.

For images (a :class:`~graftkit.agent.vlm.VisionPolicy`'s Set-of-Marks prompts) the prefill also carries every
row's pixels (``pixel_values``, ``image_grid_thw``, image token types); a model with multimodal rotary positions
(Qwen2-VL's M-RoPE) computes the prefill's positions itself and keeps each row's offset ``rope_deltas`` = (last
position + 1) − (prompt length), and each decoded token then sits at position (prompt length + step + rope_delta)
on all three axes — what ``model.generate`` does, without the text-style positions that would be wrong for image
tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.errors import GraftkitError
from .policy import Policy
from .vlm import VisionPolicy


@dataclass(frozen=True)
class Decode:
    """How actions are decoded."""

    greedy: bool = True
    """Argmax decoding; otherwise sample with temperature and top-p."""
    temperature: float = 1.0
    """Softmax temperature for sampling (ignored when greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 keeps every token)."""
    max_new_tokens: int = 32
    """Longest action, in tokens, before the turn is cut (and counted invalid)."""
    seed: int = 0
    """Seed of every row's sampling generator."""

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise GraftkitError(f"--temperature {self.temperature} must be > 0", "pass e.g. --temperature 1.0")
        if not 0 < self.top_p <= 1:
            raise GraftkitError(f"--top-p {self.top_p} must be in (0, 1]", "pass e.g. --top-p 0.95")
        if self.max_new_tokens < 1:
            raise GraftkitError("max_new_tokens must be ≥ 1")


def _choose(logits: torch.Tensor, decode: Decode, gens: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob. ``logits [B, V]`` (float32)."""
    if decode.greedy:
        logp = torch.log_softmax(logits, -1)
        tok = logits.argmax(-1)
        return tok, logp.gather(1, tok[:, None])[:, 0]
    logp = torch.log_softmax(logits / decode.temperature, -1)
    probs = logp.exp()
    if decode.top_p < 1:
        sorted_p, idx = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < decode.top_p  # the smallest prefix with mass ≥ top_p
        probs = torch.zeros_like(probs).scatter(1, idx, sorted_p * keep)
    # Inverse-CDF sampling with one uniform draw per row from that row's own generator (one cheap call
    # per row, instead of a multinomial per row); generators may live on the CPU beside a GPU model.
    u = torch.stack([torch.rand((), generator=g, device=g.device) for g in gens]).to(logits.device)
    cdf = probs.cumsum(-1)  # [B, V]
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=probs.shape[-1] - 1)[:, 0]
    return tok, logp.gather(1, tok[:, None])[:, 0]


def _forward_kwargs(model) -> tuple[str, dict]:
    """The KV-cache argument's name (``cache`` in newer transformers, ``past_key_values`` before) and
    ``logits_to_keep=1`` where the model takes it (the prefill then projects only the last position)."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    return cache_kw, ({"logits_to_keep": 1} if "logits_to_keep" in params else {})


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def batch_invariant_attention(model):
    """A context in which ``model``'s attention gives each row the same result whatever its batch: on the
    CPU in a 16-bit dtype, torch's fused scaled-dot-product kernel rounds a row differently with the left
    padding its batch gives it (logits move by a bf16 ulp, enough to flip a sampled token), so there its
    math backend is used; elsewhere nothing changes."""
    import contextlib

    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype == torch.float32:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def generate(
    policy: Policy, prompts: Sequence[Sequence[int]], decode: Decode, gens: Sequence[torch.Generator],
    vision: Sequence[dict] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Decode one action for each prompt, batched with a KV cache. Returns (token ids, log-probs).

    ``vision``: for a :class:`VisionPolicy`, each prompt's image inputs (``VisionPolicy.som_prompt``)."""
    with torch.no_grad(), batch_invariant_attention(policy.model):
        return _generate(policy, prompts, decode, gens, vision)


def _generate(policy, prompts, decode, gens, vision):
    model, pad, eos = policy.model, policy.pad_id, policy.eos_ids
    device = next(model.parameters()).device
    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, width), pad, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache_kw, extra = _forward_kwargs(model)
    if vision is not None and not isinstance(policy, VisionPolicy):
        raise GraftkitError("image inputs need a vision-language policy", "pass vision=None for a text-only policy")
    if vision is not None and len(vision) != b:
        raise GraftkitError(f"{len(vision)} image inputs for {b} prompts", "pass one per prompt")
    if vision is not None and policy.mrope:
        # The model places image tokens on its (t, h, w) grid itself and records each row's offset.
        policy.model.base_model.rope_deltas = None
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **policy.vision_inputs(ids, vision), **extra)
        deltas = policy.model.base_model.rope_deltas  # [B, 1]
        if deltas is None or tuple(deltas.shape) != (b, 1):
            raise GraftkitError(f"{type(model).__name__} kept no per-row rope_deltas after the prefill",
                                "this vision-language family is not supported by the batched decoder yet")
        next_pos = (mask.sum(-1, keepdim=True) + deltas.to(device)).expand(3, b, 1)  # [3, B, 1]: t, h, w
    else:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        images = policy.vision_inputs(ids, vision) if vision is not None else {}
        # A GRPO group repeats one prompt G times: fill the cache once per distinct prompt, then give
        # every row its prompt's cache entries and last logits (text prompts only).
        keys = [tuple(p) for p in prompts]
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        if vision is None and len(first) < b:
            uniq = sorted(set(first.values()))
            where = {i: j for j, i in enumerate(uniq)}
            inverse = torch.tensor([where[first[k]] for k in keys], device=device)
            out = model(input_ids=ids[uniq], attention_mask=mask[uniq], position_ids=pos[uniq], use_cache=True,
                        **extra)
            _cache_of(out).batch_select_indices(inverse)
            out.logits = out.logits[inverse]
        else:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **images, **extra)
        next_pos = pos[:, -1:] + 1
    cache, logits = _cache_of(out), out.logits[:, -1].float()
    tokens: list[list[int]] = [[] for _ in range(b)]
    logps: list[list[float]] = [[] for _ in range(b)]
    running = torch.ones(b, dtype=torch.bool)
    for _ in range(decode.max_new_tokens):
        tok, lp = _choose(logits, decode, gens)
        for i in running.nonzero()[:, 0].tolist():
            t = int(tok[i])
            tokens[i].append(t)
            logps[i].append(float(lp[i]))
            if t in eos:
                running[i] = False
        if not running.any():
            break
        mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], 1)
        out = model(input_ids=tok[:, None].to(device), attention_mask=mask, position_ids=next_pos,
                    use_cache=True, **{cache_kw: cache}, **extra)
        cache, logits = _cache_of(out), out.logits[:, -1].float()
        next_pos = next_pos + 1
    return tokens, logps
