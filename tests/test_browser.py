"""A real browser: Chromium (through Playwright) opens the explorer served by Voila, checks that the first view,
before any interaction, shows the map vitlab.attention_maps gives, moves the layer slider and sees the heatmap
change; `vitlab app` stopped with SIGTERM takes its server down. Skipped only where Chromium or Playwright is
missing; `.ci/run` installs Chromium. Nothing is written into the working tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import free_port

from vitlab.figures.static import find_chromium

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")]


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


def _slide_to_layer_one(page, before: str, timeout: float) -> str:
    """Press Home on the layer slider (it starts at the last layer) and return the heatmap's z once the page shows
    another one. The wait ends on the first frame that shows the change; a key press that a busy page dropped (the
    handle focused before its view listened) is pressed again every few seconds, which changes nothing once the
    slider is at layer 1. TimeoutError after ``timeout`` seconds without a change."""
    from playwright.sync_api import TimeoutError as NoChangeYet

    changed = f"() => ({HEATMAP_Z})() !== {json.dumps(before)}"
    deadline = time.monotonic() + timeout
    while True:
        handle = page.locator(".widget-slider .noUi-handle").first
        handle.focus()
        page.keyboard.press("Home")
        try:
            page.wait_for_function(changed, timeout=5_000)
            return page.evaluate(HEATMAP_Z)
        except NoChangeYet:
            if time.monotonic() > deadline:
                raise


def test_layer_slider_changes_the_heatmap_in_chromium(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    from vitlab.app import new_token, page_url, serve, stop

    port, token = free_port(), new_token()
    proc = serve(port=port, num_images=2, token=token)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", 120)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(page_url(port, token), timeout=180_000)
            page.wait_for_function(HEATMAP_Z, timeout=180_000)
            before = page.evaluate(HEATMAP_Z)
            page.screenshot(path=str(tmp_path / "explorer_first_view.png"))
            after = _slide_to_layer_one(page, before, timeout=180)
            page.screenshot(path=str(tmp_path / "explorer.png"))
            browser.close()
        assert json.loads(after) != json.loads(before)
        assert (tmp_path / "explorer.png").stat().st_size > 10_000
        # the first view, before any interaction, is the readout's attention in the last layer, heads averaged,
        # for the first image, exactly as the library computes it (not an empty placeholder)
        import numpy as np

        import vitlab
        from vitlab.data.images import default_images
        from vitlab.inspect import attention_view

        model = vitlab.load_model()
        _, x, _ = default_images(model, 2)
        maps = vitlab.attention_maps(model, x[:1])
        expected = attention_view(maps, vitlab.model_info(model), "attention", None, "mean")[0].numpy()
        np.testing.assert_allclose(np.array(json.loads(before), dtype=float), expected, rtol=1e-4, atol=1e-6)
        # and after the slider moved: layer 1's map (not merely another one)
        layer_one = attention_view(maps, vitlab.model_info(model), "attention", 1, "mean")[0].numpy()
        np.testing.assert_allclose(np.array(json.loads(after), dtype=float), layer_one, rtol=1e-4, atol=1e-6)
    finally:
        stop(proc)


def test_sigterm_stops_vitlab_app_and_its_server():
    port = free_port()
    app = subprocess.Popen([sys.executable, "-m", "vitlab.cli", "app", "--port", str(port), "--num-images", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", 120)
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=60) == 0
        time.sleep(1.0)
        with pytest.raises(OSError):  # nobody serves the port any more
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
