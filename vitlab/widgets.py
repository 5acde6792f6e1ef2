"""Widget-driven views: an attention explorer, a position-embedding explorer and an attention-distance explorer.

Each explorer holds its controls (ipywidgets) and one plotly ``FigureWidget`` whose traces are updated in place;
the computation lives in ``vitlab.inspect`` and is cached per image, so moving a slider only re-slices. All the
logic runs without a browser: set a control's ``value`` and the figure's data changes (the unit tests do this).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor, nn

import vitlab
from vitlab.capture import HEAD_FUSIONS, fuse_heads
from vitlab.info import model_info
from vitlab.inspect import (
    attention_distance_from_maps,
    gradient_rollout,
    integrated_gradients,
    occlusion,
    position_embedding_similarity,
)
from vitlab.inspect.rollout import readout_vector, rollout_row

__all__ = ["AttentionExplorer", "PositionExplorer", "DistanceExplorer", "METHODS", "HEADS"]

METHODS = ("attention", "rollout", "gradient rollout", "integrated gradients", "occlusion")
HEADS = ("mean", "max", "min")  # fusions; single heads are "head 0", "head 1", ...


def _ipw():
    import ipywidgets

    return ipywidgets


class AttentionExplorer:
    """Image, layer, head (or fusion), method, discard ratio and query patch -> a heatmap over the image.

    ``images``: ``(names, (B, C, H, W) batch, shown (H, W, 3) uint8 list)`` as ``vitlab.images.load_images``
    returns; default: the embedded photo crops. Methods: raw ``attention`` of the chosen query patch (the
    readout's row when no patch is chosen: click a patch to choose it), ``rollout`` (uses the head fusion
    and discard ratio), and the class-specific ``gradient rollout``, ``integrated gradients`` and
    ``occlusion`` for the predicted class.
    """

    def __init__(self, model: nn.Module, images: tuple[list[str], Tensor, list[np.ndarray]] | None = None,
                 num_images: int = 8) -> None:
        ipw = _ipw()
        from vitlab.images import default_images

        self.model = model  # its modes are left alone: capture and the methods run in eval mode temporarily
        names, x, shown = images if images is not None else default_images(model, num_images)
        self.names, self.x, self.shown = list(names), x, list(shown)
        self.info = model_info(model, img_size=tuple(x.shape[-2:]))
        self._maps: dict[int, Tensor] = {}  # image index -> (L, 1, H, T, T)
        self._pool: dict[int, Tensor | None] = {}  # image index -> attention-pool maps, if the model has a pool
        self._class_maps: dict[tuple[int, str], Tensor] = {}
        self.query: int | None = None  # patch index (row-major) or None for the readout
        L, H = self.info.depth, self.info.num_heads
        self.image = ipw.Dropdown(options=[(n, i) for i, n in enumerate(self.names)], value=0, description="image")
        self.upload = ipw.FileUpload(accept="image/*", multiple=False, description="upload")
        self.layer = ipw.IntSlider(value=L, min=1, max=L, description="layer")
        self.head = ipw.Dropdown(options=list(HEADS) + [f"head {h}" for h in range(H)], value="mean",
                                 description="heads")
        self.method = ipw.Dropdown(options=list(METHODS), value="attention", description="method")
        self.discard = ipw.FloatSlider(value=0.0, min=0.0, max=0.95, step=0.05, description="discard")
        self.status = ipw.HTML()
        gh, gw = self.info.grid_size
        ph, pw = self.info.patch_size
        self.figure = go.FigureWidget(
            data=[go.Image(z=self.shown[0], hoverinfo="skip"),
                  go.Heatmap(z=np.zeros((gh, gw)), x0=pw / 2 - 0.5, dx=pw, y0=ph / 2 - 0.5, dy=ph, opacity=0.55,
                             colorscale="Viridis", showscale=True, name="map",
                             hovertemplate="patch row %{customdata[0]}, col %{customdata[1]}: %{z:.4f}<extra></extra>",
                             customdata=np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1))],
            layout=go.Layout(width=460, height=440, margin=dict(l=10, r=10, t=40, b=10),
                             xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed")))
        self.figure.data[1].on_click(self._on_click)
        for w in (self.image, self.layer, self.head, self.method, self.discard):
            w.observe(lambda _change: self.update(), names="value")
        self.upload.observe(self._on_upload, names="value")
        self.update()

    # ------------------------------------------------------------------ computation (cached)
    def _attention(self, i: int) -> Tensor:
        if i not in self._maps:
            with torch.no_grad(), vitlab.capture_attention(self.model) as cap:
                self.model(self.x[i:i + 1])
            self._maps[i], self._pool[i] = cap.stack().clone(), cap.pool_maps()
        return self._maps[i]

    def _class_map(self, i: int, method: str) -> Tensor:
        key = (i, method)
        if key not in self._class_maps:
            fn = {"gradient rollout": gradient_rollout, "integrated gradients": integrated_gradients,
                  "occlusion": occlusion}[method]
            self._class_maps[key] = fn(self.model, self.x[i:i + 1])[0]
        return self._class_maps[key]

    def current_map(self) -> np.ndarray:
        """(gh, gw) the map the controls select."""
        i, method = self.image.value, self.method.value
        gh, gw = self.info.grid_size
        p = self.info.num_prefix_tokens
        maps = None if method in ("gradient rollout", "integrated gradients", "occlusion") else self._attention(i)
        if method == "attention":
            layer = maps[self.layer.value - 1, 0]  # (H, T, T)
            a = self._fuse(layer)  # (T, T)
            v = readout_vector(self.info, 1, self._pool[i])[0].float()
            if self.query is not None:
                v = torch.zeros_like(v)
                v[p + self.query] = 1.0
            return (v @ a)[p:].reshape(gh, gw).numpy()
        if method == "rollout":
            fused = self._fuse(maps[: self.layer.value, 0].transpose(0, 1))  # (l, T, T)
            v = readout_vector(self.info, 1, self._pool[i])
            if self.query is not None:
                v = torch.zeros_like(v)
                v[0, p + self.query] = 1.0
            row = rollout_row(fused[:, None, None], v, "mean", self.discard.value)
            return row[0, p:].reshape(gh, gw).float().numpy()
        return self._class_map(i, method).numpy()

    def _fuse(self, a: Tensor) -> Tensor:
        """(H, ...) -> (...): one head or a fusion over heads."""
        h = self.head.value
        return fuse_heads(a, h, dim=0) if h in HEAD_FUSIONS else a[int(h.split()[1])]

    # ------------------------------------------------------------------ events
    def update(self) -> None:
        i = self.image.value
        z = self.current_map()
        with self.figure.batch_update():
            self.figure.data[0].z = self.shown[i]
            self.figure.data[1].z = z
            q = "readout" if self.query is None else f"patch {divmod(self.query, self.info.grid_size[1])}"
            self.figure.layout.title = (f"{self.names[i]}: {self.method.value}, layer {self.layer.value}, "
                                        f"{self.head.value}" + (f", query {q}" if self.method.value in
                                                                ("attention", "rollout") else ""))
        self.status.value = f"max {float(np.max(z)):.4f}, sum {float(np.sum(z)):.4f}"

    def _on_click(self, trace, points, _state) -> None:
        if points.point_inds:
            r, c = points.point_inds[0]
            self.select_patch(int(r), int(c))

    def select_patch(self, row: int | None, col: int | None = None) -> None:
        """Choose the query patch (``None`` for the readout) and redraw."""
        gh, gw = self.info.grid_size
        if row is None:
            self.query = None
        else:
            if not (0 <= row < gh and 0 <= col < gw):
                raise ValueError(f"patch ({row}, {col}) is outside the {gh}x{gw} grid")
            self.query = row * gw + col
        self.update()

    def add_image(self, name: str, data: bytes) -> None:
        """Add an uploaded image (encoded bytes), preprocessed as the model expects, and show it."""
        from PIL import Image, UnidentifiedImageError

        from vitlab.images import model_transform

        try:
            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB")
                tf, cfg = model_transform(self.model)
                x = tf(im)[None]
                size = cfg["input_size"][-2:]
                shown = np.asarray(im.resize((size[1], size[0]), Image.Resampling.BICUBIC))
        except (UnidentifiedImageError, OSError) as e:
            self.status.value = f"<b>could not read {name}</b>: {e}"
            return
        self.x = torch.cat([self.x, x])
        self.names.append(name)
        self.shown.append(shown)
        self.image.options = [(n, k) for k, n in enumerate(self.names)]
        self.image.value = len(self.names) - 1

    def _on_upload(self, change) -> None:
        for f in change["new"] or ():
            self.add_image(f["name"], bytes(f["content"]))

    def widget(self):
        ipw = _ipw()
        controls = ipw.VBox([self.image, self.upload, self.method, self.layer, self.head, self.discard, self.status])
        return ipw.HBox([controls, self.figure])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())


class PositionExplorer:
    """Click a patch: the cosine similarity of its position embedding with every other patch's."""

    def __init__(self, model: nn.Module, grid: tuple[int, int] | None = None) -> None:
        self.sim = position_embedding_similarity(model, grid=grid)  # (gh, gw, gh, gw)
        gh, gw = self.sim.shape[:2]
        self.patch = (gh // 2, gw // 2)
        self.figure = go.FigureWidget(
            data=[go.Heatmap(z=self.sim[self.patch].numpy(), zmin=-1, zmax=1, colorscale="Viridis",
                             hovertemplate="row %{y}, col %{x}: %{z:.3f}<extra></extra>")],
            layout=go.Layout(width=420, height=420, yaxis=dict(autorange="reversed", scaleanchor="x"),
                             margin=dict(l=10, r=10, t=40, b=10)))
        self.figure.data[0].on_click(lambda _t, pts, _s: pts.point_inds and self.select(*pts.point_inds[0]))
        self.select(*self.patch)

    def select(self, row: int, col: int) -> None:
        gh, gw = self.sim.shape[:2]
        if not (0 <= row < gh and 0 <= col < gw):
            raise ValueError(f"patch ({row}, {col}) is outside the {gh}x{gw} grid")
        self.patch = (int(row), int(col))
        with self.figure.batch_update():
            self.figure.data[0].z = self.sim[self.patch].numpy()
            self.figure.layout.title = f"similarity to the position embedding of patch {self.patch}"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.figure)


class DistanceExplorer:
    """Mean attention distance per head against depth; hover a dot for its layer and head, click it to open that
    head in a linked ``AttentionExplorer``."""

    def __init__(self, model: nn.Module, images: Tensor | None = None, explorer: AttentionExplorer | None = None,
                 num_images: int = 16) -> None:
        from vitlab.images import default_images

        if images is None:
            images = default_images(model, num_images)[1]
        info = model_info(model, img_size=tuple(images.shape[-2:]))
        maps = vitlab.attention_maps(model, images)
        self.distance = attention_distance_from_maps(maps, info.grid_size, info.patch_size,
                                                     info.num_prefix_tokens).mean(1).float()  # (L, H)
        self.explorer = explorer
        L, H = self.distance.shape
        layers, heads = np.meshgrid(np.arange(1, L + 1), np.arange(H), indexing="ij")
        self.figure = go.FigureWidget(
            data=[go.Scatter(x=layers.ravel(), y=self.distance.numpy().ravel(), mode="markers",
                             customdata=heads.ravel(), marker=dict(size=8, color=heads.ravel(), colorscale="Turbo"),
                             hovertemplate="layer %{x}, head %{customdata}: %{y:.1f} px<extra></extra>")],
            layout=go.Layout(width=560, height=400, xaxis_title="network depth (layer)",
                             yaxis_title="mean attention distance (pixels)", margin=dict(l=50, r=10, t=40, b=40)))
        self.figure.data[0].on_click(lambda _t, pts, _s: pts.point_inds and self.open(pts.point_inds[0]))

    def open(self, point: int) -> tuple[int, int]:
        """The (layer, head) of dot ``point`` (1-based layer); shown in the linked explorer when there is one."""
        H = self.distance.shape[1]
        layer, head = point // H + 1, point % H
        if self.explorer is not None:
            self.explorer.method.value = "attention"
            self.explorer.head.value = f"head {head}"
            self.explorer.layer.value = layer
        return layer, head

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.figure)


def explorers(model: nn.Module, images: tuple[list[str], Tensor, list[np.ndarray]] | None = None,
              num_images: int = 8) -> Sequence[object]:
    """The three explorers, the distance explorer linked to the attention explorer."""
    att = AttentionExplorer(model, images, num_images)
    return att, PositionExplorer(model), DistanceExplorer(model, att.x, att)
