"""The embedded default model: loadable, small, declares its preprocessing, reproduces its model card."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from conftest import needs_cifar10
from safetensors.torch import load_file

import vitlab
from vitlab.models.load import DEFAULT_CHECKPOINT

shipped = pytest.mark.skipif(not (DEFAULT_CHECKPOINT / "model.safetensors").is_file(),
                             reason="the default checkpoint is not in this checkout")


@shipped
def test_default_loads_small_and_declares_preprocessing():
    model = vitlab.load_model()
    assert not model.training
    weights = DEFAULT_CHECKPOINT / "model.safetensors"
    assert weights.stat().st_size <= 15 * 1024 * 1024
    assert all(t.dtype == torch.float16 for t in load_file(str(weights)).values())
    cfg = timm.data.resolve_data_config({}, model=model)
    assert cfg["input_size"] == (3, 32, 32)
    assert cfg["mean"] == pytest.approx((0.4914, 0.4822, 0.4465)) and cfg["std"] == pytest.approx((0.2470, 0.2435, 0.2616))
    card = json.loads((DEFAULT_CHECKPOINT / "card.json").read_text())
    assert "vitlab train --preset vit_cifar10" in card["command"]
    text = (DEFAULT_CHECKPOINT / "MODEL_CARD.md").read_text()
    assert text.count(f"{card['test_accuracy']:.2%}") >= 1
    # a distilled model says so first: its teacher's bias is part of what it learned (issue 46)
    assert card["teacher"] and card["teacher"] in text.splitlines()[0]
    maps = vitlab.attention_maps(model.float(), torch.randn(2, 3, 32, 32))
    assert maps.shape[-1] == 64 + model.num_prefix_tokens  # the 8x8 patch grid and the class (+ distillation) token


@shipped
def test_the_defaults_teacher_is_shipped_and_its_card_agrees():
    card = json.loads((DEFAULT_CHECKPOINT / "card.json").read_text())
    if card["teacher"] is None:
        pytest.skip("the default was not distilled")
    teacher = DEFAULT_CHECKPOINT.parents[2] / card["teacher"]  # a path relative to the repository
    assert (teacher / "model.safetensors").is_file(), f"{card['teacher']} is not shipped"
    from vitlab.train.config import TEACHER_CIFAR10

    assert f"--set teacher={card['teacher']}" in card["command"] or card["teacher"] == TEACHER_CIFAR10
    teacher_card = json.loads((teacher / "card.json").read_text())
    # the teacher's accuracy measured at the default's export equals the one its own card states
    assert card["distillation"]["teacher"] == pytest.approx(teacher_card["test_accuracy"], abs=1e-4)


@shipped
@pytest.mark.slow
@needs_cifar10
def test_default_reproduces_card_accuracy():
    from vitlab.data.datasets import load_cifar
    from vitlab.train.export import timm_pipeline_accuracy

    card = json.loads((DEFAULT_CHECKPOINT / "card.json").read_text())
    acc = timm_pipeline_accuracy(vitlab.load_model(), load_cifar("cifar10", "test"))
    assert acc == pytest.approx(card["test_accuracy"], abs=1e-4)


@pytest.mark.slow
def test_full_size_vit_b16_capture_is_exact():
    from test_capture import plain_and_captured, reference_attention

    model = vitlab.build_model(vitlab.vit_config("B/16")).eval()
    x = torch.randn(2, 3, 224, 224)
    plain, logits, maps = plain_and_captured(model, x)
    torch.testing.assert_close(logits, plain, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(maps.double(), reference_attention(model, x), atol=1e-5, rtol=0)


CHECKPOINTS = DEFAULT_CHECKPOINT.parent
OTHERS = [("vit_shapes", "vitlab train --preset vit_shapes", "shapes"),
          ("bit_cifar10", "vitlab train --preset bit_cifar10", "cifar10"),
          ("resnet_cifar10_fast", "vitlab train --preset resnet_cifar10_fast", "cifar10"),
          ("resnet_cifar10_wide", "vitlab train --preset resnet_cifar10_wide", "cifar10")]


@pytest.mark.parametrize("folder,command,data", OTHERS, ids=[o[0] for o in OTHERS])
def test_other_shipped_checkpoints_load_with_honest_cards(folder, command, data):
    path = CHECKPOINTS / folder
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not shipped in this checkout")
    model = vitlab.load_model(str(path))
    card = json.loads((path / "card.json").read_text())
    assert card["command"].startswith(command) and data in card["data"]["train"]
    assert (path / "model.safetensors").stat().st_size <= 15 * 1024 * 1024
    assert timm.data.resolve_data_config({}, model=model)["input_size"] == (3, 32, 32)
    if data == "shapes":  # generated data: the card's accuracy is checked here, on every run
        from vitlab.data.datasets import load_shapes
        from vitlab.train.export import timm_pipeline_accuracy

        assert timm_pipeline_accuracy(model, load_shapes("test")) == pytest.approx(card["test_accuracy"], abs=1e-4)


@pytest.mark.slow
@needs_cifar10
@pytest.mark.parametrize("folder", ["bit_cifar10", "resnet_cifar10_fast", "resnet_cifar10_wide"])
def test_shipped_cifar_models_reproduce_card_accuracy(folder):
    from vitlab.data.datasets import load_cifar
    from vitlab.train.export import timm_pipeline_accuracy
    from vitlab.train.loop import evaluate

    path = CHECKPOINTS / folder
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not shipped in this checkout")
    card = json.loads((path / "card.json").read_text())
    model, test = vitlab.load_model(str(path)), load_cifar("cifar10", "test")
    assert timm_pipeline_accuracy(model, test) == pytest.approx(card["test_accuracy"], abs=1e-4)
    if card.get("test_accuracy_tta") is not None:
        assert evaluate(model.float(), test, tta=card["tta_level"]) == pytest.approx(card["test_accuracy_tta"], abs=1e-4)


@pytest.mark.slow
@needs_cifar10
def test_shipped_mpp_encoder_reproduces_its_card():
    from vitlab.data.datasets import load_cifar
    from vitlab.train.loop import evaluate_mpp
    from vitlab.train.mpp import load_mpp

    path = CHECKPOINTS / "mpp_cifar10"
    if not (path / "model.safetensors").is_file():
        pytest.skip("mpp_cifar10 is not shipped in this checkout")
    card = json.loads((path / "card.json").read_text())
    test = load_cifar("cifar10", "test")
    got = evaluate_mpp(*load_mpp(path), test, n=len(test))
    assert got["accuracy"] == pytest.approx(card["mpp_test"]["accuracy"], abs=1e-4)
    assert got["loss"] == pytest.approx(card["mpp_test"]["loss"], rel=1e-4)


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in CHECKPOINTS.glob("*/card.json")))
def test_a_cards_command_rebuilds_the_training_config_it_shipped_with(folder):
    """`vitlab train` with the card's command line (its flags; a trailing comment aside) builds
    exactly the training config recorded in the checkpoint, so the card's command reproduces the run."""
    import re
    import shlex

    from vitlab.cli import build_parser
    from vitlab.cli.train import preset_config
    from vitlab.train.config import train_config_from_dict

    path = CHECKPOINTS / folder
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not shipped in this checkout")
    command = json.loads((path / "card.json").read_text())["command"]
    train_command = re.search(r"vitlab train [^)#]*", command)  # a study's card names its run's own command
    assert train_command, f"{folder}'s card names no vitlab train command: {command}"
    args = build_parser().parse_args(shlex.split(train_command.group(0))[1:])
    cfg = preset_config(args.preset, args.set, args.epochs, args.data)
    shipped = json.loads((path / "config.json").read_text())["train"]
    assert train_config_from_dict(shipped) == cfg  # keys newer than the checkpoint take their (old-behaviour) defaults
