"""vitlab's error types with fields: model loading (shared by the zoo, the checkpoint reader and the loader) and full disks."""

from __future__ import annotations

__all__ = ["ModelLoadError", "WeightsMismatchError", "DiskFullError"]


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""


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
