"""Checkpoints (vitlab.models.checkpoint): exact round trips, atomic saves, clear errors for damaged files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import outputs, tiny_bit, tiny_hybrid, tiny_timm, tiny_vit
from safetensors import safe_open
from timm.data import resolve_data_config

import vitlab
import vitlab.models.checkpoint as vc
from vitlab import ModelLoadError, vit_config
from vitlab.models.config import Preprocess


@pytest.mark.parametrize("make", [tiny_vit, tiny_hybrid, tiny_bit, lambda: tiny_vit(pos_embed="sincos", readout="avg"),
                                  lambda: tiny_vit(pos_embed="none")])
def test_checkpoint_round_trip_is_exact(tmp_path, make, x32):
    model = make()
    out = vitlab.save_checkpoint(model, tmp_path / "ckpt", extra={"epoch": 3, "note": "hi"})
    assert out == tmp_path / "ckpt"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    loaded = vitlab.load_model(out)
    assert not loaded.training
    assert loaded.vitlab_config == model.vitlab_config
    assert torch.equal(outputs(loaded, x32), outputs(model, x32))
    assert loaded.vitlab_checkpoint["epoch"] == 3 and loaded.vitlab_checkpoint["note"] == "hi"
    assert loaded.vitlab_checkpoint["path"] == str(out)
    assert resolve_data_config({}, model=loaded) == resolve_data_config({}, model=model)


def test_checkpoint_keeps_custom_preprocessing(tmp_path):
    pre = Preprocess(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6), interpolation="bilinear", crop_pct=0.9)
    model = vitlab.build_model(vit_config("Ti/4", img_size=32, depth=1, preprocess=pre))
    loaded = vitlab.load_model(vitlab.save_checkpoint(model, tmp_path / "c"))
    assert loaded.vitlab_config.preprocess == pre
    cfg = resolve_data_config({}, model=loaded)
    assert (cfg["mean"], cfg["std"], cfg["interpolation"], cfg["crop_pct"]) == (pre.mean, pre.std, "bilinear", 0.9)


def test_checkpoint_loads_from_either_file(tmp_path, x32):
    model = tiny_vit()
    d = vitlab.save_checkpoint(model, tmp_path / "c")
    for p in (d / "config.json", d / "model.safetensors", str(d)):
        assert torch.equal(outputs(vitlab.load_model(p), x32), outputs(model, x32))


def test_checkpoint_in_float16(tmp_path, x32):
    model = tiny_vit()
    d = vitlab.save_checkpoint(model, tmp_path / "c", dtype=torch.float16)
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    loaded = vitlab.load_model(d)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(outputs(loaded, x32), outputs(model, x32), atol=2e-2, rtol=2e-2)


def test_checkpoint_files_are_plain_json_and_safetensors(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    meta = json.loads((d / "config.json").read_text())
    assert meta["format"] == "vitlab-checkpoint" and meta["config"]["kind"] == "vit"
    assert (d / "model.safetensors").read_bytes()[8:9] == b"{"  # safetensors header, not a pickle


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, x32):
    first, second = tiny_vit(), tiny_vit()
    d = vitlab.save_checkpoint(first, tmp_path / "c", extra={"v": 1})

    def broken_save(state, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(vc, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        vitlab.save_checkpoint(second, d, extra={"v": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no temporary folders left behind
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 1
    assert torch.equal(outputs(loaded, x32), outputs(first, x32))


def test_failed_final_rename_restores_the_previous_checkpoint(tmp_path, monkeypatch, x32):
    first = tiny_vit()
    d = vitlab.save_checkpoint(first, tmp_path / "c", extra={"v": 1})
    real_replace = os.replace

    def replace(src, dst):
        if ".tmp." in Path(src).name:
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(vc.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        vitlab.save_checkpoint(tiny_vit(), d, extra={"v": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 1
    assert torch.equal(outputs(loaded, x32), outputs(first, x32))


def test_save_replaces_a_previous_checkpoint(tmp_path, x32):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"v": 1})
    second = tiny_vit(readout="avg")
    vitlab.save_checkpoint(second, d, extra={"v": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # the old copy is gone too
    loaded = vitlab.load_model(d)
    assert loaded.vitlab_checkpoint["v"] == 2
    assert torch.equal(outputs(loaded, x32), outputs(second, x32))


def test_save_refuses_to_replace_other_folders(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="non-empty folder"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "results")
    assert (tmp_path / "results" / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    vitlab.save_checkpoint(tiny_vit(), tmp_path / "empty")  # an empty folder is fine


def test_save_rejects_bad_extra_before_writing(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"config": {}})
    with pytest.raises(ValueError, match="JSON"):
        vitlab.save_checkpoint(tiny_vit(), tmp_path / "c", extra={"t": torch.zeros(1)})
    assert list(tmp_path.iterdir()) == []


def test_save_needs_a_vitlab_model(tmp_path):
    with pytest.raises(ValueError, match="no vitlab config"):
        vitlab.save_checkpoint(tiny_timm("vit_tiny_patch16_224", img_size=32), tmp_path / "c")


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "no 'config' entry"),
    ('{"config": {"kind": "mlp"}}', "kind='mlp'"),
    ('{"config": {"kind": "vit", "depth": 0}}', "invalid.*depth"),
    ('{"config": {"kind": "vit", "colour": 1}}', "unknown fields"),
    ('{"format_version": 99, "config": {"kind": "vit"}}', "newer"),
])
def test_damaged_config_is_a_clear_error(tmp_path, text, match):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    (d / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match=match):
        vitlab.load_model(d)


def test_weights_from_another_model_are_a_clear_error(tmp_path):
    a = vitlab.save_checkpoint(tiny_vit(), tmp_path / "a")
    b = vitlab.save_checkpoint(vitlab.build_model(vit_config("Ti/4", img_size=32, depth=2, num_classes=10)),
                               tmp_path / "b")
    c = vitlab.save_checkpoint(vitlab.build_model(vit_config("Ti/4", img_size=48, depth=3, num_classes=10)),
                               tmp_path / "c")
    os.replace(b / "model.safetensors", a / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"does not match its config.json: missing \['blocks.2"):
        vitlab.load_model(a)
    os.replace(c / "model.safetensors", a / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"shape mismatches \['pos_embed: file \(1, 145, 192\) vs model \(1, 65"):
        vitlab.load_model(a)


def test_truncated_weights_are_a_clear_error(tmp_path):
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="could not be read.*damaged"):
        vitlab.load_model(d)


def test_folder_without_checkpoint_files(tmp_path):
    (tmp_path / "c").mkdir()
    with pytest.raises(ModelLoadError, match="not a vitlab checkpoint.*config.json.*model.safetensors"):
        vitlab.load_model(tmp_path / "c")


def test_a_path_that_does_not_exist_never_loads_its_parents_checkpoint(tmp_path):
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    with pytest.raises(ModelLoadError, match="no_such_run does not exist"):
        vitlab.load_checkpoint(ck / "no_such_run")
    assert isinstance(vitlab.load_checkpoint(ck / "config.json"), torch.nn.Module)  # one of its files still loads


def test_none_as_a_checkpoint_path_is_named():
    """load_checkpoint(None) and save_checkpoint(model, None) failed in pathlib with "expected str, bytes or
    os.PathLike object, not NoneType"; both now name the argument (loading keeps its ModelLoadError)."""
    with pytest.raises(ModelLoadError, match=r"path must be a vitlab checkpoint folder or one of its two files, got "
                                             r"None \(vitlab.load_model\(\) with no argument loads the embedded"):
        vitlab.load_checkpoint(None)
    with pytest.raises(TypeError, match="directory must be the path of the folder to write, got None"):
        vitlab.save_checkpoint(tiny_vit(), None)


def test_a_run_checkpoint_refuses_to_replace_another_folder(tmp_path):
    model = tiny_vit()
    opt = torch.optim.AdamW(model.parameters())
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="non-empty folder"):
        vc.save_run_checkpoint(tmp_path / "results", model, opt, None, {"epoch": 1})
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["notes.txt"]
    vc.save_run_checkpoint(tmp_path / "run", model, opt, None, {"epoch": 1})
    vc.save_run_checkpoint(tmp_path / "run", model, opt, None, {"epoch": 2})  # its own earlier checkpoint: replaced
    assert json.loads((tmp_path / "run" / "config.json").read_text())["epoch"] == 2


def test_a_compiled_model_saves_as_the_model_it_wraps(tmp_path):
    """torch.compile's wrapper prefixes every state_dict key with `_orig_mod.`: the checkpoint holds the plain keys
    and loads back (compiling itself is lazy: nothing is compiled here)."""
    import torch

    model = tiny_vit()
    ck = vitlab.save_checkpoint(torch.compile(model), tmp_path / "ck")
    loaded = vitlab.load_checkpoint(ck)
    assert list(loaded.state_dict()) == list(model.state_dict()) and len(model.state_dict()) > 0
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the umask from Linux's /proc")
def test_atomic_writes_follow_the_umask_without_changing_it(tmp_path):
    """The file gets 0666 less the umask, as any new file; the umask is read, never set (another thread would see
    0 for an instant)."""
    import os
    import stat

    from vitlab.base.atomic import atomic_write_text

    old = os.umask(0o027)
    try:
        calls = []
        real = os.umask
        os.umask = lambda m: (calls.append(m), real(m))[1]
        try:
            path = atomic_write_text(tmp_path / "a.txt", "x")
        finally:
            os.umask = real
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and calls == []
    finally:
        os.umask(old)


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    """A writer that fails half-way leaves the previous file as it was and nothing else in the folder."""
    from vitlab.base.atomic import atomic_write, atomic_write_text

    path = atomic_write_text(tmp_path / "a.txt", "old")

    def half(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, half)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]

def test_a_checkpoint_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """Every file of the new checkpoint is flushed (fsync) before the rename that makes it the checkpoint, and the
    folder after it; the old checkpoint is replaced only then."""
    events = []
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace
    names: dict[int, str] = {}

    def opening(path, flags, *a, **k):
        fd = real_open(path, flags, *a, **k)
        names[fd] = os.path.basename(os.fspath(path))
        return fd

    vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", names.get(fd))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.path.basename(os.fspath(b)))),
                                                     real_replace(a, b))[1])
    vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")  # replaces the first one
    swap = events.index(("replace", "ck"))
    flushed = {name for kind, name in events[:swap] if kind == "fsync"}
    assert {"model.safetensors", "config.json"} <= flushed and ("fsync", tmp_path.name) in events[swap:]
    assert vitlab.load_checkpoint(tmp_path / "ck") is not None


def test_loading_a_checkpoint_that_a_kill_left_aside_restores_it(tmp_path):
    """A kill between replace_dir's two renames (say, during an export onto the shipped folder) leaves the previous
    copy as .NAME.old.*: loading the folder puts it back instead of saying it does not exist."""
    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    ck.rename(tmp_path / ".ck.old.abc")
    assert vitlab.load_checkpoint(tmp_path / "ck") is not None and (tmp_path / "ck" / "config.json").is_file()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the umask from Linux's /proc")
def test_checkpoints_follow_the_umask(tmp_path):
    """A checkpoint folder and its files get 0777 / 0666 less the umask, like anything new (they were a fixed 0755
    and 0644, readable by all under umask 077, and the training state's safetensors were 0600 under any umask)."""
    from vitlab.models.checkpoint import save_run_checkpoint

    model = vitlab.build_model(vitlab.vit_config("Ti/16", img_size=32, patch_size=8, depth=1))
    opt = torch.optim.AdamW(model.parameters())
    for mask in (0o077, 0o022):
        old = os.umask(mask)
        try:
            shipped = vitlab.save_checkpoint(model, tmp_path / f"shipped{mask:o}")
            run = save_run_checkpoint(tmp_path / f"run{mask:o}", model, opt, None, extra={"epoch": 1})
        finally:
            os.umask(old)
        for folder in (shipped, run):
            assert folder.stat().st_mode & 0o777 == 0o777 & ~mask
            files = list(folder.iterdir())
            assert len(files) >= 2 and {f.stat().st_mode & 0o777 for f in files} == {0o666 & ~mask}


def _run_state(tmp_path):
    """A run checkpoint after one AdamW step, with an EMA and a module beside the model, and fresh objects to load
    it into (their state before loading, to compare with)."""
    import timm

    torch.manual_seed(0)
    model, head = tiny_vit(), torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
    ema = timm.utils.ModelEmaV3(model, decay=0.9)
    (model(torch.randn(2, 3, 32, 32)).sum() + head(torch.randn(2, 4)).sum()).backward()
    opt.step()
    ema.update(model)
    ck = vc.save_run_checkpoint(tmp_path / "ck", model, opt, ema, {"epoch": 1}, modules={"head": head})
    model2, head2 = tiny_vit(), torch.nn.Linear(4, 3)
    opt2 = torch.optim.AdamW([*model2.parameters(), *head2.parameters()], lr=1e-3)
    ema2 = timm.utils.ModelEmaV3(model2, decay=0.9)
    return ck, opt, opt2, ema2, head2


def _snapshot(opt, ema, head):
    return (json.dumps(opt.state_dict()["param_groups"]), len(opt.state),
            {k: v.clone() for k, v in ema.state_dict().items()}, {k: v.clone() for k, v in head.state_dict().items()})


def _same(a, b):
    return a[:2] == b[:2] and all(torch.equal(a[i][k], b[i][k]) for i in (2, 3) for k in a[i])


@pytest.mark.parametrize("damage", ["optimizer_bytes", "optimizer_json", "optimizer_groups", "ema", "head",
                                    "config", "missing_ema"])
def test_a_damaged_run_checkpoint_is_a_clear_error_that_changes_nothing(tmp_path, damage):
    """A damaged optimizer.safetensors made `vitlab train --resume` end in safetensors' traceback, and a damaged
    file late in the folder (the EMA) left the modules and optimizer already loaded from it. Every file is read and
    checked first now: a ModelLoadError names the file and the way on (a new leg from the model's weights), and
    the optimizer, EMA and module are unchanged."""
    ck, _, opt2, ema2, head2 = _run_state(tmp_path)
    cut = lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])  # noqa: E731
    if damage == "optimizer_bytes":
        cut(ck / "optimizer.safetensors")
    elif damage == "optimizer_json":
        (ck / "optimizer.json").write_text('{"param_groups": ')
    elif damage == "optimizer_groups":
        meta = json.loads((ck / "optimizer.json").read_text())
        meta["param_groups"][0]["params"] = meta["param_groups"][0]["params"][:-1]
        (ck / "optimizer.json").write_text(json.dumps(meta))
    elif damage == "ema":
        cut(ck / "ema.safetensors")
    elif damage == "head":
        from safetensors.torch import save_file

        save_file({"weight": torch.zeros(3, 5), "bias": torch.zeros(3)}, str(ck / "head.safetensors"))
    elif damage == "config":
        (ck / "config.json").write_text("{")
    else:
        (ck / "ema.safetensors").unlink()
    before = _snapshot(opt2, ema2, head2)
    with pytest.raises(ModelLoadError, match=r"ck/\w+\.(safetensors|json).*The run cannot resume from it") as e:
        vc.load_run_state(ck, opt2, ema2, modules={"head": head2})
    from vitlab.base.errors import Placeholder, Setting

    assert (e.value.param, e.value.value) == ("resume", True)  # a new leg from its weights, in a new run folder
    assert e.value.fix[0] == (Setting("init_from", str(ck), config=True), Setting("run_dir", Placeholder("NEW")))
    assert _same(_snapshot(opt2, ema2, head2), before)


def test_a_run_checkpoint_loads_exactly(tmp_path):
    """The all-or-nothing load still restores the optimizer, EMA and module state exactly."""
    ck, opt, opt2, ema2, head2 = _run_state(tmp_path)
    assert vc.load_run_state(ck, opt2, ema2, modules={"head": head2})["epoch"] == 1
    a, b = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert sorted(a) == sorted(b) and len(a) > 0
    assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])
    saved = vc.load_file(str(ck / "ema.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in ema2.state_dict().items())
    assert torch.equal(head2.weight, vc.load_file(str(ck / "head.safetensors"))["weight"])


def test_a_run_checkpoint_that_cannot_be_staged_names_its_folder(tmp_path, monkeypatch):
    """save_run_checkpoint (and export) made their staging folder with a bare mkdtemp: a parent that refuses new
    folders said 'Permission denied: .../.checkpoint.k2j4x9' (a name the user never gave); both use
    temp_dir_beside now, whose error names the folder asked for."""
    import tempfile

    model = tiny_vit()
    opt = torch.optim.AdamW(model.parameters())

    def refuse(prefix, dir):
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}x1y2z3")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(PermissionError) as e:
        vc.save_run_checkpoint(tmp_path / "run" / "checkpoint", model, opt, None, {"epoch": 1})
    assert e.value.filename == str(tmp_path / "run" / "checkpoint")


def test_a_config_that_asks_for_a_huge_model_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """A small checkpoint whose config.json says embed_dim=4096, mlp_dim=16384, depth=24 made the loader build that
    model (gigabytes) before checking the weights: the config's shapes are compared with the safetensors header
    first, and the real model is never built (its builder here would raise)."""
    import vitlab.models.checkpoint as ck

    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    meta = json.loads((d / "config.json").read_text())
    meta["config"].update(embed_dim=4096, mlp_dim=16384, depth=24, num_heads=16)
    (d / "config.json").write_text(json.dumps(meta))
    real_build = ck.build_model

    def build_only_on_meta(cfg):
        assert torch.empty(0).is_meta, "the model was built for real"
        return real_build(cfg)

    monkeypatch.setattr(ck, "build_model", build_only_on_meta)
    with pytest.raises(vitlab.base.errors.WeightsMismatchError) as e:
        vitlab.load_checkpoint(d)
    depth = tiny_vit().vitlab_config.depth
    assert e.value.path == str(d / "model.safetensors") and e.value.unexpected == []
    assert len(e.value.missing) == (24 - depth) * 12  # every tensor of the blocks the file does not hold
    assert ("cls_token", (1, 1, 192), (1, 1, 4096)) in e.value.mismatched
    assert str(e.value).count("blocks.") <= 2 * e.value.SHOWN  # the message lists a few, the fields hold all


@pytest.mark.parametrize("where, key, value", [
    ("config", "drop_path_rate", 1.5),
    ("config", "drop_rate", "x"),
    ("config", "drop_rate", -0.1),
    ("preprocess", "std", [0.5, 0.0, 0.5]),
    ("preprocess", "mean", "abc"),
    ("preprocess", "interpolation", "cubic"),
    ("pretrained_cfg", "mean", ["a", "b", "c"]),
    ("pretrained_cfg", "std", [0.2, 0.2]),
    ("pretrained_cfg", "input_size", [3, 32]),
    ("pretrained_cfg", "crop_pct", 0),
    ("pretrained_cfg", "interpolation", 7),
])
def test_every_config_value_a_user_can_set_is_checked_when_loading(tmp_path, where, key, value):
    """drop_path_rate=1.5, drop_rate='x' or a pretrained_cfg mean of strings loaded and surfaced later as torch's
    own messages; each is now a ModelLoadError naming the field."""
    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    meta = json.loads((d / "config.json").read_text())
    {"config": meta["config"], "preprocess": meta["config"]["preprocess"],
     "pretrained_cfg": meta["pretrained_cfg"]}[where][key] = value
    (d / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match=key):
        vitlab.load_checkpoint(d)


def test_a_full_disk_is_one_error_naming_the_checkpoint_and_the_space_needed(tmp_path, monkeypatch):
    """A full disk ended train's checkpoints and capture --out in safetensors' raw SafetensorError traceback: a save
    that cannot fit is refused before anything is written, and one that meets a full disk midway is a DiskFullError
    naming the checkpoint (never its temporary folder) and the bytes needed; the previous checkpoint stays, and no
    temporary folder is left."""
    import errno
    import shutil
    from collections import namedtuple

    from safetensors import SafetensorError

    from vitlab.base.errors import DiskFullError

    model = tiny_vit()
    first = vitlab.save_checkpoint(model, tmp_path / "ck", extra={"epoch": 1})
    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(DiskFullError) as e:
        vitlab.save_checkpoint(model, first, extra={"epoch": 2})
    assert (e.value.path, e.value.free, e.value.errno) == (str(first), 1000, errno.ENOSPC)
    assert weights < e.value.needed < weights + 10_000
    monkeypatch.undo()

    def full(*args, **kwargs):  # the words safetensors' Rust writer uses for ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(vc, "save_file", full)
    for save in (lambda: vitlab.save_checkpoint(model, first, extra={"epoch": 2}),
                 lambda: vc.save_run_checkpoint(first, model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                                                {"epoch": 2})):
        with pytest.raises(DiskFullError) as e:
            save()
        assert e.value.path == str(first) and e.value.needed >= weights and e.value.free is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert vitlab.load_checkpoint(first).vitlab_checkpoint["epoch"] == 1


def test_a_full_disk_in_an_atomic_write_names_the_file(tmp_path, monkeypatch):
    """capture --out and the other single-file outputs: ENOSPC from the writer is a DiskFullError naming the file
    asked for, with nothing left behind."""
    import errno

    from vitlab.base.atomic import atomic_write
    from vitlab.base.errors import DiskFullError

    def write(tmp):
        raise OSError(errno.ENOSPC, "No space left on device", tmp)

    with pytest.raises(DiskFullError) as e:
        atomic_write(tmp_path / "maps.safetensors", write, needed=123)
    assert (e.value.path, e.value.needed) == (str(tmp_path / "maps.safetensors"), 123)
    assert list(tmp_path.iterdir()) == []


def test_temporary_folders_whose_writer_is_gone_are_swept_on_the_next_save(tmp_path):
    """kill -9 during a save (a training checkpoint, an export, a report) left its .NAME.tmp.* folder, weights and
    all, for ever: the next save beside it sweeps those whose writer is gone (its process on this machine no longer
    runs, or a folder named before writers were recorded that is a day old) and never a live writer's, nor one of
    another machine's."""
    import subprocess
    import sys
    import time

    from vitlab.base.atomic import _host

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a process that has ended
    names = {"dead": f".ck.tmp.{gone}@{_host()}.abcd1234", "live": f".ck.tmp.{os.getppid()}@{_host()}.abcd1234",
             "elsewhere": f".ck.tmp.{gone}@another-host.abcd1234", "unowned_old": ".ck.tmp.k2j4h5g6",
             "unowned_new": ".ck.tmp.q1w2e3r4", "other_name": f".ckpt.tmp.{gone}@{_host()}.abcd1234"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * 100)
    day_ago = time.time() - 25 * 3600
    os.utime(tmp_path / names["unowned_old"], (day_ago, day_ago))
    vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"ck"} | {names[k] for k in ("live", "elsewhere", "unowned_new", "other_name")}


def test_a_checkpoint_a_kill_left_aside_is_restored_by_load_model_and_said(tmp_path, monkeypatch):
    """After a kill between replace_dir's two renames, `vitlab info --model OUT` said 'OUT is neither a file nor a
    timm model name' while a complete copy sat in .OUT.old.*, and nothing told the user: load_model now puts it
    back, with a RecoveredWarning naming the folder and the copy."""
    from vitlab.base.atomic import RecoveredWarning

    ck = vitlab.save_checkpoint(tiny_vit(), tmp_path / "out")
    ck.rename(tmp_path / ".out.old.abc12345")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(RecoveredWarning) as caught:
        model = vitlab.load_model("out")
    assert (caught[0].message.path, caught[0].message.aside) == ("out", ".out.old.abc12345")
    assert model.vitlab_checkpoint["path"] == "out" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_config_deeper_than_its_weights_have_tensors_is_refused_before_even_its_shapes_are_built(tmp_path,
                                                                                                    monkeypatch):
    """Building a model on the meta device still makes its Python modules, which grow with the depth: a config.json
    asking for a million blocks beside a file of 150-odd tensors is refused from the header's tensor count alone."""
    import vitlab.models.checkpoint as ck

    d = vitlab.save_checkpoint(tiny_vit(), tmp_path / "c")
    meta = json.loads((d / "config.json").read_text())
    meta["config"]["depth"] = 10**6
    (d / "config.json").write_text(json.dumps(meta))

    def never(cfg):
        raise AssertionError("a model was built")

    monkeypatch.setattr(ck, "build_model", never)
    with pytest.raises(ModelLoadError, match=r"a model of 1,000,000 blocks but .*model.safetensors holds \d+ tensors"):
        vitlab.load_checkpoint(d)
