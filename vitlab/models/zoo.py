"""The paper's model zoo: a small frozen config per family, built into a plain timm module.

Three families, each described by a small frozen config:

* ``ViTConfig``    the ViT family of Table 1 (Ti/S/B/L/H, any patch size and resolution), class-token or
                   global-average-pool readout, learned 1D, fixed 2D sin-cos or no position embedding.
* ``HybridConfig`` a ResNet (GroupNorm + weight standardisation, post-activation bottlenecks: timm's ``ResNetV2``
                   with ``preact=False``, as timm's ``vit_base_r50_s16_224``) feature map cut into 1x1 patches and
                   fed to a ViT (paper section 3.1, "Hybrid Architecture"; the R50 layout of section 4.1). Its
                   ImageNet stem pads as BiT does (fixed padding), where timm's hybrid pads "SAME": the parameter
                   names match, but timm's hybrid weights loaded into it compute something else; load those by
                   their timm name.
* ``BiTConfig``    BiT-style ResNet baselines (pre-activation ResNet-v2, GroupNorm, StdConv).
* ``CifarNetConfig`` a fast residual CNN for 32 px images (``vitlab.models.cifarnet``): the distillation teacher.

Every model is a plain timm module (``VisionTransformer`` or ``ResNetV2``), so timm's named stages
(``forward_features``, ``forward_head(pre_logits=True)``) and ``timm.data.resolve_data_config`` work on it.
The configs themselves, their presets and their JSON form (``config_to_dict`` / ``config_from_dict``, as stored in
checkpoints) live in the torch-free ``vitlab.models.config``, their one home.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from timm.layers import GroupNormAct, HybridEmbed, StdConv2d
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models import VisionTransformer
from timm.models.resnetv2 import ResNetV2
from torch import nn

from vitlab.models.config import (
    BiTConfig,
    CifarNetConfig,
    HybridConfig,
    ModelConfig,
    Preprocess,
    ViTConfig,
    size2,
)

__all__ = ["build_model", "group_count", "sincos_grid"]

# ---------------------------------------------------------------------------------------------- build


def group_count(channels: int, min_per_group: int | None) -> int:
    """GroupNorm groups for a width: BiT's 32 (``min_per_group=None``), or the largest divisor of ``channels`` that
    is at most min(32, channels // min_per_group), so every group holds at least ``min_per_group`` channels."""
    if min_per_group is None:
        return 32
    cap = max(1, min(32, channels // min_per_group))
    return max(g for g in range(1, cap + 1) if channels % g == 0)


def _group_norm(num_channels: int, min_per_group: int | None = None, **kwargs: Any) -> GroupNormAct:
    return GroupNormAct(num_channels, num_groups=group_count(num_channels, min_per_group), **kwargs)


def _resnet_v2(layers: tuple[int, ...], stem: str, preact: bool, channels: tuple[int, ...] | None = None,
               basic: bool = False, gn_min_channels_per_group: int | None = None, **kwargs: Any) -> ResNetV2:
    """A BiT-style ResNet-v2 (StdConv2d + GroupNorm, 32 groups or sized by width); the 'cifar' stem keeps full
    resolution."""
    channels = channels or tuple(256 * 2**i for i in range(len(layers)))
    norm = partial(_group_norm, min_per_group=gn_min_channels_per_group)
    if basic:
        kwargs.update(basic=True, bottle_ratio=1.0, stem_chs=channels[0])
    model = ResNetV2(
        layers=list(layers),
        channels=channels,
        preact=preact,
        stem_type="fixed" if stem == "imagenet" else "",
        conv_layer=partial(StdConv2d, eps=1e-8),
        norm_layer=norm,
        **kwargs,
    )
    if stem == "cifar":  # 32 px images: a 3x3 stride-1 stem instead of 7x7/2 conv + 3x3/2 max pool
        stem_chs = model.stem.conv.out_channels
        model.stem = nn.Sequential()
        model.stem.add_module("conv", StdConv2d(kwargs.get("in_chans", 3), stem_chs, 3, stride=1, padding=1, eps=1e-8))
        if not preact:
            model.stem.add_module("norm", norm(stem_chs))
        model.feature_info[0]["reduction"] = 1
        for info in model.feature_info[1:]:  # the stages lost the stem's stride of 4 too
            info["reduction"] //= 4
    return model


def _vit_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    return dict(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=(cfg.mlp_dim + 0.5) / cfg.embed_dim,  # timm builds int(embed_dim * ratio): exactly mlp_dim
        class_token=cfg.readout == "token",
        global_pool=cfg.readout,
        pos_embed="none" if cfg.pos_embed == "none" else "learn",
        drop_rate=cfg.drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        patch_drop_rate=cfg.patch_drop_rate,
    )


def _pretrained_cfg(arch: str, img_size: int | tuple[int, int], in_chans: int, num_classes: int,
                    pre: Preprocess, first_conv: str, classifier: str | tuple[str, ...]) -> dict[str, Any]:
    """The timm ``pretrained_cfg`` that ``timm.data.resolve_data_config`` reads the preprocessing from."""
    return dict(
        architecture=arch,
        input_size=(in_chans, *size2(img_size)),
        mean=tuple(pre.mean),
        std=tuple(pre.std),
        interpolation=pre.interpolation,
        crop_pct=pre.crop_pct,
        crop_mode="center",
        num_classes=num_classes,
        first_conv=first_conv,
        classifier=classifier,
    )


def sincos_grid(grid: tuple[int, int], dim: int, like: torch.Tensor) -> torch.Tensor:
    """(gh*gw, D) fixed 2D sin-cos table, rows in the patch order (row-major over the grid)."""
    return build_sincos2d_pos_embed(list(grid), dim=dim, device=like.device).to(like.dtype)


def _set_sincos(model: VisionTransformer) -> None:
    """Fixed 2D sin-cos position embedding (Table 8's "2-D" variant without learning); prefix rows are zero."""
    gh, gw = model.patch_embed.grid_size
    pe = torch.zeros_like(model.pos_embed)  # (1, prefix + gh*gw, D)
    pe[0, pe.shape[1] - gh * gw :] = sincos_grid((gh, gw), model.embed_dim, pe)
    model.pos_embed = nn.Parameter(pe, requires_grad=False)


def _build_vit(cfg: ViTConfig, embed_layer: Any = None) -> VisionTransformer:
    kwargs = _vit_kwargs(cfg)
    if embed_layer is not None:
        kwargs.update(patch_size=1, embed_layer=embed_layer)
    if cfg.distilled:
        from timm.models.deit import VisionTransformerDistilled

        model = VisionTransformerDistilled(**kwargs)
        # timm builds the patch dropout while the model still counts one prefix token; the distillation token must
        # be kept (never dropped or shuffled among the patches) like the class token
        if hasattr(model.patch_drop, "num_prefix_tokens"):
            model.patch_drop.num_prefix_tokens = model.num_prefix_tokens
    else:
        model = VisionTransformer(**kwargs)
    if cfg.pos_embed == "sincos":
        _set_sincos(model)
    if cfg.init != "timm":
        from vitlab.models.mimetic import VO_ALPHA, VO_BETA, mimetic_

        mimetic_(model, vo=None if cfg.init == "mimetic_qk" else (VO_ALPHA, VO_BETA))
    return model


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build a randomly initialised model from a config. The config is attached as ``model.vitlab_config``."""
    if isinstance(cfg, ViTConfig):
        model = _build_vit(cfg)
        pcfg = _pretrained_cfg("vitlab_vit", cfg.img_size, cfg.in_chans, cfg.num_classes, cfg.preprocess,
                               "patch_embed.proj", ("head", "head_dist") if cfg.distilled else "head")
    elif isinstance(cfg, HybridConfig):
        backbone = _resnet_v2(cfg.layers, cfg.stem, preact=False, channels=cfg.channels, num_classes=0,
                              global_pool="", in_chans=cfg.vit.in_chans,
                              gn_min_channels_per_group=cfg.gn_min_channels_per_group)
        model = _build_vit(cfg.vit, embed_layer=partial(HybridEmbed, backbone=backbone))
        pcfg = _pretrained_cfg("vitlab_hybrid", cfg.vit.img_size, cfg.vit.in_chans, cfg.vit.num_classes,
                               cfg.vit.preprocess, "patch_embed.backbone.stem.conv", "head")
    elif isinstance(cfg, BiTConfig):
        model = _resnet_v2(
            cfg.layers,
            cfg.stem,
            preact=True,
            channels=cfg.channels,
            basic=cfg.basic,
            num_classes=cfg.num_classes,
            in_chans=cfg.in_chans,
            width_factor=cfg.width_factor,
            drop_path_rate=cfg.drop_path_rate,
            gn_min_channels_per_group=cfg.gn_min_channels_per_group,
        )
        pcfg = _pretrained_cfg("vitlab_bit", cfg.img_size, cfg.in_chans, cfg.num_classes, cfg.preprocess,
                               "stem.conv", "head.fc")
    elif isinstance(cfg, CifarNetConfig):
        from vitlab.models.cifarnet import CifarResNet

        model = CifarResNet(cfg.widths, cfg.num_classes, cfg.in_chans, cfg.whiten_kernel, cfg.logit_scale,
                            residual=cfg.residual, whiten_fp32=cfg.whiten_fp32)
        pcfg = _pretrained_cfg("vitlab_cifarnet", cfg.img_size, cfg.in_chans, cfg.num_classes, cfg.preprocess,
                               "whiten", "head")
    else:
        raise TypeError(f"expected ViTConfig, HybridConfig, BiTConfig or CifarNetConfig, got {type(cfg).__name__}")
    model.pretrained_cfg = pcfg
    model.default_cfg = model.pretrained_cfg
    model.vitlab_config = cfg
    return model
