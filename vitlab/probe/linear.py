"""Linear probes on frozen features: the paper's few-shot protocol (section 4.1) and a full logistic probe.

Few-shot (as the authors' big_vision evaluator): features whitened with the training set's mean and standard
deviation, a constant bias feature (100, so the bias is almost unregularised) appended, targets one-hot in
{-1, 1}^K, and ridge regression ``W = (X^T X + l2 I)^-1 X^T Y`` solved in closed form (float64, through an
eigendecomposition so that many l2 values cost one factorisation). Prediction: argmax of ``X W``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted
from torch import Tensor

from vitlab.base.checks import whole_index
from vitlab.base.choices import DEFAULT_L2
from vitlab.data.datasets import DataError, k_shot_indices

try:
    from sklearn.utils.validation import validate_data
except ImportError:  # scikit-learn < 1.6 (pyproject allows >= 1.4): the same check through the old method
    def validate_data(estimator, /, X="no_validation", y="no_validation", **check_params):
        if "ensure_all_finite" in check_params:
            check_params["force_all_finite"] = check_params.pop("ensure_all_finite")
        return estimator._validate_data(X, y, **check_params)

__all__ = ["FewShotRidge", "few_shot_accuracy", "linear_probe_accuracy", "check_features", "FewShotResult",
           "DEFAULT_L2", "DEFAULT_SHOTS"]

DEFAULT_SHOTS = (1, 5, 10, 25)
BIAS_FEATURE = 100.0


def _nonfinite_message(bad: np.ndarray, what: str) -> str:
    """The error for feature rows with NaN or infinite values (``bad``: boolean mask over the rows)."""
    rows = np.flatnonzero(bad)[:5].tolist()
    return (f"{what} features contain NaN or infinite values ({int(bad.sum())} rows, e.g. {rows}): "
            "check the model's outputs (a diverged checkpoint?) before probing")


def check_features(features: Tensor, labels: Tensor, what: str = "train") -> tuple[Tensor, Tensor]:
    """Validated float64 (N, D) features and int64 (N,) labels, or a ``ValueError`` naming the problem."""
    features, labels = torch.as_tensor(features), torch.as_tensor(labels)
    if features.dim() != 2:
        raise ValueError(f"{what} features must be (N, D), got shape {tuple(features.shape)}")
    if labels.dim() != 1 or len(labels) != len(features):
        raise ValueError(f"{what}: {len(features)} feature rows but labels of shape {tuple(labels.shape)}: "
                         "pass one label per row")
    if len(features) == 0:
        raise ValueError(f"{what}: no examples")
    bad = ~torch.isfinite(features).all(1)
    if bad.any():
        raise ValueError(_nonfinite_message(bad.cpu().numpy(), what))
    if labels.is_floating_point():
        raise ValueError(f"{what} labels must be integer class indices, got {labels.dtype}")
    return features.double(), labels.long()


def _check_l2(l2: object) -> float:
    """``l2`` as a float, or a ``ValueError`` unless it is a positive finite real number."""
    if isinstance(l2, bool) or not isinstance(l2, numbers.Real) or not (math.isfinite(l2) and l2 > 0):
        raise ValueError(f"l2 must be a positive finite number (the ridge penalty), got {l2!r}: pass e.g. "
                         f"FewShotRidge(l2={DEFAULT_L2:g}) (the default) or set_params(l2=...)")
    return float(l2)


def _as_numpy(a):
    """Torch tensors (any device, float ones as float64: bfloat16 has no NumPy dtype) as NumPy arrays; anything
    else unchanged, for scikit-learn to validate."""
    if not isinstance(a, Tensor):
        return a
    a = a.detach().cpu()
    return (a.double() if a.is_floating_point() else a).numpy()


class FewShotRidge(ClassifierMixin, BaseEstimator):
    """Regularised least squares to {-1, 1}^K targets on whitened features: a scikit-learn classifier.

    ``fit`` whitens the features with the training mean and standard deviation (+1e-5), appends a constant
    bias feature (100, so the bias is almost unregularised), and factorises the normal equations once
    (float64 eigendecomposition), so ``l2`` may be changed after ``fit`` (``set_l2`` or ``set_params``)
    without refitting. ``predict`` returns the argmax class, as an element of ``classes_``.

    Inputs are anything scikit-learn's ``validate_data`` accepts (NumPy arrays, lists, ...); CPU or GPU torch
    tensors are accepted too as a convenience and converted. Outputs are always NumPy arrays. Class labels
    may be any sortable labels (ints, strings).

    Parameters
    ----------
    l2 : float, default DEFAULT_L2 (2**10, big_vision's few-shot default)
        Ridge penalty; a positive finite number, checked in ``fit`` (``__init__`` only stores it).

    Attributes
    ----------
    classes_ : ndarray of shape (K,)
        The sorted class labels seen in ``fit``.
    n_features_in_ : int
        Number of features seen in ``fit`` (``feature_names_in_`` too, when fitted on named columns).
    mean_, std_ : ndarray of shape (n_features_in_,)
        The whitening statistics (``std_`` includes the 1e-5).
    coef_ : ndarray of shape (n_features_in_ + 1, K)
        Weights on the whitened features plus the bias feature (last row) for the current ``l2``; computed
        on access from the stored factorisation. Note the layout (features x classes) is the paper's ``W``,
        the transpose of scikit-learn's linear-model convention.

    ``decision_function`` returns (N, K) scores, or for two classes the (N,) margin ``score[1] - score[0]``
    (positive means ``classes_[1]``), as scikit-learn expects of binary classifiers.

    Estimator checks: ``sklearn.utils.estimator_checks.check_estimator(FewShotRidge())`` passes every check
    it runs (scikit-learn 1.9.1; tests/test_probe.py runs them through ``parametrize_with_checks`` with no
    ``expected_failed_checks``), so none is skipped or expected to fail on our side. scikit-learn itself
    skips two where the environment lacks what they need: ``check_array_api_input`` (runs only with
    ``SCIPY_ARRAY_API=1``; the probe declares no array-API support, its default tag) and
    ``check_classifier_data_not_an_array`` (needs pandas). ``fit`` has no ``sample_weight`` parameter, so
    scikit-learn does not generate its sample-weight checks.
    """

    def __init__(self, l2: float = DEFAULT_L2) -> None:
        self.l2 = l2

    def fit(self, X, y) -> FewShotRidge:
        _check_l2(self.l2)
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), dtype=np.float64, ensure_all_finite=False)
        bad = ~np.isfinite(X).all(1)
        if bad.any():
            raise ValueError(_nonfinite_message(bad, "train"))
        check_classification_targets(y)
        classes, y_index = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"only one class ({classes.tolist()}) in the training labels: need examples of at "
                             "least 2 classes to fit a classifier")
        X = torch.tensor(X)
        mean = X.mean(0)
        std = X.std(0, unbiased=False) + 1e-5
        self.classes_, self.mean_, self.std_ = classes, mean.numpy(), std.numpy()
        Xw = self._design(X)
        Y = 2.0 * (torch.from_numpy(y_index)[:, None] == torch.arange(len(classes))[None]).double() - 1.0  # (N, K)
        N, D = Xw.shape
        if N >= D:  # (X^T X + l2 I)^-1 X^T Y through X^T X = Q diag(e) Q^T
            e, Q = torch.linalg.eigh(Xw.T @ Xw)
            lhs, rhs = Q, Q.T @ (Xw.T @ Y)
        else:  # X^T (X X^T + l2 I)^-1 Y: the N x N system when there are fewer examples than features
            e, Q = torch.linalg.eigh(Xw @ Xw.T)
            lhs, rhs = Xw.T @ Q, Q.T @ Y
        self._lhs, self._rhs, self._eigs = lhs.numpy(), rhs.numpy(), e.clamp_min(0).numpy()
        return self

    def _design(self, X: Tensor) -> Tensor:
        """Whitened float64 features with the bias feature appended."""
        Xw = (X - torch.from_numpy(self.mean_)) / torch.from_numpy(self.std_)
        return torch.cat([Xw, torch.full((len(Xw), 1), BIAS_FEATURE, dtype=Xw.dtype)], dim=1)

    def _weights(self) -> Tensor:
        check_is_fitted(self)
        l2 = _check_l2(self.l2)
        return (torch.from_numpy(self._lhs) / (torch.from_numpy(self._eigs) + l2)) @ torch.from_numpy(self._rhs)

    @property
    def coef_(self) -> np.ndarray:
        """(D + 1, K) weights on the whitened features plus the bias feature, for the current ``l2``."""
        return self._weights().numpy()

    def set_l2(self, l2: float) -> FewShotRidge:
        """Change the penalty in place (no refit needed); same as ``set_params(l2=l2)`` but checked now."""
        self.l2 = _check_l2(l2)
        return self

    def _scores(self, X) -> np.ndarray:
        """(N, K) scores ``X W`` on validated float64 features."""
        check_is_fitted(self)
        X = validate_data(self, _as_numpy(X), reset=False, dtype=np.float64, ensure_all_finite=False)
        bad = ~np.isfinite(X).all(1)
        if bad.any():
            raise ValueError(_nonfinite_message(bad, "test"))
        return (self._design(torch.tensor(X)) @ self._weights()).numpy()

    def decision_function(self, X) -> np.ndarray:
        """(N, K) class scores; for two classes the (N,) margin towards ``classes_[1]``."""
        scores = self._scores(X)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict(self, X) -> np.ndarray:
        """The highest-scoring class of each row, as elements of ``classes_`` (a NumPy array)."""
        index = self._scores(X).argmax(1)  # first: it checks that the probe is fitted
        return self.classes_[index]

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy (``ClassifierMixin.score``); torch tensors are accepted for ``X`` and ``y``."""
        return float(super().score(_as_numpy(X), _as_numpy(y), sample_weight=sample_weight))


@dataclass(frozen=True)
class FewShotResult:
    """Accuracy of one shot count over seeds."""

    shots: int
    mean: float
    std: float  # sample standard deviation over seeds (0 for one seed)
    per_seed: tuple[float, ...]


def few_shot_accuracy(train_features: Tensor, train_labels: Tensor, test_features: Tensor, test_labels: Tensor,
                      shots: Sequence[int] = DEFAULT_SHOTS, seeds: Sequence[int] = (0, 1, 2),
                      l2: float = DEFAULT_L2) -> dict[int, FewShotResult]:
    """Few-shot accuracy on the test set: for each shot count k and seed, k training examples per class
    are drawn (``vitlab.data.datasets.k_shot_indices``), the ridge probe fitted on them, and the test set scored."""
    Xtr, ytr = check_features(train_features, train_labels, "train")
    Xte, yte = check_features(test_features, test_labels, "test")
    if Xtr.shape[1] != Xte.shape[1]:
        raise ValueError(f"train features have {Xtr.shape[1]} dimensions but test features {Xte.shape[1]}: "
                         "extract both with the same model")
    classes, counts = torch.unique(ytr, return_counts=True)  # any integer labels, negative ones too
    if len(classes) < 2:
        raise ValueError(f"the training labels hold only class {classes.tolist()}: a probe needs at least 2 classes")
    unseen = sorted(set(torch.unique(yte).tolist()) - set(classes.tolist()))
    if unseen:
        raise ValueError(f"test labels {unseen} never occur in the training labels")
    if not shots or any(not whole_index(k) or k < 1 for k in shots):  # 1.5 is no shot count, True no 1
        raise ValueError(f"shots must be positive integers, got {list(shots)}")
    if int(max(shots)) > int(counts.min()):
        c = int(classes[counts.argmin()])
        raise ValueError(f"{max(shots)} shots need {max(shots)} training examples per class, but class {c} has only "
                         f"{int(counts.min())}: lower the shots or add data")
    if not seeds:
        raise ValueError("need at least one seed")
    if not all(whole_index(seed) for seed in seeds):  # 0.5 is no seed (int() would draw seed 0 again)
        raise ValueError(f"seeds must be whole numbers, got {list(seeds)}")
    if len({int(seed) for seed in seeds}) != len(seeds):  # one draw counted twice: a spread over fewer draws
        raise ValueError(f"seeds names a seed twice ({[int(seed) for seed in seeds]}): each once, or one draw counts twice and the "
                         "spread looks smaller than it is")
    out = {}
    for k in shots:
        accs = []
        for seed in seeds:
            try:
                idx = k_shot_indices(ytr, int(k), seed=int(seed))
            except DataError as e:  # pragma: no cover - excluded by the count check above
                raise ValueError(str(e)) from e
            accs.append(FewShotRidge(l2).fit(Xtr[idx], ytr[idx]).score(Xte, yte))
        std = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
        out[int(k)] = FewShotResult(int(k), float(np.mean(accs)), std, tuple(accs))
    return out


def linear_probe_accuracy(train_features: Tensor, train_labels: Tensor, test_features: Tensor,
                          test_labels: Tensor, C: float = 1.0, max_iter: int = 1000) -> float:
    """The second protocol: multinomial logistic regression (scikit-learn, lbfgs) on all training features,
    standardised; test accuracy."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    Xtr, ytr = check_features(train_features, train_labels, "train")
    Xte, yte = check_features(test_features, test_labels, "test")
    if len(torch.unique(ytr)) < 2:
        raise ValueError("the training labels hold only one class: a probe needs at least 2 classes")
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
    clf.fit(Xtr.cpu().numpy(), ytr.cpu().numpy())  # scikit-learn reads the CPU: features may be on a GPU
    return float(clf.score(Xte.cpu().numpy(), yte.cpu().numpy()))


def format_table(results: dict[int, FewShotResult], full: float | None = None) -> str:
    """Plain-text table: shots, mean accuracy, spread over seeds."""
    lines = [f"{'shots':>6} {'accuracy':>9} {'± std':>7} {'seeds':>6}"]
    for k, r in results.items():
        lines.append(f"{k:>6} {100 * r.mean:>8.2f}% {100 * r.std:>6.2f} {len(r.per_seed):>6}")
    if full is not None and not math.isnan(full):
        lines.append(f"{'all':>6} {100 * full:>8.2f}%  (logistic regression on all training features)")
    return "\n".join(lines)
