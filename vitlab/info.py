"""``model_info``: everything inspection code needs to know about a ViT, read from the model itself.

Never guess the grid from ``sqrt(N)`` or assume a class token: prefix tokens may be 0, 1 (class),
2 (class + DeiT distillation) or 1 + registers; ``pos_embed`` may or may not have rows for them
(``no_embed_class``); the readout may be the class token, an average or an attention pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["ModelInfo", "model_info"]


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about a ViT-family model (for a given input size)."""

    architecture: str
    img_size: tuple[int, int]
    patch_size: tuple[int, int]  # pixels per token side (for a hybrid: the backbone's total stride)
    grid_size: tuple[int, int]  # (gh, gw) patch tokens
    num_prefix_tokens: int  # class + distillation + register tokens, in this order at the front
    num_class_tokens: int
    num_dist_tokens: int
    num_reg_tokens: int
    pos_embed: str  # "learn", "fixed" (frozen, e.g. sin-cos) or "none" (also: relative/rotary only)
    pos_embed_has_prefix: bool  # whether pos_embed has rows for the prefix tokens
    readout: str  # "token", "avg", "map" (attention pool) or another timm global_pool name
    depth: int
    num_heads: int
    embed_dim: int
    dynamic_img_size: bool
    hybrid: bool  # patches are cells of a CNN feature map, not pixel patches

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        """T: tokens the blocks attend over (prefix + patches)."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def prefix_kinds(self) -> tuple[str, ...]:
        """Kind of each prefix token, in order: 'class', 'dist', 'reg'."""
        return ("class",) * self.num_class_tokens + ("dist",) * self.num_dist_tokens + ("reg",) * self.num_reg_tokens


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[1]))


def model_info(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> ModelInfo:
    """Facts about ``model``; ``img_size`` (H, W) gives the grid for inputs of another size.

    Raises ``TypeError`` for models without a patch embedding and transformer blocks (e.g. a ResNet).
    """
    pe = getattr(model, "patch_embed", None)
    blocks = getattr(model, "blocks", None)
    if pe is None or blocks is None:
        raise TypeError(
            f"{type(model).__name__} is not a ViT-family model (it has no patch_embed and blocks); "
            "model_info describes timm VisionTransformer-like models"
        )
    hybrid = hasattr(pe, "backbone")
    default_img = _pair(getattr(pe, "img_size", None) or model.pretrained_cfg["input_size"][-2:])
    size = default_img if img_size is None else _pair(img_size)
    if hybrid:
        ratio = pe.feat_ratio(as_scalar=False) if hasattr(pe, "feat_ratio") else None
        default_grid = _pair(pe.grid_size)
        stride = _pair(ratio) if ratio is not None else (default_img[0] // default_grid[0], default_img[1] // default_grid[1])
        patch = stride
        grid = default_grid if size == default_img else (size[0] // stride[0], size[1] // stride[1])
    else:
        patch = _pair(pe.patch_size)
        if size == default_img and getattr(pe, "grid_size", None) is not None:
            grid = _pair(pe.grid_size)
        elif hasattr(pe, "dynamic_feat_size"):
            grid = _pair(pe.dynamic_feat_size(size))
        else:
            grid = (size[0] // patch[0], size[1] // patch[1])

    n_prefix = int(getattr(model, "num_prefix_tokens", 1 if getattr(model, "cls_token", None) is not None else 0))
    n_cls = 1 if getattr(model, "cls_token", None) is not None else 0
    n_dist = 1 if getattr(model, "dist_token", None) is not None else 0
    n_reg = int(getattr(model, "num_reg_tokens", 0) or 0)
    if not n_reg and getattr(model, "reg_token", None) is not None:
        n_reg = model.reg_token.shape[1]
    if n_cls + n_dist + n_reg != n_prefix:  # a family that counts differently: trust num_prefix_tokens
        n_reg = max(0, n_prefix - n_cls - n_dist)

    pos = getattr(model, "pos_embed", None)
    if pos is None or not isinstance(pos, nn.Parameter):
        pos_kind, has_prefix = "none", False
    else:
        pos_kind = "learn" if pos.requires_grad else "fixed"
        has_prefix = not bool(getattr(model, "no_embed_class", False)) and n_prefix > 0
        if pos.shape[1] == grid[0] * grid[1] and size == default_img:
            has_prefix = False

    if getattr(model, "attn_pool", None) is not None:
        readout = "map"
    else:
        readout = str(getattr(model, "global_pool", "token") or "none")
    first = blocks[0]
    attn = getattr(first, "attn", None)
    heads = int(getattr(attn, "num_heads", 0) or 0)
    dim = int(getattr(model, "embed_dim", getattr(model, "num_features", 0)))
    return ModelInfo(
        architecture=str(getattr(model, "pretrained_cfg", {}).get("architecture", type(model).__name__)),
        img_size=size,
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=n_prefix,
        num_class_tokens=n_cls,
        num_dist_tokens=n_dist,
        num_reg_tokens=n_reg,
        pos_embed=pos_kind,
        pos_embed_has_prefix=has_prefix,
        readout=readout,
        depth=len(blocks),
        num_heads=heads,
        embed_dim=dim,
        dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        hybrid=hybrid,
    )
