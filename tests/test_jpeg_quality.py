"""benchmarks/jpeg_quality.py: quality detection, re-encoding (atomic, names kept), and the table it reports."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from PIL import Image

from benchmarks.jpeg_quality import final_accuracy, format_table, jpeg_quality, main, reencode_zip


def _jpeg(seed: int, quality: int) -> bytes:
    rng = np.random.default_rng(seed)
    smooth = np.cumsum(np.cumsum(rng.normal(size=(32, 32, 3)), 0), 1)  # a smooth picture, as photos are
    arr = ((smooth - smooth.min()) / np.ptp(smooth) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)


@pytest.mark.parametrize("quality", [10, 50, 75, 95])
def test_quality_is_read_back_from_the_tables(quality):
    assert jpeg_quality(_jpeg(0, quality)) == quality


def test_reencode_keeps_names_lowers_quality_and_leaves_other_members_out(tmp_path):
    src, dst = tmp_path / "test.zip", tmp_path / "q50" / "test.zip"
    with zipfile.ZipFile(src, "w") as z:
        for i in range(3):
            z.writestr(f"test/cat/{i:04d}.jpg", _jpeg(i, 95))
        z.writestr("README.txt", "not an image")
    stats = reencode_zip(src, dst, 50)
    assert stats["images"] == 3 and stats["mean_bytes_after"] < stats["mean_bytes_before"]
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
        assert b.namelist() == [f"test/cat/{i:04d}.jpg" for i in range(3)]
        for name in b.namelist():
            assert b.getinfo(name).compress_type == zipfile.ZIP_STORED
            assert jpeg_quality(b.read(name)) == 50
            diff = np.abs(_pixels(a.read(name)) - _pixels(b.read(name)))
            assert 0 < diff.mean() < 8  # the same picture, compressed further


def test_a_failed_reencode_leaves_no_file(tmp_path):
    src, dst = tmp_path / "train.zip", tmp_path / "q50" / "train.zip"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("train/cat/0000.jpg", _jpeg(0, 95))
        z.writestr("train/cat/0001.jpg", b"not a jpeg")
    with pytest.raises(OSError, match="cannot identify image file"):  # PIL's UnidentifiedImageError
        reencode_zip(src, dst, 50)
    assert not dst.exists() and list(dst.parent.iterdir()) == []


def _run(folder, epochs_done, epochs=3):
    folder.mkdir()
    (folder / "train_config.json").write_text(json.dumps({"epochs": epochs}))
    lines = [{"epoch": e, "epoch_seconds": 1800.0} for e in range(1, epochs_done + 1)]
    lines[-1].update(test_accuracy=0.9, test_accuracy_tta=0.91, eval_seconds=1800.0)
    if epochs_done > 1:
        lines[0].update(test_accuracy=0.5)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_final_accuracy_and_the_table(tmp_path):
    done = final_accuracy(_run(tmp_path / "a", 3))
    assert done == {"epochs": 3, "test_accuracy": 0.9, "test_accuracy_tta": 0.91, "hours": 2.0}
    with pytest.raises(ValueError, match="has not finished .2 of 3 epochs.: resume it first"):
        final_accuracy(_run(tmp_path / "b", 2))
    rows = [{"quality": 75, "source": "shared", "mean_bytes": 921, "test_accuracy": 0.9, "test_accuracy_tta": 0.91},
            {"quality": 50, "source": "re-encoded", "mean_bytes": 852, "test_accuracy": 0.885,
             "test_accuracy_tta": None}]
    table = format_table({"rows": rows}).splitlines()
    assert table[2] == "| 75 | shared | 921 | 90.00% | 91.00% | +0.00 points |"
    assert table[3] == "| 50 | re-encoded | 852 | 88.50% | - | -1.50 points |"


def test_refuses_a_folder_without_the_splits_and_bad_qualities(tmp_path, capsys):
    assert main(["--data", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    assert "has no train.zip and test.zip" in capsys.readouterr().err
    for split in ("train", "test"):
        (tmp_path / f"{split}.zip").write_bytes(b"")
    for qualities, says in ((["0", "100"], "JPEG qualities are 1-99 here (100 has no quantisation step to double), "
                                           "got [0, 100]"),
                            (["50", "50"], "names a quality twice: [50, 50]")):
        assert main(["--data", str(tmp_path), "--qualities", *qualities, "--out", str(tmp_path / "r.json")]) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_refuses_the_shared_files_own_quality_before_training(tmp_path, capsys):
    """Re-encoding at the shared files' quality would be a second row at step 1 (and used to reuse their run)."""
    for split in ("train", "test"):
        with zipfile.ZipFile(tmp_path / f"{split}.zip", "w") as z:
            z.writestr("airplane/0.jpg", _jpeg(0, 75))
    assert main(["--data", str(tmp_path), "--qualities", "75", "50", "--out", str(tmp_path / "r.json")]) == 2
    assert "the shared files are quality 75 already" in capsys.readouterr().err
    with pytest.raises(ValueError, match="distinct and positive"):
        from benchmarks.jpeg_quality import drops_per_doubling

        drops_per_doubling([1.0, 1.0], [0.9, 0.9])


def test_steps_double_per_quality_step_and_the_drops_per_doubling():
    from benchmarks.jpeg_quality import _scale, drops_per_doubling

    assert [_scale(q) / _scale(75) for q in (75, 50, 25)] == [1.0, 2.0, 4.0]  # libjpeg's quality scaling
    assert _scale(90) / _scale(75) == pytest.approx(0.4)
    drops = drops_per_doubling([2.0, 1.0, 4.0], [0.88, 0.90, 0.85])  # unordered rows; one doubling each
    assert drops == pytest.approx([0.02, 0.03])
    assert drops_per_doubling([1.0, 4.0], [0.90, 0.86]) == pytest.approx([0.02])  # two doublings at once


def test_the_figure_labels_each_point_with_its_own_quality_when_a_run_has_no_tta():
    """Each trace's hover names were taken from every row while its points skip rows without that accuracy: a run
    without TTA shifted the TTA curve's labels (quality 25's point read "quality 50")."""
    from benchmarks.jpeg_quality import figure

    rows = [{"quality": 75, "step": 1.0, "test_accuracy": 0.9, "test_accuracy_tta": 0.91},
            {"quality": 50, "step": 2.0, "test_accuracy": 0.88, "test_accuracy_tta": None},
            {"quality": 25, "step": 4.0, "test_accuracy": 0.85, "test_accuracy_tta": 0.86}]
    plain, tta = figure({"preset": "p", "shared_quality": 75, "rows": rows}).data
    assert list(plain.x) == [1.0, 2.0, 4.0] and list(plain.text) == ["quality 75", "quality 50", "quality 25"]
    assert list(tta.x) == [1.0, 4.0] and list(tta.y) == pytest.approx([91.0, 86.0])
    assert list(tta.text) == ["quality 75", "quality 25"]
