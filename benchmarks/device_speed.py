"""The inspection work on a CUDA GPU against the CPU of the same machine, in one process (run on its own, on a
machine with a GPU; it refuses to run without one):

    python benchmarks/device_speed.py [--out benchmarks/results/device_speed.json]

- features: ``extract_features`` of the embedded default over the CIFAR-10 test set (the shapes test set when
  CIFAR-10 is not here), fp32, batch 500, no cache; the best of ``--rounds`` rounds each, alternating devices;
- report: ``vitlab.report.reproduce`` of the embedded default on its 128 images, without PNGs, timed once per
  device after an untimed run on each (decoding caches, imports, CUDA's start-up and kernel choices).

Ratios are CPU seconds over CUDA seconds. TF32 stays at torch's defaults (what a user gets).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import vitlab
from vitlab.base.atomic import atomic_write_text
from vitlab.base.provenance import versions
from vitlab.data.datasets import find_cifar, load_dataset, load_shapes
from vitlab.probe.features import extract_features


def _timed(fn, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/device_speed.json")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("device_speed needs a CUDA GPU: run it on a machine with one", file=sys.stderr)
        return 2
    from vitlab.report import reproduce

    data = load_dataset("cifar10", "test") if find_cifar("cifar10", "test") else load_shapes("test")
    models = {"cpu": vitlab.load_model(None).float().eval(), "cuda": vitlab.load_model(None).float().eval().cuda()}
    feats: dict[str, list[float]] = {"cpu": [], "cuda": []}
    for dev, m in models.items():  # untimed: decoding, CUDA's start-up
        extract_features(m, data.subset(range(min(500, len(data)))), batch_size=500, cache=False, progress=False)
    for _ in range(args.rounds):
        for dev, m in models.items():
            feats[dev].append(_timed(lambda m=m: extract_features(m, data, batch_size=500, cache=False,
                                                                  progress=False), dev == "cuda"))
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dev in ("cpu", "cuda"):  # untimed: caches, imports, CUDA's start-up
            reproduce(out=Path(tmp) / f"warm-{dev}", device=dev, png=False, progress=False)
        for dev in ("cpu", "cuda"):
            t = time.perf_counter()
            out = reproduce(out=Path(tmp) / dev, device=dev, png=False, progress=False)
            m = json.loads((out / "metrics.json").read_text())
            report[dev] = {"seconds": round(time.perf_counter() - t, 2), "steps": m["step_seconds"]}
    res = {
        "device": torch.cuda.get_device_name(0), "cpu_threads": torch.get_num_threads(), "versions": versions(),
        "features": {"images": len(data), "data": data.source, "seconds": feats,
                     "ratio": min(feats["cpu"]) / min(feats["cuda"])},
        "report": {**report, "ratio": report["cpu"]["seconds"] / report["cuda"]["seconds"]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(res, indent=2) + "\n")
    print(f"| work | CPU ({res['cpu_threads']} threads) s | {res['device']} s | ratio |\n|---|---|---|---|")
    print(f"| features, {len(data):,} images | {min(feats['cpu']):.2f} | {min(feats['cuda']):.2f} | "
          f"{res['features']['ratio']:.1f}x |")
    print(f"| report, 128 images, no PNGs | {report['cpu']['seconds']:.1f} | {report['cuda']['seconds']:.1f} | "
          f"{res['report']['ratio']:.1f}x |")
    print("report steps (s):", {d: r["steps"] for d, r in report.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
