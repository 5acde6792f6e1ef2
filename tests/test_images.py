"""Analysis images: the shipped 128-image CIFAR-10 sample and the choice of default images by input size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitlab
from vitlab.data import SHARED_CIFAR10, load_dataset
from vitlab.images import CIFAR_SAMPLE, cifar_test_sample, default_images, model_transform


def test_cifar_sample_is_class_balanced_interleaved_and_small():
    data = cifar_test_sample()
    assert data.images.shape == (128, 32, 32, 3) and data.images.dtype == torch.uint8
    counts = torch.bincount(data.labels, minlength=10).tolist()
    assert sorted(counts) == [12, 12] + [13] * 8
    assert data.labels[:10].tolist() == list(range(10))  # any first n is balanced
    assert CIFAR_SAMPLE.stat().st_size < 500_000


@pytest.mark.skipif(not (SHARED_CIFAR10 / "test.zip").is_file(), reason="../shared CIFAR-10 not present")
def test_cifar_sample_equals_the_test_split_at_its_index():
    test = load_dataset("cifar10", "test")
    with np.load(CIFAR_SAMPLE) as z:
        index = torch.from_numpy(z["index"])
    sample = cifar_test_sample()
    assert torch.equal(test.images[index], sample.images) and torch.equal(test.labels[index], sample.labels)
    assert len(set(index.tolist())) == 128


def test_default_images_follow_the_input_size():
    small = vitlab.load_model()  # 32 px
    names, x, shown = default_images(small, 12)
    assert names[:2] == ["airplane #0", "automobile #1"] and x.shape == (12, 3, 32, 32)
    tf, _ = model_transform(small)
    from PIL import Image

    torch.testing.assert_close(x[3], tf(Image.fromarray(cifar_test_sample().images[3].numpy())))
    assert len(default_images(small)[0]) == 128
    big = vitlab.load_model(vitlab.vit_config("Ti/16", img_size=64, num_classes=0))
    names, x, _ = default_images(big, 4)
    assert x.shape == (4, 3, 64, 64) and not names[0].startswith("airplane")
