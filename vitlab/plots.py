"""Arrays in, plotly figures out: no computation, no display."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def image_grid_with_maps(images: Sequence[np.ndarray], maps: np.ndarray, titles: Sequence[str],
                         map_titles: Sequence[str], title: str = "") -> go.Figure:
    """One row per image: the image, then one heatmap per entry of ``maps``.

    ``images``: (H, W, 3) uint8 each; ``maps``: (N_images, K, gh, gw).
    """
    n, k = maps.shape[:2]
    fig = make_subplots(rows=n, cols=k + 1, horizontal_spacing=0.01, vertical_spacing=0.04,
                        subplot_titles=[t for i in range(n) for t in ([titles[i]] + list(map_titles))])
    for i in range(n):
        fig.add_trace(go.Image(z=images[i]), row=i + 1, col=1)
        for j in range(k):
            fig.add_trace(go.Heatmap(z=maps[i, j][::-1], colorscale="Viridis", showscale=False,
                                     hovertemplate="row %{y}, col %{x}: %{z:.4f}<extra></extra>"),
                          row=i + 1, col=j + 2)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title=title, height=220 * n + 80, width=160 * (k + 1) + 80, margin=dict(l=20, r=20, t=80, b=20))
    return fig


def layer_lines(values: np.ndarray, ylabel: str, title: str) -> go.Figure:
    """(L, H) per-head values against depth: one dot per head, the head mean as a line."""
    L, H = values.shape
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=values[:, h], mode="markers", name=f"head {h}",
                                 marker=dict(size=6), hovertemplate=f"layer %{{x}}, head {h}: %{{y:.3f}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=values.mean(1), mode="lines", name="mean over heads",
                             line=dict(color="black")))
    fig.update_layout(title=title, xaxis_title="network depth (layer)", yaxis_title=ylabel, width=700, height=450)
    return fig
