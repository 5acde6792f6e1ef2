"""Raghu et al. 2021 ("Do Vision Transformers See Like Convolutional Neural Networks?", NeurIPS) as verdicts
(``vitlab.findings.verdict``) on the linear CKA between the layers of a ViT (model a) and a ResNet (model b) on the same
images (``vitlab.inspect.cka.similarity_tables``).

Two findings, each with a stable key:

* ``raghu.uniformity`` (their Fig. 1): the ViT's representations are more uniform across depth than the ResNet's:
  its lower and higher layers are more alike. Statistic: the mean CKA between a model's lower half of layers and its
  upper half (the middle layer of an odd depth left out), the ViT's minus the ResNet's; threshold 0.
* ``raghu.lower_layers`` (their Fig. 2): the lower half of the ResNet's layers is similar to the lowest quarter of
  the ViT's. Statistic: the mean CKA between the ViT's lowest quarter of layers (at least one) and the ResNet's lower
  half, minus that between the same ViT layers and the ResNet's upper half; threshold 0.

Layers are compared by their share of the model's depth (halves and quarters of each model's own layers), so models
of different depths compare. Intervals: 95% jackknife over images (``vitlab.base.intervals.jackknife_interval``), each image
left out of the mini-batch CKA in turn, from ``MIN_IMAGES`` images on. Each finding is judged under both ways of
reading a layer (``REPRESENTATION_CONVENTIONS``: the whole token sequence or feature map, and the mean over patches
or positions), combined by ``vitlab.findings.verdict.across_conventions``; their controls are ``vitlab.findings.controls``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from torch import Tensor

from vitlab.base.intervals import jackknife_interval, n_units, none_reason
from vitlab.findings.verdict import Verdict, across_conventions, make_verdict
from vitlab.inspect.cka import SimilarityTables

__all__ = ["KEY_UNIFORMITY", "KEY_LOWER_LAYERS", "KEYS", "UNIFORMITY", "LOWER_LAYERS", "REPRESENTATION_CONVENTIONS",
           "REPRESENTATION_WORDS", "MIN_IMAGES", "lower_half", "upper_half", "lowest_quarter", "half_similarity", "uniformity",
           "lower_layers", "judge_similarity"]

KEY_UNIFORMITY = "raghu.uniformity"
KEY_LOWER_LAYERS = "raghu.lower_layers"
KEYS = (KEY_UNIFORMITY, KEY_LOWER_LAYERS)
UNIFORMITY = "Raghu et al. 2021: the ViT's representations are more uniform across depth than the ResNet's"
LOWER_LAYERS = "Raghu et al. 2021: the ViT's lowest layers resemble the ResNet's lower half"
#: the ways of reading a layer the verdicts are judged under, the first one's numbers shown
#: (``vitlab.inspect.cka.REPRESENTATIONS``; the class token is left out: a ResNet has none)
REPRESENTATION_CONVENTIONS = ("tokens", "patch_mean")
#: each representation in words, as the verdicts name the conventions
REPRESENTATION_WORDS = {"tokens": "every token (a ResNet stage: its whole feature map)",
                        "patch_mean": "the mean over patches (a ResNet stage: over positions)",
                        "cls": "the class token"}
#: the fewest images the jackknife decides from, as the Fig. 7 right verdicts' bootstrap (below: no interval)
MIN_IMAGES = 16


def lower_half(layers: int) -> list[int]:
    """The lower half of ``layers`` layers (0-based; the middle one of an odd count in neither half)."""
    return list(range(layers // 2))


def upper_half(layers: int) -> list[int]:
    """The upper half of ``layers`` layers (0-based; the middle one of an odd count in neither half)."""
    return list(range(layers - layers // 2, layers))


def lowest_quarter(layers: int) -> list[int]:
    """The lowest quarter of ``layers`` layers, rounded up (at least the first layer)."""
    return list(range(max(1, math.ceil(layers / 4))))


def half_similarity(sim: Tensor | np.ndarray) -> np.ndarray:
    """Mean CKA between a model's lower and upper half of layers, from its (..., L, L) CKA with itself: (...)."""
    s = np.asarray(sim, dtype=np.float64)
    L = s.shape[-1]
    return s[..., lower_half(L), :][..., upper_half(L)].mean((-2, -1))


def _check(tables: SimilarityTables, need: int) -> None:
    la, lb = tables.aa.shape[-1], tables.bb.shape[-1]
    if min(la, lb) < need:
        raise ValueError(f"the findings need at least {need} layers in each model (halves of layers to compare), got "
                         f"{la} and {lb}")


def _missing(tables: SimilarityTables, method: str) -> str | None:
    if tables.images < MIN_IMAGES:
        return f"{n_units(tables.images, 'images')}, at least {MIN_IMAGES} needed"
    return none_reason(method)


def _interval(stat: float, loo: np.ndarray, tables: SimilarityTables) -> tuple[tuple[float, float], str, str | None]:
    interval, method = jackknife_interval(stat, loo, "images")
    missing = _missing(tables, method)
    return ((math.nan, math.nan) if missing else interval), method, missing


def uniformity(tables: SimilarityTables) -> Verdict:
    """Raghu et al. Fig. 1: the ViT (model a of ``tables``) has more uniform representations across depth than the
    ResNet (model b): more similarity between its lower and upper layers.

    Statistic: ``half_similarity`` of a's CKA with itself minus b's (each a mean over its lower-half x upper-half
    layer pairs); threshold 0. Interval: 95% jackknife over images. Both models need at least 2 layers.
    """
    _check(tables, 2)
    aa, bb, _ = (t.numpy() for t in tables.cka())
    jaa, jbb, _ = (t.numpy() for t in tables.jackknife())
    ua, ub = float(half_similarity(aa)), float(half_similarity(bb))
    stat = ua - ub
    interval, method, missing = _interval(stat, half_similarity(jaa) - half_similarity(jbb), tables)
    la, lb = aa.shape[-1], bb.shape[-1]
    return make_verdict(
        UNIFORMITY,
        "mean CKA between the ViT's lower-half and upper-half layers minus the same for the ResNet > 0 (a middle "
        f"layer of an odd depth in neither half); 95% {method} (at least {MIN_IMAGES}). Halves of each model's own "
        "depth, so that models of different depths compare; the mean over every pair of a lower and an upper layer, "
        "not the first against the last, because the finding is about the whole depth",
        stat, interval, 0.0, ">", "CKA difference", "",
        {"vit_half_cka": ua, "resnet_half_cka": ub, "vit_layers": la, "resnet_layers": lb,
         "vit_lower": lower_half(la), "vit_upper": upper_half(la), "resnet_lower": lower_half(lb),
         "resnet_upper": upper_half(lb), "images": tables.images, "batches": len(tables.aa),
         "representation": tables.representation, "interval_method": method},
        missing, key=KEY_UNIFORMITY,
        threshold_source="the null of equal uniformity: a model against itself differs by 0")


def lower_layers(tables: SimilarityTables) -> Verdict:
    """Raghu et al. Fig. 2: the ViT's lowest layers (model a of ``tables``) resemble the ResNet's (model b) lower
    half of layers.

    Statistic: the mean CKA between a's ``lowest_quarter`` and b's ``lower_half``, minus that between a's lowest
    quarter and b's ``upper_half``; threshold 0. Interval: 95% jackknife over images. b needs at least 2 layers.
    """
    _check(tables, 2)
    ab = tables.cka()[2].numpy()
    jab = tables.jackknife()[2].numpy()
    la, lb = ab.shape
    rows, low, up = lowest_quarter(la), lower_half(lb), upper_half(lb)

    def contrast(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        part = x[..., rows, :]
        return part[..., low].mean((-2, -1)), part[..., up].mean((-2, -1))

    lo_cka, up_cka = contrast(ab)
    stat = float(lo_cka - up_cka)
    interval, method, missing = _interval(stat, np.subtract(*contrast(jab)), tables)
    # where in the ResNet each ViT layer's similarity lies: its CKA-weighted share of the ResNet's depth (0 to 1)
    depth = np.linspace(0.0, 1.0, lb)
    weights = np.clip(ab, 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = (weights * depth).sum(1) / weights.sum(1)
    return make_verdict(
        LOWER_LAYERS,
        f"mean CKA between the ViT's lowest quarter of layers ({n_units(len(rows), 'layers')}) and the ResNet's "
        "lower half minus that with the ResNet's upper half > 0; 95% "
        f"{method} (at least {MIN_IMAGES}). A contrast between the ResNet's halves, not the CKA's size, because CKA "
        "between two different models is lower everywhere; the finding is where in the ResNet the ViT's lowest "
        "layers find their match",
        stat, interval, 0.0, ">", "CKA difference", "",
        {"lower_half_cka": float(lo_cka), "upper_half_cka": float(up_cka), "vit_rows": rows, "resnet_lower": low,
         "resnet_upper": up, "resnet_depth_of_match": centre, "images": tables.images, "batches": len(tables.aa),
         "representation": tables.representation, "interval_method": method},
        missing, key=KEY_LOWER_LAYERS,
        threshold_source="no preference between the ResNet's halves: a ResNet whose layers were all alike scores 0")


def judge_similarity(tables: Mapping[str, SimilarityTables]) -> list[Verdict]:
    """Both verdicts under each way of reading a layer (``across_conventions``, each convention named by
    ``REPRESENTATION_WORDS``): ``[uniformity, lower_layers]``. ``tables``: {representation: the ViT (a) against the
    ResNet (b)}, e.g. keyed by ``REPRESENTATION_CONVENTIONS``, the first one's numbers shown."""
    if not tables:
        raise ValueError("judge_similarity needs the tables of at least one representation")
    words = {name: REPRESENTATION_WORDS.get(name, name) for name in tables}
    return [across_conventions({words[name]: uniformity(t) for name, t in tables.items()}),
            across_conventions({words[name]: lower_layers(t) for name, t in tables.items()})]
