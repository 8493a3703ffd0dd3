"""Units for the study's scheduler tests, importable by name in a worker process (tests/ is on its sys.path)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from graftkit.core.errors import GraftkitError


def write_after(path: Path, needs: tuple[Path, ...], seconds: float, on_work) -> None:
    """Write ``path`` (this process's id) after ``seconds``; every file of ``needs`` must exist when it starts."""
    missing = [str(p) for p in needs if not Path(p).exists()]
    if missing:
        raise GraftkitError(f"{path.name} started before {', '.join(missing)}")
    time.sleep(seconds)
    on_work(1, 1)
    Path(path).write_text(str(os.getpid()))


def fail(on_work) -> None:
    raise GraftkitError("planted failure in a worker", "the fix it names")
