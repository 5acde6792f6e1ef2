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

from vitlab.capture import capture_attention
from vitlab.info import model_info


def rollout_from_maps(maps: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean", discard_ratio: float = 0.0,
                      residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(L, B, H, T, T) attention -> (B, T, T) rolled-out joint attention (row i: how token i draws on inputs)."""
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    L, B, _, T, _ = maps.shape
    if not 0 <= start_layer < L:
        raise ValueError(f"start_layer must be in [0, {L}), got {start_layer}")
    fuse = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
    eye = torch.eye(T, dtype=torch.float64, device=maps.device)
    joint = eye.expand(B, T, T).clone()
    for layer in range(start_layer, L):
        a = fuse[head_fusion](maps[layer].double())  # (B, T, T)
        k = int(T * T * discard_ratio)
        if k:
            flat = a.reshape(B, T * T)
            weakest = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, flat.topk(k, -1, largest=False).indices,
                                                                          True)  # per image
            weakest[:, 0] = False  # entry (0, 0) is kept, as in vit-explain
            a = flat.masked_fill(weakest, 0.0).view(B, T, T)
        a = residual * eye + (1 - residual) * a
        a = a / a.sum(-1, keepdim=True)
        joint = a @ joint
    return joint


@torch.no_grad()
def attention_rollout(model: nn.Module, images: Tensor, head_fusion: Literal["mean", "max", "min"] = "mean",
                      discard_ratio: float = 0.0, residual: float = 0.5, start_layer: int = 0) -> Tensor:
    """(B, gh, gw) raw rollout weights of the readout over the patch tokens (not rescaled).

    Readout: the class token's row; for models without one, the mean over patch rows; for an attention
    pool, the pool's own (head-mean) weights times the rolled-out patch rows.
    """
    info = model_info(model, img_size=tuple(images.shape[-2:]))
    with capture_attention(model) as cap:
        model(images)
    joint = rollout_from_maps(cap.stack(), head_fusion, discard_ratio, residual, start_layer)  # (B, T, T)
    p = info.num_prefix_tokens
    if info.readout == "map" and cap.pool_maps() is not None:
        pool = cap.pool_maps().double().mean(1).mean(1)  # (B, N_keys): latent queries and heads averaged
        rows = joint[:, -pool.shape[-1]:, :]  # the pool attends over the tokens it is given (patches)
        weights = (pool.unsqueeze(1) @ rows).squeeze(1)[:, p:]
    elif info.num_class_tokens:
        weights = joint[:, 0, p:]
    else:
        weights = joint[:, p:, p:].mean(1)
    return weights.reshape(len(images), *info.grid_size).float()
