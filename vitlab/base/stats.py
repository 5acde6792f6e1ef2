"""Small statistics shared by the analyses: average ranks and Spearman's rank correlation, batched; the "mean ±
std" cell of the results tables."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["average_ranks", "spearman", "percent_cell", "probability_words"]


def average_ranks(x: Tensor) -> Tensor:
    """(B, N) -> (B, N) float64 ranks 0..N-1 per row, ties sharing their mean rank (as ``scipy.stats.rankdata``
    minus one, for rows without NaN; a NaN is ranked last here, where scipy would give the row NaN ranks)."""
    flat = x.double()
    r = flat.argsort(1).argsort(1).double()
    out = torch.empty_like(r)
    for i in range(len(flat)):
        _, inv, counts = torch.unique(flat[i], return_inverse=True, return_counts=True)
        mean_rank = torch.zeros(len(counts), dtype=torch.float64, device=flat.device).index_add_(0, inv, r[i]) / counts
        out[i] = mean_rank[inv]
    return out


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """(B,) float64 Spearman correlation between the rows of ``a`` and ``b`` (B, N), ties handled as scipy does.
    A constant row has no ranks to correlate: it scores 0 (not NaN), so it never passes for structure. A row with a
    NaN in either input scores NaN, as scipy's ``spearmanr`` (whose default propagates NaN)."""
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    den = (ra.norm(dim=1) * rb.norm(dim=1)).clamp_min(1e-300)
    rho = (ra * rb).sum(1) / den
    missing = a.double().isnan().any(1) | b.double().isnan().any(1)
    return torch.where(missing, torch.full_like(rho, math.nan), rho)


def percent_cell(values: Sequence[float]) -> str:
    """``"mean ± std"`` of fractions, in % to one decimal (sample std, ddof 1; ``± 0.0`` for one value): the cell
    of the sweep's and the MPP study's README tables."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarise")
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def probability_words(p: float) -> str:
    """A predicted class's probability as a caption prints it: whole percents from 1%, one decimal below (a random
    ImageNet model's 0.1% is no "0%"), "< 0.1%" under that; NaN (nothing predicted) as "n/a"."""
    if math.isnan(p):
        return "n/a"
    if p >= 0.01:
        return f"{p:.0%}"
    return f"{p:.1%}" if p >= 0.00095 else "< 0.1%"


Array = Tensor | np.ndarray | Sequence[float]


def as_float64(x: Array) -> np.ndarray:
    """``x`` (tensor, array or sequence) as a float64 numpy array, on the CPU, detached."""
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)
