"""Batched multi-turn rollouts.

Many episodes advance together. Each turn, the prompts of every running episode are decoded together by
graftkit's batched KV-cached decoder (:mod:`graftkit.agent.decode`), in length groups. Every row draws from its
own generator, seeded from ``(decode seed, task, episode seed, sample)`` (:func:`row_seed`), so an episode's
sample does not depend on which other episodes share its batch. For each turn the prompt ids, the action ids and
their log-probs under the sampling distribution (temperature applied, before top-p truncation; TRL's convention)
are kept — GRPO needs them.

An output that does not parse as an action is a no-op turn, counted in ``invalid``; an episode ends when
the task ends it or after the task's ``max_steps`` turns (then its reward is 0, a failure).

With a vLLM engine on the policy (``policy.engine``, :mod:`graftkit.agent.engine`), each turn's prompts go to
the engine as one batch instead: greedy actions are the same in float32; sampled ones are the engine's own,
each request seeded from the episode's row seed and the turn.

Observations: ``obs="text"`` prompts with the rendered element list; ``obs="som"`` (a
:class:`~graftkit.agent.vlm.VisionPolicy` only) with the Set-of-Marks screenshot and the instruction, whose
image inputs go with each prompt into the prefill (:mod:`graftkit.agent.decode`).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..core.env import Env
from ..core.errors import GraftkitError
from ..webenv import ParseError
from .decode import Decode, generate
from .engine import turn_seed
from .policy import Policy
from .tasks import check_known, make_task_env, task_spec
from .vlm import require_vision


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
    tasks = sorted({task for task, _, _ in jobs})
    check_known(tasks)
    shown = [t for t in tasks if obs == "som" and not task_spec(t).screenshots]
    if shown:
        raise GraftkitError(f"--obs som shows screenshots; {', '.join(shown)} has none (a verifiable problem is text)",
                            "use --obs text")
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
        prompts, vision = [policy.turn_ids(live[i].env.spec.prompt(live[i].obs, live[i].history)) for i in rows], None
    toks: list = [None] * len(rows)
    lps: list = [None] * len(rows)
    if policy.engine is not None:  # vLLM batches and schedules the turn's prompts itself
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
        action = policy.output_text(toks[j], st.env.spec.reads)
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

