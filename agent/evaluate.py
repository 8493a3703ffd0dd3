"""Evaluation over tasks × evaluation seeds × episodes (× samples), every episode kept.

Episode ``e`` of evaluation seed ``s`` plays the first environment seed from ``episode_seed(s, e) = 1000·s + e``
on (in strides of ``webenv.items.ITEM_STRIDE``) whose item is held out for evaluation
(:mod:`graftkit.webenv.items`; ``items="all"``, and the tasks in ``whole``: that seed itself, whatever its item),
so any two models evaluated with the same seeds and episode count meet identical episodes and can be compared
pair by pair, and no evaluated item is one that training draws. Every episode's item id is kept. ``samples`` > 1
plays each episode several times with independent sampling generators (for headroom and pass@k); greedy decoding
uses one sample. ``obs`` picks the observation: ``"text"`` (the element list) or ``"som"`` (the Set-of-Marks
screenshot, for a vision-language policy); both tracks play the same episodes with the same actions, so their
outcomes pair up too.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..verifiable.user import file_seed
from .policy import Policy
from .tasks import make_task_env, resolve_tasks
from .rollout import Decode, Episode, rollout
from .vlm import require_vision

MAX_EPISODES_PER_SEED = 1000


def episode_seed(seed: int, episode: int) -> int:
    """The environment seed of episode ``episode`` under evaluation seed ``seed``."""
    return MAX_EPISODES_PER_SEED * seed + episode


ITEM_MODES = ("heldout", "train", "all")


def plan_episodes(tasks: Sequence[str], seeds: Sequence[int], episodes: int, items: str = "heldout", obs: str = "text",
                  whole: Collection[str] = ()) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """The environment seed and item of every (task, seed, episode), decided on the mirror (the browser
    shows the same first observation): ``(tasks kept, env_seed [T, S, E], item [T, S, E], tasks left out)``.
    A task is left out under ``items="heldout"`` (``"train"``) when an episode finds no evaluation (training)
    item. ``"train"`` plays training items only: the split to choose hyperparameters on. The tasks in
    ``whole`` play every seed's own item under any ``items`` (as ``"all"``): a user's file of items that the
    run does not train on, so nothing of it needs holding out. A user's file played on every item (``whole``, or
    ``items="all"``) plays consecutive items (:func:`file_seed`), so that seeds × episodes ≥ its size covers it."""
    from ..webenv.items import NoItems, draw, item_id

    if items not in ITEM_MODES:
        raise GraftkitError(f"unknown --items {items!r}", "use heldout (evaluation items only), train (training items "
                            "only: for choosing hyperparameters) or all")
    kept, seeds_out, items_out, dropped = [], [], [], []
    for t in tasks:
        env = make_task_env(t)
        es, it = np.zeros((len(seeds), episodes), np.int64), np.empty((len(seeds), episodes), object)
        in_file = env.spec.items is not None  # a user's file: consecutive items cover it
        try:
            for b, s in enumerate(seeds):
                for e in range(episodes):
                    if in_file and (items == "all" or t in whole):
                        es[b, e] = file_seed(s, e, episodes)
                        it[b, e] = item_id(env.reset(int(es[b, e])), obs)
                    elif items == "all" or t in whole:
                        es[b, e] = episode_seed(s, e)
                        it[b, e] = item_id(env.reset(int(es[b, e])), obs)
                    else:
                        es[b, e], it[b, e], _ = draw(env, episode_seed(s, e), heldout=items == "heldout", obs_mode=obs)
        except NoItems:
            dropped.append(t)
            continue
        kept.append(t)
        seeds_out.append(es)
        items_out.append(it)
    if not kept:
        raise GraftkitError(f"{', '.join(dropped)}: no {'evaluation' if items == 'heldout' else 'training'} item "
                            "(the task shows one or a few distinct first observations)",
                            "evaluate tasks with many distinct items, or pass --items all to score items training may use")
    return kept, np.stack(seeds_out), np.stack(items_out), dropped


def seed_list(n: int) -> list[int]:
    """Evaluation seeds 0..n-1 (``--seeds n``, n ≥ 1)."""
    if n < 1:
        raise GraftkitError(f"--seeds {n} must be ≥ 1", "pass e.g. --seeds 25")
    return list(range(n))


def first_prompts(tasks: str | Sequence[str], n: int, seed: int = 0) -> list[str]:
    """``n`` first-turn prompts from the tasks, as the policy reads them in its plain format: prompt k is
    episode ``seed + k // T`` of task ``k mod T`` (T tasks: a suite name or a task list)."""
    names = resolve_tasks(tasks)
    envs = {t: make_task_env(t) for t in names}
    out = []
    for k in range(n):
        task = names[k % len(names)]
        obs = envs[task].reset(seed + k // len(names))
        out.append(envs[task].spec.prompt(obs, []).plain)
    for env in envs.values():
        env.close()
    return out


@dataclass
class EvalOutcome:
    """Every episode's outcome: arrays indexed [task, seed, episode, sample]."""

    tasks: list[str]
    seeds: list[int]
    episodes: int
    samples: int
    decode: Decode
    success: np.ndarray
    reward: np.ndarray
    turns: np.ndarray
    invalid: np.ndarray
    seconds: float
    backend: str = "py"
    obs: str = "text"
    extra: dict = field(default_factory=dict)
    #: [task, seed, episode]: each episode's item id (16 hex digits) and the environment seed it played.
    item: np.ndarray | None = None
    env_seed: np.ndarray | None = None
    #: ``heldout`` (evaluation items only), ``train`` (training items only) or ``all`` (every seed's own item).
    items: str = "heldout"
    #: Tasks that played every seed's own item whatever ``items`` says: a user's file the run does not train on.
    whole: tuple[str, ...] = ()
    #: Tasks left out because no evaluation item was found (their item space is one or a few items).
    no_items: tuple[str, ...] = ()
    #: Per task, the most common outputs that did not parse as an action: ``[(text, count), ...]``.
    invalid_outputs: dict = field(default_factory=dict)

    def rate(self, task: str | None = None) -> float:
        s = self.success if task is None else self.success[self.tasks.index(task)]
        return float(s.mean())


def evaluate(
    policy: Policy,
    tasks: Sequence[str],
    seeds: Sequence[int],
    episodes: int,
    decode: Decode,
    samples: int = 1,
    backend: str = "py",
    batch_size: int = 64,
    on_episode: Callable[[Episode], None] = lambda e: None,
    obs: str = "text",
    items: str = "heldout",
    whole: Collection[str] = (),
) -> EvalOutcome:
    """Play every (task, seed, episode, sample) and keep its outcome (episodes from :func:`plan_episodes`;
    tasks without an evaluation item are left out and named in ``no_items``; the tasks in ``whole`` play
    every item)."""
    require_vision(policy, obs)
    if not 1 <= episodes <= MAX_EPISODES_PER_SEED:
        raise GraftkitError(f"--episodes {episodes} must be in 1..{MAX_EPISODES_PER_SEED}")
    if samples < 1 or (decode.greedy and samples > 1):
        raise GraftkitError(f"samples={samples}: greedy decoding plays each episode once", "sample to repeat episodes")
    if not seeds:
        raise GraftkitError("no evaluation seeds", "pass --seeds N (N ≥ 1)")
    tasks, env_seed, item, dropped = plan_episodes(tasks, seeds, episodes, items, obs, whole)
    shape = (len(tasks), len(seeds), episodes, samples)
    index = {}
    jobs = []
    for a, t in enumerate(tasks):
        for b, s in enumerate(seeds):
            for e in range(episodes):
                for k in range(samples):
                    index[(t, int(env_seed[a, b, e]), k)] = (a, b, e, k)
                    jobs.append((t, int(env_seed[a, b, e]), k))
    t0 = time.perf_counter()
    played = rollout(policy, jobs, decode, backend=backend, batch_size=batch_size, on_episode=on_episode, obs=obs,
                     keep_vision=False)
    success, reward = np.zeros(shape, bool), np.zeros(shape)
    turns, invalid = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    bad: dict[str, Counter] = {t: Counter() for t in tasks}
    for ep in played:
        i = index[(ep.task, ep.seed, ep.sample)]
        success[i], reward[i], turns[i], invalid[i] = ep.success, ep.reward, len(ep.turns), ep.invalid
        bad[ep.task].update(shown_output(t.action) for t in ep.turns if not t.valid)
    return EvalOutcome(list(tasks), list(seeds), episodes, samples, decode, success, reward, turns, invalid,
                       time.perf_counter() - t0, backend, obs, item=item, env_seed=env_seed, items=items,
                       whole=tuple(t for t in tasks if t in whole), no_items=tuple(dropped),
                       invalid_outputs={t: c.most_common(TOP_INVALID) for t, c in bad.items() if c})


#: How many of a task's most common unparseable outputs an evaluation keeps.
TOP_INVALID = 3


def shown_output(text: str, limit: int = 80) -> str:
    """An unparseable output as a report shows it: one line, at most ``limit`` characters (an empty one as
    ``(empty)``: the model ended its turn at once)."""
    text = " ".join(text.split()) or "(empty)"
    return text if len(text) <= limit else text[: limit - 1] + "…"
