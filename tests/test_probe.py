"""Few-shot ridge probe, logistic probe and cached feature extraction: independent solutions and errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import tiny_bit, tiny_vit
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from vitlab.data.datasets import ImageArray, load_shapes
from vitlab.models.config import cifar_vit
from vitlab.models.zoo import build_model
from vitlab.probe.features import extract_features, extract_readouts, feature_key
from vitlab.probe.linear import FewShotRidge, few_shot_accuracy, linear_probe_accuracy


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
    # coef_ and predict return NumPy arrays now (scikit-learn's contract), even for tensor input: no .numpy()
    np.testing.assert_allclose(probe.coef_, W, rtol=1e-6, atol=1e-9)
    # scikit-learn's Ridge without intercept on the same design matrix agrees too
    np.testing.assert_allclose(Ridge(alpha=3.0, fit_intercept=False).fit(A, Y).coef_.T, W, rtol=1e-5, atol=1e-8)
    Xt = g.normal(size=(7, 12))
    np.testing.assert_array_equal(probe.predict(torch.tensor(Xt)), (_design(Xt, mean, std) @ W).argmax(1))
    # changing l2 reuses the factorisation and still matches
    W2 = np.linalg.solve(A.T @ A + 50.0 * np.eye(A.shape[1]), A.T @ Y)
    np.testing.assert_allclose(probe.set_l2(50.0).coef_, W2, rtol=1e-6, atol=1e-9)


# --- the scikit-learn estimator contract -------------------------------------------------------------------------

def _blobs(n_per: int, centres: np.ndarray, spread: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(centres)), n_per)
    return centres[y] + spread * g.normal(size=(len(y), centres.shape[1])), y


CENTRES = np.array([[0.0, 0.0, 0.0, 0.0], [8.0, 8.0, 0.0, 0.0], [-8.0, 8.0, 4.0, 0.0]])


def test_clone_and_params_round_trip():
    X, y = _blobs(10, CENTRES)
    fitted = FewShotRidge(l2=7.0).fit(X, y)
    copy_ = clone(fitted)
    assert copy_ is not fitted and copy_.get_params() == {"l2": 7.0} == fitted.get_params()
    assert not hasattr(copy_, "classes_") and not hasattr(copy_, "coef_")  # unfitted
    with pytest.raises(NotFittedError):
        check_is_fitted(copy_)
    with pytest.raises(NotFittedError):
        copy_.predict(X)
    check_is_fitted(fitted)
    # set_params / get_params round trip; __init__ stores the value as given
    probe = FewShotRidge()
    assert probe.get_params() == {"l2": 2.0**10}
    assert probe.set_params(l2=3) is probe and probe.get_params() == {"l2": 3}
    assert FewShotRidge(**fitted.get_params()).get_params() == fitted.get_params()
    assert repr(FewShotRidge(l2=7.0)) == "FewShotRidge(l2=7.0)"


def test_changing_l2_after_fit_equals_refitting():
    X, y = _blobs(10, CENTRES, spread=3.0)
    refit = FewShotRidge(l2=50.0).fit(X, y)
    np.testing.assert_allclose(FewShotRidge(l2=1.0).fit(X, y).set_l2(50.0).coef_, refit.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(FewShotRidge(l2=1.0).fit(X, y).set_params(l2=50.0).decision_function(X),
                               refit.decision_function(X), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "big", None, True])
def test_l2_is_validated_in_fit_not_init(bad):
    probe = FewShotRidge(l2=bad)  # scikit-learn convention: __init__ only stores
    assert probe.get_params()["l2"] is bad
    X, y = _blobs(5, CENTRES)
    with pytest.raises(ValueError, match="l2 must be a positive finite number"):
        probe.fit(X, y)
    with pytest.raises(ValueError, match="l2 must be a positive finite number"):
        FewShotRidge().fit(X, y).set_l2(bad)


def test_pipeline_with_a_scaler_separates_blobs():
    Xtr, ytr = _blobs(20, CENTRES * 100, spread=30.0)  # raw scale far from unit: the scaler has work to do
    Xte, yte = _blobs(20, CENTRES * 100, spread=30.0, seed=1)
    clf = make_pipeline(StandardScaler(), FewShotRidge()).fit(Xtr, ytr)
    assert clf.score(Xte, yte) == 1.0
    pred = clf.predict(Xte)
    assert isinstance(pred, np.ndarray) and np.array_equal(pred, yte)
    assert clf[-1].n_features_in_ == 4 and np.array_equal(clf.classes_, [0, 1, 2])


def _cv_scores_by_hand(X: np.ndarray, y: np.ndarray, l2: float) -> float:
    """5-fold stratified CV accuracy of the paper's probe, solved with np.linalg.solve (no FewShotRidge)."""
    accs = []
    for tr, te in StratifiedKFold(5).split(X, y):  # what GridSearchCV(cv=5) uses for a classifier
        mean, std = X[tr].mean(0), X[tr].std(0) + 1e-5
        A = _design(X[tr], mean, std)
        Y = 2.0 * (y[tr][:, None] == np.unique(y)[None]) - 1.0
        W = np.linalg.solve(A.T @ A + l2 * np.eye(A.shape[1]), A.T @ Y)
        accs.append(np.mean((_design(X[te], mean, std) @ W).argmax(1) == y[te]))
    return float(np.mean(accs))


def test_grid_search_picks_the_small_l2_that_a_correlated_signal_needs():
    # The class lives in x0 - x1, a tiny difference between two features that share a large nuisance u:
    # least squares (small l2) recovers the difference direction; heavy shrinkage turns ridge into a
    # class-mean classifier, which sees x0 alone, dominated by u: near chance.
    g = np.random.default_rng(0)
    n = 200
    y = np.arange(n) % 2
    u = 3.0 * g.normal(size=n)
    X = np.stack([u + 0.1 * (2 * y - 1) + 0.02 * g.normal(size=n), u + 0.02 * g.normal(size=n), g.normal(size=n)], 1)
    grid = [1e6, 1e2, 1.0, 1e-3]
    expected = [_cv_scores_by_hand(X, y, l2) for l2 in grid]
    assert expected[-1] > 0.95 and expected[0] < 0.6 and np.argmax(expected) == 3 and sorted(expected) == expected
    search = GridSearchCV(FewShotRidge(), param_grid={"l2": grid}, cv=5).fit(X, y)
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected)
    assert search.best_params_ == {"l2": 1e-3}
    assert search.best_estimator_.l2 == 1e-3 and search.score(X, y) > 0.95


def test_numpy_in_numpy_out_with_string_labels():
    X, idx = _blobs(10, CENTRES[:2])
    y = np.array(["cat", "dog"])[idx]
    probe = FewShotRidge().fit(X, y)
    assert isinstance(probe.classes_, np.ndarray) and probe.classes_.tolist() == ["cat", "dog"]
    assert probe.n_features_in_ == 4
    pred = probe.predict(X)
    assert isinstance(pred, np.ndarray) and pred.dtype.kind == "U" and pred.tolist() == y.tolist()
    margin = probe.decision_function(X)  # binary: one margin per row, positive for classes_[1]
    assert isinstance(margin, np.ndarray) and margin.shape == (len(X),)
    np.testing.assert_array_equal(np.where(margin > 0, "dog", "cat"), pred)
    assert isinstance(probe.coef_, np.ndarray) and probe.coef_.shape == (5, 2)
    assert isinstance(probe.score(X, y), float) and probe.score(X, y) == 1.0
    # three string classes: (N, K) scores whose argmax is the prediction
    X3, idx3 = _blobs(10, CENTRES)
    y3 = np.array(["bird", "cat", "dog"])[idx3]
    probe3 = FewShotRidge().fit(X3.tolist(), y3.tolist())  # lists are fine too
    scores = probe3.decision_function(X3)
    assert scores.shape == (len(X3), 3)
    np.testing.assert_array_equal(probe3.classes_[scores.argmax(1)], probe3.predict(X3))
    assert probe3.predict(X3).tolist() == y3.tolist()


def test_tensors_are_still_accepted_and_give_numpy():
    X, y = _clusters(10)  # float32 tensors, int64 labels
    probe = FewShotRidge().fit(X, y)
    assert isinstance(probe.classes_, np.ndarray) and probe.classes_.tolist() == [0, 1, 2, 3]
    pred = probe.predict(X)
    assert isinstance(pred, np.ndarray) and np.array_equal(pred, y.numpy())
    assert probe.score(X, y) == 1.0  # what few_shot_accuracy and benchmarks/probe_speed.py call
    np.testing.assert_array_equal(probe.decision_function(X), probe.decision_function(X.double().numpy()))
    np.testing.assert_array_equal(probe.predict(X.bfloat16()), probe.predict(X.bfloat16().double().numpy()))


def test_estimator_errors_name_the_problem():
    X, y = _blobs(5, CENTRES)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"train features contain NaN or infinite values \(1 rows, e.g. \[3\]\)"):
        FewShotRidge().fit(bad, y)
    probe = FewShotRidge().fit(X, y)
    with pytest.raises(ValueError, match=r"test features contain NaN or infinite values"):
        probe.predict(bad)
    with pytest.raises(ValueError, match="at least 2 classes"):
        FewShotRidge().fit(X, np.zeros(len(X), dtype=int))
    with pytest.raises(ValueError, match="expecting 4 features"):
        probe.predict(X[:, :3])
    with pytest.raises(ValueError, match="Unknown label type"):
        FewShotRidge().fit(X, np.linspace(0, 1, len(X)))


# Every check of the installed scikit-learn, none expected to fail; each is a closed-form fit on tiny data
# (the whole set takes seconds), the timeout only guards against a hang on the busy test machine.
@pytest.mark.timeout(120)
@parametrize_with_checks([FewShotRidge()])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


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
    # the labels are names, not indices: shifted to -2..1 the probe gives the same answers
    shifted = few_shot_accuracy(Xtr, ytr - 2, Xte, yte - 2, shots=(1, 5), seeds=(0, 1, 2))
    assert {k: r.per_seed for k, r in shifted.items()} == {k: r.per_seed for k, r in res.items()}


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


def test_few_shot_refuses_shots_and_seeds_that_are_no_whole_numbers():
    """shots=(1.5,) ran 1 shot, shots=(True,) 1 shot and seeds=(0, 0.5) drew seed 0's examples twice (int() of each,
    a bool being an int to Python), reported as what was asked; they are now refused by name."""
    X, y = _clusters(10)
    for shots in ((1.5,), (True,), (2, 0)):
        with pytest.raises(ValueError, match=r"shots must be positive integers, got \["):
            few_shot_accuracy(X, y, X, y, shots=shots, seeds=(0,))
    with pytest.raises(ValueError, match=r"seeds must be whole numbers, got \[0, 0.5\]"):
        few_shot_accuracy(X, y, X, y, shots=(2,), seeds=(0, 0.5))
    assert few_shot_accuracy(X, y, X, y, shots=(np.int64(2),), seeds=(np.int64(0),))[2].shots == 2
    # seeds=(1, 1) reported one draw as two, with a spread of 0 over "2 seeds"
    with pytest.raises(ValueError, match=r"seeds names a seed twice \(\[1, 1\]\): each once"):
        few_shot_accuracy(X, y, X, y, shots=(2,), seeds=(1, np.int64(1)))


def test_logistic_probe_separates_clusters():
    Xtr, ytr = _clusters(20)
    assert linear_probe_accuracy(Xtr, ytr, Xtr, ytr) == 1.0


def test_logistic_probe_standardises_so_a_features_scale_does_not_matter():
    """The features are standardised before the (L2-regularised) logistic regression: the class read from one
    feature measured in tiny units (1e-4 of the others') is found as well as in the original units."""
    g = np.random.default_rng(0)
    X = g.normal(size=(300, 5))
    y = (X[:, 0] > 0).astype(np.int64)
    scaled = X * np.array([1e-4, 1, 1, 1, 1])
    acc = linear_probe_accuracy(X[:200], y[:200], X[200:], y[200:])
    assert acc > 0.9
    assert linear_probe_accuracy(scaled[:200], y[:200], scaled[200:], y[200:]) == pytest.approx(acc, abs=0.02)


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


def test_a_feature_batch_size_that_is_no_count_is_refused_by_name():
    """extract_features(batch_size=0) failed in range() ("arg 3 must not be zero"), naming no argument, batch_size=2.5
    in range() too, and batch_size=True ran batches of 1 image; all are refused as batch_size before any forward."""
    model, data = tiny_vit(), _shapes()
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    for batch_size in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"batch_size must be a whole number of at least 1, got {batch_size!r}"):
            extract_features(model, data, batch_size=batch_size, cache=False)
    handle.remove()
    assert calls == []


def test_patch_mean_of_an_average_pooled_vit_goes_through_its_final_layernorm(monkeypatch, tmp_path):
    """readout="avg": timm's norm is the identity and the LayerNorm is fc_norm, applied after the mean; the patch mean
    is normalised as the model's own pooled readout (it averaged un-normalised tokens), here that readout exactly.
    A patch-mean file cached under the old definition is not served."""
    from safetensors.torch import save_file

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    model, data = tiny_vit(readout="avg"), _shapes()
    assert isinstance(model.norm, torch.nn.Identity) and isinstance(model.fc_norm, torch.nn.LayerNorm)
    cfg = model.pretrained_cfg
    x = data.images.permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(cfg["mean"]).view(1, 3, 1, 1)) / torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        tokens = model.forward_features(x)  # (B, 64, D): no prefix tokens, no LayerNorm yet
        want = model.fc_norm(tokens.mean(1))
        own = model.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(want, own, rtol=0, atol=0)
    old = tmp_path / "features" / f"{feature_key(model, data)}-patch_mean.safetensors"  # version 1's name
    old.parent.mkdir(parents=True)
    save_file({"features": tokens.mean(1).contiguous()}, str(old))
    patch = extract_features(model, data, batch_size=5, readout="patch_mean")
    torch.testing.assert_close(patch, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(extract_features(model, data, readout="patch_mean"), patch)  # its own (new) cache entry


def test_patch_mean_readout_averages_the_patch_tokens_of_a_distilled_vit(monkeypatch, tmp_path):
    """Two prefix tokens (class, distillation): the patch mean leaves both out; its cache entry is its own."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = build_model(cifar_vit(depth=1, embed_dim=32, num_heads=2, mlp_dim=64, num_classes=4,
                                  distilled=True)).eval()
    data = _shapes()
    cfg = model.pretrained_cfg
    x = data.images.permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(cfg["mean"]).view(1, 3, 1, 1)) / torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        tokens = model.forward_features(x)  # (B, 2 + 64, D)
    patch = extract_features(model, data, batch_size=5, readout="patch_mean")
    torch.testing.assert_close(patch, tokens[:, 2:].mean(1), rtol=1e-5, atol=1e-5)
    own = extract_features(model, data, batch_size=5)
    torch.testing.assert_close(own, (tokens[:, 0] + tokens[:, 1]) / 2, rtol=1e-5, atol=1e-5)  # timm's readout
    assert torch.equal(extract_features(model, data, readout="patch_mean"), patch)  # each from its own cache entry
    calls = []
    real = model.forward_features
    model.forward_features = lambda x: (calls.append(len(x)), real(x))[1]
    both = extract_readouts(model, data, batch_size=5, cache=False)  # both readouts from one pass over the images
    assert sum(calls) == len(data) and set(both) == {"model", "patch_mean"}
    torch.testing.assert_close(both["patch_mean"], patch, rtol=0, atol=0)
    torch.testing.assert_close(both["model"], own, rtol=0, atol=0)
    with pytest.raises(TypeError, match="readout='model'"):
        extract_features(tiny_bit(), data, readout="patch_mean")
    with pytest.raises(ValueError, match="readout must be one of"):
        extract_features(model, data, readout="cls")
    twice = extract_readouts(model, data, ("model", "model"), batch_size=5, cache=False)  # named twice: once
    assert list(twice) == ["model"] and twice["model"].shape == own.shape
    with pytest.raises(ValueError, match="the model is on cpu: move the model first"):
        extract_features(model, data, cache=False, device="cuda")
    torch.testing.assert_close(extract_features(model, data, cache=False, device="cpu"), own, rtol=0, atol=0)


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


def test_feature_key_tells_images_of_the_same_bytes_in_another_shape_apart():
    """Images 4 high by 8 wide and 8 high by 4 wide can hold the same bytes: different images, different features,
    so different keys (the key hashes each tensor's shape and dtype with its bytes)."""
    model = tiny_vit()
    wide = torch.randint(0, 256, (2, 4, 8, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    labels = torch.tensor([0, 1])
    a = ImageArray(wide, labels, ("a", "b"), "x")
    b = ImageArray(wide.reshape(2, 8, 4, 3), labels, ("a", "b"), "x")
    assert torch.equal(a.images.flatten(), b.images.flatten())
    assert feature_key(model, a) != feature_key(model, b)


def test_a_batchnorm_cnn_is_probed():
    """`vitlab probe --model data/checkpoints/resnet_cifar10_fast` failed with 'self.dim() cannot be 0 to view Long
    as Byte': the feature cache's key could not hash BatchNorm's 0-d num_batches_tracked."""
    from vitlab.models.config import CifarNetConfig

    model, data = build_model(CifarNetConfig(widths=(8, 8, 8))).eval(), _shapes()
    key = feature_key(model, data)
    with torch.no_grad():
        model.get_buffer(next(n for n, b in model.named_buffers() if b.dim() == 0)).add_(1)
    assert feature_key(model, data) != key  # the 0-d buffer is hashed, not skipped
    assert extract_features(model, data, cache=False).shape == (12, 8)


def test_feature_key_tells_a_pool_over_every_token_from_one_over_the_patches():
    """timm's pool_include_prefix changes an average-pooled ViT's readout but no weight: two such models with the
    same weights shared one cache file before, so the second was served the first one's features."""
    from conftest import tiny_timm

    data = _shapes()
    patches = tiny_timm("vit_tiny_patch16_224", img_size=32, global_pool="avg")
    every = tiny_timm("vit_tiny_patch16_224", img_size=32, global_pool="avg", pool_include_prefix=True)
    every.load_state_dict(patches.state_dict())
    assert feature_key(every, data) != feature_key(patches, data)
    extract_features(patches, data)
    torch.testing.assert_close(extract_features(every, data), extract_features(every, data, cache=False))

def test_feature_key_tells_models_apart_by_a_layer_that_holds_no_weight():
    """CLIP's QuickGELU and GELU hold no weight: the same weights loaded into timm's vit_*_clip_quickgelu_224 and
    vit_*_clip_224 shared one cache file, so the second model was served the first one's features."""
    from timm.layers import QuickGELU
    from timm.models import VisionTransformer

    data = _shapes()
    gelu = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=0).eval()
    quick = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=0,
                              act_layer=QuickGELU).eval()
    quick.load_state_dict(gelu.state_dict())
    assert feature_key(quick, data) != feature_key(gelu, data)
    assert feature_key(copy.deepcopy(quick), data) == feature_key(quick, data)
    extract_features(gelu, data)
    torch.testing.assert_close(extract_features(quick, data), extract_features(quick, data, cache=False))


def test_feature_cache_is_keyed_on_the_numerics(monkeypatch, tmp_path):
    """Features computed in a bf16 autocast region were cached under the float32 key and served to every later
    float32 call; a GPU's features (TF32 convolutions, on by default) were served to a CPU run and the reverse, so
    tests/test_gpu.py's probe command compared the CPU's cached features with themselves."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    model, data = tiny_vit(), _shapes()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = extract_features(model, data)
    exact = extract_features(model, data, cache=False)
    assert not torch.allclose(low, exact, rtol=1e-4, atol=1e-4)  # the region does change the features
    torch.testing.assert_close(extract_features(model, data), exact, rtol=0, atol=0)  # not the bf16 file
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(extract_features(model, data), low)  # its own entry
    key = feature_key(model, data)
    assert feature_key(model, data, "cpu") == key
    gpu = feature_key(model, data, "cuda")  # reads settings only: no GPU needed
    assert gpu != key
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", not torch.backends.cudnn.allow_tf32)
    assert feature_key(model, data, "cuda") != gpu
    assert feature_key(model, data) == key  # a CUDA setting leaves the CPU's key alone


def test_a_damaged_cache_file_is_computed_anew(monkeypatch, tmp_path):
    """A truncated cache file (a full disk, a bad copy) raised safetensors' 'invalid header length' from every later
    probe of that model and data, until the user found and deleted it; now it is a miss, recomputed and replaced."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    model, data = tiny_vit(), _shapes()
    feats = extract_features(model, data)
    (f,) = (tmp_path / "features").glob("*.safetensors")
    for damaged in (f.read_bytes()[:50], b""):
        f.write_bytes(damaged)
        torch.testing.assert_close(extract_features(model, data), feats, rtol=0, atol=0)
        assert f.read_bytes() != damaged  # replaced by a good file
    monkeypatch.setattr(model, "forward_features", lambda *a: (_ for _ in ()).throw(AssertionError("recomputed")))
    assert torch.equal(extract_features(model, data), feats)  # and served from it


def test_a_cache_that_cannot_be_written_keeps_the_features(monkeypatch, tmp_path):
    """VITLAB_CACHE naming a file (or a read-only or full disk) failed every probe with FileExistsError or
    safetensors' 'Error while serializing' after the features were computed; the features are returned now, and a
    CacheWarning names the cache folder and VITLAB_CACHE."""
    from safetensors import SafetensorError

    import vitlab.probe.features
    from vitlab.data.datasets import CacheWarning

    model, data = tiny_vit(), _shapes()
    expected = extract_features(model, data, cache=False)
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "afile"))
    with pytest.warns(CacheWarning, match=r"afile.*going on without it.*set VITLAB_CACHE to a writable folder"):
        torch.testing.assert_close(extract_features(model, data), expected, rtol=0, atol=0)
    assert (tmp_path / "afile").read_text() == "not a folder"

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vitlab.probe.features, "save_file", full_disk)
    with pytest.warns(CacheWarning, match="disk full.*going on without it") as got:  # a DiskFullError now
        torch.testing.assert_close(extract_features(model, data), expected, rtol=0, atol=0)
    assert ": None" not in str(got[0].message)  # no filename field to append
    assert list((tmp_path / "cache" / "features").iterdir()) == []  # no temporary left behind


def test_features_resize_to_the_model_input_and_work_for_a_resnet():
    data = load_shapes("test", n=4, size=48)  # 48 px images, 32 px models
    assert extract_features(tiny_vit(), data, cache=False).shape == (4, 192)
    assert extract_features(tiny_bit(), data, cache=False).shape[0] == 4


def test_features_take_missing_preprocessing_from_timms_defaults_and_resize_without_a_crop():
    """A pretrained config without mean and std gets timm's defaults, as every other vitlab path does (through
    resolve_data_config), not a private fallback; a crop_pct below 1 still resizes the whole image."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, resolve_data_config

    model = tiny_vit().eval()
    model.pretrained_cfg = {k: v for k, v in model.pretrained_cfg.items() if k not in ("mean", "std")} | {
        "crop_pct": 0.875}
    assert resolve_data_config({}, model=model)["mean"] == IMAGENET_DEFAULT_MEAN
    data = load_shapes("test", n=4, size=48)
    x = torch.nn.functional.interpolate(data.images.permute(0, 3, 1, 2).float() / 255, size=(32, 32), mode="bicubic",
                                        antialias=True, align_corners=False).clamp(0, 1)
    x = (x - torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(x), pre_logits=True)
    torch.testing.assert_close(extract_features(model, data, cache=False), expected, rtol=1e-5, atol=1e-5)


def test_the_probe_says_what_each_models_own_readout_is():
    """`vitlab probe` described every model's features as 'the class token; the mean of the class and distillation
    tokens for a distilled ViT', also a ResNet's (no tokens) and an average-pooled ViT's: it now names what this
    model reads out."""
    import timm

    import vitlab
    from vitlab.probe.features import readout_description

    assert readout_description(tiny_vit(), "model") == "the model's own readout (the class token)"
    assert readout_description(vitlab.load_model(), "model") == (
        "the model's own readout (the mean of the class and distillation tokens)")  # the distilled default
    assert readout_description(tiny_vit(readout="avg"), "model") == (
        "the model's own readout (the mean of the final patch tokens)")
    assert readout_description(tiny_bit(), "model") == "the model's own readout (its globally pooled final feature map)"
    siglip = timm.create_model("vit_base_patch16_siglip_224", pretrained=False, depth=1, num_classes=0, img_size=32)
    assert readout_description(siglip, "model") == "the model's own readout (its attention pool over the final tokens)"
    assert readout_description(tiny_bit(), "patch_mean") == "the mean of the final patch tokens"
