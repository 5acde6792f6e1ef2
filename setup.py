"""The build step pyproject.toml cannot say: a wheel carries the shipped files the default analyses need
(``vitlab.base.shipped.EMBEDDED``, kept in the checkout's ``data/``) as package data in ``vitlab/_embedded/``, so that a
plain ``pip install`` runs ``vitlab reproduce`` offline. An editable install reads them from ``data/`` instead.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def embedded() -> tuple[str, ...]:
    """``EMBEDDED`` as vitlab/base/shipped.py states it, read without importing vitlab."""
    tree = ast.parse((ROOT / "vitlab" / "base" / "shipped.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "EMBEDDED":
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("vitlab/base/shipped.py defines no EMBEDDED")


class BuildWithEmbedded(build_py):
    """build_py, then copy each ``data/REL`` of ``EMBEDDED`` to ``vitlab/_embedded/REL`` in the build folder."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads data/ in place
            return
        target = Path(self.build_lib) / "vitlab" / "_embedded"
        shutil.rmtree(target, ignore_errors=True)  # nothing left from an earlier build's list
        for rel in embedded():
            src = ROOT / "data" / rel
            if src.is_dir():
                shutil.copytree(src, target / rel)
            elif src.is_file():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / rel)
            else:
                raise FileNotFoundError(f"the wheel needs data/{rel} (vitlab.base.shipped.EMBEDDED), which this checkout "
                                        "lacks: train or restore it before building the wheel")


setup(cmdclass={"build_py": BuildWithEmbedded})
