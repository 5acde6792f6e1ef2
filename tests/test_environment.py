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


def test_every_package_the_code_imports_is_declared():
    """Each third-party module imported anywhere in vitlab/, benchmarks/ or tests/ belongs to a distribution that
    pyproject.toml names (core or an extra), not one that only arrives as another package's dependency."""
    import ast
    import importlib.metadata as md
    import sys

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_split(r)[0] for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_split(r)[0] for r in extra}
    dists = md.packages_distributions()
    local = {"vitlab", "benchmarks", "conftest", "_reference"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
    missing = {}
    for folder in ("vitlab", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in local:
                        continue
                    owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                    if not owners & declared:
                        missing.setdefault(top, str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml (module: first file): {missing}"
