"""The ``vitlab`` command. Every subcommand has ``--help``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

# torch-free: the parser is built (--help, an argument error) without loading torch or timm; each command imports
# what it needs itself, inside main's handling of errors and Ctrl-C
from vitlab.base.choices import CACHE_KINDS, DEVICE_HELP, PUBLIC_DATASETS, READOUTS
from vitlab.train.config import PRESETS

if TYPE_CHECKING:
    from vitlab.studies.sweep_config import SweepConfig
    from vitlab.train.config import TrainConfig



#: Python's spellings of JSON's true, false and null (``--set bf16=False`` used to set the text 'False', which is true)
_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}


def _whole_number(text: str, least: int, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {name}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type`` of a count that means nothing at 0 or below (images, a batch size, epochs): argparse's
    error names the flag (``argument --max-train: expected at least 1, got -3``)."""
    return _whole_number(text, 1, "at least 1")


def tcp_port(text: str) -> int:
    """argparse ``type`` of a TCP port: 1 to 65535."""
    port = _whole_number(text, 1, "a port from 1 to 65535")
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {port}")
    return port


def host_name(text: str) -> str:
    """argparse ``type`` of a name a Host header may carry (``vitlab app --allow-host``): no port, comma or space, and
    no IP address (the server checks those itself: loopback ones are served, others never)."""
    import ipaddress
    import re

    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"expected a host name such as myhost.local (letters, digits, '.', '-'; "
                                         f"no port), got {text!r}")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return text
    raise argparse.ArgumentTypeError(f"expected a host name, got the address {text!r}: loopback addresses are always "
                                     "served, others never (the server listens on 127.0.0.1 only)")


def non_negative_int(text: str) -> int:
    """argparse ``type`` of a count where 0 has a meaning (``--workers 0``: in this process) but no negative does."""
    return _whole_number(text, 0, "0 or more")


def positive_float(text: str) -> float:
    """argparse ``type`` of a finite number above 0 (``--image-scale``: -1 and nan drew figures at scale 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse ``type`` of a finite number, 0 or more (``--older-than 0``: everything used before now)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, 0 or more, got {text}")
    return value


def _parse_value(text: str):
    """A ``--set`` value: JSON (numbers, true/false/null, lists, quoted text), Python's True/False/None, else the text
    itself (e.g. ``flip=none``, ``randaugment=rand-m9-n2-mstd0.5``)."""
    if text in _PYTHON_CONSTANTS:
        return _PYTHON_CONSTANTS[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _check_output_file(path: str, flag: str, example: str) -> None:
    """Before any work: refuse an output file's name that is a folder, or whose parent is a file (the result would
    be computed and then lost)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name such as {p / example}")
    parent = next((a for a in p.absolute().parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")


def _model_files(model: str | None, weights: str | None) -> list[Path]:
    """The files that loading ``--model`` (and ``--weights``) reads: a checkpoint's folder's files (the embedded
    default's when ``model`` is None; a checkpoint given by one of its files is its folder), and the weights file."""
    from vitlab.base.choices import DEFAULT_CHECKPOINT  # torch-free: checked before the model loads

    files = [Path(weights)] if weights else []
    p = DEFAULT_CHECKPOINT if model is None else Path(model)
    if p.exists():
        folder = p if p.is_dir() else p.parent
        files += [f for f in folder.iterdir() if f.is_file()] if folder.is_dir() else []
    return files


def _check_not_an_input(path: str, flag: str, inputs: Sequence[Path]) -> None:
    """Before any work: refuse an output file that is one of the command's inputs (a checkpoint's weights, an image
    of --images), which writing the result would destroy."""
    p = Path(path)
    if not p.is_file():
        return
    hit = next((f for f in inputs if f.is_file() and os.path.samefile(f, p)), None)
    if hit is not None:
        raise ValueError(f"{flag} {path} is an input of this command ({hit}), which the result would overwrite; "
                         "give another file name")


def cmd_info(args: argparse.Namespace) -> int:
    from vitlab.models.checkpoint import card_line, card_metric, model_card
    from vitlab.models.info import model_info
    from vitlab.models.load import load_model

    model = load_model(args.model, pretrained=args.pretrained, weights=args.weights)
    params = sum(p.numel() for p in model.parameters())
    card = model_card(model)
    source = (getattr(model, "vitlab_checkpoint", {}).get("path") or (f"{args.weights} (local file)" if args.weights
              else (model.pretrained_cfg.get("hf_hub_id") or "timm pretrained") if args.pretrained and args.model
              else "random initialisation"))
    try:
        info = model_info(model, img_size=tuple(args.img_size) if args.img_size else None)
    except TypeError:  # a CNN: no tokens to describe
        if args.img_size:  # not left out without a word
            raise ValueError(f"--img-size gives a ViT's token grid at another input size; {args.model} is a "
                             f"{type(model).__name__}, which has no tokens: leave --img-size out") from None
        info = None
    d = dataclasses.asdict(info) if info is not None else {"architecture": type(model).__name__}
    if info is not None:
        d.update(num_tokens=info.num_tokens, prefix_kinds=list(info.prefix_kinds))
    d.update(parameters=params, weights=source, card_accuracy=card.get("test_accuracy") if card else None,
             card_metric=card_metric(card) if card else None)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    from vitlab.models.info import architecture_words

    arch = architecture_words(model, info) if info is not None else d["architecture"]  # as the report's facts
    rows = [("model", args.model or "embedded default"), ("architecture", arch),
            ("parameters", f"{params:,}"), ("weights", source)]
    if card:
        rows.append(("model card", card_line(card)))
    if info is not None:
        rows += [("input", f"{info.img_size[0]}x{info.img_size[1]} px, {info.patch_size[0]}x{info.patch_size[1]} "
                           f"px patches, grid {info.grid_size[0]}x{info.grid_size[1]}"),
                 ("tokens", f"{info.num_tokens} ({info.num_prefix_tokens} prefix: "
                            f"{', '.join(info.prefix_kinds) or 'none'}"
                            + (f", joins at block {info.class_token_joins + 1}" if info.class_token_joins else "")
                            + ")"),
                 ("blocks", f"{info.depth} x width {info.embed_dim}, {info.num_heads} heads"),
                 ("position embedding", f"{info.pos_embed} (prefix rows: {'yes' if info.pos_embed_has_prefix else 'no'})"
                                        + (f"; in attention: {', '.join(info.attention_positions)}"
                                           if info.attention_positions else "")
                                        + (f" (blocks 1-{info.gpsa_depth})" if info.gpsa_depth else "")),  # ConViT
                 ("readout", info.readout + (" (hybrid: CNN features as patches)" if info.hybrid else ""))]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0


class OptionError(ValueError):
    """A command-line option that names no preset or field: printed as it is, exit status 2."""


def preset_config(preset: str, sets: list[str] | None = None, epochs: int | None = None,
                  data: str | None = None) -> TrainConfig:
    """The ``TrainConfig`` that ``vitlab train --preset PRESET [--set FIELD=VALUE ...] [--epochs N] [--data D]``
    trains. ``OptionError`` names an unknown preset or field with the valid ones; a value the config refuses raises
    its own ValueError."""
    if preset not in PRESETS:  # told at once, before torch and timm load
        raise OptionError(f"unknown preset {preset!r}; choose one of {', '.join(sorted(PRESETS))}")
    from vitlab.models.config import replace_fields

    cfg = PRESETS[preset]
    changes = {}
    model_changes = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if key.startswith("model.") and sep:
            model_changes[key.removeprefix("model.")] = _parse_value(value)
            continue
        if not sep or key not in {f.name for f in dataclasses.fields(cfg)} or key == "model":
            raise OptionError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of "
                             f"{', '.join(f.name for f in dataclasses.fields(cfg) if f.name != 'model')}, or "
                             f"model.FIELD=VALUE for the model's config")
        changes[key] = _parse_value(value)
    if epochs is not None:
        changes["epochs"] = epochs
    if data is not None:
        changes["data"] = data
    if model_changes:  # all at once, so that fields which must agree (embed_dim, num_heads) can change together
        try:
            changes["model"] = replace_fields(cfg.model, model_changes)
        except (KeyError, TypeError, ValueError) as e:
            sets_text = " ".join(f"--set model.{k}" for k in model_changes)
            raise OptionError(f"{sets_text}: {e.args[0] if isinstance(e, KeyError) else e}") from None
    return dataclasses.replace(cfg, **changes)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        cfg = preset_config(args.preset, args.set, args.epochs, args.data)
    except OptionError as e:
        print(e, file=sys.stderr)
        return 2
    from vitlab.data.datasets import cache_dir
    from vitlab.models.load import DEFAULT_CHECKPOINT
    from vitlab.train.loop import train

    def say(text: str) -> None:  # under torchrun the main process alone (every process decides the same)
        if os.environ.get("RANK", "0") == "0":
            print(text, file=sys.stderr)

    run = Path(args.run or cache_dir() / "runs" / args.preset)  # outside the work tree: survives a fresh checkout
    resume = args.resume
    if args.continue_run:
        from vitlab.train.run_folder import continue_run

        cfg, resume = continue_run(run, DEFAULT_CHECKPOINT.parent / args.preset, cfg, say)
    say(f"run folder: {run}")
    train(cfg, run, resume=resume, progress=not args.quiet, device=args.device, workers=args.workers,
          compile={"auto": None, "on": True, "off": False}[args.compile])
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.goal is not None and not 0 < args.goal <= 1:
        raise ValueError(f"--goal is a fraction in (0, 1], e.g. 0.9 for a 90% accuracy goal, got {args.goal:g}")
    run, out = Path(args.run_dir).resolve(), Path(args.out).resolve()
    if out == run or run in out.parents or out in run.parents:  # the export replaces --out as a whole
        raise ValueError(f"--out {args.out} is --run-dir {args.run_dir}, inside it or above it: the export would replace "
                         "the run's training state (its checkpoint, the --resume point); give --out a folder outside "
                         "the run, e.g. data/checkpoints/NAME")
    from vitlab.train.export import export_run

    facts = export_run(args.run_dir, args.out, command=args.command_line, hardware=args.hardware, goal=args.goal)
    print(json.dumps(facts, indent=2))
    return 0


def cmd_export_recipe(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    for r in args.runs:  # the export replaces each seed's folder as a whole
        run = Path(r).resolve()
        if out == run or run in out.parents or out in run.parents:
            raise ValueError(f"--out {args.out} is the run {r}, inside it or above it: the export would replace the run's "
                             "training state; give --out a folder outside the runs, e.g. data/checkpoints/recipes/NAME")
    from vitlab.train.export import export_recipe

    facts = export_recipe(args.runs, args.out, name=args.name, full_epochs=args.full_epochs, command=args.command_line,
                          hardware=args.hardware, allow_unfinished=args.allow_unfinished, progress=not args.quiet)
    for f in facts:
        print(json.dumps({k: f.get(k) for k in ("path", "recipe", "seed", "epochs_done", "epochs_planned",
                                                "full_epochs", "shortened", "test_accuracy", "hardware")}))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    if args.l2 is not None and not (args.l2 > 0 and args.l2 != float("inf")):  # at once, before torch loads
        raise ValueError(f"--l2 must be a positive finite number (the ridge penalty), got {args.l2:g}")
    if args.json:  # before torch loads and the feature pass, not after it
        _check_output_file(args.json, "--json", "probe.json")
        _check_not_an_input(args.json, "--json", _model_files(args.model, args.weights) + [Path(args.data)])
    import torch

    from vitlab.base.devices import resolve_device
    from vitlab.data.datasets import load_splits, nested_subsets
    from vitlab.models.load import load_model
    from vitlab.probe.features import extract_features, readout_description
    from vitlab.probe.linear import DEFAULT_L2, few_shot_accuracy, format_table, linear_probe_accuracy

    if args.l2 is None:
        args.l2 = DEFAULT_L2
    dev = resolve_device(args.device)
    model = load_model(args.model, pretrained=args.pretrained, weights=args.weights).to(dev)
    train, test = load_splits(args.data, progress=not args.quiet)
    shots = max(args.shots)
    counts = torch.bincount(train.labels, minlength=len(train.classes))
    present = counts > 0
    if shots > int(counts[present].min()):
        raise ValueError(f"{shots} shots need that many training images per class, but the smallest class "
                         f"of {args.data} has {int(counts[present].min())}: lower --shots")
    if args.max_train is not None and args.max_train < len(train):
        train = train.subset(nested_subsets(train.labels, [args.max_train], seed=0)[0])
        kept = torch.bincount(train.labels, minlength=len(counts))
        kept[~present] = shots  # classes the data set lacks are no shortfall
        if shots > int(kept.min()):  # before the feature pass: a balanced subset of shots x classes has enough
            c = int(kept.argmin())
            raise ValueError(f"--max-train {args.max_train} keeps {int(kept[c])} training images of class "
                             f"{train.classes[c]!r}, but --shots {shots} needs {shots} per class: raise --max-train to "
                             f"at least {shots * int(present.sum())} ({shots} x {int(present.sum())} classes) or "
                             "lower --shots")
    if args.max_test is not None and args.max_test < len(test):
        test = test.subset(nested_subsets(test.labels, [args.max_test], seed=0)[0])
    progress = not args.quiet
    ftr = extract_features(model, train, batch_size=args.batch_size, progress=progress, readout=args.readout)
    fte = extract_features(model, test, batch_size=args.batch_size, progress=progress, readout=args.readout)
    res = few_shot_accuracy(ftr, train.labels, fte, test.labels, shots=args.shots, seeds=range(args.seeds),
                            l2=args.l2)
    if args.full and progress:  # scikit-learn's lbfgs shows nothing while it fits (minutes on CIFAR-10's 50,000)
        print(f"fitting a logistic regression on {len(train):,} x {ftr.shape[1]} training features (--full) ...",
              file=sys.stderr, flush=True)
    full = linear_probe_accuracy(ftr, train.labels, fte, test.labels) if args.full else None
    print(f"{args.model or 'embedded default'} on {args.data}: {len(train)} train / {len(test)} test images, "
          f"{ftr.shape[1]}-d features ({readout_description(model, args.readout)}), l2 = {args.l2:g}, {args.seeds} seeds")
    print(format_table(res, full))
    if args.json:
        from vitlab.base.atomic import atomic_write_text
        from vitlab.base.provenance import versions

        out = {"model": args.model, "data": args.data, "readout": args.readout, "l2": args.l2, "train": len(train),
               "test": len(test),
               "few_shot": {k: dataclasses.asdict(r) for k, r in res.items()}, "linear_probe": full,
               "versions": versions()}
        atomic_write_text(args.json, json.dumps(out, indent=2) + "\n")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.table and args.tune:
        raise ValueError("--table runs nothing (it prints what the results store holds) and --tune runs the tuning: "
                         "pass one of them")
    if args.save_config and not args.tune:
        raise ValueError("--save-config writes the config --tune freezes: pass --tune too, or leave --save-config out")
    from vitlab.studies.sweep_config import load_sweep_config  # torch-free: the checks below come before torch loads

    sweep = load_sweep_config(args.config)
    results = args.results or f"runs/sweeps/{sweep.name}.jsonl"
    if args.shots is not None and args.shots not in sweep.shots:
        raise ValueError(f"--shots {args.shots}: sweep {sweep.name!r} probes {list(sweep.shots)}-shot only; pick one of "
                         "those")
    stores = [Path(results), Path(results).with_suffix(".tuning.jsonl")]
    if args.plot:  # before any run, and never over the results it draws
        _check_output_file(args.plot, "--plot", "scaling.html")
        _check_not_an_input(args.plot, "--plot", [*stores, Path(args.config)])
    if args.save_config:
        _check_not_an_input(args.save_config, "--save-config", stores)
    from vitlab.studies.scaling import ResultsStore, run_sweep, summarise

    if args.table:  # default: 10-shot (the sweep's; the paper's Fig. 4 is 5-shot) where probed, else its largest
        shots = args.shots if args.shots is not None else 10 if 10 in sweep.shots else max(sweep.shots)
        return _sweep_tables(sweep, Path(results), shots, args.plot)
    if args.tune:
        from vitlab.studies.tuning import tune

        tuned = tune(sweep, Path(results).with_suffix(".tuning.jsonl"), progress=not args.quiet,
                     executor=args.executor, workers=args.workers, address=args.address, work_dir=args.work_dir)
        # beside the results, where `--table` and notebook 06 look for it (not the current folder)
        out = args.save_config or str(Path(results).with_suffix(".tuned.json"))
        from vitlab.base.atomic import atomic_write_text

        atomic_write_text(out, json.dumps(dataclasses.asdict(tuned), indent=2) + "\n")
        print(f"tuned recipes {list(tuned.recipes)} (with vitlab code {tuned.tuned_code}); frozen config written to "
              f"{out}: run the sweep with --config {out}")
        return 0
    new = run_sweep(sweep, results, executor=args.executor, workers=args.workers, address=args.address,
                    work_dir=args.work_dir, progress=not args.quiet)
    in_grid = {s.run_id for s in sweep.runs()}
    records = [r for k, r in ResultsStore(results).latest(sweep.name, sweep.fingerprint()).items() if k in in_grid]
    failed = [r for r in records if r["status"] != "ok"]
    print(f"sweep {sweep.name}: {len(new)} run(s) now, {len(records) - len(failed)} of {len(sweep.runs())} done, "
          f"{len(failed)} failed; results in {results}")
    for r in failed:
        print(f"  failed {r['run_id']}: {r['error']}")
    shots = max(sweep.shots) if args.shots is None else args.shots
    for fam, by_size in summarise(records, shots).items():
        print(f"  {fam}: " + ", ".join(f"{n}: {100 * v['mean']:.1f}%" for n, v in by_size.items()) + f" ({shots}-shot)")
    if args.plot:
        _scaling_plot(records, sweep.name, shots, args.plot)
    return 1 if failed else 0


def _scaling_plot(records: list[dict], name: str, shots: int, path: str) -> None:
    """Both panels of the sweep's figure (against images and against FLOPs) to ``path`` (.html, or .png)."""
    from vitlab.base.atomic import atomic_write
    from vitlab.figures.plots import scaling_curves
    from vitlab.studies.scaling import summarise, summarise_compute

    fig = scaling_curves(summarise(records, shots), title=f"Sweep {name}: {shots}-shot accuracy on held-out classes "
                         "(error bars: std over seeds)", compute=summarise_compute(records) or None)
    if path.endswith(".png"):  # static export through kaleido: needs a Chromium
        from vitlab.figures.static import chromium_for_export, find_chromium, no_chromium_reason

        browser = find_chromium()
        if browser is None:
            raise RuntimeError(f"--plot FILE.png needs a Chromium: {no_chromium_reason()}; or pass an .html file")
        with chromium_for_export(browser):
            atomic_write(path, lambda tmp: fig.write_image(tmp, format="png", scale=2))
    else:
        atomic_write(path, lambda tmp: fig.write_html(tmp, include_plotlyjs=True))
    print(f"plot: {path}")


def _sweep_tables(sweep: SweepConfig, results: Path, shots: int, plot: str | None = None) -> int:
    """``vitlab sweep --table``: the README's tables and verdict from a results store, running nothing. The records
    are the latest of each grid run of ``sweep.name`` whatever code made them (one fingerprint, or an error)."""
    from vitlab.findings.explain import explain
    from vitlab.findings.studies import scaling_gap_narrows
    from vitlab.findings.verdict import verdict_table
    from vitlab.studies.scaling import ResultsStore, markdown_table, one_config, summarise
    from vitlab.studies.tuning import plotted_recipes, recipe_grid_positions, tuning_table, tuning_trials_for

    in_grid = {s.run_id for s in sweep.runs()}
    records = [r for k, r in ResultsStore(results).latest(sweep.name).items() if k in in_grid]
    if not records:
        from vitlab.report import SCALING_RESULTS as shipped
        hint = (f"; the shipped sweep's results are in {shipped}: pass --results {shipped}"
                if shipped.is_file() and results.resolve() != shipped and ResultsStore(shipped).latest(sweep.name)
                else "")
        print(f"no records of sweep {sweep.name!r} in {results}: run `vitlab sweep --config ...` first{hint}",
              file=sys.stderr)
        return 1
    try:
        one_config(records)
    except ValueError as e:
        print(f"{results} holds sweep {sweep.name!r} rows of several configs or code versions, which the table would "
              f"mix: {e}", file=sys.stderr)
        return 1
    ok = [r for r in records if r["status"] == "ok"]
    print(f"{len(ok)} of {len(sweep.runs())} runs finished, {len(records) - len(ok)} failed, "
          f"{sum(r['metrics']['train_seconds'] for r in ok):,.0f} s of training\n")
    print(f"{shots}-shot accuracy on the held-out classes, % (mean ± std over seeds):\n")
    print(markdown_table(summarise(records, shots)))
    tuning = results.with_suffix(".tuning.jsonl")
    if tuning.exists():  # the trials behind these runs, the recipes they trained with marked (from their own config)
        trials, note = tuning_trials_for(records, ResultsStore(tuning).records())
        chosen = plotted_recipes(records)
        print(f"\nTuning ({tuning.name}): each family on the largest subset, seed 0, by the best validation "
              f"accuracy; {note}; marked: the recipes the runs above trained with:\n")
        if trials:
            print(tuning_table(trials, shots, chosen))
            print("\n" + "\n".join(recipe_grid_positions(trials, chosen)))
    families = {r["spec"]["family"] for r in ok}
    if {"vit", "bit"} <= families:
        verdicts = [scaling_gap_narrows(records, shots)]
        print("\n```\n" + verdict_table(verdicts) + "\n```\n")
        print(explain(verdicts, width=115))
    if plot:
        _scaling_plot(records, sweep.name, shots, plot)
    return 0


def cmd_mpp_study(args: argparse.Namespace) -> int:
    if args.run_root and Path(args.run_root).exists() and not Path(args.run_root).is_dir():  # before torch loads
        raise ValueError(f"--run-root {args.run_root} is a file; give a folder for the pre-training runs")
    from vitlab.findings.explain import explain
    from vitlab.findings.judge import mpp_verdicts
    from vitlab.findings.verdict import verdict_table
    from vitlab.probe.features import READOUT_NAMES, READOUTS
    from vitlab.studies.mpp import (
        STUDIES,
        default_results,
        markdown_tables,
        row_status,
        run_study,
        shown_records,
    )
    from vitlab.studies.scaling import ResultsStore

    study = STUDIES[args.study]
    if args.run_root:
        study = dataclasses.replace(study, run_root=args.run_root)
    results = Path(args.results) if args.results else default_results(study)
    failed = []
    if not args.table:
        new = run_study(study, results, progress=not args.quiet, device=args.device)
        failed = [r for r in new if r["status"] != "ok"]
        print(f"mpp-study {study.name}: {len(new)} row(s) run now, {len(failed)} failed; results in {results}")
        for r in failed:
            print(f"  failed {r['row_id']}: {r['error']}")
    stored = ResultsStore(results).records()
    records, shown = shown_records(stored, study.name)
    if not records:
        print(f"no records of study {study.name!r} in {results}: run `vitlab mpp-study --study {study.name}` first",
              file=sys.stderr)
        return 1
    try:
        status = row_status(study, stored)
        counts = {k: sum(v == k for v in status.values()) for k in ("done", "changed", "failed", "missing")}
        against = f"of {len(status)} rows " + ", ".join(f"{n} {k}" for k, n in counts.items() if n) + \
            " against this config and code"
    except (FileNotFoundError, ValueError) as e:  # e.g. the supervised checkpoint is not in this checkout
        against = f"not checked against this config ({e})"
    for readout in READOUTS:
        print(f"Few-shot features: {READOUT_NAMES[readout]}\n")
        print(markdown_tables(records, readout) + "\n")
    print(f"The latest finished record of each row of study {study.name} in {results}: {shown}; {against}.\n")
    verdicts = mpp_verdicts(records, study.verdict_shots)
    if verdicts:
        print(verdict_table(verdicts))
        print(explain(verdicts))
    return 1 if failed else 0


def _check_app_model(model: str | None, num_images: int, pretrained: bool = True, weights: str | None = None) -> None:
    """Load ``model`` as the explorer's kernel will and check that it has attention to show and ``num_images`` of
    its default images, before any server starts."""
    from vitlab.data.images import default_image_count, default_source
    from vitlab.models.info import has_attention, model_info
    from vitlab.models.load import load_model

    net = load_model(model or None, pretrained=pretrained, weights=weights)
    try:
        model_info(net)
    except TypeError as e:
        what = "cannot be read by the explorer" if has_attention(net) else "has no self-attention for the explorer to show"
        raise ValueError(f"{model or 'the embedded default'} {what} ({e}): pass a ViT-family model") from e
    most = default_image_count(net)
    if num_images > most:
        raise ValueError(f"--num-images {num_images}: this model's images are {default_source(net)}, at most "
                         f"{most}")


def cmd_app(args: argparse.Namespace) -> int:
    import signal

    from vitlab.app import check_port, new_token, page_url, serve, stop

    check_port(args.port)  # before the model loads: Voila would otherwise serve on another port than the one named
    # here, with the CLI's message and exit status, not in the browser
    _check_app_model(args.model, args.num_images, args.pretrained, args.weights)
    token = new_token()  # as Jupyter's: another local user or a web page (DNS rebinding) cannot start kernels
    proc = serve(args.model, port=args.port, open_browser=args.open, num_images=args.num_images,
                 pretrained=args.pretrained, weights=args.weights, token=token, hosts=tuple(args.allow_host),
                 max_pages=args.max_pages)
    print(f"serving the attention explorer on {page_url(args.port, token)} (Ctrl-C or kill to stop)", flush=True)

    def on_term(_signum, _frame):  # kill (SIGTERM) stops the server and its kernels too, not only this process
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            stop(proc)


def cmd_capture(args: argparse.Namespace) -> int:
    _check_output_file(args.out, "--out", "attention.safetensors")  # at once, before torch loads
    _check_not_an_input(args.out, "--out", _model_files(args.model, args.weights))  # the images' after vitlab.data.datasets
    from safetensors.torch import save_file

    from vitlab.base.atomic import atomic_write
    from vitlab.data.datasets import image_files
    from vitlab.data.images import load_images
    from vitlab.inspect.capture import attention_maps
    from vitlab.models.info import model_info
    from vitlab.models.load import load_model

    images = image_files(Path(args.images)) if args.images and Path(args.images).is_dir() else []
    _check_not_an_input(args.out, "--out", images)
    from vitlab.base.devices import resolve_device

    dev = resolve_device(args.device)
    model = load_model(args.model, pretrained=args.pretrained, weights=args.weights).to(dev)
    names, x, _ = load_images(model, args.images, limit=args.num_images, skip_bad=args.skip_bad)
    maps = attention_maps(model, x.to(dev), head_fusion=args.head_fusion, queries=args.queries,
                                 batch_size=args.batch_size).cpu()
    meta = {"images": json.dumps(names)}
    try:  # the token layout, so that a reader of the file alone tells prefix tokens (class, registers) from patches
        info = model_info(model, img_size=tuple(x.shape[-2:]))
    except TypeError:  # a model vitlab captures but cannot describe (timm's NaFlexVit)
        pass
    else:
        meta.update(prefix_tokens=json.dumps(list(info.prefix_kinds)), grid=json.dumps(list(info.grid_size)))
    atomic_write(args.out, lambda tmp: save_file({"attention": maps.contiguous()}, tmp, metadata=meta),
                 needed=maps.numel() * maps.element_size())  # never half a file; a full disk told before writing
    print(f"wrote {args.out}: attention {tuple(maps.shape)} (L, B, H, Q, T) for {len(names)} "
          f"image{'' if len(names) == 1 else 's'}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from vitlab.findings.recipe import recipe_runs
    from vitlab.findings.verdict import Verdict, verdict_table
    from vitlab.report import reproduce

    runs = recipe_runs(args.model) if args.model else [None]  # --model repeated, or a folder of runs: a recipe
    out = reproduce(model=runs[0] if len(runs) == 1 else runs, images=args.images, out=args.out, pretrained=args.pretrained,
                    weights=args.weights, num_images=args.num_images, shapes=args.shapes, png=args.png,
                    few_shot=args.few_shot, scaling=args.scaling, image_scale=args.image_scale,
                    formats=tuple(args.formats.split(",")), skip_bad=args.skip_bad, progress=not args.quiet,
                    device=args.device)
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    verdicts = [Verdict.from_dict({k: v for k, v in d.items() if k != "section"}) for d in metrics["verdicts"]]
    print(verdict_table(verdicts))
    for n in metrics.get("not_judged", []):  # what the report could not judge here, and how to change that
        print(f"not judged: {n['finding']}: {n['reason']}")
    print(f"report: {out / 'report.html'}")
    if metrics["png"].startswith(("skipped", "failed")):  # asked for, not written: said here, not only in metrics
        print(f"static figures ({args.formats}) not written: {metrics['png'].partition(': ')[2]}. report.html has "
              "every figure; a rerun writes the files once that is fixed (--no-png: not asked for)")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from vitlab.data.datasets import fetch_cifar

    where, fetched = fetch_cifar(args.name)
    print(f"{args.name}: downloaded into {where}" if fetched else f"{args.name}: already here, read from {where}")
    return 0


def _size_words(n: int) -> str:
    """Bytes in decimal units (``154.0 MB``), as ``du -h --si`` and the README count them."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if float(shown := f"{n / scale:.1f}") < 1000 or unit == "GB":  # 999,950 B is 1.0 MB, not 1000.0 kB
            return f"{shown} {unit}"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _age_words(seconds: float) -> str:
    """How long ago, in the unit ``--older-than`` takes beyond a day (``3.2 days ago``)."""
    seconds = max(0.0, seconds)
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def _entry_rows(entries, root: Path, now: float) -> list[str]:
    """One aligned line per cache entry: kind, size, last used, file name (relative to the cache root), detail."""
    rows = [(e.kind, _size_words(e.size), _age_words(now - e.last_used), e.path.relative_to(root).as_posix(),
             "unfinished write" if e.temp else e.detail) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + f"  {r[4]}".rstrip() for r in rows]


def cmd_cache(args: argparse.Namespace) -> int:
    import time

    from vitlab.data.cache import KINDS, TEMP_GRACE_S, prune_cache, scan_cache
    from vitlab.data.datasets import cache_dir

    now = time.time()
    root = cache_dir()
    where = f"{root} (VITLAB_CACHE)" if os.environ.get("VITLAB_CACHE") else f"{root} (set VITLAB_CACHE to move it)"
    if args.action == "prune":
        kinds = (args.kind,) if args.kind else KINDS
        result = prune_cache(args.older_than, kinds, everything=args.all, dry_run=args.dry_run, now=now)
        verb = "would remove" if args.dry_run else "removed"
        print(f"cache root: {where}")
        if result.removed:
            print(f"{verb} {_files(len(result.removed))}, {_size_words(result.freed)}:")
            print("\n".join("  " + r for r in _entry_rows(result.removed, root, now)))
        else:
            print(f"nothing to prune: no {' or '.join(kinds)} entry"
                  + ("" if args.all else f" last used more than {args.older_than:g} days ago"))
        if result.busy:
            print(f"kept {len(result.busy)} temporary file(s) younger than an hour (a writer may be filling them)")
        if args.dry_run and result.removed:
            print("nothing removed (--dry-run)")
        for e, why in result.failed:
            print(f"vitlab cache: could not remove {e.path}: {why}; check the cache folder's permissions",
                  file=sys.stderr)
        return 1 if result.failed else 0
    scan = scan_cache(root)
    print(f"cache root: {where}")
    if not scan.exists:
        print("nothing cached yet (the folder does not exist)")
        return 0
    if scan.entries:
        print("\n".join(_entry_rows(scan.entries, root, now)))
    totals = "; ".join(f"{k}: {_files(sum(e.kind == k for e in scan.entries))}, {_size_words(scan.size(k))}"
                       for k in KINDS)
    young = [e for e in scan.entries if e.temp and now - e.last_used < TEMP_GRACE_S]  # a writer may be filling them
    keeps = f", but for {_files(len(young))} a writer may still be filling" if young else ""
    print(f"{totals}; total {_size_words(scan.size())} (vitlab cache prune --all frees it{keeps})")
    print(f"runs/ (training runs: not a cache, never pruned): {_size_words(scan.runs_size)}")
    print(f"other files (results, logs, downloads: never pruned): {_size_words(scan.other_size)}")
    return 0


def user_path(text: str) -> str:
    """A path option as typed, with a leading ``~`` made the home folder: the shell expands ``--out ~/x`` but not
    ``--out=~/x``, which would otherwise make a folder named ``~`` here. An empty text (``--images "$UNSET"``) is
    refused: it read as the option left out (``--images ''`` took the default photos) or as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty text (an unset shell variable?)")
    return os.path.expanduser(text) if text.startswith("~") else text


def build_parser() -> argparse.ArgumentParser:
    from vitlab.base.provenance import VERSION as __version__

    p = argparse.ArgumentParser(prog="vitlab", description="Look inside Vision Transformers.")
    p.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(sp: argparse.ArgumentParser, default=None, runs: bool = False) -> None:
        sp.add_argument("--model", type=user_path, default=default, action="append" if runs else "store",
                        help="timm model name (the paper's own weights: e.g. vit_base_patch16_224.orig_in21k or "
                             "vit_large_patch32_224.orig_in21k; AugReg's: vit_base_patch16_224.augreg2_in21k_ft_in1k), "
                             "a vitlab checkpoint folder, or omit for the embedded default" + (
                                 ". Repeat it (--model A --model B), or give a folder of checkpoint or training run "
                                 "folders, to judge a recipe from several training runs (seeds) rather than one run: "
                                 "the verdicts combine them, the figures are the first's" if runs else ""))
        sp.add_argument("--no-pretrained", dest="pretrained", action="store_false",
                        help="for timm names: random weights instead of downloading pretrained ones")
        sp.add_argument("--weights", type=user_path, metavar="FILE",
                        help="for timm names: a local weights file (.safetensors, or .pth/.bin read with "
                             "weights_only) instead of the hub: the offline route")

    sp = sub.add_parser("info", help="print what vitlab knows about a model (grid, prefix tokens, readout, ...)")
    model_args(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--img-size", type=positive_int, nargs=2, metavar=("H", "W"), help="input size to describe")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser("capture", help="save attention maps (L, B, H, T, T) of a model on images to safetensors "
                        "(metadata: the images, the prefix tokens before the patches, the patch grid)")
    model_args(sp)
    sp.add_argument("--images", type=user_path, help="folder of images (default: the photos shipped with scikit-learn)")
    sp.add_argument("--num-images", type=positive_int, help="capture only the first N images of --images, sorted by path, "
                    "with a warning counting those left out (with --skip-bad: the first N usable ones; default: "
                    "every image)")
    sp.add_argument("--out", type=user_path, default="attention.safetensors", help="output file")
    sp.add_argument("--head-fusion", choices=["mean", "max", "min"], help="fuse heads inside the hook")
    sp.add_argument("--queries", choices=["all", "prefix"], default=None,
                    help="prefix: keep only the prefix tokens' query rows (class, distillation and register tokens; "
                    "not the readout of an average-pooled model)")
    sp.add_argument("--batch-size", type=positive_int, default=None)
    sp.add_argument("--skip-bad", action="store_true", help="skip unreadable or too small images with a warning")
    sp.add_argument("--device", help=DEVICE_HELP)
    sp.set_defaults(func=cmd_capture)

    sp = sub.add_parser("train", help="train a preset (resumable; metrics in RUN/metrics.jsonl)")
    sp.add_argument("--preset", default="vit_cifar10", help=", ".join(PRESETS))
    sp.add_argument("--run-dir", type=user_path, dest="run", help="run folder (default $VITLAB_CACHE/runs/PRESET, i.e. "
                    "~/.cache/vitlab/runs/PRESET: outside the work tree)")
    leg = sp.add_mutually_exclusive_group()  # --continue resumes by itself where there is state to resume
    leg.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    leg.add_argument("--continue", dest="continue_run", action="store_true",
                    help="resume the run when its state exists; otherwise, or when the run finished and was exported, "
                         "warm-start a new leg from the shipped checkpoint of the preset (data/checkpoints/PRESET) "
                         "with a fresh schedule instead of starting over")
    sp.add_argument("--epochs", type=positive_int, help="override the preset's number of epochs")
    sp.add_argument("--data", type=user_path, help="dataset: cifar10, cifar100 (cifar10:ROOT for a folder holding train.zip/test.zip), "
                    "or an ImageFolder folder/zip with train/ and test/ splits of the same classes")
    sp.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="override a TrainConfig field (VALUE as JSON: 5e-4, true, null, [1, 2]; Python's True/False/None too; "
                    "else a string), or a field of the preset's "
                    "model config as model.FIELD=VALUE (e.g. model.patch_drop_rate=0)")
    sp.add_argument("--device", help=f"{DEVICE_HELP}; under torchrun, one process per device")
    sp.add_argument("--workers", type=non_negative_int, help="processes making the augmented batches while the model trains "
                    "(default: none on a CPU, all cores but two beside an accelerator); the batches are the same")
    sp.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="the training step through torch.compile (auto: a ViT classifier in one process on a CPU "
                    "for 1,000 steps or more, where the faster epochs repay a slow first step); not "
                    "part of the run: resume either way")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_train)

    sp = sub.add_parser("export", help="ship a run's last checkpoint in half precision with a model card")
    sp.add_argument("--run-dir", type=user_path, required=True, help="the run folder written by vitlab train")
    sp.add_argument("--out", type=user_path, required=True, help="output folder, e.g. data/checkpoints/vit_cifar10")
    sp.add_argument("--command-line", required=True, help="the training command, recorded on the card")
    sp.add_argument("--hardware", help="where it trained (default: the CPU or GPU, cores and threads the run "
                    "recorded when it trained)")
    sp.add_argument("--goal", type=float, help="accuracy goal drawn on the learning curve, e.g. 0.9")
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("export-recipe", help="ship the seeds of one recipe (run folders) as OUT/seed<n>, each in half "
                        "precision with a card holding its history and the Fig. 7 statistics of its snapshots")
    sp.add_argument("runs", nargs="+", type=user_path, help="the recipe's run folders (vitlab train --run-dir)")
    sp.add_argument("--out", type=user_path, required=True, help="e.g. data/checkpoints/recipes/vit_cifar10_noteacher")
    sp.add_argument("--name", help="the recipe's name (default: --out's folder name, e.g. the preset's)")
    sp.add_argument("--full-epochs", type=positive_int, help="the recipe's full schedule in epochs; runs planned "
                    "for fewer are cards of a shortened schedule")
    sp.add_argument("--command-line", help="the training command on each card, {seed} for the seed (default: vitlab "
                    "train --preset NAME --set seed={seed})")
    sp.add_argument("--hardware", help="where they trained (default: as each run recorded it)")
    sp.add_argument("--allow-unfinished", action="store_true", help="ship runs that have not trained all their epochs")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_export_recipe)

    sp = sub.add_parser("probe", help="few-shot linear probe (paper section 4.1) of a model's frozen features")
    model_args(sp)
    sp.add_argument("--data", type=user_path, required=True, help="cifar10, cifar100, shapes, or an ImageFolder folder/zip with "
                    "train and test splits")
    sp.add_argument("--shots", type=positive_int, nargs="+", default=[1, 5, 10, 25], help="examples per class (default 1 5 "
                    "10 25)")
    sp.add_argument("--seeds", type=positive_int, default=3, help="random draws per shot count (default 3)")
    sp.add_argument("--l2", type=float, default=None,
                    help="ridge regularisation (default vitlab.probe.linear.DEFAULT_L2 = 2**10, as big_vision)")
    sp.add_argument("--no-full", dest="full", action="store_false",
                    help="skip the logistic-regression probe on all training features")
    sp.add_argument("--readout", choices=READOUTS, default="model",
                    help="the features probed: model (default), the model's own readout (its class token; the mean of "
                    "class and distillation tokens for a distilled ViT), or patch_mean, the mean of the final patch "
                    "tokens (for encoders whose class token was never trained, e.g. masked patch prediction's)")
    sp.add_argument("--max-train", type=positive_int, help="use a class-balanced subset of this many training images")
    sp.add_argument("--max-test", type=positive_int, help="use a class-balanced subset of this many test images")
    sp.add_argument("--batch-size", type=positive_int, default=128)
    sp.add_argument("--json", help="also write the results to this JSON file")
    sp.add_argument("--device", help=DEVICE_HELP)
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_probe)

    sp = sub.add_parser("sweep", help="data-scaling sweep (paper Fig. 3/4): pre-train on nested subsets, probe "
                        "few-shot; resumable")
    sp.add_argument("--config", default="cifar10", help="a named sweep (cifar10, quick) or a JSON file of "
                    "SweepConfig fields")
    sp.add_argument("--results", type=user_path, help="JSONL results store (default runs/sweeps/NAME.jsonl); finished runs in it "
                    "are skipped")
    sp.add_argument("--executor", choices=["local", "ray"], default="local")
    sp.add_argument("--workers", type=non_negative_int, default=1, help="parallel runs (local: processes, 0 = in this process; "
                    "ray: CPUs of a local runtime)")
    sp.add_argument("--address", help="ray: address of a running cluster (default: start a local runtime)")
    sp.add_argument("--work-dir", type=user_path, help="scratch folder for run checkpoints (default: the system temp folder)")
    sp.add_argument("--shots", type=positive_int, help="shot count to summarise and plot (default: the largest)")
    sp.add_argument("--plot", type=user_path, help="write the scaling curves to this file (.html, or .png with a Chromium)")
    sp.add_argument("--tune", action="store_true", help="tune each family's optimizer, lr and weight decay once on the "
                    "largest subset (validation split), then write the frozen config (--save-config)")
    sp.add_argument("--save-config", type=user_path, help="with --tune: where to write the tuned sweep config (JSON; default: "
                    "beside the results, RESULTS with the suffix .tuned.json)")
    sp.add_argument("--table", action="store_true", help="run nothing: print the README's tables (the grid at --shots, "
                    "default 10 where the sweep probes it, else its largest, and the tuning trials) and the Fig. 3/4 verdict from the results store; with --plot, "
                    "draw the stored runs")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("mpp-study", help="masked patch prediction (paper section 4.6): MPP vs scratch vs supervised "
                        "(few-shot and fine-tune) and the target/rate ablation; resumable")
    sp.add_argument("--study", choices=["cifar10", "smoke"], default="cifar10",
                    help="cifar10: the default ViT shape on CIFAR-10 (about 45 min on a 2-core CPU with fast bf16); "
                    "smoke: a small ViT on the synthetic shapes (seconds)")
    sp.add_argument("--results", type=user_path, help="JSONL results store (default the checkout's data/results/mpp_cifar10.jsonl for "
                    "cifar10, $VITLAB_CACHE/results/mpp_NAME.jsonl otherwise); rows done with this config and code are "
                    "skipped")
    sp.add_argument("--table", action="store_true", help="run nothing: print the comparison and ablation tables "
                    "(Markdown) and the verdicts from the results")
    sp.add_argument("--run-root", type=user_path, help="pre-training run folders (default $VITLAB_CACHE/runs/mpp_study)")
    sp.add_argument("--device", help=DEVICE_HELP)
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_mpp_study)

    sp = sub.add_parser("app", help="serve the attention explorer as a standalone page (Voila)")
    model_args(sp)
    sp.add_argument("--port", type=tcp_port, default=8866)
    sp.add_argument("--num-images", type=positive_int, default=8, help="embedded images to offer (default 8; at most "
                    "128 CIFAR-10 test images for 32 px models, 38 photo crops otherwise)")
    sp.add_argument("--open", action="store_true", help="open a browser")
    sp.add_argument("--max-pages", type=positive_int, default=3, help="most explorer pages (kernels, each holding "
                    "the model) alive at once (default 3); more are refused until one is closed or idle")
    sp.add_argument("--allow-host", action="append", default=[], type=host_name, metavar="NAME",
                    help="also serve requests whose Host header is NAME (default: only 127.0.0.1, ::1, localhost; "
                    "others are refused against DNS rebinding); repeatable")
    sp.set_defaults(func=cmd_app)

    sp = sub.add_parser("reproduce", help="run the inspection experiments and write an HTML report")
    model_args(sp, runs=True)
    sp.add_argument("--images", type=user_path, help="folder of images (default: for 32 px models the 128 shipped CIFAR-10 test "
                    "images, the first 128 test shapes for a model trained on the synthetic shapes, otherwise 16 crops "
                    "of scikit-learn's sample photos)")
    sp.add_argument("--out", type=user_path, default="out", help="output folder: a new or empty one, or an earlier report's "
                    "(replaced only when the report is complete)")
    sp.add_argument("--num-images", type=positive_int, default=None,
                    help="images to analyse (default: all 128 CIFAR-10 test images for 32 px models, 16 otherwise)")
    sp.add_argument("--no-shapes", dest="shapes", action="store_false",
                    help="skip the localisation table of the shipped shapes ViT")
    sp.add_argument("--no-few-shot", dest="few_shot", action="store_false",
                    help="skip the few-shot probe on CIFAR-10 (run only when CIFAR-10 is readable here)")
    sp.add_argument("--no-scaling", dest="scaling", action="store_false",
                    help="skip the section drawn from the shipped data-scaling sweep")
    sp.add_argument("--no-png", dest="png", action="store_false", help="skip the static figures (need Chromium)")
    sp.add_argument("--formats", default="png", help="static figure formats, comma-separated: png, svg, pdf (e.g. "
                    "png,svg for papers)")
    sp.add_argument("--image-scale", type=positive_float, default=1.0, help="static figure scale (2: high resolution)")
    sp.add_argument("--skip-bad", action="store_true", help="skip unreadable or too small images (with a warning "
                    "naming them) instead of stopping")
    sp.add_argument("--device", help=DEVICE_HELP)
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.set_defaults(func=cmd_reproduce)

    sp = sub.add_parser("cache", help="list what vitlab caches (decoded images, features) and prune it",
                        description="Without an action: list (the cache root is $VITLAB_CACHE or ~/.cache/vitlab).")
    sp.set_defaults(func=cmd_cache, action="list")
    actions = sp.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="each entry's kind, size, last use and file, with totals (the default)")
    pp = actions.add_parser("prune", help="remove whole cache entries: those unused for DAYS days, or all; never "
                            "training runs, results, or a file a writer may still be filling")
    which = pp.add_mutually_exclusive_group(required=True)
    which.add_argument("--older-than", type=non_negative_float, metavar="DAYS",
                       help="remove the entries last used (written or read) more than DAYS days ago")
    which.add_argument("--all", action="store_true", help="remove every entry of the chosen kinds")
    pp.add_argument("--kind", choices=CACHE_KINDS, help="only this cache (default: both)")
    pp.add_argument("--dry-run", action="store_true", help="remove nothing: list what would be removed")

    sp = sub.add_parser("data", help="fetch a public data set (CIFAR-10) into the data folder, where `cifar10` is "
                                     "read from",
                        description="The data folder is $VITLAB_DATA, else the cache root's datasets/ "
                                    "(~/.cache/vitlab/datasets, or $VITLAB_CACHE/datasets); NAME goes into its NAME/ "
                                    "folder. Needs the network (torchvision's downloader, checked by MD5); a data set "
                                    "already readable here is not fetched again.")
    sp.add_argument("name", choices=PUBLIC_DATASETS, metavar="NAME", help=f"one of {', '.join(PUBLIC_DATASETS)}")
    sp.set_defaults(func=cmd_data)
    return p


def cli_words(message: str) -> str:
    """An error message from the Python API, in the command line's terms (its flags instead of keyword arguments)."""
    import re

    message = re.sub(r"vitlab\.load_model\(('[^']*'|\"[^\"]*\"), weights=('[^']*'|\"[^\"]*\"|path)\)",
                     lambda m: f"--model {m.group(1).strip(chr(39) + chr(34))} --weights "
                               f"{'FILE' if m.group(2) == 'path' else m.group(2).strip(chr(39) + chr(34))}", message)
    message = _set_words(message)  # before run_dir=NEW and resume=True below
    for api, flag in (("as the model itself, without weights=", "as --model alone"),  # before weights= below
                      ("use pretrained=False", "pass --no-pretrained"), ("pretrained=False", "--no-pretrained"),
                      ("pass weights=", "pass --weights "), ("weights= ", "--weights "), ("weights=", "--weights "),
                      ("num_images=", "--num-images "), ("pass images= ", "pass --images "),
                      (": pass a folder of images", ": pass --images a folder of images"),
                      ("pass skip_bad=True", "pass --skip-bad"), ("pass device='cpu'", "pass --device cpu"),
                      ("leave device=None", "leave --device out"), ("give out= ", "give --out "),
                      ("e.g. out=", "e.g. --out "), ("run_dir=NEW", "--run-dir NEW"),
                      ("Give run_dir= ", "Give --run-dir "), ("pass resume=True", "pass --resume"),
                      ("start with resume=False", "start without --resume"),
                      ("pass results= ", "pass --results "), ("executor='ray' needs", "--executor ray needs"),
                      ("compile=True is for", "--compile on is for"),
                      ("leave compile=None (auto) or pass compile=False", "leave --compile auto or pass --compile off")):
        message = message.replace(api, flag)
    # a message that opens with the argument it refuses (``device='cuda:3': ...``, ``out=. is ...``, ``resume=True: ``)
    return re.sub(r"^resume=True:", "--resume:", re.sub(r"^(device|out)=", r"--\1 ", message))


def _set_words(message: str) -> str:
    """The training API's ``dataclasses.replace(cfg, FIELD=VALUE, ...)`` (a nested model's ``model=dataclasses.replace(
    cfg.model, ...)`` too) as ``--set FIELD=VALUE`` for each field, in JSON's words (``'constant'`` unquoted, ``None``
    as null), and a new run's ``train(dataclasses.replace(cfg, ...), run_dir=NEW)`` recipe as its flags. Each
    ``FIELD=VALUE`` is one shell word (quoted where it holds a space, a quote or a bracket) whose value
    ``_parse_value`` reads back as the Python value (a text it would read as a number, a list or null in JSON's
    quotes)."""
    import ast
    import re
    import shlex

    text = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""  # a Python string literal, as repr() writes it
    args = rf"((?:{text}|[^()'\"])*)"  # FIELD=VALUE, ...: no parenthesis outside a quoted value

    def value(v: str) -> str:
        if v[:1] not in ("'", '"'):
            return {"None": "null", "True": "true", "False": "false"}.get(v, v)
        s = ast.literal_eval(v)
        return s if _parse_value(s) == s else json.dumps(s)  # '123' is no number, 'null' no None

    def sets(fields: str, path: str = "") -> str:
        return " ".join(f"--set {shlex.quote(f'{path}{m.group(1)}={value(m.group(2))}')}"
                        for m in re.finditer(rf"(\w+)=({text}|\[[^\]]*\]|[^,]*)", fields))

    message = re.sub(rf"train\(dataclasses\.replace\(cfg, {args}\), run_dir=NEW\)",
                     lambda m: f"--run-dir NEW {sets(m.group(1))}", message)
    message = message.replace("(resume=True keeps the saved settings)", "(a --resume keeps the saved settings)")
    for nest, path in ((rf"model=dataclasses\.replace\(cfg\.model, vit=dataclasses\.replace\(cfg\.model\.vit, "
                        rf"{args}\)\)", "model.vit."),
                       (rf"model=dataclasses\.replace\(cfg\.model, {args}\)", "model."), (args, "")):
        message = re.sub(rf"dataclasses\.replace\(cfg, {nest}\)", lambda m, path=path: sets(m.group(1), path), message)
    return message.replace("(as saved in its train_config.json)", "(--set FIELD=VALUE as saved)")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a job scheduler, torchrun stopping its workers) raised as an exception in the
    main thread, so that every writer's clean-up runs as for Ctrl-C: without it Python dies at once and leaves the
    ``.NAME.tmp.*`` folder of a checkpoint, export or report it was writing."""


def _raise_terminated(_signum, _frame) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command started: as during one, no traceback
        print("vitlab: interrupted", file=sys.stderr)
        return 130
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal.signal works only there
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return args.func(args)
    except BrokenPipeError as e:
        if not _stdout_closed_by_reader():
            print(f"vitlab {args.command}: {type(e).__name__}: {_os_error_words(e)}", file=sys.stderr)
            return 1
        # the reader went away (`vitlab info --json | head -1`): stop quietly, as Unix tools do, and point stdout
        # at /dev/null so that the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # the shell's status for SIGPIPE (128 + 13)
    except (ValueError, RuntimeError, TypeError, OSError) as e:
        # an OSError from the system (errno set: a read-only or full disk, a file where a folder should be) is told
        # by its path and what to do, not as [Errno 13] ... or a traceback
        text = _os_error_words(e) if isinstance(e, OSError) and e.errno is not None else cli_words(str(e))
        print(f"vitlab {args.command}: {type(e).__name__}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C or kill: a message and the shell's status for it, not a traceback
        term = isinstance(e, Terminated)
        print(f"vitlab {args.command}: " + ("terminated (SIGTERM)" if term else "interrupted")
              + ("; --resume continues from the last finished epoch, if one finished" if args.command == "train" else ""),
              file=sys.stderr)
        return 143 if term else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stdout_closed_by_reader() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (a notebook's), or no poll on this platform
        return False


def _os_error_words(e: OSError) -> str:
    """An ``OSError`` as one line naming its path and what to do (``[Errno 13] Permission denied: 'x'`` says neither
    which flag nor the fix)."""
    if e.filename is None:
        return str(e)
    where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "")
    hint = {PermissionError: "check its permissions (and its folder's) or choose another path",
            IsADirectoryError: "it is a folder: give a file's name",
            NotADirectoryError: "a part of the path is a file, not a folder: choose another path",
            FileExistsError: "a file stands where a folder is needed: choose another path",
            FileNotFoundError: "check the path"}.get(type(e), "")
    return f"{e.strerror or e}: {where}" + (f"; {hint}" if hint else "")


if __name__ == "__main__":
    sys.exit(main())
