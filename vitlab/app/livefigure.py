"""A plotly ``FigureWidget`` kept live in the page: a figure whose view stopped applying the kernel's edits is
replaced by a fresh one that shows the current data.

Why: plotly's ``FigureWidget`` runs on anywidget, which gives each widget model 2 s from its creation in the page to
load its JavaScript module; when the module (plotly's, several megabytes, loaded once per figure) takes longer, as
on a busy machine, anywidget rejects the model's ``ready`` promise and from then on silently drops every message
the kernel sends to that model (``AnyModel._handle_comm_msg`` awaits ``ready``). The figure still draws its first
view (from the state the model was created with) and its view still sends messages, but it never applies an edit:
a frozen figure, until the page is reloaded. Only a new model, i.e. a new widget, recovers.

The kernel can tell: each edit plotly sends in an update message (``batch_update`` and kin) raises the figure's
``_last_trace_edit_id``, and a view answers with the id it applied (``_js2py_traceDeltas``), as it does with the id
it drew when it renders. ``LiveFigure`` holds the figure in ``box`` (display the box, not the figure) and, when an
edit goes unanswered for ``timeout`` seconds while the figure is shown in a view that answered before (and still
does not answer at a second look ``CONFIRM`` seconds later, so that answers which queued while the kernel was busy
are read first), puts a new ``WholeFigureWidget`` with the same data and layout in the box (``on_new`` attaches its
callbacks) and closes the old one. The new figure's model gets the data and layout with its creation, so even a page
that gives up on it shows the current figure; its next edit is checked in turn.
(A layout-only edit made outside ``batch_update`` cannot be checked: plotly's view answers it under a name plotly's
Python side never reads, ``_js2py_widget_layoutDelta``.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import plotly.graph_objects as go

from vitlab.base.errors import ParameterError

__all__ = ["LiveFigure", "WholeFigureWidget", "ANSWER_TIMEOUT", "CONFIRM"]

#: seconds a shown figure's view may take to answer an edit before the figure is replaced
ANSWER_TIMEOUT = 5.0
#: seconds between finding an edit overdue and replacing the figure if it still is
CONFIRM = 1.0


class WholeFigureWidget(go.FigureWidget):
    """A ``FigureWidget`` whose model the page creates with the figure's data and layout. plotly's own opens its comm
    (the page creates the model from the state sent with it) before it sets ``_widget_data`` and ``_widget_layout``,
    which then follow as edits: a model the page gave up on drops them and draws an empty plot."""

    def __init__(self, *args, **kwargs) -> None:
        self._built = False
        super().__init__(*args, **kwargs)
        self._built = True
        self.open()

    def open(self) -> None:
        """Open the comm once the figure is built (ipywidgets calls this from its constructor: too early here)."""
        if self._built:
            super().open()


class LiveFigure:
    """``figure`` (a ``FigureWidget``) in ``box`` (an ``ipywidgets.Box``), replaced by a copy when its view misses an
    edit (see the module's docstring). ``on_new(figure)`` is called with each replacement (click callbacks live on
    the old figure's traces). ``timeout``: seconds, > 0. ``clock``: monotonic seconds (the tests pass their own).
    Checks run by themselves on the kernel's event loop; without a running loop call ``check`` by hand.
    ``rebuilds`` counts the replacements."""

    def __init__(self, figure: go.FigureWidget, on_new: Callable[[go.FigureWidget], None] | None = None,
                 timeout: float = ANSWER_TIMEOUT, clock: Callable[[], float] = time.monotonic) -> None:
        import ipywidgets

        if not isinstance(figure, go.FigureWidget):
            raise TypeError(f"figure must be a plotly FigureWidget, got {type(figure).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ParameterError("timeout", timeout, "a positive number of seconds")
        self.timeout, self.clock, self.on_new = float(timeout), clock, on_new
        self.rebuilds = 0
        self.figure = figure
        self.box = ipywidgets.Box([figure])
        self._watch(figure)

    def _watch(self, figure: go.FigureWidget) -> None:
        self._answered: int | None = None  # the highest edit id a view answered; None: no view answered yet
        self._sent_at: float | None = None  # when the latest edit was sent (``clock``)
        self._doubted: int | None = None  # the edit found overdue once, replaced if still unanswered at the next check
        figure.observe(self._on_answer, names="_js2py_traceDeltas")
        figure.observe(self._on_edit, names="_last_trace_edit_id")

    def _on_answer(self, change) -> None:
        message = change["new"]
        edit = message.get("trace_edit_id") if isinstance(message, dict) else None
        if isinstance(edit, int):
            self._answered = edit if self._answered is None else max(self._answered, edit)

    def _on_edit(self, _change) -> None:
        self._sent_at = self.clock()
        self._schedule(self.timeout)

    def _schedule(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a script, the tests): ``check`` by hand
            return
        loop.call_later(delay, self.check)

    def unanswered(self) -> float | None:
        """Seconds since the figure's latest edit went out unanswered by a view that answered before and is shown;
        None when there is nothing to wait for (answered, never shown, or no view shown now)."""
        fig = self.figure
        views = fig._view_count
        if (self._answered is None or self._answered >= fig._last_trace_edit_id or self._sent_at is None
                or not (isinstance(views, int) and views > 0)):
            return None
        return self.clock() - self._sent_at

    def check(self) -> bool:
        """Replace the figure if its latest edit went unanswered ``timeout`` seconds (``unanswered``) at this check and
        at the one before (due ``CONFIRM`` seconds after the edit was first found overdue); whether it did. An edit not
        yet overdue is checked again when it will be."""
        waited = self.unanswered()
        if waited is None:
            return False
        if waited < self.timeout:
            self._schedule(self.timeout - waited)
            return False
        edit = self.figure._last_trace_edit_id
        if self._doubted != edit:  # answers that queued while the kernel was busy are read before the next check
            self._doubted = edit
            self._schedule(CONFIRM)
            return False
        self.rebuild()
        return True

    def rebuild(self) -> go.FigureWidget:
        """Put a new ``FigureWidget`` with the figure's data and layout (as the kernel holds them) in ``box``, close the
        old one, and return the new one (also ``figure``)."""
        old = self.figure
        old.unobserve(self._on_answer, names="_js2py_traceDeltas")
        old.unobserve(self._on_edit, names="_last_trace_edit_id")
        new = WholeFigureWidget(old)
        self.figure = new
        self.rebuilds += 1
        self._watch(new)
        if self.on_new is not None:
            self.on_new(new)
        self.box.children = (new,)
        old.close()
        return new
