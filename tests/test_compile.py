"""Training through torch.compile: when ``train`` compiles by default, that a compiled run trains the same model as an
eager one, and that a machine where inductor cannot compile trains eagerly instead of failing."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from _reference import three_class_split

import vitlab
from vitlab.models.checkpoint import save_checkpoint
from vitlab.models.config import CifarNetConfig
from vitlab.train.compiling import COMPILE_MIN_STEPS, compile_by_default
from vitlab.train.config import PRESETS
from vitlab.train.export import export_run
from vitlab.train.loop import train

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# the tiny ViT in float32 without dropping or stochastic depth: nothing random inside the model, so the compiled run
# must follow the eager one up to the rounding of fused operations
CFG = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(PRESETS["tiny"].model, num_classes=3), epochs=2,
                          batch_size=16, randaugment=None, mixup_prob=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("imgs3c")


@pytest.fixture(scope="module")
def data(folder):
    return three_class_split(folder)


def _records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_compiled_by_default_only_where_measured_to_pay():
    vit = PRESETS["vit_cifar10"]
    assert compile_by_default(vit, CPU, COMPILE_MIN_STEPS)
    assert not compile_by_default(vit, CPU, COMPILE_MIN_STEPS - 1)  # a short run would spend more compiling
    assert not compile_by_default(vit, CUDA, 10**6)  # unmeasured on accelerators ...
    assert not compile_by_default(vit, CPU, 10**6, world=2)  # ... and under torchrun
    assert not compile_by_default(PRESETS["resnet_cifar10"], CPU, 10**6)  # the CNNs stay eager
    assert not compile_by_default(PRESETS["mpp_cifar10"], CPU, 10**6)  # so does masked patch prediction
    assert isinstance(PRESETS["resnet_cifar10"].model, CifarNetConfig)


# inductor's C++ compiler (torch._inductor.config.cpp.cxx: $CXX, else g++); without one, compiling is impossible and
# only the fallback below applies
HAVE_CXX = shutil.which(os.environ.get("CXX", "g++")) is not None


@pytest.mark.skipif(not HAVE_CXX, reason="no C++ compiler for inductor (the fallback test covers such a machine)")
@pytest.mark.parametrize("distilled", [False, True])
def test_a_compiled_run_trains_the_model_an_eager_run_trains(tmp_path, data, folder, distilled):
    train_data, test_data = data
    cfg = dataclasses.replace(CFG, data=str(folder))  # a folder: export finds the test split
    if distilled:  # the teacher's forward is compiled too (a random CNN: its decisions are the targets)
        torch.manual_seed(1)
        save_checkpoint(vitlab.build_model(CifarNetConfig(widths=(8, 16, 16), num_classes=3)), tmp_path / "teacher")
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, distilled=True),
                                  teacher=str(tmp_path / "teacher"), distill_tta=1)
    eager = train(cfg, tmp_path / "eager", progress=False, train_data=train_data, test_data=test_data, compile=False)
    torch._dynamo.reset()  # nothing compiled before: the run below must compile its own graphs
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = train(cfg, tmp_path / "compiled", progress=False, train_data=train_data, test_data=test_data,
                     compile=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= graphs + 1 + distilled  # student (and teacher)
    e, c = _records(tmp_path / "eager"), _records(tmp_path / "compiled")
    assert [r.get("compiled") for r in e] == [None, None] and [r.get("compiled") for r in c] == [True, True]
    for re_, rc in zip(e, c, strict=True):
        assert rc["train_loss"] == pytest.approx(re_["train_loss"], rel=1e-4)
        assert abs(rc["test_accuracy"] - re_["test_accuracy"]) <= 1 / len(test_data) + 1e-9  # a near tie may flip
    for (name, a), (_, b) in zip(eager.state_dict().items(), compiled.state_dict().items(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4, msg=name)
    # not part of the run's config: the compiled run resumes eagerly (and would the other way round)
    more = dataclasses.replace(cfg, epochs=3)
    (tmp_path / "compiled" / "train_config.json").write_text(
        (tmp_path / "compiled" / "train_config.json").read_text().replace('"epochs": 2', '"epochs": 3'))
    train(more, tmp_path / "compiled", resume=True, progress=False, train_data=train_data, test_data=test_data,
          compile=False)
    assert [r.get("compiled") for r in _records(tmp_path / "compiled")] == [True, True, None]
    # the card says how much of the training was compiled
    export_run(tmp_path / "compiled", tmp_path / "shipped", command="vitlab train --preset tiny")
    assert json.loads((tmp_path / "shipped" / "card.json").read_text())["compiled_epochs"] == 2
    card = (tmp_path / "shipped" / "MODEL_CARD.md").read_text()
    assert "the training step compiled by `torch.compile` in 2 of 3 epochs" in card
    assert ("distilled from" in card.splitlines()[0]) == distilled  # a teacher is said in the card's first line


def test_without_a_working_compiler_the_run_warns_and_trains_eagerly(tmp_path):
    """As on a machine without a C++ compiler: a fresh process (no compiled code in memory), an empty inductor cache
    and CXX naming no compiler."""
    train_data, test_data = three_class_split(tmp_path / "data")
    script = f"""
import json, warnings, dataclasses
from pathlib import Path
from vitlab.data.datasets import load_image_folder
from vitlab.train.loop import train
from vitlab.train.config import PRESETS
cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(PRESETS["tiny"].model, num_classes=3), epochs=2,
                          batch_size=16, randaugment=None, mixup_prob=0.0)
load = lambda s: load_image_folder(Path({str(tmp_path / "data")!r}) / s, cache=False, progress=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = train(cfg, Path({str(tmp_path / "fallback")!r}), progress=False, train_data=load("train"),
                  test_data=load("test"), compile=True)
print(json.dumps([str(w.message) for w in caught if "compile" in str(w.message)]))
"""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    caught = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(caught) == 1 and "could not compile the training step" in caught[0], caught
    assert "No working C++ compiler" in caught[0] and "training eagerly instead" in caught[0]
    train(CFG, tmp_path / "eager", progress=False, train_data=train_data, test_data=test_data, compile=False)
    fallback, eager = _records(tmp_path / "fallback"), _records(tmp_path / "eager")
    assert [r.get("compiled") for r in fallback] == [None, None]
    for rf, re_ in zip(fallback, eager, strict=True):  # the same eager run, in another process
        assert rf["train_loss"] == pytest.approx(re_["train_loss"], rel=1e-5)


def test_compile_is_refused_for_masked_patch_prediction_before_anything_is_written(tmp_path, data):
    train_data, test_data = data
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(CFG.model), epochs=1, batch_size=16,
                              warmup_epochs=0.5)
    with pytest.raises(ValueError, match="only classification runs compile") as e:
        train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data, compile=True)
    assert (e.value.param, e.value.value) == ("compile", True)
    assert not (tmp_path / "run").exists()
