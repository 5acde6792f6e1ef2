"""``vitlab app``: the attention explorer as a standalone page served by Voila."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent / "explorer.ipynb"


def voila_command(port: int = 8866, open_browser: bool = False) -> list[str]:
    """The Voila command line that serves the explorer notebook on localhost:``port``."""
    if not _has_module("voila"):
        raise RuntimeError("`vitlab app` needs Voila: pip install 'vitlab[notebooks]' (or pip install voila)")
    cmd = [sys.executable, "-m", "voila", str(NOTEBOOK), f"--port={port}", "--Voila.ip=127.0.0.1",
           "--theme=light"]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def serve(model: str | None = None, port: int = 8866, open_browser: bool = False,
          num_images: int = 8) -> subprocess.Popen:
    """Start Voila in a subprocess, in its own process group (so ``stop`` ends it with the kernels it started)."""
    env = {**os.environ, "VITLAB_APP_IMAGES": str(num_images)}
    if model:  # Voila's kernel runs in the notebook's folder: a relative checkpoint path must not depend on it
        env["VITLAB_MODEL"] = str(Path(model).resolve()) if Path(model).exists() else model
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
