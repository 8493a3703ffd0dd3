"""The action grammar both backends share, and its strict parser.

    click(REF)            core.elementClick(REF): click the element, then focus it
    type(REF, "TEXT")     click and focus REF, then type TEXT key by key into the focused element

REF is an integer from the element list (an unknown ref does nothing; ``type`` then types into
whatever has focus, as MiniWoB++ does). TEXT is a double-quoted string of 1 to 64 printable ASCII
characters (MiniWoB++'s ``TYPING_MAX_LENGTH``), with ``\\"`` and ``\\\\`` as the only escapes. Anything
else raises ``ParseError``; the agent counts such an output as a no-op turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..core.errors import GraftkitError

MAX_TEXT = 64
_CLICK = re.compile(r"click\(\s*(-?\d+)\s*\)")
_TYPE = re.compile(r'type\(\s*(-?\d+)\s*,\s*"((?:[^"\\]|\\.)*)"\s*\)')


class ParseError(GraftkitError):
    """A string that is not an action of the grammar."""


@dataclass(frozen=True)
class Action:
    kind: Literal["click", "type"]
    ref: int
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("click", "type"):
            raise ParseError(f"unknown action kind {self.kind!r}", "use click or type")
        if self.kind == "type":
            _check_text(self.text)
        elif self.text:
            raise ParseError("click takes no text", 'write click(REF) or type(REF, "TEXT")')

    def __str__(self) -> str:
        if self.kind == "click":
            return f"click({self.ref})"
        return f'type({self.ref}, "{self.text.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}")'


def _check_text(text: str) -> None:
    if not text:
        raise ParseError("type needs a non-empty text", 'write type(REF, "TEXT")')
    if len(text) > MAX_TEXT:
        raise ParseError(f"typed text has {len(text)} characters, more than {MAX_TEXT}", "type it in pieces")
    bad = [c for c in text if not " " <= c <= "~"]
    if bad:
        raise ParseError(f"typed text holds non-printable or non-ASCII characters {bad!r}",
                         "type printable ASCII only")


def _unescape(raw: str, source: str) -> str:
    out, i = [], 0
    while i < len(raw):
        if raw[i] == "\\":
            if raw[i + 1] not in "\"\\":
                raise ParseError(f"unknown escape in {source!r}", 'only \\" and \\\\ may be escaped')
            i += 1
        out.append(raw[i])
        i += 1
    return "".join(out)


def parse_action(source: str) -> Action:
    """One action from its string form (surrounding whitespace ignored); ``ParseError`` otherwise."""
    if not isinstance(source, str):
        raise ParseError(f"an action is a string, got {type(source).__name__}")
    s = source.strip()
    m = _CLICK.fullmatch(s)
    if m:
        return Action("click", int(m.group(1)))
    m = _TYPE.fullmatch(s)
    if m:
        return Action("type", int(m.group(1)), _unescape(m.group(2), s))
    raise ParseError(f"not an action: {source[:80]!r}", 'write click(REF) or type(REF, "TEXT")')
