"""Principal components of the patch-embedding filters (paper Fig. 7 left).

The D filters of the linear patch embedding are D samples of C*P*P features; like
``sklearn.decomposition.PCA`` they are mean-centred, and the top ``k`` right singular vectors are the
components, reshaped back to (C, P, P) filters. Conv (timm ``PatchEmbed.proj``) and linear layouts both work.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from vitlab.base.checks import check_count, check_int
from vitlab.base.stats import Array, as_float64
from vitlab.models.info import AnyModel, resolve_model


def _filters(model: nn.Module) -> Tensor:
    """(D, C, P, P) patch-embedding filters of ``model``, the module itself (``ResolvedModel.module``)."""
    pe = getattr(model, "patch_embed", None)
    if pe is None:
        raise TypeError(f"{type(model).__name__} has no patch_embed: not a ViT-family model")
    if hasattr(pe, "backbone"):
        raise TypeError("this is a hybrid model: its patch embedding is a 1x1 projection of ResNet features, not a "
                        "filter over pixels, so its components cannot be shown as image patches (Fig. 7 left needs "
                        "a pixel-patch ViT)")
    proj = getattr(pe, "proj", None)
    if isinstance(proj, nn.Conv2d):
        return proj.weight.detach().float()  # (D, C, P, P)
    if isinstance(proj, nn.Linear):  # flattened patches: weight (D, P*P*C), timm's NHWC flattening order
        ph, pw = pe.patch_size
        d = proj.weight.shape[0]
        c = proj.weight.shape[1] // (ph * pw)
        return proj.weight.detach().float().reshape(d, ph, pw, c).permute(0, 3, 1, 2)
    raise TypeError(f"unsupported patch embedding projection {type(proj).__name__}")


def filter_pca(w: Tensor, k: int = 28) -> tuple[Tensor, Tensor]:
    """(D, C, P, P) filters -> (components (k, C, P, P), explained_variance_ratio (k,)), mean-centred like sklearn."""
    d, c, ph, pw = w.shape
    k_max = min(d, c * ph * pw)
    # a NumPy integer is a whole number too; 2.5 is none
    check_int("k", k, 1, k_max, f"in [1, {k_max}] for {d} filters of {c}x{ph}x{pw}", numpy=True)
    x = w.reshape(d, -1).double()
    x = x - x.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    var = s**2
    ratio = var / var.sum()
    comps = vh[:k]
    # the sign of a singular vector is arbitrary: fix it so the largest-magnitude entry is positive (as sklearn)
    signs = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    comps = comps * signs
    return comps.reshape(k, c, ph, pw).float(), ratio[:k].float()


def filter_component_count(model: AnyModel, k: int = 28) -> int:
    """How many components ``embedding_filter_pca`` can give, at most ``k`` (the paper's 28): never more than the
    D filters or their C*P*P values, whatever the width, patch size or channel count."""
    check_int("k", k, 1, allowed="a whole number of at least 1", numpy=True)  # 1.5 is no count, True no 1
    d, c, ph, pw = _filters(resolve_model(model).module).shape
    return min(int(k), d, c * ph * pw)


def embedding_filter_pca(model: AnyModel, k: int = 28) -> tuple[Tensor, Tensor]:
    """(components (k, C, P, P), explained_variance_ratio (k,)) of the mean-centred patch-embedding filters."""
    return filter_pca(_filters(resolve_model(model).module), k)


def random_filter_pca_ratios(model: AnyModel, k: int = 28, draws: int = 5) -> Tensor:
    """(draws, k) explained-variance ratios of the model's own patch embedding re-initialised ``draws`` times (its
    projection's ``reset_parameters``, seeds 0.., on a copy): the reference the learned filters' structure is judged
    against, drawn from exactly the distribution training started from."""
    import copy

    model = resolve_model(model).module
    check_count("draws", draws)
    pe = getattr(model, "patch_embed", None)
    proj = getattr(pe, "proj", None)
    out = []
    for seed in range(draws):
        # on the CPU in float32: the draws are the same whatever device or dtype the model is on
        fresh = (copy.deepcopy(proj).to("cpu", torch.float32) if proj is not None and hasattr(proj, "reset_parameters")
                 else None)
        if fresh is None:  # no projection to re-initialise: i.i.d. normal filters of the same shape
            g = torch.Generator().manual_seed(seed)
            w = torch.randn(_filters(model).shape, generator=g)
        else:
            with torch.random.fork_rng(devices=[]):  # the CPU generator only: no GPU's random state is touched
                torch.default_generator.manual_seed(seed)
                fresh.reset_parameters()
            shadow = nn.Module()
            shadow.patch_embed = nn.Module()
            shadow.patch_embed.proj = fresh
            shadow.patch_embed.patch_size = getattr(pe, "patch_size", None)
            w = _filters(shadow)
        out.append(filter_pca(w, k)[1])
    return torch.stack(out)


def embedding_filters(model: AnyModel) -> Tensor:
    """(D, C, P, P) float32 patch-embedding filters of a pixel-patch ViT (conv or linear layout; a hybrid refused)."""
    return _filters(resolve_model(model).module)


def dct_matrix(n: int) -> np.ndarray:
    """(n, n) float64 orthonormal DCT-II matrix: row u is the u-th cosine over n samples, so ``m @ x`` are the DCT
    coefficients of ``x`` and ``m.T @ c`` the signal of coefficients ``c``."""
    k, i = np.arange(n)[:, None], np.arange(n)[None]
    m = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    m[0] /= np.sqrt(2.0)
    return m


def _dct_energy(components: Array) -> np.ndarray:
    """(k, P, Q) squared orthonormal 2D DCT-II coefficients of (k, C, P, Q) filters, pooled over channels."""
    w = as_float64(components)
    if w.ndim != 4:
        raise ValueError(f"components must be (k, C, P, Q) filters, got shape {w.shape}")
    p, q = w.shape[-2:]
    coef = dct_matrix(p) @ w @ dct_matrix(q).T  # (k, C, P, Q) DCT coefficients
    return (coef**2).sum(1)  # (k, P, Q) pooled over channels


def dct_radius(components: Array) -> np.ndarray:
    """(k,) energy-weighted DCT radius of (k, C, P, Q) filters: each channel's orthonormal 2D DCT-II over the
    patch, radius sqrt(u^2 + v^2) of frequency (u, v) averaged with weights = squared coefficients (pooled over
    channels). 0 for a constant filter; sqrt((P-1)^2 + (Q-1)^2) for the highest DCT frequency."""
    energy = _dct_energy(components)
    p, q = energy.shape[-2:]
    radius = np.hypot(*np.meshgrid(np.arange(p), np.arange(q), indexing="ij"))  # (P, Q)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (energy * radius).sum((1, 2)) / energy.sum((1, 2))


def dct_concentration(components: Array) -> np.ndarray:
    """(k,) how concentrated each (C, P, Q) filter's energy is on few DCT frequencies: the sum over the P*Q
    frequencies of the squared share of its energy (channels pooled), from 1 / (P*Q) (energy spread evenly) to 1
    (one frequency: a DCT basis function in any colour). A random unit vector over C*P*Q values scores about
    (C + 2) / (C*P*Q + 2)."""
    energy = _dct_energy(components).reshape(len(as_float64(components)), -1)  # (k, P*Q)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = energy / energy.sum(1, keepdims=True)
    return (share**2).sum(1)
