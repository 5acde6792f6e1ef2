"""Representation similarity: linear CKA (Kornblith et al. 2019) between layers, in mini-batches (Nguyen et al. 2021).

Linear CKA of features X (n, p) and Y (n, q) of the same n images is HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with the
Gram matrices K = X X^T and L = Y Y^T. Two HSIC estimators:

* ``debiased=True`` (the default): the unbiased estimator of Song et al. (2012), as Nguyen et al. (2021) use it,
  HSIC_1(K, L) = [tr(K~ L~) + 1^T K~ 1 1^T L~ 1 / ((n - 1)(n - 2)) - 2 / (n - 2) 1^T K~ L~ 1] / (n (n - 3)) with K~, L~
  the Grams with their diagonals set to zero; computed as the inner product of U-centred Grams
  (Szekely & Rizzo 2014), which equals it. Needs n >= 4 per batch.
* ``debiased=False``: Kornblith's estimator, tr(K H L H) / (n - 1)^2 with the centring matrix H.

Mini-batch CKA (Nguyen et al. 2021, eq. 3): the HSICs of each batch of images are averaged over the batches, then
combined, CKA = mean_i HSIC(K_i, L_i) / sqrt(mean_i HSIC(K_i, K_i) mean_i HSIC(L_i, L_i)), every batch weighted
alike. Memory holds one batch's (n, n) Grams per layer, whatever the number of images. With the unbiased estimator
the average is an unbiased estimate of the population HSIC at any batch size; the biased one would depend on it.

All arithmetic is in float64. A representation that is constant over the images has HSIC 0 with everything: its CKA
is NaN (0 / 0), never a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from vitlab.base.checks import check_count
from vitlab.base.modes import eval_mode, unwrapped
from vitlab.inspect.capture import check_images
from vitlab.inspect.residual import block_list, capture_blocks

__all__ = ["cka", "hsic_gram", "MinibatchCKA", "layer_similarity", "layer_features", "REPRESENTATIONS",
           "Representation"]

Representation = Literal["tokens", "cls", "patch_mean"]
#: ``tokens``: every token of the layer's output, prefix included, flattened (T * D features; for a CNN stage the
#: C * h * w feature map flattened); ``cls``: the class token (D); ``patch_mean``: the mean of the patch tokens,
#: prefix tokens left out (D; for a CNN stage the spatial mean of its feature map, C)
REPRESENTATIONS = ("tokens", "cls", "patch_mean")


def hsic_gram(x: Tensor, debiased: bool = True) -> Tensor:
    """(..., n, p) features -> (..., n, n) float64 centred Gram G, scaled so that HSIC(X, Y) = <G_X, G_Y> (the sum of
    the elementwise product): the U-centred Gram of K = X X^T divided by sqrt(n (n - 3)) (``debiased``; n >= 4), or
    H K H / (n - 1) (Kornblith's estimator; n >= 2)."""
    x = x.double()
    n = x.shape[-2]
    need = 4 if debiased else 2
    if n < need:
        raise ValueError(f"{'the unbiased' if debiased else 'the'} HSIC estimator needs at least {need} images in a "
                         f"batch, got {n}: pass more images (or a larger batch_size)")
    k = x @ x.transpose(-1, -2)
    if not debiased:
        k = k - k.mean(-1, keepdim=True)
        k = k - k.mean(-2, keepdim=True)
        return k / (n - 1)
    k = k - torch.diag_embed(torch.diagonal(k, dim1=-2, dim2=-1))  # K~: the diagonal set to 0
    rows = k.sum(-1, keepdim=True)  # (..., n, 1)
    total = rows.sum(-2, keepdim=True)  # (..., 1, 1)
    u = k - rows / (n - 2) - rows.transpose(-1, -2) / (n - 2) + total / ((n - 1) * (n - 2))
    u = u - torch.diag_embed(torch.diagonal(u, dim1=-2, dim2=-1))
    return u / math.sqrt(n * (n - 3))


def _flat(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a (n, ...) tensor of features, one row per image, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{name} must be (n, features...) with one row per image, got shape {tuple(x.shape)}: pass "
                         f"{name}[:, None] for one feature")
    return x.reshape(len(x), -1)


def cka(a: Tensor, b: Tensor, *, debiased: bool = True) -> Tensor:
    """Linear CKA of features ``a`` (n, ...) and ``b`` (n, ...) of the same n images (everything after the first axis
    flattened): a 0-d float64 tensor, 1 for representations equal up to an orthogonal transform and an isotropic
    scaling, NaN when either is constant over the images. ``debiased`` picks the HSIC estimator (see the module)."""
    a, b = _flat(a, "a"), _flat(b, "b")
    if len(a) != len(b):
        raise ValueError(f"a and b must hold the same images: a has {len(a)} rows, b {len(b)}")
    ga, gb = hsic_gram(a, debiased), hsic_gram(b, debiased)
    return (ga * gb).sum() / ((ga * ga).sum() * (gb * gb).sum()).sqrt()


class MinibatchCKA:
    """Accumulates mini-batch CKA between ``la`` layers of one model and ``lb`` of another (Nguyen et al. 2021).

    ``update(a, b)`` takes one batch: sequences of the ``la`` and ``lb`` layers' (n, ...) features of the same n
    images; ``result()`` is the (la, lb) float64 CKA over every batch so far (NaN for a constant representation).
    Per batch, ``update`` adds HSIC(K_i, L_j) of every pair and HSIC(K_i, K_i), HSIC(L_j, L_j); the batch count cancels
    in the ratio."""

    def __init__(self, la: int, lb: int, debiased: bool = True) -> None:
        check_count("la", la)
        check_count("lb", lb)
        self.la, self.lb, self.debiased = la, lb, debiased
        self.cross = torch.zeros(la, lb, dtype=torch.float64)  # sum over batches of HSIC(A_i, B_j)
        self.self_a = torch.zeros(la, dtype=torch.float64)
        self.self_b = torch.zeros(lb, dtype=torch.float64)
        self.batches = 0

    def grams(self, feats: Sequence[Tensor], want: int, name: str) -> Tensor:
        """(L, n*n) flattened centred Grams of the L layers' (n, ...) features."""
        if len(feats) != want:
            raise ValueError(f"{name} holds {len(feats)} layers' features, this accumulator takes {want}")
        n = {len(f) for f in feats}
        if len(n) != 1:
            raise ValueError(f"{name}'s layers hold different numbers of images: {sorted(n)}")
        return torch.stack([hsic_gram(_flat(f, name), self.debiased).flatten().cpu() for f in feats])

    def update(self, a: Sequence[Tensor], b: Sequence[Tensor]) -> None:
        ga, gb = self.grams(a, self.la, "a"), self.grams(b, self.lb, "b")
        if ga.shape[1] != gb.shape[1]:
            raise ValueError(f"a and b must hold the same images: a has {math.isqrt(ga.shape[1])} per layer, b "
                             f"{math.isqrt(gb.shape[1])}")
        self.cross += ga @ gb.T
        self.self_a += (ga * ga).sum(1)
        self.self_b += (gb * gb).sum(1)
        self.batches += 1

    def result(self) -> Tensor:
        if not self.batches:
            raise ValueError("no batch was added: call update() first")
        return self.cross / (self.self_a[:, None] * self.self_b[None]).sqrt()


def _representation(tokens: Tensor, num_prefix: int, representation: str) -> Tensor:
    """One layer's (B, T, D) block output -> (B, F) features."""
    if representation == "tokens":
        return tokens.flatten(1)
    if representation == "patch_mean":
        return tokens[:, num_prefix:].mean(1)
    if num_prefix == 0:  # a ConViT's block before its class token joins: the class token is its constant value
        return tokens.new_zeros(len(tokens), tokens.shape[-1])  # constant over images: CKA NaN
    return tokens[:, 0]


def _is_vit(model: nn.Module) -> bool:
    return isinstance(getattr(model, "blocks", None), (nn.Sequential, nn.ModuleList))


@torch.no_grad()
def layer_features(model: nn.Module, images: Tensor, representation: Representation = "tokens") -> list[Tensor]:
    """Per layer, the (B, F) features of ``images`` that ``layer_similarity`` compares: for a ViT, each block's output
    tokens (before the final norm) read as ``representation`` (``REPRESENTATIONS``); for a CNN with timm's
    ``forward_intermediates`` (ResNet, BiT), each stage's output feature map (``tokens``: flattened; ``patch_mean``:
    the spatial mean; ``cls`` is refused). A ConViT's blocks before its class token joins give a constant class token
    (``cls``: CKA NaN there) and their patches alone (``tokens``)."""
    model = unwrapped(model)
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {representation!r}")
    if _is_vit(model):
        has_class = getattr(model, "cls_token", None) is not None
        if representation == "cls" and not has_class:
            raise ValueError(f"representation='cls' needs a class token, and this {type(model).__name__} has none: "
                             "use 'patch_mean' or 'tokens'")
        with capture_blocks(model, lambda _i, t, p: _representation(t, p, representation)) as kept:
            model(images)
        return [kept[i][0] for i in range(len(block_list(model)))]
    if not callable(getattr(model, "forward_intermediates", None)):
        raise TypeError(f"{type(model).__name__} is neither a ViT with transformer blocks nor a CNN with timm's "
                        "forward_intermediates: layer_similarity reads one or the other")
    if representation == "cls":
        raise ValueError(f"{type(model).__name__} is a CNN without a class token: use representation='patch_mean' "
                         "(the spatial mean of each stage) or 'tokens' (each stage's feature map flattened)")
    with eval_mode(model):
        maps = model.forward_intermediates(images, intermediates_only=True)  # per stage (B, C, h, w)
    return [m.flatten(1) if representation == "tokens" else m.mean((-2, -1)) for m in maps]


@torch.no_grad()
def layer_similarity(model_a: nn.Module, model_b: nn.Module, images: Tensor, *,
                     representation: Representation = "tokens", batch_size: int = 64, debiased: bool = True,
                     progress: bool | None = None) -> Tensor:
    """(La, Lb) float64 mini-batch linear CKA between every layer of ``model_a`` and every layer of ``model_b`` on the
    same ``images`` (a preprocessed (B, C, H, W) batch both models take; B >= 4 with ``debiased``).

    Layers: a ViT's block outputs (La = depth), a CNN's stage outputs (timm's ``forward_intermediates``). Each layer
    is read as ``representation`` (default ``"tokens"``: the whole token sequence flattened, the convention of
    Kornblith et al. for feature maps; see ``REPRESENTATIONS``). Images run in batches of ``batch_size``; a last batch
    of fewer than 4 images (the unbiased estimator's minimum) joins the one before. Memory holds one batch's features
    and (n, n) Grams, whatever the number of images. NaN where a layer's representation is constant over the
    images."""
    from tqdm.auto import tqdm

    model_a, model_b = unwrapped(model_a), unwrapped(model_b)
    check_images(images, model_a)
    check_images(images, model_b)
    check_count("batch_size", batch_size)
    need = 4 if debiased else 2
    if len(images) < need:
        raise ValueError(f"layer_similarity needs at least {need} images, got {len(images)}")
    starts = list(range(0, len(images), batch_size))
    if len(starts) > 1 and len(images) - starts[-1] < need:
        starts.pop()  # the short last batch joins the one before
    bounds = list(zip(starts, starts[1:] + [len(images)]))
    acc: MinibatchCKA | None = None
    show = len(bounds) > 1 if progress is None else progress
    for s, e in tqdm(bounds, desc="CKA", disable=not show, leave=False):
        fa = layer_features(model_a, images[s:e], representation)
        fb = layer_features(model_b, images[s:e], representation)
        if acc is None:
            acc = MinibatchCKA(len(fa), len(fb), debiased)
        acc.update(fa, fb)
        del fa, fb  # before the next batch's features exist: one batch's features at a time
    return acc.result()
