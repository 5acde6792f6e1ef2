"""Token diagnostics: where attention goes among the prefix tokens, and the norms of the tokens of every layer with
the patches whose norm is an outlier (Darcet et al. 2024, "Vision Transformers Need Registers").

Prefix tokens are those ``model_info`` counts, in timm's order: class, distillation, registers
(``ModelInfo.prefix_kinds`` names each column). A ConViT's blocks before its class token joins have no class token:
its column is NaN there (attention share and norm alike), never a number for a token that does not exist.

Outlier rule (stated): per layer, over the patch tokens of all the images, a patch is an outlier when its norm lies
above Tukey's far-out fence Q3 + ``fence`` x (Q3 - Q1) of that layer's patch norms (``fence=3.0``), or, with an absolute
``threshold`` (Darcet et al. use 150 for DINOv2 ViT-g), above that number instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from vitlab.base.checks import check_count
from vitlab.base.modes import eval_mode
from vitlab.base.stats import spearman
from vitlab.inspect.capture import capture_attention, check_images
from vitlab.inspect.residual import capture_blocks, prefix_counts
from vitlab.inspect.rollout import JointRollout, readout_vector
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["prefix_attention", "prefix_share_from_maps", "token_norms", "TokenNorms", "outlier_fence", "QUERIES",
           "norm_summary", "prefix_removed", "rollout_prefix_change"]

Queries = Literal["all", "patches", "prefix"]
#: whose attention ``prefix_attention`` averages: every token's, the patches' alone, or the prefix tokens' alone
QUERIES = ("all", "patches", "prefix")


def prefix_share_from_maps(maps: Tensor, num_prefix: int, present: int, queries: str) -> Tensor:
    """(B, H, T, T) one layer's maps -> (B, H, P) mean over the chosen queries of the attention on each of the P
    prefix keys. ``present``: how many prefix tokens exist in this block (a ConViT's early blocks: one less; the
    capture pads the missing class token as a token attending only to itself, which is left out of the queries and
    given NaN)."""
    missing = num_prefix - present  # 0, or 1: the class token has not joined
    rows = {"all": slice(missing, None), "patches": slice(num_prefix, None), "prefix": slice(missing, num_prefix)}
    q = maps[:, :, rows[queries], :num_prefix]  # (B, H, Q, P)
    if q.shape[2] == 0:  # no such queries in this block (the prefix queries of a block without prefix tokens)
        return maps.new_full((*maps.shape[:2], num_prefix), float("nan"))
    out = q.double().mean(2)
    if missing:
        out[..., 0] = float("nan")
    return out


@torch.no_grad()
def prefix_attention(model: AnyModel, images: Tensor, *, queries: Queries = "all", batch_size: int = 32,
                     per_image: bool = False, progress: bool | None = None) -> Tensor:
    """(L, H, P) float64: per block and head, the share of attention that goes to each of the P prefix tokens (columns
    in ``model_info(model).prefix_kinds`` order: class, distillation, registers), averaged over the ``queries``
    ("all" tokens, "patches" or "prefix") and over ``images`` (a preprocessed (B, C, H, W) batch); with
    ``per_image=True``, (L, B, H, P). Each entry is in [0, 1]; a row's P entries sum to at most 1 (the rest goes to
    the patches). A model without prefix tokens gives P = 0. NaN for the class token of a ConViT's blocks before it
    joins. Maps are reduced inside the capture hook, batch by batch."""
    from tqdm.auto import tqdm

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("batch_size", batch_size)
    if queries not in QUERIES:
        raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
    p = rm.info_for(images).num_prefix_tokens
    present = prefix_counts(rm)
    chunks = images.split(batch_size)
    out = []
    show = len(chunks) > 1 if progress is None else progress
    for chunk in tqdm(chunks, desc="prefix attention", disable=not show, leave=False):
        with capture_attention(rm, reduce=lambda i, maps: prefix_share_from_maps(maps, p, present[i], queries)) as cap:
            model(chunk)
            out.append(cap.stack())  # (L, B, H, P)
    per = torch.cat(out, dim=1)
    return per if per_image else per.mean(1)


@dataclass(frozen=True)
class TokenNorms:
    """Token norms of every block's output (before the model's final norm) over a set of images.

    ``norms`` (L, B, T) float32: the L2 norm of each token (the P prefix tokens first, then the N patches row-major;
    NaN for a class token that has not joined a ConViT's block). ``prefix_kinds``: the kind of each of the P
    prefix tokens. ``fences`` (L,) float64: the norm above which a patch of that layer is an outlier. ``outliers``
    (L, B, N) bool: the patches above their layer's fence."""

    norms: Tensor
    prefix_kinds: tuple[str, ...]
    fences: Tensor
    outliers: Tensor

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.prefix_kinds)

    @property
    def patch_norms(self) -> Tensor:
        """(L, B, N) the patch tokens' norms."""
        return self.norms[..., self.num_prefix_tokens:]

    @property
    def outlier_share(self) -> Tensor:
        """(L,) float64 the fraction of patches that are outliers, per layer."""
        return self.outliers.double().mean((1, 2))


def outlier_fence(patch_norms: Tensor, fence: float = 3.0) -> Tensor:
    """(L, B, N) patch norms -> (L,) float64 Tukey fences Q3 + ``fence`` x (Q3 - Q1) of each layer's norms over all
    images and patches."""
    flat = patch_norms.double().flatten(1)
    q1, q3 = flat.quantile(0.25, dim=1), flat.quantile(0.75, dim=1)
    return q3 + fence * (q3 - q1)


@torch.no_grad()
def token_norms(model: AnyModel, images: Tensor, *, fence: float = 3.0, threshold: float | None = None,
                batch_size: int = 32, progress: bool | None = None) -> TokenNorms:
    """Per block, the norm of every token of ``images`` (a preprocessed (B, C, H, W) batch) and the outlier patches
    (``TokenNorms``; the rule in the module's docstring: Tukey's fence with ``fence``, or the absolute ``threshold``).
    Norms are reduced inside the block hooks, batch by batch."""
    from tqdm.auto import tqdm

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("batch_size", batch_size)
    if isinstance(fence, bool) or not isinstance(fence, (int, float)) or not fence >= 0:
        raise ValueError(f"fence must be a number >= 0 (Tukey's far-out fence is 3.0), got {fence!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not threshold > 0):
        raise ValueError(f"threshold must be a norm > 0 or None, got {threshold!r}")
    info = rm.info_for(images)
    p = info.num_prefix_tokens

    def norms(_layer: int, tokens: Tensor, present: int) -> Tensor:  # (B, T_l, D) -> (B, T) float32
        n = tokens.float().norm(dim=-1)
        if present < p:  # a ConViT's block before the class token joins: NaN in its column
            n = torch.cat([n.new_full((len(n), p - present), float("nan")), n], dim=1)
        return n.cpu()

    chunks = images.split(batch_size)
    show = len(chunks) > 1 if progress is None else progress
    with capture_blocks(rm, norms) as kept:
        for chunk in tqdm(chunks, desc="token norms", disable=not show, leave=False):
            model(chunk)
    per = torch.stack([torch.cat(kept[i], dim=0) for i in sorted(kept)])  # (L, B, T)
    patches = per[..., p:]
    fences = (torch.full((len(per),), float(threshold), dtype=torch.float64) if threshold is not None
              else outlier_fence(patches, fence))
    return TokenNorms(norms=per, prefix_kinds=info.prefix_kinds, fences=fences,
                      outliers=patches.double() > fences[:, None, None])


def norm_summary(norms: TokenNorms) -> dict[str, Tensor]:
    """Per layer, (L,) float64 each: the patches' median, 99th percentile and largest norm over every image and patch
    ("patches: median", "patches: 99th percentile", "patches: largest"), and each prefix token's mean norm over the
    images ("class token: mean", "reg token 2: mean" where a kind repeats; NaN in a ConViT's blocks before its class
    token joins)."""
    flat = norms.patch_norms.double().flatten(1)  # (L, B * N)
    out = {"patches: median": flat.median(1).values, "patches: 99th percentile": flat.quantile(0.99, dim=1),
           "patches: largest": flat.amax(1)}
    kinds = norms.prefix_kinds
    for t, kind in enumerate(kinds):
        name = f"{kind} token {t}" if kinds.count(kind) > 1 else f"{kind} token"
        out[f"{name}: mean"] = norms.norms[:, :, t].double().mean(1)
    return out


def prefix_removed(maps: Tensor, num_prefix: int) -> Tensor:
    """(B, H, T, T) maps with the attention on the first ``num_prefix`` keys removed and each row renormalised over
    the patch keys; a row with nothing on the patches (a ConViT's class token before it joins) is left as it was."""
    patches = maps[..., num_prefix:]
    total = patches.sum(-1, keepdim=True)
    moved = torch.cat([torch.zeros_like(maps[..., :num_prefix]), patches / total.clamp_min(1e-30)], -1)
    return torch.where(total > 0, moved, maps)


@torch.no_grad()
def rollout_prefix_change(model: AnyModel, images: Tensor, *, batch_size: int = 32) -> dict[str, Tensor]:
    """How much the readout's rollout (head mean, residual 0.5, no discard) of ``images`` (a preprocessed (B, C, H, W)
    batch) changes between two prefix conventions: the prefix tokens kept in every layer's attention (vitlab's) and
    their keys removed with each row renormalised over the patches in every layer (``prefix_removed``).

    Per image, (B,) float64 CPU each: "spearman", the Spearman correlation of the two patch maps; "total_variation",
    their total-variation distance with each map scaled to sum 1 (0 to 1); "prefix_mass", the share of the readout's
    rollout mass on the prefix tokens in vitlab's convention. A model without prefix tokens gives 1, 0 and 0."""
    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("batch_size", batch_size)
    info = rm.info_for(images)
    p = info.num_prefix_tokens
    out: dict[str, list[Tensor]] = {"spearman": [], "total_variation": [], "prefix_mass": []}
    with eval_mode(model):
        for x in images.split(batch_size):
            kept, removed = JointRollout(), JointRollout()

            def reduce(layer: int, maps: Tensor) -> None:
                kept(layer, maps)
                removed(layer, prefix_removed(maps, p))

            with capture_attention(rm, head_fusion="mean", reduce=reduce) as cap:
                model(x)
                pool = cap.pool_maps()
            v = readout_vector(info, len(x), pool, device=x.device).unsqueeze(1)
            a, b = (v @ kept.joint).squeeze(1).cpu(), (v @ removed.joint).squeeze(1).cpu()  # (b, T)
            out["prefix_mass"].append(a[:, :p].sum(1))
            a, b = a[:, p:], b[:, p:]
            a, b = a / a.sum(1, keepdim=True), b / b.sum(1, keepdim=True)
            out["spearman"].append(spearman(a, b))
            out["total_variation"].append(0.5 * (a - b).abs().sum(1))
    return {k: torch.cat(v).double() for k, v in out.items()}
