"""Attention rollout (Abnar & Zuidema 2020; paper Fig. 6 and 14, App. D.8).

Per layer: heads fused (mean, max or min), optionally the weakest entries of each image's fused map set to
zero (``discard_ratio``; entry (0, 0) is never discarded, as in the widely used vit-explain code; in a ConViT's blocks
before its class token joins, the ratio counts and ranks the N x N patch entries alone, not the class token's
structural zeros, so a ratio drops the same share of real entries in every block), the
residual connection added as ``residual * I + (1 - residual) * A``, rows renormalised, and the layers
multiplied from ``start_layer`` up to the last, in float64.
"""

from __future__ import annotations

import operator
from typing import Literal

import torch
from torch import Tensor

from vitlab.base.checks import whole_index
from vitlab.inspect.capture import HEAD_FUSIONS, capture_attention, check_images, find_attention_modules, fuse_heads
from vitlab.models.info import AnyModel, resolve_model


def _check(maps: Tensor, discard_ratio: float, residual: float, start_layer: int, head_fusion: str) -> None:
    _check_stack(maps)
    _check_settings(maps.shape[0], discard_ratio, residual, start_layer, head_fusion)


def _check_settings(depth: int, discard_ratio: float, residual: float, start_layer: int, head_fusion: str) -> None:
    # a bool is an int to Python, but residual=True is no weight 1.0 (nor discard_ratio=False a ratio 0.0)
    if isinstance(discard_ratio, bool) or not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    if isinstance(residual, bool) or not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    check_start_layer(start_layer, depth)
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")


def check_start_layer(start_layer: object, depth: int) -> None:
    """Refuse a ``start_layer`` that is not a whole layer index in [0, ``depth``): a fraction is refused, never
    rounded (attention rollout and gradient rollout alike)."""
    if not whole_index(start_layer) or not 0 <= start_layer < depth:
        raise ValueError(f"start_layer must be in [0, {depth}), got {start_layer!r}")


def _check_stack(maps: Tensor, info=None) -> None:
    """Refuse maps that are not one (L, B, H, T, T) stack of every layer, or (with ``info``) whose T is not the
    number of tokens ``info`` describes: maps of another model or image size would be read with the wrong prefix
    and grid, or fail in a bare matrix product."""
    if maps.dim() != 5:
        raise ValueError(f"maps must be the (L, B, H, T, T) attention of every layer (vitlab.attention_maps), got "
                         f"shape {tuple(maps.shape)}" + ("; for one layer's (B, H, T, T) maps pass maps[None]"
                                                         if maps.dim() == 4 else ""))
    if info is not None and tuple(maps.shape[-2:]) != (info.num_tokens, info.num_tokens):
        raise ValueError(f"maps over {maps.shape[-2]}x{maps.shape[-1]} tokens do not match this info's "
                         f"{info.num_tokens} tokens ({info.num_prefix_tokens} prefix + a {info.grid_size[0]}x"
                         f"{info.grid_size[1]} grid): pass model_info(model, img_size=...) of the model and image size "
                         "the maps were captured with")


def _class_token_not_joined(a: Tensor) -> bool:
    """Whether (B, T, T) fused maps are those of a block the class token has not joined (a ConViT's GPSA blocks, as
    the capture pads them): its row and column those of the identity in every image."""
    eye = torch.zeros_like(a[:, 0])
    eye[:, 0] = 1.0
    return a.shape[-1] > 1 and bool((a[:, 0] == eye).all() and (a[:, 1:, 0] == 0).all())


def _layer_matrix(layer_maps: Tensor, head_fusion: str, discard_ratio: float, residual: float) -> Tensor:
    """(B, H, T, T) one layer's maps -> (B, T, T) float64 ``residual * I + (1 - residual) * A``, rows summing to 1."""
    B, _, T, _ = layer_maps.shape
    a = fuse_heads(layer_maps, head_fusion).double()  # fuse in the maps' precision, then float64
    late = _class_token_not_joined(a)  # its row and column are structural zeros, not weak attention
    k = int((T - 1) ** 2 * discard_ratio) if late else int(T * T * discard_ratio)
    if k:
        flat = a.reshape(B, T * T)
        ranked = flat
        if late:  # rank the patch-by-patch entries alone: the class token's row and column are never candidates
            ranked = a.clone()
            ranked[:, 0, :] = ranked[:, :, 0] = float("inf")
            ranked = ranked.reshape(B, T * T)
        weakest = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, ranked.topk(k, -1, largest=False).indices,
                                                                      True)  # per image
        weakest[:, 0] = False  # entry (0, 0) is kept, as in vit-explain
        a = flat.masked_fill(weakest, 0.0).view(B, T, T)
    a = (1 - residual) * a
    a.diagonal(dim1=-2, dim2=-1).add_(residual)
    rows = a.sum(-1, keepdim=True)
    if bool((rows == 0).any()):
        raise ValueError("a row of the fused attention is all zero after the discard (residual=0 keeps no identity "
                         "term): lower discard_ratio or use residual > 0")
    return a / rows


def rollout_from_maps(maps: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean", discard_ratio: float = 0.0,
                      residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(L, B, H, T, T) attention -> (B, T, T) rolled-out joint attention (row i: how token i draws on inputs)."""
    _check(maps, discard_ratio, residual, start_layer, head_fusion)
    L, B, _, T, _ = maps.shape
    joint = torch.eye(T, dtype=torch.float64, device=maps.device).expand(B, T, T).clone()
    for layer in range(start_layer, L):
        joint = _layer_matrix(maps[layer], head_fusion, discard_ratio, residual) @ joint
    return joint


def rollout_row(maps: Tensor, readout: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean",
                discard_ratio: float = 0.0, residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(B, T) ``readout @ rollout_from_maps(...)`` without forming the (T, T) product.

    ``readout`` (B, T) weights over the last layer's tokens (a one-hot class token, or a mean over rows).
    The row is carried down from the last layer, a vector-matrix product per layer: O(T^2) instead of O(T^3).
    """
    _check(maps, discard_ratio, residual, start_layer, head_fusion)
    v = readout.double().unsqueeze(1)  # (B, 1, T)
    for layer in range(maps.shape[0] - 1, start_layer - 1, -1):
        v = v @ _layer_matrix(maps[layer], head_fusion, discard_ratio, residual)
    return v.squeeze(1)


def check_readout(info) -> None:
    """Refuse a readout of the first token (timm's ``global_pool="token"``) when no class token reaches the blocks (a
    ConViT no deeper than its ``local_up_to_layer``): the model then reads patch 0's token, which the readout's row
    (the class token's, or the patch mean) would not be, before any forward pass."""
    if info.readout == "token" and not info.num_class_tokens:
        raise ValueError(
            f"this {info.architecture} reads out its first token (global_pool='token') but no class token reaches its "
            f"{info.depth} blocks (a ConViT's class token joins at block local_up_to_layer, past its last one): its "
            "readout is patch 0's own token, so the readout's rollout is that patch's: pass query=0 to "
            "vitlab.inspect.attention_view(maps, info, 'rollout', ...) for it")


def readout_vector(info, batch: int, pool: Tensor | None = None,
                   device: torch.device | str | None = None) -> Tensor:
    """(B, T) float64 weights of the model's readout over the tokens of the last block.

    By ``info.readout``: ``"token"``, the class token (one-hot; with a DeiT distillation token, 1/2 on each,
    since timm averages the class and distillation heads at evaluation); ``"map"``, the attention pool's own weights
    (latent queries and heads averaged; the first query row for timm's ``prr`` pool on a class token) over the
    tokens it attends to, when its maps were captured; any pooling over patches (``"avg"``, ``"max"``,
    ``"avgmax"``, none), the mean over the patch rows (every row with ``pool_include_prefix``), which is exact for
    average pooling and the linear stand-in for the others.
    """
    check_readout(info)
    T, p = info.num_tokens, info.num_prefix_tokens
    v = torch.zeros(batch, T, dtype=torch.float64, device=device)
    if info.readout == "map" and pool is not None:
        rows = pool.double().mean(1)  # (B, queries, N_keys), heads averaged
        w = (rows[:, 0] if getattr(info, "pool_reads_first_row", False) else rows.mean(1)).to(v.device)
        v[:, T - w.shape[-1]:] = w
    elif info.readout == "token" and info.num_class_tokens:
        v[:, : info.num_class_tokens + info.num_dist_tokens] = 1.0 / (info.num_class_tokens + info.num_dist_tokens)
    else:
        start = 0 if getattr(info, "readout_includes_prefix", False) else p
        v[:, start:] = 1.0 / (T - start)
    return v


def readout_attention(maps: Tensor, info, vector: Tensor | None = None) -> Tensor:
    """(L, B, H, T, T) maps -> (L, B, gh, gw): the readout's attention over the patch tokens in each layer, heads
    averaged. ``vector`` (B, T) or (T,) weights the query rows (default: ``readout_vector``, the class token's
    row or the mean of the patch rows for pooled readouts); a one-hot vector selects one query token. A ConViT's
    layers before its class token joins (``info.class_token_joins``) are all zero for the class token's row: it
    attends only to itself there."""
    _check_stack(maps, info)
    v = readout_vector(info, 1, device=maps.device)[0] if vector is None else vector
    v = v.to(maps.dtype)
    if v.dim() == 1:
        rows = torch.einsum("t,lbhts->lbs", v, maps) / maps.shape[2]
    else:
        rows = torch.einsum("bt,lbhts->lbs", v, maps) / maps.shape[2]
    L, B = rows.shape[:2]
    return rows[..., info.num_prefix_tokens:].reshape(L, B, *info.grid_size)


class JointRollout:
    """A streaming reduction for ``capture_attention(reduce=...)``: multiplies each layer's fused, discarded and
    residual-mixed attention into the running joint attention as the forward pass produces it, so memory holds one
    (B, T, T) float64 product, whatever the depth. ``joint`` afterwards equals ``rollout_from_maps`` of all maps."""

    def __init__(self, head_fusion: str = "mean", discard_ratio: float = 0.0, residual: float = 0.5,
                 start_layer: int = 0) -> None:
        self.head_fusion, self.discard_ratio, self.residual, self.start_layer = (head_fusion, discard_ratio,
                                                                                 residual, start_layer)
        self.joint: Tensor | None = None

    def __call__(self, layer: int, maps: Tensor) -> None:  # maps: (B, H', T, T)
        if layer < self.start_layer:
            return None
        a = _layer_matrix(maps, self.head_fusion, self.discard_ratio, self.residual)  # (B, T, T) float64
        self.joint = a if self.joint is None else a @ self.joint
        return None


@torch.no_grad()
def attention_rollout(model: AnyModel, images: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean",
                      discard_ratio: float = 0.0, residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(B, gh, gw) raw rollout weights of the readout over the patch tokens (not rescaled).

    Readout: the class token's row (with a distillation token, the mean of both); for models without one, the mean
    over patch rows; for an attention pool, the pool's own (head-mean) weights times the rolled-out rows. Heads are
    fused inside the capture and the joint attention is accumulated layer by layer during the forward pass
    (``JointRollout``), so peak memory is one (B, T, T) product, not one map per layer.
    """
    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    info = rm.info_for(images)
    check_readout(info)
    depth = len(find_attention_modules(rm))
    _check_settings(depth, discard_ratio, residual, start_layer, head_fusion)
    acc = JointRollout("mean", discard_ratio, residual, start_layer)  # heads are fused by the capture
    with capture_attention(rm, head_fusion=head_fusion, reduce=acc) as cap:
        model(images)
        pool = cap.pool_maps()
    v = readout_vector(info, len(images), pool, device=images.device)
    row = (v.unsqueeze(1) @ acc.joint).squeeze(1)  # (B, T)
    return row[:, info.num_prefix_tokens:].reshape(len(images), *info.grid_size).float()


def _head_index(head: object, heads: int) -> int:
    """``head`` as an index in [0, ``heads``): a negative index or a fraction is refused, not read as another head."""
    if not whole_index(head) or not 0 <= operator.index(head) < heads:
        raise ValueError(f"head must be a head index from 0 to {heads - 1} or one of {HEAD_FUSIONS}, got {head!r}")
    return operator.index(head)


def attention_view(maps: Tensor, info, method: str = "attention", layer: int | None = None, head: str | int = "mean",
                   query: int | None = None, discard_ratio: float = 0.0, pool: Tensor | None = None) -> Tensor:
    """(L, B, H, T, T) captured maps -> (B, gh, gw): what one query sees, the explorer's two attention methods.

    ``method="attention"``: layer ``layer``'s (1-based, default the last) attention of the query over the patches;
    ``"rollout"``: the rollout of layers 1..``layer`` (residual 0.5, ``discard_ratio``) for the query. ``head``: a
    head index or a fusion in ``HEAD_FUSIONS``; ``query``: a patch index (row-major) or None for the readout
    (the class token's row, or the patch mean; ``pool``: an attention pool's maps for ``readout="map"``). For a
    ConViT's ``layer`` up to ``info.class_token_joins`` the readout's map is all zero (its class token has not joined
    and attends only to itself): give a patch as ``query`` there.
    """
    _check_stack(maps, info)
    L, B, H = maps.shape[:3]
    layer = L if layer is None else layer
    if not whole_index(layer) or not 1 <= layer <= L:
        raise ValueError(f"layer must be in [1, {L}], got {layer!r}")
    p, (gh, gw) = info.num_prefix_tokens, info.grid_size
    if isinstance(head, str) and head in HEAD_FUSIONS:
        picked = fuse_heads(maps[:layer], head, dim=2)  # (l, B, T, T)
    else:
        picked = maps[:layer, :, _head_index(head, H)]
    if query is None:
        v = readout_vector(info, B, pool, device=maps.device)
    else:
        if not whole_index(query) or not 0 <= query < gh * gw:
            raise ValueError(f"query patch {query!r} is outside the {gh}x{gw} grid: give a patch index from 0 to "
                             f"{gh * gw - 1} (row-major), or None for the readout")
        v = torch.zeros(B, maps.shape[-1], dtype=torch.float64, device=maps.device)
        v[:, p + query] = 1.0
    if method == "attention":
        row = (v.to(picked.dtype).unsqueeze(1) @ picked[-1]).squeeze(1)
    elif method == "rollout":
        row = rollout_row(picked[:, :, None], v, "mean", discard_ratio)
    else:
        raise ValueError(f"method must be 'attention' or 'rollout', got {method!r}")
    return row[:, p:].reshape(B, gh, gw).float()
