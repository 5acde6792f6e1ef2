"""Numbers quoted in READMEs and model cards are the numbers in the shipped JSON that produced them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vitlab.models.checkpoint import card_metric
from vitlab.studies.scaling import ResultsStore, markdown_table, summarise

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "results"
CHECKPOINTS = ROOT / "data" / "checkpoints"


def _records() -> list[dict]:
    return list(ResultsStore(RESULTS / "scaling_cifar10.jsonl").latest().values())


def test_results_readme_table_is_the_generated_one():
    readme = (RESULTS / "README.md").read_text()
    assert markdown_table(summarise(_records(), 10)) in readme, "regenerate with vitlab.studies.scaling.markdown_table"


def test_results_readme_sentences_match_the_records():
    readme = " ".join((RESULTS / "README.md").read_text().split())
    records = _records()
    ok = [r for r in records if r["status"] == "ok"]
    m = re.search(r"(\d+) of (\d+) runs finished, (\d+) failed, ([\d,]+) s of training", readme)
    assert m and int(m[1]) == len(ok) and int(m[3]) == len(records) - len(ok)
    assert int(m[4].replace(",", "")) == round(sum(r["metrics"]["train_seconds"] for r in ok))
    for shots in (25, 1):
        s = summarise(records, shots)
        m = re.search(rf"{shots}-shot: vit ([\d.]+) -> ([\d.]+), bit ([\d.]+) -> ([\d.]+), hybrid ([\d.]+) -> ([\d.]+)",
                      readme)
        assert m, f"{shots}-shot sentence missing"
        for fam, lo, hi in (("vit", m[1], m[2]), ("bit", m[3], m[4]), ("hybrid", m[5], m[6])):
            sizes = sorted(s[fam])
            assert float(lo) == round(100 * s[fam][sizes[0]]["mean"], 1)
            assert float(hi) == round(100 * s[fam][sizes[-1]]["mean"], 1)


def test_results_readme_shows_the_tuning_evidence_and_the_verdict():
    """The tuning trials (with the recipes the frozen config holds marked) and the Fig. 3/4 verdict are the ones
    `vitlab sweep --table` computes from the shipped stores."""
    from vitlab.findings.studies import scaling_gap_narrows
    from vitlab.findings.verdict import verdict_table
    from vitlab.studies.scaling import load_sweep_config
    from vitlab.studies.tuning import tuning_table

    readme = (RESULTS / "README.md").read_text()
    tuned = load_sweep_config(str(RESULTS / "scaling_cifar10.tuned.json"))
    assert {f for f, *_ in tuned.recipes} == set(tuned.families)
    trials = ResultsStore(RESULTS / "scaling_cifar10.tuning.jsonl").records()
    assert tuning_table(trials, 10, tuned.recipes) in readme, "regenerate with vitlab sweep --table"
    assert verdict_table([scaling_gap_narrows(_records())]) in readme
    done = {r["run_id"] for r in _records() if r["status"] == "ok"}
    assert done == {s.run_id for s in tuned.runs()}  # the grid of the frozen config, whole
    assert {r["config"]["recipes"][0][0] for r in trials} == set(tuned.families)


CARDS = sorted(p.parent for p in CHECKPOINTS.glob("*/card.json"))
#: the seeds of the shipped training recipes (vitlab export-recipe): data/checkpoints/recipes/NAME/seed<n>
RECIPE_CARDS = sorted(p.parent for p in CHECKPOINTS.glob("recipes/*/seed*/card.json"))


def _card_id(folder: Path) -> str:
    return folder.relative_to(CHECKPOINTS).as_posix()


@pytest.mark.parametrize("folder", CARDS + RECIPE_CARDS, ids=_card_id)
def test_model_card_text_matches_its_json(folder):
    card = json.loads((folder / "card.json").read_text())
    text = (folder / "MODEL_CARD.md").read_text()
    name, value = card_metric(card)
    if value is None:  # an MPP encoder of the l2 target: no accuracy, its loss
        assert f"loss {card['mpp_test']['loss']:.4f}" in text
    else:
        assert f"{name[0].upper()}{name[1:]}: {value:.2%}" in text  # Test accuracy, or an MPP encoder's masked-patch one
    for key in ("train", "test"):  # data sets named by name or relative path, never a machine's absolute path
        assert not Path(str(card["data"][key])).is_absolute(), card["data"][key]
    from vitlab.models.card import _data_line

    assert f"* Data: {_data_line(card['data'])}.\n" in text  # the line the exporter writes from the card's record


@pytest.mark.parametrize("folder", [f for f in CARDS if json.loads((f / "card.json").read_text()).get(
    "warm_start_hours") is not None], ids=lambda p: p.name)
def test_card_lineage_adds_up_to_its_training_time(folder):
    """A model trained over several warm starts lists every leg: the first starts at hour 0, each ends where the
    next began (its cumulative hours plus the next leg's own hours), the leg before this one is the start the card
    names, the last leg is the card itself, and the card's text shows the table of them all."""
    from vitlab.models.card import _lineage_section

    card = json.loads((folder / "card.json").read_text())
    legs = card["lineage"]
    assert len(legs) >= 2
    assert legs[0]["train_hours"] is None or legs[0]["train_hours"] == pytest.approx(legs[0]["total_train_hours"])
    assert _lineage_section(legs) in (folder / "MODEL_CARD.md").read_text()
    for before, leg in zip(legs, legs[1:]):
        assert leg["total_train_hours"] == pytest.approx(before["total_train_hours"] + leg["train_hours"], abs=2e-3)
    last = legs[-1]
    assert (last["test_accuracy"], last["command"], last["epochs_done"]) == \
        (card["test_accuracy"], card["command"], card["epochs_done"])
    assert last["total_train_hours"] == card.get("total_train_hours", card["train_hours"])
    if len(legs) > 1:
        assert (legs[-2]["total_train_hours"], legs[-2]["test_accuracy"]) == \
            (card["warm_start_hours"], card["warm_start_test_accuracy"])


def test_checkpoints_readme_quotes_the_cards():
    readme = (CHECKPOINTS / "README.md").read_text()
    for folder in CARDS:
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{folder.name}/`")), None)
        assert row is not None, f"{folder.name} missing from data/checkpoints/README.md"
        card = json.loads((folder / "card.json").read_text())
        name, value = card_metric(card)
        if value is None:  # an MPP encoder of the l2 target: the row quotes its loss
            assert re.findall(r"masked-patch loss (\d+\.\d+)", row) == [f"{card['mpp_test']['loss']:.4f}"], row
            continue
        quoted = re.findall(rf"(\d+\.\d+)% {name}", row)
        assert quoted == [f"{100 * value:.2f}"], (row, name, value)


@pytest.mark.skipif(not RECIPE_CARDS, reason="no shipped recipes")
def test_checkpoints_readme_quotes_the_recipes_mean_accuracies():
    """The recipes' row names each shipped recipe with its seeds' mean test accuracy and its 95% interval over seeds,
    as the report and notebook 08 compute them (``vitlab.findings.recipe.recipe_accuracy``)."""
    from vitlab.findings.recipe import recipe_accuracy, recipe_cards, shipped_recipes

    row = next(line for line in (CHECKPOINTS / "README.md").read_text().splitlines()
               if line.startswith("| `recipes/`"))
    accuracy = recipe_accuracy({n: recipe_cards(s) for n, s in shipped_recipes(CHECKPOINTS / "recipes").items()})
    quoted = re.findall(r"`(\w+)/`[^|%]*?(\d+\.\d+)% mean test accuracy of (\d+) seeds \(95% interval "
                        r"\[(\d+\.\d+), (\d+\.\d+)\]\)", row)
    assert quoted == [(name, f"{100 * a['mean']:.2f}", str(len(a['seeds'])), f"{100 * a['interval'][0]:.2f}",
                       f"{100 * a['interval'][1]:.2f}") for name, a in accuracy.items()], row


def test_checkpoints_readme_is_one_short_line_per_checkpoint():
    """data/checkpoints/README.md is an index, one table row per shipped folder with no cell over 300 characters; a
    model's history lives in its card (the lineage) and in git (one cell had grown to 2,956 characters)."""
    rows = [line for line in (CHECKPOINTS / "README.md").read_text().splitlines() if line.startswith("| `")]
    folders = [f.name for f in CARDS] + (["recipes"] if RECIPE_CARDS else [])
    assert sorted(re.match(r"\| `([\w]+)/`", row)[1] for row in rows) == sorted(folders)
    cells = [cell.strip() for row in rows for cell in row.strip("|").split(" | ")]
    assert max(len(c) for c in cells) <= 300, max(cells, key=len)


def test_mpp_readme_quotes_the_study():
    """The MPP section of data/results/README.md holds the tables and the verdicts generated from the shipped
    records (``vitlab mpp-study --table`` prints them), not typed numbers."""
    from vitlab.findings.judge import mpp_verdicts
    from vitlab.findings.verdict import verdict_table
    from vitlab.probe.features import READOUTS
    from vitlab.studies.mpp import STUDIES, markdown_tables, shown_records

    records, _ = shown_records(ResultsStore(RESULTS / "mpp_cifar10.jsonl").records(), "cifar10")
    assert len(records) == 16 and all(r["status"] == "ok" for r in records)  # the whole study, one code version
    readme = (RESULTS / "README.md").read_text()
    for readout in READOUTS:
        assert markdown_tables(records, readout) in readme, f"regenerate the {readout} table: vitlab mpp-study --table"
    assert verdict_table(mpp_verdicts(records, STUDIES["cifar10"].verdict_shots)) in readme


def test_mpp_ordering_sentences_quote_the_fine_tune_means():
    """The studies page (docs/studies.md) and data/results/README.md state scratch < MPP < supervised with the mean fine-tune accuracy
    of each initialisation over the study's seeds (a rerun of one row must show in both)."""
    from vitlab.studies.mpp import shown_records

    records, _ = shown_records(ResultsStore(RESULTS / "mpp_cifar10.jsonl").records(), "cifar10")
    means = {}
    for init in ("scratch", "mpp", "supervised"):
        accs = [r["metrics"]["test_accuracy"] for r in records if r["kind"] == "finetune" and r["init"] == init]
        assert len(accs) == 3, init
        means[init] = 100 * sum(accs) / len(accs)
    expected = "{scratch:.1f} < {mpp:.1f} < {supervised:.1f}%".format(**means)
    for readme in (ROOT / "docs" / "studies.md", RESULTS / "README.md"):
        quoted = re.findall(r"(\d+\.\d) < (\d+\.\d) < (\d+\.\d)%", readme.read_text())
        assert quoted, f"{readme.name}: no 'scratch < MPP < supervised' accuracies found"
        assert {" < ".join(q) + "%" for q in quoted} == {expected}, (readme, quoted, expected)


def test_mpp_study_supervised_checkpoint_is_the_one_its_records_used():
    """The study's supervised initialisation (STUDIES["cifar10"].supervised) holds the very weights its shipped
    records were made with (their sha256), so the README's supervised numbers can be recomputed from it."""
    import hashlib

    from vitlab.studies.mpp import STUDIES, shown_records

    records, _ = shown_records(ResultsStore(RESULTS / "mpp_cifar10.jsonl").records(), "cifar10")
    digests = {r["spec"]["init"]["weights_sha256"] for r in records if r["init"] == "supervised"}
    folder = Path(__file__).resolve().parent.parent / STUDIES["cifar10"].supervised
    assert len(digests) == 1 and hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() in digests


def test_mpp_readme_attention_comparison_is_recomputed():
    """The README's MPP-against-supervised inspection numbers, recomputed from the shipped checkpoints."""
    import vitlab
    from vitlab.data.images import default_images
    from vitlab.findings.model import attention_distance_shift
    from vitlab.studies.mpp import STUDIES, supervised_model
    from vitlab.train.mpp import load_mpp

    readme = " ".join((RESULTS / "README.md").read_text().split())
    mpp, _ = load_mpp(CHECKPOINTS / "mpp_cifar10")
    sup = supervised_model(STUDIES["cifar10"])
    dist = {}
    for name, m in (("mpp", mpp), ("sup", sup)):
        dist[name] = vitlab.mean_attention_distance(m, default_images(m)[1], per_image=True, progress=False)
    layers = ", ".join(f"{float(x):.1f}" for x in dist["mpp"].mean((1, 2)))
    assert f"by layer {layers} px" in readme
    lo, hi = (f"{float(x):.1f}" for x in (dist["sup"].mean((1, 2)).min(), dist["sup"].mean((1, 2)).max()))
    assert f"default's {lo} to {hi} px" in readme
    s = attention_distance_shift(dist["mpp"], dist["sup"])
    assert f"{s.overall:.2f} px [{s.overall_interval[0]:.2f}, {s.overall_interval[1]:.2f}]" in readme
    for m in (mpp, sup):
        score = vitlab.position_structure_score(vitlab.position_embedding_similarity(m))
        assert f"{score:.3f}" in readme


def test_shipped_text_names_no_machine_path():
    """Cards, results and READMEs name data and runs by name or relative path: a machine's home, temporary or
    checkout folder means nothing on the reader's machine."""
    machine = re.compile(r"(?<![\w.])/(?:root|home|tmp|work|Users)/")
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in sorted((ROOT / "data").rglob("*"))
             if f.suffix in {".json", ".jsonl", ".md"} for m in [machine.search(f.read_text())] if m]
    assert not found, found


def test_card_line_states_a_multi_leg_models_whole_training():
    """The one-line summary (report, `vitlab info`, the tour) of a model trained in warm-started legs gives its total
    hours and number of legs, so the last leg's epochs do not read as the whole training."""
    from vitlab.models.checkpoint import card_line

    one = {"test_accuracy": 0.6202, "data": {"test": "t.zip"}, "epochs_done": 9, "epochs_planned": 15,
           "lineage": [{"total_train_hours": 2.0}]}
    assert card_line(one) == "62.02% test accuracy on t.zip, 9 of 15 epochs"
    many = {**one, "test_accuracy": 0.9, "epochs_done": 5, "epochs_planned": 5, "total_train_hours": 7.5,
            "lineage": [{"total_train_hours": 2.0}, {"total_train_hours": 7.5}]}
    assert card_line(many) == "90.00% test accuracy on t.zip, 7.50 h of training in 2 legs, its last leg 5 of 5 epochs"
    assert card_line({k: v for k, v in many.items() if k != "total_train_hours"}) == card_line(many)  # the last leg's
    assert card_line({k: v for k, v in one.items() if k != "lineage"}) == card_line(one)  # cards before lineages


def test_readme_from_scratch_sentence_quotes_its_benchmark():
    """The README's from-scratch run (the default preset's headline) states the hours, the accuracy and the fit
    against its teacher that benchmarks/results/from_scratch.json recorded, not its 5 h budget."""
    run = json.loads((ROOT / "benchmarks" / "results" / "from_scratch.json").read_text())
    readme = _readme()
    m = re.search(r"From random weights, ([\d.]+) h of it .*? reached ([\d.]+)% \((\d+) epochs", readme)
    assert m, "the README's from-scratch sentence is missing"
    assert (m[1], m[2], int(m[3])) == (f"{run['hours'][-1]:.2f}", f"{100 * run['test_accuracy'][-1]:.2f}",
                                       run["epochs_done"])
    fit = run["fit"]["train"]
    assert f"({100 * fit['readout']:.1f}% of {fit['images']:,} sampled training images right against the teacher's " \
           f"{100 * fit['teacher']:.1f}%)" in readme


def _readme() -> str:
    """The README and the documentation pages (docs/*.md) it leads to, where the long explanations live."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return " ".join(" ".join(p.read_text().split()) for p in pages)


def _card(name: str) -> dict:
    return json.loads((CHECKPOINTS / name / "card.json").read_text())


def test_readme_presets_quote_the_shipped_cards():
    """The README's preset list quotes each shipped checkpoint's card: a new leg of the default or a retrained teacher
    must show there too."""
    readme = _readme()
    fast = _card("resnet_cifar10_fast")
    assert (f"Shipped in `data/checkpoints/resnet_cifar10_fast`: {fast['test_accuracy']:.2%} test accuracy "
            f"({fast['test_accuracy_tta']:.2%} with TTA) in {fast['train_hours']:.2f} h") in readme
    wide = _card("resnet_cifar10_wide")
    assert f"({wide['parameters'] / 1e6:.1f} M parameters)" in readme
    assert f"({wide['train_seconds']:.0f} s on one H100)" in readme
    assert (f"Shipped in `data/checkpoints/resnet_cifar10_wide`: {wide['test_accuracy']:.2%} "
            f"({wide['test_accuracy_tta']:.2%} with TTA)") in readme
    default = _card("vit_cifar10")
    m = re.search(r"the shipped default reached ([\d.]+)% over ([\d.]+) h of warm-started legs, ([\d.]+) h of them on "
                  r"GPUs", readme)
    assert m, "the README's sentence on the shipped default is missing"
    assert (m[1], m[2]) == (f"{100 * default['test_accuracy']:.2f}", f"{default['total_train_hours']:.2f}")
    gpu_hours = sum(leg["train_hours"] for leg in default["lineage"] if "NVIDIA" in leg["hardware"])
    assert abs(float(m[3]) - gpu_hours) <= 0.005 + 1e-9, (m[3], gpu_hours)  # the legs' hours are rounded to 0.001


def test_readme_device_speed_quotes_its_benchmark():
    """The README's GPU speed-ups are benchmarks/results/device_speed.json's ratios."""
    run = json.loads((ROOT / "benchmarks" / "results" / "device_speed.json").read_text())
    assert (f"ran {run['features']['ratio']:.0f}x faster than on its host's {run['cpu_threads']} CPU threads, the whole "
            f"report {run['report']['ratio']:.1f}x") in _readme()


def test_readme_scaling_result_quotes_the_records():
    """The README's summary of the data-scaling sweep: run count, the ResNet's tuning margin of SGD over Adam, the
    range of the ResNet's mean lead over the ViT (no size's interval resolves it: tests/test_scaling_study.py) and the
    gap change's interval, all from the shipped stores."""
    from vitlab.findings.studies import scaling_gap_narrows

    readme = _readme()
    records = _records()
    assert f"(`data/results/README.md`, {sum(r['status'] == 'ok' for r in records)} runs, 3 seeds)" in readme
    best = {}
    for t in ResultsStore(RESULTS / "scaling_cifar10.tuning.jsonl").records():
        family, optimizer, *_ = t["config"]["recipes"][0]
        key = (family, optimizer)
        best[key] = max(best.get(key, 0.0), t["metrics"]["best"]["val_accuracy"])
    assert f"BiT's SGD, {100 * (best['bit', 'sgd'] - best['bit', 'adamw']):.1f} points of validation accuracy above " \
           "Adam" in readme
    v = scaling_gap_narrows(records)
    assert v.unit == "points"  # the README's unit, as the verdict table beside it prints it
    leads = [-g for g in v.details["gap_by_size"].values()]
    assert min(leads) > 0
    assert f"by {min(leads):.1f} to {max(leads):.1f} points" in readme
    lo, hi = v.interval
    assert f"(change {v.statistic:+.1f} points, 95% interval [{lo:+.1f}, {hi:+.1f}]: {v.verdict})" in readme


@pytest.mark.parametrize("folder", CARDS + RECIPE_CARDS, ids=_card_id)
def test_card_commands_run_as_written(folder):
    """Each command a card shows (its own and each leg's) is one a user can paste: the shell reads it (a remark
    after `#`) and vitlab's parser accepts it, so it names no removed option."""
    import shlex

    from vitlab.cli import build_parser

    card = json.loads((folder / "card.json").read_text())
    commands = [card["command"]] + [leg["command"] for leg in card.get("lineage", []) if leg.get("command")]
    for command in commands:
        argv = shlex.split(command, comments=True)
        assert argv[0] == "vitlab", command
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{folder.name}'s card shows a command vitlab refuses: {command}")


def test_readme_shell_blocks_name_real_commands():
    """Every line of the ```bash blocks of the README and the docs pages is a make target the Makefile has or a vitlab
    command its parser accepts (continuation lines joined), so a renamed option or target shows here, not on a
    reader's machine."""
    import shlex

    from vitlab.cli import build_parser

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in pages for b in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)]
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert lines
    for line in lines:
        argv = shlex.split(line, comments=True)
        if not argv:  # a comment line
            continue
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, line
            continue
        assert argv[0] == "vitlab", line
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"the README shows a command vitlab refuses: {line}")


def _bench_json(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())


def _row(rows: list[dict], name: str) -> dict:
    """The row named ``name``, or else the one row whose name starts with it."""
    names = [r.get("variant") or r["preset"] for r in rows]
    (row,) = [r for r, n in zip(rows, names) if n == name] or [r for r, n in zip(rows, names) if n.startswith(name)]
    return row


def test_benchmarks_md_is_generated_from_the_results():
    """BENCHMARKS.md is what benchmarks/markdown.py renders from benchmarks/results/: every table and reading is
    formatted from a result file (a rerun shows there, a hand edit fails here), and it stays short (it was a 78 kB lab
    journal)."""
    from benchmarks.markdown import SECTIONS, render

    text = (ROOT / "BENCHMARKS.md").read_text()
    assert text == render(), "regenerate with: python -m benchmarks.markdown"
    assert len(text.encode()) < 20_000
    assert text.count("\n## ") == len(SECTIONS)


def test_readme_training_speed_quotes_the_recorded_run():
    """The README's progressive-resizing and torch.compile speed-ups are train_speed.json's (the AMX CPU's run): the
    24 px phase and the preset's schedule against its 32 px phase, and compiled against eager at 32 px."""
    readme = _readme()
    run = _bench_json("train_speed")
    c32, e32, p24, schedule = (_row(run["vitlab_train"], p)["images_per_second"] for p in (
        "vit_cifar10, compiled", "vit_cifar10, eager (--compile off)", "vit_cifar10, 24 px phase",
        "vit_cifar10 over 75 epochs"))
    assert (f"the 24 px epochs run at {p24 / c32:.1f}x the images/s of 32 px, the whole schedule at "
            f"{schedule / c32:.2f}x") in readme
    assert f"32 px epochs ran {c32 / e32:.2f}x faster on the 2-core AMX CPU" in readme


def test_progressive_resizing_cost_is_the_pairs_it_lists():
    """The training page's cost of a first third at 24 px is the difference of the recorded pairs (epoch 15 of the two
    CPU pairs in progressive_pairs_cpu.json, epoch 48 of progressive_pair_h100.json), computed, not typed."""
    from benchmarks.markdown import progressive_gaps

    g = progressive_gaps(_bench_json("progressive_pair_h100"), _bench_json("progressive_pairs_cpu"))
    cpu = f"{g['cpu'][0]:+.2f} and {g['cpu'][1]:+.2f}"
    assert (f"ended {cpu} points against 32 px throughout over 15 epochs on the CPU, in {g['hours'][0]:.2f}x and "
            f"{g['hours'][1]:.2f}x the hours, and {g['h100']:+.2f} over 48 on an H100") in _readme()
