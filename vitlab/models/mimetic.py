"""Mimetic initialisation of self-attention (Trockman & Kolter, ICML 2023, arXiv 2305.09828).

Trained ViTs show two patterns in every attention layer: per head, the query-key product ``W_q^T W_k`` (d x d, in
the ``x @ W.T`` convention of ``nn.Linear``, so that the scores are ``x W_q^T W_k x^T``) has a strong positive
diagonal, and the value-projection product ``W_v^T W_o^T`` (a lone token's output is ``x W_v^T W_o^T``) a negative
one. Mimetic initialisation draws the weights so that these products start that way:

    per head h:   W_q,h^T W_k,h  ~=  a_qk Z_h + b_qk I     (the best rank-k approximation; k = d / heads)
    per block:    W_v^T W_o^T    ==  a_vo Z   - b_vo I     (full rank, exact)

with ``Z`` a fresh (d, d) standard normal over sqrt(d) each time, factored through its SVD (``A = U S V^T``,
left factor ``U sqrt(S)``, right ``sqrt(S) V^T``). A query then attends most to tokens like itself, position
embeddings included, so attention starts local instead of uniform; the paper reports gains of over 5 points on
CIFAR-10 for ViTs trained from scratch. Nothing else changes: biases stay zero, the MLPs, norms, embeddings and
heads keep timm's initialisation, and the architecture is the plain ViT. ``ViTConfig(init="mimetic")`` applies
both halves, ``init="mimetic_qk"`` the query-key half alone (value and projection as timm draws them).
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: (alpha, beta) as we read the paper for ViTs: query-key products ~ 0.7 Z + 0.7 I, value-projection ~ 0.4 Z - 0.4 I
QK_ALPHA, QK_BETA = 0.7, 0.7
VO_ALPHA, VO_BETA = 0.4, 0.4


def _factor(a: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, d) -> left (d, rank), right (rank, d) with ``left @ right`` the best rank-``rank`` approximation of ``a``."""
    u, s, vh = torch.linalg.svd(a.double())
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _target(d: int, alpha: float, beta: float, generator: torch.Generator | None) -> torch.Tensor:
    """(d, d): ``alpha Z + beta I`` with Z standard normal / sqrt(d)."""
    z = torch.randn(d, d, generator=generator, dtype=torch.float64) / math.sqrt(d)
    return alpha * z + beta * torch.eye(d, dtype=torch.float64)


@torch.no_grad()
def mimetic_attention_(attn: nn.Module, *, qk: tuple[float, float] = (QK_ALPHA, QK_BETA),
                       vo: tuple[float, float] | None = (VO_ALPHA, VO_BETA),
                       generator: torch.Generator | None = None) -> None:
    """Re-initialise one timm ``Attention`` (``qkv``: Linear(d, 3d), rows ordered (q|k|v, head, head_dim);
    ``proj``: Linear(d, d)) in place. ``qk`` and ``vo`` are (alpha, beta); ``vo=None`` leaves the value and
    projection weights as they are (the query-key half alone). Biases of what is re-initialised are set to zero."""
    qkv, proj, heads = getattr(attn, "qkv", None), getattr(attn, "proj", None), getattr(attn, "num_heads", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear) or not isinstance(heads, int):
        raise TypeError(f"mimetic initialisation needs a timm Attention (a fused qkv Linear, a proj Linear and "
                        f"num_heads); got {type(attn).__name__}")
    d = qkv.in_features
    if qkv.out_features != 3 * d or proj.in_features != d or proj.out_features != d or d % heads:
        raise ValueError(f"mimetic initialisation needs qkv: {d} -> {3 * d} and proj: {d} -> {d} with {d} divisible "
                         f"by num_heads={heads}; got qkv {qkv.in_features} -> {qkv.out_features}, proj "
                         f"{proj.in_features} -> {proj.out_features}")
    k = d // heads
    w = qkv.weight.detach().double().clone()
    for h in range(heads):
        left, right = _factor(_target(d, *qk, generator), k)  # scores: x W_q,h^T W_k,h x^T = x (left @ right) x^T
        w[h * k:(h + 1) * k] = left.T
        w[d + h * k:d + (h + 1) * k] = right
    if vo is not None:
        left, right = _factor(_target(d, vo[0], -vo[1], generator), d)  # x W_v^T W_o^T = x (left @ right)
        w[2 * d:] = left.T
        proj.weight.copy_(right.T)
        if proj.bias is not None:
            proj.bias.zero_()
    qkv.weight.copy_(w)
    if qkv.bias is not None:
        qkv.bias[: 2 * d if vo is None else 3 * d].zero_()


def mimetic_(model: nn.Module, generator: torch.Generator | None = None, *,
             vo: tuple[float, float] | None = (VO_ALPHA, VO_BETA)) -> int:
    """Mimetic initialisation of every block's attention of a timm ViT (``model.blocks[i].attn``), in place
    (``vo=None``: query-key only). Returns the number of layers re-initialised. Draws from ``generator`` (default:
    torch's global generator)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not len(blocks):
        raise TypeError(f"mimetic initialisation is for a timm VisionTransformer with blocks; got {type(model).__name__}")
    for block in blocks:
        mimetic_attention_(block.attn, vo=vo, generator=generator)
    return len(blocks)
