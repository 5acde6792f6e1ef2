"""The notebooks: paired with their py:percent sources, parameterised, and executed in smoke mode."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))


def test_every_experiment_has_a_notebook():
    names = " ".join(p.stem for p in SOURCES)
    for topic in ("tour", "patch_embedding", "position", "attention_distance", "rollout", "few_shot", "scaling",
                  "masked_patch", "similarity", "heads_and_tokens"):
        assert topic in names


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_sources_are_jupytext_notebooks_with_one_parameters_cell(src):
    py = jupytext.read(src)
    assert "py:percent" in py.metadata["jupytext"]["formats"]  # JupyterLab opens it as a notebook through jupytext
    params = [c for c in py.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "VITLAB_SMOKE" in params[0].source


def test_only_the_py_sources_are_tracked():
    """Outputs never enter git: the .ipynb a user's JupyterLab writes beside a source is ignored."""
    import subprocess

    root = NOTEBOOKS.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=root, capture_output=True, text=True).stdout.split()
    assert tracked and not [t for t in tracked if t.endswith(".ipynb")]
    ignored = subprocess.run(["git", "check-ignore", "notebooks/00_tour.ipynb"], cwd=root, capture_output=True)
    assert ignored.returncode == 0


_EXECUTED: dict[str, object] = {}


def _smoke_run(stem: str):
    """Notebook ``stem`` executed in smoke mode, once per test process: the smoke test, the HTML export and the
    checks of its printed text below all read this one run (each notebook is the slowest part of its tests; `make
    test`'s pytest-xdist keeps a file's tests on one worker, ``--dist loadfile``)."""
    if stem not in _EXECUTED:
        nb = jupytext.read(NOTEBOOKS / f"{stem}.py")
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute(
            env={**os.environ, "VITLAB_SMOKE": "1", "OMP_NUM_THREADS": "1"})
        _EXECUTED[stem] = nb
    return _EXECUTED[stem]


def _smoke_output(stem: str) -> str:
    """The printed text of notebook ``stem`` run in smoke mode (``_smoke_run``)."""
    return "".join(o.get("text", "") for c in _smoke_run(stem).cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.output_type == "stream")


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_runs_in_smoke_mode(src):
    nb = _smoke_run(src.stem)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_html_export_keeps_the_plotly_figures():
    nbconvert = pytest.importorskip("nbconvert")
    html, _ = nbconvert.HTMLExporter().from_notebook_node(_smoke_run("02_position_embeddings"))
    assert "not able to be represented" not in html
    assert html.count("Plotly.newPlot") >= 1 and "plotly" in html.lower()


def test_few_shot_notebook_says_what_it_probed():
    """The table's 'all' row is a logistic regression on the probed subset, not on the whole training split: the
    notebook names the data and both subset sizes (it printed the table alone)."""
    out = _smoke_output("05_few_shot_probing")
    assert "embedded default on shapes: class-balanced subsets of 200 of its " in out
    assert "(the 'all' row: these 200 training images)" in out



def test_few_shot_notebook_says_what_its_table_measures_after_the_fallback(tmp_path):
    """Without CIFAR-10 the notebook probes the synthetic shapes; its text said the default 'is probed on the classes
    it was trained on' all the same. The line under the table now follows what was probed: transfer here."""
    nb = jupytext.read(NOTEBOOKS / "05_few_shot_probing.py")
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute(
        env={**os.environ, "VITLAB_SMOKE": "1", "OMP_NUM_THREADS": "1",
             "VITLAB_PROBE_DATA": f"cifar10:{tmp_path / 'none'}"})  # a CIFAR-10 that is not there
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.output_type == "stream")
    assert "embedded default on shapes: " in out  # it fell back
    assert "what the table measures: transfer. the embedded default was trained on cifar10, not on shapes" in out
    assert "what the table measures: separability" not in out


def test_rollout_notebook_scores_localisation_as_the_report_does():
    """The report read rollout's mass on the object as 0.143 on 32 shapes where notebook 04 read 0.133 on 64 (the
    random map's pointing game: 25% and 42%): both now measure with shapes_localisation on LOCALISATION_SHAPES, and
    the notebook's smoke run (8 shapes) prints the report's own rows for those 8 and names the report's sample."""
    import inspect

    from vitlab.base.provenance import versions
    from vitlab.data.shapes import LOCALISATION_SHAPES
    from vitlab.models.load import SHAPES_CHECKPOINT
    from vitlab.report import sections as S

    assert inspect.signature(S.localisation).parameters["n"].default == LOCALISATION_SHAPES
    out = _smoke_output("04_attention_rollout")
    rows = S.localisation(SHAPES_CHECKPOINT, versions(), n=8).metrics["methods"]
    assert len(rows) == 5
    for r in rows:
        assert f"{r['method']:22s} mass in object {r['mass_in_mask']:.3f}  pointing {r['pointing']:.3f}" in out
    assert f"8 test shapes (seed 1; the report scores {LOCALISATION_SHAPES})" in out


def test_filters_notebook_gives_the_reports_statistics():
    """Notebook 01 judged the filters against 5 random draws where the report drew 20 ('filters structured' read
    0.181 and 0.182): each verdict of the report's filters section has the same statistic in the notebook's table."""
    import vitlab
    from vitlab.base.intervals import fmt_value
    from vitlab.findings.judge import model_label
    from vitlab.report import sections as S

    out = _smoke_output("01_patch_embedding_pca")  # the embedded default, as the report's default
    net = vitlab.load_model()
    inp = S.Inputs(net, vitlab.model_info(net), [], None, [], {"model": "embedded default", "versions": {}},
                   name=model_label(net, None))
    verdicts = S.filters(inp).verdicts  # the filters section reads the weights alone
    assert len(verdicts) == 2 and verdicts[0].subject == "vit_cifar10 (embedded default), weights alone"
    for v in verdicts:
        row = next(line for line in out.splitlines() if line.startswith(v.finding))
        assert f"  {fmt_value(v.statistic)} [" in row, (row, v.statistic)
        assert f"  {v.subject}  " in row, (row, v.subject)  # the row names what it judges, as the report's does

def test_mpp_notebook_marks_fixed_position_tables():
    """The smoke study's three models share one fixed 2D sin-cos table, so 'scratch' shows the same grid structure as
    the trained models; the line says so instead of leaving the notebook's 'a random initialisation's position
    embeddings carry no grid structure' to contradict the numbers."""
    line = next(t for t in _smoke_output("07_masked_patch_prediction").splitlines()
                if t.startswith("position-embedding rank correlation"))
    assert line.count("(a fixed 2D sin-cos table, not learned)") == 3 and "scratch " in line
    source = (NOTEBOOKS / "07_masked_patch_prediction.py").read_text()
    assert "its position\n# embeddings carry no grid structure" not in source


def test_mpp_notebook_budget_line_never_says_zero_hours():
    """The smoke study's MPP run takes seconds: its budget read 'in 0.00 h (the supervised run trained 241x as
    long)'; a run under 36 s is now given in seconds."""
    line = next(t for t in _smoke_output("07_masked_patch_prediction").splitlines() if t.startswith("Budgets:"))
    assert "0.00 h" not in line and re.search(r"without labels in \d+ s \(the supervised run trained \d+x", line)



def test_heads_and_tokens_notebook_formats_what_the_analysis_layers_compute():
    """Notebook 10 reads the head atlas and token diagnostics from vitlab.inspect and vitlab.findings, never from
    the report, and its sentences carry their numbers: the smoke run's rollout and prefix-share lines for the default
    and for the random-init register model are those of the same functions on the same 16 images, and both
    ablations' local-minus-global lines are printed."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    import vitlab
    from vitlab.base.intervals import fmt_value
    from vitlab.data.images import default_images
    from vitlab.findings import atlas as FA
    from vitlab.inspect.tokens import rollout_prefix_change

    source = (NOTEBOOKS / "10_heads_and_tokens.py").read_text()
    assert "vitlab.report" not in source
    out = _smoke_output("10_heads_and_tokens")
    model = vitlab.load_model()
    info = vitlab.model_info(model)
    _, x, _ = default_images(model, 16)
    torch.manual_seed(0)
    registers = VisionTransformer(img_size=info.img_size, patch_size=info.patch_size, embed_dim=info.embed_dim,
                                  depth=info.depth, num_heads=info.num_heads, reg_tokens=4, num_classes=10).eval()
    for label, net in (("vit_cifar10 (embedded default)", model), ("random-init ViT with 4 registers (seed 0)",
                                                                   registers)):
        r = FA.rollout_convention_change(rollout_prefix_change(net, x, batch_size=8))["spearman"]
        line = next(t for t in out.splitlines() if t.startswith(f"{label}: the layers' head-mean distances"))
        assert (f"Spearman {fmt_value(r['mean'])} [{fmt_value(r['interval'][0])}, {fmt_value(r['interval'][1])}]"
                in line), line
        share = vitlab.prefix_attention(net, x, batch_size=8, progress=False).nansum(-1).mean(1)
        p = vitlab.model_info(net).num_prefix_tokens
        line = next(t for t in out.splitlines() if t.startswith(f"{label}: the {p} prefix tokens"))
        assert f"take {fmt_value(float(share[0]))} of the attention in layer 1" in line, line
    for ablation in ("mean", "zero"):
        assert re.search(rf"^{ablation} ablation, local minus global: -?[0-9.e-]+ nats per head \[", out, re.M)


def test_scaling_notebook_draws_and_judges_locality_along_the_data_axis():
    """Notebook 06 judges the lowest layer's locality of every attention family its sweep recorded Fig. 7 statistics
    for, with the figure and the controls: the smoke sweep's ViT at its two sizes."""
    from vitlab.findings import controls
    from vitlab.findings.studies import LOCALITY

    nb = _smoke_run("06_data_scaling")
    out = _smoke_output("06_data_scaling")
    assert f"{LOCALITY}  sweep quick: vit_tiny at 40 and 80 images" in out
    assert f"control {controls.MORE_LOCAL!r} (positive)" in out and f"control {controls.SAME_LOCAL!r} (negative)" in out
    # what the intervals allow, in the words of vitlab.findings.studies.study_words (the report's)
    assert "vit_tiny - bit_tiny 5-shot accuracy, paired by seed (mean [95% interval] over seeds, points): " in out
    assert "The change of the vit_tiny - bit_tiny gap from 40 to 80 images (Fig. 3/4): " in out
    titles = [str(o["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"]) for c in nb.cells
              if c.cell_type == "code" for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert any(t.startswith("The lowest layer's attention distance against pre-training images") for t in titles)
