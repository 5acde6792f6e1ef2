"""A verdict and how it is decided: a statistic, its 95% interval, a threshold and a decision rule.

*reproduced* when the whole interval lies on the finding's side of the threshold, *not reproduced* when the whole
interval lies on the other side, *inconclusive* when it straddles (or touches) the threshold or could not be computed.

Intervals are percentile bootstraps (``N_BOOT`` resamples from ``numpy.random.default_rng(SEED)``, so a
verdict is deterministic) over the unit that varies: images, patches, filter components, or seeds; the mean of
fewer than ``MIN_MEAN_BOOTSTRAP`` (20) replicates takes a Student-t interval instead (a percentile bootstrap of a
few values is too narrow: about 79% coverage for a nominal 95% at 4 seeds), and replicates without spread (all equal,
or spread less than the measurement resolves) take none: a zero-width interval would decide on no uncertainty. A
resample is drawn as a vector of counts (how often each unit was drawn), so every statistic is evaluated on all
resamples at once as a weighted statistic, which equals the statistic on the repeated units.

The findings decided this way: ``vitlab.findings`` (one model's) and ``vitlab.study_findings`` (the studies'); in
words: ``vitlab.explain``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from torch import Tensor

from vitlab.checks import check_seed, whole_index

__all__ = ["Verdict", "verdict_table", "runs_words", "across_conventions", "validated", "DEPENDS_ON_CONVENTION",
           "FAILS_CONTROL", "fmt_value", "fmt_endpoint", "fmt_threshold", "json_types",
           "make_verdict", "decide", "mean_interval", "prediction_interval", "jackknife_interval", "bootstrap_counts", "percentile_interval",
           "spearman_resampled", "as_float64", "n_units", "none_reason", "Resolution", "N_BOOT", "SEED", "LEVEL",
           "MIN_MEAN_BOOTSTRAP", "MIN_ORDER_PREDICTION", "NOT_FINITE", "VERDICTS"]


N_BOOT = 1000
SEED = 0
LEVEL = 0.95
#: the fewest units the interval of a mean is bootstrapped over; below it, Student t. A percentile bootstrap of a
#: mean of n normal replicates covers about 79% at n = 4 and 87% at n = 8 instead of 95% (it ignores that the
#: spread itself is estimated), so few seeds get the t interval, whose coverage is exact for normal data.
MIN_MEAN_BOOTSTRAP = 20
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
#: the qualifier of a verdict that differs between two forms of a standard convention (``across_conventions``)
DEPENDS_ON_CONVENTION = "depends on convention"
#: the qualifier of a verdict whose criterion did not give a control's known answer (``validated``)
FAILS_CONTROL = "its criterion fails a control"

Array = Tensor | np.ndarray | Sequence[float]


@dataclass(frozen=True)
class Verdict:
    """One finding checked: ``statistic`` with its 95% ``interval`` against ``threshold``.

    ``side`` is where the finding puts the statistic (``">"``: above the threshold, ``"<"``: below);
    ``quantity`` and ``unit`` name the statistic for ``summary()``. ``subject``: what was judged, the model (or the
    runs, or the study) and the data, e.g. "vit_cifar10 on 128 CIFAR-10 test images" ("" where the maker did not
    say); ``n_runs``: the training runs the interval covers (1: the interval is over images, patches or draws of one
    run, which it does not generalise beyond; a recipe's seeds: ``vitlab.recipe.combine_runs``).

    ``key``: the finding's stable id (``"fig7.right.depth_trend"``; "" in records made before it existed);
    ``threshold_source``: where the threshold comes from (a figure of the paper read off, a control, or a stated
    convention). ``conventions``: the verdict under each form of a standard convention it depends on, {name:
    {"statistic", "interval", "verdict"}}, the first being the one whose numbers the verdict shows
    (``across_conventions``); ``controls``: its criterion run on controls with a known answer, one
    ``{"control", "kind", "expected", "observed", "statistic", "interval", "passed"}`` each
    (``vitlab.controls``); ``qualifier``: why an ``inconclusive`` (or any verdict) needs more words than its
    interval gives, e.g. ``DEPENDS_ON_CONVENTION``; ``label`` joins it to the verdict.
    """

    finding: str
    criterion: str
    statistic: float
    interval: tuple[float, float]
    threshold: float
    verdict: str
    details: dict[str, Any] = field(default_factory=dict)
    side: str = ">"
    quantity: str = "statistic"
    unit: str = ""
    subject: str = ""
    n_runs: int = 1
    key: str = ""
    threshold_source: str = ""
    conventions: dict[str, Any] = field(default_factory=dict)
    controls: list[dict[str, Any]] = field(default_factory=list)
    qualifier: str = ""

    @property
    def label(self) -> str:
        """The verdict in the words a reader acts on: "inconclusive (depends on convention)", "reproduced"."""
        return f"{self.verdict} ({self.qualifier})" if self.qualifier else self.verdict

    @property
    def failed_controls(self) -> list[str]:
        """The controls whose expected result its criterion did not give (``controls``), by name."""
        return [c["control"] for c in self.controls if not c.get("passed")]

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.side not in (">", "<"):
            raise ValueError(f"side must be '>' or '<', got {self.side!r}")
        if not whole_index(self.n_runs) or self.n_runs < 1:
            raise ValueError(f"n_runs must be a whole number of training runs, at least 1, got {self.n_runs!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (NaN becomes None), ready for ``json.dumps(..., allow_nan=False)``."""
        return json_types(asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        def num(x: Any) -> float:
            return math.nan if x is None else float(x)

        return cls(**{**d, "statistic": num(d["statistic"]), "threshold": num(d["threshold"]),
                      "interval": (num(d["interval"][0]), num(d["interval"][1])), "details": dict(d["details"]),
                      "conventions": dict(d.get("conventions") or {}),
                      "controls": [dict(c) for c in d.get("controls") or []]})

    def summary(self) -> str:
        """``reproduced      <finding> (<subject>): rising steps 1 of steps [0.833, 1] > 0.5, one training run``"""
        unit = f" {self.unit}" if self.unit else ""
        lo, hi = self.interval
        t = self.threshold
        subject = f" ({self.subject})" if self.subject else ""
        return (f"{self.label:<14}  {self.finding}{subject}: {self.quantity} {fmt_value(self.statistic)}{unit} "
                f"[{fmt_endpoint(lo, t)}, {fmt_endpoint(hi, t)}] {self.side} {fmt_threshold(t)}, "
                f"{runs_words(self.n_runs)}")


def runs_words(n_runs: int) -> str:
    """The training runs an interval covers, in words: "one training run" (it says nothing of another run of the
    same recipe), "3 seeds"."""
    return "one training run" if n_runs == 1 else f"{n_runs} seeds"


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """A plain-text table: finding, subject (what was judged), statistic [95% interval] against the threshold with
    the training runs the interval covers, verdict."""
    rows = [("finding", "subject", "statistic [95% interval]", "verdict")]
    for v in verdicts:
        unit = f" {v.unit}" if v.unit else ""
        lo, hi = v.interval
        t = v.threshold
        rows.append((v.finding, v.subject or "-", f"{fmt_value(v.statistic)} [{fmt_endpoint(lo, t)}, "
                     f"{fmt_endpoint(hi, t)}]{unit} {v.side} {fmt_threshold(t)}, {runs_words(v.n_runs)}", v.label))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_value(x: float) -> str:
    return _not_finite_text(x) if x is None or not math.isfinite(x) else f"{x:.3g}"


def _finite(*xs: float | None) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


def _fewest_digits(x: float, keeps: Callable[[float], bool]) -> str:
    """``x`` in the fewest significant digits, at least 3, whose printed value ``keeps`` accepts (all of them: repr)."""
    return next((text for d in range(3, 18) if keeps(float(text := f"{x:.{d}g}"))), repr(float(x)))


def _not_finite_text(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3g}"  # as the report writes a missing value; inf stays inf


def fmt_threshold(t: float) -> str:
    """A threshold in the fewest significant digits, at least 3, that print it exactly ("0.5", "0")."""
    return _fewest_digits(t, lambda printed: printed == t) if _finite(t) else _not_finite_text(t)


def fmt_endpoint(x: float, threshold: float) -> str:
    """An interval endpoint in at least 3 significant digits, more where fewer would round it onto or across
    ``threshold``: 0.50049 against 0.5 prints "0.5005", not "0.5". Beside ``fmt_threshold(threshold)`` the printed
    numbers compare as the true ones do, so a printed interval never contradicts its verdict."""
    if not _finite(x, threshold):
        return _not_finite_text(x)  # no threshold to keep a side of
    side = _sign(x - threshold)
    return _fewest_digits(x, lambda printed: _sign(printed - threshold) == side)


def json_types(x: Any) -> Any:
    """Numbers, arrays and tensors inside dicts/lists -> JSON types; NaN/inf -> None; keys -> str."""
    if isinstance(x, Mapping):
        return {str(k): json_types(v) for k, v in x.items()}
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return json_types(x.tolist())
    if isinstance(x, (list, tuple)):
        return [json_types(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def as_float64(x: Array) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def decide(interval: tuple[float, float], threshold: float, side: str) -> str:
    lo, hi = interval
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    above, below = lo > threshold, hi < threshold
    if side == ">":
        return "reproduced" if above else "not reproduced" if below else "inconclusive"
    return "reproduced" if below else "not reproduced" if above else "inconclusive"


def n_units(n: int, unit: str) -> str:
    """``n`` units in words: "1 image", "2 images"."""
    return f"{n} {unit.removesuffix('s') if n == 1 else unit}"


def none_reason(method: str) -> str | None:
    """Why ``mean_interval`` or ``prediction_interval`` gave no interval ("2 seeds, at least ... needed"), from the
    method it returned; None when it gave one."""
    return method.removeprefix("none: ") if method.startswith("none: ") else None


#: why a verdict has no interval when its maker gave no reason: every resample's statistic was NaN or infinite
NOT_FINITE = "the statistic is not finite on the data or on any resample"


def make_verdict(finding: str, criterion: str, statistic: float, interval: tuple[float, float], threshold: float,
                 side: str, quantity: str, unit: str, details: dict[str, Any],
                 no_interval: str | None = None, *, subject: str = "", n_runs: int = 1, key: str = "",
                 threshold_source: str = "") -> Verdict:
    """A verdict decided by ``decide``. Where the interval is not finite, ``details["no_interval"]`` says why
    (``no_interval``, e.g. "2 images, at least 16 needed"; ``NOT_FINITE`` when none is given). ``subject`` and
    ``n_runs``: as ``Verdict`` has them."""
    interval = (float(interval[0]), float(interval[1]))
    if not (math.isfinite(interval[0]) and math.isfinite(interval[1])):
        details = {**details, "no_interval": no_interval or NOT_FINITE}
    return Verdict(finding=finding, criterion=criterion, statistic=float(statistic), interval=interval,
                   threshold=float(threshold), verdict=decide(interval, threshold, side), details=json_types(details),
                   side=side, quantity=quantity, unit=unit, subject=subject, n_runs=n_runs, key=key,
                   threshold_source=threshold_source)


def _joined(*qualifiers: str) -> str:
    return "; ".join(dict.fromkeys(q for q in qualifiers if q))


def across_conventions(verdicts: Mapping[str, Verdict]) -> Verdict:
    """One verdict from the same finding judged under each form of a standard convention ({name: verdict}, e.g.
    prefix tokens dropped with and without renormalising): the first one's numbers, with every form's statistic,
    interval and verdict in ``conventions``. Where the forms give different verdicts it is ``inconclusive`` with the
    qualifier ``DEPENDS_ON_CONVENTION``: which form is right is a convention, not something the data decide."""
    if not verdicts:
        raise ValueError("across_conventions needs at least one verdict")
    first = next(iter(verdicts.values()))
    record = {name: {"statistic": v.statistic, "interval": list(v.interval), "verdict": v.verdict}
              for name, v in verdicts.items()}
    details = {**first.details, "convention": next(iter(verdicts))}
    if len({v.verdict for v in verdicts.values()}) == 1:
        return replace(first, conventions=json_types(record), details=details)
    return replace(first, verdict="inconclusive", conventions=json_types(record), details=details,
                   qualifier=_joined(first.qualifier, DEPENDS_ON_CONVENTION))


def validated(v: Verdict, controls: Sequence[Mapping[str, Any]]) -> Verdict:
    """``v`` with the results of its criterion on controls (``vitlab.controls``: each a mapping with at least
    ``control`` and ``passed``). Where one failed, the qualifier ``FAILS_CONTROL`` says so, and a ``reproduced``
    becomes ``inconclusive``: a criterion that misjudges a case with a known answer cannot establish the finding."""
    rows = [json_types(dict(c)) for c in controls]
    if all(c["passed"] for c in rows):
        return replace(v, controls=rows)
    return replace(v, controls=rows, verdict="inconclusive" if v.verdict == "reproduced" else v.verdict,
                   qualifier=_joined(v.qualifier, FAILS_CONTROL))


def bootstrap_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) how often each of ``n`` units is drawn in each bootstrap resample of size ``n``."""
    if n < 1:
        raise ValueError("nothing to resample: no units")
    if not whole_index(n_boot) or n_boot < 1:  # True is no 1 resample
        raise ValueError(f"n_boot must be a whole number of at least 1, got {n_boot!r}")
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
        return (math.nan, math.nan), f"none: {n_units(n, unit)}, at least 2 needed"
    flat = _no_spread(values, unit, resolution)
    if flat is not None:
        return (math.nan, math.nan), f"none: {flat}"
    if n < MIN_MEAN_BOOTSTRAP:
        from scipy.stats import t

        half = float(t.ppf(0.975, n - 1)) * values.std(ddof=1) / math.sqrt(n)
        return (float(values.mean() - half), float(values.mean() + half)), f"Student t over {n} {unit} ({n - 1} df)"
    w = bootstrap_counts(n, n_boot, seed)
    return percentile_interval(w @ values / n), f"bootstrap over {n} {unit}, {n_boot} resamples"


def jackknife_interval(statistic: float, leave_one_out: np.ndarray, unit: str) -> tuple[tuple[float, float], str]:
    """The 95% jackknife interval of a statistic computed on n units from its n values with one unit left out
    (``leave_one_out`` (n,)): statistic +- t(0.975, n - 1) * sqrt((n - 1) / n * sum (theta_i - mean theta)^2), the
    jackknife's standard error, consistent for smooth functions of U-statistics (Arvesen 1969) such as the unbiased
    HSIC's CKA, which a bootstrap over repeated units is not (a repeated image enters the Gram as two images).
    None for fewer than 2 units, for leave-one-out values without spread (``_no_spread``) or for non-finite ones."""
    values = as_float64(leave_one_out)
    n = len(values)
    if n < 2:
        return (math.nan, math.nan), f"none: {n_units(n, unit)}, at least 2 needed"
    if not (np.isfinite(values).all() and math.isfinite(statistic)):
        return (math.nan, math.nan), f"none: {NOT_FINITE}"
    flat = _no_spread(values, unit)
    if flat is not None:
        return (math.nan, math.nan), f"none: {flat}"
    from scipy.stats import t

    half = float(t.ppf(0.975, n - 1)) * math.sqrt((n - 1) / n * float(((values - values.mean()) ** 2).sum()))
    return (statistic - half, statistic + half), f"jackknife over {n} {unit} (Student t, {n - 1} df)"


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
        return (math.nan, math.nan), f"none: {n_units(n, unit)}, at least 2 needed"
    flat = _no_spread(values, unit)
    if flat is not None:
        return (math.nan, math.nan), f"none: {flat}"
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


def _weighted_ranks(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(R, M) ranks of the values ``x`` (M,) in each resample given by counts ``w`` (R, M), ties averaged: the
    rank that each value would get if it were repeated w times (as ``scipy.stats.rankdata``)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new = np.r_[True, xs[1:] != xs[:-1]]  # (M,) first of a tie group, in sorted order
    group = np.cumsum(new) - 1  # (M,) tie group of each sorted value
    ws = w[:, order]
    total = np.add.reduceat(ws, np.flatnonzero(new), axis=1)  # (R, G) count of each tie group
    mid = np.cumsum(total, axis=1) - total + (total + 1) / 2  # (R, G) mean rank of each tie group
    ranks = np.empty_like(ws)
    ranks[:, order] = mid[:, group]
    return ranks


def spearman_resampled(x: np.ndarray, y: np.ndarray, w: np.ndarray, chunk_elems: int = 4_000_000) -> np.ndarray:
    """(R,) Spearman correlation of the pairs (x, y) (M,) repeated by counts ``w`` (R, M): equal to
    ``vitlab.inspect.faithfulness.rank_correlation`` on the repeated pairs, without building them. NaN where a
    resample is constant."""
    out = np.empty(len(w))
    step = max(1, chunk_elems // max(1, len(x)))
    for s in range(0, len(w), step):
        ww = w[s:s + step]
        rx, ry = _weighted_ranks(x, ww), _weighted_ranks(y, ww)
        tot = ww.sum(1, keepdims=True)
        rx = rx - (ww * rx).sum(1, keepdims=True) / tot
        ry = ry - (ww * ry).sum(1, keepdims=True) / tot
        den = np.sqrt((ww * rx**2).sum(1) * (ww * ry**2).sum(1))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[s:s + step] = np.where(den > 0, (ww * rx * ry).sum(1) / den, np.nan)
    return out
