"""``vitlab cache``: list what vitlab caches (decoded images, features) and prune it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vitlab.base.choices import CACHE_KINDS
from vitlab.cli.args import non_negative_float

NAME = 'cache'
HELP = 'list what vitlab caches (decoded images, features) and prune it'
DESCRIPTION = 'Without an action: list (the cache root is $VITLAB_CACHE or ~/.cache/vitlab).'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(action="list")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="each entry's kind, size, last use and file, with totals (the default)")
    pp = actions.add_parser("prune", help="remove whole cache entries: those unused for DAYS days, or all; never "
                            "training runs, results, or a file a writer may still be filling")
    which = pp.add_mutually_exclusive_group(required=True)
    which.add_argument("--older-than", type=non_negative_float, metavar="DAYS",
                       help="remove the entries last used (written or read) more than DAYS days ago")
    which.add_argument("--all", action="store_true", help="remove every entry of the chosen kinds")
    pp.add_argument("--kind", choices=CACHE_KINDS, help="only this cache (default: both)")
    pp.add_argument("--dry-run", action="store_true", help="remove nothing: list what would be removed")


def _size_words(n: int) -> str:
    """Bytes in decimal units (``154.0 MB``), as ``du -h --si`` and the README count them."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if float(shown := f"{n / scale:.1f}") < 1000 or unit == "GB":  # 999,950 B is 1.0 MB, not 1000.0 kB
            return f"{shown} {unit}"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _age_words(seconds: float) -> str:
    """How long ago, in the unit ``--older-than`` takes beyond a day (``3.2 days ago``)."""
    seconds = max(0.0, seconds)
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def _entry_rows(entries, root: Path, now: float) -> list[str]:
    """One aligned line per cache entry: kind, size, last used, file name (relative to the cache root), detail."""
    rows = [(e.kind, _size_words(e.size), _age_words(now - e.last_used), e.path.relative_to(root).as_posix(),
             "unfinished write" if e.temp else e.detail) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + f"  {r[4]}".rstrip() for r in rows]


def run(args: argparse.Namespace) -> int:
    import time

    from vitlab.data.cache import KINDS, TEMP_GRACE_S, prune_cache, scan_cache
    from vitlab.data.datasets import cache_dir

    now = time.time()
    root = cache_dir()
    where = f"{root} (VITLAB_CACHE)" if os.environ.get("VITLAB_CACHE") else f"{root} (set VITLAB_CACHE to move it)"
    if args.action == "prune":
        kinds = (args.kind,) if args.kind else KINDS
        result = prune_cache(args.older_than, kinds, everything=args.all, dry_run=args.dry_run, now=now)
        verb = "would remove" if args.dry_run else "removed"
        print(f"cache root: {where}")
        if result.removed:
            print(f"{verb} {_files(len(result.removed))}, {_size_words(result.freed)}:")
            print("\n".join("  " + r for r in _entry_rows(result.removed, root, now)))
        else:
            print(f"nothing to prune: no {' or '.join(kinds)} entry"
                  + ("" if args.all else f" last used more than {args.older_than:g} days ago"))
        if result.busy:
            print(f"kept {len(result.busy)} temporary file(s) younger than an hour (a writer may be filling them)")
        if args.dry_run and result.removed:
            print("nothing removed (--dry-run)")
        for e, why in result.failed:
            print(f"vitlab cache: could not remove {e.path}: {why}; check the cache folder's permissions",
                  file=sys.stderr)
        return 1 if result.failed else 0
    scan = scan_cache(root)
    print(f"cache root: {where}")
    if not scan.exists:
        print("nothing cached yet (the folder does not exist)")
        return 0
    if scan.entries:
        print("\n".join(_entry_rows(scan.entries, root, now)))
    totals = "; ".join(f"{k}: {_files(sum(e.kind == k for e in scan.entries))}, {_size_words(scan.size(k))}"
                       for k in KINDS)
    young = [e for e in scan.entries if e.temp and now - e.last_used < TEMP_GRACE_S]  # a writer may be filling them
    keeps = f", but for {_files(len(young))} a writer may still be filling" if young else ""
    print(f"{totals}; total {_size_words(scan.size())} (vitlab cache prune --all frees it{keeps})")
    print(f"runs/ (training runs: not a cache, never pruned): {_size_words(scan.runs_size)}")
    print(f"other files (results, logs, downloads: never pruned): {_size_words(scan.other_size)}")
    return 0
