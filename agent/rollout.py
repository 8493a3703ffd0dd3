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

With a vLLM engine on the policy (``policy.engine``, :mod:`graftkit.agent.engine`), each turn's prompts go to
the engine as one batch instead: greedy actions are the same in float32; sampled ones are the engine's own,
each request seeded from the episode's row seed and the turn.

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
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..core.env import Env
from ..core.errors import GraftkitError
from ..webenv import ParseError
from .tasks import check_known, is_problem, make_task_env
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


#: Browsers the real backend runs at once (each is a Chromium process of ~190 MB).
MAX_BROWSERS = 4


@dataclass
class _Live:
    env: Env
    obs: object
    first: object
    gen: torch.Generator
    row: int  # the row seed: the hf engine's generator is seeded with it, a vLLM request with turn_seed(row, turn)
    history: list[str] = field(default_factory=list)


def length_groups(lengths: Sequence[int], min_rows: int = 16) -> list[list[int]]:
    """Indices sorted by length, cut where a prompt is more than twice the group's shortest (and the
    group already has ``min_rows``): left padding then wastes at most about half of a group's prefill,
    while groups stay large enough to keep the per-token decode calls amortised."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) < min_rows or lengths[i] <= 2 * lengths[groups[-1][0]]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def rollout(
    policy: Policy,
    jobs: Sequence[tuple[str, int, int]],
    decode: Decode,
    backend: str = "py",
    batch_size: int = 64,
    on_episode: Callable[[Episode], None] = lambda e: None,
    obs: str = "text",
    keep_vision: bool = True,
    max_turns: int | None = None,
) -> list[Episode]:
    """Play every ``(task, env_seed, sample)`` job to its end; returns the episodes in job order.

    Continuous batching: up to ``batch_size`` episodes are live at once, and a finished episode's slot
    is refilled from the queue at once, so the batch stays full through episodes of different lengths.
    Each turn's prompts are decoded in length groups (:func:`length_groups`). Environments are reused
    per task (a reset never depends on earlier episodes); the real backend runs at most
    :data:`MAX_BROWSERS` browsers.

    ``obs``: ``"text"`` (element list) or ``"som"`` (Set-of-Marks screenshot; a VisionPolicy only).
    ``keep_vision``: keep each SoM turn's image inputs on its :class:`Turn` (GRPO re-scores them;
    evaluation does not need them, and they are the bulk of an episode's memory).
    ``max_turns``: end episodes after this many turns if the task allows more (single-turn GRPO)."""
    require_vision(policy, obs)
    check_known(sorted({task for task, _, _ in jobs}))
    if obs == "som" and any(is_problem(t) for t, _, _ in jobs):
        raise GraftkitError("--obs som shows web pages; a verifiable problem has no screenshot", "use --obs text")
    episodes = [Episode(t, s, k) for t, s, k in jobs]
    env_kw = {"screenshots": True} if obs == "som" else {}
    if backend == "miniwob":
        batch_size = min(batch_size, MAX_BROWSERS)
    pool: dict[str, list] = {}
    pending = deque(range(len(episodes)))
    live: dict[int, _Live] = {}
    try:
        while pending or live:
            while pending and len(live) < batch_size:
                i = pending.popleft()
                ep = episodes[i]
                free = pool.setdefault(ep.task, [])
                env = free.pop() if free else make_task_env(ep.task, backend, **env_kw)
                o = env.reset(ep.seed)
                row = row_seed(decode.seed, ep.task, ep.seed, ep.sample)
                live[i] = _Live(env, o, o, torch.Generator().manual_seed(row), row)
            for i in _turn(policy, episodes, live, decode, obs, keep_vision, max_turns):
                on_episode(episodes[i])
                pool[episodes[i].task].append(live.pop(i).env)
    finally:
        for env in [e for envs in pool.values() for e in envs] + [s.env for s in live.values()]:
            env.close()
    return episodes


def _turn(policy: Policy, episodes: list[Episode], live: dict[int, _Live], decode: Decode,
          obs_kind: str, keep_vision: bool, max_turns: int | None = None) -> list[int]:
    """One turn of every live episode; returns the episodes that ended."""
    rows = sorted(live)
    if obs_kind == "som":
        prompts, vision = map(list, zip(*(policy.som_prompt(live[i].obs, live[i].history) for i in rows)))
    else:
        prompts, vision = [policy.turn_ids(live[i].obs, live[i].history) for i in rows], None
    toks: list = [None] * len(rows)
    lps: list = [None] * len(rows)
    if policy.engine is not None:  # vLLM batches and schedules the turn's prompts itself
        from .engine import turn_seed

        seeds = [turn_seed(live[i].row, len(episodes[i].turns)) for i in rows]
        toks, lps = policy.engine.generate(prompts, decode, seeds, policy.eos_ids)
    for group in length_groups([len(p) for p in prompts]) if policy.engine is None else ():
        t, lp = generate(policy, [prompts[j] for j in group], decode, [live[rows[j]].gen for j in group],
                         vision=[vision[j] for j in group] if vision is not None else None)
        for j, tj, lj in zip(group, t, lp):
            toks[j], lps[j] = tj, lj
    ended = []
    for j, i in enumerate(rows):
        ep, st = episodes[i], live[i]
        action = policy.read_output(st.obs, toks[j])
        try:
            step = st.env.step(action)
            valid = st.env.parseable(action)  # a problem's answer format (a web action's raised ParseError above)
        except ParseError:
            step, valid = None, False
        if step is not None:
            st.obs = step.observation
            ep.reward, ep.done = step.reward, step.done
        spec = st.env.spec
        progress = spec.progress(st.first, st.obs, ep.reward, ep.done) if not st.obs.empty or ep.done else 0.0
        ep.turns.append(Turn(prompts[j], toks[j], lps[j], action, valid, progress,
                             vision[j] if vision is not None and keep_vision else None))
        st.history.append(action if valid else "invalid")
        if ep.done or len(ep.turns) >= min(spec.max_steps, max_turns or spec.max_steps):
            ended.append(i)
    return ended
