"""``vitlab sweep``: the data-scaling sweep (paper Fig. 3/4), its tuning, tables and plot."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vitlab.cli.args import check_not_an_input, check_output_file, non_negative_int, positive_int, user_path

if TYPE_CHECKING:
    from vitlab.studies.sweep_config import SweepConfig

NAME = 'sweep'
HELP = 'data-scaling sweep (paper Fig. 3/4): pre-train on nested subsets, probe few-shot; resumable'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="cifar10", help="a named sweep (cifar10, quick) or a JSON file of "
                    "SweepConfig fields")
    parser.add_argument("--results", type=user_path, help="JSONL results store (default runs/sweeps/NAME.jsonl); finished runs in it "
                    "are skipped")
    parser.add_argument("--executor", choices=["local", "ray"], default="local")
    parser.add_argument("--workers", type=non_negative_int, default=1, help="parallel runs (local: processes, 0 = in this process; "
                    "ray: CPUs of a local runtime)")
    parser.add_argument("--address", help="ray: address of a running cluster (default: start a local runtime)")
    parser.add_argument("--work-dir", type=user_path, help="scratch folder for run checkpoints (default: the system temp folder)")
    parser.add_argument("--shots", type=positive_int, help="shot count to summarise and plot (default: the largest)")
    parser.add_argument("--plot", type=user_path, help="write the scaling curves to this file (.html, or .png with a Chromium)")
    parser.add_argument("--tune", action="store_true", help="tune each family's optimizer, lr and weight decay once on the "
                    "largest subset (validation split), then write the frozen config (--save-config)")
    parser.add_argument("--save-config", type=user_path, help="with --tune: where to write the tuned sweep config (JSON; default: "
                    "beside the results, RESULTS with the suffix .tuned.json)")
    parser.add_argument("--hours", type=float, help="start no run after this many hours (the runs in flight finish); "
                        "run the same command again to go on: a long sweep in sessions (local executor)")
    parser.add_argument("--table", action="store_true", help="run nothing: print the README's tables (the grid at --shots, "
                    "default 10 where the sweep probes it, else its largest, and the tuning trials) and the Fig. 3/4 verdict from the results store; with --plot, "
                    "draw the stored runs")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.table and args.tune:
        raise ValueError("--table runs nothing (it prints what the results store holds) and --tune runs the tuning: "
                         "pass one of them")
    if args.hours is not None and (args.tune or args.table):
        raise ValueError("--hours limits the grid's runs; --tune runs every trial (an interrupted tuning skips its "
                         "finished trials when run again) and --table runs nothing: leave --hours out")
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
        check_output_file(args.plot, "--plot", "scaling.html")
        check_not_an_input(args.plot, "--plot", [*stores, Path(args.config)])
    if args.save_config:
        check_not_an_input(args.save_config, "--save-config", stores)
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
                    work_dir=args.work_dir, progress=not args.quiet, hours=args.hours)
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
    from vitlab.findings.verdict import verdict_table
    from vitlab.studies.scaling import ResultsStore, markdown_table, one_config, summarise
    from vitlab.studies.tuning import plotted_recipes, recipe_grid_positions, tuning_table, tuning_trials_for

    in_grid = {s.run_id for s in sweep.runs()}
    records = [r for k, r in ResultsStore(results).latest(sweep.name).items() if k in in_grid]
    if not records:
        from vitlab.report import SCALING_RESULTS as shipped
        hint = ""
        if shipped.is_file() and results.resolve() != shipped:
            names = sorted({str(r.get("sweep")) for r in ResultsStore(shipped).newest_sweep().values()})
            hint = (f"; the shipped data-scaling results are in {shipped}: pass --config {names[0]} --results {shipped}"
                    if names else "")
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
    trials: list[dict] = []
    if tuning.exists():  # the trials behind these runs, the recipes they trained with marked (from their own config)
        trials, note = tuning_trials_for(records, ResultsStore(tuning).records())
        chosen = plotted_recipes(records)
        print(f"\nTuning ({tuning.name}): each family on the largest subset, seed 0, by the best validation "
              f"accuracy; {note}; marked: the recipes the runs above trained with:\n")
        if trials:
            print(tuning_table(trials, shots, chosen))
            print("\n" + "\n".join(recipe_grid_positions(trials, chosen)))
    _study_tables(sweep, records, shots, trials)
    from vitlab.findings.controls import study_verdicts
    from vitlab.findings.studies import study_words

    verdicts = study_verdicts(records, shots)
    if verdicts:
        print("\n```\n" + verdict_table(verdicts) + "\n```\n")
        print(explain(verdicts, width=115))
        print("\nWhat the intervals allow: " + study_words(records, verdicts, shots))
    if plot:
        _scaling_plot(records, sweep.name, shots, plot)
    return 0


def _study_tables(sweep: SweepConfig, records: list[dict], shots: int, trials: list[dict]) -> None:
    """``vitlab sweep --table``'s study tables: the paired per-size differences against the ResNet with the interval
    width reached, each run's best and last epoch (flagging runs whose best is their last), the CPU hours and the
    wall time (with the tuning ``trials`` behind the runs), and the sizes the config leaves out and why."""
    from vitlab.findings.studies import TARGET_HALF_WIDTH, difference_table
    from vitlab.studies.scaling import cost_table, numerics_line, stopping_table

    families = list(dict.fromkeys(r["spec"]["family"] for r in records if r["status"] == "ok"))
    for fam in [f for f in families if f != "bit"] if "bit" in families else []:
        print(f"\nPaired differences ({fam} - bit, the same subsets and probe pools per seed), points, with the "
              f"95% interval's half-width against the target of ±{TARGET_HALF_WIDTH:g}:\n")
        print(difference_table(records, shots, fam, "bit"))
    print("\nBest / last epoch (median over seeds) and the runs early stopping ended:\n")
    print(stopping_table(records))
    print("\nCPU hours per family and size (summed over seeds):\n")
    print(cost_table(records, trials))
    print("\n" + numerics_line(records))
    for n, why in sweep.omitted_sizes:
        print(f"\nLeft out: {n:,} images: {why}")
