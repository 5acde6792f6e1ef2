"""vitlab: look inside Vision Transformers (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021)."""

from vitlab.capture import (
    AttentionCapture,
    AttentionCaptureError,
    attention_maps,
    capture_attention,
    find_attention_modules,
)
from vitlab.info import ModelInfo, model_info
from vitlab.models import (
    BiTConfig,
    HybridConfig,
    ModelLoadError,
    ViTConfig,
    build_model,
    load_model,
    resize_for_finetuning,
    save_checkpoint,
    vit_config,
)

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
    "build_model",
    "capture_attention",
    "find_attention_modules",
    "load_model",
    "model_info",
    "resize_for_finetuning",
    "save_checkpoint",
    "vit_config",
]
