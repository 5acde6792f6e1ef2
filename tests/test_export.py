"""Export's card: paths named portably, the precision the epochs ran in, and the whole training time of a model
trained over several warm starts (a learning curve that continues where its starting checkpoint left off)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vitlab.base import precision
from vitlab.train.config import PRESETS
from vitlab.train.loop import train


def _export(run, out) -> dict:
    from vitlab.cli import main

    assert main(["export", "--run-dir", str(run), "--out", str(out), "--command-line", "vitlab train --preset tiny"]) == 0
    return json.loads((out / "card.json").read_text())


def test_export_card_names_the_precision_and_a_relative_warm_start(tmp_path, two_class_folder, monkeypatch):
    from vitlab.train.export import _precision, _warm_start_facts

    monkeypatch.setattr(precision, "_cpu_bf16", lambda: False)
    monkeypatch.chdir(tmp_path)
    base = dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=True)
    train(base, tmp_path / "first", progress=False)
    first = _export(tmp_path / "first", tmp_path / "start")
    assert len(first["lineage"]) == 1 and first["lineage"][0]["total_train_hours"] == first["train_hours"]
    assert first["run_id"] == (tmp_path / "first" / "run_id").read_text().strip()  # the card names its run
    first["train_hours"] = 1.25  # as if the start had trained 1.25 h (a tiny run takes a second)
    first["lineage"] = [{**first["lineage"][0], "train_hours": 1.25, "total_train_hours": 1.25}]
    (tmp_path / "start" / "card.json").write_text(json.dumps(first))
    train(dataclasses.replace(base, init_from=str(tmp_path / "start")), tmp_path / "warm", progress=False)
    card = _export(tmp_path / "warm", tmp_path / "shipped")
    assert card["warm_start_from"] == "start"  # relative to the working directory, not /tmp/...
    assert card["training_precision"] == "fp32"
    text = (tmp_path / "shipped" / "MODEL_CARD.md").read_text()
    assert "warm-started with a fresh schedule from `start`" in text and "measured in fp32 during training" in text
    data_line = next(line for line in text.splitlines() if line.startswith("* Data: "))  # sentences, not a dict
    assert data_line == (f"* Data: trained on `{card['data']['train']}` ({card['data']['train_examples']:,} images); "
                         f"evaluated during training on `{card['data']['test']}`; 2 classes (a, b).")
    assert str(tmp_path) not in text
    # epochs before the field existed ran as configured; a resumed run on another machine shows both, in order
    assert _precision([{}, {"precision": "bf16"}, {"precision": "fp32"}, {"precision": "fp32"}], {"bf16": True}) \
        == "bf16, then fp32"
    assert _precision([{}], {"bf16": False}) == "fp32"
    # the whole lineage's training time: the start's hours, then this run's; a further warm start adds on
    assert "warm_start_hours" not in first
    assert card["warm_start_hours"] == 1.25
    assert card["warm_start_test_accuracy"] == first["test_accuracy"]
    assert card["total_train_hours"] == pytest.approx(first["train_hours"] + card["train_hours"], abs=2e-3)
    assert f"**{card['total_train_hours']:.2f} h in all**" in text
    train(dataclasses.replace(base, init_from=str(tmp_path / "shipped")), tmp_path / "again", progress=False)
    third = _export(tmp_path / "again", tmp_path / "third")
    assert third["warm_start_hours"] == pytest.approx(card["total_train_hours"], abs=1e-3)
    # exported again onto the folder it started from (the default's case): the start its first card recorded
    again = _export(tmp_path / "again", tmp_path / "shipped")
    assert again["warm_start_hours"] == third["warm_start_hours"] == pytest.approx(card["total_train_hours"], abs=1e-3)
    assert _export(tmp_path / "again", tmp_path / "shipped")["warm_start_hours"] == again["warm_start_hours"]
    # the lineage: one leg per warm start, each ending where the next began, the last this card's own
    assert [leg["total_train_hours"] for leg in card["lineage"]] == [1.25, card["total_train_hours"]]
    assert card["lineage"][0]["test_accuracy"] == first["test_accuracy"]
    assert card["lineage"][1] == {"total_train_hours": card["total_train_hours"], "train_hours": card["train_hours"],
                                  "test_accuracy": card["test_accuracy"], "epochs_done": 1,
                                  "hardware": card["hardware"], "command": "vitlab train --preset tiny"}
    assert third["lineage"][:2] == card["lineage"] and len(third["lineage"]) == 3
    again = json.loads((tmp_path / "shipped" / "card.json").read_text())  # exported twice onto its start: no new leg
    assert again["lineage"][:2] == card["lineage"] and again["lineage"][2]["test_accuracy"] == again["test_accuracy"]
    assert len(again["lineage"]) == 3
    table = (tmp_path / "shipped" / "MODEL_CARD.md").read_text().split("## Lineage")[1].split("\n## ")[0]
    assert table.count("\n| ") == 1 + 3 and f"| 3 | 1 | {again['train_hours']:.3f} | " in table
    assert "warm-started with a fresh schedule from the checkpoint `shipped` held before this export replaced it" in \
        (tmp_path / "shipped" / "MODEL_CARD.md").read_text()
    # a card from before train_hours existed gives its train_seconds; a folder without a card gives nothing
    (tmp_path / "start" / "card.json").write_text(json.dumps({"train_seconds": 7351.0, "test_accuracy": 0.6202}))
    assert _warm_start_facts(str(tmp_path / "start"), 0.5) == {
        "warm_start_hours": 2.042, "warm_start_test_accuracy": 0.6202, "total_train_hours": 2.542,
        "earlier_legs": [{"total_train_hours": 2.042, "train_hours": 2.042, "test_accuracy": 0.6202,
                          "epochs_done": None, "hardware": None, "command": None}]}
    # a warm-started card from before lineages: everything before its start as one leg, then its own
    (tmp_path / "start" / "card.json").write_text(json.dumps({
        "train_hours": 0.381, "warm_start_hours": 2.004, "warm_start_test_accuracy": 0.8735,
        "total_train_hours": 2.385, "test_accuracy": 0.8836, "epochs_done": 12, "command": "vitlab train ..."}))
    legs = _warm_start_facts(str(tmp_path / "start"), 0.5)["earlier_legs"]
    assert legs == [{"total_train_hours": 2.004, "train_hours": None, "test_accuracy": 0.8735, "epochs_done": None,
                     "hardware": None, "command": None},
                    {"total_train_hours": 2.385, "train_hours": 0.381, "test_accuracy": 0.8836, "epochs_done": 12,
                     "hardware": None, "command": "vitlab train ..."}]
    (tmp_path / "start" / "card.json").unlink()
    assert _warm_start_facts(str(tmp_path / "start"), 0.5) == {} and _warm_start_facts(None, 0.5) == {}



def test_an_interim_export_onto_the_start_is_known_by_its_run_id(tmp_path):
    """Exported during the run onto the folder it started from, then trained on and exported again: the weights
    differ, but the card's run_id is this run's, so the start that card recorded is kept (10 h, one earlier leg),
    not counted twice (11.5 h, two legs)."""
    import torch
    from safetensors.torch import save_file

    from vitlab.train.export import _warm_start_facts

    start = tmp_path / "start"
    start.mkdir()
    save_file({"w": torch.ones(3)}, str(start / "model.safetensors"))  # the interim export
    (start / "card.json").write_text(json.dumps({
        "run_id": "r1", "warm_start_hours": 10.0, "warm_start_test_accuracy": 0.80, "total_train_hours": 11.5,
        "train_hours": 1.5, "test_accuracy": 0.83, "epochs_done": 9,
        "lineage": [{"total_train_hours": 10.0, "train_hours": 10.0, "test_accuracy": 0.80},
                    {"total_train_hours": 11.5, "train_hours": 1.5, "test_accuracy": 0.83, "epochs_done": 9}]}))
    later = tmp_path / "later.safetensors"
    save_file({"w": torch.full((3,), 2.0)}, str(later))  # the same run, six epochs on
    f = _warm_start_facts(str(start), 2.5, later, run_id="r1")
    assert (f["warm_start_hours"], f["total_train_hours"], len(f["earlier_legs"])) == (10.0, 12.5, 1)
    other = _warm_start_facts(str(start), 2.5, later, run_id="r2")  # another run warm-started from that export
    assert (other["warm_start_hours"], other["total_train_hours"], len(other["earlier_legs"])) == (11.5, 14.0, 2)


def test_card_hardware_names_the_training_machine_and_the_threads_it_used(tmp_path, two_class_folder, monkeypatch):
    """The card's hardware line comes from the run's own environment (recorded at training), not the exporting
    machine: a run with 1 torch thread on a 2-core CPU says so."""
    import torch

    from vitlab.base.provenance import cpu_model
    from vitlab.train.export import _hardware

    assert _hardware({"cpu": "AMD EPYC", "cores": 2, "threads": 1}, "fp32") == "AMD EPYC, 1 of 2 cores, fp32"
    assert _hardware({"cpu": "Xeon", "cores": 2, "threads": 2}, "bf16") == "Xeon, 2 cores, bf16"
    assert _hardware({"device": "cuda:0", "gpu": "NVIDIA H100", "cpu": "Xeon", "cores": 16}, "bf16") == \
        "NVIDIA H100, bf16"
    # torchrun: each process's threads count; a GPU run saved before the GPU's name was recorded is still a GPU run
    assert _hardware({"cpu": "Xeon", "cores": 2, "threads": 1, "world_size": 2}, "fp32") == "Xeon, 2 cores, fp32"
    assert _hardware({"cpu": "Xeon", "cores": 8, "threads": 1, "world_size": 2}, "fp32") == "Xeon, 2 of 8 cores, fp32"
    assert _hardware({"device": "cuda:1", "world_size": 4}, "bf16") == "4 x CUDA GPU, bf16"
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=False),
              tmp_path / "run", progress=False)
    finally:
        torch.set_num_threads(threads)
    env = json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())["environment"]
    assert env["threads"] == 1 and env["cpu"] == cpu_model()
    assert _export(tmp_path / "run", tmp_path / "out")["hardware"] == _hardware(env, "fp32")


def test_card_versions_name_the_training_stack_where_it_differs_from_the_exporting_one(tmp_path, two_class_folder,
                                                                                      monkeypatch):
    """A model trained elsewhere (an accelerator's image with another torch) says what it trained with and what
    measured it; one trained here names one stack."""
    from vitlab.base.provenance import versions

    monkeypatch.chdir(tmp_path)
    train(dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=False), tmp_path / "run",
          progress=False)
    here = versions()
    card = _export(tmp_path / "run", tmp_path / "out")
    assert card["train_versions"] == {"torch": here["torch"], "timm": here["timm"]}
    text = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert f"* Versions: torch {here['torch']}, timm {here['timm']}." in text and "trained with torch" not in text
    cfg_file = tmp_path / "run" / "checkpoint" / "config.json"
    meta = json.loads(cfg_file.read_text())
    meta["environment"]["torch"] = "2.11.0+cu130"
    cfg_file.write_text(json.dumps(meta))
    card = _export(tmp_path / "run", tmp_path / "out2")
    assert card["train_versions"]["torch"] == "2.11.0+cu130"
    assert (f"* Versions: trained with torch 2.11.0+cu130, timm {here['timm']}; exported and measured with torch "
            f"{here['torch']}, timm {here['timm']}.") in (tmp_path / "out2" / "MODEL_CARD.md").read_text()


def test_card_says_how_a_fresh_vits_attention_started(tmp_path, two_class_folder, monkeypatch):
    """A run from random weights with mimetic attention says so on its card; timm's initialisation goes unnamed."""
    from vitlab.models.card import _init_words

    monkeypatch.chdir(tmp_path)
    tiny = PRESETS["tiny"]
    train(dataclasses.replace(tiny, data=str(two_class_folder), epochs=1, bf16=False,
                              model=dataclasses.replace(tiny.model, init="mimetic")), tmp_path / "run", progress=False)
    _export(tmp_path / "run", tmp_path / "out")
    assert ", from random initialisation (mimetic attention, `vitlab.models.mimetic`)" in \
        (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert _init_words({"init": "timm"}) == "" and _init_words({}) == ""
    assert _init_words({"vit": {"init": "mimetic_qk"}, "layers": [1]}) == " (mimetic query-key products, `vitlab.models.mimetic`)"


def test_a_run_without_train_seconds_and_a_goal_given_in_percent(tmp_path, two_class_folder, monkeypatch, capsys):
    """A checkpoint without train_seconds (an older run) gets a card that says so (it was a TypeError), and --goal
    is a fraction: 90 is refused before any work (it drew "goal 9000%")."""
    from vitlab.cli import main
    from vitlab.train.export import export_run

    monkeypatch.chdir(tmp_path)
    train(dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=False), tmp_path / "run",
          progress=False)
    for goal in ("90", "0", "nan"):
        assert main(["export", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--command-line",
                     "x", "--goal", goal]) == 1
        assert f"--goal is a fraction in (0, 1], e.g. 0.9 for a 90% accuracy goal, got {float(goal):g}" in \
            capsys.readouterr().err
    with pytest.raises(ValueError, match=r"goal must be a fraction in \(0, 1\]"):
        export_run(tmp_path / "run", tmp_path / "out", command="x", goal=90.0)
    assert not (tmp_path / "out").exists()
    cfg_file = tmp_path / "run" / "checkpoint" / "config.json"
    meta = json.loads(cfg_file.read_text())
    del meta["train_seconds"]
    cfg_file.write_text(json.dumps(meta))
    card = _export(tmp_path / "run", tmp_path / "out")
    assert card["train_seconds"] is None
    assert "* Training wall time: not recorded (the run's checkpoint has no train_seconds) on " in \
        (tmp_path / "out" / "MODEL_CARD.md").read_text()


def _shapes_subsets(n_train: int = 64, n_test: int = 64):
    """The first images of the shapes splits, as a study's run trains and tests on them (train: class-balanced)."""
    from vitlab.data.datasets import load_shapes, nested_subsets

    train_data, test_data = load_shapes("train"), load_shapes("test")
    return (train_data.subset(nested_subsets(train_data.labels, [n_train], seed=0)[0]),
            test_data.subset(list(range(n_test))))


def test_the_card_names_the_split_it_measured_not_the_runs_test_images(tmp_path, monkeypatch):
    """A run tested on 64 images of the shapes test split (as the MPP study's runs are) is measured on export on the
    whole split: the card says so, with the split's own name, and its accuracy is that of the whole split."""
    from vitlab.data.datasets import load_shapes
    from vitlab.models.load import load_model
    from vitlab.train.export import timm_pipeline_accuracy

    monkeypatch.chdir(tmp_path)
    train_data, test_data = _shapes_subsets()
    assert test_data.source == "shapes:test:seed1[subset 64]"
    train(dataclasses.replace(PRESETS["tiny"], data="shapes", epochs=1, bf16=False), tmp_path / "run", progress=False,
          train_data=train_data, test_data=test_data)
    card = _export(tmp_path / "run", tmp_path / "out")
    whole = load_shapes("test")
    assert card["test_accuracy"] == timm_pipeline_accuracy(load_model(str(tmp_path / "out")), whole)
    text = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    lead = " ".join(text.split("\n* Training time")[0].split())
    assert "on all 2,000 images of the shapes:test:seed1 split" in lead and "[subset 64]" not in lead
    assert card["test_split"] == whole.source == "shapes:test:seed1" and card["test_images"] == len(whole) == 2000
    assert card["data"]["test"] == "shapes:test:seed1[subset 64]"  # what the run itself was tested on, kept apart


def test_a_run_with_a_qualified_data_label_exports(tmp_path, monkeypatch):
    """The MPP study's runs name their data "shapes[n=256]" (the data set and the part of it used): export loads the
    shapes test split, and the card measures and names it."""
    from vitlab.data.datasets import base_dataset

    monkeypatch.chdir(tmp_path)
    assert base_dataset("shapes[n=256]") == "shapes" and base_dataset("cifar10[500 per class, seed 0]") == "cifar10"
    assert base_dataset("shapes") == "shapes" and base_dataset("cifar10:/data/c10[n=5]") == "cifar10:/data/c10"
    (tmp_path / "odd[1]").mkdir()
    assert base_dataset("odd[1]") == "odd[1]"  # a folder whose name ends in brackets is its own name
    # loading such a label (e.g. `vitlab train --resume` of a study run) says what it is, not "not found"
    from vitlab.data.datasets import DataError, load_dataset

    with pytest.raises(DataError, match=r"names a part of 'shapes' that a run trained on .* running the study again"):
        load_dataset("shapes[n=64]", "train")
    train_data, test_data = _shapes_subsets()
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=PRESETS["tiny"].model, data="shapes[n=64]", epochs=1,
                              batch_size=16, warmup_epochs=0.5, bf16=False)
    train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)
    card = _export(tmp_path / "run", tmp_path / "out")
    assert card["objective"] == "mpp" and card["mpp_test_images"] == 2000 and card["test_split"] == "shapes:test:seed1"
    text = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert "masked patch prediction on shapes[n=64]" in text
    assert "on all 2,000 images of the shapes:test:seed1 split" in " ".join(text.split())


def test_an_export_after_a_kill_between_checkpoint_and_metrics_line_keeps_the_last_epoch(tmp_path, two_class_folder,
                                                                                        monkeypatch):
    """An epoch's checkpoint is written before its metrics line: exported after a kill between the two, the card
    still shows every epoch (table, curve, hours), from the checkpoint's own record, and the run folder is left
    as it was; lines are matched to epochs by number, not counted from the end."""
    from vitlab.train.history import read_history, run_history

    monkeypatch.chdir(tmp_path)
    train(dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=2, bf16=False), tmp_path / "run",
          progress=False)
    whole = _export(tmp_path / "run", tmp_path / "whole")
    rows = [line for line in (tmp_path / "whole" / "MODEL_CARD.md").read_text().splitlines() if line[:4] in ("| 1 ", "| 2 ")]
    assert len(rows) == 2
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0])  # killed after the epoch-2 checkpoint, before its line
    killed = _export(tmp_path / "run", tmp_path / "killed")
    text = (tmp_path / "killed" / "MODEL_CARD.md").read_text()
    assert [line for line in text.splitlines() if line[:4] in ("| 1 ", "| 2 ")] == rows
    assert killed["train_hours"] == whole["train_hours"] and killed["epochs_done"] == 2
    assert metrics.read_text() == lines[0]  # export repairs nothing in the run folder
    meta = json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())
    first, second = (json.loads(x) for x in lines)
    assert run_history(tmp_path / "run", meta) == [first, second]
    metrics.write_text(lines[0] + lines[0])  # a line repeated (an older resume): still one record per epoch
    assert run_history(tmp_path / "run", meta) == [first, second] and len(read_history(tmp_path / "run")) == 2
    metrics.write_text(lines[0] + lines[1] + json.dumps({**second, "epoch": 3}) + "\n")  # past the checkpoint
    assert run_history(tmp_path / "run", meta) == [first, second]
    metrics.unlink()  # killed before the first line was ever written
    assert run_history(tmp_path / "run", {**meta, "epoch": 1, "metrics": first}) == [first]


def test_the_cards_data_line_is_sentences_for_any_record():
    from vitlab.models.card import _data_line

    assert _data_line(None) == _data_line({}) == "not recorded by the run"
    assert _data_line({"train": "t.zip", "test": "v.zip", "train_examples": 50000}) == (
        "trained on `t.zip` (50,000 images); evaluated during training on `v.zip`")
    assert _data_line({"test": "v.zip", "note": "x"}) == "evaluated during training on `v.zip`; note: x"
    assert _data_line({"train": "t.zip", "test": "v.zip", "validation_images": 5000}) == (
        "trained on `t.zip`; validated during training on 5,000 images held out of the training split; tested once, "
        "after the last epoch, on `v.zip`")


def test_a_full_disk_stops_the_export_and_no_card_names_a_temporary_path(tmp_path, two_class_folder, monkeypatch,
                                                                           capsys):
    """With the disk full while the learning curve was drawn, export exited 0 without learning_curve.png and its card
    blamed kaleido, recording the staging folder's absolute temporary path: a full disk is now one DiskFullError
    line naming --out and exit status 1, with no folder written; another drawing failure is recorded on the card by
    the folder's name, never by the temporary path."""
    import errno

    import plotly.io as pio

    from vitlab.cli import main
    from vitlab.figures import static

    monkeypatch.chdir(tmp_path)
    train(dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=False), tmp_path / "run",
          progress=False)
    monkeypatch.setattr(static, "find_chromium", lambda: "/usr/bin/chromium")

    def full(figures, paths, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", paths[0])

    monkeypatch.setattr(pio, "write_images", full)
    args = ["export", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--command-line", "x"]
    capsys.readouterr()
    assert main(args) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vitlab")]  # less the bars
    assert len(err) == 1 and "DiskFullError" in err[0] and str(tmp_path / "out") in err[0] and ".tmp." not in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no --out, no staging folder left

    monkeypatch.setattr(pio, "write_images", lambda figures, paths, **kwargs: None)  # kaleido draws nothing
    assert main(args) == 0
    card = json.loads((tmp_path / "out" / "card.json").read_text())
    assert card["learning_curve"].startswith("failed: RuntimeError: kaleido wrote no image for out/learning_curve")
    assert ".tmp." not in (tmp_path / "out" / "MODEL_CARD.md").read_text() + json.dumps(card)
