"""benchmarks/from_scratch.py: the from-scratch learning curve, its verdict and its refusals."""

from __future__ import annotations

import json

import pytest

from benchmarks.from_scratch import main, run, slow_epochs, verdict
from vitlab.train.history import training_curve

# four epochs: 0.5 h, then 0.25 h each with evaluations of 36 s (0.01 h) at epochs 2 and 4
HISTORY = [{"epoch": 1, "epoch_seconds": 1800.0, "eval_seconds": 0.0},
           {"epoch": 2, "epoch_seconds": 900.0, "eval_seconds": 36.0, "test_accuracy": 0.5},
           {"epoch": 3, "epoch_seconds": 900.0, "eval_seconds": 0.0},
           {"epoch": 4, "epoch_seconds": 900.0, "eval_seconds": 36.0, "test_accuracy": 0.7}]


def test_training_curve_counts_training_and_evaluation_hours():
    hours, acc = training_curve(HISTORY)
    assert hours == pytest.approx([0.76, 1.27]) and acc == [0.5, 0.7]
    hours, _ = training_curve(HISTORY, t0=2.0)  # a warm start's curve goes on from where its lineage stood
    assert hours == pytest.approx([2.76, 3.27])


def test_verdict_first_point_at_the_goal_within_the_budget():
    hours, acc = [1.0, 2.0, 3.0, 6.0], [0.8, 0.91, 0.93, 0.95]
    assert verdict(hours, acc, 0.9, 5.0) == {"goal": 0.9, "budget_hours": 5.0, "reached": True, "hours": 2.0,
                                             "accuracy": 0.91}
    late = verdict(hours, acc, 0.94, 5.0)  # 95% only after 6 h: the best within 5 h is what counts
    assert not late["reached"] and (late["hours"], late["accuracy"]) == (3.0, 0.93)
    assert verdict(hours, acc, 0.9, 0.5)["hours"] is None


def test_slow_epochs_are_the_ones_well_above_the_median():
    assert slow_epochs(HISTORY) == [1]  # 1800 s against a median of 900
    assert slow_epochs([{"epoch": 1}]) == []


def _run_folder(tmp_path, history, **cfg):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    (tmp_path / "train_config.json").write_text(json.dumps({"epochs": 10, "model": {"patch_drop_rate": 0.5}, **cfg}))
    return tmp_path


def test_run_reads_the_folder_and_refuses_a_warm_start(tmp_path):
    res = run(_run_folder(tmp_path, HISTORY), 0.6, 1.0)
    assert res["epochs_evaluated"] == [2, 4] and res["epochs_done"] == 4 and res["epochs_planned"] == 10
    assert res["verdict"]["reached"] is False and res["verdict"]["accuracy"] == 0.5  # 70% came after 1.27 h
    _run_folder(tmp_path, HISTORY, init_from="data/checkpoints/vit_cifar10")
    with pytest.raises(ValueError, match="warm-started"):
        run(tmp_path, 0.6, 1.0)


def test_main_reports_a_missing_run_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "res.json"
    assert main(["--run-dir", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "not a vitlab train run folder" in capsys.readouterr().err and not out.exists()


def test_main_writes_the_curve_and_says_the_verdict(tmp_path, capsys):
    out = tmp_path / "res" / "curve.json"
    assert main(["--run-dir", str(_run_folder(tmp_path, HISTORY)), "--goal", "0.6", "--budget-hours", "2",
                 "--out", str(out)]) == 0
    assert "goal 60% within 2 h reached: 70.00% at 1.27 h" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["verdict"]["reached"] and res["hours"] == pytest.approx([0.76, 1.27])
    assert res["figure"].startswith(("written", "skipped"))  # skipped only where no Chromium is installed
    if res["figure"].startswith("written"):  # and then the image is there
        assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def _tiny_distilled(seed: int):
    """A tiny distilled ViT for the shapes data set, heads drawn so that they disagree (the readout is neither's)."""
    import dataclasses

    import torch

    import vitlab
    from vitlab.data.shapes import SHAPE_CLASSES
    from vitlab.train.config import PRESETS

    torch.manual_seed(seed)
    model = vitlab.build_model(dataclasses.replace(PRESETS["tiny"].model, num_classes=len(SHAPE_CLASSES),
                                                   distilled=True)).eval()
    with torch.no_grad():
        model.head.weight.normal_()
        model.head_dist.weight.normal_()
    return model


def _distilled_run(tmp_path, teacher: str | None = "self", **cfg):
    """A run folder whose last checkpoint is a tiny distilled ViT for the shapes data set; its teacher is the same
    network saved again (``"self"``), another one (``"other"``), or none."""
    from vitlab.models.checkpoint import save_checkpoint

    model = _tiny_distilled(0)
    run_dir = tmp_path / "run"
    save_checkpoint(model, run_dir / "checkpoint")
    cfg = {"data": "shapes", "model": {"distilled": True}, "teacher": None, **cfg}
    if teacher is not None:
        save_checkpoint(model if teacher == "self" else _tiny_distilled(1), tmp_path / "teacher")
        cfg["teacher"] = str(tmp_path / "teacher")
    (run_dir / "train_config.json").write_text(json.dumps(cfg))
    return run_dir


def _subset(seed: int, n: int, first: int | None = None):
    import torch

    from vitlab.data.datasets import load_shapes, nested_subsets

    train = load_shapes("train")
    if first is not None:  # the run's max_train_examples: a class-balanced draw with the run's seed (0)
        train = train.subset(nested_subsets(train.labels, [first], seed=0)[0])
    return train.subset(torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:n])


def test_fit_is_one_with_a_teacher_that_is_the_student_itself(tmp_path):
    """A student that is its own teacher takes the teacher's decision on every image and scores what it scores."""
    from benchmarks.from_scratch import fit
    from vitlab.data.datasets import load_shapes

    res = fit(_distilled_run(tmp_path), train_images=30, seed=3)
    for part in ("train", "test"):
        assert res[part]["readout_agrees_with_teacher"] == 1.0
        assert res[part]["readout"] == res[part]["teacher"]
    assert res["train"]["images"] == res["train_images"] == 30 and res["test"]["images"] == len(load_shapes("test"))


def test_fit_scores_student_and_teacher_on_the_seeded_draw_of_the_images_the_run_saw(tmp_path):
    """Against another teacher: each model's accuracy on the seeded draw equals its own timm-pipeline accuracy there
    (an independent pass), the draw comes from the run's ``max_train_examples`` images, and another seed
    draws other images."""
    from benchmarks.from_scratch import fit
    from vitlab.models.checkpoint import load_checkpoint
    from vitlab.train.export import distillation_facts, timm_pipeline_accuracy

    run_dir = _distilled_run(tmp_path, teacher="other", max_train_examples=200)
    res = fit(run_dir, train_images=40, seed=3)
    subset = _subset(3, 40, first=200)
    student, teacher = load_checkpoint(run_dir / "checkpoint"), load_checkpoint(tmp_path / "teacher")
    assert res["train"]["readout"] == timm_pipeline_accuracy(student, subset)
    assert res["train"]["teacher"] == timm_pipeline_accuracy(teacher, subset)
    assert res["train"]["readout_agrees_with_teacher"] < 1.0  # two different networks
    assert res["train"] == distillation_facts(student, teacher, subset)
    assert res["train"] != distillation_facts(student, teacher, _subset(3, 40))  # not a draw from all 8,000
    assert res["train"] != fit(run_dir, train_images=40, seed=4)["train"]


def test_fit_refuses_a_run_without_a_teacher_or_a_checkpoint(tmp_path, capsys):
    from benchmarks.from_scratch import fit

    run_dir = _distilled_run(tmp_path, teacher=None)
    with pytest.raises(ValueError, match="no distilled student"):
        fit(run_dir)
    (run_dir / "metrics.jsonl").write_text(json.dumps(HISTORY[1]) + "\n")
    out = tmp_path / "res.json"
    assert main(["--run-dir", str(run_dir), "--fit", "--out", str(out)]) == 2
    assert "leave --fit off" in capsys.readouterr().err and not out.exists()
    run_dir = _distilled_run(tmp_path / "b")
    (run_dir / "metrics.jsonl").write_text(json.dumps(HISTORY[1]) + "\n")
    (run_dir / "checkpoint" / "config.json").unlink()
    assert main(["--run-dir", str(run_dir), "--fit", "--out", str(out)]) == 2
    assert "holds no checkpoint yet" in capsys.readouterr().err and not out.exists()
