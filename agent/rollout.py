"""Batched multi-turn rollouts with a KV cache.

Many episodes advance together. Each turn, the prompts of every running episode are left-padded into one
batch; one forward pass fills the KV cache (prefill), then the batch decodes token by token reusing that
cache, each row stopping at its end token. Decoding is greedy (argmax) or sampled (softmax of
logits / temperature, then nucleus top-p). Every row draws from its own generator, seeded from
``(decode seed, task, episode seed, sample)``, so an episode's sample does not depend on which other
episodes share its batch. For each turn the prompt ids, the action ids and their log-probs under the
sampling distribution (temperature applied, before top-p truncation; TRL's convention) are kept — GRPO
needs them.

An output that does not parse as an action is a no-op turn, counted in ``invalid``; an episode ends when
the task ends it or after the task's ``max_steps`` turns (then its reward is 0, a failure).

Observations: ``obs="text"`` prompts with the rendered element list; ``obs="som"`` (a
:class:`~graftkit.agent.vlm.VisionPolicy` only) with the Set-of-Marks screenshot and the instruction.
For images the prefill also carries every row's pixels (``pixel_values``, ``image_grid_thw``, image
token types); a model with multimodal rotary positions (Qwen2-VL's M-RoPE) computes the prefill's
positions itself and keeps each row's offset ``rope_deltas`` = (last position + 1) − (prompt length),
and each decoded token then sits at position (prompt length + step + rope_delta) on all three axes —
what ``model.generate`` does, without the text-style positions that would be wrong for image tokens.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..errors import GraftkitError
from ..webenv import ParseError, make_env
from ..webenv.render import render_text
from ..webenv.tasks import TASKS
from .policy import Policy
from .vlm import VisionPolicy, require_vision


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


@dataclass
class Turn:
    prompt_ids: list[int]
    action_ids: list[int]
    logprobs: list[float]
    action: str
    valid: bool
    progress: float = 0.0  # the task's step-progress score after this turn
    vision: dict | None = None  # SoM turns: the image inputs beside prompt_ids (pixel_values, image_grid_thw)


@dataclass
class Episode:
    task: str
    seed: int  # the environment seed
    sample: int = 0
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False

    @property
    def success(self) -> bool:
        return self.done and self.reward == 1.0

    @property
    def invalid(self) -> int:
        return sum(not t.valid for t in self.turns)


def row_seed(decode_seed: int, task: str, env_seed: int, sample: int) -> int:
    digest = hashlib.sha256(f"{decode_seed}|{task}|{env_seed}|{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


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
    # Each row's generator may live on another device than the logits (CPU generators, GPU model).
    tok = torch.stack([torch.multinomial(probs[i].to(g.device), 1, generator=g)[0]
                       for i, g in enumerate(gens)]).to(logits.device)
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


@torch.no_grad()
def generate(
    policy: Policy, prompts: Sequence[Sequence[int]], decode: Decode, gens: Sequence[torch.Generator],
    vision: Sequence[dict] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Decode one action for each prompt, batched with a KV cache. Returns (token ids, log-probs).

    ``vision``: for a :class:`VisionPolicy`, each prompt's image inputs (``VisionPolicy.som_prompt``)."""
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


def rollout(
    policy: Policy,
    jobs: Sequence[tuple[str, int, int]],
    decode: Decode,
    backend: str = "py",
    batch_size: int = 64,
    on_episode: Callable[[Episode], None] = lambda e: None,
    obs: str = "text",
    keep_vision: bool = True,
) -> list[Episode]:
    """Play every ``(task, env_seed, sample)`` job to its end; episodes advance in batches.

    ``obs``: ``"text"`` (element list) or ``"som"`` (Set-of-Marks screenshot; a VisionPolicy only).
    ``keep_vision``: keep each SoM turn's image inputs on its :class:`Turn` (GRPO re-scores them;
    evaluation does not need them, and they are the bulk of an episode's memory)."""
    require_vision(policy, obs)
    for task, _, _ in jobs:
        if task not in TASKS:
            raise GraftkitError(f"unknown web task {task!r}", f"choose from {', '.join(sorted(TASKS))}")
    episodes = [Episode(t, s, k) for t, s, k in jobs]
    out: list[Episode] = []
    env_kw = {"screenshots": True} if obs == "som" else {}
    for start in range(0, len(episodes), batch_size):
        group = episodes[start : start + batch_size]
        envs = [make_env(e.task, backend, **env_kw) for e in group]
        try:
            _play(policy, group, envs, decode, obs, keep_vision)
        finally:
            for env in envs:
                env.close()
        for e in group:
            on_episode(e)
        out.extend(group)
    return out


def _play(policy: Policy, group: list[Episode], envs, decode: Decode, obs_kind: str = "text",
          keep_vision: bool = True) -> None:
    obs = [env.reset(e.seed) for env, e in zip(envs, group)]
    first = list(obs)
    gens = [torch.Generator().manual_seed(row_seed(decode.seed, e.task, e.seed, e.sample)) for e in group]
    history: list[list[str]] = [[] for _ in group]
    live = list(range(len(group)))
    while live:
        if obs_kind == "som":
            prompts, vision = map(list, zip(*(policy.som_prompt(obs[i], history[i]) for i in live)))
        else:
            prompts, vision = [policy.prompt_ids(render_text(obs[i]), history[i]) for i in live], None
        toks, lps = generate(policy, prompts, decode, [gens[i] for i in live], vision=vision)
        still = []
        for j, i in enumerate(live):
            ep, env = group[i], envs[i]
            action = policy.decode_action(toks[j])
            try:
                step = env.step(action)
                valid = True
            except ParseError:
                step, valid = None, False
            if step is not None:
                obs[i] = step.observation
                ep.reward, ep.done = step.reward, step.done
            spec = TASKS[ep.task]
            progress = spec.progress(first[i], obs[i], ep.reward, ep.done) if not obs[i].empty or ep.done else 0.0
            ep.turns.append(Turn(prompts[j], toks[j], lps[j], action, valid, progress,
                                 vision[j] if vision is not None and keep_vision else None))
            history[i].append(action if valid else "invalid")
            if not ep.done and len(ep.turns) < spec.max_steps:
                still.append(i)
        live = still
