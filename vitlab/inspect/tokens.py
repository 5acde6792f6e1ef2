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
from vitlab.inspect.capture import capture_attention, check_images
from vitlab.inspect.residual import capture_blocks, prefix_counts
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["prefix_attention", "prefix_share_from_maps", "token_norms", "TokenNorms", "outlier_fence", "QUERIES"]

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
