"""``Math.seedrandom(seed)`` followed by ``Math.random()``, ported bit for bit to Python.

MiniWoB++ seeds every episode with David Bau's seedrandom.js (version 2.4.x, shipped minified in
``core/core.js`` of the ``miniwob`` package) and then draws all task randomness from ``Math.random``.
The generator is ARC4 keyed by a "mixkey" of the seed's string form, with the first 256 bytes
dropped; each double takes 7+ bytes and is assembled exactly as the JS does, in IEEE doubles, so
Python's floats give the same numbers. seedrandom.js: (c) 2019 David Bau, MIT licence.

On top sit MiniWoB's own helpers from ``core.js`` (``core.randi``, ``core.randf``, ``core.sample``),
so task generators read like the JavaScript they port.
"""

from __future__ import annotations

import math
from collections.abc import MutableSequence, Sequence
from typing import TypeVar

T = TypeVar("T")

_WIDTH = 256  # each RC4 output is one byte
_CHUNKS = 6  # bytes taken for the first 48 bits of a double
_START = float(_WIDTH**_CHUNKS)  # 2^48
_SIGNIFICANCE = float(2**52)
_OVERFLOW = float(2**53)
_MASK = _WIDTH - 1


def _flatten(seed: int | str) -> str:
    """seedrandom's ``flatten(seed, 3)`` for a scalar: strings as is, numbers as ``String(n) + "\\0"``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise TypeError(f"seed must be an int or a str, got {type(seed).__name__}")
    if isinstance(seed, str):
        return seed
    if abs(seed) >= 10**21:  # JS switches to exponent notation there
        raise ValueError(f"integer seed {seed} is too large (|seed| < 1e21)")
    return f"{seed}\0"


def _mixkey(text: str) -> list[int]:
    """seedrandom's ``mixkey``: fold the seed string into a key of at most 256 bytes."""
    key: list[int] = []
    smear = 0
    for e, ch in enumerate(text):
        slot = e & _MASK
        if slot < len(key):  # JS: 19 * undefined is NaN, and x ^ NaN == x
            smear ^= 19 * key[slot]
        value = _MASK & (smear + ord(ch))
        if slot < len(key):
            key[slot] = value
        else:
            key.append(value)
    return key


class _ARC4:
    """RC4 with seedrandom's key schedule; the first 256 output bytes are discarded."""

    def __init__(self, key: Sequence[int]):
        key = list(key) or [0]  # JS: an empty key becomes [0]
        s = list(range(_WIDTH))
        j = 0
        for i in range(_WIDTH):
            t = s[i]
            j = _MASK & (j + key[i % len(key)] + t)
            s[i] = s[j]
            s[j] = t
        self.S, self.i, self.j = s, 0, 0
        self.g(_WIDTH)

    def g(self, count: int) -> int:
        """The next ``count`` bytes as one big-endian integer."""
        s, i, j, out = self.S, self.i, self.j, 0
        for _ in range(count):
            i = _MASK & (i + 1)
            t = s[i]
            j = _MASK & (j + t)
            s[i] = s[j]
            s[j] = t
            out = out * _WIDTH + s[_MASK & (s[i] + t)]
        self.i, self.j = i, j
        return out


class SeedRandom:
    """The ``Math.random`` that ``Math.seedrandom(seed)`` installs, plus MiniWoB's ``core.*`` helpers."""

    def __init__(self, seed: int | str):
        self._arc4 = _ARC4(_mixkey(_flatten(seed)))

    def random(self) -> float:
        """A double in [0, 1) with 52 bits of randomness, assembled as seedrandom.js does."""
        g = self._arc4.g
        n, d, x = float(g(_CHUNKS)), _START, 0
        while n < _SIGNIFICANCE:
            n = (n + x) * _WIDTH
            d *= _WIDTH
            x = g(1)
        while n >= _OVERFLOW:
            n /= 2
            d /= 2
            x >>= 1
        return (n + x) / d

    # --- core.js ----------------------------------------------------------------------------
    def randi(self, lo: int, hi: int) -> int:
        """``core.randi(min, max)``: ``Math.floor(Math.random() * (max - min) + min)``."""
        return math.floor(self.random() * (hi - lo) + lo)

    def randf(self, lo: float, hi: float) -> float:
        """``core.randf(min, max)``: ``Math.random() * (max - min) + min``."""
        return self.random() * (hi - lo) + lo

    def sample(self, items: Sequence[T]) -> T:
        """``core.sample(list)``: one element, uniformly."""
        return items[self.randi(0, len(items))]

    def shuffle(self, items: MutableSequence[T]) -> MutableSequence[T]:
        """``core.shuffle(array)``: Fisher-Yates from the end, in place."""
        i = len(items)
        while i != 0:
            j = math.floor(self.random() * i)
            i -= 1
            items[i], items[j] = items[j], items[i]
        return items
