"""vitlab: look inside Vision Transformers (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021)."""

# first: stamps the code and commit this process loads (see vitlab.provenance.code_hash)
from vitlab import provenance as _provenance  # noqa: F401, I001

from vitlab.capture import (
    AttentionCapture,
    AttentionCaptureError,
    attention_maps,
    capture_attention,
    find_attention_modules,
)
from vitlab.checkpoint import load_checkpoint, save_checkpoint
from vitlab.errors import ModelLoadError
from vitlab.finetune import resize_for_finetuning
from vitlab.info import ModelInfo, model_info
from vitlab.inspect import (
    attention_rollout,
    compare_methods,
    deletion_insertion,
    embedding_filter_pca,
    gradient_rollout,
    integrated_gradients,
    localisation,
    mean_attention_distance,
    occlusion,
    position_embedding_similarity,
    position_structure_score,
    randomization_sanity,
)
from vitlab.models import load_model
from vitlab.zoo import BiTConfig, HybridConfig, ViTConfig, build_model, vit_config

__version__ = "0.1.0"

__all__ = [
    "AttentionCapture",
    "AttentionCaptureError",
    "BiTConfig",
    "HybridConfig",
    "ModelInfo",
    "ModelLoadError",
    "ViTConfig",
    "attention_maps",
    "attention_rollout",
    "compare_methods",
    "deletion_insertion",
    "gradient_rollout",
    "integrated_gradients",
    "localisation",
    "occlusion",
    "randomization_sanity",
    "embedding_filter_pca",
    "mean_attention_distance",
    "position_embedding_similarity",
    "position_structure_score",
    "build_model",
    "capture_attention",
    "find_attention_modules",
    "load_checkpoint",
    "load_model",
    "model_info",
    "resize_for_finetuning",
    "save_checkpoint",
    "vit_config",
]
