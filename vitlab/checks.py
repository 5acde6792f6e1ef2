"""Checks of the plain arguments the analyses take, shared across the package: a whole number that indexes (a layer,
a head, a patch; ``whole_index``), a count of at least 1 (a batch size, a number of steps; ``check_count``), a
random seed (``check_seed``) and a test-time augmentation level (``check_tta_level``). A float or a bool is none of
them, and 0 never means "all". The checks of images against a model are ``vitlab.capture``'s (``check_images``).
Torch-free, so that the configs (``vitlab.train_config``) can use them.
"""

from __future__ import annotations

import operator

from vitlab.errors import ParameterError, Setting

__all__ = ["whole_index", "check_count", "check_seed", "check_tta_level", "check_plain_name"]


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
