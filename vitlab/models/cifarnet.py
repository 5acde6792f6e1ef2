"""A fast residual CNN for 32 px images: the distillation teacher and a strong CNN reference.

The design follows the ideas published with the airbench CIFAR-10 speed runs (Jordan 2024, "94% on CIFAR-10
in 3.29 seconds on a single GPU"), written here from their description:

* a first layer that *whitens* 2x2 patches, its weights frozen (its bias trains: throughout, or for the
  first ``whiten_bias_epochs``): its filters are the eigenvectors of the training patches' second-moment
  matrix (an uncentred covariance) scaled by 1/sqrt(eigenvalue), each with its negative (``init_from_data``);
  ``whiten_fp32=True`` runs it in float32 under bf16 autocast;
* three stages ``conv -> max-pool -> BatchNorm -> GELU`` followed by a residual ``conv -> BatchNorm -> GELU``
  branch (``x + f(x)``; ``residual=False`` chains it as airbench94 does), widths 64 / 256 / 256 by default,
  convolutions identity-initialised (Dirac) on the channels they can pass through;
* BatchNorm with learnable shifts but fixed unit scales, global max-pool and a linear head whose logits
  are scaled down by a constant (1/9), which keeps the logits small at the high learning rates used.

It exposes the timm calling convention that the rest of vitlab relies on: ``forward_features`` ->
``(B, C, h, w)``, ``forward_head(x, pre_logits=True)`` -> ``(B, C)``, ``get_classifier`` / ``reset_classifier``,
``num_classes``, ``num_features`` and ``pretrained_cfg``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.base.checks import check_tta_level

__all__ = ["CifarResNet", "whitening_filters", "tta_logits", "check_tta_level"]


class _BatchNorm(nn.BatchNorm2d):
    """BatchNorm with a fixed unit scale (only the shift learns); statistics follow the batch quickly."""

    def __init__(self, channels: int, momentum: float = 0.4, eps: float = 1e-12) -> None:
        super().__init__(channels, eps=eps, momentum=momentum)
        self.weight.requires_grad_(False)


def _conv(cin: int, cout: int, kernel: int = 3, padding: int | str = "same", bias: bool = False) -> nn.Conv2d:
    conv = nn.Conv2d(cin, cout, kernel, padding=padding, bias=bias)
    with torch.no_grad():
        if kernel % 2:  # identity on the first min(cin, cout) channels: an implicit skip at initialisation
            nn.init.dirac_(conv.weight[: min(cin, cout)])
    return conv


class _Stage(nn.Module):
    """(B, cin, H, W) -> (B, cout, H/2, W/2): conv, pool, norm, GELU, then a second conv, norm, GELU: as a residual
    branch (``x + f(x)``) or, with ``residual=False``, in a plain chain (``f(x)``, airbench94's block)."""

    def __init__(self, cin: int, cout: int, residual: bool = True) -> None:
        super().__init__()
        self.residual = residual
        self.conv1 = _conv(cin, cout)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _BatchNorm(cout)
        self.conv2 = _conv(cout, cout)
        self.norm2 = _BatchNorm(cout)
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        y = self.act(self.norm2(self.conv2(x)))
        return x + y if self.residual else y


def whitening_filters(images: Tensor, kernel: int, eps: float = 5e-4) -> Tensor:
    """(N, C, H, W) normalised images -> (2*C*k*k, C, k, k) filters that whiten their k x k patches.

    Each eigenvector v of the patches' second-moment matrix (E[p p^T], not centred: as airbench computes it, and
    close to the covariance for normalised images, whose mean is near 0) becomes the filters ``v / sqrt(lambda +
    eps)`` and its negative, ordered by decreasing eigenvalue, so each half of the layer's outputs (the positive
    filters, or their negatives) has (near) identity second moment on these images; the two halves are each other's
    negatives.
    """
    n, c = images.shape[:2]
    patches = images.float().unfold(2, kernel, 1).unfold(3, kernel, 1)  # (N, C, h, w, k, k)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * kernel * kernel).double()
    moment = patches.T @ patches / len(patches)  # (D, D) second moment, D = C*k*k
    evals, evecs = torch.linalg.eigh(moment)  # ascending
    evals, evecs = evals.flip(0), evecs.flip(1)
    filt = (evecs / torch.sqrt(evals.clamp_min(0) + eps)).T.reshape(-1, c, kernel, kernel)
    return torch.cat([filt, -filt]).float()


class CifarResNet(nn.Module):
    """Whitening stem + three residual stages + max-pool + scaled linear head; see the module docstring."""

    def __init__(self, widths: tuple[int, ...] = (64, 256, 256), num_classes: int = 10, in_chans: int = 3,
                 whiten_kernel: int = 2, logit_scale: float = 1 / 9, residual: bool = True,
                 whiten_fp32: bool = False) -> None:
        super().__init__()
        self.whiten_fp32 = whiten_fp32
        stem_width = 2 * in_chans * whiten_kernel**2
        self.whiten = nn.Conv2d(in_chans, stem_width, whiten_kernel, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)  # set from data by init_from_data, then frozen
        self.act = nn.GELU()
        chans = (stem_width, *widths)
        self.stages = nn.Sequential(*[_Stage(a, b, residual) for a, b in zip(chans[:-1], chans[1:])])
        self.num_features = widths[-1]
        self.logit_scale = logit_scale
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes, bias=False) if num_classes else nn.Identity()

    @torch.no_grad()
    def init_from_data(self, images: Tensor) -> None:
        """Set the whitening filters from (N, C, H, W) normalised training images (a few thousand suffice)."""
        w = whitening_filters(images, self.whiten.kernel_size[0])
        self.whiten.weight.copy_(w.to(self.whiten.weight))
        self.whiten.bias.zero_()

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, num_features, H', W') feature map before pooling."""
        if self.whiten_fp32 and torch.is_autocast_enabled(x.device.type):
            # the whitening filters divide by sqrt(eigenvalue): bf16's 8-bit mantissa left the outputs of the smallest
            # eigenvalues off by 11-14% RMS on CIFAR-10; the stem is ~0.1% of the FLOPs, so it can run in float32
            with torch.autocast(x.device.type, enabled=False):
                x = self.whiten(x.float())
        else:
            x = self.whiten(x)
        return self.stages(self.act(x))  # the stages under the caller's autocast

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = torch.amax(x, dim=(2, 3))  # global max-pool: (B, num_features)
        if pre_logits:
            return x
        return self.head(x) * self.logit_scale

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes, bias=False) if num_classes else nn.Identity()
        if num_classes:
            self.head.to(self.stages[0].conv1.weight)


def tta_logits(model: Callable[[Tensor], Tensor], x: Tensor, level: int = 2) -> Tensor:
    """Test-time augmentation: 0 none, 1 mean over the image and its mirror, 2 also +-1 px translations."""
    check_tta_level("level", level)
    logits = model(x)
    if level == 0:
        return logits
    logits = 0.5 * (logits + model(x.flip(-1)))
    if level == 1:
        return logits
    pad = F.pad(x, (1, 1, 1, 1), mode="reflect")
    shifted = torch.cat([pad[..., :-2, :-2], pad[..., 2:, 2:]])  # up-left and down-right by one pixel
    s = model(shifted) + model(shifted.flip(-1))
    b = len(x)
    return 0.5 * logits + 0.25 * 0.5 * (s[:b] + s[b:])
