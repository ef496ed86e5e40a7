"""The status view: widget structure, live updates, and deterministic text (no kernel needed)."""

from __future__ import annotations

import re
from dataclasses import replace

import ipywidgets as W
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display
from IPython.utils.capture import capture_output

from pgnb._wire import RANK_STATES
from pgnb.core.report import status_table
from pgnb.core.snapshot import RankStatus, Snapshot
from pgnb.notebook.view import REPLACED, SHUT_DOWN, STATE_COLOURS, SUPERSEDED, StatusView, WorldReport
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

    def publish(self, rows, phase, **changes):
        self._snap = replace(self._snap, ranks=tuple(rows), phase=phase, **changes)
        for fn in list(self._listeners):
            fn(self)

    def reinit(self, spec, state="initialized"):
        """What ``World.init`` publishes: a new generation, with the new spec."""
        rows = [RankStatus(r, spec.world, spec.backend, state) for r in range(spec.world)]
        self.publish(rows, phase=state, spec=spec, generation=self._snap.generation + 1)


@pytest.fixture
def sb():
    InteractiveShell.instance()
    return Published(4)  # the view only renders what it is given


def _rows(view):
    return [w for w in view.rows_box.children if "pgnb-row" in w._dom_classes]


def _states(view):
    return [re.search(r"class='pgnb-state'[^>]*>([a-z ]+)<", w.value).group(1) for w in _rows(view)]


def test_view_structure(sb):
    view = StatusView(sb)
    assert "pgnb-view" in view._dom_classes
    assert len(_rows(view)) == 4
    assert _states(view) == ["starting"] * 4
    assert "gloo" in view.header.value and "world 4" in view.header.value
    assert [c for c in ("pgnb-refresh", "pgnb-shutdown") if any(c in b._dom_classes for b in
            view.children[-1].children)] == ["pgnb-refresh", "pgnb-shutdown"]


def test_view_follows_the_sandbox_live(sb):
    view = StatusView(sb)
    rows = [RankStatus(r, 4, "gloo", "initialized" if r < 2 else "pending", pid=100 + r) for r in range(4)]
    sb.publish(rows, phase="rendezvous")
    assert _states(view) == ["initialized", "initialized", "pending", "pending"]
    assert "2/4 initialized" in view.header.value
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
    before = [w.model_id for w in view.rows_box.children]
    for state in ("pending", "initialized", "destroyed"):
        sb.publish([RankStatus(r, 4, "gloo", state) for r in range(4)], phase="rendezvous")
    assert [w.model_id for w in view.rows_box.children] == before
    assert _states(view) == ["destroyed"] * 4


def test_a_launcher_numbered_rank_shows_both_numbers(sb):
    view = StatusView(sb)
    sb.publish([RankStatus(r, 4, "gloo", "initialized", launcher_rank=r) for r in range(4)], phase="initialized")
    assert all(f"mpi {r}" in w.value for r, w in enumerate(_rows(view)))
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    assert not any("mpi" in w.value for w in _rows(view))


def test_a_fresh_rank_is_marked_until_work_is_sent_there(sb):
    """After an in-place replacement the view's row and every text form say which ranks started empty."""
    view = StatusView(sb)
    rows = [RankStatus(r, 4, "gloo", "initialized") for r in range(4)]
    sb.publish(rows, phase="initialized", fresh=(2,), note="rank 2 replaced (empty namespace); ranks 0, 1, 3 kept")
    assert ["pgnb-fresh" in w._dom_classes for w in _rows(view)] == [False, False, True, False]
    assert "fresh</span>" in _rows(view)[2].value and _states(view) == ["initialized"] * 4
    text = status_table(sb.snapshot())
    assert text.splitlines()[0].endswith("4/4 initialized; rank 2 fresh (started empty, nothing run there yet)")
    assert "rank 2 fresh" in WorldReport(sb.snapshot())._repr_mimebundle_()["text/html"]
    sb.publish(rows, phase="initialized", fresh=(), note="")
    assert not any("pgnb-fresh" in w._dom_classes or "fresh<" in w.value for w in _rows(view))
    assert "fresh" not in status_table(sb.snapshot())


# ---- a view tells the truth about its own world (issue 18) ----------------------------------------------
def _widgets_alive():
    from ipywidgets.widgets.widget import _instances  # every widget the kernel keeps (ipywidgets 8)

    return sum(1 for w in _instances.values() if getattr(w, "comm", None) is not None)


def _static(view):
    (static,) = view.children
    assert "pgnb-static" in static._dom_classes
    return static.value


def _static_states(view):
    return re.findall(r"class='pgnb-state'[^>]*>([a-z ]+)<", _static(view))


def test_a_live_view_waits_for_its_own_world(sb):
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    tcp = WorldSpec(world=2, init_method="tcp")
    view = StatusView(sb, live=True, spec=tcp)  # shown by %pg_init before the world is re-made
    assert view.generation is None and "world 2" in view.header.value and "tcp://" in view.header.value
    assert _states(view) == ["starting"] * 2
    sb.publish([RankStatus(r, 4, "gloo", "destroyed") for r in range(4)], phase="destroyed")  # the old world
    assert "world 2" in view.header.value and _states(view) == ["starting"] * 2
    sb.reinit(tcp, state="pending")
    assert view.generation == 1 and _states(view) == ["pending"] * 2
    sb.publish([RankStatus(r, 2, "gloo", "initialized") for r in range(2)], phase="initialized")
    assert _states(view) == ["initialized"] * 2 and not view.frozen


def test_a_later_world_freezes_the_view_at_its_own(sb):
    sb.publish([RankStatus(r, 4, "gloo", "initialized", device="cpu") for r in range(4)], phase="initialized")
    with capture_output() as cap:
        display(view := StatusView(sb))
    text = cap.outputs[0].data["text/plain"]
    sb.reinit(WorldSpec(world=3, init_method="file"))
    assert view.frozen == REPLACED
    static = _static(view)
    assert "world 4" in static and "init <code>env://</code>" in static and "file://" not in static
    assert "world 3" not in static and _static_states(view) == ["initialized"] * 4
    assert "frozen: replaced by a later %pg_init" in static
    assert static.count("disabled") == 2  # both buttons
    assert view.text() == text  # what nbval compared, whatever happened since
    sb.reinit(WorldSpec(world=2))
    assert _static(view) == static  # frozen for good


def test_shutdown_freezes_the_view_with_its_final_rows(sb):
    view = StatusView(sb)
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    sb.shutdown()  # the view's own world ends: it shows that, then stops
    assert view.frozen == SHUT_DOWN
    assert "frozen: shut down" in _static(view) and "pgnb-phase'>shut down<" in _static(view)


def test_a_frozen_view_costs_few_widgets_and_its_buttons_act_on_nothing(sb, monkeypatch):
    calls = []
    monkeypatch.setattr(sb, "status", lambda: calls.append("status"))
    monkeypatch.setattr(sb, "shutdown", lambda: calls.append("shutdown"))
    view = StatusView(sb)
    refresh, stop = view.children[-1].children
    before = _widgets_alive()
    view.freeze(SUPERSEDED)
    after = _widgets_alive()
    assert before - after >= 25, (before, after)  # ~30 widgets for 4 ranks -> VBox + one HTML (and their styles)
    assert refresh.comm is None and stop.comm is None
    refresh.click()  # a click already on its way when the view froze
    stop.click()
    assert calls == []
    assert "frozen: a newer view follows this world" in _static(view)
    with pytest.raises(AttributeError, match="frozen"):
        view.row_widgets  # noqa: B018 - dropped, so the kernel can free them


def test_frozen_views_free_their_widgets(sb):
    import gc
    import tracemalloc

    tracemalloc.start()
    try:
        gc.collect()
        start = tracemalloc.take_snapshot()
        views = [StatusView(sb) for _ in range(20)]
        gc.collect()
        live = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(start, "filename"))
        for v in views:
            v.freeze(SUPERSEDED)
        gc.collect()
        frozen = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(start, "filename"))
    finally:
        tracemalloc.stop()
    assert frozen < live / 2, (live // 20, frozen // 20)  # bytes per view: ~94 KiB live, ~26 KiB frozen here


def test_magics_keep_one_live_view(sb):
    from pgnb.notebook.magics import PgMagics

    shell = InteractiveShell.instance()
    magics = PgMagics(shell)
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    with capture_output() as cap:
        first = magics._show_view(sb, live=False)  # %pg_status
        second = magics._show_view(sb, live=True, spec=WorldSpec(world=2, init_method="tcp"))  # %pg_init
        sb.reinit(WorldSpec(world=2, init_method="tcp"))
        third = magics._show_view(sb, live=False)
    assert (first.frozen, second.frozen, third.frozen) == (REPLACED, SUPERSEDED, "")
    # outputs are displayed once and never updated: what nbval compares is what was sent
    assert [o.data["text/plain"].splitlines()[0] for o in cap.outputs] == [
        "pgnb world: backend gloo, world 4, init env:// | 4/4 initialized",
        "pgnb world: backend gloo, world 2, init tcp:// (live view; the outcome follows)",
        "pgnb world: backend gloo, world 2, init tcp:// | 2/2 initialized",
    ]
    assert "world 2" in _static(second) and "tcp://" in _static(second)
    sb.shutdown()
    assert third.frozen == SHUT_DOWN and first.frozen == REPLACED


def test_the_shut_down_button_freezes_its_own_view(sb):
    view = StatusView(sb)
    sb.publish([RankStatus(r, 4, "gloo", "initialized") for r in range(4)], phase="initialized")
    refresh, stop = view.children[-1].children
    stop.click()  # closes the button it was clicked on: the view freezes inside the click
    assert view.frozen == SHUT_DOWN and stop.comm is None
    assert _static_states(view) == ["initialized"] * 4 and "pgnb-phase'>shut down<" in _static(view)


def test_every_rank_state_has_its_colour():
    """mypy checks that every key is a state; this, that no state is missing."""
    assert set(STATE_COLOURS) == set(RANK_STATES)
