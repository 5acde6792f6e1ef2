"""The cost of recording the paper's Fig. 7 statistics during training (issue 46), as a share of an epoch.

    python benchmarks/fig7_cost.py [--steps 6] [--rounds 3] [--out benchmarks/results/fig7_cost.json]

For the recipes' shape (``vit_cifar10_noteacher``: ViT-Lite-7/4, 32 px, batch 256, random patch dropping), in one
process: the median seconds of ``vitlab.train.emergence.fig7_statistics`` on the 128 shipped CIFAR-10 test images
(``sample_batch``; ``--rounds`` after one warm-up), against one training epoch estimated from the median of
``--steps`` timed training steps (after one warm-up step: AdamW, cross-entropy, backward, step, in the precision
training uses on this CPU, ``vitlab.base.precision``) times the epoch's steps (the preset's training images less its
validation split, over the batch). The step is the bare loop's, without augmentation, data loading, evaluation or a
teacher, so the estimated epoch is shorter than a real one and the ratio an upper bound. Both image sizes of the
preset's progressive resizing are timed (its first third at 24 px); the ratio's target is under 2% of the shorter,
24 px epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import vitlab
from benchmarks._util import machine_info, median_step_seconds, report
from vitlab.base.precision import use_bf16
from vitlab.train.config import PRESETS
from vitlab.train.emergence import fig7_statistics, sample_batch

PRESET = "vit_cifar10_noteacher"
#: CIFAR-10's training images
TRAIN_IMAGES = 50_000
#: the target: the statistics of one epoch cost less than this share of the epoch
TARGET = 0.02


def step_seconds(img_size: int, steps: int, bf16: bool) -> float:
    """Median seconds of one training step of the preset's model at ``img_size`` px (one warm-up step first)."""
    cfg = PRESETS[PRESET]
    torch.manual_seed(0)
    model = vitlab.build_model(dataclasses.replace(cfg.model, img_size=img_size)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    x = torch.randn(cfg.batch_size, 3, img_size, img_size)
    y = torch.randint(0, cfg.model.num_classes, (cfg.batch_size,))
    return median_step_seconds(model, opt, lambda i: (x, y), steps, bf16)


def fig7_seconds(rounds: int) -> tuple[float, int]:
    """Median seconds of ``fig7_statistics`` of the preset's (freshly initialised) model on the 128 sample images,
    and the number of images."""
    torch.manual_seed(0)
    model = vitlab.build_model(PRESETS[PRESET].model).train()  # as the loop holds it; measured in eval mode
    x = sample_batch(model)
    times = []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        fig7_statistics(model, x)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:]), len(x)


def run(steps: int = 6, rounds: int = 3) -> dict:
    cfg = PRESETS[PRESET]
    bf16 = use_bf16(cfg.bf16, "cpu")
    epoch_steps = math.ceil((TRAIN_IMAGES - cfg.val_per_class * cfg.model.num_classes) / cfg.batch_size)
    fig7, images = fig7_seconds(rounds)
    step = {size: step_seconds(size, steps, bf16) for size in (cfg.progressive_size, cfg.model.img_size)}
    epoch = {size: s * epoch_steps for size, s in step.items()}
    share = cfg.progressive_fraction  # of the epochs at the smaller size
    mean_epoch = share * epoch[cfg.progressive_size] + (1 - share) * epoch[cfg.model.img_size]
    return {"preset": PRESET, "precision": "bf16" if bf16 else "fp32", "steps": steps, "rounds": rounds,
            "batch": cfg.batch_size, "epoch_steps": epoch_steps, "fig7_images": images, "fig7_seconds": fig7,
            "step_seconds": {str(k): v for k, v in step.items()}, "epoch_seconds": {str(k): v for k, v in epoch.items()},
            "ratio_shortest_epoch": fig7 / min(epoch.values()), "ratio_mean_epoch": fig7 / mean_epoch,
            "target": TARGET}


def format_table(res: dict) -> str:
    rows = [f"| {size} px | {res['step_seconds'][size]:.3f} | {res['epoch_seconds'][size]:.0f} | "
            f"{res['fig7_seconds'] / res['epoch_seconds'][size]:.2%} |" for size in res["step_seconds"]]
    return "\n".join([f"| epoch at | s per step (batch {res['batch']}, {res['precision']}) | s per epoch "
                      f"({res['epoch_steps']} steps) | Fig. 7 statistics ({res['fig7_seconds']:.2f} s, "
                      f"{res['fig7_images']} images) / epoch |", "|---|---|---|---|", *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/fig7_cost.json")
    a = ap.parse_args(argv)
    res = {"machine": machine_info(), **run(a.steps, a.rounds)}
    return report(res, format_table(res), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
