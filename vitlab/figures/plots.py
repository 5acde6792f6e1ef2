"""Arrays in, plotly figures out: no computation, no display."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def notebook_figures() -> None:
    """Figures shown in a notebook also carry an HTML copy (plotly.js inline, once), so a notebook exported with
    ``jupyter nbconvert --to html`` keeps its figures instead of dropping the plotly-only output."""
    import plotly.io as pio

    pio.renderers.default = "plotly_mimetype+notebook"


def map_over_image_traces(image: np.ndarray, grid_map: np.ndarray, opacity: float = 0.6,
                          **heatmap: object) -> list[go.BaseTraceType]:
    """The two traces of a (gh, gw) map drawn over an (H, W, 3) uint8 image, one cell per patch, in the image's
    pixel coordinates: the one way vitlab draws a map over an image (report grids and the explorer)."""
    gh, gw = grid_map.shape
    ph, pw = image.shape[0] / gh, image.shape[1] / gw
    cells = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1)
    kw: dict = dict(colorscale="Viridis", name="map", customdata=cells,
                    hovertemplate="patch row %{customdata[0]}, col %{customdata[1]}: %{z:.4g}<extra></extra>")
    kw.update(heatmap)
    return [go.Image(z=image, hoverinfo="skip"),
            go.Heatmap(z=grid_map, x0=pw / 2 - 0.5, dx=pw, y0=ph / 2 - 0.5, dy=ph, opacity=opacity, **kw)]


def layer_span(first: int, last: int) -> str:
    """1-based layers in words: 'layer 3', 'layers 1-10'."""
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def gpsa_words(info) -> str:
    """'layers 1-k: gated positional self-attention (GPSA)' for a ConViT (``ModelInfo.gpsa_depth``), the layers a
    per-layer figure marks as such; "" for a model without it."""
    return f"{layer_span(1, info.gpsa_depth)}: gated positional self-attention (GPSA)" if info.gpsa_depth else ""


#: how ``image_grid_with_maps`` scales each map, for the titles of figures that draw with it
MAP_SCALING = "each map divided by its own largest |value|"


def image_grid_with_maps(images: Sequence[np.ndarray], maps: np.ndarray, titles: Sequence[str],
                         map_titles: Sequence[str], title: str = "") -> go.Figure:
    """One row per image: the image, then each entry of ``maps`` drawn over it, each map divided by its own largest
    absolute value (``MAP_SCALING``), so a map's values lie in [-1, 1], signs kept: 1 is its largest positive value
    only when that is also its largest in magnitude (one shared colourbar from min(0, the lowest share) to 1; hover
    shows the raw value).

    ``images``: (H, W, 3) uint8 each; ``maps``: (N_images, K, gh, gw).
    """
    n, k = maps.shape[:2]
    peak = np.abs(maps).reshape(n, k, -1).max(-1)[..., None, None]
    scaled = maps / np.where(peak > 0, peak, 1.0)
    fig = make_subplots(rows=n, cols=k + 1, horizontal_spacing=0.015, vertical_spacing=0.45 / max(n, 1),
                        subplot_titles=[t for i in range(n) for t in ([titles[i]] + list(map_titles))])
    zmin = min(0.0, float(scaled.min()))
    for i in range(n):
        fig.add_trace(go.Image(z=images[i]), row=i + 1, col=1)
        for j in range(k):
            for t in map_over_image_traces(images[i], scaled[i, j], zmin=zmin, zmax=1.0,
                                           showscale=i == 0 and j == 0, customdata=maps[i, j][..., None],
                                           colorbar=dict(title=dict(text="share of the<br>map's largest<br>|value|",
                                                                    side="right"),
                                                         len=0.6),
                                           hovertemplate="raw value %{customdata[0]:.4g}<extra></extra>"):
                fig.add_trace(t, row=i + 1, col=j + 2)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_annotations(font_size=10)
    fig.update_layout(title=title, height=230 * n + 120, width=175 * (k + 1) + 200,
                      margin=dict(l=20, r=20, t=120, b=20))
    return fig


def heatmap_over_image(image: np.ndarray, grid_map: np.ndarray, title: str = "") -> go.Figure:
    """An (H, W, 3) uint8 image with a (gh, gw) map drawn over it, one cell per patch, with a colourbar."""
    fig = go.Figure(map_over_image_traces(image, grid_map, opacity=0.55, showscale=True,
                                          colorbar=dict(title="weight")))
    fig.update_layout(title=dict(text=title, font_size=13), width=500, height=460, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"))
    return fig


def _depth_layout(fig: go.Figure, top: float, ylabel: str, title: str,
                  reference: tuple[float, str] | None) -> go.Figure:
    """The layout of a per-layer figure: layers on x, y from zero to above ``top`` (and the reference line's value,
    drawn dashed with its label when given)."""
    if reference is not None:
        fig.add_hline(y=reference[0], line_dash="dash", line_color="grey", annotation_text=reference[1],
                      annotation_position="top left", annotation_align="left")  # a two-line label: both lines left
        top = max(top, reference[0])
    fig.update_layout(title=title, xaxis_title="network depth (layer)", yaxis_title=ylabel, width=760, height=470,
                      yaxis_range=[0, 1.12 * top], xaxis=dict(tickmode="linear", dtick=1))
    return fig


def layer_lines(values: np.ndarray, ylabel: str, title: str, spread: np.ndarray | None = None,
                reference: tuple[float, str] | None = None, spread_label: str = "spread") -> go.Figure:
    """(L, H) per-head values against depth: one dot per head, the head mean as a line; y axis from zero.

    ``spread`` (L,): error bars on the head mean (for example the standard deviation over images), named in the
    legend by ``spread_label``; ``reference`` (value, label): a dashed horizontal line, e.g. the uniform-attention
    distance.
    """
    L, H = values.shape
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=values[:, h], mode="markers", name=f"head {h}",
                                 marker=dict(size=6), hovertemplate=f"layer %{{x}}, head {h}: %{{y:.3f}}<extra></extra>"))
    name = "mean over heads" if spread is None else f"mean over heads<br>(error bars: {spread_label})"
    fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=values.mean(1), mode="lines", name=name,
                             line=dict(color="black"),
                             error_y=None if spread is None else dict(type="data", array=spread, visible=True)))
    top = float(np.nanmax(values)) if values.size else 1.0
    return _depth_layout(fig, top, ylabel, title, reference)


def layer_lines_by_model(values: dict[str, np.ndarray], ylabel: str, title: str,
                         reference: tuple[float, str] | None = None) -> go.Figure:
    """{model name: (L, H) per-head values} against depth, one colour per model: its heads as faint dots, its head
    mean as a line; y axis from zero. ``reference`` (value, label): a dashed horizontal line."""
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a"]
    fig = go.Figure()
    top = 1.0
    for k, (name, v) in enumerate(values.items()):
        L, H = v.shape
        c = colors[k % len(colors)]
        x = np.repeat(np.arange(1, L + 1), H) + (k - (len(values) - 1) / 2) * 0.12  # side by side per layer
        fig.add_trace(go.Scatter(x=x, y=v.reshape(-1), mode="markers", marker=dict(size=5, color=c, opacity=0.45),
                                 name=f"{name}: heads", legendgroup=name, showlegend=False,
                                 hovertemplate=f"{name}, layer %{{x:.0f}}: %{{y:.2f}}<extra></extra>"))
        fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=v.mean(1), mode="lines+markers", name=name,
                                 legendgroup=name, line=dict(color=c, width=3)))
        top = max(top, float(np.nanmax(v)) if v.size else 1.0)
    return _depth_layout(fig, top, ylabel, title, reference)


def filter_grid(components: np.ndarray, ratio: np.ndarray, cols: int = 7, title: str = "") -> go.Figure:
    """(k, C, P, P) filters as RGB tiles (each min-max scaled on its own), titled by explained variance."""
    k = components.shape[0]
    rows = int(np.ceil(k / cols))
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.01, vertical_spacing=0.04,
                        subplot_titles=[f"{i + 1}: {100 * r:.1f}%" for i, r in enumerate(ratio)])
    for i in range(k):
        f = components[i].transpose(1, 2, 0)
        f = (f - f.min()) / max(float(f.max() - f.min()), 1e-12)
        if f.shape[-1] != 3:
            f = np.repeat(f.mean(-1, keepdims=True), 3, axis=-1)
        fig.add_trace(go.Image(z=(f * 255).astype(np.uint8)), row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_annotations(font_size=9)
    fig.update_layout(title=title, height=110 * rows + 80, width=110 * cols + 40, margin=dict(l=10, r=10, t=70, b=10))
    return fig


def similarity_tiles(sim: np.ndarray, title: str = "") -> go.Figure:
    """(gh, gw, gh, gw) similarities as one heatmap of gh x gw tiles: tile (i, j) is patch (i, j)'s map."""
    gh, gw = sim.shape[:2]
    pad = np.full((gh, gw, gh + 1, gw + 1), np.nan)
    pad[:, :, :gh, :gw] = sim
    big = pad.transpose(0, 2, 1, 3).reshape(gh * (gh + 1), gw * (gw + 1))
    fig = go.Figure(go.Heatmap(z=big[::-1], colorscale="Viridis", zmin=-1, zmax=1,
                               colorbar=dict(title="cosine"), hoverongaps=False))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x")
    fig.update_layout(title=title, width=640, height=600)
    return fig


def cka_matrices(panels: Sequence[tuple[str, np.ndarray, Sequence[str], Sequence[str]]], title: str = "") -> go.Figure:
    """Linear CKA matrices side by side, each panel (title, (rows, cols) CKA, row layer names, column layer names):
    rows up the y axis and columns along the x axis from the first layer, one colour scale from min(0, the lowest
    value) to 1 for all panels, the value on hover (NaN: a representation constant over the images, left blank)."""
    fig = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.09,
                        subplot_titles=[p[0] for p in panels])
    finite = [float(np.nanmin(m)) for _, m, _, _ in panels if np.isfinite(m).any()]
    zmin = min([0.0, *finite])
    for k, (name, m, rows, cols) in enumerate(panels):
        fig.add_trace(go.Heatmap(z=m, x=list(cols), y=list(rows), zmin=zmin, zmax=1.0, colorscale="Viridis",
                                 showscale=k == 0, colorbar=dict(title="CKA", len=0.8), hoverongaps=False,
                                 hovertemplate=f"{name}<br>%{{y}} against %{{x}}: CKA %{{z:.3f}}<extra></extra>"),
                      row=1, col=k + 1)
        fig.update_xaxes(type="category", tickangle=-45, tickfont_size=9, row=1, col=k + 1)
        fig.update_yaxes(type="category", tickfont_size=9, row=1, col=k + 1)
    fig.update_annotations(font_size=12)
    fig.update_layout(title=title, width=min(1080, 340 * len(panels) + 120), height=430,
                      margin=dict(l=60, r=20, t=90, b=90))
    return fig


#: a table's row height in px: plotly's default (20) cuts the descenders of its 12 px font (g, p, y)
TABLE_ROW_PX = 26
#: a table column's width in px, and the characters of its 12 px font that fit on one line of it
TABLE_COLUMN_PX, TABLE_COLUMN_CHARS = 150, 20


def wrapped_lines(text: str, chars: int) -> int:
    """How many lines ``text`` takes when wrapped at spaces into lines of at most ``chars`` characters."""
    lines, width = 1, 0
    for word in text.split():
        if width and width + 1 + len(word) > chars:
            lines, width = lines + 1, len(word)
        else:
            width += len(word) + (1 if width else 0)
    return lines


def _row_px(texts: Sequence[object]) -> int:
    """The height in px of a table row holding ``texts``, one per column: a line each, plus one more for every extra
    line its most wrapped text takes at the column width."""
    lines = max((wrapped_lines(str(t), TABLE_COLUMN_CHARS) for t in texts), default=1)
    return TABLE_ROW_PX + 16 * (lines - 1)


def table_figure(header: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> go.Figure:
    """A plotly table; floats shown with 3 decimals. Tall enough for every row, each cell and the header wrapped to
    its column width: plotly scrolls a table that does not fit, which in a report or a PNG hides its last rows."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in col] for col in zip(*rows)]
    header_px = _row_px(header)
    rows_px = sum(_row_px(row) for row in zip(*cells))
    fig = go.Figure(go.Table(header=dict(values=list(header), align="left", fill_color="#e8e8f0", height=header_px),
                             cells=dict(values=cells, align="left", height=TABLE_ROW_PX)))
    fig.update_layout(title=title, width=TABLE_COLUMN_PX * len(header) + 40,
                      height=60 + header_px + rows_px + 10, margin=dict(l=10, r=10, t=50, b=10))
    return fig


def deletion_insertion_curves(x: np.ndarray, deletion: dict[str, np.ndarray], insertion: dict[str, np.ndarray],
                               ylabel: str, title: str = "") -> go.Figure:
    """Each method's deletion (solid) and insertion (dashed) curve in one colour per method (each shaped like ``x``,
    the fraction of patches changed): with a colour per curve, ten curves took ten unrelated colours and a method's
    two curves could not be told apart from the others'."""
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#7f7f7f", "#ff7f0e", "#17becf"]
    fig = go.Figure()
    for k, method in enumerate(dict.fromkeys([*deletion, *insertion])):
        for kind, ys, dash in (("deletion", deletion, "solid"), ("insertion", insertion, "dash")):
            if method in ys:
                fig.add_trace(go.Scatter(x=x, y=ys[method], mode="lines+markers", name=f"{method} {kind}",
                                         legendgroup=method, line=dict(color=colours[k % len(colours)], dash=dash),
                                         marker=dict(size=5)))
    fig.update_layout(title=title, xaxis_title="fraction of patches changed", yaxis_title=ylabel, width=900,
                      height=480)
    return fig


def scaling_curves(summary: dict[str, dict[int, dict[str, float]]], title: str = "",
                   ylabel: str = "few-shot accuracy on held-out classes",
                   compute: dict[str, dict[int, float]] | None = None) -> go.Figure:
    """Fig. 3/4 style: accuracy against pre-training set size (log x), one line per family, error bars = std
    over seeds. ``summary``: ``vitlab.studies.scaling.summarise`` output. With ``compute`` ({family: {size: FLOPs}}), a
    second panel draws the same accuracies against pre-training compute (paper Fig. 5)."""
    panels = 2 if compute else 1
    fig = make_subplots(rows=1, cols=panels, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=["against pre-training images", "against pre-training compute"][:panels])
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    for i, (fam, by_size) in enumerate(summary.items()):
        sizes = sorted(by_size)
        y = [100 * by_size[n]["mean"] for n in sizes]
        err = dict(type="data", array=[100 * by_size[n]["std"] for n in sizes], visible=True)
        colour = colours[i % len(colours)]
        fig.add_trace(go.Scatter(x=sizes, y=y, mode="lines+markers", name=fam, error_y=err, legendgroup=fam,
                                 line=dict(color=colour),
                                 hovertemplate=f"{fam}: %{{x}} images, %{{y:.1f}}%<extra></extra>"), row=1, col=1)
        if compute:
            fig.add_trace(go.Scatter(x=[compute[fam][n] for n in sizes], y=y, mode="lines+markers", name=fam,
                                     error_y=err, legendgroup=fam, showlegend=False, line=dict(color=colour),
                                     hovertemplate=f"{fam}: %{{x:.3g}} FLOPs, %{{y:.1f}}%<extra></extra>"),
                          row=1, col=2)
    all_sizes = sorted({n for by in summary.values() for n in by})
    fig.update_xaxes(type="log", title="pre-training images", tickvals=all_sizes,
                     ticktext=[f"{n:,}" for n in all_sizes], row=1, col=1)
    if compute:
        fig.update_xaxes(type="log", title="pre-training FLOPs (FlopCounterMode)", row=1, col=2)
    fig.update_yaxes(title=ylabel + " (%)", row=1, col=1)
    fig.update_layout(title=title, width=470 * panels + 140, height=470)  # two panels fit the report's 1,100 px
    return fig


def _interval_bars(rows: Sequence[dict]) -> dict:
    """Asymmetric error bars from ``{"mean", "interval": (lo, hi)}`` rows; none (0) where an interval is NaN."""
    up = [0.0 if np.isnan(r["interval"][1]) else 100 * (r["interval"][1] - r["mean"]) for r in rows]
    down = [0.0 if np.isnan(r["interval"][0]) else 100 * (r["mean"] - r["interval"][0]) for r in rows]
    return dict(type="data", symmetric=False, array=up, arrayminus=down, visible=True)


def locality_curves(by_family: dict[str, dict[int, dict]], local_head: float, title: str = "") -> go.Figure:
    """The lowest layer's locality against pre-training images (log x), one colour per family, error bars = 95%
    interval over seeds. ``by_family``: {family: ``vitlab.findings.studies.locality_by_size`` output} (shares of
    1, drawn in %). Left: the mean head distance (solid) and the most local head's (dashed), % of the
    uniform-attention distance, with the ``local_head`` line below which a head counts as local; right: the share
    of local heads (%)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["lowest-layer head distance", "share of local lowest-layer heads"])
    colours = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    for i, (fam, by_size) in enumerate(by_family.items()):
        sizes, colour = sorted(by_size), colours[i % len(colours)]
        for series, dash, shown, col in (("mean_distance", "solid", "mean head", 1), ("min_distance", "dash",
                                                                                       "most local head", 1),
                                         ("local_share", "solid", "local heads", 2)):
            rows = [by_size[n][series] for n in sizes]
            fig.add_trace(go.Scatter(x=sizes, y=[100 * r["mean"] for r in rows], mode="lines+markers",
                                     name=f"{fam}: {shown}", legendgroup=fam, error_y=_interval_bars(rows),
                                     line=dict(color=colour, dash=dash), showlegend=col == 1,
                                     hovertemplate=f"{fam}, {shown}: %{{x:,}} images, %{{y:.1f}}%<extra></extra>"),
                          row=1, col=col)
    fig.add_hline(y=100 * local_head, line=dict(color="grey", dash="dot"), row=1, col=1,
                  annotation_text=f"a head below is local ({local_head:.0%})", annotation_position="bottom left")
    all_sizes = sorted({n for by in by_family.values() for n in by})
    fig.update_xaxes(type="log", title="pre-training images", tickvals=all_sizes,
                     ticktext=[f"{n:,}" for n in all_sizes])
    fig.update_yaxes(title="% of the uniform-attention distance", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="% of the lowest layer's heads", range=[-5, 105], row=1, col=2)
    fig.update_layout(title=title, width=1080, height=470, legend=dict(orientation="h", y=-0.22))
    return fig


def learning_curve(hours: Sequence[float], accuracy: Sequence[float], title: str = "", final: float | None = None,
                   goal: float | None = 0.9, metric: str = "test accuracy",
                   final_label: str = "as shipped (fp16, timm transform)", curve_label: str | None = None,
                   percent: bool = True, start: tuple[float, float | None, str] | None = None,
                   earlier: Sequence[tuple[float, float]] | None = None) -> go.Figure:
    """``metric`` (a fraction; by default test accuracy) against cumulative training hours, with the goal line and
    the shipped model's value (``final``, labelled ``final_label``); ``curve_label`` names the curve (default:
    "METRIC after each evaluated epoch"). ``percent=False``: a metric that is not a fraction (e.g. a loss), drawn
    as it is on an automatic y range. ``start``: (hours, value or None, label) of the checkpoint a warm-started run
    began from: a marker there (a dotted line at its hours when its value is unknown); ``hours`` then count from
    the start of the whole lineage. ``earlier``: (cumulative hours, value) of the model each earlier leg of that
    lineage shipped, joined by a dotted line (the whole history, one point per leg)."""
    k = 100 if percent else 1
    fig = go.Figure()
    if earlier:
        fig.add_trace(go.Scatter(x=[h for h, _ in earlier], y=[k * v for _, v in earlier], mode="lines+markers",
                                 line_dash="dot", line_color="grey", marker_size=6,
                                 name=f"earlier legs, each as shipped ({len(earlier)})",
                                 hovertemplate="%{x:.2f} h: %{y:.2f}" + ("%" if percent else "") + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=list(hours), y=[k * a for a in accuracy], mode="lines+markers",
                             name=curve_label or f"{metric} after each evaluated epoch",
                             hovertemplate="%{x:.2f} h: %{y:.2f}" + ("%" if percent else "") + "<extra></extra>"))
    if start is not None:
        h0, v0, label = start
        if v0 is None:
            fig.add_vline(x=h0, line_dash="dot", line_color="grey", annotation_text=label)
        else:
            fig.add_trace(go.Scatter(x=[h0], y=[k * v0], mode="markers", marker_symbol="diamond", marker_size=11,
                                     name=f"{label}: {v0:.2%}" if percent else f"{label}: {v0:.4f}"))
    if goal is not None:
        fig.add_hline(y=k * goal, line_dash="dash", line_color="grey", annotation_text=f"goal {goal:.0%}",
                      annotation_position="top left", annotation_align="left")  # a two-line label: both lines left
    if final is not None and len(hours):
        fig.add_trace(go.Scatter(x=[hours[-1]], y=[k * final], mode="markers", marker_symbol="star",
                                 marker_size=14, name=f"{final_label}: {final:.2%}" if percent else
                                 f"{final_label}: {final:.4f}"))
    fig.update_layout(title=title, xaxis_title="training hours (wall clock)",
                      yaxis_title=f"{metric} (%)" if percent else metric, width=760, height=440,
                      legend=dict(x=0.45, y=0.1))
    fig.update_xaxes(rangemode="tozero")  # hours from the start of training (of the whole lineage)
    if percent:
        fig.update_yaxes(range=[0, 100])
    return fig


#: the panels of ``emergence_curves``: record key, axis title
EMERGENCE_PANELS = (
    ("val_accuracy", "validation accuracy"),
    ("position_spearman", "position-embedding Spearman<br>(-1: local)"),
    ("lowest_min", "lowest layer: most local head<br>(share of uniform)"),
    ("lowest_max", "lowest layer: most global head<br>(share of uniform)"),
    ("depth_trend", "depth trend of distance<br>(Spearman)"),
    ("filter_frequency", "filter rank vs frequency<br>(Spearman)"),
)


def emergence_curves(bands: dict[str, dict[str, dict[str, list[float]]]], title: str = "") -> go.Figure:
    """One panel per ``EMERGENCE_PANELS`` key: for each recipe, its seeds' mean against training images seen, with a
    band from their min to max. ``bands[recipe][key]`` is ``vitlab.train.emergence.emergence_bands``' output; a key a
    recipe lacks is left out of its panel."""
    panels = [(k, t) for k, t in EMERGENCE_PANELS if any(k in b for b in bands.values())]
    cols = 3
    rows = max(1, -(-len(panels) // cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[t.split("<br>")[0] for _, t in panels],
                        horizontal_spacing=0.08, vertical_spacing=0.18)
    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    for i, (key, axis) in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        for j, (recipe, by_key) in enumerate(bands.items()):
            b = by_key.get(key)
            if b is None:
                continue
            x = [s / 1e6 for s in b["images_seen"]] if all(s is not None for s in b["images_seen"]) else b["epoch"]
            color = colors[j % len(colors)]
            fig.add_trace(go.Scatter(x=x + x[::-1], y=b["max"] + b["min"][::-1], fill="toself", fillcolor=color,
                                     opacity=0.2, line=dict(width=0), hoverinfo="skip", showlegend=False), row=r, col=c)
            fig.add_trace(go.Scatter(x=x, y=b["mean"], mode="lines", line=dict(color=color), name=recipe,
                                     legendgroup=recipe, showlegend=i == 0,
                                     hovertemplate=f"{recipe}: %{{y:.3f}}<extra></extra>"), row=r, col=c)
        fig.update_yaxes(title_text=axis.split("<br>")[-1] if "<br>" in axis else "", row=r, col=c)
        fig.update_xaxes(title_text="training images seen (millions)", row=r, col=c)
    fig.update_layout(title=title, height=330 * rows, width=1100, template="plotly_white",
                      legend=dict(orientation="h", y=-0.12))
    return fig


def similarity_figure(aa: np.ndarray, bb: np.ndarray, ab: np.ndarray, vit_layers: list[str], resnet_layers: list[str],
                      vit: str = "ViT", resnet: str = "ResNet", subtitle: str = "") -> go.Figure:
    """The three CKA matrices (``aa`` (La, La): the ViT against itself, ``bb`` (Lb, Lb): the ResNet against itself,
    ``ab`` (La, Lb): the ViT against the ResNet) as one figure (``cka_matrices``); layer names that do not fit the
    matrices are replaced by "layer 1", ... ."""
    aa, bb, ab = (np.asarray(m, dtype=np.float64) for m in (aa, bb, ab))
    if len(vit_layers) != len(aa):  # names that do not fit the layers read (a CNN without timm's feature_info)
        vit_layers = [f"layer {i + 1}" for i in range(len(aa))]
    if len(resnet_layers) != len(bb):
        resnet_layers = [f"layer {i + 1}" for i in range(len(bb))]
    return cka_matrices([(f"{vit} against itself", aa, vit_layers, vit_layers),
                         (f"{resnet} against itself", bb, resnet_layers, resnet_layers),
                         (f"{vit} (rows) against {resnet}", ab, vit_layers, resnet_layers)],
                        title=f"Linear CKA between layers<br><sup>{subtitle}</sup>")


#: the head atlas's marker per group of heads: (symbol, legend name), keyed by the group code ``head_atlas`` reads
ATLAS_GROUPS = {0: ("circle", "higher layers"), 1: ("square", "lowest layers: local heads"),
                2: ("diamond", "lowest layers: global heads")}


def head_atlas(distance: np.ndarray, drops: dict[str, np.ndarray], intervals: dict[str, np.ndarray],
               groups: np.ndarray, title: str = "", colour_label: str = "layer") -> go.Figure:
    """One panel per ablation: each head as a dot at its mean attention distance (x, pixels) and its importance
    (y: the drop in the true class's log-probability, nats), with its 95% interval as an error bar (none where the
    interval is NaN); colour: the head's layer (1-based); symbol: its group (``groups`` (L, H) codes of
    ``ATLAS_GROUPS``). ``distance``, each of ``drops`` (L, H); each of ``intervals`` (L, H, 2)."""
    L, H = distance.shape
    layer = np.repeat(np.arange(1, L + 1), H)
    head = np.tile(np.arange(H), L)
    fig = make_subplots(rows=1, cols=len(drops), subplot_titles=[f"{name} ablation" for name in drops],
                        horizontal_spacing=0.1)
    for k, (name, drop) in enumerate(drops.items()):
        iv = intervals[name].reshape(-1, 2)
        y = drop.reshape(-1)
        up, down = np.nan_to_num(iv[:, 1] - y), np.nan_to_num(y - iv[:, 0])
        for code, (symbol, label) in ATLAS_GROUPS.items():
            sel = groups.reshape(-1) == code
            if not sel.any():
                continue
            fig.add_trace(go.Scatter(
                x=distance.reshape(-1)[sel], y=y[sel], mode="markers", name=label, legendgroup=label,
                showlegend=k == 0, customdata=np.stack([layer[sel], head[sel], iv[sel, 0], iv[sel, 1]], -1),
                error_y=dict(type="data", array=up[sel], arrayminus=down[sel], thickness=1, width=0,
                             color="rgba(80,80,80,0.5)"),
                marker=dict(symbol=symbol, size=9, color=layer[sel], colorscale="Viridis", cmin=1, cmax=max(L, 2),
                            line=dict(width=1, color="black"), showscale=k == 0 and code == 0,
                            colorbar=dict(title=colour_label, x=1.02, len=0.7)),
                hovertemplate="layer %{customdata[0]}, head %{customdata[1]}: %{x:.1f} px, drop %{y:.3g} nats "
                              "[%{customdata[2]:.3g}, %{customdata[3]:.3g}]<extra></extra>"), row=1, col=k + 1)
        fig.update_xaxes(title_text="mean attention distance (pixels)", row=1, col=k + 1)
        fig.update_yaxes(title_text="drop in log p(true class) (nats)" if k == 0 else None, row=1, col=k + 1)
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title=title, width=480 * len(drops) + 100, height=500,
                      legend=dict(orientation="h", y=-0.18), margin=dict(t=90, b=110))
    return fig


def prefix_share_heatmaps(share: np.ndarray, kinds: Sequence[str], title: str = "") -> go.Figure:
    """(L, H, P) shares of attention on each of the P prefix tokens (named by ``kinds``) as one (layer x head)
    heatmap per prefix token, one colour scale from 0 to the largest share (NaN cells, a token not yet joined, blank)."""
    L, H, P = share.shape
    fig = make_subplots(rows=1, cols=P, subplot_titles=[f"{kind} token {i}" if kinds.count(kind) > 1 else kind
                                                        for i, kind in enumerate(kinds)], horizontal_spacing=0.04)
    top = float(np.nanmax(share)) if np.isfinite(share).any() else 1.0
    for j in range(P):
        fig.add_trace(go.Heatmap(z=share[:, :, j], x=np.arange(H), y=np.arange(1, L + 1), zmin=0, zmax=top or 1.0,
                                 colorscale="Viridis", showscale=j == 0, hoverongaps=False,
                                 colorbar=dict(title="share of<br>attention"),
                                 hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>"), row=1, col=j + 1)
        fig.update_xaxes(title_text="head", dtick=1, row=1, col=j + 1)
    fig.update_yaxes(title_text="layer", dtick=1, autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", dtick=1)
    fig.update_layout(title=title, width=max(420, 230 * P + 160), height=160 + 26 * L, margin=dict(t=100))
    return fig


def token_norm_lines(lines: dict[str, np.ndarray], fences: np.ndarray, title: str = "") -> go.Figure:
    """Token norms against depth: each of ``lines`` ({name: (L,) norms}, e.g. the patches' median and maximum and
    each prefix token's mean) as a line, and the outlier fence ``fences`` (L,) dashed; log y axis."""
    L = len(fences)
    x = np.arange(1, L + 1)
    fig = go.Figure()
    for name, v in lines.items():
        fig.add_trace(go.Scatter(x=x, y=v, mode="lines+markers", name=name,
                                 hovertemplate=f"{name}, layer %{{x}}: %{{y:.3g}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=fences, mode="lines", name="outlier fence", line=dict(dash="dash", color="grey"),
                             hovertemplate="fence, layer %{x}: %{y:.3g}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="network depth (layer)", yaxis_title="token L2 norm (log scale)",
                      yaxis_type="log", width=760, height=470, xaxis=dict(tickmode="linear", dtick=1))
    return fig
