"""Atomic file and folder writes: readers see the old version or the new one, never a half-written one.

Used by checkpoints, training runs, the report, the sweep's outputs and the feature cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vitlab.base.errors import FolderError, Placeholder, Setting

__all__ = ["atomic_write", "atomic_write_text", "new_file_mode", "temp_dir_beside", "replace_dir", "refuse_foreign_dir",
           "rmtree_quiet", "disk_full_named", "check_free_space", "is_disk_full", "sweep_stale_temps"]

#: what safetensors' Rust writer says of a full disk (its SafetensorError carries no errno)
_DISK_FULL_WORDS = ("os error 28", "No space left on device", "StorageFull", "os error 122", "Disk quota exceeded")


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk (or the user's quota) is full: an ``OSError`` with ``ENOSPC`` or ``EDQUOT``, or a
    safetensors ``SafetensorError`` whose message says so."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return type(e).__name__ == "SafetensorError" and any(w in str(e) for w in _DISK_FULL_WORDS)


def free_bytes(path: str | os.PathLike) -> int | None:
    """The bytes free to this user on the disk that holds ``path`` (or its nearest existing folder above); None where
    that cannot be read."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def check_free_space(path: str | os.PathLike, needed: int) -> None:
    """Refuse, before anything is written, a write of ``needed`` bytes to ``path`` that the disk has no room for: a
    ``DiskFullError`` naming the path, the bytes needed and the bytes free."""
    from vitlab.base.errors import DiskFullError

    free = free_bytes(path)
    if free is not None and needed > free:
        raise DiskFullError(str(path), needed, free)


@contextlib.contextmanager
def disk_full_named(path: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Turn a full disk met inside the block (``is_disk_full``: an ``OSError`` ENOSPC, safetensors' own error) into
    one ``DiskFullError`` naming ``path`` (what the user asked for, never a temporary name), ``needed`` bytes and
    the bytes free. An inner ``DiskFullError`` is renamed to ``path`` the same way."""
    from vitlab.base.errors import DiskFullError

    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        needed = getattr(e, "needed", None) or needed
        raise DiskFullError(str(path), needed, free_bytes(path)) from None


def refuse_foreign_dir(directory: Path, is_ours: Callable[[Path], bool], writer: str, earlier: str,
                       param: str) -> None:
    """Before ``writer`` replaces ``directory`` as a whole (``replace_dir``): refuse a file, or a non-empty folder
    that ``is_ours`` does not recognise as an ``earlier`` output of the same writer, whose contents would be
    deleted: a ``FolderError`` whose ``param`` is the argument that named the folder (e.g. ``out``)."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise FolderError(param, str(directory), problem=f"exists and is not a folder; {writer} writes a folder",
                          fix=[Setting(param, Placeholder("NEW_FOLDER"))])
    if any(directory.iterdir()) and not is_ours(directory):
        raise FolderError(param, str(directory), problem=f"a non-empty folder that holds no {earlier}; {writer} "
                          "replaces the whole folder", fix=[Setting(param, Placeholder("NEW_OR_EMPTY_FOLDER")),
                                                            f"an {earlier}'s folder"])


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it (/proc/self/status); elsewhere by
    setting and restoring it, which another thread could observe for an instant."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], object], needed: int | None = None) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place in one step:
    readers see the old file or the new one, never a half-written one; on error nothing is left behind. A full disk
    is a ``DiskFullError`` naming ``path``; with ``needed`` (bytes) it is refused before anything is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if needed is not None:
        check_free_space(path, needed)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # named by the file asked for, not the temporary name (a read-only folder)
        raise type(e)(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    try:
        with disk_full_named(path, needed):
            write(tmp)
            os.chmod(tmp, new_file_mode())  # mkstemp makes 0600; the result should read like any new file
            _fsync(Path(tmp))  # on disk before the rename makes it the file: a power loss leaves old or new, not empty
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``atomic_write`` of a text file, in UTF-8 whatever the locale (a Latin-1 or C locale would refuse non-ASCII
    text after the work that made it)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def new_file_mode() -> int:
    """The mode a new file gets from ``open``: 0666 less the umask (for files a writer creates private, such as
    ``mkstemp``'s or safetensors' 0600, that should read like any other new file)."""
    return 0o666 & ~_umask()


def _host() -> str:
    """This machine's name as a temporary folder's name carries it (letters, digits and '-')."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists; anything else: assume it does
        return True
    return True


#: ``temp_dir_beside``'s names: ``.NAME.tmp.PID@HOST.RANDOM`` (the writer's process and machine), or before the owner
#: was recorded ``.NAME.tmp.RANDOM`` (mkdtemp's 8 characters)
_OWNED = re.compile(r"(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9-]+)\.[A-Za-z0-9_]+")
_UNOWNED = re.compile(r"[A-Za-z0-9_]{8}")
#: how old an unowned temporary folder must be to be swept: no save takes that long, so its writer is gone
UNOWNED_TEMP_AGE_S = 24 * 3600


def sweep_stale_temps(directory: Path) -> list[Path]:
    """Remove the temporary folders beside ``directory`` (``.NAME.tmp.*``) whose writer is gone: a kill -9 (or a power
    loss) leaves them, full of weights, where no clean-up ran. A folder is swept only when the process it names ran
    on this machine and no longer runs, or, one named before the owner was recorded, when it is more than
    ``UNOWNED_TEMP_AGE_S`` old; a live writer's (here or on another machine sharing the disk) is never touched.
    Returns the folders removed."""
    directory = Path(directory)
    prefix = f".{directory.name}.tmp."
    removed = []
    try:
        candidates = [p for p in directory.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    host, now = _host(), time.time()
    for p in candidates:
        rest = p.name[len(prefix):]
        try:
            if p.is_symlink() or not p.is_dir():
                continue
            if m := _OWNED.fullmatch(rest):
                stale = m["host"] == host and int(m["pid"]) != os.getpid() and not _alive(int(m["pid"]))
            else:
                stale = _UNOWNED.fullmatch(rest) is not None and now - p.stat().st_mtime > UNOWNED_TEMP_AGE_S
        except OSError:
            continue
        if stale:
            rmtree_quiet(p)
            removed.append(p)
    return removed


def temp_dir_beside(directory: Path) -> Path:
    """A new temporary folder beside ``directory``, to fill and then move into place with ``replace_dir``, named
    ``.NAME.tmp.PID@HOST.RANDOM`` after its writer; those of writers that are gone are swept first
    (``sweep_stale_temps``). It gets 0777 less the umask, as any new folder (``mkdtemp`` makes it private, and a
    fixed 0755 would ignore a stricter umask such as 027)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(directory)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp.{os.getpid()}@{_host()}.", dir=directory.parent))
    except OSError as e:  # named by the folder asked for, not the temporary name (a read-only parent)
        raise type(e)(e.errno, e.strerror, str(directory)) from None
    try:
        tmp.chmod(0o777 & ~_umask())
    except BaseException:
        rmtree_quiet(tmp)
        raise
    return tmp


def _fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to disk (where the platform lets a folder be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_dir(tmp: Path, directory: Path) -> None:
    """Move ``tmp`` to ``directory`` by renames; on failure the previous ``directory`` is restored. Every file of
    ``tmp`` is flushed to disk first (``os.fsync``; on Linux that reaches the disk, on macOS it may stay in the
    drive's cache, on Windows folders cannot be flushed), so a power loss after the swap should not leave empty
    files in ``directory``."""
    for f in sorted(Path(tmp).rglob("*")):
        if f.is_file():
            _fsync(f)
    _fsync(Path(tmp))
    old = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
        old.rmdir()  # only the unique name is wanted: os.replace needs the target not to exist
        os.replace(directory, old)
    try:
        os.replace(tmp, directory)
    except BaseException:
        if old is not None and not directory.exists():
            os.replace(old, directory)
        raise
    _fsync(directory.parent)
    for stale in directory.parent.glob(f".{directory.name}.old.*"):  # the copy just replaced, and any an earlier
        rmtree_quiet(stale)  # clean-up cut short left behind


def recover_dir(directory: Path, rank: Callable[[Path], Any]) -> bool:
    """After a kill between ``replace_dir``'s two renames ``directory`` is missing and its previous version waits
    as ``.NAME.old.*`` beside it: move back the copy ``rank`` puts highest, among those it does not rank ``None``
    (a clean-up cut short leaves incomplete ones). True when one was restored."""
    directory = Path(directory)
    if directory.exists():
        return False
    ranked = [(r, p) for p in directory.parent.glob(f".{directory.name}.old.*") if (r := rank(p)) is not None]
    if not ranked:
        return False
    chosen = max(ranked, key=lambda rp: rp[0])[1]
    os.replace(chosen, directory)
    import warnings

    warnings.warn(RecoveredWarning(str(directory), chosen.name), stacklevel=3)
    return True


class RecoveredWarning(UserWarning):
    """``recover_dir`` put back ``path`` from ``aside`` (the ``.NAME.old.*`` copy a kill between ``replace_dir``'s
    two renames left): the write that was replacing it did not finish, so ``path`` holds the previous version."""

    def __init__(self, path: str, aside: str) -> None:
        self.path, self.aside = path, aside
        super().__init__(f"{path} was missing: restored it from {aside}, the previous version a kill left aside "
                         "while it was being replaced; the replacement did not finish, so write it again if needed")


def rmtree_quiet(path: Path) -> None:
    """Remove a folder tree, ignoring errors (temporary folders)."""
    shutil.rmtree(path, ignore_errors=True)
