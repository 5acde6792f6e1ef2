"""Images for the analyses, preprocessed as each model expects: a user's folder, the photos scikit-learn ships
(as deterministic crops) and, for 32 px models, a fixed sample of CIFAR-10 test images shipped in ``data/``.

Every source returns ``(names, (B, C, H, W) batch, shown)`` where ``shown`` are the (H, W, 3) uint8 views at the
model's input size, for drawing maps over them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from torch import Tensor, nn

from vitlab.base.checks import check_int
from vitlab.base.errors import Setting
from vitlab.base.shipped import data_path
from vitlab.data.datasets import (
    DECODE_ERRORS,
    IMAGE_SUFFIXES,
    DataError,
    DataParameterError,
    ImageArray,
    decode_error_words,
    image_files,
    rgb8,
    sample_images,
)
from vitlab.models.info import AnyModel, data_config, resolve_model

__all__ = ["model_transform", "head_class_names", "head_labels", "load_images", "embedded_images", "cifar_test_sample", "default_image_count", "default_images", "default_labels", "default_source", "default_data_words", "trained_on", "CIFAR_SAMPLE"]

#: 128 CIFAR-10 test images (13 of each of the first 8 classes, 12 of the last 2, drawn with seed 0, classes
#: interleaved so that any first n are balanced; ``index`` holds
#: their positions in the sorted test split): the paper's 128 images for attention distance, shipped for offline use.
CIFAR_SAMPLE = data_path("cifar10_test_128.npz")  # the checkout's data/, or a wheel's copy (vitlab.base.shipped)

#: How many test shapes a checkpoint trained on the synthetic shapes is shown by default, as many as the CIFAR sample.
SHAPES_SAMPLE_SIZE = 128


def model_transform(model: nn.Module) -> tuple[Callable[[Image.Image], Tensor], dict]:
    """The model's own timm eval transform (PIL image -> normalised (C, H, W) tensor) and its data config."""
    cfg = data_config(model)  # timm's, at the input size the model is built for
    return timm.data.create_transform(**cfg), cfg


def load_images(model: nn.Module, folder: str | os.PathLike | None = None, limit: int | None = None,
                skip_bad: bool = False) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """Images preprocessed as the model expects: (names, (B, C, H, W) batch, the (H, W, 3) uint8 views shown).

    ``folder=None`` uses the photos scikit-learn ships. ``limit``: the first ``limit`` images of ``folder`` (sorted
    by path), or of those photos, with a warning that counts the images left out; None: every one. As for training
    data, macOS metadata (``__MACOSX/``, ``._x.jpg``) and hidden files and folders are no images. Unreadable
    files, and images smaller than one of the model's patches (nothing to look at once resized), raise
    ``DataError`` naming them; with ``skip_bad=True`` they are skipped with a warning that names them instead, and
    ``limit`` counts the usable images: the files after the first ``limit`` are read until that many are usable or
    the folder ends. An image's name is its path below ``folder`` (``_image_names``).
    """
    import warnings

    # True is no 1 image, 2.5 no count
    check_int("limit", limit, 1, allowed="a whole number of at least 1 image (or None for all)", none=True, numpy=True)
    if folder is None:
        items = [(name, Image.fromarray(arr)) for name, arr in sample_images()]
        if limit is not None and len(items) > limit:
            warnings.warn(f"using the first {limit} of the {len(items)} photos scikit-learn ships: "
                          f"{len(items) - limit} left out", stacklevel=2)
            items = items[:limit]
    else:
        root = Path(folder)
        if not root.is_dir():
            raise DataParameterError("folder", str(root), "a folder of images", problem="not a folder")
        files = image_files(root)  # less macOS metadata and hidden files
        if not files:
            raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {root}")
        name_of = dict(zip(files, _image_names(root, files)))
        # without skip_bad a bad file is an error anyway: only the first ``limit`` files are read
        candidates = files if skip_bad or limit is None else files[:limit]
        items, broken, read = [], [], 0
        for p in candidates:
            if limit is not None and len(items) == limit:
                break
            read += 1
            try:
                with Image.open(p) as im:
                    rgb = rgb8(im)
            except DECODE_ERRORS as e:  # a damaged file, or Pillow's guard on huge images
                broken.append(f"{p}: unreadable ({type(e).__name__}: {decode_error_words(e)})")
                continue
            if (small := too_small(model, rgb)) is not None:
                broken.append(f"{p}: {small}")
                continue
            items.append((name_of[p], rgb))
        if read < len(files) and not (broken and not skip_bad):
            usable = " usable" if broken else ""
            warnings.warn(f"using the first {len(items)}{usable} of the {len(files)} images in {root} (sorted by "
                          f"path): {len(files) - read} left out", stacklevel=2)
        elif limit is not None and skip_bad and 0 < len(items) < limit:
            warnings.warn(f"only {len(items)} usable images in {root}, fewer than the {limit} asked for", stacklevel=2)
        if broken and not skip_bad:
            raise DataParameterError("folder", str(root), problem="bad images:\n  " + "\n  ".join(broken) + "\n",
                                     fix=["remove or replace them", Setting("skip_bad", True)])
        if broken:
            warnings.warn("skipped bad images:\n  " + "\n  ".join(broken), stacklevel=2)
        if not items:
            raise DataError(f"no usable images in {root}: every file was skipped")
    return _preprocessed(model, items)


def too_small(model: nn.Module, im: Image.Image) -> str | None:
    """Why ``im`` is too small for ``model`` (smaller than one of its patches: nothing to look at once resized to
    its input), or None."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", (1, 1))
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    if im.size[0] < patch[1] or im.size[1] < patch[0]:
        return f"{im.size[0]}x{im.size[1]} px is smaller than one {patch[0]}x{patch[1]} px patch of this model"
    return None


def _image_names(root: Path, files: Sequence[Path]) -> list[str]:
    """Each file's name in results, one per file: its path below ``root`` without the suffix (``cat/001`` and
    ``dog/001`` are two images), with the suffix where files differ only in it (``pic.bmp``, ``pic.webp``)."""
    stems = [p.relative_to(root).with_suffix("").as_posix() for p in files]
    counts = Counter(stems)
    return [p.relative_to(root).as_posix() if counts[s] > 1 else s for p, s in zip(files, stems)]


def embedded_images(model: nn.Module, n: int = 16) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """``n`` deterministic square crops of the photos scikit-learn ships, preprocessed for ``model``.

    The first two are the central squares of the two photos; then crops at 1/2 and 1/3 of the short side on a
    regular grid, alternating between the photos. Returns what ``load_images`` returns.
    """
    crops = _photo_crops()
    check_int("n", n, 1, len(crops), f"in [1, {len(crops)}]", numpy=True)  # True is no 1 crop, 2.5 no count
    return _preprocessed(model, [(name, Image.fromarray(np.ascontiguousarray(arr))) for name, arr in crops[:n]])


def _photo_crops() -> list[tuple[str, np.ndarray]]:
    """The (name, (h, w, 3) uint8) crops ``embedded_images`` takes its first ``n`` from."""
    photos = sample_images()
    crops: list[tuple[str, np.ndarray]] = []
    for div in (1, 2, 3):
        per_photo = []
        for name, arr in photos:
            h, w = arr.shape[:2]
            side = min(h, w) // div
            ys = [(h - side) // 2] if div == 1 else np.linspace(0, h - side, div).astype(int).tolist()
            xs = [(w - side) // 2] if div == 1 else np.linspace(0, w - side, div + 1).astype(int).tolist()
            per_photo.append([(f"{name}_{div}_{y}_{x}", arr[y:y + side, x:x + side]) for y in ys for x in xs])
        for group in zip(*per_photo):
            crops.extend(group)
    return crops


def cifar_test_sample() -> ImageArray:
    """The 128 shipped CIFAR-10 test images as an ``ImageArray`` (uint8, labels, class names)."""
    with np.load(CIFAR_SAMPLE, allow_pickle=False) as z:
        return ImageArray(torch.from_numpy(z["images"]), torch.from_numpy(z["labels"]).long(),
                          tuple(str(c) for c in z["classes"]), "data/cifar10_test_128.npz")


def view_transform(tf: Callable[[Image.Image], Tensor], size: Sequence[int]) -> Callable[[Image.Image], np.ndarray]:
    """PIL image -> the (H, W, 3) uint8 pixels the model sees: ``tf``'s steps before its tensor conversion (timm's
    resize and centre crop), so a map drawn over the view sits on the pixels it was computed from. A transform
    that is not a torchvision ``Compose`` falls back to a plain resize to ``size`` (H, W)."""
    steps = getattr(tf, "transforms", None)
    if steps is not None:
        pil_steps = []
        for t in steps:
            if "ToTensor" in type(t).__name__:
                view = type(tf)(pil_steps)
                return lambda im: np.asarray(view(im.convert("RGB")))
            pil_steps.append(t)
    return lambda im: np.asarray(im.convert("RGB").resize((size[1], size[0]), Image.Resampling.BICUBIC))


def _preprocessed(model: nn.Module, items: list[tuple[str, Image.Image]]) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """(names, (B, C, H, W) through the model's own transform, the (H, W, 3) uint8 pixels it sees)."""
    tf, cfg = model_transform(model)
    view = view_transform(tf, cfg["input_size"][-2:])
    x = torch.stack([tf(im) for _, im in items])
    shown = [view(im) for _, im in items]
    return [n for n, _ in items], x, shown


def trained_on(model: AnyModel) -> str:
    """The data set a vitlab checkpoint's card records its training on (``cifar10``, ``shapes``, a folder), without
    its root, as ``load_dataset`` names it; "" for a model that is not a vitlab checkpoint."""
    ck = getattr(resolve_model(model).module, "vitlab_checkpoint", None) or {}  # a wrapper: its module's card
    return str((ck.get("train") or {}).get("data", "")).split(":")[0]


def _default_set(model: nn.Module) -> str:
    """Which images ``default_images`` gives this model: ``"shapes"`` for a vitlab checkpoint trained on the synthetic
    shapes (its own test draw, so the model is shown the kind of image it classifies), ``"cifar"`` for any other
    32 px model, ``"photos"`` otherwise."""
    if trained_on(model) == "shapes":
        return "shapes"
    return "cifar" if tuple(data_config(model)["input_size"][-2:]) == (32, 32) else "photos"


def _shapes_sample(model: nn.Module) -> ImageArray:
    """The first 128 test shapes (seed 1, the split the shapes checkpoints are scored on) at the model's input size."""
    from vitlab.data.datasets import load_shapes

    return load_shapes("test", n=SHAPES_SAMPLE_SIZE, size=int(data_config(model)["input_size"][-1]))


def default_source(model: nn.Module) -> str:
    """In words, where ``default_images`` takes this model's images from."""
    kind = _default_set(model)
    if kind == "shapes":
        return f"the first {SHAPES_SAMPLE_SIZE} test images of the synthetic shapes (seed 1)"
    if kind == "cifar":
        return "the 128 shipped CIFAR-10 test images (data/cifar10_test_128.npz)"
    return "crops of scikit-learn's sample photos"


def default_data_words(model: nn.Module, n: int) -> str:
    """The first ``n`` of ``default_images`` in a few words, as a verdict names its subject: "128 CIFAR-10 test
    images", "128 test shapes", "16 photo crops"."""
    kind = _default_set(model)
    what = {"shapes": ("test shape", "test shapes"), "cifar": ("CIFAR-10 test image", "CIFAR-10 test images"),
            "photos": ("photo crop", "photo crops")}[kind]
    return f"{n} {what[n != 1]}"


def default_labels(model: nn.Module, n: int) -> tuple[Tensor | None, tuple[str, ...] | None]:
    """True classes and class names of the first ``n`` ``default_images``, when they are the CIFAR or shapes
    sample."""
    kind = _default_set(model)
    if kind == "photos":
        return None, None
    data = _shapes_sample(model) if kind == "shapes" else cifar_test_sample()
    return data.labels[:n], data.classes


def head_labels(model: nn.Module, n: int) -> Tensor | None:
    """The true classes of the first ``n`` ``default_images`` when they are classes of ``model``'s head (its
    recorded class names are the sample's, e.g. a CIFAR-10 checkpoint on the CIFAR sample), else None: a label of
    the sample indexes another head's classes as nothing in particular."""
    labels, classes = default_labels(model, n)
    names = head_class_names(model)
    return labels if labels is not None and names is not None and tuple(names) == tuple(classes) else None


def head_class_names(model: AnyModel) -> tuple[str, ...] | None:
    """The names of the model's output classes, where known: the training set's classes a vitlab checkpoint records
    (``data.classes``), or CIFAR-10's for a 10-class checkpoint trained on ``cifar10`` and the shapes' for a 4-class
    one trained on ``shapes`` (checkpoints from before the names were recorded); None otherwise (e.g. a timm model or a checkpoint of another data set): never a guess
    from the head's size."""
    rm = resolve_model(model)  # a DataParallel wrapper: its module's head and card
    model = rm.module
    n_cls = int(getattr(model, "num_classes", 0) or 0)
    ck = getattr(model, "vitlab_checkpoint", None) or {}
    names = (ck.get("data") or {}).get("classes")
    if names and len(names) == n_cls:
        return tuple(str(c) for c in names)
    trained = trained_on(rm)
    if n_cls == 10 and trained == "cifar10":
        return cifar_test_sample().classes
    from vitlab.data.shapes import SHAPE_CLASSES

    if n_cls == len(SHAPE_CLASSES) and trained == "shapes":
        return SHAPE_CLASSES
    return None


def default_image_count(model: nn.Module) -> int:
    """How many ``default_images`` this model can have: 128 for a 32 px or shapes model, else the number of photo
    crops."""
    kind = _default_set(model)
    if kind == "photos":
        return len(_photo_crops())
    return SHAPES_SAMPLE_SIZE if kind == "shapes" else len(cifar_test_sample())


def default_images(model: nn.Module, n: int | None = None) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """The images the analyses use when none are given: for a checkpoint trained on the synthetic shapes, the first
    ``n`` (default all 128) of their test draw; for another model with 32 px input, the first ``n`` (default all 128)
    of the shipped CIFAR-10 test sample; both named ``class #i``; otherwise ``embedded_images(model, n)``
    (default 16)."""
    kind = _default_set(model)
    if kind == "photos":
        return embedded_images(model, 16 if n is None else n)
    data = _shapes_sample(model) if kind == "shapes" else cifar_test_sample()
    n = len(data) if n is None else n
    check_int("n", n, 1, len(data), f"in [1, {len(data)}]", numpy=True)  # True is no 1 image, 2.5 no count
    items = [(f"{data.classes[int(data.labels[i])]} #{i}", Image.fromarray(data.images[i].numpy())) for i in range(n)]
    return _preprocessed(model, items)
