"""The report's sections beyond the paper (issue 49): the causal head atlas and the token diagnostics.

``head_atlas``: every head's importance (``vitlab.head_importance``, mean and zero ablation, 95% intervals over
images) against its mean attention distance, and whether the lowest layers' local heads and their global heads
matter for the prediction, by ``GROUP_CRITERION``. ``token_sections``: the share of attention on each prefix token
per layer and head (``vitlab.prefix_attention``), how much mean attention distance and rollout change between the
prefix conventions, and the token norms per layer with the high-norm outlier verdict (``vitlab.token_norms``,
``OUTLIER_CRITERION``; Darcet et al. 2024, "Vision Transformers Need Registers").

Statements here are not the paper's findings, so they are no ``Verdict`` rows of the findings table: each is a
stated criterion on a 95% interval, decided by ``vitlab.findings.verdict.decide`` and kept in the section's metrics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitlab.base.intervals import N_BOOT, SEED, fmt_value, mean_interval
from vitlab.base.stats import spearman
from vitlab.figures.plots import head_atlas as atlas_figure
from vitlab.figures.plots import layer_span, prefix_share_heatmaps, token_norm_lines
from vitlab.findings import model as findings
from vitlab.findings.verdict import decide, json_types
from vitlab.inspect.capture import capture_attention
from vitlab.inspect.distance import uniform_attention_distance
from vitlab.inspect.heads import ABLATIONS, HeadImportance, head_importance
from vitlab.inspect.rollout import JointRollout, readout_vector
from vitlab.inspect.tokens import TokenNorms, prefix_attention, token_norms
from vitlab.report.sections import Inputs, Section

__all__ = ["head_atlas", "token_sections", "GroupEffect", "head_groups", "ablation_targets", "outlier_layers",
           "rollout_conventions", "MATTERS_NATS", "LOWEST_SHARE", "OUTLIER_SHARE", "OUTLIER_RATIO", "GROUP_CRITERION",
           "OUTLIER_CRITERION"]

#: the share of the blocks counted as the lowest layers (at least one block)
LOWEST_SHARE = 0.25
#: a group of heads matters when the 95% interval of its mean drop per head lies above this many nats (a drop of
#: 0.01 nats is a 1% lower probability of the true class), does not when it lies below
MATTERS_NATS = 0.01
GROUP_CRITERION = (f"a group of heads matters for the prediction when the 95% interval over images of its mean drop "
                   f"in log p(true class) per head, with one head ablated at a time, lies above {MATTERS_NATS} nats; "
                   "it does not when the interval lies below; otherwise undecided")
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
#: how ``decide``'s words read for a group of heads
MATTERS = {"reproduced": "matters", "not reproduced": "does not matter", "inconclusive": "undecided"}


def _mean_and_interval(values: np.ndarray) -> tuple[float, tuple[float, float], str]:
    """The mean of per-image ``values`` and its 95% interval (``mean_interval``); values without spread (every image
    alike, e.g. a head whose output no weight reads) have the degenerate interval at their value."""
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


def lowest_layers(depth: int) -> int:
    """How many blocks count as the lowest layers: ``LOWEST_SHARE`` of ``depth``, rounded, at least one."""
    return max(1, round(LOWEST_SHARE * depth))


def head_groups(distance: Tensor, lowest: int) -> Tensor:
    """(L, H) mean attention distances -> (L, H) int codes: 0 for the heads above the ``lowest`` blocks; among the
    lowest blocks' heads ranked by distance, 1 (local) for the nearer half (rounded down), 2 (global) for the rest."""
    codes = torch.zeros(distance.shape, dtype=torch.long)
    low = distance[:lowest].reshape(-1)
    order = torch.argsort(low, stable=True)
    flat = torch.full_like(low, 2, dtype=torch.long)
    flat[order[: len(low) // 2]] = 1
    codes[:lowest] = flat.reshape(lowest, -1)
    return codes


def group_effect(res: HeadImportance, mask: Tensor, distance: Tensor) -> GroupEffect | None:
    """The effect of the heads in ``mask`` (L, H) under ``res``'s ablation; None for an empty group."""
    if not bool(mask.any()):
        return None
    per_image = res.per_image_drop[mask].double().mean(0).numpy()  # (B,) the group's mean drop per head
    drop, iv, method = _mean_and_interval(per_image)
    d = distance[mask]
    return GroupEffect(heads=tuple((int(i), int(j)) for i, j in mask.nonzero().tolist()),
                       distance_px=(float(d.min()), float(d.max())), drop=drop, interval=iv, method=method,
                       accuracy_drop=float(res.accuracy_drop[mask].mean()),
                       matters=MATTERS[decide(iv, MATTERS_NATS, ">")])


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
    k = lowest_layers(len(distance))
    codes = head_groups(distance, k)
    effects = {a: {"local": group_effect(r, codes == 1, distance), "global": group_effect(r, codes == 2, distance)}
               for a, r in res.items()}
    fig = atlas_figure(distance.numpy(), {a: r.logprob_drop.numpy() for a, r in res.items()},
                       {a: r.logprob_interval.numpy() for a, r in res.items()}, codes.numpy(),
                       f"Head importance against mean attention distance<br><sup>{len(inp.x)} images; error bars: "
                       f"95% interval over images; lowest layers: {layer_span(1, k)}</sup>")
    return Section("head_atlas", title, fig, paper, _atlas_words(res, effects, distance, k, ceiling, targets),
                   inp.stamp(targets=targets, ablations=list(ABLATIONS), lowest_layers=k,
                             threshold_nats=MATTERS_NATS, interval=res["mean"].interval_method,
                             shared_prefix=res["mean"].shared),
                   metrics=_atlas_metrics(res, effects, distance, codes, k, targets))


def _atlas_words(res: dict[str, HeadImportance], effects: dict[str, dict[str, GroupEffect | None]], distance: Tensor,
                 k: int, ceiling: float, targets: str) -> str:
    mean = res["mean"]
    i, j = divmod(int(torch.nan_to_num(mean.logprob_drop, nan=-math.inf).argmax()), mean.logprob_drop.shape[1])
    lo, hi = mean.logprob_interval[i, j].tolist()
    parts = [f"Targets: {targets}; unablated accuracy {fmt_value(float(mean.base_correct.double().mean()))}."]
    for a in ABLATIONS:
        e = effects[a]
        parts.append(f"{a.capitalize()} ablation, {layer_span(1, k)}: {_group_words('local', e['local'], ceiling)}; "
                     f"{_group_words('global', e['global'], ceiling)}.")
    parts.append(f"Most important head under mean ablation: layer {i + 1}, head {j} ({float(distance[i, j]):.1f} px), "
                 f"{fmt_value(float(mean.logprob_drop[i, j]))} nats [{fmt_value(lo)}, {fmt_value(hi)}], accuracy "
                 f"drop {fmt_value(float(mean.accuracy_drop[i, j]))}; heads whose interval lies above "
                 f"{MATTERS_NATS} nats: {int((mean.logprob_interval[..., 0] > MATTERS_NATS).sum())} of "
                 f"{int((~mean.logprob_drop.isnan()).sum())}.")
    parts.append(f"Criterion: {GROUP_CRITERION}; local and global: the nearer and the farther half of the lowest "
                 f"layers' heads by mean attention distance (uniform attention: {ceiling:.1f} px).")
    return " ".join(parts)


def _atlas_metrics(res: dict[str, HeadImportance], effects: dict[str, dict[str, GroupEffect | None]],
                   distance: Tensor, codes: Tensor, k: int, targets: str) -> dict[str, Any]:
    return {"targets": targets, "lowest_layers": k, "threshold_nats": MATTERS_NATS, "criterion": GROUP_CRITERION,
            "distance_px": distance.tolist(), "groups": codes.tolist(),
            "interval_method": res["mean"].interval_method, "shared": res["mean"].shared,
            "base_accuracy": float(res["mean"].base_correct.double().mean()),
            "ablations": {a: {"logprob_drop": r.logprob_drop.tolist(), "logprob_interval": r.logprob_interval.tolist(),
                              "accuracy_drop": r.accuracy_drop.tolist(),
                              "accuracy_interval": r.accuracy_interval.tolist(),
                              "groups": {g: None if e is None else json_types(asdict(e)) for g, e in effects[a].items()}}
                          for a, r in res.items()}}


# ---------------------------------------------------------------------------------------------- tokens


def outlier_layers(norms: TokenNorms) -> tuple[str, list[dict[str, Any]]]:
    """The outlier verdict ("present", "absent" or "undecided", ``OUTLIER_CRITERION``) and per layer: the share of
    outlier patches with its interval over images, the norm ratio of the outliers' median to the layer's median
    patch norm (NaN without outliers), the fence and the layer's verdict."""
    rows = []
    patches = norms.patch_norms.double()  # (L, B, N)
    for layer in range(len(patches)):
        per_image = norms.outliers[layer].double().mean(1).numpy()  # (B,)
        share, iv, method = _mean_and_interval(per_image)
        flat, out = patches[layer].reshape(-1), norms.outliers[layer].reshape(-1)
        ratio = float(flat[out].median() / flat.median()) if bool(out.any()) else math.nan
        big = ratio >= OUTLIER_RATIO
        state = ("present" if big and iv[0] > OUTLIER_SHARE else
                 "absent" if iv[1] < OUTLIER_SHARE or not big else "undecided")
        rows.append({"layer": layer + 1, "share": share, "interval": list(iv), "method": method, "norm_ratio": ratio,
                     "fence": float(norms.fences[layer]), "verdict": state})
    states = {r["verdict"] for r in rows}
    return ("present" if "present" in states else "undecided" if "undecided" in states else "absent"), rows


def _prefix_removed(maps: Tensor, p: int) -> Tensor:
    """(B, H, T, T) maps with the attention on the ``p`` prefix keys removed and each row renormalised over the
    patch keys; a row with nothing on the patches (a ConViT's class token before it joins) is left as it was."""
    patches = maps[..., p:]
    total = patches.sum(-1, keepdim=True)
    moved = torch.cat([torch.zeros_like(maps[..., :p]), patches / total.clamp_min(1e-30)], -1)
    return torch.where(total > 0, moved, maps)


@torch.no_grad()
def rollout_conventions(inp: Inputs, batch_size: int = 32) -> dict[str, Any]:
    """The readout's rollout (head mean, residual 0.5) with the prefix tokens in every layer's attention (vitlab's
    convention) against with the prefix keys removed and rows renormalised in every layer: per image, the Spearman
    correlation of the two patch maps and their total-variation distance (each map scaled to sum 1), means with 95%
    intervals over images; and the share of the readout's rollout mass on the prefix tokens in vitlab's convention."""
    p = inp.info.num_prefix_tokens
    rho, tv, mass = [], [], []
    for x in inp.x.split(batch_size):
        kept, removed = JointRollout(), JointRollout()

        def reduce(layer: int, maps: Tensor) -> None:
            kept(layer, maps)
            removed(layer, _prefix_removed(maps, p))

        with capture_attention(inp.model, head_fusion="mean", reduce=reduce) as cap:
            inp.net(x)
            pool = cap.pool_maps()
        v = readout_vector(inp.info, len(x), pool, device=x.device).unsqueeze(1)
        a, b = (v @ kept.joint).squeeze(1).cpu(), (v @ removed.joint).squeeze(1).cpu()  # (b, T)
        mass.append(a[:, :p].sum(1))
        a, b = a[:, p:], b[:, p:]
        a, b = a / a.sum(1, keepdim=True), b / b.sum(1, keepdim=True)
        rho.append(spearman(a, b))
        tv.append(0.5 * (a - b).abs().sum(1))
    out = {}
    for name, v in (("spearman", rho), ("total_variation", tv), ("prefix_mass", mass)):
        m, iv, method = _mean_and_interval(torch.cat(v).double().numpy())
        out[name] = {"mean": m, "interval": list(iv), "method": method}
    return out


def distance_convention_change(pred: dict[str, Any], ceiling: float) -> dict[str, Any]:
    """How much mean attention distance changes when the prefix keys' share is renormalised away (the first two
    ``findings.DISTANCE_CONVENTIONS``): per layer the head mean in both (px), the largest change of a layer's head
    mean and of a single head (px and as a share of the uniform-attention distance ``ceiling``)."""
    plain, renorm = (pred["distance_conventions"][n].mean(1) for n in findings.DISTANCE_CONVENTIONS[:2])  # (L, H)
    layer_change = (renorm.mean(1) - plain.mean(1)).abs()
    head_change = (renorm - plain).abs()
    i = int(layer_change.argmax())
    return {"plain_px": plain.mean(1).tolist(), "renormalised_px": renorm.mean(1).tolist(),
            "largest_layer_change_px": float(layer_change[i]), "largest_layer": i + 1,
            "largest_head_change_px": float(head_change.max()),
            "largest_layer_change_share": float(layer_change[i]) / ceiling,
            "largest_head_change_share": float(head_change.max()) / ceiling}


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
    dist = distance_convention_change(pred, ceiling)
    if not info.num_prefix_tokens:
        return Section("prefix_attention", title, None, paper, "This model has no prefix tokens: every query attends "
                       "to patches alone, and the prefix conventions of distance and rollout coincide.", inp.stamp(),
                       metrics={"prefix_kinds": [], "distance": dist})
    share = prefix_attention(inp.model, inp.x, batch_size=batch_size, progress=False).cpu()  # (L, H, P)
    roll = rollout_conventions(inp, batch_size)
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
    patches = norms.patch_norms.double()
    L = len(patches)
    flat = patches.reshape(L, -1)
    lines = {"patches: median": flat.median(1).values.numpy(),
             "patches: 99th percentile": flat.quantile(0.99, dim=1).numpy(), "patches: largest": flat.amax(1).numpy()}
    for t, kind in enumerate(norms.prefix_kinds):
        name = f"{kind} token {t}" if norms.prefix_kinds.count(kind) > 1 else f"{kind} token"
        lines[f"{name}: mean"] = norms.norms[:, :, t].double().mean(1).numpy()
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
            + f". Share of patches above their layer's fence: at most {fmt_value(top['share'])} "
            f"[{fmt_value(top['interval'][0])}, {fmt_value(top['interval'][1])}] (layer {top['layer']}, their median "
            f"norm {fmt_value(top['norm_ratio'])}x the layer's). High-norm outliers: {verdict}"
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
