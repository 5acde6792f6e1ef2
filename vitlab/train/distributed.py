"""Training in one process or in several under ``torchrun``: which process this is and on which device
(``dist_setup``: gloo on CPUs, nccl on CUDA GPUs), a mean over the processes, a barrier, and what a model with
BatchNorm is told when each process normalises only its own slice of the batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from vitlab.base.devices import resolve_device
from vitlab.base.errors import ParameterError, Setting
from vitlab.train.config import TrainConfig

__all__ = ["Dist", "dist_setup", "per_process_batchnorm", "mean_over_ranks", "barrier"]


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: its ``rank`` among ``world`` processes and its ``device``."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def dist_setup(device: str | None) -> Dist:
    """One process (default) or one of ``torchrun``'s (``WORLD_SIZE`` > 1): gloo on CPU, nccl on GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = resolve_device(device)  # checked before any work: a missing GPU or a typo names the fix
    if world == 1:
        return Dist(device=dev)
    if dev.type not in ("cpu", "cuda"):  # it would have trained on the CPU without a word
        raise ParameterError("device", str(dev), problem="under torchrun: distributed training runs on CPUs (gloo) or "
                             "CUDA GPUs (nccl)", fix=["run on one device without torchrun", Setting("device", "cpu")])
    cuda = dev.type == "cuda"
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    dev = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    return Dist(rank, world, dev)


_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def per_process_batchnorm(model: nn.Module, cfg: TrainConfig, d: Dist) -> str | None:
    """Under torchrun, what a model with BatchNorm is told: each process normalises its own slice of the batch (DDP
    averages the gradients, not the statistics), so such a run only approximates one process's. None otherwise."""
    if d.world == 1 or not any(isinstance(m, _BATCHNORMS) for m in model.modules()):
        return None
    return (f"note: BatchNorm normalises each of the {d.world} processes' {cfg.batch_size // d.world} images, not the "
            f"global batch of {cfg.batch_size} (no SyncBatchNorm): this run's statistics, and so its weights, differ "
            "from a one-process run's; the optimizer still steps on the global batch's mean gradient")


def mean_over_ranks(value: float, d: Dist) -> float:
    """``value`` averaged over the processes (itself in one process)."""
    if d.world == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return float(t) / d.world


def barrier(d: Dist) -> None:
    """Wait for every process (nothing to wait for in one process)."""
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()
