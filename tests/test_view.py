"""The status view: widget structure, live updates, and deterministic text (no kernel needed)."""

from __future__ import annotations

import re
from dataclasses import replace

import ipywidgets as W
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display
from IPython.utils.capture import capture_output

from pgnb.core.report import status_table
from pgnb.core.world import RankStatus, Snapshot
from pgnb.notebook.view import StatusView, WorldReport
from pgnb.spec import WorldSpec


class Published:
    """A world as the view sees it (``pgnb.notebook.view.WorldLike``): the test publishes its snapshots."""

    def __init__(self, world: int = 4) -> None:
        rows = tuple(RankStatus(r, world, "gloo", "starting") for r in range(world))
        self._snap = Snapshot(WorldSpec(world=world), rows, "new")
        self._listeners = []

    def snapshot(self):
        return self._snap

    def add_listener(self, fn):
        self._listeners.append(fn)

    def remove_listener(self, fn):
        self._listeners.remove(fn)

    def status(self):
        return list(self._snap.ranks)

    def shutdown(self):
        self.publish(self._snap.ranks, phase="shut down")

    def publish(self, rows, phase):
        self._snap = replace(self._snap, ranks=tuple(rows), phase=phase)
        for fn in list(self._listeners):
            fn(self)


@pytest.fixture
def sb():
    InteractiveShell.instance()
    return Published(4)  # the view only renders what it is given


def _rows(view):
    return [w for w in view._rows_box.children if "pgnb-row" in w._dom_classes]


def _states(view):
    return [re.search(r"class='pgnb-state'[^>]*>([a-z ]+)<", w.value).group(1) for w in _rows(view)]


def test_view_structure(sb):
    view = StatusView(sb)
    assert "pgnb-view" in view._dom_classes
    assert len(_rows(view)) == 4
    assert _states(view) == ["starting"] * 4
    assert "gloo" in view._header.value and "world 4" in view._header.value
    assert [c for c in ("pgnb-refresh", "pgnb-shutdown") if any(c in b._dom_classes for b in
            view.children[-1].children)] == ["pgnb-refresh", "pgnb-shutdown"]


def test_view_follows_the_sandbox_live(sb):
    view = StatusView(sb)
    rows = [RankStatus(r, 4, "gloo", "initialized" if r < 2 else "pending", pid=100 + r) for r in range(4)]
    sb.publish(rows, phase="rendezvous")
    assert _states(view) == ["initialized", "initialized", "pending", "pending"]
    assert "2/4 initialized" in view._header.value
    view.detach()
    sb.publish([RankStatus(r, 4, "gloo", "failed", error="x") for r in range(4)], phase="failed")
    assert _states(view) == ["initialized", "initialized", "pending", "pending"]  # detached: frozen


def test_text_plain_is_deterministic_and_complete(sb):
    sb.publish([RankStatus(r, 4, "gloo", "initialized", host=f"host{r}", pid=4242 + r, device="cpu",
                             init_seconds=0.123 * r) for r in range(4)], phase="initialized")
    with capture_output() as cap:
        display(StatusView(sb))
    text = cap.outputs[0].data["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in cap.outputs[0].data
    assert text == status_table(sb.snapshot())
    assert len(text) > 110  # ipywidgets would have cut it here
    for r in range(4):
        assert re.search(rf"^{r}\s+4\s+gloo\s+cpu\s+initialized$", text, re.M)
    assert not re.search(r"4242|host\d|0\.123|0x[0-9a-f]", text)


def test_live_view_text_does_not_depend_on_timing(sb):
    view = StatusView(sb, live=True)
    before = view._repr_mimebundle_()["text/plain"]
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    assert view._repr_mimebundle_()["text/plain"] == before
    assert before == "pgnb world: backend gloo, world 4, init env:// (live view; the outcome follows)"


def test_report_carries_the_outcome(sb):
    sb.publish([RankStatus(r, 4, "gloo", "initialized", device="cpu") for r in range(3)]
                 + [RankStatus(3, 4, "gloo", "failed", error="DistStoreError: timeout")], phase="failed")
    bundle = WorldReport(sb.snapshot())._repr_mimebundle_()
    assert "3/4 initialized (1 failed)" in bundle["text/plain"]
    assert bundle["text/plain"].splitlines()[-1].split() == ["3", "4", "gloo", "-", "failed", "DistStoreError:",
                                                            "timeout"]
    assert "3/4 initialized" in bundle["text/html"]


def test_buttons_call_back_into_the_sandbox(sb, monkeypatch):
    calls = []
    monkeypatch.setattr(sb, "status", lambda: calls.append("status"))
    monkeypatch.setattr(sb, "shutdown", lambda: calls.append("shutdown"))
    view = StatusView(sb)
    refresh, stop = view.children[-1].children
    assert isinstance(refresh, W.Button)
    refresh.click()
    stop.click()
    assert calls == ["status", "shutdown"]


def test_updates_reuse_the_row_widgets(sb):
    view = StatusView(sb)
    before = [w.model_id for w in view._rows_box.children]
    for state in ("pending", "initialized", "destroyed"):
        sb.publish([RankStatus(r, 4, "gloo", state) for r in range(4)], phase="rendezvous")
    assert [w.model_id for w in view._rows_box.children] == before
    assert _states(view) == ["destroyed"] * 4


def test_a_launcher_numbered_rank_shows_both_numbers(sb):
    view = StatusView(sb)
    sb.publish([RankStatus(r, 4, "gloo", "initialized", launcher_rank=r) for r in range(4)], phase="initialized")
    assert all(f"mpi {r}" in w.value for r, w in enumerate(_rows(view)))
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    assert not any("mpi" in w.value for w in _rows(view))
