"""Model zoo, loader, checkpoints and resolution change: pinned counts, independent references, clear errors.

Big models are only built on the meta device (shapes, no memory, no init); everything that runs is tiny.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import huggingface_hub.constants
import pytest
import timm
import timm.models._hub
import torch
import torch.nn.functional as F
from conftest import tiny_timm, tiny_vit
from safetensors import safe_open
from safetensors.torch import save_file
from timm.data import resolve_data_config
from timm.layers import GroupNormAct, StdConv2d
from torch import nn

import vitlab
import vitlab.models as vm
from vitlab import BiTConfig, HybridConfig, ModelLoadError, vit_config
from vitlab.models import Preprocess


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def meta_model(build) -> nn.Module:
    with torch.device("meta"):
        return build()


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def tiny_hybrid(**vit_overrides) -> nn.Module:
    """R(1)+ViT-Ti: the ImageNet stem and one stage, stride 4, so a 32 px image gives an 8x8 grid of 1x1 patches."""
    vit = vit_config("Ti/4", img_size=32, depth=1, num_classes=10, **vit_overrides)
    return vitlab.build_model(HybridConfig(vit=vit, layers=(1,), stem="imagenet")).eval()


def tiny_bit() -> nn.Module:
    return vitlab.build_model(BiTConfig(layers=(1, 1), stem="cifar", img_size=32, num_classes=10)).eval()


def ref_sincos(gh: int, gw: int, dim: int) -> torch.Tensor:
    """(gh*gw, dim) 2D sin-cos table written out: [sin(y w), sin(x w), cos(y w), cos(x w)], w = 1/10000^(k/(dim/4))."""
    d = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(d, dtype=torch.float64) / d)
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    y, x = y.reshape(-1, 1) * omega, x.reshape(-1, 1) * omega
    return torch.cat([y.sin(), x.sin(), y.cos(), x.cos()], dim=1).float()


def ref_resample(grid_rows: torch.Tensor, old: tuple[int, int], new: tuple[int, int], mode: str,
                 antialias: bool = False) -> torch.Tensor:
    """(new gh*gw, D) from (old gh*gw, D) by F.interpolate of the (1, D, gh, gw) image."""
    d = grid_rows.shape[-1]
    img = grid_rows.reshape(1, *old, d).permute(0, 3, 1, 2)
    out = F.interpolate(img, size=new, mode=mode, antialias=antialias)
    return out.permute(0, 2, 3, 1).reshape(-1, d)


@pytest.fixture
def x32() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32)


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
    with pytest.raises(TypeError, match="ViTConfig, HybridConfig or BiTConfig"):
        vitlab.build_model({"kind": "vit"})


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


# ---------------------------------------------------------------------------------------------- checkpoints


def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize("make", [tiny_vit, tiny_hybrid, tiny_bit, lambda: tiny_vit(pos_embed="sincos", readout="avg"),
                                  lambda: tiny_vit(pos_embed="none")])
def test_checkpoint_round_trip_is_exact(tmp_path, make, x32):
    model = make()
    out = vitlab.save_checkpoint(model, tmp_path / "ckpt", extra={"epoch": 3, "note": "hi"})
    assert out == tmp_path / "ckpt"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    loaded = vitlab.load_model(out)
    assert not loaded.training
    assert loaded.vitlab_config == model.vitlab_config
    assert torch.equal(outputs(loaded, x32), outputs(model, x32))
    assert loaded.vitlab_checkpoint["epoch"] == 3 and loaded.vitlab_checkpoint["note"] == "hi"
    assert loaded.vitlab_checkpoint["path"] == str(out)
    assert resolve_data_config({}, model=loaded) == resolve_data_config({}, model=model)


def test_checkpoint_keeps_custom_preprocessing(tmp_path):
    pre = Preprocess(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6), interpolation="bilinear", crop_pct=0.9)
    model = vitlab.build_model(vit_config("Ti/4", img_size=32, depth=1, preprocess=pre))
    loaded = vitlab.load_model(vitlab.save_checkpoint(model, tmp_path / "c"))
    assert loaded.vitlab_config.preprocess == pre
    cfg = resolve_data_config({}, model=loaded)
    assert (cfg["mean"], cfg["std"], cfg["interpolation"], cfg["crop_pct"]) == (pre.mean, pre.std, "bilinear", 0.9)


def test_checkpoint_loads_from_either_file(tmp_path, x32):
    model = tiny_vit()
    d = vitlab.save_checkpoint(model, tmp_path / "c")
    for p in (d / "config.json", d / "model.safetensors", str(d)):
        assert torch.equal(outputs(vitlab.load_model(p), x32), outputs(model, x32))


def test_checkpoint_in_float16(tmp_path, x32):
    model = tiny_vit()
    d = vitlab.save_checkpoint(model, tmp_path / "c", dtype=torch.float16)
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    loaded = vitlab.load_model(d)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(outputs(loaded, x32), outputs(model, x32), atol=2e-2, rtol=2e-2)


def test_checkpoint_files_are_plain_json_and_safetensors(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    meta = json.loads((d / "config.json").read_text())
    assert meta["format"] == "vitlab-checkpoint" and meta["config"]["kind"] == "vit"
    assert (d / "model.safetensors").read_bytes()[8:9] == b"{"  # safetensors header, not a pickle


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, x32):
    first, second = tiny_vit(), tiny_vit()
    d = vitlab.save_checkpoint(first, tmp_path / "c", extra={"v": 1})

    def broken_save(state, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(vm, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        vitlab.save_checkpoint(second, d, extra={"v": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no temporary folders left behind
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 1
    assert torch.equal(outputs(loaded, x32), outputs(first, x32))


def test_failed_final_rename_restores_the_previous_checkpoint(tmp_path, monkeypatch, x32):
    first = tiny_vit()
    d = vitlab.save_checkpoint(first, tmp_path / "c", extra={"v": 1})
    real_replace = os.replace

    def replace(src, dst):
        if ".tmp." in Path(src).name:
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(vm.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        vitlab.save_checkpoint(tiny_vit(), d, extra={"v": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 1
    assert torch.equal(outputs(loaded, x32), outputs(first, x32))


def test_save_replaces_a_previous_checkpoint(tmp_path, x32):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"v": 1})
    second = tiny_vit(readout="avg")
    vitlab.save_checkpoint(second, d, extra={"v": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # the old copy is gone too
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 2
    assert torch.equal(outputs(loaded, x32), outputs(second, x32))


def test_save_refuses_to_replace_other_folders(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="non-empty folder"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "results")
    assert (tmp_path / "results" / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    vitlab.save_checkpoint(tiny_vit(), tmp_path / "empty")  # an empty folder is fine


def test_save_rejects_bad_extra_before_writing(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"config": {}})
    with pytest.raises(ValueError, match="JSON"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"t": torch.zeros(1)})
    assert list(tmp_path.iterdir()) == []


def test_save_needs_a_vitlab_model(tmp_path):
    with pytest.raises(ValueError, match="no vitlab config"):
        vitlab.save_checkpoint(tiny_timm("vit_tiny_patch16_224", img_size=32), tmp_path / "c")


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "no 'config' entry"),
    ('{"config": {"kind": "mlp"}}', "kind='mlp'"),
    ('{"config": {"kind": "vit", "depth": 0}}', "invalid.*depth"),
    ('{"config": {"kind": "vit", "colour": 1}}', "unknown fields"),
    ('{"format_version": 99, "config": {"kind": "vit"}}', "newer"),
])
def test_damaged_config_is_a_clear_error(tmp_path, text, match):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    (d / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match=match):
        vitlab.load_model(d)


def test_weights_from_another_model_are_a_clear_error(tmp_path):
    a = vitlab.save_checkpoint(tiny_vit(), tmp_path / "a")
    b = vitlab.save_checkpoint(vitlab.build_model(vit_config("Ti/4", img_size=32, depth=2, num_classes=10)),
                               tmp_path / "b")
    c = vitlab.save_checkpoint(vitlab.build_model(vit_config("Ti/4", img_size=48, depth=3, num_classes=10)),
                               tmp_path / "c")
    os.replace(b / "model.safetensors", a / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"does not match its config.json: missing \['blocks.2"):
        vitlab.load_model(a)
    os.replace(c / "model.safetensors", a / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"shape mismatches \['pos_embed: file \(1, 145, 192\) vs model \(1, 65"):
        vitlab.load_model(a)


def test_truncated_weights_are_a_clear_error(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="could not be read.*damaged"):
        vitlab.load_model(d)


def test_folder_without_checkpoint_files(tmp_path):
    (tmp_path / "c").mkdir()
    with pytest.raises(ModelLoadError, match="not a vitlab checkpoint.*config.json.*model.safetensors"):
        vitlab.load_model(tmp_path / "c")


# ---------------------------------------------------------------------------------------------- load_model


def test_default_model_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(vm, "DEFAULT_CHECKPOINT", tmp_path / "vit_cifar10")
    with pytest.raises(ModelLoadError, match="embedded default model is not in this checkout.*vitlab train"):
        vitlab.load_model()


def test_default_model_loads_when_shipped(tmp_path, monkeypatch, x32):
    model = tiny_vit()
    monkeypatch.setattr(vm, "DEFAULT_CHECKPOINT", vitlab.save_checkpoint(model, tmp_path / "vit_cifar10"))
    assert torch.equal(outputs(vitlab.load_model(), x32), outputs(model, x32))


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    """An empty hub cache, so the only way to the weights would be the network."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_offline_env_gives_clear_error(monkeypatch, no_hub_cache):
    """HF_HUB_OFFLINE set after huggingface_hub was imported (as in a notebook) is honoured, and explained."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        vitlab.load_model("vit_tiny_patch16_224", depth=1, img_size=32)
    msg = str(err.value)
    assert "offline" in msg and "weights=" in msg and "pretrained=False" in msg
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # restored afterwards


def test_unreachable_hub_gives_clear_error(monkeypatch, no_hub_cache):
    calls = []

    def no_network(*args, **kwargs):
        calls.append(kwargs.get("filename"))
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(timm.models._hub, "hf_hub_download", no_network)
    with pytest.raises(ModelLoadError, match=r"offline.*weights='path/to/model.safetensors'"):
        vitlab.load_model("vit_tiny_patch16_224", depth=1, img_size=32)
    assert calls  # the failure came from the (patched) download, not from somewhere else


def test_other_timm_failures_are_not_called_offline():
    with pytest.raises(ModelLoadError, match="timm could not build.*bogus") as err:
        vitlab.load_model("vit_tiny_patch16_224", pretrained=False, bogus=1)
    assert "offline" not in str(err.value)


def test_random_timm_model(x32):
    model = vitlab.load_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, num_classes=4)
    assert not model.training
    assert model(x32).shape == (2, 4)


@pytest.fixture
def timm_file(tmp_path) -> tuple[nn.Module, Path]:
    """A 10-class, 2-block ViT-Ti/16 at 32 px saved as a plain timm state dict in safetensors."""
    model = tiny_timm("vit_tiny_patch16_224", img_size=32, num_classes=10)
    path = tmp_path / "weights.safetensors"
    save_file(model.state_dict(), str(path))
    return model, path


def test_local_weights_file_for_a_timm_name(timm_file, x32):
    model, path = timm_file
    for kwargs in ({}, {"num_classes": 10}):  # the file's own class count is kept either way
        loaded = vitlab.load_model("vit_tiny_patch16_224", weights=path, depth=2, img_size=32, **kwargs)
        assert not loaded.training
        assert torch.equal(outputs(loaded, x32), outputs(model, x32))


def test_local_weights_file_with_a_new_head(timm_file, x32):
    model, path = timm_file
    loaded = vitlab.load_model("vit_tiny_patch16_224", weights=path, depth=2, img_size=32, num_classes=5)
    assert loaded.head.out_features == 5
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(x32), model.forward_features(x32))


def test_local_pth_file_is_read_without_pickle(tmp_path, x32):
    model = tiny_timm("vit_tiny_patch16_224", img_size=32, num_classes=10)
    path = tmp_path / "weights.pth"
    torch.save(model.state_dict(), path)
    loaded = vitlab.load_model("vit_tiny_patch16_224", weights=path, depth=2, img_size=32)
    assert torch.equal(outputs(loaded, x32), outputs(model, x32))


def test_local_weights_file_problems(timm_file, tmp_path):
    _, path = timm_file
    with pytest.raises(ModelLoadError, match="could not load .* into timm model"):
        vitlab.load_model("vit_tiny_patch16_224", weights=path, depth=3, img_size=32)
    with pytest.raises(ModelLoadError, match="does not exist"):
        vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path / "missing.safetensors")
    with pytest.raises(ModelLoadError, match="weights= is for timm model names"):
        vitlab.load_model(vit_config("Ti/4", img_size=32), weights=path)


def test_unknown_timm_name_suggests_similar_names():
    with pytest.raises(ModelLoadError, match="neither a file nor a timm model name.*vit_base_patch16_224"):
        vitlab.load_model("vit_bsae_patch16_224")


def test_unknown_pretrained_tag_lists_the_tags():
    with pytest.raises(ModelLoadError, match="no pretrained tag 'nope'.*augreg_in21k_ft_in1k"):
        vitlab.load_model("vit_tiny_patch16_224.nope")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        vitlab.load_model(tmp_path / "nothing")
    with pytest.raises(ModelLoadError, match="does not exist"):
        vitlab.load_model("runs/model.safetensors")


def test_config_spec_with_overrides(x32):
    model = vitlab.load_model(vit_config("Ti/4", img_size=32, depth=1), num_classes=3)
    assert not model.training and model(x32).shape == (2, 3)
    with pytest.raises(ModelLoadError, match="no field"):
        vitlab.load_model(vit_config("Ti/4", img_size=32, depth=1), colour=1)


def test_checkpoint_ignores_no_option_silently(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    with pytest.raises(ModelLoadError, match="resize_for_finetuning"):
        vitlab.load_model(d, num_classes=3)


# ---------------------------------------------------------------------------------------------- resize


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("size, grid", [(48, (12, 12)), ((32, 64), (8, 16))])
def test_resize_interpolates_position_embeddings(mode, size, grid):
    model = tiny_vit()
    old = model.pos_embed.detach().clone()  # (1, 1 + 64, D)
    vitlab.resize_for_finetuning(model, size, interpolation=mode)
    new = model.pos_embed
    assert new.shape == (1, 1 + grid[0] * grid[1], 192) and new.requires_grad
    assert torch.equal(new[0, 0], old[0, 0])  # the class token's row is kept
    torch.testing.assert_close(new[0, 1:], ref_resample(old[0, 1:], (8, 8), grid, mode), atol=1e-6, rtol=1e-6)


def test_resize_down_is_antialiased():
    model = tiny_vit()
    old = model.pos_embed.detach().clone()
    vitlab.resize_for_finetuning(model, 16)
    ref = ref_resample(old[0, 1:], (8, 8), (4, 4), "bicubic", antialias=True)
    torch.testing.assert_close(model.pos_embed[0, 1:], ref, atol=1e-6, rtol=1e-6)


def test_resize_to_the_same_size_is_the_identity(x32):
    model = tiny_vit()
    before, pe = outputs(model, x32), model.pos_embed.detach().clone()
    vitlab.resize_for_finetuning(model, 32)
    assert torch.equal(model.pos_embed, pe)
    assert torch.equal(outputs(model, x32), before)


def test_resize_a_frozen_model_still_interpolates():
    """A frozen learned embedding is not mistaken for the fixed sin-cos one."""
    model = tiny_vit().requires_grad_(False)
    old = model.pos_embed.detach().clone()
    vitlab.resize_for_finetuning(model, 48)
    assert not model.pos_embed.requires_grad
    torch.testing.assert_close(model.pos_embed[0, 1:], ref_resample(old[0, 1:], (8, 8), (12, 12), "bicubic"))


def test_resize_rebuilds_sincos_exactly():
    model = tiny_vit(pos_embed="sincos")
    vitlab.resize_for_finetuning(model, (48, 64))
    pe = model.pos_embed
    assert pe.shape == (1, 1 + 12 * 16, 192) and not pe.requires_grad
    assert torch.equal(pe[0, 0], torch.zeros(192))
    torch.testing.assert_close(pe[0, 1:], ref_sincos(12, 16, 192), atol=1e-5, rtol=0)


def test_resize_replaces_the_head_with_zeros():
    model = tiny_vit()
    vitlab.resize_for_finetuning(model, 48, num_classes=5)
    assert isinstance(model.head, nn.Linear) and model.head.weight.shape == (5, 192)
    logits = outputs(model, torch.randn(2, 3, 48, 48))
    assert torch.equal(logits, torch.zeros(2, 5))
    assert model.vitlab_config.img_size == 48 and model.vitlab_config.num_classes == 5
    assert resolve_data_config({}, model=model)["input_size"] == (3, 48, 48)
    assert model.pretrained_cfg["num_classes"] == 5


def test_resize_to_features_only_and_round_trip(tmp_path):
    model = tiny_vit()
    vitlab.resize_for_finetuning(model, (32, 48), num_classes=0)
    x = torch.randn(2, 3, 32, 48)
    assert outputs(model, x).shape == (2, 192)
    assert model.vitlab_config.num_classes == 0 and model.vitlab_config.img_size == (32, 48)
    loaded = vitlab.load_model(vitlab.save_checkpoint(model, tmp_path / "c"))
    assert torch.equal(outputs(loaded, x), outputs(model, x))
    assert resolve_data_config({}, model=loaded)["input_size"] == (3, 32, 48)


def test_resize_keeps_the_model_trainable():
    model = tiny_vit().train()
    vitlab.resize_for_finetuning(model, 48, num_classes=5)
    loss = F.cross_entropy(model(torch.randn(2, 3, 48, 48)), torch.tensor([0, 1]))
    loss.backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0


def test_resize_hybrid_grows_the_grid_with_the_image(tmp_path):
    model = tiny_hybrid()
    old = model.pos_embed.detach().clone()
    vitlab.resize_for_finetuning(model, 48, num_classes=3)
    assert model.patch_embed.grid_size == (12, 12)
    assert vitlab.model_info(model).grid_size == (12, 12)
    torch.testing.assert_close(model.pos_embed[0, 1:], ref_resample(old[0, 1:], (8, 8), (12, 12), "bicubic"))
    x = torch.randn(2, 3, 48, 48)
    assert model.forward_features(x).shape == (2, 1 + 144, 192)
    assert torch.equal(outputs(model, x), torch.zeros(2, 3))
    loaded = vitlab.load_model(vitlab.save_checkpoint(model, tmp_path / "c"))
    assert torch.equal(outputs(loaded, x), outputs(model, x))


def test_resize_timm_distilled_model():
    model = tiny_timm("deit_tiny_distilled_patch16_224", img_size=32)
    old = model.pos_embed.detach().clone()  # (1, 2 + 4, D)
    vitlab.resize_for_finetuning(model, 64, num_classes=7)
    assert torch.equal(model.pos_embed[0, :2], old[0, :2])
    torch.testing.assert_close(model.pos_embed[0, 2:], ref_resample(old[0, 2:], (2, 2), (4, 4), "bicubic"))
    assert torch.equal(model.head_dist.weight, torch.zeros(7, 192))
    assert torch.equal(outputs(model, torch.randn(1, 3, 64, 64)), torch.zeros(1, 7))


def test_resize_timm_registers_without_prefix_rows():
    model = tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56)
    old = model.pos_embed.detach().clone()  # (1, 16, D): no rows for the class and register tokens
    vitlab.resize_for_finetuning(model, 84)
    torch.testing.assert_close(model.pos_embed[0], ref_resample(old[0], (4, 4), (6, 6), "bicubic"))
    assert model.forward_features(torch.randn(1, 3, 84, 84)).shape == (1, 5 + 36, 384)


def test_resize_rejects_bad_sizes_without_changing_the_model():
    model = tiny_vit()
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        vitlab.resize_for_finetuning(model, 30)
    with pytest.raises(ValueError, match="img_size"):
        vitlab.resize_for_finetuning(model, 0)
    assert model.patch_embed.grid_size == (8, 8) and model.pos_embed.shape == (1, 65, 192)
    with pytest.raises(TypeError, match="needs a timm VisionTransformer.*ResNetV2"):
        vitlab.resize_for_finetuning(tiny_bit(), 64)


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
    with pytest.raises(ValueError, match="multiple of 32"):
        BiTConfig(layers=(2, 2), channels=(48, 96))
    with pytest.raises(ValueError, match="one width per stage"):
        BiTConfig(layers=(2, 2), channels=(64,))
