"""One table that compares the map methods on a model: faithfulness, sanity and (with masks) localisation."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitlab.base.checks import check_count, check_seed
from vitlab.data.shapes import LOCALISATION_SHAPES
from vitlab.inspect.attribution import ATTRIBUTION_METHODS, attribution_method, require_classifier, target_classes
from vitlab.inspect.capture import check_images
from vitlab.inspect.faithfulness import (
    check_masks,
    deletion_insertion_scorer,
    localisation,
    randomization_sanity,
    randomized_copy,
)
from vitlab.models.info import AnyModel, resolve_model

if TYPE_CHECKING:
    from vitlab.data.datasets import ImageArray

__all__ = ["MethodScores", "compare_methods", "shapes_localisation"]


@dataclass(frozen=True)
class MethodScores:
    """Scores of one method, each averaged over the images (``None`` where not measured)."""

    method: str
    seconds: float  # computing the maps, all images
    deletion_auc: float  # lower is better
    insertion_auc: float  # higher is better
    sanity_spearman: float | None  # map vs the same on re-initialised weights: near 0 is better
    mass_in_mask: float | None = None  # share of positive mass on the object; chance = object area
    pointing: float | None = None  # share of images whose top patch touches the object
    deletion_curve: list[float] = field(default_factory=list, repr=False)
    insertion_curve: list[float] = field(default_factory=list, repr=False)
    fraction: list[float] = field(default_factory=list, repr=False)  # x of the curves: share of patches changed


def compare_methods(model: AnyModel, images: Tensor, target: Tensor | int | None = None, masks: Tensor | None = None,
                    methods: Sequence[str] = tuple(ATTRIBUTION_METHODS), steps: int = 16, sanity: bool = True,
                    random_baseline: bool = True, seed: int = 0, progress: bool | None = None,
                    on_method: Callable[[str], None] | None = None) -> tuple[list[MethodScores], dict[str, Tensor]]:
    """Scores per method (plus a random-map baseline) and the (B, gh, gw) maps, keyed by method.

    ``target`` (B,) classes or one class for every image, default the model's predictions; ``masks`` (B, H, W) adds localisation scores.
    ``on_method``: called with each method's name (``"random map"`` last) as its work begins, for a caller's own
    progress display (``vitlab reproduce``'s bar).
    """
    rm = resolve_model(model)
    model = rm.module
    if isinstance(methods, str):  # one name, not a list: its letters are no method names
        raise TypeError(f"methods must be a list of method names, got the string {methods!r}: pass [{methods!r}]")
    fns = {m: attribution_method(m) for m in methods}  # every name checked before any work
    require_classifier(rm, "compare_methods (its scores follow a class's probability)")
    check_images(images, rm)
    check_count("steps", steps)  # before the prediction and the sanity copy, not in the scorer after them
    seed = check_seed("seed", seed)  # before the prediction, not at the random map after every method
    if masks is not None:  # before any map is computed, not after the first method's minutes
        check_masks(masks, len(images), rm.info_for(images).grid_size)
    target = target_classes(rm, images, target)  # checked once, the same (B,) classes for every method
    rows, maps = [], {}
    names = list(methods) + (["random map"] if random_baseline else [])
    randomized = randomized_copy(model, seed) if sanity and methods else None  # one copy serves every method
    # the baseline and the curves' two ends (unchanged images, baseline) are the same for every map: made once
    faithfulness = deletion_insertion_scorer(rm, images, target, steps=steps) if names else None
    for name in tqdm(names, desc="methods", disable=progress is False or (progress is None and len(names) < 3)):
        if on_method is not None:
            on_method(name)
        t0 = time.perf_counter()
        if name == "random map":
            g = torch.Generator().manual_seed(seed)
            grid = rm.info_for(images).grid_size
            m = torch.rand(len(images), *grid, generator=g).to(images.device)
        else:
            m = fns[name](rm, images, target)
        seconds = time.perf_counter() - t0
        maps[name] = m
        di = faithfulness(m)
        san = None
        if sanity and name != "random map":
            san = float(randomization_sanity(fns[name], model, images, target, original=m,
                                             randomized=randomized).mean())
        loc = localisation(m, masks) if masks is not None else None
        rows.append(MethodScores(
            method=name, seconds=round(seconds, 3), deletion_auc=float(di["deletion"].mean()),
            insertion_auc=float(di["insertion"].mean()), sanity_spearman=san,
            mass_in_mask=None if loc is None else float(loc["mass_in_mask"].mean()),
            pointing=None if loc is None else float(loc["pointing"].mean()),
            deletion_curve=di["deletion_curve"].mean(0).tolist(), insertion_curve=di["insertion_curve"].mean(0).tolist(),
            fraction=di["fraction"].tolist(),
        ))
    return rows, maps


def shapes_localisation(model: nn.Module, n: int = LOCALISATION_SHAPES, sanity: bool = True,
                        progress: bool | None = None, on_method: Callable[[str], None] | None = None
                        ) -> tuple[ImageArray, list[MethodScores], dict[str, Tensor]]:
    """``compare_methods`` on the first ``n`` test shapes (``vitlab.data.datasets.load_shapes("test", n)``: true classes as
    targets, their object masks for the localisation scores), preprocessed as ``model`` expects, on its device:
    what ``vitlab reproduce``'s localisation table and notebook 04 both measure, so they give the same numbers.
    Returns (the shapes' ``ImageArray``, the rows, the maps on the model's device); ``model`` must take
    ``pretrained_cfg``'s input size (the shipped shapes ViT: ``vitlab.models.load.SHAPES_CHECKPOINT``)."""
    from vitlab.data.datasets import load_shapes, normalize

    cfg = model.pretrained_cfg
    data = load_shapes("test", n=n, size=cfg["input_size"][-1])
    x = normalize(data.images, cfg["mean"], cfg["std"]).to(next(model.parameters()).device)
    rows, maps = compare_methods(model, x, data.labels, masks=data.masks, sanity=sanity, progress=progress,
                                 on_method=on_method)
    return data, rows, maps
