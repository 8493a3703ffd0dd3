"""Files on a researcher's machine: atomic writes, stale temporaries, free space, path kinds, OS errors.

Every writer of graftkit fills a temporary sibling named ``.NAME.tmp-PID`` (PID: the writing process),
fsyncs it, renames it into place and fsyncs the folder, so the rename itself survives a power cut
(:func:`write_atomic`, :func:`fsync_dir`). A killed process leaves its temporary behind; the next writer
into the same folder removes the temporaries whose PID no longer runs and says how many and how large
(:func:`sweep_stale`); ``graftkit clean`` does the same for a whole run (:func:`find_stale`). A temporary
whose PID runs is never touched.

Writers whose output size is known check free space first (:func:`check_space`); long work checks that
its destination can be written before it starts (:func:`check_writable`). A destination of the wrong
kind (a folder where a file goes, a file where a folder is needed) is refused before anything is
written (:func:`check_file_dest`, :func:`check_folder_dest`). What the operating system throws anyway
(a full disk, a read-only file system, a permission) becomes one :class:`GraftkitError` naming the file
and the fix (:func:`os_error`, :func:`translated`). This module is a leaf: every package may import it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import GraftkitError

#: A temporary sibling: ``.NAME.tmp-PID`` (``.NAME.tmp-PID.png`` where a tool needs the suffix), and the
#: ``.NAME.old-PID`` a folder replace parks the previous output under for one rename.
TEMP = re.compile(r"\.(?P<name>.+)\.(?P<what>tmp|old)-(?P<pid>\d+)(?:\.[A-Za-z0-9]{1,8})?")
#: Room left beside a known output size: file-system blocks and metadata.
SLACK_BYTES = 64 << 10


def fmt_size(n: float) -> str:
    """A byte count in binary units (B, KiB, MiB, GiB, TiB): the one size format of the command line."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def temp_path(path: str | os.PathLike, suffix: str = "") -> Path:
    """This process's temporary sibling of ``path``: ``.NAME.tmp-PID`` (plus ``suffix``)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}{suffix}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one of another user counts as running)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Stale:
    """A temporary left by a process that no longer runs."""

    path: Path
    pid: int
    nbytes: int


def _tree_bytes(path: Path) -> int:
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
    except OSError:
        return 0


def stale_temps(folder: str | os.PathLike) -> list[Stale]:
    """The temporaries directly in ``folder`` whose PID is gone. A parked ``.NAME.old-PID`` counts only
    where ``NAME`` exists again (otherwise it is the only copy of an earlier output and is left alone)."""
    folder = Path(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        m = TEMP.fullmatch(name)
        if m is None or pid_alive(int(m["pid"])):
            continue
        if m["what"] == "old" and not (folder / m["name"]).exists():
            continue
        p = folder / name
        found.append(Stale(p, int(m["pid"]), _tree_bytes(p)))
    return found


def find_stale(root: str | os.PathLike) -> list[Stale]:
    """Every stale temporary under ``root`` (not looking inside the temporaries themselves)."""
    root = Path(root)
    found = stale_temps(root)
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if TEMP.fullmatch(d) is None)
        for d in dirnames:
            found += stale_temps(Path(dirpath) / d)
    return found


def remove(stale: Stale) -> bool:
    """Remove one stale temporary; False where it went already or cannot be removed."""
    try:
        if stale.path.is_dir() and not stale.path.is_symlink():
            shutil.rmtree(stale.path)
        else:
            stale.path.unlink()
    except FileNotFoundError:
        return False
    except OSError:
        return False
    return True


def say(line: str) -> None:
    sys.stderr.write(line + "\n")


def removed_line(removed: list[Stale], folder: str | os.PathLike) -> str:
    n = len(removed)
    return (f"removed {n} stale {'temporary' if n == 1 else 'temporaries'} "
            f"({fmt_size(sum(s.nbytes for s in removed))}) in {folder}")


def sweep_stale(folder: str | os.PathLike, report: Callable[[str], None] = say) -> list[Stale]:
    """Remove the stale temporaries in ``folder`` (a writer calls it before it writes there) and report
    them in one line; returns what was removed."""
    removed = [s for s in stale_temps(folder) if remove(s)]
    if removed:
        report(removed_line(removed, folder))
    return removed


# ------------------------------------------------------------------------------------- preflight


def require(path: str | os.PathLike, flag: str | None = None, expected: str = "a file or folder") -> Path:
    """``path`` when it exists, else one error: which path, what was ``expected`` there, and the fix naming
    ``flag``, the command's option (or argument) that took it (None outside a command)."""
    if not Path(path).exists():
        raise GraftkitError(f"{path}: no such file or folder (expected {expected})",
                            f"check the path given to {flag}" if flag else "check the path")
    return Path(path)


def existing_ancestor(path: str | os.PathLike) -> Path:
    """``path`` itself or its nearest ancestor that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _dest_flag(flag: str | None, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _elsewhere(flag: str | None, kind: str = "output") -> str:
    return f"choose another {flag}" if flag else f"choose another {kind} location"


def check_file_dest(path: str | os.PathLike, flag: str | None = None, example: str | None = None) -> Path:
    """Refuse a file destination that is a folder, or whose parent path runs through a file."""
    path = Path(path)
    if path.is_dir():
        raise GraftkitError(f"{_dest_flag(flag, path)} is a folder, not a file",
                            f"pass a file path, e.g. {path / example}" if example else "pass a file path")
    _check_parents(path, flag)
    return path


def check_folder_dest(path: str | os.PathLike, flag: str | None = None) -> Path:
    """Refuse a folder destination that is a file, or whose parent path runs through a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise GraftkitError(f"{_dest_flag(flag, path)} is a file, not a folder",
                            "pass a folder path (it is created), or remove the file")
    _check_parents(path, flag)
    return path


def _check_parents(path: Path, flag: str | None) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise GraftkitError(f"{_dest_flag(flag, path)}: {parent} is a file, not a folder",
                                    "choose a path whose parent folders are folders")
            return


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def check_space(dest: str | os.PathLike, nbytes: int, flag: str | None = None, what: str = "the output") -> None:
    """Refuse to start writing ``nbytes`` (plus :data:`SLACK_BYTES`) at ``dest`` where the disk lacks them."""
    dest = Path(dest)
    where = existing_ancestor(dest.parent)
    try:
        free = free_bytes(where)
    except OSError:
        return  # a file system that cannot say: the write itself reports a full disk
    if nbytes + SLACK_BYTES > free:
        raise GraftkitError(f"not enough free space for {what} {dest}: it needs {fmt_size(nbytes)}, "
                            f"{fmt_size(free)} are free on the file system of {where}",
                            f"free space there, or {_elsewhere(flag)}")


def check_writable(dest: str | os.PathLike, flag: str | None = None) -> None:
    """Prove that ``dest`` (a file or folder to be created) can be written, by creating and removing a
    temporary in its nearest existing folder; a read-only file system or a permission is refused here."""
    where = existing_ancestor(Path(dest).parent)
    probe = temp_path(where / ".graftkit-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise os_error(exc, Path(dest), flag) from None


# --------------------------------------------------------------------------------- OS errors


_REASONS = {
    errno.ENOSPC: ("no space left on the device", "free space there, or {elsewhere}"),
    errno.EDQUOT: ("disk quota exceeded", "free space in your quota, or {elsewhere}"),
    errno.EROFS: ("the file system is read-only", "{elsewhere} on a writable file system"),
    errno.EACCES: ("permission denied", "{elsewhere} you may write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "{elsewhere} you may write to, or fix its permissions"),
    errno.EISDIR: ("a folder stands where a file is needed", "pass a file path"),
    errno.ENOTDIR: ("a file stands where a folder is needed", "choose a path whose parent folders are folders"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.ENAMETOOLONG: ("the file name is too long", "choose a shorter path"),
    errno.EIO: ("input/output error (the disk or network storage failed)", "check the storage, then rerun"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n), then rerun"),
}
_H5_ERRNO = re.compile(r"errno = (\d+)")


def _errno_of(exc: OSError) -> int | None:
    if exc.errno is not None:
        return exc.errno
    m = _H5_ERRNO.search(str(exc))  # h5py's OSError carries the errno in its message only
    return int(m[1]) if m else None


def os_error(exc: OSError, path: str | os.PathLike | None = None, flag: str | None = None,
             doing: str = "writing") -> GraftkitError:
    """``exc`` as one line: what failed, on which file, and the fix (naming ``flag`` where given)."""
    code = _errno_of(exc)
    where = path if path is not None else getattr(exc, "filename", None)  # the destination, not its temporary
    what, fix = _REASONS.get(code, (None, "check the path and the storage, then rerun"))
    if what is None:
        what = (exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]).rstrip(".")
    fix = fix.format(elsewhere=_elsewhere(flag))
    target = f" {where}" if where else ""
    return GraftkitError(f"{doing}{target} failed: {what}", fix)


@contextlib.contextmanager
def translated(path: str | os.PathLike | None = None, flag: str | None = None, doing: str = "writing") -> Iterator[None]:
    """Turn an ``OSError`` the operating system raised inside (one with an errno) into :func:`os_error`; a
    GraftkitError passes through."""
    try:
        yield
    except OSError as exc:
        if _errno_of(exc) is None:
            raise  # no errno: not the operating system's word (the command line still says it in one line)
        raise os_error(exc, path, flag, doing) from None


# ------------------------------------------------------------------------------------ writing


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename into ``folder`` durable (a file system that cannot fsync a folder is skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data, pos: int = 0) -> int:
    """``pwrite`` all of ``data`` at ``pos``; returns the bytes written."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], pos + done)
    return done


def write_atomic(path: str | os.PathLike, data: bytes | str, *, flag: str | None = None,
                 example: str | None = None, what: str = "the output") -> Path:
    """Write ``data`` to ``path`` atomically: stale temporaries of the folder swept, the destination's
    kind and the free space checked, a temporary sibling written and fsynced, renamed into place, the
    folder fsynced. On any failure the temporary is removed and ``path`` is as it was."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    check_file_dest(path, flag, example)
    with translated(path, flag):
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(path.parent)
        check_space(path, len(raw), flag, what)
        tmp = temp_path(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, raw)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(path.parent)
    return path
