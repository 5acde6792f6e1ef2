"""The training step through ``torch.compile``: when ``vitlab.train.loop`` compiles by default (``compile_by_default``:
where it was measured to pay) and the wrapper that compiles a module's forward, falling back to eager, with a
warning, where inductor cannot compile on this machine (``Compiler``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vitlab.models.config import ViTConfig
from vitlab.train.config import TrainConfig

__all__ = ["COMPILE_MIN_STEPS", "compile_by_default", "Compiler"]


#: the shortest run (in steps) that ``train`` compiles by default: the first compiled step takes tens of seconds on a
#: CPU (compiling the forward and backward) before the faster epochs repay it, so a run of a few minutes would lose
#: (``benchmarks/compile_ab.py`` and ``benchmarks/train_speed.py`` measure both)
COMPILE_MIN_STEPS = 1000


def compile_by_default(cfg: TrainConfig, device: torch.device, steps: int, world: int = 1) -> bool:
    """Whether ``train`` compiles by default: a ViT classifier (the CNNs and masked patch prediction stay eager,
    unmeasured) trained on a CPU (on an accelerator: unmeasured) in one process (under torchrun: unmeasured) for at
    least ``COMPILE_MIN_STEPS`` more steps."""
    return (device.type == "cpu" and world == 1 and isinstance(cfg.model, ViTConfig) and cfg.objective == "classify"
            and steps >= COMPILE_MIN_STEPS)


def _eager_backward_lowering() -> contextlib.AbstractContextManager:
    """AOTAutograd compiles a graph's backward together with its forward (where this torch has the switch; otherwise
    at the first backward, as it does by default)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return functorch_config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


class Compiler:
    """Modules' forwards through ``torch.compile`` (static shapes: a new image size, token count or batch compiles
    once more), or eager ones when ``enabled`` is False. When inductor cannot compile (e.g. no C++ compiler on the
    machine) a warning, and every module wrapped here runs eagerly from then on. The backward graph is compiled with
    the forward (not lazily at the first ``backward()``), so a compile fails inside the forward, before any gradient
    or weight changed: that forward is simply made again eagerly."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, module: nn.Module) -> Callable[[Tensor], Any]:
        if not self.enabled:
            return module
        compiled = torch.compile(module, dynamic=False)

        def forward(x: Tensor):
            if self.enabled:
                try:
                    with _eager_backward_lowering():
                        return compiled(x)
                except Exception as e:  # noqa: BLE001  (only a compiler failure falls back; anything else is raised)
                    from torch._dynamo.exc import BackendCompilerFailed

                    if not isinstance(e, BackendCompilerFailed):
                        raise
                    self.enabled = False
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    warnings.warn(f"torch.compile could not compile the training step ({type(e).__name__}: {first}); "
                                  "training eagerly instead (slower, the same run). Pass compile=False (vitlab train "
                                  "--compile off) to skip the attempt", stacklevel=2)
            return module(x)

        return forward
