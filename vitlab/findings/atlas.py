"""The criteria of the head atlas and the token diagnostics (issue 49, beyond the paper), on the tensors of
``vitlab.inspect.heads`` and ``vitlab.inspect.tokens``.

* ``GROUP_CRITERION``: whether the lowest layers' local heads, and their global heads, matter for the prediction
  (``head_group_effects``: the nearer and the farther half of the lowest ``LOWEST_SHARE`` of the blocks' heads by
  mean attention distance, each group's mean drop in log p(true class) per head with a 95% interval over images).
* ``OUTLIER_CRITERION``: whether high-norm outlier patches are present (Darcet et al. 2024, "Vision Transformers Need
  Registers"; ``outlier_layers``).
* How much mean attention distance and rollout change between the prefix conventions
  (``distance_convention_change``, ``rollout_convention_change``).

These statements are not the paper's findings, so they are no ``Verdict`` rows of the findings table: each is a
stated criterion on a 95% interval, decided by ``vitlab.findings.verdict.decide``. The report's sections
(``vitlab.report.atlas``) and notebook 10 format what these return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitlab.base.intervals import N_BOOT, SEED, fmt_value, mean_interval
from vitlab.findings import model as findings
from vitlab.findings.verdict import decide
from vitlab.inspect.heads import GLOBAL, LOCAL, HeadImportance, head_groups
from vitlab.inspect.tokens import TokenNorms

__all__ = ["LOWEST_SHARE", "MATTERS_NATS", "GROUP_CRITERION", "MATTERS", "OUTLIER_SHARE", "OUTLIER_RATIO",
           "OUTLIER_CRITERION", "GroupEffect", "HeadGroups", "mean_and_interval", "lowest_layers", "group_effect",
           "head_group_effects", "local_minus_global", "outlier_layers", "fence_words", "distance_convention_change", "rollout_convention_change"]

#: the share of the blocks counted as the lowest layers (at least one block)
LOWEST_SHARE = 0.25
#: a group of heads matters when the 95% interval of its mean drop per head lies above this many nats (a drop of
#: 0.01 nats is a 1% lower probability of the true class), does not when it lies below
MATTERS_NATS = 0.01
GROUP_CRITERION = (f"a group of heads matters for the prediction when the 95% interval over images of its mean drop "
                   f"in log p(true class) per head, with one head ablated at a time, lies above {MATTERS_NATS} nats; "
                   "it does not when the interval lies below; otherwise undecided")
#: how ``decide``'s words read for a group of heads
MATTERS = {"reproduced": "matters", "not reproduced": "does not matter", "inconclusive": "undecided"}
#: outlier patches: above their layer's Tukey far-out fence (``vitlab.inspect.tokens``) in at least this share of
#: the patches (interval over images), with a median norm at least ``OUTLIER_RATIO`` times the layer's median
OUTLIER_SHARE = 0.005
OUTLIER_RATIO = 2.0
OUTLIER_CRITERION = (f"high-norm outliers are present in a layer when the share of its patches above the far-out "
                     f"fence Q3 + 3 IQR of its patch norms has a 95% interval over images above {OUTLIER_SHARE:.1%} "
                     f"and those patches' median norm is at least {OUTLIER_RATIO:g}x the layer's median patch norm; "
                     f"absent when the interval lies below {OUTLIER_SHARE:.1%} or the norm ratio is under "
                     f"{OUTLIER_RATIO:g}x; present in the model when in any layer, absent when in none is it present "
                     "or undecided")


def mean_and_interval(values: np.ndarray | Tensor) -> tuple[float, tuple[float, float], str]:
    """The mean of per-image ``values`` (B,), its 95% interval over images (``mean_interval``) and the interval's
    method; values without spread (every image alike, e.g. a head whose output no weight reads) have the degenerate
    interval at their value. No values: NaN and no interval."""
    v = np.asarray(values, dtype=np.float64)
    iv, method = mean_interval(v, N_BOOT, SEED, "images")
    if not math.isfinite(iv[0]) and len(v) >= 2 and np.all(v == v[0]):
        iv, method = (float(v[0]), float(v[0])), f"none needed: all {len(v)} images give {v[0]:.3g}"
    return float(v.mean()) if len(v) else math.nan, (float(iv[0]), float(iv[1])), method


@dataclass(frozen=True)
class GroupEffect:
    """One group of heads under one ablation: its heads ((layer, head), 0-based), their mean attention distances
    (px, min and max), the mean over images of the group's mean drop in log p(true class) per head (nats) with its
    95% interval and the interval's method, the mean accuracy drop per head (a fraction), and ``matters``: "matters",
    "does not matter" or "undecided" (``GROUP_CRITERION``)."""

    heads: tuple[tuple[int, int], ...]
    distance_px: tuple[float, float]
    drop: float
    interval: tuple[float, float]
    method: str
    accuracy_drop: float
    matters: str


@dataclass(frozen=True)
class HeadGroups:
    """The lowest layers' heads split by distance, and their effects: ``lowest`` (how many blocks), ``codes`` (L, H)
    (``vitlab.inspect.heads.head_groups``: 0 above the lowest blocks, ``LOCAL``, ``GLOBAL``) and ``effects``
    {ablation: {"local": GroupEffect or None, "global": ...}} (None: an empty group)."""

    lowest: int
    codes: Tensor
    effects: dict[str, dict[str, GroupEffect | None]]


def lowest_layers(depth: int) -> int:
    """How many blocks count as the lowest layers: ``LOWEST_SHARE`` of ``depth``, rounded, at least one."""
    return max(1, round(LOWEST_SHARE * depth))


def group_effect(res: HeadImportance, mask: Tensor, distance: Tensor) -> GroupEffect | None:
    """The effect of the heads in ``mask`` (L, H) bool under ``res``'s ablation, ``distance`` (L, H) their mean
    attention distances (px); None for an empty group."""
    if not bool(mask.any()):
        return None
    per_image = res.per_image_drop[mask].double().mean(0).numpy()  # (B,) the group's mean drop per head
    drop, iv, method = mean_and_interval(per_image)
    d = distance[mask]
    return GroupEffect(heads=tuple((int(i), int(j)) for i, j in mask.nonzero().tolist()),
                       distance_px=(float(d.min()), float(d.max())), drop=drop, interval=iv, method=method,
                       accuracy_drop=float(res.accuracy_drop[mask].mean()),
                       matters=MATTERS[decide(iv, MATTERS_NATS, ">")])


def head_group_effects(res: Mapping[str, HeadImportance], distance: Tensor) -> HeadGroups:
    """``GROUP_CRITERION`` on every ablation in ``res`` ({ablation: ``head_importance`` of every block}) with the
    heads' (L, H) mean attention distances ``distance`` (px, mean over images). Raises ValueError when the shapes of
    the two differ (e.g. a block of two parallel attentions in one and not the other)."""
    distance = distance.double().cpu()
    for a, r in res.items():
        if tuple(r.logprob_drop.shape) != tuple(distance.shape):
            raise ValueError(f"the {a} ablation's heads {tuple(r.logprob_drop.shape)} are not the "
                             f"{tuple(distance.shape)} heads of the distances: measure both on every block")
    k = lowest_layers(len(distance))
    codes = head_groups(distance, k)
    effects = {a: {"local": group_effect(r, codes == LOCAL, distance), "global": group_effect(r, codes == GLOBAL,
                                                                                                distance)}
               for a, r in res.items()}
    return HeadGroups(lowest=k, codes=codes, effects=effects)


def local_minus_global(res: HeadImportance, codes: Tensor) -> tuple[float, tuple[float, float], str] | None:
    """How much more the lowest layers' local heads matter than their global heads under ``res``'s ablation: per
    image, the local group's mean drop in log p(true class) per head minus the global group's (nats), its mean over
    images, 95% interval and the interval's method. ``codes``: ``HeadGroups.codes``. None when a group is empty."""
    local, far = codes == LOCAL, codes == GLOBAL
    if not (bool(local.any()) and bool(far.any())):
        return None
    diff = res.per_image_drop[local].double().mean(0) - res.per_image_drop[far].double().mean(0)  # (B,)
    return mean_and_interval(diff.numpy())


def outlier_layers(norms: TokenNorms) -> tuple[str, list[dict[str, Any]]]:
    """The outlier verdict ("present", "absent" or "undecided", ``OUTLIER_CRITERION``) and per layer (1-based
    ``layer``): the ``share`` of outlier patches with its ``interval`` over images and its ``method``, the
    ``norm_ratio`` of the outliers' median to the layer's median patch norm (NaN without outliers), the ``fence`` and
    the layer's ``verdict``."""
    rows = []
    patches = norms.patch_norms.double()  # (L, B, N)
    for layer in range(len(patches)):
        per_image = norms.outliers[layer].double().mean(1).numpy()  # (B,)
        share, iv, method = mean_and_interval(per_image)
        flat, out = patches[layer].reshape(-1), norms.outliers[layer].reshape(-1)
        ratio = float(flat[out].median() / flat.median()) if bool(out.any()) else math.nan
        big = ratio >= OUTLIER_RATIO
        state = ("present" if big and iv[0] > OUTLIER_SHARE else
                 "absent" if iv[1] < OUTLIER_SHARE or not big else "undecided")
        rows.append({"layer": layer + 1, "share": share, "interval": list(iv), "method": method, "norm_ratio": ratio,
                     "fence": float(norms.fences[layer]), "verdict": state})
    states = {r["verdict"] for r in rows}
    return ("present" if "present" in states else "undecided" if "undecided" in states else "absent"), rows


def fence_words(row: dict[str, Any]) -> str:
    """The share of patches above the fence in a row of ``outlier_layers`` (the layer with the most, as the report
    and notebook 10 pick it), in words: "none in any layer" when that share is 0."""
    if not row["share"] > 0:
        return "none in any layer"
    lo, hi = row["interval"]
    return (f"at most {fmt_value(row['share'])} [{fmt_value(lo)}, {fmt_value(hi)}] (layer {row['layer']}, their median "
            f"norm {fmt_value(row['norm_ratio'])}x the layer's)")


def distance_convention_change(conventions: Mapping[str, Tensor], ceiling: float) -> dict[str, Any]:
    """How much mean attention distance changes when the prefix keys' share is renormalised away: ``conventions``
    {``findings.DISTANCE_CONVENTIONS`` name: (L, B, H) distances} (``vitlab.findings.judge.distance_conventions``),
    its first two compared. Per layer the head mean in both (px), the largest change of a layer's head mean (and its
    1-based layer) and of a single head, in px and as a share of the uniform-attention distance ``ceiling`` (px)."""
    plain, renorm = (conventions[n].double().mean(1) for n in findings.DISTANCE_CONVENTIONS[:2])  # (L, H)
    layer_change = (renorm.mean(1) - plain.mean(1)).abs()
    head_change = (renorm - plain).abs()
    i = int(layer_change.argmax())
    return {"plain_px": plain.mean(1).tolist(), "renormalised_px": renorm.mean(1).tolist(),
            "largest_layer_change_px": float(layer_change[i]), "largest_layer": i + 1,
            "largest_head_change_px": float(head_change.max()),
            "largest_layer_change_share": float(layer_change[i]) / ceiling,
            "largest_head_change_share": float(head_change.max()) / ceiling}


def rollout_convention_change(per_image: Mapping[str, Tensor]) -> dict[str, dict[str, Any]]:
    """``vitlab.inspect.tokens.rollout_prefix_change``'s per-image values -> {name: {"mean", "interval" [lo, hi]
    (95% over images), "method"}} for each of its "spearman", "total_variation" and "prefix_mass"."""
    out = {}
    for name, v in per_image.items():
        m, iv, method = mean_and_interval(torch.as_tensor(v).double().numpy())
        out[name] = {"mean": m, "interval": list(iv), "method": method}
    return out
