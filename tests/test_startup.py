"""A command line that starts fast and stops cleanly: ``vitlab --help``, a subcommand's ``--help`` and an argument
error load no torch, timm or plotly (``import vitlab`` loads its public names on first use), and Ctrl-C at any point
of ``main`` is a one-line message and status 130."""

from __future__ import annotations

import importlib.abc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vitlab
from vitlab.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "timm", "plotly", "numpy", "sklearn", "PIL", "safetensors", "scipy")


def _python(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter that imports this checkout's vitlab."""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_help_and_argument_errors_load_no_torch():
    action = next(a for a in build_parser()._actions if a.dest == "command")
    argvs = [["--help"], [], ["nonsense"], ["probe", "--data", "cifar10", "--shots", "0"], ["train", "--epochs", "x"],
             ["train", "--preset", "vit_cifar1O"], ["train", "--set", "nosuchfield=1"],
             # refusals of the options alone, before any work (exit status 1)
             ["train", "--preset", "tiny", "--set", "epochs=0"],
             ["export", "--run-dir", "r", "--out", "r/x", "--command-line", "c"],
             ["export", "--run-dir", "r", "--out", "x", "--command-line", "c", "--goal", "90"],
             ["probe", "--data", "cifar10", "--l2", "-1"], ["sweep", "--table", "--tune"],
             ["mpp-study", "--run-root", "README.md"], ["capture", "--out", "vitlab"],
             ["sweep", "--config", "no_such_sweep"], ["sweep", "--config", "quick", "--shots", "3"],
             ["probe", "--data", "README.md", "--json", "README.md"],  # an input: its own data
             ["capture", "--weights", "README.md", "--out", "README.md"],
             *([cmd, "--help"] for cmd in action.choices)]
    script = ("import contextlib, io, json, sys\nfrom vitlab.cli import main\ncodes = []\n"
              f"for argv in {argvs!r}:\n"
              "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
              "        try:\n            codes.append(main(argv))\n        except SystemExit as e:\n            codes.append(e.code)\n"
              f"print(json.dumps([codes, sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))]))")
    codes, heavy = json.loads(_python(script).stdout)
    assert codes == [0, 2, 2, 2, 2, 2, 2] + [1] * 11 + [0] * len(action.choices)  # each ended as it should, before any work
    assert heavy == [], f"the parser loaded {heavy}"


@pytest.mark.parametrize("module", ["base.choices", "models.config", "train.config", "studies.sweep_config"])
def test_the_configs_load_no_torch(module):
    """The modules the command line reads its presets and checks its options with import nothing heavy."""
    script = (f"import sys, vitlab.{module}\n"
              f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    assert _python(script).stdout.split() == ["[]"]


def test_an_unknown_preset_names_the_presets(capsys):
    from vitlab.train.config import PRESETS

    assert main(["train", "--preset", "vit_cifar1O"]) == 2
    assert capsys.readouterr().err == f"unknown preset 'vit_cifar1O'; choose one of {', '.join(sorted(PRESETS))}\n"


def test_public_names_load_on_first_use():
    """``import vitlab`` loads no torch; each name of ``__all__`` then resolves to its module's object, ``dir`` lists
    them, a submodule is reached by its name as before, and an unknown name is an AttributeError naming it."""
    script = f"""
import sys, vitlab
heavy = lambda: sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))
assert heavy() == [], heavy()
try:
    vitlab.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e) and "vitlab" in str(e), e
else:
    raise AssertionError("no AttributeError")
assert not hasattr(vitlab, "_private") and heavy() == [], heavy()
assert set(vitlab.__all__) <= set(dir(vitlab)), set(vitlab.__all__) - set(dir(vitlab))
assert not [n for n in dir(vitlab) if n in ("importlib", "Any", "TYPE_CHECKING") or n[0] == "_" != n[1]], dir(vitlab)
from vitlab import attention_rollout
import vitlab.inspect
assert attention_rollout is vitlab.attention_rollout is vitlab.inspect.attention_rollout
for name in vitlab.__all__:
    assert getattr(vitlab, name).__name__ == name, name
import vitlab.models.zoo
assert vitlab.ViTConfig is vitlab.models.config.ViTConfig and vitlab.build_model is vitlab.models.zoo.build_model
assert not hasattr(vitlab.models.zoo, "vit_config")  # the configs' names have one home, vitlab.models.config
print(type(vitlab.models.checkpoint).__name__)
"""
    assert _python(script).stdout.split() == ["module"]


def test_an_unknown_name_in_this_process_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'vitlab' has no attribute 'attention_rolout'"):
        vitlab.attention_rolout


def test_a_private_submodule_is_no_attribute_of_the_package():
    """Only public names load on first use: ``vitlab.__main__`` (the command's entry, which imports the CLI) is no
    attribute, so a probe such as ``hasattr(vitlab, "__main__")`` imports nothing."""
    assert not hasattr(vitlab, "__main__")
    with pytest.raises(AttributeError, match="no attribute '__main__'"):
        vitlab.__main__


def test_ctrl_c_while_the_parser_is_built_is_a_message_and_status_130(monkeypatch, capsys):
    import vitlab.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(vitlab.cli, "build_parser", interrupted)
    try:
        status = main(["info"])
    except KeyboardInterrupt:  # let through, it would stop pytest itself
        pytest.fail("main let Ctrl-C through: a traceback")
    assert status == 130
    assert capsys.readouterr().err == "vitlab: interrupted\n"


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C pressed while ``name`` is being imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_a_command_imports_its_modules_is_a_message_and_status_130(monkeypatch, capsys, tmp_path):
    """The heavy imports run inside the command's function, under main's handling of Ctrl-C."""
    monkeypatch.delitem(sys.modules, "vitlab.train.export", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport("vitlab.train.export"), *sys.meta_path])
    argv = ["export", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--command-line", "c"]
    try:
        status = main(argv)
    except KeyboardInterrupt:
        pytest.fail("main let Ctrl-C through: a traceback")
    assert status == 130
    err = capsys.readouterr().err
    assert err == "vitlab export: interrupted\n" and not list(tmp_path.iterdir())


def test_benchmarks_start_up_table_quotes_its_json():
    """BENCHMARKS.md's start-up table is what benchmarks/cli_startup.py printed for the kept result, and its
    prose names that result's date and load."""
    from benchmarks.cli_startup import format_table

    res = json.loads((ROOT / "benchmarks" / "results" / "cli_startup.json").read_text())
    text = " ".join((ROOT / "BENCHMARKS.md").read_text().split())
    assert " ".join(format_table(res).split()) in text
    assert f"{res['machine']['date']}, {res['machine']['cpu']}," in text and f"at the start {res['machine']['load_average']})" in text
    assert res["median_s"]["help"] < res["median_s"]["import_torch_timm"]


def test_python_m_vitlab_is_the_command():
    """``python -m vitlab`` runs the ``vitlab`` command (a venv whose scripts are not on PATH): its help, its prog name
    and its exit status for a bad argument; still without torch."""
    ok = subprocess.run([sys.executable, "-m", "vitlab", "--help"], capture_output=True, text=True, timeout=300,
                        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ok.returncode == 0 and ok.stdout.startswith("usage: vitlab ") and "reproduce" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-X", "importtime", "-m", "vitlab", "nonsense"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "invalid choice: 'nonsense'" in bad.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in bad.stderr.splitlines() if line.startswith("import time:")}
    assert "vitlab.cli" in loaded and not loaded & set(HEAVY)  # -X importtime lists every module loaded
