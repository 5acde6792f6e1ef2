"""Training throughput: ``vitlab.train`` against a minimal plain PyTorch loop, bf16 against fp32, and data
loading against the training step, all measured in one process on the same model and batch.

    python benchmarks/train_speed.py [--preset vit_cifar10] [--steps 12] [--batch 128]

Data: the CIFAR-10 in ../shared when present, else the synthetic shapes (same 32 px uint8 arrays).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

import vitlab
from vitlab.data import SHARED_CIFAR10, ImageArray, load_dataset, load_shapes, normalize, random_crop_flip
from vitlab.train import PRESETS, _randaugment, train, with_num_classes

GOAL_LOOP = 0.95  # vitlab train / plain loop, images per second
GOAL_LOADING = 5.0  # data loading / training step, images per second


def _data(n: int) -> tuple[ImageArray, str]:
    if (SHARED_CIFAR10 / "train.zip").is_file():
        d = load_dataset("cifar10", "train")
        return d.subset(range(n)), "cifar10"
    return load_shapes("train", n=n), "shapes"


def plain_loop(model_cfg, data: ImageArray, batch: int, steps: int, bf16: bool) -> float:
    """Images/s of the most direct loop: pre-normalised tensors, AdamW, cross-entropy, backward, step."""
    torch.manual_seed(0)
    model = vitlab.build_model(model_cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    pc = model.pretrained_cfg
    x_all = normalize(data.images[: batch * steps], pc["mean"], pc["std"])
    y_all = data.labels[: batch * steps]
    times = []
    for i in range(steps):
        x, y = x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return batch / statistics.median(times[1:])


def vitlab_loop(cfg, data: ImageArray, steps: int) -> float:
    """Images/s that ``vitlab.train`` itself reports for one epoch of ``steps`` batches (augmentation included)."""
    cfg = dataclasses.replace(cfg, epochs=1, eval_every=0, max_train_examples=cfg.batch_size * steps)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", progress=False, train_data=data, test_data=data.subset(range(10)))
        record = json.loads((Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    return record["images_per_second"]


def loading(cfg, data: ImageArray, steps: int, model) -> float:
    """Images/s of producing training batches exactly as ``vitlab.train`` does (crop, flip, RandAugment, normalise)."""
    g = torch.Generator().manual_seed(0)
    pc = model.pretrained_cfg
    order = torch.randperm(len(data), generator=g)
    t = time.perf_counter()
    for i in range(steps):
        idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
        imgs = random_crop_flip(data.images[idx], cfg.crop_padding, g)
        if cfg.randaugment:
            imgs = _randaugment(imgs, cfg.randaugment, g)
        normalize(imgs, pc["mean"], pc["std"])
    return cfg.batch_size * steps / (time.perf_counter() - t)


def run(preset: str = "vit_cifar10", steps: int = 12, batch: int = 128) -> dict:
    data, source = _data(batch * steps)
    cfg = with_num_classes(dataclasses.replace(PRESETS[preset], batch_size=batch, mixup_prob=0.0), len(data.classes))
    fp32 = plain_loop(cfg.model, data, batch, steps, bf16=False)
    bf16 = plain_loop(cfg.model, data, batch, steps, bf16=True)
    ours = vitlab_loop(dataclasses.replace(cfg, randaugment=None), data, steps)
    ours_full = vitlab_loop(cfg, data, steps)  # with the preset's RandAugment
    model = vitlab.build_model(cfg.model)
    load_plain = loading(dataclasses.replace(cfg, randaugment=None), data, steps, model)
    load_ra = loading(cfg, data, steps, model)
    return {
        "preset": preset, "data": source, "batch": batch, "steps": steps, "threads": torch.get_num_threads(),
        "images_per_second": {"plain_fp32": fp32, "plain_bf16": bf16, "vitlab_crop_flip": ours,
                              "vitlab_randaugment": ours_full, "loading_crop_flip": load_plain,
                              "loading_randaugment": load_ra},
        "ratios": {"vitlab/plain (bf16, crop+flip)": ours / bf16, "bf16/fp32 (plain)": bf16 / fp32,
                   "loading/step (crop+flip)": load_plain / bf16, "loading/step (RandAugment)": load_ra / bf16},
    }


def format_table(res: dict) -> str:
    ips = res["images_per_second"]
    r = res["ratios"]
    rows = [
        ("vitlab train / plain loop (bf16, crop+flip)", r["vitlab/plain (bf16, crop+flip)"], f">= {GOAL_LOOP}",
         f"{ips['vitlab_crop_flip']:.0f} vs {ips['plain_bf16']:.0f}"),
        ("bf16 / fp32 (plain loop)", r["bf16/fp32 (plain)"], "", f"{ips['plain_bf16']:.0f} vs {ips['plain_fp32']:.0f}"),
        ("data loading / training step (crop+flip)", r["loading/step (crop+flip)"], f">= {GOAL_LOADING}",
         f"{ips['loading_crop_flip']:.0f} vs {ips['plain_bf16']:.0f}"),
        ("data loading / training step (+RandAugment)", r["loading/step (RandAugment)"], f">= {GOAL_LOADING}",
         f"{ips['loading_randaugment']:.0f} vs {ips['plain_bf16']:.0f}"),
    ]
    lines = ["| comparison | ratio | goal | images/s |", "|---|---|---|---|"]
    lines += [f"| {a} | {b:.2f} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="vit_cifar10")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", default="benchmarks/results/train_speed.json")
    a = p.parse_args(argv)
    res = run(a.preset, a.steps, a.batch)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
