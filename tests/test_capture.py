"""Attention capture: exact maps, exact logits, clean exit, clear refusals."""

from __future__ import annotations

import copy
import math

import pytest
import timm
import torch
from conftest import attention_inputs, convit_raw_attention, tiny_convit, tiny_timm, tiny_vit
from torch import nn

import vitlab
from vitlab.inspect.capture import AttentionCaptureError


def reference_attention(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(L, B, H, T, T) recomputed from each block's qkv weights: softmax(q k^T / sqrt(d)), in float64."""
    out = []
    for blk, h in zip(model.blocks, attention_inputs(model, x)):
        at = blk.attn
        h = h.double()
        B, N, _ = h.shape
        w, b = at.qkv.weight.double(), at.qkv.bias
        qkv = h @ w.T + (b.double() if b is not None else 0)
        q, k, _ = qkv.view(B, N, 3, at.num_heads, at.head_dim).unbind(2)  # (B, N, H, d)
        with torch.no_grad():
            q, k = at.q_norm.double()(q), at.k_norm.double()(k)
        at.float()
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(at.head_dim)
        e = (s - s.amax(-1, keepdim=True)).exp()
        out.append(e / e.sum(-1, keepdim=True))
    return torch.stack(out)


def plain_and_captured(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits of a plain forward, logits of a forward inside capture_attention, the captured (L, B, H, T, T))."""
    with torch.no_grad():
        plain = model(x)
        with vitlab.capture_attention(model) as cap:
            captured = model(x)
    return plain, captured, cap.stack()


def reference_pool(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, H, Lq, N) of timm's AttentionPoolLatent recomputed from its weights."""
    pool = model.attn_pool
    feats = []
    h = pool.register_forward_pre_hook(lambda m, a: feats.append(a[0].detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        h.remove()
    t = feats[0].double()
    if pool.pos_embed is not None:
        t = t + pool.pos_embed.double()
    B, N, C = t.shape
    d = pool.head_dim
    q = (pool.latent.double() @ pool.q.weight.double().T + pool.q.bias.double()).view(1, -1, pool.num_heads, d)
    kv = (t @ pool.kv.weight.double().T + pool.kv.bias.double()).view(B, N, 2, pool.num_heads, d)
    k = kv[:, :, 0]
    with torch.no_grad():
        q, k = pool.q_norm.double()(q), pool.k_norm.double()(k)
    pool.float()
    s = torch.einsum("xlhd,bnhd->bhln", q, k) / math.sqrt(d)
    return s.softmax(-1)


CASES = {
    "vitlab_ti4": lambda: tiny_vit(),
    "vitlab_avgpool_sincos": lambda: tiny_vit(readout="avg", pos_embed="sincos"),
    "vitlab_no_posembed": lambda: tiny_vit(pos_embed="none"),
    "deit_distilled": lambda: tiny_timm("deit_tiny_distilled_patch16_224", img_size=64),
    "dinov2_registers": lambda: tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56),
    "qk_norm": lambda: timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                                     qk_norm=True, num_classes=5).eval(),
    "map_pool": lambda: timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                                      global_pool="map", class_token=False, num_classes=5).eval(),
}
EXPECTED_PREFIX = {"deit_distilled": 2, "dinov2_registers": 5, "vitlab_avgpool_sincos": 0, "map_pool": 0}


@pytest.mark.parametrize("case", sorted(CASES))
def test_maps_match_independent_softmax_and_logits_unchanged(case):
    model = CASES[case]()
    size = model.patch_embed.img_size
    x = torch.randn(3, 3, *size)
    plain, captured_logits, maps = plain_and_captured(model, x)
    ref = reference_attention(model, x)
    info = vitlab.model_info(model)
    assert maps.dtype == torch.float32
    assert maps.shape == (info.depth, 3, info.num_heads, info.num_tokens, info.num_tokens)
    assert info.num_prefix_tokens == EXPECTED_PREFIX.get(case, 1)
    torch.testing.assert_close(maps.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(captured_logits, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(maps.sum(-1), torch.ones_like(maps.sum(-1)), atol=1e-5, rtol=0)


def beit_with_a_bias() -> nn.Module:
    """A tiny BEiT whose relative position bias is not timm's initial zeros (which no capture could drop unseen)."""
    model = tiny_timm("beit_base_patch16_224", img_size=(48, 80), embed_dim=32, num_heads=2)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.relative_position_bias_table.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    return model


POSITIONS_IN_ATTENTION = {  # (model, (prefix kinds), input size): positions the attention adds, or a CNN stem
    "eva02_rope": (lambda: tiny_timm("eva02_tiny_patch14_224", img_size=(42, 70)), ("class",), (42, 70)),
    "vit_rope_reg_gap": (lambda: tiny_timm("vit_medium_patch16_rope_reg1_gap_256", img_size=48, embed_dim=32,
                                           num_heads=2), ("reg",), (48, 48)),
    "dinov3_rope_registers": (lambda: tiny_timm("vit_small_patch16_dinov3", img_size=48), ("class",) + ("reg",) * 4,
                              (48, 48)),
    "beit_relative_bias": (beit_with_a_bias, ("class",), (48, 80)),
    "hybrid_r26": (lambda: tiny_timm("vit_small_r26_s32_224", img_size=(64, 96)), ("class",), (64, 96)),
}


@pytest.mark.parametrize("case", sorted(POSITIONS_IN_ATTENTION))
def test_rotary_relative_bias_and_hybrid_maps_are_timms_own_softmax(case):
    """Rotary embeddings (EVA-02, DINOv3, timm's rope ViTs) and BEiT's relative position bias act inside the attention:
    the captured maps must be the softmax timm computes with them, read independently by torch.fx (timm's
    AttentionExtract), on a non-square input where the model takes one; prefix tokens come first, then the grid."""
    from timm.utils import AttentionExtract

    build, kinds, size = POSITIONS_IN_ATTENTION[case]
    model = build()
    x = torch.randn(2, 3, *size)
    maps = vitlab.attention_maps(model, x)
    ref_model = copy.deepcopy(model)
    for m in ref_model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    with torch.no_grad():
        ref = torch.stack(list(AttentionExtract(ref_model, names=["blocks.*softmax*"], method="fx")(x).values()))
    info = vitlab.model_info(model, img_size=size)
    assert info.prefix_kinds == kinds
    assert maps.shape == (info.depth, 2, info.num_heads, info.num_tokens, info.num_tokens)
    torch.testing.assert_close(maps, ref.float(), atol=1e-5, rtol=0)


def test_attention_pool_reported_separately():
    model = CASES["map_pool"]()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), vitlab.capture_attention(model) as cap:
        model(x)
    pool = cap.pool_maps()
    assert pool.shape == (2, 4, 1, 16)  # latent query over the 16 patch tokens
    torch.testing.assert_close(pool.double(), reference_pool(model, x), atol=1e-5, rtol=0)
    assert cap.stack().shape[0] == 2  # the pool is not counted as a layer


def test_non_square_dynamic_input():
    model = tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56, dynamic_img_size=True)
    x = torch.randn(2, 3, 42, 70)  # 3 x 5 patches
    maps = vitlab.attention_maps(model, x)
    info = vitlab.model_info(model, img_size=(42, 70))
    assert info.grid_size == (3, 5)
    assert maps.shape == (2, 2, 6, 5 + 15, 5 + 15)
    torch.testing.assert_close(maps.double(), reference_attention(model, x), atol=1e-5, rtol=0)


def test_any_resolution_after_resize():
    model = tiny_vit()
    vitlab.resize_for_finetuning(model, 48)
    maps = vitlab.attention_maps(model, torch.randn(1, 3, 48, 48))
    assert maps.shape[-1] == 1 + 12 * 12


def test_model_restored_after_exception_inside_block():
    model = tiny_vit()
    model.train()
    model.blocks[1].train(False)  # a mixed state must come back exactly
    before_modes = [m.training for m in model.modules()]
    before_fused = [blk.attn.fused_attn for blk in model.blocks]
    with pytest.raises(ZeroDivisionError):
        with vitlab.capture_attention(model, keep_grad=True):
            assert not model.training
            assert not any(blk.attn.fused_attn for blk in model.blocks)
            model(torch.randn(1, 3, 32, 32))
            1 / 0
    assert [m.training for m in model.modules()] == before_modes
    assert [blk.attn.fused_attn for blk in model.blocks] == before_fused
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def test_restored_after_exception_raised_inside_forward():
    model = CASES["map_pool"]()
    x = torch.randn(1, 3, 32, 32)

    def boom(m, a):
        raise RuntimeError("inside forward")

    h = model.attn_pool.kv.register_forward_pre_hook(boom)  # raises between the pool's pre- and post-hook
    with pytest.raises(RuntimeError, match="inside forward"):
        with vitlab.capture_attention(model):
            model(x)
    h.remove()
    assert torch._C._len_torch_function_stack() == 0
    assert model.attn_pool.fused_attn == timm.layers.use_fused_attn()
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def test_dropout_never_applied():
    model = tiny_timm("vit_tiny_patch16_224", img_size=32, attn_drop_rate=0.5).train()
    x = torch.randn(2, 3, 32, 32)
    a = vitlab.attention_maps(model, x)
    b = vitlab.attention_maps(model, x)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-5, rtol=0)
    assert model.training  # put back


def test_reductions_inside_hook_agree_with_full_maps(vit):
    x = torch.randn(4, 3, 32, 32)
    full = vitlab.attention_maps(vit, x)
    torch.testing.assert_close(vitlab.attention_maps(vit, x, head_fusion="mean"), full.mean(2, keepdim=True))
    torch.testing.assert_close(vitlab.attention_maps(vit, x, head_fusion="max"), full.amax(2, keepdim=True))
    torch.testing.assert_close(vitlab.attention_maps(vit, x, head_fusion="min"), full.amin(2, keepdim=True))
    torch.testing.assert_close(vitlab.attention_maps(vit, x, queries="prefix"), full[..., :1, :])
    torch.testing.assert_close(vitlab.attention_maps(vit, x, queries=[3, 7]), full[..., [3, 7], :])
    torch.testing.assert_close(vitlab.attention_maps(vit, x, layers=[-1, 0]), full[[0, 2]])
    torch.testing.assert_close(vitlab.attention_maps(vit, x, batch_size=3), full)


def test_layers_and_preallocate_of_the_wrong_kind_are_named(vit, x32):
    """layers=2 failed with "object of type 'int' has no len()", layers=[1.5] with a bare list-index TypeError and
    preallocate=-1 with torch's "negative dimension"; each is now named with its value and the fix, and layers given
    as a tensor of indices still works."""
    full = vitlab.attention_maps(vit, x32)
    with pytest.raises(TypeError, match=r"layers must be a list of block indices or None, got 2: pass \[2\] for "
                                        "that one block"):
        vitlab.attention_maps(vit, x32, layers=2)
    with pytest.raises(TypeError, match=r"layers must be whole block indices, got \[1.5\] in \[0, 1.5\]"):
        vitlab.attention_maps(vit, x32, layers=[0, 1.5])
    with pytest.raises(ValueError, match="preallocate must be a whole number of at least 1, got -1"):
        with vitlab.capture_attention(vit, preallocate=-1):
            pass
    torch.testing.assert_close(vitlab.attention_maps(vit, x32, layers=torch.tensor([2, 0])), full[[0, 2]])
    assert not any(m._forward_hooks for m in vit.modules())


def test_only_selected_layers_are_unfused(vit):
    seen = []
    with vitlab.capture_attention(vit, layers=[1]):
        seen = [blk.attn.fused_attn for blk in vit.blocks]
    assert seen == [True, False, True] or not timm.layers.use_fused_attn()


def test_gradients_are_each_layers_own():
    """grads() agrees with a finite difference of the logit under a perturbation of one layer's map."""
    model = tiny_vit().double()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    with vitlab.capture_attention(model, keep_grad=True) as cap:
        logit = model(x)[0, 3]
        logit.backward()
    grads = cap.grads()
    assert grads.shape == cap.stack().shape
    direction = torch.randn(grads.shape[1:], dtype=torch.float64)
    for layer in range(3):
        eps = 1e-6

        def bump(m, a, out, s):
            return out + s * eps * direction

        vals = []
        for s in (1, -1):
            h = model.blocks[layer].attn.attn_drop.register_forward_hook(lambda m, a, o, s=s: bump(m, a, o, s))
            try:
                with vitlab.capture_attention(model, layers=[layer]), torch.no_grad():
                    vals.append(model(x)[0, 3].item())
            finally:
                h.remove()
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert fd == pytest.approx((grads[layer].double() * direction).sum().item(), rel=1e-4, abs=1e-8)


def test_refuses_models_without_attention():
    with pytest.raises(AttentionCaptureError, match="no self-attention"):
        vitlab.attention_maps(timm.create_model("resnet18"), torch.randn(1, 3, 32, 32))


class _AlwaysFused(nn.Module):
    """An attention that always runs a fused kernel: nothing to capture."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.num_heads = inner.num_heads
        self.fused_attn = True
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, x, **kw):
        self.inner.fused_attn = True
        return self.inner(x)


def test_error_when_captured_maps_differ_from_depth():
    model = tiny_vit()
    model.blocks[1].attn = _AlwaysFused(model.blocks[1].attn)
    with pytest.raises(AttentionCaptureError, match="differs from the depth"):
        vitlab.attention_maps(model, torch.randn(1, 3, 32, 32))
    for m in model.modules():
        assert not m._forward_hooks


def test_error_when_model_not_run_inside_block(vit):
    with vitlab.capture_attention(vit) as cap:
        pass
    with pytest.raises(AttentionCaptureError, match="no attention maps were recorded"):
        cap.stack()


def test_preallocated_capture_names_a_short_or_long_run(vit, x32):
    """preallocate=N that N images fill gives the per-call store's maps; fewer images is refused by count (not as
    'no maps recorded'), more images as soon as they run."""
    x = x32[:4] if len(x32) >= 4 else x32.repeat(4, 1, 1, 1)[:4]
    with vitlab.capture_attention(vit) as ref, torch.no_grad():
        vit(x)
    with vitlab.capture_attention(vit, preallocate=4) as cap, torch.no_grad():
        vit(x[:2])
        vit(x[2:])
    torch.testing.assert_close(cap.stack(), ref.stack(), rtol=0, atol=0)
    with vitlab.capture_attention(vit, preallocate=4) as cap, torch.no_grad():
        vit(x[:2])
    with pytest.raises(AttentionCaptureError, match="2 of preallocate=4 images ran inside the capture"):
        cap.stack()
    with pytest.raises(AttentionCaptureError, match=r"more images ran inside the capture than preallocate=3 "
                                                    r"\(layer 0 reached 4\)"):
        with vitlab.capture_attention(vit, preallocate=3), torch.no_grad():
            vit(x[:2])
            vit(x[2:])
    with pytest.raises(AttentionCaptureError, match="4 maps in one call, more than preallocate=3: either more images"):
        with vitlab.capture_attention(vit, preallocate=3), torch.no_grad():
            vit(x)


def test_bad_options():
    with pytest.raises(ValueError, match="head_fusion"):
        with vitlab.capture_attention(tiny_vit(), head_fusion="median"):
            pass
    with pytest.raises(ValueError, match="keep_grad"):
        with vitlab.capture_attention(tiny_vit(), keep_grad=True, head_fusion="mean"):
            pass
    with pytest.raises(ValueError, match="out of range"):
        vitlab.attention_maps(tiny_vit(), torch.randn(1, 3, 32, 32), layers=[7])
    with pytest.raises(AttentionCaptureError, match="prefix"):
        vitlab.attention_maps(tiny_vit(readout="avg"), torch.randn(1, 3, 32, 32), queries="prefix")


class SoftmaxRecorder(torch.overrides.TorchFunctionMode):
    """An independent recorder: every 3D/4D softmax output computed while active (test-only)."""

    def __init__(self):
        super().__init__()
        self.out = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        r = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax) and r.dim() in (3, 4):
            self.out.append(r.detach())
        return r


def unfused_softmaxes(model, x):
    """Softmax outputs of a forward with every attention module unfused, in call order."""
    flags = [(m, m.fused_attn) for m in model.modules() if isinstance(getattr(m, "fused_attn", None), bool)]
    try:
        for m, _ in flags:
            m.fused_attn = False
        with torch.no_grad(), SoftmaxRecorder() as rec:
            model(x)
    finally:
        for m, f in flags:
            m.fused_attn = f
    return rec.out


def test_parallel_attention_branches_join_their_heads():
    model = tiny_timm("vit_small_patch16_18x2_224", img_size=32)  # two attentions side by side in each block
    x = torch.randn(2, 3, 32, 32)
    maps = vitlab.attention_maps(model, x)
    soft = unfused_softmaxes(model, x)  # block 0 branch 0, branch 1, block 1 branch 0, branch 1
    assert maps.shape == (2, 2, 12, 5, 5)
    torch.testing.assert_close(maps[0], torch.cat(soft[0:2], dim=1), atol=1e-6, rtol=0)
    torch.testing.assert_close(maps[1], torch.cat(soft[2:4], dim=1), atol=1e-6, rtol=0)
    pooled = vitlab.attention_maps(model, x, head_fusion="mean")
    torch.testing.assert_close(pooled, maps.mean(2, keepdim=True))


def test_block_that_is_its_own_attention():
    model = tiny_timm("vit_base_patch16_xp_224", img_size=32)  # ParallelScalingBlock: attention + MLP fused
    x = torch.randn(2, 3, 32, 32)
    plain, logits, maps = plain_and_captured(model, x)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(maps, torch.stack(unfused_softmaxes(model, x)), atol=1e-6, rtol=0)


def test_differential_attention_refused():
    model = tiny_timm("vit_dwee_patch16_reg1_gap_256", img_size=32)
    with pytest.raises(AttentionCaptureError, match="differential attention"):
        vitlab.attention_maps(model, torch.randn(1, 3, 32, 32))


def test_sam_global_layers_captured_windowed_refused():
    model = timm.create_model("samvit_base_patch16", pretrained=False, depth=2, img_size=64, window_size=2,
                              global_attn_indexes=(1,), num_classes=0).eval()
    x = torch.randn(2, 3, 64, 64)
    maps = vitlab.attention_maps(model, x, layers=[1])  # heads folded into the batch are unfolded
    soft = unfused_softmaxes(model, x)
    assert maps.shape == (1, 2, 12, 16, 16)
    torch.testing.assert_close(maps[0], soft[1].view(2, 12, 16, 16), atol=1e-6, rtol=0)
    with pytest.raises(AttentionCaptureError, match=r"layers=\[1\]"):
        with torch.no_grad(), vitlab.capture_attention(model) as cap:
            model(x)
        cap.stack()
    with pytest.raises(AttentionCaptureError, match="windowed attention"):
        vitlab.attention_maps(model, x)


def test_windowed_layers_alone_and_channel_attention_are_refused():
    """A windowed layer captured alone used to come back as (B * windows) 'images'; XCiT's channel-by-channel
    softmax as a token map. Both are refused, naming why (and the global layers to capture instead)."""
    model = timm.create_model("samvit_base_patch16", pretrained=False, depth=2, img_size=64, window_size=2,
                              global_attn_indexes=(1,), num_classes=0).eval()
    with pytest.raises(AttentionCaptureError, match=r"blocks \[0\] .*\(windowed attention\).*layers=\[1\]"):
        vitlab.attention_maps(model, torch.randn(2, 3, 64, 64), layers=[0])
    assert not any(m._forward_hooks for m in model.modules())
    xcit = timm.create_model("xcit_nano_12_p16_224", pretrained=False, depth=1, img_size=32).eval()
    with pytest.raises(AttentionCaptureError, match="cross-covariance attention"):
        vitlab.attention_maps(xcit, torch.randn(1, 3, 32, 32))


def test_query_selections_keep_only_their_rows_and_check_their_range(vit, x32):
    import numpy as np

    full = vitlab.attention_maps(vit, x32)  # (L, B, H, 65, 65)
    with torch.no_grad(), vitlab.capture_attention(vit, queries="prefix") as cap:
        vit(x32)
    kept = cap.maps[0][0]
    assert kept.shape == (2, 3, 1, 65) and kept.untyped_storage().nbytes() == kept.numel() * 4  # not the whole map
    for q, rows in ((np.int64(5), [5]), ([0, -1], [0, 64]), (-2, [63]), (torch.tensor([0, 3]), [0, 3]),
                    (np.array([7, 2]), [7, 2])):
        torch.testing.assert_close(vitlab.attention_maps(vit, x32, queries=q), full[..., rows, :], rtol=0, atol=0)
    for q in (65, [3, -66]):
        with pytest.raises(AttentionCaptureError, match="out of range for 65 tokens"):
            vitlab.attention_maps(vit, x32, queries=q)
    for q in (True, [0, False], torch.tensor([True, False]), 1.0):  # a bool is no row 1, a float no row
        with pytest.raises(AttentionCaptureError, match="give 'all', 'prefix', a query index"):
            vitlab.attention_maps(vit, x32, queries=q)


def test_a_convit_block_before_its_class_token_joins_is_padded_with_the_class_tokens_identity():
    """A ConViT's first local_up_to_layer blocks attend over the 64 patches alone, its later blocks over the class
    token too: the capture refused to stack them ('windowed attention?'). The earlier blocks' maps now carry the class
    token's identity row and column around timm's own patch attention, the later blocks' are theirs, model_info says
    where the class token joins, and the capture leaves no hook and no changed mode behind."""
    model = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    before = [(m.training, len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]
    maps = vitlab.attention_maps(model, x)  # (4, 2, 4, 65, 65)
    assert [(m.training, len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()] == before
    raw = convit_raw_attention(model, x)
    assert [tuple(r.shape[-2:]) for r in raw] == [(64, 64), (64, 64), (65, 65), (65, 65)]
    assert maps.shape == (4, 2, 4, 65, 65) and vitlab.model_info(model).class_token_joins == 2
    for layer in (0, 1):
        assert torch.equal(maps[layer, :, :, 0, 0], torch.ones(2, 4))
        assert not maps[layer, :, :, 0, 1:].any() and not maps[layer, :, :, 1:, 0].any()
        torch.testing.assert_close(maps[layer, :, :, 1:, 1:].double(), raw[layer], rtol=0, atol=1e-6)
    for layer in (2, 3):
        torch.testing.assert_close(maps[layer].double(), raw[layer], rtol=0, atol=1e-6)
    torch.testing.assert_close(vitlab.attention_maps(model, x, queries="prefix", layers=[1, 2]), maps[1:3, ..., :1, :])
    assert vitlab.model_info(tiny_vit()).class_token_joins == 0


def test_a_convit_blocks_gradients_before_its_class_token_joins_are_zero_for_the_class_token():
    """keep_grad on a ConViT: the earlier blocks' gradients are those of timm's own (B, H, 64, 64) maps (graph_maps),
    padded with zeros for the class token, which no output depends on there."""
    model = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    with torch.enable_grad(), vitlab.capture_attention(model, keep_grad=True) as cap:
        model(x)[:, 3].sum().backward()
        grads, graph = cap.grads(), cap.graph_maps()
    assert grads.shape == (4, 2, 4, 65, 65) and graph[0][0].shape == (2, 4, 64, 64)
    for layer in (0, 1):
        assert not grads[layer, :, :, 0].any() and not grads[layer, :, :, :, 0].any()
        torch.testing.assert_close(grads[layer, :, :, 1:, 1:], graph[layer][0].grad)
    torch.testing.assert_close(grads[2], graph[2][0].grad)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_queries_prefix_on_a_convit_whose_class_token_never_joins_is_refused_not_patch_0():
    """A ConViT no deeper than its local_up_to_layer: no class token reaches its blocks (model_info counts 0 prefix
    tokens), yet queries='prefix' returned patch 0's row as if it were the class token's. It is now refused."""
    model = tiny_convit(depth=2, local_up_to_layer=3)
    x = torch.randn(1, 3, 32, 32)
    assert vitlab.model_info(model).num_prefix_tokens == 0
    with pytest.raises(AttentionCaptureError, match="no prefix"):
        vitlab.attention_maps(model, x, queries="prefix")
    torch.testing.assert_close(vitlab.attention_maps(model, x, queries=[0]), vitlab.attention_maps(model, x)[..., :1, :])


@pytest.mark.parametrize("join", [2, 3])
def test_a_convit_exactly_as_deep_as_its_local_up_to_layer_never_adds_its_class_token(join):
    """timm joins the class token before block local_up_to_layer: a ConViT of 2 blocks with local_up_to_layer=2 (the
    boundary) never adds it, as with 3. Its info counts no prefix, no late join, and the 64 patches of the maps."""
    from vitlab.models.info import class_token_join, class_token_never_joins

    model = tiny_convit(depth=2, local_up_to_layer=join)
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, torch.randn(1, 3, 32, 32))
    assert class_token_never_joins(model) and class_token_join(model) == 0
    assert (info.num_prefix_tokens, info.class_token_joins, info.num_tokens, maps.shape[-1]) == (0, 0, 64, 64)


@pytest.mark.parametrize("attn_block", ["talking heads", "plain"])
def test_cait_class_attention_is_refused_by_name(attn_block):
    """CaiT's class token joins only in class-attention blocks (1 x (1 + N) maps from the class token alone). Built
    with plain attention blocks, its patch-only blocks were captured as (L, B, H, 64, 64) against model_info's 65
    tokens, without its class-attention blocks, and rollout failed in a bare matrix product; every attention analysis
    now refuses it by name, before any hook, and points to the maps that need no attention."""
    from timm.layers import Attention

    kwargs = {"attn_block": Attention} if attn_block == "plain" else {}
    model = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, patch_size=4, depth=2,
                              depth_token_only=1, num_classes=10, **kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    for analysis in (vitlab.attention_maps, vitlab.attention_rollout, vitlab.gradient_rollout,
                     vitlab.mean_attention_distance):
        with pytest.raises(AttentionCaptureError, match=r"class-attention blocks .* vitlab.integrated_gradients"):
            analysis(model, x)
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert vitlab.occlusion(model, x, target=1).shape == (2, 8, 8)
