"""One builder per paper figure: model and images in, a ``Section`` out (figure, statement, stamp, verdicts).

Builders compute through ``vitlab.inspect`` and judge through ``vitlab.findings.model`` (the scaling section through
``vitlab.findings.studies``); they never render HTML. Every
sentence in ``ours`` is formatted from the numbers computed here, and every claim about the paper's finding comes
with the verdict that decides it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vitlab.base.intervals import fmt_value
from vitlab.base.stats import probability_words
from vitlab.data.shapes import LOCALISATION_SHAPES
from vitlab.figures.plots import (
    MAP_SCALING,
    deletion_insertion_curves,
    filter_grid,
    gpsa_words,
    image_grid_with_maps,
    layer_lines,
    layer_span,
    scaling_curves,
    similarity_tiles,
    table_figure,
)
from vitlab.findings import controls
from vitlab.findings import model as findings
from vitlab.findings import studies as study_findings
from vitlab.findings.judge import convention_distances, distance_conventions, distance_verdicts, position_verdicts
from vitlab.findings.verdict import Verdict
from vitlab.inspect import (
    ATTRIBUTION_METHODS,
    embedding_filter_pca,
    embedding_filters,
    filter_component_count,
    position_embedding_similarity,
    position_structure_score,
    random_filter_pca_ratios,
    readout_vector,
)
from vitlab.inspect.attribution import has_classifier
from vitlab.inspect.capture import capture_attention
from vitlab.inspect.compare import MethodScores, compare_methods, shapes_localisation
from vitlab.inspect.distance import uniform_attention_distance
from vitlab.inspect.rollout import attention_rollout
from vitlab.models.info import ModelInfo, ResolvedModel, attention_position_words, resolve_model

__all__ = ["Section", "Inputs", "prediction_pass", "convention_distances", "distance_conventions", "distance_verdicts",
           "position_verdicts", "filters", "positions", "distance", "maps_and_faithfulness",
           "readout_and_entropy", "localisation", "few_shot", "scaling"]

@dataclass
class Section:
    """One figure of the report: what the paper reports, what we measured (formatted from numbers), how
    (stamp: model, weights, versions, settings), and the verdicts that decide whether the finding holds here."""

    slug: str
    title: str
    figure: Any
    paper: str
    ours: str
    stamp: dict[str, Any]
    verdicts: list[Verdict] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: what this section would have judged but could not here, with why: (what, reason) pairs, listed beside the
    #: verdicts (the report's table, metrics.json's ``not_judged``, the console)
    not_judged: list[tuple[str, str]] = field(default_factory=list)
    #: a section that only carries ``not_judged`` notes (what is missing, and how to make it): the page and
    #: metrics.json's ``figures`` leave it out, its notes stay in the not-judged rows
    hidden: bool = False


@dataclass
class Inputs:
    """What every builder reads: the model, its geometry, the images (and their true classes when known). ``net``
    may be given resolved (``vitlab.models.info.ResolvedModel``); ``model`` is it resolved, what the builders hand
    the analyses, and ``net`` the module they run."""

    net: nn.Module | ResolvedModel | None
    info: ModelInfo | None
    names: list[str]
    x: Tensor  # (B, C, H, W) preprocessed
    shown: list[np.ndarray]  # (H, W, 3) uint8 views at the input size
    base: dict[str, Any]  # the stamp every section starts from
    labels: Tensor | None = None  # (B,) true classes, for images with labels
    class_names: tuple[str, ...] | None = None
    n_show: int = 4  # images drawn in map grids
    untrained: bool = False  # random weights: the verdicts measured on this model decide nothing (findings.untrained)
    source: str = ""  # where the images come from, e.g. "the 128 shipped CIFAR-10 test images (...)"
    name: str = ""  # the model as a verdict's subject names it (default: the stamp's model)
    data: str = ""  # the images in a few words, as a verdict's subject names them, e.g. "128 CIFAR-10 test images"

    model: ResolvedModel | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.model = None if self.net is None else resolve_model(self.net)
        self.net = None if self.model is None else self.model.module

    def stamp(self, images: int | str | None = None, **settings: Any) -> dict[str, Any]:
        """The base stamp with ``settings``. ``images``: the first N of the images when the section reads fewer than
        all of them, or what it read instead (``NO_IMAGES``: the weights alone); default: all of them."""
        base = dict(self.base)
        if isinstance(images, int) and (self.x is None or images < len(self.x)):
            base["images"] = f"the first {images} of {self.source or self.base.get('images', 'the images')}"
        elif isinstance(images, str):
            base["images"] = images
        return {**base, "settings": settings}

    def subject(self, images: bool = True) -> str:
        """What a verdict measured on this model judges: the model on the images (``data``), or its weights alone
        (``images=False``), e.g. "vit_cifar10 (embedded default) on 128 CIFAR-10 test images"."""
        model = self.name or str(self.base.get("model", "the model"))
        if not images:
            return f"{model}, weights alone"
        return f"{model} on {self.data}" if self.data else model

    def judged(self, verdicts: list[Verdict], images: bool = True) -> list[Verdict]:
        """The verdicts measured on this model with their ``subject`` (``images``: as ``subject`` takes it),
        inconclusive when its weights are random (``findings.untrained``)."""
        verdicts = [replace(v, subject=self.subject(images)) for v in verdicts]
        return [findings.untrained(v) for v in verdicts] if self.untrained else verdicts

    def true_class_name(self, c: int) -> str:
        """The name of a true label (the images' own classes, e.g. CIFAR-10's, whatever the model's head)."""
        from vitlab.data.images import cifar_test_sample

        names = cifar_test_sample().classes if self.labels is not None else self.class_names  # labels: the sample's
        return names[c] if names is not None and 0 <= c < len(names) else f"class {c}"

    def class_name(self, c: int) -> str:
        if self.class_names is not None and 0 <= c < len(self.class_names):
            return self.class_names[c]
        return f"class {c}"


# ---------------------------------------------------------------------------------------------- predictions


@torch.no_grad()
def prediction_pass(inp: Inputs) -> dict[str, Any]:
    """One forward over the images: predictions, and per layer the readout's attention over patches, the
    attention entropy per head and the mean attention distance per head and image (Fig. 7 right), all reduced
    inside the capture (no (L, B, H, T, T) tensor is kept)."""
    T, p = inp.info.num_tokens, inp.info.num_prefix_tokens
    readout_rows: dict[int, Tensor] = {}
    entropy: dict[int, Tensor] = {}
    dist: dict[int, Tensor] = {}
    renorm: dict[int, Tensor] = {}  # the distance convention's other forms (findings.DISTANCE_CONVENTIONS)
    patches: dict[int, Tensor] = {}

    def reduce(layer: int, maps: Tensor) -> None:  # maps: (B, H, T, T)
        rows = maps[..., 1:, :] if layer < inp.info.class_token_joins else maps  # a class token not joined: no query
        entropy[layer] = -(rows.clamp_min(1e-12).log() * rows).sum(-1).mean(-1)  # (B, H) nats, mean over queries
        readout_rows[layer] = maps.mean(1)  # (B, T, T) head mean; the readout vector is applied below
        dist[layer], renorm[layer], patches[layer] = convention_distances(maps, inp.info)  # (B, H) each
        return None

    with capture_attention(inp.model, reduce=reduce) as cap:
        logits = inp.net(inp.x)
        pool = cap.pool_maps()
    v = readout_vector(inp.info, len(inp.x), pool, device=inp.x.device).float()  # (B, T)
    layers = sorted(readout_rows)
    readout = torch.stack([(v[:, None] @ readout_rows[i]).squeeze(1)[:, p:] for i in layers])  # (L, B, N)
    if has_classifier(inp.model) and not untrained_head(inp.net):
        probs = logits.float().softmax(-1)
        top = probs.max(-1)
        classes = {"probs": probs, "pred": top.indices, "prob": top.values}
    else:  # no classifier head: the output is the features, there is no predicted class
        classes = {"probs": None, "pred": None, "prob": None}
    classes = {k: None if v is None else v.cpu() for k, v in classes.items()}  # the figures draw from the CPU
    return {**classes,
            "readout": readout.reshape(len(layers), len(inp.x), *inp.info.grid_size).cpu(),  # (L, B, gh, gw)
            "entropy": torch.stack([entropy[i] for i in layers]).mean(1).cpu(),  # (L, H)
            "distance": torch.stack([dist[i] for i in layers]).float().cpu(),  # (L, B, H) pixels
            "distance_conventions": {name: torch.stack([d[i] for i in layers]).double().cpu()  # (L, B, H) each
                                     for name, d in zip(findings.DISTANCE_CONVENTIONS, (dist, renorm, patches))},
            "attention_shape": [len(layers), len(inp.x), int(entropy[layers[0]].shape[1]), T, T]}


def untrained_head(net: nn.Module) -> bool:
    """Whether ``net``'s classification head was never trained: a checkpoint whose card records masked-patch
    prediction (``objective="mpp"``: labels never read, the head is its initialisation)."""
    from vitlab.models.checkpoint import model_card

    return (model_card(net) or {}).get("objective") == "mpp"


def map_titles(inp: Inputs, pred: dict[str, Any], n: int) -> list[str]:
    """Row titles for map grids: true class (when known), predicted class and its probability. Image names and class
    names are escaped: plotly reads <b>, <br> or <a href> in a title as markup."""
    out = []
    for i in range(n):
        truth = inp.names[i] if inp.labels is None else f"true {inp.true_class_name(int(inp.labels[i]))}"
        truth = html.escape(truth, quote=False)
        if pred["pred"] is None:
            out.append(truth)
            continue
        c, pr = int(pred["pred"][i]), float(pred["prob"][i])
        out.append(f"{truth}<br>predicted {html.escape(inp.class_name(c), quote=False)} ({probability_words(pr)})")
    return out


# ---------------------------------------------------------------------------------------------- Fig. 7 left


#: the stamp's images for a section computed from the model's weights alone
NO_IMAGES = "none (computed from the weights alone)"


FILTERS_TITLE = "Patch-embedding filters: principal components (Fig. 7 left)"
FILTERS_PAPER = ("Fig. 7 left (ViT-L/32): the top 28 principal components of the patch-embedding filters resemble "
                 "plausible basis functions for a low-dimensional representation of the fine structure within each "
                 "patch.")


def filters(inp: Inputs) -> Section:
    if inp.info.hybrid:  # said, not silently left out
        return Section("filters", FILTERS_TITLE, None, FILTERS_PAPER,
                       "Not shown for this model: a hybrid's patches are cells of a ResNet feature map (paper "
                       "section 3.1), embedded from the ResNet's channels, so it has no filters over pixels to "
                       "decompose.", inp.stamp(NO_IMAGES))
    k = filter_component_count(inp.model)  # the paper's 28, or fewer where the filters allow fewer
    comps, ratio = (t.cpu() for t in embedding_filter_pca(inp.model, k=k))  # on the model's device: the figure's on the CPU
    random = random_filter_pca_ratios(inp.model, k=k, draws=20).cpu()
    weights = embedding_filters(inp.model).cpu()
    # both component-count conventions, each criterion checked on its controls (vitlab.findings.controls)
    verdicts = controls.validate(findings.judge_filters(weights, k), controls.filter_controls(weights, k))
    return Section(
        "filters", FILTERS_TITLE,
        filter_grid(comps.numpy(), ratio.numpy(), title="Patch-embedding filters: principal components<br><sup>"
                    "tile title: rank, explained variance</sup>"),
        FILTERS_PAPER,
        f"The top {k} components explain a share {fmt_value(float(ratio.sum()))} of the filters' variance (the first "
        f"{fmt_value(float(ratio[0]))}); randomly initialised filters of the same shape: "
        f"{fmt_value(float(random.sum(1).mean()))}.",
        inp.stamp(NO_IMAGES, k=k, centred=True, random_draws=20),
        inp.judged(verdicts, images=False),
        {"explained_variance": ratio.tolist(), "random_explained_variance": random.sum(1).tolist()})


# ---------------------------------------------------------------------------------------------- Fig. 7 centre


POSITIONS_TITLE = "Position-embedding similarity (Fig. 7 centre)"
POSITIONS_PAPER = ("Fig. 7 centre (ViT-L/32): closer patches have more similar position embeddings, with row/column "
                   "structure; the model learns the 2D image topology.")


def positions(inp: Inputs) -> list[Section]:
    if inp.info.pos_embed == "none":  # said, not silently left out
        how = attention_position_words(inp.info)
        why = (f"positions enter its attention through {how} instead, which has no table per patch to compare"
               if how else "it is told nothing about where a patch lies")
        return [Section("positions", POSITIONS_TITLE, None, POSITIONS_PAPER,
                        f"Not shown for this model: it has no position-embedding table; {why}.", inp.stamp(NO_IMAGES))]
    sim = position_embedding_similarity(inp.model).cpu()  # (gh, gw, gh, gw)
    score = position_structure_score(sim)
    gh, gw = inp.info.grid_size
    if inp.info.pos_embed == "fixed":  # a fixed table (sin-cos) has the topology by construction: nothing learned
        verdicts = []
        row_col_note = (" Not judged: this model's position embedding is fixed (e.g. the 2D sin-cos table), not "
                        "learned, so its structure says nothing about what the model learned.")
    else:
        verdicts = position_verdicts(inp.model, inp.info)
        row_col_note = ""
        if len(verdicts) < 2:  # grids too small to have pairs at equal distance in and off rows
            row_col_note = (f" Row/column structure not judged: no grid distance in a {gh}x{gw} grid is reached by "
                            "both same-row/column pairs and other pairs (a side of at least 6 and the other of at "
                            "least 4 needed).")
    if inp.info.attention_positions:  # e.g. EVA-02: a learned table and rotary embeddings
        row_col_note += (f" The table is only part of what this model knows of positions: its attention adds "
                         f"{attention_position_words(inp.info)}, which this figure does not show.")
    out = [Section(
        "positions", POSITIONS_TITLE,
        similarity_tiles(sim.numpy(), title=f"Position-embedding similarity<br><sup>tile (i, j): patch (i, j) against "
                         f"all patches of the {gh}x{gw} grid</sup>"),
        POSITIONS_PAPER,
        f"Spearman correlation between similarity and grid distance: {score:.3f} (-1: perfectly local; 0: no "
        f"structure).{row_col_note}",
        inp.stamp(NO_IMAGES, prefix_rows="excluded", grid=[gh, gw]), inp.judged(verdicts, images=False),
        {"spearman": score})]
    hi = (2 * gh, 2 * gw)
    sim_hi = position_embedding_similarity(inp.model, grid=hi).cpu()
    score_hi = position_structure_score(sim_hi)
    out.append(Section(
        "positions_resampled", f"Position embeddings resampled to {hi[0]}x{hi[1]} (fine-tuning at 2x resolution)",
        similarity_tiles(sim_hi.numpy(), title=f"Position-embedding similarity<br><sup>after bicubic resampling to a "
                         f"{hi[0]}x{hi[1]} grid</sup>"),
        "Section 3.2: for fine-tuning at a higher resolution the pre-trained position embeddings are "
        "2D-interpolated according to their location in the original image.",
        f"After bicubic resampling to {hi[0]}x{hi[1]}: Spearman {score_hi:.3f} (before: {score:.3f}).",
        inp.stamp(NO_IMAGES, resample="bicubic", grid=list(hi)), [], {"grid": list(hi), "spearman": score_hi}))
    return out


# ---------------------------------------------------------------------------------------------- Fig. 7 right


def gpsalayer_span(info: ModelInfo) -> str:
    """'; layers 1-k: gated positional self-attention (GPSA)' for a ConViT (``vitlab.figures.plots.gpsa_words``); "" for a
    model without it."""
    words = gpsa_words(info)
    return f"; {words}" if words else ""


def distance(inp: Inputs, pred: dict[str, Any]) -> Section:
    info = inp.info
    per = pred["distance"]  # (L, B, H) pixels, as mean_attention_distance(per_image=True): from the prediction pass
    dist = per.mean(1)  # (L, H)
    ceiling = uniform_attention_distance(info.grid_size, info.patch_size)
    # the lowest-layer spread and the trend decide from MIN_SPREAD_IMAGES images on (inconclusive below), under each
    # form of the distance convention; a trend needs 2 layers
    verdicts = distance_verdicts(pred["distance_conventions"], info)
    spread_v = next(v for v in verdicts if v.key == findings.KEY_LOWEST_SPREAD)  # the prose quotes its statistic
    spread = per.mean(2).std(1).numpy() if len(inp.x) > 1 else None
    lo, hi = float(dist[0].min()), float(dist[0].max())
    gpsa = ""
    if inp.untrained and info.gpsa_depth:  # not chance: local by construction
        gpsa = (f" In {layer_span(1, info.gpsa_depth)}, ConViT's gated positional self-attention "
                "starts local by construction (timm's local_init): with random weights their distance is that "
                "initialisation, not learned.")
    return Section(
        "distance", "Mean attention distance per head against depth (Fig. 7 right, Fig. 11)",
        layer_lines(dist.numpy(), "mean attention distance (pixels)",
                    f"Mean attention distance per head<br><sup>{len(inp.x)} images; dashed: uniform attention"
                    f"{gpsalayer_span(info)}</sup>",
                    spread,
                    reference=(ceiling, f"uniform attention over the {info.grid_size[0]}x{info.grid_size[1]} grid: "
                                        f"{ceiling:.1f} px"), spread_label="std over images"),
        "Fig. 7 right / Fig. 11 (ViT-L/16 on 128 images, 224 px): some heads attend to most of the image already in "
        "the lowest layers while others stay local; the attention distance grows with depth.",
        f"Lowest layer: heads from {lo:.1f} to {hi:.1f} px ({fmt_value(lo / ceiling)} to {fmt_value(hi / ceiling)} of "
        f"the {ceiling:.1f} px of uniform attention: {spread_v.quantity} {fmt_value(spread_v.statistic)} {spread_v.unit});"
        f" last layer: head mean {float(dist[-1].mean()):.1f} px, on a "
        f"{info.img_size[0]}x{info.img_size[1]} input.{gpsa}",
        inp.stamp(queries="patches", keys="patches, prefix dropped without renormalising", unit="pixels",
                  images=len(inp.x), error_bars="std over images of the head mean",
                  uniform_attention_px=round(ceiling, 2)),
        inp.judged(verdicts), {"mean_attention_distance_px": dist.tolist(), "uniform_attention_px": ceiling,
                   "std_over_images": spread.tolist() if spread is not None else None})


# ---------------------------------------------------------------------------------------------- Fig. 6 / 14


def faithfulness_sentence(rows: Sequence[MethodScores]) -> str:
    """Which methods score better than the random map on these images, in words formatted from the mean areas (a
    statement about these means, not a test: the table has no intervals)."""
    ref = next((r for r in rows if r.method == "random map"), None)
    if ref is None:
        return ""
    methods = [r for r in rows if r.method != "random map"]
    # compared as the table prints them (3 decimals): a difference it cannot show is not claimed
    lower = [r.method for r in methods if round(r.deletion_auc, 3) < round(ref.deletion_auc, 3)]
    higher = [r.method for r in methods if round(r.insertion_auc, 3) > round(ref.insertion_auc, 3)]

    def names(xs: list[str]) -> str:
        return ", ".join(xs) if xs else "none"

    return (f"Mean deletion area below the random map's {ref.deletion_auc:.3f}: {names(lower)}; mean insertion area "
            f"above its {ref.insertion_auc:.3f}: {names(higher)}.")


def maps_and_faithfulness(inp: Inputs, pred: dict[str, Any], max_images: int | None = None,
                          localisation: bool = True, tick: Callable[[str], None] | None = None) -> list[Section]:
    """Fig. 6 maps, their faithfulness table and curves; ``localisation``: whether the report has the localisation
    section on the synthetic shapes, which the map section points to; ``tick``: called with each map method's name
    as its work begins (``compare_methods``' ``on_method``)."""
    if pred["pred"] is None:
        return [rollout_only(inp, pred)]
    n_attr = min(len(inp.x), max_images or (16 if inp.info.num_tokens <= 100 else 4))
    rows, method_maps = compare_methods(inp.model, inp.x[:n_attr], progress=False, on_method=tick)
    n = min(inp.n_show, n_attr)
    show = torch.stack([method_maps[m][:n] for m in ATTRIBUTION_METHODS], 1).cpu()  # (n, K, gh, gw)
    grid = Section(
        "rollout", "Attention rollout and class-specific maps (Fig. 6 and 14)",
        image_grid_with_maps(inp.shown[:n], show.numpy(), map_titles(inp, pred, n), list(ATTRIBUTION_METHODS),
                             title=f"Maps for the predicted class<br><sup>{MAP_SCALING}</sup>"),
        "Fig. 6 / Fig. 14 (ViT-L/16): attention rollout of the output token onto the input space concentrates on "
        "the regions semantically relevant for classification.",
        "Rollout (head mean, residual 0.5, no discard) beside gradient rollout, integrated gradients and patch "
        "occlusion for the predicted class. Whether the maps localise the object is "
        + ("judged on the synthetic shapes, where the object's mask is known (localisation section)." if localisation
           else "not judged in this report: that needs the object's mask, which these images lack, and the "
                "scoring on the synthetic shapes, whose masks are known, was not run."),
        inp.stamp(n_attr, head_fusion="mean", residual=0.5, discard_ratio=0.0, start_layer=0, target="predicted class",
                  integrated_gradients="32 steps, grey baseline", occlusion="one patch at a time, grey baseline"))
    table = Section(
        "faithfulness", "Faithfulness of the map methods (our addition)", scores_table(rows, f"{n_attr} images"),
        "The paper shows rollout qualitatively; faithfulness and sanity checks (Petsiuk et al. 2018, Adebayo et al. "
        "2018) are our addition.",
        "Deletion (lower is better) and insertion (higher is better): the predicted class's probability as patches "
        "are removed from (or revealed on) a blurred copy in the map's order; the random map is the reference. "
        "Sanity: rank correlation with the same method on re-initialised weights (near 0: the map depends on the "
        "learned weights). " + faithfulness_sentence(rows),
        inp.stamp(images=n_attr, steps=16, baseline="blur", sanity="weights re-drawn, same targets"),
        metrics={"methods": [r.__dict__ for r in rows]})
    curves_fig = deletion_insertion_curves(
        np.array(rows[0].fraction), {r.method: np.array(r.deletion_curve) for r in rows},
        {r.method: np.array(r.insertion_curve) for r in rows}, "probability of the predicted class",
        "Deletion (solid) and insertion (dashed) curves<br><sup>mean over images; the random map is the "
        "reference</sup>")
    curve_sec = Section("faithfulness_curves", "Deletion and insertion curves (our addition)", curves_fig,
                        "(our addition)", f"Mean over the {n_attr} images; the areas under these curves are the "
                        "faithfulness table's deletion and insertion columns.",
                        inp.stamp(images=n_attr))
    return [grid, table, curve_sec]


def rollout_only(inp: Inputs, pred: dict[str, Any]) -> Section:
    """Fig. 6 for a model without a classifier head: rollout alone, since the class-specific maps and their
    faithfulness scores need class scores."""
    n = min(inp.n_show, len(inp.x))
    roll = attention_rollout(inp.model, inp.x[:n], head_fusion="mean", residual=0.5).cpu()  # (n, gh, gw)
    return Section(
        "rollout", "Attention rollout (Fig. 6 and 14)",
        image_grid_with_maps(inp.shown[:n], roll[:, None].numpy(), map_titles(inp, pred, n), ["rollout"],
                             title=f"Attention rollout<br><sup>{MAP_SCALING}</sup>"),
        "Fig. 6 / Fig. 14 (ViT-L/16): attention rollout of the output token onto the input space concentrates on "
        "the regions semantically relevant for classification.",
        "Rollout (head mean, residual 0.5, no discard) only: "
        + ("this model's classification head is untrained (masked-patch prediction never reads a label)"
           if untrained_head(inp.net) else "this model has no classifier head (its output is its features)")
        + ", so there is no predicted class for the class-specific maps or the faithfulness scores.",
        inp.stamp(n, head_fusion="mean", residual=0.5, discard_ratio=0.0, start_layer=0))


def scores_table(rows: list, title: str, localisation: bool = False):
    header = ["method", "deletion AUC (lower better)", "insertion AUC (higher better)", "sanity Spearman", "seconds"]
    if localisation:
        header[3:3] = ["mass on object", "pointing game"]
    cells = []
    for r in rows:
        row = [r.method, r.deletion_auc, r.insertion_auc,
               "n/a" if r.sanity_spearman is None else r.sanity_spearman, r.seconds]
        if localisation:
            row[3:3] = [r.mass_in_mask, r.pointing]
        cells.append(row)
    return table_figure(header, cells, title)


def uniform_entropy(info) -> tuple[float, str]:
    """The entropy figure's uniform-attention reference (value, label): log T nats, uniform over the T tokens. A
    ConViT's blocks before its class token joins (``class_token_joins``) attend over the N patches alone, and the
    figure averages their patch rows: their uniform reference, log N, is named beside it."""
    T, k, n = info.num_tokens, info.class_token_joins, info.num_patches
    d = 2 if not k or f"{np.log(T):.2f}" != f"{np.log(n):.2f}" else 3  # two values never printed alike (14x14: 5.28)
    label = f"uniform over {T} tokens: {np.log(T):.{d}f} nats"
    if k:
        label = (f"{label} ({layer_span(k + 1, info.depth)});<br>over the {n} patches of {layer_span(1, k)}, before the "
                 f"class token joins: {np.log(n):.{d}f} nats")
    return float(np.log(T)), label


def readout_and_entropy(inp: Inputs, pred: dict[str, Any]) -> list[Section]:
    info = inp.info
    n = min(inp.n_show, len(inp.x))
    first = info.class_token_joins if info.readout == "token" else 0  # a ConViT's class token: none before it joins
    layers = sorted({first, (first + info.depth) // 2, info.depth - 1})
    readout = pred["readout"][layers, :n].permute(1, 0, 2, 3)  # (n, K, gh, gw)
    return [
        Section("readout_attention", "Raw attention of the readout (for comparison with rollout)",
                image_grid_with_maps(inp.shown[:n], readout.numpy(), map_titles(inp, pred, n),
                                     [f"layer {i + 1}" for i in layers],
                                     title=f"Readout attention over the patches (head mean)<br><sup>{MAP_SCALING}</sup>"),
                "(raw attention, for comparison with rollout)", "Raw attention of the readout in a few layers" + (
                    f", from layer {first + 1}, where the class token joins: before it, ConViT's gated positional "
                    "self-attention attends over the patches alone and the readout has no row." if first else "."),
                inp.stamp(n, head_fusion="mean", layers=[i + 1 for i in layers])),
        Section("entropy", "Attention entropy per head against depth (our addition)",
                layer_lines(pred["entropy"].numpy(), "attention entropy (nats)",
                            "Attention entropy per head<br><sup>dashed: uniform attention</sup>",
                            reference=uniform_entropy(info)),
                "(our addition)", "Entropy of the attention rows averaged over queries and images: low = focused heads.",
                inp.stamp(), metrics={"attention_entropy_per_layer_nats": pred["entropy"].mean(1).tolist()})]


# ---------------------------------------------------------------------------------------------- localisation


def localisation_possible(shapes_checkpoint: Path) -> bool:
    """Whether the localisation section can be made: the shipped shapes ViT is there (``vitlab.base.shipped``: in a
    checkout's data/ or a wheel's vitlab/_embedded/)."""
    return (shapes_checkpoint / "model.safetensors").exists()


def localisation(shapes_checkpoint: Path, versions: dict, n: int = LOCALISATION_SHAPES,
                 device: torch.device | str = "cpu", tick: Callable[[str], None] | None = None) -> Section | None:
    """Localisation scores of every method for the shipped shapes ViT on ``n`` test shapes (true classes), computed
    on ``device``; None without that model (``localisation_possible``). ``tick``: as ``maps_and_faithfulness``'."""
    if not localisation_possible(shapes_checkpoint):
        return None
    from vitlab.models.load import load_model

    net = load_model(str(shapes_checkpoint)).to(device)
    data, rows, maps = shapes_localisation(net, n, progress=False, on_method=tick)  # as notebook 04 measures it
    maps = {k: v.cpu() for k, v in maps.items()}
    from vitlab.inspect import localisation as score

    chance = float(data.masks.double().mean())
    ro, rnd = score(maps["rollout"], data.masks), score(maps["random map"], data.masks)
    verdict = findings.rollout_localises(ro["mass_in_mask"], ro["pointing"], rnd["mass_in_mask"], rnd["pointing"])
    verdict = controls.validate([verdict], controls.rollout_controls(
        data.masks, tuple(maps["rollout"].shape[-2:]), rnd["mass_in_mask"], rnd["pointing"]))[0]
    verdict = replace(verdict, subject=f"vit_shapes (shipped) on {n} test shapes")  # not the model inspected
    stamp = {"model": "vit_shapes (shipped)", "weights": "data/checkpoints/vit_shapes", "versions": versions,
             "images": f"{n} test shapes (seed 1)", "settings": {"target": "true class", "steps": 16,
                                                                  "baseline": "blur"}, "chance": chance}
    return Section(
        "localisation", "Localisation on the synthetic shapes (Fig. 6, scored)",
        scores_table(rows, f"Shipped shapes ViT, {n} test shapes", localisation=True),
        "Fig. 6 shows rollout landing on the object; here that is scored against ground-truth masks.",
        f"Rollout puts {fmt_value(verdict.details['mass'])} of its mass on the object against "
        f"{fmt_value(verdict.details['random_mass'])} for a random map ({verdict.quantity} "
        f"{fmt_value(verdict.statistic)}; object area share, the score of a uniform map: {fmt_value(chance)}); "
        f"pointing game {fmt_value(verdict.details['pointing'])} against {fmt_value(verdict.details['random_pointing'])}"
        " (fractions of 1).",
        stamp, [verdict], {"stamp": stamp, "methods": [row.__dict__ for row in rows]})


# ---------------------------------------------------------------------------------------------- §4.1


#: what the few-shot section measures, as the verdict table names it when it was not run
FEW_SHOT = "few-shot linear probe on CIFAR-10 (section 4.1)"


def few_shot(inp: Inputs, train_per_class: int | None = None, test_images: int | None = None,
             tick: Callable[[str], None] | None = None) -> Section:
    """The paper's few-shot probe on the model's features, on CIFAR-10 when it is readable here; ``tick``: called
    with each part's name as its work begins (reading CIFAR-10, then each split's features)."""
    tick = tick or (lambda what: None)
    from vitlab.data.datasets import DataError, DatasetMissing, load_cifar, nested_subsets
    from vitlab.probe.features import extract_features
    from vitlab.probe.linear import DEFAULT_L2, few_shot_accuracy

    tick("reading CIFAR-10")
    try:
        # where `cifar10` is read from (vitlab.data.datasets.cifar_places); never a download in the middle of a report
        train, test = load_cifar("cifar10", "train", download=False), load_cifar("cifar10", "test", download=False)
    except DataError as e:
        why = (f"CIFAR-10 is not on this machine (looked in {', '.join(e.looked_in)}): {e.fix}"
               if isinstance(e, DatasetMissing) else f"CIFAR-10 could not be read: {str(e).splitlines()[0]}")
        return Section("few_shot", "Few-shot linear probe (section 4.1)", None,
                       "Section 4.1: few-shot accuracy from a regularised least-squares regression of frozen features "
                       "to {-1, 1}^K targets.", f"Not run: {why}.", inp.stamp("none (the probe was not run)"),
                       not_judged=[(FEW_SHOT, why)])
    small = inp.info.num_tokens <= 100  # 32 px models: cheap; large inputs: fewer images (CIFAR is upsampled)
    train_per_class = train_per_class or (100 if small else 30)
    test_images = test_images or (2000 if small else 500)
    train = train.subset(nested_subsets(train.labels, [train_per_class * len(train.classes)], seed=0)[0])
    test = test.subset(nested_subsets(test.labels, [min(test_images, len(test))], seed=0)[0])
    tick(f"features of {len(train)} training images")
    ftr = extract_features(inp.model, train, progress=False)
    tick(f"features of {len(test)} test images")
    fte = extract_features(inp.model, test, progress=False)
    res = few_shot_accuracy(ftr, train.labels, fte, test.labels)
    shots = sorted(res)
    fig = table_figure(["shots", "accuracy (mean over seeds)", "std over seeds", "chance"],
                       [[k, res[k].mean, res[k].std, 1 / len(train.classes)] for k in shots],
                       f"Few-shot accuracy on CIFAR-10 ({len(test)} test images)")
    return Section(
        "few_shot", "Few-shot linear probe on CIFAR-10 (section 4.1)", fig,
        "Section 4.1: few-shot accuracy from a closed-form regularised least-squares regression of frozen features "
        "to {-1, 1}^K targets; the paper's few-shot results are 5-shot (Fig. 4, Table 8). Here 1, 5, 10 and 25 "
        "shots, as the authors' big_vision evaluator.",
        ", ".join(f"{k}-shot {res[k].mean:.1%} (std {res[k].std:.1%})" for k in shots)
        + f"; chance {1 / len(train.classes):.0%}. Note: a model trained on CIFAR-10 itself has seen these classes; "
          "the data-scaling section probes held-out classes.",
        inp.stamp(f"{len(train)} CIFAR-10 training and {len(test)} test images", l2=DEFAULT_L2, seeds=3,
                  train_pool=f"{len(train)} training images (class-balanced)", test=f"{len(test)} test images",
                  whitened=True),
        metrics={str(k): {"mean": res[k].mean, "std": res[k].std} for k in shots})


# ---------------------------------------------------------------------------------------------- Fig. 3/4


def scaling(results: Path, versions: dict) -> list[Section] | None:
    """The shipped data-scaling sweep as a figure, with the verdict on the ResNet-ViT gap; and, where its runs hold
    Fig. 7 statistics, the lowest layer's locality against data size with its verdicts (``scaling_locality``)."""
    if not results.is_file():
        return None
    from vitlab.studies.scaling import ResultsStore, summarise, summarise_compute

    # the most recent sweep's code and config
    records = [r for r in ResultsStore(results).newest_sweep().values() if r["status"] == "ok"]
    if not records:
        return None
    verdicts, why = controls.judge_study(records)
    note = f" Not judged: {why}" if why else ""
    gap_verdicts = [v for v in verdicts if v.key == study_findings.KEY_SCALING]
    local = [v for v in verdicts if v.key != study_findings.KEY_SCALING]
    words = study_findings.study_words(records, verdicts) if verdicts else ""
    summary = summarise(records, shots=10)
    fig = scaling_curves(summary, title="10-shot accuracy on held-out classes<br><sup>error bars: std over seeds"
                                        "</sup>", compute=summarise_compute(records) or None)
    sizes = sorted({int(r["spec"]["size"]) for r in records})
    stamp = {"model": "see the sweep's records", "weights": str(results.name), "versions": versions,
             "settings": {"shots": 10}}
    gap = Section(
        "scaling", "Data scaling in miniature (Fig. 3/4)", fig,
        "Fig. 3/4: with small pre-training data ResNets (BiT) lead; as data grows ViTs catch up and overtake them.",
        f"From the shipped sweep ({results.name}, {len(records)} runs"
        + (f", {sizes[0]:,} to {sizes[-1]:,} images" if sizes else "") + ")." + note + (f" {words}" if words else ""),
        stamp, gap_verdicts)
    locality = scaling_locality(records, results.name, stamp, local)
    return [gap] + ([locality] if locality else [])


def scaling_locality(records: list[dict], name: str, stamp: dict, verdicts: list[Verdict]) -> Section | None:
    """The lowest layer's locality against pre-training data size, per family whose runs hold Fig. 7 statistics
    (``study_findings.locality_by_size``), with each family's locality verdict and its controls (``verdicts``, as
    ``controls.locality_verdicts`` gives them); None without one (a sweep whose runs predate them)."""
    from vitlab.figures.plots import locality_curves
    from vitlab.train.emergence import LOCAL_HEAD

    if not verdicts:
        return None
    by_family = {v.details["family"]: study_findings.locality_by_size(records, v.details["family"]) for v in verdicts}

    fig = locality_curves(by_family, LOCAL_HEAD, title="The lowest layer's attention distance against pre-training "
                          "images<br><sup>128 fixed test images; error bars: 95% interval over seeds</sup>")
    return Section(
        "scaling_locality", "Lowest-layer locality along the data axis (Raghu et al. 2021)", fig,
        "Raghu et al. 2021: ViTs pre-trained on less data (ImageNet rather than JFT-300M) learn fewer local heads in "
        "their lowest layer.",
        f"From the same sweep ({name}), each run's Fig. 7 statistics: " + "; ".join(
            f"{f}: {study_findings.locality_words(by)}" for f, by in by_family.items()) + f" (a head is local below {LOCAL_HEAD:.0%} of uniform).",
        stamp, verdicts)
