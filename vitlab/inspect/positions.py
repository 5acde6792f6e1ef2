"""Position-embedding similarity (paper Fig. 7 centre).

Cosine similarity between the learned position embeddings of every pair of patches, prefix rows excluded
(whether or not ``pos_embed`` has rows for the prefix tokens). The paper reads 2D structure off it:
nearby patches have similar embeddings, and row/column structure appears. ``position_structure_score``
summarises that as the Spearman rank correlation between similarity and grid distance (near -1: strongly
2D-local; near 0: no spatial structure).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import Tensor

from vitlab.base.stats import spearman
from vitlab.inspect.distance import patch_distances
from vitlab.models.config import size2
from vitlab.models.info import AnyModel, ResolvedModel, resolve_model


def _grid_embeddings(rm: ResolvedModel, grid: tuple[int, int] | None = None) -> tuple[Tensor, tuple[int, int]]:
    """(gh, gw, D) patch position embeddings of the resolved model ``rm``, optionally resampled (bicubic, as timm) to
    ``grid``."""
    info = rm.info()
    pe = getattr(rm.module, "pos_embed", None)
    if info.pos_embed == "none" or pe is None:
        raise ValueError(f"{info.architecture} has no absolute position embedding (pos_embed is None): "
                         "nothing to compare")
    n_prefix = info.num_prefix_tokens if info.pos_embed_has_prefix else 0
    patches = pe.detach()[:, n_prefix:].float()  # (1, gh*gw, D)
    src = info.pos_grid_size  # the table's own layout (not the token grid of a padded input)
    grid = None if grid is None else size2(grid, "grid")  # one int: a square grid; checked before timm resamples
    if grid is not None and grid != tuple(src):
        patches = resample_abs_pos_embed(patches, new_size=list(grid), old_size=list(src), num_prefix_tokens=0)
        src = tuple(grid)
    return patches[0].reshape(*src, -1), src


def position_embedding_similarity(model: AnyModel, grid: tuple[int, int] | None = None) -> Tensor:
    """(gh, gw, gh, gw) cosine similarity of patch position embeddings; ``grid`` (gh, gw), or one int for a square
    grid, resamples them first."""
    emb, (gh, gw) = _grid_embeddings(resolve_model(model), grid)
    flat = F.normalize(emb.reshape(gh * gw, -1), dim=-1)
    return (flat @ flat.T).reshape(gh, gw, gh, gw)


def position_structure_score(similarity: Tensor) -> float:
    """Spearman correlation between similarity and grid distance over all distinct patch pairs."""
    if similarity.dim() != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(f"similarity must be the (gh, gw, gh, gw) output of position_embedding_similarity, got shape "
                         f"{tuple(similarity.shape)}")
    gh, gw = similarity.shape[:2]
    dist = patch_distances((gh, gw), (1, 1))  # in grid units
    iu = torch.triu_indices(gh * gw, gh * gw, offset=1)
    sim = similarity.reshape(gh * gw, gh * gw).double()[iu[0], iu[1]]
    return float(spearman(sim[None], dist[iu[0], iu[1]][None])[0])


def position_table(model: AnyModel) -> Tensor:
    """(gh, gw, D) float32 patch position embeddings in the table's own grid, prefix rows excluded (raises
    ValueError for a model without an absolute position-embedding table)."""
    return _grid_embeddings(resolve_model(model))[0]
