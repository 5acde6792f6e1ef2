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

The findings decided this way: ``vitlab.findings.model`` (one model's) and ``vitlab.findings.studies`` (the studies'); in
words: ``vitlab.findings.explain``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from torch import Tensor

from vitlab.base.checks import check_int
from vitlab.base.intervals import (
    NOT_FINITE,
    fmt_value,
    not_finite_text,
)

__all__ = ["Verdict", "verdict_table", "runs_words", "across_conventions", "validated", "DEPENDS_ON_CONVENTION",
           "FAILS_CONTROL", "fmt_endpoint", "fmt_threshold", "json_types", "make_verdict", "decide",
           "spearman_resampled", "VERDICTS"]


VERDICTS = ("reproduced", "not reproduced", "inconclusive")
#: the qualifier of a verdict that differs between two forms of a standard convention (``across_conventions``)
DEPENDS_ON_CONVENTION = "depends on convention"
#: the qualifier of a verdict whose criterion did not give a control's known answer (``validated``)
FAILS_CONTROL = "its criterion fails a control"


@dataclass(frozen=True)
class Verdict:
    """One finding checked: ``statistic`` with its 95% ``interval`` against ``threshold``.

    ``side`` is where the finding puts the statistic (``">"``: above the threshold, ``"<"``: below);
    ``quantity`` and ``unit`` name the statistic for ``summary()``. ``subject``: what was judged, the model (or the
    runs, or the study) and the data, e.g. "vit_cifar10 on 128 CIFAR-10 test images" ("" where the maker did not
    say); ``n_runs``: the training runs the interval covers (1: the interval is over images, patches or draws of one
    run, which it does not generalise beyond; a recipe's seeds: ``vitlab.findings.recipe.combine_runs``).

    ``key``: the finding's stable id (``"fig7.right.depth_trend"``; "" in records made before it existed);
    ``threshold_source``: where the threshold comes from (a figure of the paper read off, a control, or a stated
    convention). ``conventions``: the verdict under each form of a standard convention it depends on, {name:
    {"statistic", "interval", "verdict"}}, the first being the one whose numbers the verdict shows
    (``across_conventions``); ``controls``: its criterion run on controls with a known answer, one
    ``{"control", "kind", "expected", "observed", "statistic", "interval", "passed"}`` each
    (``vitlab.findings.controls``); ``qualifier``: why an ``inconclusive`` (or any verdict) needs more words than its
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
        check_int("n_runs", self.n_runs, 1, allowed="a whole number of training runs, at least 1", numpy=True)

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


def _finite(*xs: float | None) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


def _fewest_digits(x: float, keeps: Callable[[float], bool]) -> str:
    """``x`` in the fewest significant digits, at least 3, whose printed value ``keeps`` accepts (all of them: repr)."""
    return next((text for d in range(3, 18) if keeps(float(text := f"{x:.{d}g}"))), repr(float(x)))


def fmt_threshold(t: float) -> str:
    """A threshold in the fewest significant digits, at least 3, that print it exactly ("0.5", "0")."""
    return _fewest_digits(t, lambda printed: printed == t) if _finite(t) else not_finite_text(t)


def fmt_endpoint(x: float, threshold: float) -> str:
    """An interval endpoint in at least 3 significant digits, more where fewer would round it onto or across
    ``threshold``: 0.50049 against 0.5 prints "0.5005", not "0.5". Beside ``fmt_threshold(threshold)`` the printed
    numbers compare as the true ones do, so a printed interval never contradicts its verdict."""
    if not _finite(x, threshold):
        return not_finite_text(x)  # no threshold to keep a side of
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


def decide(interval: tuple[float, float], threshold: float, side: str) -> str:
    lo, hi = interval
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    above, below = lo > threshold, hi < threshold
    if side == ">":
        return "reproduced" if above else "not reproduced" if below else "inconclusive"
    return "reproduced" if below else "not reproduced" if above else "inconclusive"




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
    """``v`` with the results of its criterion on controls (``vitlab.findings.controls``: each a mapping with at least
    ``control`` and ``passed``). Where one failed, the qualifier ``FAILS_CONTROL`` says so, and a ``reproduced``
    becomes ``inconclusive``: a criterion that misjudges a case with a known answer cannot establish the finding."""
    rows = [json_types(dict(c)) for c in controls]
    if all(c["passed"] for c in rows):
        return replace(v, controls=rows)
    return replace(v, controls=rows, verdict="inconclusive" if v.verdict == "reproduced" else v.verdict,
                   qualifier=_joined(v.qualifier, FAILS_CONTROL))


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
