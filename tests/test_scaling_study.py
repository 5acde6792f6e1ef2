"""The data-scaling study with the power to decide (issue 48): early-stopped runs, paired intervals per size, the
locality verdict and its controls, cost, and the resumable sweep that records them. Tiny runs on the generated shapes
(4 classes: 2 to pre-train, 2 to probe) and constructed records; nothing here reads CIFAR-10."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t

from vitlab.base.precision import use_bf16
from vitlab.findings import controls as C
from vitlab.findings.studies import (
    KEY_LOCALITY,
    difference_table,
    locality_by_size,
    locality_grows_with_data,
    paired_size_differences,
    scaling_gap_narrows,
    seeds_for,
)
from vitlab.studies.scaling import SWEEPS, ResultsStore, best_at_last, cost_table, run_sweep, stopping_table
from vitlab.studies.sweep_config import CIFAR10_POOL, RunSpec

#: a patience sweep on the shapes: 2 sizes, 2 seeds, ViT and ResNet, validation split, early stopping
PATIENT = dataclasses.replace(SWEEPS["quick"], name="patient", seeds=(0, 1), val_per_class=10, epochs=6, min_steps=2,
                              patience=1, eval_images=32)


def _record(family: str, size: int, seed: int, acc: float, heads: list[float] | None = None, **metrics) -> dict:
    m = {"few_shot": {"10": {"mean": acc}}, "epochs": 10, "best": {"epoch": 4, "val_accuracy": 0.5}, **metrics}
    if heads is not None:  # the lowest layer's heads, shares of the uniform-attention distance, as fig7_statistics
        m["fig7"] = {"lowest_heads": heads, "lowest_local_share": float(np.mean([d < 0.5 for d in heads])),
                     "lowest_min": min(heads), "lowest_max": max(heads), "lowest_spread": max(heads) - min(heads),
                     "depth_trend": 0.5, "position_spearman": -0.4}
    return {"sweep": "s", "run_id": f"{family}-n{size}-s{seed}", "spec": {"family": family, "size": size,
                                                                          "seed": seed},
            "status": "ok", "fingerprint": "f", "config": {"name": "s"}, "metrics": m}


def _half(values) -> float:
    v = np.asarray(values, dtype=float)
    return float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


# ---------------------------------------------------------------------------------------------- power


def test_paired_differences_per_size_are_per_seed_differences_with_their_t_interval():
    vit = {(100, 0): .40, (100, 1): .42, (100, 2): .38, (1000, 0): .50, (1000, 1): .55, (1000, 2): .53}
    bit = {(100, 0): .41, (100, 1): .45, (100, 2): .40, (1000, 0): .49, (1000, 1): .50, (1000, 2): .52}
    records = [_record("vit", n, s, a) for (n, s), a in vit.items()] + [_record("bit", n, s, a)
                                                                        for (n, s), a in bit.items()]
    by = paired_size_differences(records)
    diffs = {n: [100 * (vit[n, s] - bit[n, s]) for s in range(3)] for n in (100, 1000)}
    for n in (100, 1000):
        assert by[n]["seeds"] == [0, 1, 2] and by[n]["per_seed"] == pytest.approx(diffs[n])
        assert by[n]["mean"] == pytest.approx(np.mean(diffs[n])) and by[n]["half_width"] == pytest.approx(
            _half(diffs[n]))
    table = difference_table(records)
    gap = np.array(diffs[1000]) - np.array(diffs[100])
    assert f"±{_half(gap):.1f} | 3 | {seeds_for(float(gap.std(ddof=1)))} |" in table
    assert table.endswith("reached by 1 of 3 rows; not by 1,000 images, gap change, 100 to 1,000")  # 100: ±2.5


def test_the_words_say_which_sizes_the_intervals_resolve_and_each_verdict_with_its_interval():
    """Known answers: at 100 images the ViT is ahead on every seed by 4 to 8 points (resolved, half-width above 3),
    at 1,000 the ResNet by 5 +- 1 (resolved), at 5,000 the ResNet by 1 to 2 (not resolved over 3 seeds)."""
    from vitlab.findings.studies import resolved_words, study_words, verdict_words

    diff = {100: [4, 6, 8], 1000: [-4, -5, -6], 5000: [-1, -2, -1]}  # points, per seed
    records = [r for n, d in diff.items() for s, x in enumerate(d)
               for r in (_record("vit", n, s, .5 + x / 100), _record("bit", n, s, .5))]
    half = {n: _half(d) for n, d in diff.items()}
    assert resolved_words(records) == (f"vit ahead at 100 images; bit ahead at 1,000 images; not resolved at the other "
                                       f"1 size; half-widths {min(half.values()):.1f} to {max(half.values()):.1f} "
                                       f"points, within ±3 at 2 of 3 sizes")
    gap = C.validate([scaling_gap_narrows(records)], C.scaling_controls(records))
    change = np.array(diff[5000]) - np.array(diff[100])  # -5, -8, -9: the ViT's lead turns into a deficit
    lo, hi = np.mean(change) - _half(change), np.mean(change) + _half(change)
    assert verdict_words(gap) == (f"The change of the vit - bit gap from 100 to 5,000 images (Fig. 3/4): "
                                  f"{np.mean(change):+.1f} points [{lo:+.1f}, {hi:+.1f}] over 3 seeds: not reproduced.")
    words = study_words(records, gap)
    assert words.startswith("vit - bit 10-shot accuracy, paired by seed (mean [95% interval] over seeds, points): "
                            "+6.0 [") and words.endswith(verdict_words(gap))
    assert resolved_words([r for r in records if r["spec"]["size"] == 5000]).startswith("no size resolved")
    local = C.locality_verdicts(_locality_records(LO, HI))
    assert verdict_words(local).startswith("The drop of the vit's lowest-layer mean head distance from 100 to 5,000 "
                                           "images (Raghu et al. 2021): +")
    assert verdict_words(local).endswith("over 4 seeds: reproduced.")


def test_judge_study_keeps_the_locality_verdict_where_the_gap_cannot_be_judged():
    """With the ResNet at one size only, the gap has no two common sizes: ``judge_study`` says why and still judges
    the ViT's locality on its controls; ``study_verdicts`` raises. With both sizes, both verdicts and no reason."""
    from vitlab.findings.studies import KEY_SCALING

    full = _locality_records(LO, HI)
    verdicts, why = C.judge_study(full)
    assert why == "" and [v.key for v in verdicts] == [KEY_SCALING, KEY_LOCALITY]
    assert [v.key for v in C.study_verdicts(full)] == [KEY_SCALING, KEY_LOCALITY]
    short = [r for r in full if not (r["spec"]["family"] == "bit" and r["spec"]["size"] == 5000)]
    verdicts, why = C.judge_study(short)
    assert "2 or more common sizes" in why and [v.key for v in verdicts] == [KEY_LOCALITY]
    assert verdicts[0].verdict == C.locality_verdicts(short)[0].verdict == "reproduced"
    with pytest.raises(ValueError, match="2 or more common sizes"):
        C.study_verdicts(short)


def test_seeds_for_is_the_smallest_count_whose_t_interval_fits():
    assert seeds_for(0.0) == 2 and seeds_for(math.nan) is None
    n = seeds_for(4.39)
    assert t.ppf(0.975, n - 1) * 4.39 / math.sqrt(n) <= 3 < t.ppf(0.975, n - 2) * 4.39 / math.sqrt(n - 1)
    assert n == 11  # the shipped sweep's spread of the gap change (half-width 10.9 over 3 seeds)


def test_the_study_config_is_sized_for_the_issue():
    sweep = SWEEPS["cifar10_10k"]
    dataclasses.replace(sweep)  # checked as it is made
    assert max(sweep.sizes) == 10_000 and min(sweep.sizes) == 100 and len(sweep.seeds) >= 10
    assert set(sweep.families) == {"vit", "bit", "hybrid"} and sweep.patience > 0 and sweep.val_per_class
    assert CIFAR10_POOL == 24_500 and [n for n, _ in sweep.omitted_sizes] == [24_500]
    assert "GPU" in sweep.omitted_sizes[0][1]
    for n in sweep.sizes:  # a validation pass after the fewest whole epochs that reach 2,500 training images
        cfg = sweep.train_config(RunSpec("vit", n, 0), n)
        epoch = (n // cfg.batch_size) * cfg.batch_size  # images per epoch
        assert cfg.patience == 10 and cfg.keep_best and (cfg.eval_every - 1) * epoch < 2500 <= cfg.eval_every * epoch


def test_patience_needs_a_validation_split():
    with pytest.raises(ValueError, match="val_per_class"):
        dataclasses.replace(PATIENT, val_per_class=0)


# ---------------------------------------------------------------------------------------------- locality


def _locality_records(heads_lo, heads_hi) -> list[dict]:
    """A sweep of the ViT and the ResNet at 100 and 5,000 images, one seed per entry of ``heads_lo`` (the ViT's
    lowest-layer heads at 100 images) and ``heads_hi`` (at 5,000)."""
    out = []
    for s, (lo, hi) in enumerate(zip(heads_lo, heads_hi)):
        out += [_record("vit", 100, s, .4, lo), _record("vit", 5000, s, .5, hi), _record("bit", 100, s, .4),
                _record("bit", 5000, s, .5)]
    return out


#: four seeds whose lowest layer grows a local head with more data, and the same at 100 images
LO = [[0.9, 0.8, 0.7, 0.6], [0.85, 0.8, 0.75, 0.45], [0.9, 0.9, 0.8, 0.7], [0.8, 0.7, 0.6, 0.4]]
HI = [[0.9, 0.8, 0.6, 0.2], [0.8, 0.7, 0.6, 0.3], [0.9, 0.85, 0.7, 0.25], [0.8, 0.7, 0.3, 0.1]]


def test_the_locality_verdict_keys_and_numbers():
    v = locality_grows_with_data(_locality_records(LO, HI))
    per_seed = [100 * (np.mean(a) - np.mean(b)) for a, b in zip(LO, HI)]  # points of uniform: 12.5, 11.25, ...
    assert v.key == KEY_LOCALITY and v.unit == "points of uniform" and v.threshold == 0.0 and v.side == ">"
    assert v.statistic == pytest.approx(np.mean(per_seed)) and v.details["per_seed"] == pytest.approx(per_seed)
    assert v.interval == pytest.approx((np.mean(per_seed) - _half(per_seed), np.mean(per_seed) + _half(per_seed)))
    assert v.verdict == "reproduced" and v.n_runs == 4 and v.details["seeds"] == [0, 1, 2, 3]
    assert v.details["local_share_by_size"] == pytest.approx({"100": 2 / 16, "5000": 5 / 16})  # JSON keys
    assert v.details["mean_distance_by_size"]["100"] == pytest.approx(np.mean(LO))
    assert v.details["min_distance_by_size"]["5000"] == pytest.approx(np.mean([min(h) for h in HI]))
    assert v.details["local_head"] == 0.5 and v.subject == "sweep s: vit at 100 and 5,000 images"
    fewer = locality_grows_with_data(_locality_records(HI, LO))
    assert fewer.verdict == "not reproduced" and fewer.statistic == pytest.approx(-np.mean(per_seed))
    assert locality_grows_with_data(_locality_records(LO, HI), "vit").key == "fig3_4.locality"


def test_the_locality_verdict_sees_heads_move_towards_local_without_crossing_a_threshold():
    """No head is local (below half of uniform) at either size, so every seed's share of local heads changes by
    exactly 0 and a share gives no interval; the heads still move towards local with more data, and the verdict,
    which needs no threshold, sees it."""
    lo = [[0.9, 0.8, 0.75, 0.7], [0.95, 0.85, 0.8, 0.7], [0.9, 0.9, 0.8, 0.75]]
    hi = [[0.85, 0.75, 0.6, 0.55], [0.9, 0.8, 0.65, 0.6], [0.85, 0.8, 0.7, 0.6]]
    v = locality_grows_with_data(_locality_records(lo, hi))
    assert v.details["local_share_by_size"] == {"100": 0.0, "5000": 0.0}
    assert v.verdict == "reproduced" and v.interval[0] > 0


def test_locality_by_size_gives_each_series_with_its_interval_over_seeds():
    by = locality_by_size(_locality_records(LO, HI))
    assert sorted(by) == [100, 5000] and by[100]["runs"] == 4
    means = [np.mean(h) for h in HI]
    got = by[5000]["mean_distance"]
    assert got["mean"] == pytest.approx(np.mean(means))
    assert got["interval"] == pytest.approx((np.mean(means) - _half(means), np.mean(means) + _half(means)))
    assert by[100]["local_share"]["mean"] == pytest.approx(0.125)
    assert by[100]["min_distance"]["mean"] == pytest.approx(np.mean([min(h) for h in LO]))


def test_records_without_fig7_statistics_are_not_judged():
    with pytest.raises(ValueError, match="predate them"):
        locality_grows_with_data([_record("vit", 100, 0, .4), _record("vit", 5000, 0, .5)])
    no_heads = _locality_records(LO, HI)
    for r in no_heads:  # a record with the share but not the heads it was made from
        (r["metrics"].get("fig7") or {}).pop("lowest_heads", None)
    with pytest.raises(ValueError, match="predate them"):
        locality_grows_with_data(no_heads)


def test_the_locality_controls_pass_and_show_in_the_validation_table():
    lo = [[0.9, 0.8, 0.7, 0.6], [0.8, 0.75, 0.7, 0.65], [0.95, 0.9, 0.7, 0.5], [0.85, 0.8, 0.8, 0.6]]
    hi = [[0.8, 0.8, 0.7, 0.65], [0.85, 0.75, 0.7, 0.7], [0.9, 0.9, 0.75, 0.5], [0.85, 0.8, 0.75, 0.65]]
    records = _locality_records(lo, hi)  # no clear change
    v = locality_grows_with_data(records)
    assert v.verdict == "inconclusive"
    [checked] = C.validate([v], C.locality_controls(records))
    rows = {r["control"]: r for r in C.validation_table([checked])}
    assert set(rows) == {C.MORE_LOCAL, C.SAME_LOCAL}
    assert (rows[C.MORE_LOCAL]["kind"], rows[C.MORE_LOCAL]["observed"], rows[C.MORE_LOCAL]["passed"]) == (
        "positive", "reproduced", True)
    # the most global half of each seed's heads at 100 images moved to 0.1 of uniform: what it drops, on average
    moved = [100 * sum(sorted(h)[2:]) / 4 - 100 * 2 * C.LOCAL_AT / 4 for h in lo]
    assert rows[C.MORE_LOCAL]["statistic"] == pytest.approx(np.mean(moved))
    assert rows[C.SAME_LOCAL]["kind"] == "negative" and rows[C.SAME_LOCAL]["passed"]
    assert rows[C.SAME_LOCAL]["observed"] != "reproduced"
    assert rows[C.SAME_LOCAL]["statistic"] == pytest.approx(0.0, abs=1e-9)  # another seed's heads: no change on average


# ---------------------------------------------------------------------------------------------- stopping and cost


def test_runs_whose_best_epoch_is_their_last_are_flagged():
    records = [_record("vit", 100, 0, .4, best={"epoch": 7}, last_epoch=7, stopped_early=False),
               _record("vit", 100, 1, .4, best={"epoch": 3}, last_epoch=8, stopped_early=True),
               _record("bit", 100, 0, .4, best={"epoch": 10})]  # before last_epoch: its schedule's 10 epochs
    assert best_at_last(records) == ["bit-n100-s0", "vit-n100-s0"]
    bare = _record("bit", 100, 1, .4)
    del bare["metrics"]["epochs"], bare["metrics"]["best"]  # a record of neither (it raised KeyError in --table)
    assert best_at_last(records + [bare]) == ["bit-n100-s0", "vit-n100-s0"]
    assert "| bit | 10 / 10 (0 of 1 stopped) |" in stopping_table(records + [bare])
    table = stopping_table(records)
    assert "| vit | 5 / 7.5 (1 of 2 stopped) |" in table
    assert table.endswith("2 run(s): bit-n100-s0, vit-n100-s0")


def test_cost_table_sums_cpu_hours_per_family_and_size_and_spans_the_wall_time():
    records = [_record("vit", 100, 0, .4, cpu_seconds=3600.0, seconds=1800.0),
               _record("vit", 100, 1, .4, cpu_seconds=1800.0, seconds=900.0),
               _record("bit", 1000, 0, .4, cpu_seconds=7200.0, seconds=3600.0)]
    for r, (a, b) in zip(records, [("10:00", "10:30"), ("10:30", "10:45"), ("11:00", "12:00")]):
        r["started"], r["finished"] = f"2026-12-06T{a}:00+00:00", f"2026-12-06T{b}:00+00:00"
    table = cost_table(records)
    assert "| vit | 1.50 |  | 1.50 |" in table and "| bit |  | 2.00 | 2.00 |" in table
    assert "CPU hours (whole runs): 3.50 in all over 3 finished runs" in table
    assert "Wall time: 1.75 h with a run in flight; 2.00 h from the first run's start" in table
    assert "1.75 h summed" in table and "Tuning" not in table


def test_the_studys_wall_time_counts_parallel_runs_once_and_no_gap_between_sessions():
    """Two workers, two sessions a day apart: the study was busy 3 h, not the 26 h from its first start to its last
    finish nor the 4.5 h its runs' clocks add up to; the tuning trials add their CPU hours and their time."""
    from vitlab.studies.scaling import busy_hours

    spans = [("06T10:00", "06T11:00"), ("06T10:30", "06T11:30"), ("06T11:00", "06T11:15"),  # session 1: 10:00-11:30
             ("07T10:00", "07T11:30"), ("07T10:00", "07T10:45")]  # session 2, both workers: 10:00-11:30
    records = []
    for i, (a, b) in enumerate(spans):
        r = _record("vit", 100, i, .4, cpu_seconds=1800.0)
        r["started"], r["finished"] = f"2026-12-{a}:00+00:00", f"2026-12-{b}:00+00:00"
        records.append(r)
    assert busy_hours(records) == pytest.approx(3.0) and busy_hours([]) == 0.0
    assert busy_hours(records[:1] + [{"started": None, "finished": "2026-12-06T12:00:00+00:00"}]) == 1.0  # crashed
    table = cost_table(records)
    assert "Wall time: 3.00 h with a run in flight; 25.50 h from the first run's start" in table
    trial = _record("vit", 10000, 0, .4, cpu_seconds=7200.0)
    trial["started"], trial["finished"] = "2026-12-05T09:00:00+00:00", "2026-12-05T10:00:00+00:00"
    failed = {**trial, "status": "failed", "metrics": {}}
    table = cost_table(records, [trial, failed])
    assert table.endswith("Tuning: 2.00 CPU hours over 1 finished trials; with it the study took 4.50 CPU hours and "
                          "4.00 h of wall time with a run or trial in flight.")


# ---------------------------------------------------------------------------------------------- the sweep


def test_a_patience_sweep_records_stopping_fig7_and_pairing_and_a_resume_gives_the_same_records(tmp_path):
    results = tmp_path / "r.jsonl"
    first = run_sweep(PATIENT, results, workers=0, progress=False)
    assert len(first) == 8 and all(r["status"] == "ok" for r in first), [r.get("traceback") for r in first]
    by = {r["run_id"]: r["metrics"] for r in first}
    for run_id, m in by.items():
        assert 1 <= m["best"]["epoch"] <= m["last_epoch"] <= m["epochs"] == 6 and m["cpu_seconds"] > 0
        assert m["steps"] == m["last_epoch"] * (int(run_id.split("-n")[1].split("-")[0]) // 16)
        assert m["stopped_early"] == (m["last_epoch"] < 6)
        assert ("fig7" in m) == run_id.startswith("vit_tiny")  # the ResNet has no attention
        assert m["bf16"] is use_bf16(True, "cpu")  # the numerics this machine trained it in
        curve = dict(m["val_curve"])  # every validation pass; the best is the first of the highest
        assert len(curve) == m["evaluations"] and max(curve) == m["last_epoch"]
        assert curve[m["best"]["epoch"]] == m["best"]["val_accuracy"] == max(curve.values())
        assert min(e for e, v in curve.items() if v == max(curve.values())) == m["best"]["epoch"]
    assert by["vit_tiny-n40-s0"]["fig7"]["lowest_local_share"] in (0.0, 0.5, 1.0)  # 2 heads
    for n in (40, 80):
        for s in (0, 1):  # a seed's subset and probe pool are every family's
            a, b = by[f"vit_tiny-n{n}-s{s}"], by[f"bit_tiny-n{n}-s{s}"]
            assert (a["subset_digest"], a["probe_pool_digest"]) == (b["subset_digest"], b["probe_pool_digest"])
    assert by["vit_tiny-n40-s0"]["subset_digest"] != by["vit_tiny-n40-s1"]["subset_digest"]
    # killed during its last run: that record never written; the resume reruns it to the same numbers
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n")
    again = run_sweep(PATIENT, results, workers=0, progress=False)
    assert [r["run_id"] for r in again] == [first[-1]["run_id"]]
    timing = ("seconds", "train_seconds", "cpu_seconds", "train_cpu_seconds")
    same = lambda m: {k: v for k, v in m.items() if k not in timing}  # noqa: E731
    assert same(again[0]["metrics"]) == same(first[-1]["metrics"])
    # a seed added to an early-stopping sweep runs only its own runs: the finished ones stay done
    more = dataclasses.replace(PATIENT, seeds=(0, 1, 2))
    assert more.fingerprint() == PATIENT.fingerprint()
    added = run_sweep(dataclasses.replace(more, sizes=(40,)), results, workers=0, progress=False)
    assert sorted(r["run_id"] for r in added) == ["bit_tiny-n40-s2", "vit_tiny-n40-s2"]
    assert len(ResultsStore(results).done("patient", PATIENT.fingerprint())) == 10


def test_the_table_says_when_machines_gave_the_runs_different_numerics():
    """bf16 or float32 is the machine's choice (an AVX2-only CPU trains in float32) and no part of the fingerprint:
    a study run in sessions on different CPUs mixes them silently unless its records say which."""
    from vitlab.studies.scaling import numerics_line

    runs = [_record("vit", 100, s, .4, bf16=b) for s, b in enumerate([True, True, False])] + [_record("vit", 100, 3, .4)]
    assert numerics_line(runs[:2]) == "Training numerics: 2 run(s) in bf16, 0 in float32"
    assert numerics_line(runs).startswith("Training numerics: 2 run(s) in bf16, 1 in float32, 1 not recorded (MIXED")


def test_a_missing_fig7_sample_fails_a_run_before_its_training(tmp_path, monkeypatch):
    """The Fig. 7 statistics read the 128 shipped test images after the training: a checkout without them (a copy
    of vitlab/ alone) failed every ViT and hybrid run only after its training, hours each at the study's largest
    size. They are read first now; the ResNet, which records none, trains as before."""
    import vitlab.data.images as I
    import vitlab.studies.scaling as S

    monkeypatch.setattr(I, "CIFAR_SAMPLE", tmp_path / "missing.npz")
    trained = []
    real = S._pretrain
    monkeypatch.setattr(S, "_pretrain", lambda cfg, *a: trained.append(cfg.model) or real(cfg, *a))
    one = dataclasses.replace(PATIENT, sizes=(40,), seeds=(0,))
    got = {r["run_id"]: r for r in run_sweep(one, tmp_path / "r.jsonl", workers=0, progress=False)}
    assert got["vit_tiny-n40-s0"]["status"] == "failed"
    assert got["vit_tiny-n40-s0"]["error"].startswith("FileNotFoundError") and "missing.npz" in \
        got["vit_tiny-n40-s0"]["error"]
    assert got["bit_tiny-n40-s0"]["status"] == "ok" and len(trained) == 1  # the ResNet's training alone


def test_hours_start_no_run_after_the_deadline_and_the_next_session_goes_on(tmp_path, monkeypatch, capsys):
    import vitlab.studies.scaling as S

    one = dataclasses.replace(SWEEPS["quick"], name="sessions", families=("bit_tiny",), sizes=(40,), seeds=(0, 1))
    clock = iter([0.0, 0.0])  # the deadline is set at 0 s and the first run starts at 0 s; the next would at 10 s
    monkeypatch.setattr(S, "_clock", lambda: next(clock, 10.0))
    first = run_sweep(one, tmp_path / "r.jsonl", workers=0, hours=5 / 3600)
    assert [(r["run_id"], r["status"]) for r in first] == [("bit_tiny-n40-s0", "ok")]
    assert "1 runs not started: run the same command again to go on" in capsys.readouterr().err
    monkeypatch.undo()
    again = run_sweep(one, tmp_path / "r.jsonl", workers=0, progress=False)
    assert [r["run_id"] for r in again] == ["bit_tiny-n40-s1"]
    for bad, executor in ((0, "local"), (-1.0, "local"), (True, "local"), (1.0, "ray")):
        with pytest.raises(ValueError, match="hours must be"):
            run_sweep(one, tmp_path / "r.jsonl", executor=executor, workers=1, hours=bad, progress=False)


def test_the_results_readme_and_the_studies_page_say_what_the_shipped_intervals_allow():
    """The shipped sweep's ViT - ResNet differences, per size, as the README quotes them, are
    ``difference_words``'s formatting of the records (paired 95% intervals over seeds, every one holding 0), and no
    page claims a lead "at every size" that no interval resolves."""
    from pathlib import Path

    from vitlab.findings.studies import difference_words

    root = Path(__file__).resolve().parents[1]
    records = list(ResultsStore(root / "data" / "results" / "scaling_cifar10.jsonl").newest_sweep().values())
    by = paired_size_differences(records)
    assert all(d["interval"][0] < 0 < d["interval"][1] for d in by.values())  # no size resolved
    halves = [d["half_width"] for d in by.values()]
    readme = " ".join((root / "data" / "results" / "README.md").read_text().split())
    studies = " ".join((root / "docs" / "studies.md").read_text().split())
    assert difference_words(records) in readme
    assert f"half-widths {min(halves):.1f} to {max(halves):.1f} points" in readme
    assert f"half-widths {min(halves):.1f} to {max(halves):.1f} points" in studies
    assert len(best_at_last(records)) == 9 and "9 of the 54 runs" in readme
    for text in (readme, studies):
        assert "leads the ViT at every size" not in text and "leads the ViT in 10-shot accuracy at every size" not in text


def test_the_sweep_table_prints_the_study_tables_and_the_locality_verdict_with_its_controls(tmp_path, capsys):
    import json

    from vitlab.cli import main
    from vitlab.findings.studies import LOCALITY

    records = _locality_records(LO, HI)
    for r in records:
        r["metrics"].update(train_seconds=1.0, cpu_seconds=36.0, seconds=10.0, last_epoch=5)
    store = tmp_path / "s.jsonl"
    store.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = tmp_path / "s.json"
    cfg.write_text(json.dumps({"name": "s", "families": ["vit", "bit"], "sizes": [100, 5000], "seeds": [0, 1, 2, 3],
                               "shots": [10], "probe_pool_per_class": 10}))
    assert main(["sweep", "--config", str(cfg), "--results", str(store), "--table"]) == 0
    out = capsys.readouterr().out
    assert "| gap change, 100 to 5,000 |" in out and "Best epoch = last epoch (stopped while still improving): 0" in out
    assert "| vit | 0.04 | 0.04 | 0.08 |" in out  # 4 seeds x 36 CPU seconds per size
    assert LOCALITY in out and "13.4" in out  # the verdict table's row: the locality statistic, points of uniform
    assert C.LARGE_GAIN in out  # the gap verdict is checked on its controls too (one fails: no spread to see 20 on)


def test_the_plan_in_the_docs_is_the_timing_runs_plan():
    """docs/studies.md's plan table is ``plan_table`` of the shipped timing records: the CPU hours it states are
    computed from a measured run, and a rerun of the timing shows there."""
    from pathlib import Path

    from vitlab.studies.tuning import plan_table

    root = Path(__file__).resolve().parents[1]
    timing = ResultsStore(root / "data" / "results" / "scaling_cifar10_10k.timing.jsonl").records()
    assert {r["run_id"] for r in timing} == {"vit-n100-s0", "bit-n100-s0", "hybrid-n100-s0"}
    assert all(r["status"] == "ok" and r["metrics"]["steps"] == 60 for r in timing)
    assert sum(r["metrics"]["cpu_seconds"] for r in timing) < 600  # the timing run's budget: 10 minutes of CPU
    assert plan_table(SWEEPS["cifar10_10k"], timing) in (root / "docs" / "studies.md").read_text()
    with pytest.raises(ValueError, match="no finished timing run"):
        plan_table(SWEEPS["cifar10_10k"], timing[:1])


@pytest.mark.parametrize("other", ["--tune", "--table"])
def test_hours_is_for_the_grid_only(other, capsys):
    from vitlab.cli import main

    assert main(["sweep", "--config", "quick", other, "--hours", "2"]) == 1
    assert "--hours limits the grid's runs" in capsys.readouterr().err


def test_the_reports_scaling_sections_draw_and_judge_locality_beside_the_gap(tmp_path):
    import json

    from vitlab.report.sections import scaling

    records = _locality_records(LO, HI)
    for r in records:
        r["finished"] = "2026-12-06T10:00:00+00:00"
    store = tmp_path / "s.jsonl"
    store.write_text("".join(json.dumps(r) + "\n" for r in records))
    gap, locality = scaling(store, {})
    assert (gap.slug, [v.key for v in gap.verdicts]) == ("scaling", ["fig3_4.scaling.gap_narrows"])
    assert (locality.slug, [v.key for v in locality.verdicts]) == ("scaling_locality", [KEY_LOCALITY])
    assert [c["passed"] for c in locality.verdicts[0].controls] == [True, True]
    drawn = {t.name: t for t in locality.figure.data}  # one family: its mean and most local head, its local share
    assert set(drawn) == {"vit: mean head", "vit: most local head", "vit: local heads"}
    assert list(drawn["vit: mean head"].y) == pytest.approx([100 * np.mean(LO), 100 * np.mean(HI)])
    assert list(drawn["vit: local heads"].y) == pytest.approx([100 * 2 / 16, 100 * 5 / 16])
    means = [100 * np.mean(h) for h in HI]
    assert drawn["vit: mean head"].error_y.array[1] == pytest.approx(_half(means))
    for r in records:  # a sweep from before runs recorded Fig. 7 statistics: the gap section alone
        r["metrics"].pop("fig7", None)
    store.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [s.slug for s in scaling(store, {})] == ["scaling"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a worker ends with its parent on Linux only")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_sweeps_workers_end_with_it(tmp_path, how):
    """kill -9 of the sweep's process (a session's end) ends its pool worker too: before, the worker trained its run
    to the end, for a record nobody writes, beside the next session's workers, and then waited forever. kill (SIGTERM)
    ends the sweep and its worker at once: before, the sweep waited for the run in flight to finish (hours at the
    study's largest size), then dropped its record."""
    import json
    import os
    import signal
    import subprocess
    import time

    import psutil

    long = dataclasses.replace(SWEEPS["quick"], name="killed", families=("bit_tiny",), sizes=(40,), min_steps=10**6)
    config = tmp_path / "killed.json"
    config.write_text(json.dumps(dataclasses.asdict(long)))
    work = tmp_path / "work"
    root = Path(__file__).resolve().parents[1]
    sweep = subprocess.Popen([sys.executable, "-m", "vitlab", "sweep", "--config", str(config), "--results",
                              str(tmp_path / "r.jsonl"), "--work-dir", str(work), "--workers", "1", "--quiet"],
                             cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    workers: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while not (work.is_dir() and any(work.iterdir())) and time.time() < deadline:  # the run has started
            time.sleep(0.5)
        assert work.is_dir() and any(work.iterdir()), "the run never started"
        workers = [p for p in psutil.Process(sweep.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 1
        os.kill(sweep.pid, getattr(signal, how))
        sweep.wait(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, "the worker outlived the sweep"
    finally:  # whatever failed: nothing of this test goes on running
        if sweep.poll() is None:
            sweep.kill()
        for p in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(not __import__("shutil").which("git") or not __import__("shutil").which("make"),
                    reason="needs git and make")
def test_make_scaling_study_runs_one_commits_code_while_the_checkout_moves_on(tmp_path):
    """The study spans sessions while the project's code changes, and a record counts as done only for the code that
    made it. `make scaling-study STUDY_CODE=C` runs commit C's package from a git worktree: a commit made to the
    checkout later neither stamps the records with other code nor reruns what C finished; STUDY_CODE= (the
    control) runs the checkout's own code, a new study that finds none of them done."""
    import json
    import shutil
    import subprocess

    from vitlab.base.provenance import source_hash

    root = Path(__file__).resolve().parents[1]
    repo = tmp_path / "repo"
    shutil.copytree(root / "vitlab", repo / "vitlab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", "pyproject.toml", "data/cifar10_test_128.npz"):  # the sample: Fig. 7 statistics per run
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name, repo / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "study code")
    study = _git(repo, "rev-parse", "HEAD")
    results = tmp_path / "study"
    tuned = dataclasses.replace(SWEEPS["quick"], families=("vit_tiny",), shots=(1, 10), probe_pool_per_class=12,
                                recipes=(("vit_tiny", "adamw", 1e-3, 0.05),))
    Path(f"{results}.tuned.json").write_text(json.dumps(dataclasses.asdict(tuned)))  # tuned: the grid runs at once
    venv = Path(sys.executable).parents[1]

    def make(code: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "-C", str(repo), "-o", str(venv / ".vitlab-installed"), "scaling-study",
                               f"STUDY_CODE={code}", f"STUDY_RESULTS={results}", "HOURS=1", f"VENV={venv}"],
                              capture_output=True, text=True)

    def stamps() -> list[tuple[str, str]]:
        return [(r["provenance"]["git_commit"], r["provenance"]["code_hash"])
                for r in ResultsStore(Path(f"{results}.jsonl")).records() if r["status"] == "ok"]

    first = make(study)
    assert first.returncode == 0, first.stderr[-2000:]
    study_hash = source_hash(repo / "vitlab")
    assert stamps() == [(study, study_hash)] * 2
    with (repo / "vitlab" / "__init__.py").open("a") as f:
        f.write("# a later commit\n")
    _git(repo, "commit", "-qam", "later")
    again = make(study)
    assert again.returncode == 0, again.stderr[-2000:]
    assert stamps() == [(study, study_hash)] * 2  # nothing rerun, nothing stamped with the later code
    assert make("no-such-commit").returncode != 0 and stamps() == [(study, study_hash)] * 2
    control = make("")
    assert control.returncode == 0, control.stderr[-2000:]
    later = (_git(repo, "rev-parse", "HEAD"), source_hash(repo / "vitlab"))
    assert later[1] != study_hash and stamps() == [(study, study_hash)] * 2 + [later] * 2
