"""One model's Fig. 7 verdicts as the report and the notebooks both judge them: every form of a convention
(``vitlab.findings.model.DISTANCE_CONVENTIONS``) measured, and each criterion checked on its controls (``vitlab.findings.controls``).

``distance_conventions`` measures the (L, B, H) attention distances under each convention; ``distance_verdicts`` and
``position_verdicts`` judge them, so that a notebook outside the report (notebook 07) cannot judge differently.
``mpp_verdicts`` judges the MPP study's records the same way for the command, the report and notebook 07.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitlab.findings import controls, similarity, studies
from vitlab.findings import model as findings
from vitlab.findings.verdict import Verdict
from vitlab.inspect.capture import capture_attention
from vitlab.inspect.cka import SimilarityTables, similarity_tables
from vitlab.inspect.distance import attention_distance_from_maps, uniform_attention_distance
from vitlab.inspect.positions import position_embedding_similarity, position_table
from vitlab.models.info import AnyModel, ModelInfo, resolve_model
from vitlab.probe.features import READOUTS

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
def distance_conventions(net: AnyModel, x: Tensor, batch_size: int = 32) -> dict[str, Tensor]:
    """{``findings.DISTANCE_CONVENTIONS`` name: (L, B, H) float64 CPU distances} of ``net`` on the preprocessed
    (B, C, H, W) images ``x``, batch by batch, each layer's maps reduced inside the capture: what the prediction pass
    gives ``distance`` (the report), for a model outside the report (notebook 07). A wrapped model runs as the module
    it wraps."""
    rm = resolve_model(net)
    info = rm.info_for(x)
    parts: list[list[Tensor]] = [[], [], []]
    for chunk in x.split(batch_size):
        got: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

        def reduce(layer: int, maps: Tensor) -> None:
            got[layer] = convention_distances(maps, info)

        with capture_attention(rm, reduce=reduce):
            rm.module(chunk)
        for i in range(3):
            parts[i].append(torch.stack([got[layer][i] for layer in sorted(got)]))  # (L, b, H)
    return {name: torch.cat(part, dim=1).double().cpu() for name, part in zip(findings.DISTANCE_CONVENTIONS, parts)}


def distance_verdicts(conventions: dict[str, Tensor], info: ModelInfo) -> list[Verdict]:
    """The Fig. 7 right verdicts (``findings.judge_distance``) on {``findings.DISTANCE_CONVENTIONS`` name: (L, B, H)}
    distances (``distance_conventions``, or the prediction pass's), each criterion checked on its controls
    (``controls.distance_controls``): the one way the report and notebook 07 judge them."""
    ceiling = uniform_attention_distance(info.grid_size, info.patch_size)
    ceilings = dict(zip(findings.DISTANCE_CONVENTIONS, (ceiling, ceiling, uniform_attention_distance(
        info.grid_size, (1, 1)))))
    return controls.validate(findings.judge_distance(conventions, ceilings),
                             controls.distance_controls(conventions[findings.DISTANCE_CONVENTIONS[0]], ceiling))


def position_verdicts(net: AnyModel, info: ModelInfo) -> list[Verdict]:
    """The Fig. 7 centre verdicts (``findings.judge_positions``) on ``net``'s learned position-embedding table, each
    criterion checked on its controls (``controls.position_controls``); [] for a model with no table or a fixed one
    (e.g. 2D sin-cos: its structure is built in, not learned). The one way the report and notebook 07 judge them."""
    if info.pos_embed in ("none", "fixed"):
        return []
    rm = resolve_model(net)
    sim = position_embedding_similarity(rm).cpu()  # (gh, gw, gh, gw)
    return controls.validate(findings.judge_positions(sim), controls.position_controls(position_table(rm).cpu()))


def model_label(net, model: Any) -> str:
    """The model as a verdict's subject names it: "vit_cifar10 (embedded default)", a checkpoint or timm name as
    given, a config's type with its random weights."""
    if model is None:
        ck = getattr(net, "vitlab_checkpoint", {}).get("path")
        return f"{Path(ck).name} (embedded default)" if ck else "embedded default"
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    return f"{type(model).__name__} (random initialisation)"



def mpp_verdicts(records: Sequence[dict], shots: int = 10) -> list:
    """The paper's ordering as verdicts (``vitlab.findings.studies.mpp_ordering``), each checked on its controls: MPP beats scratch and supervised
    beats MPP, for the ``shots``-shot probe (a study's ``verdict_shots``) of each readout (the model's own, and the
    patch tokens' mean: MPP trains only the patch outputs, never the class token's) and for the fine-tune. Pairs whose
    rows are not finished yet are left out; records of several studies are refused (``ValueError``)."""
    out = []
    for kind, readout in [("few_shot", r) for r in READOUTS] + [("finetune", "model")]:
        # records of several studies, or anything else wrong with them, raise here: only "not finished" is skipped
        finished = studies.mpp_accuracies(records, kind, shots, readout)
        for better, worse in (("mpp", "scratch"), ("supervised", "mpp")):
            if better in finished and worse in finished:  # else rows not finished (or not run) yet
                v = studies.mpp_ordering(records, better, worse, kind=kind, shots=shots, readout=readout)
                # the criterion checked on controls from these records (vitlab.findings.controls.mpp_controls)
                out += controls.validate([v], controls.mpp_controls(records, better, worse, kind, shots, readout))
    return out


@torch.no_grad()
def similarity_pair(vit: AnyModel, resnet: AnyModel, x: torch.Tensor, batch_size: int = 64,
                    x_resnet: torch.Tensor | None = None, subject: str = ""
                    ) -> tuple[dict[str, SimilarityTables], list[Verdict]]:
    """{representation: tables} of ``vit`` (model a) against ``resnet`` (model b) on the preprocessed (B, C, H, W)
    images ``x`` (``x_resnet``: the same images as the ResNet's own preprocessing gives them; default ``x``), under
    each of ``similarity.REPRESENTATION_CONVENTIONS``, and the two Raghu et al. verdicts (``similarity.judge_similarity``) checked on
    their controls (``controls.similarity_controls``, on the first representation's tables), each with ``subject``
    (what it judges: the two models and the images)."""
    vit, resnet = resolve_model(vit), resolve_model(resnet)  # once for the three representations
    tables = {rep: similarity_tables(vit, resnet, x, representation=rep, batch_size=batch_size, progress=False,
                                     images_b=x_resnet) for rep in similarity.REPRESENTATION_CONVENTIONS}
    verdicts = controls.validate(similarity.judge_similarity(tables),
                                 controls.similarity_controls(tables[similarity.REPRESENTATION_CONVENTIONS[0]]))
    return tables, [replace(v, subject=subject) for v in verdicts]
