"""Attention rollout (Abnar & Zuidema 2020; paper Fig. 6 and 14, App. D.8).

Per layer: heads fused (mean, max or min), optionally the weakest entries of each image's fused map set to
zero (``discard_ratio``; entry (0, 0) is never discarded, as in the widely used vit-explain code), the
residual connection added as ``residual * I + (1 - residual) * A``, rows renormalised, and the layers
multiplied from ``start_layer`` up to the last, in float64.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from vitlab.capture import HEAD_FUSIONS, capture_attention, fuse_heads
from vitlab.info import model_info


def _check(maps: Tensor, discard_ratio: float, residual: float, start_layer: int, head_fusion: str) -> None:
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    if not 0 <= start_layer < maps.shape[0]:
        raise ValueError(f"start_layer must be in [0, {maps.shape[0]}), got {start_layer}")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")




def _layer_matrix(layer_maps: Tensor, head_fusion: str, discard_ratio: float, residual: float) -> Tensor:
    """(B, H, T, T) one layer's maps -> (B, T, T) float64 ``residual * I + (1 - residual) * A``, rows summing to 1."""
    B, _, T, _ = layer_maps.shape
    a = fuse_heads(layer_maps, head_fusion).double()  # fuse in the maps' precision, then float64
    k = int(T * T * discard_ratio)
    if k:
        flat = a.reshape(B, T * T)
        weakest = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, flat.topk(k, -1, largest=False).indices,
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


def readout_vector(info, batch: int, pool: Tensor | None = None,
                   device: torch.device | str | None = None) -> Tensor:
    """(B, T) float64 weights of the model's readout over the tokens of the last block.

    By ``info.readout``: ``"token"``, the class token (one-hot; with a DeiT distillation token, 1/2 on each,
    since timm averages the class and distillation heads at evaluation); ``"map"``, the attention pool's own weights
    (latent queries and heads averaged) over the tokens it attends to, when its maps were captured; any
    pooling over patches (``"avg"``, ``"max"``, ``"avgmax"``, none), the mean over the patch rows, which is
    exact for average pooling and the linear stand-in for the others.
    """
    T, p = info.num_tokens, info.num_prefix_tokens
    v = torch.zeros(batch, T, dtype=torch.float64, device=device)
    if info.readout == "map" and pool is not None:
        w = pool.double().mean(1).mean(1).to(v.device)  # (B, N_keys)
        v[:, T - w.shape[-1]:] = w
    elif info.readout == "token" and info.num_class_tokens:
        v[:, : info.num_class_tokens + info.num_dist_tokens] = 1.0 / (info.num_class_tokens + info.num_dist_tokens)
    else:
        v[:, p:] = 1.0 / (T - p)
    return v


def readout_attention(maps: Tensor, info, vector: Tensor | None = None) -> Tensor:
    """(L, B, H, T, T) maps -> (L, B, gh, gw): the readout's attention over the patch tokens in each layer, heads
    averaged. ``vector`` (B, T) or (T,) weights the query rows (default: ``readout_vector``, the class token's
    row or the mean of the patch rows for pooled readouts); a one-hot vector selects one query token."""
    v = readout_vector(info, 1)[0] if vector is None else vector
    v = v.to(maps.dtype)
    if v.dim() == 1:
        rows = torch.einsum("t,lbhts->lbs", v, maps) / maps.shape[2]
    else:
        rows = torch.einsum("bt,lbhts->lbs", v, maps) / maps.shape[2]
    L, B = rows.shape[:2]
    return rows[..., info.num_prefix_tokens:].reshape(L, B, *info.grid_size)


@torch.no_grad()
def attention_rollout(model: nn.Module, images: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean",
                      discard_ratio: float = 0.0, residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(B, gh, gw) raw rollout weights of the readout over the patch tokens (not rescaled).

    Readout: the class token's row; for models without one, the mean over patch rows; for an attention
    pool, the pool's own (head-mean) weights times the rolled-out rows. Heads are fused inside the capture,
    so memory holds one (T, T) map per layer and image.
    """
    info = model_info(model, img_size=tuple(images.shape[-2:]))
    with capture_attention(model, head_fusion=head_fusion) as cap:
        model(images)
    v = readout_vector(info, len(images), cap.pool_maps(), device=images.device)
    row = rollout_row(cap.stack(), v, "mean", discard_ratio, residual, start_layer)  # heads already fused
    return row[:, info.num_prefix_tokens:].reshape(len(images), *info.grid_size).float()
