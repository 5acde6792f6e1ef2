"""Token diagnostics (vitlab.inspect.tokens): attention on prefix tokens and token norms, on constructed tokens and
attention with known values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_convit, tiny_timm, tiny_vit

import vitlab
from vitlab.inspect.tokens import outlier_fence, prefix_attention, prefix_share_from_maps, token_norms


def uniform_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Every query and key zero (qkv / qk weights and biases zeroed): each block's attention is uniform over the
    tokens it attends to."""
    with torch.no_grad():
        for blk in model.blocks:
            for name in ("qkv", "qk"):
                lin = getattr(blk.attn, name, None)
                if lin is not None:
                    lin.weight.zero_()
                    if lin.bias is not None:
                        lin.bias.zero_()
            for name in ("q_bias", "k_bias"):
                if getattr(blk.attn, name, None) is not None:
                    getattr(blk.attn, name).zero_()
    return model


MODELS = {
    "vit": (lambda: tiny_vit(), ("class",)),
    "deit-distilled": (lambda: tiny_timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=4),
                       ("class", "dist")),
    "registers-no-class": (lambda: tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, reg_tokens=2,
                                             class_token=False, global_pool="avg"), ("reg", "reg")),
    "class-and-registers": (lambda: tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, reg_tokens=3),
                            ("class", "reg", "reg", "reg")),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("queries", ["all", "patches", "prefix"])
def test_uniform_attention_gives_every_prefix_token_one_share_in_t(name, queries):
    make, kinds = MODELS[name]
    model = uniform_attention(make())
    x = torch.randn(5, 3, 32, 32)
    share = prefix_attention(model, x, queries=queries, batch_size=2, progress=False)
    info = vitlab.model_info(model)
    assert info.prefix_kinds == kinds
    assert share.shape == (len(model.blocks), model.blocks[0].attn.num_heads, len(kinds))
    assert torch.allclose(share, torch.full_like(share, 1 / info.num_tokens), atol=1e-6)
    per = prefix_attention(model, x, queries=queries, batch_size=2, per_image=True, progress=False)
    assert per.shape == (len(model.blocks), 5, share.shape[1], len(kinds))


def test_a_convit_class_token_has_no_attention_before_it_joins():
    model = uniform_attention(tiny_convit())
    share = prefix_attention(model, torch.randn(3, 3, 32, 32), progress=False)
    assert share.shape == (4, 4, 1)
    assert share[:2].isnan().all()  # blocks 0 and 1: the class token does not exist yet
    assert torch.allclose(share[2:], torch.full_like(share[2:], 1 / 65), atol=1e-6)


def testprefix_share_from_maps_of_hand_built_maps():
    """T = 4 tokens, 2 of them prefix; rows are queries."""
    maps = torch.tensor([[0.5, 0.2, 0.2, 0.1],
                         [0.1, 0.6, 0.1, 0.2],
                         [0.3, 0.3, 0.4, 0.0],
                         [0.0, 0.2, 0.4, 0.4]]).view(1, 1, 4, 4)
    got = {q: prefix_share_from_maps(maps, 2, 2, q)[0, 0].tolist() for q in ("all", "patches", "prefix")}
    assert np.allclose(got["all"], [0.225, 0.325])
    assert np.allclose(got["patches"], [0.15, 0.25])
    assert np.allclose(got["prefix"], [0.3, 0.4])


NORMS = torch.tensor([1.0 + (j % 5) for j in range(64)])
NORMS[37] = 100.0  # the one high-norm patch


def known_norm_model() -> torch.nn.Module:
    """tiny_vit whose blocks are the identity (attention and MLP outputs zeroed) and whose patch embedding gives 0:
    every block outputs the position embedding, patch j with norm NORMS[j] (along one axis), the class token 2."""
    model = tiny_vit()
    with torch.no_grad():
        for blk in model.blocks:
            for lin in (blk.attn.proj, blk.mlp.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
        model.patch_embed.proj.weight.zero_()
        model.patch_embed.proj.bias.zero_()
        model.cls_token.zero_()
        model.pos_embed.zero_()
        model.pos_embed[0, 0, 1] = 2.0
        model.pos_embed[0, 1:, 0] = NORMS
    return model


def test_token_norms_and_outliers_of_constructed_tokens():
    model = known_norm_model()
    res = token_norms(model, torch.randn(4, 3, 32, 32), batch_size=3, progress=False)
    assert res.norms.shape == (3, 4, 65) and res.prefix_kinds == ("class",)
    want = torch.cat([torch.tensor([2.0]), NORMS])
    assert torch.allclose(res.norms, want.expand(3, 4, 65))
    q1, q3 = np.quantile(NORMS.numpy(), [0.25, 0.75])
    assert torch.allclose(res.fences, torch.full((3,), q3 + 3 * (q3 - q1), dtype=torch.float64))
    expected = torch.zeros(3, 4, 64, dtype=torch.bool)
    expected[..., 37] = True
    assert torch.equal(res.outliers, expected)
    assert torch.allclose(res.outlier_share, torch.full((3,), 1 / 64, dtype=torch.float64))
    fixed = token_norms(model, torch.randn(2, 3, 32, 32), threshold=4.5, progress=False)
    assert torch.equal(fixed.fences, torch.full((3,), 4.5, dtype=torch.float64))
    assert int(fixed.outliers[0, 0].sum()) == int((NORMS > 4.5).sum())  # the 5s and the 100
    assert torch.equal(outlier_fence(res.patch_norms), res.fences)


def test_token_norms_cover_every_prefix_kind_and_a_late_class_token():
    for make, kinds in MODELS.values():
        res = token_norms(make(), torch.randn(2, 3, 32, 32), progress=False)
        assert res.prefix_kinds == kinds and res.norms.shape[-1] == len(kinds) + 64
        assert res.norms.isfinite().all()
    res = token_norms(tiny_convit(), torch.randn(2, 3, 32, 32), progress=False)
    assert res.norms.shape == (4, 2, 65)
    assert res.norms[:2, :, 0].isnan().all() and res.norms[2:].isfinite().all()
    assert res.norms[:, :, 1:].isfinite().all()


def test_bad_settings_are_refused_and_hooks_never_stay():
    model = tiny_vit().train()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="fence"):
        token_norms(model, x, fence=-1)
    with pytest.raises(ValueError, match="threshold"):
        token_norms(model, x, threshold=0)
    with pytest.raises(ValueError, match="queries"):
        prefix_attention(model, x, queries="class")
    original = model.blocks[1].forward
    model.blocks[1].forward = lambda t: (_ for _ in ()).throw(RuntimeError("boom"))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            token_norms(model, x, progress=False)
        with pytest.raises(RuntimeError, match="boom"):
            prefix_attention(model, x, progress=False)
    finally:
        del model.blocks[1].forward
    assert model.blocks[1].forward.__func__ is original.__func__
    assert all(m.training for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert vitlab.token_norms is token_norms and vitlab.prefix_attention is prefix_attention
