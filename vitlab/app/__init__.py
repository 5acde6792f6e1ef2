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
    """The Voila command line that serves the explorer notebook on localhost:``port``."""
    if not _has_module("voila"):
        raise RuntimeError("`vitlab app` needs Voila: pip install 'vitlab[notebooks]' (or pip install voila)")
    # no other port: Voila would otherwise move to a free one nearby while we name ``port`` to the user
    cmd = [sys.executable, "-m", "voila", str(NOTEBOOK), f"--port={port}", "--Voila.port_retries=0",
           "--Voila.ip=127.0.0.1", "--theme=light"]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


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
          num_images: int = 8, pretrained: bool = True, weights: str | None = None) -> subprocess.Popen:
    """Start Voila in a subprocess, in its own process group (so ``stop`` reaches anything it runs there). Its kernels
    run in sessions of their own: Voila shuts them down on SIGTERM, and each exits by itself once Voila is gone
    (jupyter_client's JPY_PARENT_PID), so a SIGKILLed server leaves none behind either. ``pretrained`` and
    ``weights`` reach the kernel's ``vitlab.load_model`` (for timm names: random or local weights, offline)."""
    env = {**os.environ, "VITLAB_APP_IMAGES": str(num_images)}
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
