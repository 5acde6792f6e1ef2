"""``vitlab app``: the attention explorer as a standalone page served by Voila."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent / "explorer.ipynb"


def voila_command(port: int = 8866, open_browser: bool = False) -> list[str]:
    """The command line that serves the explorer notebook on 127.0.0.1:``port``: Voila through
    ``vitlab.app.launch``, which adds the token, the Host check and the kernel cap from ``serve``'s environment."""
    if not _has_module("voila"):
        raise RuntimeError("`vitlab app` needs Voila: pip install 'vitlab[notebooks]' (or pip install voila)")
    # no other port: Voila would otherwise move to a free one nearby while we name ``port`` to the user
    cmd = [sys.executable, "-m", "vitlab.app.launch", str(NOTEBOOK), f"--port={port}", "--Voila.port_retries=0",
           "--Voila.ip=127.0.0.1", "--theme=light"]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def new_token() -> str:
    """A fresh secret for ``serve``'s ``token`` (48 hex digits, as Jupyter's)."""
    import secrets

    return secrets.token_hex(24)


def page_url(port: int, token: str) -> str:
    """The explorer's address with its token, as ``vitlab app`` prints it."""
    return f"http://127.0.0.1:{port}/?token={token}"


def check_port(port: int) -> None:
    """Refuse a ``port`` that another server already listens on at 127.0.0.1, naming the way out."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closed one's port is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise RuntimeError(f"port {port} on 127.0.0.1 is not free ({e.strerror}): another server (an earlier "
                               "`vitlab app`?) holds it; stop it or pass another --port") from e


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def serve(model: str | None = None, port: int = 8866, open_browser: bool = False,
          num_images: int = 8, pretrained: bool = True, weights: str | None = None, *, token: str,
          hosts: tuple[str, ...] = (), max_pages: int = 3) -> subprocess.Popen:
    """Start Voila in a subprocess, in its own process group (so ``stop`` reaches anything it runs there). Its kernels
    run in sessions of their own: each exits by itself once Voila is gone (ipykernel polls its parent,
    jupyter_client's JPY_PARENT_PID). On Linux Voila gets SIGTERM when this process dies, SIGKILL included
    (``vitlab.app.launch``), so nothing outlives it. ``pretrained`` and ``weights`` reach the kernel's
    ``vitlab.load_model`` (for timm names: random or local weights, offline).

    The server answers only requests that carry ``token`` (``page_url``; the browser keeps it as a cookie) and
    name 127.0.0.1, ::1, localhost or one of ``hosts`` in their Host header (HTTP 403 otherwise); it keeps at most
    ``max_pages`` kernels (``vitlab.app.kernels.CappedKernelManager``: HTTP 503 beyond)."""
    if not token:
        raise ValueError("serve(token=''): an empty token would serve anyone who can reach the port; pass "
                         "vitlab.app.new_token()")
    env = {**os.environ, "VITLAB_APP_IMAGES": str(num_images), "VITLAB_APP_TOKEN": token,
           "VITLAB_APP_HOSTS": ",".join(hosts), "VITLAB_APP_MAX_PAGES": str(max_pages),
           "VITLAB_APP_PARENT_PID": str(os.getpid())}
    for name in ("VITLAB_MODEL", "VITLAB_PRETRAINED", "VITLAB_WEIGHTS"):  # never a value inherited from the caller's
        env.pop(name, None)  # environment: without ``model`` the kernel shows the embedded default, the one checked
    if model:  # Voila's kernel runs in the notebook's folder: a relative checkpoint path must not depend on it
        env["VITLAB_MODEL"] = str(Path(model).resolve()) if Path(model).exists() else model
    if not pretrained:
        env["VITLAB_PRETRAINED"] = "0"
    if weights:
        env["VITLAB_WEIGHTS"] = str(Path(weights).resolve())
    return subprocess.Popen(voila_command(port, open_browser), env=env, start_new_session=True)


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """End the Voila server and everything it started (its kernels): SIGTERM to the group, SIGKILL if it lingers."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # kernels left in the group after the server exited
    return proc.returncode if proc.returncode is not None else 0
