"""The Fig. 7 statistics during training: known answers, agreement with the saved snapshots, bands over seeds."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from scipy.fft import idctn

import vitlab
from vitlab.inspect.distance import mean_attention_distance, uniform_attention_distance
from vitlab.train.config import PRESETS, TrainConfig, with_num_classes
from vitlab.train.emergence import (
    LOCAL_HEAD,
    emergence_bands,
    fig7_statistics,
    lowest_layer,
    sample_batch,
    snapshot_history,
)
from vitlab.train.loop import train


def _distinct_frequencies(p: int, n: int) -> list[tuple[int, int]]:
    """The ``n`` lowest DCT frequencies (u, v) of a p x p patch with pairwise distinct radius, constant left out."""
    seen, out = set(), []
    for u, v in sorted(((u, v) for u in range(p) for v in range(p)), key=lambda f: (math.hypot(*f), f))[1:]:
        r = round(math.hypot(u, v), 9)
        if r not in seen:
            seen.add(r)
            out.append((u, v))
    return out[:n]


def test_fig7_statistics_known_answers_on_constructed_weights():
    model = vitlab.build_model(vitlab.vit_config("Ti/8", img_size=32, patch_size=8, depth=2, embed_dim=64,
                                                 num_heads=2, num_classes=10)).eval()  # 64 filters of 3 x 8 x 8
    freqs = _distinct_frequencies(8, 32)
    with torch.no_grad():
        w = torch.zeros(64, 3, 8, 8, dtype=torch.float64)
        for i, (u, v) in enumerate(freqs):  # filters +-(64 - i) basis_i: mean 0, variance falling with i
            coef = np.zeros((8, 8))
            coef[u, v] = 1.0
            w[2 * i, 0] = (64 - i) * torch.from_numpy(idctn(coef, norm="ortho"))
            w[2 * i + 1, 0] = -w[2 * i, 0]
        model.patch_embed.proj.weight.copy_(w.float())
    x = torch.randn(4, 3, 32, 32)
    rec = fig7_statistics(model, x)
    assert rec["filter_frequency"] == pytest.approx(1.0)  # the 28 components: the bases by rising radius
    dist = mean_attention_distance(model, x, progress=False).double()  # (L, H) px, the analysis the record reads
    ceiling = uniform_attention_distance((4, 4), (8, 8))
    assert rec["lowest_min"] == pytest.approx(float(dist[0].min()) / ceiling)
    assert rec["lowest_spread"] == pytest.approx(float(dist[0].max() - dist[0].min()) / ceiling)
    assert rec["layer_mean_px"] == pytest.approx(dist.mean(1).tolist())
    assert rec["depth_trend"] == pytest.approx(1.0 if dist[1].mean() > dist[0].mean() else -1.0)  # 2 layers: +-1
    assert rec["lowest_heads"] == pytest.approx((dist[0] / ceiling).tolist())
    assert rec["lowest_local_share"] == pytest.approx(float((dist[0] / ceiling < LOCAL_HEAD).double().mean()))


def test_fig7_statistics_measures_without_autograd(monkeypatch):
    """A record is a measurement: the analyses run with autograd off (a model's forward builds no graph)."""
    import vitlab.inspect.distance as distance

    seen = []
    measure = distance.mean_attention_distance
    monkeypatch.setattr(distance, "mean_attention_distance",
                        lambda *a, **k: seen.append(torch.is_grad_enabled()) or measure(*a, **k))
    model = vitlab.build_model(vitlab.vit_config("Ti/8", img_size=32, patch_size=8, depth=2, embed_dim=64,
                                                 num_heads=2, num_classes=10))
    fig7_statistics(model, torch.randn(2, 3, 32, 32))
    assert seen == [False]


def test_lowest_layer_fields_known_answer_and_no_heads():
    """The lowest-layer fields that fig7_statistics records and the locality controls rewrite, from one formula."""
    rec = lowest_layer([0.9, 0.2, LOCAL_HEAD, 0.7])
    assert rec == {"lowest_min": 0.2, "lowest_max": 0.9, "lowest_spread": pytest.approx(0.7),
                   "lowest_heads": [0.9, 0.2, LOCAL_HEAD, 0.7], "lowest_local_share": 0.25}  # at LOCAL_HEAD: not local
    with pytest.raises(ValueError, match="at least one head"):
        lowest_layer([])


def test_fig7_statistics_of_a_hybrid_leave_out_the_pixel_filters_only():
    """A hybrid's patch embedding projects CNN features: its record has no filter statistic (it raised TypeError),
    and the attention and position statistics as a ViT's."""
    from conftest import tiny_hybrid

    model = tiny_hybrid()
    x = torch.randn(3, 3, 32, 32)
    rec = fig7_statistics(model, x)
    assert rec["filter_frequency"] is None and len(rec["lowest_heads"]) == 3  # ViT-Ti: 3 heads
    assert rec["lowest_local_share"] in (0.0, 1 / 3, 2 / 3, 1.0) and rec["position_spearman"] is not None


def _position_spearman_by_hand(table: torch.Tensor, gh: int, gw: int) -> float:
    """Spearman between the cosine similarity of two patches' rows and their grid distance, over all pairs."""
    from scipy.stats import spearmanr

    t = table.double().numpy()
    t = t / np.linalg.norm(t, axis=1, keepdims=True)
    ys, xs = np.divmod(np.arange(gh * gw), gw)
    i, j = np.triu_indices(gh * gw, k=1)
    return float(spearmanr((t[i] * t[j]).sum(1), np.hypot(ys[i] - ys[j], xs[i] - xs[j])).statistic)


def test_position_statistic_separates_a_grid_table_from_its_permutation():
    from conftest import ref_sincos

    model = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=32, depth=1, embed_dim=64, num_heads=2,
                                                 num_classes=10)).eval()
    table = ref_sincos(8, 8, 64)  # (64, 64) a 2D sin-cos table: similarity falls with distance
    shuffled = table[torch.randperm(64, generator=torch.Generator().manual_seed(0))]  # no 2D structure left
    x = torch.randn(2, 3, 32, 32)
    got = []
    for t in (table, shuffled):
        with torch.no_grad():
            model.pos_embed[0, -64:].copy_(t)
        got.append(fig7_statistics(model, x)["position_spearman"])
        assert got[-1] == pytest.approx(_position_spearman_by_hand(t, 8, 8), abs=5e-3)  # ties broken apart
    assert got[0] < -0.5 and abs(got[1]) < 0.1


def test_each_epochs_record_equals_a_direct_computation_on_its_snapshot(tmp_path, tiny_data):
    cfg = dataclasses.replace(with_num_classes(PRESETS["tiny"], 3), epochs=2, snapshot_every=1, fig7_every=1,
                              val_per_class=4, data=str(tiny_data))
    train(cfg, tmp_path / "run", progress=False)
    hist = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in hist] == [1, 2] and all("fig7" in r and r["fig7_seconds"] >= 0 for r in hist)
    for r in hist:
        snap = vitlab.load_model(tmp_path / "run" / "snapshots" / f"epoch_{r['epoch']:04d}")
        direct = fig7_statistics(snap, sample_batch(snap))
        for key, value in direct.items():
            assert r["fig7"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # the same numbers from the snapshots after the run, joined with the run's accuracy records
    back = snapshot_history(tmp_path / "run", out=tmp_path / "emergence.json")
    assert [b["epoch"] for b in back] == [1, 2]
    assert [b["val_accuracy"] for b in back] == [r["val_accuracy"] for r in hist]
    assert back[0]["images_seen"] == 132  # 144 training images less 4 per class validated
    for b, r in zip(back, hist):
        assert b["lowest_min"] == pytest.approx(r["fig7"]["lowest_min"], rel=1e-5)
    assert json.loads((tmp_path / "emergence.json").read_text()) == back  # and reused, not recomputed, from out
    assert snapshot_history(tmp_path / "run", out=tmp_path / "emergence.json") == back


def test_fig7_every_is_refused_where_it_cannot_measure():
    with pytest.raises(ValueError, match="fig7_every"):
        TrainConfig(model=PRESETS["bit_cifar10"].model, fig7_every=1)
    with pytest.raises(FileNotFoundError):
        snapshot_history("/nonexistent/run")


def test_bands_over_seeds_known_answer():
    a = [{"epoch": 1, "images_seen": 10, "s": 0.0}, {"epoch": 2, "images_seen": 20, "s": 1.0}]
    b = [{"epoch": 1, "images_seen": 10, "s": 2.0}, {"epoch": 2, "images_seen": 20, "s": 3.0},
         {"epoch": 3, "images_seen": 30, "s": 9.0}]
    bands = emergence_bands([a, b], "s")
    assert bands == {"epoch": [1, 2], "images_seen": [10, 20], "mean": [1.0, 2.0], "min": [0.0, 1.0],
                     "max": [2.0, 3.0]}
    with pytest.raises(ValueError):
        emergence_bands([a, b], "nothing")


def test_the_emergence_figure_draws_each_recipes_mean_and_band_per_statistic():
    from vitlab.figures.plots import EMERGENCE_PANELS, emergence_curves

    band = {"epoch": [1, 2], "images_seen": [1_000_000, 2_000_000], "mean": [0.1, 0.5], "min": [0.0, 0.4],
            "max": [0.2, 0.6]}
    fig = emergence_curves({"no teacher": {"lowest_min": band, "val_accuracy": band},
                            "distilled": {"lowest_min": {**band, "mean": [0.3, 0.2]}}})
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [(t.name, list(t.y)) for t in lines] == [("no teacher", [0.1, 0.5]), ("no teacher", [0.1, 0.5]),
                                                    ("distilled", [0.3, 0.2])]
    assert list(lines[0].x) == [1.0, 2.0]  # millions of images
    bands = [t for t in fig.data if t.fill == "toself"]
    assert list(bands[0].y) == [0.2, 0.6, 0.4, 0.0]  # max forward, min back
    shown = [k for k, _ in EMERGENCE_PANELS if k in ("lowest_min", "val_accuracy")]
    assert [a.text for a in fig.layout.annotations] == [t.split("<br>")[0] for k, t in EMERGENCE_PANELS if k in shown]
