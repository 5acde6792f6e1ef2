"""Fine-tuning at another resolution (vitlab.models.finetune): position embeddings against F.interpolate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import outputs, ref_sincos, tiny_bit, tiny_hybrid, tiny_timm, tiny_vit
from timm.data import resolve_data_config
from torch import nn

import vitlab
from vitlab.models.finetune import resample_grid


def ref_resample(grid_rows: torch.Tensor, old: tuple[int, int], new: tuple[int, int], mode: str) -> torch.Tensor:
    """(new gh*gw, D) from (old gh*gw, D) by F.interpolate of the (1, D, gh, gw) image, antialiased where
    F.interpolate can be (bilinear, bicubic), as timm's resample_abs_pos_embed by default."""
    d = grid_rows.shape[-1]
    img = grid_rows.reshape(1, *old, d).permute(0, 3, 1, 2)
    out = F.interpolate(img, size=new, mode=mode, antialias=mode in ("bilinear", "bicubic"))
    return out.permute(0, 2, 3, 1).reshape(-1, d)


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
    ref = ref_resample(old[0, 1:], (8, 8), (4, 4), "bicubic")
    torch.testing.assert_close(model.pos_embed[0, 1:], ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows, old, new, problem", [
    ((1, 10, 8), (4, 4), (8, 8), r"\(4, 4\) grid \(16 rows\), got shape \(1, 10, 8\)"),  # was (1, 40, 8) of noise
    ((1, 17, 8), (4, 4), (4, 4), r"got shape \(1, 17, 8\)"),  # a class row left in: was returned as it came
    ((16, 8), (4, 4), (8, 8), r"got shape \(16, 8\)"),
    ((1, 16, 8), (4, 4), (0, 8), "new_grid must be"),
])
def test_resample_grid_refuses_rows_that_are_not_the_grid(rows, old, new, problem):
    with pytest.raises(ValueError, match=problem):
        resample_grid(torch.randn(rows), old, new)


def test_position_similarity_at_a_grid_is_that_of_the_model_fine_tuned_there():
    """The position-embedding panel resampled to a grid (timm's resampling) shows what fine-tuning there gives."""
    from vitlab.inspect.positions import position_embedding_similarity

    model = tiny_vit()
    at_grid = position_embedding_similarity(model, grid=(12, 16))
    vitlab.resize_for_finetuning(model, (48, 64))
    torch.testing.assert_close(position_embedding_similarity(model), at_grid, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("src", [(32, 48), (32, 32)])
@pytest.mark.parametrize("size", [(64, 96), (16, 32)])
def test_resize_equals_timm_at_the_new_size(src, size):
    """A timm ViT (class and register tokens, square and non-square grids) resized up or down here has the
    position embeddings timm gives the same weights at that size: its own set_input_size, and for a square source
    grid the checkpoint filter it loads weights at another img_size with (load_model(name, weights=, img_size=))."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    model = tiny_timm("vit_tiny_patch16_224", img_size=src, reg_tokens=2, num_classes=3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    theirs = tiny_timm("vit_tiny_patch16_224", img_size=src, reg_tokens=2, num_classes=3)
    theirs.load_state_dict(state)
    theirs.set_input_size(img_size=size)
    vitlab.resize_for_finetuning(model, size)
    assert model.pos_embed.shape == (1, 3 + size[0] // 16 * size[1] // 16, 192)
    torch.testing.assert_close(model.pos_embed, theirs.pos_embed, atol=1e-6, rtol=1e-6)
    if src[0] == src[1]:  # timm's filter takes the old grid for a square one
        loaded = tiny_timm("vit_tiny_patch16_224", img_size=size, reg_tokens=2, num_classes=3)
        torch.testing.assert_close(model.pos_embed, checkpoint_filter_fn(state, loaded)["pos_embed"], atol=1e-6,
                                   rtol=1e-6)


def test_resize_to_the_same_size_is_the_identity(x32):
    model = tiny_vit()
    before, pe = outputs(model, x32), model.pos_embed.detach().clone()
    vitlab.resize_for_finetuning(model, 32)
    assert torch.equal(model.pos_embed, pe)
    assert torch.equal(outputs(model, x32), before)


def test_resize_names_a_size_that_is_no_int_or_pair():
    """img_size=64.0 failed with "'float' object is not iterable" from inside the size check; now the check names
    it, and the model is left as it was."""
    model = tiny_vit()
    pe = model.pos_embed.detach().clone()
    for bad in (64.0, None):
        with pytest.raises(ValueError, match=rf"img_size must be a positive int or a pair \(H, W\) of positive ints, "
                                             rf"got {bad!r}"):
            vitlab.resize_for_finetuning(model, bad)
    assert torch.equal(model.pos_embed, pe)


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


def test_resize_rebuilds_a_timm_models_sincos_table_behind_its_class_row():
    """Without a vitlab config the sin-cos table is recognised in pos_embed's patch rows (the last gh*gw, after the
    class token's row) and rebuilt exactly for the new grid, not blurred by interpolation."""
    from timm.models import VisionTransformer

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, num_classes=10)
    with torch.no_grad():
        model.pos_embed[0, 1:] = ref_sincos(4, 4, 64)
    row = model.pos_embed[0, 0].detach().clone()
    vitlab.resize_for_finetuning(model, 48)
    assert torch.equal(model.pos_embed[0, 0], row)
    torch.testing.assert_close(model.pos_embed[0, 1:], ref_sincos(6, 6, 64), atol=1e-5, rtol=0)


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
    with pytest.raises(ValueError, match=r"img_size \(32, 30\) is not a multiple"):  # the width alone
        vitlab.resize_for_finetuning(model, (32, 30))
    with pytest.raises(ValueError, match="img_size"):
        vitlab.resize_for_finetuning(model, 0)
    assert model.patch_embed.grid_size == (8, 8) and model.pos_embed.shape == (1, 65, 192)
    with pytest.raises(TypeError, match="needs a timm VisionTransformer.*ResNetV2"):
        vitlab.resize_for_finetuning(tiny_bit(), 64)


@pytest.mark.parametrize("num_classes", [True, False])
def test_resize_refuses_a_boolean_class_count_before_changing_the_model(num_classes, x32):
    # True passed the int check and failed in timm's reset_classifier after the grid and position table had changed
    # (a model half-resized, num_classes=True); False silently removed the head (0 classes)
    model = tiny_vit().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    y = model(x32)
    with pytest.raises(ValueError, match=f"num_classes must be an int >= 0 .*got {num_classes}"):
        vitlab.resize_for_finetuning(model, 48, num_classes=num_classes)
    assert model.patch_embed.grid_size == (8, 8) and model.num_classes == 10
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(x32), y, atol=0, rtol=0)


def test_resize_rejects_a_bad_interpolation_and_leaves_a_failed_resize_undone(x32):
    """A misspelt mode is refused before anything changes; a failure after the patch embedding took the new size
    (here a position table whose rows do not match the grid) puts the input size back, so the model still runs."""
    model = tiny_vit().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    y = model(x32)
    with pytest.raises(ValueError, match=r"interpolation must be one of .*'bicubic'.* got 'bicubc'"):
        vitlab.resize_for_finetuning(model, 48, interpolation="bicubc")
    assert model.patch_embed.img_size == (32, 32) and model.patch_embed.grid_size == (8, 8)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(x32), y, atol=0, rtol=0)
    with pytest.raises(ValueError, match="interpolation must be one of"):
        resample_grid(model.pos_embed[:, 1:], (8, 8), (12, 12), "cubic")
    model.pos_embed = nn.Parameter(model.pos_embed.detach()[:, :-1])  # 64 rows for 1 prefix + an 8 x 8 grid
    with pytest.raises(ValueError, match="pos_embed has 64 rows"):
        vitlab.resize_for_finetuning(model, 48)
    assert model.patch_embed.img_size == (32, 32) and model.patch_embed.grid_size == (8, 8)
    assert model.pos_embed.shape == (1, 64, 192)


def test_a_new_head_leaves_the_callers_random_state_as_it_was():
    # timm's reset_classifier draws the new head's weights from torch's global generator before they are zeroed: a
    # seeded fine-tuning run then drew different dropout and augmentation than one seeded after the resize
    model = tiny_vit()
    torch.manual_seed(0)
    state = torch.get_rng_state()
    vitlab.resize_for_finetuning(model, 48, num_classes=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.head.out_features == 5 and not model.head.weight.any() and not model.head.bias.any()


def test_a_model_resize_cannot_take_says_what_to_do_instead():
    """resize_for_finetuning said only 'needs a timm VisionTransformer, got DataParallel' (or Eva): the message now
    names the module a wrapper holds (resize that, wrap again) and timm's own set_input_size for Eva-like models."""
    import timm

    from vitlab.models.finetune import resize_for_finetuning

    wrapped = torch.nn.DataParallel(vitlab.load_model())
    with pytest.raises(TypeError, match="got DataParallel: resize the VisionTransformerDistilled it wraps, then wrap"):
        resize_for_finetuning(wrapped, 64)
    assert wrapped.module.patch_embed.img_size == (32, 32)  # untouched
    eva = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=1)
    with pytest.raises(TypeError, match="got Eva; Eva has timm's own set_input_size"):
        resize_for_finetuning(eva, 64)
