"""Training augmentations on whole batches of tensors: random crop and flip of uint8 images, the alternating flip
pattern of an epoch, and the downsampling of normalised inputs for progressive resizing.

They draw from the ``torch.Generator`` (or the seed) they are given, never from global state, so a batch is a function
of its seeds (``vitlab.train.batches``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["random_crop_flip", "alternating_flips", "shrink"]


def random_crop_flip(images: Tensor, padding: int, generator: torch.Generator, mode: str = "constant",
                     flip: Tensor | None = None) -> Tensor:
    """(B, H, W, C) uint8 -> same shape: pad by ``padding`` (zeros, or ``mode="reflect"``), random crop back,
    random horizontal flip. ``flip`` (B,) bool mirrors exactly the images it marks instead of a coin drawn per
    image (e.g. ``alternating_flips``); then no flip coins are drawn from ``generator``."""
    B, H, W, C = images.shape
    if mode == "reflect":
        padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), (padding,) * 4, mode="reflect")
        padded = padded.to(images.dtype).permute(0, 2, 3, 1)
    else:
        padded = torch.nn.functional.pad(images, (0, 0, padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (B,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (B,), generator=generator)
    rows = (dy[:, None] + torch.arange(H)[None])[:, :, None]  # (B, H, 1)
    cols = dx[:, None] + torch.arange(W)[None]  # (B, W)
    if flip is None:
        flip = torch.rand(B, generator=generator) < 0.5
    elif flip.shape != (B,) or flip.dtype != torch.bool:
        raise ValueError(f"flip must be a ({B},) bool tensor, one entry per image; got {tuple(flip.shape)} "
                         f"{flip.dtype}")
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]  # (B, 1, W)
    return padded[torch.arange(B)[:, None, None], rows, cols]


def alternating_flips(n: int, epoch: int, seed: int) -> Tensor:
    """(n,) bool: which of ``n`` training images to mirror in ``epoch`` under alternating flipping (Jordan 2024,
    "94% on CIFAR-10 in 3.29 seconds", a derandomised flip): epoch 0 mirrors each image on a coin drawn from
    ``seed``; every later epoch mirrors exactly the images the epoch before did not, so any two consecutive
    epochs show every image both ways. A function of ``(seed, epoch)`` alone: nothing to save for a resume."""
    first = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < 0.5
    return first ^ bool(epoch % 2)


def shrink(x: Tensor, size: int) -> Tensor:
    """(B, C, H, W) -> (B, C, size, size): a batch downsampled bilinearly with antialiasing, after normalisation
    (progressive resizing: what a ViT sees in its small-image phase)."""
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
