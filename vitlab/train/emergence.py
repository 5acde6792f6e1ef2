"""The paper's Fig. 7 statistics as a model trains: one record per epoch, from the model or its saved snapshot.

``fig7_statistics`` measures, on a fixed image batch (the 128 shipped CIFAR-10 test images), the quantities behind
the Fig. 7 findings as plain numbers: no bootstrap, no verdict, so that an epoch's record costs a few forward passes.
``snapshot_history`` computes them for every snapshot of a run (``TrainConfig.snapshot_every``) and joins each with
the run's accuracy record of that epoch; ``emergence_bands`` summarises the records of several seeds of one recipe
per epoch (mean, min and max over seeds).

Record keys (all floats; lists of floats where noted):

- ``position_spearman``: Spearman correlation between position-embedding cosine similarity and grid distance
  (``vitlab.inspect.positions.position_structure_score``; -1 perfectly local, 0 no 2D structure). None for a model
  without a learned table.
- ``lowest_min`` / ``lowest_max``: the lowest layer's most local and most global head, mean attention distance as a
  share of the uniform-attention distance (``vitlab.inspect.distance.uniform_attention_distance``); ``lowest_spread`` their
  difference.
- ``lowest_heads``: (H,) the lowest layer's heads' mean attention distances, as shares of the uniform-attention
  distance; ``lowest_local_share`` the share of them that are local (below ``LOCAL_HEAD`` of uniform).
- ``depth_trend``: Spearman correlation between layer index and the layer's mean attention distance (1: rising at
  every layer).
- ``layer_mean_px``: (L,) the layers' mean attention distance in pixels.
- ``filter_frequency``: Spearman correlation between a filter component's rank and its DCT radius
  (``vitlab.inspect.filters.dct_radius``; > 0: leading components are lower-frequency). None for a hybrid, whose patch
  embedding projects CNN features, not pixels.

Attention distances follow ``vitlab.inspect.distance.mean_attention_distance``'s default prefix convention.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["EMERGENCE_KEYS", "LOCAL_HEAD", "fig7_statistics", "lowest_layer", "sample_batch", "snapshot_history", "emergence_bands", "halfway"]

#: the scalar statistics of a record, in the order they are drawn
EMERGENCE_KEYS = ("position_spearman", "lowest_min", "lowest_max", "lowest_spread", "depth_trend", "filter_frequency")

#: a head is local when its mean attention distance is below this share of the uniform-attention distance: midway
#: between the paper's local and global lowest-layer heads (Fig. 7 right: about 0.1 and 0.9 of it,
#: ``vitlab.findings.model.PAPER_LOWEST_SPREAD``)
LOCAL_HEAD = 0.5


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """``vitlab.base.stats.spearman`` of two sequences: the findings' own rank correlation (ties as scipy, 0 for a
    constant sequence)."""
    from vitlab.base.stats import spearman

    return float(spearman(torch.as_tensor(a, dtype=torch.float64)[None],
                          torch.as_tensor(np.asarray(b), dtype=torch.float64)[None])[0])


def sample_batch(model: nn.Module, n: int = 128) -> Tensor:
    """(n, 3, H, W): the first ``n`` of the 128 shipped CIFAR-10 test images, preprocessed for ``model``."""
    from vitlab.data.datasets import normalize
    from vitlab.data.images import cifar_test_sample
    from vitlab.models.info import resolve_model

    pc = resolve_model(model).module.pretrained_cfg
    return normalize(cifar_test_sample().images[:n], pc["mean"], pc["std"])


def lowest_layer(heads: Sequence[float]) -> dict[str, Any]:
    """The lowest-layer fields of ``fig7_statistics`` from its heads' mean attention distances (H,), each a share of
    the uniform-attention distance: ``lowest_heads``, ``lowest_min``, ``lowest_max``, ``lowest_spread`` and
    ``lowest_local_share`` (the share of heads below ``LOCAL_HEAD``). ValueError for no heads."""
    if not len(heads):
        raise ValueError("lowest_layer needs the mean attention distance of at least one head")
    low = [float(v) for v in heads]
    return {"lowest_min": min(low), "lowest_max": max(low), "lowest_spread": max(low) - min(low), "lowest_heads": low,
            "lowest_local_share": sum(v < LOCAL_HEAD for v in low) / len(low)}


@torch.no_grad()
def fig7_statistics(model: nn.Module, images: Tensor) -> dict[str, Any]:
    """The record described in the module docstring for ``model`` on ``images`` (B, 3, H, W), preprocessed.

    The model is measured in eval mode with all patch tokens and put back as it was. Raises what the analyses raise
    for a model they cannot read (e.g. no attention to capture)."""
    from vitlab.base.modes import all_patch_tokens, eval_mode
    from vitlab.inspect.distance import mean_attention_distance, uniform_attention_distance
    from vitlab.inspect.filters import dct_radius, embedding_filter_pca, filter_component_count
    from vitlab.inspect.positions import position_embedding_similarity, position_structure_score
    from vitlab.models.info import resolve_model

    rm = resolve_model(model)
    net, info = rm.module, rm.info_for(images)
    with eval_mode(net), all_patch_tokens(net):
        dist = mean_attention_distance(rm, images, progress=False).double().cpu()  # (L, H) px
    ceiling = uniform_attention_distance(info.grid_size, info.patch_size)
    low = dist[0] / ceiling
    layer_mean = dist.mean(1)
    freq = None
    if not info.hybrid:  # a hybrid's patch embedding is no filter over pixels
        k = filter_component_count(rm)
        comps, _ = embedding_filter_pca(rm, k=k)
        freq = _spearman(range(k), dct_radius(comps.cpu())) if k > 1 else None
    pos = None
    if info.pos_embed == "learn":
        pos = position_structure_score(position_embedding_similarity(rm).cpu())
    return {
        "position_spearman": pos,
        **lowest_layer(low.tolist()),
        "depth_trend": _spearman(range(len(layer_mean)), layer_mean.tolist()) if len(layer_mean) > 1 else None,
        "layer_mean_px": [float(v) for v in layer_mean],
        "filter_frequency": freq,
    }


def _accuracy_records(run: Path) -> dict[int, dict[str, Any]]:
    """``{epoch: record}`` from the run's ``metrics.jsonl`` (the last complete line of each epoch)."""
    from vitlab.train.history import read_history

    return {int(r["epoch"]): r for r in read_history(run)} if (run / "metrics.jsonl").is_file() else {}


def snapshot_history(run: str | os.PathLike, images: Tensor | None = None, *, out: str | os.PathLike | None = None,
                     progress: bool = False) -> list[dict[str, Any]]:
    """One record per snapshot of ``run`` (``RUN/snapshots/epoch_NNNN``), in epoch order: ``epoch``, ``images_seen``
    (epochs x the run's training examples), the run's ``val_accuracy`` / ``test_accuracy`` / ``train_loss`` of that
    epoch where recorded, and ``fig7_statistics`` of the snapshot on ``images`` (default ``sample_batch``).

    ``out``: a JSON file the list of records is written to (atomically, after each snapshot). Records already in
    ``out`` are reused for their epochs, not recomputed. Raises FileNotFoundError when ``run`` has no snapshots."""
    from tqdm.auto import tqdm

    from vitlab.base.atomic import atomic_write_text
    from vitlab.models.checkpoint import load_checkpoint

    run = Path(run)
    snaps = sorted((run / "snapshots").glob("epoch_*")) if (run / "snapshots").is_dir() else []
    snaps = [s for s in snaps if (s / "config.json").is_file()]
    if not snaps:
        raise FileNotFoundError(f"{run} has no snapshots (RUN/snapshots/epoch_NNNN): train with snapshot_every=1")
    done: dict[int, dict[str, Any]] = {}
    if out is not None and Path(out).is_file():
        done = {int(r["epoch"]): r for r in json.loads(Path(out).read_text())}
    acc = _accuracy_records(run)
    cfg = json.loads((run / "checkpoint" / "config.json").read_text()) if (run / "checkpoint" / "config.json").is_file() \
        else {}
    n_train = cfg.get("data", {}).get("train_examples")
    records = []
    for snap in tqdm(snaps, desc="snapshots", disable=not progress, leave=False):
        epoch = int(snap.name.split("_")[1])
        if epoch in done:
            records.append(done[epoch])
            continue
        model = load_checkpoint(snap)
        x = images if images is not None else sample_batch(model)
        rec: dict[str, Any] = {"epoch": epoch, "images_seen": epoch * n_train if n_train else None}
        for key in ("train_loss", "val_accuracy", "test_accuracy"):
            if key in acc.get(epoch, {}):
                rec[key] = acc[epoch][key]
        rec.update(fig7_statistics(model, x))
        records.append(rec)
        if out is not None:
            atomic_write_text(Path(out), json.dumps(records, indent=1) + "\n")
    return records


def emergence_bands(histories: Sequence[Sequence[dict[str, Any]]], key: str) -> dict[str, list[float]]:
    """Per epoch present in every history: ``epoch``, ``images_seen`` (the first history's), and the ``mean``,
    ``min`` and ``max`` of ``key`` over the histories (seeds). Raises ValueError for no histories or a key no record
    holds."""
    if not histories:
        raise ValueError("emergence_bands needs at least one history")
    by_epoch = [{int(r["epoch"]): r for r in h if r.get(key) is not None} for h in histories]
    epochs = sorted(set.intersection(*(set(b) for b in by_epoch)))
    if not epochs:
        raise ValueError(f"no epoch has {key!r} in every history")
    vals = np.array([[b[e][key] for b in by_epoch] for e in epochs], dtype=np.float64)  # (E, S)
    return {"epoch": epochs, "images_seen": [by_epoch[0][e].get("images_seen") for e in epochs],
            "mean": vals.mean(1).tolist(), "min": vals.min(1).tolist(), "max": vals.max(1).tolist()}


def halfway(band: dict[str, list]) -> dict[str, Any]:
    """When a statistic's seed mean has made half its change over training: ``start`` and ``end`` (the mean at the
    band's first and last epoch), and the first ``epoch`` (with its ``images_seen``) at which the mean has moved at
    least half-way from ``start`` to ``end``. ``band``: one ``emergence_bands`` output. For a mean that does not
    change (``end == start``) the epoch is the first one. Raises ValueError for an empty band."""
    mean = band["mean"]
    if not mean:
        raise ValueError("halfway needs a band with at least one epoch (emergence_bands' output)")
    start, end = float(mean[0]), float(mean[-1])
    i = next(i for i, m in enumerate(mean) if (m - start) * (1 if end >= start else -1) >= abs(end - start) / 2)
    return {"start": start, "end": end, "epoch": band["epoch"][i], "images_seen": band["images_seen"][i]}
