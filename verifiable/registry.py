"""Which names are verifiable tasks: the built-ins, and the user's tasks once their source is named.

A user's tasks enter the registry only when a command names their source (``--tasks FILE.jsonl`` or
``--tasks my_pkg.tasks:suite``): :func:`resolve_source` loads them (an entry point's code runs only then)
and returns the names they are registered under, which every later lookup in the process finds.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..core.errors import GraftkitError
from .base import VerifiableTask
from .format import PromptFormat
from .builtin import builtin

_REGISTERED: dict[str, VerifiableTask] = {}
#: Tasks in the prompt format of the command that last resolved them (:meth:`VerifiableTask.with_format`).
_FORMATTED: dict[str, VerifiableTask] = {}
_ENTRY_POINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def register(task: VerifiableTask) -> str:
    """Add ``task`` under its name (a name already taken by another source is an error); returns the name."""
    name = task.name
    if not name or not re.fullmatch(r"[\w.\-]+", name):
        raise GraftkitError(f"task name {name!r} from {task.source} is not a plain name",
                            "name tasks with letters, digits, '.', '-' or '_'")
    taken = _REGISTERED.get(name)
    if (taken is not None and taken.source != task.source) or _builtin(name) is not None:
        raise GraftkitError(f"task name {name!r} from {task.source} is already taken by "
                            f"{taken.source if taken is not None else 'a built-in task'}",
                            "rename the file or the task so that every task has its own name")
    _REGISTERED[name] = task
    return name


@lru_cache(maxsize=None)
def _builtin(name: str) -> VerifiableTask | None:
    return builtin(name)


def lookup(name: str) -> VerifiableTask:
    """The verifiable task registered or built in as ``name``."""
    task = _FORMATTED.get(name) or _REGISTERED.get(name) or _builtin(name)
    if task is None:
        raise GraftkitError(f"unknown verifiable task {name!r}",
                            "use arithmetic, multiply, countdown, multiples (each with -N for difficulty), "
                            "a FILE.jsonl or a module:function entry point")
    return task


def is_verifiable(name: str) -> bool:
    """Whether ``name`` is a built-in or registered verifiable task."""
    return name in _REGISTERED or _builtin(name) is not None


def registered() -> dict[str, VerifiableTask]:
    """The user's tasks loaded so far in this process."""
    return dict(_REGISTERED)


def resolve_source(spec: str, fmt: PromptFormat | None = None) -> list[str] | None:
    """The task names ``spec`` stands for when it names verifiable tasks (a built-in, a ``.jsonl`` file, an
    entry point ``module:function``), loading and registering a user's; None when it names none. With ``fmt``
    (a command's prompt format) every later lookup of those names finds them in it (the default format: as they
    are); without, in the format they were last resolved in."""
    from . import user

    if _builtin(spec) is not None or spec in _REGISTERED:
        names = [spec]
    elif spec.endswith(".jsonl"):
        names = [register(user.load_jsonl(spec))]
    elif _ENTRY_POINT.fullmatch(spec):
        names = [register(t) for t in user.load_entry_point(spec)]
    else:
        return None
    if fmt is not None:
        for name in names:
            _FORMATTED.pop(name, None)
            if not fmt.is_default:
                _FORMATTED[name] = lookup(name).with_format(fmt)
    return names
