"""Prototype behind the speed suggestion in BENCHMARKS.md: write maps into one preallocated buffer.

``vitlab.attention_maps`` keeps every layer's post-softmax map alive until the end of the forward, then
``AttentionCapture.stack()`` copies them twice (``torch.cat`` per layer, even for a single chunk, then
``torch.stack``). The prototype instead copies each layer's map from an ``attn_drop`` forward hook straight
into one ``(L, B, H, T, T)`` buffer: one copy, nothing retained. It checks that both give identical maps and
times (interleaved, median) the unfused forward, ``vitlab.attention_maps`` and the prototype.

    python benchmarks/prealloc_prototype.py [--model vit_base_patch16_224] [--batch 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm
import torch
from torch import Tensor, nn

import vitlab
from benchmarks._util import all_unfused


def prealloc_maps(model: nn.Module, x: Tensor) -> Tensor:
    """``(L, B, H, T, T)`` post-softmax maps of ``model.blocks[i].attn``, copied from hooks into one buffer."""
    attns = [blk.attn for blk in model.blocks]
    buf: list[Tensor] = []

    def hook(j: int) -> Callable:
        def copy(_m: nn.Module, _args: tuple, out: Tensor) -> None:
            if not buf:  # first layer: now H and T are known
                buf.append(torch.empty((len(attns), *out.shape), dtype=torch.float32, device=out.device))
            buf[0][j].copy_(out)
        return copy

    handles = [a.attn_drop.register_forward_hook(hook(j)) for j, a in enumerate(attns)]
    try:
        with torch.no_grad(), all_unfused(model):
            model(x)
    finally:
        for h in handles:
            h.remove()
    return buf[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval()
    x = torch.randn(args.batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))

    def unfused() -> Tensor:
        with torch.no_grad(), all_unfused(model):
            return model(x)

    fns: dict[str, Callable[[], Tensor]] = {
        "unfused": unfused,
        "vitlab": lambda: vitlab.attention_maps(model, x),
        "prototype": lambda: prealloc_maps(model, x),
    }
    same = torch.equal(fns["vitlab"](), fns["prototype"]())  # also the warm-up
    unfused()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            out = fn()
            times[k].append(time.perf_counter() - t0)
            del out
    base = statistics.median(times["unfused"])
    print(f"{args.model} batch {args.batch}: prototype maps identical to vitlab's: {same}")
    for k, ts in times.items():
        med, runs = statistics.median(ts), ", ".join(f"{t:.2f}" for t in ts)
        print(f"  {k:10s} median {med:7.2f} s  ratio to unfused {med / base:.2f}  ({runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
