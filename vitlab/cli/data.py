"""``vitlab data``: fetch a public data set (CIFAR-10) into the data folder."""

from __future__ import annotations

import argparse

from vitlab.base.choices import PUBLIC_DATASETS

NAME = 'data'
HELP = 'fetch a public data set (CIFAR-10) into the data folder, where `cifar10` is read from'
DESCRIPTION = "The data folder is $VITLAB_DATA, else the cache root's datasets/ (~/.cache/vitlab/datasets, or $VITLAB_CACHE/datasets); NAME goes into its NAME/ folder. Needs the network (torchvision's downloader, checked by MD5); a data set already readable here is not fetched again."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=PUBLIC_DATASETS, metavar="NAME", help=f"one of {', '.join(PUBLIC_DATASETS)}")


def run(args: argparse.Namespace) -> int:
    from vitlab.data.datasets import fetch_cifar

    where, fetched = fetch_cifar(args.name)
    print(f"{args.name}: downloaded into {where}" if fetched else f"{args.name}: already here, read from {where}")
    return 0
