"""The names and defaults the command line offers before any work (devices, readouts, MPP targets, the embedded
default checkpoint, the probe's ridge penalty, the cache kinds), here without torch so that ``vitlab --help``, a
subcommand's ``--help``, an argument error and a refused option load no torch or timm. The modules that act on them
(``vitlab.base.devices``, ``vitlab.probe.features``, ``vitlab.train.mpp``, ``vitlab.models.load``, ``vitlab.probe.linear``,
``vitlab.data.cache``) import them from here; the presets' names are those of the torch-free
``vitlab.train.config.PRESETS``.
"""

from __future__ import annotations

from typing import Literal, get_args

from vitlab.base.shipped import data_path

__all__ = ["DEVICE_HELP", "Readout", "READOUTS", "READOUT_NAMES", "MPP_TARGETS", "DEFAULT_CHECKPOINT", "DEFAULT_L2",
           "CACHE_KINDS", "PUBLIC_DATASETS"]

DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda when available)"

#: What a probe reads: the model's own readout (``forward_head(pre_logits=True)``) or the mean of a ViT's patch tokens
Readout = Literal["model", "patch_mean"]
READOUTS: tuple[str, ...] = get_args(Readout)
READOUT_NAMES = {"model": "the model's own readout (the class token; the mean of the class and distillation tokens "
                          "for a distilled ViT)",
                 "patch_mean": "the mean of the final patch tokens"}

#: What masked patch prediction predicts of each corrupted patch (``vitlab.train.mpp``; ``TrainConfig.mpp_target``)
MPP_TARGETS = ("color3", "patch4x4", "l2")

#: The embedded default model: what ``--model`` loads when it is left out (``vitlab.models.load.load_model``); the
#: checkout's data/checkpoints/vit_cifar10, or a wheel's copy (``vitlab.base.shipped``)
DEFAULT_CHECKPOINT = data_path("checkpoints/vit_cifar10")

#: The few-shot probe's ridge penalty (``vitlab.probe.linear``; ``--l2``, a sweep's ``l2``): big_vision's few-shot default
DEFAULT_L2 = 2.0**10

#: The caches ``vitlab cache`` lists and prunes (``vitlab.data.cache.KINDS``)
CACHE_KINDS: tuple[str, ...] = ("images", "features")

#: The public data sets read by name that ``vitlab data NAME`` fetches (``vitlab.data.datasets.CIFAR_FOLDERS``)
PUBLIC_DATASETS: tuple[str, ...] = ("cifar10", "cifar100")
