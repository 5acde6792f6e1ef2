"""Checks of the plain arguments the analyses take and the fields of every config, shared across the package: a whole
number that indexes (a layer, a head, a patch; ``whole_index``), a count of at least 1 (a batch size, a number of
steps; ``check_count``), a random seed (``check_seed``), a test-time augmentation level (``check_tta_level``), and
the declarative field checks the frozen config dataclasses run in ``__post_init__`` (``check_int``, ``check_real``,
``check_flag``, ``check_choice``). A float or a bool is no whole number, and 0 never means "all". Each check raises
``ValueError`` naming the parameter, the value and what is allowed. The checks of images against a model are
``vitlab.inspect.capture``'s (``check_images``). Torch-free, so that the configs (``vitlab.train.config``) can use them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

from vitlab.base.errors import ParameterError, Setting

__all__ = ["whole_index", "check_count", "check_seed", "check_tta_level", "check_plain_name", "plain_int", "check_int",
           "check_real", "check_flag", "check_choice"]


def whole_index(v: object) -> bool:
    """Whether ``v`` is a whole number that indexes (a Python, NumPy or 0-d torch integer; no float, no bool)."""
    try:
        operator.index(v)
    except TypeError:
        return False
    return not isinstance(v, bool)


def check_count(name: str, value: object) -> None:
    """Refuse a count (a batch size, a number of steps) that is not a whole number of at least 1, by its name, before
    it reaches ``Tensor.split``, ``range`` or captum, whose own errors do not name it; 0 never means "all". A NumPy
    or torch integer is a whole number but not one ``Tensor.split`` takes: it is told to pass a Python int."""
    if whole_index(value) and not isinstance(value, int) and operator.index(value) >= 1:
        raise ParameterError(name, value, "a Python int (Tensor.split takes no NumPy or torch integer)",
                             fix=[Setting(name, int(value))])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParameterError(name, value, "a whole number of at least 1")


def check_seed(name: str, value: object) -> int:
    """``value`` as the Python int a ``torch.Generator`` takes, or refused by its name when it is no whole number:
    torch's own "expected a long, but got float" names neither, and a NumPy integer it refuses as no integer."""
    if not whole_index(value):  # 1.5 is no seed, True no seed 1
        raise ParameterError(name, value, "a whole number")
    return operator.index(value)


def check_tta_level(name: str, level: object, config: bool = False) -> None:
    """Refuse, by ``name`` (``config``: a ``TrainConfig`` field), a test-time augmentation level that is not the
    whole number 0, 1 or 2 (3 is no level 2, True or 1.0 no level 1)."""
    if not whole_index(level) or level not in (0, 1, 2):
        raise ParameterError(name, level, "0, 1 or 2", config=config)


def check_plain_name(name: str, value: object) -> None:
    """Refuse, by ``name``, a name that becomes a file or folder name (a sweep's results file ``NAME.jsonl``) but is
    not one plain name: not a non-empty string, or one holding a path separator (``/`` or ``\\``), a NUL or another
    control character, or one that is ``.``/``..`` or starts with ``.`` (a hidden file, or a step out of its folder:
    ``../../x`` would write outside it)."""
    if (not isinstance(value, str) or not value or value.startswith(".") or any(c in value for c in "/\\")
            or any(ord(c) < 32 or ord(c) == 127 for c in value)):
        raise ParameterError(name, value, "a plain name (letters, digits, '-', '_'; no path separator, no leading "
                             "'.'), as it becomes a file name")


def plain_int(value: object, least: int | None = None) -> bool:
    """Whether ``value`` is a Python int (no bool, float or NumPy integer: a JSON record holds it as it is) of at
    least ``least`` (None: any)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and (least is None or value >= least))


def check_int(name: str, value: object, least: int | None = 0, most: int | None = None, allowed: str | None = None,
              none: bool = False, numpy: bool = False, error: type[ValueError] | None = None,
              config: bool = False) -> None:
    """Refuse, by ``name``, a whole number out of [``least``, ``most``] (None: unbounded), saying ``allowed``
    (default "a whole number >= least"): a ``ParameterError`` (``config``: ``name`` is a ``TrainConfig`` field), or
    ``error`` (a ``ValueError`` type taking the message) where given. A config field must be a Python int (no bool,
    float or NumPy integer: a JSON record holds it as it is); an argument with ``numpy=True`` may be any whole number
    that indexes (``whole_index``: a NumPy or 0-d torch integer too). ``none``: None is allowed too."""
    if value is None and none:
        return
    whole = whole_index(value) if numpy else plain_int(value)
    if not whole or (least is not None and value < least) or (most is not None and value > most):
        words = allowed or f"a whole number >= {least}"
        if error is not None:
            raise error(f"{name} must be {words}, got {value!r}")
        raise ParameterError(name, value, words, config=config)


def check_real(name: str, value: object, ok: Callable[[float], bool] = lambda v: True,
               allowed: str = "a finite number", none: bool = False, config: bool = False) -> None:
    """Refuse, by ``name`` (``config``: a ``TrainConfig`` field), with a ``ParameterError`` saying ``allowed``, a
    config field that is not a finite real number (an int or float; no bool, string, NaN or infinity) for which
    ``ok`` holds; ``none``: None is allowed too."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ParameterError(name, value, allowed, config=config)


def check_flag(name: str, value: object, config: bool = False) -> None:
    """Refuse, by ``name`` (``config``: a ``TrainConfig`` field), with a ``ParameterError`` whose fix sets it False, a
    config switch that is not True or False (the text 'False' is true)."""
    if not isinstance(value, bool):
        raise ParameterError(name, value, "true or false", config=config, fix=[Setting(name, False, config=config)])


def check_choice(name: str, value: object, choices: Sequence[object], config: bool = False) -> None:
    """Refuse, by ``name`` (``config``: a ``TrainConfig`` field), with a ``ParameterError`` listing them ('a', 'b' or
    'c'), a config field that is not one of ``choices``."""
    if value not in choices:
        words = [repr(c) for c in choices]
        listed = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
        raise ParameterError(name, value, listed, config=config)
