"""The command line's shared argument types (each an argparse ``type``: a bad value is a usage error naming its
flag), the model options every model-loading command takes, and the checks of an output file made before any work.
Torch-free."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["positive_int", "non_negative_int", "positive_float", "non_negative_float", "tcp_port", "host_name",
           "user_path", "add_model_arguments", "check_output_file", "check_not_an_input", "model_files"]


def _whole_number(text: str, least: int, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {name}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type`` of a count that means nothing at 0 or below (images, a batch size, epochs): argparse's
    error names the flag (``argument --max-train: expected at least 1, got -3``)."""
    return _whole_number(text, 1, "at least 1")


def tcp_port(text: str) -> int:
    """argparse ``type`` of a TCP port: 1 to 65535."""
    port = _whole_number(text, 1, "a port from 1 to 65535")
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {port}")
    return port


def host_name(text: str) -> str:
    """argparse ``type`` of a name a Host header may carry (``vitlab app --allow-host``): no port, comma or space, and
    no IP address (the server checks those itself: loopback ones are served, others never)."""
    import ipaddress
    import re

    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"expected a host name such as myhost.local (letters, digits, '.', '-'; "
                                         f"no port), got {text!r}")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return text
    raise argparse.ArgumentTypeError(f"expected a host name, got the address {text!r}: loopback addresses are always "
                                     "served, others never (the server listens on 127.0.0.1 only)")


def non_negative_int(text: str) -> int:
    """argparse ``type`` of a count where 0 has a meaning (``--workers 0``: in this process) but no negative does."""
    return _whole_number(text, 0, "0 or more")


def positive_float(text: str) -> float:
    """argparse ``type`` of a finite number above 0 (``--image-scale``: -1 and nan drew figures at scale 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse ``type`` of a finite number, 0 or more (``--older-than 0``: everything used before now)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, 0 or more, got {text}")
    return value


def check_output_file(path: str, flag: str, example: str) -> None:
    """Before any work: refuse an output file's name that is a folder, or whose parent is a file (the result would
    be computed and then lost)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name such as {p / example}")
    parent = next((a for a in p.absolute().parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")


def model_files(model: str | None, weights: str | None) -> list[Path]:
    """The files that loading ``--model`` (and ``--weights``) reads: a checkpoint's folder's files (the embedded
    default's when ``model`` is None; a checkpoint given by one of its files is its folder), and the weights file."""
    from vitlab.base.choices import DEFAULT_CHECKPOINT  # torch-free: checked before the model loads

    files = [Path(weights)] if weights else []
    p = DEFAULT_CHECKPOINT if model is None else Path(model)
    if p.exists():
        folder = p if p.is_dir() else p.parent
        files += [f for f in folder.iterdir() if f.is_file()] if folder.is_dir() else []
    return files


def check_not_an_input(path: str, flag: str, inputs: Sequence[Path]) -> None:
    """Before any work: refuse an output file that is one of the command's inputs (a checkpoint's weights, an image
    of --images), which writing the result would destroy."""
    p = Path(path)
    if not p.is_file():
        return
    hit = next((f for f in inputs if f.is_file() and os.path.samefile(f, p)), None)
    if hit is not None:
        raise ValueError(f"{flag} {path} is an input of this command ({hit}), which the result would overwrite; "
                         "give another file name")


def user_path(text: str) -> str:
    """A path option as typed, with a leading ``~`` made the home folder: the shell expands ``--out ~/x`` but not
    ``--out=~/x``, which would otherwise make a folder named ``~`` here. An empty text (``--images "$UNSET"``) is
    refused: it read as the option left out (``--images ''`` took the default photos) or as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty text (an unset shell variable?)")
    return os.path.expanduser(text) if text.startswith("~") else text


def add_model_arguments(parser: argparse.ArgumentParser, runs: bool = False) -> None:
    """``--model``, ``--no-pretrained`` and ``--weights``, as every command that loads a model takes them (``runs``:
    ``--model`` repeatable, for a recipe's several training runs)."""
    parser.add_argument("--model", type=user_path, action="append" if runs else "store",
                    help="timm model name (the paper's own weights: e.g. vit_base_patch16_224.orig_in21k or "
                         "vit_large_patch32_224.orig_in21k; AugReg's: vit_base_patch16_224.augreg2_in21k_ft_in1k), "
                         "a vitlab checkpoint folder, or omit for the embedded default" + (
                             ". Repeat it (--model A --model B), or give a folder of checkpoint or training run "
                             "folders, to judge a recipe from several training runs (seeds) rather than one run: "
                             "the verdicts combine them, the figures are the first's" if runs else ""))
    parser.add_argument("--no-pretrained", dest="pretrained", action="store_false",
                    help="for timm names: random weights instead of downloading pretrained ones")
    parser.add_argument("--weights", type=user_path, metavar="FILE",
                    help="for timm names: a local weights file (.safetensors, or .pth/.bin read with "
                         "weights_only) instead of the hub: the offline route")
