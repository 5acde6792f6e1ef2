"""The fast-training pieces: the whitening CNN teacher, distillation, SGD groups, the triangle schedule,
explicit attention, warm starts and test-time augmentation."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from _reference import three_class_split

import vitlab
from vitlab.base.modes import eval_mode, explicit_attention
from vitlab.models.checkpoint import load_checkpoint, save_checkpoint
from vitlab.models.cifarnet import CifarResNet, tta_logits, whitening_filters
from vitlab.models.config import CifarNetConfig, ViTConfig
from vitlab.models.zoo import sincos_grid
from vitlab.train.augment import random_crop_flip
from vitlab.train.config import PRESETS, TrainConfig
from vitlab.train.distill import distill_loss, load_teacher, teacher_input
from vitlab.train.loop import _optimizer, evaluate, lr_at, train
from vitlab.train.warm_start import warm_start

TINY_CNN = CifarNetConfig(widths=(8, 16, 16), num_classes=3)
TINY_VIT = dataclasses.replace(PRESETS["tiny"].model, num_classes=3)


def test_whitening_filters_whiten_the_patches():
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(3, 3, generator=g)
    images = torch.einsum("dc,nchw->ndhw", mix, torch.randn(64, 3, 12, 12, generator=g))  # correlated channels
    w = whitening_filters(images, kernel=2, eps=0.0)
    assert w.shape == (24, 3, 2, 2)
    out = F.conv2d(images, w[:12]).permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = out.T @ out / len(out)
    torch.testing.assert_close(cov, torch.eye(12, dtype=torch.float64), atol=1e-3, rtol=0)
    torch.testing.assert_close(w[12:], -w[:12])


def test_whitening_filters_whiten_patches_correlated_along_one_axis_and_init_sets_them():
    """Images smooth along their width only (a running sum over columns): a filter laid out with its rows and columns
    swapped would not whiten them. 2 images give 50 patches, so the second moment's divisor shows (50, not 49); the
    stem takes these filters and a zero bias."""
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 6, 6, generator=g).double().cumsum(-1)  # (2, 3, 6, 6): columns correlated, rows not
    w = whitening_filters(images, kernel=2, eps=0.0)
    out = F.conv2d(images, w[:12].double()).permute(0, 2, 3, 1).reshape(-1, 12)  # (50, 12)
    torch.testing.assert_close(out.T @ out / len(out), torch.eye(12, dtype=torch.float64), atol=1e-4, rtol=0)
    model = CifarResNet((8, 8, 8), num_classes=3)
    model.init_from_data(images.float())
    torch.testing.assert_close(model.whiten.weight, whitening_filters(images.float(), 2))
    assert not model.whiten.bias.any()


def test_cifarnet_follows_timm_calling_convention_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = vitlab.build_model(TINY_CNN).eval()
    model.init_from_data(torch.randn(32, 3, 32, 32))
    x = torch.randn(4, 3, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (4, 16, 3, 3)
    pre = model.forward_head(feats, pre_logits=True)
    torch.testing.assert_close(pre, feats.amax(dim=(2, 3)))
    torch.testing.assert_close(model(x), model.head(pre) * TINY_CNN.logit_scale)
    again = load_checkpoint(save_checkpoint(model, tmp_path / "ck")).eval()
    torch.testing.assert_close(again(x), model(x))
    assert again.vitlab_config == TINY_CNN
    model.reset_classifier(5)
    assert model(x).shape == (4, 5)


@pytest.mark.parametrize("residual", [True, False])
def test_cifarnet_stage_is_its_definition(residual):
    # conv, pool, norm, GELU; then conv, norm, GELU added to it (residual) or in its place (airbench94's chain)
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY_CNN, residual=residual)
    model = vitlab.build_model(cfg).eval()
    for stage in model.stages:  # random shifts and statistics, so that the norms are not identities
        for norm in (stage.norm1, stage.norm2):
            norm.bias.data.normal_()
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32)
    h = F.gelu(model.whiten(x))
    for st in model.stages:
        h = F.gelu(F.batch_norm(F.max_pool2d(F.conv2d(h, st.conv1.weight, padding=1), 2), st.norm1.running_mean,
                                st.norm1.running_var, st.norm1.weight, st.norm1.bias, eps=st.norm1.eps))
        f = F.gelu(F.batch_norm(F.conv2d(h, st.conv2.weight, padding=1), st.norm2.running_mean,
                                st.norm2.running_var, st.norm2.weight, st.norm2.bias, eps=st.norm2.eps))
        h = h + f if residual else f
    torch.testing.assert_close(model.forward_features(x), h)
    assert vitlab.build_model(dataclasses.replace(TINY_CNN, residual=residual)).stages[0].residual is residual
    with pytest.raises(ValueError, match="residual must be true or false"):
        CifarNetConfig(residual="no")


def test_whiten_fp32_runs_only_the_stem_in_float32_under_bf16_autocast():
    torch.manual_seed(0)
    images = F.avg_pool2d(torch.randn(64, 3, 34, 34), 3, stride=1)  # smooth images: small high-frequency eigenvalues
    outs = {}
    for flag in (False, True):
        model = vitlab.build_model(dataclasses.replace(TINY_CNN, whiten_fp32=flag)).eval()
        model.init_from_data(images)
        seen = {}
        model.whiten.register_forward_hook(lambda _m, _i, out: seen.update(stem=out))
        model.stages[0].conv1.register_forward_hook(lambda _m, _i, out: seen.update(conv=out))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(images[:8])
        with torch.no_grad():
            reference = F.conv2d(images[:8], model.whiten.weight, model.whiten.bias)
        err = (seen["stem"].float() - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt()
        outs[flag] = (seen["stem"].dtype, seen["conv"].dtype, float(err))
    assert outs[True][:2] == (torch.float32, torch.bfloat16)  # the stem in float32, the stages still in bf16
    assert outs[True][2] < 1e-6 < 1e-3 < outs[False][2]  # bf16 blurs the whitened outputs; float32 does not
    assert outs[False][:2] == (torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="whiten_fp32 must be true or false"):
        CifarNetConfig(whiten_fp32=1)


def test_tta_levels_equal_their_definitions():
    torch.manual_seed(0)
    model = CifarResNet((8, 8, 8), num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(tta_logits(model, x, 0), model(x))
        mirror = 0.5 * (model(x) + model(x.flip(-1)))
        torch.testing.assert_close(tta_logits(model, x, 1), mirror)
        pad = F.pad(x, (1, 1, 1, 1), mode="reflect")
        views = [pad[..., :-2, :-2], pad[..., 2:, 2:]]
        shifted = sum(model(v) + model(v.flip(-1)) for v in views) / 4
        torch.testing.assert_close(tta_logits(model, x, 2), 0.5 * mirror + 0.5 * shifted)


def test_a_tta_level_that_is_not_0_1_or_2_is_refused():
    """tta_logits(model, x, 3) and evaluate(..., tta=3) ran level 2, and True or 1.0 (as eval_tta=True or 1.0) level 1,
    each as if it were asked; they are refused by name."""
    from vitlab.data.datasets import ImageArray
    from vitlab.train.loop import evaluate

    model = CifarResNet((8, 8, 8), num_classes=3).eval()
    model.pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}
    data = ImageArray(torch.zeros(2, 32, 32, 3, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), ("a",), "s")
    for level in (3, True, -1, 1.0):
        with pytest.raises(ValueError, match=f"level must be 0, 1 or 2, got {level!r}"):
            tta_logits(model, torch.zeros(1, 3, 32, 32), level)
        with pytest.raises(ValueError, match=f"tta must be 0, 1 or 2, got {level!r}"):
            evaluate(model, data, tta=level)
    for tta in (True, 1.0):
        with pytest.raises(ValueError, match=f"eval_tta must be 0, 1 or 2, got {tta!r}"):
            dataclasses.replace(PRESETS["tiny"], eval_tta=tta)


def test_an_evaluation_batch_size_that_is_no_count_is_refused_by_name():
    """evaluate, timm_pipeline_accuracy and distillation_facts with batch_size=0 or 2.5 failed in range() naming no
    argument, and batch_size=True ran batches of 1 image; all are refused as batch_size."""
    from vitlab.data.datasets import ImageArray
    from vitlab.train.export import distillation_facts, timm_pipeline_accuracy
    from vitlab.train.loop import evaluate

    model = CifarResNet((8, 8, 8), num_classes=3).eval()
    data = ImageArray(torch.zeros(2, 32, 32, 3, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), ("a",), "s")
    for batch_size in (0, 2.5, True):
        said = f"batch_size must be a whole number of at least 1, got {batch_size!r}"
        for run in (lambda b: evaluate(model, data, batch_size=b), lambda b: timm_pipeline_accuracy(model, data, b),
                    lambda b: distillation_facts(model, model, data, b)):
            with pytest.raises(ValueError, match=said):
                run(batch_size)


class _LeftOrRight(torch.nn.Module):
    """(B, 3, H, 2) -> logits (left - right, right - left) of the columns' means: class 0 when the left column is
    brighter. Mirrored, the logits are exactly negated, so their mean over an image and its mirror is a tie (class 0)."""

    pretrained_cfg = {"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        d = x[..., 0].mean((1, 2)) - x[..., 1].mean((1, 2))
        return torch.stack([d, -d], -1)


def test_evaluate_counts_every_batch_and_averages_over_the_mirror_with_tta():
    """5 images in batches of 2, the brighter column on the side of the label but for the last: 4 of 5 right; with
    test-time augmentation over the mirror every image ties at class 0, which 3 of the 5 are."""
    from vitlab.data.datasets import ImageArray

    bright_left = torch.tensor([1, 0, 1, 0, 0], dtype=torch.bool)  # (5,)
    images = torch.zeros(5, 2, 2, 3, dtype=torch.uint8)
    images[bright_left, :, 0] = 200
    images[~bright_left, :, 1] = 200
    data = ImageArray(images, torch.tensor([0, 1, 0, 1, 0]), ("left", "right"), "toy")
    assert evaluate(_LeftOrRight(), data, batch_size=2) == pytest.approx(4 / 5)
    assert evaluate(_LeftOrRight(), data, batch_size=2, tta=1) == pytest.approx(3 / 5)


def test_reflect_crop_flip_keeps_pixels_from_the_image():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(1, 255, (16, 8, 8, 3), dtype=torch.uint8)
    out = random_crop_flip(images, 2, g, mode="reflect")
    assert out.shape == images.shape and (out > 0).all()  # no zero padding shows
    out0 = random_crop_flip(images, 2, torch.Generator().manual_seed(0), mode="reflect")
    torch.testing.assert_close(out, out0)


def test_triangle_schedule_known_values():
    lrs = [lr_at(s, 100, 20, 1.0, 0.1, "triangle", start=0.2) for s in range(101)]
    assert lrs[0] == pytest.approx(0.2 + 0.8 / 20)
    assert lrs[19] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(1.0 - 0.9 * 40 / 80)
    assert lrs[100] == pytest.approx(0.1)


def test_sgd_groups_scale_the_norm_shifts_only():
    cfg = dataclasses.replace(PRESETS["resnet_cifar10"], model=TINY_CNN)
    model = vitlab.build_model(TINY_CNN)
    opt = _optimizer(model, cfg)
    rest, norm = opt.param_groups
    assert norm["lr_scale"] == 64.0 and norm["weight_decay"] == pytest.approx(cfg.weight_decay / 64)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(".norm" in names[id(p)] for p in norm["params"])
    assert not any(names[id(p)] == "whiten.weight" for p in rest["params"])  # frozen: not optimised
    assert opt.defaults["nesterov"] and opt.defaults["momentum"] == cfg.momentum


def _adamw_steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def test_a_fused_optimizers_checkpoint_resumes_into_the_cpus_foreach_adamw(tmp_path):
    """The ViT's AdamW runs foreach on a CPU. A run state written by a fused AdamW (as on an accelerator) resumes
    into it: the moments and step counts are the run's state, the implementation this process's choice, and the
    update goes on as it would have."""
    from vitlab.models.checkpoint import load_run_state, save_run_checkpoint

    cfg = dataclasses.replace(PRESETS["tiny"], model=TINY_VIT)
    torch.manual_seed(0)
    model = vitlab.build_model(TINY_VIT)
    twin = copy.deepcopy(model)
    opt = _optimizer(model, cfg)
    assert all(g["foreach"] and not g["fused"] for g in opt.param_groups)
    params, twin_params = list(model.parameters()), list(twin.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    fused = torch.optim.AdamW([{"params": [twin_params[index[id(p)]] for p in g["params"]],
                                "weight_decay": g["weight_decay"], "lr_scale": g["lr_scale"]} for g in opt.param_groups],
                              lr=cfg.lr, betas=(0.9, 0.999), fused=True)
    assert [len(g["params"]) for g in opt.param_groups] == [len(g["params"]) for g in fused.param_groups] == [
        sum(p.ndim > 1 for p in params) - 2, sum(p.ndim <= 1 for p in params) + 2]  # cls and pos: no decay
    _adamw_steps(opt, params, 3, seed=1)
    _adamw_steps(fused, twin_params, 3, seed=1)
    for a, b in zip(params, twin_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    save_run_checkpoint(tmp_path / "ck", twin, fused, None, {})
    resumed = _optimizer(model, cfg)
    load_run_state(tmp_path / "ck", resumed, None)
    assert all(g["foreach"] and not g["fused"] for g in resumed.param_groups)  # not the checkpoint's fused=True
    _adamw_steps(resumed, params, 2, seed=2)
    _adamw_steps(fused, twin_params, 2, seed=2)
    for a, b in zip(params, twin_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_hard_and_soft_distillation_losses_known_answers():
    g = torch.Generator().manual_seed(0)
    cls, dist, teach = (torch.randn(5, 4, generator=g) for _ in range(3))
    y = torch.tensor([0, 1, 2, 3, 0])
    target = F.one_hot(y, 4).float()
    cfg = TrainConfig(model=ViTConfig(distilled=True), teacher="x")
    hard = distill_loss(cls, dist, teach, target, cfg)
    torch.testing.assert_close(hard, 0.5 * F.cross_entropy(cls, y) + 0.5 * F.cross_entropy(dist, teach.argmax(-1)))
    soft_cfg = dataclasses.replace(cfg, distill="soft", distill_tau=2.0)
    p = F.softmax(teach / 2, -1)
    kl = (p * (p.log() - F.log_softmax(dist / 2, -1))).sum(-1).mean() * 4
    torch.testing.assert_close(distill_loss(cls, dist, teach, target, soft_cfg),
                               0.5 * F.cross_entropy(cls, y) + 0.5 * kl)


def test_teacher_requires_a_distilled_vit():
    with pytest.raises(ValueError, match="distilled=True"):
        TrainConfig(model=ViTConfig(), teacher="somewhere")
    with pytest.raises(ValueError, match="readout='token'"):
        ViTConfig(distilled=True, readout="avg")


def test_explicit_attention_and_eval_mode_restore_every_module():
    model = vitlab.build_model(dataclasses.replace(TINY_VIT, drop_path_rate=0.0)).train()
    model.blocks[0].eval()  # mixed modes
    flags = [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
    with pytest.raises(RuntimeError):
        with explicit_attention(model), eval_mode(model):
            assert not any(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
            assert not any(m.training for m in model.modules())
            raise RuntimeError("boom")
    assert [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")] == flags
    assert model.training and not model.blocks[0].training and model.blocks[1].training


def test_frozen_parameters_and_no_checkpointing_restore_each_flag_and_explicit_attention_can_be_off():
    """Each parameter's requires_grad and each module's grad_checkpointing come back as they were, mixed ones
    included (a frozen embedding stays frozen); explicit_attention(model, False) leaves every fused_attn alone."""
    from vitlab.base.modes import frozen_parameters, no_checkpointing

    model = vitlab.build_model(TINY_VIT)
    model.pos_embed.requires_grad_(False)
    model.set_grad_checkpointing(True)
    model.blocks[0].grad_checkpointing = False  # a module flag of its own, not the model's
    flags = [p.requires_grad for p in model.parameters()]
    ckpt = [(m, m.grad_checkpointing) for m in model.modules() if isinstance(getattr(m, "grad_checkpointing", None),
                                                                               bool)]
    assert any(f for _, f in ckpt)
    with frozen_parameters(model), no_checkpointing(model):
        assert not any(p.requires_grad for p in model.parameters())
        assert not any(m.grad_checkpointing for m, _ in ckpt)
    assert [p.requires_grad for p in model.parameters()] == flags and not model.pos_embed.requires_grad
    assert [m.grad_checkpointing for m, _ in ckpt] == [f for _, f in ckpt]
    model.blocks[0].attn.fused_attn, model.blocks[1].attn.fused_attn = True, False
    fused = [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
    with explicit_attention(model, False):
        assert [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")] == fused


def test_explicit_attention_gives_the_same_training_gradients():
    torch.manual_seed(0)
    model = vitlab.build_model(TINY_VIT).train()
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])

    def grads():
        model.zero_grad()
        torch.manual_seed(1)
        F.cross_entropy(model(x), y).backward()
        return [p.grad.clone() for p in model.parameters()]

    fused = grads()
    with explicit_attention(model):
        explicit = grads()
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_warm_start_copies_matching_tensors_and_position_grid(tmp_path):
    torch.manual_seed(0)
    src = vitlab.build_model(TINY_VIT)
    ck = save_checkpoint(src, tmp_path / "src")
    dst = vitlab.build_model(dataclasses.replace(TINY_VIT, distilled=True))
    fresh = warm_start(dst, ck)
    assert "dist_token" in fresh and "head_dist.weight" in fresh and "pos_embed (prefix rows 1..1)" in fresh
    torch.testing.assert_close(dst.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)
    torch.testing.assert_close(dst.pos_embed[:, 2:], src.pos_embed[:, 1:])  # the grid
    torch.testing.assert_close(dst.pos_embed[:, :1], src.pos_embed[:, :1])  # the class token's row
    # another grid (8 px patches: 4x4): the grid rows are resampled in 2D, as timm does for a new resolution
    from timm.layers import resample_abs_pos_embed

    coarse = vitlab.build_model(dataclasses.replace(TINY_VIT, patch_size=8))
    notes = warm_start(coarse, ck)
    assert "pos_embed (grid resampled (8, 8) -> (4, 4))" in notes and "patch_embed.proj.weight" in notes
    expected = resample_abs_pos_embed(src.pos_embed[:, 1:], new_size=[4, 4], old_size=[8, 8], num_prefix_tokens=0)
    torch.testing.assert_close(coarse.pos_embed[:, 1:], expected)
    # a finer grid (2 px patches: 16x16) is filled exactly as fine-tuning at twice the resolution fills it
    fine = vitlab.build_model(dataclasses.replace(TINY_VIT, patch_size=2))
    warm_start(fine, ck)
    resized = vitlab.resize_for_finetuning(copy.deepcopy(src), 64)
    assert resized.pos_embed.shape == fine.pos_embed.shape
    torch.testing.assert_close(fine.pos_embed, resized.pos_embed)
    # a fixed sin-cos model keeps the exact table of its own grid (resampling another grid's would blur it)
    sincos_src = save_checkpoint(vitlab.build_model(dataclasses.replace(TINY_VIT, pos_embed="sincos")), tmp_path / "s")
    sincos = vitlab.build_model(dataclasses.replace(TINY_VIT, pos_embed="sincos", patch_size=8))
    table = sincos.pos_embed.detach().clone()
    warm_start(sincos, sincos_src)
    torch.testing.assert_close(sincos.pos_embed, table, rtol=0, atol=0)
    torch.testing.assert_close(sincos.pos_embed[0, 1:], sincos_grid((4, 4), table.shape[-1], table), rtol=0, atol=1e-6)


def test_a_warm_start_from_another_architecture_is_refused_not_a_silent_fresh_start(tmp_path):
    """--set init_from= a ResNet (or a ViT of another width) copied nothing, exited 0 and trained from scratch,
    saying so only in a line --quiet hides; it is a ValueError now, naming the share that matched, with the model
    unchanged. A checkpoint of the model's shape with another head still warm-starts."""
    from conftest import tiny_bit

    torch.manual_seed(0)
    model = vitlab.build_model(TINY_VIT)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for other in (tiny_bit(), vitlab.build_model(dataclasses.replace(TINY_VIT, embed_dim=TINY_VIT.embed_dim * 2))):
        ck = save_checkpoint(other, tmp_path / type(other).__name__ / str(id(other)))
        with pytest.raises(ValueError, match=r"init_from .*shares \d+% of this VisionTransformer's weights.*another "
                                              r"architecture or size.*leave init_from unset"):
            warm_start(model, ck)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    head = save_checkpoint(vitlab.build_model(dataclasses.replace(TINY_VIT, num_classes=TINY_VIT.num_classes + 3)),
                           tmp_path / "head")
    assert warm_start(model, head) == ["head.weight", "head.bias"]


def test_a_warm_start_must_fill_half_of_the_models_weights(tmp_path):
    """The line is half: a 1-block checkpoint fills 59% of a 2-block model's weights (a warm start, the second
    block fresh) but only 42% of a 3-block one's (refused, the model unchanged)."""
    torch.manual_seed(0)
    ck = save_checkpoint(vitlab.build_model(dataclasses.replace(TINY_VIT, depth=1)), tmp_path / "one")
    two = vitlab.build_model(dataclasses.replace(TINY_VIT, depth=2))
    assert {k.split(".")[1] for k in warm_start(two, ck)} == {"1"}  # only the second block stayed fresh
    three = vitlab.build_model(dataclasses.replace(TINY_VIT, depth=3))
    before = {k: v.clone() for k, v in three.state_dict().items()}
    with pytest.raises(ValueError, match=r"shares 42% of this VisionTransformer's weights"):
        warm_start(three, ck)
    assert all(torch.equal(v, before[k]) for k, v in three.state_dict().items())


def test_warm_start_finds_a_checkout_folder_from_any_working_directory(tmp_path, monkeypatch):
    # a config names the shipped weights as data/checkpoints/...: that must not depend on where python was started
    shipped = vitlab.load_model("data/checkpoints/vit_shapes")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = vitlab.build_model(shipped.vitlab_config)
    assert warm_start(model, "data/checkpoints/vit_shapes") == []
    own, src = model.state_dict(), shipped.state_dict()
    # its fixed sin-cos table is rebuilt exactly, not copied from the half-precision file
    torch.testing.assert_close(own.pop("pos_embed"), src.pop("pos_embed"), rtol=0, atol=1e-3)
    torch.testing.assert_close(own, src, rtol=0, atol=0)


@pytest.fixture(scope="module")
def three_class_data(tmp_path_factory):
    return three_class_split(tmp_path_factory.mktemp("imgs3"))


def test_cnn_teacher_then_distilled_vit_train_end_to_end(tmp_path):
    train_data, test_data = three_class_split(tmp_path / "data")  # a folder, so that export finds the test split
    teacher_cfg = dataclasses.replace(PRESETS["resnet_cifar10"], model=TINY_CNN, epochs=2, batch_size=32,
                                      warmup_epochs=0.5, eval_tta=1)
    teacher = train(teacher_cfg, tmp_path / "teacher", progress=False, train_data=train_data, test_data=test_data)
    metrics = (tmp_path / "teacher" / "metrics.jsonl").read_text().splitlines()
    assert '"test_accuracy_tta"' in metrics[-1]
    last = json.loads(metrics[-1])  # bf16 where this CPU runs it fast, else float32 (vitlab.base.precision)
    assert evaluate(teacher, test_data, tta=1, bf16=last["precision"] == "bf16") == pytest.approx(
        last["test_accuracy_tta"])
    student_cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, distilled=True,
                                                                                 patch_drop_rate=0.5),
                                      teacher=str(tmp_path / "teacher" / "checkpoint"), epochs=1, batch_size=32,
                                      data=str(tmp_path / "data"))
    student = train(student_cfg, tmp_path / "student", progress=False, train_data=train_data, test_data=test_data)
    assert not student.distilled_training  # distillation mode is switched off again
    built = vitlab.build_model(student_cfg.model)
    assert [m.fused_attn for m in student.modules() if hasattr(m, "fused_attn")] == \
        [m.fused_attn for m in built.modules() if hasattr(m, "fused_attn")]  # flags as built, not left explicit
    with torch.no_grad():
        out = student(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 3)  # evaluation averages the two heads into one prediction
    # its card: each head's accuracy and how often it takes the teacher's decision, measured from the shipped weights
    from vitlab.cli import main
    from vitlab.train.export import distillation_facts

    assert main(["export", "--run-dir", str(tmp_path / "student"), "--out", str(tmp_path / "shipped"),
                 "--command-line", "vitlab train --preset tiny"]) == 0
    card = json.loads((tmp_path / "shipped" / "card.json").read_text())
    shipped = load_checkpoint(tmp_path / "shipped")
    assert card["distillation"] == distillation_facts(shipped, load_teacher(tmp_path / "teacher" / "checkpoint",
                                                                            torch.device("cpu")), test_data)
    assert card["distillation"]["readout"] == card["test_accuracy"]
    text = (tmp_path / "shipped" / "MODEL_CARD.md").read_text()
    assert f"distillation token {card['distillation']['distillation_head']:.2%}" in text


def test_a_cnn_teacher_runs_channels_last_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    cnn = vitlab.build_model(TINY_CNN).eval()
    save_checkpoint(cnn, tmp_path / "cnn")
    teacher = load_teacher(tmp_path / "cnn", torch.device("cpu"))
    convs = [m.weight for m in teacher.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs if w.shape[-1] > 1)
    assert not any(q.requires_grad for q in teacher.parameters()) and not teacher.training
    pc = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}  # a student normalising differently
    x = torch.randn(4, 3, 32, 32)
    xt = teacher_input(x, pc, teacher)
    assert xt.is_contiguous(memory_format=torch.channels_last)
    tc = teacher.pretrained_cfg
    expected = (x * 0.25 + 0.5 - torch.tensor(tc["mean"]).view(1, -1, 1, 1)) / torch.tensor(tc["std"]).view(1, -1, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(teacher(xt), cnn(expected.contiguous()), rtol=1e-4, atol=1e-4)
    save_checkpoint(vitlab.build_model(TINY_VIT), tmp_path / "vit")  # a ViT teacher keeps its layout
    vit_teacher = load_teacher(tmp_path / "vit", torch.device("cpu"))
    assert teacher_input(x, vit_teacher.pretrained_cfg, vit_teacher) is x


def test_teacher_input_is_the_images_normalised_as_the_teacher_is():
    """A student normalised with one mean and std, a teacher with another: the teacher is given the same uint8
    images normalised with its own."""
    from vitlab.data.datasets import normalize

    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    student = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    teacher = torch.nn.Linear(1, 1)
    teacher.pretrained_cfg = {"mean": (0.49, 0.48, 0.45), "std": (0.25, 0.24, 0.26)}
    got = teacher_input(normalize(images, student["mean"], student["std"]), student, teacher)
    torch.testing.assert_close(got, normalize(images, teacher.pretrained_cfg["mean"], teacher.pretrained_cfg["std"]))
    teacher.pretrained_cfg = {"mean": student["mean"], "std": (0.25, 0.24, 0.26)}  # the same mean, another std
    got = teacher_input(normalize(images, student["mean"], student["std"]), student, teacher)
    torch.testing.assert_close(got, normalize(images, student["mean"], teacher.pretrained_cfg["std"]))


def test_patch_dropping_keeps_both_prefix_tokens_of_a_distilled_vit():
    torch.manual_seed(0)
    model = vitlab.build_model(dataclasses.replace(TINY_VIT, distilled=True, patch_drop_rate=0.5)).train()
    assert model.patch_drop.num_prefix_tokens == 2
    seen = {}
    model.patch_drop.register_forward_hook(lambda _m, inp, out: seen.update(inp=inp[0], out=out))
    model.forward_features(torch.randn(3, 3, 32, 32))
    # the class and distillation tokens stay first, untouched; half of the 64 patches are kept
    torch.testing.assert_close(seen["out"][:, :2], seen["inp"][:, :2])
    assert seen["out"].shape[1] == 2 + 32


def test_a_teacher_for_other_classes_is_refused(tmp_path, three_class_data):
    train_data, test_data = three_class_data
    teacher = vitlab.build_model(dataclasses.replace(TINY_CNN, num_classes=10))
    save_checkpoint(teacher, tmp_path / "teacher")
    cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, distilled=True),
                              teacher=str(tmp_path / "teacher"), epochs=1, batch_size=32)
    with pytest.raises(ValueError, match="predicts 10 classes but the data has 3"):
        train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)


def test_any_image_size_resamples_the_position_table_and_restores_the_flags():
    from timm.layers import resample_abs_pos_embed

    from vitlab.base.modes import any_image_size

    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY_VIT, distilled=True)
    model = vitlab.build_model(cfg).eval()
    small = vitlab.build_model(dataclasses.replace(cfg, img_size=24)).eval()  # an independent 24 px model
    state = dict(model.state_dict())
    # timm's own resampling, as the code under test uses: this checks the prefix rows kept, the grid read as 8x8 and the
    # (B, h, w, C) token layout, not the interpolation itself
    state["pos_embed"] = resample_abs_pos_embed(model.pos_embed.detach(), new_size=(6, 6), old_size=(8, 8),
                                                num_prefix_tokens=2)
    small.load_state_dict(state)
    x = torch.randn(2, 3, 24, 24)
    def flags(m):
        return m.dynamic_img_size, m.patch_embed.strict_img_size, m.patch_embed.flatten, m.patch_embed.output_fmt

    built = flags(model)
    with torch.no_grad(), any_image_size(model):
        assert flags(model) != built
        torch.testing.assert_close(model(x), small(x))
    assert flags(model) == built
    with pytest.raises(RuntimeError), any_image_size(model):
        raise RuntimeError("a step fails")
    assert flags(model) == built
    with pytest.raises(TypeError, match="not a timm ViT"), any_image_size(vitlab.build_model(TINY_CNN)):
        pass


@pytest.mark.parametrize("phase", [dict(progressive_epochs=1), dict(progressive_fraction=0.4)])  # 0.4 x 2 -> 1
def test_progressive_resizing_trains_small_then_whole_and_the_teacher_sees_whole_images(tmp_path, three_class_data,
                                                                                      monkeypatch, phase):
    import vitlab.train.loop as vt

    train_data, test_data = three_class_data
    save_checkpoint(vitlab.build_model(TINY_CNN).eval(), tmp_path / "teacher")
    sizes = {"student": [], "teacher": []}
    real = vt.teacher_input
    monkeypatch.setattr(vt, "teacher_input", lambda x, pc, t: sizes["teacher"].append(x.shape[-1]) or real(x, pc, t))
    cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, distilled=True),
                              teacher=str(tmp_path / "teacher"), epochs=2, batch_size=32, progressive_size=24,
                              **phase)
    model = vt.build_model(cfg.model)
    monkeypatch.setattr(vt, "build_model", lambda _c: model)
    model.patch_embed.register_forward_pre_hook(lambda _m, inp: sizes["student"].append(inp[0].shape[-1]))
    train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)
    steps = len(train_data) // 32
    assert sizes["student"][:steps] == [24] * steps  # epoch 1 small; epoch 2 and every evaluation whole
    assert set(sizes["student"][steps:]) == {32} and sizes["teacher"] == [32] * (2 * steps)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("img_size") for r in records] == [24, None]
    fresh = vitlab.build_model(cfg.model)  # not the patched vt.build_model, which returns the trained one
    assert (model.dynamic_img_size, model.patch_embed.strict_img_size, model.patch_embed.flatten,
            model.patch_embed.output_fmt) == (fresh.dynamic_img_size, fresh.patch_embed.strict_img_size,
                                              fresh.patch_embed.flatten, fresh.patch_embed.output_fmt)  # as built


def test_distillation_targets_can_average_the_teacher_over_the_mirror(tmp_path, three_class_data, monkeypatch):
    import vitlab.train.loop as vt

    train_data, test_data = three_class_data
    teacher = vitlab.build_model(TINY_CNN).eval()
    save_checkpoint(teacher, tmp_path / "teacher")
    seen = []  # (the teacher's input, the logits the loss received)
    real_input, real_loss = vt.teacher_input, vt.distill_loss
    monkeypatch.setattr(vt, "teacher_input", lambda x, pc, t: seen.append([real_input(x, pc, t)]) or seen[-1][0])
    monkeypatch.setattr(vt, "distill_loss", lambda a, b, t, y, c: seen[-1].append(t) or real_loss(a, b, t, y, c))
    cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, distilled=True),
                              teacher=str(tmp_path / "teacher"), epochs=1, batch_size=32, distill_tta=1)
    train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)
    teacher = load_checkpoint(tmp_path / "teacher").eval()
    assert len(seen) == len(train_data) // 32
    with torch.no_grad():
        for x, logits in seen:
            mirrored = 0.5 * (teacher(x) + teacher(x.flip(-1)))
            torch.testing.assert_close(logits, mirrored)
            assert not torch.allclose(logits, teacher(x))  # not the plain forward
    with pytest.raises(ValueError, match="needs a teacher") as e:
        dataclasses.replace(PRESETS["tiny"], distill_tta=1)
    assert (e.value.param, e.value.value) == ("distill_tta", 1)
    with pytest.raises(ValueError, match="distill_tta must be 0, 1 or 2"):
        dataclasses.replace(cfg, distill_tta=3)


@pytest.mark.parametrize("changes,match", [
    (dict(progressive_size=22, progressive_epochs=1), "multiple of the patch size"),
    (dict(progressive_size=32, progressive_epochs=1), "multiple of the patch size"),
    (dict(progressive_size=24, progressive_epochs=0), "progressive_epochs must be"),
    (dict(progressive_size=24, progressive_epochs=3), "progressive_epochs must be"),
    (dict(progressive_size=24, progressive_epochs=1, model=TINY_CNN), "needs a plain ViT"),
    (dict(progressive_epochs=1), "progressive_epochs=1: needs a progressive_size"),
    (dict(progressive_size=24, progressive_fraction=1.0), "progressive_fraction must be a share"),
    (dict(progressive_size=24, progressive_fraction=-0.1), "progressive_fraction must be a share"),
    (dict(progressive_size=24, progressive_fraction="a third"), "progressive_fraction must be a share"),
    (dict(progressive_size=24, progressive_epochs=1, model=dataclasses.replace(TINY_VIT, img_size=(32, 48))),
     "shrinks square images"),
])
def test_progressive_resizing_settings_are_checked(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS["tiny"], epochs=2, **changes)


def _block_tokens(model, seen):
    """Record the token count entering the first block on each forward."""
    return model.blocks[0].register_forward_pre_hook(lambda _m, inp: seen.append(inp[0].shape[1]))


def test_all_patch_tokens_turns_patch_dropping_off_and_restores_the_rate():
    from vitlab.base.modes import all_patch_tokens

    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY_VIT, distilled=True, patch_drop_rate=0.5, drop_path_rate=0.0, drop_rate=0.0)
    model = vitlab.build_model(cfg).train()
    whole = vitlab.build_model(dataclasses.replace(cfg, patch_drop_rate=0.0)).train()  # independent: built without
    whole.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    seen = []
    _block_tokens(model, seen)
    with torch.no_grad():
        model(x)
        with all_patch_tokens(model):
            torch.testing.assert_close(model(x), whole(x))
        model(x)
    assert seen == [2 + 32, 2 + 64, 2 + 32]  # half of the 8x8 patches dropped, then all, then half again
    assert model.patch_drop.prob == 0.5
    with pytest.raises(RuntimeError), all_patch_tokens(model):
        raise RuntimeError("a step fails")
    assert model.patch_drop.prob == 0.5
    with all_patch_tokens(whole):  # nothing to turn off: passes through
        pass


def test_full_token_epochs_train_the_last_epochs_on_every_patch(tmp_path, three_class_data, monkeypatch):
    import vitlab.train.loop as vt

    train_data, test_data = three_class_data
    cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, patch_drop_rate=0.5), epochs=3,
                              batch_size=32, full_token_epochs=1)
    model = vt.build_model(cfg.model)
    monkeypatch.setattr(vt, "build_model", lambda _c: model)
    seen = []
    hook = _block_tokens(model, seen)
    train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)
    hook.remove()
    steps = len(train_data) // 32
    assert len(seen) > 3 * steps and len(seen) % 3 == 0
    # per epoch: its training steps, then its evaluation batches (all tokens)
    per_epoch = [seen[i * (len(seen) // 3): (i + 1) * (len(seen) // 3)] for i in range(3)]
    assert [e[:steps] for e in per_epoch] == [[1 + 32] * steps, [1 + 32] * steps, [1 + 64] * steps]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("all_tokens") for r in records] == [None, None, True]
    assert model.patch_drop.prob == 0.5  # the model's own rate, restored


@pytest.mark.parametrize("changes,match", [
    (dict(full_token_epochs=1), "drops no patches"),
    (dict(full_token_epochs=3, model=dataclasses.replace(TINY_VIT, patch_drop_rate=0.5)), "full_token_epochs must be"),
    (dict(full_token_epochs=-1, model=dataclasses.replace(TINY_VIT, patch_drop_rate=0.5)), "full_token_epochs must be"),
])
def test_full_token_epochs_settings_are_checked(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS["tiny"], epochs=2, **changes)


def test_epoch_and_step_counts_refuse_a_bool():
    """lookahead_every=True averaged after every step, full_token_epochs=True, progressive_epochs=True,
    whiten_bias_epochs=True counted 1 epoch and distill_tta=True or 1.0 ran 1 (a bool is an int to Python), each
    recorded as asked; all are refused by name as other values that are no count are."""
    vit = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, patch_drop_rate=0.5), epochs=2)
    for base, field, also in ((PRESETS["tiny"], "lookahead_every", {}), (vit, "full_token_epochs", {}),
                              (vit, "progressive_epochs", dict(progressive_size=16)),
                              (PRESETS["resnet_cifar10_fast"], "whiten_bias_epochs", {})):
        with pytest.raises(ValueError, match=f"{field} must be .*an int .*got True"):
            dataclasses.replace(base, **{field: True}, **also)
    for tta in (True, 1.0):  # read as 1
        with pytest.raises(ValueError, match=f"distill_tta must be 0, 1 or 2, got {tta!r}$"):
            dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, distilled=True), teacher="t",
                                distill_tta=tta)


def test_distillation_facts_match_an_independent_two_head_pass():
    """The card's per-head accuracies and teacher agreement equal what timm's own training-mode forward of a
    distilled ViT (the two heads' logits as a pair) gives on the same inputs."""
    import timm
    from PIL import Image

    from vitlab.data.datasets import ImageArray
    from vitlab.train.export import distillation_facts, timm_pipeline_accuracy

    torch.manual_seed(0)
    student = vitlab.build_model(dataclasses.replace(TINY_VIT, distilled=True)).eval()
    with torch.no_grad():  # heads that disagree with each other, so that each head's accuracy is its own
        student.head.weight.normal_()
        student.head_dist.weight.normal_()
    teacher = vitlab.build_model(TINY_CNN).eval()
    g = torch.Generator().manual_seed(0)
    data = ImageArray(torch.randint(0, 256, (40, 32, 32, 3), dtype=torch.uint8, generator=g),
                      torch.randint(0, 3, (40,), generator=g), ("a", "b", "c"), "random")
    student.train()
    teacher.to(torch.bfloat16)
    facts = distillation_facts(student, teacher, data, batch_size=16)
    # the callers' models come back as they were: the facts are taken on float32 copies in eval mode
    assert student.training and next(teacher.parameters()).dtype == torch.bfloat16
    student.eval()
    teacher.float()
    assert distillation_facts(student, teacher, data, batch_size=16) == facts

    def inputs(model):
        tf = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
        return torch.stack([tf(Image.fromarray(a)) for a in data.images.numpy()])

    student.set_distilled_training(True)
    student.train()  # TINY_VIT has no dropout, drop path or patch dropping: the same function, both heads returned
    with torch.no_grad():
        cls, dist = student(inputs(student))
        t = teacher(inputs(teacher)).argmax(-1)
    student.set_distilled_training(False)
    student.eval()
    y = data.labels

    def share(hit):
        return int(hit.sum()) / len(hit)

    readout = (cls + dist).argmax(-1)
    assert facts["class_head"] == share(cls.argmax(-1) == y)
    assert facts["distillation_head"] == share(dist.argmax(-1) == y)
    assert facts["readout"] == share(readout == y) == timm_pipeline_accuracy(student, data)
    assert facts["teacher"] == share(t == y) == timm_pipeline_accuracy(teacher, data)
    assert facts["readout_agrees_with_teacher"] == share(readout == t)
    assert facts["distillation_head_agrees_with_teacher"] == share(dist.argmax(-1) == t)
    assert facts["class_head"] != facts["distillation_head"] and facts["images"] == 40
    t_wrong, s_wrong = t != y, readout != y
    assert facts["readout_where_teacher_wrong"] == int((t_wrong & ~s_wrong).sum()) / int(t_wrong.sum())
    assert facts["readout_errors_shared_with_teacher"] == int((s_wrong & (readout == t)).sum()) / int(s_wrong.sum())
    from vitlab.train.export import _distillation  # a teacher gone by export: said so, under the name the card gives it

    assert _distillation(student, "data/checkpoints/gone", "/elsewhere/gone", data) == {
        "missing": "its teacher `data/checkpoints/gone` was not found at export"}


@pytest.mark.parametrize("changes,match", [
    (dict(batch_size=0), "batch_size must be a whole number >= 1, got 0"),
    (dict(batch_size=True), "batch_size must be a whole number"),
    (dict(epochs=2.5), "epochs must be a whole number >= 1, got 2.5"),
    (dict(eval_every=-1), "eval_every must be a whole number >= 0"),
    (dict(max_train_examples=0), "max_train_examples must be a whole number >= 1"),
    (dict(seed="0"), "seed must be a whole number"),
    (dict(lr=-1.0), "lr must be a number >= 0, got -1.0"),
    (dict(lr=float("nan")), "lr must be a number >= 0, got nan"),
    (dict(lr="1e-3"), "lr must be a number >= 0, got '1e-3'"),
    (dict(warmup_epochs=-3), "warmup_epochs must be a number >= 0"),
    (dict(label_smoothing=2), r"label_smoothing must be a number in \[0, 1\)"),
    (dict(mixup_prob=1.5), r"mixup_prob must be a number in \[0, 1\]"),
    (dict(ema_decay=1.0), r"ema_decay must be None \(no EMA\) or a number in \(0, 1\)"),
    (dict(momentum=1.0), r"momentum must be a number in \[0, 1\)"),
    (dict(grad_clip=-1.0), "grad_clip must be a number >= 0"),
    (dict(distill_tau=0.0), "distill_tau must be a number > 0"),
    (dict(warmup_epochs=3), r"warmup_epochs=3: exceeds the 2 epochs: .*dataclasses.replace\(cfg, warmup_epochs=0.4\)"),
    (dict(mixup_prob=0.5, mixup_alpha=0, cutmix_alpha=0), "mixup_prob=0.5: mixes nothing.*mixup_prob=0"),
    (dict(mixup_prob=0.5, batch_size=15), "batch_size=15: odd, but mixup and cutmix pair"),
])
def test_numeric_settings_are_checked(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS["tiny"], **changes)


def test_numeric_settings_accept_their_edges():
    """What the checks must let through: the presets, ints for float fields, the documented 0 = off values."""
    cfg = dataclasses.replace(PRESETS["tiny"], epochs=1, batch_size=1, lr=1, min_lr=0, warmup_epochs=1,
                              label_smoothing=0, grad_clip=0, mixup_prob=0, ema_decay=0.999, eval_every=0,
                              crop_padding=0, lr_start=1, seed=-3)
    assert (cfg.lr, cfg.warmup_epochs, cfg.seed) == (1, 1, -3)
    mixing = dataclasses.replace(PRESETS["tiny"], batch_size=2, mixup_prob=1, mixup_alpha=0, cutmix_alpha=1)
    assert mixing.mixup_alpha == 0  # one of the two alphas is enough
    for preset in PRESETS.values():
        assert dataclasses.replace(preset) == preset


def test_a_bad_number_from_the_command_line_is_refused_before_the_run_folder(tmp_path, capsys):
    from vitlab.cli import main

    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", "shapes", "--run-dir", str(run), "--quiet", "--set",
                 "batch_size=0"]) != 0
    assert "ParameterError: --set batch_size=0: must be a whole number >= 1" in capsys.readouterr().err
    assert not run.exists()


def test_images_of_another_size_are_refused_before_the_run_folder(tmp_path, three_class_data):
    """A ViT of 48 px on 32 px data (and a hybrid's ViT likewise) is refused naming both sizes and the setting,
    before anything is written; a CNN takes the data as it is."""
    train_data, test_data = three_class_data
    cfg = dataclasses.replace(PRESETS["tiny"], model=dataclasses.replace(TINY_VIT, img_size=48), epochs=1)
    with pytest.raises(ValueError, match=r"training images of .* are 32 x 32 px but the model is built for 48 x 48") as e:
        train(cfg, tmp_path / "run", progress=False, train_data=train_data, test_data=test_data)
    assert (e.value.param, e.value.value, e.value.fix[0].value) == ("model.img_size", 48, 32)
    small_test = dataclasses.replace(test_data, images=test_data.images[:, :16, :16])
    with pytest.raises(ValueError, match="test images of .* are 16 x 16 px but the model is built for 32 x 32"):
        train(dataclasses.replace(cfg, model=TINY_VIT), tmp_path / "run", progress=False, train_data=train_data,
              test_data=small_test)
    hybrid = PRESETS["hybrid_cifar10"].model
    hybrid = dataclasses.replace(hybrid, vit=dataclasses.replace(hybrid.vit, img_size=64))
    with pytest.raises(ValueError, match=r"dataclasses.replace\(cfg, model=dataclasses.replace\(cfg.model, "
                                         r"vit=dataclasses.replace\(cfg.model.vit, img_size=32\)\)\)"):
        train(dataclasses.replace(cfg, model=hybrid), tmp_path / "run", progress=False, train_data=train_data,
              test_data=test_data)
    assert not (tmp_path / "run").exists()


def test_a_progressive_share_not_in_effect_is_not_part_of_the_config():
    """With a count given, or no size, the share does nothing: the config holds 0 there, so a run saved before the
    default preset took a share (or with its count) resumes under today's preset with the same settings."""
    vit = dataclasses.replace(PRESETS["tiny"], epochs=6, progressive_size=24, progressive_fraction=0.5)
    assert vit.small_epochs == 3
    counted = dataclasses.replace(vit, progressive_epochs=2)
    assert counted.small_epochs == 2 and counted == dataclasses.replace(PRESETS["tiny"], epochs=6, progressive_size=24,
                                                                       progressive_epochs=2)
    off = dataclasses.replace(vit, progressive_size=None)
    assert off.small_epochs == 0 and off == dataclasses.replace(PRESETS["tiny"], epochs=6)
    # a warm start keeps the size its weights converged at (a share is a from-scratch lever); a count still applies
    warm = dataclasses.replace(vit, init_from="data/checkpoints/vit_cifar10")
    assert warm.small_epochs == 0 and warm == dataclasses.replace(off, init_from="data/checkpoints/vit_cifar10")
    assert dataclasses.replace(counted, init_from="x").small_epochs == 2
    # the share never covers the whole run: the last epoch trains at the size evaluation sees
    assert [dataclasses.replace(vit, epochs=n, warmup_epochs=0.0, progressive_fraction=0.95).small_epochs
            for n in (1, 2, 10)] == [0, 1, 9]


def test_a_refused_resume_names_what_restores_a_run_saved_before_the_preset_took_a_share():
    from vitlab.train.config import config_changes

    saved = dataclasses.replace(PRESETS["vit_cifar10"], progressive_size=None)  # as such runs stored it
    text = config_changes(saved, PRESETS["vit_cifar10"])
    assert text == "progressive_size: saved null, requested 24"  # --set progressive_size=null alone restores it


def test_a_warm_start_that_fails_leaves_the_model_as_it_was(tmp_path, monkeypatch):
    # the position grid is resampled after the class token was read: a failure there (or Ctrl-C) once left the class
    # token copied from the checkpoint and every other tensor at its initialisation
    import vitlab.train.warm_start as W

    ck = save_checkpoint(vitlab.build_model(TINY_VIT), tmp_path / "src")
    torch.manual_seed(1)
    coarse = vitlab.build_model(dataclasses.replace(TINY_VIT, patch_size=8))  # another grid: resampled
    before = {k: v.clone() for k, v in coarse.state_dict().items()}

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(W, "resample_grid", interrupted)
    with pytest.raises(KeyboardInterrupt):
        warm_start(coarse, ck)
    torch.testing.assert_close(coarse.state_dict(), before, rtol=0, atol=0)
