"""Widget-driven views: an attention explorer, a position-embedding explorer and an attention-distance explorer.

Each explorer holds its controls (ipywidgets) and one plotly ``FigureWidget`` whose traces are updated in place;
the computation lives in ``vitlab.inspect`` and is cached per image, so moving a slider only re-slices. All the
logic runs without a browser: set a control's ``value`` and the figure's data changes (the unit tests do this).
The figure is shown through ``live.box`` (``vitlab.app.livefigure.LiveFigure``): a figure whose view stopped
applying edits is replaced there, and ``figure`` is always the current one.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor, nn

from vitlab.app.livefigure import LiveFigure, WholeFigureWidget
from vitlab.base.checks import whole_index
from vitlab.base.stats import probability_words
from vitlab.figures.plots import gpsa_words, heatmap_over_image, layer_lines
from vitlab.inspect import attention_view, attribution, mean_attention_distance, position_embedding_similarity
from vitlab.inspect.attribution import has_classifier, require_classifier
from vitlab.inspect.capture import capture_attention, check_images, check_input_channels, check_input_size
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["AttentionExplorer", "PositionExplorer", "DistanceExplorer", "METHODS", "HEADS", "UNITS"]

METHODS = ("attention", "rollout", "gradient rollout", "integrated gradients", "occlusion")
HEADS = ("mean", "max", "min")  # fusions; single heads are "head 0", "head 1", ...
#: what each method's map holds, the colour bar's title (a class-specific map is no attention weight)
UNITS = {"attention": "attention weight", "rollout": "rollout weight", "gradient rollout": "relevance",
         "integrated gradients": "attribution (logit)", "occlusion": "logit drop"}


def _ipw():
    import ipywidgets

    return ipywidgets


def _as_input(model: nn.Module, x: Tensor) -> Tensor:
    """``x`` on the model's device and in its floating dtype (the explorers keep their images as float32 on the CPU)."""
    p = next(model.parameters())
    return x.to(p.device, p.dtype if p.is_floating_point() else x.dtype)


def _explorer_images(model: nn.Module, images: object) -> tuple[list[str], Tensor, list[np.ndarray]]:
    """``images`` checked to be ``(names, (B, C, H, W) float batch, shown)`` of one length that ``model`` takes: never
    a bare batch, nor raw uint8 pixels (the explorer casts its batch to float, which would hide them)."""
    if isinstance(images, Tensor) or not (isinstance(images, (tuple, list)) and len(images) == 3):
        raise TypeError(f"images must be (names, (B, C, H, W) batch, shown) as vitlab.data.images.load_images returns, got "
                        f"{'a tensor' if isinstance(images, Tensor) else type(images).__name__}: pass "
                        "load_images(model, folder), or None for the default images")
    names, x, shown = images
    check_images(x)
    check_input_channels(model, x)
    check_input_size(model, tuple(x.shape[-2:]))
    if not len(names) == len(x) == len(shown):
        raise ValueError(f"images has {len(names)} names, {len(x)} images and {len(shown)} shown views: give one of "
                         "each per image")
    return list(names), x, list(shown)


def _check_patch(row: object, col: object, grid: tuple[int, int]) -> tuple[int, int]:
    """(``row``, ``col``) as a patch of the (gh, gw) ``grid``: whole numbers inside it, never a fraction rounded to
    another patch."""
    gh, gw = grid
    if not (whole_index(row) and whole_index(col) and 0 <= row < gh and 0 <= col < gw):
        raise ValueError(f"patch ({row}, {col}) is outside the {gh}x{gw} grid: give a whole row from 0 to {gh - 1} "
                         f"and column from 0 to {gw - 1}")
    return int(row), int(col)


def _drawable(t: Tensor) -> np.ndarray:
    """A result on whatever device and dtype, as the float32 NumPy array a figure draws."""
    return t.detach().float().cpu().numpy()


def _current_figure(explorer) -> go.FigureWidget:
    """An explorer's figure now: ``live.figure`` (a figure whose view stopped applying edits is replaced)."""
    return explorer.live.figure


def _colour_range(z: np.ndarray) -> dict:
    """The explorer map's colour range: plotly's own, except for a constant map (a blank readout before a ConViT's
    class token joins), which plotly centres on its value (an all-zero map's colourbar ran from -0.4 to 0.4, negative
    weights no map has): from 0 (or the value, if negative) to the value (1 for zeros)."""
    lo, hi = float(np.min(z)), float(np.max(z))
    if lo != hi:
        return dict(zauto=True, zmin=None, zmax=None)
    return dict(zauto=False, zmin=min(0.0, lo), zmax=hi if hi > 0 else 1.0)


class AttentionExplorer:
    """Image, layer, head (or fusion), method, discard ratio, query patch and target class -> a heatmap over the image.

    ``images``: ``(names, (B, C, H, W) batch, shown (H, W, 3) uint8 list)`` as ``vitlab.data.images.load_images``
    returns; default: ``vitlab.data.images.default_images`` (the shipped CIFAR-10 test images for 32 px models). Methods:
    raw ``attention`` of the chosen query patch (the readout's row when no patch is chosen: click a patch to choose
    it) and ``rollout`` (``vitlab.inspect.attention_view``), and the class-specific ``gradient rollout``,
    ``integrated gradients`` and ``occlusion`` (``vitlab.inspect.attribution``) for the target class (default: the
    predicted class). This class only wires controls to those functions and draws through ``vitlab.figures.plots``.
    """

    def __init__(self, model: AnyModel, images: tuple[list[str], Tensor, list[np.ndarray]] | None = None,
                 num_images: int = 8, class_names: Sequence[str] | None = None) -> None:
        ipw = _ipw()
        from vitlab.data.images import default_images, head_class_names

        rm = resolve_model(model)  # a compiled or DataParallel model: the module it runs
        model = rm.module
        self.model = model  # its modes are left alone: capture and the methods run in eval mode temporarily
        self.resolved = rm  # what the analyses are handed: the module and its facts, read once
        names, x, shown = _explorer_images(model, images) if images is not None else default_images(model, num_images)
        self.names, self.x, self.shown = list(names), x.detach().float().cpu(), list(shown)  # cast at each use
        self.info = rm.info_for(x)
        n_cls = int(getattr(model, "num_classes", 0) or 0)
        self.has_head = has_classifier(rm)  # without one: attention and rollout only, no predicted class
        if class_names is None and n_cls:
            class_names = head_class_names(rm)  # recorded by the checkpoint, never guessed from the head's size
        elif class_names is not None and len(class_names) != n_cls:  # extra names offered classes the head lacks
            raise ValueError(f"class_names has {len(class_names)} names but the model has {n_cls} classes: give one "
                             "name per class, in the head's order, or None for the checkpoint's own")
        self.class_names = list(class_names) if class_names else [f"class {c}" for c in range(n_cls)]
        self._maps: dict[int, tuple[Tensor, Tensor | None]] = {}  # image -> captured (L, 1, H, T, T), pool maps
        self._class_maps: dict[tuple[int, str, int], Tensor] = {}
        self._probs: dict[int, Tensor] = {}
        self.query: int | None = None  # patch index (row-major) or None for the readout
        self._forced_query: int | None = None  # the query a DistanceExplorer chose for a block without a readout
        L, H = self.info.depth, self.info.num_heads
        self.image = ipw.Dropdown(options=[(n, i) for i, n in enumerate(self.names)], value=0, description="image")
        self.upload = ipw.FileUpload(accept="image/*", multiple=False, description="upload")
        self.layer = ipw.IntSlider(value=L, min=1, max=L, description="layer")
        self.head = ipw.Dropdown(options=list(HEADS) + [f"head {h}" for h in range(H)], value="mean",
                                 description="heads")
        self.method = ipw.Dropdown(options=list(METHODS) if self.has_head else ["attention", "rollout"],
                                   value="attention", description="method")
        self.discard = ipw.FloatSlider(value=0.0, min=0.0, max=0.95, step=0.05, description="discard")
        self.target = ipw.Dropdown(options=[("predicted class", -1)] + [(c, k) for k, c in enumerate(self.class_names)],
                                   value=-1, description="class", disabled=not self.has_head)
        self.status = ipw.HTML()
        z, title = self.current_map(), self._title()  # the first view is computed before the figure exists
        first = heatmap_over_image(self.shown[0], z, title)
        # the browser draws the figure as built: changes made before it is displayed never reach it
        first.data[1].colorbar.title.text = UNITS[self.method.value]
        first.data[1].update(_colour_range(z))
        self.live = LiveFigure(WholeFigureWidget(first), on_new=self._bind_figure)
        self._bind_figure(self.figure)
        for w in (self.image, self.layer, self.head, self.method, self.discard, self.target):
            w.observe(lambda _change: self.update(), names="value")
        self.upload.observe(self._on_upload, names="value")
        self.update()

    figure = property(_current_figure)

    def _bind_figure(self, figure: go.FigureWidget) -> None:
        figure.data[1].on_click(self._on_click)

    # ------------------------------------------------------------------ inputs to the public functions (cached)
    def _run(self, x: Tensor) -> tuple[tuple[Tensor, Tensor | None], Tensor | None]:
        """One image (1, C, H, W): its captured maps (L, 1, H, T, T) and pool maps, and its class probabilities."""
        with torch.no_grad(), capture_attention(self.resolved) as cap:
            out = self.model(_as_input(self.model, x)).float()
        probs = out.softmax(-1)[0].cpu() if self.has_head else None  # a headless model's output is its features
        return (cap.stack().clone(), cap.pool_maps()), probs

    def _captured(self, i: int) -> tuple[Tensor, Tensor | None]:
        if i not in self._maps:
            self._maps[i], probs = self._run(self.x[i:i + 1])
            if probs is not None:
                self._probs[i] = probs
        return self._maps[i]

    def prediction(self, i: int | None = None) -> tuple[int, float]:
        """(class, probability) the model predicts for image ``i`` (default: the one shown)."""
        i = self.image.value if i is None else i
        require_classifier(self.resolved, "a predicted class")
        self._captured(i)
        p = self._probs[i]
        return int(p.argmax()), float(p.max())

    def target_class(self) -> int:
        return self.prediction()[0] if self.target.value == -1 else int(self.target.value)

    def current_map(self) -> np.ndarray:
        """(gh, gw) the map the controls select."""
        i, method = self.image.value, self.method.value
        if method in ("attention", "rollout"):
            maps, pool = self._captured(i)
            head = self.head.value if self.head.value in HEADS else int(self.head.value.split()[1])
            return _drawable(attention_view(maps, self.info, method, self.layer.value, head, self.query,
                                            self.discard.value, pool)[0])
        key = (i, method, self.target_class())
        if key not in self._class_maps:
            self._class_maps[key] = attribution(method, self.resolved, _as_input(self.model, self.x[i:i + 1]),
                                                key[2])[0].detach().cpu()
        return _drawable(self._class_maps[key])

    def _class_label(self, c: int) -> str:
        return self.class_names[c] if 0 <= c < len(self.class_names) else f"class {c}"

    def _title(self) -> str:
        i, method = self.image.value, self.method.value
        if method in ("attention", "rollout"):
            q = "readout" if self.query is None else f"patch {divmod(self.query, self.info.grid_size[1])}"
            if self.query is None and self.info.readout == "token" and self.layer.value <= self.info.class_token_joins:
                # a ConViT's class token joins after these layers: its row holds no patch, the map is blank
                q += f" (blank: the class token joins at layer {self.info.class_token_joins + 1})"
            elif self.query is not None and self.query == self._forced_query:
                # a distance-plot dot chose it for a block without a readout: said, not silently swapped in
                q = f"centre {q} (the class token joins at layer {self.info.class_token_joins + 1})"
            upto = "layers 1-" if method == "rollout" else "layer "
            discard = f", discard {self.discard.value:.2f}" if method == "rollout" and self.discard.value else ""
            # two lines: on one, a rollout's title with its discard ratio ran past the figure's edge
            heads = self.head.value if self.head.value.startswith("head ") else f"heads {self.head.value}"  # not "heads head 2"
            return f"{html.escape(self.names[i])}: {method}, {upto}{self.layer.value}, {heads}{discard},<br>query {q}"
        c = self.target_class()
        p = float(self._probs[i][c]) if i in self._probs and c < len(self._probs[i]) else float("nan")
        return f"{html.escape(self.names[i])}: {method} for {html.escape(self._class_label(c))} (p = {p:.2f})"

    # ------------------------------------------------------------------ events
    def update(self) -> None:
        i = self.image.value
        z = self.current_map()
        self._enable_controls()
        with self.figure.batch_update():
            self.figure.data[0].z = self.shown[i]
            self.figure.data[1].z = z
            self.figure.data[1].update(_colour_range(z))
            self.figure.layout.title.text = self._title()  # its font stays the first view's
            self.figure.data[1].colorbar.title.text = UNITS[self.method.value]
        stats = f"map max {float(np.max(z)):.4f}, sum {float(np.sum(z)):.4f}"
        if not self.has_head:
            self.status.value = f"no classifier head (the model outputs features): no predicted class; {stats}"
            return
        c, p = self.prediction(i)
        self.status.value = f"predicted <b>{html.escape(self._class_label(c))}</b> ({probability_words(p)}); {stats}"

    def _enable_controls(self) -> None:
        """Grey out the controls the chosen method does not read: layer and heads for the class-specific maps, the
        discard ratio for all but rollout, the class for attention and rollout (and without a classifier head)."""
        attention = self.method.value in ("attention", "rollout")
        self.layer.disabled = self.head.disabled = not attention
        self.discard.disabled = self.method.value != "rollout"
        self.target.disabled = attention or not self.has_head

    def _on_click(self, trace, points, _state) -> None:
        if points.point_inds:
            r, c = points.point_inds[0]
            self.select_patch(int(r), int(c))

    def select_patch(self, row: int | None, col: int | None = None) -> None:
        """Choose the query patch at (``row``, ``col``), or the readout with ``row=None`` (and no ``col``), and redraw."""
        gh, gw = self.info.grid_size
        if row is None:
            if col is not None:
                raise ValueError(f"select_patch(None, {col}): a patch needs its row too; select_patch(None) chooses the "
                                 "readout")
            self.query = None
        else:
            if col is None:
                raise ValueError(f"select_patch({row}) needs a column too: select_patch(row, col) with row in [0, {gh}) "
                                 f"and col in [0, {gw}), or select_patch(None) for the readout")
            row, col = _check_patch(row, col, (gh, gw))
            self.query = row * gw + col
        self._forced_query = None  # the user's choice: a DistanceExplorer leaves it be
        self.update()

    def add_image(self, name: str, data: bytes) -> None:
        """Add an uploaded image (encoded bytes), preprocessed as the model expects, and show it."""
        from PIL import Image

        from vitlab.data.datasets import DECODE_ERRORS, decode_error_words, rgb8
        from vitlab.data.images import model_transform, too_small, view_transform

        try:
            with Image.open(io.BytesIO(data)) as im:
                im = rgb8(im)  # 16-bit and float greyscale scaled, not clipped at 255
                tf, cfg = model_transform(self.model)
                x = tf(im)[None].float()
                shown = view_transform(tf, cfg["input_size"][-2:])(im)  # the pixels the model sees
        except DECODE_ERRORS as e:
            self.status.value = f"<b>could not read {html.escape(name)}</b>: {html.escape(decode_error_words(e))}"
            return
        if (small := too_small(self.model, im)) is not None:  # as vitlab capture/reproduce --images refuse it
            self.status.value = f"<b>could not use {html.escape(name)}</b>: {html.escape(small)}"
            return
        try:  # the model runs on it before anything changes: a failure leaves the explorer as it was
            maps, probs = self._run(x)
        except Exception as e:  # noqa: BLE001 - shown to the user, the explorer stays usable
            self.status.value = (f"<b>could not run the model on {html.escape(name)}</b>: "
                                 f"{html.escape(f'{type(e).__name__}: {e}')}")
            return
        i = len(self.names)
        self._maps[i] = maps
        if probs is not None:
            self._probs[i] = probs
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
        controls = ipw.VBox([self.image, self.upload, self.method, self.layer, self.head, self.discard, self.target,
                             self.status])
        return ipw.HBox([controls, self.live.box])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())


class PositionExplorer:
    """Click a patch: the cosine similarity of its position embedding with every other patch's."""

    def __init__(self, model: AnyModel, grid: tuple[int, int] | None = None) -> None:
        self.sim = position_embedding_similarity(model, grid=grid).detach().float().cpu()  # (gh, gw, gh, gw)
        gh, gw = self.sim.shape[:2]
        self.patch = (gh // 2, gw // 2)
        self.live = LiveFigure(WholeFigureWidget(
            data=[go.Heatmap(z=self.sim[self.patch].numpy(), zmin=-1, zmax=1, colorscale="Viridis",
                             colorbar=dict(title="cosine"),
                             hovertemplate="row %{y}, col %{x}: %{z:.3f}<extra></extra>")],
            layout=go.Layout(width=460, height=460, margin=dict(l=60, r=10, t=50, b=50), title=self._title(),
                             xaxis=dict(title="patch column", range=[-0.5, gw - 0.5], dtick=1, constrain="domain"),
                             yaxis=dict(title="patch row", range=[gh - 0.5, -0.5], dtick=1, scaleanchor="x",
                                        constrain="domain"))), on_new=self._bind_figure)
        self._bind_figure(self.figure)
        self.select(*self.patch)

    figure = property(_current_figure)

    def _bind_figure(self, figure: go.FigureWidget) -> None:
        figure.data[0].on_click(lambda _t, pts, _s: pts.point_inds and self.select(*pts.point_inds[0]))

    def select(self, row: int, col: int) -> None:
        self.patch = _check_patch(row, col, tuple(self.sim.shape[:2]))
        with self.figure.batch_update():
            self.figure.data[0].z = self.sim[self.patch].numpy()
            self.figure.layout.title = self._title()

    def _title(self) -> str:
        return f"Position-embedding similarity to patch {self.patch} (click a patch)"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.live.box)


def _gpsa_note(info) -> str:
    """A title's second line naming a ConViT's gated positional self-attention layers; "" for other models."""
    words = gpsa_words(info)
    return f"<br><sup>{words}</sup>" if words else ""


#: the marker of each head's dots once their colour shows importance (the legend's only way to tell heads apart)
HEAD_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "cross", "x", "pentagon", "hexagon",
                "star", "triangle-left", "triangle-right")


class DistanceExplorer:
    """Mean attention distance per head against depth; hover a dot for its layer and head, click it to open that
    head in a linked ``AttentionExplorer`` and to see its ablation effect.

    Head importance (``vitlab.head_importance``, mean ablation, on the same images) is computed once, when first
    asked for (the "head importance" button, or the first click on a dot), with a progress bar; the dots are then
    coloured by it (the drop in log p of the target class, nats; symbols tell the heads apart). Targets: ``labels``
    ((B,) classes of the model's head), by default the images' true classes where they are classes of the model's
    head (``vitlab.data.images.head_labels``, for the default images), else the model's own predictions."""

    def __init__(self, model: AnyModel, images: Tensor | None = None, explorer: AttentionExplorer | None = None,
                 num_images: int = 16, labels: Tensor | None = None) -> None:
        from vitlab.data.images import default_images, head_labels

        ipw = _ipw()
        rm = resolve_model(model)
        model = rm.module
        if images is None:
            images = default_images(model, num_images)[1]
            labels = head_labels(model, len(images)) if labels is None else labels
        elif not isinstance(images, Tensor):
            raise TypeError(f"images must be a (B, C, H, W) batch, got {type(images).__name__}: pass the batch alone "
                            "(load_images(model, folder)[1])")
        check_images(images)  # before the cast to the model's dtype: raw uint8 pixels are no input
        if explorer is not None and explorer.model is not model:  # its sliders would clamp this model's layer
            raise ValueError(f"explorer shows another model ({type(explorer.model).__name__}) than this one "
                             f"({type(model).__name__}): link the AttentionExplorer of the same model")
        self.distance = mean_attention_distance(rm, _as_input(model, images),
                                                progress=False).detach().float().cpu()  # (L, H) pixels
        self.explorer = explorer
        self.model, self.images, self.labels = model, images, labels
        self.resolved = rm
        self.head_importance = None  # vitlab.inspect.heads.HeadImportance once computed
        self.button = ipw.Button(description="head importance", layout=ipw.Layout(width="auto"), tooltip="ablate each head in turn (mean ablation) "
                                 "on these images and colour the dots by the drop in log p of the target class")
        self.button.on_click(lambda _b: self.importance())
        self.button.disabled = not has_classifier(rm)  # nothing to ablate towards without class scores
        # head_importance's progress, one step per ablated run (an Output widget holding tqdm's bar stopped the
        # page's figures from updating under Voila)
        self.progress = ipw.IntProgress(value=0, min=0, max=1, description="", layout=ipw.Layout(width="200px"))
        self.status = ipw.HTML("click a dot: its attention maps and its ablation effect")
        built = layer_lines(  # one trace (and colour, and legend entry) per head
            self.distance.numpy(), "mean attention distance (pixels)",
            f"Mean attention distance per head ({len(images)} images); click a dot{_gpsa_note(rm.info())}")
        # sized before it becomes a widget: the page draws the figure as built, later edits before it shows are lost
        built.update_layout(width=600, height=440, legend=dict(orientation="h", y=-0.2),
                            margin=dict(l=60, r=10, t=50, b=80))
        built.update_traces(marker_size=8, selector=dict(mode="markers"))  # dots big enough to click
        figure = WholeFigureWidget(built)
        self.live = LiveFigure(figure, on_new=self._bind_figure)
        self._bind_figure(figure)

    figure = property(_current_figure)

    def _bind_figure(self, figure: go.FigureWidget) -> None:
        H = self.distance.shape[1]
        for h in range(H):  # dot i of head h's trace is layer i + 1
            figure.data[h].on_click(lambda _t, pts, _s, h=h: pts.point_inds and self.open(pts.point_inds[0] * H + h))

    def open(self, point: int) -> tuple[int, int]:
        """The (layer, head) of dot ``point`` (1-based layer); shown in the linked explorer when there is one (for a
        ConViT block its class token has not joined, with the centre patch as the query when the readout was, and
        the readout again at the next block that has one; a patch the user chose stays)."""
        L, H = self.distance.shape
        if not whole_index(point) or not 0 <= point < L * H:
            raise ValueError(f"dot {point} does not exist: the {L} layers x {H} heads are dots 0 to {L * H - 1}")
        layer, head = point // H + 1, point % H
        self.status.value = (self.head_words(layer - 1, head, self.importance()) if has_classifier(self.resolved) else
                             f"<b>layer {layer}, head {head}</b>: mean attention distance "
                             f"{float(self.distance[layer - 1, head]):.1f} px; no classifier head (the model outputs "
                             "features): no class whose probability an ablation could lower")
        if self.explorer is not None:
            ex = self.explorer
            query, shown = ex.query, (ex.method.value, ex.head.value, ex.layer.value)
            ex.query = self._query(layer)
            ex.method.value = "attention"
            ex.head.value = f"head {head}"
            ex.layer.value = layer
            if ex.query != query and shown == (ex.method.value, ex.head.value, ex.layer.value):
                ex.update()  # only the query changed: no control's observer redraws
        return layer, head

    def importance(self):
        """The (L, H) head atlas of these images under mean ablation (``HeadImportance``), computed on the first call
        with its progress shown in ``progress``, then the dots recoloured by its ``logprob_drop``; later calls return
        it at once."""
        if self.head_importance is not None:
            return self.head_importance
        from vitlab.inspect.heads import head_importance

        require_classifier(self.resolved, "head importance (the drop in a class's log-probability)")

        x = _as_input(self.model, self.images)
        self.button.disabled, self.button.description = True, "computing head importance"
        try:
            y = self.labels
            if y is None:
                with torch.no_grad():
                    y = self.model(x).argmax(-1)
            res = head_importance(self.resolved, x, y.to(x.device), progress=False, on_progress=self._step)
        finally:
            self.button.disabled, self.button.description = False, "head importance"
        if tuple(res.logprob_drop.shape) != tuple(self.distance.shape):  # e.g. two parallel attentions per block
            raise ValueError(f"the {tuple(res.logprob_drop.shape)} ablated heads are not the "
                             f"{tuple(self.distance.shape)} dots of this plot")
        self.head_importance = res
        self.button.disabled, self.button.description = True, "head importance shown"
        self._colour(res.logprob_drop.float().numpy())
        return res

    def _step(self, done: int, total: int) -> None:
        """``head_importance``'s progress: ``done`` of ``total`` ablated runs."""
        self.progress.max, self.progress.value = total, done
        self.progress.description = f"{done}/{total}"

    def _colour(self, drop: np.ndarray) -> None:
        """Colour every head's dots by ``drop`` (L, H) on one diverging scale centred at 0, symbols per head."""
        top = float(np.nanmax(np.abs(drop))) or 1.0
        target = "true class" if self.labels is not None else "predicted class"
        with self.figure.batch_update():
            for h in range(drop.shape[1]):
                self.figure.data[h].marker = dict(
                    color=drop[:, h], colorscale="RdBu_r", cmin=-top, cmax=top, size=10,
                    symbol=HEAD_SYMBOLS[h % len(HEAD_SYMBOLS)], line=dict(width=1, color="black"), showscale=h == 0,
                    colorbar=dict(title=f"drop in<br>log p({target})<br>(nats)", x=1.02, len=0.7))
                self.figure.data[h].customdata = drop[:, h]
                self.figure.data[h].hovertemplate = (f"layer %{{x}}, head {h}: %{{y:.2f}} px, importance "
                                                     "%{customdata:.3g} nats<extra></extra>")
            self.figure.layout.legend = dict(orientation="h", y=-0.2)  # the colour bar takes the right side
            self.figure.layout.title = (f"Mean attention distance per head ({len(self.images)} images); colour: "
                                        f"importance (mean ablation); click a dot")

    def head_words(self, layer: int, head: int, res) -> str:
        """One head's distance and ablation effect (``res``: a ``HeadImportance``) as the status line's HTML;
        ``layer`` 0-based."""
        lo, hi = res.logprob_interval[layer, head].tolist()
        iv = f" [{lo:.3g}, {hi:.3g}]" if lo == lo else " (no interval)"
        target = "true class" if self.labels is not None else "predicted class"
        return (f"<b>layer {layer + 1}, head {head}</b>: mean attention distance {float(self.distance[layer, head]):.1f}"
                f" px; mean ablation lowers log p({target}) by {float(res.logprob_drop[layer, head]):.3g} nats{iv} "
                f"and accuracy by {float(res.accuracy_drop[layer, head]):.3g} over {len(self.images)} images")

    def widget(self):
        ipw = _ipw()
        return ipw.VBox([ipw.HBox([self.button, self.progress]), self.status, self.live.box])

    def _query(self, layer: int) -> int | None:
        """The linked explorer's query for ``layer`` (1-based): the centre patch in place of a ConViT's readout
        before its class token joins (its row is empty, a patch's is not), remembered as this explorer's choice so
        that a later block with a readout gets it back; the user's own query unchanged."""
        ex = self.explorer
        info, query = ex.info, ex.query
        if query is not None and query != ex._forced_query:  # chosen by the user (or set by hand)
            ex._forced_query = None
            return query
        if info.readout == "token" and layer <= info.class_token_joins:
            gh, gw = info.grid_size
            ex._forced_query = query if query is not None else (gh // 2) * gw + gw // 2
            return ex._forced_query
        ex._forced_query = None
        return None

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())


def explorers(model: nn.Module, images: tuple[list[str], Tensor, list[np.ndarray]] | None = None,
              num_images: int = 8) -> Sequence[object]:
    """The three explorers, the distance explorer linked to the attention explorer; the position explorer is None
    for a model without a position embedding (e.g. ``pos_embed="none"``): there is nothing for it to show."""
    from vitlab.data.images import head_labels

    att = AttentionExplorer(model, images, num_images)
    positions = PositionExplorer(model) if att.info.pos_embed != "none" else None
    labels = head_labels(att.model, len(att.x)) if images is None else None  # the default images' true classes
    return att, positions, DistanceExplorer(model, att.x, att, labels=labels)
