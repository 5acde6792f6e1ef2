"""The causal head atlas (vitlab.inspect.heads): a model built so that one head alone carries the class signal."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_convit, tiny_timm, tiny_vit

import vitlab
from vitlab.inspect.heads import HeadImportance, head_importance

LAYER, HEAD, WIDTH = 1, 2, 64  # tiny_vit: 3 blocks of 3 heads of width 64


def one_head_model(layer: int = LAYER, head: int = HEAD) -> torch.nn.Module:
    """tiny_vit with every attention output projection and every MLP output zeroed, except the projection columns of
    ``head`` of block ``layer`` (default head 2 of block 1): the blocks are the identity but for that head, so the
    class token learns about the image through it alone. Its weights are scaled up so that the predictions differ
    between images."""
    torch.manual_seed(0)
    model = tiny_vit()
    with torch.no_grad():
        for i, blk in enumerate(model.blocks):
            keep = blk.attn.proj.weight[:, head * WIDTH:(head + 1) * WIDTH].clone() * 20
            blk.attn.proj.weight.zero_()
            blk.attn.proj.bias.zero_()
            blk.mlp.fc2.weight.zero_()
            blk.mlp.fc2.bias.zero_()
            if i == layer:
                blk.attn.proj.weight[:, head * WIDTH:(head + 1) * WIDTH] = keep
        model.head.weight.mul_(20)
    return model


@pytest.fixture(scope="module")
def constructed():
    model = one_head_model()
    torch.manual_seed(1)
    x = torch.randn(24, 3, 32, 32)
    with torch.no_grad():
        labels = model(x).argmax(-1)  # the model's own predictions: unablated accuracy 1
    assert len(labels.unique()) >= 3  # predictions that a constant class token could not give
    return model, x, labels


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_only_the_head_that_carries_the_class_signal_matters(constructed, ablation):
    model, x, labels = constructed
    res = head_importance(model, x, labels, ablation=ablation, batch_size=10, progress=False)
    assert isinstance(res, HeadImportance) and res.shared and res.layers == (0, 1, 2)
    assert res.logprob_drop.shape == (3, 3) and res.accuracy_drop.shape == (3, 3)
    assert res.per_image_drop.shape == (3, 3, 24)
    assert bool(res.base_correct.all())
    others = torch.ones(3, 3, dtype=torch.bool)
    others[LAYER, HEAD] = False
    assert (res.per_image_drop[others] == 0).all()  # a head whose output is multiplied by zero weights: exactly 0
    assert (res.accuracy_drop[others] == 0).all()
    assert res.logprob_drop[LAYER, HEAD] > 0.5
    assert res.accuracy_drop[LAYER, HEAD] > 0.3
    lo, hi = res.logprob_interval[LAYER, HEAD].tolist()
    assert lo < float(res.logprob_drop[LAYER, HEAD]) < hi and lo > 0
    assert res.interval_method.startswith("bootstrap over 24 images")
    assert res.logprob_interval[others].isnan().all()  # no spread: no interval


def test_mean_ablation_replaces_the_head_by_its_mean_over_images_per_token(constructed):
    """The drop of head (1, 2), computed here with hooks of our own: proj inputs of all images, their mean per token
    in columns 128..191, then a forward with those columns replaced."""
    model, x, labels = constructed
    proj = model.blocks[LAYER].attn.proj
    seen = []
    h = proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        base = model(x).double().log_softmax(-1)
    h.remove()
    mean = seen[0].double().mean(0)  # (T, C)

    def replace(m, a):
        z = a[0].clone()
        z[..., HEAD * WIDTH:(HEAD + 1) * WIDTH] = mean[:, HEAD * WIDTH:(HEAD + 1) * WIDTH].float()
        return (z,)

    h = proj.register_forward_pre_hook(replace)
    with torch.no_grad():
        ablated = model(x).double().log_softmax(-1)
    h.remove()
    want = (base - ablated).gather(1, labels[:, None]).squeeze(1)
    res = head_importance(model, x, labels, layers=[LAYER], batch_size=7, progress=False)
    assert res.layers == (LAYER,)
    assert torch.allclose(res.per_image_drop[0, HEAD].double(), want, atol=1e-5)
    right = ablated.argmax(-1) == labels
    assert torch.equal(res.per_image_correct[0, HEAD], right)
    assert math.isclose(float(res.accuracy_drop[0, HEAD]), 1 - float(right.double().mean()), abs_tol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: tiny_vit(),
    lambda: tiny_convit(),
    lambda: tiny_timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=4, num_classes=10),
    lambda: tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, reg_tokens=2, class_token=False,
                      global_pool="avg", num_classes=10),
], ids=["vit", "convit", "deit-distilled", "registers-no-class"])
def test_the_shared_runs_equal_full_forwards(make):
    model = make()
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    shared = head_importance(model, x, y, ablation="zero", batch_size=4, progress=False)
    full = head_importance(model, x, y, ablation="zero", batch_size=4, share=False, progress=False)
    assert shared.shared and not full.shared
    assert torch.allclose(shared.per_image_drop, full.per_image_drop, atol=1e-5)
    assert (shared.per_image_drop != 0).any()  # the ablations changed something


def test_the_model_comes_back_unchanged_when_a_forward_raises(constructed):
    model, x, labels = constructed
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = {"n": 0}
    original = model.blocks[2].mlp.forward

    def flaky(t):
        calls["n"] += 1
        if calls["n"] == 6:  # inside the ablation runs
            raise RuntimeError("boom")
        return original(t)

    model.blocks[2].mlp.forward = flaky
    try:
        with pytest.raises(RuntimeError, match="boom"):
            head_importance(model, x, labels, batch_size=12, progress=False)
    finally:
        del model.blocks[2].mlp.forward
    assert all(m.training for m in model.modules())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.eval()


def test_bad_arguments_are_refused(constructed):
    model, x, labels = constructed
    with pytest.raises(ValueError, match="one class index per image"):
        head_importance(model, x, labels[:5])
    with pytest.raises(TypeError, match="integer class indices"):
        head_importance(model, x, labels.float())
    with pytest.raises(ValueError, match="0 to 9"):
        head_importance(model, x, labels + 10)
    with pytest.raises(ValueError, match="ablation"):
        head_importance(model, x, labels, ablation="resample")
    with pytest.raises(ValueError, match="block index"):
        head_importance(model, x, labels, layers=[3])
    assert vitlab.head_importance is head_importance


def test_on_progress_counts_every_ablated_run(constructed):
    model, x, labels = constructed
    seen = []
    head_importance(model, x[:8], labels[:8], layers=[1, 2], batch_size=5, progress=False,
                    on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 12) for k in range(1, 13)]  # 2 batches x 2 blocks x 3 heads


def test_heads_without_spread_say_why_there_is_no_interval_in_a_field():
    """Per-image drops with no spread in any head (or NaN, an absent head) give NaN intervals and a ``NoInterval``
    method whose reason counts the images; one head with a spread gives its method, no reason."""
    from vitlab.base.intervals import NoInterval, none_reason
    from vitlab.inspect.heads import _intervals

    flat = torch.zeros(2, 3, 5, dtype=torch.float64)
    flat[1, 2] = float("nan")
    iv, method = _intervals(flat, 200, 0)
    assert torch.isnan(iv).all() and isinstance(method, NoInterval)
    assert none_reason(method) == "no head's per-image values over 5 images have a spread"
    flat[0, 1] = torch.arange(5.0)
    iv, method = _intervals(flat, 200, 0)
    assert none_reason(method) is None and method.startswith("Student t over 5 images")
    assert torch.isfinite(iv[0, 1]).all() and torch.isnan(iv[0, 0]).all()
