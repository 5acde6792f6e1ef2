"""vitlab checkpoints: a folder with ``model.safetensors`` + ``config.json``, written atomically, read strictly.

``save_checkpoint`` writes one; ``load_checkpoint`` rebuilds the model from the config and loads the
weights, turning every kind of damage into a ``ModelLoadError`` that says what is wrong.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from vitlab.base.atomic import (
    check_free_space,
    disk_full_named,
    new_file_mode,
    recover_dir,
    refuse_foreign_dir,
    replace_dir,
    rmtree_quiet,
    temp_dir_beside,
)
from vitlab.base.errors import ModelLoadError, ParameterModelError, Placeholder, Setting, WeightsMismatchError
from vitlab.base.modes import unwrapped
from vitlab.base.provenance import versions
from vitlab.base.shipped import CHECKOUT, data_path
from vitlab.models.config import BiTConfig, HybridConfig, ModelConfig, ViTConfig, config_from_dict, config_to_dict
from vitlab.models.zoo import build_model

__all__ = ["save_checkpoint", "load_checkpoint", "load_module_weights", "model_card", "save_run_checkpoint",
           "load_run_state", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
#: a run folder's identity, written when the run starts (not on resume): an export records it on the card, so a
#: later export of the same run onto the folder it started from knows that card as its own
RUN_ID = "run_id"
WEIGHTS_NAME = "model.safetensors"
FORMAT_NAME = "vitlab-checkpoint"
FORMAT_VERSION = 1
#: Keys of config.json that ``save_checkpoint(extra=...)`` may not overwrite.
RESERVED_META_KEYS = frozenset({"format", "format_version", "config", "pretrained_cfg", "versions", "path"})


def save_checkpoint(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    extra: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    modules: dict[str, nn.Module] | None = None,
) -> Path:
    """Write ``model.safetensors`` + ``config.json`` into ``directory`` atomically.

    Both files are written to a temporary folder beside ``directory`` and moved into place by renames, so
    a crash leaves either the previous checkpoint or the new one, never a mix; if the save fails, the
    previous checkpoint is put back. (Folders cannot be swapped in one rename: a hard crash between the
    two renames leaves the previous checkpoint complete in a hidden ``.NAME.old.*`` folder beside it.) ``directory`` is replaced as a whole, so it must be new, empty or a
    vitlab checkpoint. ``dtype`` (e.g. ``torch.float16``) converts floating-point tensors for a smaller
    file. ``extra`` (JSON-serialisable) is stored in config.json and comes back as ``model.vitlab_checkpoint``.
    ``modules`` adds one ``NAME.safetensors`` per entry (parts that live beside the model, e.g. a masked-patch-
    prediction head), in ``dtype`` too, inside the same atomic swap.
    """
    model = unwrapped(model)  # a torch.compile or DataParallel wrapper: the model it holds, and its keys
    cfg = getattr(model, "vitlab_config", None)
    if cfg is None:
        raise ValueError(
            "this model has no vitlab config (it was not built by vitlab.build_model); "
            "save timm models with timm's own tools, or build the model with vitlab.build_model"
        )
    if not isinstance(directory, (str, os.PathLike)):  # named here: pathlib's own error does not say which argument
        raise TypeError(f"directory must be the path of the folder to write, got {directory!r}")
    directory = Path(directory)
    check_replaceable(directory)
    clash = sorted(n for n in modules or {} if f"{n}.safetensors" == WEIGHTS_NAME or not n or "/" in n)
    if clash:
        raise ValueError(f"modules {clash}: each name becomes NAME.safetensors beside {WEIGHTS_NAME}; pick another "
                         "plain name")
    text = _meta_json(model, cfg, extra)
    state = _state_for_saving(model, dtype)
    states = {name: _state_for_saving(module, dtype) for name, module in (modules or {}).items()}
    needed = _tensor_bytes(state, *states.values()) + len(text.encode())
    check_free_space(directory, needed)  # before anything is written: the previous checkpoint stays as it is
    tmp = temp_dir_beside(directory)  # a folder like any new one: 0777 less the umask, not mkdtemp's private 0700
    try:
        with disk_full_named(directory, needed):  # a full disk names the checkpoint, not the temporary folder
            save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
            for name, module_state in states.items():
                save_file(module_state, str(tmp / f"{name}.safetensors"), metadata={"format": "pt"})
            _as_new_files(tmp)
            (tmp / CONFIG_NAME).write_text(text, encoding="utf-8")
        replace_dir(tmp, directory)
    finally:
        rmtree_quiet(tmp)  # gone already after a successful swap
    return directory


def _tensor_bytes(*states: dict[str, torch.Tensor]) -> int:
    """The bytes the tensors of ``states`` take in safetensors files (their data; each header adds a few kB)."""
    return sum(v.numel() * v.element_size() for state in states for v in state.values())


def _as_new_files(folder: Path) -> None:
    """Give the safetensors files in ``folder`` the mode of any new file (0666 less the umask): safetensors writes
    them 0600 whatever the umask."""
    for f in folder.glob("*.safetensors"):
        f.chmod(new_file_mode())


def resolve_folder(path: str | os.PathLike) -> Path:
    """A checkpoint folder named in a config (a teacher, a warm start, a study's initialisation): as it is when it
    exists or is absolute, else relative to the checkout (``data/checkpoints/...`` from any working directory; a
    shipped one also from a wheel, ``vitlab.base.shipped.data_path``)."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    if len(p.parts) > 1 and p.parts[0] == "data" and ".." not in p.parts:
        return data_path(p.relative_to("data").as_posix())
    return CHECKOUT / p


def check_replaceable(directory: Path) -> None:
    """Refuse to replace a file or a folder that holds something other than a vitlab checkpoint."""
    refuse_foreign_dir(directory, _is_checkpoint_dir, "save_checkpoint", "earlier vitlab checkpoint", "directory")


def recover_checkpoint(directory: str | os.PathLike) -> bool:
    """Put back the checkpoint a kill between ``replace_dir``'s two renames left aside as ``.NAME.old.*``: the
    newest complete one (config and weights), by the epoch it records, then by when it was moved aside. True when
    one was restored; False when ``directory`` exists or there is none."""
    return recover_dir(Path(directory), _recovery_rank)


def _recovery_rank(folder: Path) -> tuple[float, float] | None:
    if not (_is_checkpoint_dir(folder) and (folder / WEIGHTS_NAME).is_file()):
        return None
    epoch = json.loads((folder / CONFIG_NAME).read_text()).get("epoch")
    return float(epoch or 0), folder.stat().st_ctime


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
        "versions": versions(),
        **extra,
    }
    try:
        return json.dumps(meta, indent=2, sort_keys=True) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra must be JSON-serialisable: {e}") from None


def _state_for_saving(model: nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous copies of the state dict (of the module a ``torch.compile`` or ``DataParallel`` wrapper holds:
    the wrapper's keys carry "_orig_mod." or "module."); floating-point tensors cast to ``dtype`` when given."""
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype such as torch.float16, got {dtype}")
    state = {}
    for k, v in unwrapped(model).state_dict().items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[k] = v.contiguous()
    return state


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
    """Same keys and shapes as the model built from the config, or a ``WeightsMismatchError`` listing the
    differences."""
    _check_shapes({k: tuple(v.shape) for k, v in state.items()}, {k: tuple(v.shape) for k, v in ref.items()}, weights)


def _check_shapes(found: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]], weights: Path) -> None:
    """``found`` (a weights file's tensor shapes) against ``wanted`` (the model's): a ``WeightsMismatchError``
    naming the missing, unexpected and mis-shaped tensors when they differ."""
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    shapes = [(k, tuple(found[k]), tuple(wanted[k])) for k in wanted if k in found and tuple(found[k]) != tuple(wanted[k])]
    if missing or unexpected or shapes:
        raise WeightsMismatchError(str(weights), CONFIG_NAME, missing, unexpected, shapes)


def check_pretrained_cfg(pc: object, cfg_file: Path) -> dict[str, Any] | None:
    """A checkpoint's stored ``pretrained_cfg`` (the preprocessing timm and vitlab read the input from) as the model
    carries it (lists as tuples), or None where there is none; a ``ModelLoadError`` naming the entry whose value
    could not be used (a mean that is no list of numbers, a zero std, an input size that is no (C, H, W) of
    positive ints, an unknown interpolation, a crop fraction outside (0, 1])."""
    from vitlab.models.config import INTERPOLATIONS, check_channel_stats

    if pc is None:
        return None
    if not isinstance(pc, dict):
        raise ModelLoadError(f"{cfg_file}: pretrained_cfg must be a JSON object, got {type(pc).__name__}; the "
                             "checkpoint is damaged")
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in pc.items()}
    try:
        size = out.get("input_size", (3, 1, 1))
        if not (isinstance(size, tuple) and len(size) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
            raise ValueError(f"input_size must be (channels, height, width) of positive ints, got {size!r}")
        for name in ("mean", "std"):
            if name in out:
                check_channel_stats(name, out[name])
                if len(out[name]) not in (1, size[0]):
                    raise ValueError(f"{name} gives {len(out[name])} values for {size[0]} input channels")
        if "interpolation" in out and out["interpolation"] not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got "
                             f"{out['interpolation']!r}")
        crop = out.get("crop_pct", 1.0)
        if isinstance(crop, bool) or not isinstance(crop, (int, float)) or not 0 < crop <= 1:
            raise ValueError(f"crop_pct must be a number in (0, 1], got {crop!r}")
    except ValueError as e:
        raise ModelLoadError(f"{cfg_file}: pretrained_cfg is invalid: {e}; the checkpoint is damaged") from None
    return out


def _header_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape as a safetensors file's header states it, without reading the tensors' data; a
    ``ModelLoadError`` when the header cannot be read."""
    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error type for damaged files
        raise ModelLoadError(
            f"{weights} could not be read ({type(e).__name__}: {e}); the checkpoint is damaged"
        ) from None


def _block_count(cfg: ModelConfig) -> int:
    """The blocks (transformer blocks, residual blocks, stages) ``cfg`` builds: each holds at least one tensor."""
    if isinstance(cfg, HybridConfig):
        return cfg.vit.depth + sum(cfg.layers)
    if isinstance(cfg, ViTConfig):
        return cfg.depth
    if isinstance(cfg, BiTConfig):
        return sum(cfg.layers)
    return len(cfg.widths)  # CifarNetConfig


def config_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of the model ``cfg`` builds, found by building it on torch's ``meta`` device: no
    memory is allocated for its tensors, however large the config."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def load_checkpoint(path: str | os.PathLike) -> nn.Module:
    """The model saved by ``save_checkpoint``, in eval mode; ``path`` is its folder or either of its files.

    The config's ``extra`` entries come back as ``model.vitlab_checkpoint`` (with the folder as ``"path"``).
    Every problem (missing files, damaged JSON or weights, weights that do not fit the config) is a
    ``ModelLoadError`` saying what is wrong.
    """
    if not isinstance(path, (str, os.PathLike)):  # named here: pathlib's own error does not say which argument
        raise ModelLoadError(f"path must be a vitlab checkpoint folder or one of its two files, got {path!r} "
                             "(vitlab.load_model() with no argument loads the embedded default model)")
    path = Path(path)
    if not path.exists():  # a kill between the two renames of its replacement left its previous copy beside it
        recover_checkpoint(path)
    if not path.exists():  # not its parent's checkpoint: a misspelt folder inside a checkpoint must not load that
        raise ModelLoadError(f"{path} does not exist: give a vitlab checkpoint folder (config.json and "
                             "model.safetensors) or one of its two files")
    directory = path if path.is_dir() else path.parent
    cfg_file, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if path.is_file() and path.name not in (CONFIG_NAME, WEIGHTS_NAME):
        raise ParameterModelError(
            "spec", str(path), problem="a file, not a vitlab checkpoint folder: a weights file (.safetensors, .pth, "
            ".bin) belongs to an architecture", fix=[(Setting("spec", Placeholder("TIMM_NAME")),
                                                      Setting("weights", str(path)))])
    if not cfg_file.is_file() or not weights.is_file():
        raise ParameterModelError(
            "spec", str(directory), problem=f"not a vitlab checkpoint: it needs both {CONFIG_NAME} and "
            f"{WEIGHTS_NAME} (as written by vitlab.save_checkpoint)",
            fix=[(Setting("spec", Placeholder("TIMM_NAME")), Setting("weights", Placeholder("FILE")))])
    meta = _read_meta(cfg_file)
    cfg = config_from_dict(meta["config"])
    pretrained_cfg = check_pretrained_cfg(meta.get("pretrained_cfg"), cfg_file)
    # the config's shapes against the weights file's header before anything is allocated: a small file whose
    # config.json asks for a huge model is refused without building it (and, where it asks for more blocks than the
    # file has tensors, without building even its shapes, whose Python objects grow with the depth)
    header = _header_shapes(weights)
    if (blocks := _block_count(cfg)) > len(header):
        raise ModelLoadError(f"{cfg_file} describes a model of {blocks:,} blocks but {weights} holds {len(header)} "
                             "tensors (every block has at least one): the checkpoint is damaged or its files come "
                             "from different saves")
    _check_shapes(header, config_shapes(cfg), weights)
    model = build_model(cfg)
    ref = model.state_dict()
    state = _read_weights(weights)
    _check_state(state, ref, weights)
    model.load_state_dict({k: v.to(ref[k].dtype) for k, v in state.items()}, strict=True)
    if pretrained_cfg is not None:
        model.pretrained_cfg = model.default_cfg = pretrained_cfg
    model.vitlab_checkpoint = {k: v for k, v in meta.items() if k not in ("config", "pretrained_cfg")}
    model.vitlab_checkpoint["path"] = str(directory)
    return model.eval()


def load_module_weights(module: nn.Module, weights: str | os.PathLike) -> nn.Module:
    """Load a module saved beside a checkpoint's model (``save_checkpoint(modules=...)``, e.g. the MPP prediction
    head ``objective.safetensors``) into ``module``, built from the checkpoint's config, in its dtype; returns it.
    As in ``load_checkpoint``, a file that cannot be read or does not fit the module (keys, shapes) is a
    ``ModelLoadError`` naming the file and what is wrong."""
    weights = Path(weights)
    ref = module.state_dict()
    state = _read_weights(weights)
    _check_state(state, ref, weights)
    module.load_state_dict({k: v.to(ref[k].dtype) for k, v in state.items()}, strict=True)
    return module


def model_card(model: nn.Module) -> dict[str, Any] | None:
    """The ``card.json`` facts (accuracy, command, data, hours) of the shipped checkpoint ``model`` was loaded
    from; None for models without one (timm names, fresh models, run checkpoints)."""
    path = getattr(model, "vitlab_checkpoint", {}).get("path")
    card = Path(path) / "card.json" if path else None
    if card is None or not card.is_file():
        return None
    return json.loads(card.read_text())


def card_metric(card: dict[str, Any]) -> tuple[str, float | None]:
    """(what a card's headline number measures, its value): "test accuracy", or for an encoder pre-trained by masked
    patch prediction (``objective="mpp"``, labels never read) "masked-patch accuracy" (None for its l2 target)."""
    if card.get("objective", "classify") == "mpp":
        return "masked-patch accuracy", (card.get("mpp_test") or {}).get("accuracy")
    return "test accuracy", card.get("test_accuracy")


def card_line(card: dict[str, Any]) -> str:
    """``62.02% test accuracy on cifar10 test, 9 of 15 epochs`` (the headline of ``card_metric``); for a model
    trained in several legs (warm starts) ``..., 17.69 h of training in 12 legs, its last leg 125 of 125 epochs``."""
    name, value = card_metric(card)
    number = f"{value:.2%} {name}" if value is not None else f"no {name}"
    epochs = f"{card['epochs_done']} of {card['epochs_planned']} epochs"
    legs = card.get("lineage") or []
    if len(legs) > 1:
        hours = card.get("total_train_hours", legs[-1]["total_train_hours"])
        epochs = f"{hours:.2f} h of training in {len(legs)} legs, its last leg {epochs}"
    return f"{number} on {card['data']['test']}, {epochs}"


# ---------------------------------------------------------------------------------------------- run checkpoints


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer's state as flat tensors (``state.<param index>.<name>``) for safetensors, plus its groups."""
    sd = opt.state_dict()
    tensors = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            tensors[f"state.{idx}.{k}"] = torch.as_tensor(v).detach().cpu().contiguous()
    return tensors, {"param_groups": sd["param_groups"]}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in tensors.items():
        _, idx, k = key.split(".", 2)
        state.setdefault(int(idx), {})[k] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def save_run_checkpoint(directory: str | os.PathLike, model: nn.Module, opt: torch.optim.Optimizer,
                        ema: nn.Module | None, extra: dict[str, Any],
                        modules: dict[str, nn.Module] | None = None) -> Path:
    """A resumable training checkpoint, written atomically as one folder: the model checkpoint (``extra`` in its
    config.json) plus ``optimizer.safetensors`` / ``optimizer.json``, with an EMA ``ema.safetensors``, and one
    ``NAME.safetensors`` per entry of ``modules`` (training-only parts beside the model, e.g. an objective's head)."""
    directory = Path(directory)
    check_replaceable(directory)  # it replaces the whole folder: only an earlier checkpoint's, or a new one
    tensors, meta = _flatten_optimizer(opt)
    parts = {"optimizer": tensors, **({"ema": _state_for_saving(ema, None)} if ema is not None else {}),
             **{name: _state_for_saving(module, None) for name, module in (modules or {}).items()}}
    needed = _tensor_bytes(unwrapped(model).state_dict(), *parts.values())
    check_free_space(directory, needed)  # before anything is written: the previous checkpoint stays resumable
    tmp = temp_dir_beside(directory)  # a failure to make it names the checkpoint, not the temporary folder
    try:
        with disk_full_named(directory, needed):  # a full disk names the checkpoint, not the temporary folder
            ck = save_checkpoint(model, tmp / directory.name, extra=extra)
            for name, state in parts.items():
                save_file(state, str(ck / f"{name}.safetensors"))
            (ck / "optimizer.json").write_text(json.dumps(meta), encoding="utf-8")
            _as_new_files(ck)
        replace_dir(ck, directory)
    finally:
        rmtree_quiet(tmp)
    return directory


#: optimizer param-group flags that choose an implementation, not the update: kept as built when a checkpoint loads
_IMPLEMENTATION_FLAGS = ("foreach", "fused")


def load_run_state(directory: str | os.PathLike, opt: torch.optim.Optimizer, ema: nn.Module | None,
                   device: torch.device | str = "cpu", modules: dict[str, nn.Module] | None = None) -> dict[str, Any]:
    """Load the optimizer (and EMA, and ``modules``) state of a ``save_run_checkpoint`` folder in place; return its
    config.json. The optimizer keeps the implementation it was built with (``foreach``/``fused``: how fast the
    update runs here, not what it computes), whichever one the checkpoint's process used.

    All or nothing: every file is read and checked against what it loads into (keys, shapes, parameter groups)
    before anything changes, and a damaged, missing or mismatched file is a ``ModelLoadError`` naming it and the way
    on (a new leg from the checkpoint's model weights), with the optimizer, EMA and modules as they were."""
    directory = Path(directory)
    try:
        states = {}
        for name, module in (modules or {}).items():
            states[name] = _read_weights(directory / f"{name}.safetensors")
            _check_state(states[name], module.state_dict(), directory / f"{name}.safetensors")
        opt_state = _optimizer_state(directory, opt)
        ema_state = None
        if ema is not None:
            ema_state = _read_weights(directory / "ema.safetensors")
            _check_state(ema_state, ema.state_dict(), directory / "ema.safetensors")
        config = _read_json(directory / CONFIG_NAME)
    except ModelLoadError as e:
        raise ParameterModelError("resume", True, problem=f"{e}. The run cannot resume from it", fix=[
            (Setting("init_from", str(directory), config=True), Setting("run_dir", Placeholder("NEW"))),
            "train the run afresh"]) from None
    for name, module in (modules or {}).items():
        ref = module.state_dict()
        module.load_state_dict({k: v.to(ref[k].dtype) for k, v in states[name].items()}, strict=True)
    impl = [{k: g[k] for k in _IMPLEMENTATION_FLAGS if k in g} for g in opt.param_groups]
    opt.load_state_dict(opt_state)
    for group, flags in zip(opt.param_groups, impl):
        group.update(flags)
    if ema_state is not None:
        ema.load_state_dict({k: v.to(device) for k, v in ema_state.items()})
    return config


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path} could not be read ({type(e).__name__}: {e}); the checkpoint is damaged"
                             ) from None


def _optimizer_state(directory: Path, opt: torch.optim.Optimizer) -> dict:
    """The optimizer state of a run checkpoint, checked against ``opt`` (its parameter groups and their sizes, what
    ``load_state_dict`` requires) without changing it; a ``ModelLoadError`` naming the file otherwise."""
    tensors, meta = _read_weights(directory / "optimizer.safetensors"), _read_json(directory / "optimizer.json")
    try:
        state = _unflatten_optimizer(tensors, meta)
        groups = state["param_groups"]
        sizes = [len(g["params"]) for g in groups]
        ids = {i for g in groups for i in g["params"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{directory / 'optimizer.json'} is not an optimizer state vitlab wrote ({type(e).__name__}: "
                             f"{e}); the checkpoint is damaged") from None
    want = [len(g["params"]) for g in opt.param_groups]
    if sizes != want or not set(state["state"]) <= ids:
        raise ModelLoadError(f"{directory / 'optimizer.json'} holds parameter groups of sizes {sizes} where this model's "
                             f"optimizer has {want}; the checkpoint's files come from different saves or models")
    return state
