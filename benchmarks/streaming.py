"""Peak memory and time of the streaming analyses on a large model: ``vitlab.mean_attention_distance`` and
``vitlab.attention_rollout`` reduce each layer's maps inside the capture hook, so their peak memory no longer grows
with depth. Measured against a plain forward with the unfused attention over the same images, in one process.

    python benchmarks/streaming.py [--model vit_large_patch16_384] [--images 128] [--batch 32]

Goal (renovation issue): ViT-L/16 at 384 px (577 tokens), 128 random images, batch 32: under 2 GB of extra peak
memory and at most 1.2x the forward. For reference, one batch of 32 full maps of all 24 layers alone is
24 x 32 x 16 x 577 x 577 x 4 bytes = 16.4 GB; one layer's is 0.68 GB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm
import torch

import vitlab
from benchmarks._util import PeakRSS, plain_forward, report

GOAL_MEMORY_GB = 2.0
GOAL_RATIO = 1.2


def _measure(fn) -> tuple[float, float]:
    with PeakRSS() as rss:
        t = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t
    return seconds, rss.extra / 2**30


def run(model_name: str = "vit_large_patch16_384", images: int = 128, batch: int = 32, rounds: int = 1) -> dict:
    from benchmarks._util import machine_info

    machine = machine_info()  # load average at the start of the run, with the CPU
    model = timm.create_model(model_name, pretrained=False).eval()  # speed and memory do not depend on the weights
    info = vitlab.model_info(model)
    x = torch.randn(images, 3, *info.img_size)
    L, H, T = info.depth, info.num_heads, info.num_tokens
    variants = {
        "forward": lambda xs: plain_forward(model, xs, batch),
        "distance": lambda xs: vitlab.mean_attention_distance(model, xs, batch_size=batch, progress=False),
        "rollout": lambda xs: [vitlab.attention_rollout(model, xs[i:i + batch]) for i in range(0, len(xs), batch)],
    }
    for fn in variants.values():  # untimed, one batch each: no variant pays the first call's one-off costs alone
        fn(x[:batch])
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):  # interleaved, each round starting one variant later
        for k in names[r % len(names):] + names[:r % len(names)]:
            rows[k].append(_measure(lambda k=k: variants[k](x)))
    med = {k: (statistics.median(s for s, _ in v), statistics.median(m for _, m in v)) for k, v in rows.items()}
    return {"machine": machine, "model": model_name, "images": images, "batch": batch, "tokens": T, "depth": L, "heads": H,
            "full_maps_one_batch_gb": L * batch * H * T * T * 4 / 2**30, "one_layer_maps_gb": batch * H * T * T * 4 / 2**30,
            "seconds": {k: v[0] for k, v in med.items()}, "peak_extra_gb": {k: v[1] for k, v in med.items()},
            "threads": torch.get_num_threads()}


def format_table(res: dict) -> str:
    f = res["seconds"]["forward"]
    lines = [f"`{res['model']}` ({res['tokens']} tokens, {res['depth']} layers), {res['images']} random images, batch "
             f"{res['batch']}, {res['threads']} threads. One batch of full maps would hold "
             f"{res['full_maps_one_batch_gb']:.1f} GB; one layer's {res['one_layer_maps_gb']:.2f} GB.", "",
             f"| run | seconds | / forward (goal <= {GOAL_RATIO}) | peak extra memory GB (goal < {GOAL_MEMORY_GB}) |",
             "|---|---|---|---|"]
    for k in ("forward", "distance", "rollout"):
        lines.append(f"| {k} | {res['seconds'][k]:.1f} | {res['seconds'][k] / f:.2f} | {res['peak_extra_gb'][k]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_large_patch16_384")
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1, help="timed rounds per variant (median reported)")
    p.add_argument("--out", default="benchmarks/results/streaming.json")
    a = p.parse_args(argv)
    res = run(a.model, a.images, a.batch, a.rounds)
    return report(res, format_table(res), a.out)


if __name__ == "__main__":
    sys.exit(main())
