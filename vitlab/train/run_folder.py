"""A training run's folder: the lock held on it while a process trains into it (``run_lock``), what a new run may
find in it (``check_fresh``), its ``metrics.jsonl`` settled to the checkpoint's epochs on resume
(``settle_history``), and what ``vitlab train --continue`` makes of it (``continue_run``).

A run folder holds ``train_config.json``, ``run_id``, ``checkpoint/`` (the resume point, replaced at the end of every
epoch), ``metrics.jsonl`` (one record per epoch), optionally ``best/``, and ``.lock`` while it trains
(``vitlab.train.loop.train`` writes them; ``vitlab.train.history`` reads the records back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vitlab.base.atomic import atomic_write_text
from vitlab.base.errors import FolderError, Placeholder, Refusal, Setting
from vitlab.base.records import read_records
from vitlab.models.checkpoint import RUN_ID, recover_checkpoint
from vitlab.train.history import history_as_of

if TYPE_CHECKING:
    from vitlab.train.config import TrainConfig

__all__ = ["RUN_LOCK", "RunInUse", "run_lock", "check_fresh", "settle_history", "continue_run"]


class RunInUse(Refusal, RuntimeError):
    """A run folder (``param`` ``run_dir``) another process is training into now (``Refusal``'s fields)."""


RUN_LOCK = ".lock"


@contextlib.contextmanager
def run_lock(run: Path):
    """Hold ``RUN/.lock`` (an exclusive POSIX record lock, ``fcntl.lockf``) while training into ``run``: a second
    process training into the same folder (two ``vitlab train --preset P`` without ``--run-dir`` share
    ``$VITLAB_CACHE/runs/P``) would interleave its checkpoints and ``metrics.jsonl`` lines with the first's, so it is
    refused. The operating system drops the lock when its process ends, a kill included; a record lock belongs to
    the process alone, so batch workers it forked do not keep it after a ``kill -9`` (an ``flock`` lock would stay
    with them and refuse the ``--resume``). Under ``torchrun`` the main process (RANK 0) holds it. A folder made only
    for the lock is removed again when training never wrote into it."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system (Windows): train unguarded
        fcntl = None
    if os.environ.get("RANK", "0") != "0" or fcntl is None:
        yield
        return
    made = not run.exists()
    run.mkdir(parents=True, exist_ok=True)
    f = open(run / RUN_LOCK, "a")
    try:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):  # a file system without locks (some network mounts,
                pass  # ENOLCK): train unguarded
            else:
                raise RunInUse("run_dir", str(run), problem="in use: another process is training into it now",
                               fix=["wait for it to finish", Setting("run_dir", Placeholder("NEW"))]) from None
        yield
    finally:
        f.close()  # releases the lock
        with contextlib.suppress(OSError):
            if made and [p.name for p in run.iterdir()] == [RUN_LOCK]:
                (run / RUN_LOCK).unlink()
                run.rmdir()


# what a run killed before its first checkpoint leaves: its settings and its id (or their half-written temporary
# files), the lock, a half-written checkpoint or best checkpoint
_FRESH_NAMES = ("train_config.json", RUN_ID)


def _left_by_a_first_epoch(name: str) -> bool:
    return (name in (*_FRESH_NAMES, RUN_LOCK) or name.startswith((".checkpoint.tmp.", ".best.tmp."))
            or any(name.startswith(f".{n}.") and name.endswith(".tmp") for n in _FRESH_NAMES))


def check_fresh(run: Path) -> None:
    """Refuse to start a new run (not a resume) in ``run`` unless the folder is new, empty, or holds only what a run
    killed before its first checkpoint leaves (``train_config.json``, ``run_id``, the lock, the temporary files and
    folders of their atomic writes): a new run into an earlier run's folder would append its records to the earlier
    ``metrics.jsonl`` and keep the earlier ``best/`` wherever it scored higher, and one into a folder that is not a
    run's (a project folder, a shipped checkpoint given as ``--run-dir`` by mistake) would write its files among the
    user's. Raises ``FileExistsError`` naming what is there and the way on, before anything is written."""
    if not run.is_dir():
        return
    if (run / "checkpoint").exists():
        raise FolderError("run_dir", str(run), problem="already holds a checkpoint",
                          fix=[Setting("resume", True), Setting("run_dir", Placeholder("NEW"))])
    names = sorted(p.name for p in run.iterdir())
    aside = [n for n in names if n.startswith(".checkpoint.old.")]
    if aside:
        raise FolderError("run_dir", str(run), problem=f"holds its last checkpoint set aside as {aside[0]} (a kill "
                          "interrupted its replacement); resuming puts it back and continues",
                          fix=[Setting("resume", True), Setting("run_dir", Placeholder("NEW"))])
    other = [n for n in names if not _left_by_a_first_epoch(n)]
    earlier = [n for n in other if n in ("metrics.jsonl", "best")]
    if earlier:
        raise FolderError("run_dir", str(run), problem=f"holds an earlier run's records ({', '.join(earlier)}) but "
                          "no checkpoint to resume: a new run would add to them",
                          fix=["move them away", Setting("run_dir", Placeholder("NEW"))])
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise FolderError("run_dir", str(run), problem=f"not a vitlab run folder (it holds {shown}): a new run writes "
                          "its checkpoint, records and settings there",
                          fix=[Setting("run_dir", Placeholder("NEW_OR_EMPTY_FOLDER"))])


def settle_history(path: Path, meta: dict) -> None:
    """On resume, make ``metrics.jsonl`` hold one record per epoch up to the checkpoint's, before any is appended
    (``vitlab.train.history.history_as_of``, as the export reads the run). An epoch's checkpoint is written before its
    record, and the checkpoint keeps the record (``meta["metrics"]``): a run killed between the two, or during the
    append (a torn last line, dropped with a ``TornLineWarning`` instead of being joined to the next record), gets
    that record back from the checkpoint. Any other line that is no record is a ``vitlab.base.records.RecordFileError``
    naming it, before anything is written."""
    old = path.read_text() if path.is_file() else ""
    records = read_records(path, torn_fix="Its record comes back from the checkpoint") if old else []
    text = "".join(json.dumps(r) + "\n" for r in history_as_of(records, meta))
    if text != old:
        atomic_write_text(path, text)


def continue_run(run: Path, shipped: Path, cfg: TrainConfig, say: Callable[[str], None]) -> tuple[TrainConfig, bool]:
    """What ``vitlab train --preset P --continue`` trains: ``(cfg, resume)`` for run folder ``run`` of the preset
    whose shipped checkpoint is ``shipped``. An unfinished run is resumed; a finished one that ``shipped`` was
    exported from is kept aside as ``RUN.legK`` and a new leg warm-starts from ``shipped`` with a fresh schedule;
    with no run state (a new machine) the run warm-starts from ``--set init_from``, else from ``shipped``, else
    starts fresh. ``say`` is told each decision. The repair and the move happen under the run's lock, so a run
    another process is training into now is neither repaired nor moved aside."""
    state = run / "checkpoint" / "config.json"
    with run_lock(run) if run.is_dir() else contextlib.nullcontext():
        recover_checkpoint(run / "checkpoint")  # a kill between the two renames of its last replacement
        if state.is_file() and _finished_and_shipped(run, shipped):
            # a finished leg whose weights were exported: keep its state and train a new leg from what shipped
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise FileExistsError(f"--continue under torchrun: {run} holds a finished leg; move it aside "
                                      f"first (mv {run} {_free_name(run)}) so that no two processes move it at "
                                      "once")
            kept = _free_name(run)
            run.rename(kept)
            say(f"{run} finished its schedule and was exported to {shipped}: kept as {kept}")
    if state.is_file():
        return cfg, True
    if cfg.init_from is not None:
        say(f"no run state in {run}: warm-starting from {cfg.init_from} (--set init_from)")
    elif (shipped / "model.safetensors").is_file():
        # the run's state is gone (a new machine): start from the shipped weights with a fresh schedule
        cfg = dataclasses.replace(cfg, init_from=str(shipped))
        say(f"no run state in {run}: warm-starting from the shipped {shipped} with a fresh schedule")
    else:
        say(f"no run state in {run} and no shipped weights {shipped / 'model.safetensors'}: starting a fresh run")
    return cfg, False


def _finished_and_shipped(run: Path, shipped: Path) -> bool:
    """Whether ``run`` has done every epoch of its schedule and ``shipped`` was exported from that state (the
    shipped checkpoint's record of its last epoch, training seconds and epoch count are the run's). An unfinished run
    is resumed; a finished one that ``shipped`` does not hold raises, since warm-starting a new leg from the shipped
    weights would silently drop what the run learned (or the shipped folder has moved on past it)."""
    meta = json.loads((run / "checkpoint" / "config.json").read_text())
    planned = meta["train"]["epochs"]  # the run's own config (a resume must match it)
    if meta["epoch"] < planned:
        return False
    f = shipped / "config.json"
    held = json.loads(f.read_text()) if f.is_file() else {}
    if all(held.get(k) == meta.get(k) for k in ("epoch", "train_seconds", "metrics")):
        return True
    raise FileExistsError(
        f"--continue: {run} finished its {planned} epochs, but {shipped} does not hold its weights. If the run was "
        f"never exported, export it first (vitlab export --run-dir {run} --out {shipped} --command-line '...'), then "
        f"--continue trains a new leg from it; if {shipped} holds a later leg trained elsewhere, move {run} aside "
        "(its state is older); or pass --run-dir NEW to start elsewhere.")


def _free_name(run: Path) -> Path:
    """``RUN.leg1``, ``RUN.leg2``, ...: the first name not taken."""
    k = 1
    while run.with_name(f"{run.name}.leg{k}").exists():
        k += 1
    return run.with_name(f"{run.name}.leg{k}")
