"""``torch.compile`` against eager ``vitlab train`` on the default preset, in alternating order, in one process.

    python benchmarks/compile_ab.py [--steps 16] [--rounds 2] [--out benchmarks/results/compile_ab.partial.json]

Each row is ``benchmarks.train_speed.vitlab_train``: two epochs of ``steps`` batches of the ``vit_cifar10`` preset
(RandAugment, distillation through the shipped teacher, patch dropping), the images/s ``vitlab train`` reports for
the second (steady state) and for the first (which pays for compiling, unless inductor's cache on this machine
already holds the graphs). Per image size (32 px, and the 24 px phase of progressive resizing) the rounds alternate
which mode goes first (compiled-eager, then eager-compiled, ...), so a machine that slows down or speeds up over the
run favours neither. The verdict is the ratio of the mean steady-state rates, compiled over eager, in this process:
what ``--compile auto`` (``vitlab.train.compiling.compile_by_default``) should be judged by on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._util import machine_info, report
from benchmarks.train_speed import _data, _teacher_dir, peak_matmul_flops, vitlab_train
from vitlab.base.precision import use_bf16


def order(rounds: int) -> list[bool]:
    """The compile flag of each run of one image size: True, False, then False, True, ... (``rounds`` pairs)."""
    return [flag for r in range(rounds) for flag in ((True, False) if r % 2 == 0 else (False, True))]


def summarise(rows: list[dict]) -> dict[str, dict]:
    """Per image size (``rows``' ``size``): the mean steady-state and first-epoch images/s of each mode and the
    compiled / eager ratio of the steady-state means."""
    out = {}
    for size in sorted({r["size"] for r in rows}):
        by = {mode: [r for r in rows if r["size"] == size and r["compiled"] is mode] for mode in (True, False)}
        if not by[True] or not by[False]:
            continue  # inductor could not compile here: every row ran eagerly
        mean = {mode: statistics.fmean(r["images_per_second"] for r in by[mode]) for mode in by}
        first = {mode: statistics.fmean(r["first_epoch_images_per_second"] for r in by[mode]) for mode in by}
        out[f"{size} px"] = {"compiled": mean[True], "eager": mean[False], "ratio": mean[True] / mean[False],
                             "first_epoch_compiled": first[True], "first_epoch_eager": first[False],
                             "runs": len(by[True]) + len(by[False])}
    return out


def run(steps: int = 16, rounds: int = 2) -> dict:
    machine = machine_info()  # load average at the start of the run (at its end it is the run's own), with the CPU
    data, name = _data(steps * 256)
    peak = peak_matmul_flops()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        teacher = _teacher_dir(Path(tmp))
        for small in (None, 24):
            for flag in order(rounds):
                r = vitlab_train("vit_cifar10", data, steps, peak, teacher, small=small, compile=flag)
                r["size"] = small or 32
                print(f"  {r['preset']}: {r['images_per_second']:.1f} images/s (first epoch "
                      f"{r['first_epoch_images_per_second']:.1f})", flush=True)
                rows.append(r)
    return {"machine": machine, "data": name, "steps": steps, "rounds": rounds,
            "precision": "bf16" if use_bf16(True, "cpu") else "fp32", "rows": rows, "summary": summarise(rows)}


def format_table(res: dict) -> str:
    lines = [f"torch.compile against eager `vitlab train`, vit_cifar10, {res['precision']}, {res['steps']} steps per "
             f"epoch, {res['rounds']} alternating pairs per size",
             "", "| images | compiled images/s | eager images/s | compiled / eager | first epoch, compiled / eager |",
             "|---|---|---|---|---|"]
    for size, s in res["summary"].items():
        lines.append(f"| {size} | {s['compiled']:.1f} | {s['eager']:.1f} | {s['ratio']:.2f}x | "
                     f"{s['first_epoch_compiled']:.1f} / {s['first_epoch_eager']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/compile_ab.partial.json")
    a = p.parse_args(argv)
    res = run(a.steps, a.rounds)
    return report(res, format_table(res), a.out)


if __name__ == "__main__":
    sys.exit(main())
