"""Temporary model states, always restored (also when the body raises): the one home for mode juggling.

``eval_mode`` (every module's own train/eval flag), ``frozen_parameters`` (``requires_grad``),
``explicit_attention`` (timm's per-module ``fused_attn`` flag), ``any_image_size`` (timm's ``dynamic_img_size``
path of a ViT), ``all_patch_tokens`` (timm's ``PatchDropout`` rate) and ``no_checkpointing`` (timm's
``grad_checkpointing``); ``unwrapped``, the module a wrapper runs.
Nothing here imports the rest of vitlab.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torch import nn

__all__ = ["unwrapped", "eval_mode", "frozen_parameters", "explicit_attention", "no_checkpointing", "any_image_size",
           "all_patch_tokens"]


def unwrapped(model: nn.Module) -> nn.Module:
    """The model a wrapper holds, unwrapped to the bottom: ``torch.compile``'s ``OptimizedModule`` (its ``_orig_mod``),
    ``nn.DataParallel`` and ``DistributedDataParallel`` (their ``module``); any other model itself. The analyses
    read and run this module: its attributes (``patch_embed``, ``blocks``, ``num_classes``) are the model's, hooks
    on it run eagerly (a compiled graph would recompile around them), and each map stays with its own image (a
    multi-GPU ``DataParallel`` runs hooks on per-device replicas in any order). Anything but a module (a checkpoint
    path, a model name, None) is refused here, where every analysis starts, with a ``TypeError`` saying to load it."""
    if not isinstance(model, nn.Module):
        raise TypeError(_not_a_module(model))
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def _not_a_module(model: object) -> str:
    """Why ``model`` is no model, and how to get one."""
    if isinstance(model, (str, os.PathLike)):
        return (f"model is the path or name {str(model)!r}, not a loaded model: load it first, "
                f"model = vitlab.load_model({str(model)!r}), and pass that")
    what = "None" if model is None else f"a {type(model).__name__}"
    return (f"model must be a torch nn.Module (a loaded model), got {what}: load one with "
            "vitlab.load_model(name or checkpoint folder)")


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Every submodule in eval mode inside the block (no dropout, no drop-path); each one's own mode restored
    after, so a model whose submodules were in mixed modes comes back exactly as it was."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield model
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Parameters stop requiring grad inside the block (so nothing accumulates in ``.grad``); restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextlib.contextmanager
def _module_flags(model: nn.Module, name: str, value: bool) -> Iterator[nn.Module]:
    """Every module's boolean attribute ``name`` set to ``value`` inside the block, each restored after."""
    mods = [m for m in model.modules() if isinstance(getattr(m, name, None), bool)]
    saved = [getattr(m, name) for m in mods]
    try:
        for m in mods:
            setattr(m, name, value)
        yield model
    finally:
        for m, flag in zip(mods, saved):
            setattr(m, name, flag)


@contextlib.contextmanager
def explicit_attention(model: nn.Module, enabled: bool = True) -> Iterator[nn.Module]:
    """Attention through the explicit softmax (each module's boolean ``fused_attn`` set False) inside the block,
    every flag restored after. Capture needs it (no softmax runs inside SDPA); training on CPU uses it because
    the explicit path's backward is faster there (``benchmarks/train_speed.py`` measures it); timm tests the two
    paths against each other."""
    with _module_flags(model, "fused_attn", False) if enabled else contextlib.nullcontext(model):
        yield model


@contextlib.contextmanager
def no_checkpointing(model: nn.Module) -> Iterator[nn.Module]:
    """Gradient checkpointing off inside the block (every module's boolean ``grad_checkpointing``, as timm's
    ``set_grad_checkpointing(False)`` sets it), each flag restored after. A checkpointed block runs its forward
    without autograd and again during ``backward()``: hooks would record maps outside the graph, then record them
    a second time."""
    with _module_flags(model, "grad_checkpointing", False):
        yield model


@contextlib.contextmanager
def any_image_size(model: nn.Module) -> Iterator[nn.Module]:
    """A timm ViT takes images of any size whose sides are multiples of its patch size inside the block: its patch
    embedding stops checking the size and keeps the (B, h, w, C) grid, and ``_pos_embed`` resamples the position
    table to that grid (bicubic, the prefix tokens' rows kept), as timm does for ``dynamic_img_size=True``. The
    four flags are restored after. Progressive resizing trains through it."""
    from timm.layers import Format

    pe = getattr(model, "patch_embed", None)
    if not hasattr(model, "dynamic_img_size") or not hasattr(pe, "strict_img_size"):
        raise TypeError(f"{type(model).__name__} is not a timm ViT with a patch embedding: any_image_size needs "
                        "VisionTransformer's dynamic_img_size path")
    saved = (model.dynamic_img_size, pe.strict_img_size, pe.flatten, pe.output_fmt)
    try:
        model.dynamic_img_size, pe.strict_img_size, pe.flatten, pe.output_fmt = True, False, False, Format.NHWC
        yield model
    finally:
        model.dynamic_img_size, pe.strict_img_size, pe.flatten, pe.output_fmt = saved


@contextlib.contextmanager
def all_patch_tokens(model: nn.Module) -> Iterator[nn.Module]:
    """Random patch dropping off inside the block: every timm ``PatchDropout`` module of ``model`` keeps all tokens
    in training too (its rate set to 0, as ``patch_drop_rate=0`` builds it), each rate restored after. A model
    without patch dropping passes through unchanged. Training ends with full-token epochs through it (FLIP's
    unmasked tuning)."""
    from timm.layers import PatchDropout

    rates = [(m, m.prob) for m in model.modules() if isinstance(m, PatchDropout)]
    try:
        for m, _ in rates:
            m.prob = 0.0
        yield model
    finally:
        for m, prob in rates:
            m.prob = prob
