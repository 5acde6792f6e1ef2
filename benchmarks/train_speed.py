"""Training throughput and model FLOPs utilisation (MFU), all measured in one process.

    python benchmarks/train_speed.py [--steps 8] [--out benchmarks/results/train_speed.partial.json]

* **peak**: matmul FLOP/s of this CPU (2048 x 2048 x 2048 products) in the precision training uses here (bf16
  where it is fast, float32 on an AVX2-only CPU: ``vitlab.base.precision``), measured before and after the rest; the
  loops below run in that precision too.
* **levers** for the default ViT (ViT-Lite-7/4): a minimal loop (pre-normalised tensors, AdamW, cross-entropy)
  with one change at a time: explicit softmax attention instead of SDPA, batch size, random patch dropping,
  ``torch.compile``, fused instead of foreach AdamW, 24 px images (the early phase of progressive resizing), and
  the model itself in bf16 instead of autocast (where bf16 is fast: no casts, no fp32 master weights; an upper
  bound for a pure-bf16 step).
  FLOPs per image come from ``torch.utils.flop_counter.FlopCounterMode`` over one real step (forward and backward,
  under the same autocast), so a variant that drops patches is credited only the FLOPs it performs.
* **vitlab train** on the ``vit_cifar10`` preset (RandAugment, distillation through the teacher, patch dropping)
  in each of its two phases, its first third of the epochs at 24 px (progressive resizing) and the rest at 32 px,
  the 32 px phase also on every patch token (as the default's recent legs train), and on the ``resnet_cifar10``
  teacher preset: the images/s ``vitlab train`` itself reports for the second of two short epochs (steady state,
  as every epoch after a real run's first; the first pays for ``torch.compile`` where the preset's real runs
  compile), the 32 px rows also eager (``--compile off``), and MFU = (student step FLOPs + teacher forward FLOPs per
  image) x images/s / peak; and the headline row, the preset over its whole schedule, priced from its compiled
  24 px and 32 px rows (``schedule_average``: the images of all epochs over their seconds).
* CNN levers for the teacher: channels_last and bf16 against fp32 (bf16 rows only where bf16 is fast) in training,
  and the shipped teacher's forward as distillation runs it, contiguous against channels_last.

MFU is a ratio of two rates measured on the same machine in the same run, so it does not depend on the
machine's speed; on a shared machine both slow down together only roughly, hence the load average in the stamp.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import vitlab
from benchmarks._util import median_step_seconds, report
from vitlab.base.modes import any_image_size, explicit_attention
from vitlab.base.precision import use_bf16
from vitlab.data.datasets import ImageArray, find_cifar, load_dataset, load_shapes, normalize
from vitlab.models.checkpoint import save_checkpoint
from vitlab.models.config import size2
from vitlab.train.augment import shrink
from vitlab.train.compiling import COMPILE_MIN_STEPS, compile_by_default
from vitlab.train.config import PRESETS, TrainConfig, with_num_classes
from vitlab.train.distill import load_teacher
from vitlab.train.loop import step_flops as train_step_flops
from vitlab.train.loop import train


@dataclasses.dataclass(frozen=True)
class Lever:
    """One variant of the minimal ViT loop; the defaults are the explicit-softmax loop at batch 256."""

    label: str
    batch: int = 256
    explicit: bool = True  # explicit softmax attention (False: scaled_dot_product_attention)
    patch_drop: float = 0.0  # timm's patch_drop_rate
    compiled: bool = False  # torch.compile
    adamw: str = "foreach"  # AdamW implementation: "foreach" (what vitlab train uses) or "fused"
    img_size: int = 32  # 24: the early phase of progressive resizing (6 x 6 patches, position embeddings resized)
    # weights, activations and gradients all in bf16 (no autocast casts; no fp32 master copy of the weights either,
    # which a real bf16 recipe would keep: an upper bound for such a step)
    bf16_weights: bool = False


#: the first row is the loop before this work
VIT_LEVERS = [
    Lever("SDPA, batch 128 (before)", batch=128, explicit=False),
    Lever("explicit softmax, batch 128", batch=128),
    Lever("explicit softmax, batch 256"),
    Lever("explicit softmax, batch 256, patch drop 0.5", patch_drop=0.5),
    Lever("explicit softmax, batch 256, torch.compile", compiled=True),
    Lever("explicit softmax, batch 256, fused AdamW", adamw="fused"),
    Lever("explicit softmax, batch 256, 24 px (progressive resizing)", img_size=24),
    Lever("explicit softmax, batch 256, bf16 weights (no autocast, no fp32 master copy)", bf16_weights=True),
]
GOAL_MFU = 0.40


def _data(n: int) -> tuple[ImageArray, str]:
    if find_cifar("cifar10", "train"):
        return load_dataset("cifar10", "train").subset(torch.randperm(50_000)[:n]), "cifar10"
    return load_shapes("train", n=n), "shapes"


#: bf16 where this CPU runs it fast (AVX-512 or AMX), else float32: what ``vitlab train`` uses here
BF16 = use_bf16(True, "cpu")
PRECISION = "bf16" if BF16 else "fp32"


def peak_matmul_flops(n: int = 2048, reps: int = 5, bf16: bool = BF16) -> float:
    """Best-of-``reps`` FLOP/s of an n x n x n matmul in bf16 (or float32): the machine's attainable matmul rate."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times)


def step_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool = BF16,
               backward: bool = True) -> float:
    """FLOPs of one training step (or forward) per image: ``vitlab.train.loop.step_flops`` over the batch size."""
    return train_step_flops(model, x, y, bf16=bf16, backward=backward) / len(x)


def _loop(model: torch.nn.Module, x_all: torch.Tensor, y_all: torch.Tensor, batch: int, steps: int,
          bf16: bool = BF16, adamw: str = "foreach") -> float:
    """Images/s (median step) of the most direct loop: AdamW (``foreach`` or ``fused``), cross-entropy, backward,
    step."""
    impl = {"foreach": True} if adamw == "foreach" else {"fused": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, **impl)
    def batch_at(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]

    return batch / median_step_seconds(model, opt, batch_at, steps, bf16)


def vit_levers(data: ImageArray, steps: int, peak: float) -> list[dict]:
    base = with_num_classes(PRESETS["vit_cifar10"], len(data.classes)).model
    rows = []
    for lever in VIT_LEVERS:
        if lever.bf16_weights and not BF16:
            continue  # bf16 runs at reference speed on this CPU
        batch = lever.batch
        cfg = dataclasses.replace(base, distilled=False, patch_drop_rate=lever.patch_drop, img_size=lever.img_size)
        torch.manual_seed(0)
        model = vitlab.build_model(cfg).train()
        pc = model.pretrained_cfg
        x_all = normalize(data.images[: batch * (steps + 1)], pc["mean"], pc["std"])
        if lever.img_size != x_all.shape[-1]:  # the images as progressive resizing shows them: downsampled
            x_all = shrink(x_all, lever.img_size)
        y_all = data.labels[: batch * (steps + 1)]
        if lever.bf16_weights:
            model, x_all = model.to(torch.bfloat16), x_all.to(torch.bfloat16)
        with explicit_attention(model, True):  # the same maths; FlopCounterMode counts no CPU SDPA kernel
            flops = step_flops(model, x_all[:batch], y_all[:batch])
        with explicit_attention(model, lever.explicit):
            try:
                net = torch.compile(model) if lever.compiled else model
                ips = _loop(net, x_all, y_all, batch, steps, adamw=lever.adamw)
                error = None
            except Exception as e:  # noqa: BLE001 - a lever that cannot run here is recorded, not fatal
                ips, error = float("nan"), f"{type(e).__name__}: {str(e)[:200]}"
        rows.append({"variant": lever.label, "batch": batch, "images_per_second": ips,
                     "train_gflops_per_image": flops / 1e9, "mfu": flops * ips / peak, "error": error})
        print(f"  {lever.label}: {ips:.0f} img/s, MFU {flops * ips / peak:.0%}", flush=True)
    return rows


def cnn_levers(data: ImageArray, steps: int, peak: float) -> list[dict]:
    cfg = with_num_classes(PRESETS["resnet_cifar10"], len(data.classes))
    rows = []
    variants = [("fp32", False, False), ("bf16", False, True), ("bf16, channels_last", True, True)] if BF16 else \
        [("fp32", False, False), ("fp32, channels_last", True, False)]  # bf16 here would run at reference speed
    for label, cl, bf16 in variants:
        torch.manual_seed(0)
        model = vitlab.build_model(cfg.model).train()
        pc = model.pretrained_cfg
        batch = cfg.batch_size
        x_all = normalize(data.images[: batch * (steps + 1)], pc["mean"], pc["std"])
        y_all = data.labels[: batch * (steps + 1)]
        # normalize() returns (B, H, W, 3) images permuted, i.e. already channels_last in memory: make each layout
        # explicit (an earlier run fed the "default layout" rows channels_last images and found no difference)
        x_all = x_all.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
        if cl:
            model = model.to(memory_format=torch.channels_last)
        flops = step_flops(model, x_all[:batch], y_all[:batch], bf16=bf16)
        ips = _loop(model, x_all, y_all, batch, steps, bf16=bf16)
        rows.append({"variant": label, "batch": batch, "images_per_second": ips, "train_gflops_per_image": flops / 1e9,
                     "mfu": flops * ips / peak})
        print(f"  cnn {label}: {ips:.0f} img/s", flush=True)
    return rows


def teacher_forward_levers(data: ImageArray, steps: int, peak: float, teacher_dir: Path) -> list[dict]:
    """The distillation teacher's forward (no gradient) at the default preset's batch, as ``vitlab train`` runs it
    every step: the checkpoint's default layout against channels_last (what ``load_teacher`` gives a CNN)."""
    batch = PRESETS["vit_cifar10"].batch_size
    rows = []
    for label, cl in [("contiguous", False), ("channels_last", True)]:
        teacher = load_teacher(teacher_dir, torch.device("cpu")).to(
            memory_format=torch.channels_last if cl else torch.contiguous_format)
        pc = teacher.pretrained_cfg
        x_all = normalize(data.images[: batch * (steps + 1)], pc["mean"], pc["std"]).contiguous(
            memory_format=torch.channels_last if cl else torch.contiguous_format)  # vitlab train's student input
        flops = step_flops(teacher, x_all[:batch], data.labels[:batch], backward=False)
        times = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
            for i in range(steps + 1):
                t = time.perf_counter()
                teacher(x_all[i * batch:(i + 1) * batch])
                times.append(time.perf_counter() - t)
        ips = batch / statistics.median(times[1:])
        rows.append({"variant": f"forward only (the teacher in distillation), {PRECISION}, {label}", "batch": batch,
                     "images_per_second": ips, "forward_gflops_per_image": flops / 1e9, "mfu": flops * ips / peak})
        print(f"  teacher forward {label}: {ips:.0f} img/s", flush=True)
    return rows


def vitlab_train(preset: str, data: ImageArray, steps: int, peak: float, teacher_dir: Path | None,
                 small: int | None = None, every_token: bool = False, compile: bool | None = None) -> dict:
    """images/s that ``vitlab train`` reports for the second of two epochs of ``steps`` batches of the preset (the
    first, recorded beside it, pays one-time costs, as a real run's first epoch does), and its MFU; ``small``: in the
    progressive-resizing phase at that many px; ``every_token``: with ``--set model.patch_drop_rate=0``, as the
    default's legs train since one on every token beat half the tokens in a 2-epoch comparison (BENCHMARKS.md);
    ``compile``: ``train``'s ``compile`` (None: as a real run of the preset on this device, whose 1,000 steps or
    more ``vitlab.train.compiling.compile_by_default`` judges, not these few)."""
    cfg = with_num_classes(PRESETS[preset], len(data.classes))
    if every_token:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, patch_drop_rate=0.0))
    cfg = dataclasses.replace(cfg, epochs=2, eval_every=0, eval_tta=0, max_train_examples=cfg.batch_size * steps,
                              warmup_epochs=0.0, teacher=str(teacher_dir) if cfg.teacher else None,
                              progressive_size=small, progressive_epochs=2 if small else 0)  # one phase throughout
    forced_eager = compile is False
    if compile is None:
        compile = compile_by_default(cfg, torch.device("cpu"), COMPILE_MIN_STEPS)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", progress=False, train_data=data, test_data=data.subset(range(10)),
              compile=compile)
        first, second = (json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines())
    compiled = bool(second.get("compiled"))  # False too where inductor could not compile here
    model = vitlab.build_model(cfg.model).train()
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    pc = model.pretrained_cfg
    x = normalize(data.images[: cfg.batch_size], pc["mean"], pc["std"])
    y = data.labels[: cfg.batch_size]
    if teacher_dir is not None and cfg.teacher:
        model.set_distilled_training(True)
    xs = shrink(x, small) if small else x
    with explicit_attention(model, cfg.explicit_attention), any_image_size(model) if small else nullcontext():
        flops = step_flops(model, xs, y)
    teacher_flops = 0.0
    if cfg.teacher:
        with torch.no_grad():
            teacher_flops = step_flops(load_teacher(cfg.teacher, torch.device("cpu")), x, y, backward=False)
    total = flops + teacher_flops
    ips = second["images_per_second"]
    phases = PRESETS[preset].small_epochs  # a preset that trains its first epochs on smaller images
    return {"preset": preset + (f", {small} px phase (progressive resizing)" if small else
                                f", {size2(cfg.model.img_size)[0]} px phase" if phases and not every_token else
                                f", {size2(cfg.model.img_size)[0]} px" if phases else "")
            + (", every patch token (model.patch_drop_rate=0)" if every_token else "")
            + (", compiled" if compiled else ", eager (--compile off)" if forced_eager else ""),
            "compiled": compiled, "batch": cfg.batch_size, "images_per_second": ips,
            "first_epoch_images_per_second": first["images_per_second"],
            "student_gflops_per_image": flops / 1e9, "teacher_gflops_per_image": teacher_flops / 1e9,
            "mfu": total * ips / peak}


def schedule_average(preset: str, cfg: TrainConfig, full: dict, small: dict, peak: float) -> dict | None:
    """``preset`` trained as ``cfg`` over its whole schedule with progressive resizing: ``cfg.small_epochs`` epochs
    at the rate of the ``small`` row, the rest at the ``full`` row's (both measured): images/s = the images of all
    epochs over their seconds (a harmonic mean weighted by epochs), FLOPs per image weighted by epochs, and MFU from
    those against ``peak`` (FLOP/s) as ``vitlab_train`` computes it; None for a ``cfg`` without a small-image phase."""
    k, n = cfg.small_epochs, cfg.epochs
    if not k:
        return None
    seconds = k / small["images_per_second"] + (n - k) / full["images_per_second"]  # per image of each epoch
    ips = n / seconds
    student = (k * small["student_gflops_per_image"] + (n - k) * full["student_gflops_per_image"]) / n
    teacher = full["teacher_gflops_per_image"]
    how = "compiled " if full["compiled"] and small["compiled"] else ""
    return {"preset": f"{preset} as the preset trains: {n} epochs, the first {k} at {cfg.progressive_size} px "
                      f"(from the {how}32 px and {cfg.progressive_size} px phase rows below)", "derived": True,
            "compiled": full["compiled"] and small["compiled"], "batch": full["batch"], "images_per_second": ips,
            "student_gflops_per_image": student, "teacher_gflops_per_image": teacher,
            "mfu": (student + teacher) * 1e9 * ips / peak}


def _teacher_dir(tmp: Path) -> Path:
    """The shipped teacher, or (before one is shipped) a random one of the same shape: the same compute."""
    shipped = Path(__file__).resolve().parents[1] / PRESETS["vit_cifar10"].teacher
    if (shipped / "config.json").is_file():
        return shipped
    return save_checkpoint(vitlab.build_model(PRESETS["resnet_cifar10"].model), tmp / "teacher")


def run(steps: int = 8) -> dict:
    from benchmarks._util import machine_info

    machine = machine_info()  # load average at the start of the run, with the CPU
    data, source = _data(512 * (steps + 1))
    peak_before = peak_matmul_flops()
    levers = vit_levers(data, steps, peak_before)
    with tempfile.TemporaryDirectory() as tmp:
        teacher = _teacher_dir(Path(tmp))
        vit = PRESETS["vit_cifar10"]
        full = vitlab_train("vit_cifar10", data, steps, peak_before, teacher)  # measured in this order
        others = [vitlab_train("vit_cifar10", data, steps, peak_before, teacher, compile=False),
                  vitlab_train("vit_cifar10", data, steps, peak_before, teacher, every_token=True),
                  vitlab_train("vit_cifar10", data, steps, peak_before, teacher, every_token=True, compile=False)]
        small = vitlab_train("vit_cifar10", data, steps, peak_before, teacher, small=vit.progressive_size)
        cnn_preset = vitlab_train("resnet_cifar10", data, steps, peak_before, None)
        preset = schedule_average("vit_cifar10", vit, full, small, peak_before)  # the preset's own schedule
        ours = [row for row in (preset, full, *others, small, cnn_preset) if row is not None]
        cnn = cnn_levers(data, steps, peak_before) + teacher_forward_levers(data, steps, peak_before, teacher)
    peak_after = peak_matmul_flops()
    peak = max(peak_before, peak_after)
    for row in [*levers, *ours, *cnn]:  # MFU against the better of the two peak measurements
        row["mfu"] *= peak_before / peak
    return {"machine": machine, "data": source, "steps": steps, "threads": torch.get_num_threads(),
            "precision": PRECISION, "peak_tflops": peak / 1e12,
            "peak_tflops_before_after": [peak_before / 1e12, peak_after / 1e12],
            "vit_levers": levers, "vitlab_train": ours, "cnn_levers": cnn}


def format_table(res: dict) -> str:
    base = res["vit_levers"][0]["images_per_second"]
    prec = res.get("precision", "bf16")  # results written before the field: bf16
    peak, (before, after) = (res["peak_tflops"], res["peak_tflops_before_after"]) if "peak_tflops" in res else \
        (res["peak_bf16_tflops"], res["peak_bf16_tflops_before_after"])
    lines = [f"Peak {prec} matmul: {peak:.3f} TFLOP/s (before / after: {before:.3f} / {after:.3f}); the loops and "
             f"`vitlab train` run in {prec}.", "",
             "| ViT-Lite-7/4, minimal loop | images/s | x before | GFLOP/img (step) | MFU |", "|---|---|---|---|---|"]
    for r in res["vit_levers"]:
        note = f" ({r['error']})" if r.get("error") else ""
        lines.append(f"| {r['variant']}{note} | {r['images_per_second']:.0f} | {r['images_per_second'] / base:.2f} | "
                     f"{r['train_gflops_per_image']:.3f} | {r['mfu']:.0%} |")
    lines += ["", f"| `vitlab train` preset | batch | images/s | x before | GFLOP/img (student + teacher) | **MFU** "
                  f"(goal >= {GOAL_MFU:.0%}) |", "|---|---|---|---|---|---|"]
    for r in res["vitlab_train"]:
        x = f"{r['images_per_second'] / base:.2f}" if r["preset"].startswith("vit_cifar10") else ""
        name = f"**{r['preset']}**" if r.get("derived") else r["preset"]
        lines.append(f"| {name} | {r['batch']} | {r['images_per_second']:.0f} | {x} | "
                     f"{r['student_gflops_per_image']:.3f} + {r['teacher_gflops_per_image']:.3f} | **{r['mfu']:.0%}** |")
    lines += ["", "| teacher CNN, minimal loop | batch | images/s | MFU |", "|---|---|---|---|"]
    for r in res["cnn_levers"]:
        lines.append(f"| {r['variant']} | {r['batch']} | {r['images_per_second']:.0f} | {r['mfu']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="benchmarks/results/train_speed.partial.json")
    a = p.parse_args(argv)
    res = run(a.steps)
    return report(res, format_table(res), a.out)


if __name__ == "__main__":
    sys.exit(main())
