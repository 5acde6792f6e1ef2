"""Linear CKA and layer similarity (vitlab.inspect.cka): known answers against formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_bit, tiny_convit, tiny_timm, tiny_vit

import vitlab
from vitlab.inspect.cka import MinibatchCKA, cka, hsic_gram, layer_features, layer_similarity
from vitlab.inspect.residual import capture_blocks


def ref_hsic_unbiased(x: torch.Tensor, y: torch.Tensor) -> float:
    """Song et al. (2012) unbiased HSIC of linear kernels, the formula of Nguyen et al. (2021) written out."""
    n = len(x)
    k, l_ = x @ x.T, y @ y.T
    k, l_ = k - torch.diag(torch.diag(k)), l_ - torch.diag(torch.diag(l_))
    one = torch.ones(n, 1, dtype=x.dtype)
    return float((torch.trace(k @ l_) + (one.T @ k @ one) * (one.T @ l_ @ one) / ((n - 1) * (n - 2))
                  - 2 / (n - 2) * (one.T @ k @ l_ @ one)) / (n * (n - 3)))


def ref_linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Kornblith et al. (2019) full-batch linear CKA in its feature-space form: ||Y^T X||_F^2 / (||X^T X|| ||Y^T Y||)
    with centred columns."""
    x, y = x - x.mean(0), y - y.mean(0)
    return float((y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm()))


def _pair(n: int = 40, p: int = 12, q: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = x[:, :q] @ torch.randn(q, q, generator=g, dtype=torch.float64) + 0.5 * torch.randn(n, q, generator=g,
                                                                                            dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("debiased", [True, False])
def test_cka_of_a_representation_with_itself_is_one(debiased):
    x, _ = _pair()
    assert abs(float(cka(x, x, debiased=debiased)) - 1.0) < 1e-12
    tokens = torch.randn(10, 5, 4)  # (n, T, D): flattened after the first axis
    assert abs(float(cka(tokens, tokens.reshape(10, 20), debiased=debiased)) - 1.0) < 1e-6


@pytest.mark.parametrize("debiased", [True, False])
def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling(debiased):
    x, y = _pair()
    q, _ = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64))
    base = float(cka(x, y, debiased=debiased))
    assert 0.3 < base < 0.99  # a pair that is neither identical nor unrelated
    assert abs(float(cka(x @ q, y, debiased=debiased)) - base) < 1e-12
    assert abs(float(cka(7.5 * x, 0.01 * y, debiased=debiased)) - base) < 1e-12
    # not invariant to an anisotropic scaling: the test can tell a changed representation
    assert abs(float(cka(x * torch.linspace(0.1, 10, 12, dtype=torch.float64), y, debiased=debiased)) - base) > 1e-3


def test_unbiased_and_biased_hsic_equal_their_formulas():
    x, y = _pair(n=17)
    ga, gb = hsic_gram(x), hsic_gram(y)
    assert abs(float((ga * gb).sum()) - ref_hsic_unbiased(x, y)) < 1e-10
    n = len(x)
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n
    biased = float(torch.trace((x @ x.T) @ h @ (y @ y.T) @ h)) / (n - 1) ** 2
    assert abs(float((hsic_gram(x, False) * hsic_gram(y, False)).sum()) - biased) < 1e-10
    assert abs(float(cka(x, y, debiased=False)) - ref_linear_cka(x, y)) < 1e-12


def test_minibatch_cka_is_the_ratio_of_averaged_per_batch_hsics():
    """Nguyen et al. eq. 3, computed batch by batch by hand with the written-out estimator."""
    xs = [_pair(n=n, seed=s) for s, n in enumerate((12, 9, 15))]
    acc = MinibatchCKA(2, 1)
    for x, y in xs:
        acc.update([x, y], [y])
    cross = [sum(ref_hsic_unbiased(p[i], p[1]) for p in xs) for i in range(2)]
    self_a = [sum(ref_hsic_unbiased(p[i], p[i]) for p in xs) for i in range(2)]
    self_b = sum(ref_hsic_unbiased(y, y) for _, y in xs)
    want = torch.tensor([[cross[i] / math.sqrt(self_a[i] * self_b)] for i in range(2)], dtype=torch.float64)
    assert torch.allclose(acc.result(), want, rtol=1e-10, atol=0)
    assert abs(float(acc.result()[1, 0]) - 1.0) < 1e-12


def test_minibatch_cka_agrees_with_full_batch_linear_cka_on_many_images():
    """With 500-image batches the mini-batch estimator over 4000 images is within 0.01 of Kornblith's full-batch CKA
    (low-dimensional features: the full-batch estimator's own bias is small there)."""
    x, y = _pair(n=4000, p=6, q=6, seed=3)
    acc = MinibatchCKA(1, 1)
    for xa, ya in zip(x.split(500), y.split(500)):
        acc.update([xa], [ya])
    full = ref_linear_cka(x, y)
    assert 0.3 < full < 0.95
    assert abs(float(acc.result()[0, 0]) - full) < 0.01


def test_the_unbiased_estimator_finds_no_similarity_between_independent_features():
    """The reason for debiasing: 50 images of independent 500-dimensional features look alike to the biased
    estimator, not to the unbiased one."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(50, 500, generator=g), torch.randn(50, 500, generator=g)
    assert float(cka(a, b, debiased=False)) > 0.8
    assert abs(float(cka(a, b))) < 0.1


def test_a_constant_representation_has_nan_cka_and_bad_input_is_refused():
    x, _ = _pair()
    assert math.isnan(float(cka(x, torch.ones(40, 3))))
    with pytest.raises(ValueError, match="same images"):
        cka(x, x[:30])
    with pytest.raises(ValueError, match="at least 4 images"):
        cka(x[:3], x[:3])
    with pytest.raises(ValueError, match=r"x\[:, None\]|\[:, None\]"):
        cka(x[:, 0], x[:, 0])


def test_layer_similarity_of_a_model_with_itself_has_a_unit_diagonal():
    model = tiny_vit()
    x = torch.randn(10, 3, 32, 32)
    sim = layer_similarity(model, model, x, batch_size=4, progress=False)
    assert sim.shape == (3, 3) and sim.dtype == torch.float64
    assert torch.allclose(sim.diagonal(), torch.ones(3, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(sim, sim.T, atol=1e-12)


def test_layer_similarity_is_the_minibatch_estimator_over_block_outputs():
    """10 images in batches of 4: the short last batch (2 images) joins the one before, so batches are 4 and 6; the
    features are each block's output (own hooks here), read as the class token."""
    a, b = tiny_vit(), tiny_convit()
    x = torch.randn(10, 3, 32, 32)
    got = layer_similarity(a, b, x, representation="cls", batch_size=4, progress=False)
    acc = MinibatchCKA(3, 4)

    def class_tokens(model, part):  # each block's class-token output, hooked by hand
        out = []
        handles = [blk.register_forward_hook(lambda m, i, o: out.append(o[:, 0])) for blk in model.blocks]
        with torch.no_grad():
            model(part)
        for h in handles:
            h.remove()
        return out

    for part in (x[:4], x[4:]):
        acc.update(class_tokens(a, part), class_tokens(b, part))
    want = acc.result()
    # a ConViT's first 2 blocks have no class token: their column is NaN (its constant value), not patch 0's
    assert got[:, :2].isnan().all()
    assert torch.allclose(got[:, 2:], want[:, 2:], atol=1e-9)


def test_layer_similarity_reads_cnn_stages_and_refuses_a_class_token_they_lack():
    vit, bit = tiny_vit(), tiny_bit()
    x = torch.randn(8, 3, 32, 32)
    sim = layer_similarity(vit, bit, x, representation="patch_mean", progress=False)
    stages = len(bit.forward_intermediates(x, intermediates_only=True))
    assert sim.shape == (3, stages) and sim.isfinite().all()
    with pytest.raises(ValueError, match="patch_mean"):
        layer_similarity(vit, bit, x, representation="cls")
    no_class = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=False, global_pool="avg",
                         reg_tokens=2)
    with pytest.raises(ValueError, match="class token"):
        layer_features(no_class, x, "cls")
    feats = layer_features(no_class, x, "patch_mean")
    assert len(feats) == 2 and feats[0].shape == (8, 192)
    with pytest.raises(ValueError, match="representation"):
        layer_similarity(vit, vit, x, representation="mean")


def test_public_names():
    assert vitlab.cka is cka and vitlab.layer_similarity is layer_similarity


def test_block_capture_restores_the_model_when_the_body_raises():
    model = tiny_vit().train()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(RuntimeError, match="inside"):
        with capture_blocks(model, lambda i, t, p: t.sum()):
            model(x)
            raise RuntimeError("inside")
    assert model.training and all(not m._forward_hooks for m in model.modules())


def test_the_benchmarks_full_batch_loop_is_the_estimator_on_one_batch():
    """benchmarks/atlas_speed.py times layer_similarity against a plain full-batch loop (every image's features kept,
    vitlab.cka per layer pair): with all images in one batch the mini-batch estimator is that formula, so the two
    agree to rounding; with several batches they are two estimators of one CKA and differ."""
    from benchmarks.atlas_speed import cka_full_batch

    a, b = tiny_vit(), tiny_convit()
    torch.manual_seed(0)
    x = torch.randn(12, 3, 32, 32)
    full = cka_full_batch(a, b, x, batch=5)
    assert full.shape == (3, 4)
    torch.testing.assert_close(full, layer_similarity(a, b, x, batch_size=12, progress=False), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(full, layer_similarity(a, b, x, batch_size=6, progress=False), atol=1e-6)
    same = cka_full_batch(a, a, x, batch=5)
    torch.testing.assert_close(same.diagonal(), torch.ones(3, dtype=torch.float64))
