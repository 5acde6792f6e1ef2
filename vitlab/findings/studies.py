"""The paper's findings that a study decides, from its stored records: Fig. 3/4 from the data-scaling sweep
(``vitlab.studies.scaling``: the ViT gains more from pre-training data than the ResNet) and Sec. 4.6 from the MPP study
(``vitlab.studies.mpp``: scratch < MPP < supervised). Each returns a ``vitlab.findings.verdict.Verdict`` with its interval over
seeds; what one trained model shows is ``vitlab.findings.model``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vitlab.base.intervals import N_BOOT, SEED, Resolution, mean_interval, n_units, none_reason
from vitlab.base.records import code_version
from vitlab.findings.verdict import Verdict, make_verdict
from vitlab.studies.mpp import few_shot_key
from vitlab.studies.scaling import one_config

__all__ = ["KEY_SCALING", "mpp_key", "scaling_accuracies", "scaling_gap_narrows", "few_shot_key", "mpp_accuracies",
           "paired_size_differences", "difference_table", "difference_words", "resolved_words", "verdict_words",
           "study_words", "seeds_for", "TARGET_HALF_WIDTH", "KEY_LOCALITY", "locality_key",
           "fig7_by_run", "lowest_mean", "LOCALITY_SERIES", "locality_by_size", "locality_words", "locality_grows_with_data",
           "MixedCodeVersions",
           "mpp_ordering", "INIT_NAMES", "POINTS"]

#: accuracy differences are reported in percentage points: a difference of accuracies (fractions of 1) times this
POINTS = 100.0
#: a gap change closer to 0 than this, in points, is 0: accuracies are ratios of image counts, so a true gap change
#: is 0 or at least 1e-7 points up to a billion test images, while the float sum of four accuracies leaves a few
#: 1e-15 points where it is 0 (the equal-gains control's), which ``mean_interval`` would take for a spread with an
#: interval above 0
ZERO_POINTS = 1e-9


# ---------------------------------------------------------------------------------------------- Fig. 3/4


#: the stable id of the Fig. 3/4 finding (``Verdict.key``)
KEY_SCALING = "fig3_4.scaling.gap_narrows"


def mpp_key(better: str, worse: str, kind: str, readout: str = "model") -> str:
    """The stable id of one Sec. 4.6 comparison, e.g. "sec4_6.mpp_beats_scratch.few_shot"."""
    tail = "" if kind != "few_shot" or readout == "model" else f".{readout}"
    return f"sec4_6.{better}_beats_{worse}.{kind}{tail}"


def scaling_accuracies(records: Sequence[Mapping[str, Any]], shots: int = 10) -> dict[tuple[str, int, int], float]:
    """{(family, size, seed): ``shots``-shot accuracy} from the sweep's JSONL records
    (``ResultsStore(path).records()``): ok runs only, the latest record of a run id wins (as
    ``ResultsStore.latest``). Records of several sweep configs (fingerprints) are refused."""
    latest = {r["run_id"]: r for r in records}
    ok = [r for r in latest.values() if r.get("status") == "ok" and str(shots) in r["metrics"]["few_shot"]]
    one_config(ok)
    return {(r["spec"]["family"], int(r["spec"]["size"]), int(r["spec"]["seed"])):
            float(r["metrics"]["few_shot"][str(shots)]["mean"]) for r in ok}


def scaling_gap_narrows(records: Sequence[Mapping[str, Any]], shots: int = 10, vit: str = "vit",
                        resnet: str = "bit", n_boot: int = N_BOOT, seed: int = SEED) -> Verdict:
    """Fig. 3/4: the ViT gains more from pre-training data than the ResNet.

    ``records``: the sweep's JSONL records (``ResultsStore(path).records()``, e.g.
    ``data/results/scaling_cifar10.jsonl``). gap(n) = ViT - ResNet ``shots``-shot accuracy at subset size n.
    Statistic: gap(largest) - gap(smallest), in percentage points (``POINTS``, as every accuracy difference
    vitlab reports). A seed fixes the nested subsets and the probe pool for both families, so the difference is
    taken per seed (seeds with all four runs; ``per_seed``, points) and the interval is over seeds: Student t below
    20 seeds, bootstrap over seeds from 20, none with 1; ``n_runs`` counts those seeds.

    The details' per-size means (``gap_by_size`` in points, ``{vit}_by_size`` and ``{resnet}_by_size`` as
    accuracies, fractions of 1) average every finished run of a family at that size, as ``vitlab.studies.scaling.summarise``
    and the sweep's figure do; ``runs_by_size`` counts them. With a seed missing a run they can differ from the
    statistic, which pairs only complete seeds (``seeds``).
    """
    acc = scaling_accuracies(records, shots)
    sizes = sorted({n for f, n, _ in acc if f == vit} & {n for f, n, _ in acc if f == resnet})
    if len(sizes) < 2:
        raise ValueError(f"need finished {vit!r} and {resnet!r} runs at 2 or more common sizes, got {sizes}")
    lo, hi = sizes[0], sizes[-1]
    seeds = sorted({s for *_, s in acc})
    complete = [s for s in seeds if all((f, n, s) in acc for f in (vit, resnet) for n in (lo, hi))]
    per_seed = POINTS * np.array([(acc[vit, hi, s] - acc[resnet, hi, s]) - (acc[vit, lo, s] - acc[resnet, lo, s])
                                  for s in complete])  # (S,) points
    per_seed[np.abs(per_seed) < ZERO_POINTS] = 0.0  # float rounding of a gap change of 0
    interval, method = mean_interval(per_seed, n_boot, seed, "seeds")

    def at(f: str, n: int) -> list[float]:
        return [a for (ff, nn, _), a in acc.items() if ff == f and nn == n]

    def mean(f: str, n: int) -> float:
        return float(np.mean(at(f, n)))

    return make_verdict(
        "Fig. 3/4: ViT gains more from data than ResNet",
        f"(ViT - ResNet {shots}-shot accuracy) at {hi} images minus the same at {lo} images > 0; "
        "95% interval over pre-training seeds",
        per_seed.mean() if len(per_seed) else math.nan, interval, 0.0, ">", "gap change", "points",
        {"shots": shots, "smallest": lo, "largest": hi, "seeds": complete, "per_seed": per_seed,
         "interval_method": method, "gap_by_size": {n: POINTS * (mean(vit, n) - mean(resnet, n)) for n in sizes},
         f"{vit}_by_size": {n: mean(vit, n) for n in sizes}, f"{resnet}_by_size": {n: mean(resnet, n) for n in sizes},
         "runs_by_size": {n: {vit: len(at(vit, n)), resnet: len(at(resnet, n))} for n in sizes}},
        none_reason(method), subject=_sweep_subject(records, vit, resnet, lo, hi), n_runs=max(1, len(complete)),
        key=KEY_SCALING, threshold_source="the null of equal gains: a ViT that gains what the ResNet gains (a control) "
                                          "has a gap change of exactly 0")


#: the 95% interval half-width, in points, the data-scaling study is sized for (issue 48: the gap change and each
#: size's difference known to within +-3 points)
TARGET_HALF_WIDTH = 3.0


def paired_size_differences(records: Sequence[Mapping[str, Any]], shots: int = 10, a: str = "vit", b: str = "bit",
                            n_boot: int = N_BOOT, seed: int = SEED) -> dict[int, dict[str, Any]]:
    """{size: {"mean", "interval", "half_width", "seeds", "per_seed", "method"}}: ``a`` minus ``b`` ``shots``-shot
    accuracy at each size common to both, in points (``POINTS``), paired by seed (a seed fixes the nested subset and
    the probe pool for both families: seeds with both runs only) with its 95% interval over seeds
    (``vitlab.base.intervals.mean_interval``: Student t below 20 seeds; NaN with fewer than 2 or no spread) and half its
    width (NaN without an interval)."""
    acc = scaling_accuracies(records, shots)
    sizes = sorted({n for f, n, _ in acc if f == a} & {n for f, n, _ in acc if f == b})
    out: dict[int, dict[str, Any]] = {}
    for n in sizes:
        seeds = sorted(s for f, nn, s in acc if f == a and nn == n and (b, n, s) in acc)
        diff = POINTS * np.array([acc[a, n, s] - acc[b, n, s] for s in seeds])  # (S,) points
        interval, method = mean_interval(diff, n_boot, seed, "seeds")
        out[n] = {"mean": float(diff.mean()) if len(diff) else math.nan, "interval": interval,
                  "half_width": (interval[1] - interval[0]) / 2, "seeds": seeds, "per_seed": diff.tolist(),
                  "method": method}
    return out


def seeds_for(sd: float, target: float = TARGET_HALF_WIDTH, most: int = 1000) -> int | None:
    """The fewest seeds whose Student t 95% interval of a mean has a half-width of at most ``target`` when the
    per-seed values spread with standard deviation ``sd`` (the same unit): the smallest n >= 2 with
    t(0.975, n - 1) sd / sqrt(n) <= target. None for an ``sd`` that is not finite or needs more than ``most``."""
    from scipy.stats import t

    if not math.isfinite(sd):
        return None
    for n in range(2, most + 1):
        if float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n) <= target:
            return n
    return None


def difference_table(records: Sequence[Mapping[str, Any]], shots: int = 10, a: str = "vit", b: str = "bit",
                     target: float = TARGET_HALF_WIDTH) -> str:
    """Markdown: ``paired_size_differences`` per size (mean, 95% interval, half-width, seeds) and the gap change's
    (``scaling_gap_narrows``) as the last row, then a line saying which half-widths reach ``target``."""
    by = paired_size_differences(records, shots, a, b)
    rows = [(f"{n:,} images", d["mean"], d["interval"], d["half_width"], len(d["seeds"])) for n, d in by.items()]
    if len(by) >= 2:
        v = scaling_gap_narrows(records, shots, a, b)
        rows.append((f"gap change, {min(by):,} to {max(by):,}", v.statistic, v.interval,
                     (v.interval[1] - v.interval[0]) / 2, len(v.details["seeds"])))
    sds = [float(np.std(d["per_seed"], ddof=1)) if len(d["seeds"]) > 1 else math.nan for d in by.values()]
    if len(by) >= 2:
        sds.append(float(np.std(v.details["per_seed"], ddof=1)) if len(v.details["seeds"]) > 1 else math.nan)
    lines = [f"| {a} - {b}, {shots}-shot | mean (points) | 95% interval | half-width | seeds | seeds for ±{target:g} |",
             "|---|---|---|---|---|---|"]
    for (what, mean, (lo, hi), half, n), sd in zip(rows, sds):
        need = seeds_for(sd, target)
        lines.append(f"| {what} | {mean:+.1f} | [{lo:+.1f}, {hi:+.1f}] | ±{half:.1f} | {n} | "
                     f"{need if need is not None else ''} |")
    missed = [what for what, _, _, half, _ in rows if not half <= target]  # NaN misses too
    lines += ["", f"Target half-width ±{target:g} points: reached by {len(rows) - len(missed)} of {len(rows)} rows"
              + (f"; not by {', '.join(missed)}" if missed else "")]
    return "\n".join(lines)


def difference_words(records: Sequence[Mapping[str, Any]], shots: int = 10, a: str = "vit", b: str = "bit") -> str:
    """``paired_size_differences`` in words, as the README quotes them: "-1.7 [-12.4, +9.0] at 100 images, -3.0
    [-7.2, +1.1] at 250, ... and -3.1 [-8.6, +2.4] at 5,000" (signed mean and 95% interval over seeds, points)."""
    by = paired_size_differences(records, shots, a, b)
    parts = [f"{d['mean']:+.1f} [{d['interval'][0]:+.1f}, {d['interval'][1]:+.1f}] at {n:,}" for n, d in by.items()]
    if parts:
        parts[0] += " images"
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] if parts else ""


def _sizes_words(sizes: Sequence[int]) -> str:
    """[1000, 10000] -> "1,000 and 10,000 images"."""
    head = ", ".join(f"{n:,}" for n in sizes[:-1])
    return f"{head} and {sizes[-1]:,} images" if head else f"{sizes[-1]:,} images"


def resolved_words(records: Sequence[Mapping[str, Any]], shots: int = 10, a: str = "vit", b: str = "bit",
                   target: float = TARGET_HALF_WIDTH) -> str:
    """What the 95% intervals of ``paired_size_differences`` resolve, in words: the sizes whose interval lies above 0
    (``a`` ahead) or below it (``b`` ahead), how many hold 0, and the half-widths reached against ``target`` (points),
    e.g. "bit ahead at 1,000 images; not resolved at the other 6 sizes; half-widths 1.4 to 3.4 points, within ±3 at
    5 of 7 sizes". "" without a size common to both families."""
    by = paired_size_differences(records, shots, a, b)
    if not by:
        return ""
    ahead = {a: [n for n, d in by.items() if d["interval"][0] > 0],
             b: [n for n, d in by.items() if d["interval"][1] < 0]}
    parts = [f"{f} ahead at {_sizes_words(ns)}" for f, ns in ahead.items() if ns]
    rest = len(by) - len(ahead[a]) - len(ahead[b])  # intervals that hold 0, and sizes without one
    if rest:
        parts.append("no size resolved" if rest == len(by) else f"not resolved at the other {n_units(rest, 'sizes')}")
    halves = [d["half_width"] for d in by.values() if math.isfinite(d["half_width"])]
    if halves:
        parts.append(f"half-widths {min(halves):.1f} to {max(halves):.1f} points, within ±{target:g} at "
                     f"{sum(h <= target for h in halves)} of {len(by)} sizes")
    return "; ".join(parts)


def _verdict_words(v: Verdict) -> str:
    """"+3.1 points [-1.8, +8.0] over 5 seeds: inconclusive" (the statistic, its 95% interval and its label)."""
    lo, hi = v.interval
    return (f"{v.statistic:+.1f} {v.unit} [{lo:+.1f}, {hi:+.1f}] over {n_units(v.n_runs, 'seeds')}: {v.label}"
            if math.isfinite(lo) and math.isfinite(hi) else f"{v.statistic:+.1f} {v.unit}, no interval: {v.label}")


def verdict_words(verdicts: Sequence[Verdict], vit: str = "vit", resnet: str = "bit") -> str:
    """A data-scaling study's verdicts in one sentence each, as the top README and the studies page state them: the
    Fig. 3/4 gap change (``KEY_SCALING``, ``vit``'s against ``resnet``'s) and each family's lowest-layer locality drop
    (``KEY_LOCALITY``), with its 95% interval, seeds and label; other verdicts are left out."""
    out = []
    for v in verdicts:
        d = v.details
        if v.key == KEY_SCALING:
            out.append(f"The change of the {vit} - {resnet} gap from {d['smallest']:,} to {d['largest']:,} images "
                       f"(Fig. 3/4): {_verdict_words(v)}.")
        elif v.key.startswith(KEY_LOCALITY):
            out.append(f"The drop of the {d['family']}'s lowest-layer mean head distance from {d['smallest']:,} to "
                       f"{d['largest']:,} images (Raghu et al. 2021): {_verdict_words(v)}.")
    return " ".join(out)


def study_words(records: Sequence[Mapping[str, Any]], verdicts: Sequence[Verdict], shots: int = 10, vit: str = "vit",
                resnet: str = "bit") -> str:
    """What a data-scaling study's intervals allow, in words, as the results README, notebook 06 and the report
    state it: per family other than ``resnet``, its paired differences against ``resnet`` by size
    (``difference_words``) and what they resolve (``resolved_words``); per family judged for locality, its lowest
    layer by size (``locality_words``); then ``verdict_words`` of ``verdicts`` (e.g.
    ``vitlab.findings.controls.study_verdicts``: checked on their controls, so a criterion that failed one says so
    in its label)."""
    acc = scaling_accuracies(records, shots)
    out = [f"{fam} - {resnet} {shots}-shot accuracy, paired by seed (mean [95% interval] over seeds, points): "
           f"{difference_words(records, shots, fam, resnet)}; {resolved_words(records, shots, fam, resnet)}."
           for fam in dict.fromkeys(f for f, _, _ in acc) if fam != resnet]
    out += [f"The {v.details['family']}'s lowest layer: {locality_words(locality_by_size(records, v.details['family']))}."
            for v in verdicts if v.key.startswith(KEY_LOCALITY)]
    return " ".join(out + [verdict_words(verdicts, vit, resnet)])


def _sweep_subject(records: Sequence[Mapping[str, Any]], vit: str, resnet: str, lo: int, hi: int) -> str:
    """What ``scaling_gap_narrows`` judges, in words: "sweep cifar10: vit vs bit at 100 and 5,000 images" (the
    sweep's name where its records hold its config)."""
    return f"{_sweep_name(records)}{vit} vs {resnet} at {lo:,} and {hi:,} images"


def _sweep_name(records: Sequence[Mapping[str, Any]]) -> str:
    """"sweep NAME: " where the records hold their sweep's config, else ""."""
    config = next((r.get("config") for r in records if isinstance(r.get("config"), Mapping)), {})
    return f"sweep {config['name']}: " if config.get("name") else ""


# ---------------------------------------------------------------------------------------------- locality


#: the stable id of the locality finding of the ViT (Raghu et al. 2021), ``locality_key``'s for another family
KEY_LOCALITY = "fig3_4.locality"
LOCALITY = "Raghu et al. 2021: less pre-training data, fewer local heads in the lowest layer"


def locality_key(family: str = "vit") -> str:
    """The stable id of the locality finding of ``family``: ``KEY_LOCALITY`` for the ViT, "fig3_4.locality.hybrid"
    for another."""
    return KEY_LOCALITY if family == "vit" else f"{KEY_LOCALITY}.{family}"


def fig7_by_run(records: Sequence[Mapping[str, Any]], family: str = "vit") -> dict[tuple[int, int], dict]:
    """{(size, seed): Fig. 7 statistics} of ``family``'s finished runs that recorded them (``metrics["fig7"]``, from
    ``vitlab.train.emergence.fig7_statistics``, with the lowest layer's per-head distances ``lowest_heads``); the
    latest record of a run id wins; several configs are refused."""
    latest = {r["run_id"]: r for r in records}
    ok = [r for r in latest.values() if r.get("status") == "ok"]
    one_config(ok)
    return {(int(r["spec"]["size"]), int(r["spec"]["seed"])): r["metrics"]["fig7"] for r in ok
            if r["spec"]["family"] == family and isinstance((r.get("metrics") or {}).get("fig7"), Mapping)
            and (r["metrics"]["fig7"].get("lowest_heads") or None) is not None}


def lowest_mean(fig7: Mapping[str, Any]) -> float:
    """The lowest layer's mean attention distance over its heads, as a share of the uniform-attention distance, from
    one run's Fig. 7 statistics (their ``lowest_heads``)."""
    return float(np.mean(fig7["lowest_heads"]))


#: the per-size series of ``locality_by_size``: name -> its value (a share of 1) from one run's Fig. 7 statistics
LOCALITY_SERIES = {"mean_distance": lowest_mean,
                   "min_distance": lambda f: float(min(f["lowest_heads"])),
                   "local_share": lambda f: float(f["lowest_local_share"])}


def locality_by_size(records: Sequence[Mapping[str, Any]], family: str = "vit", n_boot: int = N_BOOT,
                     seed: int = SEED) -> dict[int, dict[str, Any]]:
    """{size: {series: {"mean", "interval", "method"}, "runs": n}} of ``family``'s runs with Fig. 7 statistics, for
    each of ``LOCALITY_SERIES`` (shares of 1: the lowest layer's mean and most local head distance as shares of the
    uniform-attention distance, the share of local heads), mean over seeds with its 95% interval over seeds
    (``mean_interval``; none with 1 seed or no spread, NaN bounds)."""
    stats = fig7_by_run(records, family)
    out: dict[int, dict[str, Any]] = {}
    for n in sorted({n for n, _ in stats}):
        runs = [v for (nn, _), v in sorted(stats.items()) if nn == n]
        row: dict[str, Any] = {"runs": len(runs)}
        for name, of in LOCALITY_SERIES.items():
            vals = np.array([of(v) for v in runs], dtype=float)
            interval, method = mean_interval(vals, n_boot, seed, "seeds")
            row[name] = {"mean": float(vals.mean()), "interval": interval, "method": str(method)}
        out[n] = row
    return out


def locality_words(by_size: Mapping[int, Mapping[str, Any]]) -> str:
    """One family's ``locality_by_size`` in words: its mean head distance and share of local heads at the smallest
    and the largest size, as the report and notebook 06 write them."""
    lo, hi = min(by_size), max(by_size)
    return (f"mean head distance {by_size[lo]['mean_distance']['mean']:.0%} of uniform at {lo:,} images, "
            f"{by_size[hi]['mean_distance']['mean']:.0%} at {hi:,}; local heads "
            f"{by_size[lo]['local_share']['mean']:.0%} and {by_size[hi]['local_share']['mean']:.0%}")


def locality_grows_with_data(records: Sequence[Mapping[str, Any]], family: str = "vit", n_boot: int = N_BOOT,
                             seed: int = SEED) -> Verdict:
    """Raghu et al. 2021: ViTs pre-trained on less data learn fewer local heads in their lowest layer, i.e. their
    lowest layer attends less locally.

    ``records``: the sweep's JSONL records with Fig. 7 statistics (``metrics["fig7"]`` with ``lowest_heads``: the
    lowest layer's heads' mean attention distances on the fixed sample, as shares of the uniform-attention distance).
    Statistic: the lowest layer's mean head distance at the smallest size minus the same at the largest, per seed
    (seeds with both runs; ``per_seed``), in points of the uniform-attention distance (> 0: more local with more
    data), mean over seeds; interval over seeds as ``scaling_gap_narrows`` (Student t below 20). "reproduced" when
    the interval lies above 0. The statistic needs no threshold for "local": a head that moves towards local lowers
    it whether or not it crosses one, so the verdict neither flips with that convention nor ties at a share's steps of
    1/H (with 4 heads and no local head at either size every seed's share change is exactly 0). Details: per size
    (``locality_by_size``) the means over seeds of the mean and most local head distance, the share of heads below
    ``vitlab.train.emergence.LOCAL_HEAD`` of uniform, and the other Fig. 7 statistics; the runs counted. Raises
    ValueError with fewer than 2 sizes holding the statistics (a sweep from before they were recorded)."""
    from vitlab.train.emergence import LOCAL_HEAD

    stats = fig7_by_run(records, family)
    sizes = sorted({n for n, _ in stats})
    if len(sizes) < 2:
        raise ValueError(f"need Fig. 7 statistics of finished {family!r} runs at 2 or more sizes, got {sizes}: the "
                         "records predate them (a sweep run before runs recorded metrics['fig7']); rerun the sweep")
    lo, hi = sizes[0], sizes[-1]
    seeds = sorted(s for n, s in stats if n == lo and (hi, s) in stats)
    per_seed = POINTS * np.array([lowest_mean(stats[lo, s]) - lowest_mean(stats[hi, s]) for s in seeds])  # (S,)
    per_seed[np.abs(per_seed) < ZERO_POINTS] = 0.0  # float rounding of a change of 0
    interval, method = mean_interval(per_seed, n_boot, seed, "seeds")
    series = locality_by_size(records, family, n_boot, seed)

    def by_size(key: str) -> dict[int, float | None]:
        out = {}
        for n in sizes:
            vals = [v[key] for (nn, _), v in stats.items() if nn == n and v.get(key) is not None]
            out[n] = float(np.mean(vals)) if vals else None
        return out

    return make_verdict(
        LOCALITY,
        f"(lowest layer's mean head attention distance, share of uniform) at {lo:,} images minus the same at {hi:,} "
        "images > 0; 95% interval over pre-training seeds",
        per_seed.mean() if len(per_seed) else math.nan, interval, 0.0, ">", "lowest-layer distance drop",
        "points of uniform",
        {"family": family, "smallest": lo, "largest": hi, "seeds": seeds, "per_seed": per_seed,
         "interval_method": method, "local_head": LOCAL_HEAD,
         "mean_distance_by_size": {n: series[n]["mean_distance"]["mean"] for n in sizes},
         "min_distance_by_size": {n: series[n]["min_distance"]["mean"] for n in sizes},
         "local_share_by_size": {n: series[n]["local_share"]["mean"] for n in sizes},
         "lowest_spread_by_size": by_size("lowest_spread"), "depth_trend_by_size": by_size("depth_trend"),
         "position_spearman_by_size": by_size("position_spearman"),
         "runs_by_size": {n: series[n]["runs"] for n in sizes}},
        none_reason(method), subject=f"{_sweep_name(records)}{family} at {lo:,} and {hi:,} images",
        n_runs=max(1, len(seeds)), key=locality_key(family),
        threshold_source="the null of no change: a model whose lowest layer keeps the same heads at every size (a "
                         "control, with the seeds' own spread) changes by 0 on average")


# ---------------------------------------------------------------------------------------------- Sec. 4.6

#: the initialisations as the Sec. 4.6 findings name them (``vitlab.findings.explain`` reads the names back)
INIT_NAMES = {"scratch": "scratch", "mpp": "MPP", "supervised": "supervised"}




class MixedCodeVersions(Exception):
    """The latest records of one MPP study's rows come from more than one code version (a study partly rerun after a
    code change): their accuracies are not compared. Not a ``ValueError``, so that a caller that skips bad records on
    ``ValueError`` does not take it for one: the rows are sound, only not comparable."""


def _study_rows(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """{row_id: latest record} of one MPP study, all of one code version; records of several studies are refused
    (``ValueError``), rows of several code versions too (``MixedCodeVersions``)."""
    latest = {r["row_id"]: r for r in records}
    studies = {r.get("study") for r in latest.values()}
    if len(studies) > 1:
        raise ValueError(f"records of {len(studies)} studies ({sorted(map(str, studies))}): select one, e.g. "
                         "vitlab.studies.mpp.shown_records(records, NAME)[0]")
    codes: dict[str, int] = {}
    for r in latest.values():
        codes[code_version(r)] = codes.get(code_version(r), 0) + 1
    if len(codes) > 1:
        versions = ", ".join(f"{c}: {n_units(n, 'rows')}" for c, n in sorted(codes.items()))
        raise MixedCodeVersions(
            f"the latest records of the study's rows come from {len(codes)} code versions ({versions}): a study "
            "partly rerun after a code change would compare rows of different code. Select one version's rows, e.g. "
            "vitlab.studies.mpp.shown_records(records, NAME)[0] (the newest version's, as `vitlab mpp-study --table` "
            "and notebooks/07 show them), or rerun `vitlab mpp-study` to bring every row to this code")
    return latest


def mpp_accuracies(records: Sequence[Mapping[str, Any]], kind: str = "few_shot", shots: int = 10,
                   readout: str = "model") -> dict[str, dict[int, float]]:
    """{initialisation: {seed: accuracy}} from the MPP study's JSONL records (``vitlab.studies.mpp``; the latest
    record of a row id wins, ok rows only). ``kind="few_shot"``: the ``shots``-shot accuracy per probe seed (each
    seed draws the same shots for every initialisation) of features read out as ``readout``; ``"finetune"``: the
    test accuracy per fine-tune seed. Records of several studies are refused (``ValueError``), and so are rows whose
    latest records come from several code versions (``MixedCodeVersions``: select them as
    ``vitlab.studies.mpp.shown_records`` does)."""
    if kind not in ("few_shot", "finetune"):
        raise ValueError(f"kind must be 'few_shot' or 'finetune', got {kind!r}")
    key = few_shot_key(readout)
    latest = _study_rows(records)
    out: dict[str, dict[int, float]] = {}
    for r in latest.values():
        if r.get("status") != "ok" or r.get("kind") != kind:
            continue
        if kind == "few_shot":
            cell = r["metrics"].get(key, {}).get(str(shots))
            if cell is not None:
                out[r["init"]] = {int(s): float(a) for s, a in zip(r["spec"]["probe_seeds"], cell["per_seed"])}
        else:
            out.setdefault(r["init"], {})[int(r["seed"])] = float(r["metrics"]["test_accuracy"])
    return out


def _accuracy_step(rows: Sequence[Mapping[str, Any]]) -> Resolution | None:
    """The step of the accuracies of the compared ``rows`` (finished) in points, 100 / test images, where every row
    records its test images (``metrics["test"]``: the few-shot rows; the fine-tune rows do not record it); None
    otherwise."""
    tests = {(r.get("metrics") or {}).get("test") for r in rows}
    if not rows or None in tests:
        return None
    n = min(int(t) for t in tests)
    return POINTS / n, f"1 of {n:,} test images"


def _compared_facts(rows: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """What the Sec. 4.6 reasons quote, read from the compared ``rows`` (finished) where they record it: the
    pre-trained side's pre-training (``pretrain``: images, epochs, image size, data), the fine-tune's epochs and
    labelled images per class (``finetune``), the supervised checkpoint (``supervised_checkpoint``)."""
    out: dict[str, Any] = {}
    for r in rows:
        spec, metrics = r.get("spec") or {}, r.get("metrics") or {}
        init = spec.get("init") if isinstance(spec.get("init"), Mapping) else {}
        pre = metrics.get("pretrain")
        if isinstance(pre, Mapping) and "pretrain" not in out:
            model = (init.get("pretrain") or {}).get("model") or {}
            out["pretrain"] = {"images": pre.get("images"), "epochs": pre.get("epochs"),
                               "image_px": model.get("img_size"), "data": spec.get("data")}
        if init.get("checkpoint"):
            out.setdefault("supervised_checkpoint", str(init["checkpoint"]))
        if kind == "finetune" and "finetune" not in out:
            out["finetune"] = {"epochs": (spec.get("finetune") or {}).get("epochs"), "per_class": spec.get("per_class")}
    return out


def mpp_ordering(records: Sequence[Mapping[str, Any]], better: str = "mpp", worse: str = "scratch",
                 kind: str = "few_shot", shots: int = 10, n_boot: int = N_BOOT, seed: int = SEED,
                 readout: str = "model") -> Verdict:
    """Sec. 4.6: one step of the paper's ordering scratch < MPP < supervised, e.g. MPP beats scratch.

    ``records``: one MPP study's JSONL records (``vitlab.studies.mpp.run_study``, e.g.
    ``data/results/mpp_cifar10.jsonl``). Statistic, in percentage points (``POINTS``; ``per_seed`` too): mean over
    seeds of the paired difference ``better - worse``:
    few-shot accuracy per probe seed (the same shots for both), or fine-tune test accuracy per fine-tune seed (the
    same subset, order and augmentation for both). Interval over those seeds: Student t below 20, bootstrap from
    20, none with 1. Each initialisation is one pre-trained model, so the few-shot interval covers the draw of
    the shots, not pre-training seeds. ``readout``: which features the few-shot probe read (``few_shot_key``).
    """
    acc = mpp_accuracies(records, kind, shots, readout)
    missing = [i for i in (better, worse) if i not in acc]
    if missing:
        raise ValueError(f"no finished {kind} rows of {missing} in the records (have {sorted(acc)}): run "
                         "`vitlab mpp-study` first")
    common = sorted(set(acc[better]) & set(acc[worse]))
    diff = POINTS * np.array([acc[better][s] - acc[worse][s] for s in common])  # (S,) points
    rows = [r for r in _study_rows(records).values()
            if r.get("kind") == kind and r.get("init") in (better, worse) and r.get("status") == "ok"]
    unit = "probe seeds" if kind == "few_shot" else "fine-tune seeds"
    interval, method = mean_interval(diff, n_boot, seed, unit, _accuracy_step(rows))
    b, w = INIT_NAMES.get(better, better), INIT_NAMES.get(worse, worse)
    what = "fine-tune" if kind != "few_shot" else f"{shots}-shot probe" + ("" if readout == "model" else
                                                                           f", {readout.replace('_', ' ')}")
    code = sorted({code_version(r) for r in rows})  # one: _study_rows checked
    return make_verdict(
        f"Sec. 4.6: {b} beats {w} ({what})",
        f"mean over {unit} of ({b} - {w}) {what} accuracy on the test images > 0, paired by seed; 95% interval over "
        f"{unit}",
        diff.mean() if len(diff) else math.nan, interval, 0.0, ">", "accuracy difference", "points",
        {"kind": kind, "shots": shots if kind == "few_shot" else None, "readout": readout if kind == "few_shot"
         else None, "seeds": common, "per_seed": diff,
         "interval_method": method, f"{better}_mean": float(np.mean([acc[better][s] for s in common])) if common
         else None, f"{worse}_mean": float(np.mean([acc[worse][s] for s in common])) if common else None,
         "code_hashes": code, "better": better, "worse": worse, **_compared_facts(rows, kind)}, none_reason(method),
        subject=_study_subject(rows, b, w), key=mpp_key(better, worse, kind, readout),
        threshold_source="the null of no difference: two initialisations that do equally well differ by 0 on average")


def _study_subject(rows: Sequence[Mapping[str, Any]], better: str, worse: str) -> str:
    """What ``mpp_ordering`` judges, in words: "MPP study cifar10: MPP vs scratch ViT" (the study's name where its
    records hold it). Each initialisation is one pre-trained model: one training run."""
    study = next((r.get("study") for r in rows if r.get("study")), None)
    return f"{f'MPP study {study}: ' if study else ''}{better} vs {worse} ViT"
