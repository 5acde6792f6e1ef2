"""A readable training loop (``train``: a ``vitlab.train.config.TrainConfig`` into a run folder): AdamW or Nesterov
SGD, warmup + cosine or a triangle, label smoothing, clipping, mixup/cutmix, bf16, EMA, DeiT-style distillation from
a teacher checkpoint, a warm start from a checkpoint's weights, test-time augmentation at evaluation; for the CNN
teacher three pieces of the airbench recipe, each off by default: alternating flips (``flip``), Lookahead weight
averaging (``lookahead_every``, ``vitlab.train.lookahead``) and a whitening-stem bias frozen after a few epochs
(``whiten_bias_epochs``).

Speed on CPU (``benchmarks/train_speed.py`` measures each lever): a ViT trains with the explicit softmax
attention instead of ``scaled_dot_product_attention``, optionally with random patch dropping
(``ViTConfig.patch_drop_rate``) and progressive resizing (``progressive_size`` px for the first ``progressive_epochs``
epochs, or the first ``progressive_fraction`` of them; the default preset trains its first third at 24 px);
CNNs train in ``channels_last``, and a convolutional distillation teacher runs its forward in it
(``vitlab.train.distill``); a long enough ViT run compiles its step by default (``vitlab.train.compiling``). BENCHMARKS.md has
what each lever measured.

Resumable by construction: every source of randomness (data order, mixup, dropout, the alternating flip pattern) is
seeded from ``(seed, epoch)`` at the start of each epoch, each batch's crops and RandAugment from ``(seed, epoch,
step)`` (``vitlab.train.batches``, which can make the batches in worker processes), and a checkpoint is written atomically at
the end of each epoch with the model, optimizer and EMA state (Lookahead's slow weights equal the model there).
``--resume`` after a ``kill -9`` therefore ends exactly where an uninterrupted run would. A non-finite loss stops
the run and keeps the last good checkpoint.

Here too: what a run measures as it goes (``evaluate``, ``evaluate_mpp``; ``step_flops`` for the benchmarks and
sweeps) and the images it trains on (``training_subset``). The run folder (its lock, what a new run may find there,
its ``metrics.jsonl`` settled on resume) is ``vitlab.train.run_folder``'s. What a run is given, ``TrainConfig`` and the
presets, lives in ``vitlab.train.config``; the teacher and the distillation loss in ``vitlab.train.distill``; a warm
start's copy of a checkpoint's weights in ``vitlab.train.warm_start``; the processes under ``torchrun`` in
``vitlab.train.distributed``; ``torch.compile`` in ``vitlab.train.compiling``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.base.atomic import atomic_write_text
from vitlab.base.checks import check_count
from vitlab.base.errors import MissingPathError, ParameterError, Placeholder, Refusal, Setting
from vitlab.base.modes import all_patch_tokens, any_image_size, eval_mode, explicit_attention
from vitlab.base.precision import use_bf16
from vitlab.base.provenance import provenance
from vitlab.data.datasets import ImageArray, check_same_classes, load_dataset, nested_subsets, normalize
from vitlab.models.checkpoint import (
    RUN_ID,
    load_checkpoint,
    load_run_state,
    recover_checkpoint,
    save_checkpoint,
    save_run_checkpoint,
)
from vitlab.models.cifarnet import check_tta_level, tta_logits
from vitlab.models.config import HybridConfig, ViTConfig, size2
from vitlab.models.zoo import build_model
from vitlab.train.augment import shrink
from vitlab.train.batches import Augment, default_workers, epoch_seed, training_batches
from vitlab.train.compiling import Compiler, compile_by_default
from vitlab.train.config import (
    TrainConfig,
    cfg_num_classes,
    config_changes,
    train_config_from_dict,
    train_config_to_dict,
    with_num_classes,
)
from vitlab.train.distill import distill_loss, load_teacher, soft_cross_entropy, teacher_input
from vitlab.train.distributed import Dist, barrier, dist_setup, mean_over_ranks, per_process_batchnorm
from vitlab.train.lookahead import Lookahead
from vitlab.train.mpp import KEEP, MaskedPatchPrediction
from vitlab.train.run_folder import check_fresh, run_lock, settle_history
from vitlab.train.warm_start import check_init_from, warm_start, warm_start_objective

__all__ = ["train", "TrainingDiverged", "evaluate", "Patience"]


class TrainingDiverged(Refusal, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept. ``Refusal``'s fields: ``param`` ``lr``
    (its peak, the setting most often at fault), the fixes a lower lr or a longer warmup."""


# ---------------------------------------------------------------------------------------------- helpers


def lr_at(step: int, total: int, warmup: int, peak: float, floor: float, shape: str = "cosine",
          start: float = 0.0) -> float:
    """Linear warmup from ``start * peak`` to ``peak`` over ``warmup`` steps, then down to ``floor`` at ``total``:
    along a half cosine (``shape="cosine"``) or a straight line (``"triangle"``). The warmup's line starts one step
    before step 0 (which trains at ``start + (1 - start) / warmup`` of the peak, never at 0) and reaches the peak at
    step ``warmup - 1``."""
    if step < warmup:
        return peak * (start + (1 - start) * (step + 1) / warmup)
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    if shape == "triangle":
        return peak + (floor - peak) * t
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * t))


def _seed_epoch(cfg: TrainConfig, epoch: int, rank: int = 0) -> torch.Generator:
    """Seed what the training process draws per epoch (mixup from numpy, dropout and stochastic depth from torch);
    return the epoch's generator (masked patch prediction's corruption). The batches draw their own
    (``vitlab.train.batches``)."""
    seed = epoch_seed(cfg.seed, epoch)
    torch.manual_seed(seed * 7 + rank)
    np.random.seed(seed)  # timm's Mixup draws from numpy
    return torch.Generator().manual_seed(seed)


def _augment(cfg: TrainConfig) -> Augment:
    return Augment(seed=cfg.seed, crop_padding=cfg.crop_padding, crop_pad_mode=cfg.crop_pad_mode,
                   randaugment=cfg.randaugment, flip=cfg.flip)


def _optimizer(model: nn.Module, cfg: TrainConfig, extra: nn.Module | None = None) -> torch.optim.Optimizer:
    """AdamW (no decay on 1-D parameters and tokens) or Nesterov SGD (the trainable parameters of normalisation
    layers, BatchNorm/GroupNorm/LayerNorm shifts and any trainable scales, at ``norm_bias_lr_scale`` times the lr).

    Each group carries ``lr_scale``: the loop sets ``lr = lr_at(step) * lr_scale``."""
    if cfg.optimizer == "sgd":
        norm_types = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)
        modules = [model] + ([extra] if extra is not None else [])
        norm_ids = {id(p) for mod in modules for m in mod.modules() if isinstance(m, norm_types)
                    for p in m.parameters(recurse=False)}
        norm, rest = [], []
        for mod in modules:
            for p in mod.parameters():
                if p.requires_grad:
                    (norm if id(p) in norm_ids else rest).append(p)
        s = cfg.norm_bias_lr_scale
        groups = [{"params": rest, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
                  {"params": norm, "weight_decay": cfg.weight_decay / s, "lr_scale": s}]
        # foreach: one fused kernel per group instead of a Python loop over parameters
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=True, foreach=True)
    decay, no_decay = [], []
    named = list(model.named_parameters()) + (list(extra.named_parameters(prefix="objective")) if extra else [])
    for name, p in named:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(("pos_embed", "cls_token", "reg_token", "dist_token", "mask_token"))
         else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}]
    # fused on an accelerator (one kernel for every parameter), foreach on a CPU (fused there: 1.83 ms against
    # 1.78 for the default ViT's update on 2 idle AMX cores, 2026-11-26)
    fused = all(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), foreach=None if fused else True, fused=fused or None)


# ---------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def training_subset(data: ImageArray, n: int | None, seed: int) -> ImageArray:
    """The images a run with ``max_train_examples=n`` trains on: all of ``data`` when ``n`` is None or covers it,
    else a class-balanced draw of ``n`` fixed by ``seed`` (``vitlab.data.datasets.nested_subsets``). Never the first ``n``
    in storage order: an ImageFolder (the shared CIFAR-10 zips) is stored class by class, so those would be one
    class."""
    if n is None or n >= len(data):
        return data
    return data.subset(nested_subsets(data.labels, [n], seed=seed)[0])


#: the seed of ``validation_split``'s draw: one fixed split, whatever the run's seed, so that seeds compare on it
VAL_SEED = 10_007


def validation_split(data: ImageArray, per_class: int) -> tuple[ImageArray, ImageArray]:
    """``(rest, val)``: ``per_class`` images of every class drawn from ``data`` (fixed by ``VAL_SEED``, class-balanced
    as ``vitlab.data.datasets.nested_subsets`` draws), and the others in their stored order. Raises ValueError when a class has
    no more than ``per_class`` images (nothing would be left to train on)."""
    n_cls = len(data.classes)
    counts = torch.bincount(data.labels, minlength=n_cls)
    if int(counts.min()) <= per_class:
        raise ValueError(f"val_per_class={per_class} takes every image of class {data.classes[int(counts.argmin())]!r} "
                         f"({int(counts.min())} images): lower val_per_class")
    val_idx = nested_subsets(data.labels, [per_class * n_cls], seed=VAL_SEED)[0]
    rest = torch.ones(len(data), dtype=torch.bool)
    rest[val_idx] = False
    return data.subset(torch.nonzero(rest).flatten()), data.subset(val_idx)


def evaluate(model: nn.Module, data: ImageArray, batch_size: int = 500, bf16: bool = False, tta: int = 0,
             progress: bool | str = False) -> float:
    """Top-1 accuracy of ``model`` on ``data`` with the model's own normalisation; ``tta`` as in
    ``vitlab.models.cifarnet.tta_logits`` (0: the plain forward). ``progress``: a transient bar over the batches (a str
    names it)."""
    from tqdm.auto import tqdm

    check_count("batch_size", batch_size)  # before any batch
    check_tta_level("tta", tta)  # before any batch
    pc = model.pretrained_cfg
    correct = 0
    with eval_mode(model):
        dev = next(model.parameters()).device
        for i in tqdm(range(0, len(data), batch_size), desc=progress if isinstance(progress, str) else "evaluating",
                      unit="batch", leave=False, disable=not progress):
            x = normalize(data.images[i : i + batch_size].to(dev), pc["mean"], pc["std"])  # uint8 travels
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                logits = tta_logits(model, x, tta)
            correct += int((logits.argmax(-1).cpu() == data.labels[i : i + batch_size]).sum())
    return correct / len(data)


def step_flops(model: nn.Module, x: Tensor, y: Tensor, bf16: bool = True, backward: bool = True) -> float:
    """FLOPs of one training step (forward + backward; or one forward) on the batch ``x``, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (not by hand). A ViT's attention is counted through the explicit
    softmax (the same maths): FlopCounterMode counts no CPU SDPA kernel, which left the attention matmuls out.

    Counting leaves the model and the process as they were: its buffers (a BatchNorm's running statistics, which a
    forward in train mode updates), its parameters' gradients and the random number generators (dropout)."""
    from torch.utils.flop_counter import FlopCounterMode

    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    for p, _ in grads:  # set aside: backward would add this step's gradients into them in place
        p.grad = None
    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False) as fc, \
                explicit_attention(model, True):
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(x)
            if backward:
                out = out[0] if isinstance(out, tuple) else out
                F.cross_entropy(out.float(), y).backward()
    finally:
        with torch.no_grad():
            for b, kept in buffers:
                b.copy_(kept)
        for p, g in grads:
            p.grad = g
    return float(fc.get_total_flops())


@torch.no_grad()
def evaluate_mpp(model: nn.Module, objective: nn.Module, data: ImageArray, n: int = 1000, batch_size: int = 250,
                 bf16: bool = False) -> dict[str, float]:
    """Masked patch prediction on ``n`` images of ``data`` spread evenly over it (``i * len(data) // n``: a split
    stored class by class, as an ImageFolder is, would give one class in its first ``n``) with a fixed draw (seed 0):
    the loss, for the colour targets the share of corrupted patches whose colour class is predicted exactly (for
    ``patch4x4`` the share of their 16 sub-patch colours), and
    ``images`` (how many, with ``spread`` = 1: evenly spread; records before it have neither key and used the
    first ``n``)."""
    pc = model.pretrained_cfg
    g = torch.Generator().manual_seed(0)
    n = min(n, len(data))
    idx = torch.arange(n) * len(data) // n  # (n,) evenly spread, all of them when n = len(data)
    losses, hits, count = [], 0, 0
    dev = next(model.parameters()).device
    with eval_mode(model), eval_mode(objective):
        for i in range(0, n, batch_size):
            imgs = data.images[idx[i : i + batch_size]]
            x = normalize(imgs, pc["mean"], pc["std"]).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                loss, out = objective(model, x, imgs.permute(0, 3, 1, 2).float().div(255).to(dev), g)
            losses.append(float(loss) * len(imgs))
            corrupted = out["mode"] != KEEP
            if objective.target != "l2":
                pred = out["prediction"].view(*out["target"].shape, -1).argmax(-1)
                hits += int((pred == out["target"])[corrupted].sum())
                count += int(corrupted.sum()) * (16 if objective.target == "patch4x4" else 1)
    res = {"loss": sum(losses) / n, "images": n, "spread": 1}
    if count:
        res["accuracy"] = hits / count
    return res


# ---------------------------------------------------------------------------------------------- early stopping


@dataclasses.dataclass
class Patience:
    """Early stopping's count (``TrainConfig.patience``): the best watched accuracy so far (None before the first
    evaluation), the epoch (1-based) it was reached at, the evaluations since then without a higher one, and whether
    that count has reached ``patience`` (the run stopped). A tie is no gain, as ``keep_best`` keeps the first of
    equals. ``state`` / ``from_state`` carry it through a checkpoint, so a resumed run counts on."""

    patience: int
    best: float | None = None
    best_epoch: int = 0
    since: int = 0
    stopped: bool = False

    def update(self, value: float | None, epoch: int) -> bool:
        """Count one evaluation of ``value`` at ``epoch`` (None: no evaluation this epoch, nothing counted); True
        when the run is to stop after it."""
        if value is None or self.stopped:
            return self.stopped
        if self.best is None or value > self.best:
            self.best, self.best_epoch, self.since = float(value), epoch, 0
        else:
            self.since += 1
        self.stopped = self.since >= self.patience
        return self.stopped

    def state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, patience: int, state: dict[str, Any] | None) -> Patience:
        """The count saved in a checkpoint (``state``; None: a run from before early stopping, or a fresh one)."""
        if not state:
            return cls(patience)
        return cls(patience, state.get("best"), int(state.get("best_epoch", 0)), int(state.get("since", 0)),
                   bool(state.get("stopped", False)))


def _stop_agreed(stop: bool, d: Dist) -> bool:
    """The main process's decision to stop, the same in every process (only the main process evaluates)."""
    if d.world == 1:
        return stop
    import torch.distributed as dist

    t = torch.tensor([int(stop)], device=d.device)
    dist.broadcast(t, 0)
    return bool(t.item())


# ---------------------------------------------------------------------------------------------- the run


def _diverged(loss: float, epoch: int, step: int, ck: Path, cfg: TrainConfig) -> TrainingDiverged:
    """What a run whose loss stopped being finite in ``epoch`` (0-based) says: where it stands and how to go on (a
    resume refuses a changed lr, so a new run folder warm-started from the last good checkpoint), in Python's terms
    (its fields; the command line writes them as flags)."""
    head = f"loss became {loss} by epoch {epoch + 1}, step {step}: stopping"
    lower = [Setting("lr", Placeholder("LOWER"), config=True), Setting("warmup_epochs", Placeholder("LONGER"), config=True)]
    if not (ck / "config.json").is_file():
        return TrainingDiverged("lr", cfg.lr, config=True, fix=lower, problem=f"{head}. No checkpoint was written (it "
                                "diverged in the first epoch); start again with a lower peak lr or a longer warmup")
    start = (Setting("init_from", str(ck), config=True),)
    return TrainingDiverged("lr", cfg.lr, config=True, problem=f"{head}. The last good checkpoint ({ck}, epoch {epoch}) "
                            "is kept; go on from it in a new run folder with a lower peak lr or a longer warmup (a "
                            "resume keeps the saved settings)",
                            fix=[(*start, s, Setting("run_dir", Placeholder("NEW"))) for s in lower])


def _at_most_half(n: int) -> int:
    """A batch size for ``n`` training examples: the largest power of two up to half of them (at least 1)."""
    return 1 << max(0, (n // 2).bit_length() - 1) if n > 1 else 1


def _check_crop_padding(cfg: TrainConfig, train_data: ImageArray) -> None:
    """Reflect padding mirrors the image inside itself, so it needs fewer pixels than each side has (torch refuses
    at the first step otherwise, without naming the setting)."""
    side = min(train_data.images.shape[1:3])
    if cfg.crop_pad_mode == "reflect" and cfg.crop_padding >= side:
        raise ParameterError("crop_padding", cfg.crop_padding, f"below {side} with reflect padding", config=True,
                             problem=f"reflect padding needs images larger than the padding, but these are {side} px "
                             "on their short side", fix=[Setting("crop_padding", max(side // 8, 1) if side > 1 else 0,
                                                                 config=True),
                                                         Setting("crop_pad_mode", "constant", config=True)])


def _check_image_size(cfg: TrainConfig, train_data: ImageArray, test_data: ImageArray) -> None:
    """A ViT (or hybrid) is built for one image size: refuse data of another size before anything is written,
    naming both and the setting to change (timm's own check fires only at the first forward, as an AssertionError)."""
    m = cfg.model.vit if isinstance(cfg.model, HybridConfig) else cfg.model
    if not isinstance(m, ViTConfig):
        return  # the CNNs take any size
    want = size2(m.img_size)
    field = "model.vit.img_size" if isinstance(cfg.model, HybridConfig) else "model.img_size"
    for split, data in (("training", train_data), ("test", test_data)):
        got = tuple(data.images.shape[1:3])
        if got != want:
            raise ParameterError(field, m.img_size, config=True, problem=f"the {split} images of {data.source} are "
                                 f"{got[0]} x {got[1]} px but the model is built for {want[0]} x {want[1]}",
                                 fix=[Setting(field, got[0] if got[0] == got[1] else list(got), config=True),
                                      "resize the data"])


def train(cfg: TrainConfig, run_dir: str | os.PathLike, *, resume: bool = False, progress: bool = True,
          train_data: ImageArray | None = None, test_data: ImageArray | None = None,
          device: str | None = None, workers: int | None = None, compile: bool | None = None) -> nn.Module:
    """Train ``cfg`` into ``run_dir`` (``checkpoint/``, ``metrics.jsonl``, ``train_config.json``).

    ``workers``: processes that make the augmented batches while the model trains (default
    ``vitlab.train.batches.default_workers``: none on a CPU). They change the speed, never the batches.

    ``compile``: the training forward and backward (and a teacher's forward) through ``torch.compile`` (inductor;
    evaluation stays eager). Default (None): ``compile_by_default`` (``vitlab.train.compiling``), i.e. a ViT classifier in
    one process on a CPU for a run of at least ``COMPILE_MIN_STEPS`` steps, where it pays (BENCHMARKS.md). True for
    masked patch prediction is an error (it trains eagerly). Like ``workers`` it is not part of the run's config: a compiled run resumes eagerly
    and back. Unlike ``workers`` it changes the draws inside the model (patch dropping, stochastic depth: inductor's
    random kernels instead of eager's) and the rounding of fused operations, not what is trained. Where inductor
    cannot compile (e.g. no C++ compiler), the run says so and goes on eagerly.

    Under ``torchrun`` each process takes its slice of every global batch of ``cfg.batch_size`` images
    (augmented identically on every rank before slicing), so the run follows the same trajectory as one
    process with the same global batch (up to the order of floating-point reductions; mixup pairs images within
    each process's slice, and stochastic depth and patch dropping draw per process). Not a model with BatchNorm
    (the CNN teacher's presets): each process normalises its own slice (no SyncBatchNorm), so its statistics and
    weights differ from one process's; the run says so.

    While it trains, ``run_dir`` is locked (``run_lock``): a second ``train`` into the same folder is refused.
    """
    if not resume:  # before the lock, which would leave its file in a folder that is refused
        check_fresh(Path(run_dir))
    with run_lock(Path(run_dir)):
        return _train(cfg, run_dir, resume=resume, progress=progress, train_data=train_data, test_data=test_data,
                      device=device, workers=workers, compile=compile)


@dataclasses.dataclass(eq=False)
class Run:
    """One training run's state while it trains. What it is given stays frozen (``cfg``, a ``TrainConfig`` with its
    ``num_classes`` set from the data); the rest is what ``_build_run`` set up from it and what the epochs change:
    ``model`` (``net`` is the module a step calls: ``model`` itself, or its DDP wrapper under ``torchrun``), the
    optimizer ``opt``, the EMA copy, masked patch prediction's ``objective``, ``mixup``, the data splits,
    ``start_epoch`` and ``elapsed`` (training seconds so far; both from the checkpoint on resume), early stopping's
    count ``stopper``, the precision (``bf16``: autocast to bfloat16), ``workers`` (processes making the batches ahead,
    ``vitlab.train.batches.training_batches``) and ``compile`` (``net``'s and the teacher's training forward through
    ``torch.compile``). ``compiler``, ``forward``, ``teacher_forward`` and ``batches`` (the iterator of
    ``(uint8 images (B, H, W, 3), labels (B,))`` for every step from ``start_epoch`` on) are set when the epochs
    start (``_start_steps``)."""

    cfg: TrainConfig
    folder: Path
    d: Dist
    model: nn.Module
    net: nn.Module
    opt: torch.optim.Optimizer
    ema: nn.Module | None
    teacher: nn.Module | None
    objective: nn.Module | None
    mixup: Any
    train_data: ImageArray
    test_data: ImageArray
    val_data: ImageArray | None
    steps_per_epoch: int
    progress: bool
    start_epoch: int = 0
    elapsed: float = 0.0
    stopper: Patience | None = None
    bf16: bool = False
    workers: int = 0
    compile: bool = False
    compiler: Compiler | None = None
    forward: Any = None
    teacher_forward: Any = None
    batches: Any = None

    @property
    def total_steps(self) -> int:
        return self.cfg.epochs * self.steps_per_epoch

    @property
    def mine(self) -> slice:
        """This process's share of every global batch."""
        per_rank = self.cfg.batch_size // self.d.world
        return slice(self.d.rank * per_rank, (self.d.rank + 1) * per_rank)

    @property
    def amp(self) -> dict[str, Any]:
        """``torch.autocast``'s arguments for a training or evaluation forward."""
        return dict(device_type=self.d.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @property
    def says(self) -> bool:
        """Whether this process writes notes (the main one, with ``progress``)."""
        return bool(self.progress and self.d.main)


def _train(cfg: TrainConfig, run_dir: str | os.PathLike, *, resume: bool, progress: bool,
           train_data: ImageArray | None, test_data: ImageArray | None, device: str | None, workers: int | None,
           compile: bool | None) -> nn.Module:
    """``train``, with ``run_dir``'s lock held: the checks, the run's state (``Run``), its epochs."""
    if compile and cfg.objective != "classify":
        raise ParameterError("compile", True, problem=f"only classification runs compile; a {cfg.objective!r} run "
                             "trains eagerly", fix=[Setting("compile", None), Setting("compile", False)])
    d = dist_setup(device)
    folder = Path(run_dir)
    _check_run_folder(cfg, folder, d, resume, progress)
    cfg, train_data, val_data, test_data = _datasets(cfg, d, progress, train_data, test_data)
    teacher = _checked_teacher(cfg, d, resume)
    cfg = _settle_config(cfg, folder, d, resume)
    r = _build_run(cfg, folder, d, (train_data, val_data, test_data), teacher, resume, progress)
    r.workers = default_workers(d.device) if workers is None else workers
    r.compile = compile_by_default(cfg, d.device, (cfg.epochs - r.start_epoch) * r.steps_per_epoch, d.world) \
        if compile is None else compile
    try:
        with explicit_attention(r.model, cfg.explicit_attention and d.device.type == "cpu"):
            _epochs(r)
    finally:
        if teacher is not None:
            r.model.set_distilled_training(False)
    return r.model.eval()


def _check_run_folder(cfg: TrainConfig, run: Path, d: Dist, resume: bool, progress: bool) -> None:
    """Refuse a run folder that is not fresh (a new run) or has no checkpoint (a resume; one interrupted between
    its renames is restored first), and a batch the processes cannot share."""
    if not resume:  # again under the lock: another process may have written into it since
        check_fresh(run)
    if resume and d.main and recover_checkpoint(run / "checkpoint") and progress:  # killed between replace_dir's renames
        print(f"{run / 'checkpoint'} restored from the previous epoch's copy (a kill interrupted its replacement)")
    if resume and d.world > 1:  # the other processes look after the main one restored it
        import torch.distributed as dist

        dist.barrier()
    if resume and not (run / "checkpoint" / "config.json").is_file():
        raise MissingPathError("resume", True, problem=f"{run} has no checkpoint to resume from",
                               fix=[Setting("resume", False)])
    if cfg.batch_size % d.world:
        raise ParameterError("batch_size", cfg.batch_size, f"a multiple of the {d.world} processes", config=True)
    if cfg.mixup_prob > 0 and (cfg.batch_size // d.world) % 2:
        raise ParameterError("batch_size", cfg.batch_size, f"an even multiple of the {d.world} processes", config=True,
                             problem=f"gives each of the {d.world} processes an odd batch, which mixup cannot pair",
                             fix=[Setting("mixup_prob", 0, config=True)])


def _datasets(cfg: TrainConfig, d: Dist, progress: bool, train_data: ImageArray | None,
              test_data: ImageArray | None) -> tuple[TrainConfig, ImageArray, ImageArray | None, ImageArray]:
    """``(cfg, train, val, test)``: the splits (loaded from ``cfg.data`` where not given), checked against each
    other and the model, the validation split drawn and the training subset taken; ``cfg`` with the data's number
    of classes. Raises ``ParameterError`` for a batch larger than the training images."""
    train_data = train_data if train_data is not None else load_dataset(cfg.data, "train", progress and d.main)
    test_data = test_data if test_data is not None else load_dataset(cfg.data, "test", progress and d.main)
    check_same_classes(train_data, test_data, cfg.data)
    cfg = with_num_classes(cfg, len(train_data.classes))
    _check_image_size(cfg, train_data, test_data)
    _check_crop_padding(cfg, train_data)
    val_data = None
    if cfg.val_per_class:  # before the subset: the split is the same for every max_train_examples and seed
        train_data, val_data = validation_split(train_data, cfg.val_per_class)
    train_data = training_subset(train_data, cfg.max_train_examples, cfg.seed)
    if len(train_data) // cfg.batch_size == 0:
        raise ParameterError("batch_size", cfg.batch_size, config=True, problem=f"exceeds the {len(train_data)} "
                             "training examples", fix=[Setting("batch_size", _at_most_half(len(train_data)), config=True)])
    return cfg, train_data, val_data, test_data


def _checked_teacher(cfg: TrainConfig, d: Dist, resume: bool) -> nn.Module | None:
    """The distillation teacher (None without one), after the settings that need one process or a checkpoint to
    start from are checked; raises ValueError for a teacher of another number of classes."""
    if cfg.objective == "mpp" and d.world > 1:
        raise ValueError("objective='mpp' runs in one process: its head lives outside the DDP wrapper; run it "
                         "without torchrun")
    if cfg.init_from and not resume:  # before the run folder is written: a file or a folder that is no checkpoint
        check_init_from(cfg.init_from)
    teacher = load_teacher(cfg.teacher, d.device) if cfg.teacher else None
    if teacher is not None:
        t_classes = int(getattr(teacher, "num_classes", 0) or 0)
        if t_classes != cfg_num_classes(cfg):
            raise ValueError(f"the teacher {cfg.teacher} predicts {t_classes} classes but the data has "
                             f"{cfg_num_classes(cfg)}: distil from a teacher trained on the same classes")
    return teacher


def _settle_config(cfg: TrainConfig, run: Path, d: Dist, resume: bool) -> TrainConfig:
    """The config the run trains with: on resume the saved one (refused when ``cfg`` asks for another), else ``cfg``,
    written with a new run id into the run folder."""
    cfg_file = run / "train_config.json"
    if resume:
        saved = train_config_from_dict(json.loads(cfg_file.read_text()))
        cfg = dataclasses.replace(cfg, init_from=saved.init_from)  # where it started no longer matters on resume
        if saved != cfg:
            raise ParameterError("resume", True, problem=f"{run} was started with a different config "
                                 f"({config_changes(saved, cfg)})", fix=[
                                     f"resume with the run's own settings, as saved in {cfg_file}",
                                     Setting("run_dir", Placeholder("NEW"))])
    if d.main:
        run.mkdir(parents=True, exist_ok=True)
        if not resume:  # a resumed run's file already says this (checked above); never rewritten, never torn
            atomic_write_text(cfg_file, json.dumps(train_config_to_dict(cfg), indent=2) + "\n")
            atomic_write_text(run / RUN_ID, uuid.uuid4().hex + "\n")  # this run, whatever legs share its folder
    return cfg


def _built_model(cfg: TrainConfig, run: Path, d: Dist, train_data: ImageArray, teacher: nn.Module | None,
                 resume: bool, progress: bool) -> tuple[nn.Module, nn.Module | None]:
    """``(model, objective)`` on the run's device: the model built from ``cfg.seed`` and then loaded from the
    checkpoint (resume), warm-started (``init_from``) or initialised from the data; masked patch prediction's
    objective (None for classification)."""
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    pc = model.pretrained_cfg
    says = progress and d.main
    if resume:
        model.load_state_dict(load_checkpoint(run / "checkpoint").state_dict())
    elif cfg.init_from:
        fresh = warm_start(model, cfg.init_from)
        if says:
            tqdm.write(f"warm start from {cfg.init_from}; not copied as saved (left at their initialisation, or "
                       f"resampled where noted): {', '.join(fresh) or 'nothing'}")
    elif hasattr(model, "init_from_data"):  # e.g. the CNN's whitening layer, from 5,000 random training images
        pick = torch.randperm(len(train_data), generator=torch.Generator().manual_seed(cfg.seed))[:5000]
        model.init_from_data(normalize(train_data.images[pick], pc["mean"], pc["std"]))
    model.to(d.device)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    if teacher is not None:
        model.set_distilled_training(True)
    objective = None
    if cfg.objective == "mpp":
        objective = MaskedPatchPrediction.for_model(model, cfg.mpp_target, cfg.mpp_rate)
        if cfg.init_from and not resume:
            note = warm_start_objective(objective, cfg.init_from)
            if says:
                tqdm.write(f"masked patch prediction: {note}")
        objective.to(d.device)
    return model, objective


def _build_run(cfg: TrainConfig, run: Path, d: Dist, data: tuple[ImageArray, ImageArray | None, ImageArray],
               teacher: nn.Module | None, resume: bool, progress: bool) -> Run:
    """The run's state: the model and objective (``_built_model``), the optimizer and EMA (from the checkpoint on
    resume, where ``metrics.jsonl`` is settled to it), the DDP wrapper, mixup, early stopping's count, the
    precision; the model left in training mode."""
    train_data, val_data, test_data = data
    model, objective = _built_model(cfg, run, d, train_data, teacher, resume, progress)
    opt = _optimizer(model, cfg, objective)
    ema = timm.utils.ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema_decay else None
    r = Run(cfg, run, d, model, model, opt, ema, teacher, objective, None, train_data, test_data, val_data,
            len(train_data) // cfg.batch_size, progress)
    meta: dict[str, Any] = {}
    if resume:
        meta = load_run_state(run / "checkpoint", opt, ema, d.device,
                              {"objective": objective} if objective is not None else None)
        r.start_epoch, r.elapsed = meta["epoch"], meta.get("train_seconds", 0.0)
        if d.main:
            settle_history(run / "metrics.jsonl", meta)
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        r.net = DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
        if r.says and (note := per_process_batchnorm(model, cfg, d)):
            _note(note)
    if cfg.mixup_prob > 0:
        from timm.data import Mixup

        r.mixup = Mixup(mixup_alpha=cfg.mixup_alpha, cutmix_alpha=cfg.cutmix_alpha, prob=cfg.mixup_prob,
                        label_smoothing=cfg.label_smoothing, num_classes=cfg_num_classes(cfg))
    r.stopper = Patience.from_state(cfg.patience, meta.get("early_stop")) if cfg.patience else None
    if r.says and (r.start_epoch >= cfg.epochs or (r.stopper is not None and r.stopper.stopped)):
        why = (f"it stopped early at epoch {r.start_epoch} ({cfg.patience} evaluations without a gain since epoch "
               f"{r.stopper.best_epoch})" if r.stopper is not None and r.stopper.stopped else
               f"all {cfg.epochs} epochs are done")
        _note(f"{run} is finished: {why} (export it with vitlab export, or start a new run folder to train longer)")
    r.bf16 = use_bf16(cfg.bf16, d.device)
    if cfg.bf16 and not r.bf16 and r.says:
        _note(f"bf16 autocast is slow on this {d.device.type} (no native bf16: an AVX2-only CPU); training in "
              "float32 instead (the run records which precision each epoch used)")
    model.train()
    return r


def _note(text: str) -> None:
    """A line between the progress bars."""
    from tqdm.auto import tqdm

    tqdm.write(text)


# ---------------------------------------------------------------------------------------------- the epochs


def _epochs(r: Run) -> None:
    """The epochs from ``r.start_epoch`` (none when ``r.stopper``, early stopping's count, says the run stopped),
    each trained, evaluated (``val_data``: the validation split every evaluated epoch measures, ``val_accuracy``; the
    test images then measured after the last epoch only) and saved by the main process; stops early where the main
    process's count says so."""
    _start_steps(r)
    stopped = r.stopper is not None and r.stopper.stopped
    for epoch in range(r.start_epoch, r.start_epoch if stopped else r.cfg.epochs):
        record = _train_epoch(r, epoch)
        if r.d.main:
            last = _evaluate_epoch(r, epoch, record)
            _save_epoch(r, epoch, record, last)
        barrier(r.d)
        if r.stopper is not None and _stop_agreed(r.stopper.stopped, r.d):
            break


def _start_steps(r: Run) -> None:
    """Set ``r``'s compiled forwards (``torch.compile`` where ``r.compile``; never for masked patch prediction, which
    train refuses to compile) and its batches from ``r.start_epoch`` on."""
    r.compiler = Compiler(r.compile)
    r.forward = r.compiler(r.net)
    r.teacher_forward = r.compiler(r.teacher) if r.teacher is not None else None
    spe = r.steps_per_epoch
    r.batches = iter(training_batches(r.train_data, r.cfg.batch_size, spe, _augment(r.cfg), r.start_epoch * spe,
                                      r.total_steps, r.workers, r.d.device.type == "cuda"))


def _train_epoch(r: Run, epoch: int) -> dict[str, Any]:
    """Train ``epoch`` (0-based): its seeds, its phase (progressive resizing's small images, the last epochs' every
    patch), its steps; return its record (loss, lr, speed, precision, phase). Raises ``TrainingDiverged`` when the
    mean loss stops being finite (before the epoch's checkpoint, so the last one on disk is good)."""
    from tqdm.auto import tqdm

    cfg, d, spe = r.cfg, r.d, r.steps_per_epoch
    t0 = time.time()
    g = _seed_epoch(cfg, epoch, d.rank)
    frozen = _frozen_params(cfg, r.model, epoch)
    lookahead = (Lookahead(r.model, cfg.lookahead_every, r.total_steps, cfg.lookahead_decay, cfg.lookahead_power)
                 if cfg.lookahead_every else None)  # an epoch starts with the network = the slow weights
    loss_sum, seen = torch.zeros((), dtype=torch.float64, device=d.device), 0
    small = cfg.progressive_size if epoch < cfg.small_epochs else None
    full = epoch >= cfg.epochs - cfg.full_token_epochs  # patch dropping off (never when full_token_epochs is 0)
    desc = f"epoch {epoch + 1}/{cfg.epochs}" + (f" at {small} px" if small else "") + (" all tokens" if full else "")
    bar = tqdm(range(spe), desc=desc, disable=not r.says, leave=False)
    with (any_image_size(r.model) if small else contextlib.nullcontext(),
          all_patch_tokens(r.model) if full else contextlib.nullcontext()):
        for it in bar:
            step = epoch * spe + it
            lr, loss, n = _step(r, step, g, small, frozen, lookahead)
            loss_sum += loss.detach().double() * n  # read (a device sync) every 10 steps and at the end
            seen += n
            if it % 10 == 0 or it == spe - 1:
                mean_loss = loss_sum.item() / seen
                if not math.isfinite(mean_loss):  # before the epoch's checkpoint: the last one on disk is good
                    raise _diverged(mean_loss, epoch, it, r.folder / "checkpoint", cfg)
                bar.set_postfix(loss=f"{mean_loss:.3f}")
    if lookahead is not None:
        lookahead.finish((epoch + 1) * spe)  # evaluation and the checkpoint see the slow weights
    r.elapsed += time.time() - t0
    record: dict[str, Any] = {"epoch": epoch + 1, "train_loss": mean_over_ranks(mean_loss, d),
                              "lr": lr, "epoch_seconds": round(time.time() - t0, 2),
                              "images_per_second": round(seen * d.world / (time.time() - t0), 1),
                              "precision": "bf16" if r.bf16 else "fp32"}
    if small:
        record["img_size"] = small  # progressive resizing: this epoch trained on smaller images
    if full:
        record["all_tokens"] = True  # patch dropping off for this epoch
    if r.compiler.enabled:
        record["compiled"] = True  # the training step ran through torch.compile
    return record


def _step(r: Run, step: int, g: torch.Generator, small: int | None, frozen: list[nn.Parameter],
          lookahead: Lookahead | None) -> tuple[float, Tensor, int]:
    """One training step (``step`` counts from the run's start) on the next batch: ``(lr, loss, images)`` (this
    process's loss, a 0-dim tensor, and how many images it saw). ``g``: the epoch's generator (masked patch
    prediction's corruption); ``small``: the side the student sees the images at (None: as stored)."""
    cfg, d, pc = r.cfg, r.d, r.model.pretrained_cfg
    imgs, labels = next(r.batches)
    x = normalize(imgs[r.mine].to(d.device, non_blocking=True), pc["mean"], pc["std"])
    x = x.contiguous(memory_format=torch.channels_last if cfg.channels_last else torch.contiguous_format)
    y = labels[r.mine].to(d.device, non_blocking=True)
    if r.mixup is not None:
        x, target = r.mixup(x, y)
    else:
        n_cls = cfg_num_classes(cfg)
        target = F.one_hot(y, n_cls).float() * (1 - cfg.label_smoothing) + cfg.label_smoothing / n_cls
    xs = shrink(x, small) if small else x  # the student sees them downsampled; the teacher whole
    lr = lr_at(step, r.total_steps, int(cfg.warmup_epochs * r.steps_per_epoch), cfg.lr, cfg.min_lr, cfg.schedule,
               cfg.lr_start)
    for group in r.opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    loss = _loss(r, x, xs, target, imgs, g)
    r.opt.zero_grad(set_to_none=True)
    loss.backward()
    for p in frozen:  # no gradient: the optimizer skips it (no step, no momentum, no weight decay)
        p.grad = None
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_([p for grp in r.opt.param_groups for p in grp["params"]], cfg.grad_clip)
    r.opt.step()
    if lookahead is not None:
        lookahead.after_step(step + 1)
    if r.ema is not None:
        r.ema.update(r.model, step=step)
    return lr, loss, len(y)


def _loss(r: Run, x: Tensor, xs: Tensor, target: Tensor, imgs: Tensor, g: torch.Generator) -> Tensor:
    """The step's loss: masked patch prediction's on ``x`` (labels unread), else the cross-entropy of the student's
    logits on ``xs`` with ``target`` (soft labels (B, classes)), or with a teacher the distillation loss, the teacher
    seeing ``x``."""
    if r.objective is not None:  # masked patch prediction: labels are not read
        images01 = imgs[r.mine].permute(0, 3, 1, 2).float().div_(255).to(r.d.device)
        with torch.autocast(**r.amp):
            loss, _ = r.objective(r.model, x, images01, g, all_predictions=False)
        logits = None
    else:
        with torch.autocast(**r.amp):
            logits = r.forward(xs)
    if r.teacher is not None:
        with torch.autocast(**r.amp), torch.no_grad():
            teacher_logits = tta_logits(r.teacher_forward, teacher_input(x, r.model.pretrained_cfg, r.teacher),
                                        r.cfg.distill_tta)
        loss = distill_loss(logits[0], logits[1], teacher_logits, target, r.cfg)
    elif r.objective is None:
        loss = soft_cross_entropy(logits, target)
    return loss


def _evaluate_epoch(r: Run, epoch: int, record: dict[str, Any]) -> bool:
    """Add to ``record`` what ``epoch`` measures (by ``eval_every``; the watched accuracy first, which early stopping
    counts; the test images at the last epoch with a validation split; EMA weights; test-time augmentation at the
    last) and ``eval_seconds``; return whether the epoch is the run's last (early stopping may make it so)."""
    cfg, val_data, test_data, bf16 = r.cfg, r.val_data, r.test_data, r.bf16
    last = epoch + 1 == cfg.epochs
    t_eval = time.time()
    due = bool(cfg.eval_every) and ((epoch + 1) % cfg.eval_every == 0 or last)
    chosen = _watched(r)
    if due and r.objective is not None:
        record["mpp_test"] = evaluate_mpp(r.model, r.objective, test_data, bf16=bf16)
    elif due or (last and val_data is not None):
        shown = "test" if r.progress else False
        if due:  # the watched accuracy first: early stopping decides whether this epoch is the last
            on = val_data if val_data is not None else test_data
            record[chosen] = evaluate(r.model, on, bf16=bf16, progress=r.progress and ("validation" if
                                                                                     val_data is not None else shown))
        if r.stopper is not None and r.stopper.update(record.get(chosen), epoch + 1) and not last:
            last = True
            record["early_stop"] = {"best_epoch": r.stopper.best_epoch, "patience": cfg.patience}
        if val_data is not None and last:  # with a validation split the test images are read once, at the end
            record["test_accuracy"] = evaluate(r.model, test_data, bf16=bf16, progress=shown)
        if r.ema is not None and due:
            on, split = (val_data, "val") if val_data is not None else (test_data, "test")
            record[f"{split}_accuracy_ema"] = evaluate(r.ema.module, on, bf16=bf16,
                                                       progress=shown and f"{split} (EMA weights)")
        if cfg.eval_tta and last:
            record["test_accuracy_tta"] = evaluate(r.model, test_data, bf16=bf16, tta=cfg.eval_tta,
                                                   progress=shown and "test (test-time augmentation)")
    record["eval_seconds"] = round(time.time() - t_eval, 2)
    return last


def _watched(r: Run) -> str:
    """The accuracy early stopping and ``keep_best`` watch: the validation split's where there is one."""
    return "val_accuracy" if r.val_data is not None else "test_accuracy"


def _save_epoch(r: Run, epoch: int, record: dict[str, Any], last: bool) -> None:
    """What the main process keeps of ``epoch`` (0-based), in this order: the best checkpoint (``keep_best``), the
    Fig. 7 statistics into ``record`` (``fig7_every``), a snapshot (``snapshot_every``), the run checkpoint (model,
    optimizer, EMA, objective and the run's state, written atomically) and then ``record`` in ``metrics.jsonl``."""
    cfg, run, model = r.cfg, r.folder, r.model
    chosen = _watched(r)
    if cfg.keep_best and record.get(chosen) is not None:
        best_file = run / "best" / "config.json"
        best = json.loads(best_file.read_text()).get("metrics", {}).get(chosen, -1.0) if best_file.is_file() else -1.0
        if record[chosen] > best:  # the best evaluated point, as the paper reports its runs
            save_checkpoint(model, run / "best", extra={"epoch": epoch + 1, "metrics": record})
    if cfg.fig7_every and ((epoch + 1) % cfg.fig7_every == 0 or last):
        from vitlab.train.emergence import fig7_statistics, sample_batch

        t_fig7 = time.time()
        record["fig7"] = fig7_statistics(model, sample_batch(model).to(r.d.device))
        record["fig7_seconds"] = round(time.time() - t_fig7, 2)
    if cfg.snapshot_every and ((epoch + 1) % cfg.snapshot_every == 0 or last):
        save_checkpoint(model, run / "snapshots" / f"epoch_{epoch + 1:04d}",
                        extra={"epoch": epoch + 1, "metrics": record})
    state = {"epoch": epoch + 1, "train_seconds": round(r.elapsed, 1), "metrics": record,
             "data": {"train": r.train_data.source, "test": r.test_data.source,
                      "train_examples": len(r.train_data), "classes": list(r.train_data.classes),
                      **({"validation_images": len(r.val_data)} if r.val_data is not None else {})},
             "environment": provenance(world_size=r.d.world, device=str(r.d.device))}
    if r.stopper is not None:
        state["early_stop"] = r.stopper.state()
    save_run_checkpoint(run / "checkpoint", model, r.opt, r.ema, {"train": train_config_to_dict(cfg), **state},
                        {"objective": r.objective} if r.objective is not None else None)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    if r.progress:
        _note(json.dumps(record))


def _frozen_params(cfg: TrainConfig, model: nn.Module, epoch: int) -> list[nn.Parameter]:
    """The parameters that ``epoch`` leaves unchanged: the whitening stem's bias from epoch ``whiten_bias_epochs``."""
    if cfg.whiten_bias_epochs is not None and epoch >= cfg.whiten_bias_epochs:
        return [model.whiten.bias]
    return []
