"""Provenance: the one place that says which code, versions and machine produced a result.

``versions()`` for small stamps (figures, cards, probe JSON), ``provenance()`` for records that must be traceable
(training runs, sweep rows, reports), ``code_hash()`` for fingerprints that must change when the code does, and
``fingerprint()``, the one such fingerprint that the results stores (the scaling sweep's, the MPP study's) key their
records by.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from vitlab.base.shipped import PACKAGE

__all__ = ["versions", "provenance", "git_commit", "code_hash", "source_hash", "json_digest", "fingerprint", "cpu_model",
           "usable_cores"]

_PACKAGE = PACKAGE

#: vitlab's version (``vitlab.__version__``; pyproject.toml holds the same)
VERSION = "0.1.0"


def versions() -> dict[str, str]:
    """vitlab, torch and timm versions."""
    import timm
    import torch

    return {"vitlab": VERSION, "torch": torch.__version__, "timm": timm.__version__}


@functools.cache
def git_commit() -> str | None:
    """The commit of the checkout vitlab runs from when it was imported (None outside a git checkout)."""
    with contextlib.suppress(Exception):
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=_PACKAGE)
        return out.stdout.strip() or None
    return None


def source_hash(package: Path = _PACKAGE) -> str:
    """A short digest of every ``.py`` file of the vitlab package as the files are now (names and contents);
    ``package``: another checkout's package folder (e.g. a study's worktree), hashed the same way."""
    h = hashlib.blake2b(digest_size=8)
    for p in sorted(package.rglob("*.py")):
        h.update(p.relative_to(package).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


# Taken when vitlab is imported (``vitlab/__init__`` imports this module first), so that a long run stamps the code
# it loaded, not whatever the files hold by the time it saves a record (someone may be editing the checkout).
_CODE_HASH = source_hash()
git_commit()


def code_hash() -> str:
    """``source_hash()`` as it was when this process imported vitlab: two results with the same hash were produced
    by the same code, committed or not. (A module first imported later, e.g. by a worker process started after an
    edit, runs the edited code under the old hash: for a long job beside edits to the checkout, run it from a
    snapshot, e.g. ``git worktree add ../snapshot HEAD``.)"""
    return _CODE_HASH


def json_digest(obj: Any, n: int = 16) -> str:
    """The first ``n`` hex digits of the sha256 of ``obj`` as JSON with sorted keys (other types written by ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def fingerprint(inputs: dict[str, Any]) -> str:
    """The key a results store finds a record by: ``json_digest`` of ``inputs`` (e.g. ``{"config": ...}`` of a sweep,
    ``{"spec": ...}`` of an MPP study row) with ``code_hash()`` under ``"code"``, so a record counts as done only for
    the exact inputs and code that produced it. Its form must not change: the records shipped in ``data/results``
    are found by it (a test recomputes them)."""
    return json_digest({**inputs, "code": code_hash()})


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int | None:
    """CPUs this process may run on (a container's limit), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def provenance(**extra: Any) -> dict[str, Any]:
    """Versions, code (commit and source hash), Python, host, CPU model, cores and torch threads, the GPU's name
    where there is one, plus ``extra``."""
    import torch

    gpu = {"gpu": torch.cuda.get_device_name(torch.cuda.current_device())} if torch.cuda.is_available() else {}
    return {**versions(), "python": platform.python_version(), "git_commit": git_commit(), "code_hash": code_hash(),
            "host": platform.node(), "machine": platform.machine(), "cpu": cpu_model(), "cores": usable_cores(),
            "threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(), **gpu, **extra}
