"""Which environment plays a web task: the pure-Python mirror (``py``, :mod:`.env`) or real MiniWoB++ in Chromium
(``miniwob``, :mod:`.real`). Both implement :class:`.env.WebEnv`; this module alone knows both."""

from __future__ import annotations

from ..core.errors import GraftkitError
from .env import MirrorEnv, WebEnv

#: The web backends, as ``--backend`` names them.
BACKENDS = ("py", "miniwob")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise GraftkitError(f"unknown --backend {backend!r}", "use py (the mirror) or miniwob (Chromium)")


def make_env(task: str, backend: str = "py", **kwargs) -> WebEnv:
    """A web task environment: ``backend="py"`` (the mirror, default) or ``"miniwob"`` (Chromium, started on first
    use)."""
    check_backend(backend)
    if backend == "miniwob":
        from .real import MiniWobEnv

        return MiniWobEnv(task, **kwargs)
    return MirrorEnv(task, **kwargs)
