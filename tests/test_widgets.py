"""Widget logic without a browser: setting a control's value changes the figure's data."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from conftest import tiny_convit, tiny_vit
from PIL import Image

import vitlab

pytest.importorskip("ipywidgets")
from vitlab.app.widgets import AttentionExplorer, DistanceExplorer, PositionExplorer  # noqa: E402


@pytest.fixture
def explorer():
    model = tiny_vit()
    x = torch.randn(2, 3, 32, 32)
    shown = [np.zeros((32, 32, 3), np.uint8), np.full((32, 32, 3), 255, np.uint8)]
    return AttentionExplorer(model, (["a", "b"], x, shown))


def _z(ex) -> np.ndarray:
    return np.array(ex.figure.data[1].z, dtype=float)


def test_every_control_redraws_the_heatmap(explorer):
    before = _z(explorer)
    assert before.shape == (8, 8) and explorer.layer.value == 3
    explorer.layer.value = 1
    after_layer = _z(explorer)
    assert not np.allclose(after_layer, before)
    explorer.head.value = "head 1"
    assert not np.allclose(_z(explorer), after_layer)
    explorer.method.value = "rollout"
    rollout = _z(explorer)
    explorer.discard.value = 0.5
    assert not np.allclose(_z(explorer), rollout)
    explorer.image.value = 1
    assert np.array_equal(np.array(explorer.figure.data[0].z), explorer.shown[1])


def test_attention_rows_match_the_captured_maps(explorer):
    import vitlab

    maps = vitlab.attention_maps(explorer.model, explorer.x[:1])  # (L, 1, H, T, T)
    explorer.layer.value, explorer.head.value = 2, "head 0"
    np.testing.assert_allclose(_z(explorer), maps[1, 0, 0, 0, 1:].reshape(8, 8).numpy(), rtol=1e-5)
    explorer.select_patch(2, 5)  # a click on patch (2, 5) makes it the query
    np.testing.assert_allclose(_z(explorer), maps[1, 0, 0, 1 + 2 * 8 + 5, 1:].reshape(8, 8).numpy(), rtol=1e-5)
    explorer.head.value = "max"
    np.testing.assert_allclose(_z(explorer), maps[1, 0, :, 1 + 21, 1:].amax(0).reshape(8, 8).numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="outside the 8x8 grid"):
        explorer.select_patch(8, 0)


def test_select_patch_needs_both_coordinates_or_none(explorer):
    """A row without a column was a TypeError from comparing None; the query is left as it was."""
    explorer.select_patch(2, 5)
    with pytest.raises(ValueError, match=r"select_patch\(3\) needs a column too: .* row in \[0, 8\) and col in \[0, 8\)"):
        explorer.select_patch(3)
    with pytest.raises(ValueError, match=r"a patch needs its row too"):
        explorer.select_patch(None, 4)
    assert explorer.query == 2 * 8 + 5
    explorer.select_patch(None)
    assert explorer.query is None


def test_class_specific_methods(explorer):
    for m in ("gradient rollout", "integrated gradients", "occlusion"):
        explorer.method.value = m
        assert _z(explorer).shape == (8, 8) and np.isfinite(_z(explorer)).all()


def test_upload_adds_an_image_and_broken_bytes_are_reported(explorer):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    explorer.add_image("mine.png", buf.getvalue())
    assert explorer.names[-1] == "mine.png" and explorer.image.value == 2
    assert np.array(explorer.figure.data[0].z).shape == (32, 32, 3)
    explorer.add_image("broken.png", b"not an image")
    assert "could not read broken.png" in explorer.status.value and len(explorer.names) == 3


def test_a_damaged_upload_is_reported_not_raised(explorer):
    """Pillow reports some damaged PNGs with ValueError or SyntaxError: an upload of one escaped as an exception in
    the widget's callback instead of the status line."""
    from _reference import damaged_pngs

    for name, blob in damaged_pngs().items():
        explorer.add_image(name, blob)
        assert f"could not read {name}" in explorer.status.value and len(explorer.names) == 2


def test_an_upload_smaller_than_a_patch_is_refused_as_the_command_line_refuses_it(explorer):
    """A 1x1 upload was resized to the input and analysed (one colour: nothing to look at), where vitlab capture and
    reproduce refuse it; it is now refused with the same reason and the explorer is left as it was."""
    explorer.add_image("dot.png", _png(np.zeros((1, 1, 3), np.uint8)))
    assert re.search(r"could not use dot.png</b>: 1x1 px is smaller than one \d+x\d+ px patch", explorer.status.value)
    assert explorer.names == ["a", "b"] and len(explorer.x) == 2


def test_position_explorer_click_selects_a_patch():
    model = tiny_vit()
    ex = PositionExplorer(model)
    ex.select(0, 0)
    z = np.array(ex.figure.data[0].z, dtype=float)
    assert z[0, 0] == pytest.approx(1.0, abs=1e-5)  # a patch is most similar to itself
    ex.select(7, 7)
    assert np.array(ex.figure.data[0].z, dtype=float)[7, 7] == pytest.approx(1.0, abs=1e-5)


def test_distance_explorer_opens_a_head_in_the_attention_explorer(explorer):
    d = DistanceExplorer(explorer.model, explorer.x, explorer)
    heads = [t for t in d.figure.data if t.mode == "markers"]
    assert [t.name for t in heads] == ["head 0", "head 1", "head 2"]  # a legend entry and colour per head
    assert all(np.allclose(t.y, d.distance[:, h].numpy()) and list(t.x) == [1, 2, 3] for h, t in enumerate(heads))
    # the page creates the figure from the state it was opened with: its size and its clickable dots are in it
    assert (d.figure._widget_layout["width"], d.figure._widget_layout["height"]) == (600, 440)
    assert [t["marker"]["size"] for t in d.figure._widget_data if t.get("mode") == "markers"] == [8, 8, 8]
    assert d.open(5) == (2, 2)  # dot 5 = layer 2, head 2
    assert explorer.layer.value == 2 and explorer.head.value == "head 2" and explorer.method.value == "attention"


def test_clicks_reach_the_explorers(explorer):
    """The FigureWidget click callbacks, called as plotly calls them (trace, points, state)."""
    from plotly.callbacks import Points

    trace = explorer.figure.data[1]
    explorer._on_click(trace, Points(point_inds=[[3, 4]], xs=[], ys=[], trace_name="map", trace_index=1), None)
    assert explorer.query == 3 * 8 + 4 and "query patch (3, 4)" in explorer.figure.layout.title.text
    pos = PositionExplorer(explorer.model)
    for cb in pos.figure.data[0]._click_callbacks:
        cb(pos.figure.data[0], Points(point_inds=[[1, 2]], xs=[], ys=[], trace_name="", trace_index=0), None)
    assert pos.patch == (1, 2)
    dist = DistanceExplorer(explorer.model, explorer.x, explorer)
    for cb in dist.figure.data[1]._click_callbacks:  # head 1's trace, its third dot: layer 3
        cb(dist.figure.data[1], Points(point_inds=[2], xs=[], ys=[], trace_name="head 1", trace_index=1), None)
    assert explorer.layer.value == 3 and explorer.head.value == "head 1"
    for cb in dist.figure.data[2]._click_callbacks:
        cb(dist.figure.data[2], Points(point_inds=[0], xs=[], ys=[], trace_name="head 2", trace_index=2), None)
    assert explorer.layer.value == 1 and explorer.head.value == "head 2"


def test_gradient_rollout_heatmap_is_the_library_map_for_the_chosen_class(explorer):
    import vitlab

    explorer.method.value = "gradient rollout"
    expected = vitlab.gradient_rollout(explorer.model, explorer.x[:1], torch.tensor([explorer.prediction(0)[0]]))
    np.testing.assert_allclose(_z(explorer), expected[0].numpy(), rtol=1e-5)
    explorer.target.value = 3  # another class: the map follows it, and the title names it
    expected = vitlab.gradient_rollout(explorer.model, explorer.x[:1], torch.tensor([3]))
    np.testing.assert_allclose(_z(explorer), expected[0].numpy(), rtol=1e-5)
    title = explorer.figure.layout.title.text  # a model that records no class names: "class k"
    assert "for class 3 (p = " in title and "layer" not in title and "heads" not in title


def test_a_headless_model_offers_attention_and_rollout_without_a_made_up_class():
    """num_classes=0 (timm's .orig_in21k weights): the output is the features, so no predicted class, no
    class-specific methods; attention and rollout still draw."""
    import vitlab
    from vitlab.app.widgets import explorers
    from vitlab.inspect import gradient_rollout

    model = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=32, depth=2, num_classes=0)).eval()
    x = torch.randn(2, 3, 32, 32)
    shown = [np.zeros((32, 32, 3), np.uint8)] * 2
    ex = AttentionExplorer(model, (["a", "b"], x, shown))
    assert list(ex.method.options) == ["attention", "rollout"] and ex.target.disabled
    assert "no classifier head" in ex.status.value and "<b>" not in ex.status.value  # no class named
    ex.method.value = "rollout"
    assert np.isfinite(_z(ex)).all() and "no classifier head" in ex.status.value
    with pytest.raises(ValueError, match="no classifier head"):
        ex.prediction()
    for call in (lambda: gradient_rollout(model, x), lambda: vitlab.compare_methods(model, x, progress=False),
                 lambda: vitlab.deletion_insertion(model, x, torch.rand(2, 8, 8), torch.zeros(2, dtype=torch.long))):
        with pytest.raises(ValueError, match="no classifier head .*augreg2_in21k_ft_in1k"):
            call()
    d = DistanceExplorer(model, x, ex)  # a click opens the head; no ablation effect to show, and none made up
    assert d.button.disabled and d.open(1) == (1, 1) and d.head_importance is None
    assert "no classifier head" in d.status.value and "nats" not in d.status.value
    with pytest.raises(ValueError, match="head importance .* no classifier head"):
        d.importance()
    no_positions = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=32, depth=2, num_classes=10,
                                                        pos_embed="none")).eval()
    att, positions, distance = explorers(no_positions, (["a", "b"], x, shown))
    assert positions is None and distance is not None


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def test_a_bf16_model_gets_its_images_in_its_dtype_and_uploads_too():
    """The explorers keep float32 images on the CPU and cast them to the model's device and dtype at each use; what
    they draw is float32 on the CPU (a bf16 model used to fail on the first forward)."""
    import copy

    model = tiny_vit()
    half = copy.deepcopy(model).to(torch.bfloat16)
    x = torch.randn(2, 3, 32, 32)
    shown = [np.zeros((32, 32, 3), np.uint8)] * 2
    ex = AttentionExplorer(half, (["a", "b"], x.to(torch.bfloat16), shown))
    assert ex.x.dtype == torch.float32 and _z(ex).shape == (8, 8)
    ex.method.value = "gradient rollout"
    assert np.isfinite(_z(ex)).all()
    ex.add_image("mine.png", _png(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)))
    assert ex.names[-1] == "mine.png" and "could not" not in ex.status.value
    d = DistanceExplorer(half, images=x, explorer=ex)
    assert d.distance.dtype == torch.float32 and d.distance.shape == (3, 3)
    assert PositionExplorer(half).sim.dtype == torch.float32


def test_an_upload_the_model_cannot_run_leaves_the_explorer_as_it_was(explorer, monkeypatch):
    before = (list(explorer.names), explorer.x.clone(), list(explorer.image.options), explorer.image.value)
    real = explorer.model.forward
    monkeypatch.setattr(explorer.model, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("out of memory")))
    explorer.add_image("mine.png", _png(np.zeros((32, 32, 3), np.uint8)))
    assert "could not run the model on mine.png" in explorer.status.value and "out of memory" in explorer.status.value
    monkeypatch.setattr(explorer.model, "forward", real)
    assert (explorer.names, list(explorer.image.options), explorer.image.value) == (before[0], before[2], before[3])
    assert torch.equal(explorer.x, before[1])
    explorer.image.value = 1  # the original images still work
    assert _z(explorer).shape == (8, 8)


def test_a_16_bit_upload_is_scaled_not_clipped_white(explorer):
    ramp = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    explorer.add_image("ramp16.png", _png(ramp))
    view = np.asarray(explorer.shown[-1], dtype=float)
    assert abs(view.mean() - ramp.mean() / 257) < 2.0 and (view == 255).mean() < 0.01


def test_an_uploaded_photo_is_shown_upright_as_its_exif_orientation_says(explorer, tmp_path):
    from _reference import turned_photo

    explorer.add_image("portrait.jpg", turned_photo(tmp_path / "portrait.jpg").read_bytes())
    red = explorer.shown[-1][..., 0].astype(int) - explorer.shown[-1][..., 1]
    assert red[:12].min() > 200 and red[-12:].max() < 50  # top red, bottom black


def test_class_names_come_from_the_checkpoint_never_from_the_head_size(tmp_path):
    """The shipped CIFAR-10 default is named with CIFAR-10's classes; a 10-class model that does not say what it was
    trained on is not."""
    import vitlab
    from vitlab.data.images import head_class_names

    assert head_class_names(vitlab.load_model())[:3] == ("airplane", "automobile", "bird")
    saved = vitlab.load_checkpoint(vitlab.save_checkpoint(tiny_vit(), tmp_path / "ck"))  # 10 classes, no record
    assert head_class_names(saved) is None
    ex = AttentionExplorer(saved, (["a"], torch.randn(1, 3, 32, 32), [np.zeros((32, 32, 3), np.uint8)]))
    assert ex.class_names[:2] == ["class 0", "class 1"]
    saved.vitlab_checkpoint["data"] = {"classes": [f"shape{i}" for i in range(10)]}
    assert head_class_names(saved)[0] == "shape0"


def test_the_colour_bar_names_what_each_method_maps_and_the_title_its_discard_ratio(explorer):
    """Integrated gradients and occlusion are logit attributions, not attention weights: the colour bar said
    "weight" for every method. A rollout's title names its discard ratio: moving the slider changed the map under an
    unchanged title. The title takes two lines, so that the longer one is not cut off at the figure's edge."""
    assert explorer.figure.data[1].colorbar.title.text == "attention weight"
    explorer.method.value = "occlusion"
    assert explorer.figure.data[1].colorbar.title.text == "logit drop"
    explorer.method.value = "integrated gradients"
    assert "logit" in explorer.figure.data[1].colorbar.title.text
    explorer.method.value = "rollout"
    assert explorer.figure.data[1].colorbar.title.text == "rollout weight" and "discard" not in _title(explorer)
    explorer.discard.value = 0.5
    explorer.select_patch(3, 4)
    assert "discard 0.50" in _title(explorer)  # and no line of it longer than the 500 px figure shows
    assert max(len(line) for line in _title(explorer).split("<br>")) <= 60, _title(explorer)
    explorer.method.value = "attention"  # the discard ratio does not change a raw attention map: not in its title
    assert "discard" not in _title(explorer)
    # the title's words change, its font stays the first view's (replacing the whole title reset it to 17 px)
    assert explorer.figure.layout.title.font.size == explorer.figure._widget_layout["title"]["font"]["size"] == 13


def _title(ex) -> str:
    return ex.figure.layout.title.text


def test_the_first_view_the_browser_gets_has_the_methods_colour_bar_title(explorer):
    """The first view's colour bar read "weight" in Chromium while the figure in Python read "attention weight": the
    figure was built with "weight" and retitled before it was displayed, and plotly's widget sends a browser only
    the state it was built with. The state sent to the browser (``_widget_data``) now names what the map holds."""
    sent = explorer.figure._widget_data[1]
    assert sent["colorbar"]["title"]["text"] == "attention weight" == explorer.figure.data[1].colorbar.title.text
    np.testing.assert_allclose(np.array(sent["z"], dtype=float), _z(explorer))


def test_the_position_explorer_sends_the_browser_its_title():
    """The position explorer's title was set after the figure was built, which plotly's widget never sends to a
    browser: in a notebook or the app the figure had no title at all (Python's copy had one)."""
    ex = PositionExplorer(tiny_vit())
    assert ex.figure._widget_layout["title"]["text"] == ex.figure.layout.title.text
    assert "patch (4, 4)" in ex.figure.layout.title.text


def test_controls_the_chosen_method_does_not_read_are_greyed_out(explorer):
    """Every control stayed live for every method: with occlusion chosen, the layer slider, heads and discard ratio
    could be moved and changed nothing (dead widgets); the class did nothing for raw attention."""
    def live(ex):
        return {w.description for w in (ex.layer, ex.head, ex.discard, ex.target) if not w.disabled}

    assert live(explorer) == {"layer", "heads"}
    explorer.method.value = "rollout"
    assert live(explorer) == {"layer", "heads", "discard"}
    for method in ("gradient rollout", "integrated gradients", "occlusion"):
        explorer.method.value = method
        assert live(explorer) == {"class"}, method
        before = _z(explorer)
        explorer.layer.value = 1 if explorer.layer.value != 1 else 2  # what is greyed out changes nothing
        np.testing.assert_array_equal(_z(explorer), before)


def test_explorers_refuse_images_they_would_misread():
    """A bare batch where (names, batch, shown) goes failed inside timm; 48 px images hit timm's AssertionError; raw
    uint8 pixels were cast to float and explained without a word; names for fewer images than the batch were taken.
    Each is now refused naming the problem, and DistanceExplorer.open refuses a dot that does not exist."""
    model = tiny_vit()
    x = torch.randn(2, 3, 32, 32)
    shown = [np.zeros((32, 32, 3), np.uint8)] * 2
    with pytest.raises(TypeError, match=r"images must be \(names, \(B, C, H, W\) batch, shown\) .* got a tensor"):
        AttentionExplorer(model, x)
    with pytest.raises(ValueError, match="images are 48x48 px but this VisionTransformer is built for 32x32 px"):
        AttentionExplorer(model, (["a", "b"], torch.randn(2, 3, 48, 48), shown))
    with pytest.raises(TypeError, match="images are uint8: the analyses take preprocessed float images"):
        AttentionExplorer(model, (["a", "b"], torch.zeros(2, 3, 32, 32, dtype=torch.uint8), shown))
    with pytest.raises(ValueError, match="images has 1 names, 2 images and 2 shown views"):
        AttentionExplorer(model, (["a"], x, shown))
    with pytest.raises(TypeError, match="images are uint8: the analyses take preprocessed float images"):
        DistanceExplorer(model, torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"pass the batch alone \(load_images\(model, folder\)\[1\]\)"):
        DistanceExplorer(model, (["a", "b"], x, shown))
    distance = DistanceExplorer(model, x)  # 3 layers x 3 heads
    assert distance.open(8) == (3, 2)
    for point in (-1, 9):
        with pytest.raises(ValueError, match=rf"dot {point} does not exist: the 3 layers x 3 heads are dots 0 to 8"):
            distance.open(point)


def test_a_fractional_patch_or_dot_is_refused_and_changes_nothing(explorer):
    """PositionExplorer.select(1.5, 2) showed patch (1, 2) without a word, select_patch(1.5, 0) kept the query 12.0
    and then failed in attention_view (every later redraw failed with it), and DistanceExplorer.open(1.5) returned
    layer 1.0, head 1.5; each is refused as a patch or dot that does not exist, and nothing changes."""
    positions = PositionExplorer(explorer.model)
    before = positions.patch
    with pytest.raises(ValueError, match=r"patch \(1.5, 2\) is outside the 8x8 grid: give a whole row from 0 to 7"):
        positions.select(1.5, 2)
    assert positions.patch == before
    explorer.select_patch(2, 5)
    with pytest.raises(ValueError, match=r"patch \(1.5, 0\) is outside the 8x8 grid"):
        explorer.select_patch(1.5, 0)
    assert explorer.query == 2 * 8 + 5
    explorer.layer.value = 2  # the explorer still redraws
    with pytest.raises(ValueError, match=r"dot 1.5 does not exist"):
        DistanceExplorer(explorer.model, explorer.x, explorer).open(1.5)
    assert positions.select(np.int64(3), 4) is None and positions.patch == (3, 4)


def test_a_distance_explorer_refuses_the_attention_explorer_of_another_model():
    """Linked to the explorer of a shallower model, clicking layer 3's dot set that explorer's layer slider to 3,
    which ipywidgets clamped to its last layer without a word (and 'head 3' of a 3-head model raised a TraitError);
    now the link itself is refused."""
    x = torch.randn(2, 3, 32, 32)
    shallow = vitlab.build_model(vitlab.vit_config("Ti/4", img_size=32, depth=2, num_classes=10)).eval()
    other = AttentionExplorer(shallow, (["a", "b"], x, [np.zeros((32, 32, 3), np.uint8)] * 2))
    with pytest.raises(ValueError, match=r"explorer shows another model \(VisionTransformer\) than this one "
                                         r"\(VisionTransformer\): link the AttentionExplorer of the same model"):
        DistanceExplorer(tiny_vit(), x, other)
    assert DistanceExplorer(shallow, x, other).open(5) == (2, 2)


def test_class_names_of_another_length_than_the_head_are_refused():
    """Twelve names for a 10-class head offered classes 10 and 11 in the class menu, whose maps then failed inside the
    widget's callback ("target 10: not a class index"), and eight left two classes unnamed; now the explorer refuses
    them when built."""
    x = torch.randn(1, 3, 32, 32)
    shown = [np.zeros((32, 32, 3), np.uint8)]
    for n in (12, 8):
        with pytest.raises(ValueError, match=f"class_names has {n} names but the model has 10 classes: give one name "
                                             "per class"):
            AttentionExplorer(tiny_vit(), (["a"], x, shown), class_names=[f"c{k}" for k in range(n)])
    ex = AttentionExplorer(tiny_vit(), (["a"], x, shown), class_names=[f"c{k}" for k in range(10)])
    assert ex.class_names[9] == "c9"


def test_a_convit_gpsa_head_opened_from_the_distance_plot_shows_a_patchs_attention_not_an_empty_map():
    """The ConViT paper's plot is the distance of its GPSA heads, whose blocks run before the class token joins: a
    click on such a dot opened the readout's row there, the class token's identity (an all-zero map over the patches).
    The explorer now shows the centre patch's attention in that head, and keeps the readout for the later blocks."""
    model = tiny_convit()
    x = torch.randn(1, 3, 32, 32)
    ex = AttentionExplorer(model, (["a"], x, [np.zeros((32, 32, 3), np.uint8)]))
    d = DistanceExplorer(model, x, ex)
    maps = vitlab.attention_maps(model, x)  # (4, 1, 4, 65, 65)
    assert d.open(4 * 2 + 1) == (3, 1) and ex.query is None  # a block the class token has joined: the readout
    np.testing.assert_allclose(_z(ex), maps[2, 0, 1, 0, 1:].reshape(8, 8).numpy(), rtol=1e-5)
    assert d.open(1) == (1, 1) and ex.query == 4 * 8 + 4
    np.testing.assert_allclose(_z(ex), maps[0, 0, 1, 1 + 36, 1:].reshape(8, 8).numpy(), rtol=1e-5)
    assert _z(ex).sum() == pytest.approx(1.0, abs=1e-5)


def test_the_centre_patch_a_convit_dot_forced_gives_the_readout_back_but_a_chosen_patch_stays():
    """A click on a ConViT dot before the class token joins made the centre patch the explorer's query and never put
    the readout back: every later block showed the centre patch's row, not the readout the user had. The readout now
    comes back at the first click on a block that has one; a patch the user chose, the centre one too, stays. A click
    that changed only the query (the controls already on that layer and head) now redraws too."""
    model = tiny_convit()
    x = torch.randn(1, 3, 32, 32)
    ex = AttentionExplorer(model, (["a"], x, [np.zeros((32, 32, 3), np.uint8)]))
    d = DistanceExplorer(model, x, ex)
    maps = vitlab.attention_maps(model, x)  # (4, 1, 4, 65, 65)
    readout, centre = maps[2, 0, 1, 0, 1:].reshape(8, 8).numpy(), maps[0, 0, 1, 1 + 36, 1:].reshape(8, 8).numpy()
    assert d.open(1) == (1, 1) and ex.query == 36
    assert d.open(4 * 2 + 1) == (3, 1) and ex.query is None and "query readout" in ex.figure.layout.title.text
    np.testing.assert_allclose(_z(ex), readout, rtol=1e-5)
    d.open(1)
    ex.layer.value = 3  # the slider keeps the centre patch; the dot of the same layer and head gives the readout back
    d.open(4 * 2 + 1)
    assert ex.query is None
    np.testing.assert_allclose(_z(ex), readout, rtol=1e-5)
    ex.layer.value = 1  # the blank readout; the dot of the same layer and head draws the centre patch
    d.open(1)
    assert ex.query == 36
    np.testing.assert_allclose(_z(ex), centre, rtol=1e-5)
    for row, col in ((2, 5), (4, 4)):  # the user's patch, the centre one too, stays at every block
        ex.select_patch(row, col)
        for dot in (1, 4 * 2 + 1, 1):
            d.open(dot)
            assert ex.query == row * 8 + col, (row, col, dot)


def test_a_convits_blank_readout_before_its_class_token_joins_is_explained_in_the_title():
    """Moving the layer slider of a ConViT's explorer to a block before its class token joins drew the readout's row
    there, the class token's identity: an all-zero map titled 'query readout' with nothing to say why. The title now
    says the map is blank and where the class token joins; the later layers' titles say nothing of it."""
    model = tiny_convit()  # the class token joins before block 2 (0-based): at layer 3
    x = torch.randn(1, 3, 32, 32)
    ex = AttentionExplorer(model, (["a"], x, [np.zeros((32, 32, 3), np.uint8)]))
    note = "query readout (blank: the class token joins at layer 3)"
    for method in ("attention", "rollout"):
        ex.method.value = method
        for layer in (1, 2):
            ex.layer.value = layer
            assert _z(ex).sum() == 0 and note in ex.figure.layout.title.text, (method, layer)
            # a blank map's colourbar from 0 to 1, not plotly's -0.4 to 0.4 around its single value
            assert (ex.figure.data[1].zauto, ex.figure.data[1].zmin, ex.figure.data[1].zmax) == (False, 0.0, 1.0)
        ex.layer.value = 3
        assert _z(ex).sum() > 0 and "blank" not in ex.figure.layout.title.text
        assert ex.figure.data[1].zauto and ex.figure.data[1].zmin is None  # a map with a range: plotly's own
    ex.layer.value = 1
    ex.select_patch(4, 4)
    assert _z(ex).sum() > 0 and "blank" not in ex.figure.layout.title.text


def test_the_centre_patch_a_convit_dot_swaps_in_is_named_in_the_title():
    """A click on a ConViT dot before the class token joins made the centre patch the query, titled 'query patch
    (4, 4)' as if the user had chosen it, with nothing to say why the readout was gone. The title now names it the
    centre and where the class token joins; a patch the user chose, and the readout, are titled as before."""
    model = tiny_convit()  # the class token joins at layer 3
    x = torch.randn(1, 3, 32, 32)
    ex = AttentionExplorer(model, (["a"], x, [np.zeros((32, 32, 3), np.uint8)]))
    d = DistanceExplorer(model, x, ex)
    d.open(1)  # layer 1, head 1: a GPSA block
    assert ex.figure.layout.title.text.endswith("query centre patch (4, 4) (the class token joins at layer 3)")
    assert ", head 1,<br>" in ex.figure.layout.title.text  # one head: not 'heads head 1'
    ex.head.value = "mean"
    assert ", heads mean,<br>" in ex.figure.layout.title.text
    d.open(4 * 2 + 1)
    assert ex.figure.layout.title.text.endswith("query readout")
    ex.select_patch(4, 4)  # the user's own choice of the same patch
    d.open(1)
    assert ex.figure.layout.title.text.endswith("query patch (4, 4)")


def test_a_convits_distance_explorer_marks_its_gated_positional_layers():
    """The distance explorer of a ConViT drew its GPSA layers beside the later ones with nothing to tell them apart;
    its title now names the GPSA layers on a second line. A ViT's title is one line, as before."""
    x = torch.randn(1, 3, 32, 32)
    title = DistanceExplorer(tiny_convit(), x).figure.layout.title.text
    assert title.endswith("click a dot<br><sup>layers 1-2: gated positional self-attention (GPSA)</sup>"), title
    assert DistanceExplorer(tiny_vit(), x).figure.layout.title.text.endswith("click a dot")


def test_a_small_probability_is_not_printed_as_zero_percent():
    """A random ImageNet model's prediction (about 0.1%) was captioned '(0%)' in the report and the explorer's
    status; below 1% the caption now keeps a decimal, and under 0.1% says so."""
    from vitlab.base.stats import probability_words

    assert [probability_words(p) for p in (0.734, 0.01, 0.0099, 0.001, 0.00096, 0.00094, 0.0)] == \
        ["73%", "1%", "1.0%", "0.1%", "0.1%", "< 0.1%", "< 0.1%"]  # 0.00096 rounds to 0.1%: it is no "< 0.1%"
    assert probability_words(float("nan")) == "n/a"


def test_the_last_convit_block_before_its_class_token_joins_also_opens_the_centre_patch():
    """The class token joins before block 2 (0-based): layer 2 (1-based) is still a GPSA block with a blank readout,
    so its dot opens the centre patch too; layer 3 has the readout. A centre patch set by hand afterwards (ex.query,
    not the dot's choice) stays at the later blocks."""
    model = tiny_convit()
    x = torch.randn(1, 3, 32, 32)
    ex = AttentionExplorer(model, (["a"], x, [np.zeros((32, 32, 3), np.uint8)]))
    d = DistanceExplorer(model, x, ex)
    assert d.open(4 * 1 + 2) == (2, 2) and ex.query == 36
    assert d.open(4 * 2 + 2) == (3, 2) and ex.query is None
    ex.query = 36  # by hand, the patch the dot had chosen before
    d.open(4 * 3 + 2)
    assert ex.query == 36


def test_an_uploaded_file_name_and_pillow_s_error_are_shown_as_text_not_html(explorer, monkeypatch):
    """The status line and the figure's title are HTML: an upload named like a tag, and Pillow's own error (which
    names '<_io.BytesIO object ...>'), went into them unescaped, so a crafted file name ran script in the page."""
    import html

    name = "<img src=x onerror=alert(1)>.png"
    explorer.add_image(name, b"not an image")
    status = explorer.status.value
    assert status.startswith(f"<b>could not read {html.escape(name)}</b>: ")
    assert "<img" not in status and "<_io" not in status and "&lt;_io.BytesIO" in status
    explorer.add_image(name, _png(np.zeros((1, 1, 3), np.uint8)))  # refused as too small: the name again
    assert explorer.status.value.startswith(f"<b>could not use {html.escape(name)}</b>: ")
    explorer.add_image(name, _png(np.zeros((32, 32, 3), np.uint8)))
    assert explorer.names[-1] == name and explorer.image.value == 2  # the name itself is kept as it was
    title = explorer.figure.layout.title.text
    assert title.startswith(f"{html.escape(name)}: attention") and "<img" not in title
    explorer.method.value = "occlusion"  # the class-specific title names the image too
    assert explorer.figure.layout.title.text.startswith(f"{html.escape(name)}: occlusion for ")
    real = explorer.model.forward
    monkeypatch.setattr(explorer.model, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("<script>x</script>")))
    explorer.add_image(name, _png(np.zeros((32, 32, 3), np.uint8)))
    assert explorer.status.value == (f"<b>could not run the model on {html.escape(name)}</b>: "
                                     "RuntimeError: &lt;script&gt;x&lt;/script&gt;")
    monkeypatch.setattr(explorer.model, "forward", real)
    # class names come from a checkpoint's data folder: shown as text in the status line and the title
    names = ["<i>cat</i>"] * 10
    ex = AttentionExplorer(explorer.model, (["a"], explorer.x[:1], explorer.shown[:1]), class_names=names)
    assert "predicted <b>&lt;i&gt;cat&lt;/i&gt;</b>" in ex.status.value
    ex.method.value = "occlusion"
    assert "for &lt;i&gt;cat&lt;/i&gt; (p = " in ex.figure.layout.title.text


def test_head_importance_colours_the_distance_plot_once_and_a_click_shows_the_heads_effect(explorer):
    """The dots' colours are head_importance's (L, H) table of these images (mean ablation, the model's predictions
    as targets without labels); computed on the first ask only; a click names the head's drop and interval."""
    d = DistanceExplorer(explorer.model, explorer.x, explorer)
    assert d.head_importance is None and not d.button.disabled  # nothing computed before it is asked for
    heads = [t for t in d.figure.data if t.mode == "markers"]
    assert all(t.marker.color is None for t in heads)
    res = d.importance()
    with torch.no_grad():
        want = vitlab.head_importance(explorer.model, explorer.x, explorer.model(explorer.x).argmax(-1),
                                      progress=False)
    assert torch.allclose(res.logprob_drop, want.logprob_drop)
    for h, t in enumerate(heads):
        np.testing.assert_allclose(np.array(t.marker.color, dtype=float), want.logprob_drop[:, h].numpy(), rtol=1e-6)
        assert t.marker.cmin == -t.marker.cmax  # one diverging scale, 0 in its middle
    assert heads[0].marker.showscale and not heads[1].marker.showscale and d.button.disabled
    assert d.importance() is res  # once
    assert (d.progress.value, d.progress.max, d.progress.description) == (9, 9, "9/9")  # 3 x 3 heads, one batch
    assert d.open(4) == (2, 1)
    lo, hi = res.logprob_interval[1, 1].tolist()
    assert "<b>layer 2, head 1</b>" in d.status.value and f"by {float(res.logprob_drop[1, 1]):.3g} nats" in d.status.value
    assert f"[{lo:.3g}, {hi:.3g}]" in d.status.value and "log p(predicted class)" in d.status.value


def test_the_distance_explorer_follows_given_labels():
    model = tiny_vit()
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([1, 2, 3])
    d = DistanceExplorer(model, x, labels=y)
    res = d.importance()
    assert torch.equal(res.base_logprob, vitlab.head_importance(model, x, y, progress=False).base_logprob)
    d.open(0)
    assert "log p(true class)" in d.status.value


def _answer(figure, edit_id: int) -> None:
    """What a view sends once it drew (or applied) the figure's edit ``edit_id``."""
    figure._js2py_traceDeltas = {"trace_deltas": [], "trace_edit_id": edit_id}


def _shown(figure) -> None:
    """A page shows the figure: one view, which rendered and answered with the edit id it drew."""
    figure._view_count = 1
    _answer(figure, figure._last_trace_edit_id)


def test_a_figure_whose_page_stopped_applying_edits_is_replaced_by_one_showing_the_current_map(explorer, monkeypatch):
    """Under load anywidget gave up on the heatmap's model in the page (its 5 MB module took over 2 s to load) and
    dropped every edit the kernel sent it: the slider moved, the status line followed, the heatmap stayed at layer 3
    for good. An edit no view answers within the timeout, and still not at the check after, now puts a new figure in
    the explorer's box whose model the page creates with the current map (so that even a model the page gives up on
    draws it); the old one is closed, clicks reach the new one and later edits go to it."""
    import comm

    from vitlab.app.livefigure import CONFIRM

    opened = []
    create = comm.create_comm
    monkeypatch.setattr(comm, "create_comm", lambda **kw: opened.append(kw["data"]["state"]) or create(**kw))
    now = [0.0]
    explorer.live.clock = lambda: now[0]
    old = explorer.figure
    _shown(old)
    explorer.layer.value = 1  # sent; the page never answers
    now[0] = explorer.live.timeout - 0.1
    assert explorer.live.check() is False and explorer.figure is old
    now[0] = explorer.live.timeout
    assert explorer.live.check() is False and explorer.figure is old  # overdue once: looked at again
    now[0] += CONFIRM
    assert explorer.live.check() is True and explorer.live.rebuilds == 1
    new = explorer.figure
    assert new is not old and old.comm is None  # closed: the page drops its view
    assert explorer.live.box.children == (new,) and explorer.live.box in explorer.widget().children
    # the page creates the new model from the state sent when its comm opens: layer 1's map and title
    state = next(st for st in opened if st.get("_widget_data"))
    np.testing.assert_allclose(np.array(state["_widget_data"][1]["z"], dtype=float), explorer.current_map())
    assert "layer 1" in state["_widget_layout"]["title"]["text"]
    from plotly.callbacks import Points

    for cb in new.data[1]._click_callbacks:
        cb(new.data[1], Points(point_inds=[[2, 5]], xs=[], ys=[], trace_name="map", trace_index=1), None)
    assert explorer.query == 2 * 8 + 5 and "query patch (2, 5)" in new.layout.title.text
    explorer.layer.value = 2
    assert "layer 2" in explorer.figure.layout.title.text and explorer.figure is new


def test_a_figure_is_kept_while_its_view_answers_or_no_page_shows_it(explorer):
    now = [0.0]
    explorer.live.clock = lambda: now[0]
    fig = explorer.figure
    explorer.layer.value = 1  # not shown yet: a page that renders it later draws the current state
    now[0] = 100.0
    assert explorer.live.unanswered() is None and explorer.live.check() is False
    _shown(fig)
    explorer.layer.value = 2
    _answer(fig, fig._last_trace_edit_id)  # applied
    now[0] = 200.0
    assert explorer.live.check() is False
    explorer.layer.value = 3
    fig._view_count = 0  # the page went away: nothing to repair
    now[0] = 300.0
    assert explorer.live.check() is False
    fig._view_count = 1
    assert explorer.live.unanswered() == 100.0 and explorer.live.check() is False  # overdue: looked at again
    _answer(fig, fig._last_trace_edit_id)  # the answer had queued while the kernel was busy
    now[0] = 400.0
    assert explorer.live.check() is False and explorer.figure is fig
    explorer.layer.value = 1
    now[0] = 500.0
    assert explorer.live.check() is False and explorer.live.check() is True
    assert explorer.figure is not fig and explorer.live.rebuilds == 1


def test_rebuilt_position_and_distance_figures_keep_their_clicks(explorer):
    from plotly.callbacks import Points

    pos = PositionExplorer(explorer.model)
    pos.live.rebuild()
    for cb in pos.figure.data[0]._click_callbacks:
        cb(pos.figure.data[0], Points(point_inds=[[1, 2]], xs=[], ys=[], trace_name="", trace_index=0), None)
    assert pos.patch == (1, 2) and "patch (1, 2)" in pos.figure.layout.title.text
    dist = DistanceExplorer(explorer.model, explorer.x, explorer)
    dist.live.rebuild()
    for cb in dist.figure.data[1]._click_callbacks:  # head 1's trace, its third dot: layer 3
        cb(dist.figure.data[1], Points(point_inds=[2], xs=[], ys=[], trace_name="head 1", trace_index=1), None)
    assert explorer.layer.value == 3 and explorer.head.value == "head 1"
    assert dist.live.box in dist.widget().children


def test_live_figure_refuses_a_timeout_that_is_not_a_positive_number():
    import plotly.graph_objects as go

    from vitlab.app.livefigure import LiveFigure
    from vitlab.base.errors import ParameterError

    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ParameterError) as err:
            LiveFigure(go.FigureWidget(), timeout=bad)
        assert err.value.param == "timeout" and err.value.value is bad
    with pytest.raises(TypeError):
        LiveFigure(go.Figure())
