"""The live area under a running ``%%pg`` cell, and its terminal form.

``LiveView`` is an ipywidgets composite: a lane per rank with what the rank
printed so far (``\\r`` redraws its line, so a progress bar is one updating
line) and its state (running with elapsed time, waiting in a collective,
finished, failed, lost). Updates are widget state changes, which nbval
ignores; the view's ``text/plain`` is one line fixed when it is displayed,
the same on every run and in a saved notebook. When the cell ends the view
collapses to a one-line summary, and the grouped output below it is what the
notebook keeps.

``TerminalSink`` is the same news for a terminal IPython: each line as it
comes, prefixed ``[rank N]``, as ``%%px`` does.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any

import ipywidgets as W

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
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.lane = Lane()
        self.header = W.HTML().add_class("pgnb-lane-state")
        self.text = W.HTML().add_class("pgnb-lane-text")
        self.displays: W.Output | None = None
        self.box = W.VBox([self.header, self.text]).add_class("pgnb-lane").add_class(f"pgnb-lane-{rank}")
        self.box.layout = W.Layout(border="1px solid #ddd", margin="2px", min_width="16em")
        self._drawn = ""

    def feed(self, event: OutputEvent) -> None:
        if event.stream == "display":
            if self.displays is None:
                self.displays = W.Output().add_class("pgnb-lane-displays")
                self.box.children = [*self.box.children, self.displays]
            self.displays.outputs = (*self.displays.outputs,
                                     {"output_type": "display_data", "data": event.data, "metadata": {}})
        else:
            self.lane.feed(event.data)

    def draw(self, progress: RankProgress | None) -> None:
        if progress is not None:
            colour = STATE_COLOURS.get(progress.state, "#000")
            head = (f"<b>rank {self.rank}</b> &middot; <span class='pgnb-lane-{progress.state}' "
                    f"style='color:{colour}'>{html.escape(progress.text())}</span>")
            if self.header.value != head:
                self.header.value = head
        lines = list(self.lane.lines)[-SHOWN_LINES:] + ([self.lane.current] if self.lane.current else [])
        more = len(self.lane.lines) + self.lane.dropped - (len(lines) - (1 if self.lane.current else 0))
        body = (f"<span style='opacity:.6'>… {more} earlier lines</span>\n" if more > 0 else "") + html.escape(
            "\n".join(lines))
        if body != self._drawn:
            self._drawn = body
            self.text.value = f"<pre data-rank='{self.rank}' style='{_PRE}'>{body}</pre>" if body else ""

    def close(self) -> None:
        for w in (self.header, self.text, self.displays, self.box):
            if w is not None:
                w.close()


class LiveView(W.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """Every rank of a running cell, as it runs."""

    def __init__(self, ranks: list[int], label: str = "%%pg") -> None:
        self._ranks = list(ranks)
        self._label = label
        self._started = time.monotonic()
        self._title = W.HTML(self._title_html("running", "")).add_class("pgnb-live-title")
        self._lanes = {r: _RankLane(r) for r in self._ranks}
        grid = W.GridBox([lane.box for lane in self._lanes.values()]).add_class("pgnb-lanes")
        grid.layout = W.Layout(grid_template_columns="repeat(auto-fill, minmax(22em, 1fr))")
        self._grid = grid
        super().__init__([self._title, grid])
        self.add_class("pgnb-live")

    def _title_html(self, phase: str, detail: str) -> str:
        return (f"<span style='font-family:var(--jp-ui-font-family,sans-serif)'><b>pgnb</b> {html.escape(self._label)}"
                f" &middot; {html.escape(ranks_text(self._ranks))} &middot; <span class='pgnb-live-phase'>"
                f"{html.escape(phase)}</span>{html.escape(detail)}</span>")

    # ---- a LiveSink ------------------------------------------------------------
    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        by_rank = {p.rank: p for p in ranks}
        with self.hold_sync():
            for e in events:
                if e.rank in self._lanes:
                    self._lanes[e.rank].feed(e)
            for r, lane in self._lanes.items():
                lane.draw(by_rank.get(r))
            running = sum(p.state == "running" for p in ranks)
            self._title.value = self._title_html(
                "running" if running else "done",
                f" · {time.monotonic() - self._started:.1f} s" + (f" · {running} running" if running else ""))

    def finish(self, result: CellResult | None) -> None:
        """Collapse to one line: how the cell ended on each rank (the grouped output below has the rest)."""
        seconds = time.monotonic() - self._started
        summary = _summary(result) if result is not None else "stopped"
        with self.hold_sync():
            self.children = [self._title]
            self._title.value = self._title_html(summary, f" · {seconds:.1f} s")
        for lane in self._lanes.values():
            lane.close()
        self._grid.close()

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


class TerminalSink:
    """A terminal's live output: every line as it comes, ``[rank N]`` first (stderr lines on stderr)."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        for e in events:
            if e.stream == "display":
                continue  # a terminal cannot show it; the grouped output has its text form
            key = (e.rank, e.stream)
            text = self._partial.pop(key, "") + str(e.data)
            *lines, rest = text.split("\n")
            if rest:
                self._partial[key] = rest
            out = sys.stdout if e.stream == "stdout" else sys.stderr
            for line in lines:
                out.write(f"[rank {e.rank}] {line.rsplit(chr(13), 1)[-1]}\n")
            out.flush()

    def close(self) -> None:
        """Lines that never got their newline."""
        for (rank, stream), rest in sorted(self._partial.items()):
            (sys.stdout if stream == "stdout" else sys.stderr).write(f"[rank {rank}] {rest.rsplit(chr(13), 1)[-1]}\n")
        self._partial.clear()
