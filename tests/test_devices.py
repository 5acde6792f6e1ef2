"""`--device`: one rule for every command (vitlab.base.devices.resolve_device), checked before any work."""

from __future__ import annotations

import pytest
import torch

from vitlab.base.devices import DEVICE_HELP, resolve_device
from vitlab.base.errors import ParameterError, Setting
from vitlab.cli import build_parser, main


def test_default_is_cuda_only_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == torch.device("cuda")


def test_named_devices_are_checked_against_this_machine(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu") == resolve_device(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ParameterError) as e:
        resolve_device("cuda")
    assert (e.value.param, e.value.value, e.value.fix) == ("device", "cuda", (Setting("device", "cpu"),
                                                                              Setting("device", None)))
    assert str(e.value).startswith("device='cuda': ") and "--device" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    for name, allowed in (("cuda:2", "cuda:0 to cuda:1"), ("gpu", DEVICE_HELP), ("meta", DEVICE_HELP)):
        with pytest.raises(ParameterError) as e:
            resolve_device(name)
        assert isinstance(e.value, ValueError) and (e.value.param, e.value.value, e.value.allowed) == ("device", name,
                                                                                                     allowed)


def _commands_with_device() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(name for name, p in sub.choices.items() if any(a.dest == "device" for a in p._actions))


def test_every_command_that_runs_a_model_on_data_takes_device():
    assert _commands_with_device() == ["capture", "mpp-study", "probe", "reproduce", "train"]


@pytest.mark.parametrize("argv", [
    ["capture", "--out", "{tmp}/a.safetensors"],
    ["probe", "--data", "shapes"],
    ["reproduce", "--out", "{tmp}/report"],
    ["train", "--preset", "tiny", "--data", "shapes", "--run-dir", "{tmp}/run", "--quiet"],
])
def test_a_missing_gpu_fails_before_any_work(argv, tmp_path, monkeypatch, capsys):
    """No model is loaded, nothing is written: the error names the fix."""
    import vitlab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vitlab, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking --device"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--device", "cuda"]) != 0
    err = capsys.readouterr().err
    assert "--device cuda: this machine has no CUDA GPU" in err and err.rstrip().endswith("fix: --device cpu, or "
                                                                                          "without --device"), err
    assert list(tmp_path.iterdir()) == []


def test_the_device_benchmark_refuses_a_machine_without_a_gpu(monkeypatch, tmp_path, capsys):
    from benchmarks.device_speed import main as bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench(["--out", str(tmp_path / "r.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_torchrun_refuses_a_device_it_would_replace_by_the_cpu(monkeypatch):
    """Under torchrun (WORLD_SIZE > 1) the processes run on CPUs (gloo) or CUDA GPUs (nccl); --device mps used to train
    on the CPU without a word. Refused before any process group is set up."""
    import torch.distributed as dist

    import vitlab.train.distributed as vd

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(vd, "resolve_device", lambda _name: torch.device("mps"))  # as on a Mac that has MPS
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("set up a process group first"))
    with pytest.raises(ParameterError) as e:
        vd.dist_setup("mps")
    assert (e.value.param, e.value.value, e.value.fix[-1]) == ("device", "mps", Setting("device", "cpu"))
    assert "--device" not in str(e.value)
