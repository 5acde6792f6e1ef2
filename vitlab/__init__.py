"""vitlab: look inside Vision Transformers (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021).

The public names load on first use (PEP 562), so that ``import vitlab`` and the ``vitlab`` command's ``--help``
load no torch or timm: ``vitlab.attention_rollout`` imports ``vitlab.inspect`` then.
"""

# first: stamps the code and commit this process loads (see vitlab.base.provenance.code_hash)
from vitlab.base import provenance as _provenance  # noqa: I001

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

if _typing.TYPE_CHECKING:
    from vitlab.base.errors import ModelLoadError
    from vitlab.inspect import (
        attention_rollout,
        cka,
        compare_methods,
        deletion_insertion,
        embedding_filter_pca,
        gradient_rollout,
        head_importance,
        integrated_gradients,
        layer_similarity,
        localisation,
        mean_attention_distance,
        occlusion,
        position_embedding_similarity,
        position_structure_score,
        prefix_attention,
        randomization_sanity,
        token_norms,
    )
    from vitlab.inspect.capture import (
        AttentionCapture,
        AttentionCaptureError,
        attention_maps,
        capture_attention,
        find_attention_modules,
    )
    from vitlab.models.checkpoint import load_checkpoint, save_checkpoint
    from vitlab.models.config import BiTConfig, HybridConfig, ViTConfig, vit_config
    from vitlab.models.finetune import resize_for_finetuning
    from vitlab.models.info import ModelInfo, ResolvedModel, model_info, resolve_model
    from vitlab.models.load import load_model
    from vitlab.models.zoo import build_model

__version__ = _provenance.VERSION

__all__ = [
    "AttentionCapture",
    "AttentionCaptureError",
    "BiTConfig",
    "HybridConfig",
    "ModelInfo",
    "ModelLoadError",
    "ResolvedModel",
    "ViTConfig",
    "attention_maps",
    "attention_rollout",
    "cka",
    "compare_methods",
    "head_importance",
    "layer_similarity",
    "prefix_attention",
    "token_norms",
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
    "resolve_model",
    "resize_for_finetuning",
    "save_checkpoint",
    "vit_config",
]

#: The module each public name comes from
_SOURCES = {
    **dict.fromkeys(["AttentionCapture", "AttentionCaptureError", "attention_maps", "capture_attention",
                     "find_attention_modules"], "vitlab.inspect.capture"),
    **dict.fromkeys(["load_checkpoint", "save_checkpoint"], "vitlab.models.checkpoint"),
    "ModelLoadError": "vitlab.base.errors",
    "resize_for_finetuning": "vitlab.models.finetune",
    **dict.fromkeys(["ModelInfo", "model_info", "ResolvedModel", "resolve_model"], "vitlab.models.info"),
    **dict.fromkeys(["attention_rollout", "compare_methods", "deletion_insertion", "embedding_filter_pca",
                     "gradient_rollout", "integrated_gradients", "localisation", "mean_attention_distance", "occlusion",
                     "position_embedding_similarity", "position_structure_score", "randomization_sanity", "cka",
                     "layer_similarity", "head_importance", "prefix_attention", "token_norms"],
                    "vitlab.inspect"),
    "load_model": "vitlab.models.load",
    **dict.fromkeys(["BiTConfig", "HybridConfig", "ViTConfig", "vit_config"], "vitlab.models.config"),  # no torch
    "build_model": "vitlab.models.zoo",
}


def __getattr__(name: str) -> _typing.Any:
    """A public name from its module, imported on first use (then kept here); a submodule by its name, as when this
    package imported them all (``vitlab.models.zoo`` after ``import vitlab``)."""
    if name in _SOURCES:
        value = getattr(_importlib.import_module(_SOURCES[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (loaded or not), the submodules imported so far and the dunders; not this file's helpers."""
    return sorted(n for n in set(globals()) | set(__all__) if not n.startswith("_") or n.startswith("__"))
