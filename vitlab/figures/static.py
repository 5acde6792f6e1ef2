"""Static figure export: plotly figures to PNG/SVG through kaleido and a local Chromium (never downloaded)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["find_chromium", "no_chromium_reason", "chromium_for_export", "write_images"]


def find_chromium() -> str | None:
    """A Chrome/Chromium for static export: $BROWSER_PATH, then the usual executables on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file() and os.access(env, os.X_OK):
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def no_chromium_reason() -> str:
    """Why ``find_chromium`` found none, and the fix: a ``BROWSER_PATH`` set to nothing that runs is named."""
    env = os.environ.get("BROWSER_PATH")
    if env:  # set, but to nothing that runs: say so, not that it is unset
        return (f"BROWSER_PATH={env} is no executable file and no Chromium is on PATH (point BROWSER_PATH at a "
                "Chrome/Chromium, or install Debian's chromium)")
    return "no Chromium found (install Debian's chromium, or set BROWSER_PATH)"


@contextlib.contextmanager
def chromium_for_export(browser: str) -> Iterator[str]:
    """``BROWSER_PATH`` (where kaleido's choreographer looks first) set to ``browser`` inside the block only."""
    previous = os.environ.get("BROWSER_PATH")
    os.environ["BROWSER_PATH"] = browser
    try:
        yield browser
    finally:
        if previous is None:
            os.environ.pop("BROWSER_PATH", None)
        else:
            os.environ["BROWSER_PATH"] = previous


def write_images(figures: Sequence[object], paths: Sequence[str | os.PathLike], scale: float = 1.0) -> str:
    """Write each plotly figure to its path (.png, .svg, ... by suffix) when a Chromium is found.

    Returns what happened, one line (for metrics and logs): written, skipped (and why) or failed; a full disk is no
    such outcome but a ``DiskFullError`` naming the first path. Each image is drawn into a temporary file beside its
    path and all are moved into place once every one is drawn: on failure (or an interrupt) no partial image is left
    behind and a file already at a path stays as it was."""
    browser = find_chromium()
    if browser is None:
        return f"skipped: {no_chromium_reason()}"
    try:
        import kaleido  # noqa: F401
        import plotly.io as pio
    except ImportError as e:
        return f"skipped: {e}"
    figures, paths = list(figures), [Path(p) for p in paths]
    # each image at its figure's own layout size (kaleido would otherwise draw every figure at 700 x 500)
    widths = [getattr(f.layout, "width", None) or 700 for f in figures]
    heights = [getattr(f.layout, "height", None) or 500 for f in figures]
    tmps = [p.with_name(f".{p.name}.{secrets.token_hex(4)}.tmp{p.suffix}") for p in paths]  # kaleido reads the suffix
    try:
        for p in paths:  # kaleido writes nothing, and says nothing, into a folder that does not exist
            p.parent.mkdir(parents=True, exist_ok=True)
        with chromium_for_export(browser):
            pio.write_images(figures, [str(t) for t in tmps], scale=scale, width=widths, height=heights)
        missing = [str(p) for t, p in zip(tmps, paths) if not t.is_file()]
        if missing:
            raise RuntimeError(f"kaleido wrote no image for {', '.join(missing)}")
        for t, p in zip(tmps, paths):
            os.replace(t, p)
    except BaseException as e:
        for t in tmps:
            t.unlink(missing_ok=True)
        if not isinstance(e, Exception):
            raise
        from vitlab.base.atomic import disk_full_named, is_disk_full

        if is_disk_full(e):  # no room: the caller's other outputs would not fit either, so not a figure's failure
            with disk_full_named(paths[0]):
                raise
        return f"failed: {type(e).__name__}: {e}"  # a broken browser must not cost the caller its other outputs
    return f"written with {browser}"
