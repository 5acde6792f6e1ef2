"""Scaling sweeps: results store, resume after a kill, failures recorded, local and Ray executors."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from vitlab.base.records import RecordFileError, TornLineWarning
from vitlab.cli import main
from vitlab.studies.scaling import SWEEPS, ResultsStore, RunSpec, SweepConfig, check_executor, run_sweep, summarise

QUICK = SWEEPS["quick"]


def test_store_appends_tolerates_a_torn_line_and_keeps_the_latest(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    store.append({"run_id": "a", "status": "failed", "sweep": "s"})
    with open(store.path, "a") as f:
        f.write('{"run_id": "b", "sta')  # a crash mid-write
    with pytest.warns(TornLineWarning) as torn:
        assert [r["run_id"] for r in store.records()] == ["a"]
    assert torn[0].message.line == 2
    with pytest.warns(TornLineWarning):  # dropped, not left in the middle where the reader would refuse it
        store.append({"run_id": "a", "status": "ok", "sweep": "s"})
    assert [r["run_id"] for r in store.records()] == ["a", "a"]
    assert store.latest()["a"]["status"] == "ok" and store.done("s") == {"a"} and store.done("other") == set()
    store.append({"run_id": "a", "status": "failed", "sweep": "other"})  # another sweep in the same file
    assert store.done("s") == {"a"}
    assert store.path.read_text().count("\n") == 3  # the torn line was dropped before the next record


@pytest.mark.parametrize("command", [["sweep", "--config", "quick", "--table"], ["mpp-study", "--study", "smoke",
                                                                                 "--table"]])
def test_a_file_that_is_no_results_store_is_named_not_a_traceback(command, tmp_path, capsys):
    """`--results CHECKPOINT/config.json` (indented JSON: some of its lines parse as numbers) failed with
    "AttributeError: 'float' object has no attribute 'get'" and a traceback."""
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"mean": [0.5, 0.25]}, indent=2))
    before = other.read_text()
    assert main([*command, "--results", str(other)]) == 1
    assert capsys.readouterr().err.startswith(f"vitlab {command[0]}: RecordFileError: {other}, line 1: ")
    assert other.read_text() == before
    with pytest.raises(RecordFileError) as e:
        ResultsStore(other).records()
    assert (e.value.path, e.value.line, isinstance(e.value, ValueError)) == (str(other), 1, True)
    assert e.value.fix.startswith(f"{other} is not a results store")


def test_a_torn_line_of_garbage_bytes_is_skipped_too(tmp_path):
    """A crash can leave bytes that are not UTF-8 at the end of the store (a page of garbage after a power loss):
    reading it raised UnicodeDecodeError and lost every record; that line is now skipped like any torn one."""
    store = ResultsStore(tmp_path / "r.jsonl")
    store.append({"run_id": "a", "status": "ok", "sweep": "s"})
    with open(store.path, "ab") as f:
        f.write(b'{"run_id": "b", \xff\xfe\x00\x9c')
    with pytest.warns(TornLineWarning):
        store.append({"run_id": "c", "status": "ok", "sweep": "s"})
    assert [r["run_id"] for r in store.records()] == ["a", "c"] and store.done("s") == {"a", "c"}


def test_sweep_runs_resumes_and_skips_finished_runs(tmp_path):
    results = tmp_path / "r.jsonl"
    new = run_sweep(QUICK, results, workers=0, progress=False)
    assert sorted(r["run_id"] for r in new) == sorted(s.run_id for s in QUICK.runs())
    for r in new:
        assert r["status"] == "ok", r.get("traceback")
        assert set(r["metrics"]["few_shot"]) == {"1", "5"}
        assert r["provenance"]["torch"] and r["config"]["name"] == "quick"
        assert r["metrics"]["steps"] == {40: 2, 80: 5}[r["spec"]["size"]]  # one epoch of n // 16 batches
    assert run_sweep(QUICK, results, workers=0, progress=False) == []  # all done: nothing reruns
    # a sweep killed during its last run: that run's line was never written (or was torn)
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])
    again = run_sweep(QUICK, results, workers=0, progress=False)
    assert [r["run_id"] for r in again] == [json.loads(lines[-1])["run_id"]]
    assert len(ResultsStore(results).done("quick", QUICK.fingerprint())) == len(QUICK.runs())


def test_a_changed_config_is_not_taken_as_done(tmp_path):
    results = tmp_path / "r.jsonl"
    one = dataclasses.replace(QUICK, families=("vit_tiny",), sizes=(40,))
    assert len(run_sweep(one, results, workers=0, progress=False)) == 1
    assert run_sweep(one, results, workers=0, progress=False) == []
    changed = dataclasses.replace(one, epochs=2)  # same name, other settings: its old result does not count
    assert [r["run_id"] for r in run_sweep(changed, results, workers=0, progress=False)] == ["vit_tiny-n40-s0"]
    assert ResultsStore(results).done("quick", changed.fingerprint()) == {"vit_tiny-n40-s0"}


def test_a_failed_run_is_recorded_and_the_others_go_on(tmp_path, capsys):
    sweep = dataclasses.replace(QUICK, name="bad", families=("vit_tiny",), sizes=(40, 10**6))
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(dataclasses.asdict(sweep)))
    results = tmp_path / "r.jsonl"
    assert main(["sweep", "--config", str(cfg), "--results", str(results), "--workers", "0", "--quiet"]) == 1
    latest = ResultsStore(results).latest("bad")
    assert latest["vit_tiny-n40-s0"]["status"] == "ok"
    failed = latest["vit_tiny-n1000000-s0"]
    assert failed["status"] == "failed" and "exceeds the 4000 pre-training images" in failed["error"]
    assert "failed vit_tiny-n1000000-s0" in capsys.readouterr().out


def test_summarise_means_and_spreads_over_seeds():
    def rec(fam, n, seed, acc, status="ok"):
        return {"status": status, "spec": {"family": fam, "size": n, "seed": seed},
                "metrics": {"few_shot": {"10": {"mean": acc}}}}

    s = summarise([rec("vit", 100, 0, 0.5), rec("vit", 100, 1, 0.7), rec("vit", 50, 0, 0.4),
                   rec("bit", 100, 0, 0.9, status="failed")], shots=10)
    assert set(s) == {"vit"} and list(s["vit"]) == [50, 100]
    assert s["vit"][100]["mean"] == pytest.approx(0.6) and s["vit"][100]["std"] == pytest.approx(0.1414213, 1e-5)
    assert s["vit"][50] == {"mean": 0.4, "std": 0.0, "n": 1, "values": [0.4]}


def test_summarise_compute_means_the_flops_of_the_finished_runs_that_counted_them():
    from vitlab.studies.scaling import summarise_compute

    def rec(fam, n, flops, status="ok"):
        return {"status": status, "spec": {"family": fam, "size": n}, "metrics": {"pretrain_flops": flops}}

    got = summarise_compute([rec("vit", 100, 1e9), rec("vit", 100, 3e9), rec("vit", 50, 5e8), rec("vit", 50, None),
                             rec("bit", 100, 7e9, status="failed")])
    assert got == {"vit": {50: 5e8, 100: 2e9}}


def test_classes_given_out_of_order_keep_each_image_with_its_class_name():
    """Probe classes (2, 0): the images of class 2 become class 0 and are named as class 2 was, those of class 0
    become class 1; class 1 is left out."""
    import torch

    from vitlab.data.datasets import ImageArray
    from vitlab.studies.scaling import _classes

    data = ImageArray(torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1).expand(6, 2, 2, 3).clone(),
                      torch.tensor([0, 1, 2, 0, 1, 2]), ("cat", "dog", "frog"), "toy")
    sub = _classes(data, (2, 0))
    assert sub.classes == ("frog", "cat")
    assert {int(img[0, 0, 0]): int(y) for img, y in zip(sub.images, sub.labels)} == {2: 0, 5: 0, 0: 1, 3: 1}


def test_newest_sweep_never_mixes_configs_and_summarise_refuses_a_mix(tmp_path):
    """A rerun under a new config (fingerprint) that was killed part-way: the figure takes the newest config's
    rows only, and summarise refuses to average rows of two configs."""
    def rec(run, fp, finished, acc):
        return {"run_id": run, "sweep": "s", "fingerprint": fp, "finished": finished, "status": "ok",
                "spec": {"family": "vit", "size": 100, "seed": int(run[-1])},
                "metrics": {"few_shot": {"10": {"mean": acc}}}}

    store = ResultsStore(tmp_path / "r.jsonl")
    for r in (rec("vit-n100-s0", "old", "2026-01-01T00:00", 0.5), rec("vit-n100-s1", "old", "2026-01-01T00:01", 0.6),
              rec("vit-n100-s0", "new", "2026-02-01T00:00", 0.9)):
        store.append(r)
    newest = store.newest_sweep()
    assert list(newest) == ["vit-n100-s0"] and newest["vit-n100-s0"]["fingerprint"] == "new"
    assert summarise(list(newest.values()))["vit"][100]["mean"] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="records of 2 sweep configs"):
        summarise(list(store.latest().values()))
    assert ResultsStore(tmp_path / "none.jsonl").newest_sweep() == {}


def test_sweep_config_is_checked():
    with pytest.raises(ValueError, match="both pre-training and probe"):
        run_sweep(dataclasses.replace(QUICK, probe_classes=(1, 2)), "unused.jsonl")
    with pytest.raises(ValueError, match="unknown model families"):
        run_sweep(dataclasses.replace(QUICK, families=("vit_huge",)), "unused.jsonl")
    with pytest.raises(ValueError, match=r"pretrain_classes names a class twice \(\[0, 0, 1\]\)"):
        run_sweep(dataclasses.replace(QUICK, pretrain_classes=(0, 0, 1)), "unused.jsonl")


def test_sweep_class_indices_and_max_evals_that_are_no_whole_numbers_are_refused():
    """SweepConfig took pretrain_classes=(0, True) as classes 0 and 1 (a bool is an int to Python, and True == 1 in
    the class sets), a fraction or 1.0 for a class index, and max_evals=True as one validation pass; each is now
    refused by name before any run."""
    for bad in ((0, True), (0, 1.0), (0, 1.5), (0, -1)):
        with pytest.raises(ValueError, match=r"class indices \(whole numbers from 0\), got "
                                             + re.escape(f"{list(bad)} and {list(QUICK.probe_classes)}")):
            run_sweep(dataclasses.replace(QUICK, pretrain_classes=bad), "unused.jsonl")
    for bad in (True, 2.0, 0):
        with pytest.raises(ValueError, match=f"max_evals must be a whole number of at least 1, got {bad!r}"):
            run_sweep(dataclasses.replace(QUICK, max_evals=bad), "unused.jsonl")
    dataclasses.replace(QUICK, pretrain_classes=(0, 1), max_evals=1)


def test_sweep_seeds_sizes_and_shots_that_are_no_whole_numbers_are_refused_before_any_run(tmp_path):
    """SweepConfig.validate took seeds=(True,) as seed 1, probe_seeds=(0, 1.5) and sizes=(40, 80.0) until a subset
    or a probe refused them after the runs before had trained, no seeds at all as a sweep of no runs, a NumPy seed
    until its run's record could not be written, and no shots as max()'s "empty sequence"; each is now refused by
    name before any run (the store is not even created)."""
    import numpy as np

    store = tmp_path / "never.jsonl"
    for name, bad in (("seeds", (True,)), ("seeds", (0, 0.5)), ("seeds", ()), ("seeds", (np.int64(0),)),
                      ("probe_seeds", (0, 1.5)), ("probe_seeds", (False, 1)), ("probe_seeds", ()),
                      ("sizes", (40, 80.0)), ("sizes", (0, 40)), ("sizes", (True, 40)), ("sizes", ()),
                      ("shots", (True, 5)), ("shots", (2.5,)), ("shots", ()), ("shots", (0, 5))):
        with pytest.raises(ValueError, match=re.escape(f"{name} must be a non-empty list of whole numbers")
                                             + f".*got {re.escape(str(list(bad)))}$"):
            run_sweep(dataclasses.replace(QUICK, **{name: bad}), store)
        assert not store.exists()
    dataclasses.replace(QUICK, seeds=(-1, 3), probe_seeds=(7,), sizes=(1, 80), shots=(1,))


def test_a_sweep_seed_size_or_probe_seed_given_twice_is_refused():
    """seeds=(0, 0) or sizes=(40, 80, 40) trained those runs twice under one run id, and probe_seeds=(1, 1) counted
    one draw twice, its spread 0 over "2 seeds"; each is now refused before any run. A shot count twice is one."""
    for name, bad, why in (("seeds", (0, 0), "its runs train twice under one run id"),
                           ("sizes", (40, 80, 40), "its runs train twice under one run id"),
                           ("probe_seeds", (1, 1), "its probe draw counts twice")):
        with pytest.raises(ValueError, match=re.escape(f"{name} names a value twice ({list(bad)}): each once, or {why}")):
            dataclasses.replace(QUICK, **{name: bad})
    dataclasses.replace(QUICK, shots=(1, 1, 5))
    with pytest.raises(ValueError, match=re.escape("families names a value twice (['vit', 'bit', 'vit']): each once")):
        dataclasses.replace(QUICK, families=("vit", "bit", "vit"))
    with pytest.raises(ValueError, match="families must name at least one model family: choose from"):
        dataclasses.replace(QUICK, families=())


def test_sweep_shots_must_be_among_the_sweeps_own(tmp_path, capsys):
    """--shots K that the sweep never probed: an error naming its shots, not an empty summary or a verdict that
    finds no sizes."""
    assert main(["sweep", "--config", "quick", "--results", str(tmp_path / "q.jsonl"), "--table", "--shots", "7"]) == 1
    assert f"probes {list(QUICK.shots)}-shot only" in capsys.readouterr().err
    store = ResultsStore(tmp_path / "q.jsonl")  # no --shots on a sweep that never probed 10-shot: its largest
    for spec in QUICK.runs():
        store.append({"run_id": spec.run_id, "sweep": QUICK.name, "fingerprint": "f", "status": "ok",
                      "spec": dataclasses.asdict(spec), "metrics": {"few_shot": {str(max(QUICK.shots)): {"mean": 0.5}},
                                                                     "train_seconds": 1.0}})
    main(["sweep", "--config", "quick", "--results", str(tmp_path / "q.jsonl"), "--table"])
    assert f"{max(QUICK.shots)}-shot accuracy on the held-out classes" in capsys.readouterr().out
    assert RunSpec("vit", 500, 1).run_id == "vit-n500-s1"
    assert len(SweepConfig("x").runs()) == 2 * 5 * 2


def test_tuning_freezes_the_best_recipe_and_runs_report_their_best_validation_epoch(tmp_path, capsys):
    import dataclasses

    from vitlab.studies.scaling import SWEEPS, ResultsStore, run_sweep, summarise_compute
    from vitlab.studies.tuning import tune

    sweep = dataclasses.replace(SWEEPS["quick"], families=("vit_tiny",), val_per_class=5, epochs=2)
    grid = {"vit_tiny": (("adamw", 1e-3, 0.05), ("adamw", 1e-2, 0.05))}
    tuned = tune(sweep, tmp_path / "tuning.jsonl", grid=grid, progress=False)
    trials = [r for r in ResultsStore(tmp_path / "tuning.jsonl").records() if r["status"] == "ok"]
    assert len(trials) == 2
    best = max(trials, key=lambda r: r["metrics"]["best"]["val_accuracy"])
    rec = best["metrics"]["recipe"]
    assert tuned.recipes == (("vit_tiny", rec["optimizer"], rec["lr"], rec["weight_decay"]),)
    assert tune(sweep, tmp_path / "tuning.jsonl", grid=grid, progress=False) == tuned  # trials are not rerun
    assert len(ResultsStore(tmp_path / "tuning.jsonl").records()) == 2
    # the same trials in a local pool of two worker processes, both submitted at once (the sweep's executor, as
    # `run_sweep(..., workers=2)` runs a grid): both finish, with the same validation accuracies and choice
    pooled = tune(sweep, tmp_path / "pooled.jsonl", grid=grid, progress=False, workers=2)
    assert pooled == tuned
    assert sorted(r["status"] for r in ResultsStore(tmp_path / "pooled.jsonl").records()) == ["ok", "ok"]
    val = lambda path: sorted(r["metrics"]["best"]["val_accuracy"] for r in ResultsStore(path).records())  # noqa: E731
    assert val(tmp_path / "pooled.jsonl") == val(tmp_path / "tuning.jsonl")
    new = run_sweep(tuned, tmp_path / "sweep.jsonl", workers=0, progress=False)
    for r in new:
        m = r["metrics"]
        assert r["status"] == "ok" and 1 <= m["best"]["epoch"] <= m["epochs"]
        assert m["pretrain_test_accuracy"] is None  # never selected or reported on the test images
        assert m["pretrain_flops"] > 0 and m["train_cpu_seconds"] > 0
        assert m["recipe"] == dict(zip(("optimizer", "lr", "weight_decay"), tuned.recipes[0][1:]))
    compute = summarise_compute(new)
    assert set(compute["vit_tiny"]) == set(sweep.sizes)
    flops = {r["spec"]["size"]: r["metrics"]["pretrain_flops"] for r in new}
    assert flops[80] > flops[40]  # more images, more steps at the same cost per step
    # `vitlab sweep --table`: the grid, the tuning trials with the frozen winner marked, from the stores alone
    import json

    from vitlab.cli import main
    from vitlab.studies.scaling import markdown_table, summarise
    from vitlab.studies.tuning import tuning_table

    (tmp_path / "tuned.json").write_text(json.dumps(dataclasses.asdict(tuned)))
    (tmp_path / "sweep.tuning.jsonl").write_bytes((tmp_path / "tuning.jsonl").read_bytes())
    assert main(["sweep", "--config", str(tmp_path / "tuned.json"), "--results", str(tmp_path / "sweep.jsonl"),
                 "--table", "--shots", "5", "--plot", str(tmp_path / "curves.html")]) == 0
    out = capsys.readouterr().out
    assert "against pre-training compute" in (tmp_path / "curves.html").read_text()  # both panels, from the store
    assert "2 of 2 runs finished, 0 failed" in out and markdown_table(summarise(new, 5)) in out
    table = tuning_table(ResultsStore(tmp_path / "tuning.jsonl").records(), 5, tuned.recipes)
    assert table in out and table.count("**yes**") == 1
    winner = next(line for line in table.splitlines() if "**yes**" in line)
    assert f"| {rec['lr']:g} |" in winner


def test_fingerprint_changes_with_the_code(monkeypatch):
    from vitlab.base import provenance
    from vitlab.studies.scaling import SWEEPS

    before = SWEEPS["quick"].fingerprint()
    monkeypatch.setattr(provenance, "code_hash", lambda: "different code")
    assert SWEEPS["quick"].fingerprint() != before


def test_code_hash_is_the_code_the_process_imported(tmp_path):
    """A long run stamps the code it loaded: editing the package's files afterwards changes ``source_hash`` (what a
    new process would load) but not the running process's ``code_hash``."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import vitlab

    pkg = tmp_path / "vitlab"
    shutil.copytree(Path(vitlab.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    from vitlab.base.provenance import source_hash

    copied = source_hash()  # the copy's files, before the edit (the same names and contents as this package's)
    script = (f"import vitlab.base.provenance as p, pathlib; assert p.__file__.startswith({str(tmp_path)!r}); "
              f"f = pathlib.Path({str(pkg / 'base' / 'stats.py')!r}); f.write_text(f.read_text() + '# edited'); "
              "print(p.code_hash(), p.source_hash())")  # asked for the first time after the edit
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    stamped, now = out.stdout.split()
    assert stamped == copied != now


def test_every_family_gets_a_training_config_with_the_sweeps_classes():
    import vitlab
    from vitlab.studies.scaling import FAMILIES, SWEEPS, RunSpec, _train_config

    sweep = SWEEPS["cifar10"]
    for family in ("vit", "bit", "hybrid"):
        assert family in FAMILIES
        cfg = _train_config(sweep, RunSpec(family, 250, 0), 250)
        model = vitlab.build_model(cfg.model)
        assert model.num_classes == len(sweep.pretrain_classes)
    # validation at most max_evals times per run, always at the last epoch: 250 images train 150 one-step epochs
    for n, epochs, every in ((100, 150, 10), (250, 150, 10), (1000, 22, 2), (5000, 10, 1)):
        cfg = _train_config(sweep, RunSpec("vit", n, 0), n)
        assert (cfg.epochs, cfg.eval_every) == (epochs, every) and cfg.keep_best
        assert len([e for e in range(cfg.epochs) if (e + 1) % every == 0 or e + 1 == epochs]) <= sweep.max_evals
        assert cfg.warmup_epochs == 1.0  # one epoch of warmup, at most a fifth of the run
    quick = _train_config(SWEEPS["quick"], RunSpec("vit_tiny", 40, 0), 40)  # 2 steps of 16 images, 1 epoch
    assert (quick.epochs, quick.batch_size, quick.warmup_epochs) == (1, 16, 0.2)  # a fifth of its one epoch


def test_the_shipped_sweep_meets_the_issues_design():
    """At least 5 nested sizes over at least 50x, 3 seeds, three families, a validation split, and the same number
    of tuning recipes for every family (an equal chance), within the training-image budget its comment states."""
    from vitlab.studies.scaling import SWEEPS, RunSpec, _train_config
    from vitlab.studies.tuning import TUNING_GRID

    sweep = SWEEPS["cifar10"]
    assert len(sweep.sizes) >= 5 and max(sweep.sizes) / min(sweep.sizes) >= 50 and len(sweep.seeds) >= 3
    assert set(sweep.families) == {"vit", "bit", "hybrid"} and sweep.val_per_class > 0
    assert {len(TUNING_GRID[f]) for f in sweep.families} == {4}
    assert {o for o, _, _ in TUNING_GRID["bit"]} == {"adamw", "sgd"}

    def images(spec):
        cfg = _train_config(sweep, spec, spec.size)
        return cfg.epochs * (spec.size // cfg.batch_size) * cfg.batch_size

    grid = sum(images(s) for s in sweep.runs())
    tuning = sum(len(TUNING_GRID[f]) * images(RunSpec(f, max(sweep.sizes), 0)) for f in sweep.families)
    assert (round(grid / 1e6, 2), round(tuning / 1e6, 2)) == (1.33, 0.60)  # the figures the comment states


def test_percent_cell_known_answers_and_the_sweep_table_uses_it():
    from vitlab.base.stats import percent_cell
    from vitlab.studies.scaling import markdown_table, summarise

    assert percent_cell([0.5]) == "50.0 ± 0.0"
    assert percent_cell([0.40, 0.42, 0.44]) == "42.0 ± 2.0"  # sample std of 40, 42, 44 is 2
    assert percent_cell([0.1, 0.2]) == "15.0 ± 7.1"  # sqrt(50) = 7.07
    with pytest.raises(ValueError, match="no values"):
        percent_cell([])
    recs = [{"status": "ok", "spec": {"family": "vit", "size": 250}, "metrics": {"few_shot": {"10": {"mean": m}}}}
            for m in (0.40, 0.42, 0.44)]
    assert markdown_table(summarise(recs, 10)) == "| family | 250 |\n|---|---|\n| vit | 42.0 ± 2.0 |"


def test_tuning_table_orders_by_grid_marks_the_winner_and_shows_failures():
    from vitlab.studies.tuning import tuning_table

    def rec(fam, opt, lr, wd, val=None, epoch=3):
        ok = val is not None
        return {"sweep": "s-tune", "fingerprint": f"{fam}{opt}{lr}{wd}", "run_id": f"{fam}-n5000-s0",
                "status": "ok" if ok else "failed", "spec": {"family": fam}, "config": {"recipes": [[fam, opt, lr, wd]]},
                "metrics": {"best": {"val_accuracy": val, "epoch": epoch}, "epochs": 10,
                            "few_shot": {"10": {"per_seed": [0.4, 0.42, 0.44]}}} if ok else None}

    records = [rec("bit", "sgd", 0.1, 5e-4, 0.70), rec("bit", "adamw", 0.003, 0.05, 0.70),  # a tie: grid order wins
               rec("bit", "adamw", 0.001, 0.05, 0.60), rec("bit", "sgd", 0.03, 5e-4)]  # the last one failed
    lines = tuning_table(records).splitlines()[2:]
    assert [line.split(" | ")[1:4] for line in lines] == [["adamw", "0.001", "0.05"], ["adamw", "0.003", "0.05"],
                                                         ["sgd", "0.03", "0.0005"], ["sgd", "0.1", "0.0005"]]
    assert [("**yes**" in line) for line in lines] == [False, True, False, False]
    assert "| failed |" in lines[2] and "| 70.0% | 3 of 10 | 42.0 ± 2.0 |" in lines[1]
    marked = tuning_table(records, chosen=[("bit", "sgd", 0.1, 0.0005)]).splitlines()[2:]  # the frozen config decides
    assert [("**yes**" in line) for line in marked] == [False, False, False, True]
    # a re-tuning under new code: only the newest code version's trials, each once, its own winner marked
    old = [{**r, "provenance": {"code_hash": "old"}} for r in records]
    new = [{**rec("bit", "adamw", 0.001, 0.05, 0.90), "fingerprint": "n1"},
           {**rec("bit", "adamw", 0.003, 0.05, 0.50), "fingerprint": "n2"}]
    new = [{**r, "provenance": {"code_hash": "new"}} for r in new]
    lines = tuning_table(old + new).splitlines()[2:]
    assert len(lines) == 2 and "| 90.0% |" in lines[0] and "**yes**" in lines[0] and "**yes**" not in lines[1]


def test_sweep_table_refuses_rows_of_two_configs(tmp_path, capsys):
    store = ResultsStore(tmp_path / "q.jsonl")
    for i, spec in enumerate(QUICK.runs()[:2]):
        store.append({"run_id": spec.run_id, "sweep": QUICK.name, "fingerprint": f"f{i}", "status": "ok",
                      "spec": dataclasses.asdict(spec), "metrics": {"few_shot": {"5": {"mean": 0.5}},
                                                                     "train_seconds": 1.0}})
    assert main(["sweep", "--config", "quick", "--results", str(tmp_path / "q.jsonl"), "--table"]) == 1
    err = capsys.readouterr().err
    assert "rows of several configs or code versions" in err and "records of 2 sweep configs" in err


def test_a_dead_worker_fails_its_own_run_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """The first run's worker process dies. That run is recorded as crashed; the three after it still run in a new
    pool (here each fails fast on its missing data, an ordinary failed record), instead of all four being recorded
    as "worker crashed" by the broken pool."""
    import os

    from _reference import CrashFirstWorker

    from vitlab.studies.scaling import execute_runs

    monkeypatch.setenv("VITLAB_TEST_CRASH_FLAG", str(tmp_path / "crashed"))
    monkeypatch.setenv("VITLAB_TEST_PARENT_PID", str(os.getpid()))
    sweep = CrashFirstWorker("crash", data=str(tmp_path / "no-such-data"))
    records: list[dict] = []
    execute_runs([(sweep, RunSpec("vit", n, 0)) for n in (10, 20, 30, 40)], records.append, "local", 1)
    assert [r["spec"]["size"] for r in records] == [10, 20, 30, 40]
    assert records[0]["error"].startswith("worker crashed: BrokenProcessPool")
    assert all(r["status"] == "failed" and "worker crashed" not in r["error"] for r in records[1:])


def test_a_pool_that_breaks_between_runs_loses_no_run(tmp_path, monkeypatch):
    """A worker can die while the parent records another run: the next submit then finds the pool broken. That run
    goes to a new pool (it never started); a pool that breaks before taking any run records it, so the sweep ends."""
    import concurrent.futures as cf
    from concurrent.futures.process import BrokenProcessPool

    from vitlab.studies.scaling import execute_runs

    class Pool(InlinePool):  # runs each job in this process; the submits listed in `breaks` find the pool broken
        calls = 0
        breaks: set[int] = set()

        def submit(self, fn, *args):
            Pool.calls += 1
            if Pool.calls in Pool.breaks:
                raise BrokenProcessPool("a child process terminated abruptly")
            fut = cf.Future()
            fut.set_result(fn(*args))
            return fut

    monkeypatch.setattr(cf, "ProcessPoolExecutor", Pool)
    sweep = dataclasses.replace(QUICK, data=str(tmp_path / "no-such-data"))
    jobs = [(sweep, RunSpec("vit", n, 0)) for n in (10, 20, 30, 40)]
    records: list[dict] = []
    Pool.breaks = {2}  # the second submit: run 20 waits for the next pool and runs there
    execute_runs(jobs, records.append, "local", 2)
    assert sorted(r["spec"]["size"] for r in records) == [10, 20, 30, 40]
    assert not any("worker crashed" in r["error"] for r in records)
    Pool.calls, Pool.breaks, records = 0, {1, 2, 3, 4, 5, 6, 7, 8}, []  # every pool broken from the start
    execute_runs(jobs, records.append, "local", 2)
    assert [r["spec"]["size"] for r in records] == [10, 20, 30, 40]
    assert all(r["error"].startswith("worker crashed: BrokenProcessPool") for r in records)


# ---------------------------------------------------------------------------------------------- tuning, stubbed
# The tests below stub ``run_one`` (the training and probing) in this process (``workers=0``): the records, stores,
# fingerprints and checks around it are the real ones, at no training cost.



class InlinePool:
    """A stand-in for ``ProcessPoolExecutor`` (same constructor, a context manager): subclasses run each submitted job
    in this process."""

    def __init__(self, max_workers, mp_context, initializer=None, initargs=()):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

def _stub_runs(monkeypatch, val=lambda sweep, spec: 0.5, fail=lambda sweep, spec: None) -> list:
    """Replace ``run_one`` with a stub returning metrics of a run (validation accuracy ``val(sweep, spec)``) or
    raising ``fail(sweep, spec)`` where that is not None; returns the list of (sweep, spec) it was called with."""
    from vitlab.studies import scaling

    calls: list = []

    def run_one(sweep, spec, work_dir=None, device=None):
        calls.append((sweep, spec))
        err = fail(sweep, spec)
        if err is not None:
            raise err
        acc = val(sweep, spec)
        return {"few_shot": {str(k): {"mean": acc, "std": 0.0, "per_seed": [acc] * len(sweep.probe_seeds)}
                             for k in sweep.shots},
                "best": {"epoch": 1, "val_accuracy": acc}, "epochs": 2, "train_seconds": 1.0,
                "pretrain_test_accuracy": None, "pretrain_flops": 1e9,
                "recipe": dict(zip(("optimizer", "lr", "weight_decay"), sweep.recipe(spec.family)))}

    monkeypatch.setattr(scaling, "run_one", run_one)
    return calls


TUNE = dataclasses.replace(QUICK, name="t", val_per_class=5)
GRID = {"vit_tiny": (("adamw", 1e-3, 0.05), ("adamw", 2e-3, 0.05)), "bit_tiny": (("sgd", 0.03, 5e-4), ("sgd", 0.1, 5e-4))}


def test_tune_checks_the_sweep_config_before_running_a_trial(tmp_path, monkeypatch):
    from vitlab.studies.tuning import tune

    calls = _stub_runs(monkeypatch)
    for bad, match in ((dict(families=("vit_tiny", "vit_huge")), "unknown model families"),
                       (dict(probe_classes=(1, 2)), "both pre-training and probe")):
        with pytest.raises(ValueError, match=match):  # refused as the config is made: no tuning can start from it
            tune(dataclasses.replace(TUNE, **bad), tmp_path / "t.jsonl", grid=GRID, progress=False)
    assert calls == [] and not (tmp_path / "t.jsonl").exists()  # nothing ran, nothing was recorded


def test_adding_a_family_reruns_only_its_own_tuning_trials(tmp_path, monkeypatch):
    """A trial's fingerprint depends on its own family's settings, not on which other families the sweep holds."""
    from vitlab.studies.tuning import tune

    calls = _stub_runs(monkeypatch)
    one = dataclasses.replace(TUNE, families=("vit_tiny",))
    tune(one, tmp_path / "t.jsonl", grid=GRID, progress=False)
    assert [s.family for _, s in calls] == ["vit_tiny", "vit_tiny"]
    calls.clear()
    tuned = tune(TUNE, tmp_path / "t.jsonl", grid=GRID, progress=False)  # bit_tiny added
    assert [s.family for _, s in calls] == ["bit_tiny", "bit_tiny"]  # the vit_tiny trials are kept
    assert {f for f, *_ in tuned.recipes} == {"vit_tiny", "bit_tiny"}
    calls.clear()
    tune(one, tmp_path / "t.jsonl", grid=GRID, progress=False)  # and removed again: nothing reruns
    assert calls == []


def test_tune_refuses_to_freeze_a_grid_with_failed_trials_and_a_rerun_runs_only_those(tmp_path, monkeypatch, capsys):
    """One ViT trial fails and every ResNet trial fails: no config is frozen (the ResNet would otherwise train with
    the default recipe, the ViT be "tuned" on half its grid); the error names each trial, and running the same tuning
    again runs those three only."""
    from vitlab.studies.tuning import TuningIncomplete, tune

    broken = lambda sweep, spec: (RuntimeError("out of memory") if spec.family == "bit_tiny"  # noqa: E731
                                  or sweep.recipes[0][2] == 2e-3 else None)
    calls = _stub_runs(monkeypatch, val=lambda sweep, spec: 0.0, fail=broken)
    with pytest.raises(TuningIncomplete) as err:
        tune(TUNE, tmp_path / "t.jsonl", grid=GRID, progress=False)
    msg = str(err.value)
    assert "3 of 4 trials did not finish" in msg and "no recipe is frozen" in msg
    for line in ("vit_tiny adamw lr=0.002 weight decay=0.05: failed: RuntimeError: out of memory",
                 "bit_tiny sgd lr=0.03 weight decay=0.0005: failed", "bit_tiny sgd lr=0.1 weight decay=0.0005: failed"):
        assert line in msg
    assert "vit_tiny adamw lr=0.001" not in msg and "run the same tuning again" in msg
    assert "the 1 finished trials are skipped" in msg
    calls.clear()
    calls = _stub_runs(monkeypatch, val=lambda sweep, spec: sweep.recipes[0][2])  # fixed: the larger lr wins
    tuned = tune(TUNE, tmp_path / "t.jsonl", grid=GRID, progress=False)
    assert sorted((s.family, sw.recipes[0][2]) for sw, s in calls) == [("bit_tiny", 0.03), ("bit_tiny", 0.1),
                                                                        ("vit_tiny", 0.002)]
    assert tuned.recipes == (("vit_tiny", "adamw", 0.002, 0.05), ("bit_tiny", "sgd", 0.1, 0.0005))
    # the command line: exit 1, nothing written, the error on stderr
    _stub_runs(monkeypatch, fail=lambda sweep, spec: RuntimeError("boom") if spec.family == "bit_tiny" else None)
    cfg = tmp_path / "t2.json"
    cfg.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(TUNE, name="t2"))))
    out = tmp_path / "t2.tuned.json"
    monkeypatch.setattr("vitlab.studies.tuning.TUNING_GRID", GRID)
    assert main(["sweep", "--config", str(cfg), "--results", str(tmp_path / "t2.jsonl"), "--tune", "--workers", "0",
                 "--save-config", str(out), "--quiet"]) == 1
    io = capsys.readouterr()
    assert not out.exists() and "tuned recipes" not in io.out
    assert "TuningIncomplete" in io.err and "bit_tiny sgd lr=0.03 weight decay=0.0005: failed: RuntimeError: boom" in io.err


def test_a_worker_running_other_code_than_the_sweeps_refuses_and_records_the_parents_fingerprint(tmp_path,
                                                                                                 monkeypatch):
    """The package's files are edited while a sweep runs; a worker started afterwards imports the edited code. Its
    record carries the fingerprint the parent computed (the one the sweep matches on), and it runs nothing."""
    import concurrent.futures as cf

    from vitlab.base import provenance
    from vitlab.studies.scaling import execute_runs

    calls = _stub_runs(monkeypatch)

    class EditedWorkerPool(InlinePool):  # each job runs in this process, as a worker that imported edited code would
        def submit(self, fn, *args):
            fut = cf.Future()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(provenance, "code_hash", lambda: "edited")
                fut.set_result(fn(*args))
            return fut

    monkeypatch.setattr(cf, "ProcessPoolExecutor", EditedWorkerPool)
    sweep = dataclasses.replace(QUICK, sizes=(40,), families=("vit_tiny",))
    records: list[dict] = []
    execute_runs([(sweep, RunSpec("vit_tiny", 40, 0))], records.append, "local", 1)
    assert calls == [] and records[0]["fingerprint"] == sweep.fingerprint()
    assert records[0]["status"] == "failed" and f"the sweep started with code {provenance.code_hash()}" in \
        records[0]["error"] and "imported vitlab code edited" in records[0]["error"]
    records.clear()
    execute_runs([(sweep, RunSpec("vit_tiny", 40, 0))], records.append, "local", 0)  # the same code: it runs
    assert records[0]["status"] == "ok" and records[0]["fingerprint"] == sweep.fingerprint() and len(calls) == 1


def test_a_run_sets_torchs_threads_for_itself_and_leaves_the_callers_as_they_were(monkeypatch):
    """A run given a thread count (its worker's share of the cores) set it for the rest of its process: a pool
    stand-in running runs in this process (the test above) left torch on two threads, and every later test of the
    process ran several times slower on the busy test machine. The count is the run's while it runs, as its record
    says, and the caller's again afterwards, after a failed run too."""
    import torch

    from vitlab.studies.scaling import _run_record

    seen = []
    _stub_runs(monkeypatch, val=lambda sweep, spec: seen.append(torch.get_num_threads()) or 0.5)
    before = torch.get_num_threads()
    rec = _run_record(QUICK, RunSpec("vit_tiny", 40, 0), None, before + 1)
    assert rec["status"] == "ok" and seen == [before + 1] and rec["provenance"]["threads"] == before + 1
    assert torch.get_num_threads() == before
    _stub_runs(monkeypatch, fail=lambda sweep, spec: RuntimeError("out of memory"))
    assert _run_record(QUICK, RunSpec("vit_tiny", 40, 0), None, before + 1)["status"] == "failed"
    assert torch.get_num_threads() == before
    assert _run_record(QUICK, RunSpec("vit_tiny", 40, 0), None, None)["provenance"]["threads"] == before


def test_a_run_that_imports_vitlab_code_after_the_files_changed_is_not_kept(tmp_path, monkeypatch):
    """A worker that imported the sweep's code, then first imports another vitlab module during its run (the training
    code imports some lazily) after the package's files were edited, may have run other code: its result is refused.
    A run that imports nothing new ran the checked code only, whatever the files hold by then."""
    import sys
    import types

    from vitlab.base import provenance
    from vitlab.studies.scaling import execute_runs

    late = "vitlab._imported_during_the_run"
    imports = []

    def lazy_import(sweep, spec):  # what `from vitlab.x import y` inside run_one does on a module's first import
        if imports:
            monkeypatch.setitem(sys.modules, late, types.ModuleType(late))

    calls = _stub_runs(monkeypatch, fail=lazy_import)
    monkeypatch.setattr(provenance, "source_hash", lambda: "edited during the run")
    sweep = dataclasses.replace(QUICK, sizes=(40,), families=("vit_tiny",))
    records: list[dict] = []
    execute_runs([(sweep, RunSpec("vit_tiny", 40, 0))], records.append, "local", 0)  # imports nothing new: kept
    assert records[0]["status"] == "ok" and len(calls) == 1
    imports.append(late)
    records.clear()
    execute_runs([(sweep, RunSpec("vit_tiny", 40, 0))], records.append, "local", 0)
    assert len(calls) == 2 and records[0]["status"] == "failed" and "metrics" not in records[0]
    assert f"this run imported {late} while the package's files changed (they hash to edited during the run, the " \
           f"sweep started with code {provenance.code_hash()}" in records[0]["error"]
    monkeypatch.setattr(provenance, "source_hash", provenance.code_hash)  # imported while the files are unchanged
    monkeypatch.delitem(sys.modules, late)
    records.clear()
    execute_runs([(sweep, RunSpec("vit_tiny", 40, 0))], records.append, "local", 0)
    assert records[0]["status"] == "ok"


@pytest.mark.parametrize("tune", [False, True])
def test_a_results_store_that_cannot_be_written_is_refused_before_any_run(tune, tmp_path, monkeypatch, capsys):
    """--results under a file (or in a read-only folder) let the sweep train its first run (on CIFAR-10, many
    minutes) and then fail on the record's append, the run's result lost; the store is now checked before any
    run, and the message names it."""
    calls = _stub_runs(monkeypatch)
    cfg = tmp_path / "t.json"
    cfg.write_text(json.dumps(dataclasses.asdict(TUNE)))
    (tmp_path / "f.txt").write_text("x")
    results = tmp_path / "f.txt" / "scaling.jsonl"
    args = ["sweep", "--config", str(cfg), "--results", str(results), "--workers", "0", "--quiet"]
    assert main(args + ["--tune"] * tune) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'f.txt'}; a file stands where a folder is needed" in err and "Traceback" not in err
    assert calls == [] and (tmp_path / "f.txt").read_text() == "x"


def test_tune_writes_the_frozen_config_beside_the_results_by_default(tmp_path, monkeypatch, capsys):
    """Without --save-config the tuned config goes where `--table` and notebook 06 look for it (RESULTS with the
    suffix .tuned.json), not into the current folder."""
    _stub_runs(monkeypatch)
    monkeypatch.setattr("vitlab.studies.tuning.TUNING_GRID", GRID)
    cfg = tmp_path / "t.json"
    cfg.write_text(json.dumps(dataclasses.asdict(TUNE)))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    results = tmp_path / "store" / "scaling.jsonl"
    assert main(["sweep", "--config", str(cfg), "--results", str(results), "--tune", "--workers", "0", "--quiet"]) == 0
    assert list(elsewhere.iterdir()) == []
    tuned = json.loads(results.with_suffix(".tuned.json").read_text())
    assert [r[0] for r in tuned["recipes"]] == list(TUNE.families)
    assert str(results.with_suffix(".tuned.json")) in capsys.readouterr().out


def test_a_frozen_config_records_the_code_it_was_tuned_with_and_the_sweep_warns_when_that_changed(
        tmp_path, monkeypatch):
    import warnings
    from pathlib import Path

    from vitlab.base import provenance
    from vitlab.studies.scaling import RecipeProvenanceWarning, load_sweep_config, recipe_provenance
    from vitlab.studies.tuning import tune

    _stub_runs(monkeypatch)
    monkeypatch.setattr("vitlab.studies.tuning.TUNING_GRID", GRID)
    cfg = tmp_path / "t.json"
    cfg.write_text(json.dumps(dataclasses.asdict(TUNE)))
    results = tmp_path / "t.jsonl"
    assert main(["sweep", "--config", str(cfg), "--results", str(results), "--tune", "--workers", "0", "--quiet"]) == 0
    frozen = results.with_suffix(".tuned.json")
    assert json.loads(frozen.read_text())["tuned_code"] == provenance.code_hash()  # written with the config
    tuned = load_sweep_config(str(frozen))
    assert tuned == tune(TUNE, tmp_path / "t.tuning.jsonl", grid=GRID, progress=False)  # nothing reruns
    assert tuned.tuned_code == provenance.code_hash() and recipe_provenance(tuned) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same code: no warning
        run_sweep(tuned, tmp_path / "a.jsonl", workers=0, progress=False)
    monkeypatch.setattr(provenance, "code_hash", lambda: "edited")  # the code changed since the tuning
    with pytest.warns(RecipeProvenanceWarning, match=f"tuned with vitlab code {tuned.tuned_code}, and this is code "
                                                     "edited.*Re-tune with vitlab.studies.tuning.tune "
                                                     r"\(`vitlab sweep --config ... --tune`; the trials rerun"):
        run_sweep(tuned, tmp_path / "b.jsonl", workers=0, progress=False)
    # the provenance is not an input of the runs: it leaves the fingerprint as it is
    assert dataclasses.replace(tuned, tuned_code="other").fingerprint() == tuned.fingerprint()
    # a config frozen before provenance was recorded (the shipped one) loads, with its provenance unknown
    shipped = load_sweep_config(str(Path(__file__).resolve().parents[1] / "data/results/scaling_cifar10.tuned.json"))
    assert shipped.tuned_code is None and shipped.recipes
    assert "provenance is unknown. Re-tune with vitlab.studies.tuning.tune (`vitlab sweep" in recipe_provenance(shipped)
    assert recipe_provenance(dataclasses.replace(shipped, recipes=())) is None  # no recipes: nothing to warn about


def test_a_changed_data_folder_or_zip_is_not_taken_as_done(tmp_path, monkeypatch):
    """A sweep on a folder (or zip) of images: replacing, adding or removing an image changes the fingerprint, so
    the finished runs rerun instead of being skipped as done with other data."""
    import os
    import shutil
    import zipfile

    from _reference import make_folder

    calls = _stub_runs(monkeypatch)
    root = tmp_path / "data"
    make_folder(root / "train", n_per_class=2, size=8, classes=("a", "b", "c", "d"))
    make_folder(root / "test", n_per_class=2, size=8, classes=("a", "b", "c", "d"))
    sweep = dataclasses.replace(QUICK, data=str(root), sizes=(4,), families=("vit_tiny",))
    results = tmp_path / "r.jsonl"
    assert len(run_sweep(sweep, results, workers=0, progress=False)) == 1
    assert run_sweep(sweep, results, workers=0, progress=False) == []  # unchanged: done
    before = sweep.fingerprint()
    img = root / "train" / "a" / "0.png"
    mtime = img.stat().st_mtime_ns
    shutil.copy(root / "train" / "b" / "1.png", img)  # another image in its place, a second later
    os.utime(img, ns=(mtime + 10**9, mtime + 10**9))
    assert sweep.fingerprint() != before
    assert [r["run_id"] for r in run_sweep(sweep, results, workers=0, progress=False)] == ["vit_tiny-n4-s0"]
    changed = sweep.fingerprint()
    (root / "test" / "d" / "1.png").unlink()  # an image removed from the test split
    assert sweep.fingerprint() != changed
    # a zip of both splits
    z = tmp_path / "data.zip"
    with zipfile.ZipFile(z, "w") as f:
        for p in sorted(root.rglob("*.png")):
            f.write(p, p.relative_to(root))
    zipped = dataclasses.replace(sweep, data=str(z))
    first = zipped.fingerprint()
    with zipfile.ZipFile(z, "a") as f:
        f.write(img, "train/a/new.png")
    assert zipped.fingerprint() != first
    assert len(calls) == 2


def test_a_named_data_set_keeps_the_fingerprint_formula_of_the_shipped_records(tmp_path, monkeypatch):
    """cifar10 and the shapes are read by name and add nothing to the fingerprint, so every shipped record's
    fingerprint (grid and tuning trials) still recomputes from its own config and code hash."""
    from pathlib import Path

    from vitlab.base import provenance
    from vitlab.data.datasets import data_fingerprint
    from vitlab.studies.scaling import load_sweep_config

    assert data_fingerprint("cifar10") is None and data_fingerprint("shapes") is None
    assert data_fingerprint(str(tmp_path / "nothing here")) == "missing"
    results = Path(__file__).resolve().parents[1] / "data" / "results"
    records = (ResultsStore(results / "scaling_cifar10.jsonl").records()
               + ResultsStore(results / "scaling_cifar10.tuning.jsonl").records())
    assert len(records) > 50
    for i, r in enumerate(records):
        cfg = tmp_path / f"{i}.json"
        cfg.write_text(json.dumps(r["config"]))
        monkeypatch.setattr(provenance, "code_hash", lambda r=r: r["provenance"]["code_hash"])
        assert load_sweep_config(str(cfg)).fingerprint() == r["fingerprint"], r["run_id"]


def test_newest_sweep_skips_a_newer_config_whose_runs_all_failed(tmp_path):
    """A rerun under a new config whose one run failed (e.g. a typo in the data path): notebook 06 shows the newest
    config with a finished run, not 0 runs, and says which config it skipped."""
    def rec(run, fp, finished, status="ok"):
        return {"run_id": run, "sweep": "s", "fingerprint": fp, "finished": finished, "status": status,
                "spec": {"family": "vit", "size": 100, "seed": int(run[-1])},
                "metrics": {"few_shot": {"10": {"mean": 0.5}}} if status == "ok" else None}

    store = ResultsStore(tmp_path / "r.jsonl")
    for r in (rec("vit-n100-s0", "old", "2026-01-01T00:00"), rec("vit-n100-s1", "old", "2026-01-01T00:01"),
              rec("vit-n100-s0", "new", "2026-02-01T00:00", "failed")):
        store.append(r)
    shown = store.newest_sweep()
    assert sorted(shown) == ["vit-n100-s0", "vit-n100-s1"] and {r["fingerprint"] for r in shown.values()} == {"old"}
    assert store.newest_sweep_with_note()[0] == shown
    note = store.newest_sweep_with_note()[1]
    assert "config old: 2 of 2 runs finished" in note and "skipped newer config(s) with no finished run: sweep 's' " \
        "config new (1 failed record(s))" in note
    store.append(rec("vit-n100-s1", "new", "2026-02-01T00:01"))  # the new config finishes a run: it is shown
    shown, note = store.newest_sweep_with_note()
    assert {r["fingerprint"] for r in shown.values()} == {"new"} and "1 of 2 runs finished" in note
    assert "skipped" not in note
    failed_only = ResultsStore(tmp_path / "f.jsonl")
    failed_only.append(rec("vit-n100-s0", "x", "2026-01-01T00:00", "failed"))
    shown, note = failed_only.newest_sweep_with_note()
    assert list(shown) == ["vit-n100-s0"] and "no run of any config in the store finished" in note


def test_the_sweep_table_marks_the_recipes_the_runs_trained_with_and_only_their_tuning_trials(tmp_path, monkeypatch,
                                                                                              capsys):
    """`--table` with a --config whose recipes differ from the stored runs' (a re-tuned config, same grid), and a
    tuning store that also holds a later re-tuning under other code: the marks are the runs' own recipes, the trials
    those of the runs' tuning, and where each winner sits in its grid is printed."""
    from vitlab.studies.tuning import tune, tuning_table

    _stub_runs(monkeypatch, val=lambda sweep, spec: sweep.recipes[0][2])  # the larger lr wins
    results = tmp_path / "s.jsonl"
    tuned = tune(TUNE, results.with_suffix(".tuning.jsonl"), grid=GRID, progress=False)
    run_sweep(tuned, results, workers=0, progress=False)
    trials = ResultsStore(results.with_suffix(".tuning.jsonl")).records()
    retune = {**trials[0], "provenance": {**trials[0]["provenance"], "code_hash": "later"}, "fingerprint": "later",
              "metrics": {**trials[0]["metrics"], "best": {"epoch": 1, "val_accuracy": 0.99}}}
    ResultsStore(results.with_suffix(".tuning.jsonl")).append(retune)  # a later re-tuning, never run on the grid
    other = dataclasses.replace(tuned, recipes=(("vit_tiny", "adamw", 1e-3, 0.05), ("bit_tiny", "sgd", 0.03, 5e-4)))
    cfg = tmp_path / "other.json"
    cfg.write_text(json.dumps(dataclasses.asdict(other)))
    assert main(["sweep", "--config", str(cfg), "--results", str(results), "--table", "--shots", "5"]) == 0
    out = capsys.readouterr().out
    table = tuning_table(trials, 5, tuned.recipes)
    assert table in out and "99.0%" not in out  # the runs' tuning only, the re-tuning left out
    marked = [line for line in table.splitlines() if "**yes**" in line]
    assert [line.split(" | ")[:3] for line in marked] == [["| vit_tiny", "adamw", "0.002"], ["| bit_tiny", "sgd", "0.1"]]
    assert "4 of 5 tuning trials match the runs shown" in out and "1 of other configs or code left out" in out
    assert "vit_tiny: adamw lr 0.002 (the largest of 0.001, 0.002 tried: at the top edge of the grid)" in out
    assert "bit_tiny: sgd lr 0.1 (the largest of 0.03, 0.1 tried: at the top edge of the grid)" in out
    assert "may be short of its family's best" in out
    assert tuning_table(trials, 5, ()).count("**yes**") == 0  # runs without tuned recipes: nothing marked


def test_the_shipped_sweeps_tuning_evidence_says_where_its_winners_sit():
    """The shipped runs' own config names the recipes; all shipped trials are theirs; the ViT's lr 2e-3 and the
    ResNet's SGD lr 0.1 are the largest of their grids, which the lines say."""
    from pathlib import Path

    from vitlab.studies.scaling import load_sweep_config
    from vitlab.studies.tuning import plotted_recipes, recipe_grid_positions, tuning_trials_for

    results = Path(__file__).resolve().parents[1] / "data" / "results"
    records = list(ResultsStore(results / "scaling_cifar10.jsonl").newest_sweep().values())
    chosen = plotted_recipes(records)
    assert chosen == load_sweep_config(str(results / "scaling_cifar10.tuned.json")).recipes
    trials, note = tuning_trials_for(records, ResultsStore(results / "scaling_cifar10.tuning.jsonl").records())
    assert len(trials) == 12 and note.startswith("12 of 12 tuning trials match")
    lines = recipe_grid_positions(trials, chosen)
    assert lines[0].startswith("vit: adamw lr 0.002 (the largest of 0.001, 0.002 tried: at the top edge")
    assert lines[1].startswith("bit: sgd lr 0.1 (the largest of 0.03, 0.1 tried: at the top edge")
    assert not any("NOT the trials' best" in line for line in lines)
    # two trials that tie: the first in grid order is the best, as tune picks it, in whatever order the store holds them
    import copy

    tied = copy.deepcopy(trials)
    for t in tied:
        t["metrics"]["best"]["val_accuracy"] = 0.5
    from vitlab.studies.tuning import TUNING_GRID

    grid_first = ("vit", *TUNING_GRID["vit"][0])
    for order in (tied, tied[::-1]):
        assert "NOT the trials' best" not in recipe_grid_positions(order, [grid_first])[0]
    assert recipe_grid_positions(tied, [grid_first])[0].startswith(  # the lowest values tried: the bottom edge
        "vit: adamw lr 0.001 (the smallest of 0.001, 0.002 tried: at the bottom edge of the grid), weight decay 0.05 "
        "(the smallest of 0.05, 0.2 tried: at the bottom edge of the grid)")


def test_a_sweep_takes_a_config_with_list_fields(tmp_path, monkeypatch):
    """A config built in Python with lists (sizes=[...]) runs as one with tuples did (the fingerprints are kept per
    config object, not in a dict keyed by the unhashable config)."""
    from vitlab.studies.scaling import run_sweep

    _stub_runs(monkeypatch)
    listed = dataclasses.replace(TUNE, sizes=list(TUNE.sizes))
    assert len(run_sweep(listed, tmp_path / "r.jsonl", workers=0, progress=False)) == len(TUNE.runs())


def test_the_shipped_sweeps_flops_are_a_fresh_count_of_each_run():
    """Every finished run of the shipped sweep and its tuning records FLOPs equal to step_flops' count (attention
    included) per image of its family's model, times its batch and steps: the records recounted after the SDPA
    undercount keep no stale value, and a rerun of the sweep would record the same."""
    from pathlib import Path

    import torch

    from vitlab.models.zoo import build_model
    from vitlab.studies.scaling import FAMILIES
    from vitlab.train.config import with_model_classes
    from vitlab.train.loop import step_flops

    root = Path(__file__).resolve().parents[1] / "data" / "results"
    per_image, seen = {}, 0
    for name in ("scaling_cifar10.jsonl", "scaling_cifar10.tuning.jsonl"):
        for r in ResultsStore(root / name).records():
            if r.get("status") != "ok":
                continue
            fam, n, m = r["spec"]["family"], r["spec"]["size"], r["metrics"]
            if fam not in per_image:
                model = build_model(with_model_classes(FAMILIES[fam](), len(r["config"]["pretrain_classes"])))
                x, y = torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)
                per_image[fam] = step_flops(model, x, y) / 2
            assert m["pretrain_flops"] == pytest.approx(per_image[fam] * min(r["config"]["batch_size"], n)
                                                        * m["steps"], rel=1e-12), r["run_id"]
            seen += 1
    assert seen == 54 + 12 and set(per_image) == {"vit", "bit", "hybrid"}


def test_check_executor_refuses_a_worker_count_that_is_no_whole_number():
    """check_executor("local", 1.5) and ("local", True) passed (a bool is an int to Python, 1.5 >= 0): a sweep then
    started with a worker count nobody wrote; both are refused, as a negative count is, before any run."""
    check_executor("local", 0)
    for workers in (1.5, True, -1):
        with pytest.raises(ValueError, match=f"workers must be a whole number >= 0 .*got {workers!r}"):
            check_executor("local", workers)


@pytest.mark.parametrize("field, value", [
    ("name", "../../../x"), ("name", "a/b"), ("name", ""), ("name", ".hidden"), ("name", 3),
    ("epochs", 0), ("batch_size", 2.5), ("lr", -1.0), ("lr", float("nan")), ("l2", 0), ("min_steps", -1),
    ("probe_test_per_class", 0), ("val_per_class", True), ("data", ""), ("recipes", [["vit_tiny", "adam", 1e-3, 0.0]]),
])
def test_a_sweep_config_file_is_checked_whole_before_any_run_or_path(tmp_path, monkeypatch, field, value):
    """"name": "../../../x" wrote the results file outside runs/sweeps/ (making folders on the way), and fields such
    as epochs, lr or a recipe's optimizer were refused only inside each run, once per run; load_sweep_config and the
    command line now refuse each by its field before anything runs or is written."""
    from vitlab.studies.sweep_config import load_sweep_config

    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(QUICK).items()}
    fields.update({"name": "mine", field: value})
    cfg = tmp_path / "sweep.json"
    cfg.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match=field):
        load_sweep_config(str(cfg))
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--config", str(cfg), "--quiet"]) == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sweep.json"]  # no results file, no folder


def test_a_sweep_config_that_is_no_json_object_is_refused(tmp_path):
    """A sweep config holding a JSON list stopped with a TypeError traceback ('argument after ** must be a
    mapping'); it is now a ValueError naming the file."""
    from vitlab.studies.sweep_config import load_sweep_config

    for text in ("[1, 2]", '"cifar10"', "null"):
        (tmp_path / "s.json").write_text(text)
        with pytest.raises(ValueError, match=r"s\.json holds a JSON (list|str|NoneType): a sweep config is a JSON obj"):
            load_sweep_config(str(tmp_path / "s.json"))
