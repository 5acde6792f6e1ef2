"""A finding judged for a recipe: the verdicts of one finding on several training runs combined (vitlab.findings.recipe)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from scipy.stats import t as student

from vitlab.findings.recipe import Z_95, MixedFindings, combine_runs, recipe_runs
from vitlab.findings.verdict import Verdict, decide, verdict_table

FINDING = "Fig. 7 right: attention distance grows with depth"


def run(statistic: float, half: float = 0.0, subject: str = "", side: str = ">", threshold: float = 0.0,
        lo_extra: float = 0.0, **kw) -> Verdict:
    """One run's verdict: ``statistic`` with an interval ``half`` either side (``lo_extra`` more below)."""
    interval = (statistic - half - lo_extra, statistic + half)
    return Verdict(FINDING, "slope > 0 px/layer", statistic, interval, threshold, decide(interval, threshold, side),
                   side=side, quantity="slope", unit="px/layer", subject=subject, **kw)


def test_three_runs_without_image_width_give_the_t_interval_of_their_mean():
    v = combine_runs([run(1.0, subject="a"), run(2.0, subject="b"), run(3.0, subject="c")])
    half = student.ppf(0.975, 2) * 1.0 / math.sqrt(3)  # sd of 1, 2, 3 is 1
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert (v.statistic, v.n_runs) == (2.0, 3)
    assert v.interval == pytest.approx((2.0 - half, 2.0 + half), abs=1e-12)
    assert v.verdict == "inconclusive"  # 2 - 2.48 < 0
    assert v.details["between_runs_sd"] == pytest.approx(1.0) and v.details["measurement_sd"] == 0.0
    assert [r["statistic"] for r in v.details["runs"]] == [1.0, 2.0, 3.0]
    assert [r["subject"] for r in v.details["runs"]] == ["a", "b", "c"]
    assert (v.finding, v.side, v.threshold, v.quantity, v.unit) == (FINDING, ">", 0.0, "slope", "px/layer")


def test_the_runs_image_uncertainty_is_added_as_one_shared_error():
    """Each run's interval is +-1.96 sigma_img; measured on the same images, the runs share that error, so the
    mean's image part is sigma_img itself (not sigma_img / sqrt(n))."""
    v = combine_runs([run(x, half=Z_95 * 0.5) for x in (1.0, 2.0, 3.0)])
    se = math.sqrt(1.0 / 3 + 0.5**2)
    assert v.details["measurement_sd"] == pytest.approx(0.5) and v.details["shared"]
    assert v.interval == pytest.approx((2 - student.ppf(0.975, 2) * se, 2 + student.ppf(0.975, 2) * se))
    # an asymmetric interval counts by its half-width
    w = combine_runs([run(x, half=Z_95 * 0.25, lo_extra=Z_95 * 0.5) for x in (1.0, 2.0, 3.0)])
    assert w.details["measurement_sd"] == pytest.approx(0.5) and w.interval == pytest.approx(v.interval)
    # errors of each run's own (its weights' components): independent, already in the spread, not added again
    own = combine_runs([run(x, half=Z_95 * 0.5) for x in (1.0, 2.0, 3.0)], shared=False)
    half = student.ppf(0.975, 2) / math.sqrt(3)
    assert own.interval == pytest.approx((2 - half, 2 + half)) and not own.details["shared"]
    flat = combine_runs([run(2.0, half=0.3), run(2.0, half=0.3)], shared=False)  # no spread: no interval
    assert flat.verdict == "inconclusive" and math.isnan(flat.interval[0])


def test_agreeing_runs_reproduce_and_the_verdict_is_decide_on_the_interval():
    v = combine_runs([run(x, half=0.2) for x in (2.0, 2.2, 1.9, 2.1)])
    assert v.verdict == "reproduced" == decide(v.interval, 0.0, ">") and v.interval[0] > 0
    below = combine_runs([run(x, half=0.2, side="<") for x in (2.0, 2.2, 1.9, 2.1)])
    assert below.verdict == "not reproduced" and below.side == "<"


def test_one_run_is_returned_as_it_is_with_one_training_run():
    v = run(1.5, half=0.3, subject="vit_cifar10 on 128 CIFAR-10 test images")
    assert combine_runs([v]) == v and combine_runs([v]).n_runs == 1
    assert combine_runs([v], subject="seed 0").subject == "seed 0"


def test_the_order_of_the_runs_changes_nothing():
    rng = np.random.default_rng(0)
    runs = [run(float(x), half=float(h), lo_extra=float(e)) for x, h, e in
            zip(rng.normal(0.3, 0.5, 5), rng.uniform(0.01, 0.3, 5), rng.uniform(0, 0.1, 5))]
    first = combine_runs(runs)
    for order in itertools.permutations(range(5)):
        v = combine_runs([runs[i] for i in order])
        assert (v.statistic, v.interval, v.verdict) == (first.statistic, first.interval, first.verdict)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_runs_on_both_sides_of_the_threshold_never_reproduce_up_to_four_runs(n):
    """Up to 4 runs the t interval covers the threshold whenever a run falls on the other side (t(0.975, n-1) >=
    n - 1), whatever the image widths; tried on 2,000 random recipes each."""
    rng = np.random.default_rng(n)
    for _ in range(2000):
        stats = rng.uniform(0, 5, n) * rng.choice([1, 1e-3, 1e3])
        stats[rng.integers(n)] *= -rng.uniform(1e-6, 1)  # one run on the other side of 0
        v = combine_runs([run(float(x), half=float(h)) for x, h in zip(stats, rng.uniform(0, 0.1, n))])
        assert v.verdict != "reproduced", stats
        assert v.details["runs_against"] >= 1


def test_from_five_runs_a_dissenting_run_is_counted_beside_the_verdict():
    v = combine_runs([run(x) for x in (1.0, 1.0, 1.0, 1.0, -0.01)])
    assert v.verdict == "reproduced" and v.details["runs_against"] == 1 and v.n_runs == 5


def test_a_run_without_an_interval_leaves_the_recipe_without_one():
    blind = Verdict(FINDING, "slope > 0 px/layer", 1.0, (math.nan, math.nan), 0.0, "inconclusive",
                    {"no_interval": "1 image, at least 2 needed"}, quantity="slope", unit="px/layer")
    v = combine_runs([run(2.0, half=0.1), blind])
    assert math.isnan(v.interval[0]) and v.verdict == "inconclusive" and v.statistic == 1.5
    assert "1 image, at least 2 needed" in v.details["no_interval"]
    flat = combine_runs([run(2.0), run(2.0)])  # no spread and no width: no interval rather than a zero-width one
    assert flat.verdict == "inconclusive" and math.isnan(flat.interval[0]) and flat.details["no_interval"]


def test_an_untrained_run_makes_the_recipe_inconclusive():
    random = run(2.0, half=0.1, details={"untrained": True})
    v = combine_runs([run(2.1, half=0.1), random, run(1.9, half=0.1)])
    assert v.interval[0] > 0 and v.verdict == "inconclusive" and v.details["untrained"]


def test_verdicts_of_different_findings_or_several_runs_are_refused():
    other = Verdict("Fig. 6: rollout", "slope > 0 px/layer", 1.0, (0.5, 1.5), 0.0, "reproduced", quantity="slope",
                    unit="px/layer")
    with pytest.raises(MixedFindings) as e:
        combine_runs([run(1.0, half=0.1), other])
    assert (e.value.field, e.value.run, e.value.value, e.value.expected) == ("finding", 1, "Fig. 6: rollout", FINDING)
    with pytest.raises(MixedFindings) as e:
        combine_runs([run(1.0, half=0.1), run(1.0, half=0.1, threshold=0.5)])
    assert e.value.field == "threshold"
    with pytest.raises(ValueError):
        combine_runs([])
    with pytest.raises(ValueError):
        combine_runs([run(1.0, half=0.1), run(1.0, half=0.1, n_runs=3)])


def test_the_record_round_trips_and_old_records_read_as_one_run():
    v = combine_runs([run(x, half=0.1, subject=f"seed {i}") for i, x in enumerate((1.0, 1.2, 0.9))],
                     subject="3 seeds of tiny on 8 images")
    back = Verdict.from_dict(json.loads(json.dumps(v.to_dict(), allow_nan=False)))
    assert back == v and (back.subject, back.n_runs) == ("3 seeds of tiny on 8 images", 3)
    old = {k: x for k, x in run(1.0, half=0.1).to_dict().items() if k not in ("subject", "n_runs")}
    assert (Verdict.from_dict(old).n_runs, Verdict.from_dict(old).subject) == (1, "")
    with pytest.raises(ValueError):
        run(1.0, n_runs=0)
    with pytest.raises(ValueError):
        run(1.0, n_runs=True)
    rows = verdict_table([v, run(1.0, half=0.1, subject="a")]).splitlines()
    assert rows[0].split()[:2] == ["finding", "subject"]


def _checkpoint_folder(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_folder_of_checkpoints_or_run_folders_stands_for_its_runs(tmp_path):
    a, b = _checkpoint_folder(tmp_path / "seeds" / "s1"), _checkpoint_folder(tmp_path / "seeds" / "s0")
    c = _checkpoint_folder(tmp_path / "runs" / "r0" / "checkpoint")
    (tmp_path / "seeds" / "notes").mkdir()
    assert recipe_runs([tmp_path / "seeds"]) == [str(b), str(a)]
    assert recipe_runs([tmp_path / "runs", str(a)]) == [str(c), str(a)]
    assert recipe_runs(["vit_base_patch16_224", str(a)]) == ["vit_base_patch16_224", str(a)]
    assert recipe_runs([tmp_path / "seeds" / "notes"]) == [str(tmp_path / "seeds" / "notes")]  # load_model's to refuse
    with pytest.raises(ValueError):
        recipe_runs([tmp_path / "seeds", str(a)])  # s1 twice


def test_a_run_whose_verdict_carries_a_qualifier_leaves_the_recipe_no_reproduced():
    """A run whose verdict depends on a convention or whose criterion failed a control (its qualifier) cannot be
    outweighed by the other runs: the recipe's verdict is inconclusive, with the qualifier."""
    if "qualifier" not in {f.name for f in dataclasses.fields(Verdict)}:
        pytest.skip("Verdict records no qualifier here")
    runs = [run(x, half=0.1) for x in (2.0, 2.1, 1.9)]
    assert combine_runs(runs).verdict == "reproduced"
    runs[1] = dataclasses.replace(runs[1], qualifier="depends on convention")
    v = combine_runs(runs)
    assert v.verdict == "inconclusive" and v.qualifier == "depends on convention" and v.interval[0] > 0


# ---------------------------------------------------------------------------------------------- vitlab reproduce


@pytest.fixture(scope="module")
def three_seeds(tmp_path_factory, two_class_folder):
    """Three training runs of the tiny preset (seeds 0, 1, 2; one epoch on the two-class folder) as run folders
    under one folder: the companion issue's seeds in miniature."""
    from vitlab.train.config import PRESETS, with_num_classes
    from vitlab.train.loop import train

    root = tmp_path_factory.mktemp("recipe")
    for seed in range(3):
        cfg = dataclasses.replace(with_num_classes(PRESETS["tiny"], 2), data=str(two_class_folder), epochs=1,
                                  seed=seed)
        train(cfg, root / f"s{seed}", progress=False, device="cpu")
    return root


def test_reproduce_judges_a_recipe_from_its_runs(three_seeds, tmp_path, capsys):
    """`vitlab reproduce --model FOLDER` with a folder of three training runs: every verdict measured on the model
    covers the three runs (n_runs 3, each run's statistic in details), and each run's statistic is the one a report
    of that run alone gives; the verdict is the recipe rule's on those records."""
    from vitlab.cli import main
    from vitlab.report import reproduce

    out = tmp_path / "recipe"
    assert main(["reproduce", "--model", str(three_seeds), "--out", str(out), "--num-images", "16", "--no-png",
                 "--no-shapes", "--no-few-shot", "--no-scaling", "--quiet", "--device", "cpu"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    runs = [str(three_seeds / f"s{i}" / "checkpoint") for i in range(3)]
    assert metrics["runs"] == runs
    judged = [v for v in metrics["verdicts"] if v["section"] in ("filters", "positions", "distance")]
    assert len(judged) >= 4 and all(v["n_runs"] == 3 and len(v["details"]["runs"]) == 3 for v in judged)
    assert {v["subject"] for v in judged} == {"3 runs (s0/checkpoint, s1/checkpoint, s2/checkpoint), weights alone",
                                              "3 runs (s0/checkpoint, s1/checkpoint, s2/checkpoint) on 16 CIFAR-10 "
                                              "test images"}
    t2 = student.ppf(0.975, 2)
    for v in judged:  # the rule, recomputed from the runs' records in metrics.json
        stats = np.array([r["statistic"] for r in v["details"]["runs"]])
        assert v["statistic"] == pytest.approx(stats.mean(), rel=1e-12)
        halves = [(r["interval"][1] - r["interval"][0]) / 2 for r in v["details"]["runs"] if None not in r["interval"]]
        if len(halves) == 3:
            shared = v["section"] == "distance"  # the images are shared by the runs, the weights are each run's own
            assert v["details"]["shared"] == shared
            se = math.sqrt(stats.var(ddof=1) / 3 + shared * (np.mean(halves) / Z_95) ** 2)
            assert v["interval"] == pytest.approx([stats.mean() - t2 * se, stats.mean() + t2 * se], rel=1e-9)
            if not v.get("qualifier"):
                assert v["verdict"] == decide(tuple(v["interval"]), v["threshold"], v["side"])
        else:  # a run without an interval: the recipe has none
            assert v["interval"] == [None, None] and v["verdict"] == "inconclusive"
    # run s1 alone: the numbers its report gives are those the recipe's records hold for it
    alone = json.loads((reproduce(model=runs[1], out=tmp_path / "one", num_images=16, png=False, shapes=False,
                                  few_shot=False, scaling=False, progress=False, device="cpu")
                        / "metrics.json").read_text())
    single = {(v["section"], v["finding"]): v for v in alone["verdicts"]}
    for v in judged:
        one = single[v["section"], v["finding"]]
        assert one["n_runs"] == 1 and one["subject"].startswith(runs[1])
        assert v["details"]["runs"][1]["statistic"] == pytest.approx(one["statistic"], rel=1e-9)
        assert v["details"]["runs"][1]["interval"] == pytest.approx(one["interval"], rel=1e-9)
    assert alone["runs"] == [runs[1]]
    table = capsys.readouterr().out
    assert "3 seeds" in table and "3 runs (s0/checkpoint" in table


def test_runs_of_another_shape_are_refused_before_any_work(three_seeds, tmp_path):
    from conftest import tiny_vit

    import vitlab
    from vitlab.report import reproduce

    other = vitlab.save_checkpoint(tiny_vit(), tmp_path / "other")  # 3 blocks against the tiny preset's 2
    with pytest.raises(ValueError, match="depth"):
        reproduce(model=[str(three_seeds / "s0" / "checkpoint"), str(other)], out=tmp_path / "out", png=False,
                  progress=False, device="cpu")
    assert not (tmp_path / "out").exists()


def test_several_runs_are_checkpoints_or_names_without_a_weights_file(tmp_path):
    """weights= is one file for one timm name: with several runs it would be read for each, so it is refused, and
    so are an empty list and a config among the runs (a config has no trained weights to be a run of a recipe)."""
    import vitlab
    from vitlab.report import reproduce

    for model, kw in (([], {}), (["a", "b"], {"weights": "w.safetensors"}),
                      (["a", vitlab.vit_config("Ti/4", img_size=32, depth=1)], {})):
        with pytest.raises(ValueError, match="several runs"):
            reproduce(model=model, out=tmp_path / "out", progress=False, **kw)
    assert not (tmp_path / "out").exists()


def test_compare_recipes_says_which_findings_hold_in_which_recipe():
    from vitlab.findings.recipe import compare_recipes
    from vitlab.findings.verdict import Verdict

    def v(key: str, verdict: str, n: int = 3, qualifier: str = "") -> Verdict:
        return Verdict(finding=key.upper(), criterion="c", statistic=1.0, interval=(0.5, 1.5), threshold=0.0,
                       verdict=verdict, key=key, n_runs=n, qualifier=qualifier)

    a = [v("pos", "reproduced"), v("depth", "reproduced"), v("spread", "inconclusive"), v("only_a", "reproduced")]
    b = [v("depth", "not reproduced"), v("pos", "reproduced"),
         v("spread", "inconclusive", qualifier="depends on convention")]
    rows = compare_recipes({"no teacher": a, "distilled": b})
    assert [r["key"] for r in rows] == ["pos", "depth", "spread"]  # the first recipe's order; only shared keys
    assert [r["holds_in"] for r in rows] == [["no teacher", "distilled"], ["no teacher"], []]
    assert [r["undecided_in"] for r in rows] == [[], [], ["no teacher", "distilled"]]
    assert rows[2]["outcomes"] == {"no teacher": "inconclusive", "distilled": "inconclusive"}
    assert rows[2]["verdicts"] == {"no teacher": "inconclusive", "distilled": "inconclusive (depends on convention)"}
    assert rows[0]["n_runs"] == {"no teacher": 3, "distilled": 3}
    from vitlab.report.recipes import _holds_words

    names = ["no teacher", "distilled"]
    assert [_holds_words(r, names) for r in rows] == [
        "in every recipe", "only in no teacher", "undecided in every recipe"]
    mixed = compare_recipes({"no teacher": [v("x", "not reproduced"), v("y", "reproduced")],
                             "distilled": [v("x", "inconclusive"), v("y", "inconclusive")]})
    assert [_holds_words(r, names) for r in mixed] == [  # "in neither" only where both recipes decided
        "in neither; undecided in distilled", "only in no teacher; undecided in distilled"]
    with pytest.raises(ValueError):
        compare_recipes({"one": a})
    with pytest.raises(ValueError):
        compare_recipes({"a": [v("", "reproduced")], "b": b})
