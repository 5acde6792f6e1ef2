"""The house rules that a reader relies on: no module reaches into another's private names, the report is a
leaf, and the bottom modules import nothing from the rest of vitlab."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vitlab"


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) for every ``from vitlab... import name`` and ``import vitlab...`` in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vitlab":
            out += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "vitlab"]
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_names_imported_across_modules(path):
    me = _module_name(path)
    bad = [f"line {line}: from {mod} import {name}" for mod, name, line in _imports(path)
           if name.startswith("_") and not name.startswith("__") and mod != me]
    assert not bad, f"{path.relative_to(ROOT)} imports private names of other modules: {bad}"


def test_report_is_a_leaf():
    users = sorted({_module_name(p) for p in SOURCES + sorted((ROOT / "notebooks").glob("*.py"))
                    for mod, _, _ in _imports(p) if mod == "vitlab.report" or mod.startswith("vitlab.report.")})
    outside = [u for u in users if u != "vitlab.report" and not u.startswith(("vitlab.report.", "vitlab.cli."))
               and not u.startswith("benchmarks.")]  # top-level consumers: the CLI, and a benchmark that times it
    assert outside == [], f"only the CLI, benchmarks and the report's own modules may import vitlab.report: {outside}"


@pytest.mark.parametrize("module", ["atomic", "modes", "provenance", "errors", "static", "choices", "shipped"])
def test_bottom_modules_import_nothing_else_from_vitlab(module):
    own = _imports(PACKAGE / f"{module}.py")
    # at most ``import vitlab`` for its version, and the bottom modules beneath this one: the errors (a full disk is
    # a DiskFullError for atomic writes and static export), atomic writes (static export), the default's place
    beneath = {"atomic": {"vitlab.errors"}, "static": {"vitlab.errors", "vitlab.atomic"}, "choices": {"vitlab.shipped"}}
    below = {"vitlab"} | beneath.get(module, set())
    assert [m for m, _, _ in own if m not in below] == [], own


def test_the_docs_layout_names_every_module():
    """The Layout block of docs/layout.md is where a reader finds which file holds what: every module and subpackage
    of vitlab/ is named there (a new module left out of it had happened five times)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[: block.index("```", block.index("```") + 3)]
    names = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    missing = sorted(n for n in names if n not in block)
    assert not missing, f"docs/layout.md's Layout block does not name {missing}"
