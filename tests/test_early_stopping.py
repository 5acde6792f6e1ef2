"""Early stopping (``TrainConfig.patience``): a run stops when its watched accuracy stops rising, and stays stopped."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vitlab.train.config import PRESETS, TrainConfig
from vitlab.train.loop import Patience, train


def _log(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_patience_counts_evaluations_without_a_gain_and_a_tie_is_no_gain():
    p = Patience(2)
    assert [p.update(v, e) for e, v in enumerate([0.5, 0.6, None, 0.6, 0.55], 1)] == [False] * 4 + [True]
    assert (p.best, p.best_epoch, p.since, p.stopped) == (0.6, 2, 2, True)
    assert Patience.from_state(2, p.state()) == p and Patience.from_state(2, None) == Patience(2)


def test_patience_stops_a_run_and_a_resume_trains_no_further(tmp_path, tiny_data, monkeypatch):
    """lr 0: the watched accuracy never rises after the first evaluation, so patience 2 stops the run at epoch 3 of
    a 30-epoch cap; the stopped epoch is the last (it reads the test images, which a validation split keeps for the
    last epoch), and a resume finds the run finished."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = dataclasses.replace(PRESETS["tiny"], data=str(tiny_data), epochs=30, lr=0.0, min_lr=0.0, patience=2,
                              val_per_class=8, keep_best=True, warmup_epochs=0.0)
    train(cfg, tmp_path / "run", progress=False)
    log = _log(tmp_path / "run")
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert all("val_accuracy" in r for r in log) and [("test_accuracy" in r) for r in log] == [False, False, True]
    assert log[-1]["early_stop"] == {"best_epoch": 1, "patience": 2}
    state = json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())["early_stop"]
    assert (state["stopped"], state["best_epoch"], state["since"]) == (True, 1, 2)
    assert json.loads((tmp_path / "run" / "best" / "config.json").read_text())["epoch"] == 1
    train(cfg, tmp_path / "run", resume=True, progress=False)
    assert _log(tmp_path / "run") == log  # stopped: nothing more trained or logged


def test_a_run_that_keeps_improving_trains_to_its_cap(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = dataclasses.replace(PRESETS["tiny"], data=str(tiny_data), epochs=2, patience=5)
    train(cfg, tmp_path / "run", progress=False)
    log = _log(tmp_path / "run")
    assert [r["epoch"] for r in log] == [1, 2] and "early_stop" not in log[-1]


@pytest.mark.parametrize("change", [dict(patience=-1), dict(patience=True), dict(patience=2, eval_every=0)])
def test_a_patience_that_cannot_work_is_refused_by_name(change):
    with pytest.raises(ValueError, match="patience"):
        dataclasses.replace(TrainConfig(model=PRESETS["tiny"].model), **change)
