"""benchmarks/run.py: a partial run prints and keeps its own JSON but never replaces a published section."""

from __future__ import annotations

import json

import pytest

from benchmarks import run as bench

PUBLISHED = "\n".join(f"<!-- {n}:start -->\nOLD {n}\n<!-- {n}:end -->" for n in ("machine", "speed", "coverage"))
OFF = ["--no-train", "--no-inspect", "--no-probe"]
WRITE_COVERAGE_JSON = bench.coverage.write_json


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    """The benchmarks replaced by stubs that record their arguments: only the publishing rules run."""
    calls = []
    monkeypatch.setattr(bench.speed, "run_speed", lambda models, batch, repeats: calls.append(
        ("speed", models, batch, repeats)) or [])
    monkeypatch.setattr(bench.speed, "to_json", lambda rows: [])
    monkeypatch.setattr(bench, "speed_section", lambda rows, repeats, info: "NEW speed")
    monkeypatch.setattr(bench.coverage, "timed_coverage", lambda pattern, limit: calls.append(
        ("coverage", pattern, limit)) or ([], {}, 1.0))
    monkeypatch.setattr(bench.coverage, "write_json", lambda path, *a: path.write_text("{}"))
    monkeypatch.setattr(bench, "coverage_section", lambda *a: "NEW coverage")
    monkeypatch.setattr(bench, "summary_table", lambda rows, summary: "")
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(PUBLISHED)
    return md, tmp_path / "results", calls


def test_a_partial_run_leaves_the_published_sections(stubbed, capsys):
    md, results, calls = stubbed
    common = ["--results", str(results), "--markdown", str(md), *OFF]
    assert bench.main([*common, "--batch", "8", "--repeats", "2", "--filter", "deit*"]) == 0
    assert calls == [("speed", bench.speed.DEFAULT_MODELS, 8, 2), ("coverage", "deit*", None)]
    assert md.read_text() == PUBLISHED  # the machine section too: it would name a run whose numbers are not there
    assert sorted(p.name for p in results.iterdir()) == ["capture_coverage.partial.json", "capture_speed.partial.json"]
    assert "a partial run" in capsys.readouterr().out
    assert bench.main([*common, "--no-coverage", "--models", "vit_tiny_patch16_224"]) == 0
    assert md.read_text() == PUBLISHED


def test_other_train_steps_or_inspect_model_are_partial_too(stubbed, monkeypatch):
    md, results, _ = stubbed
    monkeypatch.setattr(bench.train_speed, "run", lambda steps: {"data": "d", "steps": steps, "threads": 2})
    monkeypatch.setattr(bench.train_speed, "format_table", lambda res: "NEW train")
    monkeypatch.setattr(bench.inspect_speed, "run", lambda name: {"model": name, "img_size": [224], "threads": 2})
    monkeypatch.setattr(bench.inspect_speed, "format_table", lambda res: "NEW inspect")
    base = ["--results", str(results), "--markdown", str(md), "--no-speed", "--no-coverage", "--no-probe"]
    assert bench.main([*base, "--train-steps", "3", "--inspect-model", "vit_tiny_patch16_224"]) == 0
    assert md.read_text() == PUBLISHED
    assert {"train_speed.partial.json", "inspect_speed.partial.json"} <= {p.name for p in results.iterdir()}
    assert bench.main(base) == 0  # the defaults: both sections published
    text = md.read_text()
    assert "NEW train" in text and "NEW inspect" in text and "OLD speed" in text


def test_a_full_section_is_published_with_the_machine(stubbed):
    md, results, _ = stubbed
    assert bench.main(["--results", str(results), "--markdown", str(md), "--no-coverage", *OFF]) == 0
    text = md.read_text()
    assert "NEW speed" in text and "OLD coverage" in text and "OLD machine" not in text
    assert "--no-coverage" in text  # the machine section names the command
    saved = json.loads((results / "capture_speed.json").read_text())
    assert saved["rows"] == [] and {"cpu", "date"} <= set(saved["machine"])
    assert not list(md.parent.glob(".BENCHMARKS.md.*"))  # written in one step, no temporary left



def test_each_section_and_its_json_carry_the_machine_as_it_was_before_that_benchmark(stubbed, monkeypatch):
    """'load average at the start' is the load before the benchmark's own work: the train, inspect and probe
    sections were stamped after their run (BENCHMARKS.md's train section named 13:08 and the load its own run had
    left, its JSON 13:04), and the coverage JSON with the time it was written."""
    md, results, _ = stubbed
    clock = iter(range(1000))

    def machine_info():
        return {"cpu": "c", "cores": 2, "torch_threads": 2, "torch": "t", "timm": "t", "python": "p",
                "date": f"t{next(clock)}", "load_average": "x"}

    started = {}

    def benchmark(name, res):
        def run(*args, **kwargs):
            started[name] = next(clock)  # the stamp of the benchmark's start is read just before this
            next(clock)  # time passes while it runs
            return dict(res)
        return run

    monkeypatch.setattr(bench, "machine_info", machine_info)
    monkeypatch.setattr(bench.coverage, "machine_info", machine_info)
    monkeypatch.setattr(bench.coverage, "write_json", WRITE_COVERAGE_JSON)  # the real one, which the fixture stubs
    cover = benchmark("coverage", {})
    monkeypatch.setattr(bench.coverage, "timed_coverage", lambda pattern, limit: (cover(), ([], {}, 1.0))[1])
    monkeypatch.setattr(bench, "coverage_section", lambda results, summary, seconds, info: bench.stamp(info))
    monkeypatch.setattr(bench.train_speed, "run", benchmark("train", {"data": "d", "steps": 12, "threads": 2}))
    monkeypatch.setattr(bench.inspect_speed, "run", benchmark("inspect", {"model": "m", "img_size": [224],
                                                                          "threads": 2}))
    monkeypatch.setattr(bench.probe_speed, "run", benchmark("probe", {"train": 1, "test": 1, "data": "d", "seeds": 1,
                                                                      "threads": 2}))
    for module in (bench.train_speed, bench.inspect_speed, bench.probe_speed):
        monkeypatch.setattr(module, "format_table", lambda res: "")
    assert bench.main(["--results", str(results), "--markdown", str(md), "--no-speed"]) == 0
    text = md.read_text()
    for name, file in [("coverage", "capture_coverage"), ("train", "train_speed"), ("inspect", "inspect_speed"),
                       ("probe", "probe_speed")]:
        before = f"t{started[name] - 1}"
        assert json.loads((results / f"{file}.json").read_text())["machine"]["date"] == before, name
        section = text.split(f"<!-- {name}:start -->\n")[1]
        assert section.startswith(f"Measured {before}, "), (name, section[:40])
