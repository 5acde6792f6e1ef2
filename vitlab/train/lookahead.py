"""Lookahead weight averaging as the airbench CIFAR-10 speed runs use it (Jordan 2024, "94% on CIFAR-10 in 3.29
seconds on a single GPU"), written from its description.

A slow copy of the network's floating-point state (parameters and BatchNorm statistics) follows the network.
Every ``every`` optimizer steps the two meet (Lookahead, Zhang et al. 2019, with step size ``1 - decay``)::

    slow <- slow + (1 - decay_t) * (net - slow)        then        net <- slow

and the decay grows along the run, ``decay_t = decay * (t / total) ** power`` (``t`` optimizer steps done of
``total``): near 0 early, when the slow copy simply follows, up to ``decay`` at the end, when it averages
strongly. Each epoch ends with one more meeting at the scheduled decay (``finish``; none when one just happened),
so every evaluation and checkpoint sees the averaged weights, the final network is the averaged one, and no step
is thrown away. Because an epoch ends with ``net == slow``, the next epoch (or a resumed run) starts a fresh
``Lookahead`` from the network: there is no extra state to save. (Airbench ends its run with a meeting at decay 1,
dropping the steps since the last meeting; here every epoch ends, so that would drop up to ``every - 1`` steps per
epoch.)

Integer state (BatchNorm's ``num_batches_tracked``) is left to the network.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Lookahead", "lookahead_decay"]


def lookahead_decay(step: int, total: int, decay: float, power: float) -> float:
    """The share of itself the slow copy keeps at a meeting after ``step`` of ``total`` optimizer steps."""
    return decay * (step / total) ** power


class Lookahead:
    """Slow weights for ``model`` over one epoch; call ``after_step`` after every optimizer step and ``finish``
    at the epoch's end (both with the run's optimizer steps done so far)."""

    def __init__(self, model: nn.Module, every: int, total_steps: int, decay: float, power: float) -> None:
        if every < 1 or total_steps < 1:
            raise ValueError(f"every and total_steps must be >= 1, got {every} and {total_steps}")
        # state_dict() tensors share storage with the model's: writing into them writes the model
        self.fast = [v for v in model.state_dict().values() if v.is_floating_point()]
        self.slow = [v.clone() for v in self.fast]  # at an epoch's start the network is the slow copy
        self.every, self.total, self.decay, self.power = every, total_steps, decay, power

    @torch.no_grad()
    def sync(self, decay: float) -> None:
        """slow <- slow + (1 - decay) (net - slow); net <- slow."""
        torch._foreach_lerp_(self.slow, self.fast, 1.0 - decay)
        torch._foreach_copy_(self.fast, self.slow)

    def after_step(self, step: int) -> None:
        """``step``: optimizer steps done in the whole run (1 after the first); meets every ``every`` of them."""
        if step % self.every == 0:
            self.sync(lookahead_decay(step, self.total, self.decay, self.power))

    def finish(self, step: int) -> None:
        """At the end of an epoch, ``step`` optimizer steps into the run: a meeting at the scheduled decay unless one
        just happened, so the network is the slow copy and the steps since the last meeting count."""
        if step % self.every:
            self.sync(lookahead_decay(step, self.total, self.decay, self.power))
