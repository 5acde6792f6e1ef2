"""The model zoo (vitlab.models.zoo): pinned parameter counts, timm's own layouts as references, config checks.

Big models are only built on the meta device (shapes, no memory, no init); everything that runs is tiny.
"""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import ref_sincos, tiny_bit, tiny_hybrid, tiny_vit
from timm.data import resolve_data_config
from timm.layers import GroupNormAct, StdConv2d
from torch import nn

import vitlab
from vitlab import BiTConfig, HybridConfig, vit_config
from vitlab.models.config import Preprocess


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def meta_model(build) -> nn.Module:
    with torch.device("meta"):
        return build()


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}

# ---------------------------------------------------------------------------------------------- the family


@pytest.mark.parametrize("name, count", [("B/16", 86_567_656), ("L/16", 304_326_632), ("H/14", 632_045_800)])
def test_table1_parameter_counts(name, count):
    model = meta_model(lambda: vitlab.build_model(vit_config(name)))
    assert n_params(model) == count


@pytest.mark.parametrize("name, timm_name", [("Ti/16", "vit_tiny_patch16_224"), ("S/16", "vit_small_patch16_224"),
                                             ("B/32", "vit_base_patch32_224"), ("L/32", "vit_large_patch32_224"),
                                             ("H/14", "vit_huge_patch14_224")])
def test_family_matches_timm_shapes(name, timm_name):
    ours = meta_model(lambda: vitlab.build_model(vit_config(name)))
    ref = meta_model(lambda: timm.create_model(timm_name, pretrained=False, num_classes=1000))
    assert shapes(ours) == shapes(ref)


def test_hybrid_matches_timm_r50_vit_b16():
    """Independent check: with no head, our R50+ViT-B/16 has exactly timm's vit_base_r50_s16_224 tensors."""
    ours = meta_model(lambda: vitlab.build_model(HybridConfig(vit=vit_config("B/16", num_classes=0))))
    ref = meta_model(lambda: timm.create_model("vit_base_r50_s16_224", pretrained=False, num_classes=0))
    assert shapes(ours) == shapes(ref)
    assert ours.patch_embed.grid_size == (14, 14)
    assert ours.patch_embed.proj.kernel_size == (1, 1)  # the feature map is cut into 1x1 patches


def test_bit_r50x1_matches_timm():
    ours = meta_model(lambda: vitlab.build_model(BiTConfig()))
    ref = meta_model(lambda: timm.create_model("resnetv2_50x1_bit", pretrained=False))
    assert n_params(ours) == 25_549_352 == n_params(ref)
    assert shapes(ours) == shapes(ref)


def test_bit_uses_group_norm_and_weight_standardisation():
    model = tiny_bit()
    convs = [m for name, m in model.named_modules() if isinstance(m, nn.Conv2d) and not name.startswith("head")]
    assert convs and all(isinstance(m, StdConv2d) for m in convs)  # the head is a plain 1x1 conv, as in timm
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, GroupNormAct) and m.num_groups == 32 for m in model.modules())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert [f["reduction"] for f in model.feature_info] == [1, 1, 2]  # 32 px stem keeps full resolution


def test_hybrid_runs_and_backbone_is_bit_style(x32):
    model = tiny_hybrid()
    assert model.patch_embed.grid_size == (8, 8)
    assert all(isinstance(m, StdConv2d) for m in model.patch_embed.backbone.modules() if isinstance(m, nn.Conv2d))
    assert any(isinstance(m, GroupNormAct) for m in model.patch_embed.backbone.modules())
    assert model.forward_features(x32).shape == (2, 1 + 64, 192)
    assert model(x32).shape == (2, 10)


def test_hybrid_with_the_small_image_stem():
    """The 32 px stem keeps full resolution: two stages give stride 2, so 16 px make an 8x8 grid."""
    cfg = HybridConfig(vit=vit_config("Ti/2", img_size=16, depth=1, num_classes=10), layers=(1, 1), stem="cifar")
    model = vitlab.build_model(cfg).eval()
    assert model.patch_embed.grid_size == (8, 8)
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 10)


def test_small_image_variant(x32):
    model = tiny_vit()
    assert model.patch_embed.grid_size == (8, 8)
    assert model.patch_embed.proj.kernel_size == (4, 4)
    assert model(x32).shape == (2, 10)


def test_non_square_images():
    model = vitlab.build_model(vit_config("Ti/4", img_size=(32, 48), depth=1, num_classes=3)).eval()
    assert model.patch_embed.grid_size == (8, 12)
    assert model(torch.randn(1, 3, 32, 48)).shape == (1, 3)
    assert resolve_data_config({}, model=model)["input_size"] == (3, 32, 48)


def test_token_readout_reads_the_class_token(x32):
    model = tiny_vit()
    assert model.cls_token is not None and model.global_pool == "token"
    feats = model.forward_features(x32)  # (B, 1 + 64, D), final norm applied
    assert torch.equal(model.forward_head(feats, pre_logits=True), feats[:, 0])


def test_avg_readout_has_no_class_token_and_averages(x32):
    model = tiny_vit(readout="avg")
    assert model.cls_token is None and model.num_prefix_tokens == 0
    feats = model.forward_features(x32)  # (B, 64, D)
    assert feats.shape == (2, 64, 192)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), model.fc_norm(feats.mean(1)))


def test_learned_position_embedding():
    model = tiny_vit()
    assert isinstance(model.pos_embed, nn.Parameter) and model.pos_embed.requires_grad
    assert model.pos_embed.shape == (1, 1 + 64, 192)


def test_sincos_position_embedding_is_the_fixed_2d_table():
    model = tiny_vit(pos_embed="sincos")
    pe = model.pos_embed
    assert not pe.requires_grad
    assert pe.shape == (1, 1 + 64, 192)
    assert torch.equal(pe[0, 0], torch.zeros(192))  # the class token gets no position
    torch.testing.assert_close(pe[0, 1:], ref_sincos(8, 8, 192), atol=1e-5, rtol=0)
    assert not any(p is pe for p in model.parameters() if p.requires_grad)


def test_no_position_embedding_makes_the_model_blind_to_patch_order():
    """Table 8's 'no positional embedding': permuting the patches of the image leaves the logits unchanged."""
    model = tiny_vit(pos_embed="none", readout="avg")
    assert model.pos_embed is None
    x = torch.randn(2, 3, 32, 32)
    patches = x.reshape(2, 3, 8, 4, 8, 4).permute(0, 2, 4, 1, 3, 5).reshape(2, 64, 3, 4, 4)
    perm = torch.randperm(64)
    shuffled = patches[:, perm].reshape(2, 8, 8, 3, 4, 4).permute(0, 3, 1, 4, 2, 5).reshape(2, 3, 32, 32)
    assert not torch.equal(shuffled, x)
    with torch.no_grad():
        torch.testing.assert_close(model(shuffled), model(x), atol=1e-5, rtol=1e-5)


def test_learned_position_embedding_makes_the_model_see_patch_order(x32):
    model = tiny_vit(readout="avg")
    flipped = x32.reshape(2, 3, 8, 4, 32).flip(2).reshape(2, 3, 32, 32)  # rows of patches in reverse order
    with torch.no_grad():
        assert not torch.allclose(model(flipped), model(x32), atol=1e-4)


def test_every_model_is_a_plain_timm_module():
    assert type(tiny_vit()).__name__ == "VisionTransformer"
    assert type(tiny_bit()).__name__ == "ResNetV2"
    assert tiny_vit().vitlab_config == vit_config("Ti/4", img_size=32, depth=3, num_classes=10)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["X/16", "B16", "B/x", "B/0", "B/-4", "B/16/2", ""])
def test_vit_config_rejects_bad_names(name):
    with pytest.raises(ValueError, match="SIZE/PATCH"):
        vit_config(name)


@pytest.mark.parametrize("overrides, match", [
    (dict(img_size=100), "not a multiple of patch_size"),
    (dict(img_size=(224, 100)), "not a multiple of patch_size"),
    (dict(img_size=0), "img_size"),
    (dict(num_heads=5), "divisible by num_heads"),
    (dict(readout="cls"), "readout"),
    (dict(pos_embed="1d"), "pos_embed"),
    (dict(depth=0), "depth"),
    (dict(num_classes=-1), "num_classes"),
    (dict(embed_dim=6, num_heads=1, pos_embed="sincos"), "divisible by 4"),
])
def test_vit_config_rejects_bad_fields(overrides, match):
    with pytest.raises(ValueError, match=match):
        vit_config("B/16", **overrides)


def test_vit_config_unknown_field():
    with pytest.raises(TypeError, match="unknown ViTConfig fields.*patch"):
        vit_config("B/16", patch=8)


def test_other_configs_reject_bad_fields():
    with pytest.raises(ValueError, match="vit.patch_size must be 16"):
        HybridConfig(vit=vit_config("B/32"))
    with pytest.raises(ValueError, match="stem"):
        BiTConfig(stem="tiny")
    with pytest.raises(ValueError, match="layers"):
        BiTConfig(layers=())
    with pytest.raises(TypeError, match="ViTConfig, HybridConfig, BiTConfig or CifarNetConfig"):
        vitlab.build_model({"kind": "vit"})


def test_model_configs_refuse_a_bool_for_a_count():
    """vit_config(num_classes=True), BiTConfig(width_factor=True), BiTConfig(layers=(True, 1)),
    CifarNetConfig(whiten_kernel=True) and CifarNetConfig(widths=(True, 8)) were accepted, each True to be read as 1
    (a bool is an int to Python); they are refused with their fields' messages."""
    from vitlab.models.config import CifarNetConfig

    for make, match in ((lambda: vit_config("Ti/16", num_classes=True), "num_classes must be an int >= 0"),
                        (lambda: BiTConfig(width_factor=True), "width_factor must be a positive int"),
                        (lambda: BiTConfig(layers=(True, 1)), "layers must be a non-empty tuple of block counts"),
                        (lambda: CifarNetConfig(whiten_kernel=True), "whiten_kernel must be a positive int"),
                        (lambda: CifarNetConfig(widths=(True, 8)), "widths must be a non-empty tuple of positive")):
        with pytest.raises(ValueError, match=match + ".*True"):
            make()


# ---------------------------------------------------------------------------------------------- preprocessing


def test_preprocessing_comes_from_the_models_own_config():
    pre = Preprocess(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6), interpolation="bilinear")
    model = vitlab.build_model(vit_config("Ti/4", img_size=32, depth=1, preprocess=pre))
    cfg = resolve_data_config({}, model=model)
    assert cfg["input_size"] == (3, 32, 32)
    assert cfg["mean"] == (0.1, 0.2, 0.3) and cfg["std"] == (0.4, 0.5, 0.6)
    assert cfg["interpolation"] == "bilinear"
    assert cfg["crop_pct"] == 1.0


@pytest.mark.parametrize("make, size", [(tiny_hybrid, 32), (tiny_bit, 32),
                                        (lambda: meta_model(lambda: vitlab.build_model(vit_config("B/16"))), 224)])
def test_preprocessing_defaults(make, size):
    cfg = resolve_data_config({}, model=make())
    assert cfg["input_size"] == (3, size, size)
    assert cfg["mean"] == cfg["std"] == (0.5, 0.5, 0.5)
    assert cfg["interpolation"] == "bicubic"


def test_input_size_follows_in_chans():
    model = vitlab.build_model(vit_config("Ti/4", img_size=32, depth=1, in_chans=1))
    assert resolve_data_config({}, model=model)["input_size"] == (1, 32, 32)


@pytest.mark.parametrize("layers,timm_name", [((2, 2, 2, 2), "resnetv2_18"), ((3, 4, 6, 3), "resnetv2_34")])
def test_basic_bit_resnets_match_timm_layout(layers, timm_name):
    """Basic-block BiT ResNets have exactly timm's ResNet-v2 18/34 tensors, with GroupNorm and StdConv."""
    from timm.layers import GroupNormAct, StdConv2d

    cfg = BiTConfig(layers=layers, channels=(64, 128, 256, 512), basic=True)
    ours = meta_model(lambda: vitlab.build_model(cfg))
    ref = meta_model(lambda: timm.create_model(timm_name))
    shapes = {k: v.shape for k, v in ref.state_dict().items() if "running_" not in k and "num_batches" not in k}
    assert {k: v.shape for k, v in ours.state_dict().items()} == shapes
    assert any(isinstance(m, StdConv2d) for m in ours.modules())
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in ours.modules())
    assert any(isinstance(m, GroupNormAct) for m in ours.modules())


def test_bit_channels_validated():
    with pytest.raises(ValueError, match="multiples of 32 with BiT's 32 GroupNorm groups"):
        BiTConfig(layers=(2, 2), channels=(48, 96))
    with pytest.raises(ValueError, match="one width per stage"):
        BiTConfig(layers=(2, 2), channels=(64,))
    with pytest.raises(ValueError, match="at least 8 channels"):
        BiTConfig(layers=(2, 2), channels=(4, 96), gn_min_channels_per_group=8)


def test_hybrid_backbone_widths_validated_like_bits():
    """The hybrid's backbone is the same ResNet-v2: the same width and grouping checks, before anything is built
    (a 48-wide stage used to reach torch's 'num_channels must be divisible by num_groups' at build time)."""
    vit = vit_config("Ti/2", img_size=16, depth=1, num_classes=10)
    with pytest.raises(ValueError, match="multiples of 32 with BiT's 32 GroupNorm groups"):
        HybridConfig(vit=vit, layers=(1, 1), stem="cifar", channels=(48, 96))
    with pytest.raises(ValueError, match="gn_min_channels_per_group must be None or a positive int"):
        HybridConfig(vit=vit, layers=(1, 1), stem="cifar", gn_min_channels_per_group=0)
    ok = HybridConfig(vit=vit, layers=(1, 1), stem="cifar", channels=(48, 96), gn_min_channels_per_group=8)
    assert vitlab.build_model(ok)(torch.zeros(1, 3, 16, 16)).shape == (1, 10)


def test_bottleneck_middle_widths_are_checked_before_the_build():
    """A bottleneck normalises a quarter of its stage's width: 64 and 128 wide stages have 16 and 32 channels in
    the middle, so 32 groups need stages of 128 and more. Every width the check lets through builds."""
    vit = vit_config("Ti/2", img_size=16, depth=1, num_classes=10)
    with pytest.raises(ValueError, match=r"bottleneck middle widths \[16, 32\].*got \[16\]"):
        HybridConfig(vit=vit, layers=(1, 1), stem="cifar", channels=(64, 128))
    with pytest.raises(ValueError, match="bottleneck middle widths"):
        BiTConfig(layers=(1, 1), channels=(64, 128), stem="cifar", img_size=16)
    for cfg in (HybridConfig(vit=vit, layers=(1, 1), stem="cifar", channels=(128, 256)),
                BiTConfig(layers=(1, 1), channels=(128, 256), stem="cifar", img_size=16, num_classes=10),
                BiTConfig(layers=(1, 1), channels=(32, 64), basic=True, stem="cifar", img_size=16, num_classes=10),
                BiTConfig(layers=(1, 1), channels=(32, 64), stem="cifar", img_size=16, num_classes=10,
                          gn_min_channels_per_group=8)):
        assert vitlab.build_model(cfg)(torch.zeros(1, 3, 16, 16)).shape == (1, 10)


@pytest.mark.parametrize("channels, basic, k", [((48, 80), True, None), ((256, 320), False, None), ((4, 8), True, 8)])
def test_widened_stages_are_checked_at_the_width_they_are_built(channels, basic, k):
    """width_factor 2 builds (48, 80) as (96, 160), all multiples of 32, and (4, 8) as (16, 32), at least 8 channels
    wide: the check judges those built widths (it used to refuse the declared 48 or 4, which no layer has)."""
    cfg = BiTConfig(layers=(1, 1), channels=channels, basic=basic, width_factor=2, stem="cifar", img_size=16,
                    num_classes=3, gn_min_channels_per_group=k)
    model = vitlab.build_model(cfg)
    norms = [g for g in model.modules() if isinstance(g, torch.nn.GroupNorm)]
    assert {g.num_channels for g in norms} >= {2 * c for c in channels}
    assert all(g.num_channels % g.num_groups == 0 and g.num_channels // g.num_groups >= (k or 1) for g in norms)
    assert k is not None or all(g.num_groups == 32 for g in norms)
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 3)
    with pytest.raises(ValueError, match="multiples of 32"):  # a built width off the groups is still refused
        BiTConfig(layers=(1, 1), channels=(40, 80), basic=True, width_factor=2, stem="cifar", img_size=16)


def test_configs_round_widths_as_timm_builds_them():
    """The configs check the widths timm builds without loading timm: vitlab.models.config's copy of timm's
    make_divisible gives timm's width for every width and factor a config can ask for."""
    from timm.layers import make_divisible

    from vitlab.models import config as model_config

    widths = [c * f for c in range(1, 2049) for f in (0.25, 0.5, 1, 2, 3)]
    assert [model_config._make_divisible(w) for w in widths] == [make_divisible(w) for w in widths]


def test_group_norm_keeps_at_least_k_channels_per_group():
    from vitlab.models.zoo import group_count

    assert [group_count(c, 8) for c in (8, 32, 44, 48, 64, 256, 512)] == [1, 4, 4, 6, 8, 32, 32]
    assert all(c % group_count(c, 8) == 0 and c // group_count(c, 8) >= 8 for c in range(8, 600))
    m = vitlab.build_model(BiTConfig(layers=(1, 1), channels=(32, 48), basic=True, stem="cifar", img_size=32,
                                     num_classes=3, gn_min_channels_per_group=8))
    groups = {(g.num_channels, g.num_groups) for g in m.modules() if isinstance(g, torch.nn.GroupNorm)}
    assert groups == {(32, 4), (48, 6)}
    legacy = vitlab.build_model(BiTConfig(layers=(1, 1), channels=(32, 64), basic=True, stem="cifar", img_size=32,
                                          num_classes=3))  # BiT's 32 groups, as the shipped checkpoint was built
    assert {g.num_groups for g in legacy.modules() if isinstance(g, torch.nn.GroupNorm)} == {32}


def test_the_mlp_is_built_as_wide_as_asked():
    """mlp_dim / embed_dim times embed_dim rounds down for some pairs in floating point (88, 120: 119.99...); every
    block's hidden layer is exactly mlp_dim wide."""
    from vitlab.models.config import cifar_vit

    for embed_dim, mlp_dim in ((88, 120), (256, 512), (24, 100), (96, 312)):
        model = vitlab.build_model(cifar_vit(depth=1, embed_dim=embed_dim, num_heads=2, mlp_dim=mlp_dim))
        assert model.blocks[0].mlp.fc1.weight.shape == (mlp_dim, embed_dim)
