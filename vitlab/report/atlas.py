"""The report's sections beyond the paper (issue 49): the causal head atlas and the token diagnostics.

``head_atlas``: every head's importance (``vitlab.head_importance``, mean and zero ablation, 95% intervals over
images) against its mean attention distance, and whether the lowest layers' local heads and their global heads
matter for the prediction. ``token_sections``: the share of attention on each prefix token per layer and head
(``vitlab.prefix_attention``), how much mean attention distance and rollout change between the prefix conventions,
and the token norms per layer with the high-norm outlier verdict (``vitlab.token_norms``; Darcet et al. 2024,
"Vision Transformers Need Registers").

The criteria and what they decide live in ``vitlab.findings.atlas``, the tensors in ``vitlab.inspect.heads`` and
``vitlab.inspect.tokens`` (notebook 10 uses the same functions); this module runs them on the report's inputs and
formats their numbers into figures and sentences.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitlab.base.intervals import fmt_value
from vitlab.figures.plots import head_atlas as atlas_figure
from vitlab.figures.plots import layer_span, prefix_share_heatmaps, token_norm_lines
from vitlab.findings.atlas import (
    GROUP_CRITERION,
    MATTERS_NATS,
    OUTLIER_CRITERION,
    OUTLIER_RATIO,
    OUTLIER_SHARE,
    GroupEffect,
    HeadGroups,
    distance_convention_change,
    fence_words,
    head_group_effects,
    local_minus_global,
    outlier_layers,
    rollout_convention_change,
)
from vitlab.findings.verdict import json_types
from vitlab.inspect.distance import uniform_attention_distance
from vitlab.inspect.heads import ABLATIONS, HeadImportance, head_importance
from vitlab.inspect.tokens import norm_summary, prefix_attention, rollout_prefix_change, token_norms
from vitlab.report.sections import Inputs, Section

__all__ = ["head_atlas", "token_sections", "prefix_section", "norms_section", "ablation_targets"]


def ablation_targets(inp: Inputs, pred: dict[str, Any]) -> tuple[Tensor, str]:
    """The classes whose log-probability the ablations follow, and their name: the images' true classes when they
    are classes of the model's head (the CIFAR sample for a CIFAR-10 model), else the model's own predictions."""
    from vitlab.data.images import head_labels

    y = head_labels(inp.net, len(inp.x)) if inp.labels is not None else None  # labels: the default images'
    if y is not None:
        return y.to(inp.x.device), "the images' true classes"
    return pred["pred"].to(inp.x.device), "the unablated model's predicted classes (no true class of its head)"


def _group_words(name: str, g: GroupEffect | None, ceiling: float) -> str:
    if g is None:
        return f"no {name} heads (one head in the lowest layers: nothing to split)"
    lo, hi = g.distance_px
    return (f"the {len(g.heads)} {name} heads ({lo:.1f} to {hi:.1f} px, {fmt_value(lo / ceiling)} to "
            f"{fmt_value(hi / ceiling)} of uniform attention) {fmt_value(g.drop)} nats per head "
            f"[{fmt_value(g.interval[0])}, {fmt_value(g.interval[1])}], accuracy {fmt_value(g.accuracy_drop)}: "
            f"{g.matters}")


def head_atlas(inp: Inputs, pred: dict[str, Any], batch_size: int = 32) -> Section:
    """The head atlas section (slug ``head_atlas``): see the module. Needs a classifier head (``pred["pred"]``)."""
    title = "Causal head atlas: importance against mean attention distance (our addition)"
    paper = ("Beyond the paper (Fig. 7 right shows local and global heads in the lowest layers, not whether they "
             "matter): each head's output replaced by its mean over the images (mean ablation) or by zero, one head "
             "at a time, and the drop in the true class's log-probability measured.")
    if pred["pred"] is None:
        return Section("head_atlas", title, None, paper, "Not measured: this model has no trained classifier head, "
                       "so there is no class whose probability an ablation could lower.", inp.stamp())
    y, targets = ablation_targets(inp, pred)
    res = {a: head_importance(inp.model, inp.x, y, ablation=a, batch_size=batch_size, progress=False)
           for a in ABLATIONS}
    distance = pred["distance"].double().mean(1)  # (L, H) px
    if tuple(distance.shape) != tuple(res["mean"].logprob_drop.shape):  # e.g. a block of two parallel attentions
        return Section("head_atlas", title, None, paper, f"Not drawn: this model's {tuple(distance.shape)} heads of "
                       f"the distance figure are not the {tuple(res['mean'].logprob_drop.shape)} heads ablated.",
                       inp.stamp())
    ceiling = uniform_attention_distance(inp.info.grid_size, inp.info.patch_size)
    groups = head_group_effects(res, distance)
    k = groups.lowest
    fig = atlas_figure(distance.numpy(), {a: r.logprob_drop.numpy() for a, r in res.items()},
                       {a: r.logprob_interval.numpy() for a, r in res.items()}, groups.codes.numpy(),
                       f"Head importance against mean attention distance<br><sup>{len(inp.x)} images; error bars: "
                       f"95% interval over images; lowest layers: {layer_span(1, k)}</sup>")
    return Section("head_atlas", title, fig, paper, _atlas_words(res, groups, distance, ceiling, targets),
                   inp.stamp(targets=targets, ablations=list(ABLATIONS), lowest_layers=k,
                             threshold_nats=MATTERS_NATS, interval=res["mean"].interval_method,
                             shared_prefix=res["mean"].shared),
                   metrics=_atlas_metrics(res, groups, distance, targets))


def _atlas_words(res: dict[str, HeadImportance], groups: HeadGroups, distance: Tensor, ceiling: float,
                 targets: str) -> str:
    mean, k = res["mean"], groups.lowest
    i, j = mean.most_important()
    lo, hi = mean.logprob_interval[i, j].tolist()
    parts = [f"Targets: {targets}; unablated accuracy {fmt_value(float(mean.base_correct.double().mean()))}."]
    for a in ABLATIONS:
        e = groups.effects[a]
        diff = local_minus_global(res[a], groups.codes)
        contrast = ("" if diff is None else f"; local minus global {fmt_value(diff[0])} nats per head "
                    f"[{fmt_value(diff[1][0])}, {fmt_value(diff[1][1])}]")
        parts.append(f"{a.capitalize()} ablation, {layer_span(1, k)}: {_group_words('local', e['local'], ceiling)}; "
                     f"{_group_words('global', e['global'], ceiling)}{contrast}.")
    parts.append(f"Most important head under mean ablation: layer {i + 1}, head {j} ({float(distance[i, j]):.1f} px), "
                 f"{fmt_value(float(mean.logprob_drop[i, j]))} nats [{fmt_value(lo)}, {fmt_value(hi)}], accuracy "
                 f"drop {fmt_value(float(mean.accuracy_drop[i, j]))}; heads whose interval lies above "
                 f"{MATTERS_NATS} nats: {int((mean.logprob_interval[..., 0] > MATTERS_NATS).sum())} of "
                 f"{int((~mean.logprob_drop.isnan()).sum())}.")
    parts.append(f"Criterion: {GROUP_CRITERION}; local and global: the nearer and the farther half of the lowest "
                 f"layers' heads by mean attention distance (uniform attention: {ceiling:.1f} px).")
    return " ".join(parts)


def _contrast(res: HeadImportance, groups: HeadGroups) -> dict[str, Any] | None:
    diff = local_minus_global(res, groups.codes)
    return None if diff is None else {"mean": diff[0], "interval": list(diff[1]), "method": diff[2]}


def _atlas_metrics(res: dict[str, HeadImportance], groups: HeadGroups, distance: Tensor, targets: str
                   ) -> dict[str, Any]:
    return {"targets": targets, "lowest_layers": groups.lowest, "threshold_nats": MATTERS_NATS,
            "criterion": GROUP_CRITERION, "distance_px": distance.tolist(), "groups": groups.codes.tolist(),
            "interval_method": res["mean"].interval_method, "shared": res["mean"].shared,
            "base_accuracy": float(res["mean"].base_correct.double().mean()),
            "ablations": {a: {"logprob_drop": r.logprob_drop.tolist(), "logprob_interval": r.logprob_interval.tolist(),
                              "accuracy_drop": r.accuracy_drop.tolist(),
                              "accuracy_interval": r.accuracy_interval.tolist(),
                              "groups": {g: None if e is None else json_types(asdict(e))
                                         for g, e in groups.effects[a].items()},
                              "local_minus_global": _contrast(r, groups)}
                          for a, r in res.items()}}


# ---------------------------------------------------------------------------------------------- tokens


def _interval_words(d: dict[str, Any]) -> str:
    lo, hi = d["interval"]
    return f"{fmt_value(d['mean'])} [{fmt_value(lo)}, {fmt_value(hi)}]"


def prefix_section(inp: Inputs, pred: dict[str, Any], batch_size: int = 32) -> Section:
    """The prefix-attention section (slug ``prefix_attention``): each prefix token's share of the attention per
    layer and head, and how much distance and rollout change between the prefix conventions."""
    info = inp.info
    title = "Token diagnostics: attention on the prefix tokens and the prefix conventions (our addition)"
    paper = ("Beyond the paper: Darcet et al. 2024 find that large ViTs trained long route attention through a few "
             "tokens (registers, or high-norm patches without them); how much attention the class, distillation "
             "and register tokens take decides how much the prefix convention of the distance and rollout figures "
             "matters.")
    ceiling = uniform_attention_distance(info.grid_size, info.patch_size)
    dist = distance_convention_change(pred["distance_conventions"], ceiling)
    if not info.num_prefix_tokens:
        return Section("prefix_attention", title, None, paper, "This model has no prefix tokens: every query attends "
                       "to patches alone, and the prefix conventions of distance and rollout coincide.", inp.stamp(),
                       metrics={"prefix_kinds": [], "distance": dist})
    share = prefix_attention(inp.model, inp.x, batch_size=batch_size, progress=False).cpu()  # (L, H, P)
    roll = rollout_convention_change(rollout_prefix_change(inp.model, inp.x, batch_size=batch_size))
    per_layer = share.nansum(-1).mean(1)  # (L,) head mean of the share on all prefix tokens
    flat = torch.nan_to_num(share, nan=-1.0)
    i, j, t = np.unravel_index(int(flat.argmax()), tuple(share.shape))
    kinds = list(info.prefix_kinds)
    fig = prefix_share_heatmaps(share.numpy(), kinds, f"Share of attention on each prefix token<br><sup>all "
                                f"queries, mean over {len(inp.x)} images; uniform attention gives each token "
                                f"{1 / info.num_tokens:.3f}</sup>")
    ours = (f"Share of all queries' attention on the {len(kinds)} prefix tokens ({', '.join(kinds)}), head mean: "
            f"{fmt_value(float(per_layer[0]))} in layer 1, {fmt_value(float(per_layer.max()))} at most (layer "
            f"{int(per_layer.argmax()) + 1}), {fmt_value(float(per_layer[-1]))} in layer {len(per_layer)}; uniform "
            f"attention would give them {fmt_value(len(kinds) / info.num_tokens)}. Largest single head: layer {i + 1}, "
            f"head {j}, {fmt_value(float(share[i, j, t]))} on the {kinds[t]} token. Mean attention distance with the "
            f"prefix share renormalised away against dropped: layer head means differ by at most "
            f"{dist['largest_layer_change_px']:.2f} px (layer {dist['largest_layer']}, "
            f"{fmt_value(dist['largest_layer_change_share'])} of the {ceiling:.1f} px of uniform attention), single "
            f"heads by at most {dist['largest_head_change_px']:.2f} px. Rollout of the readout with the prefix "
            f"tokens in every layer against with their keys removed and rows renormalised: Spearman "
            f"{_interval_words(roll['spearman'])}, total-variation distance {_interval_words(roll['total_variation'])}"
            f" between the maps scaled to sum 1 (95% intervals over images); with the prefix kept, "
            f"{_interval_words(roll['prefix_mass'])} of the readout's rollout mass stays on the prefix tokens.")
    return Section("prefix_attention", title, fig, paper, ours,
                   inp.stamp(queries="all", heads="each", rollout="head mean, residual 0.5, no discard",
                             interval=roll["spearman"]["method"]),
                   metrics={"prefix_kinds": kinds, "share": share.tolist(), "share_per_layer": per_layer.tolist(),
                            "distance": dist, "rollout": roll})


def norms_section(inp: Inputs, batch_size: int = 32) -> Section:
    """The token-norm section (slug ``token_norms``): the norms per layer and the high-norm outlier verdict."""
    norms = token_norms(inp.model, inp.x, batch_size=batch_size, progress=False)
    verdict, rows = outlier_layers(norms)
    lines = {name: v.numpy() for name, v in norm_summary(norms).items()}
    L = len(norms.norms)
    fig = token_norm_lines(lines, norms.fences.numpy(), f"Token norms per layer<br><sup>{len(inp.x)} images; "
                           "dashed: the outlier fence Q3 + 3 IQR of each layer's patch norms</sup>")
    present = [r["layer"] for r in rows if r["verdict"] == "present"]
    top = max(rows, key=lambda r: r["share"])
    prefix = "; ".join(f"{name.removesuffix(': mean')} {fmt_value(float(v[-1]))}" for name, v in lines.items()
                       if not name.startswith("patches"))
    ours = (f"Median patch norm {fmt_value(float(lines['patches: median'][0]))} in layer 1 and "
            f"{fmt_value(float(lines['patches: median'][-1]))} in layer {L}, largest "
            f"{fmt_value(float(lines['patches: largest'].max()))}" + (f"; last layer's prefix tokens: {prefix}" if prefix
                                                                       else "")
            + f". Share of patches above their layer's fence: {fence_words(top)}. High-norm outliers: {verdict}"
            + (f" (layers {', '.join(map(str, present))})" if present else "")
            + f". Criterion: {OUTLIER_CRITERION}. Darcet et al. find about 2% of patches far above the rest in large "
            "models trained long, from the middle layers on.")
    return Section("token_norms", "Token diagnostics: token norms and high-norm outliers (our addition)", fig,
                   "Darcet et al. 2024, \"Vision Transformers Need Registers\": large ViTs trained long develop "
                   "high-norm tokens in low-information background patches, which take attention and make maps noisy.",
                   ours, inp.stamp(fence="Q3 + 3 IQR per layer", share_threshold=OUTLIER_SHARE,
                                   norm_ratio=OUTLIER_RATIO, where="each block's output, before the final norm"),
                   metrics={"verdict": verdict, "criterion": OUTLIER_CRITERION, "layers": rows,
                            "prefix_kinds": list(norms.prefix_kinds),
                            "lines": {k: v.tolist() for k, v in lines.items()}, "fences": norms.fences.tolist()})


def token_sections(inp: Inputs, pred: dict[str, Any], batch_size: int = 32) -> list[Section]:
    """The two token-diagnostic sections: ``prefix_section`` and ``norms_section``."""
    return [prefix_section(inp, pred, batch_size), norms_section(inp, batch_size)]
