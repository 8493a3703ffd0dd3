"""The one exception type graftkit raises for bad input.

Every message is one line: what is wrong, which file or tensor, and how to fix it. The command line
prints it without a traceback and exits non-zero. This module is a leaf: every package may import it.
"""

from __future__ import annotations


class GraftkitError(Exception):
    """Bad input or an unmet precondition, explained in one line."""

    exit_code = 2

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(f"{what} — {fix}" if fix else what)

    def __reduce__(self):
        """Pickled whole (what, fix and any attribute of a subclass), so an error raised in a worker process is the
        same one line in the process that handed it the work."""
        return _rebuild, (type(self), self.what, self.fix, dict(self.__dict__))


def _rebuild(cls: type, what: str, fix: str | None, state: dict) -> GraftkitError:
    e = cls.__new__(cls)
    GraftkitError.__init__(e, what, fix)
    e.__dict__.update(state)
    return e
