"""A random policy over the action grammar: the baseline MiniWoB++ papers report, and a fuzzer.

``random_action(obs, rng)`` picks any ref of the observation (text fragments included) or an unknown
one, and clicks it or types into it a word of the instruction, a snippet, or a space. It depends only
on the observation and ``rng``, so the same seed replays the same actions on either backend — which is
how the tests drive both through the odd corners of each page and compare them step by step.
"""

from __future__ import annotations

import random

from .observation import Observation

SNIPPETS = ("An", "S", "Ba", "Uni", "x", " ", "ab c")
UNKNOWN_REFS = (0, 999)


def random_action(obs: Observation, rng: random.Random) -> str:
    refs = [el.ref for el in obs.elements] + list(UNKNOWN_REFS)
    ref = rng.choice(refs)
    if rng.random() < 0.55:
        return f"click({ref})"
    words = [w for w in obs.utterance.replace('"', " ").split() if len(w) > 1]
    word = rng.choice(words) if words else "x"
    text = rng.choice([word[: rng.randint(1, 6)], rng.choice(SNIPPETS)])
    text = text.replace("\\", "").replace('"', "") or "x"
    return f'type({ref}, "{text}")'
