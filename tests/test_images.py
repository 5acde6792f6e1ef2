"""Analysis images: the shipped 128-image CIFAR-10 sample and the choice of default images by input size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import needs_cifar10

import vitlab
from vitlab.base.errors import Setting
from vitlab.data.datasets import load_dataset
from vitlab.data.images import CIFAR_SAMPLE, cifar_test_sample, default_images, model_transform

CHECKPOINTS = Path(__file__).resolve().parent.parent / "data" / "checkpoints"


def test_cifar_sample_is_class_balanced_interleaved_and_small():
    data = cifar_test_sample()
    assert data.images.shape == (128, 32, 32, 3) and data.images.dtype == torch.uint8
    counts = torch.bincount(data.labels, minlength=10).tolist()
    assert sorted(counts) == [12, 12] + [13] * 8
    assert data.labels[:10].tolist() == list(range(10))  # any first n is balanced
    assert CIFAR_SAMPLE.stat().st_size < 500_000


@needs_cifar10
def test_cifar_sample_equals_the_test_split_at_its_index():
    test = load_dataset("cifar10", "test")
    with np.load(CIFAR_SAMPLE) as z:
        index = torch.from_numpy(z["index"])
    sample = cifar_test_sample()
    assert torch.equal(test.images[index], sample.images) and torch.equal(test.labels[index], sample.labels)
    assert len(set(index.tolist())) == 128


def test_default_images_follow_the_input_size():
    small = vitlab.load_model()  # 32 px
    names, x, shown = default_images(small, 12)
    assert names[:2] == ["airplane #0", "automobile #1"] and x.shape == (12, 3, 32, 32)
    tf, _ = model_transform(small)
    from PIL import Image

    torch.testing.assert_close(x[3], tf(Image.fromarray(cifar_test_sample().images[3].numpy())))
    assert len(default_images(small)[0]) == 128
    big = vitlab.load_model(vitlab.vit_config("Ti/16", img_size=64, num_classes=0))
    names, x, _ = default_images(big, 4)
    assert x.shape == (4, 3, 64, 64) and not names[0].startswith("airplane")


def test_a_shapes_checkpoint_is_shown_test_shapes_not_cifar():
    """The shipped shapes ViT classifies shapes: by default it is shown their test draw (seed 1) with its class names,
    and it classifies them about as its card says (90.95% on the 2,000 test shapes)."""
    from vitlab.data.datasets import load_shapes
    from vitlab.data.images import default_image_count, default_labels, default_source, head_class_names
    from vitlab.data.shapes import SHAPE_CLASSES

    m = vitlab.load_model(str(CHECKPOINTS / "vit_shapes")).eval()
    names, x, shown = default_images(m)
    labels, classes = default_labels(m, len(names))
    test = load_shapes("test", n=128)
    assert len(names) == default_image_count(m) == 128 and classes == head_class_names(m) == SHAPE_CLASSES
    assert names[0] == f"{SHAPE_CLASSES[int(test.labels[0])]} #0" and torch.equal(labels, test.labels)
    assert np.array_equal(shown[5], test.images[5].numpy()) and "shapes" in default_source(m)
    with torch.no_grad():
        acc = float((m(x).argmax(-1) == labels).float().mean())
    assert acc > 0.85  # on CIFAR-10 images a 4-class shapes model scores nothing meaningful


def test_too_small_and_broken_images_are_refused_or_skipped(tmp_path):
    from PIL import Image

    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    Image.new("RGB", (1, 1), "red").save(tmp_path / "tiny.png")
    Image.new("RGB", (40, 40), "blue").save(tmp_path / "ok.png")
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    model = vitlab.load_model()  # 4 px patches
    with pytest.raises(DataError, match=r"tiny.png: 1x1 px is smaller than one 4x4 px patch") as e:
        load_images(model, tmp_path)
    assert "broken.jpg: unreadable" in e.value.problem and e.value.param == "folder"
    assert Setting("skip_bad", True) in e.value.fix and "--skip-bad" not in str(e.value)  # no flag for Python
    with pytest.warns(UserWarning, match="broken.jpg"):
        names, x, shown = load_images(model, tmp_path, skip_bad=True)
    assert names == ["ok"] and x.shape == (1, 3, 32, 32)


def test_a_file_given_as_the_images_folder_is_refused_in_python_words(tmp_path):
    """load_images(model, a_file) said "--images FILE is not a folder", a flag the Python caller never passed."""
    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(DataError) as e:
        load_images(vitlab.load_model(), tmp_path / "a.png")
    assert (e.value.param, e.value.value, e.value.allowed) == ("folder", str(tmp_path / "a.png"), "a folder of images")
    assert "--images" not in str(e.value)


def test_macos_metadata_and_hidden_files_in_an_images_folder_are_no_images(tmp_path):
    """A folder unzipped from a macOS zip holds __MACOSX/._x.png resource forks and ._x.png files beside the images:
    as for training data they are no images, never 'bad images' that stop the analysis (or warnings with
    --skip-bad)."""
    import warnings

    from PIL import Image

    from vitlab.data.images import load_images

    Image.new("RGB", (40, 40), "blue").save(tmp_path / "x.png")
    fork = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        "  # an AppleDouble header: no image
    (tmp_path / "._x.png").write_bytes(fork)
    (tmp_path / "__MACOSX").mkdir()
    (tmp_path / "__MACOSX" / "._x.png").write_bytes(fork)
    (tmp_path / ".thumbs").mkdir()
    (tmp_path / ".thumbs" / "x.jpg").write_bytes(b"not a jpeg")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names, x, _ = load_images(vitlab.load_model(), tmp_path)
    assert names == ["x"] and x.shape == (1, 3, 32, 32)


def test_damaged_files_pillow_reports_as_value_or_syntax_errors_are_named_bad_images(tmp_path):
    """A damaged PNG can make Pillow raise ValueError or SyntaxError, not OSError: it was a traceback that named no
    file, and --skip-bad did not skip it."""
    from _reference import damaged_pngs
    from PIL import Image

    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    for name, blob in damaged_pngs().items():
        (tmp_path / name).write_bytes(blob)
    Image.new("RGB", (40, 40), "blue").save(tmp_path / "ok.png")
    model = vitlab.load_model()
    with pytest.raises(DataError, match=r"(?s)chunk.png: unreadable \(SyntaxError.*ihdr.png: unreadable \(ValueError"):
        load_images(model, tmp_path)
    with pytest.warns(UserWarning, match=r"(?s)skipped bad images.*chunk.png.*ihdr.png"):
        names, _, _ = load_images(model, tmp_path, skip_bad=True)
    assert names == ["ok"]


def test_images_of_the_same_name_in_sub_folders_or_formats_keep_apart(tmp_path):
    """cat/001.jpg and dog/001.jpg (or pic.bmp and pic.webp) were both named by their stem alone: a report's rows and
    a capture's image list could not say which file each was."""
    from PIL import Image

    from vitlab.data.images import load_images

    for rel in ("cat/001.jpg", "dog/001.jpg", "dog/2019/001.png", "pic.bmp", "pic.webp", "solo.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 40), "blue").save(tmp_path / rel)
    names, _, _ = load_images(vitlab.load_model(), tmp_path)
    assert names == ["cat/001", "dog/001", "dog/2019/001", "pic.bmp", "pic.webp", "solo"]


def test_a_linked_folder_of_images_is_read(tmp_path):
    """--images mine/ holding photos -> /elsewhere/photos read no image below the link ('no images in mine')."""
    from PIL import Image

    from vitlab.data.images import load_images

    (tmp_path / "elsewhere").mkdir()
    Image.new("RGB", (40, 40), "blue").save(tmp_path / "elsewhere" / "x.png")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photos").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "mine" / "photos" / "loop").symlink_to(tmp_path / "mine", target_is_directory=True)  # not entered
    names, _, _ = load_images(vitlab.load_model(), tmp_path / "mine")
    assert names == ["photos/x"]


@pytest.mark.filterwarnings("ignore:skipped bad images")
def test_a_limit_with_skip_bad_counts_usable_images(tmp_path):
    """With skip_bad, ``limit`` counts the images used, not the files read: 2 bad files among the first 4 make it
    read 6 files for 4 images (it gave 2), the warnings count both; too few usable ones are said; without skip_bad
    a bad file among the first ``limit`` is still an error and one after them is never read."""
    import warnings

    from PIL import Image

    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    for i in range(8):
        Image.new("RGB", (40, 40), (30 * i, 0, 0)).save(tmp_path / f"{i}.png")
    for i in (1, 2):
        (tmp_path / f"{i}.png").write_bytes(b"not a png")
    model = vitlab.load_model()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        names, x, _ = load_images(model, tmp_path, limit=4, skip_bad=True)
    assert names == ["0", "3", "4", "5"] and x.shape == (4, 3, 32, 32)
    text = [str(m.message) for m in w]
    assert any("using the first 4 usable of the 8 images" in t and ": 2 left out" in t for t in text)
    assert any(t.startswith("skipped bad images") and "1.png" in t and "2.png" in t for t in text)
    with pytest.warns(UserWarning, match="only 6 usable images in .*, fewer than the 7 asked for"):
        names, _, _ = load_images(model, tmp_path, limit=7, skip_bad=True)
    assert len(names) == 6
    with pytest.raises(DataError, match="1.png: unreadable"):
        load_images(model, tmp_path, limit=2)
    with pytest.warns(UserWarning, match="using the first 1 of the 8 images"):
        assert load_images(model, tmp_path, limit=1)[0] == ["0"]


def test_a_photo_is_shown_upright_as_its_exif_orientation_says(tmp_path):
    """A phone stores a portrait shot landscape with an EXIF orientation tag: it was analysed lying on its side."""
    from _reference import turned_photo

    from vitlab.data.images import load_images

    turned_photo(tmp_path / "portrait.jpg")
    _, _, shown = load_images(vitlab.load_model(), tmp_path)  # 32 px: the upright 32 x 64 resized, centre-cropped
    red = shown[0][..., 0].astype(int) - shown[0][..., 1]  # (32, 32): red minus green, about 255 on red
    assert red[:12].min() > 200 and red[-12:].max() < 50  # top red, bottom black; lying, it was left and right


def test_the_view_is_the_pixels_the_model_sees(tmp_path):
    """timm's eval transform resizes and centre-crops (crop_pct 0.875 here): the view a map is drawn over must be
    those pixels, equal to un-normalising the model's input, not the whole image squashed to the input size."""
    import timm
    from PIL import Image

    from vitlab.data.images import load_images

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, depth=1)
    model.pretrained_cfg = {**model.pretrained_cfg, "crop_pct": 0.875}
    img = np.zeros((224, 448, 3), np.uint8)
    img[:, :200] = (255, 0, 0)  # red in the left 200 columns of a 2:1 photo
    Image.fromarray(img).save(tmp_path / "wide.png")
    _, x, shown = load_images(model, tmp_path)
    _, cfg = model_transform(model)
    mean, std = torch.tensor(cfg["mean"]).view(3, 1, 1), torch.tensor(cfg["std"]).view(3, 1, 1)
    seen = ((x[0] * std + mean) * 255).round().clamp(0, 255).byte().permute(1, 2, 0).numpy()
    assert shown[0].shape == seen.shape == (224, 224, 3)
    assert np.abs(shown[0].astype(int) - seen.astype(int)).max() <= 1  # the same pixels, up to rounding
    squashed = np.asarray(Image.fromarray(img).resize((224, 224), Image.Resampling.BICUBIC))
    red = lambda a: (a[..., 0] > 128).mean()  # noqa: E731
    assert abs(red(shown[0]) - red(seen)) < 0.01 and abs(red(squashed) - red(seen)) > 0.05


def test_a_decompression_bomb_is_a_named_bad_image(tmp_path, monkeypatch):
    from PIL import Image

    from vitlab.data.datasets import DataError
    from vitlab.data.images import load_images

    Image.new("RGB", (64, 64), "blue").save(tmp_path / "huge.png")
    Image.new("RGB", (40, 40), "blue").save(tmp_path / "ok.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1700)  # 64 x 64 is over twice this (refused); 40 x 40 under it
    with pytest.raises(DataError, match=r"huge.png: unreadable \(DecompressionBombError") as e:
        load_images(vitlab.load_model(), tmp_path)
    assert "Resize it below 3400 pixels or, if you trust the file, raise PIL.Image.MAX_IMAGE_PIXELS" in str(e.value)
    with pytest.warns(UserWarning, match="huge.png"):
        names, _, _ = load_images(vitlab.load_model(), tmp_path, skip_bad=True)
    assert names == ["ok"]


def test_images_come_at_the_input_size_the_model_is_built_for():
    """A timm name built at another img_size keeps the name's 224 px pretrained_cfg; the images follow the model."""
    import vitlab
    from vitlab.data.images import default_images

    m = vitlab.load_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)
    names, x, shown = default_images(m, 2)
    assert x.shape == (2, 3, 64, 64) and shown[0].shape == (64, 64, 3)
    assert m(x).shape == (2, 1000)


def test_a_limit_that_is_no_whole_number_is_refused_by_name(tmp_path):
    """load_images(model, folder, limit=True) read 1 image (a bool is an int to Python) and limit=2.5 failed in a
    list slice ("slice indices must be integers"); both are refused by name before any file is read."""
    from conftest import tiny_vit
    from PIL import Image

    from vitlab.data.images import load_images

    Image.new("RGB", (40, 40)).save(tmp_path / "a.png")
    for limit in (True, 2.5, 0):
        for folder in (tmp_path, None):
            with pytest.raises(ValueError, match=f"limit must be a whole number of at least 1 image .*got {limit!r}"):
                load_images(tiny_vit(), folder, limit=limit)
    assert load_images(tiny_vit(), tmp_path, limit=np.int64(1))[1].shape[0] == 1


def test_a_default_image_count_that_is_no_whole_number_is_refused_by_name():
    """default_images(model, True) gave 1 image (a bool is an int to Python) and n=2.5 failed in range() or a list
    slice, naming no argument; for the shipped CIFAR-10 sample and for the photo crops alike they are refused by
    name."""
    from conftest import tiny_vit

    from vitlab.data.images import default_images, embedded_images

    photos = vitlab.load_model("vit_tiny_patch16_224", pretrained=False, depth=1)
    for n in (True, 2.5):
        with pytest.raises(ValueError, match=rf"n must be in \[1, 128\], got {n!r}"):
            default_images(tiny_vit(), n)
        with pytest.raises(ValueError, match=rf"n must be in \[1, 38\], got {n!r}"):
            embedded_images(photos, n)
