"""``vitlab probe``: the few-shot linear probe (paper section 4.1) of a model's frozen features."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from vitlab.base.choices import DEVICE_HELP, READOUTS
from vitlab.cli.args import (
    add_model_arguments,
    check_not_an_input,
    check_output_file,
    model_files,
    positive_int,
    user_path,
)

NAME = 'probe'
HELP = "few-shot linear probe (paper section 4.1) of a model's frozen features"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--data", type=user_path, required=True, help="cifar10, cifar100, shapes, or an ImageFolder folder/zip with "
                    "train and test splits")
    parser.add_argument("--shots", type=positive_int, nargs="+", default=[1, 5, 10, 25], help="examples per class (default 1 5 "
                    "10 25)")
    parser.add_argument("--seeds", type=positive_int, default=3, help="random draws per shot count (default 3)")
    parser.add_argument("--l2", type=float, default=None,
                    help="ridge regularisation (default vitlab.probe.linear.DEFAULT_L2 = 2**10, as big_vision)")
    parser.add_argument("--no-full", dest="full", action="store_false",
                    help="skip the logistic-regression probe on all training features")
    parser.add_argument("--readout", choices=READOUTS, default="model",
                    help="the features probed: model (default), the model's own readout (its class token; the mean of "
                    "class and distillation tokens for a distilled ViT), or patch_mean, the mean of the final patch "
                    "tokens (for encoders whose class token was never trained, e.g. masked patch prediction's)")
    parser.add_argument("--max-train", type=positive_int, help="use a class-balanced subset of this many training images")
    parser.add_argument("--max-test", type=positive_int, help="use a class-balanced subset of this many test images")
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--device", help=DEVICE_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.l2 is not None and not (args.l2 > 0 and args.l2 != float("inf")):  # at once, before torch loads
        raise ValueError(f"--l2 must be a positive finite number (the ridge penalty), got {args.l2:g}")
    if args.json:  # before torch loads and the feature pass, not after it
        check_output_file(args.json, "--json", "probe.json")
        check_not_an_input(args.json, "--json", model_files(args.model, args.weights) + [Path(args.data)])
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
