"""Intervals from replicates (seeds, draws, images): of their mean (Student t for few, a percentile bootstrap for
many) and of one more replicate, and why there is none when there is none. Statistics only; a verdict
(``vitlab.findings.verdict``) decides a finding from such an interval."""

from __future__ import annotations

import math

import numpy as np

from vitlab.base.checks import check_int, check_seed
from vitlab.base.stats import as_float64

#: bootstrap resamples, the resampling seed and the level of every interval
N_BOOT = 1000
SEED = 0
LEVEL = 0.95
#: why there is no interval when its maker gave no reason: every resample's statistic was NaN or infinite
NOT_FINITE = "the statistic is not finite on the data or on any resample"

#: the fewest units the interval of a mean is bootstrapped over; below it, Student t. A percentile bootstrap of a
#: mean of n normal replicates covers about 79% at n = 4 and 87% at n = 8 instead of 95% (it ignores that the
#: spread itself is estimated), so few seeds get the t interval, whose coverage is exact for normal data.
MIN_MEAN_BOOTSTRAP = 20


def fmt_value(x: float) -> str:
    """A statistic in 3 significant digits ("n/a" when missing)."""
    return not_finite_text(x) if x is None or not math.isfinite(x) else f"{x:.3g}"


def not_finite_text(x: float | None) -> str:
    """A missing or infinite value as the report writes it: "n/a" for None and NaN, inf stays "inf"."""
    return "n/a" if x is None or x != x else f"{x:.3g}"  # as the report writes a missing value; inf stays inf


def n_units(n: int, unit: str) -> str:
    """``n`` units in words: "1 image", "2 images"."""
    return f"{n} {unit.removesuffix('s') if n == 1 else unit}"


class NoInterval(str):
    """The method an interval maker returns when it gives no interval: written "none: <reason>" (as verdicts and
    records store it), with the reason itself in the field ``reason``, so no caller reads it back out of the text."""

    reason: str

    def __new__(cls, reason: str) -> NoInterval:
        self = super().__new__(cls, f"none: {reason}")
        self.reason = reason
        return self

    def __getnewargs__(self) -> tuple[str]:  # a copy or a pickle is made from the reason, not from the text
        return (self.reason,)


def none_reason(method: str) -> str | None:
    """Why ``mean_interval``, ``prediction_interval`` or ``jackknife_interval`` gave no interval ("2 seeds, at least
    ... needed"): the ``reason`` of the ``NoInterval`` it returned as its method; None when it gave one."""
    return method.reason if isinstance(method, NoInterval) else None


def bootstrap_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) how often each of ``n`` units is drawn in each bootstrap resample of size ``n``."""
    if n < 1:
        raise ValueError("nothing to resample: no units")
    check_int("n_boot", n_boot, 1, allowed="a whole number of at least 1", numpy=True)  # True is no 1 resample
    seed = check_seed("seed", seed)  # numpy's SeedSequence names no argument for 0.5, and takes True as seed 1
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    """The central ``LEVEL`` percentile interval of the finite bootstrap samples (NaN when there are none)."""
    s = samples[np.isfinite(samples)]
    if len(s) == 0:
        return (math.nan, math.nan)
    a = (1 - LEVEL) / 2
    return float(np.quantile(s, a)), float(np.quantile(s, 1 - a))

#: A step of a measurement: (size, in words), e.g. (1e-4, "1 of 10,000 test images") for an accuracy
Resolution = tuple[float, str]


def _no_spread(values: np.ndarray, unit: str, resolution: Resolution | None = None) -> str | None:
    """Why the replicates ``values`` (2 or more) have no spread to take an interval from, None when they have one:
    all equal (up to rounding in the last digits, as 0.255 - 0.25 against 0.305 - 0.3), or, where the step of the
    measurement is known (``resolution``), a standard deviation below that step, which the measurement cannot
    resolve. An interval from such a spread is (nearly) of zero width and decides a finding on no uncertainty."""
    n = len(values)
    sd = float(values.std(ddof=1))
    if sd <= 1e-9 * float(np.abs(values).max()):
        who = f"both {unit}" if n == 2 else f"all {n} {unit}"
        return f"{who} give the same value, {fmt_value(float(values.mean()))}, so there is no spread to take an interval from"
    if resolution is not None and sd < resolution[0]:
        return (f"the {n} {unit} spread less (sd {sd:.2g}) than one step of the measurement resolves ({resolution[1]}: "
                f"{resolution[0]:.2g})")
    return None


def mean_interval(values: np.ndarray, n_boot: int, seed: int, unit: str, resolution: Resolution | None = None
                  ) -> tuple[tuple[float, float], str]:
    """Interval of the mean of replicates (seeds, draws, images): Student t below ``MIN_MEAN_BOOTSTRAP``, a
    percentile bootstrap from there on, none for 1 or for replicates without spread (``_no_spread``)."""
    n = len(values)
    if n < 2:
        return (math.nan, math.nan), NoInterval(f"{n_units(n, unit)}, at least 2 needed")
    flat = _no_spread(values, unit, resolution)
    if flat is not None:
        return (math.nan, math.nan), NoInterval(flat)
    if n < MIN_MEAN_BOOTSTRAP:
        from scipy.stats import t

        half = float(t.ppf(0.975, n - 1)) * values.std(ddof=1) / math.sqrt(n)
        return (float(values.mean() - half), float(values.mean() + half)), f"Student t over {n} {unit} ({n - 1} df)"
    w = bootstrap_counts(n, n_boot, seed)
    return percentile_interval(w @ values / n), f"bootstrap over {n} {unit}, {n_boot} resamples"

#: the fewest replicates whose order statistics make a 95% prediction interval (ranks 1 and n at 39: 38/40 = 95%)
MIN_ORDER_PREDICTION = 39


def prediction_interval(values: np.ndarray, unit: str) -> tuple[tuple[float, float], str]:
    """Where one more replicate would fall, 95%: Student t (mean +- t sd sqrt(1 + 1/n)) below
    ``MIN_ORDER_PREDICTION`` replicates, exact for normal ones; from there on the replicates of ranks
    i = floor(0.025 (n + 1)) and j = ceil(0.975 (n + 1)), between which one more replicate of any continuous
    distribution falls with probability (j - i) / (n + 1) >= 95%. (The 2.5 and 97.5 percentiles of the replicates
    hold one more only 87% of the time at 20 replicates, 90% at 30.) None for 1 or for replicates without spread."""
    n = len(values)
    if n < 2:
        return (math.nan, math.nan), NoInterval(f"{n_units(n, unit)}, at least 2 needed")
    flat = _no_spread(values, unit)
    if flat is not None:
        return (math.nan, math.nan), NoInterval(flat)
    if n < MIN_ORDER_PREDICTION:
        from scipy.stats import t

        half = float(t.ppf(0.975, n - 1)) * values.std(ddof=1) * math.sqrt(1 + 1 / n)
        return (float(values.mean() - half), float(values.mean() + half)), \
            f"Student t prediction interval over {n} {unit} ({n - 1} df)"
    a = (1 - LEVEL) / 2
    # 1-based ranks, 1 <= i < j <= n from n = 39 (the 1e-9 keeps a product that is an integer from rounding off it)
    i, j = math.floor(a * (n + 1) + 1e-9), math.ceil((1 - a) * (n + 1) - 1e-9)
    s = np.sort(values)
    return (float(s[i - 1]), float(s[j - 1])), f"ranks {i} and {j} of {n} {unit}"


def jackknife_interval(statistic: float, leave_one_out: np.ndarray, unit: str) -> tuple[tuple[float, float], str]:
    """The 95% jackknife interval of a statistic computed on n units from its n values with one unit left out
    (``leave_one_out`` (n,)): statistic +- t(0.975, n - 1) * sqrt((n - 1) / n * sum (theta_i - mean theta)^2), the
    jackknife's standard error, consistent for smooth functions of U-statistics (Arvesen 1969) such as the unbiased
    HSIC's CKA, which a bootstrap over repeated units is not (a repeated image enters the Gram as two images).
    None for fewer than 2 units, for leave-one-out values without spread (``_no_spread``) or for non-finite ones."""
    values = as_float64(leave_one_out)
    n = len(values)
    if n < 2:
        return (math.nan, math.nan), NoInterval(f"{n_units(n, unit)}, at least 2 needed")
    if not (np.isfinite(values).all() and math.isfinite(statistic)):
        return (math.nan, math.nan), NoInterval(NOT_FINITE)
    flat = _no_spread(values, unit)
    if flat is not None:
        return (math.nan, math.nan), NoInterval(flat)
    from scipy.stats import t

    half = float(t.ppf(0.975, n - 1)) * math.sqrt((n - 1) / n * float(((values - values.mean()) ** 2).sum()))
    return (statistic - half, statistic + half), f"jackknife over {n} {unit} (Student t, {n - 1} df)"
