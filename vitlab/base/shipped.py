"""Where the shipped files live: the embedded default model, the shapes ViT, the 128 CIFAR-10 test images and the
shipped sweep.

In a checkout they are in its ``data/`` folder (where their cards and the study records name them, e.g.
``data/checkpoints/vit_cifar10``); a wheel (``pip install vitlab``) carries the ones the default analyses need,
``EMBEDDED``, as package data in ``vitlab/_embedded/`` with the same layout (``setup.py`` copies them there when it
builds the wheel), so that ``vitlab reproduce`` works offline without a checkout. ``data_path`` is the one place that
chooses between the two; this module imports nothing heavy and nothing else of vitlab.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path, PurePosixPath

__all__ = ["EMBEDDED", "EMBEDDED_DIR", "CHECKOUT_DATA", "data_path", "data_name"]

#: What a wheel carries, relative to ``data/``: a folder (all its files) or a file. The default analyses
#: (``vitlab reproduce``, ``vitlab info``, the notebooks' default model and images) need nothing else.
EMBEDDED: tuple[str, ...] = ("checkpoints/vit_cifar10", "checkpoints/vit_shapes", "cifar10_test_128.npz",
                             "results/scaling_cifar10.jsonl")

#: The package-data folder a wheel holds them in (absent in a checkout)
EMBEDDED_DIR = Path(str(importlib.resources.files("vitlab").joinpath("_embedded")))

#: The vitlab package folder, and the folder above it: a checkout's root (data/, notebooks/, ...) when run from one
PACKAGE = Path(__file__).resolve().parents[1]
CHECKOUT = PACKAGE.parent

#: A checkout's data/ folder (absent in a wheel install)
CHECKOUT_DATA = CHECKOUT / "data"


def data_path(rel: str) -> Path:
    """The shipped file or folder ``rel`` (relative to ``data/``, e.g. ``"checkpoints/vit_cifar10"``): the wheel's
    copy in ``vitlab/_embedded`` when vitlab runs from a wheel that holds it, else the checkout's ``data/rel``. The
    path is returned whether or not it exists (the caller says what is missing and how to get it).

    Raises ``ValueError`` for an absolute ``rel`` or one that leaves ``data/`` (``..``)."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"rel must be a path inside data/, e.g. 'checkpoints/vit_cifar10', got {rel!r}")
    embedded = EMBEDDED_DIR.joinpath(*p.parts)
    return embedded if embedded.exists() else CHECKOUT_DATA.joinpath(*p.parts)


def data_name(path: str | Path) -> str | None:
    """How records name a shipped ``path`` wherever it was read from: ``data/REL`` for a path inside the checkout's
    ``data/`` or the wheel's ``vitlab/_embedded/`` (``data/checkpoints/vit_cifar10``); None for any other path."""
    p = Path(path).resolve()
    for base in (EMBEDDED_DIR, CHECKOUT_DATA):
        if p.is_relative_to(base.resolve()):
            return PurePosixPath("data", p.relative_to(base.resolve()).as_posix()).as_posix()
    return None
