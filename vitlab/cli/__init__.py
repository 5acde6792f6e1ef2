"""The ``vitlab`` command: one module per subcommand (``vitlab/cli/<command>.py``), each with ``NAME``, ``HELP``
(and optionally ``DESCRIPTION``), ``add_arguments(parser)`` and ``run(args) -> exit status``, registered in
``COMMANDS``. Every subcommand has ``--help``.

Torch-free: the parser is built (--help, an argument error) without loading torch or timm; each command imports what
it needs itself, inside ``main``'s handling of errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "build_parser", "main"]

#: the subcommands, in the order ``vitlab --help`` lists them: each the name of its module in this package. A new
#: command is a new module and one name here.
COMMANDS = ("info", "capture", "train", "export", "probe", "sweep", "mpp_study", "app", "reproduce", "cache", "data")


def build_parser() -> argparse.ArgumentParser:
    """The ``vitlab`` parser: each of ``COMMANDS`` a subparser, whose ``func`` default is its module's ``run``."""
    from vitlab import __version__

    p = argparse.ArgumentParser(prog="vitlab", description="Look inside Vision Transformers.")
    p.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = importlib.import_module(f"vitlab.cli.{name}")
        sp = sub.add_parser(command.NAME, help=command.HELP, description=getattr(command, "DESCRIPTION", None))
        command.add_arguments(sp)
        sp.set_defaults(func=command.run)
    return p


def cli_words(message: str) -> str:
    """An error message from the Python API, in the command line's terms (its flags instead of keyword arguments)."""
    import re

    message = re.sub(r"vitlab\.load_model\(('[^']*'|\"[^\"]*\"), weights=('[^']*'|\"[^\"]*\"|path)\)",
                     lambda m: f"--model {m.group(1).strip(chr(39) + chr(34))} --weights "
                               f"{'FILE' if m.group(2) == 'path' else m.group(2).strip(chr(39) + chr(34))}", message)
    message = _set_words(message)  # before run_dir=NEW and resume=True below
    for api, flag in (("as the model itself, without weights=", "as --model alone"),  # before weights= below
                      ("use pretrained=False", "pass --no-pretrained"), ("pretrained=False", "--no-pretrained"),
                      ("pass weights=", "pass --weights "), ("weights= ", "--weights "), ("weights=", "--weights "),
                      ("num_images=", "--num-images "), ("pass images= ", "pass --images "),
                      (": pass a folder of images", ": pass --images a folder of images"),
                      ("pass skip_bad=True", "pass --skip-bad"), ("pass device='cpu'", "pass --device cpu"),
                      ("leave device=None", "leave --device out"), ("give out= ", "give --out "),
                      ("e.g. out=", "e.g. --out "), ("run_dir=NEW", "--run-dir NEW"),
                      ("Give run_dir= ", "Give --run-dir "), ("pass resume=True", "pass --resume"),
                      ("start with resume=False", "start without --resume"),
                      ("pass results= ", "pass --results "), ("executor='ray' needs", "--executor ray needs"),
                      ("compile=True is for", "--compile on is for"),
                      ("leave compile=None (auto) or pass compile=False", "leave --compile auto or pass --compile off")):
        message = message.replace(api, flag)
    # a message that opens with the argument it refuses (``device='cuda:3': ...``, ``out=. is ...``, ``resume=True: ``)
    return re.sub(r"^resume=True:", "--resume:", re.sub(r"^(device|out)=", r"--\1 ", message))


def _set_words(message: str) -> str:
    """The training API's ``dataclasses.replace(cfg, FIELD=VALUE, ...)`` (a nested model's ``model=dataclasses.replace(
    cfg.model, ...)`` too) as ``--set FIELD=VALUE`` for each field, in JSON's words (``'constant'`` unquoted, ``None``
    as null), and a new run's ``train(dataclasses.replace(cfg, ...), run_dir=NEW)`` recipe as its flags. Each
    ``FIELD=VALUE`` is one shell word (quoted where it holds a space, a quote or a bracket) whose value
    ``parse_value`` reads back as the Python value (a text it would read as a number, a list or null in JSON's
    quotes)."""
    import ast
    import re
    import shlex

    from vitlab.cli.train import parse_value

    text = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""  # a Python string literal, as repr() writes it
    args = rf"((?:{text}|[^()'\"])*)"  # FIELD=VALUE, ...: no parenthesis outside a quoted value

    def value(v: str) -> str:
        if v[:1] not in ("'", '"'):
            return {"None": "null", "True": "true", "False": "false"}.get(v, v)
        s = ast.literal_eval(v)
        return s if parse_value(s) == s else json.dumps(s)  # '123' is no number, 'null' no None

    def sets(fields: str, path: str = "") -> str:
        return " ".join(f"--set {shlex.quote(f'{path}{m.group(1)}={value(m.group(2))}')}"
                        for m in re.finditer(rf"(\w+)=({text}|\[[^\]]*\]|[^,]*)", fields))

    message = re.sub(rf"train\(dataclasses\.replace\(cfg, {args}\), run_dir=NEW\)",
                     lambda m: f"--run-dir NEW {sets(m.group(1))}", message)
    message = message.replace("(resume=True keeps the saved settings)", "(a --resume keeps the saved settings)")
    for nest, path in ((rf"model=dataclasses\.replace\(cfg\.model, vit=dataclasses\.replace\(cfg\.model\.vit, "
                        rf"{args}\)\)", "model.vit."),
                       (rf"model=dataclasses\.replace\(cfg\.model, {args}\)", "model."), (args, "")):
        message = re.sub(rf"dataclasses\.replace\(cfg, {nest}\)", lambda m, path=path: sets(m.group(1), path), message)
    return message.replace("(as saved in its train_config.json)", "(--set FIELD=VALUE as saved)")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a job scheduler, torchrun stopping its workers) raised as an exception in the
    main thread, so that every writer's clean-up runs as for Ctrl-C: without it Python dies at once and leaves the
    ``.NAME.tmp.*`` folder of a checkpoint, export or report it was writing."""


def _raise_terminated(_signum, _frame) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command started: as during one, no traceback
        print("vitlab: interrupted", file=sys.stderr)
        return 130
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal.signal works only there
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return args.func(args)
    except BrokenPipeError as e:
        if not _stdout_closed_by_reader():
            print(f"vitlab {args.command}: {type(e).__name__}: {_os_error_words(e)}", file=sys.stderr)
            return 1
        # the reader went away (`vitlab info --json | head -1`): stop quietly, as Unix tools do, and point stdout
        # at /dev/null so that the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # the shell's status for SIGPIPE (128 + 13)
    except (ValueError, RuntimeError, TypeError, OSError) as e:
        # an OSError from the system (errno set: a read-only or full disk, a file where a folder should be) is told
        # by its path and what to do, not as [Errno 13] ... or a traceback
        text = _os_error_words(e) if isinstance(e, OSError) and e.errno is not None else cli_words(str(e))
        print(f"vitlab {args.command}: {type(e).__name__}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C or kill: a message and the shell's status for it, not a traceback
        term = isinstance(e, Terminated)
        print(f"vitlab {args.command}: " + ("terminated (SIGTERM)" if term else "interrupted")
              + ("; --resume continues from the last finished epoch, if one finished" if args.command == "train" else ""),
              file=sys.stderr)
        return 143 if term else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stdout_closed_by_reader() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (a notebook's), or no poll on this platform
        return False


def _os_error_words(e: OSError) -> str:
    """An ``OSError`` as one line naming its path and what to do (``[Errno 13] Permission denied: 'x'`` says neither
    which flag nor the fix)."""
    if e.filename is None:
        return str(e)
    where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "")
    hint = {PermissionError: "check its permissions (and its folder's) or choose another path",
            IsADirectoryError: "it is a folder: give a file's name",
            NotADirectoryError: "a part of the path is a file, not a folder: choose another path",
            FileExistsError: "a file stands where a folder is needed: choose another path",
            FileNotFoundError: "check the path"}.get(type(e), "")
    return f"{e.strerror or e}: {where}" + (f"; {hint}" if hint else "")
