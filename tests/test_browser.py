"""A real browser: Chromium (through Playwright) opens the explorer served by Voila, moves the layer slider and
sees the heatmap change. Skipped only where Chromium or Playwright is missing; `.ci/run` installs Chromium."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from vitlab.static import find_chromium

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")]
SHOTS = Path(__file__).resolve().parent.parent / "out" / "screenshots"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


HEATMAP_Z = """() => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  for (const p of plots) { for (const t of (p.data || [])) { if (t.type === 'heatmap') return JSON.stringify(t.z); } }
  return null;
}"""


def test_layer_slider_changes_the_heatmap_in_chromium(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    from vitlab.app import serve

    port = _free_port()
    proc = serve(port=port, num_images=2)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", 120)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(f"http://127.0.0.1:{port}/", timeout=180_000)
            page.wait_for_function(HEATMAP_Z, timeout=180_000)
            before = page.evaluate(HEATMAP_Z)
            handle = page.locator(".widget-slider .noUi-handle").first
            handle.focus()
            page.keyboard.press("Home")  # layer slider to layer 1 (it starts at the last layer)
            page.wait_for_function(f"() => ({HEATMAP_Z})() !== {json.dumps(before)}", timeout=60_000)
            after = page.evaluate(HEATMAP_Z)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "explorer_layer1.png"))
            page.screenshot(path=str(tmp_path / "explorer.png"))
            browser.close()
        assert json.loads(after) != json.loads(before)
        assert (tmp_path / "explorer.png").stat().st_size > 10_000
    finally:
        proc.terminate()
        proc.wait(timeout=30)
