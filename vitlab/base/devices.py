"""Which device a command runs on: one rule for every ``--device`` (train, mpp-study, probe, capture, reproduce).

``resolve_device(None)`` is CUDA's first device when this torch sees a GPU, else the CPU. A named device is checked
before any work, so that a typo or a missing GPU fails with the fix instead of deep inside a model's ``.to()``.
"""

from __future__ import annotations

import torch

from vitlab.base.choices import DEVICE_HELP
from vitlab.base.errors import ParameterError, Setting

__all__ = ["resolve_device", "DEVICE_HELP"]


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """``None`` -> ``cuda`` when available, else ``cpu``; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (and ``"mps"`` where
    torch has it) -> that device once checked to exist here. Anything else raises ``ValueError`` naming what this
    machine has: a ``ParameterError`` (``param`` ``device``)."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ParameterError("device", name, DEVICE_HELP, problem="not a device") from e
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError("device", name, problem=f"this machine has no CUDA GPU that torch {torch.__version__} "
                                 "can use", fix=[Setting("device", "cpu"), Setting("device", None)])
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ParameterError("device", name, f"cuda:0 to cuda:{count - 1}",
                                 problem=f"this machine has {count} CUDA device(s)")
        return dev
    if dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ParameterError("device", name, problem="Apple's MPS is not available here",
                                 fix=[Setting("device", "cpu")])
        return dev
    raise ParameterError("device", name, DEVICE_HELP, problem="vitlab does not run on it")
