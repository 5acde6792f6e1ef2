"""A finding judged for a training recipe rather than one training run: the verdicts of the same finding measured on
several checkpoints (seeds of one recipe, on the same images) combined into one (``combine_runs``), and the
checkpoints a ``--model`` argument names (``recipe_runs``: a checkpoint, or a folder of them). For shipped recipes
(``data/checkpoints/recipes/NAME/seed<n>``, ``vitlab export-recipe``): their seeds (``shipped_recipes``), cards
(``recipe_cards``), test accuracies over seeds (``recipe_accuracy``) and emergence during training
(``emergence_summary``).

The rule, on the records alone (``vitlab.findings.verdict.Verdict``): with n >= 2 runs, the statistic is the mean of the
runs' statistics, and its 95% interval is a Student t interval with n - 1 degrees of freedom,

    mean +- t(0.975, n - 1) * sqrt(s^2 / n + sigma_img^2),

where s is the standard deviation of the runs' statistics (ddof 1: how much a run of the recipe varies) and
sigma_img the image-sampling uncertainty of the mean: the runs are measured on the same images, so their image
errors are taken as fully correlated (they do not average out over runs), and each run's interval is read as
+-1.96 sigma about its statistic, so sigma_img = mean of the runs' interval half-widths / 1.96. Where a run's
interval resamples something of its own instead (``shared=False``: the components or patches of its weights, for
the filters and position embeddings), those errors are independent between runs and already in s: sigma_img is
left out (mean +- t s / sqrt(n)). The verdict is decided as every other, by ``vitlab.findings.verdict.decide``. With one
run the run's verdict is returned as it is, with ``n_runs = 1``: its interval covers the images only. Up to 4 runs a run on the other side of the threshold always
leaves the interval touching it (t(0.975, n - 1) >= n - 1); from 5 runs one dissenting run can be outweighed, and
``details["runs_against"]`` counts such runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.base.intervals import fmt_value, mean_interval, n_units
from vitlab.findings.verdict import Verdict, make_verdict

__all__ = ["combine_runs", "compare_recipes", "recipe_runs", "MixedFindings", "IDENTITY_FIELDS", "Z_95",
           "RECIPE_COMMAND", "shipped_recipes", "recipe_cards", "recipe_accuracy", "emergence_summary",
           "emergence_lines", "EMERGENCE_WHAT", "images_words"]

#: how shipped recipe folders (``data/checkpoints/recipes/NAME/seed<n>``) are made; docs/recipes.md has the sequence
RECIPE_COMMAND = "vitlab export-recipe RUN_FOLDER... --out data/checkpoints/recipes/NAME (docs/recipes.md)"

#: the fields that make two verdicts judgements of the same finding by the same criterion (the per-run fields
#: statistic, interval, verdict, details, subject and n_runs may differ)
IDENTITY_FIELDS = ("finding", "criterion", "threshold", "side", "quantity", "unit")
#: the normal quantile a run's 95% interval is read with: half-width = Z_95 * sigma
Z_95 = 1.959963984540054


class MixedFindings(ValueError):
    """Verdicts given as runs of one recipe judge different findings or criteria: ``run`` (its index) has ``value``
    in ``field`` where run 0 has ``expected``."""

    def __init__(self, field: str, run: int, value: object, expected: object) -> None:
        self.field, self.run, self.value, self.expected = field, run, value, expected
        super().__init__(f"run {run} judges another finding or criterion than run 0: its {field} is {value!r}, run "
                         f"0's {expected!r}; combine only the verdicts of one finding measured the same way")


def _same_finding(verdicts: Sequence[Verdict]) -> None:
    first = verdicts[0]
    fields = IDENTITY_FIELDS + (("key",) if hasattr(first, "key") else ())  # the criterion id, where recorded
    for i, v in enumerate(verdicts[1:], 1):
        for name in fields:
            a, b = getattr(first, name), getattr(v, name, None)
            if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
                raise MixedFindings(name, i, b, a)


def combine_runs(verdicts: Sequence[Verdict], subject: str | None = None, shared: bool = True) -> Verdict:
    """One verdict for a recipe from the verdicts of one finding on each of its runs (the module's rule).

    ``verdicts``: one per run, all of the same finding and criterion (``IDENTITY_FIELDS``; else ``MixedFindings``
    naming the field), each ``n_runs == 1`` (else ``ValueError``); their order does not change the statistic, interval or verdict.
    ``subject``: what the combination judges (default: "n runs: " and the runs' subjects). The result has
    ``n_runs = len(verdicts)`` and, in ``details``, each run's ``subject``, ``statistic``, ``interval`` and
    ``verdict`` (``runs``), the runs' spread (``between_runs_sd``), the runs' own error (``measurement_sd``, added
    to the spread where it is ``shared`` by the runs: measured on the same images), ``shared``,
    ``runs_against`` and ``interval_method``. It has no interval (inconclusive, ``details["no_interval"]`` says
    why) when a run has none, or when the runs agree exactly and their intervals have no width. A run measured on
    random weights (``details["untrained"]``) makes the recipe's verdict inconclusive, as it does the run's, and
    so does a run whose verdict carries a qualifier (where records have one) for a recipe that would be reproduced.
    """
    verdicts = list(verdicts)
    if not verdicts:
        raise ValueError("no verdicts to combine: pass one verdict per training run")
    several = [i for i, v in enumerate(verdicts) if v.n_runs != 1]
    if several:
        raise ValueError(f"run {several[0]}'s verdict already covers {verdicts[several[0]].n_runs} training runs; "
                         "combine the verdicts of single runs")
    _same_finding(verdicts)
    n = len(verdicts)
    if n == 1:
        return replace(verdicts[0], subject=verdicts[0].subject if subject is None else subject, n_runs=1)
    first = verdicts[0]
    t = first.threshold
    stats = [v.statistic for v in verdicts]
    runs = [{"subject": v.subject, "statistic": v.statistic, "interval": list(v.interval), "verdict": v.verdict,
             **{k: getattr(v, k) for k in ("qualifier", "conventions") if getattr(v, k, None)}} for v in verdicts]
    against = sum(1 for x in stats if (x <= t if first.side == ">" else x >= t))
    missing = next((f"run {i} ({v.subject or 'no subject'}) has no interval: "
                    f"{v.details.get('no_interval', 'none could be computed')}"
                    for i, v in enumerate(verdicts) if not all(math.isfinite(e) for e in v.interval)), None)
    if all(math.isfinite(x) for x in stats):
        mean = math.fsum(stats) / n  # fsum rounds once: the sums, and so the result, do not depend on the order
    else:
        mean, missing = math.nan, "a run's statistic is not finite"
    interval, sd, img = (math.nan, math.nan), math.nan, math.nan
    method = f"Student t over {n} training runs ({n - 1} df), " + (
        "between-run variance plus the image uncertainty the runs share" if shared else "between-run variance")
    if missing is None:
        from scipy.stats import t as student

        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in stats) / (n - 1))
        img = math.fsum((v.interval[1] - v.interval[0]) / 2 for v in verdicts) / n / Z_95
        se = math.sqrt(sd**2 / n + (img**2 if shared else 0.0))
        if se <= 1e-9 * max(abs(x) for x in stats):
            missing = (f"all {n} runs give the same value, {fmt_value(mean)}"
                       + (", and their intervals have no width," if shared else ",")
                       + " so there is no spread to take an interval from")
        else:
            half = float(student.ppf(0.975, n - 1)) * se
            interval = (mean - half, mean + half)
    details = {"runs": runs, "between_runs_sd": sd, "measurement_sd": img, "shared": shared, "runs_against": against,
               "interval_method": method if missing is None else "none"}
    if any(v.details.get("untrained") for v in verdicts):
        details["untrained"] = True
    criterion = (f"{first.criterion}; for the recipe: mean over {n} training runs, 95% Student t interval covering "
                 + ("runs and images" if shared else "runs (each run's own error is in their spread)"))
    if subject is None:
        subject = f"{n_units(n, 'runs')}: " + "; ".join(v.subject or f"run {i}" for i, v in enumerate(verdicts))
    out = make_verdict(first.finding, criterion, mean, interval, t, first.side, first.quantity, first.unit, details,
                       missing, subject=subject, n_runs=n)
    # what belongs to the criterion, not the run, where the records hold it: its id, where its threshold comes from,
    # and its controls (the first run's); a run's qualifier (its verdict depends on a convention, or its criterion
    # failed a control) is the recipe's too
    carried = {k: getattr(first, k) for k in ("key", "threshold_source", "controls") if hasattr(first, k)}
    if hasattr(first, "qualifier"):
        carried["qualifier"] = "; ".join(dict.fromkeys(v.qualifier for v in verdicts if v.qualifier))
    out = replace(out, **carried)
    if details.get("untrained") or (carried.get("qualifier") and out.verdict == "reproduced"):
        out = replace(out, verdict="inconclusive")
    return out


def _is_checkpoint(folder: Path) -> bool:
    from vitlab.models.checkpoint import CONFIG_NAME, WEIGHTS_NAME

    return (folder / CONFIG_NAME).is_file() and (folder / WEIGHTS_NAME).is_file()


def recipe_runs(specs: Sequence[str | os.PathLike]) -> list[str]:
    """The models that ``vitlab reproduce --model A --model B ...`` judges together: each spec as given, except a
    folder that is no checkpoint but holds checkpoint folders (directly, or as ``run/checkpoint`` of training run
    folders), which stands for those, sorted by name (any other spec is left to ``load_model`` to read or refuse).
    A model given twice is refused (``ValueError`` naming it)."""
    out: list[str] = []
    for spec in specs:
        path = Path(spec)
        found = sorted(p if _is_checkpoint(p) else p / "checkpoint" for p in path.iterdir()
                       if _is_checkpoint(p) or _is_checkpoint(p / "checkpoint")) \
            if path.is_dir() and not _is_checkpoint(path) else []
        out += [str(p) for p in found] if found else [os.fspath(spec)]
    seen: set[str] = set()
    for m in out:
        key = os.path.realpath(m) if Path(m).exists() else m
        if key in seen:
            raise ValueError(f"--model {m} is given twice: a recipe's runs are distinct checkpoints")
        seen.add(key)
    return out


def compare_recipes(recipes: dict[str, Sequence[Verdict]]) -> list[dict[str, object]]:
    """Which findings hold in which recipe: one row per finding key that every recipe judged, in the first recipe's
    order, as ``{"key", "finding", "verdicts": {recipe: verdict label}, "outcomes": {recipe: verdict (no
    qualifier)}, "holds_in": [recipes where reproduced], "undecided_in": [recipes where inconclusive], "n_runs":
    {recipe: runs}}``. A recipe in neither list judged the finding not reproduced. Raises ValueError for fewer than
    two recipes or a verdict without a key (a record written before verdicts had keys)."""
    if len(recipes) < 2:
        raise ValueError(f"compare_recipes needs at least two recipes, got {len(recipes)}")
    by_key: dict[str, dict[str, Verdict]] = {}
    for name, verdicts in recipes.items():
        for v in verdicts:
            if not v.key:
                raise ValueError(f"recipe {name!r}: the verdict of {v.finding!r} has no key; judge it again with this "
                                 "vitlab version")
            by_key.setdefault(v.key, {})[name] = v
    first = [v.key for v in next(iter(recipes.values()))]
    rows: list[dict[str, object]] = []
    for key in first:
        got = by_key[key]
        if len(got) < len(recipes):
            continue
        rows.append({"key": key, "finding": got[next(iter(recipes))].finding,
                     "verdicts": {r: got[r].label for r in recipes},
                     "outcomes": {r: got[r].verdict for r in recipes},
                     "holds_in": [r for r in recipes if got[r].verdict == "reproduced"],
                     "undecided_in": [r for r in recipes if got[r].verdict == "inconclusive"],
                     "n_runs": {r: got[r].n_runs for r in recipes}})
    return rows


def shipped_recipes(root: Path) -> dict[str, list[Path]]:
    """``{recipe: its seed folders}`` under ``root`` (``root/NAME/seed<n>``, each a checkpoint with ``card.json``),
    recipes and seeds sorted by name; recipes without a seed are left out, a missing ``root`` gives {}."""
    out: dict[str, list[Path]] = {}
    for folder in sorted(p for p in Path(root).glob("*") if p.is_dir()) if Path(root).is_dir() else []:
        seeds = sorted(s for s in folder.glob("seed*") if (s / "card.json").is_file() and (s / "config.json").is_file())
        if seeds:
            out[folder.name] = seeds
    return out


def recipe_cards(seeds: Sequence[Path]) -> list[dict]:
    """The ``card.json`` facts of each seed folder, in order."""
    return [json.loads((s / "card.json").read_text()) for s in seeds]


def emergence_summary(cards: dict[str, list[dict]]) -> tuple[dict, dict, list[str]]:
    """From each recipe's cards (``{recipe: recipe_cards(...)}``): ``bands`` (``{recipe: {key: emergence_bands}}``
    for every statistic ``vitlab.figures.plots.EMERGENCE_PANELS`` draws that every seed recorded), ``times`` (``{recipe:
    {key: halfway}}`` for ``lowest_min``, the local heads, and ``position_spearman``, the 2D position structure) and
    the recipes whose cards hold no emergence records."""
    from vitlab.figures.plots import EMERGENCE_PANELS
    from vitlab.train.emergence import emergence_bands, halfway

    bands: dict[str, dict] = {}
    times: dict[str, dict] = {}
    missing = []
    for name, cs in cards.items():
        hist = [c.get("emergence") or [] for c in cs]
        if not all(hist):
            missing.append(name)
            continue
        bands[name] = {}
        for key, _ in EMERGENCE_PANELS:
            try:
                bands[name][key] = emergence_bands(hist, key)
            except ValueError:  # no epoch has it in every seed (e.g. a table without learned positions)
                continue
        times[name] = {k: halfway(bands[name][k]) for k in ("lowest_min", "position_spearman") if k in bands[name]}
        try:  # did the most local head become a local one (below LOCAL_HEAD of uniform)?
            times[name]["lowest_local_share"] = halfway(emergence_bands(hist, "lowest_local_share"))
        except ValueError:  # records written before the share was kept
            pass
    return bands, times, missing


#: what ``emergence_lines`` calls each statistic whose half-way epoch it states
EMERGENCE_WHAT = {"lowest_min": "local heads (lowest layer's most local head, share of uniform distance)",
                  "position_spearman": "2D position structure (position-embedding Spearman)"}


def emergence_lines(times: dict[str, dict]) -> list[str]:
    """Sentences from ``emergence_summary``'s ``times``: per recipe, each statistic's start, end and half-way
    epoch, the share of lowest-layer heads that are local at the last epoch, and which came first. The local heads'
    time is compared only where some lowest-layer head became local: a most local head that moved part of the way
    has no time of local heads to compare."""
    from vitlab.train.emergence import LOCAL_HEAD

    lines = []
    for name, t in times.items():
        for key, what in EMERGENCE_WHAT.items():
            if key not in t:
                lines.append(f"{name}, {what}: not recorded.")
                continue
            h = t[key]
            seen = f" ({images_words(h['images_seen'])})" if h.get("images_seen") else ""
            lines.append(f"{name}, {what}: {h['start']:.3f} at the first epoch to {h['end']:.3f} at the last, "
                         f"half-way by epoch {h['epoch']}{seen}.")
        share = t.get("lowest_local_share", {}).get("end")
        if share is not None:
            lines.append(f"{name}: {share:.0%} of the lowest layer's heads are local (mean distance below "
                         f"{LOCAL_HEAD:g} of uniform attention's) at the last epoch.")
        if not {"lowest_min", "position_spearman"} <= set(t):
            continue
        a, b = t["lowest_min"]["epoch"], t["position_spearman"]["epoch"]
        if share == 0:
            lines.append(f"{name}: the position structure half-way by epoch {b}; no lowest-layer head became "
                         "local, so there is no time of local heads to compare.")
            continue
        order = ("both in the same epoch" if a == b else
                 f"local heads first, {b - a} epochs before the position structure" if a < b else
                 f"position structure first, {a - b} epochs before the local heads")
        lines.append(f"{name}: {order}.")
    return lines


def recipe_accuracy(cards: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Per recipe (``{recipe: recipe_cards(...)}``): its seeds, their test accuracies as shipped (measured once, on
    export), the ``mean``, the 95% ``interval`` of the mean over seeds and its ``method``
    (``vitlab.base.intervals.mean_interval``: none for one seed), the ``teacher``, ``epochs`` and ``shortened``."""
    out = {}
    for name, cs in cards.items():
        acc = np.array([c["test_accuracy"] for c in cs if c.get("test_accuracy") is not None], dtype=np.float64)
        (lo, hi), method = mean_interval(acc, 2000, 0, "seeds")
        out[name] = {"seeds": [c.get("seed") for c in cs], "test_accuracy": acc.tolist(),
                     "mean": float(acc.mean()) if len(acc) else None, "interval": [lo, hi], "method": method,
                     "teacher": cs[0].get("teacher"), "epochs": cs[0].get("epochs_done"),
                     "shortened": cs[0].get("shortened")}
    return out


def images_words(n: int | None) -> str:
    """A count of training images seen, in a few words ("" for None): millions from one million on."""
    if not n:
        return ""
    return f"{n / 1e6:.2f}M training images" if n >= 1_000_000 else f"{n:,} training images"
