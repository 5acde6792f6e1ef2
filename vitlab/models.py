"""The paper's model zoo, built through timm, and one loader for every kind of model spec.

Three families, each described by a small frozen config:

* ``ViTConfig``    the ViT family of Table 1 (Ti/S/B/L/H, any patch size and resolution), class-token or
                   global-average-pool readout, learned 1D, fixed 2D sin-cos or no position embedding.
* ``HybridConfig`` a ResNet (v2, GroupNorm + weight standardisation) feature map cut into 1x1 patches
                   and fed to a ViT (paper section 3.1, "Hybrid Architecture").
* ``BiTConfig``    BiT-style ResNet baselines (pre-activation ResNet-v2, GroupNorm, StdConv).

Every model is a plain timm module (``VisionTransformer`` or ``ResNetV2``), so timm's named stages
(``forward_features``, ``forward_head(pre_logits=True)``) and ``timm.data.resolve_data_config`` work on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from timm.layers import GroupNormAct, HybridEmbed, StdConv2d, resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models import VisionTransformer
from timm.models.resnetv2 import ResNetV2
from torch import nn

__all__ = [
    "VIT_SIZES",
    "ViTConfig",
    "HybridConfig",
    "BiTConfig",
    "ModelLoadError",
    "build_model",
    "vit_config",
    "load_model",
    "save_checkpoint",
    "resize_for_finetuning",
    "DEFAULT_CHECKPOINT",
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

#: Where the embedded default model lives (shipped by the training work; see data/checkpoints/README.md).
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "data" / "checkpoints" / "vit_cifar10"

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_NAME = "vitlab-checkpoint"
FORMAT_VERSION = 1
#: Keys of config.json that ``save_checkpoint(extra=...)`` may not overwrite.
RESERVED_META_KEYS = frozenset({"format", "format_version", "config", "pretrained_cfg", "versions", "path"})


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""


@dataclass(frozen=True)
class Preprocess:
    """What the model expects at its input; becomes the timm ``pretrained_cfg``."""

    mean: tuple[float, float, float] = CIFAR_MEAN
    std: tuple[float, float, float] = CIFAR_STD
    interpolation: str = "bicubic"
    crop_pct: float = 1.0


def _size2(v: int | tuple[int, int] | list[int], what: str = "img_size") -> tuple[int, int]:
    """``v`` as (H, W) of positive ints; a clear ValueError otherwise."""
    pair = (v, v) if isinstance(v, int) else tuple(v)
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in pair):
        raise ValueError(f"{what} must be a positive int or a pair (H, W) of positive ints, got {v!r}")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class ViTConfig:
    """One member of the ViT family. ``vit_config("B/16")`` gives the paper's ViT-B/16.

    ``img_size`` is an int (square) or (H, W); each side must be a whole number of patches.
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

    def __post_init__(self) -> None:
        if isinstance(self.img_size, list):  # from JSON
            object.__setattr__(self, "img_size", tuple(self.img_size))
        for name in ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "in_chans"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise ValueError(f"num_classes must be an int >= 0 (0: no head), got {self.num_classes!r}")
        h, w = _size2(self.img_size)
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"img_size={self.img_size} is not a multiple of patch_size={self.patch_size}: "
                "pick sizes so the image splits into whole patches"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
        if self.readout not in ("token", "avg"):
            raise ValueError(f"readout must be 'token' or 'avg', got {self.readout!r}")
        if self.pos_embed not in ("learn", "sincos", "none"):
            raise ValueError(f"pos_embed must be 'learn', 'sincos' or 'none', got {self.pos_embed!r}")
        if self.pos_embed == "sincos" and self.embed_dim % 4:
            raise ValueError(f"2D sin-cos position embeddings need embed_dim divisible by 4, got {self.embed_dim}")


def _check_resnet(layers: tuple[int, ...], stem: str) -> None:
    if not layers or not all(isinstance(n, int) and n >= 1 for n in layers):
        raise ValueError(f"layers must be a non-empty tuple of block counts >= 1, got {layers!r}")
    if stem not in ("imagenet", "cifar"):
        raise ValueError(f"stem must be 'imagenet' (7x7/2 conv + max pool) or 'cifar' (3x3/1 conv), got {stem!r}")


@dataclass(frozen=True)
class HybridConfig:
    """R?+ViT: a ResNet-v2 stem and stages whose feature map is cut into 1x1 patches (paper section 3.1)."""

    vit: ViTConfig = ViTConfig()  # vit.patch_size is the backbone's total stride
    layers: tuple[int, ...] = (3, 4, 9)  # R50 hybrid: the first three stages of ResNet-50
    stem: Literal["imagenet", "cifar"] = "imagenet"

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        _check_resnet(self.layers, self.stem)
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

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        _check_resnet(self.layers, self.stem)
        if isinstance(self.channels, list):
            object.__setattr__(self, "channels", tuple(self.channels))
        if self.channels is not None and (len(self.channels) != len(self.layers) or min(self.channels) < 32
                                          or any(c % 32 for c in self.channels)):
            raise ValueError(f"channels must give one width per stage ({len(self.layers)}), each a multiple of 32 "
                             f"(GroupNorm has 32 groups), got {self.channels!r}")
        if not isinstance(self.width_factor, int) or self.width_factor < 1:
            raise ValueError(f"width_factor must be a positive int, got {self.width_factor!r}")
        _size2(self.img_size)


ModelConfig = ViTConfig | HybridConfig | BiTConfig
_KINDS: dict[str, type] = {"vit": ViTConfig, "hybrid": HybridConfig, "bit": BiTConfig}


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


# ---------------------------------------------------------------------------------------------- build


def _resnet_stride(layers: tuple[int, ...], stem: str) -> int:
    """Total stride of stem + stages: the stem gives 4 (imagenet) or 1 (cifar), every stage after the first 2."""
    stem_stride = 4 if stem == "imagenet" else 1
    return stem_stride * 2 ** (len(layers) - 1)


def _resnet_v2(layers: tuple[int, ...], stem: str, preact: bool, channels: tuple[int, ...] | None = None,
               basic: bool = False, **kwargs: Any) -> ResNetV2:
    """A BiT-style ResNet-v2 (StdConv2d + GroupNorm(32)); the 'cifar' stem keeps full resolution."""
    channels = channels or tuple(256 * 2**i for i in range(len(layers)))
    if basic:
        kwargs.update(basic=True, bottle_ratio=1.0, stem_chs=channels[0])
    model = ResNetV2(
        layers=list(layers),
        channels=channels,
        preact=preact,
        stem_type="fixed" if stem == "imagenet" else "",
        conv_layer=partial(StdConv2d, eps=1e-8),
        norm_layer=partial(GroupNormAct, num_groups=32),
        **kwargs,
    )
    if stem == "cifar":  # 32 px images: a 3x3 stride-1 stem instead of 7x7/2 conv + 3x3/2 max pool
        stem_chs = model.stem.conv.out_channels
        model.stem = nn.Sequential()
        model.stem.add_module("conv", StdConv2d(kwargs.get("in_chans", 3), stem_chs, 3, stride=1, padding=1, eps=1e-8))
        if not preact:
            model.stem.add_module("norm", GroupNormAct(stem_chs, num_groups=32))
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
        mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        class_token=cfg.readout == "token",
        global_pool=cfg.readout,
        pos_embed="none" if cfg.pos_embed == "none" else "learn",
        drop_rate=cfg.drop_rate,
        drop_path_rate=cfg.drop_path_rate,
    )


def _pretrained_cfg(arch: str, img_size: int | tuple[int, int], in_chans: int, num_classes: int,
                    pre: Preprocess, first_conv: str, classifier: str) -> dict[str, Any]:
    """The timm ``pretrained_cfg`` that ``timm.data.resolve_data_config`` reads the preprocessing from."""
    return dict(
        architecture=arch,
        input_size=(in_chans, *_size2(img_size)),
        mean=tuple(pre.mean),
        std=tuple(pre.std),
        interpolation=pre.interpolation,
        crop_pct=pre.crop_pct,
        crop_mode="center",
        num_classes=num_classes,
        first_conv=first_conv,
        classifier=classifier,
    )


def _sincos_grid(grid: tuple[int, int], dim: int, like: torch.Tensor) -> torch.Tensor:
    """(gh*gw, D) fixed 2D sin-cos table, rows in the patch order (row-major over the grid)."""
    return build_sincos2d_pos_embed(list(grid), dim=dim, device=like.device).to(like.dtype)


def _set_sincos(model: VisionTransformer) -> None:
    """Fixed 2D sin-cos position embedding (Table 8's "2-D" variant without learning); prefix rows are zero."""
    gh, gw = model.patch_embed.grid_size
    pe = torch.zeros_like(model.pos_embed)  # (1, prefix + gh*gw, D)
    pe[0, pe.shape[1] - gh * gw :] = _sincos_grid((gh, gw), model.embed_dim, pe)
    model.pos_embed = nn.Parameter(pe, requires_grad=False)


def _build_vit(cfg: ViTConfig, embed_layer: Any = None) -> VisionTransformer:
    kwargs = _vit_kwargs(cfg)
    if embed_layer is not None:
        kwargs.update(patch_size=1, embed_layer=embed_layer)
    model = VisionTransformer(**kwargs)
    if cfg.pos_embed == "sincos":
        _set_sincos(model)
    return model


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build a randomly initialised model from a config. The config is attached as ``model.vitlab_config``."""
    if isinstance(cfg, ViTConfig):
        model = _build_vit(cfg)
        pcfg = _pretrained_cfg("vitlab_vit", cfg.img_size, cfg.in_chans, cfg.num_classes, cfg.preprocess,
                               "patch_embed.proj", "head")
    elif isinstance(cfg, HybridConfig):
        backbone = _resnet_v2(cfg.layers, cfg.stem, preact=False, num_classes=0, global_pool="",
                              in_chans=cfg.vit.in_chans)
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
        )
        pcfg = _pretrained_cfg("vitlab_bit", cfg.img_size, cfg.in_chans, cfg.num_classes, cfg.preprocess,
                               "stem.conv", "head.fc")
    else:
        raise TypeError(f"expected ViTConfig, HybridConfig or BiTConfig, got {type(cfg).__name__}")
    model.pretrained_cfg = pcfg
    model.default_cfg = model.pretrained_cfg
    model.vitlab_config = cfg
    return model


# ---------------------------------------------------------------------------------------------- config <-> json


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """JSON-ready dict: ``{"kind": "vit" | "hybrid" | "bit", **fields}``."""
    kind = {ViTConfig: "vit", HybridConfig: "hybrid", BiTConfig: "bit"}[type(cfg)]
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
            v = Preprocess(**{k: tuple(x) if isinstance(x, list) else x for k, x in v.items()})
        elif name == "vit":
            v = _from_fields(ViTConfig, v)
        elif isinstance(v, list):
            v = tuple(v)
        out[name] = v
    return cls(**out)


# ---------------------------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    extra: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model.safetensors`` + ``config.json`` into ``directory`` atomically.

    Both files are written to a temporary folder beside ``directory`` and moved into place by renames, so
    a crash leaves either the previous checkpoint or the new one, never a mix; if the save fails, the
    previous checkpoint is put back. (Folders cannot be swapped in one rename: a hard crash between the
    two renames leaves the previous checkpoint complete in a hidden ``.NAME.old.*`` folder beside it.) ``directory`` is replaced as a whole, so it must be new, empty or a
    vitlab checkpoint. ``dtype`` (e.g. ``torch.float16``) converts floating-point tensors for a smaller
    file. ``extra`` (JSON-serialisable) is stored in config.json and comes back as ``model.vitlab_checkpoint``.
    """
    cfg = getattr(model, "vitlab_config", None)
    if cfg is None:
        raise ValueError(
            "this model has no vitlab config (it was not built by vitlab.build_model); "
            "save timm models with timm's own tools, or build the model with vitlab.build_model"
        )
    directory = Path(directory)
    _check_replaceable(directory)
    text = _meta_json(model, cfg, extra)
    state = _state_for_saving(model, dtype)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp.", dir=directory.parent))
    try:
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(text)
        _swap_in(tmp, directory)
    finally:
        _rmtree(tmp)  # gone already after a successful swap
    return directory


def _check_replaceable(directory: Path) -> None:
    """Refuse to replace a file or a folder that holds something other than a vitlab checkpoint."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise FileExistsError(f"{directory} exists and is not a folder; save_checkpoint writes a folder")
    if any(directory.iterdir()) and not _is_checkpoint_dir(directory):
        raise FileExistsError(
            f"{directory} is a non-empty folder without a vitlab checkpoint; save_checkpoint replaces the "
            "whole folder, so give it a new or empty folder (or a previous checkpoint's folder)"
        )


def _is_checkpoint_dir(directory: Path) -> bool:
    try:
        meta = json.loads((directory / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME


def _meta_json(model: nn.Module, cfg: ModelConfig, extra: dict[str, Any] | None) -> str:
    """config.json's text; checked before anything is written so a bad ``extra`` cannot half-save."""
    extra = dict(extra or {})
    clash = sorted(RESERVED_META_KEYS & set(extra))
    if clash:
        raise ValueError(f"extra may not use the reserved keys {clash}")
    pcfg = getattr(model, "pretrained_cfg", None) or {}
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "config": config_to_dict(cfg),
        "pretrained_cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in pcfg.items()},
        "versions": {"torch": torch.__version__, "timm": timm.__version__},
        **extra,
    }
    try:
        return json.dumps(meta, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra must be JSON-serialisable: {e}") from None


def _state_for_saving(model: nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous copies of the state dict; floating-point tensors cast to ``dtype`` when given."""
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype such as torch.float16, got {dtype}")
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[k] = v.contiguous()
    return state


def _swap_in(tmp: Path, directory: Path) -> None:
    """Move ``tmp`` to ``directory`` by renames; on failure the previous ``directory`` is restored."""
    old = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
        old.rmdir()  # only the unique name is wanted: os.replace needs the target not to exist
        os.replace(directory, old)
    try:
        os.replace(tmp, directory)
    except BaseException:
        if old is not None and not directory.exists():
            os.replace(old, directory)
        raise
    if old is not None:
        _rmtree(old)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_meta(cfg_file: Path) -> dict[str, Any]:
    try:
        meta = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e}); the checkpoint is damaged") from None
    if not isinstance(meta, dict) or "config" not in meta:
        raise ModelLoadError(f"{cfg_file} has no 'config' entry; the checkpoint is damaged or not from vitlab")
    version = meta.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ModelLoadError(
            f"{cfg_file} has format_version={version!r}, newer than this vitlab reads ({FORMAT_VERSION}); "
            "upgrade vitlab"
        )
    return meta


def _read_weights(weights: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(weights))
    except Exception as e:  # safetensors raises its own error type for damaged files
        raise ModelLoadError(
            f"{weights} could not be read ({type(e).__name__}: {e}); the checkpoint is damaged"
        ) from None


def _check_state(state: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], weights: Path) -> None:
    """Same keys and shapes as the model built from the config, or a ModelLoadError listing the differences."""
    missing = sorted(set(ref) - set(state))
    unexpected = sorted(set(state) - set(ref))
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(ref[k].shape)}"
              for k in ref if k in state and state[k].shape != ref[k].shape]
    if missing or unexpected or shapes:
        raise ModelLoadError(
            f"{weights} does not match its {CONFIG_NAME}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"shape mismatches {shapes[:5]} (first 5 of each shown); the checkpoint is damaged or its files "
            "come from different saves"
        )


def _load_vitlab_checkpoint(path: Path) -> nn.Module:
    directory = path if path.is_dir() else path.parent
    cfg_file, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not cfg_file.is_file() or not weights.is_file():
        raise ModelLoadError(
            f"{directory} is not a vitlab checkpoint: it needs both {CONFIG_NAME} and {WEIGHTS_NAME} "
            "(as written by vitlab.save_checkpoint); for a timm weights file use "
            "vitlab.load_model('<timm name>', weights=path)"
        )
    meta = _read_meta(cfg_file)
    model = build_model(config_from_dict(meta["config"]))
    ref = model.state_dict()
    state = _read_weights(weights)
    _check_state(state, ref, weights)
    model.load_state_dict({k: v.to(ref[k].dtype) for k, v in state.items()}, strict=True)
    if isinstance(meta.get("pretrained_cfg"), dict):
        pc = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["pretrained_cfg"].items()}
        model.pretrained_cfg = model.default_cfg = pc
    model.vitlab_checkpoint = {k: v for k, v in meta.items() if k not in ("config", "pretrained_cfg")}
    model.vitlab_checkpoint["path"] = str(directory)
    return model.eval()


# ---------------------------------------------------------------------------------------------- loading

_HUB_PREFIXES = ("hf-hub:", "hf_hub:")


def load_model(spec: str | os.PathLike | ModelConfig | None = None, *, pretrained: bool = True,
               weights: str | os.PathLike | None = None, **overrides: Any) -> nn.Module:
    """Return a model in eval mode from any spec.

    * ``None``: the embedded default model shipped in ``data/checkpoints``.
    * a path to a vitlab checkpoint (its folder, ``config.json`` or ``model.safetensors``).
    * a ``ViTConfig`` / ``HybridConfig`` / ``BiTConfig``: a freshly initialised model (``overrides``
      replace config fields).
    * a timm model name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``, or ``"hf-hub:org/name"``):
      built by timm; with ``pretrained=True`` the weights come from the hub, or from a local file given as
      ``weights=`` (``.safetensors``, or ``.bin``/``.pth`` read with ``weights_only=True``, never
      unpickling code). A weights file decides the number of classes unless ``num_classes`` is given;
      a different ``num_classes`` gets a fresh head, as timm does for hub weights.

    For timm names ``overrides`` go to ``timm.create_model`` (e.g. ``img_size=384``, ``num_classes=10``,
    ``dynamic_img_size=True``). Every failure is a ``ModelLoadError`` saying why and what to do.
    """
    if spec is None:
        _no_extras("the default model", weights, overrides)
        if not (DEFAULT_CHECKPOINT / WEIGHTS_NAME).is_file():
            raise ModelLoadError(
                f"the embedded default model is not in this checkout ({DEFAULT_CHECKPOINT} has no {WEIGHTS_NAME}). "
                "Train it with `vitlab train --preset vit_cifar10` or pass a model: "
                "vitlab.load_model('vit_base_patch16_224', pretrained=False) or a checkpoint folder"
            )
        return _load_vitlab_checkpoint(DEFAULT_CHECKPOINT)
    if isinstance(spec, (ViTConfig, HybridConfig, BiTConfig)):
        _no_extras("a config", weights, {})
        return build_model(_replace_config(spec, overrides)).eval()
    name = os.fspath(spec)
    if not isinstance(name, str):
        raise ModelLoadError(f"a model spec must be a timm name, a path or a config, got {type(spec).__name__}")
    if name.startswith(_HUB_PREFIXES):
        if weights is not None:
            raise ModelLoadError("weights= needs a timm architecture name (e.g. 'vit_base_patch16_224'), not a hub id")
        return _create_timm(name, pretrained, overrides)
    path = Path(name)
    if path.exists():
        _no_extras("a vitlab checkpoint", weights, overrides)
        return _load_vitlab_checkpoint(path)
    if os.sep in name or "/" in name or name.endswith((".safetensors", ".json", ".pth", ".bin")):
        raise ModelLoadError(f"{name} does not exist: pass an existing vitlab checkpoint folder or a timm model name")
    _check_timm_name(name)
    if weights is not None:
        return _load_timm_with_file(name, Path(weights), overrides)
    return _create_timm(name, pretrained, overrides)


def _no_extras(what: str, weights: Any, overrides: dict[str, Any]) -> None:
    """Options that only make sense for timm names must not be silently ignored."""
    if weights is not None:
        raise ModelLoadError(f"weights= is for timm model names; {what} already says where its weights come from")
    if overrides:
        raise ModelLoadError(
            f"overrides {sorted(overrides)} are for timm names and configs; {what} is loaded as saved "
            "(use vitlab.resize_for_finetuning to change the image size or the number of classes)"
        )


def _replace_config(cfg: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    if not overrides:
        return cfg
    try:
        return dataclasses.replace(cfg, **overrides)
    except TypeError as e:
        fields = sorted(f.name for f in dataclasses.fields(cfg))
        raise ModelLoadError(
            f"{type(cfg).__name__} has no field for {sorted(overrides)}: {e}; fields: {fields}"
        ) from None


def _check_timm_name(name: str) -> None:
    """A ModelLoadError with similar names for an unknown architecture or pretrained tag."""
    arch, _, tag = name.partition(".")
    if not timm.is_model(arch):
        raise ModelLoadError(
            f"{name!r} is neither a file nor a timm model name. "
            + _similar("Similar timm names", arch, timm.list_models())
            + "See timm.list_models('vit_*') for the ViT family."
        )
    if tag:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
        if tag not in tags:
            raise ModelLoadError(
                f"timm has no pretrained tag {tag!r} for {arch!r}. "
                + (f"Available tags: {', '.join(tags)}. " if tags else "It has no pretrained weights. ")
            )


def _similar(label: str, word: str, names: list[str], n: int = 8) -> str:
    """'label: a, b, c. ' for names close to ``word`` (typos and substrings), or ''."""
    close = difflib.get_close_matches(word, names, n=n, cutoff=0.6)
    close += [m for m in names if word and word in m and m not in close]
    return f"{label}: {', '.join(close[:n])}. " if close else ""


def _create_timm(name: str, pretrained: bool, overrides: dict[str, Any]) -> nn.Module:
    try:
        with _honour_offline_env():
            model = timm.create_model(name, pretrained=pretrained, **overrides)
    except Exception as e:  # the hub raises a zoo of connection errors; all mean the same to a user
        if pretrained and _looks_offline(e):
            raise ModelLoadError(
                f"could not download pretrained weights for {name!r} ({type(e).__name__}: {str(e)[:200]}). "
                "This machine seems to be offline or the hub is unreachable. Download the weights elsewhere "
                f"and pass them as a local file: vitlab.load_model({name!r}, weights='path/to/model.safetensors'), "
                "or use pretrained=False for random weights"
            ) from e
        args = f" with {overrides}" if overrides else ""
        raise ModelLoadError(f"timm could not build {name!r}{args}: {type(e).__name__}: {e}") from e
    return model.eval()


def _load_timm_with_file(name: str, wpath: Path, overrides: dict[str, Any]) -> nn.Module:
    """timm builds ``name`` and loads ``wpath`` strictly (its checkpoint filter still adapts e.g. pos_embed).

    timm drops the classifier whenever ``num_classes`` differs from the pretrained config's, so the file's
    own class count is put into the config: a fine-tuned 10-class file keeps its head.
    """
    if not wpath.is_file():
        raise ModelLoadError(f"weights file {wpath} does not exist")
    kwargs = dict(overrides)
    file_classes = _file_num_classes(wpath, _classifier_names(name))
    wanted = kwargs.pop("num_classes", file_classes)
    overlay: dict[str, Any] = dict(file=str(wpath), label_offset=0)
    if file_classes is not None:
        overlay["num_classes"] = kwargs["num_classes"] = file_classes
    elif wanted is not None:
        kwargs["num_classes"] = wanted
    try:
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    except Exception as e:
        raise ModelLoadError(f"could not load {wpath} into timm model {name!r}: {type(e).__name__}: {e}") from e
    if wanted is not None and wanted != file_classes:
        model.reset_classifier(wanted)  # a new task: a fresh head (timm does the same for hub weights)
    return model.eval()


def _classifier_names(name: str) -> tuple[str, ...]:
    cfg = timm.models.get_pretrained_cfg(name)
    classifier = getattr(cfg, "classifier", None) if cfg is not None else None
    if not classifier:
        return ()
    return (classifier,) if isinstance(classifier, str) else tuple(classifier)


def _file_num_classes(wpath: Path, classifiers: tuple[str, ...]) -> int | None:
    """Rows of the first classifier weight in the file; None when the file has no such key."""
    if not classifiers:
        return None
    key = f"{classifiers[0]}.weight"
    try:
        if wpath.name.endswith(".safetensors"):
            with safe_open(str(wpath), framework="pt") as f:
                return f.get_slice(key).get_shape()[0] if key in f.keys() else None
        state = timm.models.load_state_dict(str(wpath), weights_only=True)
    except Exception as e:
        raise ModelLoadError(f"could not read weights file {wpath} ({type(e).__name__}: {e})") from None
    return int(state[key].shape[0]) if key in state else None


@contextlib.contextmanager
def _honour_offline_env() -> Iterator[None]:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: honour it when it was set later (a notebook cell)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        yield
        return
    before = constants.HF_HUB_OFFLINE
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


_OFFLINE_WORDS = ("connection", "offline", "timed out", "timeout", "network", "max retries", "name or service",
                  "name resolution", "could not resolve", "localentrynotfound", "cannot find the requested files",
                  "outgoing traffic has been disabled", "unreachable")


def _looks_offline(e: BaseException | None) -> bool:
    """Whether ``e`` or anything in its cause/context chain says the hub could not be reached."""
    seen: set[int] = set()
    text = ""
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)):
            return True
        names = {c.__name__ for c in type(e).__mro__}
        if names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout"}:
            return True
        text += f" {type(e).__name__} {e}".lower()
        e = e.__cause__ or e.__context__
    return any(k in text for k in _OFFLINE_WORDS)


# ---------------------------------------------------------------------------------------------- fine-tuning


def resize_for_finetuning(model: nn.Module, img_size: int | tuple[int, int], num_classes: int | None = None,
                          interpolation: str = "bicubic") -> nn.Module:
    """Prepare a ViT for fine-tuning at another resolution, as in the paper's section 3.2.

    The patch size stays, so the grid grows; the learned position embeddings of the patch grid are
    resampled by 2D interpolation (``interpolation`` is the ``F.interpolate`` mode; antialiased only when
    the grid shrinks), prefix rows kept as they are; fixed sin-cos embeddings are rebuilt exactly for the
    new grid; with ``num_classes`` the head is replaced by a zero-initialised linear layer (0: no head).
    For a hybrid the grid is the backbone's feature map at the new size. Works in place and returns the model.
    """
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"resize_for_finetuning needs a timm VisionTransformer, got {type(model).__name__}")
    size = _size2(img_size)
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 0):
        raise ValueError(f"num_classes must be an int >= 0 (0: no head), got {num_classes!r}")
    embed = model.patch_embed
    if not isinstance(embed, HybridEmbed) and not getattr(embed, "dynamic_img_pad", False):
        ph, pw = embed.patch_size
        if size[0] % ph or size[1] % pw:
            raise ValueError(f"img_size {size} is not a multiple of the patch size {(ph, pw)}")
    new_cfg = _resized_config(getattr(model, "vitlab_config", None), size, num_classes)  # validates before changes
    pe = model.pos_embed
    sincos = pe is not None and _is_sincos(model)
    old_grid = tuple(embed.grid_size)
    embed.set_input_size(img_size=size)  # hybrid: runs the backbone once to read the new feature map size
    new_grid = tuple(embed.grid_size)
    if pe is not None:
        n_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        with torch.no_grad():
            new = _resized_pos_embed(pe, n_prefix, old_grid, new_grid, sincos, interpolation)
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
    table = _sincos_grid(grid, pe.shape[-1], pe.detach())
    return bool(torch.allclose(pe.detach()[0, -n:], table, atol=1e-5))


def _resized_pos_embed(pe: torch.Tensor, n_prefix: int, old_grid: tuple[int, int], new_grid: tuple[int, int],
                       sincos: bool, interpolation: str) -> torch.Tensor:
    """(1, n_prefix + new gh*gw, D) from (1, n_prefix + old gh*gw, D); prefix rows are copied unchanged."""
    if pe.shape[1] != n_prefix + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"pos_embed has {pe.shape[1]} rows but the model has {n_prefix} prefix rows and a {old_grid} grid"
        )
    if sincos:
        table = _sincos_grid(new_grid, pe.shape[-1], pe)
        return torch.cat([pe[:, :n_prefix].detach(), table[None]], dim=1)
    shrink = new_grid[0] < old_grid[0] or new_grid[1] < old_grid[1]
    antialias = shrink and interpolation in ("bilinear", "bicubic")
    return resample_abs_pos_embed(pe.detach(), new_size=list(new_grid), old_size=list(old_grid),
                                  num_prefix_tokens=n_prefix, interpolation=interpolation, antialias=antialias)


def _zero_head(model: VisionTransformer, num_classes: int) -> None:
    """A fresh D x K head with zero weight and bias (paper section 3.2), on the model's device and dtype."""
    ref = model.pos_embed if model.pos_embed is not None else next(model.parameters())
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
