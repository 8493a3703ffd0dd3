"""Behavioural divergence between two policies on fixed, teacher-forced episodes: per-token KL.

A policy plays its own rollouts once (:func:`play_fixed`): sampled at temperature 1 (top-p 1), seeded per row as
:mod:`graftkit.agent.rollout` seeds it, on the held-out items evaluation plays (:func:`~graftkit.agent.evaluate.plan_episodes`).
Every turn's prompt ids and the action ids the policy generated are kept (:class:`FixedEpisodes`): a web
episode is several turns, a verifiable problem one. Any model can then score the same token sequences by
teacher forcing — batched forward passes, no generation (:func:`log_softmax_batches`) — and two scorings give
the divergence at every action token.

Notation (shapes in brackets; N action tokens, V the vocabulary)::

    x_{<t}                    a turn's prompt and the action tokens before t, as the playing policy generated them
    log p[t, v] = log P(v | x_{<t})   full-vocabulary log-softmax of P's logits at temperature 1     [N, V]
    KL_t(P‖Q) = Σ_v p[t, v] (log p[t, v] − log q[t, v])     nats, one value per action token        [N]
    log P(a_t) − log Q(a_t)   the log-ratio at the played token a_t                                   [N]

Conventions (:data:`CONVENTIONS`, stored beside every value computed from here): forward KL from the policy
that played the episodes (KL(π_played‖π_other)); action tokens only, the turn-end token included (a turn cut at
``max_new_tokens`` has none); temperature 1; log-softmax in float32 from the model's logits (the model runs in
its placement dtype), sums over tokens in float64; natural logarithms (nats). A vocabulary entry with
p = 0 adds nothing (0·log 0 = 0); one with p > 0 and q = 0 makes the KL infinite, as it is.

Memory: a batch of turns is scored at a time, the output head only over its action positions
(:func:`graftkit.agent.policy.next_token_logits`), so a forward pass holds [tokens of the batch, V] logits and
never [sequence length, V]. :func:`score_pair` keeps only the per-token results; a caller that must keep full
distributions (a graft sweep's references) bounds them itself (:func:`token_chunks`).

References: per-token KL between a base and its fine-tune on fixed text (science-of-finetuning's
diffing-toolkit); forward KL on the new task as a predictor of forgetting (Shenfeld et al. 2025, "RL's Razor").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterator, Sequence

import numpy as np
import torch

from ..core.errors import GraftkitError
from .evaluate import MAX_EPISODES_PER_SEED, plan_episodes
from .policy import Policy, next_token_logits
from .decode import Decode, batch_invariant_attention
from .rollout import Episode, rollout

#: Whose rollouts: the RL policy's or the SFT policy's.
SIDES = ("rl", "sft")
#: Sampling temperature of the rollouts and of every distribution compared.
TEMPERATURE = 1.0
#: Turns per batched forward pass.
FORWARD_BATCH = 16

CONVENTIONS = {
    "kl": "KL(P‖Q) = Σ_v p_v (log p_v − log q_v) per action token, over the full vocabulary",
    "direction": "forward KL from the policy that played the episodes: KL(π_played‖π_other)",
    "tokens": "every action token the playing policy generated, the turn-end token included (a turn cut at "
              "max_new_tokens has none); prompt tokens are context only",
    "temperature": TEMPERATURE,
    "top_p": 1.0,
    "dtype": "log-softmax in float32 from the model's logits (the model in its placement dtype); sums in float64",
    "log_base": "e (nats)",
    "rollouts": "each policy's own rollouts, sampled at temperature 1 and top-p 1, every row seeded from (decode "
                "seed, task, env seed, sample) as graftkit.agent.rollout; the episodes evaluation plays "
                "(held-out items by default)",
    "teacher_forcing": "each turn is one sequence (prompt ids + action ids) scored in one forward pass, right-padded, "
                       "no generation",
}


@dataclass(frozen=True)
class FixedTurn:
    """One turn as played: the prompt the policy read, the action tokens it generated, and their text."""

    prompt_ids: tuple[int, ...]
    action_ids: tuple[int, ...]
    action: str
    """The output as the task read it (a web action, or a problem's completion)."""
    valid: bool = True
    """Whether the output parsed (a web action, or an answer in the task's answer format)."""


@dataclass(frozen=True)
class FixedEpisode:
    """One played episode: where it sits in the grid, its item, its outcome and its turns."""

    task: str
    seed: int
    """The evaluation seed."""
    episode: int
    """The episode's index within its seed."""
    env_seed: int
    item: str
    success: bool
    turns: tuple[FixedTurn, ...]


@dataclass(frozen=True)
class FixedEpisodes:
    """A fixed set of teacher-forced episodes: one policy's rollouts over ``tasks`` × ``seeds`` × ``episodes``
    (``played`` in that row-major order), and which policy played them (``side``: rl or sft)."""

    side: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    episodes: int
    played: tuple[FixedEpisode, ...]
    decode_seed: int = 0
    max_new_tokens: int = 32
    no_items: tuple[str, ...] = ()
    """Tasks left out because they have no evaluation item."""

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise GraftkitError(f"rollouts of side {self.side!r}", f"use one of {', '.join(SIDES)}")
        if len(self.played) != len(self.tasks) * len(self.seeds) * self.episodes:
            raise GraftkitError(f"{len(self.played)} episodes for a {self.shape} grid of tasks × seeds × episodes")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``[task, seed, episode]``."""
        return len(self.tasks), len(self.seeds), self.episodes

    def turns(self) -> list[tuple[int, FixedTurn]]:
        """Every turn in flat order, with the flat index of its episode."""
        return [(e, t) for e, ep in enumerate(self.played) for t in ep.turns]

    @property
    def n_tokens(self) -> int:
        return sum(len(t.action_ids) for ep in self.played for t in ep.turns)

    def token_episode(self) -> np.ndarray:
        """The flat episode index of every action token ``[N]`` (flat token order: episode, turn, position)."""
        return np.array([e for e, t in self.turns() for _ in t.action_ids], dtype=np.int64)

    def token_turn(self) -> np.ndarray:
        """The index of every action token's turn within its episode ``[N]``."""
        return np.array([k for ep in self.played for k, t in enumerate(ep.turns) for _ in t.action_ids], dtype=np.int64)

    def token_ids(self) -> np.ndarray:
        """The played action token ids ``[N]``."""
        return np.array([i for _, t in self.turns() for i in t.action_ids], dtype=np.int64)

    def per_episode(self, values: np.ndarray) -> np.ndarray:
        """Per-token ``values [N]`` summed over each episode, in float64: ``[task, seed, episode]``."""
        sums = np.bincount(self.token_episode(), weights=np.asarray(values, np.float64), minlength=len(self.played))
        return sums.reshape(self.shape)

    def tokens(self) -> np.ndarray:
        """Action tokens per episode ``[task, seed, episode]``."""
        return np.array([sum(len(t.action_ids) for t in ep.turns) for ep in self.played], np.int64).reshape(self.shape)

    def items(self) -> np.ndarray:
        """Each episode's item id ``[task, seed, episode]``."""
        return np.array([ep.item for ep in self.played], dtype=object).reshape(self.shape)

    def success(self) -> np.ndarray:
        """Each episode's outcome ``[task, seed, episode]`` (int8)."""
        return np.array([ep.success for ep in self.played], np.int8).reshape(self.shape)

    def invalid(self) -> np.ndarray:
        """Turns per episode whose output did not parse ``[task, seed, episode]`` (int16)."""
        return np.array([sum(not t.valid for t in ep.turns) for ep in self.played], np.int16).reshape(self.shape)

    def n_turns(self) -> np.ndarray:
        """Turns per episode ``[task, seed, episode]`` (int16)."""
        return np.array([len(ep.turns) for ep in self.played], np.int16).reshape(self.shape)


def rollout_decode(max_new_tokens: int = 32, seed: int = 0) -> Decode:
    """How the fixed episodes are sampled: temperature 1, top-p 1 (:data:`CONVENTIONS`)."""
    return Decode(greedy=False, temperature=TEMPERATURE, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)


def play_fixed(policy: Policy, side: str, tasks: Sequence[str], seeds: Sequence[int], episodes: int, *,
               max_new_tokens: int = 32, decode_seed: int = 0, items: str = "heldout", whole: Collection[str] = (),
               backend: str = "py", batch_size: int = 64,
               on_episode: Callable[[Episode], None] = lambda e: None) -> FixedEpisodes:
    """``policy``'s own rollouts of every (task, seed, episode), sampled at temperature 1 (:func:`rollout_decode`),
    on the episodes evaluation plays (:func:`~graftkit.agent.evaluate.plan_episodes`: held-out items by default),
    every turn's prompt and action ids kept. Text observations only."""
    if not 1 <= episodes <= MAX_EPISODES_PER_SEED:
        raise GraftkitError(f"--episodes {episodes} must be in 1..{MAX_EPISODES_PER_SEED}")
    if not seeds:
        raise GraftkitError("no evaluation seeds", "pass --seeds N (N ≥ 1)")
    tasks, env_seed, item, dropped = plan_episodes(tasks, seeds, episodes, items, "text", whole)
    jobs = [(t, int(env_seed[a, b, e]), 0) for a, t in enumerate(tasks) for b in range(len(seeds))
            for e in range(episodes)]
    played = rollout(policy, jobs, rollout_decode(max_new_tokens, decode_seed), backend=backend,
                     batch_size=batch_size, on_episode=on_episode, keep_vision=False)
    out, k = [], 0
    for a, t in enumerate(tasks):
        for b, s in enumerate(seeds):
            for e in range(episodes):
                ep = played[k]
                k += 1
                out.append(FixedEpisode(t, int(s), e, ep.seed, str(item[a, b, e]), ep.success, tuple(
                    FixedTurn(tuple(turn.prompt_ids), tuple(turn.action_ids), turn.action, turn.valid) for turn in ep.turns)))
    return FixedEpisodes(side, tuple(tasks), tuple(int(s) for s in seeds), episodes, tuple(out), decode_seed,
                         max_new_tokens, tuple(dropped))


# ------------------------------------------------------------------------------------------ scoring


def token_kl(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """KL_t(P‖Q) = Σ_v p_v (log p_v − log q_v) per row: ``logp_p, logp_q [N, V]`` (log-softmax) → ``[N]``.
    0·log 0 = 0 (a vocabulary entry P gives no mass adds nothing)."""
    if logp_p.shape != logp_q.shape:
        raise GraftkitError(f"log-probabilities of shapes {tuple(logp_p.shape)} and {tuple(logp_q.shape)}: the two "
                            "policies must share one vocabulary", "compare models with the same tokenizer")
    p = logp_p.exp()
    terms = p * (logp_p - logp_q.to(logp_p.device))
    return torch.where(p > 0, terms, torch.zeros_like(terms)).sum(-1)


def token_chunks(turns: Sequence[tuple[int, FixedTurn]], vocab: int, budget_bytes: int) -> list[list[int]]:
    """Turn indices cut into consecutive chunks whose full float32 distributions ([action tokens, V]) fit
    ``budget_bytes`` (a turn larger than the budget is a chunk of its own)."""
    per_token = 4 * vocab
    chunks: list[list[int]] = [[]]
    used = 0
    for i, (_, t) in enumerate(turns):
        need = per_token * len(t.action_ids)
        if chunks[-1] and used + need > budget_bytes:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += need
    return [c for c in chunks if c]


def _batch(turns: Sequence[FixedTurn], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, L]``, attention mask ``[B, L]`` and the positions that predict an action token
    ``[B, L-1]`` (position t predicts token t + 1), in row-major order = flat token order."""
    width = max(len(t.prompt_ids) + len(t.action_ids) for t in turns)
    ids = torch.full((len(turns), width), pad, dtype=torch.long)
    mask = torch.zeros((len(turns), width), dtype=torch.long)
    select = torch.zeros((len(turns), width - 1), dtype=torch.bool)
    for r, t in enumerate(turns):
        seq, p = list(t.prompt_ids) + list(t.action_ids), len(t.prompt_ids)
        if p < 1:
            raise GraftkitError("a turn without prompt tokens cannot be teacher-forced", "play the episodes again")
        ids[r, : len(seq)] = torch.tensor(seq)
        mask[r, : len(seq)] = 1
        select[r, p - 1 : p - 1 + len(t.action_ids)] = True
    return ids, mask, select


def log_softmax_batches(model, turns: Sequence[FixedTurn], pad_id: int, *, batch_size: int = FORWARD_BATCH
                        ) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first token index, log p [n, V])`` per batch of ``batch_size`` turns, in flat token order: the
    full-vocabulary log-softmax (float32, temperature 1) at every action token, by teacher forcing (one forward
    pass per batch, no generation, no gradient). ``log p`` stays on the model's device."""
    if batch_size < 1:
        raise GraftkitError(f"forward batch of {batch_size} turns", "pass a batch size ≥ 1")
    dev = next(model.parameters()).device
    start = 0
    for i in range(0, len(turns), batch_size):
        chunk = turns[i : i + batch_size]
        ids, mask, select = _batch(chunk, pad_id)
        with torch.no_grad(), batch_invariant_attention(model):
            logits = next_token_logits(model, ids.to(dev), mask.to(dev), select.to(dev))  # [n, V] float32
            logp = torch.log_softmax(logits.float() / TEMPERATURE, -1)
        yield start, logp
        start += logp.shape[0]


def action_log_softmax(model, fixed: FixedEpisodes, pad_id: int, *, batch_size: int = FORWARD_BATCH) -> torch.Tensor:
    """Every action token's full-vocabulary log-softmax ``[N, V]`` (float32, on the CPU), in flat token order.
    It holds N·V floats: for large vocabularies score in batches (:func:`log_softmax_batches`, :func:`score_pair`)."""
    parts = [lp.cpu() for _, lp in log_softmax_batches(model, [t for _, t in fixed.turns()], pad_id,
                                                       batch_size=batch_size)]
    return torch.cat(parts) if parts else torch.zeros((0, 0))


@dataclass(frozen=True)
class PairScores:
    """Two policies' scoring of one fixed set of episodes, per action token ``[N]`` (flat token order): the
    playing policy P and the other Q."""

    kl: np.ndarray
    """KL_t(P‖Q) in nats (float32)."""
    logp_p: np.ndarray
    """log P(a_t) of the played token (float32)."""
    logp_q: np.ndarray
    """log Q(a_t) of the played token (float32)."""


def played_logp(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``logp [n, V]`` at the played tokens ``ids [n]`` → ``[n]``."""
    return logp.gather(1, ids.to(logp.device)[:, None])[:, 0]


def score_pair(model_p, model_q, fixed: FixedEpisodes, pad_id: int, *, batch_size: int = FORWARD_BATCH,
               on_tokens: Callable[[int], None] = lambda n: None) -> PairScores:
    """KL_t(P‖Q) and both log-probabilities of the played token at every action token of ``fixed`` (episodes P
    played), batch by batch: only [batch tokens, V] distributions are ever held. ``on_tokens(n)`` after each
    batch."""
    turns = [t for _, t in fixed.turns()]
    ids = torch.from_numpy(fixed.token_ids())
    kl, lp, lq = (np.zeros(ids.numel(), np.float32) for _ in range(3))
    batches_q = log_softmax_batches(model_q, turns, pad_id, batch_size=batch_size)
    for (start, logp_p), (_, logp_q) in zip(log_softmax_batches(model_p, turns, pad_id, batch_size=batch_size),
                                            batches_q):
        n = logp_p.shape[0]
        logp_q = logp_q.to(logp_p.device)
        if logp_q.shape != logp_p.shape:
            raise GraftkitError(f"the two policies give {logp_p.shape[1]} and {logp_q.shape[1]} logits per token: "
                                "KL needs one vocabulary", "compare two checkpoints of one model (same tokenizer)")
        here = ids[start : start + n]
        kl[start : start + n] = token_kl(logp_p, logp_q).cpu().numpy()
        lp[start : start + n] = played_logp(logp_p, here).cpu().numpy()
        lq[start : start + n] = played_logp(logp_q, here).cpu().numpy()
        on_tokens(n)
    return PairScores(kl, lp, lq)


__all__ = [
    "CONVENTIONS", "FORWARD_BATCH", "SIDES", "TEMPERATURE", "FixedEpisode", "FixedEpisodes", "FixedTurn", "PairScores",
    "action_log_softmax", "log_softmax_batches", "play_fixed", "played_logp", "rollout_decode", "score_pair",
    "token_chunks", "token_kl",
]
