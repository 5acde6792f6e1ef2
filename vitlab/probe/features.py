"""Frozen features for probing: ``forward_head(forward_features(x), pre_logits=True)``, batched, cached on disk.

The cache key covers the model (class, readout settings and a hash of every weight), the data (its source, size
and a hash of its pixels and labels), the transform (input size, mean, std, interpolation) and the numerics (the
device type, an autocast region around the call, the TF32 and float32 matmul precision settings), so a change to
any of them misses the cache instead of returning stale features; each readout's file name carries the version of
its definition (``READOUT_VERSIONS``), so a changed definition misses too. Files are safetensors, written atomically;
an unreadable one (damaged outside vitlab) is computed anew and replaced.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from vitlab.base.checks import check_count
from vitlab.base.choices import READOUT_NAMES, READOUTS, Readout
from vitlab.base.modes import eval_mode
from vitlab.data.datasets import ImageArray, cache_file, normalize, touch_cache, write_cache
from vitlab.models.info import AnyModel, model_info, resolve_model

__all__ = ["extract_features", "extract_readouts", "feature_key", "patch_mean", "preprocess_uint8", "READOUTS",
           "READOUT_NAMES", "READOUT_VERSIONS", "readout_description"]


#: Bumped when a readout's definition changes, so that features cached under the old definition are never served.
#: patch_mean 2: the mean goes through the model's ``fc_norm`` (an average-pooled ViT's final LayerNorm; version 1
#: averaged its tokens before any LayerNorm).
READOUT_VERSIONS = {"model": 1, "patch_mean": 2}


def readout_description(model: AnyModel, readout: str) -> str:
    """``READOUT_NAMES[readout]`` said of ``model``: what its own readout is (the class token, the class and
    distillation tokens' mean, an average or attention pool, a CNN's pooled feature map)."""
    if readout != "model":
        return READOUT_NAMES[readout]
    try:
        info = model_info(model)  # a wrapped model: the one it holds; a resolved one: the facts it keeps
    except (TypeError, ValueError):  # no tokens: a CNN's head pools its last feature map
        return "the model's own readout (its globally pooled final feature map)"
    if info.readout == "token" and not info.num_class_tokens:  # a ConViT whose class token never joins its blocks
        what = "the first patch token"
    elif info.readout == "token":
        what = ("the mean of the class and distillation tokens" if "dist" in info.prefix_kinds
                else "the class token")
    elif info.readout == "avg":
        what = "the mean of the final tokens" if info.readout_includes_prefix else "the mean of the final patch tokens"
    elif info.readout == "map":
        what = "its attention pool over the final tokens"
    else:
        what = f"timm's global_pool={info.readout!r} over the final tokens"
    return f"the model's own readout ({what})"


def _cache_name(key: str, readout: str) -> str:
    """The cache file of ``readout`` for ``feature_key`` ``key`` (the model readout's name is the key alone, as
    before versions were recorded)."""
    version = READOUT_VERSIONS[readout]
    return f"{key}{'' if readout == 'model' else '-' + readout}{'' if version == 1 else f'-v{version}'}.safetensors"


def patch_mean(model: nn.Module, tokens: Tensor, num_prefix_tokens: int) -> Tensor:
    """(B, D) the ``patch_mean`` readout of ``forward_features`` output ``tokens`` (B, T, D): the mean of the patch
    tokens, prefix tokens left out, normalised as the model normalises its own pooled readout. ``forward_features``
    has applied ``model.norm``; the mean then goes through ``model.fc_norm``, as timm's ``forward_head`` does after
    pooling: the identity for a class-token ViT (its LayerNorm is ``norm``), the final LayerNorm of an
    average-pooled ViT (``global_pool="avg"``, vitlab's ``readout="avg"``, whose ``norm`` is the identity), for
    which ``patch_mean`` is then exactly the model's own readout."""
    fc_norm = getattr(model, "fc_norm", None)
    mean = tokens[:, num_prefix_tokens:].mean(1)
    return fc_norm(mean) if isinstance(fc_norm, nn.Module) else mean


def _hash_tensor(h, t: Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-d too (BatchNorm's count)


def _transform(model: nn.Module) -> dict:
    """Input size, mean, std and interpolation from ``timm.data.resolve_data_config`` (the source every vitlab
    path reads them from, timm's defaults included). The whole image is resized to the input size: no centre crop
    (``crop_pct`` is not applied), so a probe reads every pixel of small images such as CIFAR's."""
    from vitlab.models.info import data_config

    cfg = data_config(model)  # timm's, at the input size the model is built for
    return {"input_size": [int(v) for v in cfg["input_size"][-2:]], "mean": [float(v) for v in cfg["mean"]],
            "std": [float(v) for v in cfg["std"]], "interpolation": str(cfg["interpolation"])}


def _numerics(device: torch.device) -> dict:
    """What moves float32 features besides weights, data and transform: the device type (a GPU's kernels round
    differently from the CPU's), an autocast region the call runs in (bf16 features), and the TF32 and float32
    matmul precision settings (cuDNN's TF32 convolutions are on by default and move features by about 1e-3)."""
    out: dict = {"device": device.type, "matmul_precision": torch.get_float32_matmul_precision()}
    try:
        if torch.is_autocast_enabled(device.type):
            out["autocast"] = str(torch.get_autocast_dtype(device.type))
    except (RuntimeError, TypeError):  # a device type without autocast
        pass
    if device.type == "cuda":
        out["tf32"] = [bool(torch.backends.cudnn.allow_tf32), bool(torch.backends.cuda.matmul.allow_tf32)]
    return out


def _structure(model: nn.Module) -> list[str]:
    """Each module's name, class and settings (``extra_repr``, memory addresses left out): what computes the features
    besides the weights, e.g. the activation, which holds no weight (CLIP's QuickGELU against GELU)."""
    return [f"{name}:{type(m).__module__}.{type(m).__qualname__}({re.sub(r' at 0x[0-9a-fA-F]+', '', m.extra_repr())})"
            for name, m in model.named_modules()]


def feature_key(model: AnyModel, data: ImageArray, device: str | torch.device | None = None) -> str:
    """A hex digest of (model config, modules and weights, data, transform, numerics on ``device``: default the
    model's); the config includes the readout settings that no weight holds (``global_pool``, timm's
    ``pool_include_prefix``), the modules each layer's class and settings (an activation holds no weight). A
    wrapped model (``torch.compile``, ``DataParallel``) has the key of the module it wraps."""
    model = resolve_model(model).module
    device = torch.device(device) if device is not None else next(model.parameters()).device
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(_numerics(device), sort_keys=True).encode())
    h.update(type(model).__name__.encode())
    h.update(json.dumps(_structure(model)).encode())
    arch = getattr(model, "vitlab_config", None) or {k: getattr(model, k, None) for k in
                                                       ("global_pool", "num_prefix_tokens", "num_classes")}
    if getattr(model, "pool_include_prefix", False):  # a readout setting held in no weight (timm's pooled ViTs)
        arch = {"arch": arch, "pool_include_prefix": True}
    h.update(json.dumps(arch, sort_keys=True, default=str).encode())
    h.update(json.dumps(_transform(model), sort_keys=True).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        _hash_tensor(h, t)
    h.update(data.source.encode())
    _hash_tensor(h, data.images)
    _hash_tensor(h, data.labels)
    return h.hexdigest()


def preprocess_uint8(images: Tensor, transform: dict) -> Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, h, w) float32 as ``transform`` (a timm data config) says: ``vitlab.data.datasets.normalize``
    at the model's input size."""
    return normalize(images, transform["mean"], transform["std"], size=tuple(transform["input_size"])[-2:],
                     interpolation=transform["interpolation"])


def extract_features(model: nn.Module, data: ImageArray, batch_size: int = 128, cache: bool = True,
                     progress: bool | None = None, device: str | torch.device | None = None,
                     readout: Readout = "model") -> Tensor:
    """(N, D) float32 pre-logit features of ``data`` (the representation a linear probe reads).

    ``readout="model"``: the model's own readout, ``forward_head(pre_logits=True)`` (the class token, the mean of
    the class and distillation tokens, an average or attention pool: whatever the model classifies from);
    ``"patch_mean"``: the mean of the final patch tokens of a ViT, prefix tokens left out, through the model's
    final LayerNorm (``norm`` before the mean for a class-token ViT, ``fc_norm`` after it for an average-pooled
    one, as timm's own pooled representation: see ``patch_mean``), for encoders whose class token was never
    trained (e.g. masked patch prediction trains only patch outputs).
    Images are resized and normalised as the model's pretrained config says. With ``cache=True`` features
    are stored under ``$VITLAB_CACHE/features`` and reused when model, weights, data, transform, readout and numerics
    (device type, autocast, TF32: see ``feature_key``) match.
    The model's train/eval mode is restored afterwards. ``extract_readouts`` gives several readouts in one pass.
    The features are computed where the model is (``device``, if given, must name that device: it is checked, the
    model is not moved) and returned on the CPU.
    """
    return extract_readouts(model, data, (readout,), batch_size, cache, progress, device)[readout]


@torch.no_grad()
def extract_readouts(model: AnyModel, data: ImageArray, readouts: Sequence[Readout] = READOUTS,
                     batch_size: int = 128, cache: bool = True, progress: bool | None = None,
                     device: str | torch.device | None = None) -> dict[str, Tensor]:
    """{readout: (N, D) float32 features} of ``data`` for each of ``readouts`` (as ``extract_features`` defines
    them) from one forward pass over the images; each readout is cached on its own."""
    rm = resolve_model(model)
    model = rm.module
    if not hasattr(model, "forward_head") or not hasattr(model, "forward_features"):
        raise TypeError(f"{type(model).__name__} has no forward_features/forward_head: extract_features needs a "
                        "timm model (a ViT, hybrid or ResNet)")
    check_count("batch_size", batch_size)  # before the cache is read
    readouts = tuple(dict.fromkeys(readouts))  # a readout named twice is computed (and returned) once
    bad = [r for r in readouts if r not in READOUTS]
    if bad or not readouts:
        raise ValueError(f"readout must be one of {READOUTS}, got {bad or list(readouts)!r}")
    n_prefix = 0
    if "patch_mean" in readouts:
        try:
            n_prefix = rm.info().num_prefix_tokens
        except (TypeError, ValueError) as e:
            raise TypeError(f"readout='patch_mean' needs a ViT with patch tokens; {type(model).__name__}: {e}. Use "
                            "readout='model'") from e
    here = next(model.parameters()).device
    want = torch.device(device) if device is not None else here
    if want.type != here.type or (want.index is not None and want.index != here.index):
        raise ValueError(f"device={device!r} but the model is on {here}: move the model first "
                         f"(model.to({str(device)!r})); the features run where the model is")
    device = here
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    paths: dict[str, Path | None] = dict.fromkeys(readouts)
    found: dict[str, Tensor] = {}
    if cache:
        key = feature_key(rm, data, device)
        for r in readouts:
            paths[r] = cache_file("features", _cache_name(key, r))
            if paths[r] is not None and paths[r].exists():
                try:
                    feats = load_file(paths[r])["features"]
                except (OSError, KeyError, SafetensorError):  # damaged (a full disk, a bad copy): computed anew
                    continue
                if feats.dim() == 2 and len(feats) == len(data):
                    found[r] = feats
                    touch_cache(paths[r])
    todo = [r for r in readouts if r not in found]
    if not todo:
        return found
    tf = _transform(model)
    out: dict[str, list[Tensor]] = {r: [] for r in todo}
    with eval_mode(model):
        starts = range(0, len(data), batch_size)
        for i in tqdm(starts, desc="features", disable=progress is False or (progress is None and len(starts) < 4),
                      leave=False):
            x = preprocess_uint8(data.images[i:i + batch_size], tf).to(device, dtype)  # a half model: half images
            tokens = model.forward_features(x)
            for r in todo:
                f = patch_mean(model, tokens, n_prefix) if r == "patch_mean" else model.forward_head(tokens,
                                                                                                    pre_logits=True)
                out[r].append(f.float().cpu())
    for r in todo:
        feats = found[r] = torch.cat(out[r]) if out[r] else torch.empty(0, 0)
        if paths[r] is not None:
            write_cache(paths[r], lambda tmp, f=feats: save_file({"features": f.contiguous()}, tmp,
                                                                  metadata={"source": data.source,
                                                                            "n": str(len(data))}),
                        errors=(OSError, SafetensorError))
    return {r: found[r] for r in readouts}
