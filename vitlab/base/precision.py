"""Whether bf16 autocast pays on a device: on a CPU without native bf16 (AVX2 only: no AVX-512, no AMX) PyTorch
falls back to a reference kernel that runs bf16 matmuls hundreds of times slower than float32, so a run asked for
in bf16 would take hundreds of times longer. Training and evaluation ask ``fast_bf16`` and run in float32 where it
says no."""

from __future__ import annotations

import functools

import torch

__all__ = ["fast_bf16", "use_bf16"]


@functools.cache
def _cpu_bf16() -> bool:
    try:  # oneDNN's own answer: AVX-512 (emulated bf16 at vector speed), AVX512-BF16 or AMX
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: trust the vector width PyTorch dispatches to
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def fast_bf16(device: torch.device | str) -> bool:
    """True when bf16 autocast on ``device`` runs at least at float32's speed: a CUDA device with native bf16
    (compute capability 8.0 or more: Ampere on; earlier GPUs only emulate it), a CPU whose oneDNN has bf16 kernels
    (AVX-512 or AMX); False on an AVX2-only CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_capability(dev) >= (8, 0)  # that device, not the current one
    if dev.type == "cpu":
        return _cpu_bf16()
    return True  # other backends (mps, xpu): autocast decides


def use_bf16(requested: bool, device: torch.device | str) -> bool:
    """``requested`` where bf16 is fast on ``device``; float32 (False) otherwise."""
    return requested and fast_bf16(device)
