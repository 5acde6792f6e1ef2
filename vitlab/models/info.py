"""``model_info``: everything inspection code needs to know about a ViT, read from the model itself.
``resolve_model``: a model resolved once where it enters vitlab (``ResolvedModel``: the module a wrapper runs and its
``ModelInfo`` per input size), passed down so that the layers below neither unwrap it nor read its facts again.

Never guess the grid from ``sqrt(N)`` or assume a class token: prefix tokens may be 0, 1 (class),
2 (class + DeiT distillation) or 1 + registers; ``pos_embed`` may or may not have rows for them
(``no_embed_class``); the readout may be the class token, an average or an attention pool.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from torch import nn

from vitlab.base.checks import whole_index
from vitlab.base.modes import unwrapped

__all__ = ["ModelInfo", "model_info", "ResolvedModel", "resolve_model", "AnyModel", "data_config", "architecture_words", "attention_position_words"]


def data_config(model: AnyModel) -> dict:
    """``timm.data.resolve_data_config({}, model=model)`` with the input size the model is built for: a timm model
    created with an ``img_size`` override (or a bare ``VisionTransformer``) keeps the ``pretrained_cfg`` of its
    name (224 px), which would resize every image to a size its fixed patch grid refuses. A model with a dynamic
    input size (``dynamic_img_size=True``) built at another size gets that size too: the size it was built for."""
    import timm.data

    model = resolve_model(model).module
    cfg = dict(timm.data.resolve_data_config({}, model=model))
    pe = getattr(model, "patch_embed", None)
    size = getattr(pe, "img_size", None)
    if size is not None:
        size = (size, size) if isinstance(size, int) else tuple(int(v) for v in size)
        if tuple(cfg["input_size"][-2:]) != size:
            cfg["input_size"] = (cfg["input_size"][0], *size)
    return cfg


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about a ViT-family model (for a given input size)."""

    architecture: str
    img_size: tuple[int, int]
    patch_size: tuple[int, int]  # pixels per token side (for a hybrid: the backbone's total stride)
    grid_size: tuple[int, int]  # (gh, gw) patch tokens at img_size
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
    # a pooled readout ("avg", "max", ...) over every token, prefix included (timm's pool_include_prefix)
    readout_includes_prefix: bool = False
    # the attention pool's output is its first query row (timm's AttentionPoolPrr on a model with a class token),
    # not the mean of its query rows
    pool_reads_first_row: bool = False
    # (gh, gw) the grid pos_embed's patch rows are laid out on: the model's own grid as timm builds it, which timm
    # resamples to grid_size for other inputs (dynamic_img_size); it differs from grid_size even at the model's own
    # size when the patches pad the image (dynamic_img_pad with a side that is no multiple of the patch)
    pos_grid_size: tuple[int, int] | None = None
    # position information the attention adds itself, which pos_embed does not hold: "rotary" (RoPE: EVA-02, DINOv3,
    # timm's vit_*_rope_*), "relative bias" (BEiT's relative position bias) and "gated positional" (ConViT's gated
    # positional self-attention, a learned attention over relative offsets); () for none
    attention_positions: tuple[str, ...] = ()
    # the block before which the class token joins the patches (a ConViT's local_up_to_layer; 0 when it is there from
    # the first block): the captured maps of earlier blocks hold the class token's identity row and column (it attends
    # only to itself and nothing attends to it), padded around the blocks' own patch-by-patch attention
    class_token_joins: int = 0

    @property
    def gpsa_depth(self) -> int:
        """How many leading blocks run a ConViT's gated positional self-attention (up to where its class token joins,
        or all of them); 0 for a model without it."""
        return (self.class_token_joins or self.depth) if "gated positional" in self.attention_positions else 0

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


def _img_size_arg(img_size: int | tuple[int, int]) -> tuple[int, int]:
    """``img_size`` as (H, W): a positive int or a tuple or list of two (NumPy integers too; a string such as "88" is
    no pair), refused otherwise in the words of ``vitlab.models.config.size2``."""
    pair = (img_size, img_size) if isinstance(img_size, int) else img_size
    if (isinstance(img_size, (bool, str)) or not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(whole_index(v) for v in pair) or min(_pair(pair)) < 1):
        raise ValueError(f"img_size must be a positive int or a pair (H, W) of positive ints, got {img_size!r}")
    return _pair(pair)


@dataclass(frozen=True, eq=False)
class ResolvedModel:
    """A model resolved once where it enters vitlab: ``module``, the module a wrapper (``torch.compile``,
    ``nn.DataParallel``) runs, which the analyses read, hook and run; and its ``ModelInfo`` per input size
    (``info``), read on first use and kept. Every public analysis takes one in place of a model and passes it on;
    the facts are those of the model when first read (a model whose weights are later frozen or resized needs a new
    ``resolve_model``)."""

    module: nn.Module
    _infos: dict = field(default_factory=dict, repr=False)

    def info(self, img_size: int | tuple[int, int] | None = None) -> ModelInfo:
        """``model_info`` of the module for (H, W) inputs ``img_size`` (None: its own size), read once per size.
        Raises ``TypeError`` for a model that is no ViT (see ``model_info``)."""
        key = None if img_size is None else _img_size_arg(img_size)
        if key not in self._infos:
            self._infos[key] = _read_info(self.module, key)
        return self._infos[key]

    def info_for(self, images: torch.Tensor) -> ModelInfo:
        """``info`` for the size of a (B, C, H, W) batch ``images``."""
        return self.info(tuple(images.shape[-2:]))


#: what a public function takes as its model: a module (wrapped or not) or a ``ResolvedModel``
AnyModel = nn.Module | ResolvedModel


def resolve_model(model: AnyModel) -> ResolvedModel:
    """``model`` resolved: a ``ResolvedModel`` as it is; a module (also a compiled or DataParallel one,
    ``vitlab.base.modes.unwrapped``) held with its facts, read when first asked for. Anything else (a path, a name,
    None) raises ``TypeError`` saying how to load a model."""
    if isinstance(model, ResolvedModel):
        return model
    return ResolvedModel(unwrapped(model))


def model_info(model: AnyModel, img_size: int | tuple[int, int] | None = None) -> ModelInfo:
    """Facts about ``model``; ``img_size`` (H, W) gives the grid for inputs of another size. A ``ResolvedModel``
    answers from the facts it keeps.

    Raises ``TypeError`` for models without a patch embedding and transformer blocks (e.g. a ResNet).
    """
    if isinstance(model, ResolvedModel):
        return model.info(img_size)
    return _read_info(unwrapped(model), None if img_size is None else _img_size_arg(img_size))


def _read_info(model: nn.Module, img_size: tuple[int, int] | None) -> ModelInfo:
    """``model_info`` of the unwrapped ``model`` for an (H, W) size already checked (None: its own)."""
    pe = getattr(model, "patch_embed", None)
    blocks = getattr(model, "blocks", None)
    if pe is None and blocks is not None and hasattr(model, "embeds"):  # timm's NaFlexVit: a ViT all the same
        raise TypeError(
            f"{type(model).__name__} embeds its patches with timm's variable-resolution NaFlex embedding (`embeds`, "
            "patches placed by coordinates, not a patch_embed with one fixed grid), which vitlab does not read: its "
            "patch grid, prefix tokens and position embeddings are unknown to vitlab's analyses. Use the same model "
            "as a timm VisionTransformer (e.g. vit_base_patch16_siglip_224 for naflexvit_base_patch16_siglip); "
            "vitlab.attention_maps alone works on it"
        )
    if pe is None or blocks is None:
        raise TypeError(
            f"{type(model).__name__} is not a ViT-family model (it has no "
            f"{' and no '.join(n for n, v in (('patch_embed', pe), ('blocks', blocks)) if v is None)}); "
            "model_info describes timm VisionTransformer-like models"
        )
    hybrid = hasattr(pe, "backbone")
    pcfg = getattr(model, "pretrained_cfg", None) or {}
    default_img = _pair(getattr(pe, "img_size", None) or pcfg.get("input_size", (3, 224, 224))[-2:])
    size = default_img if img_size is None else img_size
    default_grid, patch = _default_grid_and_patch(pe, default_img, hybrid)
    padded = bool(getattr(pe, "dynamic_img_pad", False))  # timm's grid_size floors, its padded tokens ceil
    grid = default_grid if size == default_img and not padded else _grid_for(pe, size, patch)
    if min(grid) < 1:  # `vitlab info --img-size 2 2` described a 0x0 grid: an input no forward pass takes
        raise ValueError(f"img_size {size[0]}x{size[1]} is smaller than one {patch[0]}x{patch[1]} px patch: give at "
                         f"least {patch[0]}x{patch[1]}")

    n_prefix, n_cls, n_dist, n_reg = _prefix_counts(model)
    if class_token_never_joins(model):  # as timm counts it when it prunes such a ConViT's blocks
        n_prefix, n_cls = n_prefix - n_cls, 0
    pos = getattr(model, "pos_embed", None)
    if pos is None or not isinstance(pos, nn.Parameter):
        pos_kind, has_prefix = "none", False
    else:
        pos_kind = _pos_embed_kind(model, pos, default_grid)
        has_prefix = n_prefix > 0 and _pos_has_prefix(model, pos, n_prefix, default_grid)

    if getattr(model, "attn_pool", None) is not None:
        readout = "map"
    else:
        readout = str(getattr(model, "global_pool", "token") or "none")
    first = blocks[0]
    attn = getattr(first, "attn", None)
    heads = int(getattr(attn, "num_heads", 0) or 0)
    dim = int(getattr(model, "embed_dim", getattr(model, "num_features", 0)))
    return ModelInfo(
        architecture=str(pcfg.get("architecture", type(model).__name__)),
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
        readout_includes_prefix=bool(getattr(model, "pool_include_prefix", False)) and readout not in ("map", "token"),
        pool_reads_first_row=getattr(model, "global_pool", None) == "prr"
        and getattr(getattr(model, "attn_pool", None), "pool", None) == "token",
        pos_grid_size=default_grid,
        attention_positions=_attention_positions(model),
        class_token_joins=class_token_join(model),
    )


def has_attention(model: nn.Module) -> bool:
    """Whether any module of ``model`` is an attention layer (timm's ``Attention``, ``EvaAttention`` and kin, by class
    name): what separates a CNN from a ViT that ``model_info`` cannot read (e.g. timm's NaFlexVit)."""
    return any("attention" in type(m).__name__.lower() for m in model.modules())


def _attention_positions(model: nn.Module) -> tuple[str, ...]:
    """("rotary", "relative bias", "gated positional") as far as the model's attention encodes positions itself: a
    rotary embedding module (timm's ``RotaryEmbedding*``), a relative position bias table (BEiT's), gated positional
    self-attention (ConViT's GPSA: ``pos_proj`` of the relative offsets, mixed in by ``gating_param``)."""
    kinds = []
    if any("rotary" in type(m).__name__.lower() for m in model.modules()):
        kinds.append("rotary")
    if any(name.endswith("relative_position_bias_table") for name, _ in model.named_parameters()):
        kinds.append("relative bias")
    if any(hasattr(m, "pos_proj") and hasattr(m, "gating_param") for m in model.modules()):  # ConViT's GPSA
        kinds.append("gated positional")
    return tuple(kinds)


def _default_grid_and_patch(
    pe: nn.Module, default_img: tuple[int, int], hybrid: bool
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(gh, gw) of timm's ``grid_size`` at the model's own size (the layout of pos_embed's patch rows) and pixels per
    token side (a hybrid's: the backbone's total stride)."""
    grid = getattr(pe, "grid_size", None)
    if hybrid:
        grid = _pair(grid)
        if hasattr(pe, "feat_ratio"):
            return grid, _pair(pe.feat_ratio(as_scalar=False))
        return grid, (default_img[0] // grid[0], default_img[1] // grid[1])
    patch = _pair(pe.patch_size)
    if grid is not None:
        return _pair(grid), patch
    return _grid_for(pe, default_img, patch), patch


def _grid_for(pe: nn.Module, size: tuple[int, int], patch: tuple[int, int]) -> tuple[int, int]:
    """Tokens per side for an (H, W) input: timm's own rule when it has one (padding), a hybrid's feature map."""
    if hasattr(pe, "backbone"):
        return _hybrid_grid(pe, size)
    if hasattr(pe, "dynamic_feat_size"):
        return _pair(pe.dynamic_feat_size(size))
    return (size[0] // patch[0], size[1] // patch[1])


def _hybrid_grid(pe: nn.Module, size: tuple[int, int]) -> tuple[int, int]:
    """Tokens per side of a hybrid for an (H, W) input, read off its backbone's feature map for a zero image (as timm
    sizes the map when it builds one): timm's ``dynamic_feat_size`` divides by the built size's ratio, which floors
    where the backbone's padded convolutions round up (a stride-32 ResNet gives 3x3 cells at 72 px, not 2x2)."""
    from vitlab.base.modes import eval_mode

    ref = next(pe.parameters())
    chans = int(getattr(pe, "in_chans", None) or 3)
    with torch.no_grad(), eval_mode(pe):
        feat = pe.backbone(torch.zeros(1, chans, *size, device=ref.device, dtype=ref.dtype))
    feat = feat[-1] if isinstance(feat, (list, tuple)) else feat
    ph, pw = _pair(getattr(pe, "patch_size", 1))
    h, w = feat.shape[-2:]
    if getattr(pe, "dynamic_img_pad", False):
        return (-(-h // ph), -(-w // pw))
    return (h // ph, w // pw)


def _prefix_counts(model: nn.Module) -> tuple[int, int, int, int]:
    """(total, class, distillation, register) prefix tokens, in timm's order class, dist, registers."""
    n_cls = 1 if getattr(model, "cls_token", None) is not None else 0
    n_dist = 1 if getattr(model, "dist_token", None) is not None else 0
    n_prefix = int(getattr(model, "num_prefix_tokens", n_cls + n_dist))
    n_reg = int(getattr(model, "num_reg_tokens", 0) or 0)
    if not n_reg and getattr(model, "reg_token", None) is not None:
        n_reg = model.reg_token.shape[1]
    if n_cls + n_dist + n_reg != n_prefix:  # a family that counts differently: trust num_prefix_tokens
        n_reg = max(0, n_prefix - n_cls - n_dist)
    return n_prefix, n_cls, n_dist, n_reg


def _late_join(model: nn.Module) -> tuple[int, int] | None:
    """(``local_up_to_layer``, number of blocks) of a ConViT with a class token (timm's: the class token joins the
    patches before block ``local_up_to_layer``); None for any other model. ``model`` is the module itself (as
    ``ResolvedModel.module``), not a wrapper."""
    join, blocks = getattr(model, "local_up_to_layer", None), getattr(model, "blocks", None)
    if not whole_index(join) or getattr(model, "cls_token", None) is None or blocks is None:
        return None
    return operator.index(join), len(blocks)


def class_token_never_joins(model: nn.Module) -> bool:
    """Whether ``model`` is a ConViT no deeper than ``local_up_to_layer``: its blocks are all gated positional
    self-attention over the patches alone, and the class token it holds never reaches them."""
    late = _late_join(model)
    return late is not None and late[1] <= late[0]


def class_token_join(model: nn.Module) -> int:
    """The block before which a class token that joins late (a ConViT's ``local_up_to_layer``) joins the patches, or 0
    when it is there from the first block or never joins (a ConViT no deeper than ``local_up_to_layer``)."""
    late = _late_join(model)
    return late[0] if late is not None and 0 < late[0] < late[1] else 0


def _pos_has_prefix(model: nn.Module, pos: nn.Parameter, n_prefix: int, default_grid: tuple[int, int]) -> bool:
    """Rows for the prefix tokens: read from pos_embed's length at the model's own grid, else ``no_embed_class``."""
    n_patch = default_grid[0] * default_grid[1]
    if pos.shape[1] == n_prefix + n_patch:
        return True
    if pos.shape[1] == n_patch:
        return False
    return not bool(getattr(model, "no_embed_class", False))


def _pos_embed_kind(model: nn.Module, pos: nn.Parameter, grid: tuple[int, int]) -> str:
    """'fixed' or 'learn', from the vitlab config when there is one, else from the tensor itself.

    A frozen pos_embed is 'fixed' when it holds the 2D sin-cos table or when the rest of the model trains;
    a model frozen as a whole (``requires_grad_(False)`` for inspection) keeps a learned embedding: 'learn'.
    """
    cfg = getattr(model, "vitlab_config", None)
    cfg = getattr(cfg, "vit", cfg)
    if getattr(cfg, "pos_embed", None) in ("learn", "sincos"):
        return "fixed" if cfg.pos_embed == "sincos" else "learn"
    if pos.requires_grad:
        return "learn"
    if _is_sincos_table(pos, grid):
        return "fixed"
    others_train = any(p.requires_grad for p in model.parameters() if p is not pos)
    return "fixed" if others_train else "learn"


def _is_sincos_table(pos: torch.Tensor, grid: tuple[int, int]) -> bool:
    """Whether the patch rows (the last gh*gw) of pos_embed (1, N, D) are timm's 2D sin-cos table."""
    n, dim = grid[0] * grid[1], pos.shape[-1]
    if dim % 4 or pos.shape[1] < n:
        return False
    table = build_sincos2d_pos_embed(list(grid), dim=dim, device=pos.device).to(pos.dtype)
    return bool(torch.allclose(pos.detach()[0, -n:], table, atol=1e-5))


def architecture_words(model: AnyModel, info: ModelInfo) -> str:
    """The architecture as ``vitlab info`` and the report's facts both name it: the model's architecture name and
    its class, e.g. ``vitlab_vit (VisionTransformerDistilled)``; the name alone where it is the class's."""
    cls = type(resolve_model(model).module).__name__
    return info.architecture if info.architecture == cls else f"{info.architecture} ({cls})"


def attention_position_words(info: ModelInfo) -> str:
    """How the model's attention adds positions itself (rotary embeddings, a relative position bias, a ConViT's gated
    positional self-attention), as words; "" for none."""
    words = {"rotary": "rotary embeddings", "relative bias": "a relative position bias",
             "gated positional": "gated positional self-attention over relative offsets (ConViT's GPSA)"}
    return " and ".join(words.get(k, k) for k in info.attention_positions)
