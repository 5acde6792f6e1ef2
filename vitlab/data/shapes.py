"""A synthetic dataset of shapes on textured backgrounds, with ground-truth object masks.

Deterministic from a seed. Four classes (circle, square, triangle, cross) of random size, position and
colour on a background of random oriented stripes plus noise, so that the class is carried by the shape
alone. The masks say where the object is: the attention-rollout localisation score uses them.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from vitlab.base.checks import check_count, check_seed, whole_index

SHAPE_CLASSES = ("circle", "square", "triangle", "cross")

#: How many test shapes the localisation scores are measured on (``vitlab.inspect.shapes_localisation``: the
#: report's localisation table and notebook 04 alike, so that both give the same numbers)
LOCALISATION_SHAPES = 32


def _shape_mask(kind: int, yy: Tensor, xx: Tensor, cy: Tensor, cx: Tensor, r: Tensor) -> Tensor:
    """(N, H, W) bool masks of one kind; yy/xx (H, W) pixel centres, cy/cx/r (N, 1, 1)."""
    dy, dx = yy - cy, xx - cx
    if kind == 0:
        return dy**2 + dx**2 <= r**2
    if kind == 1:
        s = r * 0.85
        return (dy.abs() <= s) & (dx.abs() <= s)
    if kind == 2:  # upward triangle: apex r above (cy, cx), base 0.7 r below it and 2.2 r wide
        top, base = -r, r * 0.7
        inside_y = (dy >= top) & (dy <= base)
        half_width = (dy - top) / (base - top) * r * 1.1
        return inside_y & (dx.abs() <= half_width)
    arm = r * 0.33
    return ((dy.abs() <= arm) & (dx.abs() <= r)) | ((dx.abs() <= arm) & (dy.abs() <= r))


def make_shapes(n: int, size: int = 32, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` images: (n, size, size, 3) uint8, labels (n,) int64, masks (n, size, size) bool.

    ``size`` is at least 11 px: below, a small cross's arms (0.66 of a radius of 14% of the side) can fall between
    the pixel centres, leaving an image of that class with no object at all. ``n``, ``size`` and ``seed`` are whole
    numbers (NumPy integers too): n=True is no 1 image, nor n=2.5 a count."""
    check_count("n", operator.index(n) if whole_index(n) else n)
    if not whole_index(size) or size < 11:
        raise ValueError(f"shapes need images of at least 11 px (smaller ones can hold no pixel of a thin cross), "
                         f"a whole number, got size={size!r}")
    n, size = operator.index(n), operator.index(size)
    g = torch.Generator().manual_seed(check_seed("seed", seed))
    yy, xx = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    labels = torch.arange(n) % len(SHAPE_CLASSES)
    labels = labels[torch.randperm(n, generator=g)]
    r = (torch.rand(n, generator=g) * 0.18 + 0.14) * size  # radius 14%..32% of the side
    cy = r + torch.rand(n, generator=g) * (size - 2 * r)
    cx = r + torch.rand(n, generator=g) * (size - 2 * r)
    r, cy, cx = r.view(n, 1, 1), cy.view(n, 1, 1), cx.view(n, 1, 1)
    masks = torch.zeros(n, size, size, dtype=torch.bool)
    for k in range(len(SHAPE_CLASSES)):
        sel = labels == k
        if sel.any():
            masks[sel] = _shape_mask(k, yy, xx, cy[sel], cx[sel], r[sel])
    # background: oriented stripes of random frequency and colour, plus pixel noise
    theta = torch.rand(n, 1, 1, generator=g) * math.pi
    freq = (torch.rand(n, 1, 1, generator=g) * 0.5 + 0.15)
    stripes = torch.sin((xx * torch.cos(theta) + yy * torch.sin(theta)) * freq * 2 * math.pi)  # (n, H, W)
    base = torch.rand(n, 1, 1, 3, generator=g) * 0.6 + 0.2
    amp = torch.rand(n, 1, 1, 3, generator=g) * 0.25
    bg = base + amp * stripes[..., None] + 0.06 * torch.randn(n, size, size, 3, generator=g)
    colour = torch.rand(n, 1, 1, 3, generator=g)
    # a colour too close to the background is inverted, which separates most of them (about 1.6% of objects stay
    # within 0.5 of the background after the inversion)
    too_close = (colour - base).abs().sum(-1, keepdim=True) < 0.5
    colour = torch.where(too_close, 1 - colour, colour)
    fg = colour + 0.04 * torch.randn(n, size, size, 3, generator=g)
    img = torch.where(masks[..., None], fg, bg).clamp(0, 1)
    return (img * 255).round().to(torch.uint8), labels, masks
