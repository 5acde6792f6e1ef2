"""Independent reference computations and data helpers shared by several test files (one home each)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitlab.studies.scaling import SweepConfig


def make_folder(root: Path, n_per_class: int = 3, size: int = 8, classes=("a", "b")) -> Path:
    """An ImageFolder of random RGB PNGs: ``root/<class>/<i>.png``."""
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def turned_photo(path: Path) -> Path:
    """A JPEG as a phone stores a portrait shot: 64 wide by 32 high, left half red, right half black, with EXIF
    orientation 6 (turn 90 degrees clockwise to view): upright it is 32 wide by 64 high, top half red."""
    pixels = np.zeros((32, 64, 3), np.uint8)
    pixels[:, :32] = (255, 0, 0)
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = 6
    img.save(path, exif=exif, quality=95)
    return path


def damaged_pngs() -> dict[str, bytes]:
    """PNGs whose damage Pillow reports as other than ``OSError``: ``ihdr.png``, a header chunk cut short
    (``ValueError`` on open), and ``chunk.png``, a garbage chunk between its image data chunks (``SyntaxError``
    while decoding)."""
    import io

    buf = io.BytesIO()
    Image.new("RGB", (40, 40), "red").save(buf, "PNG")
    ihdr = bytearray(buf.getvalue())
    ihdr[11] = 6  # IHDR's length: 6 of its 13 bytes
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (256, 256, 3), np.uint8)).save(buf, "PNG")
    chunk = bytearray(buf.getvalue())  # noise that does not compress: several IDAT chunks
    second = chunk.index(b"IDAT", chunk.index(b"IDAT") + 4)
    chunk[second:second + 4] = b"\x01\x02\x03\x04"
    return {"ihdr.png": bytes(ihdr), "chunk.png": bytes(chunk)}


def reference_gradient_rollout(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, T, T) float64 (I + A_L) ... (I + A_1) with A_l = mean over heads of relu(a_l * grad_l), each layer's map
    paired with its own gradient through ``torch.autograd.grad``: the definition, computed independently."""
    # imported here: the sweep workers that unpickle CrashFirstWorker import this module, and need no timm for it
    from vitlab.inspect.capture import capture_attention

    xg = x.clone().requires_grad_(True)
    with capture_attention(model, keep_grad=True) as cap:
        logits = model(xg)
        maps = [parts[0] for parts in cap.graph_maps()]
        grads = torch.autograd.grad(logits[torch.arange(len(x)), target].sum(), maps)
    T = maps[0].shape[-1]
    R = torch.eye(T, dtype=torch.float64)
    for a, g in zip(maps, grads):
        R = (torch.eye(T) + (a * g).clamp_min(0).mean(1)).double() @ R
    return R.detach()


def three_class_split(root: Path):
    """(train, test) ImageArrays of random 32 px images in three classes (32 and 8 per class), for tiny runs."""
    from vitlab.data.datasets import load_image_folder

    make_folder(root / "train", n_per_class=32, size=32, classes=("a", "b", "c"))
    make_folder(root / "test", n_per_class=8, size=32, classes=("a", "b", "c"))
    return (load_image_folder(root / "train", cache=False, progress=False),
            load_image_folder(root / "test", cache=False, progress=False))


@dataclasses.dataclass(frozen=True)
class CrashFirstWorker(SweepConfig):
    """A sweep config whose first run kills its worker process (as the out-of-memory killer would): the worker that
    unpickles its run's config and claims the flag file ``VITLAB_TEST_CRASH_FLAG`` first exits its process; every
    other run goes on."""

    def __setstate__(self, state: dict) -> None:  # unpickled: in a worker process, before its run starts
        flag = os.environ.get("VITLAB_TEST_CRASH_FLAG")
        if flag and os.getpid() != int(os.environ.get("VITLAB_TEST_PARENT_PID", "0")):
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        self.__dict__.update(state)

    def fingerprint(self) -> str:
        return "crash-first-worker"
