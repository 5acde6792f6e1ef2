"""The package's architecture, checked from the code: every module of vitlab/ lies in one layer (a sub-package),
imports only from its own layer or the layers below it, and no two modules import each other, even through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "vitlab"

#: The sub-packages from the bottom up; vitlab/__init__.py (the public face) and __main__.py sit above them all.
LAYERS = ("base", "figures", "models", "data", "inspect", "train", "probe", "studies", "findings", "report", "app", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The vitlab modules ``name`` imports anywhere in its body (also inside functions): a ``from X import y`` counts
    as X.y when that is a module, else as X."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "vitlab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "vitlab":
                out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    out.discard(name)
    return out


def layer(name: str) -> int:
    """The index of a module's layer in LAYERS; len(LAYERS) for the package's top (vitlab, vitlab.__main__)."""
    parts = name.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1])


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) & set(mods) for n, p in mods.items()}


def test_every_module_lies_in_a_layer():
    entries = sorted(p.name for p in ROOT.iterdir() if not p.name.startswith(("_", ".")) or p.name in
                     ("__init__.py", "__main__.py"))
    outside = [e for e in entries if e.removesuffix(".py") not in LAYERS
               and e not in ("__init__.py", "__main__.py", "py.typed")]
    assert outside == []
    assert len(entries) <= 15


def test_no_module_imports_from_a_layer_above_it():
    g = graph()
    upward = sorted((a, b) for a, deps in g.items() for b in deps if layer(b) > layer(a))
    assert upward == []


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package's __init__ that gathers its modules is the package's face, not a cycle with them
    g = {a: {b for b in deps if not a.startswith(b + ".")} for a, deps in graph().items()}
    assert cycles(g) == []


@pytest.mark.parametrize("g, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_cycles_finds_known_cycles(g, expected):
    assert cycles(g) == expected


def test_layer_of_known_modules():
    assert layer("vitlab.base.atomic") == 0 and layer("vitlab.cli") == LAYERS.index("cli")
    assert layer("vitlab") == layer("vitlab.__main__") == len(LAYERS)
