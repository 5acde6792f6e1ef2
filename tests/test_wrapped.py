"""Models as users hold them: wrapped (torch.compile, DataParallel), in half precision, with gradient checkpointing,
inside no-grad contexts. Each analysis gives the plain eval-mode model's result or a clear error, and leaves the
model as it was."""

from __future__ import annotations

import copy

import pytest
import torch

import vitlab
from vitlab.inspect import (
    attention_rollout,
    embedding_filter_pca,
    gradient_rollout,
    mean_attention_distance,
    position_embedding_similarity,
)


def _analyses(model, x) -> dict[str, torch.Tensor]:
    return {"maps": vitlab.attention_maps(model, x), "rollout": attention_rollout(model, x),
            "gradient rollout": gradient_rollout(model, x, target=1), "distance": mean_attention_distance(model, x),
            "positions": position_embedding_similarity(model), "filters": embedding_filter_pca(model, k=4)[1]}


def test_data_parallel_model_analysed_as_its_module(vit, x32):
    want = _analyses(vit, x32)
    wrapped = torch.nn.DataParallel(vit)
    assert vitlab.model_info(wrapped) == vitlab.model_info(vit)
    got = _analyses(wrapped, x32)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
    with vitlab.capture_attention(wrapped, queries="prefix") as cap:  # the module's class token, not "no prefix"
        wrapped(x32)
    assert cap.stack().shape == (3, 2, 3, 1, 65)


def test_compiled_model_analysed_eagerly(vit, x32):
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(vit, backend=counter)
    want = _analyses(vit, x32)
    got = _analyses(compiled, x32)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
    assert counter.frame_count == 0  # the original module ran: nothing traced, no recompiles around the hooks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_model_takes_its_own_precision_and_names_it(vit, x32, dtype):
    half = copy.deepcopy(vit).to(dtype)
    with pytest.raises(TypeError, match=rf"images are float32 but the model's weights are {str(dtype)[6:]}: pass "
                                        rf"images.to\(torch.{str(dtype)[6:]}\)"):
        attention_rollout(half, x32)
    want = _analyses(vit, x32)
    got = _analyses(half, x32.to(dtype))
    for k in want:
        torch.testing.assert_close(got[k].float(), want[k], rtol=0.05, atol=0.05, msg=k)
    assert all(p.dtype == dtype for p in half.parameters())


def test_raw_or_double_images_refused_by_name(vit, x32):
    pixels = (x32 * 60 + 128).clamp(0, 255).to(torch.uint8)
    for f in (attention_rollout, vitlab.inspect.integrated_gradients, mean_attention_distance):
        with pytest.raises(TypeError, match="images are uint8: the analyses take preprocessed float images"):
            f(vit, pixels)
        with pytest.raises(TypeError, match=r"images are float64 but the model's weights are float32: pass "
                                            r"images.to\(torch.float32\)"):
            f(vit, x32.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts the images itself: no refusal
        assert attention_rollout(vit, x32).shape == (2, 8, 8)


def test_gradient_checkpointing_model_gives_its_gradient_rollout(vit, x32):
    want = gradient_rollout(vit, x32, target=1)
    vit.set_grad_checkpointing(True)
    torch.testing.assert_close(gradient_rollout(vit, x32, target=1), want, rtol=0, atol=1e-6)
    with vitlab.capture_attention(vit, keep_grad=True) as cap:  # one map per layer: none recorded again in backward
        vit(x32.requires_grad_(True)).sum().backward()
        assert cap.grads().shape == (3, 2, 3, 65, 65)
    assert vit.grad_checkpointing is True


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_gradient_methods_inside_no_grad_contexts(vit, x32, context):
    from vitlab.inspect import integrated_gradients

    want = gradient_rollout(vit, x32, target=1), integrated_gradients(vit, x32, target=1, steps=4)
    with context():
        x = x32.clone()  # made inside the context, as a user's inputs are
        got = gradient_rollout(vit, x, target=1), integrated_gradients(vit, x, target=1, steps=4)
        assert torch.is_inference_mode_enabled() == (context is torch.inference_mode)
        assert not torch.is_grad_enabled()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    assert all(p.grad is None for p in vit.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_model_features(vit, dtype):
    from vitlab.data.images import cifar_test_sample
    from vitlab.probe.features import extract_readouts

    data = cifar_test_sample().subset(range(4))
    want = extract_readouts(vit, data, cache=False)
    half = copy.deepcopy(vit).to(dtype)
    got = extract_readouts(half, data, cache=False)
    for k in want:
        assert got[k].dtype == torch.float32
        torch.testing.assert_close(got[k], want[k], rtol=0.05, atol=0.05, msg=k)
    assert all(p.dtype == dtype for p in half.parameters())


def test_randomization_sanity_of_a_gradient_method_inside_inference_mode(vit, x32):
    from vitlab.inspect import randomization_sanity

    want = randomization_sanity("gradient rollout", vit, x32, target=1)
    with torch.inference_mode():
        got = randomization_sanity("gradient rollout", vit, x32, target=1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert all(p.requires_grad and p.grad is None for p in vit.parameters())


def test_data_parallel_model_saved_as_its_module(vit, x32, tmp_path):
    vitlab.save_checkpoint(torch.nn.DataParallel(vit), tmp_path / "ck")
    back = vitlab.load_checkpoint(tmp_path / "ck")
    torch.testing.assert_close(back.eval()(x32), vit(x32), rtol=0, atol=0)


def test_data_parallel_checkpoint_keeps_its_class_names(vit):
    from vitlab.data.images import head_class_names

    vit.vitlab_checkpoint = {"train": {"data": "cifar10"}}  # what load_checkpoint attaches for a CIFAR-10 run
    names = head_class_names(vit)
    assert names is not None and names[0] == "airplane"
    assert head_class_names(torch.nn.DataParallel(vit)) == names


def test_data_parallel_shapes_model_shown_shapes(vit):
    from vitlab.data.images import default_images

    vit.vitlab_checkpoint = {"train": {"data": "shapes"}}
    names = default_images(vit, 2)[0]
    assert default_images(torch.nn.DataParallel(vit), 2)[0] == names
    assert not names[0].startswith("airplane")  # the shapes' test draw, not CIFAR-10's


def test_a_model_resolved_once_is_never_unwrapped_or_read_again(vit, x32, monkeypatch):
    """A wrapped model resolved where it enters (``vitlab.resolve_model``) holds the module it wraps and its facts:
    handed to the analyses, none of them unwraps it again, its ``ModelInfo`` is read once per input size, and the
    numbers are those of the plain model. A resolved model resolves to itself; no model (a path) is refused."""
    import vitlab.models.info as I
    from vitlab.inspect.compare import compare_methods

    want = _analyses(vit, x32)
    rm = vitlab.resolve_model(torch.nn.DataParallel(vit))
    assert rm.module is vit and vitlab.resolve_model(rm) is rm
    reads, unwraps = [], []
    read, unwrap = I._read_info, I.unwrapped
    monkeypatch.setattr(I, "_read_info", lambda m, size: reads.append(size) or read(m, size))
    monkeypatch.setattr(I, "unwrapped", lambda m: unwraps.append(m) or unwrap(m))
    got = _analyses(rm, x32)
    rows, _ = compare_methods(rm, x32, sanity=False, progress=False)
    assert unwraps == [] and len(reads) == 2 and set(reads) == {None, (32, 32)}, reads  # own size, the images' once
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
    assert vitlab.model_info(rm) is rm.info() and rm.info_for(x32) is rm.info((32, 32)) == vitlab.model_info(vit, 32)
    assert len(rows) > 1
    with pytest.raises(TypeError, match="load_model"):
        vitlab.resolve_model("data/checkpoints/vit_cifar10")


def test_the_report_hands_its_sections_the_model_resolved_once(vit):
    """``report.sections.Inputs`` takes a plain or a resolved model: ``model`` is it resolved (what the builders hand
    the analyses), ``net`` the module they run; a copy with another run's model (``replace``) resolves that one."""
    import dataclasses

    from vitlab.report import sections as S

    rm = vitlab.resolve_model(vit)
    inp = S.Inputs(rm, rm.info(), [], None, [], {})
    assert inp.model is rm and inp.net is vit
    other = copy.deepcopy(vit)
    moved = dataclasses.replace(inp, net=torch.nn.DataParallel(other))
    assert moved.net is other and moved.model.module is other and moved.model is not rm
    assert S.Inputs(vit, None, [], None, [], {}).model.module is vit and S.Inputs(None, None, [], None, [], {}).model is None
