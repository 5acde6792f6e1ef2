"""vitlab's error types with fields: a refused argument or config field (``ParameterError`` and its kin, whose
message is written from their fields, so that the command line writes the same refusal in its flags), model loading
(shared by the zoo, the checkpoint reader and the loader) and full disks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

__all__ = ["Setting", "Placeholder", "Refusal", "ParameterError", "ParameterModelError", "FolderError",
           "MissingPathError", "ModelLoadError", "WeightsMismatchError", "DiskFullError", "python_words"]


class Placeholder(str):
    """A value the user chooses (``NEW``, ``FOLDER``, ``...``): written bare, never quoted."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One keyword argument (``device``, ``run_dir``) or, with ``config=True``, one ``TrainConfig`` field (``lr``;
    dotted for a field of its model config: ``model.img_size``) set to ``value`` (a ``Placeholder`` where the user
    chooses it)."""

    param: str
    value: object
    config: bool = False


def _value(v: object) -> str:
    return str(v) if isinstance(v, Placeholder) else repr(v)


def _replace(settings: Sequence[Setting], owner: str = "cfg") -> str:
    """Config fields as ``dataclasses.replace(cfg, a=1, model=dataclasses.replace(cfg.model, img_size=16))``."""
    parts, nested = [], {}
    for s in settings:
        head, dot, rest = s.param.partition(".")
        if dot:
            nested.setdefault(head, []).append(dataclasses.replace(s, param=rest))
        else:
            parts.append(f"{s.param}={_value(s.value)}")
    parts += [f"{k}={_replace(v, f'{owner}.{k}')}" for k, v in nested.items()]
    return f"dataclasses.replace({owner}, {', '.join(parts)})"


def python_words(settings: Sequence[Setting]) -> str:
    """Settings as a Python caller writes them: config fields through ``dataclasses.replace(cfg, ...)``, then the
    keyword arguments (``run_dir=NEW``), joined by " and "."""
    fields = [s for s in settings if s.config]
    words = [_replace(fields)] if fields else []
    return " and ".join(words + [f"{s.param}={_value(s.value)}" for s in settings if not s.config])


#: one way out of a refusal: a setting, settings made together, or words (no argument in them)
Fix = Setting | tuple[Setting, ...] | str


class Refusal(Exception):
    """The data of a refused argument or config field, a base mixed into an exception type (``ParameterError`` for a
    ``ValueError``). Fields: ``param`` (the argument's or field's name; dotted for a model config's field),
    ``value`` (what was given), ``config`` (whether ``param`` is a ``TrainConfig`` field), ``allowed`` (what is
    accepted, in words; None where the problem says it), ``problem`` (why it is refused, in words that name no
    argument; None: it is not among ``allowed``), ``fix`` (the ways out, each a ``Fix``). ``str()`` is
    ``words(python_words)``; the command line writes ``words`` with its flags."""

    def __init__(self, param: str, value: object, allowed: str | None = None, *, problem: str | None = None,
                 fix: Sequence[Fix] = (), config: bool = False) -> None:
        self.param, self.value, self.config = param, value, config
        self.allowed, self.problem, self.fix = allowed, problem, tuple(fix)
        super().__init__(self.words(python_words))

    @property
    def setting(self) -> Setting:
        """The refused setting itself."""
        return Setting(self.param, self.value, self.config)

    @property
    def settings(self) -> tuple[Setting, ...]:
        """Every setting the refusal names: the refused one, then those of its fixes."""
        fixes = [f for f in self.fix if not isinstance(f, str)]
        return (self.setting, *(s for f in fixes for s in (f if isinstance(f, tuple) else (f,))))

    def words(self, say: Callable[[Sequence[Setting]], str], given: Callable[[Setting], str] | None = None) -> str:
        """The message: "GIVEN: PROBLEM (allowed: ALLOWED); fix: FIX, or FIX", or without a problem "GIVEN: must be
        ALLOWED" (a Python caller's: "PARAM must be ALLOWED, got VALUE"). The fixes' settings are written by ``say``
        (one or several settings made together -> words), the refused one by ``given`` (default ``param=value``)."""
        head = given(self.setting) if given else f"{self.param}={_value(self.value)}"
        if self.problem:
            text = f"{head}: {self.problem}" + (f" (allowed: {self.allowed})" if self.allowed else "")
        else:
            text = f"{head}: must be {self.allowed}" if given else \
                f"{self.param} must be {self.allowed}, got {_value(self.value)}"
        ways = [f if isinstance(f, str) else say(f if isinstance(f, tuple) else (f,)) for f in self.fix]
        return text + (f"; fix: {', or '.join(ways)}" if ways else "")


class ParameterError(Refusal, ValueError):
    """A refused argument or config field (``Refusal``'s fields) as a ``ValueError``."""


class FolderError(Refusal, FileExistsError):
    """A folder (``param``: ``run_dir``, ``out``) that may not be written: it holds something else, or is a file
    (``Refusal``'s fields), as a ``FileExistsError``."""


class MissingPathError(Refusal, FileNotFoundError):
    """A file or folder that an argument or config field names (a ``teacher``, a run to ``resume``) and that is not
    there (``Refusal``'s fields), as a ``FileNotFoundError``."""


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""


class ParameterModelError(Refusal, ModelLoadError):
    """A model spec refused for one of ``load_model``'s arguments (``Refusal``'s fields) as a ``ModelLoadError``."""


class WeightsMismatchError(ModelLoadError):
    """A weights file whose tensors do not fit the model its config describes. Fields: ``path`` (the weights file),
    ``missing`` and ``unexpected`` (tensor names, sorted), ``mismatched`` ((name, file shape, model shape) per tensor
    whose shape differs). The message lists the first ``SHOWN`` of each."""

    SHOWN = 5

    def __init__(self, path: str, config: str, missing: list[str], unexpected: list[str],
                 mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        self.path, self.missing, self.unexpected, self.mismatched = path, missing, unexpected, mismatched
        n = self.SHOWN

        def few(items: list) -> str:
            return f"{items[:n]}" + (f" (first {n} of {len(items)})" if len(items) > n else "")

        shapes = [f"{k}: file {f} vs model {m}" for k, f, m in mismatched]
        super().__init__(f"{path} does not match its {config}: missing {few(missing)}, unexpected {few(unexpected)}, "
                         f"shape mismatches {few(shapes)}; the checkpoint is damaged or its files come from different "
                         "saves")


class DiskFullError(OSError):
    """A write ran out of disk space (``errno.ENOSPC``). Fields: ``path`` (what was being written), ``needed`` (the
    bytes the write needed in all, None where unknown) and ``free`` (the bytes free on that disk when it failed, None
    where unknown). Nothing half-written is left in place of an earlier version."""

    def __init__(self, path: str, needed: int | None, free: int | None) -> None:
        import errno

        self.path, self.needed, self.free = str(path), needed, free
        need = f"needs {_size(needed)}" if needed is not None else "needs more space"
        have = f", {_size(free)} free" if free is not None else ""
        super().__init__(errno.ENOSPC, f"disk full: writing {path} {need}{have}; free some space on that disk or "
                                       "write elsewhere, then run it again")

    def __str__(self) -> str:
        return self.strerror


def _size(n: int) -> str:
    """Bytes in decimal units, as ``du --si`` counts them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
