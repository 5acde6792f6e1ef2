"""The ``vitlab`` command: one module per subcommand (``vitlab/cli/<command>.py``), each with ``NAME``, ``HELP``
(and optionally ``DESCRIPTION``), ``add_arguments(parser)`` and ``run(args) -> exit status``, registered in
``COMMANDS``. Every subcommand has ``--help``.

Torch-free: the parser is built (--help, an argument error) without loading torch or timm; each command imports what
it needs itself, inside ``main``'s handling of errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from vitlab.base.errors import Refusal

__all__ = ["COMMANDS", "build_parser", "main"]

#: the subcommands, in the order ``vitlab --help`` lists them: each the name of its module in this package. A new
#: command is a new module and one name here.
COMMANDS = ("info", "capture", "train", "export", "export_recipe", "probe", "sweep", "mpp_study", "app", "reproduce", "cache", "data")


def build_parser() -> argparse.ArgumentParser:
    """The ``vitlab`` parser: each of ``COMMANDS`` a subparser, whose ``func`` default is its module's ``run``."""
    from vitlab.base.provenance import VERSION as __version__

    p = argparse.ArgumentParser(prog="vitlab", description="Look inside Vision Transformers.")
    p.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = importlib.import_module(f"vitlab.cli.{name}")
        sp = sub.add_parser(command.NAME, help=command.HELP, description=getattr(command, "DESCRIPTION", None))
        command.add_arguments(sp)
        sp.set_defaults(func=command.run)
    return p


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
        parser = build_parser()
        args = parser.parse_args(argv)
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
        if isinstance(e, Refusal):  # a refused argument: written again from its fields, in this command's flags
            from vitlab.cli.flags import command_parser, refusal_words

            text = refusal_words(e, command_parser(parser, args.command))
        else:
            text = _os_error_words(e) if isinstance(e, OSError) and e.errno is not None else str(e)
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
