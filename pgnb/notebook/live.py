"""The live area under a running ``%%pg`` cell.

``LiveView`` is one ipywidgets HTML widget: a lane per rank with what the rank
printed so far (``\\r`` redraws its line, so a progress bar is one updating
line) and its state (running with elapsed time, waiting in a collective,
finished, failed, lost). Updates are widget state changes, which nbval
ignores; the view's ``text/plain`` is one line fixed when it is displayed,
the same on every run and in a saved notebook. When the cell ends the view
collapses to a one-line summary, and the grouped output below it is what the
notebook keeps. (A terminal IPython gets ``pgnb.core.terminal.TerminalSink``
instead.)
"""

from __future__ import annotations

import html
import time
from typing import Any

import ipywidgets as W
from ipywidgets.widgets.widget_string import HTMLStyle

from ..core.live import OutputEvent, RankProgress
from ..core.results import CellResult
from ..core.terminal import Lane
from ..core.text import ranks_text

#: Lines of a lane drawn in the view (the lane keeps more; the notebook keeps everything).
SHOWN_LINES = 40
STATE_COLOURS = {"running": "#1565c0", "finished": "#2e7d32", "failed": "#c62828", "lost": "#6a1b9a"}
_PRE = ("margin:0;padding:2px 6px;max-height:14em;overflow:auto;white-space:pre-wrap;"
        "font-family:var(--jp-code-font-family,monospace);font-size:12px;background:var(--jp-layout-color2,#f5f5f5)")


def live_text(ranks: list[int]) -> str:
    """The view's text form: fixed when displayed, the same on every run (nbval compares it)."""
    return f"pgnb: live output of {ranks_text(ranks)} while the cell ran (the grouped output follows)"


class _RankLane:
    """One rank's lane: its state line, its last lines of text, the displays it made."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.lane = Lane()
        self.state = ""
        self.displays: list[str] = []

    def feed(self, event: OutputEvent) -> None:
        if event.stream == "display":
            self.displays.append(_display_html(event.data))
        else:
            self.lane.feed(event.data, event.stream)

    def html(self, progress: RankProgress | None) -> str:
        if progress is not None:
            colour = STATE_COLOURS.get(progress.state, "#000")
            self.state = (f"<span class='pgnb-lane-{progress.state}' style='color:{colour}'>"
                          f"{html.escape(progress.text())}</span>")
        open_lines = self.lane.current
        lines = list(self.lane.lines)[-SHOWN_LINES:] + open_lines
        more = len(self.lane.lines) + self.lane.dropped - (len(lines) - len(open_lines))
        body = (f"<span style='opacity:.6'>… {more} earlier lines</span>\n" if more > 0 else "") + html.escape(
            "\n".join(lines))
        text = f"<pre class='pgnb-lane-text' data-rank='{self.rank}' style='{_PRE}'>{body}</pre>" if body else ""
        return (f"<div class='pgnb-lane pgnb-lane-{self.rank}' style='border:1px solid #ddd;margin:2px;"
                f"min-width:16em'><div class='pgnb-lane-state'><b>rank {self.rank}</b> &middot; {self.state}</div>"
                f"{text}{''.join(self.displays)}</div>")


_SHARED: dict[str, W.Widget] = {}


def _shared(kind: str) -> W.Widget:
    """The one Layout (or HTMLStyle) every live view uses, made on first use."""
    widget = _SHARED.get(kind)
    if widget is None or widget.comm is None:  # closed meanwhile (a kernel's widgets were reset)
        widget = _SHARED[kind] = W.Layout() if kind == "layout" else HTMLStyle()
    return widget


def _display_html(bundle: dict[str, Any]) -> str:
    """A rank's display as it shows in its lane: a picture, its HTML, or its text."""
    if "image/png" in bundle:
        return f"<img style='max-width:100%' src='data:image/png;base64,{bundle['image/png']}'>"
    if "text/html" in bundle:
        return f"<div>{bundle['text/html']}</div>"
    return f"<pre style='{_PRE}'>{html.escape(str(bundle.get('text/plain', '')))}</pre>"


class LiveView(W.HTML):  # type: ignore[misc]  # ipywidgets is untyped
    """Every rank of a running cell, as it runs: one HTML widget (cheap to make for every cell)."""

    def __init__(self, ranks: list[int], label: str = "%%pg") -> None:
        self._ranks = list(ranks)
        self._label = label
        self._started = time.monotonic()
        self._lanes = {r: _RankLane(r) for r in self._ranks}
        # every live view shares one layout and one style: a cell opens one comm, not three
        super().__init__(self._page("running", "", self._grid({})), layout=_shared("layout"), style=_shared("style"))
        self.add_class("pgnb-live")

    def _page(self, phase: str, detail: str, body: str) -> str:
        title = (f"<div class='pgnb-live-title' style='font-family:var(--jp-ui-font-family,sans-serif)'><b>pgnb</b> "
                 f"{html.escape(self._label)} &middot; {html.escape(ranks_text(self._ranks))} &middot; "
                 f"<span class='pgnb-live-phase'>{html.escape(phase)}</span>{html.escape(detail)}</div>")
        return title + body

    def _grid(self, progress: dict[int, RankProgress]) -> str:
        lanes = "".join(lane.html(progress.get(r)) for r, lane in self._lanes.items())
        return ("<div class='pgnb-lanes' style='display:grid;grid-template-columns:repeat(auto-fill,minmax(22em,1fr))'>"
                f"{lanes}</div>")

    # ---- a LiveSink ------------------------------------------------------------
    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        for e in events:
            if e.rank in self._lanes:
                self._lanes[e.rank].feed(e)
        running = sum(p.state == "running" for p in ranks)
        if not running:
            return  # the cell has ended: finish() draws the last picture, once
        detail = f" · {time.monotonic() - self._started:.1f} s" + (f" · {running} running" if running else "")
        self.value = self._page("running" if running else "done", detail, self._grid({p.rank: p for p in ranks}))

    def finish(self, result: CellResult | None) -> None:
        """Collapse to one line: how the cell ended on each rank (the grouped output below has the rest)."""
        summary = _summary(result) if result is not None else "stopped"
        self.value = self._page(summary, f" · {time.monotonic() - self._started:.1f} s", "")
        self._lanes.clear()

    # ---- text forms ------------------------------------------------------------
    def __repr__(self) -> str:
        return live_text(self._ranks)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = live_text(self._ranks)  # not ipywidgets' repr, which would change as it runs
        return bundle


def _summary(result: CellResult) -> str:
    by_state: dict[str, list[int]] = {}
    for r in result.ranks:
        state = r.state if r.state != "failed" or not r.ename else f"failed ({r.ename})"
        by_state.setdefault(state, []).append(r.rank)
    return "; ".join(f"{ranks_text(rs)} {state}" for state, rs in by_state.items())

