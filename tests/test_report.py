"""`vitlab reproduce`: every figure stamped and set beside the paper, bad input leaves nothing behind."""

from __future__ import annotations

import html
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import convit_raw_attention, tiny_bit, tiny_convit, tiny_vit

import vitlab
from vitlab.cli import main
from vitlab.data.images import default_images
from vitlab.figures.static import find_chromium
from vitlab.findings import judge

#: the smallest metrics.json that reads as an earlier report's
EARLIER = {"summary": {"vitlab": "0.1"}, "verdicts": [], "figures": [{"slug": "filters"}]}
FIGURES = {"filters", "positions", "positions_resampled", "distance", "rollout", "faithfulness", "faithfulness_curves",
           "readout_attention", "entropy", "head_atlas", "prefix_attention", "token_norms", "few_shot", "scaling", "similarity"}
#: the sections without a figure in a report of a tiny ViT on a few images: no CIFAR-10 for the few-shot probe, too
#: few images (and another preprocessing than the shipped ResNet's) for the CKA section
NO_FIGURE = {"few_shot", "similarity"}


@pytest.fixture
def checkpoint(tmp_path):
    return vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")


@pytest.fixture(scope="module")
def figures_report(tmp_path_factory):
    """``(checkpoint, out, exit code)`` of one `vitlab reproduce` of a one-block ViT-Ti/4 at 32 px on 2 images into
    ``out``, an empty folder made before: every section but the few-shot probe (the shipped shapes model's
    localisation table too), each figure written as PNG and SVG where a Chromium is found. Made once for the tests of
    what a run does around the model (its folder, its static figures, the shapes table), which read nothing of its
    depth: the map methods and the figures' export were most of three such tests' time. Isolated as every test is
    (``conftest.isolate``: the per-test fixture does not reach a module's fixture)."""
    from conftest import isolate

    root = tmp_path_factory.mktemp("figures_report")
    torch.manual_seed(0)
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10)
    ck = vitlab.save_checkpoint(vitlab.build_model(cfg).eval(), root / "ck1")
    out = root / "out"
    out.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.getbasetemp())
        code = main(["reproduce", "--model", str(ck), "--out", str(out), "--num-images", "2", "--no-few-shot",
                     "--formats", "png,svg", "--quiet"])
    return ck, out, code


def test_reproduce_writes_a_stamped_report(tmp_path, checkpoint, monkeypatch, no_cifar, capsys):
    """On a machine without CIFAR-10 (a user's fresh clone): every other figure, and the few-shot section saying the
    command that fetches the data, in the page, in metrics.json's not_judged and on the console."""
    import markupsafe

    from vitlab.report.sections import FEW_SHOT

    out = tmp_path / "out"
    import vitlab.report
    from vitlab.report.render import PAGE_WIDTH
    drawn = {}

    def keep_sections(summary, sections):
        drawn.update({s.slug: s.figure for s in sections if s.figure is not None})
        return render_html(summary, sections)

    render_html = vitlab.report.render_html
    monkeypatch.setattr(vitlab.report, "render_html", keep_sections)
    assert main(["reproduce", "--model", str(checkpoint), "--out", str(out), "--num-images", "3", "--no-png",
                 "--no-shapes", "--quiet"]) == 0
    console = capsys.readouterr().out
    text = (out / "metrics.json").read_text(encoding="utf-8")
    metrics = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.json"))  # strict JSON
    assert "tensor(" not in text and "array(" not in text  # numbers, not their str()
    assert metrics["attention_shape"] == [3, 3, 3, 65, 65]
    # a 32 px model is shown the shipped CIFAR-10 test images (the paper's 128 images, offline)
    assert [p["image"] for p in metrics["predictions"]] == default_images(tiny_vit(), 3)[0] == [
        "airplane #0", "automobile #1", "bird #2"]
    assert {f["slug"] for f in metrics["figures"]} == FIGURES
    # no CIFAR-10 here: the few-shot section stays, without a figure, and says how to get the data, once
    [missing] = [n for n in metrics["not_judged"] if n["section"] == "few_shot"]
    [recipes] = [n for n in metrics["not_judged"] if n["section"] == "recipes"]
    # 3 images: too few for CKA; no shipped recipes: no recipes section, a note naming the command
    assert [n["section"] for n in metrics["not_judged"]] == ["similarity", "few_shot", "recipes"]
    assert (missing["section"], missing["finding"]) == ("few_shot", FEW_SHOT)
    assert recipes["section"] == "recipes" and "vitlab export-recipe" in recipes["reason"]
    assert "recipes" not in {f["slug"] for f in metrics["figures"]}
    assert f"`vitlab data cifar10` while online (it downloads into {no_cifar / 'cifar10'})" in missing["reason"]
    few_shot = next(f for f in metrics["figures"] if f["slug"] == "few_shot")
    assert missing["reason"] in few_shot["ours"] and "download=True" not in text
    assert f"not judged: {FEW_SHOT}: {missing['reason']}\n" in console
    for f in metrics["figures"]:
        assert f["paper"] and f["ours"]
        if f["slug"] != "scaling":  # drawn from the shipped sweep, not from this model
            assert f["stamp"]["weights"] == str(checkpoint)
        assert set(f["stamp"]["versions"]) == {"vitlab", "torch", "timm"} and "settings" in f["stamp"]
        assert "{" not in f["stamp_line"]  # a readable line, not a JSON dump
    distance = next(f for f in metrics["figures"] if f["slug"] == "distance")
    ref = distance["metrics"]["uniform_attention_px"]  # the stamp gives the reference as the text names it, rounded
    assert distance["stamp"]["settings"]["uniform_attention_px"] == round(ref, 2) != ref
    assert "ceiling" not in distance["stamp_line"]
    # every figure that judges a finding carries its verdicts, and metrics.json holds them all
    judged = {v["section"] for v in metrics["verdicts"]}
    assert {"filters", "positions", "distance"} <= judged
    assert all(v["verdict"] in ("reproduced", "not reproduced", "inconclusive") for v in metrics["verdicts"])
    # every finding's criterion ran on its controls: the validation table lists finding x control, and a verdict
    # whose criterion failed one is no "reproduced" (3 images: too few for the distance controls' intervals)
    rows = metrics["criterion_validation"]
    assert {r["key"] for r in rows} == {v["key"] for v in metrics["verdicts"]} >= {
        "fig7.left.low_frequency", "fig7.left.structured", "fig7.centre.distance", "fig7.right.depth_trend"}
    assert all({"control", "kind", "expected", "observed", "statistic", "interval", "passed"} <= set(r) for r in rows)
    assert len(rows) == sum(len(v["controls"]) for v in metrics["verdicts"])
    failed = {v["key"]: v["verdict"] for v in metrics["verdicts"] if not all(c["passed"] for c in v["controls"])}
    assert "reproduced" not in failed.values() and "fig7.right.depth_trend" in failed
    assert metrics["summary"]["facts"]["parameters"] == f"{sum(p.numel() for p in tiny_vit().parameters()):,}"
    assert [r["method"] for r in metrics["methods"]] == ["rollout", "gradient rollout", "integrated gradients",
                                                         "occlusion", "random map"]
    assert len(metrics["mean_attention_distance_px"]) == 3 and len(metrics["mean_attention_distance_px"][0]) == 3
    page = (out / "report.html").read_text()
    assert "plotly" in page.lower() and "<script" in page  # plotly embedded: opens offline
    assert all(f"id='{slug}'" in page for slug in FIGURES)
    assert page.count("class=\"badge") >= 2 * len(metrics["verdicts"])  # in the summary table and under the figure
    assert page.count("<h2>Criterion validation</h2>") == 1
    assert page.count('class="badge not-judged"') == 3 and str(markupsafe.escape(missing["reason"])) in page
    assert '"model_info"' not in page and "{&#34;" not in page  # no raw JSON on the page
    assert metrics["png"] == "not asked for" and not list(out.glob("*.png"))
    # every figure fits the page's text width (the two-panel scaling figure was 1,400 px wide and cut off)
    assert set(drawn) == FIGURES - NO_FIGURE and f"max-width: {PAGE_WIDTH}px" in page
    assert {slug: fig.layout.width for slug, fig in drawn.items() if fig.layout.width > PAGE_WIDTH} == {}


def test_reproduce_moves_its_bar_within_long_steps_and_says_when_pngs_were_skipped(tmp_path, checkpoint,
                                                                                  monkeypatch, capsys):
    """The bar advances as each map method begins (the maps step sat still for minutes on 128 images), naming it;
    and without a Chromium the console says the static figures were not written, and why (not only metrics.json)."""
    import vitlab.report
    from vitlab.inspect import ATTRIBUTION_METHODS

    events = []

    class Bar:  # records where the bar stands at each update, and what its label said
        def __init__(self, *args, total=None, **kwargs):
            self.total, self.n, self.label = total, 0, ""

        def set_postfix_str(self, s):
            self.label = s

        def update(self, k=1):
            self.n += k
            events.append((self.label, self.n))

        def close(self):
            pass

    monkeypatch.setattr(vitlab.report, "tqdm", Bar)
    monkeypatch.setenv("PATH", str(tmp_path))  # no Chromium on it
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    out = tmp_path / "out"
    assert main(["reproduce", "--model", str(checkpoint), "--out", str(out), "--num-images", "2", "--no-shapes",
                 "--no-few-shot", "--no-scaling"]) == 0
    methods = [*ATTRIBUTION_METHODS, "random map"]
    maps = [(label, n) for label, n in events if label.startswith("maps")]
    # one step per method begun after the first, then the step's end: each a part further on
    assert [label for label, _ in maps] == [f"maps: {m}" for m in methods]
    assert [n for _, n in maps] == list(range(maps[0][1], maps[0][1] + len(methods)))
    from vitlab.report.steps import chosen

    # every other step counts one part: the bar ends full
    ran = chosen({"shapes": False, "few_shot": False, "scaling": False, "recipes": True})
    assert events[-1][1] == sum(s.parts for s in ran)
    png = json.loads((out / "metrics.json").read_text())["png"]
    assert png.startswith("skipped: ")
    assert f"not written: {png.removeprefix('skipped: ')}" in capsys.readouterr().out


def test_the_few_shot_section_probes_the_cifar10_in_the_data_folder(no_cifar, checkpoint):
    """The section the stamped report shows without data, drawn from a small CIFAR-10 stand-in put where
    `vitlab data cifar10` puts it (10 classes of 25 training and 5 test images in ImageFolder layout)."""
    from _reference import make_folder

    from vitlab.report import sections as S
    from vitlab.report.render import PAGE_WIDTH

    classes = tuple(f"class{i}" for i in range(10))
    make_folder(no_cifar / "cifar10" / "train", n_per_class=25, size=32, classes=classes)
    make_folder(no_cifar / "cifar10" / "test", n_per_class=5, size=32, classes=classes)
    net = vitlab.load_model(str(checkpoint))
    inp = S.Inputs(net, vitlab.model_info(net), [], None, [], {"images": "none"})
    section = S.few_shot(inp, train_per_class=25, test_images=30)
    assert section.not_judged == [] and section.figure is not None
    assert section.figure.layout.width is None or section.figure.layout.width <= PAGE_WIDTH
    assert set(section.metrics) == {"1", "5", "10", "25"}
    assert all(0 <= m["mean"] <= 1 for m in section.metrics.values())
    assert section.stamp["images"] == "250 CIFAR-10 training and 30 test images"


def test_reproduce_scores_localisation_on_the_shipped_shapes_model(figures_report):
    from vitlab.models.load import SHAPES_CHECKPOINT

    if not (SHAPES_CHECKPOINT / "model.safetensors").exists():
        pytest.skip("no shapes checkpoint shipped yet")
    _, out, code = figures_report  # the table is the shipped shapes model's, whatever --model is
    assert code == 0
    loc = json.loads((out / "metrics.json").read_text())["shapes_localisation"]
    rows = {r["method"]: r for r in loc["methods"]}
    assert 0 < loc["stamp"]["chance"] < 0.5
    assert all(0 <= r["mass_in_mask"] <= 1 and 0 <= r["pointing"] <= 1 for r in rows.values())
    # a known answer: on the shipped shapes model every map method puts more mass on the object than a random map,
    # and the rollout verdict says so
    assert all(rows[m]["mass_in_mask"] > rows["random map"]["mass_in_mask"] for m in rows if m != "random map")
    verdicts = json.loads((out / "metrics.json").read_text())["verdicts"]
    assert [v["verdict"] for v in verdicts if v["section"] == "localisation"] == ["reproduced"]


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium for static export")
def test_reproduce_writes_pngs_with_chromium(figures_report):
    from vitlab.models.load import SHAPES_CHECKPOINT
    from vitlab.report.sections import localisation_possible

    _, out, code = figures_report
    assert code == 0
    assert json.loads((out / "metrics.json").read_text())["png"].startswith("written")
    pngs = {p.stem: p.read_bytes() for p in out.glob("*.png")}
    drawn = FIGURES - NO_FIGURE | ({"localisation"} if localisation_possible(SHAPES_CHECKPOINT) else set())
    assert set(pngs) == drawn and all(b.startswith(b"\x89PNG") for b in pngs.values())
    assert {p.stem for p in out.glob("*.svg")} == set(pngs)
    assert all(p.read_text().lstrip().startswith("<svg") for p in out.glob("*.svg"))


def _earlier_images(tmp_path):
    import plotly.graph_objects as go

    paths = [tmp_path / "a.png", tmp_path / "b.svg"]
    for p in paths:
        p.write_bytes(b"an earlier image")
    return [go.Figure(go.Scatter(y=[1, 3, 2])) for _ in paths], paths


def test_a_failing_static_export_keeps_the_images_already_there(tmp_path, monkeypatch):
    """A browser that dies at once (kaleido raises): the export reports the failure and the files already at the
    paths (a benchmark's earlier figure) stay as they were; they were deleted. Nothing else is left behind."""
    from vitlab.figures.static import write_images

    figures, paths = _earlier_images(tmp_path)
    monkeypatch.setenv("BROWSER_PATH", "/bin/false")
    assert write_images(figures, paths).startswith("failed: ")
    assert [p.read_bytes() for p in paths] == [b"an earlier image"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.svg"]


def test_an_interrupted_static_export_leaves_no_half_written_image(tmp_path, monkeypatch):
    """Ctrl-C while kaleido writes (half of the first image on disk): the interrupt goes on, and neither half an
    image nor a temporary file is left; the earlier files are kept (the first path held the half-written bytes)."""
    import plotly.io as pio

    from vitlab.figures.static import write_images

    def interrupted(figures, files, **kw):
        Path(files[0]).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    figures, paths = _earlier_images(tmp_path)
    monkeypatch.setenv("BROWSER_PATH", "/bin/false")
    monkeypatch.setattr(pio, "write_images", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_images(figures, paths)
    assert [p.read_bytes() for p in paths] == [b"an earlier image"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.svg"]


def test_static_export_names_a_bad_browser_path(tmp_path, monkeypatch):
    """BROWSER_PATH naming a missing file or a folder, and no Chromium on PATH: the export is skipped saying that
    BROWSER_PATH is wrong (it said "set BROWSER_PATH", which was set; a folder was handed to kaleido as a browser)."""
    from vitlab.figures.static import find_chromium, write_images

    figures, paths = _earlier_images(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    for bad in (tmp_path / "no-such-chromium", tmp_path):
        monkeypatch.setenv("BROWSER_PATH", str(bad))
        assert find_chromium() is None
        assert write_images(figures, paths).startswith(f"skipped: BROWSER_PATH={bad} is no executable file")
    assert [p.read_bytes() for p in paths] == [b"an earlier image"] * 2


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium for static export")
def test_static_export_replaces_the_images_already_there(tmp_path):
    from vitlab.figures.static import write_images

    figures, paths = _earlier_images(tmp_path)
    assert write_images(figures, paths).startswith("written")
    assert paths[0].read_bytes().startswith(b"\x89PNG") and paths[1].read_text().lstrip().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.svg"]


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium for static export")
def test_static_export_into_a_new_folder_writes_the_image(tmp_path):
    """kaleido writes nothing, and raises nothing, into a folder that does not exist: the export said 'written' and
    no image was there (benchmarks/from_scratch.py draws its curve before writing its JSON into that folder)."""
    from vitlab.figures.static import write_images

    figures, _ = _earlier_images(tmp_path)
    path = tmp_path / "new" / "deeper" / "a.png"
    assert write_images(figures[:1], [path]).startswith("written")
    assert path.read_bytes().startswith(b"\x89PNG") and [p.name for p in path.parent.iterdir()] == ["a.png"]


def test_a_static_export_that_writes_nothing_is_a_failure(tmp_path, monkeypatch):
    """A kaleido that returns without writing a file is reported as failed, naming the image, not as written."""
    import plotly.io as pio

    from vitlab.figures.static import write_images

    figures, paths = _earlier_images(tmp_path)
    monkeypatch.setenv("BROWSER_PATH", "/bin/false")
    monkeypatch.setattr(pio, "write_images", lambda figures, files, **kw: None)
    res = write_images(figures, paths)
    assert res.startswith("failed: RuntimeError: kaleido wrote no image for ") and str(paths[0]) in res
    assert [p.read_bytes() for p in paths] == [b"an earlier image"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.svg"]


def _keeps_previous(out, argv, capsys, needle):
    out.mkdir(exist_ok=True)
    (out / "report.html").write_text("an earlier report")
    (out / "metrics.json").write_text(json.dumps(EARLIER))
    assert main(argv + ["--out", str(out), "--no-png", "--no-shapes", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert needle in err, err
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.html"]  # untouched, nothing half-written
    assert (out / "report.html").read_text() == "an earlier report"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".out")]


def test_bad_images_leave_the_previous_report(tmp_path, checkpoint, capsys):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _keeps_previous(tmp_path / "out", ["reproduce", "--model", str(checkpoint), "--images", str(imgs)], capsys,
                    "no images")
    (imgs / "x.jpg").write_bytes(b"broken")
    _keeps_previous(tmp_path / "out", ["reproduce", "--model", str(checkpoint), "--images", str(imgs)], capsys,
                    "x.jpg")


def test_more_default_images_than_there_are_is_named_by_its_flag(tmp_path, checkpoint, capsys):
    """`--num-images 200` on a 32 px model said 'n must be in [1, 128], got 200', naming no flag or image set."""
    _keeps_previous(tmp_path / "out", ["reproduce", "--model", str(checkpoint), "--num-images", "200"], capsys,
                    "--num-images 200: this model's default images are the 128 shipped CIFAR-10 test images "
                    "(data/cifar10_test_128.npz) (allowed: at most 128); fix: --num-images 128, or --images FOLDER")


def test_unknown_model_and_model_without_attention(tmp_path, capsys):
    _keeps_previous(tmp_path / "out", ["reproduce", "--model", "vit_tinyy_patch16_224"], capsys,
                    "neither a file nor a timm model name")
    bit = vitlab.save_checkpoint(tiny_bit(), tmp_path / "bit")
    _keeps_previous(tmp_path / "out", ["reproduce", "--model", str(bit)], capsys, "attention")


def test_random_weights_are_stamped_as_random_initialisation(tmp_path, capsys):
    """A timm name with --no-pretrained (timm's smallest ViT, test_vit: the stamp does not depend on the size)."""
    import timm

    out = tmp_path / "out"
    assert main(["reproduce", "--model", "test_vit", "--no-pretrained", "--out", str(out), "--num-images",
                 "1", "--no-png", "--no-shapes", "--no-few-shot", "--no-scaling", "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["weights"] == "random initialisation (no pretrained weights)"
    assert all(f["stamp"]["weights"] == metrics["weights"] for f in metrics["figures"])
    hub = timm.create_model("test_vit", pretrained=False).pretrained_cfg["hf_hub_id"]
    assert hub and hub not in (out / "report.html").read_text()  # no hub weights named that the model does not have
    printed = capsys.readouterr().out
    assert "finding" in printed and "verdict" in printed  # the one-line-per-finding summary table


def test_reproduce_refuses_a_folder_that_is_not_a_report(tmp_path, figures_report, capsys):
    """The report replaces its whole folder: a folder holding other files, or a file, is refused untouched, before
    the model is even loaded; an empty folder is written into and an earlier report's folder is replaced."""
    import shutil

    ck, earlier, code = figures_report
    assert code == 0  # written into an empty folder
    args = ["reproduce", "--model", str(ck), "--num-images", "1", "--no-png", "--no-shapes", "--no-few-shot",
            "--no-scaling", "--quiet"]
    notes = tmp_path / "my_results"
    notes.mkdir()
    (notes / "thesis_notes.txt").write_text("keep me")
    assert main([*args, "--out", str(notes)]) != 0
    assert "holds no earlier report" in capsys.readouterr().err
    assert [p.name for p in notes.iterdir()] == ["thesis_notes.txt"]
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main([*args, "--out", str(a_file)]) != 0
    assert "is not a folder" in capsys.readouterr().err and a_file.read_text() == "x"
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    assert main([*args, "--out", str(out)]) == 0  # a report replaces itself, its static figures too
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.html"]
    assert json.loads((out / "metrics.json").read_text())["png"] == "not asked for"
    # an earlier report with the user's own file in it: refused, naming the file, nothing deleted
    (out / "thesis_notes.txt").write_text("keep me")
    assert main([*args, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert f"--out {out}: holds no earlier report" in err and "does not write thesis_notes.txt" in err
    assert err.rstrip().endswith("fix: --out NEW_OR_EMPTY_FOLDER")
    assert (out / "thesis_notes.txt").read_text() == "keep me" and (out / "report.html").is_file()


def test_only_a_folder_of_report_files_with_the_reports_metrics_is_an_earlier_report(tmp_path):
    """Any folder holding report.html and metrics.json used to count as an earlier report, and was deleted whole.
    Now metrics.json must parse and carry the report's keys, and every entry must be one the report writes
    (report.html, metrics.json, {slug}.{format} of its figures); otherwise the refusal names what is wrong."""
    from vitlab.report import check_report_dir

    d = tmp_path / "out"
    d.mkdir()
    (d / "report.html").write_text("<html></html>")
    (d / "metrics.json").write_text(json.dumps(EARLIER))
    for name in ("filters.png", "filters.svg"):
        (d / name).write_bytes(b"image")
    check_report_dir(d)  # an earlier report with its figures
    (d / "results.csv").write_text("1,2")
    (d / "runs").mkdir()
    with pytest.raises(FileExistsError, match=r"the report does not write results\.csv, runs/\. .*NEW_OR_EMPTY"):
        check_report_dir(d)
    (d / "results.csv").unlink()
    (d / "runs").rmdir()
    (d / "distance.png").write_bytes(b"image")  # not a figure of that report
    with pytest.raises(FileExistsError, match="does not write distance.png"):
        check_report_dir(d)
    (d / "distance.png").unlink()
    (d / "metrics.json").write_text('{"loss": [0.1, 0.2]}')  # the user's own metrics.json
    with pytest.raises(FileExistsError, match="metrics.json is not a report's.*does not write filters.png"):
        check_report_dir(d)
    (d / "metrics.json").write_text("{not json")
    with pytest.raises(FileExistsError, match="metrics.json does not parse"):
        check_report_dir(d)
    (d / "metrics.json").unlink()
    with pytest.raises(FileExistsError, match="no metrics.json"):
        check_report_dir(d)
    assert sorted(p.name for p in d.iterdir()) == ["filters.png", "filters.svg", "report.html"]  # nothing deleted


def test_a_folder_or_file_the_report_would_replace_is_refused_in_python_words(tmp_path):
    """reproduce(out=...) from Python said "give --out a new or empty folder", a flag its caller never passed."""
    from vitlab.base.errors import Placeholder, Setting
    from vitlab.report import check_report_dir

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.txt").write_text("keep me")
    (tmp_path / "a_file").write_text("x")
    for out, new in ((tmp_path / "notes", "NEW_OR_EMPTY_FOLDER"), (tmp_path / "a_file", "NEW_FOLDER")):
        with pytest.raises(FileExistsError) as e:
            check_report_dir(out)
        assert (e.value.param, e.value.value, e.value.fix[0]) == ("out", str(out), Setting("out", Placeholder(new)))
        assert "--out" not in str(e.value)


def _minimal_report(ck: Path, out: Path, num_images: int) -> dict:
    """`vitlab reproduce` of checkpoint ``ck`` into ``out`` on ``num_images`` images, with only the sections computed
    from the model itself (no PNGs, shapes, few-shot or scaling); its metrics.json."""
    assert main(["reproduce", "--model", str(ck), "--out", str(out), "--num-images", str(num_images), "--no-png",
                 "--no-shapes", "--no-few-shot", "--no-scaling", "--quiet"]) == 0
    return json.loads((out / "metrics.json").read_text())


def test_a_fixed_position_table_one_layer_and_one_image_get_no_false_verdicts(tmp_path):
    """A sin-cos table has the 2D topology by construction: not judged as learned; one block has no slope to fit
    (the report goes on); one image decides nothing about the lowest layer's spread."""
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10, pos_embed="sincos")
    ck = vitlab.save_checkpoint(vitlab.build_model(cfg).eval(), tmp_path / "ck")
    out = tmp_path / "out"
    metrics = _minimal_report(ck, out, 1)
    by_section = {}
    for v in metrics["verdicts"]:
        by_section.setdefault(v["section"], []).append(v)
    assert "positions" not in by_section
    positions = next(f for f in metrics["figures"] if f["slug"] == "positions")
    assert "fixed" in positions["ours"] and "Not judged" in positions["ours"]
    assert [v["verdict"] for v in by_section["distance"]] == ["inconclusive"]  # the spread over 1 image; no slope
    assert by_section["distance"][0]["details"]["no_interval"] == "1 image, at least 16 needed"
    page = (out / "report.html").read_text()  # the page says what is missing, not a reason about training data
    assert "no interval: 1 image, at least 16 needed." in page and "learn less local attention" not in page
    seconds = metrics["summary"]["seconds"]  # the run time the page states, in metrics.json too
    assert 0 < seconds <= metrics["seconds_total"] and f"in {seconds} s." in page


def test_sections_a_model_cannot_have_say_why_instead_of_vanishing(tmp_path):
    """A hybrid's report left out the filters section and a model without a position table (vitlab's
    pos_embed="none", rotary and relative-bias models) the positions section, without a word: a reader could not
    tell a missing figure from a broken one. Each section now stays, with no figure and no verdict, saying why."""
    from conftest import tiny_hybrid

    ck = vitlab.save_checkpoint(tiny_hybrid(), tmp_path / "hybrid")
    metrics = _minimal_report(ck, tmp_path / "out_h", 1)
    filters = next(f for f in metrics["figures"] if f["slug"] == "filters")
    assert filters["ours"].startswith("Not shown for this model: a hybrid's patches") and not filters["verdicts"]
    assert not (tmp_path / "out_h" / "filters.png").exists()
    page = (tmp_path / "out_h" / "report.html").read_text()
    assert "Not shown for this model: a hybrid" in page
    # the facts say what the model is, in words that agree with their numbers ("1 blocks", "prefix token(s)")
    assert "hybrid, ResNet features as patches; 1 block, width 192, 3 heads" in page
    assert "4 px per patch (the ResNet&#39;s stride), 8x8 grid, 1 prefix token (class)," in page
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10, pos_embed="none")
    ck = vitlab.save_checkpoint(vitlab.build_model(cfg).eval(), tmp_path / "nopos")
    metrics = _minimal_report(ck, tmp_path / "out_n", 1)
    positions = [f for f in metrics["figures"] if f["slug"].startswith("positions")]
    assert len(positions) == 1 and not positions[0]["verdicts"]
    assert positions[0]["ours"] == ("Not shown for this model: it has no position-embedding table; it is told "
                                    "nothing about where a patch lies.")
    assert not [v for v in metrics["verdicts"] if v["section"].startswith("positions")]


def test_positions_name_what_a_rotary_or_relative_bias_model_adds_in_attention():
    """A rope model's attention knows positions through rotary embeddings the table cannot show; BEiT's through a
    relative bias: the section names them (EVA-02 keeps its learned table too: a note says the table is only part)."""
    import numpy as np
    import timm

    from vitlab.report import sections as S

    for name, kw, words in (("beit_base_patch16_224", dict(use_abs_pos_emb=False), "a relative position bias"),
                            ("eva02_tiny_patch14_224", {}, "rotary embeddings")):
        net = timm.create_model(name, pretrained=False, num_classes=3, depth=1, img_size=32, **kw).eval()
        info = vitlab.model_info(net)
        assert (info.pos_embed == "none") == name.startswith("beit")  # BEiT here: no table; EVA-02: a table too
        x = torch.zeros(1, 3, 32, 32)
        inp = S.Inputs(net, info, ["a"], x, [np.zeros((32, 32, 3), np.uint8)], {"images": "1 of test"})
        made = S.positions(inp)
        if info.pos_embed == "none":
            assert made[0].figure is None and f"through {words} instead" in made[0].ours
        else:
            assert f"its attention adds {words}, which this figure does not show" in made[0].ours


def test_a_model_without_a_classifier_head_gets_rollout_and_no_made_up_predictions(tmp_path):
    """num_classes=0 (timm's .orig_in21k weights): no predicted classes, no class-specific maps or faithfulness
    scores, the rest of the report as usual."""
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=2, num_classes=0)
    ck = vitlab.save_checkpoint(vitlab.build_model(cfg).eval(), tmp_path / "ck")
    out = tmp_path / "out"
    metrics = _minimal_report(ck, out, 4)
    assert metrics["predictions"] == [] and metrics["methods"] == []
    slugs = {f["slug"] for f in metrics["figures"]}
    assert "rollout" in slugs and not slugs & {"faithfulness", "faithfulness_curves"}
    rollout = next(f for f in metrics["figures"] if f["slug"] == "rollout")
    assert "no classifier head" in rollout["ours"]
    page = (out / "report.html").read_text()
    assert "\\u003cbr\\u003epredicted" not in page and "<br>predicted" not in page  # no title names a predicted class


def test_the_report_is_written_in_utf8_under_an_ascii_locale(tmp_path):
    """plotly.js holds non-ASCII characters: under a C or Latin-1 locale write_text without an encoding raised
    UnicodeEncodeError after every analysis had run. The report, metrics.json and atomic_write_text write UTF-8.
    In this process with its character locale set to C for the test (a text file opened without an encoding takes
    the locale's at the time of opening), not in a fresh interpreter under LC_ALL=C, which imports vitlab again."""
    import locale

    import plotly.graph_objects as go

    from vitlab.base.atomic import atomic_write_text
    from vitlab.report import write_report

    if sys.flags.utf8_mode:  # PYTHONUTF8=1 or -X utf8: every text file is UTF-8 whatever the locale
        pytest.skip("Python's UTF-8 mode is on: no locale makes open() choose ASCII")
    page = go.Figure().to_html(include_plotlyjs=True)
    assert not page.isascii()
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert locale.getpreferredencoding(False).lower() in ("ascii", "ansi_x3.4-1968")  # as open() will choose
        write_report(tmp_path / "out", page, {"model": "caf\u00e9"}, None)
        atomic_write_text(tmp_path / "note.txt", "na\u00efve")
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert not (tmp_path / "out" / "report.html").read_bytes().decode("utf-8").isascii()
    assert json.loads((tmp_path / "out" / "metrics.json").read_bytes().decode("utf-8"))["model"] == "caf\u00e9"
    assert (tmp_path / "note.txt").read_bytes() == "na\u00efve".encode()


def test_metrics_json_is_strict_json_with_numbers_not_their_str(tmp_path):
    """NaN (an unnormed metric, a few-shot std over one seed) became bare NaN, which strict JSON readers refuse, and
    default=str wrote tensors and numpy scalars as their repr ("tensor([1., nan])"). Now numbers are numbers, NaN
    and infinities null, and a value of any other type is refused by its place before anything is written."""
    import math

    import numpy as np
    import torch

    from vitlab.report import write_report

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.json"))

    metrics = {"nan": math.nan, "f32": np.float32(0.5), "t": torch.tensor([1.0, float("nan")]), "i": np.int64(3),
               "inf": [np.inf, -math.inf], "scalar": torch.tensor(2.5), "nested": {"std": np.float64("nan")}}
    write_report(tmp_path / "out", "<html></html>", metrics, None)
    got = strict((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in got.items() if k not in ("png", "seconds_total")} == {
        "nan": None, "f32": 0.5, "t": [1.0, None], "i": 3, "inf": [None, None], "scalar": 2.5, "nested": {"std": None}}
    assert got["png"] == "not asked for"
    with pytest.raises(TypeError, match=r"metrics\['figures'\]\[0\]\['where'\] \(PosixPath\) is not a JSON value"):
        write_report(tmp_path / "other", "<html></html>", {"figures": [{"where": tmp_path}]}, None)
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other.*"))  # nothing half-written


def test_image_and_class_names_are_text_in_map_titles_not_plotly_markup():
    """Plotly reads <b>, <br> and <a href> in subplot titles as markup: an image file named "<b>x</b>.jpg" or a
    class named with a link changed the page. Names are escaped (plotly shows &lt; as <); the one <br> between the
    true and the predicted line is ours."""
    import torch

    from vitlab.report.sections import Inputs, map_titles

    inp = Inputs(net=None, info=None, names=["<b>x</b>", "a & b<br>c"], x=None, shown=[], base={},
                 class_names=("<a href='https://example.com'>cat</a>", "dog"))
    pred = {"pred": torch.tensor([0, 1]), "prob": torch.tensor([0.9, 0.5])}
    assert map_titles(inp, pred, 2) == [
        "&lt;b&gt;x&lt;/b&gt;<br>predicted &lt;a href='https://example.com'&gt;cat&lt;/a&gt; (90%)",
        "a &amp; b&lt;br&gt;c<br>predicted dog (50%)"]
    assert map_titles(inp, {"pred": None, "prob": None}, 1) == ["&lt;b&gt;x&lt;/b&gt;"]  # no head: the name alone
    # a random 1000-class model's 0.1% was captioned (0%)
    low = map_titles(inp, {"pred": torch.tensor([1, 1]), "prob": torch.tensor([0.0012, 0.0001])}, 2)
    assert [t.rsplit("<br>", 1)[1] for t in low] == ["predicted dog (0.1%)", "predicted dog (< 0.1%)"]


def test_map_grid_titles_state_the_scaling_the_grid_applies():
    """The map grids divide each map by its largest |value| (plots.MAP_SCALING); their titles said 'scaled to its own
    maximum', which a signed map (occlusion, integrated gradients) with a negative extreme contradicts."""
    import numpy as np
    import torch

    from vitlab.report import sections as S

    net = tiny_vit()
    inp = S.Inputs(net, vitlab.model_info(net), ["a", "b"], torch.randn(2, 3, 32, 32),
                   [np.zeros((32, 32, 3), np.uint8)] * 2, {}, n_show=2)
    pred = S.prediction_pass(inp)
    grids = [S.rollout_only(inp, {**pred, "pred": None, "prob": None}),
             S.maps_and_faithfulness(inp, pred, max_images=2)[0], S.readout_and_entropy(inp, pred)[0]]
    for section in grids:
        title = section.figure.layout.title.text
        assert "each map divided by its own largest |value|" in title and "maximum" not in title, title


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the umask from Linux's /proc")
def test_the_report_folder_follows_the_umask(tmp_path):
    """The report's folder was chmod 0755 whatever the umask: with umask 027 (no access for others) the report was
    readable by everyone. It gets 0777 less the umask, as any new folder; its files 0666 less the umask."""
    import stat

    from vitlab.report import write_report

    old = os.umask(0o027)
    try:
        write_report(tmp_path / "out", "<html></html>", {}, None)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {"report.html": 0o640,
                                                                              "metrics.json": 0o640}


def test_out_as_the_current_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """--out . (whose Path name is empty) or a folder above the current one would be replaced as a whole from
    under the shell: refused up front, before the model is loaded, with a name to give instead. Relative names
    below the current folder are made absolute and work as before."""
    from vitlab.report import report_target, reproduce

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    for out in (".", "..", "./", str(tmp_path)):
        with pytest.raises(ValueError, match=r"current folder or one that holds it") as e:
            reproduce(model="no_such_model_name", out=out)  # refused before the model name is even looked up
        assert (e.value.param, e.value.value) == ("out", out) and "--out" not in str(e.value)
    assert main(["reproduce", "--out", ".", "--quiet"]) == 1
    assert "--out .: the current folder" in capsys.readouterr().err
    assert report_target("out") == tmp_path / "sub" / "out" and report_target("../x") == tmp_path / "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"] and not list((tmp_path / "sub").iterdir())


def test_formats_counts_and_scale_of_the_wrong_kind_are_refused_before_any_work(tmp_path):
    """formats="svg" was read letter by letter ("unknown figure format(s) ['g', 's', 'v']"), num_images=0 was refused
    as "n must be in [1, 128]" after the model was loaded, and image_scale=0 silently wrote scale-1 figures; each
    is now refused by its own name before the model is looked up, and nothing is written."""
    from vitlab.report import reproduce

    out = tmp_path / "out"
    for kw, err, words in [
        (dict(formats="svg"), TypeError, r"formats must be a list of figure formats, got the string 'svg': pass "
                                         r"\['svg'\]"),
        (dict(num_images=0), ValueError, "num_images must be a whole number of at least 1, or None for the default, "
                                         "got 0"),
        (dict(image_scale=0), ValueError, r"image_scale must be a positive number \(2.0: twice the resolution\), "
                                          "got 0"),
        (dict(image_scale=float("nan")), ValueError, "image_scale must be a positive number .*got nan")]:
        with pytest.raises(err, match=words):
            reproduce(model="no_such_model_name", out=out, **kw)  # refused before the model name is looked up
    assert not out.exists()


def test_a_model_with_random_weights_reproduces_no_finding(tmp_path):
    """A random initialisation has learned nothing: a chance slope (e.g. 0.15 px/layer of an average-pooled timm ViT
    at uniform attention) used to read 'reproduced', with the paper's reasons about pre-training data beside the
    others. Now every verdict measured on such a model (--no-pretrained, or a config) is inconclusive, its statistic
    kept, and says why; the weights of a config are stamped as random, not as 'pretrained (timm)'."""
    from vitlab.report import reproduce

    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=2, num_classes=10, readout="avg")
    torch.manual_seed(0)
    out = reproduce(model=cfg, out=tmp_path / "out", num_images=2, png=False, shapes=False, few_shot=False,
                    scaling=False, progress=False, device="cpu")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["weights"] == "random initialisation (no pretrained weights)"
    judged = [v for v in metrics["verdicts"] if v["section"] in ("filters", "positions", "distance")]
    assert len(judged) >= 4 and all(v["verdict"] == "inconclusive" and v["details"]["untrained"] for v in judged)
    # the CKA section is there, and says why 2 images are too few for it (its verdicts: tests/test_similarity.py)
    assert [n["section"] for n in metrics["not_judged"]] == ["similarity", "recipes"]  # no shipped recipes here
    from vitlab.findings.explain import UNTRAINED_REASON

    page = (out / "report.html").read_text()
    text = html.unescape(page)  # the page as read: jinja2 escapes the reason's apostrophes
    assert UNTRAINED_REASON in text and "JFT-300M (section 4.5" not in text and "trained briefly" not in text


def test_the_rollout_section_points_to_a_localisation_section_only_when_there_is_one(tmp_path):
    """With --no-shapes the rollout section still said the maps' localisation 'is judged on the synthetic shapes
    (localisation section)', a section the report did not have; now it says it is not judged here and why."""
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10)
    ck = vitlab.save_checkpoint(vitlab.build_model(cfg).eval(), tmp_path / "ck")
    out = tmp_path / "out"
    metrics = _minimal_report(ck, out, 1)
    assert "localisation" not in {f["slug"] for f in metrics["figures"]}
    rollout = next(f for f in metrics["figures"] if f["slug"] == "rollout")
    assert "localisation section" not in rollout["ours"] and "not judged" in rollout["ours"]


def test_a_masked_patch_prediction_checkpoint_gets_no_predictions_from_its_untrained_head(tmp_path):
    """The shipped mpp_cifar10 never read a label, so its classification head is its initialisation: the report
    used to give its 'predicted' classes (about 16%) and class-specific maps and faithfulness scores for them. Now a
    checkpoint whose card records objective 'mpp' is treated as a model without a head: rollout alone, no predictions."""
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    card = Path(vitlab.__file__).resolve().parents[1] / "data" / "checkpoints" / "mpp_cifar10" / "card.json"
    (ck / "card.json").write_text(card.read_text())  # the shipped MPP checkpoint's card: objective "mpp"
    out = tmp_path / "out"
    metrics = _minimal_report(ck, out, 2)
    assert metrics["predictions"] == [] and metrics["methods"] == []
    rollout = next(f for f in metrics["figures"] if f["slug"] == "rollout")
    assert "untrained" in rollout["ours"] and "no classifier head" not in rollout["ours"]


def test_each_stamp_names_the_images_its_section_read():
    """Every stamp said 'images: 128 of the 128 shipped CIFAR-10 test images', also where the section read none (the
    filters and position embeddings are weights), the first 16 (the maps and their faithfulness scores) or the first
    4 (the readout grid), or CIFAR-10's own splits (the few-shot probe)."""
    import numpy as np

    from vitlab.report import sections as S
    from vitlab.report.render import stamp_line

    net = tiny_vit()
    source = "the 6 shipped test images"
    inp = S.Inputs(net, vitlab.model_info(net), list("abcdef"), torch.randn(6, 3, 32, 32),
                   [np.zeros((32, 32, 3), np.uint8)] * 6, {"images": f"6 of {source}"}, n_show=2, source=source)
    pred = S.prediction_pass(inp)
    maps = S.maps_and_faithfulness(inp, pred, max_images=3)
    readout, entropy = S.readout_and_entropy(inp, pred)
    got = {s.slug: s.stamp["images"] for s in [S.filters(inp), *S.positions(inp), *maps, readout, entropy]}
    assert got == {"filters": S.NO_IMAGES, "positions": S.NO_IMAGES, "positions_resampled": S.NO_IMAGES,
                   "rollout": f"the first 3 of {source}", "faithfulness": f"the first 3 of {source}",
                   "faithfulness_curves": f"the first 3 of {source}", "readout_attention": f"the first 2 of {source}",
                   "entropy": f"6 of {source}"}
    assert "images: the first 3 of the 6 shipped test images" in stamp_line(maps[1].stamp)


def test_the_faithfulness_text_names_the_methods_that_beat_the_random_map():
    """The faithfulness sections' text names, from the table's means, the methods with a deletion area below the
    random map's and an insertion area above it; without a random map it says nothing."""
    from vitlab.inspect.compare import MethodScores
    from vitlab.report import sections as S

    rows = [MethodScores("rollout", 1.0, 0.20, 0.50, 0.1), MethodScores("occlusion", 1.0, 0.35, 0.30, 0.0),
            MethodScores("random map", 0.0, 0.30, 0.40, None)]
    assert S.faithfulness_sentence(rows) == ("Mean deletion area below the random map's 0.300: rollout; mean "
                                             "insertion area above its 0.400: rollout.")
    rows[1] = MethodScores("occlusion", 1.0, 0.31, 0.30, 0.0)
    assert "below the random map's 0.300: rollout;" in S.faithfulness_sentence(rows)
    assert "above its 0.400: rollout." in S.faithfulness_sentence(rows[:1] + rows[2:])
    assert S.faithfulness_sentence([MethodScores("occlusion", 1.0, 0.5, 0.1, 0.0), rows[2]]).endswith(
        "0.300: none; mean insertion area above its 0.400: none.")
    assert S.faithfulness_sentence(rows[:2]) == ""


def test_the_distance_section_reads_the_prediction_pass_instead_of_a_second_forward():
    """The distance section ran the model over the report's images a second time (mean_attention_distance) after
    the prediction pass had captured the same maps; the prediction pass now reduces them to distances too, so the
    images go through the model once, and the distances are mean_attention_distance's, bit for bit."""
    import numpy as np
    import torch

    from vitlab.inspect import mean_attention_distance
    from vitlab.report import sections as S

    net, x = tiny_vit(), torch.randn(5, 3, 32, 32)
    inp = S.Inputs(net, vitlab.model_info(net), list("abcde"), x, [np.zeros((32, 32, 3), np.uint8)] * 5, {})
    seen = []
    hook = net.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    try:
        section = S.distance(inp, S.prediction_pass(inp))
    finally:
        hook.remove()
    assert seen == [5]
    want = mean_attention_distance(net, x, per_image=True, progress=False)  # (L, B, H)
    assert section.metrics["mean_attention_distance_px"] == want.mean(1).tolist()
    assert section.metrics["std_over_images"] == want.mean(2).std(1).numpy().tolist()


def test_the_distance_and_filter_prose_quote_fractions_in_their_verdicts_units():
    """The report's prose gave the lowest layer's heads and the filters' explained variance in percent while the
    lowest-layer verdict's record (and the CLI table) give the spread as a fraction "of uniform": one unit per
    quantity. The prose now quotes the spread verdict's own statistic and unit, and the shares as fractions."""
    import numpy as np
    import torch

    from vitlab.base.intervals import fmt_value
    from vitlab.findings import model as findings
    from vitlab.report import sections as S

    net, x = tiny_vit(), torch.randn(16, 3, 32, 32)
    inp = S.Inputs(net, vitlab.model_info(net), [str(i) for i in range(16)], x, [np.zeros((32, 32, 3), np.uint8)] * 16,
                   {})
    section = S.distance(inp, S.prediction_pass(inp))
    (spread,) = [v for v in section.verdicts if v.key == findings.KEY_LOWEST_SPREAD]
    assert spread.unit == "of uniform"
    assert f"{spread.quantity} {fmt_value(spread.statistic)} {spread.unit}" in section.ours, section.ours
    assert "%" not in section.ours, section.ours
    filters = S.filters(inp)
    ratio = torch.as_tensor(filters.metrics["explained_variance"])
    assert f"a share {fmt_value(float(ratio.sum()))} of the filters' variance" in filters.ours, filters.ours
    assert "%" not in filters.ours, filters.ours


def test_notebook_07_judges_distances_and_positions_as_the_report_does():
    """Notebook 07 judged each model's distances with the single-convention findings, without their controls, so
    it could call "reproduced" what the report calls inconclusive. It now measures the distances with
    ``distance_conventions`` (the prediction pass's numbers, bit for bit) and judges them and the position table
    with the report's ``distance_verdicts`` and ``position_verdicts``: the same keys, statistics and verdicts."""
    import numpy as np
    import torch

    from vitlab.report import sections as S

    net, x = tiny_vit(), torch.randn(16, 3, 32, 32)
    info = vitlab.model_info(net)
    inp = S.Inputs(net, info, [str(i) for i in range(16)], x, [np.zeros((32, 32, 3), np.uint8)] * 16, {})
    pred = S.prediction_pass(inp)
    conv = judge.distance_conventions(net, x, batch_size=5)  # batches of 5, 5, 5 and 1: the same numbers
    assert list(conv) == list(pred["distance_conventions"])
    for name, d in conv.items():
        torch.testing.assert_close(d, pred["distance_conventions"][name], rtol=1e-6, atol=1e-6)
    section = S.distance(inp, pred)
    mine = judge.distance_verdicts(conv, info)
    assert [(v.key, v.verdict, bool(v.conventions)) for v in mine] == [
        (v.key, v.verdict, bool(v.conventions)) for v in section.verdicts]
    assert [v.statistic for v in mine] == pytest.approx([v.statistic for v in section.verdicts], rel=1e-3, abs=1e-6)
    assert all(v.controls for v in mine)
    report = S.positions(inp)[0].verdicts
    assert [(v.key, v.verdict, v.statistic) for v in judge.position_verdicts(net, info)] == [
        (v.key, v.verdict, v.statistic) for v in report]


def test_the_report_reads_a_convits_blocks_before_its_class_token_joins_over_the_patches():
    """A ConViT's first blocks attend over the patches before its class token joins (the capture gives the class token
    the identity there): the entropy per head averaged that row's 0 nats in with the patches' rows, and the readout
    figure drew the first block, where the class token attends to nothing, as an empty map. The entropy is now the
    mean over the patch rows alone and the readout figure starts at the block the class token joins."""
    import numpy as np

    from vitlab.report import sections as S

    net = tiny_convit()
    x = torch.randn(2, 3, 32, 32)
    inp = S.Inputs(net, vitlab.model_info(net), ["a", "b"], x, [np.zeros((32, 32, 3), np.uint8)] * 2, {}, n_show=2)
    pred = S.prediction_pass(inp)
    want = torch.stack([-(a * a.clamp_min(1e-12).log()).sum(-1).mean(-1).mean(0) for a in convit_raw_attention(net, x)])
    torch.testing.assert_close(pred["entropy"].double(), want, rtol=1e-4, atol=1e-4)
    readout = S.readout_and_entropy(inp, pred)[0]
    assert readout.stamp["settings"]["layers"] == [3, 4]
    assert bool((pred["readout"][[2, 3]].sum((-1, -2)) > 0).all())


def test_the_entropy_figure_names_the_uniform_reference_of_a_convits_blocks_before_its_class_token_joins():
    """The entropy figure drew one 'uniform attention' line at log(1 + N) for every block, but a ConViT's blocks before
    its class token joins attend over the N patches alone (their patch rows are what it plots): their uniform entropy
    is log N. The reference's label now names both, each with its layers; a ViT's stays log T alone."""
    import math

    import numpy as np

    from vitlab.report import sections as S

    net = tiny_convit()  # 8x8 grid, class token joins before block 2 of 4
    x = torch.randn(2, 3, 32, 32)
    inp = S.Inputs(net, vitlab.model_info(net), ["a", "b"], x, [np.zeros((32, 32, 3), np.uint8)] * 2, {}, n_show=2)
    entropy = S.readout_and_entropy(inp, S.prediction_pass(inp))[1]
    (line,) = [s for s in entropy.figure.layout.shapes if s.line.dash == "dash"]
    (label,) = [a.text for a in entropy.figure.layout.annotations]
    assert line.y0 == math.log(65)
    assert f"uniform over 65 tokens: {math.log(65):.2f} nats (layers 3-4)" in label, label
    assert f"over the 64 patches of layers 1-2, before the class token joins: {math.log(64):.2f} nats" in label, label
    vit = tiny_vit()
    assert S.uniform_entropy(vitlab.model_info(vit)) == (math.log(65), f"uniform over 65 tokens: {math.log(65):.2f} nats")


def test_a_convits_positions_in_its_gated_positional_attention_are_named():
    """ConViT's GPSA blocks attend by relative offsets (pos_proj, mixed in by gating_param), which model_info did not
    list: the report said a ConViT without a position-embedding table 'is told nothing about where a patch lies', and
    drew the table of one with it as all it knows of positions. Both now name its gated positional attention."""
    from vitlab.report import sections as S

    for table in (False, True):
        net = tiny_convit(use_pos_embed=table)
        info = vitlab.model_info(net)
        assert info.attention_positions == ("gated positional",)
        text = S.positions(S.Inputs(net, info, [], None, [], {}))[0].ours
        assert "gated positional self-attention over relative offsets" in text and "told nothing" not in text, text
    assert vitlab.model_info(tiny_vit()).attention_positions == ()


def test_a_random_convits_distance_and_readout_text_say_what_its_gpsa_blocks_are():
    """On a random ConViT the distance section read its GPSA blocks' local attention (timm's local_init, by
    construction) beside a verdict calling all attention chance, and the readout figure began at the block the class
    token joins with no word why. The distance text now says those blocks start local by construction, and the
    readout text names the layer the class token joins; a trained ConViT's and a ViT's texts say neither."""
    import numpy as np

    from vitlab.report import sections as S

    x = torch.randn(2, 3, 32, 32)
    for net, untrained in ((tiny_convit(), True), (tiny_convit(), False), (tiny_vit(), True)):
        inp = S.Inputs(net, vitlab.model_info(net), ["a", "b"], x, [np.zeros((32, 32, 3), np.uint8)] * 2, {},
                       n_show=2, untrained=untrained)
        pred = S.prediction_pass(inp)
        gpsa = "In layers 1-2, ConViT's gated positional self-attention starts local by construction"
        assert (gpsa in S.distance(inp, pred).ours) == (untrained and net.__class__.__name__ == "ConVit")
        readout = S.readout_and_entropy(inp, pred)[0].ours
        convit = net.__class__.__name__ == "ConVit"
        assert ("from layer 3, where the class token joins" in readout) == convit, readout


def test_the_reports_facts_say_where_a_convit_learns_positions_and_when_its_class_token_joins():
    """The facts table of a ConViT's report said nothing of positions and '1 prefix token (class)', as for a ViT:
    neither its gated positional self-attention nor that its class token joins after those blocks. A 'positions'
    row now names the table and the GPSA layers, and the prefix token says where it joins; a ViT's say neither."""
    from vitlab.models.card import model_facts

    facts = dict(model_facts(tiny_convit(), vitlab.model_info(tiny_convit()), "convit", False))
    assert facts["positions"] == ("a learned position-embedding table; its attention adds gated positional "
                                  "self-attention over relative offsets (ConViT's GPSA) in layers 1-2")
    assert "1 prefix token (class, joins at layer 3)" in facts["input"]
    net = tiny_convit(use_pos_embed=False)
    assert dict(model_facts(net, vitlab.model_info(net), "c", False))["positions"].startswith(
        "no position-embedding table; its attention adds gated positional")
    facts = dict(model_facts(tiny_vit(), vitlab.model_info(tiny_vit()), "vit", False))
    assert facts["positions"] == "a learned position-embedding table" and "joins" not in facts["input"]


def test_the_two_uniform_entropies_of_a_convit_are_never_printed_alike():
    """On a 14x14 grid the entropy figure's two uniform references, log 197 and log 196 nats, were both printed
    '5.28 nats', two lines of the label naming one number. They now get a third decimal where two would print them
    alike (5.283 and 5.278); an 8x8 grid's stay at two (4.17 and 4.16)."""
    import timm

    from vitlab.report import sections as S

    net = timm.create_model("convit_tiny", pretrained=False, depth=2, local_up_to_layer=1, num_classes=10)
    _, label = S.uniform_entropy(vitlab.model_info(net))
    assert "uniform over 197 tokens: 5.283 nats" in label and "before the class token joins: 5.278 nats" in label
    _, label = S.uniform_entropy(vitlab.model_info(tiny_convit()))
    assert "65 tokens: 4.17 nats" in label and "joins: 4.16 nats" in label


def test_the_faithfulness_text_claims_no_difference_the_table_cannot_show():
    """On a random ConViT every area in the faithfulness table read 0.002, yet the text named all four methods as
    below the random map's 0.002 (and above it), from differences in the fourth decimal. The text now compares the
    areas as the table prints them: equal there, none is named."""
    from vitlab.inspect.compare import MethodScores
    from vitlab.report import sections as S

    rows = [MethodScores("rollout", 1.0, 0.00221, 0.00229, 0.1), MethodScores("occlusion", 1.0, 0.0011, 0.0031, 0.0),
            MethodScores("random map", 0.0, 0.00224, 0.00226, None)]
    assert S.faithfulness_sentence(rows) == ("Mean deletion area below the random map's 0.002: occlusion; mean "
                                             "insertion area above its 0.002: occlusion.")


def test_a_convits_distance_figure_marks_its_gated_positional_layers():
    """A ConViT's distance figure drew its GPSA layers beside its later ones with nothing to tell them apart, though
    the step between them is that of two kinds of attention. Its subtitle now names the GPSA layers; a ViT's does not."""
    import numpy as np

    from vitlab.report import sections as S

    x = torch.randn(2, 3, 32, 32)
    for net, note in ((tiny_convit(), "; layers 1-2: gated positional self-attention (GPSA)</sup>"), (tiny_vit(), "")):
        inp = S.Inputs(net, vitlab.model_info(net), ["a", "b"], x, [np.zeros((32, 32, 3), np.uint8)] * 2, {})
        title = S.distance(inp, S.prediction_pass(inp)).figure.layout.title.text
        assert title.endswith(f"dashed: uniform attention{note}" if note else "dashed: uniform attention</sup>"), title
