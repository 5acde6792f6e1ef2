"""Masked patch prediction (paper section 4.6): targets with known answers, the corruption's proportions and
placement, a loss that ignores uncorrupted patches, and a tiny run that learns and resumes exactly."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from _reference import three_class_split

import vitlab
from vitlab.train.config import PRESETS
from vitlab.train.loop import train
from vitlab.train.mpp import (
    KEEP,
    MASK,
    RANDOM,
    SAME,
    MaskedPatchPrediction,
    color3_targets,
    corrupted_patches,
    draw_corruption,
    patch4x4_targets,
)

TINY = dataclasses.replace(PRESETS["tiny"].model, num_classes=3)


def test_color3_of_hand_made_patches():
    img = torch.zeros(1, 3, 8, 8)
    img[0, 0, :4, :4] = 1.0  # patch 0: pure red -> r = 7
    img[0, :, :4, 4:] = 0.5  # patch 1: mid grey -> 4, 4, 4
    img[0, 2, 4:, :4] = 0.99  # patch 2: blue 0.99 -> b = 7
    img[0, 1, 4:, 4:6] = 1.0  # patch 3: green on half the patch -> mean 0.5 -> g = 4
    assert color3_targets(img, 4).tolist() == [[7 * 64, 4 * 64 + 4 * 8 + 4, 7, 4 * 8]]
    assert color3_targets(torch.ones(1, 3, 4, 4), 4).item() == 511 and color3_targets(torch.zeros(1, 3, 4, 4), 4) == 0


@pytest.mark.parametrize("make", [patch4x4_targets, color3_targets])
@pytest.mark.parametrize("pixels, problem", [
    (lambda u8: u8.float(), r"values in \[0, 255\]"),  # 0-255 floats: clamped, every patch would be class 511
    (lambda u8: (u8.float() / 255 - 0.5) / 0.25, r"before normalisation"),  # normalised images
    (lambda u8: u8, r"torch.uint8"),  # the raw bytes
])
def test_colour_targets_refuse_pixels_outside_0_1(make, pixels, problem):
    """The colour classes are defined on [0, 1] pixels; anything else is refused, not clamped into a few classes."""
    u8 = torch.arange(3 * 8 * 8).reshape(1, 3, 8, 8).mul(7).remainder(256).to(torch.uint8)
    u8[0, 0, 0, 0] = 255
    u8[0, 0, 0, 1] = 0
    with pytest.raises(ValueError, match=problem):
        make(pixels(u8), 4)
    expected = make(u8.float() / 255, 4)  # the same image in [0, 1]: classes spread over the range
    assert expected.unique().numel() > 1


@pytest.mark.parametrize("shape", [(2, 3, 64, 32), (3, 3, 32, 64), (2, 3, 16, 32)])
def test_colour_targets_come_from_the_same_batch_at_the_same_size(shape):
    """images01 of another size or batch is refused before the forward pass, also where its patch count happens to
    match x's (64 x 32 against 32 x 64: 128 patches each, every target from the wrong place)."""
    model = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=(32, 64), depth=1, num_classes=3)).eval()
    objective = MaskedPatchPrediction.for_model(model)
    x = torch.randn(2, 3, 32, 64)
    calls = []
    model.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match="images01 .* must be the batch x"):
        objective(model, x, torch.rand(shape), torch.Generator().manual_seed(0))
    assert not calls and not model.patch_embed._forward_hooks  # nothing ran, no corruption hook left behind
    loss, _ = objective(model, x, torch.rand(2, 3, 32, 64), torch.Generator().manual_seed(0))
    assert loss.isfinite()


def test_color3_is_the_exact_mean_colour_but_on_level_edges_as_documented():
    """The 3-bit class of the mean of the raw 0-255 pixels, recomputed in integers: floor(8 * sum / (255 * P * P));
    only means exactly on a level's edge may differ (one level low), as many as ``color3_targets`` says."""
    from vitlab.data.images import cifar_test_sample
    from vitlab.train.mpp import _patches

    imgs = cifar_test_sample().images  # (128, 32, 32, 3) uint8
    got = color3_targets(imgs.permute(0, 3, 1, 2).float().div(255), 4)
    s = _patches(imgs.permute(0, 3, 1, 2).long(), 4).sum((-1, -2))  # (B, N, 3) exact channel sums
    q = torch.div(8 * s, 255 * 16, rounding_mode="floor").clamp_max(7)
    exact = q[..., 0] * 64 + q[..., 1] * 8 + q[..., 2]
    edge = ((8 * s) % (255 * 16) == 0).any(-1)
    assert torch.equal(got[~edge], exact[~edge]) and (got <= exact).all()
    assert (got != exact).sum().item() == 4 and got.numel() == 8192  # the numbers color3_targets's docstring gives


def test_patch4x4_of_a_4px_patch_is_the_patch_itself():
    img = torch.rand(2, 3, 8, 8)
    t = patch4x4_targets(img, 4)  # (B, N, 16)
    assert t.shape == (2, 4, 16)
    assert t[1, 3, 5].item() == color3_targets(img[1:2, :, 5:6, 5:6], 1).item()  # patch 3, pixel (1, 1)


def test_patch4x4_of_an_8px_patch_averages_each_2_x_2_cell():
    """Each of the 16 targets is the mean colour of its 2 x 2 cell (the paper's downsized patch), not its brightest
    pixel: a cell of 0, 0, 0 and 1 has mean 0.25, level 2."""
    img = torch.zeros(1, 3, 8, 8)
    img[0, :, 1::2, 1::2] = 1.0  # one bright pixel in every 2 x 2 cell
    img[0, 0, :2, :2] = 1.0  # cell 0's red: the whole cell
    t = patch4x4_targets(img, 8)
    assert t.shape == (1, 1, 16)
    grey = 2 * 64 + 2 * 8 + 2
    assert t[0, 0].tolist() == [7 * 64 + 2 * 8 + 2] + [grey] * 15


def test_patch4x4_needs_patches_that_split_into_4_x_4_cells():
    """The paper's 4 x 4 downsized patch averages whole cells of a 16 px patch; a 2 px patch was upsampled (each
    pixel predicted four times) and a 6 px one averaged overlapping cells, both silently."""
    with pytest.raises(ValueError, match="patch4x4.*multiple of 4, not 2") as e:
        dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(TINY, patch_size=2), mpp_target="patch4x4")
    assert (e.value.param, e.value.value, e.value.config) == ("mpp_target", "patch4x4", True)
    with pytest.raises(ValueError, match="patch4x4.*multiple of 4.*6 px"):
        MaskedPatchPrediction(32, 6, 1, "patch4x4")
    dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(TINY, patch_size=2))  # color3: any patch
    from vitlab.studies.mpp import STUDIES

    with pytest.raises(ValueError, match="patch4x4.*multiple of 4"):  # a study with that ablation: before any run
        dataclasses.replace(STUDIES["smoke"], model=dataclasses.replace(STUDIES["smoke"].model, patch_size=2))


def test_corruption_proportions_within_binomial_bounds():
    g = torch.Generator().manual_seed(0)
    B, N = 400, 64
    mode, source = draw_corruption(B, N, 0.5, g)
    assert ((mode != KEEP).sum(1) == 32).all()  # exactly half of every image's patches
    n = int((mode != KEEP).sum())
    for kind, p in ((MASK, 0.8), (RANDOM, 0.1), (SAME, 0.1)):
        k = int((mode == kind).sum())
        assert abs(k - n * p) < 5 * math.sqrt(n * p * (1 - p)), (kind, k, n * p)
    own = torch.arange(B * N).view(B, N)
    assert not (source == own).any() and source.min() >= 0 and source.max() < B * N
    assert draw_corruption(15, 64, 0.15, torch.Generator().manual_seed(0))[0].ne(KEEP).sum(1).eq(10).all()


def test_replacements_land_where_the_mode_says():
    model = vitlab.build_model(TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    clean = model.patch_embed(x)  # (B, N, D)
    mode, source = draw_corruption(2, 64, 0.5, torch.Generator().manual_seed(1))
    token = torch.randn(clean.shape[-1])
    seen = {}
    with corrupted_patches(model, mode, source, token):
        seen["out"] = model.patch_embed(x)
    out = seen["out"]
    flat = clean.reshape(-1, clean.shape[-1])
    for b in range(2):
        for n in range(64):
            m = int(mode[b, n])
            want = token if m == MASK else flat[source[b, n]] if m == RANDOM else clean[b, n]
            torch.testing.assert_close(out[b, n], want)
    assert not model.patch_embed._forward_hooks  # the hook is gone after the block
    torch.testing.assert_close(model.patch_embed(x), clean)


def test_loss_ignores_uncorrupted_patches():
    torch.manual_seed(0)
    model = vitlab.build_model(TINY).eval()
    obj = MaskedPatchPrediction.for_model(model, "color3", 0.5)
    x = torch.rand(2, 3, 32, 32)
    loss, out = obj(model, x, x, torch.Generator().manual_seed(3))
    keep = out["mode"] == KEEP
    changed = x.clone()
    # repaint every uncorrupted patch: targets there change, the loss must not
    for b, n in keep.nonzero().tolist():
        r, c = divmod(n, 8)
        changed[b, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = 1.0 - changed[b, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4]
    loss2, out2 = obj(model, x, changed, torch.Generator().manual_seed(3))
    assert not torch.equal(out["target"], out2["target"])
    torch.testing.assert_close(loss, loss2)


def test_the_loss_is_over_every_corrupted_patch_the_kept_and_replaced_ones_too():
    """The paper's loss is over all corrupted patches: [mask], a random other patch and the 10% left as they are
    (as BERT's), not the masked ones alone."""
    torch.manual_seed(0)
    model = vitlab.build_model(TINY).eval()
    obj = MaskedPatchPrediction.for_model(model, "color3", 0.5)
    x = torch.rand(4, 3, 32, 32)
    loss, out = obj(model, x, x, torch.Generator().manual_seed(3))
    corrupted = out["mode"] != KEEP
    assert (out["mode"] == SAME).any() and (out["mode"] == RANDOM).any()
    want = torch.nn.functional.cross_entropy(out["prediction"][corrupted], out["target"][corrupted])
    torch.testing.assert_close(loss, want)


def test_an_encoder_without_a_class_token_predicts_every_patch():
    """With no prefix token the patch tokens start at the first token: none is dropped or shifted."""
    torch.manual_seed(0)
    model = vitlab.build_model(dataclasses.replace(TINY, readout="avg")).eval()
    assert model.num_prefix_tokens == 0
    obj = MaskedPatchPrediction.for_model(model, "color3", 0.5)
    x = torch.rand(2, 3, 32, 32)
    loss, out = obj(model, x, x, torch.Generator().manual_seed(3))
    assert out["prediction"].shape[:2] == (2, 64) and torch.isfinite(loss)
    corrupted = out["mode"] != KEEP
    want = torch.nn.functional.cross_entropy(out["prediction"][corrupted], out["target"][corrupted])
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("target", ["color3", "patch4x4", "l2"])
def test_training_path_gives_the_same_loss_from_the_corrupted_patches_alone(target):
    torch.manual_seed(0)
    model = vitlab.build_model(TINY).eval()
    obj = MaskedPatchPrediction.for_model(model, target, 0.5)
    x = torch.rand(3, 3, 32, 32)
    full, out = obj(model, x, x, torch.Generator().manual_seed(5))
    part, lean = obj(model, x, x, torch.Generator().manual_seed(5), all_predictions=False)
    torch.testing.assert_close(part, full)
    assert out["prediction"].shape[:2] == (3, 64) and lean["prediction"] is None
    assert torch.equal(out["mode"], lean["mode"])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return three_class_split(tmp_path_factory.mktemp("mppdata"))


def test_tiny_run_learns_and_resumes_to_the_same_weights(tmp_path, images, monkeypatch):
    import json

    import vitlab.train.loop as T
    from vitlab.train.warm_start import warm_start

    train_data, test_data = images
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=TINY, epochs=4, batch_size=16, warmup_epochs=0.5,
                              lr=3e-3, bf16=False)
    full = train(cfg, tmp_path / "full", progress=False, train_data=train_data, test_data=test_data)
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]  # it learns
    assert "mpp_test" in rows[-1] and "test_accuracy" not in rows[-1]  # labels are not read

    # the same schedule stopped after epoch 2 (as a kill would), then resumed: exactly the uninterrupted weights
    real, calls = T.save_run_checkpoint, {"n": 0}

    def stop_after_two(*args, **kwargs):
        real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(T, "save_run_checkpoint", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "stopped", progress=False, train_data=train_data, test_data=test_data)
    monkeypatch.setattr(T, "save_run_checkpoint", real)
    assert json.loads((tmp_path / "stopped" / "checkpoint" / "config.json").read_text())["epoch"] == 2
    assert (tmp_path / "stopped" / "checkpoint" / "objective.safetensors").is_file()
    resumed = train(cfg, tmp_path / "stopped", resume=True, progress=False, train_data=train_data,
                    test_data=test_data)
    assert list(full.state_dict()) == list(resumed.state_dict())
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)

    # what ships is the encoder alone: a plain vitlab ViT checkpoint with a fresh (untrained) classifier head
    loaded = vitlab.load_model(str(tmp_path / "full" / "checkpoint"))
    assert type(loaded).__name__ == "VisionTransformer" and loaded.num_classes == 3

    # fine-tuning from it (init_from): the encoder is copied, the never-trained classifier stays the fine-tune's own
    torch.manual_seed(7)
    target = vitlab.build_model(TINY)
    head_before = target.head.weight.detach().clone()
    fresh = warm_start(target, tmp_path / "full" / "checkpoint")
    assert fresh == ["head.weight", "head.bias"]
    torch.testing.assert_close(target.head.weight, head_before, rtol=0, atol=0)
    assert not torch.equal(target.head.weight, loaded.head.weight)
    torch.testing.assert_close(target.blocks[0].attn.qkv.weight, loaded.blocks[0].attn.qkv.weight, rtol=0, atol=0)


def test_a_warm_started_mpp_run_keeps_the_trained_mask_embedding_and_head(tmp_path, images):
    """Pre-training warm-started from an MPP checkpoint (``init_from``, as ``vitlab train --preset mpp_cifar10
    --continue`` does from the shipped folder) goes on with that checkpoint's [mask] embedding and prediction head,
    not fresh ones beside a trained encoder; a checkpoint of another target leaves them fresh."""
    from vitlab.train.mpp import load_mpp

    train_data, test_data = images
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=TINY, epochs=1, batch_size=16, warmup_epochs=0.0,
                              bf16=False, eval_every=0)
    train(cfg, tmp_path / "first", progress=False, train_data=train_data, test_data=test_data)
    _, trained = load_mpp(tmp_path / "first")
    still = dataclasses.replace(cfg, lr=0.0, min_lr=0.0, init_from=str(tmp_path / "first" / "checkpoint"))
    train(still, tmp_path / "second", progress=False, train_data=train_data, test_data=test_data)
    _, continued = load_mpp(tmp_path / "second")
    for k, v in trained.state_dict().items():
        torch.testing.assert_close(continued.state_dict()[k], v, rtol=0, atol=0, msg=k)
    other = dataclasses.replace(still, mpp_target="l2")  # another head: nothing to carry over
    train(other, tmp_path / "l2", progress=False, train_data=train_data, test_data=test_data)
    _, fresh = load_mpp(tmp_path / "l2")
    assert fresh.target == "l2" and not torch.equal(fresh.mask_token, trained.mask_token)


def test_mpp_config_is_validated():
    with pytest.raises(ValueError, match="plain ViT"):
        dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(TINY, patch_drop_rate=0.5))
    with pytest.raises(ValueError, match="mixup_prob=0"):
        dataclasses.replace(PRESETS["mpp_cifar10"], mixup_prob=0.5)
    with pytest.raises(ValueError, match="mpp_target"):
        dataclasses.replace(PRESETS["mpp_cifar10"], mpp_target="colour")
    with pytest.raises(ValueError, match="lookahead_every=0"):
        dataclasses.replace(PRESETS["mpp_cifar10"], lookahead_every=5)


@pytest.mark.parametrize("field, value, fix", [("label_smoothing", 0.1, 0), ("ema_decay", 0.999, None),
                                               ("eval_tta", 2, 0)])
def test_settings_the_mpp_loop_never_reads_are_refused(field, value, fix):
    """The MPP loss is an unsmoothed cross-entropy on colour classes (or a squared error), and its evaluation
    (``evaluate_mpp``) reads neither an EMA nor test-time augmentation: such a setting (e.g. the vit_shapes preset's
    label_smoothing=0.1 with --set objective=mpp) was recorded in the run's config and silently did nothing."""
    from vitlab.base.errors import ParameterError, Setting

    with pytest.raises(ParameterError) as e:
        dataclasses.replace(PRESETS["mpp_cifar10"], **{field: value})
    assert (e.value.param, e.value.value, e.value.fix) == (field, value, ((Setting(field, fix, config=True),),))
    with pytest.raises(ValueError, match="label_smoothing=0"):
        dataclasses.replace(PRESETS["vit_shapes"], objective="mpp")


def test_export_ships_the_prediction_head_and_a_card_that_reproduces(tmp_path, monkeypatch, capsys):
    import json

    from _reference import make_folder
    from safetensors.torch import load_file

    from vitlab.cli import main
    from vitlab.data.datasets import load_dataset
    from vitlab.train.loop import evaluate_mpp
    from vitlab.train.mpp import OBJECTIVE_NAME, load_mpp

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    make_folder(tmp_path / "data" / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(tmp_path / "data" / "test", n_per_class=8, size=32, classes=("a", "b"))
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(TINY, num_classes=2), epochs=2,
                              batch_size=16, warmup_epochs=0.5, data=str(tmp_path / "data"), bf16=False)
    train(cfg, tmp_path / "run", progress=False)
    out = tmp_path / "shipped"
    assert main(["export", "--run-dir", str(tmp_path / "run"), "--out", str(out),
                 "--command-line", "vitlab train --preset mpp_cifar10"]) == 0
    head = load_file(str(out / OBJECTIVE_NAME))
    assert head and all(v.dtype == torch.float16 for v in head.values())  # shipped in the checkpoint's dtype
    card = json.loads((out / "card.json").read_text())
    assert card["objective"] == "mpp" and card["test_accuracy"] is None  # its classifier never saw a label
    model, objective = load_mpp(out)
    again = evaluate_mpp(model, objective, load_dataset(str(tmp_path / "data"), "test"), n=16)
    assert card["mpp_test_images"] == 16 and again == pytest.approx(card["mpp_test"])  # the card reproduces
    text = (out / "MODEL_CARD.md").read_text()
    assert f"Masked-patch accuracy: {card['mpp_test']['accuracy']:.2%}" in text and "Test accuracy" not in text
    # the shipped head is the run's, rounded to half precision
    run_model, run_objective = load_mpp(tmp_path / "run")
    for k, v in run_objective.state_dict().items():
        torch.testing.assert_close(objective.state_dict()[k], v.half().float(), rtol=0, atol=0, msg=k)
    capsys.readouterr()
    assert main(["info", "--model", str(out)]) == 0  # a card without a test accuracy: `vitlab info` shows its own
    assert f"{card['mpp_test']['accuracy']:.2%} masked-patch accuracy" in capsys.readouterr().out


def test_load_mpp_names_what_is_missing(tmp_path):
    from vitlab.models.checkpoint import save_checkpoint
    from vitlab.train.mpp import OBJECTIVE_NAME, load_mpp

    with pytest.raises(FileNotFoundError, match="mpp_cifar10"):
        load_mpp(tmp_path / "nothing")
    folder = save_checkpoint(vitlab.build_model(TINY), tmp_path / "supervised")
    (folder / OBJECTIVE_NAME).write_bytes((folder / "model.safetensors").read_bytes())  # a head, but no MPP config
    with pytest.raises(ValueError, match="objective='mpp'"):
        load_mpp(folder)


def test_load_mpp_reports_a_head_that_does_not_fit_as_a_damaged_checkpoint(tmp_path):
    """A prediction head that does not fit the checkpoint's config (another target's, from another save) or cannot
    be read is a ModelLoadError naming the file and what is wrong, as load_checkpoint reports its weights."""
    from vitlab.base.errors import ModelLoadError
    from vitlab.models.checkpoint import save_checkpoint
    from vitlab.train.mpp import OBJECTIVE_NAME, load_mpp

    model = vitlab.build_model(TINY)
    train_cfg = {"objective": "mpp", "mpp_target": "color3", "mpp_rate": 0.5}
    right = MaskedPatchPrediction.for_model(model, "color3", 0.5)
    wrong = MaskedPatchPrediction.for_model(model, "patch4x4", 0.5)  # another target: another output size
    folder = save_checkpoint(model, tmp_path / "mpp", extra={"train": train_cfg}, modules={"objective": wrong})
    with pytest.raises(ModelLoadError, match=rf"{OBJECTIVE_NAME} does not match .*head\.1\.weight: file"):
        load_mpp(folder)
    (folder / OBJECTIVE_NAME).write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match=rf"{OBJECTIVE_NAME} could not be read"):
        load_mpp(folder)
    folder = save_checkpoint(model, tmp_path / "fits", extra={"train": train_cfg}, modules={"objective": right})
    _, objective = load_mpp(folder)
    for k, v in right.state_dict().items():
        torch.testing.assert_close(objective.state_dict()[k], v, rtol=0, atol=0, msg=k)

    # resuming a run reads the head through the same check (it was torch's raw size-mismatch error)
    from vitlab.models.checkpoint import load_run_state, save_run_checkpoint

    opt = torch.optim.AdamW(list(model.parameters()) + list(wrong.parameters()))
    run = save_run_checkpoint(tmp_path / "run", model, opt, None, {"epoch": 1}, modules={"objective": wrong})
    with pytest.raises(ModelLoadError, match=rf"{OBJECTIVE_NAME} does not match .*head\.1\.weight: file"):
        load_run_state(run, torch.optim.AdamW(list(model.parameters()) + list(right.parameters())), None,
                       modules={"objective": right})
    fresh = MaskedPatchPrediction.for_model(model, "patch4x4", 0.5)
    load_run_state(run, opt, None, modules={"objective": fresh})
    for k, v in wrong.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_evaluate_mpp_spreads_its_images_over_a_class_ordered_split():
    from vitlab.data.datasets import ImageArray
    from vitlab.train.loop import evaluate_mpp

    # 40 images stored class by class (as an ImageFolder is): class c's images are filled with the value c
    labels = torch.arange(4).repeat_interleave(10)
    images = labels.view(-1, 1, 1, 1).expand(-1, 32, 32, 3).to(torch.uint8).contiguous()
    data = ImageArray(images, labels, ("a", "b", "c", "d"), "class-ordered")
    model = vitlab.build_model(dataclasses.replace(TINY, num_classes=4))
    seen = []

    class Recorder(MaskedPatchPrediction):
        def forward(self, model, x, images01, generator, all_predictions=True):
            seen.append(images01[:, 0, 0, 0] * 255)
            return super().forward(model, x, images01, generator, all_predictions)

    obj = Recorder.for_model(model)
    res = evaluate_mpp(model, obj, data, n=8, batch_size=3)
    assert torch.cat(seen).round().long().tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # i * 40 // 8: every class, evenly
    assert res["images"] == 8 and res["spread"] == 1


def test_export_of_an_l2_run_reports_its_loss_and_an_interrupted_export_changes_nothing(tmp_path, monkeypatch):
    import json

    from _reference import make_folder

    import vitlab.train.export as E
    from vitlab.cli import main

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    make_folder(tmp_path / "data" / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(tmp_path / "data" / "test", n_per_class=8, size=32, classes=("a", "b"))
    cfg = dataclasses.replace(PRESETS["mpp_cifar10"], model=dataclasses.replace(TINY, num_classes=2), epochs=2,
                              batch_size=16, warmup_epochs=0.5, data=str(tmp_path / "data"), bf16=False,
                              mpp_target="l2")
    train(cfg, tmp_path / "run", progress=False)
    out = tmp_path / "shipped"
    assert main(["export", "--run-dir", str(tmp_path / "run"), "--out", str(out), "--command-line", "l2"]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["mpp_target"] == "l2" and "accuracy" not in card["mpp_test"]
    drawn = card["learning_curve"].startswith("written")  # when Chromium is here
    assert drawn == (out / "learning_curve.png").is_file() and (drawn or card["learning_curve"].startswith("skipped"))
    text = (out / "MODEL_CARD.md").read_text()
    assert f"loss {card['mpp_test']['loss']:.4f}" in text and "masked-patch loss" in text and "nan" not in text
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C while the card is written

    monkeypatch.setattr(E, "card_text", broken)
    assert main(["export", "--run-dir", str(tmp_path / "run"), "--out", str(out), "--command-line", "again"]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous export, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "data", "run", "shipped"]  # no staging left


def test_save_checkpoint_refuses_a_module_named_like_the_weights(tmp_path):
    from vitlab.models.checkpoint import save_checkpoint

    model = vitlab.build_model(TINY)
    with pytest.raises(ValueError, match="model.safetensors"):
        save_checkpoint(model, tmp_path / "ck", modules={"model": MaskedPatchPrediction.for_model(model)})
    assert not (tmp_path / "ck").exists()


def test_the_no_patch_error_names_a_rate_that_works():
    import re

    from vitlab.train.mpp import draw_corruption

    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="corrupts no patch of 64") as e:
        draw_corruption(2, 64, 0.001, g)
    rate = float(re.search(r"= ([0-9.e-]+) \(one patch\)", str(e.value)).group(1))
    mode, _ = draw_corruption(2, 64, rate, g)  # the advised rate corrupts exactly one patch per image
    assert ((mode != 0).sum(1) == 1).all()
