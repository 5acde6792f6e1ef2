"""Few-shot ridge probe, logistic probe and cached feature extraction: independent solutions and errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import tiny_bit, tiny_vit
from sklearn.linear_model import Ridge

from vitlab.data import ImageArray, load_shapes
from vitlab.features import extract_features, feature_key
from vitlab.probe import FewShotRidge, few_shot_accuracy, linear_probe_accuracy


def _design(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return np.concatenate([(X - mean) / std, np.full((len(X), 1), 100.0)], axis=1)


@pytest.mark.parametrize("n", [40, 6])  # more examples than features, and fewer (the N x N branch)
def test_ridge_matches_an_independent_solve(n):
    g = np.random.default_rng(0)
    X, y = g.normal(size=(n, 12)), np.arange(n) % 3
    probe = FewShotRidge(l2=3.0).fit(torch.tensor(X), torch.tensor(y))
    mean, std = X.mean(0), X.std(0) + 1e-5
    A = _design(X, mean, std)
    Y = 2.0 * (y[:, None] == np.arange(3)[None]) - 1.0
    W = np.linalg.solve(A.T @ A + 3.0 * np.eye(A.shape[1]), A.T @ Y)
    np.testing.assert_allclose(probe.coef_.numpy(), W, rtol=1e-6, atol=1e-9)
    # scikit-learn's Ridge without intercept on the same design matrix agrees too
    np.testing.assert_allclose(Ridge(alpha=3.0, fit_intercept=False).fit(A, Y).coef_.T, W, rtol=1e-5, atol=1e-8)
    Xt = g.normal(size=(7, 12))
    np.testing.assert_array_equal(probe.predict(torch.tensor(Xt)).numpy(), (_design(Xt, mean, std) @ W).argmax(1))
    # changing l2 reuses the factorisation and still matches
    W2 = np.linalg.solve(A.T @ A + 50.0 * np.eye(A.shape[1]), A.T @ Y)
    np.testing.assert_allclose(probe.set_l2(50.0).coef_.numpy(), W2, rtol=1e-6, atol=1e-9)


def _clusters(n_per: int, k: int = 4, d: int = 16, noise_seed: int = 0, spread: float = 0.3):
    """Gaussian clusters around fixed centres; ``noise_seed`` redraws only the points."""
    centres = torch.randn(k, d, generator=torch.Generator().manual_seed(123)) * 3
    y = torch.arange(k).repeat_interleave(n_per)
    g = torch.Generator().manual_seed(noise_seed)
    return centres[y] + spread * torch.randn(len(y), d, generator=g), y


def test_few_shot_on_separable_clusters_is_perfect_and_reports_seeds():
    Xtr, ytr = _clusters(30)
    Xte, yte = _clusters(10, noise_seed=1)
    res = few_shot_accuracy(Xtr, ytr, Xte, yte, shots=(1, 5), seeds=(0, 1, 2))
    assert set(res) == {1, 5}
    assert res[5].mean == 1.0 and res[5].per_seed == (1.0, 1.0, 1.0) and res[5].std == 0.0
    assert len(res[1].per_seed) == 3 and res[1].mean == pytest.approx(np.mean(res[1].per_seed))


def test_few_shot_accuracy_on_noisy_data_has_a_spread():
    Xtr, ytr = _clusters(30, spread=4.0)
    Xte, yte = _clusters(30, noise_seed=1, spread=4.0)
    r = few_shot_accuracy(Xtr, ytr, Xte, yte, shots=(1,), seeds=range(5))[1]
    assert r.std > 0 and 0.25 < r.mean < 1.0
    assert r.std == pytest.approx(np.std(r.per_seed, ddof=1))


@pytest.mark.parametrize("case,match", [
    ("one class", "at least 2 classes"),
    ("too few", "class 3 has only 2"),
    ("lengths", "one label per row"),
    ("nan", "NaN"),
    ("dims", "dimensions"),
])
def test_few_shot_errors_name_the_problem(case, match):
    X, y = _clusters(10)
    Xt, yt = X.clone(), y.clone()
    if case == "one class":
        y = torch.zeros_like(y)
        yt = torch.zeros_like(yt)
    elif case == "too few":
        keep = torch.cat([torch.nonzero(y != 3).flatten(), torch.nonzero(y == 3).flatten()[:2]])
        X, y = X[keep], y[keep]
    elif case == "lengths":
        y = y[:-1]
    elif case == "nan":
        X[3, 2] = float("nan")
    elif case == "dims":
        Xt = Xt[:, :5]
    with pytest.raises(ValueError, match=match):
        few_shot_accuracy(X, y, Xt, yt, shots=(5,), seeds=(0,))


def test_logistic_probe_separates_clusters():
    Xtr, ytr = _clusters(20)
    assert linear_probe_accuracy(Xtr, ytr, Xtr, ytr) == 1.0


def _shapes(n: int = 12) -> ImageArray:
    return load_shapes("test", n=n)


def test_extract_features_are_the_pre_logits_and_are_cached(monkeypatch):
    model, data = tiny_vit(), _shapes()
    cfg = model.pretrained_cfg
    x = data.images.permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(cfg["mean"]).view(1, 3, 1, 1)) / torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(x), pre_logits=True)
    feats = extract_features(model, data, batch_size=5)
    torch.testing.assert_close(feats, expected, rtol=1e-5, atol=1e-5)
    model.train()
    monkeypatch.setattr(model, "forward_features", lambda *a: (_ for _ in ()).throw(AssertionError("recomputed")))
    assert torch.equal(extract_features(model, data), feats)  # served from the cache
    assert model.training  # mode untouched


def test_feature_key_changes_with_weights_data_and_transform():
    model, data = tiny_vit(), _shapes()
    key = feature_key(model, data)
    assert feature_key(copy.deepcopy(model), data) == key  # same weights, another object
    assert feature_key(model, _shapes(13)) != key
    other = copy.deepcopy(model)
    other.pretrained_cfg = {**other.pretrained_cfg, "mean": (0.0, 0.0, 0.0)}
    assert feature_key(other, data) != key
    with torch.no_grad():
        model.head.weight[0, 0] += 1
    assert feature_key(model, data) != key


def test_features_resize_to_the_model_input_and_work_for_a_resnet():
    data = load_shapes("test", n=4, size=48)  # 48 px images, 32 px models
    assert extract_features(tiny_vit(), data, cache=False).shape == (4, 192)
    assert extract_features(tiny_bit(), data, cache=False).shape[0] == 4
