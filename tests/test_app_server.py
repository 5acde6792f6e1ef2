"""`vitlab app` under hostile input, against a real server: a request without the token or with a foreign Host
header (DNS rebinding) starts no kernel, page loads beyond --max-pages start none either (the memory stays under a
stated bound), and SIGKILL of `vitlab app` leaves no Voila, kernel or listening port behind. One server serves the
module; the SIGKILL test ends it and runs last."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import free_port

pytest.importorskip("voila")
psutil = pytest.importorskip("psutil")

#: resident memory one explorer kernel may hold (the embedded default model, torch, the first view), in bytes
KERNEL_RSS_BOUND = 1_600_000_000
#: resident memory Voila itself may hold, in bytes
SERVER_RSS_BOUND = 400_000_000
MAX_PAGES = 1


class Server:
    def __init__(self, tmp_path):
        self.port = free_port()
        self.log = tmp_path / "app.log"
        # --open with a "browser" that records what it was asked to open
        self.opened, browser = tmp_path / "opened.txt", tmp_path / "browser.sh"
        browser.write_text(f'#!/bin/sh\nprintf "%s" "$*" > "{self.opened}"\n')
        browser.chmod(0o755)
        with open(self.log, "w") as out:
            self.app = subprocess.Popen([sys.executable, "-m", "vitlab.cli", "app", "--port", str(self.port),
                                         "--num-images", "1", "--max-pages", str(MAX_PAGES), "--open"],
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "BROWSER": str(browser)})
        self.token = self._wait_until_serving(240)

    def _wait_until_serving(self, timeout: float) -> str:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.app.poll() is not None:
                raise RuntimeError(f"vitlab app exited with {self.app.returncode}: {self.log.read_text()}")
            found = re.search(rf"http://127\.0\.0\.1:{self.port}/\?token=([0-9a-f]+)", self.log.read_text())
            if found:
                try:
                    self.get("/")
                    return found.group(1)
                except OSError:
                    pass
            time.sleep(0.5)
        raise TimeoutError(f"vitlab app did not serve within {timeout} s: {self.log.read_text()}")

    def get(self, path: str, host: str | None = None, timeout: float = 300) -> tuple[int, str]:
        """(status, body) of GET ``path``, redirects not followed; ``host`` replaces the Host header. The cookies
        set go to ``cookies``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"Host": host or f"127.0.0.1:{self.port}"})
            resp = conn.getresponse()
            self.cookies = [c.split(";")[0] for c in resp.headers.get_all("Set-Cookie") or ()]
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def kernel_socket(self, kernel_id: str, cookies: list[str], host: str) -> int:
        """The HTTP status of opening the page's kernel channels (the widgets' websocket) with ``cookies`` and the
        Host header ``host``: 101 when it opens (then closed at once)."""
        import asyncio

        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.websocket import websocket_connect

        async def connect():
            url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
            try:
                ws = await websocket_connect(HTTPRequest(url, headers={"Cookie": "; ".join(cookies), "Host": host}))
            except HTTPClientError as e:
                return e.code
            ws.close()
            return 101

        return asyncio.run(connect())

    def processes(self) -> list:
        """Everything `vitlab app` started that still runs: Voila and its kernels."""
        try:
            return psutil.Process(self.app.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kernels(self) -> list:
        return [p for p in self.processes() if "ipykernel_launcher" in " ".join(p.cmdline())]


def test_a_new_page_reclaims_an_abandoned_kernel_but_never_a_connected_or_recent_one(tmp_path):
    """At the cap, a new kernel replaces the longest-idle kernel no page is connected to once it has been idle for
    reclaim_after seconds; a connected one, or one idle for less, stays and the new page gets HTTP 503."""
    import asyncio

    from tornado import web

    from vitlab.app.kernels import CappedKernelManager

    async def scenario():
        km = CappedKernelManager(max_kernels=2, reclaim_after=3600.0, root_dir=str(tmp_path))
        try:
            a = await km.start_kernel(path="")
            b = await km.start_kernel(path="")
            with pytest.raises(web.HTTPError) as refused:  # both inactive for less than reclaim_after
                await km.start_kernel(path="")
            assert refused.value.status_code == 503 and sorted(km.list_kernel_ids()) == sorted([a, b])
            km.reclaim_after = 0.0
            km._kernel_connections[a] = 1  # a page is connected to a: never reclaimed
            assert km.abandoned() == [b]
            c = await km.start_kernel(path="")
            assert sorted(km.list_kernel_ids()) == sorted([a, c]) and km.live_kernels() == 2
            km._kernel_connections[c] = 1
            with pytest.raises(web.HTTPError):  # both connected: nothing to reclaim
                await km.start_kernel(path="")
            km._kernel_connections[c] = 0
            km.get_kernel(c).execution_state = "busy"  # rendering its page, no browser connected yet
            with pytest.raises(web.HTTPError):
                await km.start_kernel(path="")
            assert sorted(km.list_kernel_ids()) == sorted([a, c])
        finally:
            await km.shutdown_all(now=True)

    asyncio.run(scenario())


def test_the_server_config_culls_idle_unconnected_kernels_and_keeps_connected_ones(tmp_path):
    """The manager `vitlab app` configures (vitlab.app.launch.server_config) shuts down a kernel no page is
    connected to once it has been idle for cull_idle_timeout; a connected one stays. Timeouts shortened here."""
    import asyncio

    from vitlab.app.kernels import CappedKernelManager
    from vitlab.app.launch import CULL_IDLE_TIMEOUT, server_config

    config = server_config("t", (), 2)
    km = CappedKernelManager(config=config, root_dir=str(tmp_path))
    assert (km.max_kernels, km.cull_idle_timeout, km.cull_connected) == (2, CULL_IDLE_TIMEOUT, False)
    config.CappedKernelManager.cull_idle_timeout = config.CappedKernelManager.cull_interval = 1

    async def scenario():
        km = CappedKernelManager(config=config, root_dir=str(tmp_path))
        try:
            a = await km.start_kernel(path="")
            b = await km.start_kernel(path="")
            km._kernel_connections[a] = 1
            for _ in range(100):
                if b not in km:
                    break
                await asyncio.sleep(0.1)
            assert km.list_kernel_ids() == [a]
        finally:
            await km.shutdown_all(now=True)

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("app"))
    yield srv
    if srv.app.poll() is None:
        srv.app.send_signal(signal.SIGTERM)
        try:
            srv.app.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.app.pid, signal.SIGKILL)


def test_the_page_needs_the_printed_token(server):
    status, _ = server.get("/")
    assert status == 302  # to the login page: no notebook runs
    status, _ = server.get("/?token=" + "0" * len(server.token))
    assert status == 302
    status, _ = server.get("/api/kernels/00000000-0000-0000-0000-000000000000")  # the kernel API too
    assert status == 403
    assert server.kernels() == []


def test_open_gives_the_browser_the_page_with_its_token_outside_the_browser_s_command_line(server):
    """Voila's own --open opened the address without the token (a login page); the browser now gets a temporary
    file that forwards to the page with the token, so the token stays out of the browser's command line."""
    from pathlib import Path
    from urllib.parse import urlparse

    for _ in range(100):
        if server.opened.exists() and server.opened.read_text():
            break
        time.sleep(0.1)
    opened = server.opened.read_text()
    assert opened.startswith("file://") and server.token not in opened
    forward = Path(urlparse(opened).path).read_text()
    assert f'url=http://127.0.0.1:{server.port}/?token={server.token}"' in forward


def test_a_foreign_host_header_is_refused_even_with_the_token(server):
    """A web page the user visits can point its own name at 127.0.0.1 (DNS rebinding); its requests then carry
    that name as Host, and are refused before any kernel starts."""
    for host in ("evil.example.com", f"evil.example.com:{server.port}", "127.0.0.1.nip.io"):
        status, _ = server.get(f"/?token={server.token}", host=host)
        assert status == 403, host
    assert server.kernels() == []


def test_page_loads_beyond_max_pages_start_no_kernel_and_memory_stays_bounded(server):
    host = f"localhost:{server.port}"
    status, body = server.get(f"/?token={server.token}", host=host)
    assert status == 200 and "application/vnd.jupyter.widget-view+json" in body  # the explorer rendered
    # the browser keeps the token as a cookie: the widgets' websocket to the page's kernel opens with it only
    kernel_id, cookies = re.search(r'"kernelId": "([0-9a-f-]+)"', body).group(1), server.cookies
    assert cookies and server.kernel_socket(kernel_id, cookies, host) == 101
    assert server.kernel_socket(kernel_id, [], host) == 403
    for _ in range(4):  # the kernel just rendered its page: it is not abandoned, so no room is made
        status, body = server.get(f"/?token={server.token}")
        assert status == 503 and "explorer pages are open" in body
    kernels = server.kernels()
    assert len(kernels) == MAX_PAGES
    rss = sum(p.memory_info().rss for p in server.processes())
    assert rss < MAX_PAGES * KERNEL_RSS_BOUND + SERVER_RSS_BOUND, rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal (prctl) is Linux only")
def test_sigkill_of_vitlab_app_leaves_no_server_kernel_or_port_behind(server):
    from vitlab.app import check_port

    left = server.processes()
    assert any("vitlab.app.launch" in " ".join(p.cmdline()) for p in left)
    os.kill(server.app.pid, signal.SIGKILL)
    server.app.wait(timeout=10)
    _, alive = psutil.wait_procs(left, timeout=60)
    assert alive == [], [p.cmdline() for p in alive]
    check_port(server.port)  # free again: the next `vitlab app` on it starts
