"""The paper's inspection analyses, one module per figure: tensors or a model in, tensors out (no plotting)."""

from vitlab.inspect.distance import attention_distance_from_maps, mean_attention_distance, patch_distances
from vitlab.inspect.filters import embedding_filter_pca
from vitlab.inspect.positions import position_embedding_similarity, position_structure_score
from vitlab.inspect.rollout import attention_rollout, rollout_from_maps

__all__ = [
    "attention_distance_from_maps",
    "attention_rollout",
    "embedding_filter_pca",
    "mean_attention_distance",
    "patch_distances",
    "position_embedding_similarity",
    "position_structure_score",
    "rollout_from_maps",
]
