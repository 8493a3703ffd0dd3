"""Wall time and peak memory of a command and every process it starts.

`run_measured` starts a command, polls ``/proc/<pid>/status`` of the process tree every ~5 ms, and
reports:

- ``peak_rss_bytes``: the largest sum of ``VmRSS`` over the tree seen in one sample, raised to the
  kernel's own high-water marks where those are larger (a 5 ms poll can miss a short spike; the
  kernel's ``VmHWM`` of each process cannot). Pages shared between processes of the tree are
  counted once per process, as ``ps`` and ``top`` count them.

  ``ru_maxrss`` from ``wait4`` is the cross-check, with a catch: at ``exec`` Linux folds the
  high-water mark of the *pre-exec* address space into it, and Python starts children with
  ``vfork``, whose pre-exec address space is this (parent) process. So ``ru_maxrss`` is really
  max(child's peak, parent's peak at spawn); it is folded into ``peak_rss_bytes`` only when it
  exceeds the parent's own ``VmHWM`` at spawn, i.e. when it can only be the child's.
- ``peak_anon_bytes``: the largest sum of ``RssAnon`` over the tree: memory the tools allocated
  themselves (heap, tensors), as opposed to file pages they mapped (``RssFile``), which the kernel
  can drop and re-read at will. Sampled only; there is no kernel high-water mark for it.

The poller itself costs ≈2% of one core (measured against ``sleep``). Linux only. Timings on a
shared 2-core machine swing a lot: warm the page cache first, repeat, and compare the minimum and
the median against an anchor measured in the same run (`best_of`, `summarize`).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

POLL_INTERVAL_S = 0.005
_KIB = 1024


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One run of one command."""

    wall_s: float
    """Seconds from start to exit of the top process, as seen by the parent (``time.perf_counter``)."""
    peak_rss_bytes: int
    """Peak resident memory of the tree: max(sampled Σ VmRSS, largest VmHWM, ru_maxrss if valid)."""
    peak_anon_bytes: int
    """Peak sampled Σ RssAnon over the tree (heap and tensors, not mapped files)."""
    returncode: int
    """Exit status of the top process; negative: killed by that signal."""
    stdout: str
    stderr: str
    sampled_peak_rss_bytes: int = 0
    """Peak Σ VmRSS over the tree seen by the poller alone (a lower bound on the true peak)."""
    ru_maxrss_bytes: int = 0
    """Kernel high-water mark from ``wait4``: the largest RSS of any single process of the tree that
    was waited for (the top process and the children it reaped), not a sum; inflated to the parent's
    own peak by the spawn (see the module docstring)."""
    ru_maxrss_valid: bool = False
    """Whether ``ru_maxrss_bytes`` exceeds the parent's peak at spawn, so it is the child's own."""
    samples: int = 0
    """Number of /proc samples taken."""
    processes_seen: int = 0
    """Number of distinct processes seen in the tree."""
    cpu_s: float = 0.0
    """User + system CPU seconds of the top process and the children it reaped (``wait4``). Steadier
    than wall time on a contended machine, where other people's processes take the cores."""

    def check(self, what: str) -> Measurement:
        """Return self, or raise with the command's stderr if it failed."""
        if self.returncode != 0:
            tail = self.stderr.strip().splitlines()[-20:]
            raise RuntimeError(f"{what} exited with status {self.returncode}; last lines of stderr:\n"
                               + "\n".join(tail))
        return self


def _status_fields(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon, VmHWM of one process in bytes, or None once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields: dict[str, int] = {}
    for line in text.split(b"\n"):
        if line.startswith((b"VmRSS:", b"RssAnon:", b"VmHWM:")):
            key, value = line.split(b":", 1)
            fields[key.decode()] = int(value.split()[0]) * _KIB
    return fields if "VmRSS" in fields else None


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, over all its threads (needs CONFIG_PROC_CHILDREN, as on Debian)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _tree(pid: int) -> list[int]:
    seen, stack = [], [pid]
    while stack:
        p = stack.pop()
        seen.append(p)
        stack.extend(_children(p))
    return seen


def run_measured(cmd: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None,
                 poll_interval_s: float = POLL_INTERVAL_S) -> Measurement:
    """Run `cmd` to completion; return its wall time, peak tree RSS / anonymous memory and output.

    `env` replaces the environment when given (pass ``{**os.environ, ...}`` to extend it). stdout and
    stderr go to temporary files, not pipes, so a chatty command never blocks on a full pipe.
    Never raises for a failing command: look at ``returncode`` (or call ``.check()``).
    """
    parent_hwm = (_status_fields(os.getpid()) or {}).get("VmHWM", 0)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=dict(env) if env else None,
                                cwd=cwd)
        peak_rss = peak_anon = peak_hwm = samples = 0
        pids_seen: set[int] = set()
        while True:
            rss = anon = 0
            for pid in _tree(proc.pid):
                fields = _status_fields(pid)
                if fields is None:
                    continue
                pids_seen.add(pid)
                rss += fields["VmRSS"]
                anon += fields.get("RssAnon", 0)
                peak_hwm = max(peak_hwm, fields.get("VmHWM", 0))
            samples += 1
            peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
            # wait4 on this pid alone: the rusage is this child's (and what it reaped), not that of
            # every child this Python process ever had, as RUSAGE_CHILDREN would be.
            waited, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if waited == proc.pid:
                wall = time.perf_counter() - start
                break
            time.sleep(poll_interval_s)
        proc.returncode = os.waitstatus_to_exitcode(status)
        ru_maxrss = usage.ru_maxrss * _KIB  # Linux reports KiB
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    ru_valid = ru_maxrss > parent_hwm
    return Measurement(
        wall_s=wall,
        peak_rss_bytes=max(peak_rss, peak_hwm, ru_maxrss if ru_valid else 0),
        peak_anon_bytes=peak_anon,
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        sampled_peak_rss_bytes=peak_rss,
        ru_maxrss_bytes=ru_maxrss,
        ru_maxrss_valid=ru_valid,
        cpu_s=usage.ru_utime + usage.ru_stime,
        samples=samples,
        processes_seen=len(pids_seen),
    )


def children_maxrss_bytes() -> int:
    """``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in bytes: the largest RSS of any child this process
    has ever reaped (with the spawn inflation described above). Only a cross-check across a whole
    run; per command, use ``Measurement.ru_maxrss_bytes``."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * _KIB


def warm_page_cache(paths: Iterable[str | os.PathLike], chunk_bytes: int = 16 << 20) -> int:
    """Read every file under `paths` (files or folders, recursively) once; return bytes read.

    Makes the first measured run as warm as the later ones, so that all of them time the tools and
    not the disk. Needs free memory for the files to stay cached.
    """
    total = 0
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    for path in _files(paths):
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def _files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out = []
    for root in map(Path, paths):
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out.extend(sorted(p for p in root.rglob("*") if p.is_file()))
    return out


def evict_page_cache(paths: Iterable[str | os.PathLike]) -> int:
    """Drop every file under `paths` from the page cache (``posix_fadvise(DONTNEED)``, after ``os.sync()`` so
    that its pages are clean and can go); return bytes advised. A benchmark that writes model-sized outputs
    evicts each after its run, so that outputs never push the inputs out of memory (a later run would read
    them from disk). A no-op where ``posix_fadvise`` is missing."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    os.sync()
    total = 0
    for path in _files(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


@dataclasses.dataclass(frozen=True)
class Stat:
    """Minimum and median of one quantity over repeated runs."""

    min: float
    median: float
    values: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Summary:
    """Min and median of wall time, CPU time and memory over repeated runs of one command."""

    runs: int
    wall_s: Stat
    cpu_s: Stat
    peak_rss_bytes: Stat
    peak_anon_bytes: Stat

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _stat(values: Sequence[float]) -> Stat:
    return Stat(min=min(values), median=statistics.median(values), values=tuple(values))


def summarize(measurements: Sequence[Measurement]) -> Summary:
    """Min and median of each quantity over `measurements` (all must have succeeded)."""
    if not measurements:
        raise ValueError("summarize() needs at least one measurement")
    failed = [m.returncode for m in measurements if m.returncode != 0]
    if failed:
        raise ValueError(f"summarize() got failed runs (exit statuses {failed}); check() them first")
    return Summary(
        runs=len(measurements),
        wall_s=_stat([m.wall_s for m in measurements]),
        cpu_s=_stat([m.cpu_s for m in measurements]),
        peak_rss_bytes=_stat([m.peak_rss_bytes for m in measurements]),
        peak_anon_bytes=_stat([m.peak_anon_bytes for m in measurements]),
    )


def best_of(n: int, fn: Callable[[], Measurement]) -> Summary:
    """Call `fn` `n` times in a row and return the min and median of each quantity.

    To compare two tools fairly on a noisy machine, alternate them instead (A, B, A, B, ...) and
    `summarize` each list: that spreads slow spells over both.
    """
    if n < 1:
        raise ValueError(f"best_of() needs n >= 1, got {n}")
    return summarize([fn() for _ in range(n)])


def gb(nbytes: float) -> str:
    """Bytes as decimal gigabytes, 2 decimals (the unit FACTS.md and mergekit's docs use)."""
    return f"{nbytes / 1e9:.2f} GB"
