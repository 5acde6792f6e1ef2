"""Mean attention distance (paper Fig. 7 right, Fig. 11, App. D.7).

For each head: the attention-weighted distance, in pixels, between a query patch and the patches it attends
to, averaged over query patches and then over images. The paper computes it on 128 images.

Prefix-token policy (stated, not hidden): by default queries and keys are the patch tokens and the prefix
tokens are dropped *without* renormalising the remaining weights (the convention of the widely used code,
so a head that attends to the class token looks "closer"); ``renormalize=True`` divides by the attention mass
that falls on patch keys instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vitlab.base.checks import check_count
from vitlab.inspect.capture import capture_attention, check_images
from vitlab.models.info import AnyModel, resolve_model


def patch_distances(grid: tuple[int, int], patch: tuple[int, int], dtype=torch.float64) -> Tensor:
    """(N, N) Euclidean distances in pixels between patch centres of a (gh, gw) grid, N = gh * gw, row-major."""
    gh, gw = grid
    ys = torch.arange(gh, dtype=dtype).repeat_interleave(gw) * patch[0]
    xs = torch.arange(gw, dtype=dtype).repeat(gh) * patch[1]
    return torch.sqrt((ys[:, None] - ys[None]) ** 2 + (xs[:, None] - xs[None]) ** 2)


def attention_distance_from_maps(maps: Tensor, grid: tuple[int, int], patch: tuple[int, int],
                                 num_prefix_tokens: int, renormalize: bool = False) -> Tensor:
    """(L, B, H, T, T) attention maps -> (L, B, H) mean attention distance in pixels, per image."""
    p = num_prefix_tokens
    n = grid[0] * grid[1]
    if maps.shape[-1] != p + n or maps.shape[-2] != p + n:
        raise ValueError(f"maps over {maps.shape[-1]} tokens do not match {p} prefix tokens + {grid} grid")
    d = patch_distances(grid, patch).to(maps.device)
    if renormalize:
        a = maps[..., p:, p:].double()  # (L, B, H, N, N): patch queries, patch keys
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
        return (a * d).sum(-1).mean(-1)  # per query, then the mean over queries
    # mean_i sum_j a_ij d_ij = <A, D> / N: one matrix-vector product over the flattened maps, with D padded by
    # zero rows and columns for the prefix tokens so the maps need no slicing or copying
    T = p + n
    # at least float32: <A, D> sums N rows of distances (ViT-B/16 at 384 px: about 115,000 px), past half
    # precision's 65,504 and its 3 significant digits; float64 maps stay float64
    work = maps.dtype if maps.dtype in (torch.float32, torch.float64) else torch.float32
    full = torch.zeros(T, T, dtype=work, device=maps.device)
    full[p:, p:] = d.to(work)
    flat = maps.reshape(-1, T * T).to(work)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return (flat @ full.reshape(T * T)).double().view(maps.shape[:-2]) / n


@torch.no_grad()
def mean_attention_distance(model: AnyModel, images: Tensor, *, batch_size: int = 32, renormalize: bool = False,
                            per_image: bool = False, progress: bool | None = None) -> Tensor:
    """(L, H) mean attention distance in pixels over ``images`` (or (L, B, H) with ``per_image=True``).

    ``images``: a preprocessed (B, C, H, W) batch (the paper uses 128 images). Maps are captured batch by
    batch and each layer's maps are reduced to per-head distances inside the capture hook, so memory holds one
    layer's maps at a time, whatever the depth.
    """
    from tqdm.auto import tqdm

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("batch_size", batch_size)
    info = rm.info_for(images)
    chunks = images.split(batch_size)
    out = []
    show = len(chunks) > 1 if progress is None else progress
    def per_head(layer: int, maps: Tensor) -> Tensor:  # (B, H, T, T) -> (B, H): reduced inside the hook
        return attention_distance_from_maps(maps[None], info.grid_size, info.patch_size, info.num_prefix_tokens,
                                            renormalize)[0]

    for chunk in tqdm(chunks, desc="attention distance", disable=not show, leave=False):
        with capture_attention(rm, reduce=per_head) as cap:
            model(chunk)
            out.append(cap.stack())  # (L, B, H)
    per = torch.cat(out, dim=1).float()  # (L, B, H)
    return per if per_image else per.mean(1)


def uniform_attention_distance(grid: tuple[int, int], patch: tuple[int, int]) -> float:
    """Mean attention distance in pixels of a head that attends uniformly to all patches (itself included):
    the mean of ``patch_distances`` over all query-key pairs. About 0.52 * image side for large grids."""
    return float(patch_distances(grid, patch).mean())
