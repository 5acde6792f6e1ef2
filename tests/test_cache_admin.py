"""``vitlab cache``: listing and pruning the decoded-image and feature caches, in a throw-away cache root."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from _reference import make_folder
from conftest import tiny_vit

from vitlab.cli import main
from vitlab.data.cache import TEMP_GRACE_S, prune_cache, scan_cache
from vitlab.data.datasets import ImageArray, load_image_folder
from vitlab.probe.features import extract_features

DAY = 86400.0
IMAGES = "images-0123abcd-0123456789abcdef.npz"
OLD_IMAGES = "images-fedcba9876543210.npz"  # named as before sources were part of the name
FEATURES = "0123456789abcdef0123456789abcdef.safetensors"
PATCH = "0123456789abcdef0123456789abcdef-patch_mean-v2.safetensors"


def _file(path, size: int, age_days: float, now: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (now - age_days * DAY, now - age_days * DAY))
    return path


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A cache root with two image entries, two feature entries, a writer's temporary file, a run and a result."""
    r = tmp_path / "cache"
    monkeypatch.setenv("VITLAB_CACHE", str(r))
    now = time.time()
    _file(r / IMAGES, 1000, 1, now)
    _file(r / OLD_IMAGES, 3000, 40, now)
    _file(r / "features" / FEATURES, 200, 10, now)
    _file(r / "features" / PATCH, 100, 0.5, now)
    _file(r / "runs" / "vit_cifar10" / "checkpoint.safetensors", 5000, 90, now)
    _file(r / "results" / "mpp_smoke.jsonl", 7, 90, now)
    _file(r / "notes.npz", 11, 90, now)  # not a name either cache gives: never listed or removed
    _file(r / "features" / "mine.safetensors", 13, 90, now)
    return r


def _names(entries) -> list[str]:
    return sorted(e.path.name for e in entries)


def test_the_listing_names_each_cache_entry_with_its_kind_and_size(root):
    scan = scan_cache()
    assert scan.root == root and scan.exists
    assert [(e.kind, e.path.name, e.size) for e in scan.entries] == [
        ("images", OLD_IMAGES, 3000), ("images", IMAGES, 1000),  # by kind, least recently used first
        ("features", FEATURES, 200), ("features", PATCH, 100)]
    assert scan.size("images") == 4000 and scan.size("features") == 300 and scan.size() == 4300
    assert scan.runs_size == 5000 and scan.other_size == 7 + 11 + 13
    assert abs(time.time() - scan.entries[0].last_used - 40 * DAY) < 60


def test_a_missing_cache_root_lists_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "never"))
    scan = scan_cache()
    assert not scan.exists and scan.entries == () and scan.size() == 0
    assert main(["cache"]) == 0
    assert "nothing cached yet" in capsys.readouterr().out
    assert not (tmp_path / "never").exists()
    assert prune_cache(everything=True).removed == ()


def test_a_cache_root_that_is_a_file_is_a_clear_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "afile"))
    assert main(["cache"]) == 1
    assert "is a file, not a folder: set VITLAB_CACHE to a folder" in capsys.readouterr().err


def test_prune_by_age_removes_exactly_the_entries_unused_that_long(root):
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = prune_cache(older_than_days=5)
    assert _names(result.removed) == sorted([OLD_IMAGES, FEATURES]) and result.freed == 3200
    gone = {root / OLD_IMAGES, root / "features" / FEATURES}
    assert sorted(p for p in root.rglob("*") if p.is_file()) == sorted(set(before) - gone)
    assert all(p.read_bytes() == b for p, b in before.items() if p not in gone)  # runs, results, others intact


def test_prune_keeps_the_kind_not_named(root):
    result = prune_cache(older_than_days=5, kinds=("features",))
    assert _names(result.removed) == [FEATURES]
    assert (root / OLD_IMAGES).is_file()


def test_a_dry_run_removes_nothing(root, capsys):
    before = sorted(root.rglob("*"))
    result = prune_cache(everything=True, dry_run=True)
    assert _names(result.removed) == sorted([IMAGES, OLD_IMAGES, FEATURES, PATCH])
    assert sorted(root.rglob("*")) == before
    assert main(["cache", "prune", "--all", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 4 files, 4.3 kB" in out and "nothing removed (--dry-run)" in out
    assert sorted(root.rglob("*")) == before


def test_a_writers_temporary_file_is_kept_for_an_hour(root):
    """atomic_write fills ``.NAME.RANDOM.tmp`` beside the entry before its rename: one younger than an hour may be
    being written; an older one is a killed writer's leftover and goes."""
    now = time.time()
    fresh = _file(root / f".{IMAGES}.k2j_x9.tmp", 50, 0, now)
    os.utime(fresh, (now - TEMP_GRACE_S / 2, now - TEMP_GRACE_S / 2))
    stale = _file(root / "features" / f".{FEATURES}.a1b2c3.tmp", 60, 2, now)
    future = _file(root / "features" / PATCH, 100, -3, now)  # a clock set back since it was written
    result = prune_cache(everything=True)
    assert not future.exists()
    assert _names(result.busy) == [fresh.name] and fresh.is_file()
    assert stale.name in _names(result.removed) and not stale.exists()


def test_runs_and_other_files_are_never_pruned(root):
    prune_cache(older_than_days=0)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "features/mine.safetensors", "notes.npz", "results/mpp_smoke.jsonl", "runs/vit_cifar10/checkpoint.safetensors"]


def test_prune_says_which_entries(root):
    with pytest.raises(ValueError, match=r"older_than_days=DAYS .* or everything=True$"):
        prune_cache()
    with pytest.raises(ValueError, match="not both"):
        prune_cache(3, everything=True)
    with pytest.raises(ValueError, match="0 or more"):
        prune_cache(-1)
    with pytest.raises(ValueError, match="kinds must be among"):
        prune_cache(3, ("runs",))
    assert len(list(root.rglob("*.npz"))) == 3


def test_prune_refuses_an_age_or_kinds_of_the_wrong_type_and_removes_nothing(root):
    """prune_cache(True) removed what was unused for a day (a bool is an int to Python), prune_cache("3") failed in a
    comparison naming no argument, and kinds="images" was read as its letters; each is refused by name."""
    for days in (True, "3", float("nan")):
        with pytest.raises(ValueError, match=rf"older_than_days must be a number of days, 0 or more, got {days!r}"):
            prune_cache(days)
    with pytest.raises(ValueError, match=r"kinds must be a tuple of cache kinds, got the text 'images': pass "
                                         r"\('images',\)"):
        prune_cache(3, "images")
    assert len(list(root.rglob("*.npz"))) == 3 and len(list(root.rglob("*.safetensors"))) == 4


def test_the_command_lists_and_prunes(root, capsys):
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"cache root: {root}" in out and IMAGES in out and f"features/{PATCH}" in out
    assert "images: 2 files, 4.0 kB; features: 2 files, 300 B; total 4.3 kB" in out
    assert "runs/ (training runs: not a cache, never pruned): 5.0 kB" in out
    assert "notes.npz" not in out and "mine.safetensors" not in out
    assert main(["cache", "prune", "--older-than", "5", "--kind", "images"]) == 0
    assert "removed 1 file, 3.0 kB" in capsys.readouterr().out
    assert not (root / OLD_IMAGES).exists() and (root / "features" / FEATURES).exists()
    for bad in (["cache", "prune"], ["cache", "prune", "--older-than", "-1"], ["cache", "prune", "--older-than", "2",
                                                                                 "--all"]):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2
    assert (root / "features" / FEATURES).exists()
    assert "(vitlab cache prune --all frees it)" in out  # no writer's file: --all frees every byte listed
    _file(root / f".{IMAGES}.a1b2c3.tmp", 10, 0, time.time())  # a writer's file: --all keeps it
    assert main(["cache"]) == 0
    assert "(vitlab cache prune --all frees it, but for 1 file a writer may still be filling)" in capsys.readouterr().out


def _age(path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path, (t, t))


def test_a_decode_cache_hit_refreshes_the_entry_and_a_read_only_one_still_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    folder = make_folder(tmp_path / "train")
    first = load_image_folder(folder, progress=False)
    (hit,) = (tmp_path / "cache").glob("images-*.npz")
    _age(hit, 30)
    assert torch.equal(load_image_folder(folder, progress=False).images, first.images)
    assert time.time() - hit.stat().st_mtime < 60
    assert prune_cache(older_than_days=1).removed == ()

    _age(hit, 30)
    monkeypatch.setattr(os, "utime", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Read-only")))
    assert torch.equal(load_image_folder(folder, progress=False).images, first.images)
    assert time.time() - hit.stat().st_mtime > 29 * DAY


def test_a_feature_cache_hit_refreshes_the_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    rng = np.random.default_rng(0)
    data = ImageArray(torch.from_numpy(rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)), torch.arange(4) % 2,
                      ("a", "b"), "test")
    model = tiny_vit()
    feats = extract_features(model, data)
    (entry,) = (tmp_path / "features").glob("*.safetensors")
    (listed,) = scan_cache().entries
    assert listed.path == entry and listed.detail == "model, test, n=4"
    _age(entry, 30)
    assert torch.equal(extract_features(model, data), feats)
    assert time.time() - entry.stat().st_mtime < 60


def test_an_entry_that_cannot_be_removed_is_named_and_the_rest_go(root, monkeypatch, capsys):
    unlink = os.unlink

    def refuse(path, *a, **k):
        if str(path).endswith(OLD_IMAGES):
            raise PermissionError(13, "Permission denied", str(path))
        return unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", refuse)
    assert main(["cache", "prune", "--older-than", "5"]) == 1
    captured = capsys.readouterr()
    assert "removed 1 file, 200 B" in captured.out and FEATURES in captured.out
    assert f"could not remove {root / OLD_IMAGES}: Permission denied; check the cache folder's permissions" in captured.err
    assert (root / OLD_IMAGES).is_file() and not (root / "features" / FEATURES).exists()


def test_cache_sizes_never_print_1000_of_a_unit():
    """vitlab cache printed 999,950 bytes as '1000.0 kB' (and 999.96 MB as '1000.0 MB'), where du --si says 1.0M: a
    size rounds up into the next unit now, and one under 1000 bytes stays in bytes."""
    from vitlab.cli.cache import _size_words

    assert [_size_words(n) for n in (999, 1000, 999_949, 999_950, 999_960_000, 154_001_156)] == [
        "999 B", "1.0 kB", "999.9 kB", "1.0 MB", "1.0 GB", "154.0 MB"]


def test_the_temporary_file_grace_is_an_hour_not_less(root):
    """A writer's temporary file 50 minutes old is kept (it may still be filling), one 70 minutes old goes."""
    now = time.time()
    young = _file(root / f".{IMAGES}.q1w2e3.tmp", 50, 50 / 1440, now)
    old = _file(root / f".{OLD_IMAGES}.r4t5y6.tmp", 60, 70 / 1440, now)
    result = prune_cache(everything=True, now=now)
    assert _names(result.busy) == [young.name] and young.is_file()
    assert old.name in _names(result.removed) and not old.exists()


def test_an_entry_used_between_the_scan_and_its_removal_is_kept(root, monkeypatch):
    """A decode that reads OLD_IMAGES after prune's scan refreshes it: prune re-reads its time and keeps it."""
    from vitlab.data import cache as cache_admin

    scan = cache_admin.scan_cache

    def scan_then_use(*a, **k):
        found = scan(*a, **k)
        os.utime(root / OLD_IMAGES)  # a cache hit meanwhile (vitlab.data.datasets.touch_cache)
        return found

    monkeypatch.setattr(cache_admin, "scan_cache", scan_then_use)
    result = prune_cache(older_than_days=5)
    assert _names(result.removed) == [FEATURES]
    assert (root / OLD_IMAGES).is_file() and not (root / "features" / FEATURES).exists()


def test_a_file_named_almost_as_a_cache_entry_is_never_listed_or_removed(root):
    """Only images-[SOURCE-]KEY.npz with hex keys is a decode entry: a user's images-mine.npz stays."""
    mine = _file(root / "images-mine.npz", 17, 90, time.time())
    assert mine.name not in _names(scan_cache().entries)
    prune_cache(everything=True)
    assert mine.is_file()


def test_no_kinds_is_refused_not_a_prune_of_nothing(root):
    with pytest.raises(ValueError, match=r"kinds must be among .*got \[\]"):
        prune_cache(3, ())


def test_an_images_entry_detail_is_count_then_height_by_width(root):
    """The detail is read from the npz header: 2 images 4 high and 6 wide are '2 images 4x6'."""
    np.savez(root / IMAGES, images=np.zeros((2, 4, 6, 3), np.uint8), labels=np.zeros(2, np.int64))
    (entry,) = [e for e in scan_cache().entries if e.path.name == IMAGES]
    assert entry.detail == "2 images 4x6"


def test_prune_never_follows_a_features_link_out_of_the_cache(tmp_path, monkeypatch):
    """`vitlab cache prune --all` followed a features/ link and deleted cache-named files in the folder it points
    to, outside the cache; a linked features/ is now skipped with a SkippedPathWarning naming it, and its files
    stay."""
    from vitlab.data.datasets import SkippedPathWarning

    r = tmp_path / "cache"
    monkeypatch.setenv("VITLAB_CACHE", str(r))
    now = time.time()
    _file(r / IMAGES, 1000, 1, now)
    outside = _file(tmp_path / "project" / FEATURES, 200, 10, now).parent
    (r / "features").symlink_to(outside, target_is_directory=True)
    with pytest.warns(SkippedPathWarning) as caught:
        result = prune_cache(everything=True)
    assert _names(result.removed) == [IMAGES] and (outside / FEATURES).is_file()
    assert [(w.message.path, w.message.reason) for w in caught] == [(str(r / "features"), "folder link")]
