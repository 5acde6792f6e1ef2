"""The notebooks: paired with their py:percent sources, parameterised, and executed in smoke mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))


def test_every_experiment_has_a_notebook():
    names = " ".join(p.stem for p in SOURCES)
    for topic in ("tour", "patch_embedding", "position", "attention_distance", "rollout", "few_shot", "scaling"):
        assert topic in names


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_paired_and_parameterised(src):
    py = jupytext.read(src)
    ipynb = jupytext.read(src.with_suffix(".ipynb"))
    assert [c.source for c in py.cells] == [c.source for c in ipynb.cells], "run `jupytext --sync notebooks/*.py`"
    params = [c for c in py.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "VITLAB_SMOKE" in params[0].source


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_runs_in_smoke_mode(src, monkeypatch, tmp_path):
    nb = jupytext.read(src)
    monkeypatch.setenv("VITLAB_SMOKE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env={**os.environ})
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
