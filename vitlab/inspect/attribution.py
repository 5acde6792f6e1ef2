"""Class-specific maps in the rollout's (B, gh, gw) patch format.

* ``gradient_rollout``: each layer's attention weighted by its own gradient of the target logit, positive
  part, heads averaged, accumulated as ``R <- R + A R`` from the identity (Chefer et al. 2021, "Generic
  attention-model explainability"); the readout row over the patches is returned.
* ``integrated_gradients``: captum's IntegratedGradients on the pixels, summed over channels and over
  the pixels of each patch.
* ``occlusion``: captum's FeatureAblation with one feature per patch (patch-aligned masks): the drop of
  the target logit when that patch is replaced by the baseline.

All take ``target`` as (B,) class indices, one index for every image, or None for the model's own prediction;
indices are checked (whole numbers in [0, num_classes)) before any map is computed. Models keep their
parameters' ``requires_grad`` flags and gain no ``.grad``: gradients are taken with respect to the
inputs and the captured maps only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from vitlab.base.checks import check_count
from vitlab.base.modes import eval_mode, frozen_parameters
from vitlab.inspect.capture import capture_attention, check_images
from vitlab.inspect.rollout import attention_rollout, check_readout, check_start_layer, readout_vector
from vitlab.models.info import AnyModel, ModelInfo, resolve_model

__all__ = ["gradient_rollout", "integrated_gradients", "occlusion", "patch_mask", "ATTRIBUTION_METHODS",
           "attribution", "attribution_method", "predicted_class", "has_classifier", "require_classifier",
           "target_classes"]


def has_classifier(model: AnyModel) -> bool:
    """False for a model built without a classifier head (timm's ``num_classes=0``, e.g. the paper's own
    ``.orig_in21k`` weights), whose output is its features, not class scores."""
    model = resolve_model(model).module
    return getattr(model, "num_classes", None) != 0


def require_classifier(model: AnyModel, what: str) -> None:
    """Refuse a class-specific method on a model without a classifier head: its argmax would be a feature index."""
    if not has_classifier(model):
        raise ValueError(f"{what} needs class scores, but this model has no classifier head (num_classes=0: its "
                         "output is its features, as for timm's .orig_in21k weights). Use a model with a head, e.g. "
                         "'vit_base_patch16_224.augreg2_in21k_ft_in1k', or attention and rollout, which need none")


@torch.no_grad()
def predicted_class(model: AnyModel, images: Tensor, batch_size: int = 64) -> Tensor:
    """(B,) argmax of the logits (eval mode)."""
    rm = resolve_model(model)
    model = rm.module
    require_classifier(rm, "a predicted class")
    check_images(images, rm)
    with eval_mode(model):
        return torch.cat([model(images[i:i + batch_size]).argmax(-1) for i in range(0, len(images), batch_size)])


def _num_classes(model: nn.Module, images: Tensor) -> int:
    """The width of the class scores of ``model``, the module itself (``ResolvedModel.module``): its ``num_classes``
    (timm's), else one forward pass on an image."""
    n = getattr(model, "num_classes", None)
    if isinstance(n, int) and n > 0:
        return n
    with torch.no_grad(), eval_mode(model):
        return int(model(images[:1]).shape[-1])


def _entries(t: Tensor, bad: Tensor, limit: int = 5) -> str:
    """``target 10`` or ``target[1] = 10, target[3] = -1``: the offending entries of ``t`` (at most ``limit``)."""
    if t.dim() == 0:
        return f"target {t.item():g}" if t.is_floating_point() else f"target {t.item()}"
    idx = bad.nonzero().flatten().tolist()
    fmt = (lambda v: f"{v:g}") if t.is_floating_point() else str
    text = ", ".join(f"target[{i}] = {fmt(t[i].item())}" for i in idx[:limit])
    return text + (f" and {len(idx) - limit} more" if len(idx) > limit else "")


def target_classes(model: AnyModel, images: Tensor, target: Tensor | int | None, batch_size: int = 64) -> Tensor:
    """(B,) int64 class indices on ``images``' device: ``target`` as one index for every image or one per image,
    checked to be whole numbers in [0, num_classes); None: the model's prediction."""
    rm = resolve_model(model)
    require_classifier(rm, "a class-specific map")
    if target is None:
        return predicted_class(rm, images, batch_size)
    try:
        raw = torch.as_tensor(target).detach().cpu()
    except (TypeError, ValueError, RuntimeError):  # a class name, a ragged list: torch's "new(): invalid data type"
        raise ValueError(f"target must be a class index, one per image, or None for the model's prediction, got "
                         f"{target!r}") from None
    if raw.dtype == torch.bool or raw.is_complex():
        raise ValueError(f"target must be class indices (integers), got a {raw.dtype} tensor")
    if raw.is_floating_point():
        bad = ~(torch.isfinite(raw) & (raw == raw.round()))
        if bool(bad.any()):
            raise ValueError(f"target must be whole class indices, got {_entries(raw, bad)}")
    if raw.dim() != 0 and raw.shape != (len(images),):
        raise ValueError(f"target must be one class index or one per image ({len(images)}), got shape "
                         f"{tuple(raw.shape)}")
    n = _num_classes(rm.module, images)
    bad = (raw < 0) | (raw >= n)
    if bool(bad.any()):
        raise ValueError(f"{_entries(raw, bad)}: not a class index of this model, which has {n} classes (valid: 0 "
                         f"to {n - 1})")
    t = raw.long()
    t = t.expand(len(images)) if t.dim() == 0 else t
    return t.to(images.device)


def gradient_rollout(model: AnyModel, images: Tensor, target: Tensor | int | None = None,
                     start_layer: int = 0) -> Tensor:
    """(B, gh, gw) gradient-weighted rollout of the readout over the patches, for class ``target``.

    Per layer l (from ``start_layer``): ``A_l = mean_heads(relu(grad_l * attn_l))`` with ``grad_l`` the
    gradient of the target logit with respect to that layer's attention; ``R <- R + A_l R`` from ``R = I``.
    """
    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    info = rm.info_for(images)
    check_readout(info)
    check_start_layer(start_layer, info.depth)
    t = target_classes(rm, images, target)
    # autograd also inside a caller's torch.inference_mode(): the clones made here are ordinary tensors it can save
    with torch.inference_mode(False):
        x, t = images.detach().clone().requires_grad_(True), t.clone()
    with (torch.inference_mode(False), frozen_parameters(model), torch.enable_grad(),
          capture_attention(rm, keep_grad=True) as cap):
        logits = model(x)
        logits.gather(1, t[:, None]).sum().backward()
        maps, grads, pool = cap.stack(), cap.grads(), cap.pool_maps()
    L, B = maps.shape[:2]
    v = readout_vector(info, B, pool, device=maps.device).unsqueeze(1)  # (B, 1, T): the readout row, carried down the layers
    for layer in range(L - 1, start_layer - 1, -1):
        a = (grads[layer] * maps[layer]).clamp_min(0).mean(1).double()  # (B, T, T)
        v = v + v @ a  # v (I + A_L) ... (I + A_start)
    return v.squeeze(1)[:, info.num_prefix_tokens:].reshape(B, *info.grid_size).float()


def patch_mask(info: ModelInfo, device: torch.device | None = None) -> Tensor:
    """(1, 1, H, W) int64: the index of the patch token each pixel belongs to (row-major over the grid)."""
    (gh, gw), (ph, pw) = info.grid_size, info.patch_size
    ids = torch.arange(gh * gw, device=device).view(gh, gw)
    mask = ids.repeat_interleave(ph, 0).repeat_interleave(pw, 1)
    H, W = info.img_size
    if mask.shape != (H, W):  # a hybrid's stride may not tile the image exactly: pad with the edge patches
        mask = torch.nn.functional.pad(mask[None, None].float(), (0, W - mask.shape[1], 0, H - mask.shape[0]),
                                       mode="replicate")[0, 0].long()
    return mask[None, None]


def _pool_to_patches(attr: Tensor, info: ModelInfo) -> Tensor:
    """(B, C, H, W) pixel attributions -> (B, gh, gw): summed over channels and the pixels of each patch."""
    mask = patch_mask(info, attr.device).view(-1)
    per_pixel = attr.sum(1).flatten(1).double()  # (B, H*W)
    out = torch.zeros(len(attr), info.num_patches, dtype=torch.float64, device=attr.device)
    mask = mask.to(attr.device)
    out.index_add_(1, mask, per_pixel)
    return out.view(len(attr), *info.grid_size).float()


def _check_baseline(baseline: object) -> None:
    """Refuse a baseline that is not one number in input space (not deletion_insertion's "blur") before captum, whose
    own check is a bare AssertionError."""
    if isinstance(baseline, bool) or not isinstance(baseline, (int, float)):
        raise ValueError(f"baseline must be a number in the model's input space (0 = the normalisation mean, a grey "
                         f"image), got {baseline!r}")


def integrated_gradients(model: AnyModel, images: Tensor, target: Tensor | int | None = None, steps: int = 32,
                         baseline: float = 0.0, internal_batch_size: int = 256) -> Tensor:
    """(B, gh, gw) integrated gradients (captum) of the target logit, summed per patch.

    ``baseline`` is a constant in the model's input space (0 = the normalisation mean, a grey image).
    """
    from captum.attr import IntegratedGradients

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("steps", steps)
    check_count("internal_batch_size", internal_batch_size)
    _check_baseline(baseline)
    info = rm.info_for(images)
    t = target_classes(rm, images, target)
    with torch.inference_mode(False):  # autograd also inside a caller's torch.inference_mode(), on ordinary clones
        images, t = images.clone(), t.clone()
    with torch.inference_mode(False), eval_mode(model), frozen_parameters(model), torch.enable_grad():
        attr = IntegratedGradients(model).attribute(images, baselines=baseline, target=t, n_steps=steps,
                                                    internal_batch_size=internal_batch_size)
    return _pool_to_patches(attr.detach(), info)


@torch.no_grad()
def occlusion(model: AnyModel, images: Tensor, target: Tensor | int | None = None, baseline: float = 0.0,
              perturbations_per_eval: int = 64) -> Tensor:
    """(B, gh, gw) drop of the target logit when each patch alone is replaced by ``baseline`` (captum)."""
    from captum.attr import FeatureAblation

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("perturbations_per_eval", perturbations_per_eval)
    _check_baseline(baseline)
    info = rm.info_for(images)
    t = target_classes(rm, images, target)
    mask = patch_mask(info, images.device)
    with eval_mode(model):
        attr = FeatureAblation(model).attribute(images, baselines=baseline, target=t, feature_mask=mask,
                                                perturbations_per_eval=perturbations_per_eval)
    # every pixel of a patch carries the patch's value: read one pixel per patch
    (ph, pw) = info.patch_size
    return attr[:, 0, ::ph, ::pw][:, : info.grid_size[0], : info.grid_size[1]].float()


def _rollout(model: AnyModel, images: Tensor, target: Tensor | int | None = None) -> Tensor:
    return attention_rollout(model, images)


ATTRIBUTION_METHODS: dict[str, Callable[..., Tensor]] = {
    "rollout": _rollout,
    "gradient rollout": gradient_rollout,
    "integrated gradients": integrated_gradients,
    "occlusion": occlusion,
}


def attribution_method(name: str) -> Callable[..., Tensor]:
    """The ``(model, images, target)`` function of ``ATTRIBUTION_METHODS[name]``, or an error naming the choices."""
    if name not in ATTRIBUTION_METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {sorted(ATTRIBUTION_METHODS)}")
    return ATTRIBUTION_METHODS[name]


def attribution(method: str, model: AnyModel, images: Tensor, target: Tensor | int | None = None) -> Tensor:
    """(B, gh, gw) map of ``method`` (a key of ``ATTRIBUTION_METHODS``); rollout ignores ``target``."""
    return attribution_method(method)(model, images, target)
