"""A refusal (``vitlab.base.errors.Refusal``: a refused argument or config field, with its fixes) in the command line's
words: each setting written as the flag of the parser's action whose ``dest`` is its parameter, a ``TrainConfig``
field as ``--set FIELD=VALUE`` where the command has ``--set``. A setting no flag sets stays in Python's words."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Sequence

from vitlab.base.errors import Placeholder, Refusal, Setting, python_words

__all__ = ["flag_for", "setting_words", "refusal_words", "command_parser", "API_VALUES", "API_PARAMS"]

#: the Python values that a flag's choices stand for, by the action's ``dest`` (``--compile on`` is ``compile=True``)
API_VALUES: dict[str, dict[str, object]] = {"compile": {"auto": None, "on": True, "off": False}}

#: the ``dest`` of the flag that feeds a Python parameter of another name: ``load_model(spec)`` is ``--model``,
#: ``load_images(model, folder)`` ``--images``
API_PARAMS: dict[str, str] = {"spec": "model", "folder": "images"}


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The subcommand ``command``'s own parser within the ``vitlab`` parser."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def flag_for(parser: argparse.ArgumentParser, param: str) -> argparse.Action | None:
    """The action of ``parser`` whose ``dest`` is ``param`` (or the name ``API_PARAMS`` gives it; None when no flag
    sets it)."""
    dest = API_PARAMS.get(param, param)
    return next((a for a in parser._actions if a.dest == dest and not isinstance(a, argparse._HelpAction)), None)


def _set_value(value: object) -> str:
    """A ``--set`` value as ``vitlab.cli.train.parse_value`` reads it back: JSON (null, true, numbers, lists), a
    text bare unless JSON would read it as something else (``'123'``, ``'null'``)."""
    if isinstance(value, Placeholder):
        return str(value)
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(value)


def _one(parser: argparse.ArgumentParser, s: Setting) -> str:
    action = flag_for(parser, s.param)
    if action is None:
        if s.config and flag_for(parser, "set") is not None:
            return f"--set {shlex.quote(f'{s.param}={_set_value(s.value)}')}"
        return python_words([s])
    flag = action.option_strings[-1] if action.option_strings else action.metavar or action.dest.upper()
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return flag if bool(s.value) == isinstance(action, argparse._StoreTrueAction) else f"without {flag}"
    word = next((k for k, v in API_VALUES.get(action.dest, {}).items() if v is s.value), None)
    if word is not None:  # None, True and False: the values a choice stands for
        return f"{flag} {word}"
    if s.value is None:
        return f"without {flag}"
    values = s.value if isinstance(s.value, (list, tuple)) else [s.value]
    words = [str(v) if isinstance(v, Placeholder) else shlex.quote(str(v)) for v in values]
    if not action.option_strings:
        return " ".join(words)
    if isinstance(action, argparse._AppendAction):  # --model A --model B
        return " ".join(f"{flag} {w}" for w in words)
    return f"{flag} {' '.join(words)}"


def setting_words(parser: argparse.ArgumentParser) -> Callable[[Sequence[Setting]], str]:
    """Settings -> the command line's words for ``parser``'s command (settings made together joined by spaces)."""
    return lambda settings: " ".join(_one(parser, s) for s in settings)


def refusal_words(e: Refusal, parser: argparse.ArgumentParser) -> str:
    """``e``'s message in the flags of ``parser``'s command."""
    say = setting_words(parser)
    return e.words(say, lambda s: say([s]))
