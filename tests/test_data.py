"""Datasets, conversions, bad input, samplers and batch augmentation."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from _reference import make_folder
from conftest import needs_cifar10
from PIL import Image

from vitlab.data.datasets import (
    DataError,
    k_shot_indices,
    load_image_folder,
    nested_subsets,
    normalize,
    sample_images,
)
from vitlab.train.augment import alternating_flips, random_crop_flip, shrink


def test_folder_and_zip_give_the_same_array(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train")
    with zipfile.ZipFile(tmp_path / "train.zip", "w") as zf:
        for p in sorted(root.rglob("*.png")):
            zf.write(p, f"train/{p.parent.name}/{p.name}")
    a = load_image_folder(root, progress=False)
    b = load_image_folder(tmp_path / "train.zip", progress=False)
    assert a.images.shape == (6, 8, 8, 3) and a.images.dtype == torch.uint8
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.classes == ("a", "b") and a.labels.tolist() == [0, 0, 0, 1, 1, 1]
    again = load_image_folder(root, progress=False)  # from the cache
    assert torch.equal(again.images, a.images)
    assert list((tmp_path / "cache").glob("images-*.npz"))


def test_a_damaged_decode_cache_file_is_decoded_anew(tmp_path, monkeypatch):
    """A truncated or foreign images-KEY.npz (full disk, bad copy) made every later load of that data fail with
    numpy's traceback; it is a cache miss now, decoded again and replaced, and the write leaves no temporary."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train")
    first = load_image_folder(root, progress=False)
    (hit,) = (tmp_path / "cache").glob("images-*.npz")
    good = hit.read_bytes()
    for damage in (good[: len(good) // 2], b"not a zip", b""):
        hit.write_bytes(damage)
        again = load_image_folder(root, progress=False)
        assert torch.equal(again.images, first.images) and torch.equal(again.labels, first.labels)
        assert hit.read_bytes() == good  # replaced by the same arrays
    with open(hit, "wb") as f:  # readable, but not consistent
        np.savez(f, images=np.zeros((2, 8, 8, 3), np.uint8), labels=np.zeros(3, np.int64), classes=np.array(["a"]))
    assert torch.equal(load_image_folder(root, progress=False).images, first.images)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [hit.name]


def test_an_empty_or_tilde_vitlab_cache_is_not_the_working_directory(tmp_path, monkeypatch):
    """VITLAB_CACHE set but empty (``VITLAB_CACHE= vitlab ...``, an env file's blank value) put images-KEY.npz, and
    by default training runs, into the working directory, and VITLAB_CACHE=~/cache (quoted, so the shell left the
    ~) made a folder named '~' there; empty now counts as unset and a leading ~ is the home folder."""
    from vitlab.data.datasets import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    root = make_folder(tmp_path / "train")
    monkeypatch.setenv("VITLAB_CACHE", "")
    assert cache_dir() == tmp_path / "home" / ".cache" / "vitlab"
    load_image_folder(root, progress=False)
    assert len(list((tmp_path / "home" / ".cache" / "vitlab").glob("images-*.npz"))) == 1
    monkeypatch.setenv("VITLAB_CACHE", "~/vc")
    assert cache_dir() == tmp_path / "home" / "vc"
    assert not list(tmp_path.glob("images-*")) and not (tmp_path / "~").exists()


def test_no_home_folder_is_an_error_naming_vitlab_cache(monkeypatch):
    """With HOME unset and no home for the user (a container's made-up uid), the cache folder was pathlib's
    'Could not determine home directory.'; the error now names the cache and VITLAB_CACHE as the fix."""
    import pwd

    from vitlab.data.datasets import cache_dir

    def unknown(uid):
        raise KeyError(uid)

    monkeypatch.delenv("VITLAB_CACHE")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", unknown)
    with pytest.raises(RuntimeError, match=r"~/.cache/vitlab \(VITLAB_CACHE is unset\).*set VITLAB_CACHE to a writable"):
        cache_dir()


def test_a_cache_that_cannot_be_used_keeps_the_decoded_images(tmp_path, monkeypatch):
    """VITLAB_CACHE naming a file (or a read-only or full disk) failed every load with FileExistsError after all
    the images were decoded, and with no home folder the load failed before decoding; the images are returned now,
    the same as an uncached load, with a CacheWarning naming VITLAB_CACHE."""
    import pwd

    from vitlab.data.datasets import CacheWarning

    root = make_folder(tmp_path / "train")
    fresh = load_image_folder(root, cache=False, progress=False)
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "afile"))
    with pytest.warns(CacheWarning, match=r"afile.*going on without it.*set VITLAB_CACHE to a writable folder"):
        got = load_image_folder(root, progress=False)
    assert torch.equal(got.images, fresh.images) and torch.equal(got.labels, fresh.labels)
    assert (tmp_path / "afile").read_text() == "not a folder"
    monkeypatch.delenv("VITLAB_CACHE")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    with pytest.warns(CacheWarning, match="set VITLAB_CACHE to a writable folder's full path; going on without"):
        got = load_image_folder(root, progress=False)
    assert torch.equal(got.images, fresh.images)


def test_the_decode_cache_key_names_the_decoder(tmp_path, monkeypatch):
    """Arrays decoded by an older decoder (e.g. 16-bit images clipped white) are never served after it changed."""
    import vitlab.data.datasets as D

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train")
    load_image_folder(root, progress=False)
    monkeypatch.setattr(D, "DECODER", "another")
    calls = []
    real = D._decode
    monkeypatch.setattr(D, "_decode", lambda *a: (calls.append(1), real(*a))[1])
    load_image_folder(root, progress=False)
    assert len(calls) == 6 and len(list((tmp_path / "cache").glob("images-*.npz"))) == 1  # the old one replaced


def test_a_new_decode_cache_entry_replaces_the_stale_ones_of_its_source(tmp_path, monkeypatch):
    """Each change of a data set's files (or of the decoder) wrote another images-KEY.npz and never removed the old
    one: the cache held 1 GB of stale CIFAR-10 copies. Writing an entry now removes the earlier entries of the same
    source (folder, size and split) and entries in the name format before sources were named; another source's
    entry and the same folder at another size stay, and a failed write removes nothing."""
    import vitlab.data.datasets as D

    cache = tmp_path / "cache"
    monkeypatch.setenv("VITLAB_CACHE", str(cache))
    root, other = make_folder(tmp_path / "train"), make_folder(tmp_path / "other", classes=("c", "d"))
    load_image_folder(other, progress=False)
    load_image_folder(root, progress=False)
    load_image_folder(root, size=4, progress=False)
    cache.joinpath("images-0123456789abcdef.npz").write_bytes(b"an entry named the old way")
    kept = sorted(p.name for p in cache.glob("images-*.npz") if "0123456789abcdef" not in p.name)
    assert len(kept) == 3 and all(len(n.split("-")) == 3 for n in kept)
    monkeypatch.setattr(D, "DECODER", "another")
    with monkeypatch.context() as m:  # a write that fails leaves every entry as it was
        m.setattr("vitlab.base.atomic.atomic_write", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
        with pytest.warns(D.CacheWarning):
            load_image_folder(root, progress=False)
    assert sorted(p.name for p in cache.glob("images-*.npz")) == sorted([*kept, "images-0123456789abcdef.npz"])
    again = load_image_folder(root, progress=False)
    after = sorted(p.name for p in cache.glob("images-*.npz"))
    assert len(after) == 3 and "images-0123456789abcdef.npz" not in after
    assert len(set(after) & set(kept)) == 2  # the other folder and the size-4 entry stay; the stale one is gone
    assert torch.equal(again.images, load_image_folder(root, cache=False, progress=False).images)


def test_ppm_pgm_and_avif_files_are_images(tmp_path, monkeypatch):
    """torchvision's ImageFolder reads .ppm and .pgm files and Pillow reads .avif, but vitlab's loaders counted
    none of them as images: a folder of them was 'no images'. They load now, from a folder and from a zip."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    root = tmp_path / "data"
    pixels = {}
    for cls, suffix, mode in (("a", ".ppm", "RGB"), ("b", ".pgm", "L"), ("c", ".avif", "RGB")):
        (root / cls).mkdir(parents=True)
        arr = rng.integers(0, 255, (8, 8, 3) if mode == "RGB" else (8, 8), dtype=np.uint8)
        img = Image.fromarray(arr, mode)
        img.save(root / cls / f"x{suffix}", **({"quality": 100} if suffix == ".avif" else {}))
        with Image.open(root / cls / f"x{suffix}") as saved:  # what Pillow reads back (AVIF is lossy)
            pixels[cls] = np.asarray(saved.convert("RGB"))
        assert cls == "c" or np.array_equal(pixels[cls], np.asarray(img.convert("RGB")))
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as zf:
        for p in sorted(root.rglob("*.*")):
            zf.write(p, f"{p.parent.name}/{p.name}")
    for src in (root, tmp_path / "data.zip"):
        got = load_image_folder(src, progress=False)
        assert got.classes == ("a", "b", "c") and got.labels.tolist() == [0, 1, 2]
        assert all(np.array_equal(got.images[i].numpy(), pixels[c]) for i, c in enumerate("abc"))


def test_the_cache_follows_changes_inside_class_folders(tmp_path, monkeypatch):
    """Adding an image to a class folder or overwriting one in place leaves the root folder's own time as it was:
    the cached array must still be rebuilt, and equal what an uncached load decodes."""
    import os

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train")
    first = load_image_folder(root, progress=False)
    st = root.stat()
    Image.new("RGB", (8, 8), (255, 255, 255)).save(root / "a" / "zz_new.png")
    target = sorted((root / "b").glob("*.png"))[0]
    Image.new("RGB", (8, 8), (1, 2, 3)).save(target)
    os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))  # the root as it was: only its members changed
    again = load_image_folder(root, progress=False)
    fresh = load_image_folder(root, cache=False, progress=False)
    assert len(first) == 6 and len(again) == len(fresh) == 7
    assert torch.equal(again.images, fresh.images) and torch.equal(again.labels, fresh.labels)
    assert (again.images == 255).all(dim=(1, 2, 3)).sum() == 1  # the added white image
    assert any((img == torch.tensor([1, 2, 3], dtype=torch.uint8)).all() for img in again.images)  # the overwritten
    assert len(list((tmp_path / "cache").glob("images-*.npz"))) == 1


def test_the_cache_follows_an_image_overwritten_with_one_of_the_same_byte_size(tmp_path, monkeypatch):
    """An uncompressed image overwritten in place by another of its size keeps its path and byte count: its
    modification time tells the cache it changed."""
    import os

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "train"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        Image.new("RGB", (8, 8), (10, 10, 10)).save(root / c / "x.bmp")
    first = load_image_folder(root, progress=False)
    target = root / "b" / "x.bmp"
    size, st = target.stat().st_size, target.stat()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert target.stat().st_size == size
    again = load_image_folder(root, progress=False)
    assert first.images[1, 0, 0].tolist() == [10, 10, 10] and again.images[1, 0, 0].tolist() == [200, 100, 50]


def test_the_cache_key_skips_what_the_loader_skips(tmp_path, monkeypatch):
    """A dangling link or a non-image file under the folder is no image: the cached load reads the same images as
    the uncached one instead of failing on the link's stat."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train")
    (root / "a" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "a" / "notes.txt").write_text("not an image")
    fresh = load_image_folder(root, cache=False, progress=False)
    cached = load_image_folder(root, progress=False)
    assert len(fresh) == len(cached) == 6 and torch.equal(fresh.images, cached.images)


def test_a_decompression_bomb_in_a_training_folder_is_named(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "train", n_per_class=1)
    Image.new("RGB", (64, 64)).save(root / "a" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 is over twice this: Pillow refuses it
    with pytest.raises(DataError, match=r"huge.png: DecompressionBombError.*raise PIL.Image.MAX_IMAGE_PIXELS"):
        load_image_folder(root, cache=False, progress=False)


def test_grayscale_rgba_palette_converted(tmp_path):
    root = make_folder(tmp_path / "d", n_per_class=1)
    Image.new("L", (8, 8), 100).save(root / "a" / "gray.png")
    Image.new("RGBA", (8, 8), (10, 20, 30, 255)).save(root / "a" / "rgba.png")
    Image.new("P", (8, 8)).save(root / "b" / "pal.png")
    d = load_image_folder(root, cache=False, progress=False)
    assert d.images.shape == (5, 8, 8, 3)
    gray = d.images[d.labels == 0][0]  # sorted: 0.png, gray.png, rgba.png
    assert (d.images[1] == 100).all() and gray.shape == (8, 8, 3)
    assert d.images[2, 0, 0].tolist() == [10, 20, 30]


def test_deep_and_float_greyscale_scale_to_8_bits_by_their_range(tmp_path):
    """16-bit greyscale is scaled by 255/65535 and rounded (25854 -> 100.6 -> 101), 32-bit greyscale whose largest
    value is 255 is kept as it is, float greyscale in [0, 1] (1.0 included) is scaled by 255."""
    root = tmp_path / "d"
    for c in ("a", "b", "c"):
        (root / c).mkdir(parents=True)
    Image.fromarray(np.array([[25854, 65535], [0, 257]], np.uint16)).save(root / "a" / "x.png")
    Image.fromarray(np.array([[0, 100], [200, 255]], np.int32), mode="I").save(root / "b" / "x.tif")
    Image.fromarray(np.array([[0.0, 0.5], [0.2, 1.0]], np.float32), mode="F").save(root / "c" / "x.tif")
    d = load_image_folder(root, cache=False, progress=False)
    assert d.images[..., 0].tolist() == [[[101, 255], [0, 1]], [[0, 100], [200, 255]], [[0, 128], [51, 255]]]
    assert (d.images == d.images[..., :1]).all()  # grey: every channel the same


def test_images_read_at_a_size_take_its_height_and_width(tmp_path):
    """size=(H, W) is height by width, as the arrays are: a non-square size is not read transposed."""
    root = make_folder(tmp_path / "d", n_per_class=1)
    d = load_image_folder(root, size=(4, 6), cache=False, progress=False)
    assert d.images.shape == (2, 4, 6, 3)


def test_training_photos_are_decoded_upright_as_their_exif_orientation_says(tmp_path):
    from _reference import turned_photo

    root = tmp_path / "d"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        turned_photo(root / c / "portrait.jpg")
    d = load_image_folder(root, cache=False, progress=False)
    assert d.images.shape == (2, 64, 32, 3)  # (N, H, W, 3): upright, not the stored 32 x 64
    red = d.images[0, ..., 0].int() - d.images[0, ..., 1].int()
    assert red[:28].min() > 200 and red[-28:].max() < 50


def test_transparency_is_laid_over_white_not_the_colour_kept_under_it(tmp_path):
    """A logo on a transparent background keeps black (or any colour) under its transparent pixels: dropping the
    alpha showed that colour; over white, an opaque pixel keeps its colour and a half-transparent one is blended."""
    root = tmp_path / "d"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    rgba = np.zeros((8, 8, 4), np.uint8)  # transparent black
    rgba[0, 0] = (255, 0, 0, 255)  # opaque red
    rgba[0, 1] = (255, 0, 0, 128)  # half-transparent red
    Image.fromarray(rgba, "RGBA").save(root / "a" / "rgba.png")
    Image.merge("LA", (Image.new("L", (8, 8), 0), Image.new("L", (8, 8), 0))).save(root / "a" / "la.png")
    pal = Image.new("P", (8, 8), 0)
    pal.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    pal.paste(1, (0, 0, 4, 8))  # left half green, right half palette entry 0: black, marked transparent
    pal.save(root / "b" / "pal.png", transparency=0)
    d = load_image_folder(root, cache=False, progress=False)  # sorted: a/la.png, a/rgba.png, b/pal.png
    la, rgb, p = (d.images[i].int() for i in range(3))
    assert (la == 255).all() and (rgb[1:] == 255).all() and (p[:, 4:] == 255).all()
    assert rgb[0, 0].tolist() == [255, 0, 0] and p[0, 0].tolist() == [0, 255, 0]
    assert rgb[0, 1, 0] == 255 and abs(int(rgb[0, 1, 1]) - 127) <= 1  # half red over white: pink


def test_broken_and_mixed_size_images_are_named(tmp_path):
    root = make_folder(tmp_path / "d", n_per_class=1)
    (root / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    good = (root / "b" / "0.png").read_bytes()
    (root / "b" / "trunc.png").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match=r"(?s)2 unreadable.*broken\.jpg.*trunc\.png") as e:
        load_image_folder(root, cache=False, progress=False)
    assert "broken.jpg: UnidentifiedImageError: not an image Pillow can read (10 bytes)" in str(e.value)
    assert "BytesIO" not in str(e.value)  # Pillow's name for the in-memory copy, not the file's
    root2 = make_folder(tmp_path / "e", n_per_class=1)
    Image.new("RGB", (9, 7)).save(root2 / "a" / "big.png")
    with pytest.raises(DataError, match="mixed sizes"):
        load_image_folder(root2, cache=False, progress=False)
    d = load_image_folder(root2, size=8, cache=False, progress=False)
    assert d.images.shape == (3, 8, 8, 3)
    with pytest.raises(DataError, match="no images"):
        (tmp_path / "empty" / "a").mkdir(parents=True)
        load_image_folder(tmp_path / "empty", cache=False, progress=False)


def test_damaged_images_pillow_reports_as_value_or_syntax_errors_are_named(tmp_path):
    """A damaged PNG can make Pillow raise SyntaxError ('broken PNG file') while decoding: it was a traceback that
    named no file instead of the list of unreadable images."""
    from _reference import damaged_pngs

    root = make_folder(tmp_path / "d", n_per_class=1)
    for name, blob in damaged_pngs().items():
        (root / "a" / name).write_bytes(blob)
    with pytest.raises(DataError, match=r"(?s)2 unreadable.*chunk\.png: SyntaxError.*ihdr\.png: ValueError"):
        load_image_folder(root, cache=False, progress=False)


def test_linked_class_folders_are_read_as_torchvision_reads_them(tmp_path, monkeypatch):
    """train/dog -> /data/dogs (a class folder kept elsewhere) was 'class folder(s) ['dog'] hold no images', and a
    linked folder below a class was left out; links to folders are followed, a loop adds nothing, and the cache
    follows changes behind a link."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train", n_per_class=2, classes=("cat",))
    store = make_folder(tmp_path / "store", n_per_class=2, classes=("dogs", "more_cats"))
    (root / "dog").symlink_to(store / "dogs", target_is_directory=True)
    (root / "cat" / "more").symlink_to(store / "more_cats", target_is_directory=True)
    (root / "cat" / "loop").symlink_to(root, target_is_directory=True)
    d = load_image_folder(root, progress=False)
    assert d.classes == ("cat", "dog") and d.labels.tolist() == [0, 0, 0, 0, 1, 1]
    Image.new("RGB", (8, 8)).save(store / "dogs" / "new.png")
    assert load_image_folder(root, progress=False).labels.tolist() == [0, 0, 0, 0, 1, 1, 1]


def test_a_damaged_zip_entry_is_named_among_the_unreadable_images(tmp_path):
    """A zip entry whose bytes no longer match its checksum (a bad copy) stopped loading with zipfile's traceback;
    it is now one of the unreadable images, named."""
    root = make_folder(tmp_path / "d", n_per_class=2)
    with zipfile.ZipFile(tmp_path / "d.zip", "w") as zf:  # stored: the PNG's bytes stand as they are in the zip
        for p in sorted(root.rglob("*.png")):
            zf.write(p, p.relative_to(root).as_posix())
    blob = bytearray((tmp_path / "d.zip").read_bytes())
    blob[blob.index(b"IDAT") + 6] ^= 0xFF  # a byte of a/0.png's image data
    (tmp_path / "d.zip").write_bytes(blob)
    with pytest.raises(DataError, match=r"1 unreadable image\(s\) in .*d\.zip.*\n  a/0\.png: BadZipFile: Bad CRC-32"):
        load_image_folder(tmp_path / "d.zip", cache=False, progress=False)


def _zip_folder(root, zpath, prefix=""):
    """``root``'s files and folders (every one, hidden ones too) zipped under ``prefix``, as ``zip -r`` would."""
    with zipfile.ZipFile(zpath, "w") as zf:
        for p in sorted(root.rglob("*")):
            name = f"{prefix}{p.relative_to(root).as_posix()}"
            zf.write(p, name) if p.is_file() else zf.writestr(f"{name}/", "")
    return zpath


def test_images_nested_below_class_folders_take_the_class_folders_label(tmp_path, monkeypatch):
    """As torchvision's ImageFolder: the class is the first folder under the root, its images found at any depth
    (train/cat/2019/x.png is a cat), in a folder and in a zip alike; never a false 'class folders hold no images'."""
    from vitlab.data.datasets import load_dataset

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "d"
    make_folder(src / "train" / "cat" / "2019", n_per_class=2, classes=("indoor", "outdoor"))
    make_folder(src / "train" / "dog", n_per_class=1, classes=("2019",))
    make_folder(src / "train", n_per_class=1, classes=("dog",))  # one dog image directly in its class folder
    make_folder(src / "test", n_per_class=1, classes=("cat", "dog"))
    flat = make_folder(tmp_path / "flat", n_per_class=1, classes=("cat", "dog"))
    folder = load_image_folder(src / "train", cache=False, progress=False)
    assert folder.classes == ("cat", "dog") and folder.labels.tolist() == [0, 0, 0, 0, 1, 1]
    zipped = load_image_folder(_zip_folder(src / "train", tmp_path / "train.zip", "train/"), progress=False)
    assert zipped.classes == ("cat", "dog")
    assert torch.equal(zipped.images, folder.images) and torch.equal(zipped.labels, folder.labels)
    both = _zip_folder(src, tmp_path / "both.zip", "wrapper/")
    for spec in (src, both):
        train = load_dataset(str(spec), "train")
        assert train.classes == ("cat", "dog") and torch.equal(train.images, folder.images)
        assert load_dataset(str(spec), "test").classes == ("cat", "dog")
    (src / "train" / "bird" / "2019").mkdir(parents=True)  # an empty class is still found below nested folders
    for spec in (src, _zip_folder(src, tmp_path / "bird.zip")):
        with pytest.raises(DataError, match=r"class folder\(s\) \['bird'\].*hold no images"):
            load_dataset(str(spec), "train")
    with pytest.raises(DataError, match=r"class folder\(s\) \['bird'\].*hold no images"):
        load_image_folder(_zip_folder(src / "train", tmp_path / "bird_train.zip", "train/"), progress=False)
    assert load_image_folder(flat, cache=False, progress=False).classes == ("cat", "dog")


def test_images_directly_in_the_root_and_a_zip_of_one_class_folder(tmp_path, monkeypatch):
    """As torchvision's ImageFolder: an image lying directly in the root belongs to no class and is not read; a zip
    holding one class folder is that one class, as the folder is."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "d", n_per_class=2, classes=("cat",))
    Image.new("RGB", (8, 8)).save(tmp_path / "d" / "stray.png")
    folder = load_image_folder(root, cache=False, progress=False)
    assert folder.classes == ("cat",) and len(folder) == 2
    with zipfile.ZipFile(tmp_path / "cat.zip", "w") as zf:
        for p in sorted((root / "cat").glob("*.png")):
            zf.write(p, f"cat/{p.name}")
    zipped = load_image_folder(tmp_path / "cat.zip", progress=False)
    assert zipped.classes == ("cat",) and torch.equal(zipped.images, folder.images)


def test_macos_metadata_and_hidden_files_are_no_images(tmp_path, monkeypatch):
    """A zip made on macOS holds __MACOSX/.../._x.png resource forks (no PNGs) beside the images, and a copied
    folder ._x.png files, .DS_Store and hidden folders: all skipped, never an unreadable image or an extra class."""
    from vitlab.data.datasets import load_dataset, zip_splits

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    make_folder(src / "train", n_per_class=2)
    make_folder(src / "test", n_per_class=1)
    clean = {s: load_image_folder(src / s, cache=False, progress=False) for s in ("train", "test")}
    fork = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        "  # an AppleDouble header: no image
    for s in ("train", "test"):
        (src / s / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
        (src / s / "a" / "._0.png").write_bytes(fork)
        (src / s / ".ipynb_checkpoints").mkdir()  # a hidden folder with no images: no empty class
        (src / s / ".ipynb_checkpoints" / "0-checkpoint.png").write_bytes((src / s / "b" / "0.png").read_bytes())
    with zipfile.ZipFile(tmp_path / "mac.zip", "w") as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                rel = p.relative_to(src).as_posix()
                zf.write(p, f"data/{rel}")
                zf.writestr(f"__MACOSX/data/{p.parent.relative_to(src).as_posix()}/._{p.name}", fork)
        zf.writestr("__MACOSX/data/val/a/._9.png", fork)  # metadata alone is no split
    assert zip_splits(tmp_path / "mac.zip") == ["test", "train"]
    for spec in (src, tmp_path / "mac.zip"):
        for s in ("train", "test"):
            got = load_dataset(str(spec), s)
            assert got.classes == ("a", "b") and torch.equal(got.images, clean[s].images)
            assert torch.equal(got.labels, clean[s].labels)
    train_zip = _zip_folder(src / "train", tmp_path / "train.zip", "train/")  # a split zip, ._ files and all
    with zipfile.ZipFile(train_zip, "a") as zf:
        zf.writestr("__MACOSX/train/a/._0.png", fork)
    assert torch.equal(load_image_folder(train_zip, cache=False, progress=False).images, clean["train"].images)


def test_mixed_sizes_name_the_sizes_and_a_fix_each_caller_has(tmp_path, monkeypatch):
    """The command line (--data) and load_dataset take no size: the error names the sizes found, an image of each,
    and both fixes (resize the files; in Python, load_image_folder's size=), never a size= they cannot pass."""
    from vitlab.data.datasets import load_dataset

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "d" / "train", n_per_class=2)
    Image.new("RGB", (9, 7)).save(root / "b" / "wide.png")  # 7 rows of 9 pixels
    with pytest.raises(DataError) as e:
        load_dataset(str(tmp_path / "d"), "train")
    msg = str(e.value)
    assert "mixed sizes (height x width): 8x8 (4 images, e.g. a/0.png), 7x9 (1 image: b/wide.png)" in msg
    assert "resize the image files to one size (e.g. 8x8, the most common)" in msg
    assert f"vitlab.data.datasets.load_image_folder({str(root)!r}, size=(H, W))" in msg and "pass size=" not in msg
    with zipfile.ZipFile(tmp_path / "both.zip", "w") as zf:
        for p in sorted((tmp_path / "d").rglob("*.png")):
            zf.write(p, p.relative_to(tmp_path / "d").as_posix())
    with pytest.raises(DataError, match=r"7x9 \(1 image: train/b/wide.png\).*size=\(H, W\), split='train'\)"):
        load_dataset(str(tmp_path / "both.zip"), "train")


def test_random_crop_flip_is_a_shifted_window():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 6 * 6 * 3, dtype=torch.int64).reshape(2, 6, 6, 3).to(torch.uint8)
    y = random_crop_flip(x, 2, g)
    assert y.shape == x.shape
    padded = torch.nn.functional.pad(x, (0, 0, 2, 2, 2, 2))
    for i in range(2):  # each output equals some window of the padded image, possibly mirrored
        hits = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (False, True)
                if torch.equal(y[i], (lambda w: w.flip(1) if f else w)(padded[i, dy:dy + 6, dx:dx + 6]))]
        assert hits


def test_reflect_padding_crops_windows_of_the_mirrored_border():
    """mode="reflect" pads with the image mirrored at its edge (row -1 is row 1), not its edge row repeated: each
    output is a window of the reflect-padded image, possibly mirrored."""
    x = torch.arange(8 * 6 * 6).reshape(8, 6, 6, 1).to(torch.uint8)  # every pixel its own value
    y = random_crop_flip(x, 2, torch.Generator().manual_seed(0), mode="reflect")
    padded = torch.nn.functional.pad(x.permute(0, 3, 1, 2).float(), (2, 2, 2, 2), mode="reflect")
    padded = padded.to(torch.uint8).permute(0, 2, 3, 1)
    for i in range(8):
        assert any(torch.equal(y[i], (lambda w: w.flip(1) if f else w)(padded[i, dy:dy + 6, dx:dx + 6]))
                   for dy in range(5) for dx in range(5) for f in (False, True)), i


def test_random_flips_mirror_half_the_images():
    """Each image is mirrored on a fair coin: 100,000 two-pixel images, 50% +- 0.4% mirrored (4 standard errors)."""
    x = torch.tensor([0, 1], dtype=torch.uint8).view(1, 1, 2, 1).expand(100_000, 1, 2, 1)
    y = random_crop_flip(x, 0, torch.Generator().manual_seed(0))
    assert abs(y[:, 0, 0, 0].float().mean().item() - 0.5) < 0.004


def test_alternating_flips_complement_every_epoch_before():
    """Any two consecutive epochs show every image both ways, so every even epoch mirrors what epoch 0 did."""
    flips = [alternating_flips(50, epoch, seed=7) for epoch in range(6)]
    assert 0 < int(flips[0].sum()) < 50
    for a, b in zip(flips, flips[1:]):
        assert torch.equal(b, ~a)


def test_shrink_antialiases_fine_detail_into_its_mean():
    """Progressive resizing's small images are antialiased: 1-in-4 pixel stripes shrunk 4 times are a grey near
    their mean 0.25, not whichever pixels a plain bilinear sample hits (here all black)."""
    x = torch.zeros(1, 1, 16, 16)
    x[..., ::4] = 1
    out = shrink(x, 4)
    assert out.shape == (1, 1, 4, 4) and (out - 0.25).abs().max() < 0.1  # 0.18 to 0.29: the border's share


def test_normalize_matches_manual():
    x = torch.randint(0, 256, (2, 4, 4, 3), dtype=torch.uint8)
    out = normalize(x, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5))
    ref = (x.permute(0, 3, 1, 2).float() / 255 - torch.tensor([0.5, 0.4, 0.3])[:, None, None]) / torch.tensor(
        [0.2, 0.25, 0.5])[:, None, None]
    torch.testing.assert_close(out, ref)


def test_normalize_keeps_resized_pixels_in_the_images_range():
    """Bicubic resizing overshoots at sharp edges: the resized pixels are clamped to [0, 1] before normalising, so
    no input lies outside what an image of 0..255 pixels gives."""
    x = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    x[:, :, ::2] = 255  # one-pixel stripes: the sharpest edges
    out = normalize(x, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), size=(13, 13))
    assert out.min() >= -2 and out.max() <= 2  # (0 - 0.5) / 0.25 and (1 - 0.5) / 0.25
    assert out.max() == 2 and out.min() == -2


def test_k_shot_and_nested_subsets():
    labels = torch.arange(100) % 4
    idx = k_shot_indices(labels, 5, seed=1)
    assert len(idx) == 20 and torch.bincount(labels[idx]).tolist() == [5, 5, 5, 5]
    assert len(set(idx.tolist())) == 20
    assert not torch.equal(idx, k_shot_indices(labels, 5, seed=2))
    with pytest.raises(DataError, match="fewer than k=30"):
        k_shot_indices(labels, 30)
    subsets = nested_subsets(labels, [8, 40, 16, 100], seed=0)
    assert [len(s) for s in subsets] == [8, 16, 40, 100]
    for small, big in zip(subsets, subsets[1:]):
        assert set(small.tolist()) <= set(big.tolist())
    assert torch.bincount(labels[subsets[1]]).tolist() == [4, 4, 4, 4]  # class balanced
    assert nested_subsets(labels, []) == []  # no sizes, no subsets (the MPP study without caps asks for none)


def test_k_shot_and_nested_subsets_refuse_counts_and_seeds_that_are_no_whole_numbers():
    """k_shot_indices(labels, -1) kept all but one example of each class and k=True one, nested_subsets(labels, [-5])
    all but 5 images and [True] one (a slice of the shuffled order), and a seed of 0.5 failed in torch naming no
    argument; each is refused by name, and NumPy integers draw what their ints do."""
    labels = torch.arange(100) % 4
    for k in (-1, 0, True, 2.5):
        with pytest.raises(ValueError, match=f"k must be a whole number of at least 1 shot, got {k!r}"):
            k_shot_indices(labels, k)
    for sizes in ([-5], [True], [8, 2.5]):
        with pytest.raises(ValueError, match=r"sizes must be whole numbers of images >= 0, got \["):
            nested_subsets(labels, sizes)
    for seed in (0.5, True):
        with pytest.raises(ValueError, match=f"seed must be a whole number, got {seed!r}"):
            k_shot_indices(labels, 2, seed=seed)
        with pytest.raises(ValueError, match=f"seed must be a whole number, got {seed!r}"):
            nested_subsets(labels, [8], seed=seed)
    assert torch.equal(k_shot_indices(labels, np.int64(2), seed=np.int64(3)), k_shot_indices(labels, 2, seed=3))
    assert torch.equal(nested_subsets(labels, [np.int64(8)], seed=np.int64(3))[0],
                       nested_subsets(labels, [8], seed=3)[0])


def test_nested_subsets_refuses_sizes_that_do_not_sort_by_name():
    """nested_subsets(labels, 8) and nested_subsets(labels, [8, "2"]) failed in sorted() ("'int' object is not
    iterable", "'<' not supported"), naming no argument; both are refused as sizes, as given."""
    labels = torch.arange(100) % 4
    for sizes in (8, [8, "2"], [None]):
        with pytest.raises(ValueError, match=f"sizes must be whole numbers of images >= 0, got {re.escape(repr(sizes))}"):
            nested_subsets(labels, sizes)


def _old_nested_order(labels, seed):
    """nested_subsets' order before the round-robin (interleaved up to the smallest class, then the rest class by
    class): the draws the shipped results were made with, for classes of equal size."""
    g = torch.Generator().manual_seed(seed)
    orders = [torch.nonzero(labels == c).flatten()[torch.randperm(int((labels == c).sum()), generator=g)]
              for c in torch.unique(labels).tolist()]
    m = min(len(o) for o in orders)
    return torch.cat([torch.stack([o[:m] for o in orders], dim=1).flatten(), *[o[m:] for o in orders]])


def test_nested_subsets_stay_balanced_when_classes_differ_in_size():
    """Once the smallest class is used up, the rest are still drawn one image per class in turn (100/100/10 images,
    120 drawn: 55/55/10, not 100/10/10), and every subset still holds every smaller one."""
    labels = torch.cat([torch.zeros(100), torch.ones(100), torch.full((10,), 2)]).long()
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(3))]
    assert torch.bincount(labels[nested_subsets(labels, [120])[0]]).tolist() == [55, 55, 10]
    sizes = list(range(1, len(labels) + 1))
    for seed in (0, 1):
        subsets = nested_subsets(labels, sizes, seed=seed)
        again = nested_subsets(labels, sizes, seed=seed)  # the same draw for the same seed
        assert all(torch.equal(a, b) for a, b in zip(subsets, again))
        for small, big in zip(subsets, subsets[1:]):
            assert set(small.tolist()) < set(big.tolist())
        for s in subsets[:-1]:  # no class with images left holds fewer than any other class's count minus one
            counts = torch.bincount(labels[s], minlength=3)
            left = counts < torch.bincount(labels)
            assert counts.max() - counts[left].min() <= 1


@pytest.mark.parametrize("seed", [0, 7, 10_007])
def test_nested_subsets_of_equal_classes_draw_what_the_shipped_results_drew(seed):
    """With classes of equal size (CIFAR-10, the shapes) the round-robin is the order the shipped sweep and study
    results were drawn with: the same images, for any size."""
    labels = torch.arange(10).repeat_interleave(50)
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))]
    old = _old_nested_order(labels, seed)
    sizes = [1, 9, 10, 11, 137, 250, 499, 500]
    for n, got in zip(sizes, nested_subsets(labels, sizes, seed=seed)):
        assert torch.equal(got, old[:n].sort().values)


def test_sample_images_shipped_with_scikit_learn():
    imgs = sample_images()
    assert [n for n, _ in imgs] == ["china", "flower"]
    assert imgs[0][1].shape == (427, 640, 3) and imgs[0][1].dtype == np.uint8


@needs_cifar10
def test_shared_cifar10_test_split():
    from vitlab.data.datasets import load_cifar

    d = load_cifar("cifar10", "test")
    assert d.images.shape == (10000, 32, 32, 3)
    assert torch.bincount(d.labels).tolist() == [1000] * 10
    assert d.classes[0] == "airplane" and d.classes[-1] == "truck"


def test_empty_class_folder_and_missing_split_are_errors(tmp_path):
    from vitlab.data.datasets import load_dataset

    root = make_folder(tmp_path / "d" / "train")
    (root / "c").mkdir()
    with pytest.raises(DataError, match=r"class folder\(s\) \['c'\].*hold no images"):
        load_image_folder(root, cache=False, progress=False)
    (root / "c").rmdir()
    assert len(load_dataset(str(tmp_path / "d"), "train")) == 6
    with pytest.raises(DataError, match="no 'test' split"):
        load_dataset(str(tmp_path / "d"), "test")
    with pytest.raises(DataError, match="not found"):
        load_dataset(str(tmp_path / "nowhere"))


def test_portable_source_never_names_a_machine_path(tmp_path, monkeypatch):
    from pathlib import Path

    import vitlab.data.datasets
    from vitlab.data.datasets import portable_source

    repo = Path(vitlab.data.datasets.__file__).resolve().parents[2]  # vitlab/data/datasets.py -> the checkout
    assert portable_source(repo / "data" / "checkpoints" / "vit_cifar10") == "data/checkpoints/vit_cifar10"
    monkeypatch.setattr(vitlab.data.datasets, "SHARED_CIFAR10", tmp_path / "shared" / "datasets" / "cifar10")
    assert portable_source(tmp_path / "shared/datasets/cifar10/test.zip") == "shared/datasets/cifar10/test.zip"
    other = tmp_path / "snapshot"  # another checkout (a git worktree: .git is a file there)
    (other / "vitlab").mkdir(parents=True)
    (other / "vitlab" / "__init__.py").write_text("")
    (other / ".git").write_text("gitdir: elsewhere\n")
    assert portable_source(other / "data" / "checkpoints" / "vit_cifar10") == "data/checkpoints/vit_cifar10"
    (tmp_path / "cwd" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert portable_source(tmp_path / "cwd" / "a" / "b.zip") == "a/b.zip"
    assert portable_source(tmp_path / "elsewhere" / "folder" / "name.zip") == ".../folder/name.zip"
    (tmp_path / "notrepo" / "vitlab").mkdir(parents=True)  # a folder named vitlab outside a repository: no checkout
    assert portable_source(tmp_path / "notrepo" / "vitlab" / "x") == ".../vitlab/x"


def test_a_zip_of_train_and_test_folders_gives_each_split_its_own_images(tmp_path, monkeypatch):
    """`data.zip` holding `train/cls/...` and `test/cls/...` (under a wrapper folder too): each split reads only its
    own folder, never both."""
    from vitlab.data.datasets import load_dataset

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    tr = make_folder(tmp_path / "src" / "train", n_per_class=3)
    te = make_folder(tmp_path / "src" / "test", n_per_class=2)
    for name, prefix in (("data.zip", ""), ("wrapped.zip", "cifar/")):
        with zipfile.ZipFile(tmp_path / name, "w") as zf:
            for p in sorted((tmp_path / "src").rglob("*.png")):
                zf.write(p, f"{prefix}{p.relative_to(tmp_path / 'src')}")
        train, test = load_dataset(str(tmp_path / name), "train"), load_dataset(str(tmp_path / name), "test")
        assert (len(train), len(test)) == (6, 4)
        assert torch.equal(train.images, load_image_folder(tr, cache=False, progress=False).images)
        assert torch.equal(test.images, load_image_folder(te, cache=False, progress=False).images)
        assert train.source.endswith("!train") and test.source.endswith("!test")
        with pytest.raises(DataError, match="no 'val' split"):
            load_dataset(str(tmp_path / name), "val")


def test_a_bare_class_folder_is_training_data_only(tmp_path):
    """Without split folders the same images would be the test set too: asking for a test split is an error."""
    from vitlab.data.datasets import load_dataset

    root = make_folder(tmp_path / "classes")
    with zipfile.ZipFile(tmp_path / "classes.zip", "w") as zf:
        for p in sorted(root.rglob("*.png")):
            zf.write(p, f"{p.parent.name}/{p.name}")
    for spec in (root, tmp_path / "classes.zip"):
        assert len(load_dataset(str(spec), "train")) == 6
        with pytest.raises(DataError, match="no 'test' split, and the same images cannot be their own test set"):
            load_dataset(str(spec), "test")


def test_splits_with_different_classes_are_refused(tmp_path):
    """Each split numbers its own sorted class folders: test 'frog' would get training's label of 'dog'."""
    from vitlab.data.datasets import check_same_classes, load_dataset

    make_folder(tmp_path / "d" / "train", classes=("cat", "dog", "frog"))
    make_folder(tmp_path / "d" / "test", classes=("cat", "frog"))
    train, test = load_dataset(str(tmp_path / "d"), "train"), load_dataset(str(tmp_path / "d"), "test")
    with pytest.raises(DataError, match=r"different classes \(train \['cat', 'dog', 'frog'\], test \['cat', 'frog'\]"):
        check_same_classes(train, test, "d")
    check_same_classes(train, train, "d")


def test_a_cifar_root_that_holds_nothing_is_an_error_not_the_shared_copy(tmp_path):
    """`cifar10:ROOT` with a mistyped or empty ROOT fails naming it; it never falls back to the shared zips."""
    from vitlab.data.datasets import load_dataset

    with pytest.raises(DataError, match=f"{tmp_path / 'nowhere'} does not exist"):  # no download, online or not
        load_dataset(f"cifar10:{tmp_path / 'nowhere'}", "test")
    assert not (tmp_path / "nowhere").exists()


def test_quiet_loads_decode_without_a_progress_bar(two_class_folder, tmp_path, monkeypatch, capsys):
    """`--quiet` reaches the first decode of a data set (it printed a bar for every split before)."""
    from vitlab.cli import main
    from vitlab.data.datasets import load_splits

    for progress, shown in [(False, False), (True, True)]:
        monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / f"cache{progress}"))  # a fresh decode each time
        load_splits(str(two_class_folder), progress=progress)
        assert ("decoding" in capsys.readouterr().err) is shown
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache_cli"))
    assert main(["train", "--preset", "tiny", "--data", str(two_class_folder), "--run-dir", str(tmp_path / "run"),
                 "--epochs", "1", "--set", "warmup_epochs=0", "--quiet"]) == 0
    assert "decoding" not in capsys.readouterr().err


def test_the_docs_list_the_image_suffixes_the_loaders_read():
    """The data page's list of image file types (docs/data.md) is the loaders' own (``IMAGE_SUFFIXES``), so it
    cannot fall behind."""
    import re
    from pathlib import Path

    from vitlab.data.datasets import IMAGE_SUFFIXES

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    listed = re.search(r"Image files are\s+(.*?)\s+in any case", text, re.S).group(1)
    assert tuple(re.findall(r"`(\.\w+)`", listed)) == IMAGE_SUFFIXES


def test_files_that_are_not_files_are_skipped_with_a_warning(tmp_path, monkeypatch):
    """A self-referencing link (x.png -> x.png) stopped training data, capture and reproduce with 'Too many levels
    of symbolic links' even with --skip-bad, and a FIFO named *.png hung the load forever: the walk stats every
    entry (never opens one) and leaves out, with a SkippedPathWarning naming it, whatever is no regular file or
    folder, and a link back to a folder it is inside."""
    import os
    import warnings

    from vitlab.data.datasets import SkippedPathWarning, image_files

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "train", n_per_class=2)
    (root / "a" / "x.png").symlink_to("x.png")  # a loop of one link
    os.mkfifo(root / "b" / "f.png")  # opening it would wait for a writer forever
    (root / "b" / "up").symlink_to(root, target_is_directory=True)  # a folder loop
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = image_files(root)
        data = load_image_folder(root, cache=False, progress=False)
    assert [p.relative_to(root).as_posix() for p in files] == ["a/0.png", "a/1.png", "b/0.png", "b/1.png"]
    assert data.labels.tolist() == [0, 0, 1, 1]
    seen = {(Path(w.message.path).relative_to(root).as_posix(), w.message.reason)
            for w in caught if isinstance(w.message, SkippedPathWarning)}
    assert seen == {("a/x.png", "unreadable"), ("b/f.png", "not a regular file"), ("b/up", "folder loop")}


def test_a_dataset_path_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """`vitlab train --data d.zip` with d.zip a FIFO waited forever in zipfile.is_zipfile for a writer; it is now a
    DataError naming it. (The load runs in a thread so that the old behaviour fails the test instead of hanging it.)"""
    import os
    import threading

    from vitlab.data.datasets import load_dataset

    fifo = tmp_path / "d.zip"
    os.mkfifo(fifo)
    outcome = []

    def load():
        try:
            load_dataset(str(fifo), progress=False)
        except Exception as e:
            outcome.append(e)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # release the reader it waits on, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=10)
        pytest.fail("load_dataset waited on the FIFO")
    assert len(outcome) == 1 and isinstance(outcome[0], DataError) and "neither a folder nor a regular file" in str(
        outcome[0])
