"""``vitlab reproduce``: the inspection experiments, judged, in an HTML report."""

from __future__ import annotations

import argparse
import json

from vitlab.base.choices import DEVICE_HELP
from vitlab.cli.args import add_model_arguments, positive_float, positive_int, user_path

NAME = 'reproduce'
HELP = 'run the inspection experiments and write an HTML report'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, runs=True)
    parser.add_argument("--images", type=user_path, help="folder of images (default: for 32 px models the 128 shipped CIFAR-10 test "
                    "images, the first 128 test shapes for a model trained on the synthetic shapes, otherwise 16 crops "
                    "of scikit-learn's sample photos)")
    parser.add_argument("--out", type=user_path, default="out", help="output folder: a new or empty one, or an earlier report's "
                    "(replaced only when the report is complete)")
    parser.add_argument("--num-images", type=positive_int, default=None,
                    help="images to analyse (default: all 128 CIFAR-10 test images for 32 px models, 16 otherwise)")
    parser.add_argument("--no-shapes", dest="shapes", action="store_false",
                    help="skip the localisation table of the shipped shapes ViT")
    parser.add_argument("--no-few-shot", dest="few_shot", action="store_false",
                    help="skip the few-shot probe on CIFAR-10 (run only when CIFAR-10 is readable here)")
    parser.add_argument("--no-scaling", dest="scaling", action="store_false",
                    help="skip the section drawn from the shipped data-scaling sweep")
    parser.add_argument("--no-png", dest="png", action="store_false", help="skip the static figures (need Chromium)")
    parser.add_argument("--formats", default="png", help="static figure formats, comma-separated: png, svg, pdf (e.g. "
                    "png,svg for papers)")
    parser.add_argument("--image-scale", type=positive_float, default=1.0, help="static figure scale (2: high resolution)")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or too small images (with a warning "
                    "naming them) instead of stopping")
    parser.add_argument("--device", help=DEVICE_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
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
