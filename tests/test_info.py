"""model_info: read every fact from the model, checked against what the model actually does."""

from __future__ import annotations

import re

import numpy as np
import pytest
import timm
import torch
from conftest import tiny_timm, tiny_vit
from timm.models import VisionTransformer
from torch import nn

import vitlab
from vitlab import BiTConfig, HybridConfig, model_info, vit_config


def tiny_hybrid() -> nn.Module:
    vit = vit_config("Ti/4", img_size=32, depth=1, num_classes=10)
    return vitlab.build_model(HybridConfig(vit=vit, layers=(1,), stem="imagenet")).eval()


def map_pool_vit() -> nn.Module:
    """A SigLIP-style ViT: no class token, attention-pool ('map') readout."""
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10,
                             class_token=False, global_pool="map").eval()


def tokens(model: nn.Module, h: int, w: int) -> int:
    """T, the number of tokens the blocks really see for an (h, w) input."""
    with torch.no_grad():
        return model.forward_features(torch.randn(1, 3, h, w)).shape[1]


MODELS = {
    "vitlab_token": lambda: tiny_vit(),
    "vitlab_avg": lambda: tiny_vit(readout="avg"),
    "vitlab_sincos": lambda: tiny_vit(pos_embed="sincos"),
    "vitlab_nopos": lambda: tiny_vit(pos_embed="none"),
    "deit_distilled": lambda: tiny_timm("deit_tiny_distilled_patch16_224", img_size=64),
    "dinov2_reg4": lambda: tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56),
    "map_pool": map_pool_vit,
    "vitlab_hybrid": tiny_hybrid,
    "timm_hybrid": lambda: tiny_timm("vit_tiny_r_s16_p8_224", img_size=64),
}

#: name -> (grid, patch, prefix kinds, pos_embed, pos_embed_has_prefix, readout, depth, heads, dim, hybrid)
EXPECTED = {
    "vitlab_token": ((8, 8), (4, 4), ("class",), "learn", True, "token", 3, 3, 192, False),
    "vitlab_avg": ((8, 8), (4, 4), (), "learn", False, "avg", 3, 3, 192, False),
    "vitlab_sincos": ((8, 8), (4, 4), ("class",), "fixed", True, "token", 3, 3, 192, False),
    "vitlab_nopos": ((8, 8), (4, 4), ("class",), "none", False, "token", 3, 3, 192, False),
    "deit_distilled": ((4, 4), (16, 16), ("class", "dist"), "learn", True, "token", 2, 3, 192, False),
    "dinov2_reg4": ((4, 4), (14, 14), ("class", "reg", "reg", "reg", "reg"), "learn", False, "token", 2, 6, 384,
                    False),
    "map_pool": ((4, 4), (8, 8), (), "learn", False, "map", 2, 2, 64, False),
    "vitlab_hybrid": ((8, 8), (4, 4), ("class",), "learn", True, "token", 1, 3, 192, True),
    "timm_hybrid": ((2, 2), (32, 32), ("class",), "learn", True, "token", 2, 3, 192, True),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_info(name):
    model = MODELS[name]()
    info = model_info(model)
    grid, patch, kinds, pos, has_prefix, readout, depth, heads, dim, hybrid = EXPECTED[name]
    assert info.grid_size == grid and info.num_patches == grid[0] * grid[1]
    assert info.patch_size == patch
    assert info.prefix_kinds == kinds and info.num_prefix_tokens == len(kinds)
    assert (info.num_class_tokens, info.num_dist_tokens, info.num_reg_tokens) == (
        kinds.count("class"), kinds.count("dist"), kinds.count("reg"))
    assert (info.pos_embed, info.pos_embed_has_prefix) == (pos, has_prefix)
    assert (info.readout, info.depth, info.num_heads, info.embed_dim, info.hybrid) == (readout, depth, heads, dim,
                                                                                        hybrid)
    assert info.img_size == (grid[0] * patch[0], grid[1] * patch[1])
    # cross-checks against the model itself
    assert tokens(model, *info.img_size) == info.num_tokens
    assert info.num_prefix_tokens == model.num_prefix_tokens
    if model.pos_embed is not None:
        assert model.pos_embed.shape[1] == info.num_patches + info.num_prefix_tokens * info.pos_embed_has_prefix


def test_architecture_names():
    assert model_info(tiny_vit()).architecture == "vitlab_vit"
    assert model_info(tiny_hybrid()).architecture == "vitlab_hybrid"
    assert model_info(MODELS["deit_distilled"]()).architecture == "deit_tiny_distilled_patch16_224"


def test_dynamic_model_at_a_non_square_size():
    model = tiny_timm("vit_tiny_patch16_224", img_size=64, dynamic_img_size=True)
    info = model_info(model, img_size=(48, 80))
    assert info.img_size == (48, 80) and info.grid_size == (3, 5) and info.num_tokens == 16
    assert info.dynamic_img_size
    assert info.pos_embed_has_prefix  # read at the model's own grid, whatever the input size
    assert tokens(model, 48, 80) == info.num_tokens
    assert model_info(model).grid_size == (4, 4)


def test_padded_patches_give_the_token_grid_at_the_models_own_size():
    """timm's grid_size floors img_size / patch, but with dynamic_img_pad the model pads and runs ceil(...) tokens per
    side: the grid is the tokens', while pos_embed's rows stay laid out on timm's grid."""
    model = tiny_timm("vit_tiny_patch16_224", img_size=70, dynamic_img_size=True, dynamic_img_pad=True)
    info = model_info(model)
    assert info.grid_size == (5, 5) and tokens(model, 70, 70) == info.num_tokens == 26
    assert info.pos_grid_size == (4, 4) and info.pos_embed_has_prefix
    assert model_info(model, img_size=(50, 64)).grid_size == (4, 4)
    assert model_info(tiny_vit()).pos_grid_size == (8, 8)

@pytest.mark.parametrize("dynamic", [False, True])
def test_data_config_gives_the_size_the_model_is_built_for(dynamic):
    """data_config's docstring said a dynamic-size model kept its name's 224 px; its check read an attribute timm's
    PatchEmbed does not have, so every model gets the size it is built for, as the docstring now says."""
    from vitlab.models.info import data_config

    model = tiny_timm("vit_tiny_patch16_224", img_size=(48, 80), dynamic_img_size=dynamic)
    assert data_config(model)["input_size"] == (3, 48, 80)

def test_img_size_int_and_hybrid_at_another_size():
    assert model_info(tiny_vit(), img_size=48).grid_size == (12, 12)
    info = model_info(tiny_hybrid(), img_size=(48, 64))
    assert info.grid_size == (12, 16) and info.patch_size == (4, 4)


def test_dynamic_hybrid_at_a_size_its_stride_does_not_divide():
    """timm's dynamic_feat_size divides by the built size's ratio and floors (2x2 at 72 px for a stride-32 backbone),
    but the backbone's padded convolutions give 3x3 cells: the grid is read off the backbone, so the analyses get
    the tokens the model runs (attention_rollout failed with a raw matmul error before)."""
    model = tiny_timm("vit_small_r26_s32_224", depth=1, img_size=64, dynamic_img_size=True, num_classes=3)
    model.train()
    for size, grid in (((72, 72), (3, 3)), ((80, 100), (3, 4)), ((96, 64), (3, 2))):
        info = model_info(model, img_size=size)
        assert info.grid_size == grid and info.patch_size == (32, 32)
        assert tokens(model.eval(), *size) == info.num_tokens
        model.train()
    assert all(m.training for m in model.modules())  # the backbone ran in eval mode and was put back
    assert vitlab.attention_rollout(model, torch.randn(1, 3, 72, 72)).shape == (1, 3, 3)

def test_non_square_vitlab_model():
    model = vitlab.build_model(vit_config("Ti/4", img_size=(32, 48), depth=1))
    info = model_info(model)
    assert info.img_size == (32, 48) and info.grid_size == (8, 12)


def test_non_square_patches_give_the_grid_the_model_runs():
    """Rows divide by the patch's height and columns by its width: an (8, 4) px patch at 48 x 40 px is a 6 x 10 grid."""
    model = VisionTransformer(img_size=32, patch_size=(8, 4), embed_dim=64, depth=1, num_heads=2, num_classes=10,
                              dynamic_img_size=True).eval()
    info = model_info(model, img_size=(48, 40))
    assert info.patch_size == (8, 4) and info.grid_size == (6, 10)
    assert tokens(model, 48, 40) == info.num_tokens == 61


def test_a_frozen_sincos_table_behind_a_class_row_is_fixed():
    """The sin-cos check reads pos_embed's patch rows, the last gh*gw, not its first rows (the class token's row
    first): a wholly frozen timm ViT whose patch rows hold the 2D sin-cos table has a fixed embedding."""
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, num_classes=10).eval()
    with torch.no_grad():
        model.pos_embed[0, 1:] = build_sincos2d_pos_embed([4, 4], dim=64)
    model.requires_grad_(False)
    assert model_info(model).pos_embed == "fixed"
    with torch.no_grad():
        model.pos_embed[0, 1:] += 0.1  # no longer the table: a learned embedding, frozen for inspection
    assert model_info(model).pos_embed == "learn"


def test_a_class_token_readout_never_includes_the_prefix_in_a_pool():
    """pool_include_prefix is about pooled readouts ("avg"): a class-token readout pools nothing."""
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, num_classes=10, pool_include_prefix=True)
    assert not model_info(VisionTransformer(global_pool="token", **kw)).readout_includes_prefix
    assert model_info(VisionTransformer(global_pool="avg", **kw)).readout_includes_prefix


def test_frozen_model_keeps_a_learned_embedding():
    """Freezing a model for inspection does not turn its learned pos_embed into a 'fixed' one."""
    vitlab_model = tiny_vit().requires_grad_(False)
    timm_model = tiny_timm("vit_tiny_patch16_224", img_size=32).requires_grad_(False)
    assert model_info(vitlab_model).pos_embed == "learn"
    assert model_info(timm_model).pos_embed == "learn"


def test_frozen_pos_embed_alone_is_fixed():
    model = tiny_timm("vit_tiny_patch16_224", img_size=32)
    model.pos_embed.requires_grad_(False)
    assert model_info(model).pos_embed == "fixed"


def test_resnets_are_refused_clearly():
    bit = vitlab.build_model(BiTConfig(layers=(1, 1), stem="cifar", img_size=32, num_classes=10))
    with pytest.raises(TypeError, match="ResNetV2 is not a ViT-family model"):
        model_info(bit)
    with pytest.raises(TypeError, match="not a ViT-family model"):
        model_info(timm.create_model("resnet18", pretrained=False, num_classes=10))


def test_naflex_vit_is_refused_as_what_it_is():
    """timm's NaFlexVit (a ViT whose patches are placed by coordinates, `embeds` instead of `patch_embed`) was refused
    as 'not a ViT-family model (it has no patch_embed and blocks)': it has blocks and is a ViT. The message now names
    its embedding, why vitlab cannot read it and what to use instead."""
    model = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, depth=1, embed_dim=32, num_heads=2,
                              img_size=32, num_classes=3)
    with pytest.raises(TypeError, match=r"NaFlex embedding \(`embeds`.*Use the same model as a timm VisionTransformer"):
        model_info(model)
    maps = vitlab.attention_maps(model.eval(), torch.randn(1, 3, 32, 32))  # what does work on it
    assert maps.shape == (1, 1, 2, model.num_prefix_tokens + 4, model.num_prefix_tokens + 4)


def test_positions_the_attention_adds_are_named(capsys):
    """`vitlab info` said 'position embedding none' for RoPE and BEiT models, whose attention encodes positions (rotary
    embeddings, a relative position bias): model_info and the command now name them."""
    from vitlab.cli import main

    small = dict(pretrained=False, depth=1, img_size=32, num_classes=3)
    rope = timm.create_model("vit_base_patch16_rope_224", embed_dim=32, num_heads=2, **small)
    beit = timm.create_model("beit_base_patch16_224", embed_dim=32, num_heads=2, **small)
    eva = timm.create_model("eva02_tiny_patch14_224", **{**small, "img_size": 28})
    assert (model_info(rope).pos_embed, model_info(rope).attention_positions) == ("none", ("rotary",))
    assert (model_info(beit).pos_embed, model_info(beit).attention_positions) == ("none", ("relative bias",))
    assert (model_info(eva).pos_embed, model_info(eva).attention_positions) == ("learn", ("rotary",))
    assert model_info(tiny_vit()).attention_positions == ()
    assert main(["info", "--model", "eva02_tiny_patch14_224", "--no-pretrained"]) == 0
    assert "learn (prefix rows: yes); in attention: rotary" in capsys.readouterr().out


def test_bad_img_size():
    """In the words of vitlab.models.config.size2 (model building and resize_for_finetuning), whatever is wrong with it."""
    # "88" was read as the pair ("8", "8"): a 2x2 grid described without a word; 64.0 reached a bare error
    # a float tensor has __index__ too (it raises when called): (32.5, 32) was truncated to a 32 x 32 grid
    for bad in (0, (32, -1), "88", 64.0, (32,), (32.0, 32.0), (torch.tensor(32.5), 32)):
        with pytest.raises(ValueError, match=r"img_size must be a positive int or a pair \(H, W\) of positive ints, got "
                                             + re.escape(repr(bad))):
            model_info(tiny_vit(), img_size=bad)
    assert model_info(tiny_vit(), img_size=[64, 32]).grid_size == (16, 8)
    assert model_info(tiny_vit(), img_size=(torch.tensor(64), np.int64(32))).grid_size == (16, 8)


def test_an_input_smaller_than_one_patch_is_refused():
    """`vitlab info --img-size 2 2` described a 0x0 grid (2 tokens) for a 4 px patch model, an input no model takes."""
    model = tiny_timm("vit_tiny_patch16_224", img_size=64, dynamic_img_size=True)
    with pytest.raises(ValueError, match="smaller than one 16x16 px patch"):
        model_info(model, img_size=(8, 64))
    assert model_info(model, img_size=(16, 16)).grid_size == (1, 1)


def test_a_vit_vitlab_cannot_read_is_not_said_to_have_no_attention(tmp_path, monkeypatch):
    """`vitlab reproduce` and `vitlab app` wrapped model_info's refusal of timm's NaFlexVit (a ViT that vitlab cannot
    read) in 'has no self-attention', which is false; a model with attention layers is now 'cannot be inspected',
    and a CNN still 'has no self-attention'."""
    from conftest import tiny_bit

    import vitlab.report as R
    from vitlab.models.info import has_attention

    naflex = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, depth=1, num_classes=3)
    assert has_attention(naflex) and has_attention(vitlab.load_model()) and not has_attention(tiny_bit())
    for net, words in ((naflex, "m cannot be inspected"), (tiny_bit(), "m has no self-attention to inspect")):
        monkeypatch.setattr(R, "load_model", lambda *a, _n=net, **k: _n)
        with pytest.raises(ValueError, match=words):
            R.reproduce("m", out=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_vitlab_info_and_the_report_name_the_architecture_alike(tmp_path, capsys):
    """`vitlab info` said 'vitlab_vit' where the report's facts said 'VisionTransformer (...)' of the same model."""
    from vitlab.cli import main
    from vitlab.models.info import architecture_words
    from vitlab.report import _summary

    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    assert main(["info", "--model", str(ck)]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    net = vitlab.load_model(str(ck))
    facts = dict(_summary(net, model_info(net), str(ck), True, None, "images", 1)["facts"])
    assert rows["architecture"] == architecture_words(net, model_info(net)) == "vitlab_vit (VisionTransformer)"
    assert facts["architecture"].split(": ")[0] == rows["architecture"]


def test_vitlab_info_words_the_weights_as_the_model_facts_do(tmp_path, capsys):
    """`vitlab info` wrote where the weights came from its own way ("random initialisation", "timm pretrained", a
    checkpoint's path as given) where the report wrote ``weights_description``'s words; both now come from there,
    and the JSON keeps a checkpoint's path in its own field."""
    import json

    from safetensors.torch import save_file

    from vitlab.cli import main
    from vitlab.models.card import weights_description

    def info(*argv: str) -> dict:
        assert main(["info", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    name = "vit_tiny_patch16_224"
    net = vitlab.load_model(name, pretrained=False)
    d = info("--model", name, "--no-pretrained")
    assert d["weights"] == weights_description(net, name, False, None) == "random initialisation (no pretrained weights)"
    assert d["checkpoint"] is None
    w = tmp_path / "w.safetensors"
    save_file(net.state_dict(), str(w))
    d = info("--model", name, "--weights", str(w))
    assert d["weights"] == f"{w} (local file)" and d["checkpoint"] is None
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    d = info("--model", str(ck))
    assert d["weights"] == weights_description(vitlab.load_model(str(ck)), str(ck), True, None)
    assert d["checkpoint"] == str(ck)
    assert main(["info", "--model", str(ck)]) == 0
    assert dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())["weights"] == d["weights"]


def test_model_facts_word_one_models_architecture_parameters_and_weights(tmp_path):
    """One wording of a model's facts for `vitlab info`, the report and the notebooks (vitlab.models.card.model_facts)."""
    from safetensors.torch import save_file

    from vitlab.models.card import facts_text, model_facts

    cfg = vit_config("Ti/4", img_size=32, depth=2, num_classes=10)
    net = vitlab.load_model(cfg)
    facts = dict(model_facts(net, model_info(net), cfg))
    assert list(facts) == ["model", "architecture", "parameters", "input", "positions", "weights"]
    assert facts["parameters"] == f"{sum(p.numel() for p in net.parameters()):,}"
    assert facts["architecture"].endswith(": 2 blocks, width 192, 3 heads")
    assert facts["input"].startswith("32x32 px, 4 px patches, 8x8 grid, 1 prefix token (class)")
    assert facts["weights"] == "random initialisation (no pretrained weights)"
    weights = tmp_path / "w.safetensors"
    save_file(net.state_dict(), str(weights))
    assert dict(model_facts(net, model_info(net), cfg, weights=weights))["weights"] == f"{weights} (local file)"
    shipped = dict(model_facts(vitlab.load_model(None), model_info(vitlab.load_model(None))))
    assert shipped["weights"] == "data/checkpoints/vit_cifar10" and "model card" in shipped
    cnn = timm.create_model("resnet18", pretrained=False, num_classes=10)
    rows = model_facts(cnn, None, "resnet18", pretrained=False)
    assert [k for k, _ in rows] == ["model", "architecture", "parameters", "weights"] and rows[1][1] == "ResNet"
    assert facts_text(rows).splitlines()[0] == "model         resnet18"
