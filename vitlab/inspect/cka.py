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
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from vitlab.base.checks import check_count
from vitlab.base.modes import eval_mode
from vitlab.inspect.capture import check_images
from vitlab.inspect.residual import block_list, capture_blocks
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["cka", "hsic_gram", "centred_gram", "MinibatchCKA", "layer_similarity", "layer_features",
           "REPRESENTATIONS", "Representation", "SimilarityTables", "feature_tables", "layer_names", "similarity_tables", "batch_bounds"]

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
    return centred_gram(x @ x.transpose(-1, -2), debiased)


def centred_gram(k: Tensor, debiased: bool = True) -> Tensor:
    """``hsic_gram`` from the (..., n, n) Gram K = X X^T itself (float64): what a subset of the images needs, K's
    rows and columns of those images (``SimilarityTables``' leave-one-out values)."""
    k = k.double()
    n = k.shape[-1]
    need = 4 if debiased else 2
    if n < need:
        raise ValueError(f"{'the unbiased' if debiased else 'the'} HSIC estimator needs at least {need} images in a "
                         f"batch, got {n}: pass more images (or a larger batch_size)")
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
def layer_features(model: AnyModel, images: Tensor, representation: Representation = "tokens") -> list[Tensor]:
    """Per layer, the (B, F) features of ``images`` that ``layer_similarity`` compares: for a ViT, each block's output
    tokens (before the final norm) read as ``representation`` (``REPRESENTATIONS``); for a CNN with timm's
    ``forward_intermediates`` (ResNet, BiT), each stage's output feature map (``tokens``: flattened; ``patch_mean``:
    the spatial mean; ``cls`` is refused). A ConViT's blocks before its class token joins give a constant class token
    (``cls``: CKA NaN there) and their patches alone (``tokens``)."""
    rm = resolve_model(model)
    model = rm.module
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {representation!r}")
    if _is_vit(model):
        has_class = getattr(model, "cls_token", None) is not None
        if representation == "cls" and not has_class:
            raise ValueError(f"representation='cls' needs a class token, and this {type(model).__name__} has none: "
                             "use 'patch_mean' or 'tokens'")
        with capture_blocks(rm, lambda _i, t, p: _representation(t, p, representation)) as kept:
            model(images)
        return [kept[i][0] for i in range(len(block_list(rm)))]
    if not callable(getattr(model, "forward_intermediates", None)):
        raise TypeError(f"{type(model).__name__} is neither a ViT with transformer blocks nor a CNN with timm's "
                        "forward_intermediates: layer_similarity reads one or the other")
    if representation == "cls":
        raise ValueError(f"{type(model).__name__} is a CNN without a class token: use representation='patch_mean' "
                         "(the spatial mean of each stage) or 'tokens' (each stage's feature map flattened)")
    with eval_mode(model):
        maps = model.forward_intermediates(images, intermediates_only=True)  # per stage (B, C, h, w)
    return [m.flatten(1) if representation == "tokens" else m.mean((-2, -1)) for m in maps]


def layer_names(model: AnyModel) -> list[str]:
    """The names of the layers ``layer_features`` reads, in its order: "block 1", ... for a ViT; for a CNN, the
    modules of timm's ``feature_info`` ("stem.conv", "stages.0", ...), or "stage 1", ... where it has none."""
    rm = resolve_model(model)
    model = rm.module
    if _is_vit(model):
        return [f"block {i + 1}" for i in range(len(block_list(rm)))]
    info = getattr(model, "feature_info", None)
    if isinstance(info, list) and all(isinstance(f, dict) and "module" in f for f in info):
        return [str(f["module"]) for f in info]
    return [f"stage {i + 1}" for i in range(len(getattr(model, "feature_info", ()) or ()))]


@torch.no_grad()
def layer_similarity(model_a: AnyModel, model_b: AnyModel, images: Tensor, *,
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

    model_a, model_b = resolve_model(model_a), resolve_model(model_b)
    check_images(images, model_a)
    check_images(images, model_b)
    bounds = batch_bounds(len(images), batch_size, 4 if debiased else 2, "layer_similarity")
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


def batch_bounds(n: int, batch_size: int, need: int, who: str) -> list[tuple[int, int]]:
    """[start, end) of each batch of ``n`` images, ``batch_size`` each; a last batch of fewer than ``need`` images
    (the estimator's minimum) joins the one before. ``ValueError`` naming ``who`` for fewer than ``need`` images."""
    check_count("batch_size", batch_size)
    if n < need:
        raise ValueError(f"{who} needs at least {need} images, got {n}")
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < need:
        starts.pop()  # the short last batch joins the one before
    return list(zip(starts, starts[1:] + [n]))


def _ratio(aa: Tensor, bb: Tensor, ab: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Summed HSIC tables (..., La, La), (..., Lb, Lb), (..., La, Lb) -> their CKA matrices (same shapes)."""
    da, db = aa.diagonal(dim1=-2, dim2=-1), bb.diagonal(dim1=-2, dim2=-1)
    return (aa / (da[..., :, None] * da[..., None, :]).sqrt(), bb / (db[..., :, None] * db[..., None, :]).sqrt(),
            ab / (da[..., :, None] * db[..., None, :]).sqrt())


@dataclass(frozen=True)
class SimilarityTables:
    """What mini-batch CKA between two models a and b on the same n images is made of, and its jackknife over images.

    ``aa`` (B, La, La), ``bb`` (B, Lb, Lb), ``ab`` (B, La, Lb): float64 HSIC of every pair of layers in each of B
    batches (a with itself, b with itself, a with b); ``batch`` (n,): the batch of each image; ``loo_aa`` (n, La, La),
    ``loo_bb``, ``loo_ab``: its batch's HSICs with that image left out. ``cka()`` is the mini-batch CKA (every batch
    weighted alike, Nguyen et al. eq. 3), ``jackknife()`` the same with each image left out in turn. ``reordered``
    and ``self_pair`` build controls (``vitlab.findings.controls``) from the same numbers."""

    aa: Tensor
    bb: Tensor
    ab: Tensor
    batch: Tensor
    loo_aa: Tensor
    loo_bb: Tensor
    loo_ab: Tensor
    representation: str = "tokens"
    debiased: bool = True

    @property
    def images(self) -> int:
        return len(self.batch)

    def cka(self) -> tuple[Tensor, Tensor, Tensor]:
        """(a with a (La, La), b with b (Lb, Lb), a with b (La, Lb)) float64 mini-batch CKA over all images."""
        return _ratio(self.aa.sum(0), self.bb.sum(0), self.ab.sum(0))

    def jackknife(self) -> tuple[Tensor, Tensor, Tensor]:
        """As ``cka()`` with image i left out, for each i: (n, La, La), (n, Lb, Lb), (n, La, Lb). Its batch keeps its
        weight (each batch's HSIC is an estimate of the same HSIC, whatever its size)."""
        return tuple(_ratio(*(t.sum(0) - t[self.batch] + loo for t, loo in (
            (self.aa, self.loo_aa), (self.bb, self.loo_bb), (self.ab, self.loo_ab)))))

    def reordered(self, a: Sequence[int] | None = None, b: Sequence[int] | None = None) -> SimilarityTables:
        """The tables of a model whose layers are ``a``'s layers in the order ``a`` (indices, repeats allowed: [0, 0]
        is a model whose two layers are both a's first), and likewise for ``b``; None keeps a model's order."""
        ia = torch.arange(self.aa.shape[-1]) if a is None else torch.as_tensor(list(a))
        ib = torch.arange(self.bb.shape[-1]) if b is None else torch.as_tensor(list(b))

        def pick(t: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
            return t[..., rows, :][..., cols]

        return SimilarityTables(pick(self.aa, ia, ia), pick(self.bb, ib, ib), pick(self.ab, ia, ib), self.batch,
                                pick(self.loo_aa, ia, ia), pick(self.loo_bb, ib, ib), pick(self.loo_ab, ia, ib),
                                self.representation, self.debiased)

    def self_pair(self, which: str = "b") -> SimilarityTables:
        """The tables of model ``which`` ("a" or "b") against itself."""
        if which not in ("a", "b"):
            raise ValueError(f"which must be 'a' or 'b', got {which!r}")
        t, loo = (self.aa, self.loo_aa) if which == "a" else (self.bb, self.loo_bb)
        return SimilarityTables(t, t, t, self.batch, loo, loo, loo, self.representation, self.debiased)


def _grams_with_leave_one_out(feats: Sequence[Tensor], debiased: bool) -> tuple[Tensor, Tensor]:
    """Per layer, the batch's flattened centred Gram (L, m*m) and, for each image left out, the centred Gram of the
    other m - 1 (L, m, (m-1)^2)."""
    x = [_flat(f, "features").double() for f in feats]
    k = torch.stack([f @ f.T for f in x])  # (L, m, m) raw Grams
    m = k.shape[-1]
    keep = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, m)]) for i in range(m)]).to(k.device)
    loo = k[:, keep[:, :, None], keep[:, None, :]]  # (L, m, m-1, m-1)
    return (centred_gram(k, debiased).flatten(1).cpu(), centred_gram(loo, debiased).flatten(2).cpu())


@torch.no_grad()
def similarity_tables(model_a: AnyModel, model_b: AnyModel, images: Tensor, *,
                      representation: Representation = "tokens", batch_size: int = 64, debiased: bool = True,
                      progress: bool | None = None, images_b: Tensor | None = None) -> SimilarityTables:
    """The HSIC tables (``SimilarityTables``) of ``model_a`` against itself, ``model_b`` against itself and the two
    against each other on the same preprocessed (B, C, H, W) ``images`` (``images_b``: the same images as
    ``model_b``'s own preprocessing gives them, for two models that differ in it; default ``images``), layers and
    ``representation`` as ``layer_similarity`` reads them, in batches of ``batch_size`` (a last batch of fewer than 5
    images joins the one before: leaving one out must leave the unbiased estimator its 4). ``cka()[2]`` equals
    ``layer_similarity`` with the same batches. Memory holds one batch's features and Grams, and the tables
    (O(n L^2) numbers)."""
    from tqdm.auto import tqdm

    model_a, model_b = resolve_model(model_a), resolve_model(model_b)
    images_b = images if images_b is None else images_b
    if len(images_b) != len(images):
        raise ValueError(f"images_b must be the same images as images: {len(images_b)} against {len(images)}")
    check_images(images, model_a)
    check_images(images_b, model_b)
    bounds = batch_bounds(len(images), batch_size, (4 if debiased else 2) + 1, "similarity_tables")
    show = len(bounds) > 1 if progress is None else progress
    parts = [_batch_tables(layer_features(model_a, images[s:e], representation),
                           layer_features(model_b, images_b[s:e], representation), debiased)
             for s, e in tqdm(bounds, desc="CKA tables", disable=not show, leave=False)]
    return _joined(parts, bounds, representation, debiased)


def feature_tables(feats_a: Sequence[Tensor], feats_b: Sequence[Tensor], *, batch_size: int = 64,
                   debiased: bool = True, representation: str = "given features") -> SimilarityTables:
    """``similarity_tables`` of features given as tensors: ``feats_a``, ``feats_b`` each a sequence of one
    (n, ...) tensor per layer, all of the same n images (constructed representations, or ``layer_features``')."""
    n = {len(f) for f in [*feats_a, *feats_b]}
    if len(n) != 1:
        raise ValueError(f"every layer's features must hold the same images, got {sorted(n)} rows")
    bounds = batch_bounds(n.pop(), batch_size, (4 if debiased else 2) + 1, "feature_tables")
    parts = [_batch_tables([f[s:e] for f in feats_a], [f[s:e] for f in feats_b], debiased) for s, e in bounds]
    return _joined(parts, bounds, representation, debiased)


def _batch_tables(fa: Sequence[Tensor], fb: Sequence[Tensor], debiased: bool) -> tuple[Tensor, ...]:
    """One batch's HSIC tables (aa, bb, ab) and leave-one-out tables (m, ...) from its layers' features."""
    ga, la = _grams_with_leave_one_out(fa, debiased)
    gb, lb = _grams_with_leave_one_out(fb, debiased)
    return (ga @ ga.T, gb @ gb.T, ga @ gb.T, torch.einsum("aip,bip->iab", la, la),
            torch.einsum("aip,bip->iab", lb, lb), torch.einsum("aip,bip->iab", la, lb))


def _joined(parts: Sequence[tuple[Tensor, ...]], bounds: Sequence[tuple[int, int]], representation: str,
            debiased: bool) -> SimilarityTables:
    aa, bb, ab = (torch.stack([p[i] for p in parts]) for i in range(3))
    loo_aa, loo_bb, loo_ab = (torch.cat([p[i] for p in parts]) for i in range(3, 6))
    batch = torch.cat([torch.full((e - s,), j) for j, (s, e) in enumerate(bounds)])
    return SimilarityTables(aa, bb, ab, batch, loo_aa, loo_bb, loo_ab, representation, debiased)
