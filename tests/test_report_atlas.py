"""The report's head atlas and token diagnostic sections (vitlab.report.atlas) on tiny models with known answers, and
the criteria and tensors they format (vitlab.findings.atlas, vitlab.inspect.heads and vitlab.inspect.tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_timm, tiny_vit
from test_heads import one_head_model
from test_tokens import uniform_attention

import vitlab
from vitlab.findings import atlas as F
from vitlab.inspect.distance import uniform_attention_distance
from vitlab.inspect.heads import head_groups
from vitlab.inspect.tokens import TokenNorms, outlier_fence, prefix_removed, rollout_prefix_change
from vitlab.report import atlas as A
from vitlab.report import metrics_json
from vitlab.report import sections as S


def inputs(net, n: int = 24, seed: int = 1) -> S.Inputs:
    torch.manual_seed(seed)
    x = torch.randn(n, 3, 32, 32)
    return S.Inputs(net, vitlab.model_info(net), [str(i) for i in range(n)], x, [np.zeros((32, 32, 3), np.uint8)] * n,
                    {"model": "tiny", "weights": "random", "versions": {}, "images": f"{n} random"})


@pytest.fixture(scope="module")
def lowest_head():
    """The one-head model with its head in the lowest block (tiny_vit: 3 blocks, so block 0 alone is the lowest)."""
    net = one_head_model(layer=0, head=1)
    inp = inputs(net)
    return inp, S.prediction_pass(inp)


def test_the_atlas_finds_the_one_lowest_layer_head_that_carries_the_class_signal(lowest_head):
    inp, pred = lowest_head
    sec = A.head_atlas(inp, pred, batch_size=10)
    m = sec.metrics
    assert sec.slug == "head_atlas" and sec.figure is not None
    assert m["lowest_layers"] == 1 and m["threshold_nats"] == F.MATTERS_NATS and m["shared"]
    assert m["targets"].startswith("the unablated model's predicted classes") and m["base_accuracy"] == 1.0
    codes = torch.tensor(m["groups"])
    assert codes[1:].eq(0).all() and sorted(codes[0].tolist()) == [1, 2, 2]  # 3 heads: 1 local, 2 global
    carrier = "local" if codes[0, 1] == 1 else "global"
    other = {"local": "global", "global": "local"}[carrier]
    for ablation in ("mean", "zero"):
        groups = m["ablations"][ablation]["groups"]
        assert groups[carrier]["matters"] == "matters" and groups[carrier]["interval"][0] > F.MATTERS_NATS
        assert [0, 1] in groups[carrier]["heads"]
        # the other heads' outputs reach nothing (zero projection columns): exactly no drop, a degenerate interval
        assert groups[other]["matters"] == "does not matter"
        assert groups[other]["drop"] == 0 and groups[other]["interval"] == [0.0, 0.0]
        lo, hi = m["ablations"][ablation]["local_minus_global"]["interval"]
        assert (lo > 0) if carrier == "local" else (hi < 0)  # the carrier's group matters more
        drop = np.array(m["ablations"][ablation]["logprob_drop"])
        assert np.unravel_index(drop.argmax(), drop.shape) == (0, 1)
    assert f"{F.MATTERS_NATS} nats" in sec.ours and "does not matter" in sec.ours
    json.loads(metrics_json({"figures": [sec.metrics]}))  # JSON-ready


def test_the_atlas_figure_draws_head_importance_table_against_distance(lowest_head):
    inp, pred = lowest_head
    sec = A.head_atlas(inp, pred, batch_size=24)
    res = vitlab.head_importance(inp.net, inp.x, pred["pred"], progress=False)
    dist = pred["distance"].double().mean(1)
    panel = [t for t in sec.figure.data if t.xaxis in (None, "x")]  # the mean-ablation panel
    got = {(int(c[0]) - 1, int(c[1])): (x, y) for t in panel for x, y, c in zip(t.x, t.y, t.customdata)}
    assert len(got) == 9
    for (i, j), (x, y) in got.items():
        assert x == pytest.approx(float(dist[i, j])) and y == pytest.approx(float(res.logprob_drop[i, j]))


def test_groups_split_the_lowest_layers_heads_by_distance():
    d = torch.tensor([[3.0, 1.0, 2.0, 4.0], [0.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    assert head_groups(d, 1).tolist() == [[2, 1, 1, 2], [0] * 4, [0] * 4]
    assert head_groups(d, 2)[:2].eq(1).sum() == 4  # 8 heads: the 4 nearest local
    assert [F.lowest_layers(n) for n in (1, 3, 7, 12, 24)] == [1, 1, 2, 3, 6]


def test_a_model_without_a_trained_head_gets_no_atlas():
    inp = inputs(tiny_vit(), n=2)
    sec = A.head_atlas(inp, {"pred": None, "distance": torch.zeros(3, 2, 3)})
    assert sec.figure is None and sec.ours.startswith("Not measured")


def test_uniform_attention_gives_each_prefix_token_one_over_t_and_known_convention_changes():
    """Every block attends uniformly: each prefix token gets 1/T of every head's attention; renormalising the prefix
    share away raises every head's distance by exactly p/T of the uniform distance; rollout's patch map is the same
    in both conventions."""
    net = uniform_attention(tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, reg_tokens=2,
                                      num_classes=10))
    inp = inputs(net, n=6)
    info = inp.info
    pred = S.prediction_pass(inp)
    prefix, norms = A.token_sections(inp, pred, batch_size=4)
    T, p = info.num_tokens, info.num_prefix_tokens
    assert (prefix.slug, norms.slug) == ("prefix_attention", "token_norms")
    assert prefix.metrics["prefix_kinds"] == ["class", "reg", "reg"]
    share = torch.tensor(prefix.metrics["share"])
    assert share.shape == (2, 3, 3) and torch.allclose(share, torch.full_like(share, 1 / T), atol=1e-6)
    ceiling = uniform_attention_distance(info.grid_size, info.patch_size)
    dist = prefix.metrics["distance"]
    assert dist["largest_layer_change_px"] == pytest.approx(p / T * ceiling, rel=1e-4)
    assert dist["largest_head_change_share"] == pytest.approx(p / T, rel=1e-4)
    roll = prefix.metrics["rollout"]
    assert roll["total_variation"]["mean"] == pytest.approx(0, abs=1e-9)
    assert 0 < roll["prefix_mass"]["mean"] < 1
    assert set(norms.metrics) >= {"verdict", "criterion", "layers", "lines", "fences", "prefix_kinds"}
    assert [r["layer"] for r in norms.metrics["layers"]] == [1, 2]
    assert prefix.figure is not None and norms.figure is not None
    assert [t.name for t in norms.figure.data][-1] == "outlier fence"
    json.loads(metrics_json({"figures": [prefix.metrics, norms.metrics]}))


def test_a_model_without_prefix_tokens_says_so():
    net = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=False, global_pool="avg",
                    num_classes=10)
    inp = inputs(net, n=3)
    sec = A.prefix_section(inp, S.prediction_pass(inp))
    assert sec.figure is None and sec.metrics["prefix_kinds"] == [] and "no prefix tokens" in sec.ours
    assert sec.metrics["distance"]["largest_head_change_px"] == pytest.approx(0, abs=1e-5)  # float rounding alone


def _norms(outlier_share: float, outlier_norm: float, images: int = 40, patches: int = 100) -> TokenNorms:
    """Two layers of patch norms about 10 (a spread of 1), one prefix token; in layer 2 each image's first
    ``outlier_share`` of patches has norm ``outlier_norm``."""
    g = torch.Generator().manual_seed(0)
    norms = 10 + torch.randn(2, images, 1 + patches, generator=g)
    norms[1, :, 1:1 + round(outlier_share * patches)] = outlier_norm
    fences = outlier_fence(norms[..., 1:])
    return TokenNorms(norms=norms, prefix_kinds=("class",), fences=fences,
                      outliers=norms[..., 1:].double() > fences[:, None, None])


def test_outliers_are_present_only_when_many_enough_and_far_enough_above_the_rest():
    verdict, rows = F.outlier_layers(_norms(0.03, 100.0))  # Darcet-like: 3% of patches at 10x the norm
    assert verdict == "present" and [r["verdict"] for r in rows] == ["absent", "present"]
    assert rows[1]["share"] == pytest.approx(0.03) and rows[1]["norm_ratio"] == pytest.approx(10, rel=0.05)
    assert rows[1]["interval"] == [0.03, 0.03]  # every image alike: no spread
    assert F.outlier_layers(_norms(0.03, 16.0))[0] == "absent"  # beyond the fence but 1.6x the median: not high-norm
    assert F.outlier_layers(_norms(0.0, 0.0))[0] == "absent"


def test_prefix_removal_renormalises_rows_over_the_patches_and_keeps_rows_without_patch_attention():
    maps = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    maps[0, 0, 0] = torch.tensor([1.0, 0, 0, 0, 0])  # a class token attending only to itself (ConViT, not joined)
    out = prefix_removed(maps, 2)
    assert torch.equal(out[0, 0, 0], maps[0, 0, 0])
    rest = torch.ones(2, 3, 5, dtype=torch.bool)
    rest[0, 0, 0] = False
    assert (out[..., :2][rest] == 0).all() and torch.allclose(out.sum(-1), torch.ones(2, 3, 5))
    assert torch.allclose(out[1, 2, 3, 2:], maps[1, 2, 3, 2:] / maps[1, 2, 3, 2:].sum())



def test_true_classes_are_targets_only_for_a_head_with_the_samples_classes():
    from vitlab.data.images import default_labels, head_labels

    default = vitlab.load_model(None)  # a CIFAR-10 checkpoint: the CIFAR sample's labels are its classes
    assert torch.equal(head_labels(default, 5), default_labels(default, 5)[0])
    assert head_labels(tiny_vit(), 5) is None  # 10 classes of nothing in particular: no true class of its head


def test_the_criteria_and_tensors_load_without_the_report():
    """Notebook 10 reads the head atlas and the token diagnostics from the analysis layers: their criteria and
    tensors import without loading vitlab.report (they lived in vitlab.report.atlas)."""
    import subprocess
    import sys

    code = ("import sys; import vitlab.findings.atlas, vitlab.inspect.heads, vitlab.inspect.tokens; "
            "print(sorted(m for m in sys.modules if m.startswith('vitlab.report')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rollout_of_a_model_without_prefix_tokens_does_not_change_between_conventions():
    net = tiny_timm("vit_tiny_patch16_224", img_size=32, patch_size=4, class_token=False, global_pool="avg",
                    num_classes=10)
    torch.manual_seed(0)
    change = rollout_prefix_change(net, torch.randn(5, 3, 32, 32), batch_size=2)
    assert set(change) == {"spearman", "total_variation", "prefix_mass"}
    assert all(v.shape == (5,) and v.dtype == torch.float64 for v in change.values())
    assert torch.allclose(change["spearman"], torch.ones(5, dtype=torch.float64)) and change["prefix_mass"].eq(0).all()
    assert change["total_variation"].abs().max() < 1e-6  # float32 maps renormalised: rounding alone
    summary = F.rollout_convention_change(change)
    assert summary["spearman"]["mean"] == pytest.approx(1.0) and summary["prefix_mass"]["interval"] == [0.0, 0.0]


def test_head_groups_refuse_a_lowest_count_outside_the_blocks():
    d = torch.rand(3, 4)
    for bad in (0, 4, 1.5):
        with pytest.raises(ValueError, match="lowest must be a number of blocks from 1 to 3"):
            head_groups(d, bad)
    with pytest.raises(ValueError, match=r"distance must be \(L, H\)"):
        head_groups(torch.rand(3, 4, 2), 1)


def test_group_effects_refuse_distances_of_other_heads(lowest_head):
    inp, pred = lowest_head
    res = vitlab.head_importance(inp.net, inp.x, pred["pred"], progress=False)
    assert res.most_important() == (0, 1)  # the one head that carries the class signal
    groups = F.head_group_effects({"mean": res}, pred["distance"].double().mean(1))
    assert groups.lowest == 1 and groups.effects["mean"]["local"] is not None
    carrier = 1 if groups.codes[0, 1] == 1 else -1  # +1: the carrier is a local head
    diff, (lo, hi), _ = F.local_minus_global(res, groups.codes)
    per_head = groups.effects["mean"]["local"].drop - groups.effects["mean"]["global"].drop
    assert diff == pytest.approx(per_head) and carrier * lo > 0 and lo <= diff <= hi
    assert F.local_minus_global(res, torch.zeros_like(groups.codes)) is None
    with pytest.raises(ValueError, match=r"heads \(3, 3\) are not the \(3, 2\) heads"):
        F.head_group_effects({"mean": res}, torch.zeros(3, 2))


def test_a_model_without_patches_above_the_fence_reads_none_not_a_missing_ratio():
    """Random weights put no patch above the fence: the sentence said "their median norm n/ax the layer's"."""
    rows = F.outlier_layers(_norms(0.0, 0.0))[1]
    top = max(rows, key=lambda r: r["share"])
    assert top["share"] == 0 and np.isnan(top["norm_ratio"])
    assert F.fence_words(top) == "none in any layer"
    present = F.outlier_layers(_norms(0.03, 100.0))[1][1]
    assert F.fence_words(present).startswith("at most 0.03 [0.03, 0.03] (layer 2, ") and "n/a" not in F.fence_words(present)
