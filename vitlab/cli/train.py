"""``vitlab train``: train a preset, with ``--set FIELD=VALUE`` overrides of its ``TrainConfig``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vitlab.base.choices import DEVICE_HELP
from vitlab.cli.args import non_negative_int, positive_int, user_path
from vitlab.cli.flags import API_VALUES
from vitlab.train.config import PRESETS

if TYPE_CHECKING:
    from vitlab.train.config import TrainConfig

#: Python's spellings of JSON's true, false and null (``--set bf16=False`` used to set the text 'False', which is true)
_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}

NAME = 'train'
HELP = 'train a preset (resumable; metrics in RUN/metrics.jsonl)'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="vit_cifar10", help=", ".join(PRESETS))
    parser.add_argument("--run-dir", type=user_path, help="run folder (default $VITLAB_CACHE/runs/PRESET, i.e. "
                    "~/.cache/vitlab/runs/PRESET: outside the work tree)")
    leg = parser.add_mutually_exclusive_group()  # --continue resumes by itself where there is state to resume
    leg.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    leg.add_argument("--continue", dest="continue_run", action="store_true",
                    help="resume the run when its state exists; otherwise, or when the run finished and was exported, "
                         "warm-start a new leg from the shipped checkpoint of the preset (data/checkpoints/PRESET) "
                         "with a fresh schedule instead of starting over")
    parser.add_argument("--epochs", type=positive_int, help="override the preset's number of epochs")
    parser.add_argument("--data", type=user_path, help="dataset: cifar10, cifar100 (cifar10:ROOT for a folder holding train.zip/test.zip), "
                    "or an ImageFolder folder/zip with train/ and test/ splits of the same classes")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="override a TrainConfig field (VALUE as JSON: 5e-4, true, null, [1, 2]; Python's True/False/None too; "
                    "else a string), or a field of the preset's "
                    "model config as model.FIELD=VALUE (e.g. model.patch_drop_rate=0)")
    parser.add_argument("--device", help=f"{DEVICE_HELP}; under torchrun, one process per device")
    parser.add_argument("--workers", type=non_negative_int, help="processes making the augmented batches while the model trains "
                    "(default: none on a CPU, all cores but two beside an accelerator); the batches are the same")
    parser.add_argument("--compile", choices=tuple(API_VALUES["compile"]), default="auto",
                    help="the training step through torch.compile (auto: a ViT classifier in one process on a CPU "
                    "for 1,000 steps or more, where the faster epochs repay a slow first step); not "
                    "part of the run: resume either way")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def parse_value(text: str):
    """A ``--set`` value: JSON (numbers, true/false/null, lists, quoted text), Python's True/False/None, else the text
    itself (e.g. ``flip=none``, ``randaugment=rand-m9-n2-mstd0.5``)."""
    if text in _PYTHON_CONSTANTS:
        return _PYTHON_CONSTANTS[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
            model_changes[key.removeprefix("model.")] = parse_value(value)
            continue
        if not sep or key not in {f.name for f in dataclasses.fields(cfg)} or key == "model":
            raise OptionError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of "
                             f"{', '.join(f.name for f in dataclasses.fields(cfg) if f.name != 'model')}, or "
                             f"model.FIELD=VALUE for the model's config")
        changes[key] = parse_value(value)
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



def run(args: argparse.Namespace) -> int:
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

    run = Path(args.run_dir or cache_dir() / "runs" / args.preset)  # outside the work tree: survives a fresh checkout
    resume = args.resume
    if args.continue_run:
        from vitlab.train.run_folder import continue_run

        cfg, resume = continue_run(run, DEFAULT_CHECKPOINT.parent / args.preset, cfg, say)
    say(f"run folder: {run}")
    train(cfg, run, resume=resume, progress=not args.quiet, device=args.device, workers=args.workers,
          compile=API_VALUES["compile"][args.compile])
    return 0
