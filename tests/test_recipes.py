"""Issue 46 on tiny models: a recipe's seeds shipped with their emergence records, and the report's recipe sections."""

from __future__ import annotations

import dataclasses
import json

import pytest

import vitlab
from vitlab.base.errors import FolderError
from vitlab.data.datasets import DataError
from vitlab.train.config import PRESETS, with_num_classes
from vitlab.train.emergence import fig7_statistics, sample_batch
from vitlab.train.export import export_recipe
from vitlab.train.loop import train


def _train(run, data, seed: int, **changes):
    cfg = dataclasses.replace(with_num_classes(PRESETS["tiny"], 3), epochs=2, snapshot_every=1, val_per_class=4,
                              data=str(data), seed=seed, **changes)
    train(cfg, run, progress=False)
    return run


@pytest.fixture(scope="module")
def recipes(tmp_path_factory, tiny_data):
    """Two toy recipes of two seeds each, trained and shipped by export_recipe: {name: (run folders, facts)}. Their
    learning curves are not drawn (no Chromium found): each seed's PNG took a browser start, and no test here reads
    it (tests/test_train.py's export tests do)."""
    import vitlab.figures.static

    root = tmp_path_factory.mktemp("recipes")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vitlab.figures.static, "find_chromium", lambda: None)
        for name, changes in (("plain", {}), ("slow", {"lr": 1e-4})):
            runs = [_train(root / "runs" / name / f"s{seed}", tiny_data, seed, **changes) for seed in (1, 0)]
            out[name] = (runs, export_recipe(runs, root / "shipped" / name, full_epochs=5))
    return root, out


def test_each_seeds_card_holds_the_emergence_of_its_snapshots_as_computed_directly(recipes):
    root, got = recipes
    runs, facts = got["plain"]
    assert [f["seed"] for f in facts] == [0, 1]  # seed order, whatever the runs' order
    for run, seed in ((runs[1], 0), (runs[0], 1)):
        card = json.loads((root / "shipped" / "plain" / f"seed{seed}" / "card.json").read_text())
        assert card["recipe"] == "plain" and card["seed"] == seed and card["dtype"] == "float16"
        assert card["full_epochs"] == 5 and card["shortened"] is True  # 2 of 5 epochs
        assert card["command"] == f"vitlab train --preset plain --set seed={seed}"
        assert [r["epoch"] for r in card["emergence"]] == [1, 2]
        recorded = json.loads((run / "checkpoint" / "config.json").read_text())["data"]
        assert recorded["validation_images"] == card["data"]["validation_images"] == 4 * 3  # val_per_class x classes
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [h["val_accuracy"] for h in card["history"]] == [h["val_accuracy"] for h in history]
        assert "test_accuracy" not in history[0] and 0 <= card["test_accuracy"] <= 1  # read once, at the end
        for rec in card["emergence"]:
            snap = vitlab.load_model(run / "snapshots" / f"epoch_{rec['epoch']:04d}")
            direct = fig7_statistics(snap, sample_batch(snap))
            for key, value in direct.items():
                assert rec[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
            assert rec["val_accuracy"] == history[rec["epoch"] - 1]["val_accuracy"]
        text = (root / "shipped" / "plain" / f"seed{seed}" / "MODEL_CARD.md").read_text()
        assert "a shortened schedule" in text and "2 of the full recipe's 5 epochs" in text


def test_export_recipe_refuses_runs_of_different_recipes_or_one_seed_twice(recipes, tmp_path):
    _, got = recipes
    plain, slow = got["plain"][0], got["slow"][0]
    with pytest.raises(ValueError, match="differs in lr"):
        export_recipe([plain[0], slow[0]], tmp_path / "mixed")
    with pytest.raises(ValueError, match="same seed"):
        export_recipe([plain[0], plain[0]], tmp_path / "twice")
    with pytest.raises(ValueError, match="not finished"):  # its config says more epochs than it trained
        cfg = json.loads((plain[0] / "checkpoint" / "config.json").read_text())
        run = tmp_path / "unfinished"
        import shutil

        shutil.copytree(plain[0], run)
        cfg["train"]["epochs"] = 9
        (run / "checkpoint" / "config.json").write_text(json.dumps(cfg))
        export_recipe([run], tmp_path / "u")
    assert not (tmp_path / "mixed").exists() and not (tmp_path / "u").exists()  # refused before any export


def test_export_recipe_refuses_missing_data_or_a_foreign_out_before_measuring_snapshots(recipes, tmp_path,
                                                                                          monkeypatch):
    import shutil

    import vitlab.train.emergence

    _, got = recipes
    measured = []
    monkeypatch.setattr(vitlab.train.emergence, "snapshot_history", lambda run, progress=False: measured.append(run))
    run = shutil.copytree(got["plain"][0][0], tmp_path / "moved")
    cfg = json.loads((run / "checkpoint" / "config.json").read_text())
    cfg["train"]["data"] = str(tmp_path / "gone")  # its data set was moved away since training
    (run / "checkpoint" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError):
        export_recipe([run], tmp_path / "out")
    foreign = tmp_path / "foreign" / "seed1"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FolderError) as refused:
        export_recipe([got["plain"][0][0]], tmp_path / "foreign")
    assert refused.value.value == str(foreign)
    assert measured == [] and not (tmp_path / "out").exists()
    assert (foreign / "notes.txt").read_text() == "mine"


def test_the_recipes_sections_from_two_toy_recipes(recipes, monkeypatch):
    import vitlab.report.recipes
    from vitlab.findings.model import KEY_DEPTH_TREND, KEY_LOWEST_SPREAD, KEY_POSITION_DISTANCE
    from vitlab.findings.recipe import compare_recipes
    from vitlab.report.recipes import recipe_judgement, recipes_sections

    calls = []  # each recipe's judgement as the sections made it: (its seeds, device, name), its verdicts

    def judgement(runs, device="cpu", name=None):
        calls.append(((sorted(map(str, runs)), str(device), name), recipe_judgement(runs, device, name)))
        return calls[-1][1]

    monkeypatch.setattr(vitlab.report.recipes, "recipe_judgement", judgement)
    root, got = recipes
    made = recipes_sections(root / "shipped")
    assert [s.slug for s in made] == ["recipes", "recipe_accuracy", "emergence"] and not any(s.hidden for s in made)
    compare, accuracy, emergence = made
    seeds = {n: sorted((root / "shipped" / n).glob("seed*")) for n in ("plain", "slow")}
    # every recipe judged once, over all its shipped seeds, on the CPU, and the table compares those judgements
    assert [args for args, _ in calls] == [(sorted(map(str, s)), "cpu", n) for n, s in seeds.items()]
    judged = {n: verdicts for (_, _, n), verdicts in calls}
    assert compare.metrics["rows"] == compare_recipes(judged)
    assert {r["key"] for r in compare.metrics["rows"]} >= {KEY_POSITION_DISTANCE, KEY_LOWEST_SPREAD, KEY_DEPTH_TREND}
    assert all(v.n_runs == 2 for v in compare.verdicts) and len(compare.verdicts) == sum(map(len, judged.values()))
    assert {v.subject.split(":")[0] for v in compare.verdicts} == {"plain", "slow"}  # each names its recipe
    for name, (_, facts) in got.items():
        acc = [f["test_accuracy"] for f in facts]
        assert accuracy.metrics[name]["test_accuracy"] == acc
        assert accuracy.metrics[name]["mean"] == pytest.approx(sum(acc) / 2)
        assert f"{name}: {sum(acc) / 2:.2%} over 2 seeds" in accuracy.ours
        first = [f["emergence"] for f in facts]
        band = emergence.metrics["bands"][name]["lowest_min"]
        assert band["mean"][0] == pytest.approx((first[0][0]["lowest_min"] + first[1][0]["lowest_min"]) / 2)
        assert emergence.metrics["halfway"][name]["lowest_min"]["start"] == band["mean"][0]
        assert emergence.metrics["halfway"][name]["position_spearman"]["epoch"] in (1, 2)


def test_without_two_shipped_recipes_there_is_no_section_only_a_note(recipes, tmp_path):
    from vitlab.findings.recipe import RECIPE_COMMAND
    from vitlab.report.recipes import recipes_sections
    from vitlab.report.render import render_html

    root, _ = recipes
    for where in (tmp_path / "none", root / "shipped" / "plain"):  # nothing; one folder of seeds, no recipes
        (made,) = recipes_sections(where)
        assert made.hidden and made.figure is None and made.verdicts == []
        assert made.not_judged[0][0] == "Fig. 7 findings by training recipe" and RECIPE_COMMAND in made.not_judged[0][1]
        page = render_html({"model": "m", "headline": "", "facts": [], "vitlab": "0", "seconds": 0}, [made])
        assert "<section" not in page and "export-recipe" in page


def test_the_emergence_notebook_states_the_records_numbers(recipes):
    import os
    from pathlib import Path

    import jupytext
    import nbclient

    from vitlab.findings.recipe import emergence_lines, emergence_summary, recipe_cards, shipped_recipes

    root, got = recipes
    nb = jupytext.read(Path(__file__).resolve().parent.parent / "notebooks" / "08_emergence.py")
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute(
        env={**os.environ, "VITLAB_SMOKE": "1", "OMP_NUM_THREADS": "1", "VITLAB_RECIPES": str(root / "shipped")})
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/markdown", "") for o in outputs)
    _, times, _ = emergence_summary({n: recipe_cards(s) for n, s in shipped_recipes(root / "shipped").items()})
    for name, (_, facts) in got.items():
        acc = [f["test_accuracy"] for f in facts]
        assert f"{name}: mean {sum(acc) / 2:.2%}" in text
        h = times[name]["position_spearman"]
        assert (f"{name}, 2D position structure (position-embedding Spearman): {h['start']:.3f} at the first "
                f"epoch to {h['end']:.3f} at the last, half-way by epoch {h['epoch']}") in text
    assert all(f"* {line}" in text for line in emergence_lines(times))
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)  # the bands are drawn


def test_the_export_recipe_command(recipes, tmp_path, capsys):
    from vitlab.cli import main

    _, got = recipes
    runs, facts = got["plain"]
    assert main(["export-recipe", *map(str, runs), "--out", str(tmp_path / "vit_x"), "--full-epochs", "2",
                 "--quiet"]) == 0
    said = capsys.readouterr()
    lines = [json.loads(line) for line in said.out.splitlines()]
    assert "accuracy:" not in said.err  # --quiet: no bar while each seed's test accuracy is measured either
    assert [(r["seed"], r["recipe"], r["shortened"]) for r in lines] == [(0, "vit_x", False), (1, "vit_x", False)]
    assert [r["test_accuracy"] for r in lines] == [f["test_accuracy"] for f in facts]  # the same fp16 weights
    card = json.loads((tmp_path / "vit_x" / "seed1" / "card.json").read_text())
    assert card["command"] == "vitlab train --preset vit_x --set seed=1"
    assert card["emergence"] == facts[1]["emergence"]
    assert main(["export-recipe", str(runs[0]), "--out", str(runs[0] / "shipped")]) == 1  # inside a run: refused
    assert "inside it or above it" in capsys.readouterr().err and not (runs[0] / "shipped").exists()


def test_a_run_that_did_not_record_its_validation_split_gets_it_from_its_config():
    from vitlab.train.export import _data_record

    data = {"train": "t.zip", "test": "v.zip", "classes": ["a", "b", "c"]}
    assert _data_record({"data": data, "train": {"val_per_class": 7}})["validation_images"] == 21
    assert _data_record({"data": data, "train": {"val_per_class": 0}}) == data  # no split: the record as it was
    assert _data_record({"data": {**data, "validation_images": 5}, "train": {"val_per_class": 7}})[
        "validation_images"] == 5  # a run's own count is kept


def test_local_heads_get_a_time_only_where_a_lowest_layer_head_became_local():
    from vitlab.findings.recipe import emergence_lines

    def h(start, end, epoch):
        return {"start": start, "end": end, "epoch": epoch, "images_seen": epoch * 1000}

    base = {"lowest_min": h(0.98, 0.77, 6), "position_spearman": h(-0.02, -0.57, 2)}
    none_local = emergence_lines({"r": {**base, "lowest_local_share": h(0.0, 0.0, 1)}})
    some_local = emergence_lines({"r": {**base, "lowest_local_share": h(0.0, 0.25, 9)}})
    old_cards = emergence_lines({"r": base})  # records without the share: the order as before
    assert any("0% of the lowest layer's heads" in line for line in none_local)
    assert not any("epochs before" in line for line in none_local)
    assert any("25% of the lowest layer's heads" in line for line in some_local)
    assert "r: position structure first, 4 epochs before the local heads." in some_local
    assert old_cards[-1] == "r: position structure first, 4 epochs before the local heads."
