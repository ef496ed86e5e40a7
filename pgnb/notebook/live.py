"""The live area under a running ``%%pg`` cell.

``LiveView`` draws a box of ipywidgets: a title line, then a grid of a lane per rank with
what the rank printed so far (``\\r`` redraws its line, so a progress bar is
one updating line) and its state (running with elapsed time, waiting in a
collective, finished, failed, lost). Each lane's state line, text and displays
are widgets of their own, so an update sends only the parts that changed: a
rank's elapsed time, not every rank's text again.

Nothing is drawn until there is something to see: the box appears at the first
live update, which ``pgnb.core.live.LiveCell`` sends once the cell has run a
tenth of a second. A cell that ends before that (most quick cells) displays
nothing and opens no comm. Either way the notebook keeps the same output, the
grouped output: the view's bundle is the widget alone, which nbval skips (its
model id differs on every run), and its updates are widget state changes,
which nbval ignores too. A notebook saved with its widget state shows the
collapsed view; without it, nothing but the grouped output. When the cell ends
the box collapses to its title, a one-line summary. (A terminal IPython gets
``pgnb.core.terminal.TerminalSink`` instead.)
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import Any, Literal

import ipywidgets as W
from IPython.display import display
from ipywidgets.widgets.widget_string import HTMLStyle

from ..core.live import UPDATES_PER_SECOND, LiveState, OutputEvent, RankProgress
from ..core.results import CellResult
from ..core.terminal import Lane
from ..core.text import ranks_text

#: Lines of a lane drawn in the view (the lane keeps more; the notebook keeps everything) ...
SHOWN_LINES = 40
#: ... and, over all lanes, about this many: 64 lanes draw their last 4 lines, not 40 each.
SHOWN_IN_ALL = 256
#: At most this many lane parts (a state line, a text) are sent per second: a world of 64 ranks that
#: all print is drawn 2.5 times a second, not 10 (128 comm messages an update, each up to a few KB).
PARTS_PER_SECOND = 320
STATE_COLOURS: dict[LiveState, str] = {
    "running": "#1565c0",
    "finished": "#2e7d32",
    "failed": "#c62828",
    "lost": "#6a1b9a",
}
_PRE = ("margin:0;padding:2px 6px;max-height:14em;overflow:auto;white-space:pre-wrap;"
        "font-family:var(--jp-code-font-family,monospace);font-size:12px;background:var(--jp-layout-color2,#f5f5f5)")


#: The layouts and the style every live view shares (one comm each per kernel, not per cell):
#: the view and its title, the grid of lanes, a lane's box, a part of a lane, the HTML widgets' style.
Shared = Literal["plain", "grid", "grid-compact", "lane", "part", "style"]
_SHARED: dict[Shared, W.Widget] = {}


def shown_lines(world: int) -> int:
    """How many of its last lines each lane draws in a view of ``world`` lanes."""
    return max(4, min(SHOWN_LINES, SHOWN_IN_ALL // max(1, world)))


def draw_every(world: int) -> float:
    """Seconds between two drawings of a view of ``world`` lanes (LiveCell's updates come more often)."""
    return max(1.0 / UPDATES_PER_SECOND, 2 * world / PARTS_PER_SECOND)


def _make(kind: Shared) -> W.Widget:
    if kind == "grid":
        return W.Layout(grid_template_columns="repeat(auto-fill,minmax(22em,1fr))")
    if kind == "grid-compact":  # many lanes: narrower, so a screen holds more of them
        return W.Layout(grid_template_columns="repeat(auto-fill,minmax(15em,1fr))")
    if kind == "plain":
        return W.Layout()
    if kind == "lane":
        return W.Layout(border="1px solid #ddd", margin="2px", min_width="16em")
    if kind == "part":
        return W.Layout(margin="0")
    return HTMLStyle()


def _shared(kind: Shared) -> W.Widget:
    """The one widget of this kind every live view uses, made on first use."""
    widget = _SHARED.get(kind)
    if widget is None or widget.comm is None:  # closed meanwhile (a kernel's widgets were reset)
        widget = _SHARED[kind] = _make(kind)
    return widget


def _html(value: str, kind: Shared, *classes: str) -> W.HTML:
    # classes given at creation travel in the comm's open message (add_class would send one more)
    return W.HTML(value, layout=_shared(kind), style=_shared("style"), _dom_classes=classes)


def _set(widget: W.HTML, value: str) -> None:
    if widget.value != value:  # an unchanged part sends nothing
        widget.value = value


class _RankLane:
    """One rank's lane: what it printed and displayed, and its widgets once drawn (a box of parts)."""

    def __init__(self, rank: int, shown_lines: int = SHOWN_LINES) -> None:
        self.rank = rank
        self.shown_lines = shown_lines
        self.lane = Lane()
        self.displays: list[str] = []
        self.box: W.VBox | None = None  # the widgets, once drawn: the box of the parts below
        self.state: W.HTML | None = None
        self.text: W.HTML | None = None
        self.shown: W.HTML | None = None  # the displays, once there are any

    def feed(self, event: OutputEvent) -> None:
        if event.stream == "display":
            self.displays.append(_display_html(event.data))
        else:
            self.lane.feed(event.data, event.stream)

    def parts(self) -> list[W.Widget]:
        return [w for w in (self.box, self.state, self.text, self.shown) if w is not None]

    def draw(self, progress: RankProgress | None) -> W.VBox:
        """The lane's box, made on first use, its parts brought up to date (an unchanged part sends nothing)."""
        if self.box is None or self.state is None or self.text is None:
            self.state = _html(self._state_html(progress), "part", "pgnb-lane-state")
            self.text = _html(self._text_html(), "part")
            self.box = W.VBox([self.state, self.text], layout=_shared("lane"),
                              _dom_classes=("pgnb-lane", f"pgnb-lane-{self.rank}"))
        elif progress is not None:  # none: the state line stays as it was
            _set(self.state, self._state_html(progress))
        _set(self.text, self._text_html())
        if self.displays:
            shown = "".join(self.displays)
            if self.shown is None:
                self.shown = _html(shown, "part")
                self.box.children = (*self.box.children, self.shown)
            _set(self.shown, shown)
        return self.box

    def close(self) -> None:
        for w in self.parts():
            w.close()

    def _state_html(self, progress: RankProgress | None) -> str:
        state = "" if progress is None else (  # whole seconds: a lane's clock sends once a second
            f"<span class='pgnb-lane-{progress.state}' style='color:{STATE_COLOURS[progress.state]}'>"
            f"{html.escape(progress.text(whole=True))}</span>")
        return f"<b>rank {self.rank}</b> &middot; {state}"

    def _text_html(self) -> str:
        open_lines = self.lane.current
        lines = list(self.lane.lines)[-self.shown_lines:] + open_lines
        more = len(self.lane.lines) + self.lane.dropped - (len(lines) - len(open_lines))
        body = (f"<span style='opacity:.6'>… {more} earlier lines</span>\n" if more > 0 else "") + html.escape(
            "\n".join(lines))
        return f"<pre class='pgnb-lane-text' data-rank='{self.rank}' style='{_PRE}'>{body}</pre>" if body else ""


def _display_html(bundle: dict[str, Any]) -> str:
    """A rank's display as it shows in its lane: a picture, its HTML, or its text."""
    if "image/png" in bundle:
        return f"<img style='max-width:100%' src='data:image/png;base64,{bundle['image/png']}'>"
    if "text/html" in bundle:
        return f"<div>{bundle['text/html']}</div>"
    return f"<pre style='{_PRE}'>{html.escape(str(bundle.get('text/plain', '')))}</pre>"


def _widget_only(widget: W.Widget) -> dict[str, Any]:
    """What displays ``widget`` without a text form: no ``text/plain`` that a notebook would keep, so a
    cell's recorded outputs are the same whether its view was drawn or the cell ended first."""
    return {k: v for k, v in (widget._repr_mimebundle_() or {}).items() if k != "text/plain"}


class LiveView:
    """Every rank of a running cell, as it runs: a ``LiveSink`` that shows itself (``show``, IPython's
    ``display`` by default) at its first update, as a title and then a grid of a lane per rank."""

    def __init__(self, ranks: list[int], label: str = "%%pg", show: Callable[..., Any] = display) -> None:
        self._ranks = list(ranks)
        self._label = label
        self._show = show
        self._started = time.monotonic()
        self._lanes = {r: _RankLane(r, shown_lines(len(self._ranks))) for r in self._ranks}
        self._every = draw_every(len(self._ranks))
        self._drawn_at = 0.0
        self.box: W.VBox | None = None  # the widgets, once drawn: the title, then the grid
        self._title: W.HTML | None = None
        self._grid: W.GridBox | None = None

    def _title_html(self, phase: str, detail: str) -> str:
        return (f"<div class='pgnb-live-title' style='font-family:var(--jp-ui-font-family,sans-serif)'><b>pgnb</b> "
                f"{html.escape(self._label)} &middot; {html.escape(ranks_text(self._ranks))} &middot; "
                f"<span class='pgnb-live-phase'>{html.escape(phase)}</span>{html.escape(detail)}</div>")

    # ---- a LiveSink ------------------------------------------------------------
    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        for e in events:
            if e.rank in self._lanes:
                self._lanes[e.rank].feed(e)
        running = sum(p.state == "running" for p in ranks)
        if not running:
            return  # the cell has ended: finish() draws the last picture, once
        now = time.monotonic()
        if self._grid is not None and now - self._drawn_at < self._every:
            return  # what arrived is kept in the lanes; the next drawing shows it
        self._drawn_at = now
        progress = {p.rank: p for p in ranks}
        title = self._title_html("running", f" · {time.monotonic() - self._started:.1f} s · {running} running")
        # each part that changed sends one message, a part that did not sends nothing; no widget changes
        # twice in an update, so there is nothing for hold_sync to merge (and holding every part would cost
        # more than the update: ipywidgets reads each held widget's whole state when the hold ends)
        if self._title is None:
            self._title = _html(title, "plain")
        else:
            _set(self._title, title)
        boxes = [lane.draw(progress.get(r)) for r, lane in self._lanes.items()]
        if self._grid is None:  # the first update draws the whole view, once
            grid: Shared = "grid" if len(self._ranks) <= 16 else "grid-compact"
            self._grid = W.GridBox(boxes, layout=_shared(grid), _dom_classes=("pgnb-lanes",))
            self.box = W.VBox([self._title, self._grid], layout=_shared("plain"), _dom_classes=("pgnb-live",))
            self._show(_widget_only(self.box), raw=True)

    def finish(self, result: CellResult | None) -> None:
        """Collapse to one line: how the cell ended on each rank (the grouped output below has the rest).
        A view never drawn stays undrawn."""
        if self.box is None or self._title is None or self._grid is None:
            self._lanes.clear()
            return
        summary = _summary(result) if result is not None else "stopped"
        _set(self._title, self._title_html(summary, f" · {time.monotonic() - self._started:.1f} s"))
        self.box.children = [self._title]
        self._grid.close()
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()

    def __repr__(self) -> str:
        return f"pgnb: live output of {ranks_text(self._ranks)}"


def _summary(result: CellResult) -> str:
    by_state: dict[str, list[int]] = {}
    for r in result.ranks:
        state = r.state if r.state != "failed" or not r.ename else f"failed ({r.ename})"
        by_state.setdefault(state, []).append(r.rank)
    return "; ".join(f"{ranks_text(rs)} {state}" for state, rs in by_state.items())
