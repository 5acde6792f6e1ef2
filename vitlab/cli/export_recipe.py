"""``vitlab export-recipe``: ship the seeds of one training recipe, each with a card holding its history and the Fig. 7
statistics of its snapshots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.base.errors import ParameterError
from vitlab.cli.args import positive_int, user_path

NAME = "export-recipe"
HELP = ("ship the seeds of one recipe (run folders) as OUT/seed<n>, each in half precision with a card holding its "
        "history and the Fig. 7 statistics of its snapshots")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=user_path, help="the recipe's run folders (vitlab train --run-dir)")
    parser.add_argument("--out", type=user_path, required=True, help="e.g. data/checkpoints/recipes/vit_cifar10_noteacher")
    parser.add_argument("--name", help="the recipe's name (default: --out's folder name, e.g. the preset's)")
    parser.add_argument("--full-epochs", type=positive_int, help="the recipe's full schedule in epochs; runs planned "
                        "for fewer are cards of a shortened schedule")
    parser.add_argument("--command-line", help="the training command on each card, {seed} for the seed (default: "
                        "vitlab train --preset NAME --set seed={seed})")
    parser.add_argument("--hardware", help="where they trained (default: as each run recorded it)")
    parser.add_argument("--allow-unfinished", action="store_true", help="ship runs that have not trained all their "
                        "epochs")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    for r in args.runs:  # the export replaces each seed's folder as a whole
        path = Path(r).resolve()
        if out == path or path in out.parents or out in path.parents:
            raise ParameterError("out", args.out, problem=f"is the run {r}, inside it or above it: the export would "
                                 "replace the run's training state", fix=["a folder outside the runs, e.g. "
                                                                          "data/checkpoints/recipes/NAME"])
    from vitlab.train.export import export_recipe

    facts = export_recipe(args.runs, args.out, name=args.name, full_epochs=args.full_epochs, command=args.command_line,
                          hardware=args.hardware, allow_unfinished=args.allow_unfinished, progress=not args.quiet)
    for f in facts:
        print(json.dumps({k: f.get(k) for k in ("path", "recipe", "seed", "epochs_done", "epochs_planned",
                                                "full_epochs", "shortened", "test_accuracy", "hardware")}))
    return 0
