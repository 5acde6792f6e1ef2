"""A real browser: Chromium (through Playwright) opens the explorer served by Voila, checks that the first view,
before any interaction, shows the map vitlab.attention_maps gives, moves the layer slider and sees the heatmap
change, also when anywidget gave up on the figure's model in the page (vitlab.app.livefigure); `vitlab app` stopped
with SIGTERM takes its server down. Skipped only where Chromium or Playwright is missing; `.ci/run` installs
Chromium. Nothing is written into the working tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
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

    # a page without a heatmap (a replaced figure's old view gone, its new one not drawn yet) is no change
    changed = f"() => {{ const z = ({HEATMAP_Z})(); return z !== null && z !== {json.dumps(before)}; }}"
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


#: run in the page before its own scripts: anywidget's 2 s allowance for a widget model to load its module (an
#: ``AbortSignal.timeout(2000)``) runs out at once, as it did on a busy machine, where anywidget then dropped every
#: edit the kernel sent the figure; ``window.__vitlabShortened`` counts the allowances cut short
GIVE_UP_AT_ONCE = """(() => {
  const timeout = AbortSignal.timeout.bind(AbortSignal);
  window.__vitlabShortened = 0;
  AbortSignal.timeout = (ms) => { if (ms !== 2000) return timeout(ms); window.__vitlabShortened += 1; return timeout(0); };
})();"""


def _layer_maps(layers: tuple[int | None, ...]):
    """The readout's attention, heads averaged, for the first of the app's 2 default images, at each of ``layers``
    (None: the last), as the library computes it."""
    import vitlab
    from vitlab.data.images import default_images
    from vitlab.inspect import attention_view

    model = vitlab.load_model()
    _, x, _ = default_images(model, 2)
    maps = vitlab.attention_maps(model, x[:1])
    return [attention_view(maps, vitlab.model_info(model), "attention", layer, "mean")[0].numpy() for layer in layers]


def _explorer_in_chromium(tmp_path, init_script: str | None = None) -> dict:
    """Serve the app, open it in Chromium (running ``init_script`` first), press Home on the layer slider and return
    the heatmap's z ``before`` and ``after`` (JSON), whether the heatmap ``replaced`` its first plot element, and the
    page's ``shortened`` count (GIVE_UP_AT_ONCE). Screenshots go to ``tmp_path``."""
    playwright = pytest.importorskip("playwright.sync_api")
    from vitlab.app import new_token, page_url, serve, stop

    port, token = free_port(), new_token()
    proc = serve(port=port, num_images=2, token=token)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", 120)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            if init_script:
                page.add_init_script(init_script)
            page.goto(page_url(port, token), timeout=180_000)
            page.wait_for_function(HEATMAP_Z, timeout=180_000)
            before = page.evaluate(HEATMAP_Z)
            page.evaluate("() => { for (const p of document.querySelectorAll('.js-plotly-plot')) p.__first = true; }")
            page.screenshot(path=str(tmp_path / "explorer_first_view.png"))
            after = _slide_to_layer_one(page, before, timeout=180)
            page.screenshot(path=str(tmp_path / "explorer.png"))
            replaced = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].some(
                p => !p.__first && (p.data || []).some(t => t.type === 'heatmap'))""")
            shortened = page.evaluate("() => window.__vitlabShortened ?? null")
            browser.close()
        return {"before": before, "after": after, "replaced": replaced, "shortened": shortened}
    finally:
        stop(proc)


def test_layer_slider_changes_the_heatmap_in_chromium(tmp_path):
    seen = _explorer_in_chromium(tmp_path)
    before, after = json.loads(seen["before"]), json.loads(seen["after"])
    assert after != before
    assert (tmp_path / "explorer.png").stat().st_size > 10_000
    # the first view, before any interaction, is the readout's attention in the last layer, heads averaged,
    # for the first image, exactly as the library computes it (not an empty placeholder)
    last, layer_one = _layer_maps((None, 1))
    np.testing.assert_allclose(np.array(before, dtype=float), last, rtol=1e-4, atol=1e-6)
    # and after the slider moved: layer 1's map (not merely another one)
    np.testing.assert_allclose(np.array(after, dtype=float), layer_one, rtol=1e-4, atol=1e-6)


def test_the_heatmap_follows_the_slider_when_anywidget_gave_up_on_its_model(tmp_path):
    """About one run in five on a busy machine the heatmap never left layer 7: plotly's 5 MB widget module took over
    the 2 s anywidget allows a model, and anywidget dropped every edit the kernel sent that figure. Here the
    allowance runs out at once for every figure; the explorer notices the unanswered edit and shows layer 1's map
    in a new figure (vitlab.app.livefigure)."""
    seen = _explorer_in_chromium(tmp_path, GIVE_UP_AT_ONCE)
    assert seen["shortened"] >= 1  # anywidget still asks for its 2 s allowance: the fault was injected
    assert seen["replaced"] is True  # the heatmap is drawn by another plot element than the first view's
    last, layer_one = _layer_maps((None, 1))
    np.testing.assert_allclose(np.array(json.loads(seen["before"]), dtype=float), last, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.array(json.loads(seen["after"]), dtype=float), layer_one, rtol=1e-4, atol=1e-6)


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
