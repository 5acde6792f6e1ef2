"""Static figure export: plotly figures to PNG/SVG through kaleido and a local Chromium (never downloaded)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["find_chromium", "chromium_for_export", "write_images"]


def find_chromium() -> str | None:
    """A Chrome/Chromium for static export: $BROWSER_PATH, then the usual executables on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).exists():
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


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

    Returns what happened, one line (for metrics and logs): written, skipped (and why) or failed; on failure
    no partial image is left behind."""
    browser = find_chromium()
    if browser is None:
        return "skipped: no Chromium found (install Debian's chromium, or set BROWSER_PATH)"
    try:
        import kaleido  # noqa: F401
        import plotly.io as pio
    except ImportError as e:
        return f"skipped: {e}"
    figures = list(figures)
    # each image at its figure's own layout size (kaleido would otherwise draw every figure at 700 x 500)
    widths = [getattr(f.layout, "width", None) or 700 for f in figures]
    heights = [getattr(f.layout, "height", None) or 500 for f in figures]
    try:
        with chromium_for_export(browser):
            pio.write_images(figures, [str(p) for p in paths], scale=scale, width=widths, height=heights)
    except Exception as e:  # noqa: BLE001 - a broken browser must not cost the caller its other outputs
        for p in paths:
            Path(p).unlink(missing_ok=True)
        return f"failed: {type(e).__name__}: {e}"
    return f"written with {browser}"
