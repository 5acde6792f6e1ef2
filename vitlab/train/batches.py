"""Training batches, made ahead of the step: the run's image order, random crop + flip and RandAugment on uint8 images.

Step ``k`` of a run (epoch ``k // steps_per_epoch``, batch ``k % steps_per_epoch``) is a function of the config's
seed, the epoch and the step alone: the epoch's order and flip pattern come from ``(seed, epoch)``, each batch's crops
and RandAugment draws from ``(seed, epoch, step)``. So a batch is the same whichever process makes it and however
many make them, and a resumed run sees exactly the batches an uninterrupted one would.

``training_batches`` serves them through a ``torch.utils.data.DataLoader`` over the run's remaining steps: in the
training process (``workers=0``, the CPU default: on 2 cores the model wants both), or in ``workers`` worker processes
that prepare batches while the model trains (an accelerator's default: its step is far faster than one core's
RandAugment, ~140 us per 32 px image).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from vitlab.base.checks import check_int
from vitlab.data.datasets import ImageArray
from vitlab.train.augment import alternating_flips, random_crop_flip

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["Augment", "TrainBatches", "training_batches", "default_workers", "epoch_flips", "randaugment"]


@dataclass(frozen=True)
class Augment:
    """What a training batch goes through, and the seed everything is drawn from."""

    seed: int = 0
    crop_padding: int = 0
    crop_pad_mode: Literal["constant", "reflect"] = "constant"
    randaugment: str | None = None  # timm RandAugment spec, e.g. "rand-m9-n2-mstd0.5"
    flip: Literal["random", "alternating", "none"] = "random"


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of everything drawn once per epoch (order, mixup, dropout): the run's, offset by the epoch."""
    return (seed * 100_003 + epoch) % 2**31


def epoch_flips(aug: Augment, epoch: int, n: int) -> Tensor | None:
    """(n,) bool: the training images mirrored in ``epoch``, for ``flip="alternating"`` or ``"none"``; None for
    ``"random"`` (a coin per image, drawn with its crop)."""
    if aug.flip == "random":
        return None
    if aug.flip == "none":
        return torch.zeros(n, dtype=torch.bool)
    return alternating_flips(n, epoch, seed=aug.seed * 100_003 + 50_000)  # apart from the epochs' seeds


def randaugment(images: Tensor, spec: str, generator: torch.Generator) -> Tensor:
    """Per-image timm RandAugment on (B, H, W, 3) uint8, seeded from ``generator``. timm draws from Python's and
    numpy's global generators: both are seeded here and restored afterwards, so the caller's streams (numpy's feeds
    timm's Mixup) are the same whether batches are made in this process or in a worker."""
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    seed = int(torch.randint(0, 2**31, (1,), generator=generator))
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        tf = rand_augment_transform(spec, {"translate_const": int(images.shape[1] * 0.45),
                                           "img_mean": (125, 123, 114)})
        for op in tf.ops:
            if op.name.startswith("Posterize"):
                op.aug_fn = posterize
        out = np.empty_like(images.numpy())
        for i, img in enumerate(images.numpy()):
            out[i] = np.asarray(tf(Image.fromarray(img)))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return torch.from_numpy(out)


def posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's Posterize op, keeping 0 bits as the op's mask means it (no bits kept: a black image). The Pillow
    installed here (13) refuses 0 bits, which timm asks for at magnitudes below 2.5 (``Posterize``) or at 10
    (``PosterizeIncreasing``: DeiT's ``rand-m9-mstd0.5-inc1`` reaches it within a few batches), so timm's own op
    would stop a run there. Other bit counts go through timm's op unchanged."""
    from PIL import Image
    from timm.data.auto_augment import posterize as timm_posterize

    if bits_to_keep < 1:
        return Image.new(img.mode, img.size, 0)
    return timm_posterize(img, bits_to_keep)


class TrainBatches(torch.utils.data.Dataset):
    """Item ``k``: step ``k`` of the run, ``(images (B, H, W, 3) uint8 augmented, labels (B,) int64)`` with B the
    global ``batch_size`` (under torchrun every rank makes the whole batch and takes its slice). A run of any length:
    no ``__len__``; the loader's sampler says which steps are wanted."""

    def __init__(self, data: ImageArray, batch_size: int, steps_per_epoch: int, aug: Augment):
        self.images, self.labels = data.images, data.labels
        self.batch_size, self.steps, self.aug = batch_size, steps_per_epoch, aug
        self._epoch: int | None = None
        self._order: Tensor | None = None
        self._flips: Tensor | None = None

    def epoch_order(self, epoch: int) -> Tensor:
        """(N,) the order in which ``epoch`` visits the training images."""
        g = torch.Generator().manual_seed(epoch_seed(self.aug.seed, epoch))
        return torch.randperm(len(self.labels), generator=g)

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        epoch, it = divmod(int(k), self.steps)
        if epoch != self._epoch:  # a worker (or the loop) meets each epoch's steps in order: compute these once
            self._epoch, self._order = epoch, self.epoch_order(epoch)
            self._flips = epoch_flips(self.aug, epoch, len(self.labels))
        idx = self._order[it * self.batch_size : (it + 1) * self.batch_size]
        g = torch.Generator().manual_seed((epoch_seed(self.aug.seed, epoch) * 1_000_003 + it) % 2**62)
        imgs = self.images[idx]
        if self.aug.crop_padding or self._flips is not None:
            imgs = random_crop_flip(imgs, self.aug.crop_padding, g, self.aug.crop_pad_mode,
                                    None if self._flips is None else self._flips[idx])
        if self.aug.randaugment:
            imgs = randaugment(imgs, self.aug.randaugment, g)
        return imgs, self.labels[idx]


def default_workers(device: torch.device) -> int:
    """Worker processes for ``device``: none on a CPU (the training step needs its cores; augmentation is ~5% of a
    2-core CPU step), else all cores but two (one for the training process, one for the system), at most 16."""
    if device.type == "cpu":
        return 0
    return max(0, min(16, (os.cpu_count() or 1) - 2))


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # each worker is one core's worth of augmentation
    # the loader stops a slow worker with SIGTERM: end it, not raise the `vitlab` command's Terminated (forked with
    # its handler) with a traceback per worker
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def training_batches(data: ImageArray, batch_size: int, steps_per_epoch: int, aug: Augment, start_step: int,
                     stop_step: int, workers: int = 0, pin_memory: bool = False) -> torch.utils.data.DataLoader:
    """A loader yielding steps ``start_step .. stop_step - 1`` of the run, each ``(images, labels)`` as
    ``TrainBatches`` makes them; ``workers`` > 0 makes them in that many processes, ``4 * workers`` batches ahead."""
    # 1.5 is no process count, True no 1
    check_int("workers", workers, 0, allowed="a whole number >= 0 (0: batches made in the training process)",
              numpy=True)
    extra = {}
    if workers:
        methods = multiprocessing.get_all_start_methods()  # fork shares the decoded images instead of pickling them
        extra = dict(prefetch_factor=4, worker_init_fn=_worker_init,
                     multiprocessing_context="fork" if "fork" in methods else None)
    return torch.utils.data.DataLoader(TrainBatches(data, batch_size, steps_per_epoch, aug),
                                       sampler=range(start_step, stop_step), batch_size=None, num_workers=workers,
                                       pin_memory=pin_memory, **extra)
