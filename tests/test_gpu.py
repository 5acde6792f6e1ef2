"""The analyses, the report and the commands on a CUDA GPU agree with the same code on the CPU.

Skipped where torch sees no CUDA GPU (CI never has one); run them on a GPU machine with
``pytest tests/test_gpu.py``. TF32 is switched off for the comparison: it is a cuDNN/cuBLAS speed setting (on by
default for convolutions), not part of what vitlab computes, and it moves float32 results by about 1e-3.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from conftest import tiny_hybrid, tiny_timm, tiny_vit

import vitlab
from vitlab.cli import main
from vitlab.data.datasets import load_shapes
from vitlab.inspect.attribution import has_classifier
from vitlab.probe.features import extract_features

#: the device compared with the CPU; VITLAB_TEST_DEVICE=cpu runs the same comparisons CPU against CPU (a dry run
#: of these tests on a machine without a GPU)
DEV = os.environ.get("VITLAB_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEV.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _exact_float32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _timm32(name: str, **kwargs) -> torch.nn.Module:
    """A tiny timm ViT at 32 px whose data config says 32 px (timm keeps the 224 of the name otherwise)."""
    return tiny_timm(name, img_size=32, patch_size=4, pretrained_cfg_overlay={"input_size": (3, 32, 32)}, **kwargs)


MODELS = {
    "embedded default (distilled)": lambda: vitlab.load_model(None).float().eval(),
    "vitlab ViT": lambda: tiny_vit(),
    "timm DeiT distilled": lambda: _timm32("deit_tiny_distilled_patch16_224"),
    "timm ViT with registers": lambda: _timm32("vit_tiny_patch16_224", reg_tokens=4, no_embed_class=True),
    "timm ViT, average pool": lambda: _timm32("vit_tiny_patch16_224", global_pool="avg", class_token=False,
                                              fc_norm=True),
    "hybrid": lambda: tiny_hybrid(),
}


def _state(model: torch.nn.Module) -> tuple:
    """What an analysis must leave as it found it: hooks, train flags, fused attention flags."""
    return tuple((len(m._forward_hooks), len(m._forward_pre_hooks), m.training, getattr(m, "fused_attn", None))
                 for m in model.modules())


def _close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    err = float((a - b).abs().max()) / max(float(a.abs().max()), 1e-12)
    assert err < tol, f"{what}: CUDA and CPU differ by {err:.2e} of the largest value (tolerance {tol:g})"


@pytest.mark.parametrize("name", list(MODELS))
def test_every_analysis_agrees_on_cuda_and_cpu(name):
    torch.manual_seed(0)
    cpu = MODELS[name]()
    gpu = copy.deepcopy(cpu).to(DEV)
    before = _state(gpu)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, *vitlab.model_info(cpu).img_size, generator=g)
    xg = x.to(DEV)
    info = vitlab.model_info(cpu)

    _close(vitlab.attention_maps(gpu, xg), vitlab.attention_maps(cpu, x), 1e-5, "attention maps")
    _close(vitlab.attention_rollout(gpu, xg), vitlab.attention_rollout(cpu, x), 1e-5, "rollout")
    _close(vitlab.mean_attention_distance(gpu, xg, per_image=True, progress=False),
           vitlab.mean_attention_distance(cpu, x, per_image=True, progress=False), 1e-5, "attention distance")
    if info.pos_embed == "learned":
        _close(vitlab.position_embedding_similarity(gpu), vitlab.position_embedding_similarity(cpu), 1e-5,
               "position similarity")
    if not info.hybrid:
        (cg, rg), (cc, rc) = vitlab.embedding_filter_pca(gpu, k=4), vitlab.embedding_filter_pca(cpu, k=4)
        _close(rg, rc, 1e-4, "filter PCA explained variance")
        _close(cg.abs(), cc.abs(), 1e-3, "filter PCA components (up to sign)")
    data = load_shapes("test", n=12, size=info.img_size[0])
    _close(extract_features(gpu, data, cache=False), extract_features(cpu, data, cache=False), 1e-5, "features")
    if has_classifier(cpu):
        rows_g, maps_g = vitlab.compare_methods(gpu, xg, progress=False)
        rows_c, maps_c = vitlab.compare_methods(cpu, x, progress=False)
        for m in maps_c:
            _close(maps_g[m], maps_c[m], 1e-3, f"{m} map")
        for rg_, rc_ in zip(rows_g, rows_c):
            assert rg_.method == rc_.method
            assert abs(rg_.deletion_auc - rc_.deletion_auc) < 1e-3 and abs(rg_.insertion_auc - rc_.insertion_auc) < 1e-3
    assert _state(gpu) == before, "an analysis left a hook or a changed flag on the CUDA model"
    assert next(gpu.parameters()).device.type == torch.device(DEV).type


def test_report_on_cuda_matches_the_cpu_report(tmp_path):
    from vitlab.report import reproduce

    reports = {dev: json.loads((reproduce(out=tmp_path / dev.replace(":", "_"), device=dev, png=False, num_images=16, progress=False)
                                / "metrics.json").read_text()) for dev in ("cpu", DEV)}
    c, g = reports["cpu"], reports[DEV]
    assert [p["class"] for p in g["predictions"]] == [p["class"] for p in c["predictions"]]
    _close(torch.tensor([p["probability"] for p in g["predictions"]]),
           torch.tensor([p["probability"] for p in c["predictions"]]), 1e-4, "report: probabilities")
    _close(torch.tensor(g["mean_attention_distance_px"]), torch.tensor(c["mean_attention_distance_px"]), 1e-5,
           "report: attention distance")
    assert [(v["section"], v["finding"], v["verdict"]) for v in g["verdicts"]] == \
        [(v["section"], v["finding"], v["verdict"]) for v in c["verdicts"]]
    for vg, vc in zip(g["verdicts"], c["verdicts"]):
        if isinstance(vc["statistic"], float):
            assert abs(vg["statistic"] - vc["statistic"]) <= 1e-3 * max(1.0, abs(vc["statistic"])), vc["finding"]
    for mg, mc in zip(g["methods"], c["methods"]):
        assert abs(mg["deletion_auc"] - mc["deletion_auc"]) < 1e-3, mg["method"]


def test_probe_and_capture_commands_on_cuda(tmp_path, capsys):
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    common = ["--model", str(ck), "--data", "shapes", "--max-train", "60", "--max-test", "30", "--shots", "1", "5",
              "--seeds", "2", "--quiet"]
    for name, dev in (("cpu", "cpu"), ("dev", DEV)):
        assert main(["probe", *common, "--json", str(tmp_path / f"{name}.json"), "--device", dev]) == 0
        assert main(["capture", "--model", str(ck), "--out", str(tmp_path / f"{name}.safetensors"),
                     "--device", dev]) == 0
    c, g = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("cpu", "dev"))
    for k in c["few_shot"]:
        assert abs(g["few_shot"][k]["mean"] - c["few_shot"][k]["mean"]) <= 1 / 30 + 1e-9, k
    from safetensors.torch import load_file

    _close(load_file(str(tmp_path / "dev.safetensors"))["attention"],
           load_file(str(tmp_path / "cpu.safetensors"))["attention"], 1e-5, "capture command")


def test_a_run_trained_on_cuda_evaluates_the_same_on_the_cpu(tmp_path):
    """The checkpoint of a CUDA run loads on a CPU-only reader and scores there what the run logged."""
    from vitlab.data.datasets import load_dataset
    from vitlab.train.loop import evaluate

    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", "shapes", "--run-dir", str(run), "--quiet",
                 "--device", DEV]) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    model = vitlab.load_checkpoint(run / "checkpoint")
    assert next(model.parameters()).device.type == "cpu"
    test = load_dataset("shapes", "test")
    assert abs(evaluate(model, test) - logged["test_accuracy"]) <= 1 / len(test) + 1e-9


def test_probes_and_export_facts_take_models_and_features_on_cuda():
    from vitlab.data.datasets import ImageArray
    from vitlab.probe.linear import few_shot_accuracy, linear_probe_accuracy
    from vitlab.train.export import distillation_facts, timm_pipeline_accuracy

    g = torch.Generator().manual_seed(0)
    ftr, fte = torch.randn(60, 16, generator=g), torch.randn(30, 16, generator=g)
    ytr, yte = torch.arange(60) % 3, torch.arange(30) % 3
    ftr[:, :3] += 2 * torch.nn.functional.one_hot(ytr, 3)  # a signal to find
    fte[:, :3] += 2 * torch.nn.functional.one_hot(yte, 3)
    on = [t.to(DEV) for t in (ftr, ytr, fte, yte)]
    assert linear_probe_accuracy(*on) == linear_probe_accuracy(ftr, ytr, fte, yte)
    fc, fg = few_shot_accuracy(ftr, ytr, fte, yte, shots=(1, 5)), few_shot_accuracy(*on, shots=(1, 5))
    assert all(abs(fg[k].mean - fc[k].mean) <= 1 / 30 + 1e-9 for k in fc)

    student = vitlab.load_model(None).float().eval()
    data = ImageArray(torch.randint(0, 256, (24, 32, 32, 3), dtype=torch.uint8, generator=g),
                      torch.randint(0, 10, (24,), generator=g), tuple("abcdefghij"), "random")
    assert timm_pipeline_accuracy(copy.deepcopy(student).to(DEV), data) == timm_pipeline_accuracy(student, data)
    teacher = vitlab.load_model(None).float().eval()  # any 10-class model stands in for the teacher
    facts = distillation_facts(copy.deepcopy(student).to(DEV), copy.deepcopy(teacher).to(DEV), data)
    assert facts == distillation_facts(student, teacher, data)
