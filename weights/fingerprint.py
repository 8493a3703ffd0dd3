"""Content fingerprints (sha256) of checkpoint files, cached by file identity.

A checkpoint's fingerprint is the sha256 of the sorted lines ``"<file name> <sha256 of file>"`` over
its weight files and ``config.json``. Hashing a multi-GB checkpoint takes seconds, so each file's digest
is cached under ``$GRAFTKIT_CACHE`` (default ``~/.cache/graftkit``) keyed by its real path, size, inode
and modification time: any change to the file invalidates the entry (files modified in the last two
seconds are not cached, since a same-size edit inside the clock's granularity would keep the key). Files are hashed on two threads
(hashlib releases the GIL on large buffers).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from ..errors import GraftkitError
from ..files import write_atomic

_CHUNK = 8 << 20
_SETTLE_S = 2.0


def cache_dir() -> Path:
    return Path(os.environ.get("GRAFTKIT_CACHE", Path.home() / ".cache" / "graftkit"))


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _load_cache() -> dict[str, str]:
    try:
        return json.loads((cache_dir() / "sha256.json").read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(cache: dict[str, str]) -> None:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / "sha256.json", json.dumps(cache))  # a killed writer's temporary is swept next time
    except (OSError, GraftkitError):
        pass  # a read-only or full home only costs a re-hash next time


def file_digests(files: Iterable[Path]) -> dict[Path, str]:
    """sha256 of each file, from the cache where the file is unchanged."""
    files = list(dict.fromkeys(Path(f) for f in files))
    cache = _load_cache()
    keys = {f: _key(f) for f in files}
    todo = [f for f in files if keys[f] not in cache]
    found = {f: cache[keys[f]] for f in files if keys[f] in cache}
    if todo:
        now = time.time()
        with ThreadPoolExecutor(max_workers=min(2, len(todo))) as pool:
            for f, digest in zip(todo, pool.map(sha256_file, todo)):
                found[f] = digest
                # A file modified in the last seconds may still change within the timestamp
                # granularity of older kernels: hash it again next time rather than trust its key.
                if now - f.stat().st_mtime > _SETTLE_S:
                    cache[keys[f]] = digest
        _save_cache(cache)
    return {f: found[f] for f in files}


def fingerprint(files: Iterable[Path]) -> str:
    """One sha256 for a set of files (weights and config), independent of their folder's path."""
    digests = file_digests(files)
    lines = sorted(f"{p.name} {d}" for p, d in digests.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
