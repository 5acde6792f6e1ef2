"""Mimetic initialisation (vitlab.models.mimetic): the products it promises, against an independent numpy computation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import Attention

import vitlab
from vitlab.models.config import cifar_vit, config_from_dict, config_to_dict
from vitlab.models.mimetic import mimetic_, mimetic_attention_


def _targets(seed: int, d: int, heads: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The (d, d) matrices mimetic_attention_ aims at, drawn in its order from the same seed, with the paper's
    coefficients for ViTs written out: 0.7 Z + 0.7 I per head, 0.4 Z - 0.4 I per block."""
    g = torch.Generator().manual_seed(seed)
    eye = np.eye(d)
    qk = [0.7 * torch.randn(d, d, generator=g, dtype=torch.float64).numpy() / math.sqrt(d) + 0.7 * eye
          for _ in range(heads)]
    vo = 0.4 * torch.randn(d, d, generator=g, dtype=torch.float64).numpy() / math.sqrt(d) - 0.4 * eye
    return qk, vo


def _rank_k(a: np.ndarray, k: int) -> np.ndarray:
    u, s, vh = np.linalg.svd(a)
    return (u[:, :k] * s[:k]) @ vh[:k]


def test_products_are_the_papers_targets() -> None:
    d, heads = 48, 4
    k = d // heads
    attn = Attention(d, num_heads=heads, qkv_bias=True)
    mimetic_attention_(attn, generator=torch.Generator().manual_seed(7))
    qk, vo = _targets(7, d, heads)
    w = attn.qkv.weight.detach().double().numpy()
    wq, wk, wv = w[:d], w[d:2 * d], w[2 * d:]
    wo = attn.proj.weight.detach().double().numpy()
    # value-projection: x @ Wv^T @ Wo^T == x @ (a Z - b I), exactly (float32 weights)
    np.testing.assert_allclose(wv.T @ wo.T, vo, atol=1e-5)
    for h in range(heads):  # query-key per head: the best rank-k approximation of a Z + b I (Eckart-Young)
        rows = slice(h * k, (h + 1) * k)
        np.testing.assert_allclose(wq[rows].T @ wk[rows], _rank_k(qk[h], k), atol=1e-5)
    assert np.diag(wv.T @ wo.T).mean() == pytest.approx(-0.4, abs=0.05)
    assert np.all(attn.qkv.bias.detach().numpy() == 0) and np.all(attn.proj.bias.detach().numpy() == 0)


def test_timms_forward_sees_the_promised_products() -> None:
    """Through timm's own forward, not the weight layout: each head's scores q_h k_h^T (read where timm computes
    them) are x (rank-k approximation of 0.7 Z_h + 0.7 I) x^T, and a lone token (attention exactly 1) comes out as
    x (0.4 Z - 0.4 I)."""
    d, heads = 32, 4
    k = d // heads
    attn = Attention(d, num_heads=heads, qkv_bias=True)
    mimetic_attention_(attn, generator=torch.Generator().manual_seed(11))
    qk, vo = _targets(11, d, heads)
    x = torch.randn(1, 5, d, dtype=torch.float32)
    seen: dict[str, torch.Tensor] = {}
    hooks = [attn.q_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o)),
             attn.k_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o))]
    try:
        attn(x)
    finally:
        for h in hooks:
            h.remove()
    xs = x[0].double().numpy()
    for h in range(heads):  # (N, N) scores before timm's 1/sqrt(k) scale
        scores = (seen["q"][0, h] @ seen["k"][0, h].T).double().detach().numpy()
        np.testing.assert_allclose(scores, xs @ _rank_k(qk[h], k) @ xs.T, atol=1e-3)
    lone = attn(x[:, :1])[0, 0].double().detach().numpy()
    np.testing.assert_allclose(lone, xs[0] @ vo, atol=1e-4)


def test_the_model_config_switch_changes_attention_only() -> None:
    cfg = cifar_vit(depth=2, embed_dim=64, num_heads=2, mlp_dim=128, distilled=True)
    torch.manual_seed(3)
    plain = vitlab.build_model(cfg)
    torch.manual_seed(3)
    mim = vitlab.build_model(dataclasses.replace(cfg, init="mimetic"))
    assert mim.vitlab_config.init == "mimetic"
    a, b = plain.state_dict(), mim.state_dict()
    changed = {n for n in a if not torch.equal(a[n], b[n])}
    assert changed == {f"blocks.{i}.attn.{p}.weight" for i in range(2) for p in ("qkv", "proj")}
    # the config survives its JSON round trip; a config written before the field existed reads as timm's
    assert config_from_dict(config_to_dict(mim.vitlab_config)).init == "mimetic"
    torch.manual_seed(3)  # the query-key half alone: value and projection as timm drew them
    half = vitlab.build_model(dataclasses.replace(cfg, init="mimetic_qk")).state_dict()
    changed = {n for n in a if not torch.equal(a[n], half[n])}
    assert changed == {f"blocks.{i}.attn.qkv.weight" for i in range(2)}
    assert all(torch.equal(half[f"blocks.{i}.attn.qkv.weight"][128:], a[f"blocks.{i}.attn.qkv.weight"][128:])
               for i in range(2))
    old = config_to_dict(cfg)
    del old["init"]
    assert config_from_dict(old).init == "timm"


def test_attention_starts_on_the_query_itself() -> None:
    """The point of the method: at initialisation each token attends most to tokens like itself, so the
    diagonal of every attention map holds far more than uniform attention's 1/T (timm's init stays near 1/T)."""
    x = torch.randn(4, 3, 32, 32)

    def diagonal(init: str) -> torch.Tensor:
        torch.manual_seed(0)
        model = vitlab.build_model(cifar_vit(depth=3, init=init)).eval()
        maps = vitlab.attention_maps(model, x)  # (L, B, H, T, T)
        return maps.diagonal(dim1=-2, dim2=-1).mean(dim=(1, 2, 3))  # (L,)

    t = 1 + (32 // 4) ** 2
    assert torch.all(diagonal("timm") < 1.5 / t)
    assert torch.all(diagonal("mimetic") > 5 / t)


def test_attention_starts_local_on_real_images() -> None:
    """On the 128 shipped CIFAR-10 images neighbouring patches look alike, so attending to tokens like the query
    means attending near it: every layer's mean attention distance starts well below timm's, which sits at the
    uniform-attention value (about 16 px on the 8 x 8 grid of 4 px patches)."""
    from vitlab.data.images import default_images
    from vitlab.inspect.distance import mean_attention_distance

    def distance(init: str) -> torch.Tensor:
        torch.manual_seed(0)
        model = vitlab.build_model(cifar_vit(init=init, distilled=True)).eval()
        _, x, _ = default_images(model, 32)
        return mean_attention_distance(model, x).mean(-1)  # (L,) pixels, mean over heads

    timm_init, mimetic = distance("timm"), distance("mimetic")
    assert torch.all((timm_init > 15) & (timm_init < 17))
    assert torch.all(mimetic < timm_init - 2)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="init must be 'timm', 'mimetic' or 'mimetic_qk'"):
        cifar_vit(init="xavier")
    with pytest.raises(TypeError, match="needs a timm Attention"):
        mimetic_attention_(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="VisionTransformer with blocks"):
        mimetic_(torch.nn.Sequential())


def test_query_key_half_alone_leaves_value_and_projection() -> None:
    attn = Attention(32, num_heads=2, qkv_bias=True)
    before = {n: p.detach().clone() for n, p in attn.named_parameters()}
    mimetic_attention_(attn, vo=None, generator=torch.Generator().manual_seed(1))
    assert torch.equal(attn.qkv.weight[64:], before["qkv.weight"][64:])
    assert torch.equal(attn.qkv.bias[64:], before["qkv.bias"][64:])
    assert torch.equal(attn.proj.weight, before["proj.weight"]) and torch.equal(attn.proj.bias, before["proj.bias"])
    qk, _ = _targets(1, 32, 2)
    w = attn.qkv.weight.detach().double().numpy()
    np.testing.assert_allclose(w[:16].T @ w[32:48], _rank_k(qk[0], 16), atol=1e-5)
