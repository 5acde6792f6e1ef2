"""Which device a command runs on: one rule for every ``--device`` (train, mpp-study, probe, capture, reproduce).

``resolve_device(None)`` is CUDA's first device when this torch sees a GPU, else the CPU. A named device is checked
before any work, so that a typo or a missing GPU fails with the fix instead of deep inside a model's ``.to()``.
"""

from __future__ import annotations

import torch

from vitlab.base.choices import DEVICE_HELP

__all__ = ["resolve_device", "DEVICE_HELP"]


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """``None`` -> ``cuda`` when available, else ``cpu``; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (and ``"mps"`` where
    torch has it) -> that device once checked to exist here. Anything else raises ``ValueError`` naming what this
    machine has."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={name!r} is not a device: use {DEVICE_HELP}") from e
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r}: this machine has no CUDA GPU that torch {torch.__version__} can use; "
                             "pass device='cpu' or leave device=None")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={name!r}: this machine has {count} CUDA device(s), cuda:0 to "
                             f"cuda:{count - 1}")
        return dev
    if dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"device={name!r}: Apple's MPS is not available here; pass device='cpu'")
        return dev
    raise ValueError(f"device={name!r}: vitlab runs on {DEVICE_HELP}")
