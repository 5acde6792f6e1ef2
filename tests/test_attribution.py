"""Class-specific maps and their faithfulness scores: known answers and independent computations."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.stats
import torch
from _reference import reference_gradient_rollout
from conftest import tiny_hybrid, tiny_vit

import vitlab
from vitlab.inspect.attribution import (
    ATTRIBUTION_METHODS,
    gradient_rollout,
    integrated_gradients,
    occlusion,
    patch_mask,
)
from vitlab.inspect.faithfulness import (
    deletion_insertion,
    localisation,
    randomization_sanity,
    randomized_copy,
    rank_correlation,
)


def _untouched(model: torch.nn.Module, flags: list[bool]) -> None:
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())


def test_patch_mask_tiles_the_image_row_major():
    info = vitlab.model_info(tiny_vit())
    mask = patch_mask(info)[0, 0]
    assert mask.shape == (32, 32)
    assert mask[0, 0] == 0 and mask[0, 4] == 1 and mask[4, 0] == 8 and mask[31, 31] == 63
    assert torch.equal(torch.bincount(mask.flatten()), torch.full((64,), 16))


def test_patch_mask_of_non_square_patches_is_patch_high_and_patch_wide():
    """A 4 px high, 2 px wide patch covers 4 rows and 2 columns: an 8 x 8 image is a 2 x 4 grid of them."""
    from timm.models import VisionTransformer

    model = VisionTransformer(img_size=8, patch_size=(4, 2), embed_dim=16, depth=1, num_heads=2, num_classes=3)
    mask = patch_mask(vitlab.model_info(model))[0, 0]
    row = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert torch.equal(mask, torch.stack([row] * 4 + [row + 4] * 4))


def test_gradient_rollout_equals_product_of_identity_plus_weighted_attention():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    flags = [p.requires_grad for p in model.parameters()]
    target = torch.tensor([3, 7])
    out = gradient_rollout(model, x, target)
    _untouched(model, flags)
    R = reference_gradient_rollout(model, x, target)  # independent: (I+A_L)...(I+A_1), per-layer own gradients
    np.testing.assert_allclose(out.numpy(), R[:, 0, 1:].reshape(2, 8, 8).float().detach().numpy(), rtol=1e-4,
                               atol=1e-7)
    assert not torch.allclose(out, gradient_rollout(model, x, torch.tensor([0, 1])))  # class-specific


def test_gradient_rollout_without_class_token_and_on_a_hybrid():
    m, x = tiny_vit(readout="avg"), torch.randn(2, 3, 32, 32)
    out = gradient_rollout(m, x, torch.tensor([2, 2]))
    R = reference_gradient_rollout(m, x, torch.tensor([2, 2]))  # independent; the readout: mean of patch rows
    np.testing.assert_allclose(out.numpy(), R.mean(1).reshape(2, 8, 8).float().detach().numpy(), rtol=1e-4,
                               atol=1e-7)
    assert gradient_rollout(tiny_hybrid(), torch.randn(1, 3, 32, 32)).shape == (1, 8, 8)


def test_integrated_gradients_is_complete():
    """IG's completeness axiom: the patch attributions sum to logit(x) - logit(baseline)."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    flags = [p.requires_grad for p in model.parameters()]
    target = torch.tensor([1, 4])
    out = integrated_gradients(model, x, target, steps=128)
    _untouched(model, flags)
    with torch.no_grad():
        diff = model(x)[torch.arange(2), target] - model(torch.zeros_like(x))[torch.arange(2), target]
    np.testing.assert_allclose(out.flatten(1).sum(1).numpy(), diff.numpy(), rtol=0.02, atol=2e-3)


def test_occlusion_is_the_logit_drop_of_each_patch():
    model, x = tiny_vit(), torch.randn(1, 3, 32, 32)
    out = occlusion(model, x, target=5)
    assert out.shape == (1, 8, 8)
    with torch.no_grad():
        full = model(x)[0, 5]
        for r, c in [(0, 0), (3, 6), (7, 7)]:
            y = x.clone()
            y[..., 4 * r:4 * r + 4, 4 * c:4 * c + 4] = 0
            assert out[0, r, c].item() == pytest.approx((full - model(y)[0, 5]).item(), abs=1e-5)


def test_target_is_checked():
    with pytest.raises(ValueError, match="one per image"):
        gradient_rollout(tiny_vit(), torch.randn(2, 3, 32, 32), torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("method", ["gradient rollout", "integrated gradients", "occlusion"])
def test_class_indices_are_whole_numbers_within_the_head(method):
    """Out-of-range or fractional classes are refused by name with the valid range (they gave a raw index error,
    a device-side assert on CUDA, or were silently truncated: 2.7 -> 2); whole floats and ints are classes."""
    fn, model, x = ATTRIBUTION_METHODS[method], tiny_vit(), torch.randn(2, 3, 32, 32)  # 10 classes
    for bad, named in ((10, "target 10"), (-1, "target -1"), (torch.tensor([3, 10]), r"target\[1\] = 10"),
                       (torch.tensor([-2, 12]), r"target\[0\] = -2, target\[1\] = 12")):
        with pytest.raises(ValueError, match=named + r": not a class index of this model, which has 10 classes "
                                                     r"\(valid: 0 to 9\)"):
            fn(model, x, bad)
    for bad, named in ((2.7, "target 2.7"), (torch.tensor([1.0, 2.5]), r"target\[1\] = 2.5"),
                       (float("nan"), "target nan")):
        with pytest.raises(ValueError, match="target must be whole class indices, got " + named):
            fn(model, x, bad)
    with pytest.raises(ValueError, match="integers"):
        fn(model, x, torch.tensor([True, False]))
    torch.testing.assert_close(fn(model, x, 9), fn(model, x, torch.tensor([9.0, 9.0])))


@pytest.mark.parametrize("method", [integrated_gradients, occlusion])
def test_a_baseline_that_is_no_number_is_named(method):
    """baseline="blur" (deletion_insertion's) reached captum's bare AssertionError; now a ValueError says what a
    baseline is here."""
    with pytest.raises(ValueError, match=r"baseline must be a number in the model's input space \(0 = the "
                                         r"normalisation mean, a grey image\), got 'blur'"):
        method(tiny_vit(), torch.randn(1, 3, 32, 32), 3, baseline="blur")


def test_a_class_name_or_ragged_list_as_target_is_named():
    """target="cat" failed in torch.as_tensor with "new(): invalid data type 'str'"; now a ValueError names it."""
    for bad in ("cat", [[1], [2, 3]]):
        with pytest.raises(ValueError, match=r"target must be a class index, one per image, or None for the model's "
                                             r"prediction, got " + re.escape(repr(bad))):
            gradient_rollout(tiny_vit(), torch.randn(2, 3, 32, 32), bad)


def test_sanity_and_localisation_name_maps_of_the_wrong_shape():
    """An ``original`` map of other images failed in spearman's bare size mismatch and localisation of one (gh, gw)
    map in a tuple unpacking; both now name the (B, gh, gw) shape they need."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"maps must have shape \(B, gh, gw\) = \(2, 8, 8\) for these images, got "
                                         r"\(2, 4, 4\)"):
        randomization_sanity("rollout", model, x, original=torch.rand(2, 4, 4))
    with pytest.raises(ValueError, match=r"maps must be \(B, gh, gw\), one map per image, got shape \(8, 8\); pass "
                                         r"maps\[None\] for one image"):
        localisation(torch.rand(8, 8), torch.ones(1, 32, 32, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------- faithfulness


def test_localisation_counts_only_the_positive_mass_of_a_map():
    """Negative map values (a signed attribution) carry no mass: a map whose only positive patch is off the object
    puts 0 of its mass on it, whatever negative value lies on the object."""
    maps = torch.tensor([[[1.0, -1.0], [0.0, 0.0]]])
    masks = torch.zeros(1, 4, 4, dtype=torch.bool)
    masks[0, :2, 2:] = True  # the object fills patch (0, 1), where the map is -1
    r = localisation(maps, masks)
    assert r["mass_in_mask"].item() == 0.0 and r["chance"].item() == 0.25 and r["pointing"].item() == 0.0

def test_deletion_insertion_changes_the_rounded_share_of_patches_at_each_step():
    """Step s of ``steps`` changes round(s / steps * N) patches: 64 patches in 5 steps are 0, 13, 26, 38, 51, 64."""
    model, x = tiny_vit(), torch.randn(1, 3, 32, 32)
    r = deletion_insertion(model, x, torch.rand(1, 8, 8), steps=5, baseline=0.0)
    torch.testing.assert_close(r["fraction"], torch.tensor([0, 13, 26, 38, 51, 64]) / 64)

def test_deletion_insertion_curves_end_at_the_image_and_the_baseline():
    model, x = tiny_vit(), torch.randn(3, 3, 32, 32)
    maps = torch.rand(3, 8, 8)
    r = deletion_insertion(model, x, maps, steps=8, baseline=0.0, batch_size=4)  # 27 variants in chunks of 2
    with torch.no_grad():
        target = model(x).argmax(-1)
        p_img = model(x).softmax(-1)[torch.arange(3), target]
        p_base = model(torch.zeros_like(x)).softmax(-1)[torch.arange(3), target]
        # half the patches (the top 32 of each map) deleted, written out by hand
        y = x.clone()
        for b in range(3):
            for n in maps[b].flatten().argsort(descending=True, stable=True)[:32].tolist():
                y[b, :, 4 * (n // 8):4 * (n // 8) + 4, 4 * (n % 8):4 * (n % 8) + 4] = 0
        p_half = model(y).softmax(-1)[torch.arange(3), target]
    d, i = r["deletion_curve"], r["insertion_curve"]
    np.testing.assert_allclose(d[:, 0], p_img, atol=1e-5)
    np.testing.assert_allclose(i[:, -1], p_img, atol=1e-5)
    np.testing.assert_allclose(d[:, -1], p_base, atol=1e-5)
    np.testing.assert_allclose(i[:, 0], p_base, atol=1e-5)
    np.testing.assert_allclose(d[:, 4], p_half, atol=1e-5)
    np.testing.assert_allclose(r["deletion"], np.trapezoid(d.numpy(), dx=1 / 8, axis=1), atol=1e-6)
    assert ((r["insertion"] >= 0) & (r["insertion"] <= 1)).all()


def test_the_oracle_order_beats_its_reverse_on_the_shipped_model():
    """On the trained default, deleting the patches occlusion ranks highest first hurts more (lower deletion
    AUC) than deleting them last, and inserting them first helps more."""
    model = vitlab.load_model()
    from vitlab.data.images import embedded_images

    x = embedded_images(model, 8)[1]
    occ = occlusion(model, x)
    good = deletion_insertion(model, x, occ, steps=8)
    bad = deletion_insertion(model, x, -occ, steps=8)
    assert good["deletion"].mean() < bad["deletion"].mean()
    assert good["insertion"].mean() > bad["insertion"].mean()


def test_deletion_insertion_takes_targets_as_the_map_methods_do():
    """One class for every image is that class per image (an int was an AttributeError); a count or shape that is
    not one per image, and a class outside the head, are refused (3 targets for 2 images were accepted)."""
    model, x, maps = tiny_vit(), torch.randn(2, 3, 32, 32), torch.rand(2, 8, 8)
    one = deletion_insertion(model, x, maps, 3, steps=4)
    each = deletion_insertion(model, x, maps, torch.tensor([3, 3]), steps=4)
    for k in ("deletion_curve", "insertion_curve"):
        torch.testing.assert_close(one[k], each[k])
    with pytest.raises(ValueError, match=r"one per image \(2\), got shape \(3,\)"):
        deletion_insertion(model, x, maps, torch.tensor([1, 2, 3]), steps=4)
    with pytest.raises(ValueError, match=r"one per image \(2\), got shape \(2, 1\)"):
        deletion_insertion(model, x, maps, torch.tensor([[1], [2]]), steps=4)
    with pytest.raises(ValueError, match="target 10: not a class index"):
        deletion_insertion(model, x, maps, 10, steps=4)


def test_deletion_insertion_rejects_bad_maps():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="shape"):
        deletion_insertion(model, x, torch.rand(2, 4, 4))
    with pytest.raises(ValueError, match="NaN"):
        deletion_insertion(model, x, torch.full((2, 8, 8), float("nan")))


def test_a_baseline_or_step_count_is_refused_before_running_the_model():
    """An unknown baseline ("grey") was refused only after the model had predicted every image's class (target=None),
    and compare_methods(steps=0) only after that prediction and the sanity check's re-initialised copy; both are now
    refused before any forward pass."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match="baseline must be 'blur' or a number, got 'grey'"):
        deletion_insertion(model, x, torch.rand(2, 8, 8), baseline="grey")
    with pytest.raises(ValueError, match="baseline must be 'blur' or a number, got True"):  # not read as 1.0
        deletion_insertion(model, x, torch.rand(2, 8, 8), baseline=True)
    with pytest.raises(ValueError, match="steps must be a whole number of at least 1, got 0"):
        vitlab.compare_methods(model, x, steps=0)
    handle.remove()
    assert calls == []


def test_sanity_refuses_an_original_map_before_running_the_model():
    """An ``original`` map of the wrong shape was refused only after the model had predicted every image's class
    (target=None); it is now refused before any forward pass."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match=r"maps must have shape \(B, gh, gw\) = \(2, 8, 8\)"):
        randomization_sanity("rollout", model, x, original=torch.rand(2, 4, 4))
    handle.remove()
    assert calls == []


def test_rank_correlation_matches_scipy_with_ties():
    a = torch.tensor([[1.0, 2.0, 2.0, 5.0, 0.0, 3.0], [4.0, 4.0, 4.0, 1.0, 2.0, 9.0]])
    b = torch.tensor([[0.5, 1.0, 3.0, 3.0, -1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    ours = rank_correlation(a, b)
    for k in range(2):
        assert ours[k].item() == pytest.approx(scipy.stats.spearmanr(a[k], b[k]).statistic, abs=1e-6)


def test_randomized_copy_leaves_the_original_and_keeps_scales():
    model = tiny_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rand = randomized_copy(model, seed=1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    r = dict(rand.named_parameters())
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            assert not torch.equal(p, r[name])
            assert r[name].std().item() == pytest.approx(p.std().item(), rel=0.2)
        else:
            assert torch.equal(p, r[name])


def test_sanity_check_separates_model_dependent_from_model_blind_maps():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)

    def brightness(m, images, target):  # ignores the model: an edge-detector-like map
        return torch.nn.functional.avg_pool2d(images.abs().sum(1, keepdim=True), 4)[:, 0]

    np.testing.assert_allclose(randomization_sanity(brightness, model, x), 1.0, atol=1e-6)
    assert randomization_sanity(occlusion, model, x).abs().max() < 0.9


def test_sanity_takes_a_method_by_name_and_the_public_rollout():
    """attention_rollout's third argument is head_fusion, not a target: passed as it is, it is the rollout entry
    of ATTRIBUTION_METHODS, and the name works too; an unknown name is refused with the choices."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    want = randomization_sanity(ATTRIBUTION_METHODS["rollout"], model, x)
    torch.testing.assert_close(randomization_sanity("rollout", model, x), want, rtol=0, atol=0)
    torch.testing.assert_close(randomization_sanity(vitlab.attention_rollout, model, x), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown method 'rolout': choose one of"):
        randomization_sanity("rolout", model, x)


def test_sanity_of_rollout_runs_on_a_model_without_a_head():
    """Rollout needs no class: its sanity check on a num_classes=0 model (timm's .orig_in21k weights) ran
    predicted_class first and was refused with advice to use rollout; the class-specific methods are still refused."""
    headless = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=32, depth=3, num_classes=0)).eval()
    x = torch.randn(2, 3, 32, 32)
    rho = randomization_sanity("rollout", headless, x)
    want = rank_correlation(ATTRIBUTION_METHODS["rollout"](headless, x),
                            ATTRIBUTION_METHODS["rollout"](randomized_copy(headless), x))
    torch.testing.assert_close(rho, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="a class-specific map needs class scores"):
        randomization_sanity("occlusion", headless, x)


def test_localisation_known_answers():
    masks = torch.zeros(3, 32, 32, dtype=torch.bool)
    masks[:, 8:16, 8:16] = True  # the object fills patches (2..3, 2..3) of the 8x8 grid
    on = torch.zeros(8, 8)
    on[2, 2] = 1.0
    off = torch.zeros(8, 8)
    off[6, 6] = 1.0
    r = localisation(torch.stack([on, off, torch.ones(8, 8)]), masks)
    np.testing.assert_allclose(r["mass_in_mask"], [1.0, 0.0, 64 / 1024])
    np.testing.assert_allclose(r["pointing"], [1.0, 0.0, 0.0])  # a flat map points at its first patch, (0, 0)
    np.testing.assert_allclose(r["chance"], 64 / 1024)
    half = torch.zeros(1, 32, 32, dtype=torch.bool)
    half[:, :, :2] = True  # half of each patch in the first column
    edge = torch.zeros(1, 8, 8)
    edge[0, :, 0] = 1.0
    edge[0, :, 1] = 1.0
    np.testing.assert_allclose(localisation(edge, half)["mass_in_mask"], 0.25)


def test_localisation_refuses_a_0_255_mask():
    """A mask read from a PNG (0 and 255, uint8) made the share on the object and the chance level 255 times too large
    (a "share" of 255 for this map), and compare_methods averaged those into its table without a word; now it is
    refused with its value range and the fix, and the same mask as bool (or 0/1 numbers) scores as before."""
    masks = torch.zeros(1, 32, 32, dtype=torch.uint8)
    masks[:, 8:16, 8:16] = 255
    one = torch.zeros(1, 8, 8)
    one[0, 2, 2] = 1.0
    with pytest.raises(ValueError, match="masks must be object masks of 0 and 1 \\(bool\\), got values from 0 to "
                                         "255: pass masks > 0"):
        localisation(one, masks)
    assert localisation(one, masks > 0)["mass_in_mask"].item() == 1.0
    assert localisation(one, (masks > 0).float())["chance"].item() == 64 / 1024


def test_localisation_names_a_mask_without_a_batch_axis():
    """A 0-d mask (one flag for the whole image) failed with a bare "tuple index out of range" before its shape was
    checked; it is now refused as masks of the wrong shape."""
    with pytest.raises(ValueError, match=r"masks must be \(B, H, W\) with B = 1 and H, W multiples of the grid "
                                         r"\(8, 8\), got \(\)"):
        localisation(torch.rand(1, 8, 8), torch.tensor(True))


def test_deletion_insertion_scorer_scores_each_map_as_deletion_insertion_does():
    """The scorer does the shared work (targets, baseline, both ends of the curves) once; each map then costs only
    its inner steps, and its scores are deletion_insertion's exactly."""
    from vitlab.inspect.faithfulness import deletion_insertion_scorer

    model, x, steps = tiny_vit(), torch.randn(3, 3, 32, 32), 4
    score = deletion_insertion_scorer(model, x, steps=steps, batch_size=4)
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    try:
        got = [score(torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(k))) for k in range(2)]
    finally:
        hook.remove()
    assert sum(seen) == 2 * (2 * 3 * (steps - 1))
    for k, g in enumerate(got):
        want = deletion_insertion(model, x, torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(k)),
                                  steps=steps, batch_size=4)
        assert want.keys() == g.keys()
        for key in want:
            torch.testing.assert_close(g[key], want[key], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"maps must have shape \(B, gh, gw\)"):
        score(torch.rand(2, 8, 8))


def test_a_seed_that_is_no_whole_number_is_refused_by_name_before_running_the_model():
    """randomized_copy(seed=1.5) and (seed=True) failed in torch as "manual_seed expected a long, but got float"
    (naming no argument) and compare_methods(seed=0.5) so only after predicting every image's class; a NumPy seed
    failed as "an integer is required". They are now refused as 'seed must be a whole number' before any forward
    pass, and a NumPy integer draws the copy its int does."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    for seed in (1.5, True, 2.0):
        with pytest.raises(ValueError, match=f"seed must be a whole number, got {seed!r}"):
            randomized_copy(model, seed=seed)
        with pytest.raises(ValueError, match=f"seed must be a whole number, got {seed!r}"):
            vitlab.compare_methods(model, x, methods=["rollout"], seed=seed)
        with pytest.raises(ValueError, match=f"seed must be a whole number, got {seed!r}"):
            randomization_sanity("rollout", model, x, seed=seed)
    handle.remove()
    assert calls == []
    a, b = randomized_copy(model, seed=np.int64(3)), randomized_copy(model, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
