"""``vitlab mpp-study``: masked patch prediction (paper section 4.6) against scratch and supervised."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from vitlab.base.choices import DEVICE_HELP
from vitlab.cli.args import user_path

NAME = 'mpp-study'
HELP = 'masked patch prediction (paper section 4.6): MPP vs scratch vs supervised (few-shot and fine-tune) and the target/rate ablation; resumable'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", choices=["cifar10", "smoke"], default="cifar10",
                    help="cifar10: the default ViT shape on CIFAR-10 (about 45 min on a 2-core CPU with fast bf16); "
                    "smoke: a small ViT on the synthetic shapes (seconds)")
    parser.add_argument("--results", type=user_path, help="JSONL results store (default the checkout's data/results/mpp_cifar10.jsonl for "
                    "cifar10, $VITLAB_CACHE/results/mpp_NAME.jsonl otherwise); rows done with this config and code are "
                    "skipped")
    parser.add_argument("--table", action="store_true", help="run nothing: print the comparison and ablation tables "
                    "(Markdown) and the verdicts from the results")
    parser.add_argument("--run-root", type=user_path, help="pre-training run folders (default $VITLAB_CACHE/runs/mpp_study)")
    parser.add_argument("--device", help=DEVICE_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.run_root and Path(args.run_root).exists() and not Path(args.run_root).is_dir():  # before torch loads
        raise ValueError(f"--run-root {args.run_root} is a file; give a folder for the pre-training runs")
    from vitlab.findings.explain import explain
    from vitlab.findings.judge import mpp_verdicts
    from vitlab.findings.verdict import verdict_table
    from vitlab.probe.features import READOUT_NAMES, READOUTS
    from vitlab.studies.mpp import STUDIES, default_results, markdown_tables, row_status, run_study, shown_records
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
