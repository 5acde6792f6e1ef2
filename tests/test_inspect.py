"""The inspection analyses against known answers and independent (loop) implementations."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from conftest import convit_raw_attention, tiny_convit, tiny_timm, tiny_vit

import vitlab
from vitlab.inspect import (
    attention_distance_from_maps,
    attention_rollout,
    embedding_filter_pca,
    mean_attention_distance,
    patch_distances,
    position_embedding_similarity,
    position_structure_score,
    rollout_from_maps,
)


def random_maps(L=2, B=3, H=2, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(L, B, H, T, T, generator=g).softmax(-1)


def test_patch_distances_known_answer():
    d = patch_distances((1, 3), (4, 4))
    assert d.tolist() == [[0, 4, 8], [4, 0, 4], [8, 4, 0]]
    d2 = patch_distances((2, 2), (3, 4))  # rows 3 px apart, columns 4 px apart
    assert d2[0, 3].item() == pytest.approx(5.0)


def loop_distance(maps, grid, patch, p, renormalize):
    """Per-patch Python loops, as in the probing-vits notebook."""
    L, B, H = maps.shape[:3]
    gh, gw = grid
    out = torch.zeros(L, B, H, dtype=torch.float64)
    for layer in range(L):
        for b in range(B):
            for h in range(H):
                total = 0.0
                for qi in range(gh * gw):
                    row = maps[layer, b, h, p + qi, p:].double()
                    if renormalize:
                        row = row / row.sum()
                    acc = 0.0
                    for kj in range(gh * gw):
                        dy = (qi // gw - kj // gw) * patch[0]
                        dx = (qi % gw - kj % gw) * patch[1]
                        acc += row[kj].item() * math.hypot(dy, dx)
                    total += acc
                out[layer, b, h] = total / (gh * gw)
    return out


@pytest.mark.parametrize("renormalize", [False, True])
def test_distance_matches_loop_reference(renormalize):
    maps = random_maps(T=1 + 3 * 4)
    fast = attention_distance_from_maps(maps, (3, 4), (8, 8), 1, renormalize)
    # float32 maps: the default path accumulates in float32 (one matrix-vector product), so 1e-6 relative
    torch.testing.assert_close(fast, loop_distance(maps, (3, 4), (8, 8), 1, renormalize), rtol=1e-6, atol=1e-6)


def test_distance_known_answers():
    n = 9
    eye = torch.eye(n).expand(1, 1, 1, n, n)
    assert attention_distance_from_maps(eye, (3, 3), (16, 16), 0).item() == 0.0
    uniform = torch.full((1, 1, 1, n, n), 1 / n)
    d = patch_distances((3, 3), (16, 16))
    assert attention_distance_from_maps(uniform, (3, 3), (16, 16), 0).item() == pytest.approx(d.mean().item())
    # all weight on the class token: dropped without renormalising, so the distance is 0
    to_cls = torch.zeros(1, 1, 1, n + 1, n + 1)
    to_cls[..., 0] = 1
    assert attention_distance_from_maps(to_cls, (3, 3), (16, 16), 1).item() == 0.0
    with pytest.raises(ValueError, match="do not match"):
        attention_distance_from_maps(uniform, (2, 2), (16, 16), 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_maps_give_the_float32_distance(dtype):
    """Uniform attention over ViT-B/16's 24 x 24 grid at 384 px: <A, D> sums to about 115,000 px, past float16's
    65,504; the distance must be the uniform distance (199.7 px), not inf or bf16's 200 (3 significant digits)."""
    n = 24 * 24
    uniform = torch.full((1, 1, 1, n + 1, n + 1), 1 / (n + 1), dtype=dtype)
    d = patch_distances((24, 24), (16, 16))
    want = float(d.mean()) * n / (n + 1)  # the class-token share of each row is dropped, not renormalised
    got = attention_distance_from_maps(uniform, (24, 24), (16, 16), 1).item()
    ref = attention_distance_from_maps(uniform.float(), (24, 24), (16, 16), 1).item()
    assert math.isfinite(got) and got == pytest.approx(ref, rel=1e-6)
    assert got == pytest.approx(want, rel=2e-3)  # the half-precision weights 1/577 themselves round


def test_mean_attention_distance_on_a_model():
    model = tiny_vit()
    x = torch.randn(5, 3, 32, 32)
    per = mean_attention_distance(model, x, batch_size=2, per_image=True)
    assert per.shape == (3, 5, 3)
    torch.testing.assert_close(mean_attention_distance(model, x), per.mean(1))
    maps = vitlab.attention_maps(model, x)
    torch.testing.assert_close(per, attention_distance_from_maps(maps, (8, 8), (4, 4), 1).float())
    assert 0 < per.min() and per.max() < patch_distances((8, 8), (4, 4)).max()


def test_analyses_of_a_model_whose_patches_pad_its_own_image_size():
    """A timm ViT at 70 px with 16 px patches and dynamic_img_pad runs a 5x5 grid (timm's grid_size says 4x4): every
    analysis reads the tokens the model runs, and the position table keeps its own 4x4 layout."""
    from vitlab.inspect import gradient_rollout, integrated_gradients, occlusion

    model = tiny_timm("vit_tiny_patch16_224", img_size=70, dynamic_img_size=True, dynamic_img_pad=True, num_classes=4)
    x = torch.randn(2, 3, 70, 70)
    maps = vitlab.attention_maps(model, x)
    assert maps.shape == (2, 2, 3, 26, 26)
    torch.testing.assert_close(mean_attention_distance(model, x, per_image=True),
                               attention_distance_from_maps(maps, (5, 5), (16, 16), 1).float())
    assert attention_rollout(model, x).shape == gradient_rollout(model, x, 1).shape == (2, 5, 5)
    assert integrated_gradients(model, x, 1, steps=2).shape == occlusion(model, x, 1).shape == (2, 5, 5)
    assert position_embedding_similarity(model).shape == (4, 4, 4, 4)

def _analyses():
    from vitlab.inspect import (
        attribution,
        compare_methods,
        deletion_insertion,
        gradient_rollout,
        integrated_gradients,
        occlusion,
        randomization_sanity,
    )
    from vitlab.inspect.attribution import predicted_class

    return {
        "attention_maps": lambda m, x: vitlab.attention_maps(m, x),
        "mean_attention_distance": lambda m, x: mean_attention_distance(m, x),
        "attention_rollout": lambda m, x: attention_rollout(m, x),
        "gradient_rollout": lambda m, x: gradient_rollout(m, x, 3),
        "integrated_gradients": lambda m, x: integrated_gradients(m, x, 3, steps=2),
        "occlusion": lambda m, x: occlusion(m, x, 3),
        "attribution": lambda m, x: attribution("rollout", m, x),
        "deletion_insertion": lambda m, x: deletion_insertion(m, x, torch.rand(1, 8, 8), steps=2),
        "randomization_sanity": lambda m, x: randomization_sanity("rollout", m, x),
        "compare_methods": lambda m, x: compare_methods(m, x, methods=("rollout",), steps=2, progress=False),
        "predicted_class": lambda m, x: predicted_class(m, x),
    }


@pytest.mark.parametrize("name", sorted(_analyses()))
def test_every_analysis_refuses_an_image_without_its_batch_axis_and_an_empty_batch(name):
    """One shared check names the problem (a bare (C, H, W) image fails deep inside timm otherwise, and an empty
    batch gives NaNs or a torch.cat error); a batch of one image works."""
    model, run = tiny_vit(), _analyses()[name]
    with pytest.raises(ValueError, match=r"\(B, C, H, W\) batch, got shape \(3, 32, 32\); pass images\[None\] "
                                         "for one image"):
        run(model, torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match=r"empty batch \(shape \(0, 3, 32, 32\)\)"):
        run(model, torch.randn(0, 3, 32, 32))
    run(model, torch.randn(3, 32, 32)[None])


@pytest.mark.parametrize("name", sorted(_analyses()))
@pytest.mark.parametrize("kind", ["vit", "hybrid"])
def test_every_analysis_names_an_image_size_the_model_cannot_take(name, kind):
    """A ViT built for 32 px given 48 px images: timm's bare AssertionError (a hybrid's raw tensor size mismatch deep
    in the forward) before; now a ValueError naming both sizes and the ways out."""
    from conftest import tiny_hybrid

    model = tiny_vit() if kind == "vit" else tiny_hybrid()
    with pytest.raises(ValueError, match=r"images are 48x48 px but this VisionTransformer is built for 32x32 px .*"
                                         r"resize_for_finetuning\(model, \(48, 48\)\).*dynamic_img_size=True"):
        _analyses()[name](model, torch.randn(2, 3, 48, 48))


@pytest.mark.parametrize("name", sorted(_analyses()) + ["attention_maps", "capture_attention", "model_info",
                                                        "position_embedding_similarity", "embedding_filter_pca"])
def test_every_analysis_asks_for_a_loaded_model_given_a_path_or_none(name):
    """A checkpoint path or None where the model goes failed with "'str' object has no attribute 'parameters'" (or
    'named_modules', or timm's bare AssertionError) from deep inside; now a TypeError says to load the model first."""
    run = {**_analyses(), "attention_maps": vitlab.attention_maps,
           "capture_attention": lambda m, x: vitlab.capture_attention(m).__enter__(),
           "model_info": lambda m, x: vitlab.model_info(m),
           "position_embedding_similarity": lambda m, x: vitlab.position_embedding_similarity(m),
           "embedding_filter_pca": lambda m, x: vitlab.embedding_filter_pca(m)}[name]
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(TypeError, match=r"model is the path or name 'data/checkpoints/vit_cifar10', not a loaded "
                                        r"model: load it first, model = vitlab.load_model\('data/checkpoints/"):
        run("data/checkpoints/vit_cifar10", x)
    with pytest.raises(TypeError, match=r"model must be a torch nn.Module \(a loaded model\), got None"):
        run(None, x)

@pytest.mark.parametrize("name", sorted(_analyses()))
def test_every_analysis_names_images_on_another_device_than_the_model(name):
    """Images left on the CPU for a model moved to another device failed in the first layer with torch's bare "Tensor
    on device cpu is not on the expected device" (on a GPU: "Expected all tensors to be on the same device"); now a
    ValueError names both devices and the fix, before any hook is set. (The meta device stands in for a GPU here.)"""
    model, run = tiny_vit().to("meta"), _analyses()[name]
    with pytest.raises(ValueError, match=r"images are on cpu but the model is on meta: pass images.to\('meta'\), or "
                                         r"move the model with model.to\('cpu'\)"):
        run(model, torch.randn(2, 3, 32, 32))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("name", sorted(_analyses()))
def test_every_analysis_names_channels_last_and_greyscale_images(name):
    """A (B, H, W, C) batch was read as 32x3 px images (a wrong size named) and a one-channel batch failed inside the
    patch convolution with torch's bare 'expected input to have 3 channels'; now both name the channels and the fix."""
    model, run = tiny_vit(), _analyses()[name]
    with pytest.raises(ValueError, match=r"have 32 channels on axis 1 but the model takes 3: they look channels-last "
                                         r"\(B, H, W, C\); pass images.permute\(0, 3, 1, 2\)"):
        run(model, torch.randn(2, 32, 32, 3))
    with pytest.raises(ValueError, match=r"images have 1 channel\(s\) but the model takes 3"):
        run(model, torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match=r"one \(H, W, C\) image: pass images.permute\(2, 0, 1\)\[None\]"):
        run(model, torch.randn(32, 32, 3))


def test_the_channel_check_reads_the_input_convolution_timm_names():
    """The channel check took the first Conv2d a model registers as its input layer; a model whose first registered
    convolution is another one (here a one-channel conv registered before the stem) had its RGB images refused.
    It now reads timm's pretrained_cfg["first_conv"] where the model names it."""
    from vitlab.inspect.capture import check_input_channels

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.side = torch.nn.Conv2d(1, 4, 1)  # registered first, not the input layer
            self.stem = torch.nn.Conv2d(3, 8, 3)
            self.pretrained_cfg = {"first_conv": "stem"}

    net = Net()
    check_input_channels(net, torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match=r"images have 1 channel\(s\) but the model takes 3"):
        check_input_channels(net, torch.randn(2, 1, 8, 8))
    net.pretrained_cfg = {"first_conv": ("stem", "side")}  # several, as CrossViT's: the first
    check_input_channels(net, torch.randn(2, 3, 8, 8))
    del net.pretrained_cfg  # no name: the first registered convolution
    with pytest.raises(ValueError, match=r"images have 3 channel\(s\) but the model takes 1"):
        check_input_channels(net, torch.randn(2, 3, 8, 8))


def loop_rollout(maps, discard_ratio, residual, start_layer):
    """Per image, as vit-explain does it (with its discard applied to every image, not only the first)."""
    L, B, H, T, _ = maps.shape
    out = []
    for b in range(B):
        result = torch.eye(T, dtype=torch.float64)
        for layer in range(start_layer, L):
            fused = maps[layer, b].double().mean(0)
            flat = fused.reshape(-1).clone()
            k = int(flat.numel() * discard_ratio)
            if k:
                idx = flat.topk(k, largest=False).indices
                idx = idx[idx != 0]
                flat[idx] = 0
            a = residual * torch.eye(T, dtype=torch.float64) + (1 - residual) * flat.view(T, T)
            a = a / a.sum(-1, keepdim=True)
            result = a @ result
        out.append(result)
    return torch.stack(out)


@pytest.mark.parametrize("discard,residual,start", [(0.0, 0.5, 0), (0.9, 0.5, 0), (0.5, 0.3, 1)])
def test_rollout_matches_per_image_loop(discard, residual, start):
    maps = random_maps(L=3, B=4, T=7, seed=1)
    torch.testing.assert_close(rollout_from_maps(maps, "mean", discard, residual, start),
                               loop_rollout(maps, discard, residual, start))


@pytest.mark.parametrize("fusion,discard,residual,start", [("mean", 0.0, 0.5, 0), ("max", 0.9, 0.5, 0),
                                                          ("min", 0.5, 0.3, 1), ("mean", 0.3, 0.0, 2)])
def test_rollout_row_is_the_readout_times_the_joint_attention(fusion, discard, residual, start):
    from vitlab.inspect.rollout import rollout_row

    maps = random_maps(L=4, B=3, T=7, seed=2)
    readout = torch.rand(3, 7, dtype=torch.float64)
    joint = rollout_from_maps(maps, fusion, discard, residual, start)
    torch.testing.assert_close(rollout_row(maps, readout, fusion, discard, residual, start),
                               (readout.unsqueeze(1) @ joint).squeeze(1))


def test_avg_readout_with_a_class_token_uses_the_patch_rows():
    m = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=True, global_pool="avg")
    x = torch.randn(2, 3, 32, 32)
    joint = rollout_from_maps(vitlab.attention_maps(m, x))
    torch.testing.assert_close(vitlab.attention_rollout(m, x), joint[:, 1:, 1:].mean(1).reshape(2, 8, 8).float())


def test_readouts_of_timms_prr_pool_and_of_an_average_over_every_token():
    """timm's ``prr`` pool on a class token reads its first query row (not the mean of the rows); ``avg`` with
    ``pool_include_prefix`` averages every token, the class token included."""
    from vitlab.inspect.rollout import readout_vector

    x = torch.randn(2, 3, 32, 32)
    prr = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=True, global_pool="prr")
    info = vitlab.model_info(prr)
    assert info.readout == "map" and info.pool_reads_first_row
    with torch.no_grad(), vitlab.capture_attention(prr) as cap:
        prr(x)
    maps, pool = cap.stack(), cap.pool_maps()  # pool: (B, H, T, T), self-attention over every token
    assert pool.shape[-2] == pool.shape[-1] == info.num_tokens
    row0 = pool.double().mean(1)[:, 0]  # (B, T): the class token's row, heads averaged
    torch.testing.assert_close(readout_vector(info, 2, pool), row0)
    joint = rollout_from_maps(maps)
    want = (row0.unsqueeze(1) @ joint).squeeze(1)[:, 1:].reshape(2, 8, 8).float()
    torch.testing.assert_close(vitlab.attention_rollout(prr, x), want)
    avg = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=True, global_pool="avg",
                    pool_include_prefix=True)
    info = vitlab.model_info(avg)
    assert info.readout_includes_prefix and not info.pool_reads_first_row
    # a latent attention pool (timm's "map") also names its pool "token" but averages its one latent query; a class
    # token readout averages nothing, whatever pool_include_prefix says
    latent = vitlab.model_info(tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, global_pool="map"))
    token = vitlab.model_info(tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, pool_include_prefix=True))
    assert not latent.pool_reads_first_row and not token.readout_includes_prefix
    torch.testing.assert_close(readout_vector(info, 1), torch.full((1, 65), 1 / 65, dtype=torch.float64))
    joint = rollout_from_maps(vitlab.attention_maps(avg, x))
    torch.testing.assert_close(vitlab.attention_rollout(avg, x), joint.mean(1)[:, 1:].reshape(2, 8, 8).float())



def test_a_distillation_token_readout_averages_the_class_and_distillation_rows():
    """DeiT's distilled model averages its class and distillation heads at evaluation: rollout's readout is the mean
    of those two rows of the joint attention (weights 1/2 each, summing to 1), not their sum."""
    from vitlab.inspect.rollout import readout_vector

    model = tiny_vit(distilled=True)
    info = vitlab.model_info(model)
    assert info.num_prefix_tokens == 2
    torch.testing.assert_close(readout_vector(info, 1)[0, :3], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    x = torch.randn(2, 3, 32, 32)
    joint = rollout_from_maps(vitlab.attention_maps(model, x))
    torch.testing.assert_close(attention_rollout(model, x), joint[:, :2, 2:].mean(1).reshape(2, 8, 8).float())



def test_a_convit_whose_class_token_never_joins_counts_no_prefix_and_refuses_a_readout_rollout():
    """A ConViT no deeper than its local_up_to_layer never adds its class token (timm joins it at that block): its
    blocks attend over the patches alone and its 'token' head reads patch 0. model_info counted the class token,
    and attention_rollout failed in a bare matrix product; the token count now matches the maps, and both rollouts
    of the readout refuse it, naming patch 0's rollout (attention_view query=0), which still works."""
    import timm

    from vitlab.inspect.rollout import attention_view
    from vitlab.probe.features import readout_description

    model = timm.create_model("convit_tiny", pretrained=False, img_size=32, depth=2, local_up_to_layer=3,
                              num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, x)  # (2, 2, 4, 4, 4): 2x2 patches, no class token
    assert (info.num_prefix_tokens, info.num_class_tokens, info.num_tokens) == (0, 0, maps.shape[-1])
    assert readout_description(model, "model") == "the model's own readout (the first patch token)"
    for rollout in (vitlab.attention_rollout, vitlab.gradient_rollout):
        with pytest.raises(ValueError, match=r"no class token reaches its 2 blocks .* pass query=0 to"):
            rollout(model, x)
    torch.testing.assert_close(attention_view(maps, info, "rollout", query=0),
                               rollout_from_maps(maps)[:, 0].reshape(2, 2, 2).float())


def test_a_class_token_that_attends_to_itself_alone_but_is_attended_to_is_discarded_as_a_joined_one():
    """Row 0 the identity is not enough to be a block the class token has not joined: here the patches attend to it
    (column 0 holds 0.1 and 0.2), so discard_ratio=0.4 ranks all 9 entries and drops the 3 weakest, (0, 1), (0, 2)
    and (1, 0), worked out by hand, not 1 of the 4 patch entries."""
    a = torch.tensor([[1.0, 0.0, 0.0], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    got = rollout_from_maps(a[None, None, None], discard_ratio=0.4)[0]
    want = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.8 / 0.95, 0.15 / 0.95], [0.1, 0.1, 0.8]], dtype=torch.float64)
    torch.testing.assert_close(got, want)


def test_a_convits_attention_distance_reads_its_gpsa_blocks_over_the_patches_alone():
    """The ConViT paper's plot: mean attention distance per head of every block, the GPSA blocks (patches over
    patches, before the class token joins) and the later ones. It refused ('maps over 64 tokens do not match 1 prefix
    tokens'); it now equals a recomputation from timm's own attention of each block, in pixels."""
    model = tiny_convit()
    x = torch.randn(3, 3, 32, 32)
    raw = convit_raw_attention(model, x)
    ys, xs = torch.arange(64) // 8 * 4.0, torch.arange(64) % 8 * 4.0  # patch centres, 4 px patches
    d = ((ys[:, None] - ys[None]) ** 2 + (xs[:, None] - xs[None]) ** 2).sqrt().double()
    want = torch.stack([(a[..., -64:, -64:] * d).sum(-1).mean(-1).mean(0) for a in raw])  # (L, H)
    torch.testing.assert_close(mean_attention_distance(model, x).double(), want, rtol=1e-5, atol=1e-5)
    gpsa = model.blocks[0].attn  # timm's own distance of a GPSA block (in patches, images averaged) agrees
    inputs = []
    h = gpsa.register_forward_hook(lambda m, a, out: inputs.append(a[0]))
    with torch.no_grad():
        model(x)
        h.remove()
        timm_distance = gpsa.get_attention_map(inputs[0]).double() * 4
    torch.testing.assert_close(want[0], timm_distance, rtol=1e-5, atol=1e-5)


def test_a_convits_rollout_carries_its_class_token_unchanged_until_it_joins():
    """attention_rollout of a ConViT failed in a bare matrix product ([1, 65] against [1, 64]). Its exact rollout:
    in the blocks before the class token joins, the class token attends only to itself and nothing attends to it
    (its identity row and column); the readout's row then mixes the patches through the later blocks alone. vitlab's
    rollout (heads averaged, 0.5 residual, rows renormalised) equals that rollout written out from timm's own maps."""
    model = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    joint = torch.eye(65, dtype=torch.float64).expand(2, 65, 65)
    for a in convit_raw_attention(model, x):
        a = a.mean(1)
        if a.shape[-1] == 64:  # a GPSA block: the class token is not there yet
            padded = torch.zeros(2, 65, 65, dtype=torch.float64)
            padded[:, 0, 0] = 1.0
            padded[:, 1:, 1:] = a
            a = padded
        m = 0.5 * torch.eye(65, dtype=torch.float64) + 0.5 * a
        joint = (m / m.sum(-1, keepdim=True)) @ joint
    want = joint[:, 0, 1:].reshape(2, 8, 8).float()
    torch.testing.assert_close(attention_rollout(model, x), want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(rollout_from_maps(vitlab.attention_maps(model, x))[:, 0, 1:].reshape(2, 8, 8).float(),
                               want, rtol=1e-5, atol=1e-7)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_convits_discard_ratio_counts_the_patch_entries_of_its_blocks_before_the_class_token_joins():
    """With discard_ratio > 0, the count of entries dropped in a ConViT's blocks before its class token joins was taken
    over the padded (1 + N) x (1 + N) map, whose class-token row and column (2N structural zeros) are the weakest:
    a ratio of 0.5 on an 8x8 grid dropped 1,984 of the 4,096 real entries there, not 2,048. The ratio now counts and
    ranks the N x N patch entries alone. Written out from timm's own maps: drop the int(64 * 64 * r) weakest patch entries of a GPSA block and
    the int(65 * 65 * r) weakest of a later block (entry (0, 0) kept), then mix in the residual and renormalise."""
    torch.manual_seed(0)
    model = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    r = 0.5
    joint = torch.eye(65, dtype=torch.float64).expand(2, 65, 65)
    for a in convit_raw_attention(model, x):
        a = a.mean(1)
        if a.shape[-1] == 64:  # a GPSA block: drop among the patch entries, then pad with the class token's identity
            flat = a.reshape(2, -1).clone()
            flat.scatter_(1, flat.topk(int(64 * 64 * r), -1, largest=False).indices, 0.0)
            a = torch.zeros(2, 65, 65, dtype=torch.float64)
            a[:, 0, 0] = 1.0
            a[:, 1:, 1:] = flat.view(2, 64, 64)
        else:
            flat = a.reshape(2, -1).clone()
            keep = flat[:, 0].clone()
            flat.scatter_(1, flat.topk(int(65 * 65 * r), -1, largest=False).indices, 0.0)
            flat[:, 0] = keep
            a = flat.view(2, 65, 65)
        m = 0.5 * torch.eye(65, dtype=torch.float64) + 0.5 * a
        joint = (m / m.sum(-1, keepdim=True)) @ joint
    want = joint[:, 0, 1:].reshape(2, 8, 8).float()
    torch.testing.assert_close(attention_rollout(model, x, discard_ratio=r), want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(rollout_from_maps(vitlab.attention_maps(model, x), discard_ratio=r)[:, 0, 1:]
                               .reshape(2, 8, 8).float(), want, rtol=1e-4, atol=1e-6)


def test_a_convits_gradient_rollout_leaves_its_class_token_alone_until_it_joins():
    """gradient_rollout of a ConViT failed as rollout did; it now equals Chefer's rule written out from timm's own maps
    and their gradients (own hooks), the blocks before the class token joins padded with its row and column: the
    identity in the maps and 0 in the gradients, so (I + A) leaves the class token as it is there."""
    model = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    maps = []

    def keep(_m, _a, out):
        out.retain_grad()
        maps.append(out)

    handles = [blk.attn.attn_drop.register_forward_hook(keep) for blk in model.blocks]
    try:
        model(x)[:, 3].sum().backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    v = torch.zeros(2, 1, 65, dtype=torch.float64)
    v[:, 0, 0] = 1.0
    for a in reversed(maps):
        r = (a.grad * a).clamp_min(0).mean(1).double()  # (B, n, n)
        if r.shape[-1] == 64:  # the class token is not there yet: no attention to it or from it, no gradient
            r = torch.nn.functional.pad(r, (1, 0, 1, 0))
        v = v + v @ r
    want = v[:, 0, 1:].reshape(2, 8, 8).float()
    torch.testing.assert_close(vitlab.gradient_rollout(model, x, target=3), want, rtol=1e-4, atol=1e-7)


def test_a_latent_pool_readout_averages_its_queries_and_heads():
    """An attention pool with several latent queries (timm's AttentionPoolLatent, latent_len > 1) reads out their
    mean: the readout weights are the pool's maps averaged over heads and queries, placed on the tokens it reads."""
    from types import SimpleNamespace

    from vitlab.inspect.rollout import readout_vector

    info = SimpleNamespace(readout="map", num_tokens=5, num_prefix_tokens=1, pool_reads_first_row=False)
    pool = torch.rand(2, 3, 2, 4).softmax(-1)  # (B, heads, queries, keys): the 4 patch tokens
    want = torch.zeros(2, 5, dtype=torch.float64)
    want[:, 1:] = pool.double().mean((1, 2))
    torch.testing.assert_close(readout_vector(info, 2, pool), want)
    torch.testing.assert_close(readout_vector(info, 2, pool).sum(1), torch.ones(2, dtype=torch.float64))



def test_readout_attention_is_the_head_mean_of_the_readout_row():
    """(L, B, gh, gw): the class token's row over the patches, heads averaged; a one-hot vector picks a query."""
    from vitlab.inspect.rollout import readout_attention

    model = tiny_vit()
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, torch.randn(2, 3, 32, 32))  # (3, 2, 3, 65, 65)
    want = maps[:, :, :, 0, 1:].mean(2).reshape(3, 2, 8, 8)
    torch.testing.assert_close(readout_attention(maps, info), want)
    one_hot = torch.zeros(2, 65)
    one_hot[:, 1 + 9] = 1.0  # patch 9 as the query
    torch.testing.assert_close(readout_attention(maps, info, one_hot), maps[:, :, :, 10, 1:].mean(2).reshape(3, 2, 8, 8))



def test_attention_view_of_a_query_patch_is_that_patchs_row():
    """The explorer's attention of query patch q (row-major over the grid) is token 1 + q's row past the class token,
    in the layer asked for (1-based), heads averaged or one head."""
    from vitlab.inspect.rollout import attention_view

    model = tiny_vit()
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, torch.randn(2, 3, 32, 32))  # (3, 2, 3, 65, 65)
    got = attention_view(maps, info, layer=2, query=9)
    torch.testing.assert_close(got, maps[1, :, :, 10, 1:].mean(1).reshape(2, 8, 8))
    torch.testing.assert_close(attention_view(maps, info, layer=3, head=1, query=0), maps[2, :, 1, 1, 1:].reshape(2, 8, 8))


def test_attention_view_refuses_a_head_it_does_not_have_and_maps_of_another_model():
    """head=-1 silently showed the last head and head=1.5 head 1; head=3 of 3 heads was a bare IndexError and
    head='avg' int()'s ValueError; maps of another model (or one layer's 4-d maps) failed in a bare matrix product.
    Now each is a ValueError naming the valid heads, or the token counts and the fix; head=np.int64(2) still works."""
    import numpy as np

    from vitlab.inspect.rollout import attention_view, readout_attention

    model = tiny_vit()
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, torch.randn(2, 3, 32, 32))  # (3, 2, 3, 65, 65): 3 heads
    for head in (-1, 3, 1.5, "avg", True):
        with pytest.raises(ValueError, match=r"head must be a head index from 0 to 2 or one of \('mean', 'max', "
                                             r"'min'\), got " + re.escape(repr(head))):
            attention_view(maps, info, head=head)
    torch.testing.assert_close(attention_view(maps, info, head=np.int64(2)), attention_view(maps, info, head=2))
    other = vitlab.model_info(tiny_vit(readout="avg"))  # 64 tokens, no prefix
    for run in (lambda m, i: attention_view(m, i), lambda m, i: readout_attention(m, i)):
        with pytest.raises(ValueError, match=r"maps over 65x65 tokens do not match this info's 64 tokens \(0 prefix "
                                             r"\+ a 8x8 grid\): pass model_info\(model, img_size=...\)"):
            run(maps, other)
        with pytest.raises(ValueError, match=r"got shape \(2, 3, 65, 65\); for one layer's \(B, H, T, T\) maps "
                                             r"pass maps\[None\]"):
            run(maps[0], info)
    with pytest.raises(ValueError, match=r"maps must be the \(L, B, H, T, T\) attention of every layer"):
        rollout_from_maps(maps[0])


def test_attention_view_names_a_layer_or_query_that_is_no_whole_number():
    """layer=2.5 failed in a bare slice ("slice indices must be integers") and query=1.5 in a bare tensor index; both
    are now refused with the valid range, and NumPy integers still work."""
    import numpy as np

    from vitlab.inspect.rollout import attention_view

    model = tiny_vit()
    info = vitlab.model_info(model)
    maps = vitlab.attention_maps(model, torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"layer must be in \[1, 3\], got 2.5"):
        attention_view(maps, info, layer=2.5)
    with pytest.raises(ValueError, match=r"query patch 1.5 is outside the 8x8 grid: give a patch index from 0 to 63 "
                                         r"\(row-major\), or None for the readout"):
        attention_view(maps, info, query=1.5)
    torch.testing.assert_close(attention_view(maps, info, layer=np.int64(2), query=np.int64(9)),
                               attention_view(maps, info, layer=2, query=9))


def test_rollout_known_answers():
    T = 5
    uniform = torch.full((2, 1, 1, T, T), 1 / T)
    joint = rollout_from_maps(uniform, residual=0.0)
    torch.testing.assert_close(joint, torch.full((1, T, T), 1 / T, dtype=torch.float64))
    assert torch.equal(rollout_from_maps(random_maps(T=T), residual=1.0), torch.eye(T, dtype=torch.float64)[None]
                       .expand(3, T, T))
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout_from_maps(uniform, discard_ratio=1.0)
    # a bool is an int to Python: residual=True was read as the weight 1.0, discard_ratio=False as 0.0
    with pytest.raises(ValueError, match=r"residual must be in \[0, 1\], got True"):
        rollout_from_maps(uniform, residual=True)
    with pytest.raises(ValueError, match=r"discard_ratio must be in \[0, 1\), got False"):
        rollout_from_maps(uniform, discard_ratio=False)
    with pytest.raises(ValueError, match=r"residual must be in \[0, 1\], got False"):
        attention_rollout(tiny_vit(), torch.randn(1, 3, 32, 32), residual=False)


def test_attention_rollout_readouts():
    x = torch.randn(2, 3, 32, 32)
    model = tiny_vit()
    r = attention_rollout(model, x)
    assert r.shape == (2, 8, 8)
    joint = rollout_from_maps(vitlab.attention_maps(model, x))
    torch.testing.assert_close(r, joint[:, 0, 1:].reshape(2, 8, 8).float())
    assert (r.flatten(1).sum(1) < 1).all()  # the class token keeps some weight on itself
    avg = tiny_vit(readout="avg")
    ra = attention_rollout(avg, x)
    joint = rollout_from_maps(vitlab.attention_maps(avg, x))
    torch.testing.assert_close(ra, joint.mean(1).reshape(2, 8, 8).float())
    torch.testing.assert_close(ra.flatten(1).sum(1), torch.ones(2))  # no prefix tokens: rows stay stochastic
    pooled = timm_map_model()
    rp = attention_rollout(pooled, torch.randn(2, 3, 32, 32))
    assert rp.shape == (2, 4, 4)
    torch.testing.assert_close(rp.flatten(1).sum(1), torch.ones(2))


def timm_map_model():
    import timm

    return timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                         global_pool="map", class_token=False, num_classes=5).eval()


def test_position_similarity_structure():
    sincos = tiny_vit(pos_embed="sincos")
    sim = position_embedding_similarity(sincos)
    assert sim.shape == (8, 8, 8, 8)
    torch.testing.assert_close(torch.diagonal(sim.reshape(64, 64)), torch.ones(64))
    assert position_structure_score(sim) < -0.5  # 2D sin-cos embeddings are spatially local by construction
    rand = tiny_vit()  # random learned embeddings: no structure
    assert abs(position_structure_score(position_embedding_similarity(rand))) < 0.1
    assert position_embedding_similarity(sincos, grid=(12, 12)).shape == (12, 12, 12, 12)
    reg = tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56)  # no prefix rows in pos_embed
    assert position_embedding_similarity(reg).shape == (4, 4, 4, 4)
    with pytest.raises(ValueError, match="no absolute position embedding"):
        position_embedding_similarity(tiny_vit(pos_embed="none"))


def test_position_similarity_names_a_grid_or_similarity_it_cannot_use():
    """grid=(0, 0) reached timm's resampling as torch's bare 'Input and output sizes should be greater than 0' and
    grid=12 "'int' object is not iterable"; position_structure_score of one patch's (gh, gw) row a bare reshape
    error. Now grid=12 is the square grid, and the others ValueErrors naming the argument and its shape."""
    model = tiny_vit()
    assert torch.equal(position_embedding_similarity(model, grid=12), position_embedding_similarity(model, grid=(12, 12)))
    with pytest.raises(ValueError, match=r"grid must be a positive int or a pair \(H, W\) of positive ints, got \(0, 0\)"):
        position_embedding_similarity(model, grid=(0, 0))
    sim = position_embedding_similarity(model)
    with pytest.raises(ValueError, match=r"similarity must be the \(gh, gw, gh, gw\) output of "
                                         r"position_embedding_similarity, got shape \(8, 8\)"):
        position_structure_score(sim[3, 4])


def test_spearman_matches_scipy():
    from scipy.stats import spearmanr

    sim = torch.randn(3, 4, 3, 4)
    sim = (sim + sim.permute(2, 3, 0, 1)) / 2
    ys = torch.arange(3).repeat_interleave(4).double()
    xs = torch.arange(4).repeat(3).double()
    dist = torch.sqrt((ys[:, None] - ys[None]) ** 2 + (xs[:, None] - xs[None]) ** 2)
    iu = torch.triu_indices(12, 12, offset=1)
    expected = spearmanr(sim.reshape(12, 12)[iu[0], iu[1]].numpy(), dist[iu[0], iu[1]].numpy()).statistic
    assert position_structure_score(sim) == pytest.approx(expected)
    from vitlab.base.stats import spearman

    a, b = torch.tensor([[1.0, float("nan"), 3, 4, 2], [1.0, 2, 3, 4, 5]]), torch.tensor([[1.0, 5, 3, 4, 2]] * 2)
    rho = spearman(a, b)  # a NaN row gives NaN, as scipy's spearmanr; the other row is scipy's value
    assert math.isnan(rho[0]) and math.isnan(spearmanr(a[0], b[0]).statistic)
    assert float(rho[1]) == pytest.approx(spearmanr(a[1], b[1]).statistic)
    assert math.isnan(spearman(b, a)[0])  # a NaN in the second input too


def test_filter_pca_matches_scikit_learn():
    from sklearn.decomposition import PCA

    model = tiny_vit()
    comps, ratio = embedding_filter_pca(model, k=10)
    w = model.patch_embed.proj.weight.detach().reshape(192, -1).double().numpy()
    ref = PCA(n_components=10).fit(w)
    assert comps.shape == (10, 3, 4, 4)
    torch.testing.assert_close(ratio.double(), torch.from_numpy(ref.explained_variance_ratio_), atol=1e-6, rtol=1e-5)
    ours = comps.reshape(10, -1).double()
    theirs = torch.from_numpy(ref.components_)
    torch.testing.assert_close((ours * theirs).sum(1).abs(), torch.ones(10, dtype=torch.float64), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="k must be"):
        embedding_filter_pca(model, k=0)



def test_filter_pca_gives_each_component_the_sign_of_its_largest_entry():
    """A singular vector's sign is arbitrary; like scikit-learn, each component's largest-magnitude entry is
    positive, so the same filters always show the same picture."""
    from vitlab.inspect import filter_pca

    w = torch.randn(40, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    comps, _ = filter_pca(w, k=6)
    flat = comps.reshape(6, -1)
    assert (flat.gather(1, flat.abs().argmax(1, keepdim=True)) > 0).all()
    torch.testing.assert_close(filter_pca(-w, k=6)[0], comps)  # negated filters: the same components



def test_linear_patch_embedding_filters_follow_timms_patch_flattening():
    """A linear patch projection reads a patch flattened as (P, P, C) (timm's NHWC order): weight column
    (y * P + x) * C + c is channel c of pixel (y, x) of the (D, C, P, P) filter."""
    from torch import nn

    from vitlab.inspect.filters import _filters

    model = nn.Module()
    model.patch_embed = nn.Module()
    model.patch_embed.proj = nn.Linear(3 * 2 * 2, 5)
    model.patch_embed.patch_size = (2, 2)
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_(torch.arange(12.0).expand(5, 12))
    f = _filters(model)
    assert f.shape == (5, 3, 2, 2)
    for c in range(3):
        for y in range(2):
            for x in range(2):
                assert f[0, c, y, x].item() == (y * 2 + x) * 3 + c


def test_filter_pca_refuses_hybrid_clearly():
    hybrid = vitlab.build_model(vitlab.HybridConfig(vit=vitlab.vit_config("Ti/4", img_size=32, depth=1),
                                                    layers=(1,), stem="imagenet"))
    with pytest.raises(TypeError, match="hybrid"):
        embedding_filter_pca(hybrid)


def test_filter_component_count_is_what_the_pca_can_give():
    """min(28, D filters, C*P*P values): the count the notebook and the report both ask for, never refused."""
    from vitlab.inspect import filter_component_count

    for overrides, want in [(dict(), 28), (dict(patch_size=2), 12), (dict(embed_dim=8, num_heads=1), 8),
                            (dict(patch_size=2, in_chans=1), 4)]:
        cfg = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10)
        model = vitlab.build_model(dataclasses.replace(cfg, **overrides))
        k = filter_component_count(model)
        assert k == want, overrides
        comps, ratio = vitlab.embedding_filter_pca(model, k=k)
        assert comps.shape[0] == ratio.shape[0] == k
        with pytest.raises(ValueError, match="k must be in"):
            vitlab.embedding_filter_pca(model, k=k + 1) if k < 28 else vitlab.embedding_filter_pca(model, k=10**6)


def test_filter_component_count_refuses_a_k_that_is_no_whole_number():
    """filter_component_count(model, k=1.5) returned 1.5 (min(k, D, C*P*P)) and k=True returned True, counts that
    embedding_filter_pca then refused or read as 1; they are refused by name, and a torch integer k comes back a Python int."""
    from vitlab.inspect import filter_component_count

    model = tiny_vit()
    for k in (1.5, True, 0):
        with pytest.raises(ValueError, match=f"k must be a whole number of at least 1, got {k!r}"):
            filter_component_count(model, k=k)
    k = filter_component_count(model, k=torch.tensor(5))
    assert k == 5 and type(k) is int


def test_filter_counts_that_are_no_whole_number_are_named():
    """k=2.5 failed in a tensor slice ("slice indices must be integers") and draws=0 in torch.stack ("expects a
    non-empty TensorList"); both are now ValueErrors naming the argument and its value."""
    from vitlab.inspect import random_filter_pca_ratios

    model = tiny_vit()
    with pytest.raises(ValueError, match=r"k must be in \[1, 48\] for 192 filters of 3x4x4, got 2.5"):
        vitlab.embedding_filter_pca(model, k=2.5)
    for draws in (0, -1):
        with pytest.raises(ValueError, match=f"draws must be a whole number of at least 1, got {draws}"):
            random_filter_pca_ratios(model, draws=draws)


def test_random_filter_reference_is_the_projection_redrawn_and_leaves_every_state():
    """Each draw is the patch projection's own reset_parameters under seed s, on the CPU in float32: the same for
    a float64 copy of the model; the model and the global random state are left as they were."""
    from vitlab.inspect import filter_pca, random_filter_pca_ratios

    model = tiny_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    got = random_filter_pca_ratios(model, k=5, draws=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    proj = model.patch_embed.proj
    for s in range(2):
        torch.manual_seed(s)
        fresh = torch.nn.Conv2d(proj.in_channels, proj.out_channels, proj.kernel_size, proj.stride)
        torch.testing.assert_close(got[s], filter_pca(fresh.weight.detach(), 5)[1], rtol=0, atol=0)
    torch.set_rng_state(state)
    torch.testing.assert_close(random_filter_pca_ratios(tiny_vit().double(), k=5, draws=2), got, rtol=0, atol=0)


_COUNTS = {  # (function, count argument): a call with that count n
    ("attention_maps", "batch_size"): lambda m, x, n: vitlab.attention_maps(m, x, batch_size=n),
    ("mean_attention_distance", "batch_size"): lambda m, x, n: vitlab.mean_attention_distance(m, x, batch_size=n),
    ("deletion_insertion", "batch_size"): lambda m, x, n: vitlab.deletion_insertion(m, x, torch.rand(2, 8, 8), steps=2,
                                                                                     batch_size=n),
    ("deletion_insertion", "steps"): lambda m, x, n: vitlab.deletion_insertion(m, x, torch.rand(2, 8, 8), steps=n),
    ("integrated_gradients", "steps"): lambda m, x, n: vitlab.integrated_gradients(m, x, 3, steps=n),
    ("integrated_gradients", "internal_batch_size"): lambda m, x, n: vitlab.integrated_gradients(
        m, x, 3, steps=2, internal_batch_size=n),
    ("occlusion", "perturbations_per_eval"): lambda m, x, n: vitlab.occlusion(m, x, 3, perturbations_per_eval=n),
}


@pytest.mark.parametrize("key", sorted(_COUNTS), ids="-".join)
def test_counts_below_one_are_named(key):
    """batch_size=-1 reached Tensor.split's bare error (0 meant "all" in attention_maps, and failed in
    mean_attention_distance), deletion_insertion's batch_size=0 and steps=2.5 range()'s, and captum asserted on
    steps=0 or perturbations_per_eval=0; each is now a ValueError naming the argument and its value."""
    m, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    for n in (0, -1, 2.5):
        with pytest.raises(ValueError, match=rf"{key[1]} must be a whole number of at least 1, got {n}"):
            _COUNTS[key](m, x, n)


def test_numpy_integer_counts_are_told_what_they_are():
    """check_count told batch_size=np.int64(2) it "must be a whole number of at least 1", which it is, and
    filter_pca refused k=np.int64(3) (which it had taken) as out of range "got 3"; a NumPy integer k is taken, and a
    NumPy count is told to pass a Python int."""
    import numpy as np

    from vitlab.base.errors import ParameterError, Setting
    from vitlab.inspect import filter_pca

    m, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    with pytest.raises(ParameterError) as e:
        vitlab.mean_attention_distance(m, x, batch_size=np.int64(2))
    assert (e.value.param, e.value.value, e.value.fix) == ("batch_size", 2, (Setting("batch_size", 2),))
    assert type(e.value.fix[0].value) is int
    w = torch.randn(8, 3, 4, 4)
    torch.testing.assert_close(filter_pca(w, k=np.int64(3))[1], filter_pca(w, k=3)[1])
    with pytest.raises(ValueError, match=r"k must be in \[1, 8\] for 8 filters of 3x4x4, got 2.5"):
        filter_pca(w, k=2.5)


def test_an_empty_layer_list_is_named():
    """layers=[] captured nothing and blamed the caller for running the model outside the block."""
    with pytest.raises(ValueError, match=r"layers is empty: give at least one block index \(0 to 2"):
        vitlab.attention_maps(tiny_vit(), torch.randn(1, 3, 32, 32), layers=[])


@pytest.mark.parametrize("method", ["attention_rollout", "gradient_rollout"])
def test_a_start_layer_that_is_no_whole_number_is_named(method):
    """start_layer=1.5 ran attention_rollout from layer 2 without a word and failed in gradient_rollout's range() with
    a bare TypeError; both now refuse it with the valid range."""
    with pytest.raises(ValueError, match=r"start_layer must be in \[0, 3\), got 1.5"):
        getattr(vitlab, method)(tiny_vit(), torch.randn(1, 3, 32, 32), start_layer=1.5)
