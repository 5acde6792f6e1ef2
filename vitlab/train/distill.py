"""DeiT-style distillation from a teacher checkpoint: the frozen teacher (``load_teacher``), the student's batch
re-expressed in the teacher's normalisation and memory format (``teacher_input``), and the loss that splits itself
between the labels through the class token and the teacher through the distillation token (``distill_loss``, on
``soft_cross_entropy``, the loss against soft targets that the training loop uses without a teacher too).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.base.errors import MissingPathError, Placeholder, Setting
from vitlab.models.checkpoint import load_checkpoint, resolve_folder
from vitlab.models.cifarnet import CifarResNet
from vitlab.train.config import TrainConfig

__all__ = ["load_teacher", "teacher_input", "soft_cross_entropy", "distill_loss"]


def load_teacher(path: str | os.PathLike, device: torch.device) -> nn.Module:
    """A frozen teacher in eval mode from a vitlab checkpoint folder (relative paths: to the cwd, then the repo).
    The CNN teacher (``vitlab.models.cifarnet.CifarResNet``) comes in channels_last, which ``teacher_input`` matches: its
    forward is faster that way on a CPU (``benchmarks/train_speed.py``). Other teachers keep their layout."""
    p = resolve_folder(path)
    if not (p / "config.json").is_file():
        raise MissingPathError("teacher", os.fspath(path), problem="no teacher checkpoint there", config=True, fix=[
            "train it first (vitlab train --preset resnet_cifar10_fast, then vitlab export)",
            Setting("teacher", Placeholder("FOLDER"), config=True)])
    teacher = load_checkpoint(p).to(device).eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    if (fmt := _teacher_layout(teacher)) is not None:
        teacher.to(memory_format=fmt)
    return teacher


def _teacher_layout(teacher: nn.Module) -> torch.memory_format | None:
    """The memory format a teacher runs in, the one place that decides it: channels_last for the CNN teacher; None
    (left as it is) for any other."""
    return torch.channels_last if isinstance(teacher, CifarResNet) else None


def teacher_input(x: Tensor, student_cfg: dict, teacher: nn.Module) -> Tensor:
    """(B, 3, H, W) normalised for the student -> the same images normalised for ``teacher``, in its memory
    format (channels_last for the CNN teacher from ``load_teacher``)."""
    x = _renormalize(x, student_cfg, teacher.pretrained_cfg)
    fmt = _teacher_layout(teacher)
    return x if fmt is None else x.contiguous(memory_format=fmt)


def _renormalize(x: Tensor, src: dict, dst: dict) -> Tensor:
    """``x`` normalised with ``src``'s mean and std, re-expressed with ``dst``'s (a no-op when they agree)."""
    if tuple(src["mean"]) == tuple(dst["mean"]) and tuple(src["std"]) == tuple(dst["std"]):
        return x

    def col(v):
        return torch.tensor(v, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)

    return (x * col(src["std"]) + col(src["mean"]) - col(dst["mean"])) / col(dst["std"])


def soft_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy against (B, K) soft targets (label smoothing, mixup), averaged over the batch."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def distill_loss(logits: Tensor, dist_logits: Tensor, teacher_logits: Tensor, target: Tensor,
                  cfg: TrainConfig) -> Tensor:
    """DeiT: half the loss on the labels through the class token, half on the teacher through the
    distillation token (its argmax for ``hard``; KL divergence at temperature ``distill_tau`` for ``soft``). The soft
    term is the KL divergence per image, the DeiT paper's formula; DeiT's reference code divides the summed KL by
    every logit (B x K), which makes its soft term K times smaller (10 times for CIFAR-10): compare soft-target
    numbers with that code's only after scaling."""
    base = soft_cross_entropy(logits, target)
    if cfg.distill == "hard":
        dist = F.cross_entropy(dist_logits.float(), teacher_logits.argmax(-1))
    else:
        tau = cfg.distill_tau
        dist = F.kl_div(F.log_softmax(dist_logits.float() / tau, -1), F.log_softmax(teacher_logits.float() / tau, -1),
                        reduction="batchmean", log_target=True) * tau * tau
    return 0.5 * base + 0.5 * dist
