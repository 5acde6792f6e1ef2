"""bf16 only where it is fast: an AVX2-only CPU trains in float32, the same run as one asked for in float32."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitlab.base import precision
from vitlab.train.config import PRESETS
from vitlab.train.loop import train


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith("flags")), None)
    return set(line.split(":", 1)[1].split()) if line else None


@pytest.mark.skipif(_cpu_flags() is None or torch.backends.mkldnn.is_available() is False,
                    reason="needs /proc/cpuinfo (Linux) and oneDNN")
def test_fast_bf16_agrees_with_the_cpu_flags():
    flags = _cpu_flags()
    # oneDNN's bf16 kernels need AVX-512 (BW/VL/DQ: "avx512_core") at least, or AMX; AVX2 alone has none
    expected = {"avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_bf16" in flags
    assert precision.fast_bf16("cpu") is expected
    assert precision.use_bf16(True, "cpu") is expected and precision.use_bf16(False, "cpu") is False


def test_fast_bf16_on_a_gpu_needs_native_bf16_on_that_device(monkeypatch):
    """A V100 or T4 (compute capability 7.x) only emulates bf16, slower than float32; Ampere (8.0) on has it. The
    device asked about is the one read, not the current one."""
    asked = []
    caps = {0: (7, 0), 1: (8, 0), 2: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: asked.append(d) or caps[d.index])
    assert [precision.fast_bf16(f"cuda:{i}") for i in range(3)] == [False, True, True]
    assert [d.index for d in asked] == [0, 1, 2]


def test_bf16_request_on_a_cpu_without_bf16_trains_the_float32_run(tmp_path, two_class_folder, monkeypatch):
    monkeypatch.setattr(precision, "_cpu_bf16", lambda: False)
    base = dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1)
    train(dataclasses.replace(base, bf16=True), tmp_path / "asked_bf16", progress=False)
    train(dataclasses.replace(base, bf16=False), tmp_path / "fp32", progress=False)
    a = load_file(str(tmp_path / "asked_bf16" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "fp32" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit the float32 run
    log = json.loads((tmp_path / "asked_bf16" / "metrics.jsonl").read_text().splitlines()[-1])
    assert log["precision"] == "fp32"
    saved = json.loads((tmp_path / "asked_bf16" / "train_config.json").read_text())
    assert saved["bf16"] is True  # the config keeps what was asked: a machine with bf16 resumes it in bf16


def test_bf16_where_it_is_fast_is_used(tmp_path, two_class_folder, monkeypatch):
    monkeypatch.setattr(precision, "_cpu_bf16", lambda: True)
    cfg = dataclasses.replace(PRESETS["tiny"], data=str(two_class_folder), epochs=1, bf16=True, max_train_examples=16)
    train(cfg, tmp_path / "run", progress=False)
    log = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert log["precision"] == "bf16"

