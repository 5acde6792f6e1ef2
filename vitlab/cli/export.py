"""``vitlab export``: ship a run's last checkpoint in half precision with a model card."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.cli.args import user_path

NAME = 'export'
HELP = "ship a run's last checkpoint in half precision with a model card"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=user_path, required=True, help="the run folder written by vitlab train")
    parser.add_argument("--out", type=user_path, required=True, help="output folder, e.g. data/checkpoints/vit_cifar10")
    parser.add_argument("--command-line", required=True, help="the training command, recorded on the card")
    parser.add_argument("--hardware", help="where it trained (default: the CPU or GPU, cores and threads the run "
                    "recorded when it trained)")
    parser.add_argument("--goal", type=float, help="accuracy goal drawn on the learning curve, e.g. 0.9")


def run(args: argparse.Namespace) -> int:
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
