"""The paper's inspection analyses, one module per figure: tensors or a model in, tensors out (no plotting)."""

from vitlab.inspect.attribution import (
    ATTRIBUTION_METHODS,
    attribution,
    gradient_rollout,
    integrated_gradients,
    occlusion,
)
from vitlab.inspect.cka import REPRESENTATIONS, MinibatchCKA, cka, layer_features, layer_similarity
from vitlab.inspect.compare import MethodScores, compare_methods
from vitlab.inspect.distance import attention_distance_from_maps, mean_attention_distance, patch_distances
from vitlab.inspect.faithfulness import deletion_insertion, localisation, randomization_sanity
from vitlab.inspect.filters import (
    embedding_filter_pca,
    embedding_filters,
    filter_component_count,
    filter_pca,
    random_filter_pca_ratios,
)
from vitlab.inspect.heads import ABLATIONS, HeadImportance, head_importance
from vitlab.inspect.positions import position_embedding_similarity, position_structure_score, position_table
from vitlab.inspect.rollout import (
    attention_rollout,
    attention_view,
    readout_attention,
    readout_vector,
    rollout_from_maps,
)
from vitlab.inspect.tokens import TokenNorms, prefix_attention, token_norms

__all__ = [
    "ABLATIONS",
    "ATTRIBUTION_METHODS",
    "HeadImportance",
    "MethodScores",
    "MinibatchCKA",
    "REPRESENTATIONS",
    "TokenNorms",
    "cka",
    "head_importance",
    "layer_features",
    "layer_similarity",
    "prefix_attention",
    "token_norms",
    "attention_distance_from_maps",
    "attention_rollout",
    "attention_view",
    "attribution",
    "compare_methods",
    "deletion_insertion",
    "embedding_filter_pca",
    "embedding_filters",
    "filter_component_count",
    "filter_pca",
    "random_filter_pca_ratios",
    "readout_attention",
    "readout_vector",
    "gradient_rollout",
    "integrated_gradients",
    "localisation",
    "mean_attention_distance",
    "occlusion",
    "patch_distances",
    "position_embedding_similarity",
    "position_structure_score",
    "position_table",
    "randomization_sanity",
    "rollout_from_maps",
]
