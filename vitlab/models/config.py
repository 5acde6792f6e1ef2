"""The model zoo's configs, without torch: ``ViTConfig``, ``HybridConfig``, ``BiTConfig`` and ``CifarNetConfig``
(each checked when it is made), the paper's ViT names (``vit_config``), the CIFAR presets' shapes and the configs'
JSON form (``config_to_dict`` / ``config_from_dict``, as stored in checkpoints): their one home. ``vitlab.models.zoo``
builds them into timm modules; a training config (``vitlab.train.config``) and the command line read them without
loading torch or timm.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from vitlab.base.checks import check_choice, check_flag, check_int, check_real, plain_int
from vitlab.base.errors import ModelLoadError

__all__ = [
    "replace_fields",
    "VIT_SIZES",
    "CIFAR_MEAN",
    "CIFAR_STD",
    "CIFAR_PRE",
    "cifar_vit",
    "cifar_bit",
    "IMAGENET_INCEPTION",
    "Preprocess",
    "ViTConfig",
    "HybridConfig",
    "BiTConfig",
    "CifarNetConfig",
    "ModelConfig",
    "vit_config",
    "size2",
    "config_to_dict",
    "config_from_dict",
]

#: Table 1 of the paper (plus DeiT's Tiny and Small): width, depth, heads, MLP width.
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}

#: Preprocessing for models trained from scratch by vitlab unless a config says otherwise (CIFAR-10 statistics).
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_INCEPTION = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class Preprocess:
    """What the model expects at its input; becomes the timm ``pretrained_cfg``."""

    mean: tuple[float, float, float] = CIFAR_MEAN
    std: tuple[float, float, float] = CIFAR_STD
    interpolation: str = "bicubic"
    crop_pct: float = 1.0

    def __post_init__(self) -> None:
        for name in ("mean", "std"):
            v = getattr(self, name)
            if isinstance(v, list):  # from JSON
                object.__setattr__(self, name, v := tuple(v))
            check_channel_stats(name, v)
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}")
        check_real("crop_pct", self.crop_pct, lambda v: 0 < v <= 1,
                   "a number in (0, 1] (the fraction of the resized image kept)")


#: the resampling filters a preprocessing may name (timm's ``str_to_pil_interp``)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")


def _real(v: object) -> bool:
    """Whether ``v`` is a finite real number (an int or float; no bool, no string, no NaN or infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_channel_stats(name: str, v: object) -> None:
    """Refuse, by ``name``, a per-channel mean or std that is not a non-empty sequence of finite numbers (a std must
    also be positive: the input is divided by it)."""
    ok = isinstance(v, (tuple, list)) and len(v) > 0 and all(_real(x) for x in v)
    if not ok or (name == "std" and not all(x > 0 for x in v)):
        what = "positive finite numbers" if name == "std" else "finite numbers"
        raise ValueError(f"{name} must be a list of {what}, one per input channel, got {v!r}")


def check_rate(name: str, v: object) -> None:
    """Refuse, by ``name``, a dropout or drop-path probability that is not a number in [0, 1)."""
    check_real(name, v, lambda p: 0 <= p < 1, "a probability in [0, 1)")


#: The preprocessing of the 32 px models vitlab trains on CIFAR (its statistics, bicubic, no crop): a property of
#: the data the models see, stored with every checkpoint.
CIFAR_PRE = Preprocess(mean=CIFAR_MEAN, std=CIFAR_STD, interpolation="bicubic", crop_pct=1.0)


def replace_fields(obj: Any, changes: dict[str, Any]) -> Any:
    """``obj`` (a frozen config dataclass) with ``changes`` applied: field names, dotted for nested groups (``{"vit.depth":
    2}`` of a HybridConfig). All changes to one config are made in one ``dataclasses.replace``, so fields that must
    agree (``embed_dim`` and ``num_heads``) can change together. KeyError naming the fields there when a name does not
    exist or ends at a group of settings; the config's own error when the values are bad."""
    names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
    here: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if head not in names:
            raise KeyError(f"{type(obj).__name__} has no field {key!r}; its fields: {', '.join(names)}")
        sub = getattr(obj, head)
        if rest:
            nested.setdefault(head, {})[rest] = value
        elif dataclasses.is_dataclass(sub) and not dataclasses.is_dataclass(value):
            raise KeyError(f"{key} is a group of settings ({type(sub).__name__}); set one of its fields: "
                           f"{', '.join(f.name for f in dataclasses.fields(sub))}")
        else:
            here[head] = value
    for head, sub_changes in nested.items():
        here[head] = replace_fields(here.get(head, getattr(obj, head)), sub_changes)
    return dataclasses.replace(obj, **here) if here else obj


def size2(v: int | tuple[int, int] | list[int], what: str = "img_size") -> tuple[int, int]:
    """``v`` as (H, W) of positive ints; a clear ValueError otherwise."""
    try:
        pair = (v, v) if isinstance(v, int) else tuple(v)
    except TypeError:  # 64.0, None: not iterable
        pair = ()
    if len(pair) != 2 or not all(plain_int(s, 1) for s in pair):
        raise ValueError(f"{what} must be a positive int or a pair (H, W) of positive ints, got {v!r}")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class ViTConfig:
    """One member of the ViT family. ``vit_config("B/16")`` gives the paper's ViT-B/16.

    ``img_size`` is an int (square) or (H, W); each side must be a whole number of patches.

    The classification head is a single linear layer (timm's ``head``), the paper's fine-tuning head; the MLP with
    one hidden layer that the paper's section 3.1 uses at pre-training time is not built, so a model trained here
    from scratch learns with the linear head (timm's layout, tensor for tensor).
    """

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    patch_size: int = 16
    img_size: int | tuple[int, int] = 224
    num_classes: int = 1000
    in_chans: int = 3
    readout: Literal["token", "avg"] = "token"
    pos_embed: Literal["learn", "sincos", "none"] = "learn"
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    preprocess: Preprocess = Preprocess(mean=IMAGENET_INCEPTION, std=IMAGENET_INCEPTION)
    #: DeiT's distillation token (timm ``VisionTransformerDistilled``): two prefix tokens, two heads whose
    #: logits are averaged at evaluation. Needs ``readout="token"``.
    distilled: bool = False
    #: fraction of patch tokens dropped at random in training only (timm ``PatchDropout``); eval sees all
    patch_drop_rate: float = 0.0
    #: how the attention weights start: timm's (truncated normal), "mimetic" (``vitlab.models.mimetic``: query-key products
    #: near the identity, value-projection near its negative; Trockman & Kolter 2023) or "mimetic_qk" (the
    #: query-key half alone). Only a fresh model's weights differ; a loaded checkpoint replaces them.
    init: Literal["timm", "mimetic", "mimetic_qk"] = "timm"

    def __post_init__(self) -> None:
        if isinstance(self.img_size, list):  # from JSON
            object.__setattr__(self, "img_size", tuple(self.img_size))
        for name in ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "in_chans"):
            check_int(name, getattr(self, name), 1, allowed="a positive int")
        check_int("num_classes", self.num_classes, 0, allowed="an int >= 0 (0: no head)")
        h, w = size2(self.img_size)
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"img_size={self.img_size} is not a multiple of patch_size={self.patch_size}: "
                "pick sizes so the image splits into whole patches"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
        check_choice("readout", self.readout, ("token", "avg"))
        check_choice("pos_embed", self.pos_embed, ("learn", "sincos", "none"))
        if self.pos_embed == "sincos" and self.embed_dim % 4:
            raise ValueError(f"2D sin-cos position embeddings need embed_dim divisible by 4, got {self.embed_dim}")
        check_flag("distilled", self.distilled)
        if self.distilled and self.readout != "token":
            raise ValueError("distilled=True reads the class and distillation tokens: use readout='token'")
        for name in ("drop_rate", "drop_path_rate", "patch_drop_rate"):
            check_rate(name, getattr(self, name))
        if not isinstance(self.preprocess, Preprocess):
            raise ValueError(f"preprocess must be a Preprocess, got {self.preprocess!r}")
        check_choice("init", self.init, ("timm", "mimetic", "mimetic_qk"))


def _check_head(num_classes: object, in_chans: object) -> None:
    """A CNN config's class count (0: no head) and input channels."""
    check_int("num_classes", num_classes, 0, allowed="an int >= 0")
    check_int("in_chans", in_chans, 1, allowed="an int >= 1")


def _check_resnet(layers: tuple[int, ...], stem: str) -> None:
    if not layers or not all(plain_int(n, 1) for n in layers):
        raise ValueError(f"layers must be a non-empty tuple of block counts >= 1, got {layers!r}")
    if stem not in ("imagenet", "cifar"):
        raise ValueError(f"stem must be 'imagenet' (7x7/2 conv + max pool) or 'cifar' (3x3/1 conv), got {stem!r}")


def _make_divisible(v: float, divisor: int = 8) -> int:
    """timm's ``timm.layers.make_divisible`` (the width ``ResNetV2`` builds for ``v`` channels), here so that a config
    is checked without loading timm: the nearest multiple of ``divisor``, at least ``divisor`` and never more than
    10% below ``v``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _check_widths(layers: tuple[int, ...], channels: tuple[int, ...] | None, k: int | None, bottleneck: bool,
                  width_factor: int = 1) -> None:
    """Stage widths and GroupNorm grouping of a ResNet-v2 (the BiT baseline and a hybrid's backbone), checked before
    anything is built: every normalised width (the stem's, each stage's and, in bottleneck blocks, the middle width
    of a quarter of the stage's, as timm builds them) must split into BiT's 32 groups, or hold at least k channels
    with ``gn_min_channels_per_group=k``."""
    check_int("gn_min_channels_per_group", k, 1, allowed="None or a positive int", none=True)
    if channels is not None and len(channels) != len(layers):
        raise ValueError(f"channels must give one width per stage ({len(layers)}), got {channels!r}")
    outs = [_make_divisible(c * width_factor) for c in (channels or [256 * 2**i for i in range(len(layers))])]
    stem = _make_divisible(64 * width_factor) if bottleneck else outs[0]  # timm's default stem; basic: channels[0]
    mids = [_make_divisible(o * 0.25) for o in outs] if bottleneck else []
    # as declared too (times the width factor): timm rounds a narrow width up to 8 where the config says another
    widths = sorted({stem, *outs, *mids, *(c * width_factor for c in channels or ())})
    what = f"channels {channels!r}" + (f" (bottleneck middle widths {mids})" if bottleneck else "")
    if k is None and any(w % 32 for w in widths):
        raise ValueError(f"{what}: every normalised width must be a multiple of 32 with BiT's 32 GroupNorm groups, "
                         f"got {[w for w in widths if w % 32]}: widen the stages (channels must be multiples of 32 "
                         f"with BiT's 32 GroupNorm groups{', bottleneck stages of 128' if bottleneck else ''}) or set "
                         "gn_min_channels_per_group (e.g. 8) to size the groups by width")
    if k is not None and min(widths) < k:
        raise ValueError(f"{what}: every width must hold at least {k} channels (gn_min_channels_per_group), got "
                         f"{min(widths)}")


@dataclass(frozen=True)
class HybridConfig:
    """R?+ViT: a ResNet stem and stages (GroupNorm, weight-standardised convolutions, post-activation bottlenecks:
    timm's ``ResNetV2`` built with ``preact=False``) whose feature map is cut into 1x1 patches (paper section 3.1)."""

    vit: ViTConfig = ViTConfig()  # vit.patch_size is the backbone's total stride
    #: R50 hybrid (paper section 4.1, option (ii)): ResNet-50 (3, 4, 6, 3) with stage 4 removed and its 3 blocks
    #: placed in stage 3, keeping the 16 blocks; the extended stage 3's output (stride 16) is the token grid
    layers: tuple[int, ...] = (3, 4, 9)
    stem: Literal["imagenet", "cifar"] = "imagenet"
    #: backbone stage widths (None: ResNet-50's 256, 512, 1024 bottleneck stages) and GroupNorm grouping (None: BiT's
    #: 32 groups; k: at least k channels per group), for narrow hybrids on small images
    channels: tuple[int, ...] | None = None
    gn_min_channels_per_group: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        if isinstance(self.channels, list):
            object.__setattr__(self, "channels", tuple(self.channels))
        _check_resnet(self.layers, self.stem)
        _check_widths(self.layers, self.channels, self.gn_min_channels_per_group, bottleneck=True)
        stride = _resnet_stride(self.layers, self.stem)
        if stride != self.vit.patch_size:
            raise ValueError(
                f"the backbone with layers={self.layers} and stem={self.stem!r} has stride {stride}, "
                f"so vit.patch_size must be {stride} (got {self.vit.patch_size})"
            )


@dataclass(frozen=True)
class BiTConfig:
    """A BiT-style ResNet-v2 (pre-activation, GroupNorm, weight-standardised convolutions)."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # ResNet-50
    width_factor: int = 1
    channels: tuple[int, ...] | None = None  # stage output widths; None: 256, 512, 1024, ... (bottleneck)
    basic: bool = False  # two 3x3 convolutions per block (ResNet-18/34 style) instead of bottlenecks
    num_classes: int = 1000
    in_chans: int = 3
    img_size: int = 224
    stem: Literal["imagenet", "cifar"] = "imagenet"
    drop_path_rate: float = 0.0
    preprocess: Preprocess = Preprocess(mean=IMAGENET_INCEPTION, std=IMAGENET_INCEPTION)
    #: GroupNorm grouping. None: BiT's 32 groups everywhere (channels must be multiples of 32; at 32 channels that
    #: is one channel per group, InstanceNorm). An int k: at least k channels per group at every width (the largest
    #: divisor of the width up to min(32, width // k)), which keeps narrow ResNets normalising over groups.
    gn_min_channels_per_group: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        _check_resnet(self.layers, self.stem)
        if isinstance(self.channels, list):
            object.__setattr__(self, "channels", tuple(self.channels))
        check_int("width_factor", self.width_factor, 1, allowed="a positive int")
        check_flag("basic", self.basic)
        _check_widths(self.layers, self.channels, self.gn_min_channels_per_group, bottleneck=not self.basic,
                      width_factor=self.width_factor)
        size2(self.img_size)
        _check_head(self.num_classes, self.in_chans)
        check_rate("drop_path_rate", self.drop_path_rate)
        if not isinstance(self.preprocess, Preprocess):
            raise ValueError(f"preprocess must be a Preprocess, got {self.preprocess!r}")


@dataclass(frozen=True)
class CifarNetConfig:
    """The fast residual CNN of ``vitlab.models.cifarnet`` (whitening stem, three residual stages, BatchNorm)."""

    widths: tuple[int, ...] = (64, 256, 256)
    num_classes: int = 10
    in_chans: int = 3
    img_size: int = 32
    whiten_kernel: int = 2
    logit_scale: float = 1 / 9
    residual: bool = True  # each stage's second conv as a residual branch (x + f(x)); False: airbench94's plain chain
    whiten_fp32: bool = False  # the whitening stem in float32 under bf16 autocast (bf16 blurs its small-eigenvalue outputs)
    preprocess: Preprocess = Preprocess()

    def __post_init__(self) -> None:
        if isinstance(self.widths, list):
            object.__setattr__(self, "widths", tuple(self.widths))
        if not self.widths or not all(plain_int(w, 1) for w in self.widths):
            raise ValueError(f"widths must be a non-empty tuple of positive ints, got {self.widths!r}")
        for flag in ("residual", "whiten_fp32"):
            check_flag(flag, getattr(self, flag))
        check_int("whiten_kernel", self.whiten_kernel, 1, allowed="a positive int")
        size2(self.img_size)
        _check_head(self.num_classes, self.in_chans)
        check_real("logit_scale", self.logit_scale, lambda v: v > 0, "a positive finite number")
        if not isinstance(self.preprocess, Preprocess):
            raise ValueError(f"preprocess must be a Preprocess, got {self.preprocess!r}")


def cifar_vit(**overrides: Any) -> ViTConfig:
    """A ViT for 32 px images with CIFAR preprocessing; by default ViT-Lite-7/4 of Hassani et al. (CCT paper):
    4 px patches (an 8 x 8 grid), 7 blocks, width 256, 4 heads, MLP 512, drop-path 0.1, 10 classes."""
    base: dict[str, Any] = dict(embed_dim=256, depth=7, num_heads=4, mlp_dim=512, patch_size=4, img_size=32,
                                num_classes=10, drop_path_rate=0.1, preprocess=CIFAR_PRE)
    return ViTConfig(**{**base, **overrides})


def cifar_bit(**overrides: Any) -> BiTConfig:
    """A BiT-style ResNet for 32 px images (3x3 stride-1 stem, CIFAR preprocessing); by default a pre-activation
    ResNet-18 at half width (basic blocks, widths 32/64/128/256), 10 classes."""
    base: dict[str, Any] = dict(layers=(2, 2, 2, 2), channels=(32, 64, 128, 256), basic=True, num_classes=10,
                                img_size=32, stem="cifar", preprocess=CIFAR_PRE)
    return BiTConfig(**{**base, **overrides})


ModelConfig = ViTConfig | HybridConfig | BiTConfig | CifarNetConfig
_KINDS: dict[str, type] = {"vit": ViTConfig, "hybrid": HybridConfig, "bit": BiTConfig, "cifarnet": CifarNetConfig}


def vit_config(name: str = "B/16", **overrides: Any) -> ViTConfig:
    """The paper's naming: ``"B/16"``, ``"L/32"``, ``"Ti/4"`` (any patch size) plus field overrides."""
    try:
        size, patch = name.split("/")
        width, depth, heads, mlp = VIT_SIZES[size]
        patch_size = int(patch)
        if patch_size < 1:
            raise ValueError
    except (ValueError, KeyError, AttributeError):
        raise ValueError(
            f"unknown ViT name {name!r}: use SIZE/PATCH with SIZE in {list(VIT_SIZES)} and a positive patch "
            "size, e.g. 'B/16' or 'Ti/4'"
        ) from None
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"unknown ViTConfig fields {unknown}; valid fields: {sorted(fields)}")
    values = dict(embed_dim=width, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch_size)
    values.update(overrides)
    return ViTConfig(**values)



def _resnet_stride(layers: tuple[int, ...], stem: str) -> int:
    """Total stride of stem + stages: the stem gives 4 (imagenet) or 1 (cifar), every stage after the first 2."""
    stem_stride = 4 if stem == "imagenet" else 1
    return stem_stride * 2 ** (len(layers) - 1)


# ---------------------------------------------------------------------------------------------- config <-> json


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """JSON-ready dict: ``{"kind": "vit" | "hybrid" | "bit" | "cifarnet", **fields}``."""
    kind = {v: k for k, v in _KINDS.items()}[type(cfg)]
    return {"kind": kind, **dataclasses.asdict(cfg)}


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Inverse of ``config_to_dict``; any problem is a ``ModelLoadError`` naming it."""
    if not isinstance(d, dict):
        raise ModelLoadError(f"checkpoint config must be a JSON object, got {type(d).__name__}")
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in _KINDS:
        raise ModelLoadError(f"checkpoint config has kind={kind!r}; expected one of {sorted(_KINDS)}")
    try:
        return _from_fields(_KINDS[kind], d)
    except (TypeError, ValueError, AttributeError) as e:
        raise ModelLoadError(f"checkpoint config for a {kind!r} model is invalid: {e}") from None


def _from_fields(cls: type, d: dict[str, Any]) -> Any:
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__} fields must be a JSON object, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ModelLoadError(f"checkpoint config has unknown fields {sorted(unknown)} for {cls.__name__}")
    out = {}
    for name, v in d.items():
        if name == "preprocess":
            v = _from_fields(Preprocess, v)
        elif name == "vit":
            v = _from_fields(ViTConfig, v)
        elif isinstance(v, list):
            v = tuple(v)
        out[name] = v
    return cls(**out)
