"""MiniWoB++'s word lists (``ui_utils.js``), read from the installed ``miniwob`` package when present.

The task generators index these lists with seeded random numbers, so they must be the very lists the
browser uses: with ``miniwob`` installed they are parsed from its ``html/common/ui_utils.js`` at run
time; without it, ``_miniwob_words`` holds a copy of just the lists the mirror uses (MIT licence,
attribution there). ``tests/test_webenv.py`` checks that the copy equals the installed file.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from ..core.errors import GraftkitError

#: The lists the mirror's tasks draw from (names as in ui_utils.js).
USED = ("lorem_words", "FIFTY_NAMES", "COUNTRIES", "LAST_NAMES", "alphanumericChars")

_ASSIGN = re.compile(r"^ui_utils\.(\w+)\s*=\s*", re.M)


def installed_ui_utils() -> Path | None:
    """Path of the installed package's ``ui_utils.js``, or None when ``miniwob`` is not installed."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "html" / "common" / "ui_utils.js"
    return path if path.is_file() else None


def _js_string(src: str, i: int) -> tuple[str, int]:
    """The JS string literal starting at ``src[i]`` (a quote) and the index just past it."""
    quote, out, i = src[i], [], i + 1
    while src[i] != quote:
        if src[i] == "\\":
            i += 1
        out.append(src[i])
        i += 1
    return "".join(out), i + 1


def parse_ui_utils(src: str) -> dict[str, list[str] | str]:
    """Every ``ui_utils.NAME = [ 'a', "b", ... ];`` list and ``ui_utils.NAME = '...';`` string in ``src``."""
    found: dict[str, list[str] | str] = {}
    for m in _ASSIGN.finditer(src):
        i = m.end()
        if src[i] in "'\"":
            found[m.group(1)], _ = _js_string(src, i)
        elif src[i] == "[":
            items, i = [], i + 1
            while True:
                while src[i] in " \t\r\n,":
                    i += 1
                if src[i] == "]":
                    break
                if src[i] not in "'\"":  # not a list of string literals
                    items = None
                    break
                item, i = _js_string(src, i)
                items.append(item)
            if items is not None:
                found[m.group(1)] = items
    return found


@lru_cache(maxsize=1)
def ui_utils() -> dict[str, list[str] | str]:
    """The lists in ``USED``, from the installed package or else the bundled copy."""
    path = installed_ui_utils()
    if path is not None:
        parsed = parse_ui_utils(path.read_text(encoding="utf-8"))
        missing = [name for name in USED if name not in parsed]
        if missing:
            raise GraftkitError(
                f"{path} lacks ui_utils.{', ui_utils.'.join(missing)}",
                "install the miniwob version the mirror was built against: pip install miniwob==1.1.0",
            )
        return {name: parsed[name] for name in USED}
    from . import _miniwob_words

    return {name: getattr(_miniwob_words, name) for name in USED}


def source() -> str:
    """Where the lists come from: the installed file's path, or ``bundled``."""
    path = installed_ui_utils()
    return str(path) if path is not None else "bundled"
