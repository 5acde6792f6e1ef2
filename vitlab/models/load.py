"""One loader for every kind of model spec: the embedded default, a checkpoint, a config or a timm name.

``load_model`` dispatches on the spec; timm names are built by timm, with weights from the hub or a local
file, and an unreachable hub is reported as such, with what to do offline.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import timm
from safetensors import safe_open
from torch import nn

from vitlab.base.choices import DEFAULT_CHECKPOINT
from vitlab.base.errors import ModelLoadError, ParameterModelError, Placeholder, Setting
from vitlab.base.shipped import data_path
from vitlab.models.checkpoint import WEIGHTS_NAME, load_checkpoint, recover_checkpoint
from vitlab.models.config import BiTConfig, CifarNetConfig, HybridConfig, ModelConfig, ViTConfig, replace_fields
from vitlab.models.zoo import build_model

__all__ = ["load_model", "DEFAULT_CHECKPOINT", "SHAPES_CHECKPOINT"]

# DEFAULT_CHECKPOINT (from the torch-free vitlab.base.choices, for the command line): where the embedded default model
# lives (shipped by the training work; see data/checkpoints/README.md, and vitlab.base.shipped for a wheel's copy).
#: The ViT trained on the synthetic shapes (object masks): the localisation scores use it.
SHAPES_CHECKPOINT = data_path("checkpoints/vit_shapes")

_HUB_PREFIXES = ("hf-hub:", "hf_hub:")


def load_model(spec: str | os.PathLike | ModelConfig | None = None, *, pretrained: bool = True,
               weights: str | os.PathLike | None = None, **overrides: Any) -> nn.Module:
    """Return a model in eval mode from any spec.

    * ``None``: the embedded default model shipped in ``data/checkpoints``.
    * a path to a vitlab checkpoint (its folder, ``config.json`` or ``model.safetensors``).
    * a ``ViTConfig`` / ``HybridConfig`` / ``BiTConfig`` / ``CifarNetConfig``: a freshly initialised model (``overrides``
      replace config fields, all at once; dotted names reach nested groups: ``**{"vit.depth": 2}``).
    * a timm model name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``, or ``"hf-hub:org/name"``):
      built by timm; with ``pretrained=True`` the weights come from the hub, or from a local file given as
      ``weights=`` (``.safetensors``, or ``.bin``/``.pth`` read with ``weights_only=True``, never
      unpickling code). A weights file decides the number of classes unless ``num_classes`` is given;
      a different ``num_classes`` gets a fresh head, as timm does for hub weights.

    For timm names ``overrides`` go to ``timm.create_model`` (e.g. ``img_size=384``, ``num_classes=10``,
    ``dynamic_img_size=True``). Every failure is a ``ModelLoadError`` saying why and what to do.
    """
    if spec is None:
        _no_extras("the default model", weights, overrides, pretrained)
        if not (DEFAULT_CHECKPOINT / WEIGHTS_NAME).is_file():
            raise ParameterModelError(
                "spec", None, problem=f"the embedded default model is not here ({DEFAULT_CHECKPOINT} has no "
                f"{WEIGHTS_NAME})", fix=["train it with `vitlab train --preset vit_cifar10`",
                                         (Setting("spec", "vit_base_patch16_224"), Setting("pretrained", False)),
                                         Setting("spec", Placeholder("CHECKPOINT_FOLDER"))])
        return load_checkpoint(DEFAULT_CHECKPOINT)
    if isinstance(spec, (ViTConfig, HybridConfig, BiTConfig, CifarNetConfig)):
        _no_extras("a config", weights, {})
        return build_model(_replace_config(spec, overrides)).eval()
    name = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None
    if not isinstance(name, str):
        raise ModelLoadError(f"a model spec must be a timm name, a path or a config (ViTConfig, HybridConfig, "
                             f"BiTConfig, CifarNetConfig), got {type(spec).__name__}")
    if name.startswith(_HUB_PREFIXES):
        if weights is not None:
            raise ParameterModelError("weights", os.fspath(weights), problem=f"needs a timm architecture name (e.g. "
                                      f"'vit_base_patch16_224'), not the hub id {name!r}")
        return _create_timm(name, pretrained, overrides)
    path = Path(name)
    if not path.exists():  # a kill between the two renames of its replacement left its previous copy beside it
        recover_checkpoint(path)
    if path.exists():
        _no_extras("a vitlab checkpoint", weights, overrides, pretrained)
        return load_checkpoint(path)
    if os.sep in name or "/" in name or name.endswith((".safetensors", ".json", ".pth", ".bin")):
        raise ModelLoadError(f"{name} does not exist: pass an existing vitlab checkpoint folder or a timm model name")
    _check_timm_name(name)
    if weights is not None:
        if not pretrained:
            raise ParameterModelError("pretrained", False, problem="contradicts a weights file, which is the "
                                      "pretrained weights", fix=[Setting("weights", None), Setting("pretrained", True)])
        return _load_timm_with_file(name, Path(weights), overrides)
    return _create_timm(name, pretrained, overrides)


def _no_extras(what: str, weights: Any, overrides: dict[str, Any], pretrained: bool = True) -> None:
    """Options that only make sense for timm names must not be silently ignored."""
    if not pretrained:
        raise ParameterModelError("pretrained", False, problem=f"only timm model names take it; {what} always loads "
                                  "its saved weights", fix=["for random ones, build its config with vitlab.build_model"])
    if weights is not None:
        raise ParameterModelError("weights", os.fspath(weights), problem=f"only timm model names take it; {what} "
                                  "already says where its weights come from", fix=[Setting("weights", None)])
    if overrides:
        raise ModelLoadError(
            f"overrides {sorted(overrides)} are for timm names and configs; {what} is loaded as saved "
            "(use vitlab.resize_for_finetuning to change the image size or the number of classes)"
        )


def _replace_config(cfg: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """``cfg`` with ``overrides`` (field names, dotted for nested groups: ``{"vit.depth": 2}`` of a HybridConfig)."""
    try:
        return replace_fields(cfg, overrides)
    except KeyError as e:
        raise ModelLoadError(f"load_model overrides: {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"load_model overrides {overrides}: {e}") from None


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


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hugging Face hub (``$HF_ENDPOINT``) opens within ``timeout`` seconds: checked
    once per process, so an offline machine fails in seconds instead of after the hub client's retries."""
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def _create_timm(name: str, pretrained: bool, overrides: dict[str, Any]) -> nn.Module:
    try:
        with _honour_offline_env(force=pretrained and not hub_reachable()):
            model = timm.create_model(name, pretrained=pretrained, **overrides)
    except Exception as e:  # the hub raises a zoo of connection errors; all mean the same to a user
        if pretrained and _looks_offline(e):
            raise ParameterModelError(
                "spec", name, problem=f"could not download its pretrained weights ({type(e).__name__}: "
                f"{str(e)[:200]}). This machine seems to be offline or the hub is unreachable: download the weights "
                "elsewhere and pass them as a local file",
                fix=[(Setting("spec", name), Setting("weights", Placeholder("path/to/model.safetensors"))),
                     Setting("pretrained", False)]) from e
        args = f" with {overrides}" if overrides else ""
        raise ModelLoadError(f"timm could not build {name!r}{args}: {type(e).__name__}: {e}") from e
    return model.eval()


def _load_timm_with_file(name: str, wpath: Path, overrides: dict[str, Any]) -> nn.Module:
    """timm builds ``name`` and loads ``wpath`` strictly (its checkpoint filter still adapts e.g. pos_embed).

    timm drops the classifier whenever ``num_classes`` differs from the pretrained config's, so the file's
    own class count is put into the config: a fine-tuned 10-class file keeps its head.
    """
    if not wpath.is_file():  # a folder "did not exist"
        if not wpath.is_dir():
            raise ParameterModelError("weights", str(wpath), problem="does not exist")
        raise ParameterModelError("weights", str(wpath), problem="is a folder",
                                  fix=["the weights file inside it (.safetensors, .pth, .bin)",
                                       (Setting("spec", str(wpath)), Setting("weights", None))])
    kwargs = dict(overrides)
    file_classes = _file_num_classes(wpath, _classifier_names(name))
    wanted = kwargs.pop("num_classes", file_classes)
    overlay: dict[str, Any] = dict(file=str(wpath), label_offset=0)
    if file_classes is not None:
        overlay["num_classes"] = kwargs["num_classes"] = file_classes
    elif wanted is not None:
        kwargs["num_classes"] = wanted
    try:
        with _recorded_loads() as loads:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    except Exception as e:
        raise ModelLoadError(f"could not load {wpath} into timm model {name!r}: {type(e).__name__}: {e}") from e
    # timm loads non-strictly when the class count changes (and only logs what it skipped): only the classifier
    # may be missing from the file, and nothing in it may go unused
    head = {f"{c}.{p}" for c in _classifier_names(name) for p in ("weight", "bias")}
    missing = sorted({k for r in loads for k in r.missing_keys} - head)
    unexpected = sorted({k for r in loads for k in r.unexpected_keys})
    if missing or unexpected:
        raise ModelLoadError(f"{wpath} does not fit timm model {name!r}{f' with {overrides}' if overrides else ''}: "
                             f"{len(missing)} of its parameters are missing from the file ({', '.join(missing[:5])}"
                             f"{', ...' if len(missing) > 5 else ''}) and {len(unexpected)} in the file are not the "
                             f"model's ({', '.join(unexpected[:5])}{', ...' if len(unexpected) > 5 else ''}): are "
                             "these the weights of another architecture or size?")
    if wanted is not None and wanted != file_classes:
        model.reset_classifier(wanted)  # a new task: a fresh head (timm does the same for hub weights)
    return model.eval()


_LOADS_LOCK = threading.Lock()


@contextlib.contextmanager
def _recorded_loads() -> Iterator[list]:
    """Inside the block the results (missing and unexpected keys) of this thread's ``nn.Module.load_state_dict``
    calls are recorded. One block at a time (a lock), so the patched method is always put back as it was; other
    threads' loads run unrecorded meanwhile."""
    with _LOADS_LOCK:
        seen: list = []
        owner = threading.get_ident()
        real = nn.Module.load_state_dict

        def recording(self, *args, **kwargs):
            result = real(self, *args, **kwargs)
            if threading.get_ident() == owner:
                seen.append(result)
            return result

        nn.Module.load_state_dict = recording
        try:
            yield seen
        finally:
            nn.Module.load_state_dict = real


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
        why = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__}"
        size = wpath.stat().st_size if wpath.is_file() else None
        damaged = "it is empty" if size == 0 else "it is damaged or not a weights file"
        raise ModelLoadError(f"could not read weights file {wpath} ({why}): {damaged}; give the model's .safetensors "
                             "(or a PyTorch state dict) as saved") from None
    return int(state[key].shape[0]) if key in state else None


@contextlib.contextmanager
def _honour_offline_env(force: bool = False) -> Iterator[None]:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: honour it when it was set later (a notebook cell);
    ``force``: offline for this block (the hub is unreachable: read the local cache only, no retries)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        yield
        return
    before = constants.HF_HUB_OFFLINE
    if force or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
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
