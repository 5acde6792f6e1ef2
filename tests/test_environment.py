"""environment.yml (conda) must list exactly what pyproject.toml asks pip for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"torch": "pytorch", "kaleido": "python-kaleido", "ray": "ray-core"}  # PyPI name -> conda-forge name where they differ


def _split(req: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req)
    assert m, req
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():  # every extra: the Makefile installs them all
        wanted += extra
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = {}
    pip_section = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip_section = dep["pip"]
            continue
        name, spec = _split(dep)
        conda[name] = spec
    expected = {}
    for req in wanted:
        name, spec = _split(req)
        expected[CONDA_NAMES.get(name, name)] = spec
    python_spec = project["requires-python"].replace(" ", "")
    assert conda.pop("python") == python_spec
    conda.pop("pip")
    assert conda == expected
    assert pip_section == ["-e ."]
