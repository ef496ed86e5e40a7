"""The status view: an ipywidgets composite plus a deterministic text form.

``StatusView`` renders the ``Snapshot`` it is given (it never asks ranks
anything itself; its buttons call back into the Sandbox). Live updates are
widget trait changes, which nbval ignores, so what nbval compares is the
``text/plain`` sent when the view is displayed:

* a view displayed *before* the outcome is known (``live=True``, as
  ``%pg_init`` does) carries only the request in its text form;
* the outcome then reaches the notebook as a ``WorldReport``, whose text is
  the full rank table (no pids, hosts, ports or timings) and whose HTML is a
  one-line summary that stays readable when widgets are not rendered.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import ipywidgets as W

from .._wire import RankState
from ..core.report import status_table, summary_text
from ..core.snapshot import RankStatus, Snapshot
from ..spec import WorldSpec


class WorldLike(Protocol):
    """What a view needs of a world: its snapshots, news of changes, and the buttons' two actions."""

    def snapshot(self) -> Snapshot: ...

    def add_listener(self, fn: Callable[[Any], None]) -> None: ...

    def remove_listener(self, fn: Callable[[Any], None]) -> None: ...

    def status(self) -> Any: ...

    def shutdown(self) -> None: ...


STATE_COLOURS: dict[RankState, str] = {
    "starting": "#9e9e9e",
    "pending": "#f0ad4e",
    "initialized": "#2e7d32",
    "failed": "#c62828",
    "destroyed": "#546e7a",
    "lost": "#6a1b9a",
}
#: the report's columns: the deterministic ones (no host, pid or timing), as its text form has them
REPORT_COLUMNS = ("rank", "world", "backend", "device", "state", "error")
COLUMNS = ("rank", "host", "pid", "device", "backend", "world", "state", "error")
_WIDTHS = ("6em", "9em", "5em", "5em", "9em", "3.5em", "7em", "auto")
FINAL_PHASES = ("initialized", "failed", "destroyed", "shut down")
#: Why a view stopped following its world: the one line a frozen view shows.
REPLACED = "replaced by a later %pg_init"
SHUT_DOWN = "shut down"
SUPERSEDED = "a newer view follows this world"


class WorldReport:
    """The outcome of a magic as the notebook keeps it: the text table, and one HTML line that opens on the table.

    The rows are in the HTML too (folded under the line), so a saved notebook reopened without
    running it, where widgets are not drawn, still shows every rank of every ``%pg_init``.
    """

    def __init__(self, snap: Snapshot) -> None:
        self.snapshot = snap

    def __repr__(self) -> str:
        return status_table(self.snapshot)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        snap = self.snapshot
        colour = STATE_COLOURS["initialized" if snap.initialized == snap.spec.world else "failed"]
        summary = (f"<span style='color:{colour}'>&#9679;</span> <b>pgnb</b> "
                   f"{html.escape(snap.spec.describe())} &mdash; {html.escape(summary_text(snap))}")
        cell = "padding:0 .6em;text-align:left"
        head = "".join(f"<th style='{cell}'>{c}</th>" for c in REPORT_COLUMNS)
        rows = "".join(
            "<tr>" + "".join(f"<td style='{cell}'>{html.escape(v)}</td>" for v in
                             (str(r.rank), str(r.world_size), r.backend, r.device or "-", r.state, r.error)) + "</tr>"
            for r in snap.ranks)
        table = f"<table class='pgnb-report-rows'><tr>{head}</tr>{rows}</table>"
        return {"text/plain": repr(self), "text/html": (f"<details class='pgnb-report'><summary>{summary}</summary>"
                                                         f"{table}</details>")}


def _close_tree(w: W.Widget) -> None:
    for child in getattr(w, "children", ()):
        _close_tree(child)
    for attr in ("layout", "style"):
        sub = getattr(w, attr, None)
        if isinstance(sub, W.Widget):
            _close_one(sub)
    _close_one(w)


def _close_one(w: W.Widget) -> None:
    # a comm the kernel's comm manager no longer knows (closed by the front end, or a
    # manager replaced since) is already closed as far as anyone can tell
    try:
        w.close()
    except KeyError:
        w.comm = None


def _placeholder(spec: WorldSpec) -> Snapshot:
    """What a view shows of the world it waits for, before that world's first snapshot."""
    return Snapshot(spec, tuple(RankStatus(r, spec.world, spec.backend, "starting") for r in range(spec.world)), "new")


class StatusView(W.VBox):  # type: ignore[misc]  # ipywidgets has no type information (VBox is Any)
    """A view of one world: header, one row per rank, and actions.

    A view belongs to the world that was current when it was made: the
    ``Snapshot.generation`` of its ``World`` then, or, for a ``live`` view (shown
    by ``%pg_init`` before it initialises anything), the next one. It redraws
    that world's snapshots and ignores any other's. When its world is replaced
    (a later ``%pg_init``, ``--force``) or shut down, or a newer view takes over
    (``freeze``), it stops following: it keeps the last picture of its own
    world, says why in one line (``frozen``), and its widgets are swapped for
    one static HTML widget with the same rows and disabled buttons, so an old
    view costs the kernel 5 widgets instead of ~30 and still shows its table.
    """

    def __init__(self, sandbox: WorldLike, live: bool = False, spec: WorldSpec | None = None, **kwargs: Any) -> None:
        self._sandbox = sandbox
        self.live = live
        now = sandbox.snapshot()
        # what was asked for: a live view is shown before the sandbox has switched to it
        wanted = spec or now.spec
        #: the text form of a live view, fixed when it is made: nbval compares it, so it must not
        #: depend on how far the world got by the time the frontend asks
        self._live_text = f"pgnb world: {wanted.describe()} (live view; the outcome follows)"
        #: the generation of the world this view belongs to (None: a live view whose world is not made yet)
        self.generation: int | None = None if live else now.generation
        self._after = now.generation
        #: why this view no longer follows its world ("" while it does)
        self.frozen = ""
        self._shown = _placeholder(wanted) if live else now
        # the liveness watcher publishes from its own thread
        self._lock = threading.RLock()
        parts = _Parts(lambda: self._act(self._sandbox.status), lambda: self._act(self._sandbox.shutdown))
        self._parts: _Parts | None = parts
        super().__init__([parts.header, parts.rows_box, parts.message, W.HBox([parts.refresh, parts.shutdown])],
                         **kwargs)
        self.add_class("pgnb-view")
        self.render(self._shown)
        sandbox.add_listener(self._on_change)

    # the live widgets, while there are any (read-only: tests and the reliability checks read them)
    @property
    def header(self) -> Any:
        return self._live_parts().header

    @property
    def rows_box(self) -> Any:
        return self._live_parts().rows_box

    @property
    def message(self) -> Any:
        return self._live_parts().message

    @property
    def row_widgets(self) -> list[Any]:
        return self._live_parts().rows

    def _live_parts(self) -> _Parts:
        if self._parts is None:
            raise AttributeError(f"this view is frozen ({self.frozen}): it has no live widgets")
        return self._parts

    def detach(self) -> None:
        """Stop following the sandbox (the view keeps its last picture)."""
        self._sandbox.remove_listener(self._on_change)

    def close(self) -> None:
        """Detach, and close every widget this view made: ipywidgets keeps a widget (and its comm)
        alive until it is closed, so views a notebook no longer shows would grow the kernel."""
        self.detach()
        parts, self._parts = self._parts, None
        for w in [*self.children, *(parts.loose() if parts is not None else ())]:
            _close_tree(w)
        for sub in (self.layout, getattr(self, "style", None)):
            if isinstance(sub, W.Widget):
                _close_one(sub)
        try:
            super().close()
        except KeyError:  # see _close_one
            self.comm = None

    def freeze(self, reason: str) -> None:
        """Stop following the world, keep its last picture, and say ``reason`` in one line.

        The header, rows and buttons become one static HTML widget (buttons disabled); the
        widgets they were are closed and dropped, so the kernel frees them (~94 KiB -> ~26 KiB
        for 4 ranks). The displayed output is not rewritten (its text/plain is what nbval
        compared), only this box's children change. Freezing twice keeps the first reason.
        """
        with self._lock:
            if self.frozen:
                return
            self.frozen = reason
            self.detach()
            parts, self._parts = self._parts, None
            old = [*self.children, *(parts.loose() if parts is not None else ())]
            static = W.HTML(self.static_html()).add_class("pgnb-static")
            self.set_trait("children", (static,))
            for w in old:
                _close_tree(w)

    def _act(self, action: Callable[[], Any]) -> None:
        # a click that was on its way when the view froze acts on nothing: the world is no longer this view's
        if not self.frozen:
            action()

    def _on_change(self, sandbox: WorldLike) -> None:
        snap = sandbox.snapshot()
        with self._lock:
            if self.frozen:
                return
            if self.generation is None:
                if snap.generation <= self._after:
                    return  # the world before this view's, on its way out
                self.generation = snap.generation
            if snap.generation != self.generation:
                self.freeze(REPLACED)
                return
            self.render(snap)
            if snap.phase == "shut down":
                self.freeze(SHUT_DOWN)

    # ---- drawing -------------------------------------------------------
    def render(self, snap: Snapshot) -> None:
        parts = self._parts
        if parts is None:  # frozen: its picture is final
            return
        self._shown = snap
        with self.hold_sync():
            parts.header.value = _header_html(snap)
            while len(parts.rows) < len(snap.ranks):
                parts.rows.append(W.HTML())
            rows = parts.rows[: len(snap.ranks)]
            for w, r in zip(rows, snap.ranks, strict=True):
                w.value = _row_html(r, r.rank in snap.fresh)
                w._dom_classes = _row_classes(r, r.rank in snap.fresh)
            if list(parts.rows_box.children) != [parts.title, *rows]:
                parts.rows_box.children = [parts.title, *rows]
            parts.message.value = _message_html(snap)
            stopped = snap.phase == "shut down"
            parts.refresh.disabled = stopped
            parts.shutdown.disabled = stopped

    def static_html(self) -> str:
        """The view as one piece of HTML: what a frozen view shows (same classes as the widgets)."""
        snap = self._shown
        why = html.escape(self.frozen)
        tip = html.escape(f"frozen: {self.frozen}; this view acts on no world now (%pg_status shows the current one)")
        rows = "".join(f"<div class='{' '.join(_row_classes(r, r.rank in snap.fresh))}' style='{_ROW_STYLE}'>"
                       f"{_row_html(r, r.rank in snap.fresh)}</div>" for r in snap.ranks)
        message = _message_html(snap)
        buttons = "".join(
            f"<button class='jupyter-button widget-button {cls}' disabled title='{tip}' style='{_BUTTON_STYLE}'>"
            f"<i class='fa fa-{icon}'></i> {label}</button>"
            for cls, icon, label in (("pgnb-refresh", "refresh", "Refresh"),
                                     ("pgnb-shutdown", "power-off", "Shut down")))
        return (
            f"<div class='pgnb-header' style='{_ROW_STYLE}'>{_header_html(snap, frozen=True)}</div>"
            f"<div class='pgnb-rows'><div class='pgnb-title' style='{_ROW_STYLE}'>{_cells(list(COLUMNS), bold=True)}"
            f"</div>{rows}</div>"
            + (f"<div class='pgnb-message'>{message}</div>" if message else "")
            + f"<div class='pgnb-frozen' style='color:#616161;font-style:italic;{_ROW_STYLE}'>frozen: {why}</div>"
            f"<div>{buttons}</div>"
        )

    # ---- text forms ------------------------------------------------------
    def text(self) -> str:
        return self._live_text if self.live else status_table(self._shown)

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.text()  # ipywidgets would cut repr() at 110 characters
        return bundle


class _Parts:
    """The widgets of a live view: a frozen view drops them, so the kernel can free them."""

    def __init__(self, on_refresh: Callable[[], None], on_shutdown: Callable[[], None]) -> None:
        self.header = W.HTML().add_class("pgnb-header")
        self.rows_box = W.VBox().add_class("pgnb-rows")
        self.title = W.HTML(_cells(list(COLUMNS), bold=True)).add_class("pgnb-title")
        self.rows: list[Any] = []  # one HTML widget per rank, reused from one snapshot to the next
        self.message = W.HTML().add_class("pgnb-message")
        self.refresh = W.Button(description="Refresh", icon="refresh",
                                tooltip="Ask every rank for its state").add_class("pgnb-refresh")
        self.shutdown = W.Button(description="Shut down", icon="power-off",
                                 tooltip="Destroy the group and stop the engines").add_class("pgnb-shutdown")
        self.refresh.on_click(lambda _: on_refresh())
        self.shutdown.on_click(lambda _: on_shutdown())

    def loose(self) -> list[Any]:
        """Widgets that may not be among the view's children just now (rows beyond the world's size)."""
        return [self.title, *self.rows]


# ---- HTML pieces, shared by the live widgets and the static picture of a frozen view ----
#: a static row is as tall as a widget row (ipywidgets' inline height)
_ROW_STYLE = "min-height:var(--jp-widgets-inline-height,28px);line-height:var(--jp-widgets-inline-height,28px)"


#: a disabled button as ipywidgets draws one (its CSS greys only widget buttons)
_BUTTON_STYLE = "margin-right:4px;opacity:.5;cursor:not-allowed"


def _cells(values: list[str], bold: bool = False) -> str:
    style = "display:inline-block;padding:0 .4em;white-space:nowrap;overflow:hidden;vertical-align:top"
    weight = ";font-weight:bold" if bold else ""
    return "".join(f"<span style='{style};width:{w}{weight}'>{v}</span>" for v, w in zip(values, _WIDTHS, strict=True))


def _row_classes(r: RankStatus, fresh: bool = False) -> tuple[str, ...]:
    return ("pgnb-row", f"pgnb-rank-{r.rank}", f"pgnb-is-{r.state}") + (("pgnb-fresh",) if fresh else ())


def _row_html(r: RankStatus, fresh: bool = False) -> str:
    colour = STATE_COLOURS[r.state]
    # the dot is decoration; keep the state cell's text exactly the state for tests and screen readers
    state = (f"<span style='color:{colour}'>&#9679;</span> "
             f"<span class='pgnb-state' style='color:{colour};font-weight:bold'>{html.escape(r.state)}</span>")
    if fresh:  # replaced or added beside ranks that kept their namespaces, until work is sent there
        state += (" <span class='pgnb-fresh-tag' style='opacity:.7' title='started with an empty namespace; "
                  "nothing has run here since'>fresh</span>")
    rank = str(r.rank)
    if r.launcher_rank is not None:  # MPI / Slurm numbered the process: show that torch agrees
        rank += (f" <span class='pgnb-launcher-rank' style='opacity:.7' title='rank given by the "
                 f"launcher (MPI COMM_WORLD rank or SLURM_PROCID)'>&middot; mpi {r.launcher_rank}</span>")
    values = [rank, html.escape(r.host or "-"), str(r.pid or "-"), html.escape(r.device or "-"),
              html.escape(r.backend), str(r.world_size), state,
              f"<span class='pgnb-error' title='{html.escape(r.error)}'>{html.escape(r.error)}</span>"]
    return _cells(values)


def _message_html(snap: Snapshot) -> str:
    return (f"<span style='color:{STATE_COLOURS['failed']}'>{html.escape(snap.message)}</span>"
            if snap.message else "")


def _header_html(snap: Snapshot, frozen: bool = False) -> str:
    spec = snap.spec
    elapsed = ""
    if snap.started_at and snap.phase not in FINAL_PHASES and not frozen:
        elapsed = f" &middot; {time.monotonic() - snap.started_at:.1f} s"
    engines = ""
    if snap.phase == "starting engines":
        engines = f" &middot; engines {snap.engines_up}/{spec.world} up"
        if snap.waiting:  # its batch job in the queue: the job id, its state and Slurm's reason
            engines += f" &middot; <span class='pgnb-waiting'>{html.escape(snap.waiting)}</span>"
    init = spec.init_method if "://" in spec.init_method else f"{spec.init_method}://"
    return (
        "<div style='font-family:var(--jp-ui-font-family,sans-serif)'>"
        f"<b>pgnb</b> &middot; backend <code>{html.escape(spec.backend)}</code> &middot; "
        f"world {spec.world} &middot; init <code>{html.escape(init)}</code>"
        + (f" &middot; group <code>{html.escape(spec.group_name)}</code>" if spec.group_name else "")
        + f" &middot; <span class='pgnb-count'>{snap.initialized}/{spec.world} initialized</span>"
        f" &middot; <span class='pgnb-phase'>{html.escape(snap.phase)}</span>{engines}{elapsed}</div>"
    )
