"""Shared fixtures: tiny models that build in milliseconds on CPU."""

from __future__ import annotations

import pytest
import timm
import torch

import vitlab

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's waits for a
# descheduled thread make every small op many times slower: tests run on one thread.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_vit(**overrides) -> torch.nn.Module:
    """A 3-block ViT-Ti/4 at 32 px, randomly initialised, in eval mode."""
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=3, num_classes=10, **overrides)
    return vitlab.build_model(cfg).eval()


def tiny_timm(name: str, **kwargs) -> torch.nn.Module:
    """A timm architecture at reduced depth, random weights, eval mode."""
    kwargs.setdefault("depth", 2)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


@pytest.fixture
def vit():
    return tiny_vit()
