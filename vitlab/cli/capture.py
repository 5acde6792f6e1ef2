"""``vitlab capture``: a model's attention maps on images, saved to safetensors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.base.choices import DEVICE_HELP
from vitlab.cli.args import (
    add_model_arguments,
    check_not_an_input,
    check_output_file,
    model_files,
    positive_int,
    user_path,
)

NAME = 'capture'
HELP = 'save attention maps (L, B, H, T, T) of a model on images to safetensors (metadata: the images, the prefix tokens before the patches, the patch grid)'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--images", type=user_path, help="folder of images (default: the photos shipped with scikit-learn)")
    parser.add_argument("--num-images", type=positive_int, help="capture only the first N images of --images, sorted by path, "
                    "with a warning counting those left out (with --skip-bad: the first N usable ones; default: "
                    "every image)")
    parser.add_argument("--out", type=user_path, default="attention.safetensors", help="output file")
    parser.add_argument("--head-fusion", choices=["mean", "max", "min"], help="fuse heads inside the hook")
    parser.add_argument("--queries", choices=["all", "prefix"], default=None,
                    help="prefix: keep only the prefix tokens' query rows (class, distillation and register tokens; "
                    "not the readout of an average-pooled model)")
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or too small images with a warning")
    parser.add_argument("--device", help=DEVICE_HELP)


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out", "attention.safetensors")  # at once, before torch loads
    check_not_an_input(args.out, "--out", model_files(args.model, args.weights))  # the images' after vitlab.data.datasets
    from safetensors.torch import save_file

    from vitlab.base.atomic import atomic_write
    from vitlab.data.datasets import image_files
    from vitlab.data.images import load_images
    from vitlab.inspect.capture import attention_maps
    from vitlab.models.info import resolve_model
    from vitlab.models.load import load_model

    images = image_files(Path(args.images)) if args.images and Path(args.images).is_dir() else []
    check_not_an_input(args.out, "--out", images)
    from vitlab.base.devices import resolve_device

    dev = resolve_device(args.device)
    model = resolve_model(load_model(args.model, pretrained=args.pretrained, weights=args.weights).to(dev))
    names, x, _ = load_images(model.module, args.images, limit=args.num_images, skip_bad=args.skip_bad)
    maps = attention_maps(model, x.to(dev), head_fusion=args.head_fusion, queries=args.queries,
                                 batch_size=args.batch_size).cpu()
    meta = {"images": json.dumps(names)}
    try:  # the token layout, so that a reader of the file alone tells prefix tokens (class, registers) from patches
        info = model.info_for(x)
    except TypeError:  # a model vitlab captures but cannot describe (timm's NaFlexVit)
        pass
    else:
        meta.update(prefix_tokens=json.dumps(list(info.prefix_kinds)), grid=json.dumps(list(info.grid_size)))
    atomic_write(args.out, lambda tmp: save_file({"attention": maps.contiguous()}, tmp, metadata=meta),
                 needed=maps.numel() * maps.element_size())  # never half a file; a full disk told before writing
    print(f"wrote {args.out}: attention {tuple(maps.shape)} (L, B, H, Q, T) for {len(names)} "
          f"image{'' if len(names) == 1 else 's'}")
    return 0
