"""Atomic file and folder writes: readers see the old version or the new one, never a half-written one.

Used by checkpoints, training runs, the report, the sweep's outputs and the feature cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text", "replace_dir", "rmtree_quiet"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place in one step:
    readers see the old file or the new one, never a half-written one; on error nothing is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any new file
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``atomic_write`` of a text file."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def replace_dir(tmp: Path, directory: Path) -> None:
    """Move ``tmp`` to ``directory`` by renames; on failure the previous ``directory`` is restored."""
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
    if old is not None:
        rmtree_quiet(old)


def rmtree_quiet(path: Path) -> None:
    """Remove a folder tree, ignoring errors (temporary folders)."""
    shutil.rmtree(path, ignore_errors=True)
