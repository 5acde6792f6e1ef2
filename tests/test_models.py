"""load_model (vitlab.models.load): the default model, timm names, local weights files, offline hubs."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest
import timm
import timm.models._hub
import torch
from conftest import outputs, tiny_timm, tiny_vit
from safetensors.torch import save_file
from torch import nn

import vitlab
import vitlab.models.load as vm
from vitlab import ModelLoadError, vit_config
from vitlab.base.errors import Placeholder, Setting


def test_default_model_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(vm, "DEFAULT_CHECKPOINT", tmp_path / "vit_cifar10")
    with pytest.raises(ModelLoadError, match="vitlab train --preset vit_cifar10"):  # what the user runs
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
    with pytest.raises(ModelLoadError, match="offline") as e:
        vitlab.load_model("vit_tiny_patch16_224", depth=1, img_size=32)
    assert (e.value.param, e.value.value) == ("spec", "vit_tiny_patch16_224")
    assert e.value.fix == ((Setting("spec", "vit_tiny_patch16_224"),
                            Setting("weights", Placeholder("path/to/model.safetensors"))), Setting("pretrained", False))
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
    with pytest.raises(ModelLoadError) as e:
        vitlab.load_model(vit_config("Ti/4", img_size=32), weights=path)
    assert (e.value.param, e.value.value, e.value.fix) == ("weights", str(path), (Setting("weights", None),))
    # an empty file (a failed download) said '(EOFError: )', with nothing after the colon and no way on
    for name in ("empty.pth", "empty.safetensors"):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(ModelLoadError, match=rf"{name} \(\w+(: [^)]+)?\): it is empty; give the model's "):
            vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path / name)
    (tmp_path / "junk.pth").write_bytes(b"not a state dict")
    with pytest.raises(ModelLoadError, match=r"junk.pth \(.+\): it is damaged or not a weights file"):
        vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path / "junk.pth")



def test_a_weights_file_that_does_not_fit_is_refused_even_with_a_new_head(timm_file, tmp_path, x32):
    """With num_classes given timm loads non-strictly; only the classifier may be missing from the file: a block
    left out or a stray tensor is an error, not a model with random layers. A headless file takes a new head."""
    from safetensors.torch import load_file

    model, path = timm_file
    state = load_file(str(path))
    headless = {k: v for k, v in state.items() if not k.startswith("head.")}
    save_file(headless, str(tmp_path / "headless.safetensors"))
    loaded = vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path / "headless.safetensors", depth=2,
                               img_size=32, num_classes=10)
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(x32), model.forward_features(x32))
    broken = {k: v for k, v in headless.items() if not k.startswith("blocks.1.")} | {"junk.weight": torch.ones(2)}
    save_file(broken, str(tmp_path / "broken.safetensors"))
    with pytest.raises(ModelLoadError, match=r"does not fit .* missing from the file \(blocks\.1\..*junk\.weight"):
        vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path / "broken.safetensors", depth=2, img_size=32,
                          num_classes=10)


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
    wider = vitlab.load_model(vit_config("Ti/4", img_size=32, depth=1), embed_dim=256, num_heads=4)  # together
    assert (wider.embed_dim, wider.blocks[0].attn.num_heads) == (256, 4)
    with pytest.raises(ModelLoadError, match="embed_dim=256 must be divisible by num_heads=3"):
        vitlab.load_model(vit_config("Ti/4", img_size=32, depth=1), embed_dim=256)
    with pytest.raises(ModelLoadError, match="ViTConfig has no field 'colour'.*its fields: .*depth"):
        vitlab.load_model(vit_config("Ti/4", img_size=32, depth=1), colour=1)
    hybrid = vitlab.HybridConfig(vit=vit_config("Ti/4", img_size=32, depth=1, patch_size=2), layers=(1, 1),
                                 stem="cifar")
    deeper = vitlab.load_model(hybrid, **{"vit.depth": 2, "vit.num_classes": 3})  # a dotted name reaches a nested group
    assert len(deeper.blocks) == 2 and deeper(x32).shape == (2, 3)
    with pytest.raises(ModelLoadError, match="vit is a group of settings"):
        vitlab.load_model(hybrid, vit=2)


def test_every_model_config_loads_and_any_other_spec_is_a_model_load_error(x32):
    """The CNN teacher's CifarNetConfig is a model config like the others (a raw TypeError from os.fspath before);
    a spec of no kind at all is a ModelLoadError naming what is accepted."""
    cnn = vitlab.load_model(vitlab.models.config.CifarNetConfig(widths=(8, 16, 16), num_classes=3), num_classes=4)
    assert not cnn.training and cnn(x32).shape == (2, 4)
    for spec in (3, ["vit_tiny_patch16_224"]):
        with pytest.raises(ModelLoadError, match=r"a timm name, a path or a config \(.*CifarNetConfig\), got"):
            vitlab.load_model(spec)


def test_checkpoint_ignores_no_option_silently(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    with pytest.raises(ModelLoadError, match="resize_for_finetuning"):
        vitlab.load_model(d, num_classes=3)


def test_pretrained_false_is_never_silently_ignored(timm_file, tmp_path):
    """A checkpoint (or the default) always loads its saved weights, and a weights file is pretrained weights:
    asking for random weights there is an error, not trained weights handed back."""
    _, path = timm_file
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    for spec in (None, str(ck)):
        with pytest.raises(ModelLoadError) as e:
            vitlab.load_model(spec, pretrained=False)
        assert (e.value.param, e.value.value) == ("pretrained", False)
    with pytest.raises(ModelLoadError, match="contradicts a weights file"):
        vitlab.load_model("vit_tiny_patch16_224", weights=path, pretrained=False, depth=2, img_size=32)
