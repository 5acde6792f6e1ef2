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

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import timm
import torch
from safetensors.torch import load_file, save_file
from timm.layers import GroupNormAct, StdConv2d, resample_abs_pos_embed
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
FORMAT_VERSION = 1


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""


@dataclass(frozen=True)
class Preprocess:
    """What the model expects at its input; becomes the timm ``pretrained_cfg``."""

    mean: tuple[float, float, float] = CIFAR_MEAN
    std: tuple[float, float, float] = CIFAR_STD
    interpolation: str = "bicubic"
    crop_pct: float = 1.0


@dataclass(frozen=True)
class ViTConfig:
    """One member of the ViT family. ``vit_config("B/16")`` gives the paper's ViT-B/16."""

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    patch_size: int = 16
    img_size: int = 224
    num_classes: int = 1000
    in_chans: int = 3
    readout: Literal["token", "avg"] = "token"
    pos_embed: Literal["learn", "sincos", "none"] = "learn"
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    preprocess: Preprocess = Preprocess(mean=IMAGENET_INCEPTION, std=IMAGENET_INCEPTION)

    def __post_init__(self) -> None:
        if self.img_size % self.patch_size:
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


@dataclass(frozen=True)
class HybridConfig:
    """R?+ViT: a ResNet-v2 stem and stages whose feature map is cut into 1x1 patches (paper section 3.1)."""

    vit: ViTConfig = ViTConfig()  # vit.patch_size is the backbone's total stride
    layers: tuple[int, ...] = (3, 4, 9)  # R50 hybrid: the first three stages of ResNet-50
    stem: Literal["imagenet", "cifar"] = "imagenet"

    def __post_init__(self) -> None:
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
    num_classes: int = 1000
    in_chans: int = 3
    img_size: int = 224
    stem: Literal["imagenet", "cifar"] = "imagenet"
    drop_path_rate: float = 0.0
    preprocess: Preprocess = Preprocess(mean=IMAGENET_INCEPTION, std=IMAGENET_INCEPTION)


ModelConfig = ViTConfig | HybridConfig | BiTConfig
_KINDS: dict[str, type] = {"vit": ViTConfig, "hybrid": HybridConfig, "bit": BiTConfig}


def vit_config(name: str = "B/16", **overrides: Any) -> ViTConfig:
    """The paper's naming: ``"B/16"``, ``"L/32"``, ``"Ti/4"`` (any patch size) plus field overrides."""
    try:
        size, patch = name.split("/")
        width, depth, heads, mlp = VIT_SIZES[size]
        patch_size = int(patch)
    except (ValueError, KeyError):
        raise ValueError(
            f"unknown ViT name {name!r}: use SIZE/PATCH with SIZE in {sorted(VIT_SIZES)}, e.g. 'B/16' or 'Ti/4'"
        ) from None
    fields = dict(embed_dim=width, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch_size)
    fields.update(overrides)
    return ViTConfig(**fields)


# ---------------------------------------------------------------------------------------------- build


def _resnet_stride(layers: tuple[int, ...], stem: str) -> int:
    stem_stride = 4 if stem == "imagenet" else 1
    return stem_stride * 2 ** (len(layers) - 1)


def _resnet_v2(layers: tuple[int, ...], stem: str, preact: bool, **kwargs: Any) -> ResNetV2:
    channels = tuple(256 * 2**i for i in range(len(layers)))
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


def _pretrained_cfg(arch: str, img_size: int, num_classes: int, pre: Preprocess, first_conv: str) -> dict:
    return dict(
        architecture=arch,
        input_size=(3, img_size, img_size),
        mean=tuple(pre.mean),
        std=tuple(pre.std),
        interpolation=pre.interpolation,
        crop_pct=pre.crop_pct,
        crop_mode="center",
        num_classes=num_classes,
        first_conv=first_conv,
        classifier="head" if arch.startswith("vitlab_vit") or arch.startswith("vitlab_hybrid") else "head.fc",
    )


def _set_sincos(model: VisionTransformer) -> None:
    """Fixed 2D sin-cos position embedding (Table 8's "2-D" variant without learning); prefix rows are zero."""
    gh, gw = model.patch_embed.grid_size
    grid = build_sincos2d_pos_embed((gh, gw), dim=model.embed_dim)  # (gh*gw, D)
    pe = torch.zeros_like(model.pos_embed)  # (1, prefix + gh*gw, D)
    pe[0, -gh * gw :] = grid
    model.pos_embed = nn.Parameter(pe, requires_grad=False)


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build a randomly initialised model from a config. The config is attached as ``model.vitlab_config``."""
    if isinstance(cfg, ViTConfig):
        model = VisionTransformer(**_vit_kwargs(cfg))
        if cfg.pos_embed == "sincos":
            _set_sincos(model)
        arch, img, ncls, pre, first = "vitlab_vit", cfg.img_size, cfg.num_classes, cfg.preprocess, "patch_embed.proj"
    elif isinstance(cfg, HybridConfig):
        from timm.layers import HybridEmbed

        backbone = _resnet_v2(cfg.layers, cfg.stem, preact=False, num_classes=0, global_pool="", in_chans=cfg.vit.in_chans)
        embed = partial(HybridEmbed, backbone=backbone)
        kwargs = _vit_kwargs(cfg.vit)
        kwargs["patch_size"] = 1
        model = VisionTransformer(**kwargs, embed_layer=embed)
        if cfg.vit.pos_embed == "sincos":
            _set_sincos(model)
        arch, img, ncls, pre = "vitlab_hybrid", cfg.vit.img_size, cfg.vit.num_classes, cfg.vit.preprocess
        first = "patch_embed.backbone.stem.conv"
    elif isinstance(cfg, BiTConfig):
        model = _resnet_v2(
            cfg.layers,
            cfg.stem,
            preact=True,
            num_classes=cfg.num_classes,
            in_chans=cfg.in_chans,
            width_factor=cfg.width_factor,
            drop_path_rate=cfg.drop_path_rate,
        )
        arch, img, ncls, pre, first = "vitlab_bit", cfg.img_size, cfg.num_classes, cfg.preprocess, "stem.conv"
    else:
        raise TypeError(f"expected ViTConfig, HybridConfig or BiTConfig, got {type(cfg).__name__}")
    model.pretrained_cfg = _pretrained_cfg(arch, img, ncls, pre, first)
    model.default_cfg = model.pretrained_cfg
    model.vitlab_config = cfg
    return model


# ---------------------------------------------------------------------------------------------- config <-> json


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    kind = {ViTConfig: "vit", HybridConfig: "hybrid", BiTConfig: "bit"}[type(cfg)]
    return {"kind": kind, **dataclasses.asdict(cfg)}


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in _KINDS:
        raise ModelLoadError(f"checkpoint config has kind={kind!r}; expected one of {sorted(_KINDS)}")
    return _from_fields(_KINDS[kind], d)


def _from_fields(cls: type, d: dict[str, Any]) -> Any:
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.name == "preprocess":
            v = Preprocess(**{k: tuple(x) if isinstance(x, list) else x for k, x in v.items()})
        elif f.name == "vit":
            v = _from_fields(ViTConfig, v)
        elif isinstance(v, list):
            v = tuple(v)
        out[f.name] = v
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ModelLoadError(f"checkpoint config has unknown fields {sorted(unknown)} for {cls.__name__}")
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
    a crash leaves either the previous checkpoint or the new one, never a mix. ``dtype`` (e.g.
    ``torch.float16``) converts floating-point tensors for a smaller file.
    """
    cfg = getattr(model, "vitlab_config", None)
    if cfg is None:
        raise ValueError(
            "this model has no vitlab config (it was not built by vitlab.build_model); "
            "save timm models with timm's own tools, or build the model with vitlab.build_model"
        )
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[k] = v.contiguous()
    meta = {
        "format": "vitlab-checkpoint",
        "format_version": FORMAT_VERSION,
        "config": config_to_dict(cfg),
        "pretrained_cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in model.pretrained_cfg.items()},
        "versions": {"torch": torch.__version__, "timm": timm.__version__},
        **(extra or {}),
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        old = None
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            if old.exists():
                _rmtree(old)
            os.replace(directory, old)
        os.replace(tmp, directory)
        if old is not None:
            _rmtree(old)
    except BaseException:
        _rmtree(tmp)
        raise
    return directory


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _load_vitlab_checkpoint(path: Path) -> nn.Module:
    directory = path if path.is_dir() else path.parent
    cfg_file, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not cfg_file.is_file() or not weights.is_file():
        raise ModelLoadError(
            f"{directory} is not a vitlab checkpoint: it needs both {CONFIG_NAME} and {WEIGHTS_NAME} "
            "(as written by vitlab.save_checkpoint)"
        )
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e}); the checkpoint is damaged") from None
    model = build_model(config_from_dict(meta["config"]))
    state = load_file(str(weights))
    ref = model.state_dict()
    state = {k: v.to(ref[k].dtype) if k in ref else v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(
            f"{weights} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if "pretrained_cfg" in meta:
        pc = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["pretrained_cfg"].items()}
        model.pretrained_cfg = model.default_cfg = pc
    model.vitlab_checkpoint = {k: v for k, v in meta.items() if k not in ("config", "pretrained_cfg")}
    model.vitlab_checkpoint["path"] = str(directory)
    return model.eval()


# ---------------------------------------------------------------------------------------------- loading


def load_model(spec: str | os.PathLike | ModelConfig | None = None, *, pretrained: bool = True,
               weights: str | os.PathLike | None = None, **overrides: Any) -> nn.Module:
    """Return a model in eval mode from any spec.

    * ``None``: the embedded default model shipped in ``data/checkpoints``.
    * a path to a vitlab checkpoint (its folder, ``config.json`` or ``model.safetensors``).
    * a ``ViTConfig`` / ``HybridConfig`` / ``BiTConfig``: a freshly initialised model.
    * a timm model name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``): built by timm; with
      ``pretrained=True`` the weights come from the hub, or from a local file given as ``weights=``
      (``.safetensors``, or ``.bin``/``.pth`` read with ``weights_only=True``).

    ``overrides`` go to ``timm.create_model`` (e.g. ``img_size=384``, ``num_classes=10``,
    ``dynamic_img_size=True``).
    """
    if spec is None:
        if not (DEFAULT_CHECKPOINT / WEIGHTS_NAME).is_file():
            raise ModelLoadError(
                f"the embedded default model is not in this checkout ({DEFAULT_CHECKPOINT} has no {WEIGHTS_NAME}). "
                "Train it with `vitlab train --preset vit_cifar10` or pass a model: "
                "vitlab.load_model('vit_base_patch16_224', pretrained=False) or a checkpoint folder"
            )
        return _load_vitlab_checkpoint(DEFAULT_CHECKPOINT)
    if isinstance(spec, (ViTConfig, HybridConfig, BiTConfig)):
        return build_model(spec).eval()
    path = Path(spec)
    if path.exists():
        if weights is not None:
            raise ModelLoadError("weights= is for timm model names; a checkpoint folder already holds its weights")
        return _load_vitlab_checkpoint(path)
    name = str(spec)
    if os.sep in name or name.endswith((".safetensors", ".json", ".pth", ".bin")):
        raise ModelLoadError(f"{name} does not exist: pass an existing vitlab checkpoint folder or a timm model name")
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('.')[0][:12]}*")[:8]
        raise ModelLoadError(
            f"{name!r} is neither a file nor a timm model name. "
            + (f"Similar timm names: {', '.join(close)}. " if close else "")
            + "See timm.list_models('vit_*') for the ViT family."
        )
    if weights is not None:
        wpath = Path(weights)
        if not wpath.is_file():
            raise ModelLoadError(f"weights file {wpath} does not exist")
        overlay = dict(file=str(wpath))
        try:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **overrides)
        except (RuntimeError, KeyError, ValueError) as e:
            raise ModelLoadError(f"could not load {wpath} into timm model {name!r}: {e}") from e
        return model.eval()
    try:
        model = timm.create_model(name, pretrained=pretrained, **overrides)
    except Exception as e:  # the hub raises a zoo of connection errors; all mean the same to a user
        if pretrained and _looks_offline(e):
            raise ModelLoadError(
                f"could not download pretrained weights for {name!r} ({type(e).__name__}: {str(e)[:200]}). "
                "This machine seems to be offline or the hub is unreachable. Download the weights elsewhere "
                f"and pass them as a local file: vitlab.load_model({name!r}, weights='path/to/model.safetensors'), "
                "or use pretrained=False for random weights"
            ) from e
        raise
    return model.eval()


def _looks_offline(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    keys = ("connection", "resolve", "offline", "timed out", "timeout", "network", "max retries",
            "name or service", "localentrynotfound", "cannot find the requested files", "hub")
    while e is not None:
        text += f" {type(e).__name__} {e}".lower()
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return any(k in text for k in keys)


# ---------------------------------------------------------------------------------------------- fine-tuning


def resize_for_finetuning(model: nn.Module, img_size: int | tuple[int, int], num_classes: int | None = None,
                          interpolation: str = "bicubic") -> nn.Module:
    """Prepare a ViT for fine-tuning at another resolution, as in the paper's section 3.2.

    The patch size stays, so the grid grows; the learned position embeddings of the patch grid are
    resampled by 2D interpolation (prefix rows kept as they are), fixed sin-cos embeddings are rebuilt
    for the new grid, and with ``num_classes`` the head is replaced by a zero-initialised linear layer.
    Works in place and returns the model.
    """
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"resize_for_finetuning needs a timm VisionTransformer, got {type(model).__name__}")
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    pe = model.pos_embed
    frozen = pe is not None and not pe.requires_grad
    old_grid = tuple(model.patch_embed.grid_size)
    if hasattr(model.patch_embed, "backbone"):  # hybrid: the grid is the backbone's feature map
        stride = model.patch_embed.feat_ratio() if hasattr(model.patch_embed, "feat_ratio") else None
        _set_hybrid_size(model, size)
    else:
        ph, pw = model.patch_embed.patch_size
        if size[0] % ph or size[1] % pw:
            raise ValueError(f"img_size {size} is not a multiple of the patch size {(ph, pw)}")
        model.patch_embed.set_input_size(img_size=size)
    new_grid = tuple(model.patch_embed.grid_size)
    if pe is not None:
        n_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        with torch.no_grad():
            if frozen:
                new = torch.zeros(1, n_prefix + new_grid[0] * new_grid[1], pe.shape[-1], dtype=pe.dtype)
                new[0, :n_prefix] = pe[0, :n_prefix]
                new[0, n_prefix:] = build_sincos2d_pos_embed(new_grid, dim=pe.shape[-1]).to(pe.dtype)
            else:
                new = resample_abs_pos_embed(pe, new_size=list(new_grid), old_size=list(old_grid),
                                             num_prefix_tokens=n_prefix, interpolation=interpolation)
        model.pos_embed = nn.Parameter(new, requires_grad=not frozen)
    if num_classes is not None:
        model.reset_classifier(num_classes)
        if isinstance(model.head, nn.Linear):
            nn.init.zeros_(model.head.weight)
            nn.init.zeros_(model.head.bias)
    pc = dict(getattr(model, "pretrained_cfg", {}) or {})
    pc["input_size"] = (model.in_chans if hasattr(model, "in_chans") else 3, *size)
    if num_classes is not None:
        pc["num_classes"] = num_classes
    model.pretrained_cfg = model.default_cfg = pc
    cfg = getattr(model, "vitlab_config", None)
    if cfg is not None and size[0] == size[1]:
        if isinstance(cfg, ViTConfig):
            cfg = dataclasses.replace(cfg, img_size=size[0], num_classes=num_classes or cfg.num_classes)
        elif isinstance(cfg, HybridConfig):
            cfg = dataclasses.replace(cfg, vit=dataclasses.replace(
                cfg.vit, img_size=size[0], num_classes=num_classes or cfg.vit.num_classes))
        model.vitlab_config = cfg
    return model


def _set_hybrid_size(model: VisionTransformer, size: tuple[int, int]) -> None:
    pe = model.patch_embed
    with torch.no_grad():
        was = pe.backbone.training
        pe.backbone.eval()
        feat = pe.backbone(torch.zeros(1, model.in_chans if hasattr(model, "in_chans") else 3, *size))
        pe.backbone.train(was)
    if isinstance(feat, (list, tuple)):
        feat = feat[-1]
    fh, fw = feat.shape[-2:]
    pe.img_size = size
    pe.feature_size = (fh, fw)
    pe.grid_size = (fh // pe.patch_size[0], fw // pe.patch_size[1])
    pe.num_patches = pe.grid_size[0] * pe.grid_size[1]
