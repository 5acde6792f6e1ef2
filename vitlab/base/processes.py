"""Child processes that end with their parent: ``die_with_parent``, for a process that must not outlive the one that
started it (the ``vitlab app`` server, a sweep's pool workers)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel send this process SIGTERM when ``parent_pid`` (its parent) exits, however it exits (a
    SIGKILL included); exit now if the parent is already gone. Elsewhere nothing (no such facility). Raises OSError
    when the kernel refuses."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(1)
