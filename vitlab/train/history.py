"""A training run's epoch records: the lines of its ``metrics.jsonl``, the records as of a checkpoint, and the wall
clock they add up to.

``vitlab train`` appends one record per epoch to ``RUN/metrics.jsonl`` after writing the epoch's checkpoint; a resume
settles the file to the checkpoint's epochs (``vitlab.train.run_folder.settle_history``), and an export and the benchmarks
read it back through ``run_history`` and ``read_history``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from vitlab.base.records import read_records

__all__ = ["read_history", "run_history", "history_as_of", "run_hours", "training_curve"]


def read_history(run: Path) -> list[dict]:
    """The epoch records of a ``vitlab train`` run folder (``metrics.jsonl``, in order), under
    ``vitlab.base.records.read_records``'s torn-line policy: a last line torn by a kill during its append is left out with
    a ``TornLineWarning`` (resuming the run restores it from the checkpoint); any other line that is no record is a
    ``RecordFileError`` naming it."""
    return read_records(run / "metrics.jsonl", torn_fix="Resuming the run with resume=True (vitlab train --resume) "
                                                       "restores it", what="a run's metrics.jsonl")


def run_history(run: Path, meta: dict) -> list[dict]:
    """The epoch records of the checkpoint whose ``config.json`` is ``meta``, one per epoch up to its epoch, in
    epoch order (``history_as_of``) from the lines of ``metrics.jsonl`` (``read_history``): a run killed between an
    epoch's checkpoint and its line (or during the append) keeps its last epoch, as
    ``vitlab.train.run_folder.settle_history`` restores it on resume, here without writing to the run folder."""
    return history_as_of(read_history(run) if (run / "metrics.jsonl").is_file() else [], meta)


def history_as_of(records: Sequence[object], meta: dict) -> list[dict]:
    """One epoch record per epoch up to the epoch of the checkpoint whose ``config.json`` is ``meta``, in epoch
    order: the latest of ``records`` for each epoch (anything but an epoch record, and epochs past the
    checkpoint's, left out), and the checkpoint's own record of its epoch (``meta["metrics"]``), which an epoch's
    checkpoint is written with before its line is appended."""
    epoch = int(meta["epoch"])
    by_epoch: dict[int, dict] = {}
    for h in records:
        if isinstance(h, dict) and isinstance(h.get("epoch"), int) and 1 <= h["epoch"] <= epoch:
            by_epoch[h["epoch"]] = h  # the latest line of an epoch wins
    own = meta.get("metrics")
    if isinstance(own, dict) and own.get("epoch") == epoch:
        by_epoch[epoch] = own
    return [by_epoch[e] for e in sorted(by_epoch)]


def run_hours(history: Sequence[dict]) -> float:
    """A run's wall clock in hours from its epoch records: training and evaluation seconds summed."""
    return sum(h.get("epoch_seconds", 0.0) + h.get("eval_seconds", 0.0) for h in history) / 3600


def training_curve(history: Sequence[dict], value_of: Callable[[dict], float | None] = lambda h: h.get("test_accuracy"),
                   t0: float = 0.0) -> tuple[list[float], list[float]]:
    """``(hours, values)`` of a run's epoch records (``metrics.jsonl``, in order): the cumulative wall clock from
    ``t0`` hours, training and evaluation included, at each record where ``value_of`` gives a value."""
    hours, values, t = [], [], t0
    for h in history:
        t += (h.get("epoch_seconds", 0.0) + h.get("eval_seconds", 0.0)) / 3600
        value = value_of(h)
        if value is not None:
            hours.append(t)
            values.append(value)
    return hours, values
