"""Content fingerprints of checkpoint files, cached by file identity, computable while other work runs.

A checkpoint's fingerprint is ``"blake3:<hex>"``: the BLAKE3 digest of the sorted lines ``"<file name>
<blake3 of file>"`` over its weight files and ``config.json``, prefixed with the algorithm's name (the
``algorithm:encoded`` form of OCI digests), so a record says how it was computed. BLAKE3 is a
cryptographic hash like sha256 and runs about 4× faster per core (≈ 4 GB/s reading from the page cache
here, against 1.4 GB/s for sha256 with SHA-NI), which matters at 8B: 32 GB for a pair.

Each file's digest is cached under ``$GRAFTKIT_CACHE`` (default ``~/.cache/graftkit``), one JSON map per
algorithm, keyed by the file's real path, size, inode and modification time: any change to the file
invalidates the entry (files modified in the last two seconds are not cached, since a same-size edit
inside the clock's granularity would keep the key). Files are hashed on two threads; both hashes release
the GIL, so :func:`fingerprint_later` hashes while the caller copies or computes, and the first graft of a
pair costs about what a repeat does (the fingerprint is needed only when the provenance is written).

``file_digests(..., algorithm="sha256")`` gives plain sha256 of files, for records meant to be matched
against other tools' (a GGUF source file's digest, as a model hub lists it).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from ..core.errors import GraftkitError
from ..core.files import write_atomic

ALGORITHM = "blake3"
ALGORITHMS = ("blake3", "sha256")
#: Read size of a file being hashed: 1 MB stays in a core's cache between its copy from the page cache and
#: its hash (≈ 10% less CPU than 8 MB reads, measured on a bf16 shard).
_CHUNK = 1 << 20
_SETTLE_S = 2.0
_CACHE_LOCK = threading.Lock()  # one reader-modifier-writer of a cache file per process at a time


def cache_dir() -> Path:
    return Path(os.environ.get("GRAFTKIT_CACHE", Path.home() / ".cache" / "graftkit"))


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}"


def _hasher(algorithm: str):
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3(max_threads=1)  # files run on their own threads
    raise GraftkitError(f"unknown digest algorithm {algorithm!r}", f"use one of {', '.join(ALGORITHMS)}")


def digest_file(path: Path, algorithm: str = ALGORITHM) -> str:
    """The hex digest of one file's bytes, read in 1 MB chunks into one reused buffer."""
    h = _hasher(algorithm)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    return digest_file(path, "sha256")


def _cache_file(algorithm: str) -> Path:
    return cache_dir() / f"{algorithm}.json"


def _load_cache(algorithm: str) -> dict[str, str]:
    try:
        return json.loads(_cache_file(algorithm).read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(algorithm: str, new: dict[str, str]) -> None:
    """Merge ``new`` entries into the cache file (re-read first: another process may have added its own)."""
    try:
        with _CACHE_LOCK:
            cache = _load_cache(algorithm)
            cache.update(new)
            cache_dir().mkdir(parents=True, exist_ok=True)
            write_atomic(_cache_file(algorithm), json.dumps(cache))  # a killed writer's temporary is swept next time
    except (OSError, GraftkitError):
        pass  # a read-only or full home only costs a re-hash next time


def file_digests(files: Iterable[Path], algorithm: str = ALGORITHM) -> dict[Path, str]:
    """The hex digest of each file, from the cache where the file is unchanged."""
    if algorithm not in ALGORITHMS:
        raise GraftkitError(f"unknown digest algorithm {algorithm!r}", f"use one of {', '.join(ALGORITHMS)}")
    files = list(dict.fromkeys(Path(f) for f in files))
    cache = _load_cache(algorithm)
    keys = {f: _key(f) for f in files}
    todo = [f for f in files if keys[f] not in cache]
    found = {f: cache[keys[f]] for f in files if keys[f] in cache}
    if todo:
        now, new = time.time(), {}
        # largest first, so two threads finish together
        todo.sort(key=lambda f: f.stat().st_size, reverse=True)
        with ThreadPoolExecutor(max_workers=min(2, len(todo)), thread_name_prefix="graftkit-hash") as pool:
            for f, digest in zip(todo, pool.map(lambda p: digest_file(p, algorithm), todo)):
                found[f] = digest
                # A file modified in the last seconds may still change within the timestamp
                # granularity of older kernels: hash it again next time rather than trust its key.
                if now - f.stat().st_mtime > _SETTLE_S:
                    new[keys[f]] = digest
        if new:
            _save_cache(algorithm, new)
    return {f: found[f] for f in files}


def combine(digests: dict[Path, str], algorithm: str = ALGORITHM) -> str:
    """``"<algorithm>:<hex>"`` over the sorted ``"<file name> <digest>"`` lines: independent of the
    folder's path and of the order the files are listed in."""
    lines = sorted(f"{p.name} {d}" for p, d in digests.items())
    h = _hasher(algorithm)
    h.update("\n".join(lines).encode())
    return f"{algorithm}:{h.hexdigest()}"


def fingerprint(files: Iterable[Path]) -> str:
    """One ``"blake3:<hex>"`` for a set of files (weights and config), independent of their folder's path."""
    return combine(file_digests(files))


def cached_fingerprint(files: Iterable[Path]) -> str | None:
    """The fingerprint when every file's digest is in the cache (no file is read), else None."""
    files = list(dict.fromkeys(Path(f) for f in files))
    cache = _load_cache(ALGORITHM)
    digests = {}
    for f in files:
        d = cache.get(_key(f))
        if d is None:
            return None
        digests[f] = d
    return combine(digests)


def fingerprint_later(files: Iterable[Path]) -> Callable[[], str]:
    """Start fingerprinting ``files`` in a background thread; returns a function that waits for the
    value (and re-raises the thread's error, e.g. a file that vanished, as a :class:`GraftkitError`).

    A fingerprint found whole in the cache is returned without a thread. The files are only read, so
    hashing them while the caller copies them reads each byte from the page cache the copy warmed.
    """
    files = list(dict.fromkeys(Path(f) for f in files))
    ready = cached_fingerprint(files)
    if ready is not None:
        return lambda: ready
    fut: Future = Future()

    def work() -> None:
        try:
            fut.set_result(fingerprint(files))
        except BaseException as e:  # handed to the waiter
            fut.set_exception(e)

    threading.Thread(target=work, name="graftkit-fingerprint", daemon=True).start()

    def wait() -> str:
        try:
            return fut.result()
        except OSError as e:
            raise GraftkitError(f"fingerprinting {getattr(e, 'filename', None) or 'a checkpoint file'} failed: "
                                f"{e.strerror or e}", "check that the checkpoint was not changed or removed "
                                                      "while graftkit read it") from None

    return wait
