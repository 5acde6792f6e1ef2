"""What vitlab keeps in its cache folder, and pruning it (``vitlab cache``; ``pip cache`` in spirit).

Two caches hold what vitlab can compute again: decoded images (``images-SOURCE-KEY.npz`` in the cache root, one
per data set file version and decode setting) and frozen features (``features/KEY[-READOUT][-vN].safetensors``).
Each hit refreshes an entry's modification time (``vitlab.data.datasets.touch_cache``), so an entry's age is the time since
it was last used. Only files named as those two caches name theirs are listed or removed; training runs
(``runs/``) and anything else in the root are measured, never touched. Both caches write through a temporary file
beside the entry (``.NAME.RANDOM.tmp``, ``vitlab.base.atomic.atomic_write``) renamed into place: a temporary file is
left alone until it is ``TEMP_GRACE_S`` old (a writer may still be filling it), then it is an unfinished write's
leftover and pruned as an entry.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import time
import zipfile
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

from vitlab.base.choices import CACHE_KINDS
from vitlab.data.datasets import cache_dir

__all__ = ["CacheEntry", "CacheScan", "PruneResult", "KINDS", "TEMP_GRACE_S", "scan_cache", "prune_cache"]

#: the caches ``vitlab cache`` lists and prunes
KINDS = CACHE_KINDS
#: a temporary file younger than this may be one another process is writing: never removed
TEMP_GRACE_S = 3600.0

_ENTRY = {"images": re.compile(r"images-(?:[0-9a-f]{8}-)?[0-9a-f]{16}\.npz"),  # older entries: images-KEY.npz
          "features": re.compile(r"[0-9a-f]{32}(?:-[a-z_]+)?(?:-v\d+)?\.safetensors")}
_TEMP = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")  # atomic_write's mkstemp(prefix=".NAME.", suffix=".tmp")


@dataclass(frozen=True)
class CacheEntry:
    """One file of a cache: ``kind`` (``images`` or ``features``), its ``path``, ``size`` in bytes, ``last_used``
    (POSIX seconds: written or last read), ``temp`` (an unfinished write), ``detail`` (what the file records of
    itself, read from its header: images' count and size, features' readout, data source and count; "" if none)."""

    kind: str
    path: Path
    size: int
    last_used: float
    temp: bool = False
    detail: str = ""


@dataclass(frozen=True)
class CacheScan:
    """The cache folder ``root`` (``exists``: False when nothing was ever cached), its ``entries`` (by kind, the
    least recently used first), and the bytes of what is not a cache: ``runs_size`` (training runs, ``runs/``)
    and ``other_size`` (anything else: results, downloads, files vitlab does not name)."""

    root: Path
    exists: bool
    entries: tuple[CacheEntry, ...]
    runs_size: int
    other_size: int

    def size(self, kind: str | None = None) -> int:
        """Bytes of the entries of ``kind`` (all kinds for None)."""
        return sum(e.size for e in self.entries if kind is None or e.kind == kind)


@dataclass(frozen=True)
class PruneResult:
    """What ``prune_cache`` removed (or, with ``dry_run``, would remove), the temporary files it left because a
    writer may still be filling them (``busy``), and the entries it could not remove with the reason (``failed``)."""

    removed: tuple[CacheEntry, ...]
    busy: tuple[CacheEntry, ...]
    failed: tuple[tuple[CacheEntry, str], ...]
    dry_run: bool

    @property
    def freed(self) -> int:
        """Bytes removed (with ``dry_run``: that would be)."""
        return sum(e.size for e in self.removed)


def _kind_of(folder: str, name: str) -> tuple[str, bool] | None:
    """(kind, is a temporary file) of a file named ``name`` in the cache root (``folder`` "") or ``features/``;
    None for a file neither cache names so."""
    temp = _TEMP.fullmatch(name)
    base = temp.group("name") if temp else name
    kind = "images" if folder == "" else "features"
    return (kind, temp is not None) if _ENTRY[kind].fullmatch(base) else None


def _images_detail(path: Path) -> str:
    """'N images HxW' from the header of the npz's images array (no pixel is read); "" where unreadable."""
    import numpy as np

    try:
        with zipfile.ZipFile(path) as z, z.open("images.npy") as f:
            version = np.lib.format.read_magic(f)
            shape = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                     else np.lib.format.read_array_header_2_0(f))[0]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return ""
    return f"{shape[0]} images {shape[1]}x{shape[2]}" if len(shape) == 4 else ""


def _features_detail(path: Path) -> str:
    """'READOUT, SOURCE, n=N' from the safetensors header (its metadata; no tensor is read); "" where unreadable."""
    readout = "patch_mean" if "-patch_mean" in path.name else "model"
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 1 << 16:  # one tensor's header is about 200 bytes: not a features file
                return ""
            meta = json.loads(f.read(n)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error, AttributeError):
        return ""
    return ", ".join([readout] + [f"{meta['source']}"] * ("source" in meta) + [f"n={meta['n']}"] * ("n" in meta))


def _tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed); 0 when it is missing."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def scan_cache(root: str | os.PathLike | None = None) -> CacheScan:
    """The entries of vitlab's two caches under ``root`` (default ``vitlab.data.datasets.cache_dir()``: ``$VITLAB_CACHE``
    or ``~/.cache/vitlab``). A missing root is an empty scan; a root that is a file is a ``NotADirectoryError``.
    A ``features/`` that is a link to a folder elsewhere is not entered (a ``SkippedPathWarning``): what it holds is
    outside the cache, and ``prune_cache`` must never delete it."""
    root = Path(root) if root is not None else cache_dir()
    if not root.exists():
        return CacheScan(root, False, (), 0, 0)
    if not root.is_dir():
        raise NotADirectoryError(f"vitlab's cache folder {root} is a file, not a folder: set VITLAB_CACHE to a "
                                 "folder (or move the file away)")
    entries = []
    for folder in ("", "features"):
        d = root / folder
        if folder and d.is_symlink():  # its files live outside the cache: never listed, never pruned
            import warnings

            from vitlab.data.datasets import SkippedPathWarning

            warnings.warn(SkippedPathWarning(str(d), "folder link", f"to {os.readlink(d)}: its files lie outside "
                                             "the cache and are neither listed nor pruned"), stacklevel=2)
            continue
        if not d.is_dir():
            continue
        for p in d.iterdir():
            try:
                st = p.lstat()
            except OSError:  # removed meanwhile
                continue
            kind = _kind_of(folder, p.name) if stat.S_ISREG(st.st_mode) else None
            if kind is not None:
                detail = "" if kind[1] else _images_detail(p) if kind[0] == "images" else _features_detail(p)
                entries.append(CacheEntry(kind[0], p, st.st_size, st.st_mtime, kind[1], detail))
    entries.sort(key=lambda e: (KINDS.index(e.kind), e.last_used, e.path.name))
    runs = _tree_size(root / "runs")
    other = max(0, _tree_size(root) - runs - sum(e.size for e in entries))  # features/ a link: not walked
    return CacheScan(root, True, tuple(entries), runs, other)


def prune_cache(older_than_days: float | None = None, kinds: tuple[str, ...] = KINDS, *, everything: bool = False,
                dry_run: bool = False, root: str | os.PathLike | None = None, now: float | None = None) -> PruneResult:
    """Remove the entries of ``kinds`` last used more than ``older_than_days`` days ago, or with ``everything``
    all of them; whole files only, nothing outside the two caches, and never a temporary file younger than
    ``TEMP_GRACE_S`` (a writer may be filling it). ``dry_run``: remove nothing, say what would go. An entry used
    between the scan and its removal is kept."""
    if everything == (older_than_days is not None):
        raise ValueError("say which entries to prune: older_than_days=DAYS (last used more than DAYS days ago) or "
                         "everything=True" + (", not both" if everything else ""))
    if older_than_days is not None and (isinstance(older_than_days, bool) or not isinstance(older_than_days, Real)
                                        or not 0 <= older_than_days < float("inf")):  # True is no 1 day
        raise ValueError(f"older_than_days must be a number of days, 0 or more, got {older_than_days!r}")
    if isinstance(kinds, str):  # its letters are no kinds
        raise ValueError(f"kinds must be a tuple of cache kinds, got the text {kinds!r}: pass ({kinds!r},)")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be among {KINDS}, got {list(kinds)!r}")
    now = time.time() if now is None else now
    cutoff = float("inf") if everything else now - older_than_days * 86400  # all: a clock-skewed future time too
    removed, busy, failed = [], [], []
    for e in scan_cache(root).entries:
        if e.kind not in kinds or e.last_used > cutoff:
            continue
        if e.temp and now - e.last_used < TEMP_GRACE_S:
            busy.append(e)
            continue
        try:
            if os.lstat(e.path).st_mtime > cutoff:  # used since the scan
                continue
            if not dry_run:
                os.unlink(e.path)
        except FileNotFoundError:  # another process removed it first (a newer decode replacing it)
            continue
        except OSError as err:
            failed.append((e, err.strerror or str(err)))
            continue
        removed.append(e)
    return PruneResult(tuple(removed), tuple(busy), tuple(failed), dry_run)
