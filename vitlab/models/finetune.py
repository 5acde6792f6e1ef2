"""Fine-tuning at another resolution (paper section 3.2): resample the position embeddings, reset the head."""

from __future__ import annotations

import dataclasses

import torch
from timm.layers import HybridEmbed, resample_abs_pos_embed
from timm.models import VisionTransformer
from torch import nn

from vitlab.models.config import HybridConfig, ModelConfig, ViTConfig, size2
from vitlab.models.zoo import sincos_grid

__all__ = ["resize_for_finetuning", "resample_grid", "INTERPOLATIONS"]

#: ``F.interpolate``'s modes for a 2D grid, the ones ``resample_grid`` takes.
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def resize_for_finetuning(model: nn.Module, img_size: int | tuple[int, int], num_classes: int | None = None,
                          interpolation: str = "bicubic") -> nn.Module:
    """Prepare a ViT for fine-tuning at another resolution, as in the paper's section 3.2.

    The patch size stays, so the grid grows; the learned position embeddings of the patch grid are
    resampled by 2D interpolation (``interpolation`` is the ``F.interpolate`` mode, antialiased for bilinear and
    bicubic as timm's ``resample_abs_pos_embed``), prefix rows kept as they are; fixed sin-cos embeddings are
    rebuilt exactly for the new grid; with ``num_classes`` the head is replaced by a zero-initialised linear layer
    (0: no head).
    For a hybrid the grid is the backbone's feature map at the new size. Works in place and returns the model.
    """
    if not isinstance(model, VisionTransformer):
        from vitlab.base.modes import unwrapped

        inner = unwrapped(model)
        if inner is not model:  # torch.compile's OptimizedModule, DataParallel
            why = (f": resize the {type(inner).__name__} it wraps, then wrap that again"
                   + (" (compile again: the compiled code is for the old size)" if hasattr(model, "_orig_mod") else ""))
        elif hasattr(model, "set_input_size"):  # e.g. Eva, Beit: positions also in rotary or relative-bias tables
            why = (f"; {type(model).__name__} has timm's own set_input_size for another resolution (vitlab resizes "
                   "only a VisionTransformer's position table)")
        else:
            why = ""
        raise TypeError(f"resize_for_finetuning needs a timm VisionTransformer, got {type(model).__name__}{why}")
    size = size2(img_size)
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0):
        raise ValueError(f"num_classes must be an int >= 0 (0: no head), got {num_classes!r}")
    embed = model.patch_embed
    if not isinstance(embed, HybridEmbed) and not getattr(embed, "dynamic_img_pad", False):
        ph, pw = embed.patch_size
        if size[0] % ph or size[1] % pw:
            raise ValueError(f"img_size {size} is not a multiple of the patch size {(ph, pw)}")
    _check_interpolation(interpolation)
    new_cfg = _resized_config(getattr(model, "vitlab_config", None), size, num_classes)  # validates before changes
    pe = model.pos_embed
    sincos = pe is not None and _is_sincos(model)
    old_grid, old_size = tuple(embed.grid_size), tuple(embed.img_size)
    embed.set_input_size(img_size=size)  # hybrid: runs the backbone once to read the new feature map size
    try:
        new_grid = tuple(embed.grid_size)
        if pe is not None:
            n_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
            with torch.no_grad():
                new = _resized_pos_embed(pe, n_prefix, old_grid, new_grid, sincos, interpolation)
    except BaseException:
        embed.set_input_size(img_size=old_size)  # the model as it came: nothing half-resized
        raise
    if pe is not None:
        model.pos_embed = nn.Parameter(new, requires_grad=pe.requires_grad)
    if num_classes is not None:
        _zero_head(model, num_classes)
    _record_size(model, size, num_classes, new_cfg)
    return model


def _resized_config(cfg: ModelConfig | None, size: tuple[int, int], num_classes: int | None) -> ModelConfig | None:
    """The vitlab config of the resized model (so a checkpoint of it rebuilds the right shapes)."""
    img: int | tuple[int, int] = size[0] if size[0] == size[1] else size
    if isinstance(cfg, ViTConfig):
        ncls = cfg.num_classes if num_classes is None else num_classes
        return dataclasses.replace(cfg, img_size=img, num_classes=ncls)
    if isinstance(cfg, HybridConfig):
        ncls = cfg.vit.num_classes if num_classes is None else num_classes
        return dataclasses.replace(cfg, vit=dataclasses.replace(cfg.vit, img_size=img, num_classes=ncls))
    return cfg


def _is_sincos(model: VisionTransformer) -> bool:
    """Whether pos_embed is the fixed sin-cos table: from the vitlab config, else by comparing the values.

    (``requires_grad`` is no evidence: a user may have frozen a learned embedding.)
    """
    cfg = getattr(model, "vitlab_config", None)
    cfg = cfg.vit if isinstance(cfg, HybridConfig) else cfg
    if isinstance(cfg, ViTConfig):
        return cfg.pos_embed == "sincos"
    pe, grid = model.pos_embed, tuple(model.patch_embed.grid_size)
    n = grid[0] * grid[1]
    if pe.shape[-1] % 4 or pe.shape[1] < n:
        return False
    table = sincos_grid(grid, pe.shape[-1], pe.detach())
    return bool(torch.allclose(pe.detach()[0, -n:], table, atol=1e-5))


def _resized_pos_embed(pe: torch.Tensor, n_prefix: int, old_grid: tuple[int, int], new_grid: tuple[int, int],
                       sincos: bool, interpolation: str) -> torch.Tensor:
    """(1, n_prefix + new gh*gw, D) from (1, n_prefix + old gh*gw, D); prefix rows are copied unchanged."""
    if pe.shape[1] != n_prefix + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"pos_embed has {pe.shape[1]} rows but the model has {n_prefix} prefix rows and a {old_grid} grid"
        )
    if sincos:
        table = sincos_grid(new_grid, pe.shape[-1], pe)
        return torch.cat([pe[:, :n_prefix].detach(), table[None]], dim=1)
    grid = resample_grid(pe.detach()[:, n_prefix:], old_grid, new_grid, interpolation)
    return torch.cat([pe.detach()[:, :n_prefix], grid], dim=1)


def resample_grid(rows: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int],
                  interpolation: str = "bicubic") -> torch.Tensor:
    """(1, gh*gw, D) learned position embeddings of an ``old_grid`` -> (1, gh'*gw', D) for ``new_grid`` by 2D
    interpolation (``F.interpolate`` mode; paper section 3.2). Bilinear and bicubic are antialiased in either
    direction, as timm's ``resample_abs_pos_embed`` does when it loads weights at another ``img_size`` or resizes a
    ``dynamic_img_size`` model (upwards this changes the bicubic kernel, to PyTorch's antialiased a = -0.5), so a
    model resized here equals the one timm builds at that size."""
    _check_interpolation(interpolation)
    old_grid, new_grid = size2(tuple(old_grid), "old_grid"), size2(tuple(new_grid), "new_grid")
    if rows.dim() != 3 or rows.shape[1] != old_grid[0] * old_grid[1]:
        raise ValueError(f"resample_grid needs (B, gh*gw, D) rows of the {old_grid} grid ({old_grid[0] * old_grid[1]} "
                         f"rows), got shape {tuple(rows.shape)}: leave out the prefix rows and pass the grid they were "
                         "laid out on")
    if old_grid == new_grid:
        return rows
    antialias = interpolation in ("bilinear", "bicubic")  # F.interpolate antialiases these two modes only
    return resample_abs_pos_embed(rows, new_size=list(new_grid), old_size=list(old_grid), num_prefix_tokens=0,
                                  interpolation=interpolation, antialias=antialias)


def _check_interpolation(interpolation: str) -> None:
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)} (F.interpolate's 2D modes), got "
                         f"{interpolation!r}")


def _zero_head(model: VisionTransformer, num_classes: int) -> None:
    """A fresh D x K head with zero weight and bias (paper section 3.2), on the model's device and dtype."""
    ref = model.pos_embed if model.pos_embed is not None else next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # timm draws the new head's weights (zeroed below) on the CPU
        model.reset_classifier(num_classes)
    for name in ("head", "head_dist"):  # DeiT-distilled models have a second head
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            head.to(device=ref.device, dtype=ref.dtype)


def _record_size(model: VisionTransformer, size: tuple[int, int], num_classes: int | None,
                 cfg: ModelConfig | None) -> None:
    """Make pretrained_cfg (read by timm.data.resolve_data_config) and the vitlab config tell the new size."""
    pc = dict(getattr(model, "pretrained_cfg", {}) or {})
    chans = (pc.get("input_size") or (getattr(model.patch_embed, "in_chans", 3),))[0]
    pc["input_size"] = (chans, *size)
    pc.pop("test_input_size", None)
    if num_classes is not None:
        pc["num_classes"] = num_classes
    model.pretrained_cfg = model.default_cfg = pc
    try:
        from timm.models._input import update_model_input_size
    except ImportError:  # older timm keeps no size traits
        pass
    else:
        update_model_input_size(model, size)
    if cfg is not None:
        model.vitlab_config = cfg
