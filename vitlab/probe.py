"""Linear probes on frozen features: the paper's few-shot protocol (section 4.1) and a full logistic probe.

Few-shot (as the authors' big_vision evaluator): features whitened with the training set's mean and standard
deviation, a constant bias feature (100, so the bias is almost unregularised) appended, targets one-hot in
{-1, 1}^K, and ridge regression ``W = (X^T X + l2 I)^-1 X^T Y`` solved in closed form (float64, through an
eigendecomposition so that many l2 values cost one factorisation). Prediction: argmax of ``X W``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitlab.data import DataError, k_shot_indices

__all__ = ["FewShotRidge", "few_shot_accuracy", "linear_probe_accuracy", "check_features", "FewShotResult",
           "DEFAULT_L2", "DEFAULT_SHOTS"]

DEFAULT_L2 = 2.0**10  # big_vision's few-shot default
DEFAULT_SHOTS = (1, 5, 10, 25)
BIAS_FEATURE = 100.0


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
        rows = torch.nonzero(bad).flatten()[:5].tolist()
        raise ValueError(f"{what} features contain NaN or infinite values ({int(bad.sum())} rows, e.g. {rows}): "
                         "check the model's outputs (a diverged checkpoint?) before probing")
    if labels.is_floating_point():
        raise ValueError(f"{what} labels must be integer class indices, got {labels.dtype}")
    return features.double(), labels.long()


class FewShotRidge:
    """Regularised least squares to {-1, 1}^K targets on whitened features, scikit-learn style.

    ``fit(X, y)``, ``predict(X)``, ``score(X, y)``; ``l2`` may be changed after ``fit`` (``set_l2``)
    without refitting the factorisation.
    """

    def __init__(self, l2: float = DEFAULT_L2) -> None:
        if not l2 > 0:
            raise ValueError(f"l2 must be positive, got {l2}")
        self.l2 = float(l2)

    def fit(self, X: Tensor | np.ndarray, y: Tensor | np.ndarray) -> FewShotRidge:
        X, y = check_features(torch.as_tensor(X), torch.as_tensor(y))
        self.classes_ = torch.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(f"need examples of at least 2 classes to fit a classifier, got only class "
                             f"{self.classes_.tolist()}")
        self.mean_ = X.mean(0, keepdim=True)
        self.std_ = X.std(0, unbiased=False, keepdim=True) + 1e-5
        Xw = self._design(X)
        Y = 2.0 * (y[:, None] == self.classes_[None]).double() - 1.0  # (N, K) in {-1, 1}
        N, D = Xw.shape
        if N >= D:  # (X^T X + l2 I)^-1 X^T Y through X^T X = Q diag(e) Q^T
            e, Q = torch.linalg.eigh(Xw.T @ Xw)
            self._lhs, self._rhs = Q, Q.T @ (Xw.T @ Y)
        else:  # X^T (X X^T + l2 I)^-1 Y: the N x N system when there are fewer examples than features
            e, Q = torch.linalg.eigh(Xw @ Xw.T)
            self._lhs, self._rhs = Xw.T @ Q, Q.T @ Y
        self._eigs = e.clamp_min(0)
        return self

    def _design(self, X: Tensor) -> Tensor:
        Xw = (X - self.mean_) / self.std_
        return torch.cat([Xw, torch.full((len(Xw), 1), BIAS_FEATURE, dtype=Xw.dtype)], dim=1)

    @property
    def coef_(self) -> Tensor:
        """(D + 1, K) weights on the whitened features plus the bias feature, for the current ``l2``."""
        return (self._lhs / (self._eigs + self.l2)) @ self._rhs

    def set_l2(self, l2: float) -> FewShotRidge:
        self.l2 = float(l2)
        return self

    def decision_function(self, X: Tensor | np.ndarray) -> Tensor:
        X, _ = check_features(torch.as_tensor(X), torch.zeros(len(X), dtype=torch.long), "test")
        return self._design(X) @ self.coef_

    def predict(self, X: Tensor | np.ndarray) -> Tensor:
        return self.classes_[self.decision_function(X).argmax(1)]

    def score(self, X: Tensor | np.ndarray, y: Tensor | np.ndarray) -> float:
        return float((self.predict(X) == torch.as_tensor(y)).double().mean())


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
    are drawn (``vitlab.data.k_shot_indices``), the ridge probe fitted on them, and the test set scored."""
    Xtr, ytr = check_features(train_features, train_labels, "train")
    Xte, yte = check_features(test_features, test_labels, "test")
    if Xtr.shape[1] != Xte.shape[1]:
        raise ValueError(f"train features have {Xtr.shape[1]} dimensions but test features {Xte.shape[1]}: "
                         "extract both with the same model")
    classes = torch.unique(ytr)
    if len(classes) < 2:
        raise ValueError(f"the training labels hold only class {classes.tolist()}: a probe needs at least 2 classes")
    unseen = sorted(set(torch.unique(yte).tolist()) - set(classes.tolist()))
    if unseen:
        raise ValueError(f"test labels {unseen} never occur in the training labels")
    if not shots or any(int(k) < 1 for k in shots):
        raise ValueError(f"shots must be positive integers, got {list(shots)}")
    counts = torch.bincount(ytr)[classes]
    if int(max(shots)) > int(counts.min()):
        c = int(classes[counts.argmin()])
        raise ValueError(f"{max(shots)} shots need {max(shots)} training examples per class, but class {c} has only "
                         f"{int(counts.min())}: lower the shots or add data")
    if not seeds:
        raise ValueError("need at least one seed")
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
    clf.fit(Xtr.numpy(), ytr.numpy())
    return float(clf.score(Xte.numpy(), yte.numpy()))


def format_table(results: dict[int, FewShotResult], full: float | None = None) -> str:
    """Plain-text table: shots, mean accuracy, spread over seeds."""
    lines = [f"{'shots':>6} {'accuracy':>9} {'± std':>7} {'seeds':>6}"]
    for k, r in results.items():
        lines.append(f"{k:>6} {100 * r.mean:>8.2f}% {100 * r.std:>6.2f} {len(r.per_seed):>6}")
    if full is not None and not math.isnan(full):
        lines.append(f"{'all':>6} {100 * full:>8.2f}%  (logistic regression on all training features)")
    return "\n".join(lines)
