"""Items: what an episode shows the policy first, and the split that keeps evaluation items out of training.

An **item** is an episode's first observation as the policy sees it: its rendered text (``render_text``),
or for a Set-of-Marks policy the instruction and the marks (refs and boxes). Two environment seeds can
show the same item (focus-text has one: its text shows no positions), so holding evaluation seeds out of
training holds nothing out. Items are held out instead: an item is an **evaluation item** when its digest
falls in one residue class (``HELDOUT_MOD``), a pure function of what the policy sees. Training (SFT
demonstrations and GRPO prompts) draws only training items; evaluation plays only evaluation items, so the
two never overlap, for any seed or task, on any backend (the mirror decides, the browser shows the same).

Evaluation episode ``(seed, episode)`` plays the first environment seed ``episode_seed + j·ITEM_STRIDE``
(j = 0, 1, …) whose item is an evaluation item (and training draws skip evaluation items the same way),
so every policy evaluated with the same seeds still meets identical episodes. A task with no evaluation
item among ``MAX_DRAWS`` candidates (an item space of one or a few items) cannot be evaluated held-out.
"""

from __future__ import annotations

import hashlib

from .observation import Observation
from .render import render_text, som_marks

#: One item in HELDOUT_MOD is held out for evaluation (its digest ≡ 0 mod HELDOUT_MOD).
HELDOUT_MOD = 4
#: Candidate environment seeds of one episode are ``base + j * ITEM_STRIDE`` (disjoint for any base < stride).
ITEM_STRIDE = 2**32
#: Candidates tried before a task is declared to have no item of the split asked for.
MAX_DRAWS = 64
#: An evaluation whose distinct items are fewer than this, or fewer than half its episodes, repeats items
#: so often that it measures few items: it is flagged (and its intervals cluster by item).
MIN_DISTINCT = 20

SPLIT_RULE = f"item digest ≡ 0 mod {HELDOUT_MOD} held out for evaluation; training draws only the other items"


def item_id(obs: Observation, obs_mode: str = "text") -> str:
    """The item of a first observation: 16 hex digits of the SHA-256 of what the policy sees (a problem's
    prompt, for an observation that carries ``item_text``)."""
    if hasattr(obs, "item_text"):  # an observation that is its own text (a verifiable problem)
        seen = obs.item_text()
    elif obs_mode == "som":
        marks = ";".join(f"{m.ref}:{','.join(f'{v:.1f}' for v in m.box)}" for m in som_marks(obs))
        seen = f"{obs.utterance}\n{marks}"
    else:
        seen = render_text(obs)
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def is_heldout(item: str) -> bool:
    """Whether ``item`` is an evaluation item (never used in training)."""
    return int(item, 16) % HELDOUT_MOD == 0


class NoItems(LookupError):
    """No candidate seed of an episode shows an item of the split asked for."""


def draw(env, base: int, heldout: bool, obs_mode: str = "text") -> tuple[int, str, Observation]:
    """The first candidate seed ``base + j·ITEM_STRIDE`` whose item is (``heldout``) or is not an evaluation
    item: ``(env_seed, item, first observation)``. Raises :class:`NoItems` after ``MAX_DRAWS`` candidates."""
    for j in range(MAX_DRAWS):
        seed = base + j * ITEM_STRIDE
        obs = env.reset(seed)
        item = item_id(obs, obs_mode)
        if is_heldout(item) == heldout:
            return seed, item, obs
    raise NoItems(f"no {'evaluation' if heldout else 'training'} item in {MAX_DRAWS} draws")


def too_few(distinct: int, episodes: int) -> bool:
    """Whether ``distinct`` items are too few for an evaluation of ``episodes`` episodes."""
    return distinct < min(MIN_DISTINCT, episodes) or 2 * distinct < episodes
