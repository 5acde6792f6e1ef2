"""One model's Fig. 7 verdicts as the report and the notebooks both judge them: every form of a convention
(``vitlab.findings.DISTANCE_CONVENTIONS``) measured, and each criterion checked on its controls (``vitlab.controls``).

``distance_conventions`` measures the (L, B, H) attention distances under each convention; ``distance_verdicts`` and
``position_verdicts`` judge them, so that a notebook outside the report (notebook 07) cannot judge differently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitlab import controls, findings
from vitlab.capture import capture_attention
from vitlab.info import ModelInfo
from vitlab.inspect.distance import attention_distance_from_maps
from vitlab.inspect.positions import position_embedding_similarity, position_table
from vitlab.verdict import Verdict

__all__ = ["model_label", "convention_distances", "distance_conventions", "distance_verdicts", "position_verdicts"]


def convention_distances(maps: Tensor, info: ModelInfo) -> tuple[Tensor, Tensor, Tensor]:
    """One layer's (B, H, T, T) attention maps as (B, H) mean attention distances per head and image under each form
    of the distance convention, in the order of ``findings.DISTANCE_CONVENTIONS``: prefix dropped and not
    renormalised (px), renormalised (px), not renormalised (patches)."""
    p = info.num_prefix_tokens
    return (attention_distance_from_maps(maps[None], info.grid_size, info.patch_size, p)[0],
            attention_distance_from_maps(maps[None], info.grid_size, info.patch_size, p, True)[0],
            attention_distance_from_maps(maps[None], info.grid_size, (1, 1), p)[0])


@torch.no_grad()
def distance_conventions(net: nn.Module, x: Tensor, batch_size: int = 32) -> dict[str, Tensor]:
    """{``findings.DISTANCE_CONVENTIONS`` name: (L, B, H) float64 CPU distances} of ``net`` on the preprocessed
    (B, C, H, W) images ``x``, batch by batch, each layer's maps reduced inside the capture: what the prediction pass
    gives ``distance`` (the report), for a model outside the report (notebook 07)."""
    from vitlab.info import model_info

    info = model_info(net, img_size=tuple(x.shape[-2:]))
    parts: list[list[Tensor]] = [[], [], []]
    for chunk in x.split(batch_size):
        got: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

        def reduce(layer: int, maps: Tensor) -> None:
            got[layer] = convention_distances(maps, info)

        with capture_attention(net, reduce=reduce):
            net(chunk)
        for i in range(3):
            parts[i].append(torch.stack([got[layer][i] for layer in sorted(got)]))  # (L, b, H)
    return {name: torch.cat(part, dim=1).double().cpu() for name, part in zip(findings.DISTANCE_CONVENTIONS, parts)}


def distance_verdicts(conventions: dict[str, Tensor], info: ModelInfo) -> list[Verdict]:
    """The Fig. 7 right verdicts (``findings.judge_distance``) on {``findings.DISTANCE_CONVENTIONS`` name: (L, B, H)}
    distances (``distance_conventions``, or the prediction pass's), each criterion checked on its controls
    (``controls.distance_controls``): the one way the report and notebook 07 judge them."""
    ceiling = findings.uniform_attention_distance(info.grid_size, info.patch_size)
    ceilings = dict(zip(findings.DISTANCE_CONVENTIONS, (ceiling, ceiling, findings.uniform_attention_distance(
        info.grid_size, (1, 1)))))
    return controls.validate(findings.judge_distance(conventions, ceilings),
                             controls.distance_controls(conventions[findings.DISTANCE_CONVENTIONS[0]], ceiling))


def position_verdicts(net: nn.Module, info: ModelInfo) -> list[Verdict]:
    """The Fig. 7 centre verdicts (``findings.judge_positions``) on ``net``'s learned position-embedding table, each
    criterion checked on its controls (``controls.position_controls``); [] for a model with no table or a fixed one
    (e.g. 2D sin-cos: its structure is built in, not learned). The one way the report and notebook 07 judge them."""
    if info.pos_embed in ("none", "fixed"):
        return []
    sim = position_embedding_similarity(net).cpu()  # (gh, gw, gh, gw)
    return controls.validate(findings.judge_positions(sim), controls.position_controls(position_table(net).cpu()))


def model_label(net, model: Any) -> str:
    """The model as a verdict's subject names it: "vit_cifar10 (embedded default)", a checkpoint or timm name as
    given, a config's type with its random weights."""
    if model is None:
        ck = getattr(net, "vitlab_checkpoint", {}).get("path")
        return f"{Path(ck).name} (embedded default)" if ck else "embedded default"
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    return f"{type(model).__name__} (random initialisation)"
