"""A warm start: a new run begins from a checkpoint's weights with its own fresh schedule (``TrainConfig.init_from``).
``warm_start`` copies every tensor whose name and shape match, adapts position embeddings of another grid or prefix
layout, and says what stayed fresh; ``warm_start_objective`` carries a masked-patch-prediction head over when it
fits. (A ``--resume`` is not a warm start: it restores the run's own state, ``vitlab.models.checkpoint``.)
"""

from __future__ import annotations

import json
import os

import torch
from torch import Tensor, nn

from vitlab.base.errors import ModelLoadError
from vitlab.models.checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_checkpoint, load_module_weights, resolve_folder
from vitlab.models.finetune import resample_grid
from vitlab.models.info import ResolvedModel, resolve_model
from vitlab.train.mpp import OBJECTIVE_NAME, MaskedPatchPrediction

__all__ = ["warm_start", "warm_start_objective", "check_init_from"]


def check_init_from(path: str | os.PathLike) -> None:
    """Refuse, before a run starts, an ``init_from`` that names no vitlab checkpoint: a file other than a
    checkpoint's own two (a timm weights file cannot start a vitlab model: it holds no config), or a folder without
    ``config.json`` and ``model.safetensors`` (a run folder is pointed to its ``checkpoint/``). A ``ModelLoadError``
    naming ``init_from`` and the fix; a path that does not exist is left to ``load_checkpoint``, which restores a
    copy a kill left aside or says so."""
    p = resolve_folder(path)
    fix = ("init_from takes a vitlab checkpoint folder (config.json and model.safetensors): a run's checkpoint/ "
           "folder or an exported one such as data/checkpoints/vit_cifar10")
    if p.is_file() and p.name not in (CONFIG_NAME, WEIGHTS_NAME):
        raise ModelLoadError(f"init_from={str(path)!r} is a file; {fix}. A timm weights file cannot start a "
                             "vitlab run: it holds no model config")
    if p.is_dir() and not ((p / CONFIG_NAME).is_file() and (p / WEIGHTS_NAME).is_file()):
        run_ck = p / "checkpoint"
        hint = (f" ({path} is a training run: give its checkpoint, init_from={str(run_ck)!r})"
                if (run_ck / CONFIG_NAME).is_file() else "")
        raise ModelLoadError(f"init_from={str(path)!r} holds no vitlab checkpoint{hint}; {fix}")


def warm_start(model: nn.Module, path: str | os.PathLike) -> list[str]:
    """Copy every tensor of checkpoint ``path`` whose name and shape match into ``model``; return what was not copied
    as saved: the names of ``model``'s tensors left at their initialisation (e.g. a new distillation token, or the
    classifier of an encoder pre-trained without labels, which was never trained), and a note for position
    embeddings adapted to another layout ("pos_embed (grid resampled ...)", "pos_embed (prefix rows ...)": the
    latter left at their initialisation). Position embeddings of a
    different layout keep what carries over: the grid rows (resampled in 2D when the grids differ, as for
    fine-tuning at another resolution) and the prefix rows both models have (the class token's first). A checkpoint
    that would fill less than half of the model's weights (another architecture or size) is a ``ValueError``, with
    the model unchanged."""
    check_init_from(path)
    src_model = load_checkpoint(resolve_folder(path))  # data/checkpoints/... from any working directory
    src = src_model.state_dict()
    own = model.state_dict()
    fresh = []
    untrained = _untrained_heads(src_model)
    dst, src_resolved = resolve_model(model), resolve_model(src_model)  # their facts read once, when first asked
    fixed_pos = "pos_embed" in own and dst.info().pos_embed == "fixed"  # e.g. its own exact sin-cos table
    copies: dict[str, Tensor] = {}  # every tensor made first, then copied: a failure leaves the model as it was
    with torch.no_grad():
        for k, v in own.items():
            w = src.get(k)
            if any(k == h or k.startswith(h + ".") for h in untrained):
                fresh.append(k)  # e.g. a masked-patch-prediction encoder's classifier: never trained, not copied
            elif k == "pos_embed" and fixed_pos:
                continue  # built for this model's grid; resampling another grid's table would only blur it
            elif w is not None and k == "pos_embed" and w.shape != v.shape and w.shape[-1] == v.shape[-1]:
                copies[k] = v.clone()
                fresh += _warm_pos_embed(copies[k], w, dst, src_resolved)
            elif w is not None and w.shape == v.shape:
                copies[k] = w.to(v.dtype)
            else:
                fresh.append(k)
        carried = sum(own[k].numel() for k in copies if own[k].is_floating_point())
        total = sum(v.numel() for v in own.values() if v.is_floating_point())
        if carried < total / 2:  # another architecture or size: a "warm start" that is really a fresh one
            raise ValueError(
                f"init_from {path}: its {type(src_model).__name__} shares {carried / max(total, 1):.0%} of this "
                f"{type(model).__name__}'s weights by name and shape (a warm start copies only those), so the run "
                "would start almost from scratch: the checkpoint is another architecture or size. Give a checkpoint "
                "of this model's shape, or leave init_from unset to train from scratch")
        for k, w in copies.items():
            own[k].copy_(w)
    return fresh


def warm_start_objective(objective: MaskedPatchPrediction, path: str | os.PathLike) -> str:
    """Masked patch prediction warm-started from checkpoint ``path``: its [mask] embedding and prediction head
    (``objective.safetensors``) into ``objective`` when it was pre-trained by masked patch prediction for the same
    target (the head fits; the corruption rate may differ), so that the encoder ``warm_start`` copied goes on with
    the head it was trained with; otherwise both stay fresh. Returns a sentence saying which."""
    p = resolve_folder(path)
    folder = p if p.is_dir() else p.parent
    meta_file = folder / "config.json"
    src = (json.loads(meta_file.read_text()).get("train") or {}) if meta_file.is_file() else {}
    if src.get("objective") != "mpp" or not (folder / OBJECTIVE_NAME).is_file():
        return f"{path} holds no masked-patch-prediction head: the [mask] embedding and the head start fresh"
    if src.get("mpp_target") != objective.target:
        return (f"{path} predicts the {src.get('mpp_target')!r} target, this run {objective.target!r}: the [mask] "
                "embedding and the head start fresh")
    load_module_weights(objective, folder / OBJECTIVE_NAME)  # a head that does not fit: a ModelLoadError naming it
    return f"the [mask] embedding and the prediction head come from {path} ({OBJECTIVE_NAME})"


def _untrained_heads(model: nn.Module) -> tuple[str, ...]:
    """The classifier module names of a checkpoint whose training never read labels (``objective="mpp"``)."""
    train_cfg = (getattr(model, "vitlab_checkpoint", None) or {}).get("train") or {}
    if train_cfg.get("objective", "classify") == "classify":
        return ()
    heads = getattr(model, "pretrained_cfg", {}).get("classifier", "head")
    return (heads,) if isinstance(heads, str) else tuple(heads)


def _warm_pos_embed(v: Tensor, w: Tensor, model: ResolvedModel, src_model: ResolvedModel) -> list[str]:
    """Fill ``v`` (1, P + N, D) in place from ``w`` (1, P' + N', D); returns what stayed fresh."""
    def layout(m: ResolvedModel) -> tuple[int, tuple[int, int]]:  # prefix rows of pos_embed and the grid, per ModelInfo
        info = m.info()
        return (info.num_prefix_tokens if info.pos_embed_has_prefix else 0), tuple(info.grid_size)

    (p_dst, g_dst), (p_src, g_src) = layout(model), layout(src_model)
    grid = resample_grid(w[:, p_src:], g_src, g_dst)  # as for fine-tuning at another resolution
    v[:, p_dst:] = grid.to(v.dtype)
    shared = min(p_src, p_dst)
    v[:, :shared] = w[:, :shared].to(v.dtype)  # class token first, in timm's order
    notes = [f"pos_embed (grid resampled {g_src} -> {g_dst})"] if g_src != g_dst else []
    if p_dst > shared:
        notes.append(f"pos_embed (prefix rows {shared}..{p_dst - 1})")
    return notes
