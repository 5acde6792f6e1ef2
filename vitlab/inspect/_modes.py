"""Temporary model states for the analyses, always restored (also when the body raises)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Every submodule in eval mode inside the block (no dropout, no drop-path); each one's mode restored after."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield model
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Parameters stop requiring grad inside the block (so nothing accumulates in ``.grad``); restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
