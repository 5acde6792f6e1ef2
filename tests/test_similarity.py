"""The Raghu et al. 2021 verdicts on CKA (vitlab.findings.similarity), their tables and jackknife
(vitlab.inspect.cka.SimilarityTables), their controls (vitlab.findings.controls) and the report section
(vitlab.report.similarity): known answers on constructed features and on tiny models; records, not sentences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_bit, tiny_vit

import vitlab
from vitlab.base.intervals import jackknife_interval
from vitlab.findings import controls as C
from vitlab.findings import similarity as SF
from vitlab.findings.verdict import DEPENDS_ON_CONVENTION, FAILS_CONTROL
from vitlab.inspect.cka import MinibatchCKA, feature_tables, layer_features, layer_similarity, similarity_tables


def _orth(d: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]


def staged_and_uniform(n: int = 64, d: int = 12, layers: int = 6, noise: float = 0.3, seed: int = 0):
    """Two constructed models' per-layer features (n, d) of the same n images, with known similarity structure:
    ``uniform``: every layer the same signal X, rotated, plus a little independent noise (CKA near 1 between all
    layers); ``staged``: its lower half built from X, its upper half from an independent signal Z (CKA near 0
    between the halves); ``decaying``: layer l mixes X and Z in proportion l / (L - 1), so similarity falls with the
    distance between layers."""
    g = torch.Generator().manual_seed(seed)
    x, z = (torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2))

    def layer(signal: torch.Tensor) -> torch.Tensor:
        return signal @ _orth(d, g) + noise * torch.randn(n, d, generator=g, dtype=torch.float64)

    uniform = [layer(x) for _ in range(layers)]
    staged = [layer(x if i < layers // 2 else z) for i in range(layers)]
    decaying = [layer(math.cos(math.pi / 2 * i / (layers - 1)) * x + math.sin(math.pi / 2 * i / (layers - 1)) * z)
                for i in range(layers)]
    return uniform, staged, decaying


# ---------------------------------------------------------------------------------------------- tables


def test_the_tables_give_layer_similarity_and_each_image_left_out_by_hand():
    a, b = tiny_vit(), tiny_bit()
    x = torch.randn(23, 3, 32, 32)
    t = similarity_tables(a, b, x, batch_size=8, progress=False)  # batches of 8, 8, 7
    assert t.batch.tolist() == [0] * 8 + [1] * 8 + [2] * 7 and t.aa.shape == (3, 3, 3) and t.loo_ab.shape[0] == 23
    assert torch.allclose(t.cka()[2], layer_similarity(a, b, x, batch_size=8, progress=False), atol=1e-12)
    aa, bb, _ = t.cka()
    assert torch.allclose(aa.diagonal(), torch.ones(3, dtype=torch.float64)) and torch.allclose(aa, aa.T)
    fa, fb = layer_features(a, x), layer_features(b, x)
    for i in (3, 20):  # image i left out of its batch, the other batches whole
        acc = MinibatchCKA(len(fa), len(fb))
        for s, e in ((0, 8), (8, 16), (16, 23)):
            keep = [j for j in range(s, e) if j != i]
            acc.update([f[keep] for f in fa], [f[keep] for f in fb])
        assert torch.allclose(t.jackknife()[2][i], acc.result(), atol=1e-6)


def test_tables_of_a_model_against_itself_and_reordered_are_its_own_numbers():
    uniform, staged, _ = staged_and_uniform()
    t = feature_tables(uniform, staged, batch_size=16)
    aa, bb, ab = t.cka()
    assert torch.allclose(t.self_pair("b").cka()[2], bb) and torch.allclose(t.self_pair("a").cka()[2], aa)
    order = [5, 0, 3, 3]
    r = t.reordered(a=order)
    assert torch.allclose(r.cka()[2], ab[order]) and torch.allclose(r.cka()[0], aa[order][:, order])
    assert torch.allclose(r.jackknife()[2], t.jackknife()[2][:, order])
    with pytest.raises(ValueError, match="same images"):
        feature_tables(uniform, [f[:10] for f in staged])
    with pytest.raises(ValueError, match="'a' or 'b'"):
        t.self_pair("c")


def test_the_jackknife_interval_of_a_mean_is_the_student_t_interval():
    """Leave-one-out means give the jackknife's standard error sd / sqrt(n) exactly."""
    from scipy.stats import t as student

    v = np.random.default_rng(0).normal(2.0, 1.5, 30)
    loo = (v.sum() - v) / (len(v) - 1)
    (lo, hi), method = jackknife_interval(float(v.mean()), loo, "images")
    half = student.ppf(0.975, 29) * v.std(ddof=1) / math.sqrt(30)
    assert (lo, hi) == pytest.approx((v.mean() - half, v.mean() + half), rel=1e-12)
    assert method.startswith("jackknife over 30 images")
    assert math.isnan(jackknife_interval(1.0, np.ones(30), "images")[0][0])  # no spread: no interval
    assert math.isnan(jackknife_interval(1.0, np.ones(1), "images")[0][0])


# ---------------------------------------------------------------------------------------------- verdicts


def test_a_uniform_model_is_more_uniform_than_a_staged_one_and_not_the_other_way():
    uniform, staged, _ = staged_and_uniform()
    v = SF.uniformity(feature_tables(uniform, staged, batch_size=16))
    assert (v.key, v.threshold, v.side, v.verdict) == ("raghu.uniformity", 0.0, ">", "reproduced")
    assert v.details["vit_half_cka"] > 0.8 and abs(v.details["resnet_half_cka"]) < 0.2
    assert v.statistic == pytest.approx(v.details["vit_half_cka"] - v.details["resnet_half_cka"])
    assert v.details["vit_lower"] == [0, 1, 2] and v.details["vit_upper"] == [3, 4, 5]
    assert "jackknife over 64 images" in v.details["interval_method"] and v.threshold_source
    w = SF.uniformity(feature_tables(staged, uniform, batch_size=16))
    assert w.verdict == "not reproduced" and w.statistic == pytest.approx(-v.statistic)


def test_lowest_layers_that_match_the_lower_half_reproduce_and_a_reversed_resnet_does_not():
    uniform, staged, _ = staged_and_uniform()
    vit = [staged[0], staged[0], staged[-1]]  # its lowest quarter (1 of 3 layers) is the staged model's signal X
    v = SF.lower_layers(feature_tables(vit, staged, batch_size=16))
    assert (v.key, v.verdict) == ("raghu.lower_layers", "reproduced")
    assert v.details["vit_rows"] == [0] and v.details["resnet_lower"] == [0, 1, 2]
    assert v.statistic == pytest.approx(v.details["lower_half_cka"] - v.details["upper_half_cka"])
    assert v.details["lower_half_cka"] > 0.8 and abs(v.details["upper_half_cka"]) < 0.2
    assert SF.lower_layers(feature_tables(vit, staged[::-1], batch_size=16)).verdict == "not reproduced"
    # a ResNet whose layers are all alike: no preference between its halves, whatever the ViT's layers are
    flat = SF.lower_layers(feature_tables(vit, [uniform[0]] * 6, batch_size=16))
    assert flat.statistic == pytest.approx(0.0, abs=1e-12) and flat.verdict == "inconclusive"


def test_halves_and_quarters_of_depth():
    assert (SF.lower_half(7), SF.upper_half(7), SF.lowest_quarter(7)) == ([0, 1, 2], [4, 5, 6], [0, 1])
    assert (SF.lower_half(5), SF.upper_half(5), SF.lowest_quarter(5)) == ([0, 1], [3, 4], [0, 1])
    assert (SF.lower_half(2), SF.upper_half(2), SF.lowest_quarter(2)) == ([0], [1], [0])
    assert SF.lowest_quarter(24) == list(range(6))


def test_too_few_images_or_layers_decide_nothing():
    uniform, staged, _ = staged_and_uniform(n=12)
    v = SF.uniformity(feature_tables(uniform, staged, batch_size=6))
    assert v.verdict == "inconclusive" and math.isnan(v.interval[0])
    assert v.details["no_interval"] == f"12 images, at least {SF.MIN_IMAGES} needed"
    with pytest.raises(ValueError, match="at least 2 layers"):
        SF.uniformity(feature_tables(uniform[:1], staged, batch_size=6))


def test_both_representations_judged_and_a_disagreement_is_inconclusive():
    uniform, staged, _ = staged_and_uniform()
    agree = SF.judge_similarity({"tokens": feature_tables(uniform, staged, batch_size=16),
                                 "patch_mean": feature_tables(uniform, staged, batch_size=16)})
    assert [v.key for v in agree] == list(SF.KEYS) and agree[0].verdict == "reproduced"
    assert list(agree[0].conventions) == [SF.REPRESENTATION_WORDS["tokens"], SF.REPRESENTATION_WORDS["patch_mean"]]
    differ = SF.judge_similarity({"tokens": feature_tables(uniform, staged, batch_size=16),
                                  "patch_mean": feature_tables(staged, uniform, batch_size=16)})
    assert differ[0].verdict == "inconclusive" and differ[0].qualifier == DEPENDS_ON_CONVENTION
    assert differ[0].statistic == agree[0].statistic  # the first convention's numbers are shown


# ---------------------------------------------------------------------------------------------- controls


def test_the_controls_give_their_known_answers_on_a_model_whose_similarity_falls_with_depth():
    uniform, staged, decaying = staged_and_uniform(n=96)
    tables = feature_tables(decaying, staged, batch_size=32)
    results = C.similarity_controls(tables)
    assert set(results) == set(SF.KEYS)
    for key in SF.KEYS:
        assert [(r.control, r.kind) for r in results[key]] == list(C.CONTROLS[key])
        assert {r.kind for r in results[key]} == {C.POSITIVE, C.NEGATIVE} and all(r.passed for r in results[key])
    by_name = {r.control: r for rs in results.values() for r in rs}
    assert by_name[C.SHUFFLED_VS_VIT].statistic == pytest.approx(-by_name[C.VIT_VS_SHUFFLED].statistic)
    assert by_name[C.RESNET_REVERSED].statistic == pytest.approx(-by_name[C.RESNET_SELF].statistic)
    verdicts = C.validate(SF.judge_similarity({"tokens": tables}), results)
    assert all(len(v.controls) == 3 and not v.failed_controls for v in verdicts)
    assert C.interleaved(7) == [0, 6, 1, 5, 2, 4, 3] and sorted(C.interleaved(6)) == list(range(6))


def test_a_model_without_depth_structure_fails_the_shuffled_control_and_its_reproduced_is_withdrawn():
    """A ViT whose layers are all alike is more uniform than a staged ResNet, but shuffling it changes nothing: the
    positive control cannot show that the criterion sees depth structure in it, so "reproduced" becomes
    inconclusive."""
    uniform, staged, _ = staged_and_uniform()
    tables = feature_tables(uniform, staged, batch_size=16)
    v = C.validate(SF.judge_similarity({"tokens": tables}), C.similarity_controls(tables))[0]
    assert C.SHUFFLED_VS_VIT in v.failed_controls
    assert v.verdict == "inconclusive" and FAILS_CONTROL in v.qualifier


# ---------------------------------------------------------------------------------------------- the report


def _inputs(net, n: int, untrained: bool = False):
    from vitlab.report import sections as S

    x = torch.randn(n, 3, 32, 32)
    return S.Inputs(net, vitlab.model_info(net), [f"i{k}" for k in range(n)], x, [], {"model": "tiny", "images": "x"},
                    untrained=untrained, name="tiny", data=f"{n} noise images")


def test_the_report_section_carries_both_verdicts_with_their_controls_and_renders():
    from vitlab.report.render import render_html, validation_rows
    from vitlab.report.similarity import similarity

    torch.manual_seed(0)
    sec = similarity(_inputs(tiny_vit(), 20), resnet=tiny_bit(), resnet_name="tiny bit", batch_size=10)
    assert sec.slug == "similarity" and sec.figure is not None and not sec.not_judged
    assert sec.stamp["settings"]["compared_with"] == "tiny bit" and sec.stamp["settings"]["batch_size"] == 10
    assert [v.key for v in sec.verdicts] == list(SF.KEYS)
    assert all(len(v.controls) == 3 and v.subject == "tiny on 20 noise images against tiny bit" for v in sec.verdicts)
    assert all(len(v.conventions) == 2 for v in sec.verdicts)
    cka = sec.metrics["cka"]["tokens"]
    assert np.asarray(cka["vit_vit"]).shape == (3, 3) and np.asarray(cka["vit_resnet"]).shape == (3, 3)
    assert sec.verdicts[0].details["vit_half_cka"] == pytest.approx(np.asarray(cka["vit_vit"])[0, 2])
    assert len(sec.figure.data) == 3 and sec.metrics["layers"]["vit"] == ["block 1", "block 2", "block 3"]
    assert {r["key"] for r in validation_rows([sec])} == set(SF.KEYS)
    from vitlab.figures.plots import similarity_figure

    t = feature_tables(*staged_and_uniform(layers=4)[:2], batch_size=16)
    assert list(similarity_figure(*t.cka(), ["only one name"], ["a", "b", "c", "d"]).data[0].x) == [f"layer {i}" for i in
                                                                                           range(1, 5)]
    page = render_html({"model": "tiny", "headline": "", "facts": [], "vitlab": "0", "seconds": 0}, [sec])
    assert "id='similarity'" in page and page.count("Plotly.newPlot") == 1


def test_random_weights_decide_nothing_and_a_pair_that_cannot_share_images_is_not_judged():
    from vitlab.report.similarity import SIMILARITY_FINDING, similarity

    sec = similarity(_inputs(tiny_vit(), 20, untrained=True), resnet=tiny_bit(), batch_size=10)
    assert all(v.verdict == "inconclusive" and v.details["untrained"] for v in sec.verdicts)
    few = similarity(_inputs(tiny_vit(), 4), resnet=tiny_bit())
    assert few.figure is None and not few.verdicts and few.not_judged[0][0] == SIMILARITY_FINDING
    from vitlab.models.config import CIFAR_PRE

    other = vitlab.build_model(vitlab.BiTConfig(layers=(1, 1), stem="cifar", img_size=32, num_classes=10,
                                                preprocess=CIFAR_PRE)).eval()
    moved = similarity(_inputs(tiny_vit(), 20), resnet=other)
    assert moved.figure is None and "normalised" in moved.not_judged[0][1]


def test_cka_matrices_draw_one_heatmap_per_panel_on_one_scale():
    from vitlab.figures.plots import cka_matrices

    m = np.array([[1.0, 0.2], [0.2, 1.0]])
    fig = cka_matrices([("a", m, ["l1", "l2"], ["l1", "l2"]), ("b", m - 0.3, ["l1", "l2"], ["s1", "s2"])])
    assert len(fig.data) == 2 and {t.zmax for t in fig.data} == {1.0} and fig.data[0].zmin == pytest.approx(-0.1)
    assert list(fig.data[1].x) == ["s1", "s2"] and [t.showscale for t in fig.data] == [True, False]
