"""Training: resume after kill -9 ends where an uninterrupted run does; divergence keeps the last good state."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from vitlab.base.errors import ParameterError, Placeholder, Setting
from vitlab.base.records import RecordFileError, TornLineWarning
from vitlab.train.config import PRESETS, with_num_classes
from vitlab.train.history import read_history
from vitlab.train.loop import TrainingDiverged, lr_at, train

NEW = Placeholder("NEW")


def _forked_cli(*args: str, env: dict[str, str] | None = None) -> int:
    """The pid of a fork of this process that runs the command ``args`` (``vitlab.cli.main``) with ``env`` added to
    its environment and exits with its code: a command in a process of its own, without a fresh interpreter
    importing torch and timm."""
    from vitlab.cli import main

    pid = os.fork()
    if pid == 0:  # the command's process: never back into pytest
        code = 1
        try:
            os.environ.update(env or {})
            code = main(list(args))
        finally:
            os._exit(code)
    return pid


def _exit_codes(pids: list[int], timeout: float = 300) -> list[int]:
    """The exit codes of the forked commands ``pids``, waited for up to ``timeout`` seconds in all (then every one
    still running is killed and the test fails: one rank of a process group waits for ever on a failed other)."""
    deadline, codes = time.time() + timeout, {}
    while len(codes) < len(pids) and time.time() < deadline:
        for pid in set(pids) - set(codes):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    for pid in set(pids) - set(codes):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if len(codes) < len(pids):
        pytest.fail(f"{len(pids) - len(codes)} of {len(pids)} commands still ran after {timeout} s")
    return [codes[pid] for pid in pids]


def _epoch(run: Path) -> int:
    try:
        return json.loads((run / "checkpoint" / "config.json").read_text())["epoch"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def test_lr_schedule_shape():
    lrs = [lr_at(s, 100, 10, 1.0, 0.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # cosine decays monotonically
    assert lrs[55] == pytest.approx(0.5, abs=0.02)


def test_cosine_schedule_known_values_with_a_floor():
    """Warmup 10 of 110 steps, peak 1, floor 0.2: the peak at steps 9 and 10 and never above it, halfway down the
    cosine (step 60) the mean of peak and floor, the floor at the end."""
    lrs = [lr_at(s, 110, 10, 1.0, 0.2) for s in range(111)]
    assert lrs[9] == pytest.approx(1.0) and lrs[10] == pytest.approx(1.0) and max(lrs) == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.6)
    assert lrs[35] == pytest.approx(0.2 + 0.4 * (1 + math.cos(math.pi / 4)))
    assert lrs[110] == pytest.approx(0.2)


def test_resume_after_kill_9_matches_uninterrupted(tmp_path, tiny_data):
    """Also: batches made in worker processes (2 before the kill, 1 after) train exactly what the training process
    alone does. The killed run is a process of its own, a fork of this one; the uninterrupted run and the resumption
    run the same command in this one (``vitlab.cli.main``): no interpreter imports vitlab again."""
    from vitlab.cli import main

    common = ["train", "--preset", "tiny", "--data", str(tiny_data), "--epochs", "4", "--quiet",
              "--set", "mixup_prob=0.5", "--set", "crop_padding=4", "--set", "randaugment=rand-m9-n2-mstd0.5",
              "--set", "fig7_every=1", "--set", "snapshot_every=1", "--set", "val_per_class=4"]
    killed = _forked_cli(*common, "--run-dir", str(tmp_path / "killed"), "--workers", "2")  # batches made apart
    deadline, ended = time.time() + 240, None  # ended: the wait status of a run that ended by itself
    while _epoch(tmp_path / "killed") < 2 and time.time() < deadline and ended is None:
        pid, status = os.waitpid(killed, os.WNOHANG)
        ended = status if pid else None
        time.sleep(0.05)
    if ended is not None:
        assert os.waitstatus_to_exitcode(ended) == 0, "the run to be killed failed"
        pytest.skip("the run finished before it could be killed")
    os.kill(killed, signal.SIGKILL)
    os.waitpid(killed, 0)
    assert 2 <= _epoch(tmp_path / "killed") < 4  # killed in its third or fourth epoch: two or one left to resume
    assert main([*common, "--run-dir", str(tmp_path / "killed"), "--resume", "--workers", "1"]) == 0
    assert main([*common, "--run-dir", str(tmp_path / "full"), "--workers", "0"]) == 0

    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    opt_a = load_file(str(tmp_path / "full" / "checkpoint" / "optimizer.safetensors"))
    opt_b = load_file(str(tmp_path / "killed" / "checkpoint" / "optimizer.safetensors"))
    assert all(torch.equal(opt_a[k], opt_b[k]) for k in opt_a)
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["epoch"] == 4
    # the Fig. 7 statistics of every epoch, as an uninterrupted run records them (issue 46: emergence in training)
    fig7 = [[json.loads(line)["fig7"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("full", "killed")]
    assert len(fig7[0]) == 4 and fig7[0] == fig7[1]
    # and the records an export ships (issue 46): every snapshot's statistics with its epoch's validation accuracy
    from vitlab.train.emergence import snapshot_history

    shipped = [snapshot_history(tmp_path / run) for run in ("full", "killed")]
    assert [r["epoch"] for r in shipped[0]] == list(range(1, 5)) and shipped[0] == shipped[1]
    assert all(r["val_accuracy"] is not None for r in shipped[0]) and "test_accuracy" in shipped[0][-1]
    model = vitlab.load_model(tmp_path / "killed" / "checkpoint")  # a checkpoint is a loadable model
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 3)


def test_settle_history_restores_the_checkpoints_record_and_drops_torn_lines(tmp_path):
    from vitlab.train.run_folder import settle_history

    path = tmp_path / "metrics.jsonl"
    r1, r2, r3 = ({"epoch": e, "train_loss": 1.0 / e, "epoch_seconds": 10.0 * e} for e in (1, 2, 3))
    # killed between the checkpoint of epoch 3 and its record: the record comes back from the checkpoint
    path.write_text(json.dumps(r1) + "\n" + json.dumps(r2) + "\n")
    settle_history(path, {"epoch": 3, "metrics": r3})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [r1, r2, r3]
    # killed during the append: the torn line goes, the record comes back, and the next append starts a line
    path.write_text(json.dumps(r1) + "\n" + json.dumps(r2) + "\n" + json.dumps(r3)[:9])
    with pytest.warns(TornLineWarning):
        settle_history(path, {"epoch": 3, "metrics": r3})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [r1, r2, r3] and path.read_text().endswith("\n")
    # a corrupt line in the middle is no kill's tear: refused by its line, the file left as it is
    broken = json.dumps(r1) + "\n" + json.dumps(r2)[:9] + "\n" + json.dumps(r3) + "\n"
    path.write_text(broken)
    with pytest.raises(RecordFileError) as e:
        settle_history(path, {"epoch": 3, "metrics": r3})
    assert e.value.line == 2 and path.read_text() == broken
    path.write_text(json.dumps(r1) + "\n" + json.dumps(r2) + "\n" + json.dumps(r3) + "\n")
    # a complete history is left byte for byte as it is
    before = path.stat().st_mtime_ns, path.read_text()
    settle_history(path, {"epoch": 3, "metrics": r3})
    assert (path.stat().st_mtime_ns, path.read_text()) == before
    # no file at all (deleted by hand): the checkpoint's own record starts it
    path.unlink()
    settle_history(path, {"epoch": 3, "metrics": r3})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [r3]


def test_settle_history_keeps_one_record_per_epoch_as_the_export_reads_it(tmp_path):
    """A line repeated in metrics.jsonl (an older resume) stayed through a resume, so read_history counted that
    epoch twice (its hours too); settled, the file holds what run_history reads from it: one record per epoch."""
    from vitlab.train.history import run_history
    from vitlab.train.run_folder import settle_history

    path = tmp_path / "metrics.jsonl"
    r1, r2 = ({"epoch": e, "train_loss": 1.0 / e, "epoch_seconds": 10.0 * e} for e in (1, 2))
    path.write_text(json.dumps(r1) + "\n" + json.dumps(r1) + "\n")
    meta = {"epoch": 2, "metrics": r2}
    settle_history(path, meta)
    assert read_history(tmp_path) == [r1, r2] == run_history(tmp_path, meta)


def test_history_as_of_keeps_each_epochs_latest_line_up_to_the_checkpoints():
    """One record per epoch, the latest line of each (a resume re-ran it), the checkpoint's own epoch included when
    its config carries no record, later epochs and lines without an epoch left out."""
    from vitlab.train.history import history_as_of

    old, new = {"epoch": 2, "train_loss": 0.9}, {"epoch": 2, "train_loss": 0.5}
    records = [{"epoch": 1}, old, {"epoch": 3}, new, {"note": "no epoch"}, {"epoch": 4}]
    assert history_as_of(records, {"epoch": 3}) == [{"epoch": 1}, new, {"epoch": 3}]
    own = {"epoch": 3, "train_loss": 0.1}
    assert history_as_of(records, {"epoch": 3, "metrics": own}) == [{"epoch": 1}, new, own]


def test_run_hours_adds_training_and_evaluation_seconds():
    from vitlab.train.history import run_hours

    history = [{"epoch": 1, "epoch_seconds": 1800.0}, {"epoch": 2, "epoch_seconds": 900.0, "eval_seconds": 36.0}]
    assert run_hours(history) == pytest.approx(0.76)  # (1800 + 900 + 36) s
    assert run_hours([]) == 0


def test_read_history_leaves_out_a_torn_last_line_and_names_a_broken_one(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n\n{"epoch": 2}\n{"epo')
    with pytest.warns(UserWarning, match=r"the last line is not a whole record.*"
                                         r"with resume=True \(vitlab train --resume\)"):
        assert read_history(tmp_path) == [{"epoch": 1}, {"epoch": 2}]
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n{"epo{"epoch": 2}\n{"epoch": 3}\n')
    with pytest.raises(RecordFileError) as e:
        read_history(tmp_path)
    assert (e.value.path, e.value.line) == (str(tmp_path / "metrics.jsonl"), 2)


def test_a_resume_after_a_lost_record_logs_every_epoch_once(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 2})
    train(cfg, tmp_path / "run", progress=False)
    log = tmp_path / "run" / "metrics.jsonl"
    first = log.read_text().splitlines()
    log.write_text(first[0] + "\n" + first[1][:12])  # epoch 2's record torn, as by a kill during its append
    longer = cfg.__class__(**{**cfg.__dict__, "epochs": 3})
    with pytest.raises(ValueError, match="different config"):  # the guard stays: only the same config resumes
        train(longer, tmp_path / "run", resume=True, progress=False)
    train(cfg, tmp_path / "run", resume=True, progress=False)  # nothing left to train: the log is settled
    assert [json.loads(x) for x in log.read_text().splitlines()] == [json.loads(x) for x in first]
    assert read_history(tmp_path / "run") == [json.loads(x) for x in first]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_data, monkeypatch):
    import vitlab.train.loop as T

    real = T.lr_at
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 3})
    steps = 144 // cfg.batch_size
    monkeypatch.setattr(T, "lr_at", lambda s, *a: float("nan") if s >= steps else real(s, *a))
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(TrainingDiverged, match="last good checkpoint"):
        train(cfg, tmp_path / "run", progress=False)
    assert _epoch(tmp_path / "run") == 1
    model = vitlab.load_model(tmp_path / "run" / "checkpoint")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not list((tmp_path / "run").glob(".checkpoint*"))
    # the refusal points at the kept checkpoint and a way on that works (--resume refuses a changed lr): a new run
    # folder, warm-started from it, with a lower lr or a longer warmup
    with pytest.raises(TrainingDiverged) as err:
        train(cfg, tmp_path / "run2", progress=False)
    ck = str(tmp_path / "run2" / "checkpoint")
    assert (err.value.param, err.value.value) == ("lr", cfg.lr)
    assert err.value.fix[0] == (Setting("init_from", ck, config=True), Setting("lr", Placeholder("LOWER"), config=True),
                                Setting("run_dir", NEW))
    assert "--" not in str(err.value)  # a Python caller is not told flags
    # diverging in the first epoch: no checkpoint, and the message does not name one
    monkeypatch.setattr(T, "lr_at", lambda s, *a: float("nan"))
    with pytest.raises(TrainingDiverged, match="No checkpoint was written") as err:
        train(cfg, tmp_path / "run3", progress=False)
    assert "last good" not in str(err.value) and not (tmp_path / "run3" / "checkpoint").exists()
    assert all("init_from" not in str(f) for f in err.value.fix)


def test_the_preset_randaugment_specs_taken_without_timm_are_ones_timm_parses():
    """TrainConfig takes the presets' RandAugment spec without loading timm (the presets load no torch); timm
    parses each such spec, and a spec outside them is still refused by timm (test below)."""
    from timm.data.auto_augment import rand_augment_transform

    from vitlab.train import config as train_config

    assert {c.randaugment for c in PRESETS.values()} - {None} <= train_config._TIMM_PARSES
    for spec in train_config._TIMM_PARSES:
        assert rand_augment_transform(spec, {"translate_const": 10, "img_mean": (128, 128, 128)}).num_layers == 2


def test_bad_settings_are_refused_by_name_before_the_run_folder_is_written(tmp_path, tiny_data, monkeypatch, capsys):
    """Each of these used to start a run: some failed at the first step with a bare torch or timm error after the
    run folder was written, others trained something else than asked (the text 'False' is true)."""
    import dataclasses

    from vitlab.cli import main
    from vitlab.cli.train import preset_config
    from vitlab.models.config import ViTConfig

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    tiny = dataclasses.replace(PRESETS["tiny"], data=str(tiny_data), epochs=1)
    # Python's spellings of the constants on the command line are the constants
    cfg = preset_config("tiny", ["bf16=False", "keep_best=True", "model.distilled=False", "ema_decay=None"])
    assert cfg.bf16 is False and cfg.keep_best is True and cfg.model.distilled is False and cfg.ema_decay is None
    for field, value in (("bf16", "no"), ("explicit_attention", "off"), ("keep_best", 1)):
        with pytest.raises(ValueError, match=f"{field} must be true or false, got {value!r}"):
            dataclasses.replace(tiny, **{field: value})
    with pytest.raises(ValueError, match="distilled must be true or false"):
        ViTConfig(distilled="False")
    with pytest.raises(ParameterError, match=r"exceeds the peak lr 0.0001") as e:
        dataclasses.replace(tiny, lr=1e-4, min_lr=1e-3)
    assert (e.value.param, e.value.value, e.value.fix) == ("min_lr", 1e-3, (Setting("min_lr", 1e-6, config=True),))
    with pytest.raises(ParameterError, match="never evaluates") as e:
        dataclasses.replace(tiny, keep_best=True, eval_every=0)
    assert e.value.param == "keep_best" and Setting("eval_every", 1, config=True) in e.value.fix
    with pytest.raises(ParameterError, match="not a spec timm understands") as e:
        dataclasses.replace(tiny, randaugment="rand-x9")
    assert (e.value.param, e.value.value) == ("randaugment", "rand-x9")
    with pytest.raises(ParameterError, match="starting with 'rand'"):
        dataclasses.replace(tiny, randaugment=True)
    # refused by train() after reading the data, before anything is written
    for bad, needle in ((dataclasses.replace(tiny, batch_size=512, mixup_prob=0.0),
                         r"batch_size=512: exceeds the 144 training examples; fix: dataclasses.replace\(cfg, batch_size=64\)"),
                        (dataclasses.replace(tiny, crop_padding=32, crop_pad_mode="reflect"),
                         r"crop_padding=32: reflect padding .* 32 px .* dataclasses.replace\(cfg, crop_padding=4\)"),
                        (dataclasses.replace(tiny, teacher="no/such/teacher", model=dataclasses.replace(
                            tiny.model, distilled=True)), "no/such/teacher")):
        with pytest.raises((ValueError, FileNotFoundError), match=needle):
            train(bad, tmp_path / "run", progress=False)
        assert not (tmp_path / "run").exists()
    # the command line names the problem without a traceback and writes nothing
    assert main(["train", "--preset", "tiny", "--data", str(tiny_data), "--run-dir", str(tmp_path / "cli"),
                 "--set", "randaugment=m9"]) != 0
    err = capsys.readouterr().err
    assert "--set randaugment=m9: must be a timm RandAugment spec" in err and "Traceback" not in err
    assert not (tmp_path / "cli").exists()


def test_refuses_to_overwrite_or_resume_wrong_run(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 1})
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="already holds a checkpoint") as e:
        train(cfg, tmp_path / "run", progress=False)
    assert e.value.param == "run_dir" and e.value.fix[0] == Setting("resume", True)  # train's argument, not the flag
    other = cfg.__class__(**{**cfg.__dict__, "lr": 0.5})
    with pytest.raises(ValueError, match=r"different config \(lr: saved 0.001, requested 0.5\)"):  # names the field
        train(other, tmp_path / "run", resume=True, progress=False)
    with pytest.raises(FileNotFoundError, match="^resume=True: .* no checkpoint") as e:
        train(cfg, tmp_path / "fresh", resume=True, progress=False)
    assert e.value.fix == (Setting("resume", False),)


def test_a_second_training_into_a_busy_run_folder_is_refused(tmp_path, tiny_data, monkeypatch):
    """Two trainings into one folder (two `vitlab train --preset tiny` without --run-dir share
    $VITLAB_CACHE/runs/tiny) both ran: metrics.jsonl held both runs' epoch lines, train_config.json one run's
    settings and the checkpoint the other's. While one trains (holds RUN/.lock) the second is now refused before it
    writes anything; once the lock is free, training there proceeds."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 1})
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(  # another process's training: it holds the folder's lock until told to stop
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.lockf(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); sys.stdin.read()", str(run / ".lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match=r"in use: another process is training into it") as e:
            train(cfg, run, progress=False)
        assert (e.value.param, e.value.value, e.value.fix[-1]) == ("run_dir", str(run), Setting("run_dir", NEW))
        assert [p.name for p in run.iterdir()] == [".lock"]
    finally:
        holder.communicate("", timeout=60)  # ends it, and its lock with it
    train(cfg, run, progress=False)
    assert _epoch(run) == 1 and len(read_history(run)) == 1


def test_a_killed_trainings_forked_workers_do_not_keep_the_run_folder_locked(tmp_path):
    """kill -9 of a training leaves its forked batch workers running for a while; with an flock lock they kept the
    folder locked and the --resume right after was refused ('in use'). The record lock belongs to the killed
    process alone, so the folder is free at once while its forked child still lives."""
    from vitlab.train.run_folder import run_lock

    script = ("import os, signal, sys, time\nfrom pathlib import Path\nfrom vitlab.train.run_folder import run_lock\n"
              "with run_lock(Path(sys.argv[1])):\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        time.sleep(60)\n"
              "        os._exit(0)\n"
              "    print(pid, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    child = int(killed.stdout.readline())
    assert killed.wait(timeout=60) == -signal.SIGKILL
    try:
        os.kill(child, 0)  # the forked worker is still alive...
        with run_lock(tmp_path / "run"):  # ...and the folder can be trained into again
            pass
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_run_folder_on_a_file_system_without_locks_still_trains(tmp_path, tiny_data, monkeypatch):
    """Some network mounts refuse flock (ENOLCK): the run folder's lock must not stop every training there."""
    import errno
    import fcntl

    def no_locks(f, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fcntl, "lockf", no_locks)
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 1})
    train(cfg, tmp_path / "run", progress=False)
    assert _epoch(tmp_path / "run") == 1
    monkeypatch.setitem(sys.modules, "fcntl", None)  # no fcntl at all (Windows): training goes on unguarded
    train(cfg, tmp_path / "run2", progress=False)
    assert _epoch(tmp_path / "run2") == 1


def test_two_process_ddp_matches_single_process(tmp_path, tiny_data):
    """2 CPU processes (gloo) follow the single-process run with the same global batch. The command runs in this
    process (``vitlab.cli.main``), and in two forks of it given the environment torchrun gives its processes (the
    command under torchrun itself: test_a_batchnorm_model_under_torchrun_is_told_its_statistics_are_per_process)."""
    from conftest import free_port

    from vitlab.cli import main

    common = ["train", "--preset", "tiny", "--data", str(tiny_data), "--epochs", "2", "--quiet", "--device", "cpu"]
    assert main([*common, "--run-dir", str(tmp_path / "single")]) == 0
    torchrun = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [_forked_cli(*common, "--run-dir", str(tmp_path / "ddp"), env={**torchrun, "RANK": r, "LOCAL_RANK": r})
             for r in ("0", "1")]
    assert _exit_codes(ranks) == [0, 0]
    meta = json.loads((tmp_path / "ddp" / "checkpoint" / "config.json").read_text())
    assert meta["environment"]["world_size"] == 2
    a = load_file(str(tmp_path / "single" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "ddp" / "checkpoint" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    torch.manual_seed(0)
    start = vitlab.build_model(with_num_classes(PRESETS["tiny"], 3).model).state_dict()
    assert max((a[k] - start[k]).abs().max() for k in a) > 1e-3  # the run really moved the weights


def test_a_batchnorm_model_under_torchrun_is_told_its_statistics_are_per_process(tmp_path, tiny_data):
    """DDP averages the gradients but each process normalises its own slice of the batch (a tiny CNN's weights after
    2 epochs in two processes were up to 1.5 from one process's, checked by hand): the main process, alone, says so. So does the command's own line, once."""
    env = {**os.environ, "VITLAB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["train", "--preset", "resnet_cifar10", "--data", str(tiny_data), "--epochs", "1", "--device", "cpu",
            "--set", "model.widths=[8,16,16]", "--set", "batch_size=32", "--set", "eval_tta=0",
            "--set", "warmup_epochs=0.5", "--run-dir", str(tmp_path / "ddp")]
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(port), "-m", "vitlab.cli", *args], env=env, capture_output=True,
                         text=True, timeout=300)
    out = ddp.stdout + ddp.stderr
    assert ddp.returncode == 0, out
    note = "BatchNorm normalises each of the 2 processes' 16 images, not the global batch of 32"
    assert out.count(note) == 1, out
    assert out.count(f"run folder: {tmp_path / 'ddp'}") == 1, out  # the command's own lines: the main process too


def test_export_ships_half_precision_with_a_card_that_reproduces(tmp_path, tiny_data, monkeypatch):
    from vitlab.cli import main
    from vitlab.data.datasets import load_dataset
    from vitlab.train.export import timm_pipeline_accuracy

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 2})
    train(cfg, tmp_path / "run", progress=False)
    out = tmp_path / "shipped"
    assert main(["export", "--run-dir", str(tmp_path / "run"), "--out", str(out),
                 "--command-line", "vitlab train --preset tiny"]) == 0
    card = json.loads((out / "card.json").read_text())
    model = vitlab.load_model(out)
    assert all(v.dtype == torch.float16 for v in load_file(str(out / "model.safetensors")).values())
    test = load_dataset(str(tiny_data), "test")
    assert timm_pipeline_accuracy(model, test) == card["test_accuracy"]
    text = (out / "MODEL_CARD.md").read_text()
    assert "vitlab train --preset tiny" in text and f"{card['test_accuracy']:.2%}" in text
    cfg_t = __import__("timm").data.resolve_data_config({}, model=model)
    assert cfg_t["input_size"] == (3, 32, 32) and cfg_t["mean"] == pytest.approx((0.4914, 0.4822, 0.4465))


def test_max_train_examples_draws_every_class_not_the_first_images():
    """An ImageFolder is stored class by class: the first 12 images would be one class. The run trains on a
    class-balanced draw fixed by its seed, the same on every call."""
    from vitlab.data.datasets import ImageArray
    from vitlab.train.loop import training_subset

    labels = torch.arange(3).repeat_interleave(10)  # (30,) stored class by class, as a zip of class folders is
    data = ImageArray(torch.zeros(30, 4, 4, 3, dtype=torch.uint8), labels, ("a", "b", "c"), "sorted")
    sub = training_subset(data, 12, seed=0)
    assert torch.bincount(sub.labels).tolist() == [4, 4, 4]
    assert torch.equal(training_subset(data, 12, seed=0).labels, sub.labels)
    assert training_subset(data, None, 0) is data and training_subset(data, 30, 0) is data
    assert len(training_subset(data, 29, seed=0)) == 29  # one short of all: still a draw, not every image


def test_resume_after_a_kill_between_the_checkpoint_renames(tmp_path):
    """replace_dir moves the old checkpoint aside, then the new one in: a kill between the two leaves only
    `.checkpoint.old.*`. --resume restores it (the previous epoch) instead of saying there is nothing to resume."""
    import dataclasses

    cfg = dataclasses.replace(PRESETS["tiny"], data="shapes", epochs=1, max_train_examples=64, eval_every=0)
    run = tmp_path / "run"
    train(cfg, run, progress=False)
    run_id = (run / "run_id").read_text()  # written at the start: the card of an export names the run by it
    assert len(run_id.strip()) == 32
    (run / "checkpoint").rename(run / ".checkpoint.old.x1y2")  # the state a kill between the renames leaves
    train(cfg, run, resume=True, progress=False)  # finished: nothing to train, and no error
    assert (run / "checkpoint" / "config.json").is_file() and not list(run.glob(".checkpoint.old.*"))
    assert (run / "run_id").read_text() == run_id  # a resume is the same run
    # two copies aside, the newer one cut short by a clean-up (no weights): the complete one comes back
    from vitlab.models.checkpoint import recover_checkpoint

    (run / "checkpoint").rename(run / ".checkpoint.old.good")
    (run / ".checkpoint.old.cut").mkdir()
    (run / ".checkpoint.old.cut" / "config.json").write_text('{"epoch": 9}')
    assert recover_checkpoint(run / "checkpoint") and (run / "checkpoint" / "model.safetensors").is_file()


def test_a_new_run_refuses_a_folder_that_holds_more_than_a_killed_first_epoch_left(tmp_path, tiny_data, monkeypatch):
    """A new run (no --resume) used to go into any folder: into an earlier run's, whose checkpoint was removed, it
    appended its records to the earlier metrics.jsonl and kept the earlier best/ wherever that scored higher; into a
    folder that is not a run's (a shipped checkpoint given as --run-dir), it wrote its files among the user's. Each
    is refused now before anything is written; what a run killed before its first checkpoint leaves is not."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    cfg = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "data": str(tiny_data), "epochs": 1})

    def snapshot(folder: Path) -> dict:
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    earlier = tmp_path / "earlier"  # an earlier run's records, its checkpoint removed
    (earlier / "best").mkdir(parents=True)
    (earlier / "best" / "config.json").write_text('{"metrics": {"test_accuracy": 0.99}}')
    (earlier / "metrics.jsonl").write_text('{"epoch": 1, "test_accuracy": 0.99}\n')
    (earlier / "train_config.json").write_text("{}")
    before = snapshot(earlier)
    with pytest.raises(FileExistsError, match=r"earlier run's records \(best, metrics.jsonl\)") as e:
        train(cfg, earlier, progress=False)
    assert (e.value.param, e.value.fix) == ("run_dir", ("move them away", Setting("run_dir", NEW)))
    assert snapshot(earlier) == before and sorted(p.name for p in earlier.iterdir()) == ["best", "metrics.jsonl",
                                                                                         "train_config.json"]
    shipped = tmp_path / "shipped"  # not a run folder at all
    shipped.mkdir()
    (shipped / "model.safetensors").write_bytes(b"weights")
    (shipped / "config.json").write_text("{}")
    before = snapshot(shipped)
    with pytest.raises(FileExistsError, match=r"not a vitlab run folder \(it holds config.json, model.safetensors\)"
                                              r".*run_dir=NEW_OR_EMPTY_FOLDER"):
        train(cfg, shipped, progress=False)
    assert snapshot(shipped) == before and sorted(p.name for p in shipped.iterdir()) == ["config.json",
                                                                                         "model.safetensors"]
    aside = tmp_path / "aside"  # a kill between a checkpoint replacement's two renames
    (aside / ".checkpoint.old.x1").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=r"set aside as .checkpoint.old.x1.*resuming puts it back") as e:
        train(cfg, aside, progress=False)
    assert e.value.fix == (Setting("resume", True), Setting("run_dir", NEW))
    # a run killed in its first epoch leaves its settings, its id and a half-written checkpoint: a new run goes on
    killed = tmp_path / "killed"
    (killed / ".checkpoint.tmp.x2").mkdir(parents=True)
    (killed / ".best.tmp.x3").mkdir()
    (killed / ".train_config.json.x4.tmp").write_text("{")
    (killed / "train_config.json").write_text("{}")
    (killed / "run_id").write_text("old\n")
    train(cfg, killed, progress=False)
    assert _epoch(killed) == 1 and (killed / "run_id").read_text() != "old\n"
    assert len(read_history(killed)) == 1


def test_validation_split_is_fixed_class_balanced_and_disjoint():
    from vitlab.data.datasets import ImageArray
    from vitlab.train.loop import validation_split

    labels = torch.arange(3).repeat_interleave(10)
    images = torch.arange(30, dtype=torch.uint8).view(30, 1, 1, 1).expand(30, 2, 2, 3).contiguous()
    data = ImageArray(images, labels, ("a", "b", "c"), "mem")
    rest, val = validation_split(data, 2)
    assert torch.bincount(val.labels).tolist() == [2, 2, 2] and torch.bincount(rest.labels).tolist() == [8, 8, 8]
    ids_val, ids_rest = set(val.images[:, 0, 0, 0].tolist()), set(rest.images[:, 0, 0, 0].tolist())
    assert not ids_val & ids_rest and len(ids_val | ids_rest) == 30  # a partition: nothing trained on is validated
    again, val2 = validation_split(data, 2)
    assert torch.equal(val.images, val2.images)  # fixed whatever the global seed
    with pytest.raises(ValueError, match="val_per_class"):
        validation_split(data, 10)


def test_a_validation_split_reads_the_test_images_once_and_snapshots_every_epoch(tmp_path, tiny_data):
    cfg = with_num_classes(PRESETS["tiny"], 3)
    import dataclasses

    cfg = dataclasses.replace(cfg, epochs=3, val_per_class=8, snapshot_every=1, data=str(tiny_data))
    model = train(cfg, tmp_path / "run", progress=False)
    hist = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [("val_accuracy" in r, "test_accuracy" in r) for r in hist] == [(True, False), (True, False), (True, True)]
    snaps = sorted(p.name for p in (tmp_path / "run" / "snapshots").iterdir())
    assert snaps == ["epoch_0001", "epoch_0002", "epoch_0003"]
    last = vitlab.load_model(tmp_path / "run" / "snapshots" / "epoch_0003")
    final = model.state_dict()
    assert all(torch.equal(v, final[k]) for k, v in last.state_dict().items())  # the snapshot is the model as trained
    assert last.vitlab_checkpoint["metrics"]["val_accuracy"] == hist[-1]["val_accuracy"]


def test_an_init_from_that_is_no_checkpoint_folder_is_told_as_init_from(tmp_path, two_class_folder, capsys):
    """`vitlab train --set init_from=FILE` was answered with '--model <timm name> --weights FILE' advice, options
    train does not take, after writing the run folder; init_from is now refused by its own name before anything is
    written, and a training run's folder is pointed to its checkpoint/."""
    from vitlab.cli import main

    (tmp_path / "weights.safetensors").write_bytes(b"not a checkpoint")
    (tmp_path / "run0" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run0" / "checkpoint" / "config.json").write_text("{}")
    for given, fix in (("weights.safetensors", "is a file"), ("run0", "give its checkpoint, init_from='")):
        capsys.readouterr()
        code = main(["train", "--preset", "tiny", "--data", str(two_class_folder), "--run", str(tmp_path / "new"),
                     "--quiet", "--set", f"init_from={tmp_path / given}"])
        err = capsys.readouterr().err
        assert code == 1 and f"init_from='{tmp_path / given}'" in err and fix in err and "--weights" not in err
        assert not (tmp_path / "new").exists()
