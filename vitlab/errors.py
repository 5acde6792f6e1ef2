"""The one error type of model loading, shared by the zoo, the checkpoint reader and the loader."""

from __future__ import annotations

__all__ = ["ModelLoadError"]


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""
