"""vitlab.inspect.compare: one row per method plus the random map, scores that agree with the functions behind them."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_vit

from vitlab.inspect import ATTRIBUTION_METHODS, deletion_insertion, localisation
from vitlab.inspect.compare import compare_methods


def test_rows_maps_and_scores_agree_with_the_underlying_functions():
    model, x = tiny_vit(), torch.randn(3, 3, 32, 32)
    masks = torch.zeros(3, 32, 32, dtype=torch.bool)
    masks[:, :16, :16] = True
    target = torch.tensor([1, 2, 3])
    rows, maps = compare_methods(model, x, target, masks=masks, methods=("rollout", "occlusion"), steps=8,
                                 sanity=False, progress=False)
    assert [r.method for r in rows] == ["rollout", "occlusion", "random map"]
    assert all(m.shape == (3, 8, 8) for m in maps.values())
    torch.testing.assert_close(maps["rollout"], ATTRIBUTION_METHODS["rollout"](model, x, target))
    for r in rows:
        di = deletion_insertion(model, x, maps[r.method], target, steps=8)
        loc = localisation(maps[r.method], masks)
        assert r.deletion_auc == pytest.approx(float(di["deletion"].mean()))
        assert r.insertion_auc == pytest.approx(float(di["insertion"].mean()))
        assert r.mass_in_mask == pytest.approx(float(loc["mass_in_mask"].mean()))
        assert r.fraction[0] == 0.0 and r.fraction[-1] == 1.0
    again, maps2 = compare_methods(model, x, target, methods=(), steps=8, sanity=False, progress=False)
    torch.testing.assert_close(maps2["random map"], maps["random map"])  # the random map is seeded


def test_one_target_for_every_image_and_wrong_counts():
    """compare_methods takes an int class as the map methods do (it was an AttributeError in the scores) and
    refuses a target count that is not one per image before any method runs."""
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    kw = dict(methods=("rollout",), steps=4, sanity=False, progress=False)
    rows, _ = compare_methods(model, x, 3, **kw)
    want, _ = compare_methods(model, x, torch.tensor([3, 3]), **kw)
    assert [r.deletion_curve for r in rows] == [r.deletion_curve for r in want]
    for bad in (torch.tensor([1, 2, 3]), torch.tensor([[1], [2]])):
        with pytest.raises(ValueError, match=r"one class index or one per image \(2\)"):
            compare_methods(model, x, bad, **kw)


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="unknown method 'saliency': choose one of"):
        compare_methods(tiny_vit(), torch.randn(1, 3, 32, 32), methods=("saliency",))


def test_one_method_name_as_a_string_is_named():
    """methods="rollout" was read letter by letter: "unknown method 'r'"."""
    with pytest.raises(TypeError, match=r"methods must be a list of method names, got the string 'rollout': pass "
                                        r"\['rollout'\]"):
        compare_methods(tiny_vit(), torch.randn(1, 3, 32, 32), methods="rollout")


def test_bad_masks_are_refused_before_any_map_is_computed(monkeypatch):
    """Masks of the wrong shape (or 0/255 values) were found only by localisation, after the first method's maps,
    sanity copy and curves had been computed (minutes on a real model); now they are refused before any map."""
    import vitlab.inspect.compare as compare_module

    def no_work(*args, **kwargs):
        raise AssertionError("a map was computed before the masks were checked")

    monkeypatch.setattr(compare_module, "randomized_copy", no_work)
    monkeypatch.setattr(compare_module, "deletion_insertion_scorer", no_work)
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"masks must be \(B, H, W\) with B = 2 and H, W multiples of the grid "
                                         r"\(8, 8\), got \(2, 30, 30\)"):
        compare_methods(tiny_vit(), x, masks=torch.ones(2, 30, 30, dtype=torch.bool), progress=False)
    with pytest.raises(ValueError, match="masks must be object masks of 0 and 1 \\(bool\\), got values from 0 to 255"):
        compare_methods(tiny_vit(), x, masks=torch.arange(2 * 32 * 32).reshape(2, 32, 32) % 256, progress=False)


def test_one_randomized_copy_serves_every_method(monkeypatch):
    """compare_methods drew the same re-initialised copy of the model again for each method's sanity check (a deep
    copy and new weights each time); one copy now serves them all, and the scores are those of the functions."""
    import vitlab.inspect.compare as compare_module
    import vitlab.inspect.faithfulness as faithfulness_module
    from vitlab.inspect import randomization_sanity

    real, seeds = faithfulness_module.randomized_copy, []

    def counted(model, seed=0):
        seeds.append(seed)
        return real(model, seed)

    monkeypatch.setattr(faithfulness_module, "randomized_copy", counted)
    monkeypatch.setattr(compare_module, "randomized_copy", counted, raising=False)
    model, x, target = tiny_vit(), torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    rows, _ = compare_methods(model, x, target, methods=("rollout", "gradient rollout", "occlusion"), steps=2, seed=3,
                              progress=False)
    assert seeds == [3]
    monkeypatch.setattr(faithfulness_module, "randomized_copy", real)
    for r in rows[:-1]:
        assert r.sanity_spearman == float(randomization_sanity(r.method, model, x, target, seed=3).mean())
    assert rows[-1].sanity_spearman is None  # the random map has no sanity score


def test_no_deletion_insertion_variant_is_evaluated_twice():
    """Step 0 and the last step of every deletion and insertion curve are the unchanged images or the baseline,
    whatever the map: compare_methods evaluated those 4 variants per image again for each map (and each curve);
    they are now evaluated once per call, and the curves are the same as deletion_insertion's, bit for bit."""
    model, x, target, steps = tiny_vit(), torch.randn(2, 3, 32, 32), torch.tensor([1, 2]), 4
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    try:
        rows, maps = compare_methods(model, x, target, methods=("rollout",), steps=steps, sanity=False,
                                     progress=False)
    finally:
        hook.remove()
    B = len(x)
    rollout, ends, per_map = B, 2 * B, 2 * B * (steps - 1)  # per map: both curves at steps 1 .. steps - 1
    assert sum(seen) == rollout + ends + len(rows) * per_map
    for r in rows:
        di = deletion_insertion(model, x, maps[r.method], target, steps=steps)
        assert r.deletion_curve == di["deletion_curve"].mean(0).tolist()
        assert r.insertion_curve == di["insertion_curve"].mean(0).tolist()
        assert (r.deletion_auc, r.insertion_auc) == (float(di["deletion"].mean()), float(di["insertion"].mean()))
