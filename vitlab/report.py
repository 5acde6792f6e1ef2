"""``vitlab reproduce``: run the inspection experiments on a model and write a self-contained report.

Everything is written into a temporary folder beside ``out`` and moved into place at the end, so a failed
run leaves no half-written report.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from torch import Tensor, nn

import vitlab
from vitlab.checkpoint import replace_dir
from vitlab.data import IMAGE_SUFFIXES, DataError, sample_images
from vitlab.inspect import (
    attention_rollout,
    embedding_filter_pca,
    mean_attention_distance,
    position_embedding_similarity,
    position_structure_score,
)
from vitlab.plots import filter_grid, image_grid_with_maps, layer_lines, similarity_tiles


def _transform(model: nn.Module):
    cfg = timm.data.resolve_data_config({}, model=model)
    return timm.data.create_transform(**cfg), cfg


def load_images(model: nn.Module, folder: str | os.PathLike | None = None,
                limit: int = 16) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """Images preprocessed as the model expects: (names, (B, C, H, W) batch, the (H, W, 3) uint8 views shown).

    ``folder=None`` uses the photos scikit-learn ships. Broken files raise ``DataError`` naming them.
    """
    tf, cfg = _transform(model)
    if folder is None:
        items = [(name, Image.fromarray(arr)) for name, arr in sample_images()]
    else:
        root = Path(folder)
        if not root.is_dir():
            raise DataError(f"--images {root} is not a folder")
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:limit]
        if not files:
            raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {root}")
        items, broken = [], []
        for p in files:
            try:
                with Image.open(p) as im:
                    items.append((p.stem, im.convert("RGB")))
            except OSError as e:
                broken.append(f"{p}: {e}")
        if broken:
            raise DataError("unreadable images (remove or replace them):\n  " + "\n  ".join(broken))
    names = [n for n, _ in items]
    x = torch.stack([tf(im) for _, im in items])
    size = cfg["input_size"][-2:]
    shown = [np.asarray(im.resize((size[1], size[0]), Image.Resampling.BICUBIC)) for _, im in items]
    return names, x, shown


def embedded_images(model: nn.Module, n: int = 16) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """``n`` deterministic square crops of the photos scikit-learn ships, preprocessed for ``model``.

    The first two are the central squares of the two photos; then crops at 1/2 and 1/3 of the short side on a
    regular grid, alternating between the photos. Returns what ``load_images`` returns.
    """
    tf, cfg = _transform(model)
    photos = sample_images()
    crops: list[tuple[str, np.ndarray]] = []
    for div in (1, 2, 3):
        per_photo = []
        for name, arr in photos:
            h, w = arr.shape[:2]
            side = min(h, w) // div
            ys = [(h - side) // 2] if div == 1 else np.linspace(0, h - side, div).astype(int).tolist()
            xs = [(w - side) // 2] if div == 1 else np.linspace(0, w - side, div + 1).astype(int).tolist()
            per_photo.append([(f"{name}_{div}_{y}_{x}", arr[y:y + side, x:x + side]) for y in ys for x in xs])
        for group in zip(*per_photo):
            crops.extend(group)
    if not 1 <= n <= len(crops):
        raise ValueError(f"n must be in [1, {len(crops)}], got {n}")
    size = cfg["input_size"][-2:]
    items = [(name, Image.fromarray(np.ascontiguousarray(arr))) for name, arr in crops[:n]]
    x = torch.stack([tf(im) for _, im in items])
    shown = [np.asarray(im.resize((size[1], size[0]), Image.Resampling.BICUBIC)) for _, im in items]
    return [name for name, _ in items], x, shown


def _readout_maps(maps: Tensor, info: vitlab.ModelInfo) -> Tensor:
    """(L, B, H, T, T) -> (L, B, gh, gw): head-mean attention of the readout over the patch tokens."""
    p = info.num_prefix_tokens
    if p:
        rows = maps[:, :, :, 0, p:]  # class-token row
    else:
        rows = maps[:, :, :, :, p:].mean(3)  # mean over patch queries
    L, B = rows.shape[:2]
    return rows.mean(2).reshape(L, B, *info.grid_size)


def reproduce(model: str | None = None, images: str | None = None, out: str | os.PathLike = "out",
              pretrained: bool = True) -> Path:
    """Write ``report.html`` and ``metrics.json`` into ``out`` for ``model`` on ``images``."""
    t0 = time.time()
    net = vitlab.load_model(model, pretrained=pretrained)
    info = vitlab.model_info(net)
    names, x, shown = load_images(net, images)
    maps = vitlab.attention_maps(net, x)  # (L, B, H, T, T)
    readout = _readout_maps(maps, info)
    entropy = -(maps.clamp_min(1e-12).log() * maps).sum(-1).mean(dim=(1, 3))  # (L, H) nats
    with torch.no_grad():
        probs = net(x).softmax(-1)
    top = probs.max(-1)
    out = Path(out)
    stamp = {
        "model": str(model or "embedded default"),
        "weights": getattr(net, "vitlab_checkpoint", {}).get("path") or net.pretrained_cfg.get("hf_hub_id") or
        ("pretrained" if pretrained else "random"),
        "versions": {"vitlab": vitlab.__version__, "torch": torch.__version__, "timm": timm.__version__},
    }
    metrics = {
        **stamp,
        "model_info": {k: list(v) if isinstance(v, tuple) else v for k, v in info.__dict__.items()},
        "images": names,
        "attention_shape": list(maps.shape),
        "attention_entropy_per_layer_nats": entropy.mean(1).tolist(),
        "predictions": [{"image": n, "class": int(c), "probability": float(p)}
                        for n, c, p in zip(names, top.indices, top.values)],
    }
    layers = [0, info.depth // 2, info.depth - 1]
    figures: list[tuple[object, str]] = []
    if not info.hybrid:
        comps, ratio = embedding_filter_pca(net, k=min(28, info.embed_dim))
        metrics["filter_pca_explained_variance_top28"] = ratio.tolist()
        figures.append((filter_grid(comps.numpy(), ratio.numpy(), title="Patch-embedding filters: principal "
                                    "components (Fig. 7 left)"),
                        "Paper: the top components resemble plausible basis functions for a low-dimensional "
                        "representation of the fine structure within each patch."))
    if info.pos_embed != "none":
        sim = position_embedding_similarity(net)
        score = position_structure_score(sim)
        metrics["position_embedding_structure_spearman"] = score
        figures.append((similarity_tiles(sim.numpy(), title="Position-embedding cosine similarity (Fig. 7 centre)"),
                        f"Paper: closer patches have more similar embeddings, with row/column structure. Here: "
                        f"Spearman correlation of similarity with grid distance = {score:.3f} (-1: perfectly local)."))
    dist = mean_attention_distance(net, x)
    metrics["mean_attention_distance_px"] = dist.tolist()
    figures.append((layer_lines(dist.numpy(), "mean attention distance (pixels)",
                                "Mean attention distance per head (Fig. 7 right)"),
                    f"Paper (ViT-L/16, 128 images): some heads attend globally already in the lowest layers, others "
                    f"locally; the distance grows with depth. Here on {len(names)} image(s), pixel units of a "
                    f"{info.img_size[0]}x{info.img_size[1]} input."))
    roll = attention_rollout(net, x)
    figures.append((image_grid_with_maps(shown, roll[:, None].numpy(), names, ["rollout"],
                                         title="Attention rollout (Fig. 6)"),
                    "Paper: the rolled-out attention of the output token concentrates on the semantically "
                    "relevant object."))
    fig_maps = image_grid_with_maps(shown, readout[layers].permute(1, 0, 2, 3).numpy(), names,
                                    [f"layer {i + 1}" for i in layers],
                                    title="Readout attention over patches (head mean)")
    fig_entropy = layer_lines(entropy.numpy(), "attention entropy (nats)",
                              "Attention entropy per head against depth")
    figures += [(fig_maps, "Raw attention of the readout in a few layers."),
                (fig_entropy, "Entropy of the attention rows: low = focused heads.")]
    metrics["seconds"] = round(time.time() - t0, 2)
    caption = html.escape(json.dumps(stamp))
    body = "".join(f"<section>{f.to_html(full_html=False, include_plotlyjs=i == 0)}<p>{html.escape(text)}</p>"
                   f"<p><small>{caption}</small></p></section>" for i, (f, text) in enumerate(figures))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>vitlab report</title></head><body>"
            f"<h1>vitlab report</h1><pre>{html.escape(json.dumps(metrics['model_info'], indent=1))}</pre>{body}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)
        (tmp / "report.html").write_text(page)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
