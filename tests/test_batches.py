"""Training batches: a function of (seed, epoch, step) alone, whichever process makes them."""

from __future__ import annotations

import os

import pytest
import torch

from vitlab.data.datasets import ImageArray
from vitlab.train.augment import alternating_flips
from vitlab.train.batches import Augment, TrainBatches, default_workers, training_batches

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


def test_each_batch_of_an_epoch_draws_its_own_crops():
    """40 copies of one image: the batches differ only by their crops and flips, which each step draws anew."""
    images = torch.randint(0, 256, (1, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    same = ImageArray(images.expand(N, -1, -1, -1).clone(), torch.zeros(N, dtype=torch.long), ("a",), "one image")
    ds = TrainBatches(same, B, STEPS, Augment(seed=0, crop_padding=4))
    batches = [ds[it][0] for it in range(STEPS)]
    assert all(not torch.equal(a, b) for a, b in zip(batches, batches[1:]))
    assert torch.equal(TrainBatches(same, B, STEPS, Augment(seed=0, crop_padding=4))[1][0], batches[1])


def test_worker_defaults_and_bad_counts(data, monkeypatch):
    assert default_workers(torch.device("cpu")) == 0
    assert 0 <= default_workers(torch.device("cuda")) <= 16
    for cores, workers in ((1, 0), (2, 0), (8, 6), (64, 16)):  # all cores but two, at most 16
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert default_workers(torch.device("cuda")) == workers
    for workers in (-1, 1.5, True):  # 1.5 and True passed the check (a bool is an int to Python, 1.5 >= 0)
        with pytest.raises(ValueError, match=f"workers must be a whole number >= 0 .*got {workers!r}"):
            training_batches(data, B, STEPS, Augment(), 0, STEPS, workers=workers)


def test_posterize_keeps_zero_bits_as_black_and_other_counts_as_timm_does():
    """Pillow 13 refuses ``ImageOps.posterize(img, 0)``, which timm's op asks for at low (or, increasing, top)
    magnitudes: vitlab's op gives the black image the zero-bit mask means, and timm's result for 1-8 bits."""
    import numpy as np
    from PIL import Image
    from timm.data.auto_augment import posterize as timm_posterize

    from vitlab.train.batches import posterize

    g = torch.Generator().manual_seed(0)
    img = Image.fromarray(torch.randint(0, 256, (8, 8, 3), dtype=torch.uint8, generator=g).numpy())
    assert not np.asarray(posterize(img, 0)).any() and posterize(img, 0).size == img.size
    for bits in range(1, 9):
        assert np.array_equal(np.asarray(posterize(img, bits)), np.asarray(timm_posterize(img, bits)))
    top_bit = np.asarray(img) & 0b10000000
    assert np.array_equal(np.asarray(posterize(img, 1)), top_bit)  # an independent mask of the top bit


@pytest.mark.parametrize("spec", ["rand-m9-mstd0.5-inc1", "rand-m10-n2-mstd101", "rand-m1-n2"])
def test_randaugment_runs_the_specs_that_reach_zero_bit_posterize(spec):
    """DeiT's own spec (``inc1``: PosterizeIncreasing keeps 0 bits at magnitude 10), uniform magnitudes and low ones
    ask timm's Posterize for 0 bits within a few batches of 64; each batch still comes out, shape and dtype kept."""
    from vitlab.train.batches import randaugment

    images = torch.randint(0, 256, (64, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    blacks = 0
    for k in range(6):
        out = randaugment(images, spec, torch.Generator().manual_seed(k))
        assert out.shape == images.shape and out.dtype == torch.uint8
        blacks += int((out.flatten(1).amax(1) == 0).sum())
    assert blacks > 0  # the zero-bit posterize did happen, and gave black images


def test_randaugment_is_unchanged_where_posterize_keeps_bits():
    """With no magnitude noise (m9: Posterize keeps 3 bits) the batch equals timm's transform, image by image, with
    the same seeding: the zero-bit guard changes nothing else."""
    import random

    import numpy as np
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    from vitlab.train.batches import randaugment

    images = torch.randint(0, 256, (32, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(5)
    got = randaugment(images, "rand-m9-n3-mstd0", g)
    seed = int(torch.randint(0, 2**31, (1,), generator=torch.Generator().manual_seed(5)))
    random.seed(seed)
    np.random.seed(seed)
    tf = rand_augment_transform("rand-m9-n3-mstd0", {"translate_const": 7, "img_mean": (125, 123, 114)})
    want = np.stack([np.asarray(tf(Image.fromarray(a))) for a in images.numpy()])
    assert np.array_equal(got.numpy(), want)


def test_a_batch_worker_ends_on_sigterm_without_the_commands_handler():
    """`vitlab train --workers 1000` printed a 'vitlab.cli.Terminated' traceback per worker: the workers forked with
    the command's SIGTERM handler, and the loader stops a slow worker with SIGTERM."""
    import os
    import signal

    from vitlab.cli import _raise_terminated
    from vitlab.train.batches import _worker_init

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                _worker_init(0)
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()
            except BaseException:
                os._exit(3)  # the handler raised: a traceback in a real worker
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
