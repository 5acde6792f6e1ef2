"""Speed of attention capture, as ratios against plain forwards measured in the same process.

For each model (random weights, eval, ``torch.no_grad``) and one fixed ``(B, 3, 224, 224)`` batch:

* (a) ``fused``:    plain forward, attention fused as built (``scaled_dot_product_attention``);
* (b) ``unfused``:  plain forward with every attention module's ``fused_attn = False`` (explicit softmax);
* (c) ``capture``:  ``vitlab.attention_maps(model, x)``, all layers, full maps ``(L, B, H, T, T)``;
* (d) ``reduced``:  ``vitlab.attention_maps(model, x, head_fusion="mean", queries="prefix")`` -> ``(L, B, 1, 1, T)``.

The four variants run round-robin (a, b, c, d, a, b, ...) after one warm-up round, so slow drift of the
machine (other processes, thermal state) spreads over all of them; the median of ``--repeats`` rounds is
reported. The issue's goal: c/b <= 1.3 (capture costs at most 30% over the unfused forward it needs).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

import vitlab
from benchmarks._util import PeakRSS, machine_info
from vitlab.base.atomic import atomic_write_text
from vitlab.base.modes import explicit_attention

DEFAULT_MODELS = ("vit_tiny_patch16_224", "vit_base_patch16_224")
VARIANTS = ("fused", "unfused", "capture", "reduced")
GOAL = 1.3  # c/b


@dataclass
class SpeedRow:
    """Median seconds per variant for one model and the ratios derived from them."""

    model: str
    batch: int
    img_size: int
    seconds: dict[str, float]  # variant -> median seconds per forward
    all_seconds: dict[str, list[float]]
    peak_rss: dict[str, int]  # variant -> median peak resident memory above the start of the call, bytes
    maps_shape: list[int]  # (L, B, H, T, T)
    maps_bytes: int
    reduced_shape: list[int]  # (L, B, 1, P, T)
    reduced_bytes: int

    @property
    def ratios(self) -> dict[str, float]:
        s = self.seconds
        return {
            "b/a": s["unfused"] / s["fused"],
            "c/b": s["capture"] / s["unfused"],
            "c/a": s["capture"] / s["fused"],
            "d/b": s["reduced"] / s["unfused"],
        }


def build(name: str) -> nn.Module:
    """``name`` with random weights, eval mode."""
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False).eval()


def variants(model: nn.Module, x: Tensor) -> dict[str, Callable[[], Any]]:
    """One zero-argument callable per variant; capture variants return their ``(L, B, H', Q, T)`` tensor."""
    def fused() -> Tensor:
        with torch.no_grad():
            return model(x)

    def unfused() -> Tensor:
        with torch.no_grad(), explicit_attention(model):
            return model(x)

    return {
        "fused": fused,
        "unfused": unfused,
        "capture": lambda: vitlab.attention_maps(model, x),
        "reduced": lambda: vitlab.attention_maps(model, x, head_fusion="mean", queries="prefix"),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, int]:
    """(seconds, peak extra resident bytes) of one call; the result counts while it is alive in the call."""
    gc.collect()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
        del out
    return seconds, mem.extra


def bench_model(name: str, batch: int, repeats: int, img_size: int = 224, progress: bool = True) -> SpeedRow:
    """Median seconds (and peak extra memory) of each variant over ``repeats`` round-robin rounds.

    One untimed warm-up round first (allocator, oneDNN kernel selection), which also gives the result shapes.
    """
    model = build(name)
    x = torch.randn(batch, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))
    fns = variants(model, x)
    warm = {v: fn() for v, fn in fns.items()}
    maps, reduced = warm["capture"], warm["reduced"]
    shapes = dict(maps_shape=list(maps.shape), maps_bytes=maps.numel() * maps.element_size(),
                  reduced_shape=list(reduced.shape), reduced_bytes=reduced.numel() * reduced.element_size())
    del warm, maps, reduced
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    peaks: dict[str, list[int]] = {v: [] for v in VARIANTS}
    for _ in tqdm(range(repeats), desc=f"speed {name}", disable=not progress, leave=False):
        for v in VARIANTS:
            dt, peak = timed(fns[v])
            times[v].append(dt)
            peaks[v].append(peak)
    return SpeedRow(model=name, batch=batch, img_size=img_size,
                    seconds={v: statistics.median(t) for v, t in times.items()}, all_seconds=times,
                    peak_rss={v: int(statistics.median(p)) for v, p in peaks.items()}, **shapes)


def profile_capture(name: str, batch: int, img_size: int = 224, top: int = 12) -> str:
    """torch.profiler tables (self CPU time) of the unfused forward and of ``attention_maps``."""
    from torch.profiler import ProfilerActivity, profile

    model = build(name)
    x = torch.randn(batch, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))
    fns = variants(model, x)
    parts = []
    for v in ("unfused", "capture"):
        fns[v]()  # warm-up
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fns[v]()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
        parts.append(f"--- {name} {v} (batch {batch})\n{table}")
    return "\n".join(parts)


def format_table(rows: list[SpeedRow]) -> str:
    """Markdown table: median seconds per variant and the ratios, one row per model."""
    lines = ["| model | batch | a fused s | b unfused s | c capture s | d reduced s | b/a | **c/b** | c/a | d/b |",
             "|" + "---|" * 10]
    for r in rows:
        s, q = r.seconds, r.ratios
        lines.append(
            f"| {r.model} | {r.batch} | {s['fused']:.3f} | {s['unfused']:.3f} | {s['capture']:.3f} | "
            f"{s['reduced']:.3f} | {q['b/a']:.2f} | **{q['c/b']:.2f}** | {q['c/a']:.2f} | {q['d/b']:.2f} |"
        )
    return "\n".join(lines)


def format_memory_table(rows: list[SpeedRow]) -> str:
    """Markdown table: bytes of the captured result and peak extra resident memory of each variant."""
    lines = ["| model | batch | maps (c): shape, bytes | maps (d): shape, bytes | peak extra RSS a / b / c / d |",
             "|" + "---|" * 5]
    for r in rows:
        peaks = " / ".join(_mib(r.peak_rss[v]) for v in VARIANTS)
        lines.append(f"| {r.model} | {r.batch} | {tuple(r.maps_shape)}, {_mib(r.maps_bytes)} | "
                     f"{tuple(r.reduced_shape)}, {_kib(r.reduced_bytes)} | {peaks} |")
    return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _kib(n: int) -> str:
    return f"{n / 2**10:.1f} KiB"


def run_speed(models: tuple[str, ...] = DEFAULT_MODELS, batch: int = 32, repeats: int = 3,
              progress: bool = True) -> list[SpeedRow]:
    """Benchmark every model in ``models``."""
    return [bench_model(m, batch, repeats, progress=progress) for m in models]


def to_json(rows: list[SpeedRow]) -> list[dict[str, Any]]:
    return [{**asdict(r), "ratios": r.ratios} for r in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="timm model names")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/capture_speed.partial.json"))
    p.add_argument("--threads", type=int, help="torch threads (default: torch's own choice, one per core)")
    p.add_argument("--profile", action="store_true", help="also print torch.profiler tables (unfused vs capture)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run_speed(tuple(args.models), args.batch, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps({"machine": machine_info(), "rows": to_json(rows)}, indent=1))
    print(format_table(rows))
    print()
    print(format_memory_table(rows))
    worst = max(r.ratios["c/b"] for r in rows)
    print(f"\ngoal c/b <= {GOAL}: {'met' if worst <= GOAL else 'NOT met'} (worst {worst:.2f}); results in {args.out}")
    if args.profile:
        for m in args.models:
            print(profile_capture(m, args.batch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
