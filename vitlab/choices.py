"""The names the command line offers before any work (devices, readouts, presets), here without torch so that
``vitlab --help``, a subcommand's ``--help`` and an argument error load no torch or timm. The modules that act on
them (``vitlab.devices``, ``vitlab.features``, ``vitlab.train_config``) import them from here.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["DEVICE_HELP", "Readout", "READOUTS", "READOUT_NAMES", "PRESET_NAMES"]

DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda when available)"

#: What a probe reads: the model's own readout (``forward_head(pre_logits=True)``) or the mean of a ViT's patch tokens
Readout = Literal["model", "patch_mean"]
READOUTS: tuple[str, ...] = get_args(Readout)
READOUT_NAMES = {"model": "the model's own readout (the class token; the mean of the class and distillation tokens "
                          "for a distilled ViT)",
                 "patch_mean": "the mean of the final patch tokens"}

#: The names of ``vitlab.train_config.PRESETS`` in its order (that module refuses to load when the two differ)
PRESET_NAMES: tuple[str, ...] = ("vit_cifar10", "resnet_cifar10", "bit_cifar10", "hybrid_cifar10", "mpp_cifar10",
                                 "vit_shapes", "tiny", "resnet_cifar10_fast", "resnet_cifar10_wide")
