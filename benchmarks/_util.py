"""Helpers shared by the benchmarks: peak memory, machine description (the unfused attention switch is
``vitlab.base.modes.explicit_attention``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import timm
import torch
import torch.nn.functional as F

from vitlab.base.atomic import atomic_write_text
from vitlab.base.modes import explicit_attention
from vitlab.base.provenance import cpu_model


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


class PeakRSS:
    """Samples resident memory every ``interval`` seconds while active; ``extra`` = peak minus start, bytes.

    Torch kernels release the GIL, so the sampling thread runs during forwards; peaks shorter than the
    interval can be missed, so this is a lower bound.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.start


@torch.no_grad()
def plain_forward(model: torch.nn.Module, x: torch.Tensor, batch: int) -> None:
    """The model's forward over ``x`` (N, C, H, W) in batches of ``batch``, through the explicit softmax, keeping
    nothing: the baseline an instrumented pass is timed against."""
    with explicit_attention(model):
        for i in range(0, len(x), batch):
            model(x[i:i + batch])


def load_average() -> str:
    """1/5/15-minute load averages, or '?' where the OS does not report them."""
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, library versions, date, load."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "load_average": load_average(),
    }


def report(result: Any, table: str, out: str | os.PathLike | None) -> int:
    """A benchmark script's ending: print its table, write its result as JSON to ``out`` (if given; folders made,
    the file replaced whole, atomically), exit status 0."""
    print(table)
    if out:  # atomic_write: a failure or kill mid-write leaves the previous file, no half-written one beside it
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    return 0


def median_step_seconds(model: torch.nn.Module, opt: torch.optim.Optimizer,
                        batch_at: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int, bf16: bool) -> float:
    """The median seconds of ``steps`` training steps (cross-entropy, backward, ``opt`` step; bf16 autocast when
    ``bf16``) on the (images, labels) that ``batch_at(i)`` gives for step i, after one warm-up step (which also
    compiles)."""
    times = []
    for i in range(steps + 1):
        x, y = batch_at(i)
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])
