"""Is a (B, gh, gw) map faithful to the model, and does it find the object?

* ``deletion_insertion``: patches removed (deletion) or revealed (insertion) in the map's order, most
  important first; the target probability traced over the fraction of patches changed and its area under
  the curve taken (Petsiuk et al. 2018, at patch level). Deletion: lower is better; insertion: higher.
* ``randomization_sanity``: the map recomputed on a copy of the model with re-initialised weights
  (Adebayo et al. 2018); the Spearman correlation with the original map should be low for a method that
  depends on what the model learned.
* ``localisation``: on images with object masks, the share of the map's positive mass on the object and
  the pointing game (does the top patch touch the object?), beside the chance level of a uniform map.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.base.checks import check_count, check_seed
from vitlab.base.modes import eval_mode
from vitlab.base.stats import spearman
from vitlab.inspect.attribution import (
    attribution_method,
    has_classifier,
    patch_mask,
    predicted_class,
    require_classifier,
    target_classes,
)
from vitlab.inspect.capture import check_images
from vitlab.inspect.rollout import attention_rollout
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["deletion_insertion", "deletion_insertion_scorer", "randomization_sanity", "localisation", "rank_correlation",
           "randomized_copy", "check_masks"]


def _check_maps(maps: Tensor, images: Tensor, grid: tuple[int, int]) -> None:
    if maps.shape != (len(images), *grid):
        raise ValueError(f"maps must have shape (B, gh, gw) = {(len(images), *grid)} for these images, got "
                         f"{tuple(maps.shape)}")
    if not torch.isfinite(maps).all():
        raise ValueError("maps contain NaN or infinite values")


def deletion_insertion(model: AnyModel, images: Tensor, maps: Tensor, target: Tensor | int | None = None,
                       steps: int = 16, baseline: str | float = "blur", batch_size: int = 64) -> dict[str, Tensor]:
    """Deletion and insertion curves and AUCs for each image.

    ``images`` (B, C, H, W) as the model takes them; ``maps`` (B, gh, gw); ``target`` (B,) classes or one class
    for every image (default: the prediction). At step s of ``steps``, the top ``round(s / steps * N)`` patches of the map are replaced
    by the baseline (deletion) or taken from the image into the baseline (insertion). ``baseline``:
    ``"blur"`` (a heavily blurred copy, as RISE uses for insertion) or a constant in input space (0 = the
    normalisation mean). Returns ``deletion``/``insertion`` (B,) AUCs in [0, 1] and the (B, steps + 1) curves.
    Several maps of the same images: ``deletion_insertion_scorer``, which does the shared work once.
    """
    rm = resolve_model(model)
    model = rm.module
    require_classifier(rm, "deletion and insertion (the probability of a class)")
    check_images(images, rm)
    _check_maps(maps, images, rm.info_for(images).grid_size)
    return deletion_insertion_scorer(rm, images, target, steps, baseline, batch_size)(maps)


@torch.no_grad()
def deletion_insertion_scorer(model: AnyModel, images: Tensor, target: Tensor | int | None = None, steps: int = 16,
                              baseline: str | float = "blur", batch_size: int = 64
                              ) -> Callable[[Tensor], dict[str, Tensor]]:
    """``deletion_insertion`` of these images as a function of the (B, gh, gw) maps alone: the checks, the target
    classes, the baseline and both ends of the curves (the unchanged images and the baseline, the same for every
    map) are done once here, so each map costs only its steps 1 to ``steps - 1``."""
    rm = resolve_model(model)
    model = rm.module
    require_classifier(rm, "deletion and insertion (the probability of a class)")
    check_images(images, rm)
    info = rm.info_for(images)
    check_count("steps", steps)
    check_count("batch_size", batch_size)
    blur = isinstance(baseline, str) and baseline == "blur"
    # before the prediction's forward pass; a bool is an int to Python, but True is no pixel value
    if not blur and (isinstance(baseline, bool) or not isinstance(baseline, (int, float))):
        raise ValueError(f"baseline must be 'blur' or a number, got {baseline!r}")
    B, N = len(images), info.num_patches
    target = target_classes(rm, images, target, batch_size)
    if blur:
        k = max(3, (min(images.shape[-2:]) // 4) | 1)
        base = _gaussian_blur(images, k, sigma=k / 3)
    else:
        base = torch.full_like(images, float(baseline))
    with eval_mode(model):
        ends = _target_probs(model, torch.cat([images, base]), target.repeat(2), batch_size).view(2, B)
    pix = patch_mask(info, images.device).view(1, -1)  # (1, H*W) patch index per pixel
    counts = torch.tensor([round(s / steps * N) for s in range(steps + 1)])
    x = torch.tensor(counts.tolist(), dtype=torch.float64) / N

    @torch.no_grad()
    def score(maps: Tensor) -> dict[str, Tensor]:
        _check_maps(maps, images, info.grid_size)
        # rank[b, n]: position of patch n in image b's order (0 = most important); ties keep grid order
        maps = maps.to(images.device)
        order = maps.flatten(1).double().argsort(dim=1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order,
                                                torch.arange(N, device=order.device).expand(B, N).contiguous())
        pix_rank = rank.gather(1, pix.expand(B, -1)).view(B, 1, *images.shape[-2:])  # (B, 1, H, W)
        # step 0 and the last step change nothing or everything: the unchanged images and the baseline
        probs = {"deletion": torch.empty(B, steps + 1), "insertion": torch.empty(B, steps + 1)}
        probs["deletion"][:, 0], probs["deletion"][:, steps] = ends[0], ends[1]
        probs["insertion"][:, 0], probs["insertion"][:, steps] = ends[1], ends[0]
        # the other (step, image) variants of both curves, evaluated in chunks of ``batch_size``
        pairs = [(s, b) for s in range(1, steps) for b in range(B)]
        with eval_mode(model):
            _fill_curves(model, images, base, pix_rank, counts, target, pairs, probs, batch_size)
        auc = {k: torch.trapezoid(v.double(), x, dim=1).float() for k, v in probs.items()}
        return {**auc, "deletion_curve": probs["deletion"], "insertion_curve": probs["insertion"],
                "fraction": x.float()}

    return score


def _target_probs(model: nn.Module, images: Tensor, target: Tensor, batch_size: int) -> Tensor:
    """(B,) float32 CPU probability of class ``target[b]`` for ``images[b]``, in chunks of ``batch_size``."""
    return torch.cat([model(images[i:i + batch_size]).softmax(-1).gather(1, target[i:i + batch_size, None])
                      .squeeze(1).float().cpu() for i in range(0, len(images), batch_size)])


def _fill_curves(model: nn.Module, images: Tensor, base: Tensor, pix_rank: Tensor, counts: Tensor, target: Tensor,
                 pairs: list[tuple[int, int]], probs: dict[str, Tensor], batch_size: int) -> None:
    """Target probabilities of every (step, image) variant, both curves, in chunks of ``batch_size`` images."""
    for start in range(0, len(pairs), max(1, batch_size // 2)):
        chunk = pairs[start:start + max(1, batch_size // 2)]
        s_idx = torch.tensor([s for s, _ in chunk])
        b_idx = torch.tensor([b for _, b in chunk])
        dev_b = b_idx.to(images.device)
        changed = pix_rank[dev_b] < counts[s_idx].view(-1, 1, 1, 1).to(pix_rank.device)  # the top-k patches
        img, bas = images[dev_b], base[dev_b]
        batch = torch.cat([torch.where(changed, bas, img), torch.where(changed, img, bas)])
        p = model(batch).softmax(-1).gather(1, target.to(batch.device)[dev_b].repeat(2)[:, None]).squeeze(1)
        p = p.float().cpu()
        probs["deletion"][b_idx, s_idx] = p[: len(chunk)]
        probs["insertion"][b_idx, s_idx] = p[len(chunk):]


def _gaussian_blur(images: Tensor, k: int, sigma: float) -> Tensor:
    ax = torch.arange(k, dtype=images.dtype, device=images.device) - (k - 1) / 2
    g = torch.exp(-(ax**2) / (2 * sigma**2))
    g = g / g.sum()
    C = images.shape[1]
    x = F.pad(images, (k // 2,) * 4, mode="replicate")
    x = F.conv2d(x, g.view(1, 1, 1, k).expand(C, 1, 1, k), groups=C)
    return F.conv2d(x, g.view(1, 1, k, 1).expand(C, 1, k, 1), groups=C)


def rank_correlation(a: Tensor, b: Tensor) -> Tensor:
    """(B,) Spearman correlation between the flattened maps of ``a`` and ``b`` (B, ...), per image."""
    return spearman(a.flatten(1), b.flatten(1)).float()


def randomized_copy(model: nn.Module, seed: int = 0) -> nn.Module:
    """A copy of ``model`` whose weight tensors (every parameter with 2 or more dimensions: projections,
    convolutions, position embeddings, prefix tokens) are re-drawn from N(0, s^2), s the tensor's own
    standard deviation, so activations keep their scale but nothing learned remains; 1-d parameters (norm
    scales, biases, layer scales) are kept. The original model is untouched."""
    seed = check_seed("seed", seed)  # before the copy is made
    with torch.inference_mode(False):  # inside a caller's inference_mode, ordinary tensors: gradient methods run on it
        rand = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode(False), torch.no_grad():
        for p in rand.parameters():
            if p.ndim >= 2:
                # drawn and scaled on the CPU in float32: the same copy whatever the model's device
                std = float(p.detach().float().cpu().std().clamp_min(1e-6)) if p.numel() > 1 else 0.02
                p.copy_((torch.randn(p.shape, generator=g) * std).to(p))
    return rand


def randomization_sanity(method: Callable[..., Tensor] | str, model: nn.Module, images: Tensor,
                         target: Tensor | int | None = None, seed: int = 0, original: Tensor | None = None,
                         randomized: nn.Module | None = None) -> Tensor:
    """(B,) Spearman correlation between ``method(model, images, target)`` and the same on a
    re-initialised copy of the model (same targets). Near 0: the map depends on the learned weights.
    ``method`` takes (model, images, target), as the values of ``ATTRIBUTION_METHODS`` do (or give its name there,
    e.g. ``"rollout"``); ``original``: the map on ``model`` when already computed; ``randomized``: the copy
    ``randomized_copy(model, seed)`` when already made (``seed`` is then not used). ``target`` None: the model's
    prediction, or, for a model without a classifier head, no class (rollout, which needs none, still runs there;
    the class-specific methods refuse such a model)."""
    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    if randomized is None:  # before the original map's forward passes, not at the copy after them
        seed = check_seed("seed", seed)
    if method is attention_rollout:  # its third argument is head_fusion, not a target: the wrapper takes one
        method = "rollout"
    if isinstance(method, str):
        method = attribution_method(method)
    if original is not None:  # a map of these images on this model, checked before the prediction's forward pass
        _check_maps(original, images, rm.info_for(images).grid_size)
    if target is None and has_classifier(rm):
        target = predicted_class(rm, images)
    if original is None:
        original = method(model, images, target)
    if randomized is None:
        randomized = randomized_copy(model, seed)
    return rank_correlation(original, method(randomized, images, target))


def check_masks(masks: Tensor, batch: int, grid: tuple[int, int]) -> None:
    """Refuse object masks that are not (B, H, W) of 0 and 1 with H, W multiples of the (gh, gw) grid."""
    gh, gw = grid
    if masks.dim() != 3 or masks.shape[0] != batch or masks.shape[1] % gh or masks.shape[2] % gw:
        raise ValueError(f"masks must be (B, H, W) with B = {batch} and H, W multiples of the grid ({gh}, {gw}), got "
                         f"{tuple(masks.shape)}")
    if masks.dtype != torch.bool and masks.numel() and not bool(((masks >= 0) & (masks <= 1)).all()):
        # a 0/255 mask read from a PNG made the share on the object and the chance level 255 times too large
        lo, hi = float(masks.min()), float(masks.max())
        raise ValueError(f"masks must be object masks of 0 and 1 (bool), got values from {lo:g} to {hi:g}: pass "
                         "masks > 0 (the object's pixels) as bool")


def localisation(maps: Tensor, masks: Tensor) -> dict[str, Tensor]:
    """Share of positive map mass on the object, and the pointing game, per image.

    ``maps`` (B, gh, gw); ``masks`` (B, H, W) bool object masks with H, W multiples of gh, gw. A patch's
    mass is spread evenly over its pixels. Returns ``mass_in_mask``, ``pointing`` (1.0 when the top patch
    overlaps the object) and ``chance`` (the object's area share: what a uniform map scores), each (B,).
    """
    if maps.dim() != 3:
        raise ValueError(f"maps must be (B, gh, gw), one map per image, got shape {tuple(maps.shape)}"
                         + ("; pass maps[None] for one image" if maps.dim() == 2 else ""))
    B, gh, gw = maps.shape
    masks = masks.to(maps.device)
    check_masks(masks, B, (gh, gw))
    frac = F.avg_pool2d(masks[:, None].double(), (masks.shape[1] // gh, masks.shape[2] // gw))[:, 0]  # (B, gh, gw)
    pos = maps.double().clamp_min(0)
    total = pos.flatten(1).sum(1)
    mass = (pos * frac).flatten(1).sum(1) / total.clamp_min(1e-300)
    mass = torch.where(total > 0, mass, frac.flatten(1).mean(1))  # an all-zero map scores chance
    top = maps.flatten(1).argmax(1)
    pointing = (frac.flatten(1).gather(1, top[:, None]).squeeze(1) > 0).double()
    return {"mass_in_mask": mass.float(), "pointing": pointing.float(), "chance": frac.flatten(1).mean(1).float()}
