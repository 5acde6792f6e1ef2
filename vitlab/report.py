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
import torch
from tqdm.auto import tqdm

import vitlab
from vitlab.atomic import replace_dir
from vitlab.images import default_images, default_source, load_images
from vitlab.inspect import (
    embedding_filter_pca,
    position_embedding_similarity,
    position_structure_score,
)
from vitlab.inspect.attribution import ATTRIBUTION_METHODS
from vitlab.inspect.compare import compare_methods
from vitlab.inspect.distance import attention_distance_from_maps
from vitlab.inspect.rollout import readout_attention
from vitlab.models import SHAPES_CHECKPOINT
from vitlab.plots import curves, filter_grid, image_grid_with_maps, layer_lines, similarity_tiles, table_figure
from vitlab.provenance import versions
from vitlab.static import write_images


def _stamp(base: dict, **settings) -> dict:
    return {**base, "settings": settings}


def _write_pngs(figures: list[tuple[str, object]], folder: Path) -> str:
    """PNG per figure through kaleido when a Chromium is found; returns what happened, for metrics.json."""
    return write_images([f for _, f in figures], [folder / f"{slug}.png" for slug, _ in figures])


def _section(slug: str, fig, paper: str, ours: str, stamp: dict) -> dict:
    return {"slug": slug, "figure": fig, "paper": paper, "ours": ours, "stamp": stamp}


def _scores_table(rows: list, title: str, localisation: bool = False) -> object:
    header = ["method", "deletion AUC (lower better)", "insertion AUC (higher better)",
              "sanity: Spearman vs random weights (near 0 better)", "seconds"]
    if localisation:
        header[3:3] = ["mass in object", "pointing game"]
    cells = []
    for r in rows:
        row = [r.method, r.deletion_auc, r.insertion_auc,
               "n/a" if r.sanity_spearman is None else r.sanity_spearman, r.seconds]
        if localisation:
            row[3:3] = [r.mass_in_mask, r.pointing]
        cells.append(row)
    return table_figure(header, cells, title)


def reproduce(model: str | None = None, images: str | None = None, out: str | os.PathLike = "out",
              pretrained: bool = True, num_images: int = 16, shapes: bool = True, png: bool = True,
              progress: bool | None = None) -> Path:
    """Write ``report.html``, ``metrics.json`` (and PNGs when a Chromium is found) into ``out``.

    ``model``: anything ``load_model`` takes (default: the embedded checkpoint); ``images``: a folder (default:
    ``num_images`` crops of the embedded photos). ``shapes``: add the localisation table of the shipped shapes
    ViT. Everything is written to a temporary folder first: a failure leaves ``out`` as it was.
    """
    t0 = time.time()
    out = Path(out)
    net = vitlab.load_model(model, pretrained=pretrained)
    try:
        info = vitlab.model_info(net)  # a model without attention fails here, before any work
    except TypeError as e:
        raise ValueError(f"{model or 'this model'} has no self-attention to inspect ({e}). `vitlab reproduce` needs a "
                         "ViT-family model: a timm ViT/DeiT name or a vitlab ViT or hybrid checkpoint") from e
    names, x, shown = load_images(net, images, limit=num_images) if images else default_images(net, num_images)
    base = {
        "model": str(model or "embedded default"),
        "weights": getattr(net, "vitlab_checkpoint", {}).get("path") or net.pretrained_cfg.get("hf_hub_id") or
        ("pretrained" if pretrained else "random"),
        "versions": versions(),
        "images": f"{len(names)} from {images}" if images else f"{len(names)} of {default_source(net)}",
    }
    metrics: dict = {**base, "model_info": {k: list(v) if isinstance(v, tuple) else v for k, v in info.__dict__.items()},
                     "image_names": names}
    sections: list[dict] = []
    steps = ["attention", "filters", "positions", "distance", "rollout", "methods"] + (["shapes"] if shapes else [])
    bar = tqdm(steps, desc="reproduce", disable=progress is False)

    def step(name: str) -> None:
        bar.set_postfix_str(name)

    step("attention")
    maps = vitlab.attention_maps(net, x)  # (L, B, H, T, T)
    metrics["attention_shape"] = list(maps.shape)
    with torch.no_grad():
        probs = net(x).softmax(-1)
    top = probs.max(-1)
    metrics["predictions"] = [{"image": n, "class": int(c), "probability": float(p)}
                              for n, c, p in zip(names, top.indices, top.values)]
    bar.update()

    step("filters")
    if not info.hybrid:
        k = min(28, info.embed_dim)
        comps, ratio = embedding_filter_pca(net, k=k)
        metrics["filter_pca_explained_variance"] = ratio.tolist()
        sections.append(_section(
            "filters", filter_grid(comps.numpy(), ratio.numpy(), title="Patch-embedding filters: principal components "
                                   "(Fig. 7 left)"),
            "Fig. 7 left (ViT-L/32): the top 28 principal components of the patch-embedding filters resemble plausible "
            "basis functions for a low-dimensional representation of the fine structure within each patch.",
            f"The top {k} components explain {100 * float(ratio.sum()):.1f}% of the filters' variance; the first "
            f"{100 * float(ratio[0]):.1f}%.", _stamp(base, k=k, centred=True)))
    else:
        metrics["filter_pca_explained_variance"] = "n/a: a hybrid embeds CNN feature-map cells, not pixel patches"
    bar.update()

    step("positions")
    if info.pos_embed != "none":
        sim = position_embedding_similarity(net)
        score = position_structure_score(sim)
        metrics["position_embedding_structure_spearman"] = score
        sections.append(_section(
            "positions", similarity_tiles(sim.numpy(), title="Position-embedding cosine similarity (Fig. 7 centre)"),
            "Fig. 7 centre (ViT-L/32): closer patches have more similar position embeddings, with row/column "
            "structure; the model learns the 2D image topology.",
            f"Spearman correlation between similarity and grid distance: {score:.3f} (-1: perfectly local; 0: no "
            "structure).", _stamp(base, prefix_rows="excluded", grid=list(info.grid_size))))
        hi = tuple(2 * g for g in info.grid_size)
        sim_hi = position_embedding_similarity(net, grid=hi)
        score_hi = position_structure_score(sim_hi)
        metrics["position_embedding_structure_spearman_resampled"] = {"grid": list(hi), "spearman": score_hi}
        sections.append(_section(
            "positions_resampled", similarity_tiles(sim_hi.numpy(), title=f"The same, embeddings resampled to a "
                                                   f"{hi[0]}x{hi[1]} grid (fine-tuning at 2x resolution)"),
            "Section 3.2: for fine-tuning at a higher resolution the pre-trained position embeddings are 2D-"
            "interpolated according to their location in the original image.",
            f"After bicubic resampling to {hi[0]}x{hi[1]}: Spearman {score_hi:.3f}.",
            _stamp(base, resample="bicubic", grid=list(hi))))
    bar.update()

    step("distance")
    per = attention_distance_from_maps(maps, info.grid_size, info.patch_size, info.num_prefix_tokens)  # (L, B, H)
    dist = per.mean(1)
    metrics["mean_attention_distance_px"] = dist.tolist()
    metrics["mean_attention_distance_px_std_over_images"] = per.mean(2).std(1).tolist() if len(names) > 1 else None
    spread = per.mean(2).std(1).numpy() if len(names) > 1 else None
    sections.append(_section(
        "distance", layer_lines(dist.numpy(), "mean attention distance (pixels)",
                                "Mean attention distance per head against depth (Fig. 7 right, Fig. 11)", spread),
        "Fig. 7 right / Fig. 11 (ViT-L/16 on 128 images, 224 px): some heads attend to most of the image already in "
        "the lowest layers while others stay local; the attention distance grows with depth. Local heads in early "
        "layers are fewer in hybrids.",
        f"Lowest layer: heads from {float(dist[0].min()):.1f} to {float(dist[0].max()):.1f} px; last layer: head mean "
        f"{float(dist[-1].mean()):.1f} px, on a {info.img_size[0]}x{info.img_size[1]} input.",
        _stamp(base, queries="patches", keys="patches, prefix dropped without renormalising", unit="pixels",
               images=len(names), error_bars="std over images of the head mean")))
    entropy = -(maps.clamp_min(1e-12).log() * maps).sum(-1).mean(dim=(1, 3))  # (L, H) nats
    metrics["attention_entropy_per_layer_nats"] = entropy.mean(1).tolist()
    bar.update()

    step("rollout")
    n_show = min(4, len(names))
    bar.update()

    step("methods")
    n_attr = min(len(names), 16 if info.num_tokens <= 100 else 4)
    rows, method_maps = compare_methods(net, x[:n_attr], progress=False)
    metrics["methods"] = [r.__dict__ for r in rows]
    show = torch.stack([method_maps[m][:n_show] for m in ATTRIBUTION_METHODS], 1)  # (n, K, gh, gw)
    sections.append(_section(
        "rollout", image_grid_with_maps(shown[:n_show], show.numpy(), names[:n_show], list(ATTRIBUTION_METHODS),
                                        title="Attention rollout and class-specific maps (Fig. 6 and 14)"),
        "Fig. 6 / Fig. 14 (ViT-L/16): attention rollout of the output token onto the input space concentrates on "
        "the regions semantically relevant for classification.",
        "Rollout (head mean, residual 0.5, no discard) beside gradient rollout, integrated gradients and patch "
        "occlusion for the predicted class.",
        _stamp(base, head_fusion="mean", residual=0.5, discard_ratio=0.0, start_layer=0, target="predicted class",
               integrated_gradients="32 steps, grey baseline", occlusion="one patch at a time, grey baseline")))
    roll = method_maps["rollout"].flatten(1)
    metrics["rollout_top_patch_share"] = float((roll.max(1).values / roll.sum(1)).mean())
    sections.append(_section(
        "faithfulness", _scores_table(rows, f"Map methods on this model ({n_attr} images)"),
        "The paper shows rollout qualitatively; faithfulness and sanity checks (Petsiuk et al. 2018, Adebayo et al. "
        "2018) are our addition.",
        "Deletion/insertion: the predicted class's probability as patches are removed from (or revealed on) a blurred "
        "copy in the map's order; a random map is the floor. Sanity: rank correlation with the same method on "
        "re-initialised weights.",
        _stamp(base, images=n_attr, steps=16, baseline="blur", sanity="weights re-drawn, same targets")))
    sections.append(_section(
        "faithfulness_curves", curves(np.array(rows[0].fraction), {f"{r.method} deletion": np.array(r.deletion_curve)
                                                                for r in rows} |
                                      {f"{r.method} insertion": np.array(r.insertion_curve) for r in rows},
                                      "fraction of patches changed", "probability of the predicted class",
                                      "Deletion and insertion curves"),
        "(our addition)", "Mean over the images.", _stamp(base, images=n_attr)))
    readout = readout_attention(maps, info)
    layers = sorted({0, info.depth // 2, info.depth - 1})
    sections.append(_section(
        "readout_attention", image_grid_with_maps(shown[:n_show], readout[layers, :n_show].permute(1, 0, 2, 3).numpy(),
                                                  names[:n_show], [f"layer {i + 1}" for i in layers],
                                                  title="Readout attention over patches (head mean)"),
        "(raw attention, for comparison with rollout)", "Raw attention of the readout in a few layers.",
        _stamp(base, head_fusion="mean", layers=[i + 1 for i in layers])))
    sections.append(_section(
        "entropy", layer_lines(entropy.numpy(), "attention entropy (nats)", "Attention entropy per head against depth"),
        "(our addition)", "Entropy of the attention rows: low = focused heads.", _stamp(base)))
    bar.update()

    if shapes:
        step("shapes")
        loc = _shapes_localisation()
        if loc is not None:
            shapes_rows, shapes_stamp = loc
            metrics["shapes_localisation"] = {"stamp": shapes_stamp, "methods": [r.__dict__ for r in shapes_rows]}
            sections.append(_section(
                "localisation", _scores_table(shapes_rows, "Localisation on the synthetic shapes (shipped shapes ViT)",
                                              localisation=True),
                "Fig. 6 shows rollout landing on the object; here that is scored against ground-truth masks.",
                f"Object area share (the score of a uniform map): {shapes_stamp['chance']:.3f}.", shapes_stamp))
        bar.update()
    bar.close()
    metrics["seconds"] = round(time.time() - t0, 2)
    metrics["figures"] = [{"slug": s["slug"], "paper": s["paper"], "ours": s["ours"], "stamp": s["stamp"]}
                          for s in sections]
    body = "".join(
        f"<section id='{s['slug']}'>{s['figure'].to_html(full_html=False, include_plotlyjs=i == 0)}"
        f"<p><b>Paper:</b> {html.escape(s['paper'])}</p><p><b>Here:</b> {html.escape(s['ours'])}</p>"
        f"<p><small>{html.escape(json.dumps(s['stamp']))}</small></p></section>" for i, s in enumerate(sections))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>vitlab report: {html.escape(base['model'])}"
            f"</title></head><body><h1>vitlab report: {html.escape(base['model'])}</h1>"
            f"<pre>{html.escape(json.dumps(metrics['model_info'], indent=1))}</pre>{body}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)
        (tmp / "report.html").write_text(page)
        metrics["png"] = _write_pngs([(s["slug"], s["figure"]) for s in sections], tmp) if png else "not asked for"
        metrics["seconds_total"] = round(time.time() - t0, 2)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _shapes_localisation(n: int = 32) -> tuple[list, dict] | None:
    """Localisation scores of every method for the shipped shapes ViT on ``n`` test shapes (true classes)."""
    if not (SHAPES_CHECKPOINT / "model.safetensors").exists():
        return None
    from vitlab.data import load_shapes, normalize

    net = vitlab.load_model(str(SHAPES_CHECKPOINT))
    size = net.pretrained_cfg["input_size"][-1]
    data = load_shapes("test", n=n, size=size)
    cfg = net.pretrained_cfg
    x = normalize(data.images, cfg["mean"], cfg["std"])
    rows, _ = compare_methods(net, x, data.labels, masks=data.masks, progress=False)
    chance = float(data.masks.double().mean())
    stamp = {"model": "vit_shapes (shipped)", "weights": str(SHAPES_CHECKPOINT), "images": f"{n} test shapes (seed 1)",
             "versions": versions(),
             "settings": {"target": "true class", "steps": 16, "baseline": "blur"}, "chance": chance}
    return rows, stamp
