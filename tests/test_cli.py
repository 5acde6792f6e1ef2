"""The `vitlab` command and the report it writes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import tiny_vit

import vitlab
from vitlab.cli import build_parser, main


def _subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("cmd", _subcommands())
def test_every_subcommand_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage: vitlab " + cmd in capsys.readouterr().out


def test_preset_help_names_every_preset(capsys):
    from vitlab.train.config import PRESETS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in PRESETS)


def test_train_set_reaches_the_model_config(tmp_path, monkeypatch, capsys):
    import vitlab.train.config
    import vitlab.train.loop

    seen = {}
    monkeypatch.setattr(vitlab.train.loop, "train", lambda cfg, run, **kw: seen.update(cfg=cfg, run=run))
    base = ["train", "--run-dir", str(tmp_path / "run"), "--quiet"]
    assert main([*base, "--preset", "resnet_cifar10", "--set", "model.residual=false", "--set", "lr=0.5",
                 "--set", "model.widths=[16, 32, 32]"]) == 0
    want = vitlab.train.config.PRESETS["resnet_cifar10"]
    assert seen["cfg"].model == dataclasses.replace(want.model, residual=False, widths=(16, 32, 32))
    assert seen["cfg"].lr == 0.5 and seen["cfg"].epochs == want.epochs
    assert main([*base, "--preset", "hybrid_cifar10", "--set", "model.vit.depth=2"]) == 0
    hybrid = vitlab.train.config.PRESETS["hybrid_cifar10"].model
    assert seen["cfg"].model == dataclasses.replace(hybrid, vit=dataclasses.replace(hybrid.vit, depth=2))
    # fields that must agree change together (90 is no multiple of the preset's 4 heads)
    assert main([*base, "--preset", "vit_cifar10", "--set", "model.embed_dim=90", "--set", "model.num_heads=3"]) == 0
    assert (seen["cfg"].model.embed_dim, seen["cfg"].model.num_heads) == (90, 3)
    capsys.readouterr()
    # bad paths and bad values are clear errors that name the fields, and nothing is trained
    seen.clear()
    assert main([*base, "--preset", "vit_cifar10", "--set", "model.depht=3"]) == 2
    err = capsys.readouterr().err
    assert "ViTConfig has no field 'depht'" in err and "depth" in err
    assert main([*base, "--preset", "hybrid_cifar10", "--set", "model.vit=3"]) == 2
    assert "group of settings (ViTConfig)" in capsys.readouterr().err
    assert main([*base, "--preset", "resnet_cifar10", "--set", "model.residual=maybe"]) == 2
    assert "residual must be true or false" in capsys.readouterr().err
    assert not seen


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "vitlab.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "reproduce" in out.stdout


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"vitlab {vitlab.__version__}"


def test_info_is_readable_by_default_and_json_on_request(capsys):
    assert main(["info", "--model", "deit_tiny_distilled_patch16_224", "--no-pretrained"]) == 0
    text = capsys.readouterr().out
    assert "random initialisation" in text and "5,910,800" in text and "class, dist" in text and "{" not in text
    assert main(["info", "--model", "deit_tiny_distilled_patch16_224", "--no-pretrained", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_prefix_tokens"] == 2 and d["prefix_kinds"] == ["class", "dist"] and d["grid_size"] == [14, 14]
    assert d["parameters"] == 5_910_800


def test_img_size_of_a_cnn_is_refused_not_ignored(tmp_path, capsys):
    """`vitlab info --model RESNET --img-size 64 64` printed the CNN's facts as if 64x64 had been described."""
    from conftest import tiny_bit

    ck = vitlab.save_checkpoint(tiny_bit(), tmp_path / "bit")
    assert main(["info", "--model", str(ck), "--img-size", "64", "64"]) == 1
    assert capsys.readouterr().err.startswith(f"vitlab info: ValueError: --img-size gives a ViT's token grid at another "
                                              f"input size; {ck} is a ")
    assert main(["info", "--model", str(ck)]) == 0


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["info", "--model", "vit_tinyy_patch16_224"]) == 1
    err = capsys.readouterr().err
    assert "neither a file nor a timm model name" in err and "vit_tiny" in err


@pytest.fixture
def checkpoint(tmp_path):
    return vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")


def test_capture_command(tmp_path, checkpoint):
    from safetensors.torch import load_file

    f = tmp_path / "a.safetensors"
    assert main(["capture", "--model", str(checkpoint), "--out", str(f), "--head-fusion", "mean",
                 "--queries", "prefix", "--device", "cpu"]) == 0
    assert load_file(str(f))["attention"].shape == (3, 2, 1, 1, 65)


def test_capture_file_tells_prefix_tokens_from_patches(tmp_path, checkpoint):
    """The saved maps' T axis counts prefix tokens (class, distillation, registers) before the patches, but the file
    did not say how many (a register model's 4 registers read as patches): its metadata now names them and the grid."""
    from safetensors import safe_open

    f = tmp_path / "a.safetensors"
    with pytest.warns(UserWarning, match="using the first 1 of the 2 photos"):  # said, as to any user
        assert main(["capture", "--model", str(checkpoint), "--out", str(f), "--num-images", "1"]) == 0
    with safe_open(str(f), "pt") as opened:
        meta, T = opened.metadata(), opened.get_slice("attention").get_shape()[-1]
    prefix, grid = json.loads(meta["prefix_tokens"]), json.loads(meta["grid"])
    assert prefix == ["class"] and grid == [8, 8] and len(prefix) + grid[0] * grid[1] == T


def test_capture_takes_every_image_of_a_folder_unless_told(tmp_path, checkpoint, capsys):
    """All 20 images of a folder are captured (the first 16 were, silently); --num-images keeps the first N with a
    warning that counts those left out."""
    import warnings

    from _reference import make_folder
    from safetensors.torch import load_file

    folder = make_folder(tmp_path / "imgs", n_per_class=10, size=32)
    f = tmp_path / "a.safetensors"
    base = ["capture", "--model", str(checkpoint), "--images", str(folder), "--out", str(f), "--queries", "prefix"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left out, nothing to warn about
        assert main(base) == 0
    assert load_file(str(f))["attention"].shape[1] == 20 and "for 20 images" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=r"using the first 5 of the 20 images in .*imgs \(sorted by path\): 15 left "
                                         "out"):
        assert main([*base, "--num-images", "5"]) == 0
    assert load_file(str(f))["attention"].shape[1] == 5
    with pytest.raises(SystemExit) as e:
        main([*base, "--num-images", "0"])
    assert e.value.code == 2 and "argument --num-images: expected at least 1, got 0" in capsys.readouterr().err


def test_capture_num_images_also_limits_the_default_photos(tmp_path, checkpoint, capsys):
    """Without --images, capture reads scikit-learn's two photos; --num-images 1 captured both, silently."""
    from safetensors.torch import load_file

    f = tmp_path / "a.safetensors"
    with pytest.warns(UserWarning, match=r"using the first 1 of the 2 photos scikit-learn ships: 1 left out"):
        assert main(["capture", "--model", str(checkpoint), "--out", str(f), "--num-images", "1"]) == 0
    assert load_file(str(f))["attention"].shape[1] == 1 and "for 1 image\n" in capsys.readouterr().out


def test_queries_prefix_help_says_it_keeps_the_prefix_token_rows(capsys):
    """--queries prefix keeps every prefix token's row (class and 4 registers here), not 'only the readout rows':
    the help and the Python API page (docs/api.md) say what it keeps."""
    from pathlib import Path

    from conftest import tiny_timm

    model, x = tiny_timm("vit_small_patch14_reg4_dinov2", img_size=56), torch.randn(1, 3, 56, 56)
    full = vitlab.attention_maps(model, x)
    torch.testing.assert_close(vitlab.attention_maps(model, x, queries="prefix"), full[..., :5, :])
    with pytest.raises(SystemExit):
        main(["capture", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text().split())
    for text in (help_text, readme):
        assert "readout rows" not in text and "class, distillation and register tokens" in text


def test_capture_never_leaves_half_a_file(tmp_path, checkpoint, monkeypatch, capsys):
    """A write that fails part-way keeps the earlier file byte for byte and leaves no temporary; a folder as --out
    is refused before any work."""
    import safetensors.torch

    f = tmp_path / "a.safetensors"
    assert main(["capture", "--model", str(checkpoint), "--out", str(f)]) == 0
    before = f.read_bytes()

    def torn(tensors, path, metadata=None):
        with open(path, "wb") as out:
            out.write(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", torn)
    assert main(["capture", "--model", str(checkpoint), "--out", str(f), "--head-fusion", "mean"]) != 0
    assert "disk full" in capsys.readouterr().err
    assert f.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "ck"]
    assert main(["capture", "--model", str(checkpoint), "--out", str(tmp_path)]) != 0
    assert "is a folder; give a file name" in capsys.readouterr().err


def test_probe_command(tmp_path, checkpoint, capsys):
    f = tmp_path / "probe.json"
    assert main(["probe", "--model", str(checkpoint), "--data", "shapes", "--max-train", "40", "--max-test", "20",
                 "--shots", "1", "5", "--seeds", "2", "--json", str(f), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "40 train / 20 test images" in out and "logistic regression" in out
    d = json.loads(f.read_text())
    assert set(d["few_shot"]) == {"1", "5"} and len(d["few_shot"]["5"]["per_seed"]) == 2
    assert 0 <= d["linear_probe"] <= 1
    assert main(["probe", "--model", str(checkpoint), "--data", "shapes", "--max-train", "40", "--shots", "25",
                 "--quiet"]) == 1
    assert "--max-train 40 keeps 10 training images of class 'circle'" in capsys.readouterr().err


def test_probe_reads_the_patch_mean_when_asked(tmp_path, checkpoint, capsys):
    """--readout patch_mean probes the mean of the final patch tokens (an MPP encoder's class token was never trained,
    and `vitlab probe` could only read it): the features are extract_features' patch_mean ones, and the output and
    JSON say which readout was probed."""
    import vitlab
    from vitlab.data.datasets import load_splits, nested_subsets
    from vitlab.probe.features import extract_features
    from vitlab.probe.linear import few_shot_accuracy

    f = tmp_path / "probe.json"
    argv = ["probe", "--model", str(checkpoint), "--data", "shapes", "--max-train", "40", "--max-test", "20",
            "--shots", "2", "--seeds", "2", "--no-full", "--quiet", "--json", str(f)]
    assert main([*argv, "--readout", "patch_mean"]) == 0
    assert "(the mean of the final patch tokens)" in capsys.readouterr().out
    d = json.loads(f.read_text())
    train, test = load_splits("shapes", progress=False)
    train = train.subset(nested_subsets(train.labels, [40], seed=0)[0])
    test = test.subset(nested_subsets(test.labels, [20], seed=0)[0])
    model = vitlab.load_model(str(checkpoint))
    feats = [extract_features(model, x, progress=False, readout="patch_mean") for x in (train, test)]
    want = few_shot_accuracy(feats[0], train.labels, feats[1], test.labels, shots=[2], seeds=range(2), l2=1024.0)
    assert d["readout"] == "patch_mean" and d["few_shot"]["2"]["per_seed"] == list(want[2].per_seed)
    assert main([*argv]) == 0 and json.loads(f.read_text())["readout"] == "model"
    assert "(the model's own readout" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--readout", "mean"])


@pytest.mark.parametrize("max_train, shots, kept", [("40", "11", "10"), ("3", "1", "0")])
def test_probe_checks_shots_against_max_train_before_the_feature_pass(max_train, shots, kept, checkpoint,
                                                                       monkeypatch, capsys):
    """--max-train too small for --shots was caught only after both feature passes, by a message that said 'add
    data' (not --max-train); below one image per class it said 'test labels [3] never occur in the training
    labels'. Now refused before any feature is extracted, naming --max-train and the least value that works."""
    import vitlab.probe.features

    def no_features(*args, **kwargs):
        raise AssertionError("features were extracted before --shots was checked against --max-train")

    monkeypatch.setattr(vitlab.probe.features, "extract_features", no_features)
    assert main(["probe", "--model", str(checkpoint), "--data", "shapes", "--max-train", max_train, "--max-test",
                 "8", "--shots", shots, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"--max-train {max_train} keeps {kept} training images of class" in err
    assert f"raise --max-train to at least {4 * int(shots)} ({shots} x 4 classes) or lower --shots" in err


@pytest.mark.parametrize("args, flag, bound", [
    (["probe", "--data", "shapes", "--max-train", "-3"], "--max-train", "at least 1, got -3"),  # used 29 of 32 images
    (["probe", "--data", "shapes", "--max-test", "-2"], "--max-test", "at least 1, got -2"),  # used 14 of 16
    (["probe", "--data", "shapes", "--batch-size", "0"], "--batch-size", "at least 1, got 0"),  # a range() error
    (["probe", "--data", "shapes", "--shots", "5", "0"], "--shots", "at least 1, got 0"),
    (["probe", "--data", "shapes", "--seeds", "0"], "--seeds", "at least 1, got 0"),
    (["probe", "--data", "shapes", "--max-train", "ten"], "--max-train", "a whole number, got 'ten'"),
    (["info", "--img-size", "0", "32"], "--img-size", "at least 1, got 0"),
    (["capture", "--batch-size", "-1"], "--batch-size", "at least 1, got -1"),
    (["train", "--epochs", "0"], "--epochs", "at least 1, got 0"),
    (["train", "--workers", "-1"], "--workers", "0 or more, got -1"),
    (["sweep", "--workers", "-2"], "--workers", "0 or more, got -2"),
    (["sweep", "--shots", "0"], "--shots", "at least 1, got 0"),
    (["app", "--num-images", "0"], "--num-images", "at least 1, got 0"),
    (["app", "--port", "-1"], "--port", "a port from 1 to 65535, got -1"),
    (["app", "--port", "70000"], "--port", "a port from 1 to 65535, got 70000"),
    (["reproduce", "--num-images", "-4"], "--num-images", "at least 1, got -4"),
])
def test_counts_that_cannot_be_zero_or_negative_are_refused_naming_the_flag(args, flag, bound, capsys):
    """A count below its least meaningful value is a usage error naming the flag, before anything loads or runs."""
    with pytest.raises(SystemExit) as e:  # parsing alone: without the check the command would run
        build_parser().parse_args(args)
    assert e.value.code == 2
    assert f"argument {flag}: expected {bound}" in capsys.readouterr().err


def test_counts_at_their_least_value_are_accepted():
    parse = build_parser().parse_args
    args = parse(["probe", "--data", "shapes", "--max-train", "1", "--max-test", "1", "--batch-size", "1", "--shots",
                  "1", "--seeds", "1"])
    assert (args.max_train, args.max_test, args.batch_size, args.shots, args.seeds) == (1, 1, 1, [1], 1)
    assert parse(["train", "--workers", "0", "--epochs", "1"]).workers == 0
    assert parse(["sweep", "--workers", "0"]).workers == 0 and parse(["info", "--img-size", "1", "2"]).img_size == [1, 2]


@pytest.mark.parametrize("l2", ["0", "-1", "nan", "inf"])
def test_probe_refuses_a_bad_l2_before_loading_the_model(l2, monkeypatch, capsys):
    """--l2 0 was refused by the ridge fit only after the model loaded and every feature was extracted."""
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --l2 was checked")

    monkeypatch.setattr(vitlab, "load_model", no_model)
    assert main(["probe", "--data", "shapes", "--l2", l2, "--quiet"]) == 1
    assert f"--l2 must be a positive finite number (the ridge penalty), got {float(l2):g}" in capsys.readouterr().err


def test_offline_hub_name_fails_within_seconds(monkeypatch, capsys):
    import time

    from vitlab.models.load import hub_reachable

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: the hub is unreachable
    hub_reachable.cache_clear()
    try:
        t0 = time.time()
        assert main(["info", "--model", "vit_tiny_patch16_224"]) == 1
        assert time.time() - t0 < 20
        err = capsys.readouterr().err
        assert "offline" in err and "--weights" in err  # the CLI names its own flag for the offline route
    finally:
        hub_reachable.cache_clear()


def test_a_weights_file_given_as_model_is_named_by_its_own_path(tmp_path, capsys):
    bad = tmp_path / "weights.pth"
    bad.write_bytes(b"not a checkpoint")
    assert main(["info", "--model", str(bad)]) == 1
    err = capsys.readouterr().err  # the line a user reads: the flag, the file, and the flags that load it
    assert err.startswith(f"vitlab info: ParameterModelError: --model {bad}: a file, not a vitlab checkpoint folder")
    assert err.rstrip().endswith(f"fix: --model TIMM_NAME --weights {bad}"), err


def test_resume_on_a_finished_run_says_so(tmp_path, capsys, monkeypatch):
    from _reference import make_folder

    data = make_folder(tmp_path / "d" / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(tmp_path / "d" / "test", n_per_class=4, size=32, classes=("a", "b"))
    args = ["train", "--preset", "tiny", "--data", str(data.parent), "--epochs", "1", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    assert "is finished: all 1 epochs are done" in capsys.readouterr().out  # tqdm.write prints to stdout


def test_continue_warm_starts_from_the_shipped_checkpoint_when_the_state_is_gone(tmp_path, capsys, monkeypatch):
    from _reference import make_folder

    import vitlab.models.load

    data = make_folder(tmp_path / "d" / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(tmp_path / "d" / "test", n_per_class=4, size=32, classes=("a", "b"))
    shipped_root = tmp_path / "checkpoints"
    monkeypatch.setattr(vitlab.models.load, "DEFAULT_CHECKPOINT", shipped_root / "vit_cifar10")
    args = ["train", "--preset", "tiny", "--data", str(data.parent), "--epochs", "1", "--continue"]
    assert main(args + ["--run-dir", str(tmp_path / "a")]) == 0  # nothing shipped, no state: a fresh run
    from vitlab.models.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(load_checkpoint(tmp_path / "a" / "checkpoint"), shipped_root / "tiny")
    capsys.readouterr()
    assert main(args + ["--run-dir", str(tmp_path / "b")]) == 0  # state gone: warm start from the shipped weights
    assert "warm-starting from the shipped" in capsys.readouterr().err
    assert json.loads((tmp_path / "b" / "train_config.json").read_text())["init_from"] == str(shipped_root / "tiny")


def test_continue_after_a_finished_and_exported_leg_trains_a_new_leg(tmp_path, capsys, monkeypatch):
    """A finished run's state is kept aside and a new leg warm-starts from what shipped; a finished run that was
    never exported is refused (a new leg from the shipped weights would drop what it learned) and left as it was."""
    from _reference import make_folder

    import vitlab.models.load
    from vitlab.train.export import export_run

    data = make_folder(tmp_path / "d" / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(tmp_path / "d" / "test", n_per_class=4, size=32, classes=("a", "b"))
    shipped = tmp_path / "checkpoints" / "tiny"
    monkeypatch.setattr(vitlab.models.load, "DEFAULT_CHECKPOINT", shipped.parent / "vit_cifar10")
    run = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--data", str(data.parent), "--epochs", "1", "--run-dir", str(run)]
    assert main(args) == 0
    first = (run / "checkpoint" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(args + ["--continue"]) == 1  # finished, not exported: refused, nothing moved
    assert "does not hold its weights" in capsys.readouterr().err
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == first and not run.with_name("run.leg1").exists()

    export_run(run, shipped, command="vitlab train --preset tiny")
    # another process training into the run now (it holds RUN/.lock): --continue neither repairs nor moves the
    # folder from under it (it was renamed before the lock was taken)
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(run / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(args + ["--continue"]) == 1
        assert f"RunInUse: --run-dir {run}: in use: another process is training" in capsys.readouterr().err
        assert not run.with_name("run.leg1").exists() and (run / "checkpoint" / "model.safetensors").read_bytes() == first
    finally:
        holder.kill()
        holder.wait()
    assert main(args + ["--continue"]) == 0  # exported: kept as run.leg1, and a new leg from the shipped weights
    assert "kept as" in capsys.readouterr().err
    assert (run.with_name("run.leg1") / "checkpoint" / "model.safetensors").read_bytes() == first
    assert json.loads((run / "train_config.json").read_text())["init_from"] == str(shipped)
    assert json.loads((run / "checkpoint" / "config.json").read_text())["epoch"] == 1

    # the new leg finished too, but the shipped folder holds the first leg (same epoch count, other weights): refused
    assert main(args + ["--continue"]) == 1 and "does not hold its weights" in capsys.readouterr().err
    meta_file = run / "checkpoint" / "config.json"  # an unfinished leg (as if killed after epoch 0) is resumed
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "epoch": 0}))
    assert main(args + ["--continue"]) == 0
    assert "kept as" not in capsys.readouterr().err and not run.with_name("run.leg2").exists()
    assert json.loads(meta_file.read_text())["epoch"] == 1


def test_probe_refuses_splits_whose_classes_differ(tmp_path, checkpoint, capsys):
    from _reference import make_folder

    make_folder(tmp_path / "d" / "train", size=32, classes=("cat", "dog", "frog"))
    make_folder(tmp_path / "d" / "test", size=32, classes=("cat", "frog"))
    assert main(["probe", "--model", str(checkpoint), "--data", str(tmp_path / "d"), "--shots", "1", "--quiet"]) == 1
    assert "hold different classes" in capsys.readouterr().err


def test_app_hands_voila_an_absolute_checkpoint_path(tmp_path, monkeypatch):
    """Voila's kernel runs in the notebook's own folder: a relative checkpoint path is resolved before it starts;
    a timm name is passed as it is."""
    import subprocess

    from vitlab import app

    seen = {}
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, env, start_new_session: seen.update(env=env))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "ck").mkdir(parents=True)
    app.serve("runs/ck", token="t")
    assert seen["env"]["VITLAB_MODEL"] == str(tmp_path / "runs" / "ck")
    app.serve("vit_tiny_patch16_224", token="t")
    assert seen["env"]["VITLAB_MODEL"] == "vit_tiny_patch16_224"


def _fake_serve(monkeypatch, started: list) -> None:
    """``vitlab.app.serve`` replaced by a recorder: each call's (model, options) appended to ``started``, and a
    server that has already ended."""
    import vitlab.app

    class Served:
        def wait(self):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(vitlab.app, "serve", lambda model, **kw: started.append((model, kw)) or Served())


def test_app_checks_the_model_and_the_image_count_before_starting_voila(tmp_path, checkpoint, monkeypatch, capsys):
    """A missing model, a model without attention or an image count the model has no images for fail on the command
    line with exit status 1 (they failed only in the browser); a good one reaches the server with its settings."""
    from conftest import free_port, tiny_bit

    import vitlab.app

    started, port = [], str(free_port())  # the default 8866 may be another program's

    _fake_serve(monkeypatch, started)
    assert main(["app", "--port", port, "--model", str(tmp_path / "missing")]) == 1
    assert f"{tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main(["app", "--port", port, "--model", "vit_tinyy_patch16_224"]) == 1
    assert "neither a file nor a timm model name" in capsys.readouterr().err
    cnn = vitlab.save_checkpoint(tiny_bit(), tmp_path / "cnn")
    assert main(["app", "--port", port, "--model", str(cnn)]) == 1
    assert "has no self-attention for the explorer to show" in capsys.readouterr().err
    assert main(["app", "--port", port, "--model", str(checkpoint), "--num-images", "129"]) == 1
    err = capsys.readouterr().err
    assert "--num-images 129" in err and "at most 128" in err
    with pytest.raises(SystemExit):  # refused when the arguments are parsed
        main(["app", "--model", str(checkpoint), "--num-images", "0"])
    assert "argument --num-images: expected at least 1, got 0" in capsys.readouterr().err
    assert not started
    assert main(["app", "--model", str(checkpoint), "--num-images", "128", "--port", port]) == 0
    token = started[0][1].pop("token")
    assert started == [(str(checkpoint), {"port": int(port), "open_browser": False, "num_images": 128,
                                          "pretrained": True, "weights": None, "hosts": (), "max_pages": 3})]
    assert re.fullmatch("[0-9a-f]{48}", token)  # printed with the address, as Jupyter's
    assert f"http://127.0.0.1:{port}/?token={token}" in capsys.readouterr().out


def test_app_takes_a_timm_name_offline_with_random_or_local_weights(tmp_path, monkeypatch, capsys):
    """`vitlab app --model <timm name>` offline told the user to pass --no-pretrained or --weights, which `vitlab app`
    did not accept: a timm model could not be explored without the hub. Both now reach the check and the kernel."""
    import timm
    from conftest import free_port
    from safetensors.torch import save_file

    import vitlab.app

    serve, started, port = vitlab.app.serve, [], str(free_port())  # the default 8866 may be another program's

    _fake_serve(monkeypatch, started)
    assert main(["app", "--port", port, "--model", "vit_tiny_patch16_224", "--no-pretrained", "--num-images", "2"]) == 0
    assert started[-1][1]["pretrained"] is False
    weights = tmp_path / "w.safetensors"
    save_file(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3).state_dict(), weights)
    assert main(["app", "--port", port, "--model", "vit_tiny_patch16_224", "--weights", str(weights), "--num-images", "2"]) == 0
    assert started[-1][1]["weights"] == str(weights)
    seen = {}
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, env, start_new_session: seen.update(env=env))
    serve("vit_tiny_patch16_224", pretrained=False, weights=str(weights), token="t")
    assert seen["env"]["VITLAB_PRETRAINED"] == "0" and seen["env"]["VITLAB_WEIGHTS"] == str(weights)
    monkeypatch.setenv("VITLAB_PRETRAINED", "0")
    serve("vit_tiny_patch16_224", token="t")
    assert "VITLAB_PRETRAINED" not in seen["env"] and "VITLAB_WEIGHTS" not in seen["env"]
    # a VITLAB_MODEL left in the shell (the notebooks read it) made `vitlab app` without --model serve that model,
    # though the command checked the embedded default: the kernel now gets the default too
    monkeypatch.setenv("VITLAB_MODEL", "vit_small_patch16_224")
    serve(None, token="t")
    assert "VITLAB_MODEL" not in seen["env"]


def test_app_hands_voila_a_token_host_names_and_a_page_cap_outside_its_command_line(monkeypatch, capsys):
    """The server had no token, accepted any Host header and any number of kernels: `vitlab app` now passes a fresh
    token, --allow-host names and --max-pages to the server through its environment (never its command line, which
    other users can read in ps), and refuses a host name with a port or a comma, an IP address and a cap below 1."""
    from conftest import free_port

    import vitlab.app

    serve, started, port = vitlab.app.serve, [], str(free_port())
    _fake_serve(monkeypatch, started)
    monkeypatch.setattr("vitlab.cli.app._check_app_model", lambda *a: None)
    assert main(["app", "--port", port, "--allow-host", "box.local", "--allow-host", "box", "--max-pages", "2"]) == 0
    assert (started[0][1]["hosts"], started[0][1]["max_pages"]) == (("box.local", "box"), 2)
    assert main(["app", "--port", port]) == 0
    assert started[1][1]["token"] != started[0][1]["token"]  # one per server
    capsys.readouterr()
    for bad, words in ((["--allow-host", "box:8866"], "argument --allow-host: expected a host name"),
                       (["--allow-host", "a,b"], "argument --allow-host: expected a host name"),
                       (["--allow-host", "10.0.0.5"], "argument --allow-host: expected a host name, got the address"),
                       (["--max-pages", "0"], "argument --max-pages: expected at least 1, got 0")):
        with pytest.raises(SystemExit):
            main(["app", "--port", port, *bad])
        assert words in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, env, start_new_session: seen.update(cmd=cmd, env=env))
    serve(token="s3cret", hosts=("box",), max_pages=2)
    assert (seen["env"]["VITLAB_APP_TOKEN"], seen["env"]["VITLAB_APP_HOSTS"], seen["env"]["VITLAB_APP_MAX_PAGES"]) == (
        "s3cret", "box", "2")
    assert seen["env"]["VITLAB_APP_PARENT_PID"] == str(os.getpid()) and "s3cret" not in " ".join(seen["cmd"])
    with pytest.raises(ValueError, match="empty token"):
        serve(token="")


def test_app_refuses_a_port_in_use_before_loading_the_model(monkeypatch, capsys):
    """A port another server listens on: Voila moved to the next free port while `vitlab app` printed the busy one
    (the page there was someone else's); now the command fails at once naming the port and --port, before the model
    loads, and Voila itself is told to try no other port."""
    import socket

    import vitlab.app

    monkeypatch.setattr("vitlab.cli.app._check_app_model", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.setattr(vitlab.app, "serve", lambda *a, **kw: pytest.fail("the server was started"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["app", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is not free" in err and "pass another --port" in err, err
    assert "--Voila.port_retries=0" in vitlab.app.voila_command(port)


def test_default_images_refuse_zero_images():
    from vitlab.data.images import default_images

    with pytest.raises(ValueError, match=r"n must be in \[1, 38\], got 0"):  # 0 gave the default 16
        default_images(vitlab.load_model("vit_tiny_patch16_224", pretrained=False, depth=1), 0)


def test_no_pretrained_with_a_checkpoint_or_a_weights_file_reads_in_flags(tmp_path, checkpoint, capsys):
    from vitlab.base.errors import ParameterModelError, Setting

    assert main(["info", "--model", str(checkpoint), "--no-pretrained"]) == 1
    assert "ParameterModelError: --no-pretrained: only timm model names take it" in capsys.readouterr().err
    w = tmp_path / "w.safetensors"
    w.write_bytes(b"")
    with pytest.raises(ParameterModelError) as e:
        vitlab.load_model("vit_tiny_patch16_224", weights=w, pretrained=False)
    assert (e.value.param, e.value.value, e.value.fix) == ("pretrained", False, (Setting("weights", None),
                                                                                 Setting("pretrained", True)))
    assert main(["info", "--model", "vit_tiny_patch16_224", "--weights", str(w), "--no-pretrained"]) == 1
    assert capsys.readouterr().err.rstrip().endswith("fix: without --weights, or without --no-pretrained")
    assert main(["info", "--model", str(checkpoint), "--weights", str(w)]) == 1
    assert f"ParameterModelError: --weights {w}: only timm model names take it; a vitlab checkpoint already says" in \
        capsys.readouterr().err


def test_sweep_table_without_results_points_at_the_shipped_store(tmp_path, monkeypatch, capsys):
    """`vitlab sweep --table` reads runs/sweeps/cifar10.jsonl by default, where nothing is on a fresh checkout: the
    message said to run the sweep (38 min) and not that the shipped sweep's results are one --results away."""
    from pathlib import Path

    shipped = Path(vitlab.__file__).resolve().parents[1] / "data" / "results" / "scaling_cifar10.jsonl"
    if not shipped.is_file():
        pytest.skip("no shipped sweep results (a wheel install)")
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--table"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no records of sweep 'cifar10' in runs/sweeps/cifar10.jsonl" in err
    assert f"--results {shipped}" in err
    assert main(["sweep", "--table", "--results", str(shipped)]) == 0


def test_sweep_plot_over_its_own_results_is_refused(tmp_path, capsys):
    """`--table --plot data/results/scaling_cifar10.jsonl` replaced the shipped results store with the HTML figure."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "data" / "results" / "scaling_cifar10.jsonl"
    store = tmp_path / "scaling.jsonl"
    store.write_bytes(shipped.read_bytes())
    assert main(["sweep", "--table", "--results", str(store), "--plot", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab sweep: ValueError: --plot {store} is an input of this command")
    assert store.read_bytes() == shipped.read_bytes()
    assert main(["sweep", "--table", "--results", str(store), "--plot", str(tmp_path)]) == 1
    assert f"--plot {tmp_path} is a folder; give a file name" in capsys.readouterr().err


def test_sweep_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    """`sweep --table --tune` printed the tables and silently skipped the tuning, and `--save-config` without
    --tune wrote nothing; both are refused now, before any work, naming the fix."""
    assert main(["sweep", "--table", "--tune"]) == 1
    assert "--table runs nothing" in capsys.readouterr().err
    assert main(["sweep", "--table", "--save-config", str(tmp_path / "c.json")]) == 1
    assert "--save-config writes the config --tune freezes: pass --tune too" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_sweep_plot_png_names_a_bad_browser_path(tmp_path, monkeypatch, capsys):
    """--plot FILE.png without a Chromium said 'needs a Chromium (apt-get install chromium)' also when BROWSER_PATH
    was set to a file that does not exist: the message names that path, and no file is written."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "data" / "results"
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium on PATH either
    out = tmp_path / "curves.png"
    code = main(["sweep", "--config", str(root / "scaling_cifar10.tuned.json"), "--results",
                 str(root / "scaling_cifar10.jsonl"), "--table", "--plot", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and f"BROWSER_PATH={tmp_path / 'no-such-chrome'} is no executable file" in err
    assert "or pass an .html file" in err and not out.exists()


@pytest.mark.parametrize("error, words", [
    (PermissionError(13, "Permission denied", "/ro/out.json"), "Permission denied: /ro/out.json; check its permissions"),
    (IsADirectoryError(21, "Is a directory", "/tmp/x"), "Is a directory: /tmp/x; it is a folder: give a file's name"),
    (NotADirectoryError(20, "Not a directory", "/f.txt/y"), "Not a directory: /f.txt/y; a part of the path is a file"),
    (FileExistsError(17, "File exists", "/f.txt"), "File exists: /f.txt; a file stands where a folder is needed"),
])
def test_system_errors_are_one_line_naming_the_path_not_a_traceback(error, words, monkeypatch, capsys):
    """A read-only output folder (PermissionError) or a folder where a file goes (IsADirectoryError) escaped main()
    as a raw traceback, after all the work; now a line naming the path and the fix, exit status 1."""
    def fail(args):
        raise error

    monkeypatch.setattr("vitlab.cli.info.run", fail)
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab info: {type(error).__name__}: {words}") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_ctrl_c_is_a_message_and_status_130_not_a_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("vitlab.cli.train.run", interrupted)
    assert main(["train", "--preset", "tiny"]) == 130
    assert capsys.readouterr().err == "vitlab train: interrupted; --resume continues from the last finished epoch, if one finished\n"
    monkeypatch.setattr("vitlab.cli.info.run", interrupted)
    assert main(["info"]) == 130
    assert capsys.readouterr().err == "vitlab info: interrupted\n"


def test_kill_cleans_up_like_ctrl_c_status_143(monkeypatch, capsys, tmp_path):
    """SIGTERM (kill, timeout, a scheduler) during a checkpoint save: Python's default would die at once and leave the
    save's .NAME.tmp.* folder with its weights beside the target; through main it is an exception, so the save's
    clean-up runs, the earlier checkpoint stays, and the status is the shell's for SIGTERM (128 + 15)."""
    import os
    import signal

    import vitlab.cli
    import vitlab.models.checkpoint
    from vitlab.models.checkpoint import save_checkpoint

    model = vitlab.load_model(vitlab.vit_config("Ti/16", img_size=32, patch_size=8, depth=1, num_classes=2))
    target = tmp_path / "ck"
    save_checkpoint(model, target)
    before = (target / "model.safetensors").read_bytes()
    real_save = vitlab.models.checkpoint.save_file

    def killed_while_writing(state, path, **kw):
        real_save(state, path, **kw)  # the new weights are on disk in the temporary folder...
        os.kill(os.getpid(), signal.SIGTERM)  # ...when the process is told to stop

    def save(args):
        monkeypatch.setattr(vitlab.models.checkpoint, "save_file", killed_while_writing)
        save_checkpoint(model, target)
        return 0

    monkeypatch.setattr("vitlab.cli.info.run", save)
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["info"]) == 143
    assert capsys.readouterr().err == "vitlab info: terminated (SIGTERM)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"] and (target / "model.safetensors").read_bytes() == before
    assert signal.getsignal(signal.SIGTERM) is handler  # main leaves the process's handler as it found it


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, capsys):
    """`vitlab info --json | head -1`: when the pipe's reader has gone, the command stops with the shell's SIGPIPE
    status (141) and no message, as Unix tools do; a broken pipe that is not stdout is still an error that names it."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "vitlab.cli", "info", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and err.decode() == ""

    def other_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("vitlab.cli.info.run", other_pipe)
    assert main(["info"]) == 1
    assert capsys.readouterr().err == "vitlab info: BrokenPipeError: [Errno 32] Broken pipe\n"


def test_atomic_write_into_a_read_only_folder_names_the_file_not_its_temporary(tmp_path, monkeypatch):
    import tempfile

    from vitlab.base.atomic import atomic_write, temp_dir_beside

    def denied(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", f"{dir}/.out.json.abc123.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    with pytest.raises(PermissionError) as e:
        atomic_write(tmp_path / "out.json", lambda tmp: None)
    assert e.value.filename == str(tmp_path / "out.json")
    with pytest.raises(PermissionError) as e:
        temp_dir_beside(tmp_path / "report")
    assert e.value.filename == str(tmp_path / "report")


@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_probe_json_that_cannot_be_written_is_refused_before_the_model_loads(where, tmp_path, monkeypatch, capsys):
    """--json naming a folder failed with a traceback after the whole feature pass and probe (the results lost)."""
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --json was checked")

    monkeypatch.setattr(vitlab, "load_model", no_model)
    (tmp_path / "f.txt").write_text("x")
    target = tmp_path if where == "folder" else tmp_path / "f.txt" / "p.json"
    assert main(["probe", "--data", "shapes", "--json", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vitlab probe: ValueError: --json ") and ("is a folder" in err or "is a file" in err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_probe_json_that_is_an_input_is_refused_before_the_model_loads(tmp_path, checkpoint, monkeypatch, capsys):
    """`--json CHECKPOINT/config.json` replaced the model's config with the probe's results: the checkpoint lost."""
    monkeypatch.setattr(vitlab, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    target = checkpoint / "config.json"
    before = target.read_bytes()
    assert main(["probe", "--model", str(checkpoint), "--data", "shapes", "--json", str(target)]) == 1
    assert capsys.readouterr().err.startswith(f"vitlab probe: ValueError: --json {target} is an input of this command")
    assert target.read_bytes() == before


def test_capture_out_under_a_file_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(vitlab, "load_model", no_model)
    (tmp_path / "f.txt").write_text("x")
    assert main(["capture", "--out", str(tmp_path / "f.txt" / "a.safetensors")]) == 1
    assert f"{tmp_path / 'f.txt'} is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["weights", "image"])
def test_capture_out_that_is_an_input_is_refused_before_the_model_loads(target, tmp_path, checkpoint, monkeypatch,
                                                                        capsys):
    """`--out CHECKPOINT/model.safetensors` replaced the model's weights with the attention maps (the checkpoint lost),
    `--out IMAGES/x.png` an image of --images."""
    from _reference import make_folder

    folder = make_folder(tmp_path / "imgs", n_per_class=1, size=32)
    out = checkpoint / "model.safetensors" if target == "weights" else sorted(folder.rglob("*.png"))[0]
    before = out.read_bytes()
    monkeypatch.setattr(vitlab, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["capture", "--model", str(checkpoint), "--images", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab capture: ValueError: --out {out} is an input of this command") and \
        "give another file name" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize("run", ["missing", "empty", "file"])
def test_export_of_a_folder_without_a_run_says_what_run_dir_needs(run, tmp_path, capsys):
    """A misspelt or empty --run-dir gave '[Errno 2] No such file or directory: .../checkpoint/config.json', a file
    a NotADirectoryError traceback."""
    path = tmp_path / run
    if run == "empty":
        path.mkdir()
    elif run == "file":
        path.write_text("x")
    assert main(["export", "--run-dir", str(path), "--out", str(tmp_path / "out"), "--command-line", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab export: FileNotFoundError: {path} holds no training checkpoint")
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["checkpoint", ".", ".."])
def test_export_into_its_own_run_is_refused_before_any_work(where, tmp_path, monkeypatch, capsys):
    """`--out RUN/checkpoint` replaced the run's training checkpoint (its --resume point) with the half-precision
    export."""
    import vitlab.train.export

    monkeypatch.setattr(vitlab.train.export, "export_run", lambda *a, **k: pytest.fail("the export ran"))
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    assert main(["export", "--run-dir", str(run), "--out", str(run / where), "--command-line", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab export: ValueError: --out {run / where} is --run-dir {run}, inside it or above it")


def test_resume_and_continue_together_are_a_usage_error(capsys):
    """Both were accepted: --continue printed 'starting a fresh run', then --resume failed for want of state."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["train", "--resume", "--continue"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf", "abc"])
def test_reproduce_refuses_an_image_scale_that_is_no_positive_number(scale, capsys):
    """--image-scale -1 or nan drew every PNG at the default scale without a word."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["reproduce", "--image-scale", scale])
    assert e.value.code == 2 and "argument --image-scale: expected a" in capsys.readouterr().err


def test_mpp_study_refuses_a_run_root_that_is_a_file_before_any_row(tmp_path, monkeypatch, capsys):
    """Every row was run and stored as failed (NotADirectoryError) in the results store."""
    import vitlab.studies.mpp

    monkeypatch.setattr(vitlab.studies.mpp, "run_study", lambda *a, **k: pytest.fail("a row ran"))
    (tmp_path / "f.txt").write_text("x")
    assert main(["mpp-study", "--study", "smoke", "--run-root", str(tmp_path / "f.txt"),
                 "--results", str(tmp_path / "r.jsonl")]) == 1
    assert "--run-root" in capsys.readouterr().err and not (tmp_path / "r.jsonl").exists()


def test_sweep_config_typos_name_the_file(tmp_path, capsys):
    """A JSON syntax error said only 'JSONDecodeError: Expecting property name ...: line 1 column 2', naming no file;
    a misspelt .json path was an 'unknown sweep'."""
    bad = tmp_path / "my sweep ü.json"
    bad.write_text("{bad json")
    assert main(["sweep", "--config", str(bad), "--table"]) == 1
    assert capsys.readouterr().err.startswith(f"vitlab sweep: ValueError: {bad} is not valid JSON (")
    assert main(["sweep", "--config", str(tmp_path / "nope.json"), "--table"]) == 1
    assert f"no such file '{tmp_path / 'nope.json'}'" in capsys.readouterr().err


def test_a_weights_folder_is_named_a_folder_not_missing(tmp_path, capsys):
    assert main(["info", "--model", "vit_tiny_patch16_224", "--weights", str(tmp_path)]) == 1
    from vitlab.base.errors import ModelLoadError, Setting

    assert capsys.readouterr().err.rstrip().endswith(f"--weights {tmp_path}: is a folder; fix: the weights file "
                                                     f"inside it (.safetensors, .pth, .bin), or --model {tmp_path} "
                                                     "without --weights")
    with pytest.raises(ModelLoadError) as e:  # from Python: load_model's arguments, no flag
        vitlab.load_model("vit_tiny_patch16_224", weights=tmp_path)
    assert (e.value.param, e.value.value, e.value.fix[1]) == ("weights", str(tmp_path),
                                                              (Setting("spec", str(tmp_path)), Setting("weights", None)))
    assert "--" not in str(e.value).replace(str(tmp_path), "")


def test_a_tilde_in_a_path_option_is_the_home_folder(monkeypatch):
    """`--out=~/report` reaches vitlab unexpanded (the shell expands a ~ only at a word's start) and made a folder
    named '~' in the current folder; every path option now reads a leading ~ as the home folder."""
    import os

    monkeypatch.setenv("HOME", "/home/someone")
    parse = build_parser().parse_args
    home = "/home/someone/x"
    assert parse(["reproduce", "--out=~/x", "--images=~/x", "--model=~/x"]).out == home
    got = parse(["reproduce", "--out=~/x", "--images=~/x", "--model=~/x"])
    assert (got.images, got.model) == (home, [home])  # reproduce's --model repeats: a recipe's runs
    assert parse(["capture", "--out=~/x", "--weights=~/x"]).weights == home
    assert parse(["train", "--run-dir=~/x", "--data=~/x"]).run_dir == home
    assert parse(["export", "--run-dir=~/x", "--out=~/x", "--command-line", "c"]).out == home
    assert parse(["sweep", "--results=~/x", "--plot=~/x"]).plot == home
    got = parse(["sweep", "--work-dir=~/x", "--save-config=~/x"])
    assert (got.work_dir, got.save_config) == (home, home)
    assert parse(["mpp-study", "--results=~/x", "--run-root=~/x"]).run_root == home
    assert parse(["reproduce", "--out=out"]).out == "out" and parse(["capture"]).out == "attention.safetensors"
    assert parse(["reproduce", "--model=vit_tiny_patch16_224"]).model == ["vit_tiny_patch16_224"]
    assert parse(["info", "--model=vit_tiny_patch16_224"]).model == "vit_tiny_patch16_224"  # one model elsewhere
    assert parse(["reproduce", "--model=a", "--model=~/x"]).model == ["a", home]
    assert os.path.expanduser("~") == "/home/someone"


@pytest.mark.parametrize("argv", [["capture", "--images", ""], ["capture", "--out", " "], ["reproduce", "--out", ""],
                                  ["train", "--run-dir", ""], ["probe", "--data", ""]])
def test_an_empty_path_is_a_usage_error(argv, capsys):
    """`--images ""` (an unset shell variable) captured the default photos without a word; `--out ""` said
    '--out  is a folder'."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and f"argument {argv[1]}: expected a path, got an empty text" in capsys.readouterr().err


def test_info_says_which_blocks_of_a_convit_are_gated_positional_and_where_its_class_token_joins(capsys):
    """vitlab info on a ConViT printed 'tokens 197 (1 prefix: class)' and 'in attention: gated positional' as if
    every block saw the class token and ran GPSA; its first 10 of 12 blocks are GPSA over the patches alone and the
    class token joins at block 11. Both lines now say so; a ViT's lines are as before."""
    assert main(["info", "--model", "convit_tiny", "--no-pretrained"]) == 0
    text = capsys.readouterr().out
    assert "197 (1 prefix: class, joins at block 11)" in text, text
    assert "in attention: gated positional (blocks 1-10)" in text, text
    assert main(["info", "--model", "vit_tiny_patch16_224", "--no-pretrained"]) == 0
    text = capsys.readouterr().out
    assert "197 (1 prefix: class)" in text and "in attention" not in text, text
