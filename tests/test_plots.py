"""vitlab.figures.plots: arrays in, figures out; the figures carry exactly the data they were given."""

from __future__ import annotations

import numpy as np

from vitlab.figures import plots


def test_image_grid_draws_each_map_over_its_image_scaled_to_its_maximum():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    maps = rng.random((2, 3, 8, 8)) * np.array([1.0, 10.0, 0.01])[None, :, None, None]
    fig = plots.image_grid_with_maps(images, maps, ["a", "b"], ["m1", "m2", "m3"], title="t")
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(fig.data) == 2 * (1 + 2 * 3) and len(heat) == 6  # per row: the image, then image + map per method
    for k, t in enumerate(heat):
        i, j = divmod(k, 3)
        np.testing.assert_allclose(np.array(t.z), maps[i, j] / maps[i, j].max())
        np.testing.assert_allclose(np.array(t.customdata)[..., 0], maps[i, j])  # hover: the raw value
        assert t.x0 == 1.5 and t.dx == 4 and t.y0 == 1.5 and t.dy == 4  # one cell per 4 px patch
    assert sum(bool(t.showscale) for t in heat) == 1  # one shared colourbar
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["a", "m1", "m2", "m3"]


def test_a_signed_map_is_drawn_as_a_share_of_its_largest_absolute_value_and_says_so():
    """Occlusion and integrated gradients are signed: the grid divides by the largest |value|, and the colour bar
    says so (it said 'share of map max', which a map whose extreme is negative never reaches)."""
    images = [np.zeros((32, 32, 3), np.uint8)]
    maps = np.linspace(-4.0, 1.0, 64).reshape(1, 1, 8, 8)  # largest |value|: -4
    fig = plots.image_grid_with_maps(images, maps, ["a"], ["m"])
    heat = next(t for t in fig.data if t.type == "heatmap")
    np.testing.assert_allclose(np.array(heat.z), maps[0, 0] / 4.0)
    assert heat.zmin == -1.0 and heat.zmax == 1.0
    assert heat.colorbar.title.text == "share of the<br>map's largest<br>|value|"
    assert plots.MAP_SCALING == "each map divided by its own largest |value|"


def test_layer_lines_start_at_zero_and_draw_the_reference():
    values = np.array([[1.0, 3.0], [2.0, 6.0]])
    fig = plots.layer_lines(values, "px", "t", spread=np.array([0.5, 0.5]), reference=(10.0, "ceiling"))
    mean = fig.data[-1]
    np.testing.assert_allclose(mean.y, [2.0, 4.0])
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.range[1] >= 10.0
    assert any(s.y0 == 10.0 for s in fig.layout.shapes)


def test_heatmap_over_image_puts_cells_on_patch_centres():
    fig = plots.heatmap_over_image(np.zeros((32, 32, 3), np.uint8), np.arange(64.0).reshape(8, 8), "t")
    heat = fig.data[1]
    assert heat.x0 == 1.5 and heat.dx == 4 and heat.y0 == 1.5 and heat.dy == 4
    np.testing.assert_array_equal(np.array(heat.z), np.arange(64.0).reshape(8, 8))


def test_learning_curve_and_scaling_curves_carry_their_numbers():
    fig = plots.learning_curve([0.5, 1.0], [0.6, 0.8], final=0.81, goal=0.9)
    np.testing.assert_allclose(fig.data[0].y, [60.0, 80.0])
    assert fig.data[1].y[0] == 81.0 and fig.layout.shapes[0].y0 == 90.0
    fig = plots.learning_curve([2.5, 3.0], [0.6, 0.8], final=0.81, start=(2.0, 0.7, "start"),
                               earlier=[(1.0, 0.5), (2.0, 0.7)])  # the lineage's earlier legs come first
    np.testing.assert_allclose(fig.data[0].x, [1.0, 2.0])
    np.testing.assert_allclose(fig.data[0].y, [50.0, 70.0])
    np.testing.assert_allclose(fig.data[1].y, [60.0, 80.0])
    fig = plots.scaling_curves({"vit": {100: {"mean": 0.5, "std": 0.1, "n": 2}, 1000: {"mean": 0.6, "std": 0.0,
                                                                                        "n": 2}}})
    np.testing.assert_allclose(fig.data[0].y, [50.0, 60.0])
    np.testing.assert_allclose(fig.data[0].error_y.array, [10.0, 0.0])


def test_similarity_tiles_and_table():
    sim = np.random.default_rng(1).random((3, 4, 3, 4))
    fig = plots.similarity_tiles(sim)
    z = np.array(fig.data[0].z, dtype=float)[::-1]
    assert z.shape == (3 * 4, 4 * 5)
    np.testing.assert_allclose(z[:3, :4], sim[0, 0])  # tile (0, 0) is patch (0, 0)'s map
    table = plots.table_figure(["a", "b"], [["x", 0.12345], ["y", 2]])
    assert list(table.data[0].cells.values[1]) == ["0.123", "2"]


def test_a_table_is_tall_enough_for_its_wrapped_header_and_every_row():
    """The report's faithfulness, localisation and few-shot tables cut their last row: rows at plotly's default
    20 px cut the descenders of the 12 px font, and the figure left no room for a header wrapped to two lines, so
    plotly scrolled the table and the report and its PNG hid the bottom of the last row."""
    header = ["method", "deletion AUC (lower better)", "insertion AUC (higher better)", "a much longer header that "
              "wraps onto three lines"]
    rows = [["integrated gradients", 0.1, 0.2, 0.3]] * 5
    fig = plots.table_figure(header, rows, "t")
    t = fig.data[0]
    assert t.cells.height >= 24  # room for descenders under a 12 px font
    assert plots.wrapped_lines(header[3], plots.TABLE_COLUMN_CHARS) == 3
    assert t.header.height >= t.cells.height + 2 * 14  # two more lines of text in the header
    plot_height = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_height >= t.header.height + len(rows) * t.cells.height  # nothing left to scroll to
    assert plots.wrapped_lines("shots", 20) == 1 and plots.wrapped_lines("accuracy (mean over seeds)", 20) == 2


def test_a_table_is_tall_enough_for_cells_that_wrap():
    """The report's recipe accuracy table cut its last row: a cell of three seeds' accuracies ("66.25%, 66.77%,
    66.02%") wraps onto two lines, and the figure was sized for rows of one line each."""
    one = plots.table_figure(["recipe", "each seed"], [["a", "1"], ["b", "2"]])
    wrapped = plots.table_figure(["recipe", "each seed"], [["a", "71.46%, 71.25%, 71.45%"], ["b", "66.25%, 66.77%, "
                                                                                              "66.02%"]])
    assert plots.wrapped_lines("71.46%, 71.25%, 71.45%", plots.TABLE_COLUMN_CHARS) == 2
    assert wrapped.layout.height - one.layout.height >= 2 * 14  # a second line of 12 px text in each row


def test_deletion_and_insertion_curves_of_a_method_share_its_colour_and_differ_in_dash():
    """The report's curves figure gave each of its ten curves its own colour, so a method's deletion and insertion
    curves could not be paired; each method now has one colour, deletion solid and insertion dashed."""
    x = np.linspace(0, 1, 5)
    methods = ["rollout", "gradient rollout", "integrated gradients", "occlusion", "random map"]
    fig = plots.deletion_insertion_curves(x, {m: x * i for i, m in enumerate(methods)},
                                          {m: 1 - x * i for i, m in enumerate(methods)}, "p")
    by_name = {t.name: t for t in fig.data}
    assert len(by_name) == 10
    colours = set()
    for i, m in enumerate(methods):
        d, ins = by_name[f"{m} deletion"], by_name[f"{m} insertion"]
        assert d.line.color == ins.line.color and d.line.dash == "solid" and ins.line.dash == "dash"
        np.testing.assert_allclose(d.y, x * i)
        np.testing.assert_allclose(ins.y, 1 - x * i)
        colours.add(d.line.color)
    assert len(colours) == len(methods)  # one colour per method, none shared
    assert fig.layout.xaxis.title.text == "fraction of patches changed" and fig.layout.yaxis.title.text == "p"


def test_layer_lines_name_their_error_bars_in_the_legend():
    """The attention-distance figure drew error bars on the head mean and said nowhere on the figure what they were
    (only the report's stamp did); the mean's legend entry now names them, and has no error bars to name without."""
    values = np.array([[1.0, 3.0], [2.0, 6.0]])
    fig = plots.layer_lines(values, "px", "t", spread=np.array([0.5, 0.5]), spread_label="std over images")
    mean = fig.data[-1]
    assert mean.error_y.array is not None and "error bars: std over images" in mean.name
    assert "error bars" not in plots.layer_lines(values, "px", "t").data[-1].name


def test_head_atlas_draws_each_head_at_its_distance_and_drop_with_its_interval():
    dist = np.array([[1.0, 2.0], [3.0, 4.0]])
    drop = np.array([[0.1, -0.2], [0.3, 0.0]])
    iv = np.stack([drop - 0.05, drop + 0.1], -1)
    iv[1, 1] = np.nan  # no interval: no error bar
    groups = np.array([[1, 2], [0, 0]])
    fig = plots.head_atlas(dist, {"mean": drop}, {"mean": iv}, groups)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"higher layers", "lowest layers: local heads", "lowest layers: global heads"}
    hi = by_name["higher layers"]
    assert list(hi.x) == [3.0, 4.0] and list(hi.y) == [0.3, 0.0] and hi.marker.symbol == "circle"
    assert np.allclose(hi.error_y.array, [0.1, 0.0]) and np.allclose(hi.error_y.arrayminus, [0.05, 0.0])
    assert [list(c[:2]) for c in hi.customdata] == [[2, 0], [2, 1]]  # layer (1-based), head
    assert by_name["lowest layers: local heads"].marker.symbol == "square"


def test_prefix_share_heatmaps_name_repeated_kinds_and_token_norms_draw_the_fence():
    share = np.random.default_rng(0).random((3, 2, 3)) / 3
    fig = plots.prefix_share_heatmaps(share, ["class", "reg", "reg"])
    assert [a.text for a in fig.layout.annotations] == ["class", "reg token 1", "reg token 2"]
    assert np.allclose(np.array(fig.data[2].z, dtype=float), share[:, :, 2])
    lines = plots.token_norm_lines({"patches: median": np.array([1.0, 2.0])}, np.array([5.0, 6.0]))
    assert [t.name for t in lines.data] == ["patches: median", "outlier fence"] and lines.layout.yaxis.type == "log"
