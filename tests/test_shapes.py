"""The synthetic shapes: deterministic, balanced, masks that fit the geometry of each class."""

from __future__ import annotations

import math

import torch

from vitlab.data import load_dataset, load_shapes
from vitlab.shapes import SHAPE_CLASSES, make_shapes


def test_deterministic_and_balanced():
    a, b = make_shapes(64, seed=3), make_shapes(64, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], make_shapes(64, seed=4)[0])
    assert torch.bincount(a[1], minlength=4).tolist() == [16, 16, 16, 16]


def test_mask_area_matches_each_shape_formula():
    imgs, labels, masks = make_shapes(400, size=64, seed=0)
    area = masks.flatten(1).sum(1).float()
    # the radius is not returned; recover it from the bounding box of the mask
    rows = masks.any(2).float().sum(1)  # bounding-box height
    cols = masks.any(1).float().sum(1)
    for k, name in enumerate(SHAPE_CLASSES):
        sel = labels == k
        if name == "circle":
            expected = math.pi * (rows[sel] / 2) ** 2
        elif name == "square":
            expected = rows[sel] * cols[sel]
        elif name == "triangle":
            expected = rows[sel] * cols[sel] / 2
        else:  # cross: two bars of width 2 * 0.33 r across a 2r box
            expected = 2 * rows[sel] * (0.66 * rows[sel] / 2) - (0.66 * rows[sel] / 2) ** 2
        ratio = (area[sel] / expected).mean().item()
        assert 0.85 < ratio < 1.15, (name, ratio)


def test_objects_differ_from_background_and_split_loader():
    imgs, labels, masks = make_shapes(32, seed=1)
    x = imgs.float()
    inside = (x * masks[..., None]).sum((1, 2)) / masks.sum((1, 2))[:, None]
    outside = (x * ~masks[..., None]).sum((1, 2)) / (~masks).sum((1, 2))[:, None]
    assert ((inside - outside).abs().sum(1) > 40).float().mean() > 0.9
    d = load_shapes("test", n=8)
    assert d.masks.shape == (8, 32, 32) and d.classes == SHAPE_CLASSES
    assert d.subset([0, 2]).masks.shape == (2, 32, 32)
    assert len(load_dataset("shapes", "test")) == 2000
