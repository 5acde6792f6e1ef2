"""Training batches: a function of (seed, epoch, step) alone, whichever process makes them."""

from __future__ import annotations

import pytest
import torch

from vitlab.batches import Augment, TrainBatches, default_workers, training_batches
from vitlab.data import ImageArray, alternating_flips

N, B, STEPS = 40, 8, 5  # 5 steps of 8 visit all 40 images


@pytest.fixture(scope="module")
def data() -> ImageArray:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (N, 16, 16, 3), dtype=torch.uint8, generator=g)
    images[:, 0, 0, 0] = torch.arange(N, dtype=torch.uint8)  # pixel (0, 0) names the image before augmentation
    return ImageArray(images, torch.arange(N) % 4, ("a", "b", "c", "d"), "synthetic")


def _all(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def test_workers_make_the_same_batches_as_the_training_process(data):
    aug = Augment(seed=3, crop_padding=2, crop_pad_mode="reflect", randaugment="rand-m9-n2-mstd0.5")
    here = _all(training_batches(data, B, STEPS, aug, 0, 3 * STEPS, workers=0))
    apart = _all(training_batches(data, B, STEPS, aug, 0, 3 * STEPS, workers=2))
    assert len(here) == len(apart) == 3 * STEPS
    for (x0, y0), (x1, y1) in zip(here, apart):
        assert x0.shape == (B, 16, 16, 3) and x0.dtype == torch.uint8
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    tail = _all(training_batches(data, B, STEPS, aug, 7, 3 * STEPS, workers=1))  # a resumed run mid-epoch
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(here[7:], tail))
    other = _all(training_batches(data, B, STEPS, Augment(seed=4, crop_padding=2), 0, STEPS))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(here, other))  # another seed, other batches


def test_each_epoch_visits_every_image_once_in_its_own_order(data):
    ds = TrainBatches(data, B, STEPS, Augment(seed=1, flip="none"))  # no crop, no flip: the images as stored
    seen = []
    for epoch in range(2):
        ids = torch.cat([ds[epoch * STEPS + it][0][:, 0, 0, 0] for it in range(STEPS)]).long()
        assert sorted(ids.tolist()) == list(range(N))
        labels = torch.cat([ds[epoch * STEPS + it][1] for it in range(STEPS)])
        assert torch.equal(labels, data.labels[ids])  # labels travel with their images
        seen.append(ids)
    assert not torch.equal(seen[0], seen[1])


def test_alternating_flips_mirror_the_images_the_epoch_before_did_not(data):
    aug = Augment(seed=2, flip="alternating")
    ds = TrainBatches(data, B, STEPS, aug)
    for epoch in range(2):
        mirrored = alternating_flips(N, epoch, seed=2 * 100_003 + 50_000)
        for it in range(STEPS):
            x, _ = ds[epoch * STEPS + it]
            idx = ds.epoch_order(epoch)[it * B : (it + 1) * B]
            want = torch.where(mirrored[idx][:, None, None, None], data.images[idx].flip(2), data.images[idx])
            assert torch.equal(x, want)


def test_worker_defaults_and_bad_counts(data):
    assert default_workers(torch.device("cpu")) == 0
    assert 0 <= default_workers(torch.device("cuda")) <= 16
    with pytest.raises(ValueError, match="workers must be >= 0"):
        training_batches(data, B, STEPS, Augment(), 0, STEPS, workers=-1)
