"""Masked patch prediction (paper section 4.6, Appendix B.1.2): self-supervised pre-training of a ViT encoder.

Half of the patch embeddings (``rate``) are corrupted, per image: of those, 80% are replaced by a learnable [mask]
embedding, 10% by the embedding of a random other patch (drawn from the whole batch), 10% are kept as they are.
From each corrupted patch's output token the model predicts one of three targets:

* ``"color3"`` (the paper's choice): the patch's mean colour in 3 bits per channel, one of 512 classes;
* ``"patch4x4"``: the patch downsized to 4 x 4 pixels in 3-bit colours, 16 predictions of 512 classes each;
* ``"l2"``: the full patch's pixels (normalised), regressed with a squared error.

Only corrupted patches enter the loss. The corruption is drawn from the caller's generator (the training loop's
per-epoch generator), so a resumed run draws exactly what an uninterrupted one would. The encoder stays a plain
vitlab ViT: the [mask] embedding and the prediction head live in ``MaskedPatchPrediction``, next to it, and the
corruption is applied by a forward hook on ``patch_embed`` that exists only inside ``corrupted_patches``: before the
position embeddings are added, so a [mask] or a random other patch's embedding gets the position of the slot it fills
(as BERT adds positions to a replaced token; the paper does not say), and a random patch's embedding is its clean one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.base.choices import MPP_TARGETS

__all__ = ["MPP_TARGETS", "color3_targets", "patch4x4_targets", "patch_pixels", "draw_corruption",
           "corrupted_patches", "MaskedPatchPrediction", "KEEP", "MASK", "RANDOM", "SAME", "OBJECTIVE_NAME",
           "load_mpp"]

#: The file beside a checkpoint's ``model.safetensors`` that holds the [mask] embedding and the prediction head.
OBJECTIVE_NAME = "objective.safetensors"
KEEP, MASK, RANDOM, SAME = 0, 1, 2, 3  # not corrupted; [mask]; a random other patch; corrupted but left as it is


def _patches(images: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C, P, P) patches in row-major grid order."""
    B, C, H, W = images.shape
    p = images.unfold(2, patch, patch).unfold(3, patch, patch)  # (B, C, gh, gw, P, P)
    return p.permute(0, 2, 3, 1, 4, 5).reshape(B, (H // patch) * (W // patch), C, patch, patch)


def _unit_pixels(images01: Tensor, what: str) -> Tensor:
    """``images01`` (B, 3, H, W) floats in [0, 1], or a ValueError naming what is wrong (normalised or 0-255 pixels
    would otherwise clamp into a few colour classes without a word)."""
    if images01.dim() != 4 or images01.shape[1] != 3 or not images01.is_floating_point():
        raise ValueError(f"{what} targets need (B, 3, H, W) float pixels in [0, 1], got {images01.dtype} of shape "
                         f"{tuple(images01.shape)}: pass the RGB images as uint8 / 255")
    if images01.numel():
        lo, hi = (float(v) for v in torch.aminmax(images01.detach()))
        if not (0.0 <= lo and hi <= 1.0):  # NaN fails too
            raise ValueError(f"{what} targets need pixels in [0, 1] (uint8 / 255, before normalisation), got values "
                             f"in [{lo:.4g}, {hi:.4g}]: pass the unnormalised images divided by 255")
    return images01


def _bits3(x: Tensor) -> Tensor:
    """Values in [0, 1] -> 3-bit levels 0..7."""
    return (x.clamp(0, 1) * 8).floor().clamp_max(7).long()


def color3_targets(images01: Tensor, patch: int) -> Tensor:
    """(B, 3, H, W) pixels in [0, 1] -> (B, N) classes 0..511: each patch's mean colour, 3 bits per channel
    (class = 64 r + 8 g + b). The mean is taken in float32 before quantising (level = floor(8 * mean)): a mean exactly
    on a level's edge (a 4 x 4 patch's channel of 0-255 pixels summing to a multiple of 510) can round to the level
    below (4 of the 8,192 patches of the 128 shipped CIFAR-10 test images)."""
    mean = _patches(_unit_pixels(images01, "color3"), patch).mean(dim=(-1, -2))  # (B, N, 3)
    q = _bits3(mean)
    return q[..., 0] * 64 + q[..., 1] * 8 + q[..., 2]


def patch4x4_targets(images01: Tensor, patch: int) -> Tensor:
    """(B, 3, H, W) in [0, 1] -> (B, N, 16): each patch average-pooled to 4 x 4 pixels, 3-bit colours (0..511)."""
    p = _patches(_unit_pixels(images01, "patch4x4"), patch)  # (B, N, 3, P, P)
    B, N = p.shape[:2]
    small = F.adaptive_avg_pool2d(p.reshape(B * N, 3, patch, patch), 4).reshape(B, N, 3, 16)
    q = _bits3(small)
    return q[:, :, 0] * 64 + q[:, :, 1] * 8 + q[:, :, 2]


def patch_pixels(images: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C * P * P) flattened patches (the L2 target, in the model's normalised units)."""
    p = _patches(images, patch)
    return p.reshape(*p.shape[:2], -1)


def draw_corruption(batch: int, patches: int, rate: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Per image, exactly ``round(rate * patches)`` patches corrupted; each one [mask] with probability 0.8, a random
    other patch with 0.1, itself with 0.1. Returns ``mode`` (B, N) in {KEEP, MASK, RANDOM, SAME} and ``source``
    (B, N): for RANDOM, the flat index (image * N + patch) of the replacing patch, never the patch itself."""
    k = round(rate * patches)
    if k < 1:
        raise ValueError(f"a corruption rate of {rate} corrupts no patch of {patches}: raise mpp_rate to at least "
                         f"1/{patches} = {1 / patches:.4g} (one patch)")
    order = torch.rand(batch, patches, generator=generator).argsort(1)
    chosen = torch.zeros(batch, patches, dtype=torch.bool).scatter_(1, order[:, :k], True)
    u = torch.rand(batch, patches, generator=generator)
    mode = torch.full((batch, patches), KEEP, dtype=torch.long)
    mode[chosen & (u < 0.8)] = MASK
    mode[chosen & (u >= 0.8) & (u < 0.9)] = RANDOM
    mode[chosen & (u >= 0.9)] = SAME
    total = batch * patches
    own = torch.arange(total).view(batch, patches)
    other = torch.randint(0, max(1, total - 1), (batch, patches), generator=generator)
    source = other + (other >= own).long()  # uniform over every flat index but one's own
    return mode, source.clamp_max(total - 1)


@contextlib.contextmanager
def corrupted_patches(model: nn.Module, mode: Tensor, source: Tensor, mask_token: Tensor) -> Iterator[None]:
    """Inside the block, ``model.patch_embed``'s output (B, N, D) is corrupted as ``mode`` says; the hook is removed
    on exit, also when the body raises."""

    def hook(_module, _args, out: Tensor) -> Tensor:
        shape = out.shape
        flat = out.reshape(shape[0], -1, shape[-1])  # (B, N, D)
        B, N, D = flat.shape
        m = mode.to(flat.device).view(B, N, 1)
        random = flat.reshape(B * N, D)[source.to(flat.device).view(-1)].view(B, N, D)
        new = torch.where(m == MASK, mask_token.to(flat.dtype).view(1, 1, D), flat)
        new = torch.where(m == RANDOM, random, new)
        return new.reshape(shape)

    handle = model.patch_embed.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class MaskedPatchPrediction(nn.Module):
    """The [mask] embedding and the prediction head for one encoder; ``loss`` runs the encoder on corrupted patches.

    ``num_prefix_tokens`` and ``patch`` come from the encoder (a timm ``VisionTransformer`` built by vitlab).
    """

    def __init__(self, embed_dim: int, patch: int, num_prefix_tokens: int,
                 target: Literal["color3", "patch4x4", "l2"] = "color3", rate: float = 0.5, channels: int = 3) -> None:
        super().__init__()
        if target not in MPP_TARGETS:
            raise ValueError(f"mpp target must be one of {MPP_TARGETS}, got {target!r}")
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"corruption rate must be in (0, 1], got {rate}")
        if target == "patch4x4" and patch % 4:
            raise ValueError(f"the patch4x4 target averages each patch over 4 x 4 cells: it needs a patch size that is a "
                             f"multiple of 4, got {patch} px; use another target or patch size")
        self.target, self.rate, self.patch, self.num_prefix_tokens = target, rate, patch, num_prefix_tokens
        self.mask_token = nn.Parameter(torch.zeros(embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        out = {"color3": 512, "patch4x4": 16 * 512, "l2": channels * patch * patch}[target]
        self.head = nn.Sequential(nn.LayerNorm(embed_dim), nn.Linear(embed_dim, out))

    @classmethod
    def for_model(cls, model: nn.Module, target: str = "color3", rate: float = 0.5) -> MaskedPatchPrediction:
        ps = model.patch_embed.patch_size
        patch = ps if isinstance(ps, int) else ps[0]
        return cls(model.embed_dim, patch, int(model.num_prefix_tokens), target, rate)

    def targets(self, images01: Tensor, x: Tensor) -> Tensor:
        """The target of every patch: (B, N) classes, (B, N, 16) classes, or (B, N, C*P*P) normalised pixels."""
        if self.target == "color3":
            return color3_targets(images01, self.patch)
        if self.target == "patch4x4":
            return patch4x4_targets(images01, self.patch)
        return patch_pixels(x, self.patch)

    def forward(self, model: nn.Module, x: Tensor, images01: Tensor, generator: torch.Generator,
                all_predictions: bool = True) -> tuple[Tensor, dict[str, Tensor | None]]:
        """Loss over the corrupted patches of the normalised batch ``x`` (B, C, H, W), whose [0, 1] pixels are
        ``images01`` (for the colour targets); also returns the draw, the predictions (B, N, out) of every patch and
        the targets. ``all_predictions=False`` (training) runs the head on the corrupted patches only, the same loss
        for half the head's work, and returns ``prediction=None``."""
        if getattr(model, "patch_drop", None) is not None and not isinstance(model.patch_drop, nn.Identity):
            raise ValueError("masked patch prediction needs every patch token: build the encoder with "
                             "patch_drop_rate=0")
        B = len(x)
        if self.target != "l2" and (images01.shape[0] != B or images01.shape[-2:] != x.shape[-2:]):
            raise ValueError(f"images01 {tuple(images01.shape)} must be the batch x {tuple(x.shape)} before "
                             "normalisation (same images, same size): its patches give the colour targets of x's")
        N = (x.shape[-2] // self.patch) * (x.shape[-1] // self.patch)
        mode, source = draw_corruption(B, N, self.rate, generator)
        with corrupted_patches(model, mode, source, self.mask_token):
            tokens = model.forward_features(x)  # (B, prefix + N, D)
        patches = tokens[:, self.num_prefix_tokens:].float()  # (B, N, D)
        target = self.targets(images01, x).to(patches.device)
        corrupted = (mode != KEEP).to(patches.device)  # (B, N): only these enter the loss
        out = self.head(patches) if all_predictions else None  # (B, N, out)
        pred = out[corrupted] if out is not None else self.head(patches[corrupted])  # (K, out)
        if self.target == "color3":
            loss = F.cross_entropy(pred, target[corrupted])
        elif self.target == "patch4x4":
            loss = F.cross_entropy(pred.view(-1, 512), target[corrupted].view(-1))
        else:
            loss = F.mse_loss(pred, target[corrupted].float())
        return loss, {"mode": mode, "source": source, "prediction": out, "target": target}


def load_mpp(path: str | os.PathLike) -> tuple[nn.Module, MaskedPatchPrediction]:
    """(encoder, objective) of a masked-patch-prediction checkpoint: a shipped folder (``model.safetensors``,
    ``config.json`` and ``objective.safetensors``, as ``vitlab export`` writes it) or a training run folder (its
    ``checkpoint/``). Target and rate come from the checkpoint's training config; both come back in float32 eval mode."""
    from vitlab.models.checkpoint import load_checkpoint, load_module_weights

    p = Path(path).expanduser()
    folder = p / "checkpoint" if (p / "checkpoint" / OBJECTIVE_NAME).is_file() else p
    if not (folder / OBJECTIVE_NAME).is_file():
        raise FileNotFoundError(f"{p} holds no masked-patch-prediction head ({OBJECTIVE_NAME}): pass a run of "
                                "`vitlab train --preset mpp_cifar10` or its export (`vitlab export --run-dir RUN --out "
                                "FOLDER`)")
    model = load_checkpoint(folder).float().eval()
    train_cfg = (getattr(model, "vitlab_checkpoint", None) or {}).get("train") or {}
    if train_cfg.get("objective") != "mpp":
        raise ValueError(f"{folder} was not trained with objective='mpp' (its training config says "
                         f"{train_cfg.get('objective', 'nothing')!r})")
    objective = MaskedPatchPrediction.for_model(model, train_cfg["mpp_target"], train_cfg["mpp_rate"]).float()
    load_module_weights(objective, folder / OBJECTIVE_NAME)  # a head that does not fit: a ModelLoadError naming it
    return model, objective.eval()
