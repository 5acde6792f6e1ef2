"""The airbench pieces of the CNN teacher's recipe, each off by default: alternating flips, Lookahead averaging and a
whitening bias frozen after a few epochs; resume stays exact with them, and old run configs still match."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _reference import three_class_split
from safetensors.torch import load_file
from torch import nn

import vitlab.train.batches as B
import vitlab.train.loop as T
from vitlab.models.config import CifarNetConfig
from vitlab.train.augment import alternating_flips, random_crop_flip
from vitlab.train.config import PRESETS, TrainConfig, train_config_from_dict, train_config_to_dict
from vitlab.train.lookahead import Lookahead, lookahead_decay
from vitlab.train.loop import train

TINY_CNN = CifarNetConfig(widths=(8, 16, 16), num_classes=3)
NEW_KEYS = ("flip", "lookahead_every", "lookahead_decay", "lookahead_power", "whiten_bias_epochs")
#: The tiny teacher with all three options: 96 images in batches of 32 = 3 steps an epoch, Lookahead every 2 steps
#: (so its meetings cross epoch boundaries), the whitening bias trained in epoch 0 only.
RECIPE = dict(model=TINY_CNN, batch_size=32, warmup_epochs=0.5, eval_tta=0, flip="alternating", lookahead_every=2,
              lookahead_decay=0.9, whiten_bias_epochs=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return three_class_split(tmp_path_factory.mktemp("recipe"))


class _Killed(Exception):
    pass


def _killed_at(step0: int):
    """``lr_at`` that crashes the run at global step ``step0`` (mid-epoch: the last epoch's checkpoint stays)."""
    real = T.lr_at

    def lr_at(step, *args):
        if step >= step0:
            raise _Killed
        return real(step, *args)

    return lr_at


# ---------------------------------------------------------------------------------------------- alternating flips


def test_alternating_flips_show_every_image_both_ways_in_two_consecutive_epochs():
    flips = [alternating_flips(10_000, e, seed=3) for e in range(4)]
    assert 0.48 < flips[0].float().mean() < 0.52  # epoch 0: a fair coin per image (4.5 standard deviations)
    for a, b in zip(flips, flips[1:]):
        assert (a ^ b).all()  # mirrored in exactly one of any two consecutive epochs
    assert torch.equal(flips[0], flips[2]) and torch.equal(alternating_flips(10_000, 0, seed=3), flips[0])
    assert not torch.equal(alternating_flips(10_000, 0, seed=4), flips[0])


def test_crop_flip_mirrors_exactly_the_images_it_is_given():
    images = torch.randint(0, 256, (6, 8, 8, 3), dtype=torch.uint8)
    flip = torch.tensor([True, False, True, True, False, False])
    out = random_crop_flip(images, 0, torch.Generator().manual_seed(0), flip=flip)
    assert torch.equal(out, torch.where(flip[:, None, None, None], images.flip(2), images))
    with pytest.raises(ValueError, match="bool tensor"):
        random_crop_flip(images, 0, torch.Generator(), flip=flip[:3])


# ---------------------------------------------------------------------------------------------- Lookahead


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.register_buffer("stat", torch.zeros(()))  # a float buffer, like BatchNorm's running mean
        self.register_buffer("count", torch.zeros((), dtype=torch.long))  # like num_batches_tracked


def test_lookahead_known_answer_on_a_toy_model():
    # SGD at lr 1 on loss = w moves w by -1 a step; the float buffer moves +10 a step, the integer one +1.
    # Meetings every 2 of 5 steps, decay 0.25 * (step / 5): 0.1 after step 2, 0.2 after step 4. By hand:
    #   steps 1, 2: w = -2, then slow = 0 + 0.9 * (-2 - 0) = -1.8 = w
    #   steps 3, 4: w = -3.8, then slow = -1.8 + 0.8 * (-3.8 + 1.8) = -3.4 = w
    #   step 5: w = -4.4; finish meets at decay 0.25: slow = -3.4 + 0.75 * (-4.4 + 3.4) = -4.15 = w (step 5 counts).
    #   The float buffer is 10x that, negated; the integer one counts 5.
    model = _Toy()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    look = Lookahead(model, every=2, total_steps=5, decay=0.25, power=1.0)
    seen = []
    for step in range(1, 6):
        opt.zero_grad()
        model.w.backward()
        opt.step()
        with torch.no_grad():
            model.stat += 10
            model.count += 1
        look.after_step(step)
        seen.append(float(model.w.detach()))
    look.finish(5)
    assert seen == pytest.approx([-1.0, -1.8, -2.8, -3.4, -4.4])
    assert float(model.w.detach()) == pytest.approx(-4.15) and float(model.stat) == pytest.approx(41.5)
    look.finish(4)  # right after a meeting: nothing to do
    assert float(model.w.detach()) == pytest.approx(-4.15)
    assert int(model.count) == 5
    assert lookahead_decay(2, 5, 0.25, 1.0) == pytest.approx(0.1)
    assert lookahead_decay(9, 10, 0.95**5, 3.0) == pytest.approx(0.95**5 * 0.729)


# ---------------------------------------------------------------------------------------------- in the training loop


def test_the_loop_flips_alternately_meets_on_schedule_and_freezes_the_whitening_bias(tmp_path, data, monkeypatch):
    train_data, test_data = data
    index = {bytes(img.numpy()): i for i, img in enumerate(train_data.images)}
    flips: list[dict[int, bool]] = []  # per call: dataset index -> mirrored
    real_crop = B.random_crop_flip

    def crop(images, padding, generator, mode="constant", flip=None):
        assert flip is not None
        flips.append({index[bytes(img.numpy())]: bool(f) for img, f in zip(images, flip)})
        return real_crop(images, padding, generator, mode, flip)

    decays: list[float] = []
    real_sync = Lookahead.sync
    biases: list[torch.Tensor] = []
    real_save = T.save_run_checkpoint

    def save(directory, model, *args, **kwargs):
        biases.append(model.whiten.bias.detach().clone())
        return real_save(directory, model, *args, **kwargs)

    monkeypatch.setattr(B, "random_crop_flip", crop)
    monkeypatch.setattr(Lookahead, "sync", lambda self, decay: (decays.append(decay), real_sync(self, decay)))
    monkeypatch.setattr(T, "save_run_checkpoint", save)
    cfg = dataclasses.replace(PRESETS["resnet_cifar10"], epochs=3, **RECIPE)
    model = train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)

    epoch = [{k: v for call in flips[3 * e : 3 * e + 3] for k, v in call.items()} for e in range(3)]
    assert all(len(e) == len(train_data) for e in epoch)  # 3 steps of 32 visit all 96 images
    assert all(epoch[0][i] != epoch[1][i] and epoch[1][i] != epoch[2][i] for i in range(len(train_data)))
    assert 20 < sum(epoch[0].values()) < 76

    # meetings every 2 of the run's 9 steps, and at the ends of epochs (steps 3, 6, 9) unless one just happened
    assert decays == pytest.approx([lookahead_decay(s, 9, 0.9, 3.0) for s in (2, 3, 4, 6, 8, 9)])

    assert biases[0].abs().sum() > 0  # trained in epoch 0 (initialised at zero) ...
    assert torch.equal(biases[1], biases[0]) and torch.equal(biases[2], biases[0])  # ... then frozen
    assert torch.equal(model.whiten.bias.detach(), biases[0])


def test_resume_with_the_recipe_ends_where_an_uninterrupted_run_does(tmp_path, data, monkeypatch):
    train_data, test_data = data
    cfg = dataclasses.replace(PRESETS["resnet_cifar10"], epochs=4, **RECIPE)
    kw = dict(progress=False, train_data=train_data, test_data=test_data)
    train(cfg, tmp_path / "full", **kw)

    with monkeypatch.context() as m:
        m.setattr(T, "lr_at", _killed_at(2 * 3 + 1))  # the second step of epoch 3
        with pytest.raises(_Killed):
            train(cfg, tmp_path / "killed", **kw)
    assert json.loads((tmp_path / "killed" / "checkpoint" / "config.json").read_text())["epoch"] == 2
    train(cfg, tmp_path / "killed", resume=True, **kw)

    for name in ("model.safetensors", "optimizer.safetensors"):
        a = load_file(str(tmp_path / "full" / "checkpoint" / name))
        b = load_file(str(tmp_path / "killed" / "checkpoint" / name))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name


# ---------------------------------------------------------------------------------------------- configs


def test_old_run_configs_without_the_new_keys_equal_their_presets():
    with_new_keys = ("resnet_cifar10_fast", "resnet_cifar10_wide")  # the presets that use them
    for name, preset in PRESETS.items():
        if name in with_new_keys:
            continue
        assert (preset.flip, preset.lookahead_every, preset.whiten_bias_epochs) == ("random", 0, None), name
        old = {k: v for k, v in train_config_to_dict(preset).items() if k not in NEW_KEYS}
        assert train_config_from_dict(json.loads(json.dumps(old))) == preset, name
    for name in with_new_keys:
        preset = PRESETS[name]
        assert train_config_from_dict(json.loads(json.dumps(train_config_to_dict(preset)))) == preset, name


def test_resume_accepts_a_run_folder_written_before_the_new_keys(tmp_path, data, monkeypatch):
    train_data, test_data = data
    cfg = dataclasses.replace(PRESETS["resnet_cifar10"], model=TINY_CNN, epochs=2, batch_size=32, warmup_epochs=0.5,
                              eval_tta=0)
    kw = dict(progress=False, train_data=train_data, test_data=test_data)
    with monkeypatch.context() as m:
        m.setattr(T, "lr_at", _killed_at(3))  # in epoch 2
        with pytest.raises(_Killed):
            train(cfg, tmp_path / "run", **kw)
    saved = tmp_path / "run" / "train_config.json"
    saved.write_text(json.dumps({k: v for k, v in json.loads(saved.read_text()).items() if k not in NEW_KEYS}))
    train(cfg, tmp_path / "run", resume=True, **kw)  # the defaults are today's behaviour: the configs compare equal
    assert json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())["epoch"] == 2


def test_the_fast_preset_is_the_teacher_with_the_three_options():
    base, fast = PRESETS["resnet_cifar10"], PRESETS["resnet_cifar10_fast"]
    changed = {f.name for f in dataclasses.fields(base) if getattr(base, f.name) != getattr(fast, f.name)}
    assert changed == {"flip", "lookahead_every", "whiten_bias_epochs"}
    assert fast.lookahead_every * fast.batch_size == 5 * 1024  # airbench's 5 steps of 1024 images


@pytest.mark.parametrize("change, message", [
    (dict(flip="sometimes"), "flip must be"),
    (dict(lookahead_every=-1), "lookahead_every must be"),
    (dict(lookahead_decay=1.0), "lookahead_decay must be"),
    (dict(whiten_bias_epochs=-1), "whiten_bias_epochs must be"),
])
def test_bad_options_are_refused_with_the_fix(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PRESETS["resnet_cifar10"], **change)


def test_whiten_bias_epochs_needs_a_whitening_stem():
    with pytest.raises(ValueError, match="CifarNetConfig"):
        TrainConfig(model=PRESETS["tiny"].model, whiten_bias_epochs=3)


def test_the_wide_preset_is_the_fast_one_wider_and_longer_with_its_epoch_counts_scaled():
    fast, wide = PRESETS["resnet_cifar10_fast"], PRESETS["resnet_cifar10_wide"]
    changed = {f.name for f in dataclasses.fields(fast) if getattr(fast, f.name) != getattr(wide, f.name)}
    assert changed == {"model", "epochs", "warmup_epochs", "whiten_bias_epochs"}
    assert dataclasses.replace(wide.model, widths=fast.model.widths) == fast.model
    assert wide.warmup_epochs / wide.epochs == pytest.approx(fast.warmup_epochs / fast.epochs)  # 23%
    assert wide.whiten_bias_epochs / wide.epochs == pytest.approx(fast.whiten_bias_epochs / fast.epochs)  # 30%
