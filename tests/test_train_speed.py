"""benchmarks/train_speed.py: the preset's rate over its whole schedule, from its two measured phases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks.train_speed import schedule_average
from vitlab.train.config import PRESETS

FULL = {"images_per_second": 600.0, "student_gflops_per_image": 0.8, "teacher_gflops_per_image": 0.2, "mfu": 0.25,
        "compiled": True, "batch": 256}
SMALL = {"images_per_second": 900.0, "student_gflops_per_image": 0.45, "teacher_gflops_per_image": 0.2, "mfu": 0.2,
         "compiled": True, "batch": 256}


def test_schedule_average_weights_each_phase_by_its_epochs():
    cfg = dataclasses.replace(PRESETS["vit_cifar10"], epochs=30, progressive_size=24, progressive_epochs=10)
    peak = 1.0e9 * 600 / 0.25  # the peak FULL's MFU was measured against: (0.8 + 0.2) GFLOP x 600 / peak = 0.25
    row = schedule_average("vit_cifar10", cfg, FULL, SMALL, peak)
    # 10 epochs at 900 images/s and 20 at 600: 30 epochs' images in 10/900 + 20/600 seconds per image
    assert row["images_per_second"] == pytest.approx(30 / (10 / 900 + 20 / 600))  # 675
    assert row["student_gflops_per_image"] == pytest.approx((10 * 0.45 + 20 * 0.8) / 30)
    assert row["mfu"] == pytest.approx((row["student_gflops_per_image"] + 0.2) * 1e9 * row["images_per_second"] / peak)
    assert "30 epochs, the first 10 at 24 px" in row["preset"]
    assert schedule_average("x", dataclasses.replace(cfg, progressive_size=None, progressive_epochs=0), FULL,
                            SMALL, peak) is None


def test_the_preset_trains_its_first_third_at_24_px_and_keeps_the_share_under_other_epoch_counts():
    cfg = PRESETS["vit_cifar10"]
    assert cfg.small_epochs * 3 == cfg.epochs == 75 and cfg.progressive_size % cfg.model.patch_size == 0
    assert dataclasses.replace(cfg, epochs=15).small_epochs == 5  # --epochs 15: its first 5
    assert dataclasses.replace(cfg, epochs=2, warmup_epochs=0.4).small_epochs == 1  # at least one while the share > 0
    assert dataclasses.replace(cfg, progressive_epochs=7).small_epochs == 7  # a count given takes precedence
    assert dataclasses.replace(cfg, progressive_size=None).small_epochs == 0  # --set progressive_size=null: off
    row = schedule_average("vit_cifar10", cfg, FULL, SMALL, 1.0e12)
    assert row["images_per_second"] == pytest.approx(75 / (25 / 900 + 50 / 600))
    assert "75 epochs, the first 25 at 24 px" in row["preset"]


def test_compile_ab_alternates_the_order_and_compares_the_mean_rates_per_size():
    from benchmarks.compile_ab import order, summarise

    assert order(2) == [True, False, False, True] and order(1) == [True, False]

    def row(size, compiled, ips, first):
        return {"size": size, "compiled": compiled, "images_per_second": ips, "first_epoch_images_per_second": first}

    rows = [row(32, True, 90.0, 20.0), row(32, False, 92.0, 80.0), row(32, False, 96.0, 90.0), row(32, True, 100.0,
            100.0), row(24, True, 150.0, 140.0), row(24, False, 130.0, 125.0)]
    s = summarise(rows)
    assert list(s) == ["24 px", "32 px"]
    assert s["32 px"]["ratio"] == pytest.approx(95.0 / 94.0) and s["32 px"]["runs"] == 4
    assert s["32 px"]["first_epoch_compiled"] == pytest.approx(60.0)
    assert s["24 px"]["ratio"] == pytest.approx(150 / 130)
    # where inductor could not compile, every row ran eagerly: no ratio is made up
    assert summarise([row(32, False, 90.0, 90.0), row(32, False, 91.0, 91.0)]) == {}


def test_step_flops_matches_a_hand_count_whatever_attention_path_the_model_runs():
    """The FLOPs of one training step of a tiny ViT, counted by hand: every matmul 2 x M x N x K forward, twice that
    backward (gradients of input and weight), but the patch embedding's once (its input needs no gradient). The
    model runs SDPA by default, which FlopCounterMode does not count on CPU: the sweep's pre-training FLOPs came
    out a third short for this model before."""
    import torch

    from vitlab.base.modes import explicit_attention
    from vitlab.models.config import cifar_vit
    from vitlab.models.zoo import build_model
    from vitlab.train.loop import step_flops

    D, M, C, L, T, B = 32, 64, 5, 2, 8 * 8 + 1, 4  # width, MLP, classes, blocks, tokens (64 patches + class), batch
    model = build_model(cifar_vit(embed_dim=D, depth=L, num_heads=2, mlp_dim=M, num_classes=C,
                                  drop_path_rate=0.0)).train()
    embed = 2 * 64 * (3 * 4 * 4) * D  # 4 px patches: a (48 -> D) projection per patch
    block = 2 * T * D * 3 * D + 2 * (2 * T * T * D) + 2 * T * D * D + 2 * (2 * T * D * M)  # qkv, qk^T and AV, proj, MLP
    forward = B * (embed + L * block + 2 * D * C)
    x, y = torch.randn(B, 3, 32, 32), torch.randint(0, C, (B,))
    assert any(getattr(m, "fused_attn", False) for m in model.modules())  # the default path is SDPA
    assert step_flops(model, x, y, bf16=False) == 3 * forward - B * embed
    with explicit_attention(model):
        assert step_flops(model, x, y, bf16=False) == 3 * forward - B * embed
    assert step_flops(model, x, y, bf16=False, backward=False) == forward
    assert any(getattr(m, "fused_attn", False) for m in model.modules())  # its attention path is left as it was


def test_step_flops_leaves_the_model_and_the_random_state_as_they_were():
    """Counting a step ran a real forward in train mode: a BatchNorm model's running statistics moved, the
    parameters' gradients were wiped (a caller's accumulated ones too) and dropout advanced the random state, so
    the benchmark timed (and the sweep measured) a model the count had changed. All three are as they were now."""
    import torch

    from vitlab.train.loop import step_flops

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Flatten(), torch.nn.LazyLinear(5)).train()
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    model(x).sum().backward()  # a caller's gradients, accumulated before the count
    buffers = [b.clone() for b in model.buffers()]
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    assert step_flops(model, x + 1, y, bf16=False) > 0
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert torch.equal(rng, torch.get_rng_state()) and model.training


def test_compile_ab_stamps_the_machine_as_the_run_starts(monkeypatch):
    """Its JSON's load average was read after the run (2026-11-27 05:18, load 1.98: its own work, the text's run
    began 05:10 on an idle machine); like train_speed and streaming it now records the load before its own work."""
    from benchmarks import compile_ab

    clock = iter(range(100))
    monkeypatch.setattr(compile_ab, "machine_info", lambda: {"date": f"t{next(clock)}"})
    monkeypatch.setattr(compile_ab, "_data", lambda n: (None, "d"))
    monkeypatch.setattr(compile_ab, "_teacher_dir", lambda tmp: tmp)
    monkeypatch.setattr(compile_ab, "peak_matmul_flops", lambda: 1.0)

    def vitlab_train(preset, data, steps, peak, teacher, small=None, compile=None):
        next(clock)  # time passes while it runs
        return {"preset": preset, "compiled": compile, "images_per_second": 1.0, "first_epoch_images_per_second": 1.0}

    monkeypatch.setattr(compile_ab, "vitlab_train", vitlab_train)
    assert compile_ab.run(steps=1, rounds=1)["machine"] == {"date": "t0"}


def test_a_benchmark_report_that_fails_mid_write_leaves_no_file(tmp_path, monkeypatch):
    """``report`` wrote ``NAME.json.tmp`` and renamed it: a failure mid-write left the half-written temporary
    behind (under one fixed name, which two runs would also share); it now writes through ``atomic_write``."""
    from pathlib import Path

    from benchmarks._util import report

    out = tmp_path / "r.json"
    assert report({"a": 1}, "table", out) == 0 and json.loads(out.read_text()) == {"a": 1}

    def torn(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[:3])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", torn)
    with pytest.raises(OSError, match="disk full"):
        report({"a": 2}, "table", out)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and json.loads(out.read_text()) == {"a": 1}
