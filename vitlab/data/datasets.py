"""Datasets as decoded uint8 tensors, their normalisation into model inputs, and samplers.

Small-image datasets (CIFAR-10/100, an ImageFolder folder or zip) are decoded once into one
``(N, H, W, 3)`` uint8 array and cached on disk (``~/.cache/vitlab`` or ``$VITLAB_CACHE``), so an epoch never
decodes JPEGs again. Augmentation then runs on whole batches of tensors (``vitlab.train.augment``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from vitlab.base.checks import check_int, check_seed, whole_index
from vitlab.base.errors import Refusal
from vitlab.base.shipped import CHECKOUT

__all__ = [
    "ImageArray",
    "portable_source",
    "DataError",
    "DataParameterError",
    "DatasetMissing",
    "SkippedPathWarning",
    "load_image_folder",
    "check_same_classes",
    "load_splits",
    "load_cifar",
    "data_dir",
    "cifar_places",
    "find_cifar",
    "fetch_cifar",
    "FETCH_COMMAND",
    "load_dataset",
    "base_dataset",
    "data_fingerprint",
    "load_shapes",
    "sample_images",
    "normalize",
    "k_shot_indices",
    "nested_subsets",
    "IMAGE_SUFFIXES",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".avif")


class DataError(ValueError):
    """A dataset could not be read; the message names the files and the fix."""


class DataParameterError(Refusal, DataError):
    """A dataset or image folder refused for one argument (``Refusal``'s fields, e.g. ``param`` ``folder``)."""


class DatasetMissing(DataError):
    """A public data set read by name (``cifar10``) is not on this machine and could not be fetched.

    Fields: ``dataset`` (its name), ``looked_in`` (the folders searched, in order, as strings), ``fix`` (what makes
    it readable: the command that fetches it, or where to put its files) and ``cause`` (why a download failed, e.g.
    no network; None when no download was tried). The message says all of them."""

    def __init__(self, dataset: str, looked_in: Sequence[str], fix: str, cause: str | None = None):
        self.dataset, self.looked_in, self.fix, self.cause = dataset, tuple(looked_in), fix, cause
        tried = f" and could not be downloaded ({cause})" if cause else ""
        super().__init__(f"{dataset} is not on this machine (looked in {', '.join(self.looked_in)}){tried}: {fix}")

    def __reduce__(self):  # picklable with its fields (a DataLoader worker or a Ray task re-raises it)
        return type(self), (self.dataset, self.looked_in, self.fix, self.cause)


#: what Pillow raises on a file it cannot decode: besides ``OSError`` (``UnidentifiedImageError``, a truncated file),
#: a damaged header or chunk can raise ``ValueError`` ('Truncated IHDR chunk'), ``SyntaxError`` ('broken PNG file'),
#: ``EOFError`` or ``struct.error``; ``DecompressionBombError`` is its guard on huge images
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


def decode_error_words(e: BaseException) -> str:
    """One of ``DECODE_ERRORS`` as words, with the fix where Pillow names none: an image over Pillow's pixel limit
    (``DecompressionBombError``) says how to get it read."""
    if isinstance(e, Image.DecompressionBombError):
        return (f"{e} Resize it below {2 * Image.MAX_IMAGE_PIXELS} pixels or, if you trust the file, raise "
                "PIL.Image.MAX_IMAGE_PIXELS before loading")
    return str(e)


#: what reading a file's bytes raises: ``OSError`` from a folder; from a zip's damaged entry ``BadZipFile`` (Bad
#: CRC-32) or ``zlib.error``, from an encrypted one ``RuntimeError``, from an unknown compression method
#: ``NotImplementedError``, from a cut-off one ``EOFError``
READ_ERRORS = (OSError, zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError, EOFError)


class CacheWarning(UserWarning):
    """vitlab's cache could not be read or written; the work goes on without it (and is done again next time)."""


@dataclass(frozen=True)
class ImageArray:
    """A decoded dataset: ``images`` (N, H, W, 3) uint8, ``labels`` (N,) int64, class names."""

    images: Tensor
    labels: Tensor
    classes: tuple[str, ...]
    source: str
    masks: Tensor | None = None  # (N, H, W) bool object masks, where the dataset has them

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: Tensor | Sequence[int]) -> ImageArray:
        index = torch.as_tensor(index, dtype=torch.long)
        masks = self.masks[index] if self.masks is not None else None
        return ImageArray(self.images[index], self.labels[index], self.classes,
                          f"{self.source}[subset {len(index)}]", masks)


def _source(root: Path, split: str | None) -> str:
    """``portable_source`` of an image folder, with ``!split`` for one split folder inside a zip."""
    return portable_source(root) + ("" if split is None else f"!{split}")


def portable_source(path: str | os.PathLike) -> str:
    """How records (cards, results, caches) name a dataset file: never by this machine's absolute path.

    The shared data sets become ``shared/datasets/...``; a path inside the checkout (``data/...``), under the
    working directory or inside another vitlab checkout (e.g. a ``git worktree`` snapshot a long run trained from)
    stays relative to it; anything else is named by its last two parts (``.../folder/name``)."""
    p = Path(path).resolve()
    shared = SHARED_CIFAR10.resolve().parent.parent  # .../shared
    repo = CHECKOUT  # the checkout vitlab runs from (data/, notebooks/, ...)
    for base, prefix in ((shared, "shared"), (repo, ""), (Path.cwd().resolve(), "")):
        if p.is_relative_to(base):
            rel = p.relative_to(base).as_posix()
            return f"{prefix}/{rel}" if prefix else rel
    for base in p.parents:  # another checkout of vitlab: a git repository (or worktree) holding the package
        if (base / ".git").exists() and (base / "vitlab" / "__init__.py").is_file():
            return p.relative_to(base).as_posix()
    return ".../" + "/".join(p.parts[-2:])


def cache_dir() -> Path:
    """Where vitlab keeps what it can compute again (decoded images, features) and, by default, training runs:
    ``$VITLAB_CACHE`` (a leading ``~`` is the home folder; set but empty counts as unset, never the working
    directory), else ``~/.cache/vitlab``."""
    env = os.environ.get("VITLAB_CACHE", "")
    try:
        return Path(env).expanduser() if env else Path.home() / ".cache" / "vitlab"
    except RuntimeError:  # no HOME and no home in the password file (a container's made-up user), or ~nobody
        where = f"VITLAB_CACHE={env}" if env else "~/.cache/vitlab (VITLAB_CACHE is unset)"
        raise RuntimeError(f"vitlab's cache folder is {where}, but that home folder cannot be found (HOME is unset "
                           "or the user unknown): set VITLAB_CACHE to a writable folder's full path") from None


def cache_file(*parts: str) -> Path | None:
    """``cache_dir() / parts``, or None with a ``CacheWarning`` where there is no cache folder (no home folder):
    the caller then computes without the cache."""
    try:
        return cache_dir().joinpath(*parts)
    except RuntimeError as e:
        warnings.warn(f"{e}; going on without the cache", CacheWarning, stacklevel=3)
        return None


def write_cache(path: Path, write: Callable[[str], object], errors: tuple[type[Exception], ...] = (OSError,)) -> None:
    """``atomic_write(path, write)`` of a cache file, best effort: where it fails with one of ``errors`` (a read-only
    or full disk, a file where the cache folder should be) the result in hand is kept and a ``CacheWarning`` names
    the folder and the fix; the next run computes it again."""
    from vitlab.base.atomic import atomic_write

    try:
        atomic_write(path, write)
    except errors as e:
        why = (f"{e.strerror}: {e.filename}" if e.filename is not None else e.strerror) \
            if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"  # a DiskFullError names its path
        warnings.warn(f"vitlab's cache cannot keep files in {path.parent} ({why}); going on without it, so what "
                      "it would keep is computed again next time: set VITLAB_CACHE to a writable folder", CacheWarning,
                      stacklevel=3)  # one message per folder: Python shows it once, not once per file


def touch_cache(path: Path) -> None:
    """Mark a cache file as just used (its modification time: ``vitlab cache prune --older-than`` removes what was
    not used, not what was made long ago). Best effort: a read-only cache or another user's file stays as it is."""
    with contextlib.suppress(OSError):
        os.utime(path)


#: what decoded images depend on besides the files: part of the decode cache's key, so that a change to the
#: decoding (e.g. 16-bit images scaled instead of clipped) never serves arrays decoded the old way
DECODER = "rgb8-3"

#: the EXIF tag that says how a camera's photo is turned: 1 upright, 3/6/8 turned (and 2/4/5/7 mirrored)
EXIF_ORIENTATION = 0x0112


def rgb8(img: Image.Image) -> Image.Image:
    """Any PIL image as 8-bit RGB. 16-bit and 32-bit integer greyscale (``I;16*``, and ``I`` above 255) is scaled
    by 255/65535 and float greyscale (``F``) from [0, 1] (else clipped to [0, 255]), where Pillow's own
    ``convert`` would clip them at 255 (a 16-bit image came out almost white); images with transparency (an alpha
    channel, or a palette or colour marked transparent) are laid over white, as a page shows them, where dropping
    the alpha showed whatever colour the file keeps under transparent pixels (mostly black); everything else is
    Pillow's conversion. A photo whose EXIF orientation says it is turned (a phone's portrait shot is stored
    landscape) is turned upright first, as image viewers show it. Always a new, loaded image."""
    if img.getexif().get(EXIF_ORIENTATION, 1) != 1:
        img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I;16") or (img.mode == "I" and arr.size and arr.max() > 255):
            arr = arr * (255 / 65535)
        elif img.mode == "F" and arr.size and arr.max() <= 1.0:
            arr = arr * 255
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)).convert("RGB")
    if "A" in img.mode or img.mode == "P" or "transparency" in img.info:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")  # a loaded copy, also for RGB: the caller may close the file


def _to_rgb(img: Image.Image, name: str, size: tuple[int, int] | None, problems: list[str]) -> np.ndarray | None:
    img = rgb8(img)
    if size is not None and img.size != (size[1], size[0]):
        img = img.resize((size[1], size[0]), Image.Resampling.BICUBIC)
    return np.asarray(img, dtype=np.uint8)


def _decode(blob: bytes, name: str, size: tuple[int, int] | None, problems: list[str]) -> np.ndarray | None:
    try:
        with Image.open(io.BytesIO(blob)) as img:
            img.load()
            return _to_rgb(img, name, size, problems)
    except DECODE_ERRORS as e:  # Pillow names the in-memory file (<_io.BytesIO object at 0x...>), not the image
        why = (f"not an image Pillow can read ({len(blob)} bytes)" if isinstance(e, UnidentifiedImageError)
               else decode_error_words(e))
        problems.append(f"{name}: {type(e).__name__}: {why}")
        return None


SPLIT_NAMES = ("train", "test", "val")

#: how images are found and labelled: part of the decode cache's key, so that arrays labelled by an older rule (the
#: class was an image's direct parent folder; macOS metadata files counted as images; links to folders not followed;
#: .ppm, .pgm and .avif files not counted as images) are never served
LAYOUT = "first-folder-3"


class SkippedPathWarning(UserWarning):
    """A walked folder held an entry that is neither a regular file nor a folder (a FIFO, a socket, a device, a link
    that loops or leads nowhere) or a link back into a folder being walked: it is skipped. ``path`` is the entry,
    ``reason`` one of ``"not a regular file"``, ``"unreadable"`` (``stat`` failed: a link loop or a dangling link),
    ``"folder loop"`` or ``"folder link"`` (a link out of a folder vitlab owns, such as the cache's ``features/``)."""

    def __init__(self, path: str, reason: str, detail: str = "") -> None:
        self.path, self.reason = path, reason
        super().__init__(f"skipped {path}: {reason}" + (f" ({detail})" if detail else ""))


def walk(root: Path) -> list[Path]:
    """Every folder and regular file below ``root`` at any depth, sorted, as ``root.rglob("*")`` but following links
    to folders (``train/dog -> /data/dogs``), as torchvision's ``ImageFolder`` does. Nothing is opened: an entry that
    is neither a regular file nor a folder once links are followed (a FIFO, whose opening would wait forever, a
    socket, a device, a link that loops or leads nowhere) is left out with a ``SkippedPathWarning``, as is a link
    to a folder it is already inside (a loop: not entered). Hidden entries and macOS metadata (``_skipped``) are
    left out of the warnings, not of the list. A folder that cannot be read is left out, as ``rglob`` leaves it."""
    import stat

    found: list[Path] = []
    skipped: list[SkippedPathWarning] = []

    def skip(entry: os.DirEntry, reason: str, detail: str = "") -> None:
        if not _skipped(Path(entry.path).relative_to(root).parts):
            skipped.append(SkippedPathWarning(entry.path, reason, detail))

    def visit(folder: Path, inside: frozenset[str]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            try:
                mode = e.stat().st_mode  # follows links; never opens the entry
            except OSError as err:  # x.png -> x.png (ELOOP), a dangling link
                skip(e, "unreadable", err.strerror or str(err))
                continue
            if stat.S_ISDIR(mode):
                real = os.path.realpath(e.path)
                if real in inside:
                    skip(e, "folder loop", f"a link to {real}, a folder it is inside")
                    continue
                found.append(Path(e.path))
                visit(Path(e.path), inside | {real})
            elif stat.S_ISREG(mode):
                found.append(Path(e.path))
            else:
                skip(e, "not a regular file")

    visit(root, frozenset({os.path.realpath(root)}))
    for w in skipped:
        warnings.warn(w, stacklevel=2)
    return sorted(found)


def _skipped(parts: Sequence[str]) -> bool:
    """Whether a path (its parts below the data's root) holds no data: macOS's metadata (a zip's ``__MACOSX/``
    folder, ``._name`` resource forks) and every hidden file or folder (``.DS_Store``, ``.ipynb_checkpoints/``)."""
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


def image_files(root: Path) -> list[Path]:
    """The image files (``IMAGE_SUFFIXES``, in any case) at any depth below folder ``root`` (``walk``: links to
    folders followed), sorted by path, less macOS metadata and hidden files and folders (``_skipped``)."""
    return sorted(p for p in walk(root)
                  if p.suffix.lower() in IMAGE_SUFFIXES and not _skipped(p.relative_to(root).parts))


def _split_index(parts: Sequence[str]) -> int | None:
    """Where the split folder of a zip entry ``[...]/split/class/[...]/img.jpg`` is: the first part named as a split
    (``SPLIT_NAMES``) with a class folder and a file below it; None without one."""
    return next((i for i, p in enumerate(parts[:-2]) if p in SPLIT_NAMES), None)


def zip_splits(root: Path) -> list[str]:
    """The split folders (``SPLIT_NAMES``) a zip holds its class folders in (``[...]/split/class/img.jpg``)."""
    with zipfile.ZipFile(root) as zf:
        return sorted({parts[i] for n in zf.namelist() if n.lower().endswith(IMAGE_SUFFIXES)
                       and not _skipped(parts := Path(n).parts) and (i := _split_index(parts)) is not None})


def _zip_entries(zf: zipfile.ZipFile, split: str | None) -> dict[str, tuple[str, ...]]:
    """Each entry of a zip under its class root (its name -> its parts below that root; folders end in ``/``). With
    ``split``: the entries of that split folder (``_split_index``). Without: the root is the deepest folder above
    every image that holds no image itself (``train/cat/x.jpg`` and ``train/dog/y.jpg``: ``train/``; ``cat/x.jpg``
    alone: the zip's own root)."""
    entries = [(n, Path(n).parts) for n in sorted(zf.namelist()) if not _skipped(Path(n).parts)]
    if split is not None:  # a folder entry (train/cat/) counts as one holding a file
        return {n: parts[i + 1:] for n, parts in entries
                if (i := _split_index(parts + ("",) * n.endswith("/"))) is not None and parts[i] == split}
    images = [parts for n, parts in entries if not n.endswith("/") and n.lower().endswith(IMAGE_SUFFIXES)]
    prefix = images[0][:-1] if images else ()
    for parts in images[1:]:
        k = next((k for k, (a, b) in enumerate(zip(prefix, parts[:-1])) if a != b), min(len(prefix), len(parts) - 1))
        prefix = prefix[:k]
    while prefix and any(len(parts) - 1 == len(prefix) for parts in images):  # a folder holding images is a class
        prefix = prefix[:-1]
    return {n: parts[len(prefix):] for n, parts in entries if parts[:len(prefix)] == prefix}


def _members(root: Path, split: str | None = None) -> tuple[list[tuple[str, str, callable]], set[str]]:
    """(class, name, read) for every image under root (a folder or a zip), in sorted order, and the class folders.
    As torchvision's ``ImageFolder``: the class is the first folder under the root, its images found at any depth
    (``cat/2019/x.jpg`` is a cat); images directly in the root, macOS metadata and hidden files (``_skipped``) are
    not read. With ``split``, only a zip's images in that split folder (``[...]/split/class/img.jpg``)."""
    if root.is_file() and zipfile.is_zipfile(root):
        zf = zipfile.ZipFile(root)
        rel = _zip_entries(zf, split)
        members = [(parts[0], n, (lambda n=n: zf.read(n))) for n, parts in rel.items()
                   if len(parts) >= 2 and not n.endswith("/") and n.lower().endswith(IMAGE_SUFFIXES)]
        folders = {parts[0] for n, parts in rel.items() if len(parts) >= 2 or (parts and n.endswith("/"))}
        return members, folders
    if root.is_dir():
        members = []
        for p in image_files(root):
            parts = p.relative_to(root).parts
            if len(parts) >= 2 and p.is_file():  # in a class folder; not a folder named like an image
                members.append((parts[0], str(p), p.read_bytes))
        return members, {p.name for p in root.iterdir() if p.is_dir() and not _skipped((p.name,))}
    raise DataError(f"{root} is neither a folder nor a zip file of images (ImageFolder layout: class/image.jpg)")


def _fingerprint(root: Path) -> str:
    """What the decoded cache of ``root`` depends on: a zip's size and modification time; for a folder, the
    relative path, size and modification time of every entry under it (a root's own time does not change when an
    image inside a class folder is added or overwritten)."""
    st = root.stat()
    if not root.is_dir():
        return f"{st.st_size}|{st.st_mtime_ns}"
    h = hashlib.sha1()
    for p in walk(root):
        try:  # what the loader reads (image files) and the class folders; a dangling link or a vanished file: skip
            if _skipped(p.relative_to(root).parts) or not (
                    p.is_dir() or (p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())):
                continue
            e = p.stat()
        except OSError:
            continue
        h.update(f"{p.relative_to(root)}|{e.st_size}|{e.st_mtime_ns}\n".encode())
    return h.hexdigest()


def load_image_folder(root: str | os.PathLike, *, size: int | tuple[int, int] | None = None,
                      cache: bool = True, progress: bool = True, split: str | None = None) -> ImageArray:
    """Decode an ImageFolder directory or zip (``class/img.jpg``) into an ``ImageArray``; ``split``: only the
    images of a zip's ``split/`` folder (a zip holding ``train/`` and ``test/``). As torchvision's ``ImageFolder``,
    the class is the first folder under the root and its images are found at any depth (``cat/2019/img.jpg``);
    macOS metadata (``__MACOSX/``, ``._img.jpg``) and hidden files and folders are skipped.

    Grayscale, RGBA and palette images are converted to RGB (transparency laid over white: ``rgb8``); with ``size``
    every image is resized to it, otherwise all images must share one size. Unreadable files raise ``DataError`` naming them.
    """
    from tqdm.auto import tqdm

    root = Path(root)
    size = (size, size) if isinstance(size, int) else size
    hit = None
    if cache:
        part = "" if split is None else f"|{split}"
        source = hashlib.sha1(f"{root.resolve()}|{size}{part}".encode()).hexdigest()[:8]
        key = hashlib.sha1(f"{root.resolve()}|{_fingerprint(root)}|{size}{part}|{DECODER}|{LAYOUT}".encode())
        hit = cache_file(f"images-{source}-{key.hexdigest()[:16]}.npz")
        cached = _cached_images(hit, root, split) if hit is not None else None
        if cached is not None:
            return cached
    members, folders = _members(root, split)
    where = root if split is None else f"{root} ({split}/)"
    if not members:
        raise DataError(f"no images found in {where}: expected an ImageFolder layout (class/image.jpg)")
    classes = sorted({c for c, _, _ in members})
    empty = sorted(folders - set(classes))
    if empty:
        raise DataError(f"class folder(s) {empty} in {where} hold no images ({', '.join(IMAGE_SUFFIXES)}), in them "
                        "or in folders below them: add images or remove the folders")
    index = {c: i for i, c in enumerate(classes)}
    problems: list[str] = []
    images, labels, names = [], [], []
    for cls, name, read in tqdm(members, desc=f"decoding {root.name}", disable=not progress, leave=False):
        try:
            blob = read()
        except READ_ERRORS as e:  # a zip's damaged entry (Bad CRC-32), an encrypted one, an unreadable file
            problems.append(f"{name}: {type(e).__name__}: {e}")
            continue
        arr = _decode(blob, name, size, problems)
        if arr is not None:
            images.append(arr)
            labels.append(index[cls])
            names.append(name)
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise DataError(f"{len(problems)} unreadable image(s) in {root} (remove or replace them):\n  {shown}{more}")
    if len({a.shape for a in images}) > 1:
        raise DataError(_mixed_sizes(root, split, images, names))
    data = ImageArray(torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.long),
                      tuple(classes), _source(root, split))
    if hit is not None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a path
                np.savez(f, images=data.images.numpy(), labels=data.labels.numpy(), classes=np.array(classes))

        write_cache(hit, write)
        if hit.is_file():  # written: what it replaces can go
            _drop_stale(hit)
    return data


def _drop_stale(hit: Path) -> None:
    """Remove the decode cache's entries that ``hit`` (``images-SOURCE-KEY.npz``, just written) replaces: those of
    the same source (folder or zip, size and split) under another key, i.e. decoded before its files, the decoder
    or the layout rule changed, and entries named as before sources were part of the name (``images-KEY.npz``).
    No code reads either again; kept, each change of a data set or of vitlab left another copy of it behind (150 MB
    for CIFAR-10's training set). Best effort: a file another process removed first or cannot remove is left."""
    source = hit.name.split("-")[1]
    for p in hit.parent.glob("images-*.npz"):
        parts = p.stem.split("-")
        if p != hit and ((len(parts) == 3 and parts[1] == source) or len(parts) == 2):
            with contextlib.suppress(OSError):
                p.unlink()


def _cached_images(hit: Path, root: Path, split: str | None) -> ImageArray | None:
    """The decoded images cached at ``hit``, or None when there are none or the file is damaged (a full disk, a bad
    copy): those are decoded again and the file replaced, rather than failing every later load."""
    import zipfile

    if not hit.is_file():
        return None
    try:
        with np.load(hit, allow_pickle=False) as z:
            images, labels, classes = z["images"], z["labels"], tuple(str(c) for c in z["classes"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if images.ndim != 4 or len(images) != len(labels) or not classes:
        return None
    touch_cache(hit)
    return ImageArray(torch.from_numpy(images), torch.from_numpy(labels), classes, _source(root, split))


def _mixed_sizes(root: Path, split: str | None, images: list[np.ndarray], names: list[str]) -> str:
    """The error for images of several sizes: each size (most common first) with its count and an image of it, and
    the fixes a caller has (``load_dataset`` and the command line's ``--data`` take no size)."""
    by_size: dict[tuple[int, int], list[str]] = {}
    for arr, name in zip(images, names):
        by_size.setdefault(arr.shape[:2], []).append(Path(name).relative_to(root).as_posix() if root.is_dir()
                                                      else name)
    ranked = sorted(by_size.items(), key=lambda kv: -len(kv[1]))
    sizes = ", ".join(f"{h}x{w} ({len(n)} images, e.g. {n[0]})" if len(n) > 1 else f"{h}x{w} (1 image: {n[0]})"
                      for (h, w), n in ranked[:5])
    more = f" and {len(ranked) - 5} more sizes" if len(ranked) > 5 else ""
    (h, w), _ = ranked[0]
    where = root if split is None else f"{root} ({split}/)"
    call = f"vitlab.data.datasets.load_image_folder({str(root)!r}, size=(H, W){'' if split is None else f', split={split!r}'})"
    return (f"images in {where} have mixed sizes (height x width): {sizes}{more}. A data set is read at one size: "
            f"resize the image files to one size (e.g. {h}x{w}, the most common), or, from Python, load them with "
            f"{call}, which resizes every image as it is read")


#: the CIFAR-10 beside the checkout (``../shared/datasets/cifar10``, ImageFolder zips), where there is one: a place
#: ``cifar_places`` looks after the data folder, never one a user has to provide
SHARED_CIFAR10 = CHECKOUT.parent / "shared" / "datasets" / "cifar10"
#: torchvision's folder of extracted files, by data set (what ``vitlab data NAME`` leaves in its folder)
CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
#: the command that fetches a public data set into ``data_dir()`` (``FETCH_COMMAND.format(name="cifar10")``)
FETCH_COMMAND = "vitlab data {name}"


def data_dir() -> Path:
    """Where the public data sets read by name live (``data_dir() / "cifar10"``; ``vitlab data cifar10`` downloads
    there): ``$VITLAB_DATA`` (a leading ``~`` is the home folder; set but empty counts as unset), else the
    ``datasets`` folder of the cache root (``cache_dir()``: ``$VITLAB_CACHE`` or ``~/.cache/vitlab``). ``vitlab cache
    prune`` never touches it. Raises ``RuntimeError`` as ``cache_dir`` does when there is no home folder."""
    env = os.environ.get("VITLAB_DATA", "")
    return Path(env).expanduser() if env else cache_dir() / "datasets"


def cifar_places(name: str = "cifar10") -> list[Path]:
    """The folders ``name`` (``cifar10``/``cifar100`` without a ``:ROOT``) is looked for in, in order:
    ``data_dir() / name``, then for CIFAR-10 the shared copy beside the checkout (``SHARED_CIFAR10``)."""
    return [data_dir() / name] + ([SHARED_CIFAR10] if name == "cifar10" else [])


def _cifar_in(base: Path, name: str, split: str) -> Path | None:
    """What ``split`` of ``name`` is read from in folder ``base``: ``{split}.zip`` or ``{split}/`` (ImageFolder
    layout), else torchvision's extracted folder (``CIFAR_FOLDERS``); None when ``base`` holds none of them."""
    if (base / f"{split}.zip").is_file():
        return base / f"{split}.zip"
    if (base / split).is_dir():
        return base / split
    tv = base / CIFAR_FOLDERS[name]
    return tv if tv.is_dir() else None


def find_cifar(name: str = "cifar10", split: str = "test") -> Path | None:
    """The file or folder ``split`` of ``name`` is read from (the first of ``cifar_places`` that holds it), or None
    when it is not on this machine; nothing is downloaded."""
    if name not in CIFAR_FOLDERS:
        raise DataError(f"unknown dataset {name!r}: use one of {sorted(CIFAR_FOLDERS)}")
    return next((hit for base in cifar_places(name) if (hit := _cifar_in(base, name, split)) is not None), None)


def _missing(name: str, cause: str | None = None) -> DatasetMissing:
    dest = data_dir() / name
    where = ("VITLAB_DATA chooses that folder's parent" if os.environ.get("VITLAB_DATA") else
             f"VITLAB_DATA=DIR reads DIR/{name} instead")
    fix = (f"run `{FETCH_COMMAND.format(name=name)}` while online (it downloads into {dest}), or put train.zip and "
           f"test.zip (ImageFolder layout) or torchvision's {CIFAR_FOLDERS[name]}/ folder into {dest} ({where})")
    return DatasetMissing(name, [str(p) for p in cifar_places(name)], fix, cause)


def fetch_cifar(name: str = "cifar10") -> tuple[Path, bool]:
    """Make ``name`` (``cifar10``/``cifar100``) readable by name: (the folder it is read from, whether it was
    downloaded now). Already in one of ``cifar_places`` (both splits): that folder, nothing downloaded. Otherwise
    torchvision's downloader fetches its archive into ``data_dir() / name`` (checked against torchvision's MD5,
    then extracted). Raises ``DatasetMissing`` (with ``cause``) when the download fails, e.g. offline; the folders
    it made for the download are removed again."""
    hits = [find_cifar(name, split) for split in ("train", "test")]
    if all(hits):
        return hits[0].parent, False
    dest = data_dir() / name
    import shutil

    import torchvision

    cls = {"cifar10": torchvision.datasets.CIFAR10, "cifar100": torchvision.datasets.CIFAR100}[name]
    created = [p for p in (dest, *dest.parents) if not p.exists()]
    try:
        cls(str(dest), train=True, download=True)  # one archive holds both splits
    except Exception as e:  # noqa: BLE001 - offline downloads fail in many ways
        if created:  # no empty folder (or half an archive) left where the next look would find nothing anyway
            shutil.rmtree(created[-1], ignore_errors=True)
        raise _missing(name, f"{type(e).__name__}: {e}") from e
    return dest, True


def load_cifar(name: str = "cifar10", split: str = "train", root: str | os.PathLike | None = None,
               download: bool = True, progress: bool = True) -> ImageArray:
    """CIFAR-10/100: from ``root`` when given (its ImageFolder zips or folders, else torchvision's files there,
    downloaded into it when ``download``), otherwise from the first of ``cifar_places`` that holds it, downloaded
    into ``data_dir()`` when it is nowhere and ``download`` (``fetch_cifar``). ``progress``: a bar while the JPEGs are
    decoded the first time. Raises ``DatasetMissing`` when it is not here and cannot be (or must not be)
    downloaded, ``DataError`` for a ``root`` that does not exist or an unknown name."""
    if split not in ("train", "test"):
        raise DataError(f"split must be 'train' or 'test', got {split!r}")
    if name not in CIFAR_FOLDERS:
        raise DataError(f"unknown dataset {name!r}: use cifar10, cifar100 or a folder/zip path")
    if root is not None and not Path(root).exists():  # a typo: never a download into a new folder of that name
        raise DataError(f"{name}:{root}: {root} does not exist: give the folder that holds train.zip/test.zip (or "
                        "torchvision's files), or leave ':ROOT' out")
    # a root given is the only place looked at (then torchvision's files there): never the data folder instead
    if root is None:
        hit = find_cifar(name, split)
        if hit is None and download:
            fetch_cifar(name)
            hit = find_cifar(name, split)
        if hit is None:
            raise _missing(name)
    else:
        hit = _cifar_in(Path(root), name, split)
    tv_root = Path(root) if root is not None else hit.parent
    if hit is not None and hit.name != CIFAR_FOLDERS[name]:
        return load_image_folder(hit, progress=progress)
    import torchvision

    cls = {"cifar10": torchvision.datasets.CIFAR10, "cifar100": torchvision.datasets.CIFAR100}[name]
    try:
        ds = cls(str(tv_root), train=split == "train", download=download and hit is None)
    except Exception as e:  # noqa: BLE001 - offline downloads fail in many ways
        raise DataError(
            f"could not read or download {name} into {tv_root} ({type(e).__name__}: {e}). Offline, pass root= a "
            "folder holding train.zip/test.zip in ImageFolder layout or torchvision's extracted files"
        ) from e
    return ImageArray(torch.from_numpy(np.asarray(ds.data)), torch.tensor(ds.targets, dtype=torch.long),
                      tuple(ds.classes), f"torchvision:{name}")


SHAPES_SIZES = {"train": (8000, 0), "test": (2000, 1)}


def load_shapes(split: str = "train", n: int | None = None, size: int = 32) -> ImageArray:
    """The synthetic shapes dataset with object masks (train: 8,000 images, seed 0; test: 2,000, seed 1); ``n``: draw
    ``n`` images with the split's seed instead (not a prefix of the split: the draw depends on ``n``), None: the
    split. A draw is generated once per process (``_drawn_shapes`` keeps the last few: a sweep on the shapes loads
    both splits for every run) and each call gets its own copy of the tensors, free to change."""
    from vitlab.data.shapes import SHAPE_CLASSES

    if split not in SHAPES_SIZES:
        raise DataError(f"split must be 'train' or 'test', got {split!r}")
    check_int("n", n, 1, allowed="at least 1 image, a whole number (or None for the whole split)", none=True,
              numpy=True, error=DataError)  # True is no 1 image, 1.5 no count
    count, seed = SHAPES_SIZES[split]
    images, labels, masks = (t.clone() for t in _drawn_shapes(count if n is None else n, size, seed))
    return ImageArray(images, labels, SHAPE_CLASSES, f"shapes:{split}:seed{seed}", masks)


@functools.lru_cache(maxsize=4, typed=True)  # typed: size=32.0 is refused by make_shapes, never 32's entry
def _drawn_shapes(n: int, size: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``vitlab.data.shapes.make_shapes(n, size, seed)``, kept for the next call with the same arguments (both full
    splits at 32 px hold about 40 MB). Callers copy the tensors before handing them out."""
    from vitlab.data.shapes import make_shapes

    return make_shapes(n, size=size, seed=seed)


def load_dataset(spec: str, split: str = "train", progress: bool = True) -> ImageArray:
    """``cifar10`` / ``cifar100`` (optionally ``cifar10:/path/to/root``), ``shapes``, or a folder/zip path;
    ``progress``: a bar while images are decoded the first time (``--quiet`` turns it off)."""
    name, _, root = spec.partition(":")
    if name == "shapes":
        return load_shapes(split)
    if name in ("cifar10", "cifar100"):
        return load_cifar(name, split, root or None, progress=progress)
    path = Path(spec)
    if base_dataset(spec) != spec:  # not a path as written (base_dataset keeps an existing one whole)
        raise DataError(f"dataset {spec!r} names a part of {base_dataset(spec)!r} that a run trained on (the MPP "
                        f"study's label: `vitlab mpp-study` draws that part and passes it to training itself, so "
                        f"resume such a run by running the study again); load {base_dataset(spec)!r} for the whole "
                        "data set")
    if not path.exists():
        raise DataError(f"dataset {spec!r} not found: use cifar10, cifar100, shapes, or an existing ImageFolder "
                        "folder or zip")
    if not (path.is_dir() or path.is_file()):  # a FIFO would make the zip check wait for a writer forever
        raise DataError(f"dataset {spec!r} is neither a folder nor a regular file (a FIFO, socket or device): give an "
                        "ImageFolder folder or zip")
    for cand in (path / f"{split}.zip", path / split):
        if cand.exists():
            return load_image_folder(cand, progress=progress)
    if path.is_dir():
        splits = sorted(p.stem for p in path.iterdir() if p.stem in SPLIT_NAMES)
    else:
        splits = zip_splits(path) if zipfile.is_zipfile(path) else []
        if split in splits:
            return load_image_folder(path, split=split, progress=progress)
    if splits:
        raise DataError(f"{path} has no {split!r} split (found {splits}): add {split}/ or {split}.zip beside them")
    if split != "train":  # a bare class folder is one set of images: as its own test set it would score training
        raise DataError(f"{path} holds class folders but no {split!r} split, and the same images cannot be their own "
                        f"test set: put the classes under {path}/train/ and {path}/{split}/ (or train.zip and "
                        f"{split}.zip)")
    return load_image_folder(path, progress=progress)


def base_dataset(label: str) -> str:
    """The ``load_dataset`` spec of a run's ``data`` label: the label less a trailing ``[...]`` qualifier, which says
    which part of the data set a run used (the MPP study's ``shapes[n=256]``, ``cifar10[500 per class, seed 0]``),
    so that its splits load; a label that is an existing path as written (a folder named ``x[1]``) stays whole."""
    if label.endswith("]") and "[" in label and not Path(label).exists():
        return label[: label.rindex("[")]
    return label


def data_fingerprint(spec: str) -> str | None:
    """What the images of data set ``spec`` (as ``load_dataset`` names it) depend on, for results that must not
    outlive a change to them. None for the sets read by name: ``cifar10``/``cifar100`` (fixed public data; the
    shared copy's or torchvision's files are the same images wherever they lie) and ``shapes`` (generated by the
    code). For a folder or zip path, or a ``cifar10:ROOT`` root: a digest of the decode cache's fingerprint of it
    (every class folder and image file under a folder: relative path, size, modification time; a zip's size and
    time) and of each zip directly in a folder (``train.zip``, ``test.zip``). "missing" for a path that does not
    exist (loading it fails, with its own error)."""
    name, _, root = spec.partition(":")
    if name == "shapes" or (name in ("cifar10", "cifar100") and not root):
        return None
    path = Path(root if name in ("cifar10", "cifar100") else spec)
    if not path.exists():
        return "missing"
    h = hashlib.sha1()
    for p in [path, *(sorted(path.glob("*.zip")) if path.is_dir() else [])]:
        h.update(f"{p.name}|{_fingerprint(p)}\n".encode())
    return h.hexdigest()[:16]


def load_splits(spec: str, progress: bool = True) -> tuple[ImageArray, ImageArray]:
    """``load_dataset(spec, "train")`` and ``(spec, "test")``, checked to hold the same classes (``check_same_classes``)."""
    train, test = load_dataset(spec, "train", progress), load_dataset(spec, "test", progress)
    check_same_classes(train, test, spec)
    return train, test


def check_same_classes(train: ImageArray, test: ImageArray, spec: str) -> None:
    """Each split numbers its own class folders in sorted order: with different class lists the same label would
    name different classes. Raises ``DataError`` naming both lists."""
    if tuple(train.classes) != tuple(test.classes):
        raise DataError(f"{spec}: the train and test splits hold different classes (train {list(train.classes)}, "
                        f"test {list(test.classes)}), so their labels do not match: give both splits the same class "
                        "folders")


def sample_images() -> list[tuple[str, np.ndarray]]:
    """The real photos scikit-learn ships (china, flower): (name, (H, W, 3) uint8), for offline demos."""
    from sklearn.datasets import load_sample_images

    d = load_sample_images()
    return [(Path(f).stem, img) for f, img in zip(d.filenames, d.images)]


# ---------------------------------------------------------------------------------------------- batch ops


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float], size: Sequence[int] | None = None,
              interpolation: str = "bicubic") -> Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, h, w) float32 normalised with ``mean`` and ``std``, on the images' device: the one
    way vitlab turns uint8 images into a model input. With ``size`` (h, w) different from (H, W) the images are resized first
    (bicubic or bilinear, antialiased, clamped to [0, 1])."""
    x = images.permute(0, 3, 1, 2).float().div_(255)
    if size is not None and tuple(x.shape[-2:]) != tuple(size):
        mode = "bilinear" if interpolation == "bilinear" else "bicubic"
        x = torch.nn.functional.interpolate(x, size=tuple(size), mode=mode, antialias=True,
                                            align_corners=False).clamp_(0, 1)
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


# ---------------------------------------------------------------------------------------------- sampling


def k_shot_indices(labels: Tensor, k: int, seed: int = 0) -> Tensor:
    """Indices of ``k`` examples per class, drawn without replacement; a class with fewer is an error."""
    check_int("k", k, 1, allowed="a whole number of at least 1 shot", numpy=True)  # -1 is no "all but one"
    g = torch.Generator().manual_seed(check_seed("seed", seed))
    out = []
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        if len(idx) < k:
            raise DataError(f"class {c} has {len(idx)} examples, fewer than k={k} shots")
        out.append(idx[torch.randperm(len(idx), generator=g)[:k]])
    return torch.cat(out).sort().values


def nested_subsets(labels: Tensor, sizes: Sequence[int], seed: int = 0) -> list[Tensor]:
    """Class-balanced subsets, each containing every smaller one: one order of all images, cut at each size. Each
    class's images are shuffled once (``seed``); the order then takes one image of each class in turn, skipping the
    classes already used up, so a subset's class counts differ by at most one except for classes it holds whole
    (classes of 100, 100 and 10 images give 55, 55 and 10 of 120). With classes of equal size this is the order of
    earlier versions (interleaved to the smallest class, then the rest class by class), so draws are unchanged."""
    try:
        ordered = sorted(sizes)
    except TypeError:  # one size (8 for [8]), or sizes that do not compare ([8, "2"])
        ordered = None
    if ordered is None or not all(whole_index(n) for n in ordered) or (ordered and ordered[0] < 0):  # [-5], [True]
        raise ValueError(f"sizes must be whole numbers of images >= 0, got {sizes!r}")
    sizes = ordered
    if not sizes:  # no cut asked for: no subsets
        return []
    seed = check_seed("seed", seed)
    classes = torch.unique(labels).tolist()
    if sizes[-1] > len(labels):
        raise DataError(f"largest subset {sizes[-1]} exceeds the {len(labels)} examples available")
    g = torch.Generator().manual_seed(seed)
    orders = [torch.nonzero(labels == c).flatten()[torch.randperm(int((labels == c).sum()), generator=g)]
              for c in classes]
    # round-robin: the r-th image of class i goes at rank r * len(classes) + i (each class sorted by its shuffle)
    rank = torch.cat([torch.arange(len(o)) * len(orders) + i for i, o in enumerate(orders)])
    order = torch.cat(orders)[torch.argsort(rank)]
    return [order[:n].sort().values for n in sizes]
