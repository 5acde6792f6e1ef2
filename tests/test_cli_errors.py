"""Refused arguments carry data (``vitlab.base.errors.Refusal``: param, value, allowed, fix) and the command line writes
them in its own flags, found through its parser: the tests assert the fields, and read a line as a user would only
where the flag in it is the feature."""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_vit

from vitlab.base.errors import Placeholder, Refusal, Setting
from vitlab.cli import build_parser, main
from vitlab.cli.flags import command_parser, flag_for, refusal_words, setting_words
from vitlab.cli.train import parse_value

PACKAGE = Path(__file__).resolve().parents[1] / "vitlab"


def _refusal(call) -> Refusal:
    with pytest.raises(Refusal) as e:
        call()
    return e.value


def _cli(e: Refusal, command: str) -> str:
    """``e`` as ``vitlab COMMAND`` prints it (after its type)."""
    return refusal_words(e, command_parser(build_parser(), command))


def test_image_folder_refusals_name_the_folder_and_the_command_line_its_flags(tmp_path):
    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    (tmp_path / "a_file").write_text("x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "broken.jpg").write_bytes(b"not a jpeg")
    model = tiny_vit()
    not_folder = _refusal(lambda: load_images(model, tmp_path / "a_file"))
    assert isinstance(not_folder, DataError) and (not_folder.param, not_folder.value) == ("folder",
                                                                                            str(tmp_path / "a_file"))
    bad = _refusal(lambda: load_images(model, tmp_path / "bad"))
    assert bad.param == "folder" and Setting("skip_bad", True) in bad.fix and "broken.jpg" in bad.problem
    assert _cli(not_folder, "capture").startswith(f"--images {tmp_path / 'a_file'}: ")
    assert _cli(bad, "reproduce").endswith("fix: remove or replace them, or --skip-bad")


def test_device_refusals_name_device_and_the_command_line_its_flag(monkeypatch):
    import vitlab.train.distributed as vd
    from vitlab.base.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    typo, no_gpu = _refusal(lambda: resolve_device("gpu")), _refusal(lambda: resolve_device("cuda"))
    assert (typo.param, typo.value, no_gpu.param, no_gpu.value) == ("device", "gpu", "device", "cuda")
    assert no_gpu.fix == (Setting("device", "cpu"), Setting("device", None))
    assert _refusal(lambda: resolve_device("mps")).fix == (Setting("device", "cpu"),)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(vd, "resolve_device", lambda _name: torch.device("mps"))
    torchrun = _refusal(lambda: vd.dist_setup("mps"))
    assert (torchrun.param, torchrun.value, torchrun.fix[-1]) == ("device", "mps", Setting("device", "cpu"))
    line = _cli(no_gpu, "train")
    assert line.startswith("--device cuda: ") and line.endswith("fix: --device cpu, or without --device"), line
    assert "device=" not in line and "device=" in str(no_gpu)  # a Python caller reads its argument's name


def test_report_folder_refusals_name_out(tmp_path, monkeypatch):
    from vitlab.report import check_report_dir, report_target

    (tmp_path / "a_file").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.txt").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    here = _refusal(lambda: report_target("."))
    assert (here.param, here.value, here.fix) == ("out", ".", (Setting("out", "report"),))
    for folder, new in (("a_file", "NEW_FOLDER"), ("notes", "NEW_OR_EMPTY_FOLDER")):
        e = _refusal(lambda folder=folder: check_report_dir(tmp_path / folder))
        assert isinstance(e, FileExistsError) and (e.param, e.value) == ("out", str(tmp_path / folder))
        assert e.fix[0] == Setting("out", Placeholder(new))
    assert _cli(here, "reproduce").endswith("fix: --out report")


def test_run_folder_refusals_name_run_dir_and_resume(tmp_path):
    from vitlab.train.config import PRESETS
    from vitlab.train.loop import train
    from vitlab.train.run_folder import check_fresh

    folders = {name: tmp_path / name for name in ("done", "aside", "earlier", "other")}
    (folders["done"] / "checkpoint").mkdir(parents=True)
    (folders["aside"] / ".checkpoint.old.x1").mkdir(parents=True)
    (folders["earlier"] / "best").mkdir(parents=True)
    folders["other"].mkdir()
    (folders["other"] / "notes.txt").write_text("keep me")
    new = Setting("run_dir", Placeholder("NEW"))
    fixes = {"done": (Setting("resume", True), new), "aside": (Setting("resume", True), new),
             "earlier": ("move them away", new), "other": (Setting("run_dir", Placeholder("NEW_OR_EMPTY_FOLDER")),)}
    for name, folder in folders.items():
        e = _refusal(lambda folder=folder: check_fresh(folder))
        assert (e.param, e.value, e.fix) == ("run_dir", str(folder), fixes[name]), name
    assert _cli(_refusal(lambda: check_fresh(folders["done"])), "train").endswith("fix: --resume, or --run-dir NEW")
    no_run = _refusal(lambda: train(PRESETS["tiny"], tmp_path / "fresh", resume=True, progress=False, device="cpu"))
    assert isinstance(no_run, FileNotFoundError) and (no_run.param, no_run.fix) == ("resume", (Setting("resume", False),))
    assert _cli(no_run, "train").startswith("--resume: ") and _cli(no_run, "train").endswith("fix: without --resume")
    assert not (tmp_path / "fresh").exists()


def test_sweep_refusals_name_results_and_executor(tmp_path, monkeypatch):
    from vitlab.studies.scaling import ResultsStore, _ray_runtime

    (tmp_path / "config.json").write_text(json.dumps({"mean": [0.5, 0.25]}, indent=2))
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed: its import fails

    def with_ray():
        with _ray_runtime(None, 1):
            pass

    from vitlab.base.records import RecordFileError

    with pytest.raises(RecordFileError) as store:  # the one reader's refusal of a file that holds no records
        ResultsStore(tmp_path / "config.json").records()
    ray = _refusal(with_ray)
    assert (store.value.param, store.value.path, store.value.line) == ("results", str(tmp_path / "config.json"), 1)
    assert (ray.param, ray.value, ray.fix[-1]) == ("executor", "ray", Setting("executor", "local"))
    assert _cli(ray, "sweep").startswith("--executor ray: needs Ray")


def test_training_refusals_carry_the_field_and_the_value_that_fixes_it(tmp_path):
    from vitlab.data.datasets import ImageArray
    from vitlab.train.config import PRESETS
    from vitlab.train.loop import _check_crop_padding, _check_image_size, _diverged

    cfg = PRESETS["tiny"]
    small = ImageArray(torch.zeros(4, 16, 16, 3, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), ("a",), "s")
    hybrid = dataclasses.replace(cfg, model=PRESETS["hybrid_cifar10"].model)
    ck = tmp_path / "run" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    pad = _refusal(lambda: _check_crop_padding(dataclasses.replace(cfg, crop_padding=16, crop_pad_mode="reflect"),
                                               small))
    assert (pad.param, pad.value, pad.config) == ("crop_padding", 16, True)
    assert pad.fix == (Setting("crop_padding", 2, True), Setting("crop_pad_mode", "constant", True))
    size = _refusal(lambda: _check_image_size(cfg, small, small))
    assert (size.param, size.fix[0]) == ("model.img_size", Setting("model.img_size", 16, True))
    assert _refusal(lambda: _check_image_size(hybrid, small, small)).param == "model.vit.img_size"
    nan = _diverged(float("nan"), 3, 7, ck, cfg)
    assert (nan.param, nan.value) == ("lr", cfg.lr) and Setting("init_from", str(ck), True) in nan.fix[0]
    # the command line: each field a --set, the run folder its flag
    assert _cli(pad, "train").endswith("fix: --set crop_padding=2, or --set crop_pad_mode=constant")
    assert _cli(nan, "train").endswith(f"fix: --set init_from={ck} --set lr=LOWER --run-dir NEW, or --set "
                                       f"init_from={ck} --set warmup_epochs=LONGER --run-dir NEW")
    assert "dataclasses.replace(cfg, crop_padding=2)" in str(pad)  # a Python caller: the call that fixes it


def _bad_configs() -> dict[str, dict]:
    """One refused TrainConfig per validation rule: the field each is refused by -> the changes to the tiny preset."""
    from vitlab.train.config import PRESETS

    mpp = PRESETS["mpp_cifar10"]
    return {"lr": {"lr": -1}, "batch_size": {"batch_size": 0}, "bf16": {"bf16": "no"}, "seed": {"seed": 1.5},
            "optimizer": {"optimizer": "lamb"}, "schedule": {"schedule": "step"}, "flip": {"flip": "up"},
            "crop_pad_mode": {"crop_pad_mode": "x"}, "eval_tta": {"eval_tta": 3}, "distill": {"distill": "x"},
            "distill_tta": {"distill_tta": 1}, "objective": {"objective": "x"}, "randaugment": {"randaugment": "m9"},
            "keep_best": {"keep_best": True, "eval_every": 0}, "min_lr": {"lr": 1e-4, "min_lr": 1e-3},
            "warmup_epochs": {"warmup_epochs": 3}, "mixup_prob": {"mixup_prob": 0.5, "mixup_alpha": 0,
                                                                  "cutmix_alpha": 0},
            "lookahead_every": {"lookahead_every": -1}, "lookahead_decay": {"lookahead_decay": 1},
            "lookahead_power": {"lookahead_power": -1}, "progressive_fraction": {"progressive_fraction": 1},
            "progressive_epochs": {"progressive_epochs": 1}, "progressive_size": {"progressive_size": 7},
            "full_token_epochs": {"full_token_epochs": 1}, "whiten_bias_epochs": {"whiten_bias_epochs": 1},
            "fig7_every": {"fig7_every": 1, "objective": "mpp", "model": mpp.model, "label_smoothing": 0,
                           "ema_decay": None},
            "label_smoothing": {"objective": "mpp", "model": mpp.model, "label_smoothing": 0.1}}


@pytest.mark.parametrize("field", sorted(_bad_configs()))
def test_every_config_refusal_names_its_field_and_the_command_line_finds_its_flag(field):
    """TrainConfig's validation refuses each bad value by its field (err.param, a TrainConfig field), and the train
    command writes that field as a flag found through its parser: --set FIELD=VALUE, or the flag whose dest it is
    (--epochs, --data)."""
    from vitlab.train.config import PRESETS, TrainConfig

    e = _refusal(lambda: dataclasses.replace(PRESETS["tiny"], **_bad_configs()[field]))
    assert isinstance(e, ValueError) and (e.param, e.config) == (field, True)
    assert e.param.partition(".")[0] in {f.name for f in dataclasses.fields(TrainConfig)}
    parser = command_parser(build_parser(), "train")
    words = setting_words(parser)([e.setting])
    action = flag_for(parser, e.param)
    assert words.startswith(f"{action.option_strings[-1]} " if action else f"--set {e.param}="), words
    for fix in e.fix:  # every fix a flag too
        for s in (fix if isinstance(fix, tuple) else (fix,) if isinstance(fix, Setting) else ()):
            assert setting_words(parser)([s]).startswith(("--set ", "--")), s


def test_every_train_config_refusal_is_one_a_parser_flag_can_name():
    """Every ParameterError that train_config.py raises names a TrainConfig field (or a field of its model config)
    as a literal, so that the command line finds its flag (the parametrised test above triggers them); no bare
    ValueError is left whose words would name a field only in prose."""
    from vitlab.train.config import TrainConfig

    tree = ast.parse((PACKAGE / "train" / "config.py").read_text())
    # a refusal is raised directly or by a field check of vitlab.base.checks, which raises one too
    refusers = {"ParameterError", "check_int", "check_real", "check_flag", "check_choice", "check_tta_level"}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in refusers]
    raised_bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
                   and getattr(n.exc.func, "id", "") == "ValueError"]
    assert len(calls) >= 30 and raised_bare == []
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    literal = [c.args[0].value for c in calls if isinstance(c.args[0], ast.Constant)]
    assert all(p.partition(".")[0] in fields for p in literal), literal
    assert all(any(k.arg == "config" for k in c.keywords) for c in calls)  # each says it is a config field


_METHODS = ("replace", "translate", "removeprefix", "removesuffix", "split", "rsplit", "partition", "rpartition")


def _rewritten(node: ast.Call, functions: set[str]) -> list[ast.AST]:
    """What a call rewrites as text: the string a str method (replace, split, ...) is called on, ``re.sub``'s
    arguments, or the arguments of a call of one of ``functions``; [] for any other call."""
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in _METHODS:
        return [f.value]
    if isinstance(f, ast.Attribute) and f.attr in ("sub", "subn") and getattr(f.value, "id", "") == "re":
        return list(node.args)
    if getattr(f, "id", getattr(f, "attr", None)) in functions:
        return [*node.args, *(k.value for k in node.keywords)]
    return []


def _reads(nodes: list[ast.AST], names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for a in nodes for n in ast.walk(a))


def _text_rewriters(trees: list[ast.AST]) -> set[str]:
    """The functions that rewrite one of their own parameters' text (as ``cli_words(message)`` did)."""
    out = set()
    for tree in trees:
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = {a.arg for a in (*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs)}
                if any(_reads(_rewritten(n, set()), params) for n in ast.walk(f) if isinstance(n, ast.Call)):
                    out.add(f.name)
    return out


def _message_rewrites(tree: ast.AST, functions: set[str]) -> list[int]:
    """Lines where a caught exception (``except ... as e``), or its text, goes to a rewriter or a rewriting function."""
    return [n.lineno for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name
            for stmt in h.body for n in ast.walk(stmt)
            if isinstance(n, ast.Call) and _reads(_rewritten(n, functions), {h.name})]


_TREES = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
_FUNCTIONS = _text_rewriters(list(_TREES.values()))


@pytest.mark.parametrize("path", sorted(_TREES), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_rewrites_an_error_message(path):
    """No code reads its own errors' prose back: no caught exception (``except ... as e``) or its text goes to a
    string rewriter (re.sub, str.replace, split, ...) or to a function that rewrites its text argument, anywhere in
    vitlab. Errors carry fields; the command line writes them anew."""
    bad = _message_rewrites(_TREES[path], _FUNCTIONS)
    assert bad == [], f"{path.name} rewrites an error's text at lines {bad}"


def test_the_rewriting_check_catches_cli_words():
    """The check above fails on what it forbids: main handing str(e) to cli_words, which rewrote it with
    str.replace and re.sub; and a handler that rewrites the text itself."""
    code = ("import re\n"
            "def cli_words(message):\n    message = re.sub('x', 'y', message)\n    return message.replace('a', 'b')\n"
            "def main():\n    try:\n        run()\n    except ValueError as e:\n        print(cli_words(str(e)))\n"
            "    except OSError as err:\n        print(str(err).split(':')[0])\n")
    tree = ast.parse(code)
    assert _text_rewriters([tree]) == {"cli_words"}
    assert _message_rewrites(tree, {"cli_words"}) == [9, 11]


def test_set_fixes_paste_into_a_shell(tmp_path):
    """Each --set of a refusal pastes as one shell word whose value parse_value reads back as the Python value: a
    path with a space and quotes, a list, a text JSON would read as a number or null, None, True."""
    from vitlab.base.errors import ParameterError
    from vitlab.data.datasets import ImageArray
    from vitlab.train.config import PRESETS
    from vitlab.train.loop import _check_image_size, _diverged

    def pasted(e: Refusal) -> dict:
        words = shlex.split(_cli(e, "train").partition("; fix: ")[2])  # the problem's words quote nothing
        return {k: parse_value(v) for w, nxt in zip(words, words[1:]) if w == "--set" for k, _, v in
                [nxt.rstrip(",").partition("=")]}

    ck = tmp_path / "my runs" / "it's \"x\"" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    assert pasted(_diverged(float("nan"), 3, 7, ck, PRESETS["tiny"]))["init_from"] == str(ck)
    rect = ImageArray(torch.zeros(4, 16, 24, 3, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), ("a",), "s")
    assert pasted(_refusal(lambda: _check_image_size(PRESETS["tiny"], rect, rect)))["model.img_size"] == [16, 24]
    values = {"teacher": "123", "init_from": "null", "c": None, "d": True, "e": "a\\b"}
    made = ParameterError("lr", 1, "x", config=True, fix=[tuple(Setting(k, v, True) for k, v in values.items())])
    assert pasted(made) == values


def test_the_error_line_names_the_flag_and_the_fix(capsys):
    """As a user reads it: `vitlab train --set lr=-1` says which flag and what it must be, exit status 1."""
    assert main(["train", "--preset", "tiny", "--set", "lr=-1"]) == 1
    assert capsys.readouterr().err == "vitlab train: ParameterError: --set lr=-1: must be a number >= 0\n"
    assert main(["train", "--preset", "tiny", "--set", "bf16=no"]) == 1
    assert capsys.readouterr().err.endswith("--set bf16=no: must be true or false; fix: --set bf16=false\n")


def test_the_compile_refusal_names_the_flags(tmp_path, capsys):
    from vitlab.train.config import PRESETS
    from vitlab.train.loop import train

    e = _refusal(lambda: train(PRESETS["mpp_cifar10"], tmp_path / "run", progress=False, compile=True))
    assert (e.param, e.value, e.fix) == ("compile", True, (Setting("compile", None), Setting("compile", False)))
    assert _cli(e, "train").startswith("--compile on: ") and _cli(e, "train").endswith(
        "fix: --compile auto, or --compile off")
