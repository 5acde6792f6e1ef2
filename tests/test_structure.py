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


@pytest.mark.parametrize("module", ["base/atomic", "base/modes", "base/provenance", "base/errors", "figures/static",
                                    "base/choices", "base/shipped"])
def test_bottom_modules_import_nothing_else_from_vitlab(module):
    own = _imports(PACKAGE / f"{module}.py")
    # only the bottom modules beneath this one: the errors (a full disk is a DiskFullError for atomic writes and
    # static export), atomic writes (static export), the default's place (choices, and provenance's package folder)
    beneath = {"base/atomic": {"vitlab.base.errors"}, "figures/static": {"vitlab.base.errors", "vitlab.base.atomic"},
               "base/choices": {"vitlab.base.shipped"}, "base/provenance": {"vitlab.base.shipped"}}
    assert [m for m, _, _ in own if m not in beneath.get(module, set())] == [], own


def layout_sections(text: str) -> dict[str, str]:
    """The Layout block of docs/layout.md by folder: {"base/": its lines, ..., "vitlab/": the package's top}."""
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3: block.index("```", block.index("```") + 3)]
    out: dict[str, str] = {}
    key = ""
    for line in filter(str.strip, block.splitlines()):
        if line[:1].strip():
            key = line.split()[0]
        out[key] = out.get(key, "") + line + "\n"
    return out


def test_the_docs_layout_names_every_module():
    """The Layout block of docs/layout.md is where a reader finds which file holds what: every module of vitlab/ is
    named there under its folder (a new module left out of it had happened five times)."""
    sections = layout_sections((ROOT / "docs" / "layout.md").read_text())
    missing = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE)
        folder = "vitlab/" if len(rel.parts) == 1 else f"{rel.parts[0]}/"
        if rel.name != "__init__.py" or folder == "report/":
            missing += [str(rel)] if p.name not in sections.get(folder, "") else []
    assert missing == []


def test_layout_sections_split_by_folder():
    text = "## Layout\n```\nbase/   a.py, b.py\n        c.py\nmodels/ d.py\n```\n"
    assert layout_sections(text) == {"base/": "base/   a.py, b.py\n        c.py\n", "models/": "models/ d.py\n"}


#: the longest function vitlab/ may hold, in lines from its ``def`` to its last line (issue 47: a reader takes a
#: function in at once; a longer one is split into named steps)
MAX_FUNCTION_LINES = 80


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function or method in ``source`` (nested ones too) longer than ``limit`` lines,
    decorators not counted."""
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_in_vitlab_is_longer_than_80_lines():
    long = [(str(p.relative_to(ROOT)), name, n) for p in sorted(PACKAGE.rglob("*.py"))
            for name, n in long_functions(p.read_text())]
    assert long == []


def test_long_functions_counts_from_def_to_the_last_line_methods_and_nested_ones_too():
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    source = (f"@decorator\ndef three():\n{body}\n"
              f"class C:\n    async def method(self):\n{body.replace('    ', '        ')}"
              f"        def inner():\n            return 1\n")
    assert long_functions(source, limit=3) == [("three", 4), ("method", 6)]
    assert long_functions(source, limit=4) == [("method", 6)]
