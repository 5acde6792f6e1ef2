"""A plain wheel carries the embedded default: built from this checkout's sources, installed without its
dependencies into a fresh venv that sees the dependencies of this environment but neither the checkout nor its
editable install, ``vitlab info`` (and, slow, ``vitlab reproduce``) run from a folder outside the checkout with
every network request refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from vitlab.base.shipped import EMBEDDED

ROOT = Path(__file__).resolve().parents[1]
#: what an sdist of vitlab holds, and so all a wheel is built from
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "vitlab", "data")
MAX_WHEEL_BYTES = 25 * 1000 * 1000


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: nothing of this checkout's build/ or a stale vitlab/_embedded gets in
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "_embedded"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # offline: any request through a proxy-aware client fails at once; the hub is told it is offline
    env.update({k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
               no_proxy="", NO_PROXY="", HF_HUB_OFFLINE="1", PIP_NO_INDEX="1", VITLAB_CACHE=str(tmp / "cache"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(tmp / "dist"), str(src)], tmp, env)
    (wheel,) = (tmp / "dist").glob("vitlab-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         tmp, env)
    # the dependencies: this environment's site-packages as a plain path, so that its .pth files (the editable
    # install's finder among them) are not run
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env)
                .stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    home = tmp / "elsewhere"
    home.mkdir()
    return {"wheel": wheel, "venv": venv, "py": py, "site": site, "cwd": home, "env": env}


def test_the_wheel_carries_the_embedded_default_and_stays_small(wheel_env):
    wheel = wheel_env["wheel"]
    assert wheel.stat().st_size <= MAX_WHEEL_BYTES, f"{wheel.name}: {wheel.stat().st_size:,} bytes"
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in EMBEDDED:
        src = ROOT / "data" / rel
        files = [f.relative_to(ROOT / "data").as_posix() for f in src.iterdir() if f.is_file()] if src.is_dir() else [rel]
        missing = [f for f in files if f"vitlab/_embedded/{f}" not in names]
        assert files and not missing, f"the wheel lacks {missing} of data/{rel}"
    assert not [n for n in names if n.startswith("data/") or ("/data/" in n and not n.startswith("vitlab/data/"))]
    # nothing installed outside vitlab/ (vitlab/data/ is the data package)


def test_the_wheel_runs_vitlab_info_outside_the_checkout(wheel_env):
    """The venv imports the wheel's vitlab (not this checkout's), and `vitlab info` loads the embedded default."""
    w = wheel_env
    where = json.loads(_run([str(w["py"]), "-c", "import json, sys, vitlab, vitlab.base.choices as c; print(json.dumps("
                                              "[vitlab.__file__, str(c.DEFAULT_CHECKPOINT), "
                                              "[type(f).__name__ for f in sys.meta_path]]))"],
                            w["cwd"], w["env"]).stdout)
    assert Path(where[0]).is_relative_to(w["site"]), where
    assert Path(where[1]) == w["site"] / "vitlab" / "_embedded" / "checkpoints" / "vit_cifar10"
    assert "_EditableFinder" not in where[2]
    info = json.loads(_run([str(w["venv"] / "bin" / "vitlab"), "info", "--json"], w["cwd"], w["env"]).stdout)
    assert Path(info["checkpoint"]) == Path(where[1]) and info["weights"] == "data/checkpoints/vit_cifar10"
    card = json.loads((ROOT / "data" / "checkpoints" / "vit_cifar10" / "card.json").read_text())
    assert info["card_accuracy"] == card["test_accuracy"]
    assert info["parameters"] > 0 and info["depth"] >= 1


@pytest.mark.slow
def test_the_wheel_reproduces_offline_on_the_embedded_default(wheel_env):
    w = wheel_env
    _run([str(w["venv"] / "bin" / "vitlab"), "reproduce", "--out", "report", "--quiet", "--no-png"], w["cwd"],
         w["env"], timeout=1800)
    metrics = json.loads((w["cwd"] / "report" / "metrics.json").read_text())
    assert metrics["weights"] == "data/checkpoints/vit_cifar10"
    assert metrics["images"].startswith("128 of ")
    slugs = {f["slug"] for f in metrics["figures"]}
    assert {"localisation", "scaling"} <= slugs, slugs  # the embedded shapes ViT and the shipped sweep were read
    assert metrics["shapes_localisation"]
