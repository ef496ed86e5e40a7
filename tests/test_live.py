"""Live ``%%pg``: each rank's output and state while the cell runs, and what the notebook keeps when it ends.

The text handling is tested without engines; the stream through ``Sandbox.execute(on_output=...)`` on a real
world; the live view in a real Jupyter kernel, timing the iopub messages as a frontend receives them; the
terminal form in a real terminal IPython.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import get_args

import ipywidgets as W
import pytest
from IPython.core.interactiveshell import InteractiveShell

from pgnb.core.cells import CellHooks, CellOptions
from pgnb.core.live import LiveState, OutputEvent, RankProgress
from pgnb.core.results import CellResult, RankOutput
from pgnb.core.terminal import Lane, settle
from pgnb.notebook.live import STATE_COLOURS, LiveView, draw_every, shown_lines

TICKS = "import time\nfor i in range({n}):\n    print('tick', i, flush=True)\n    time.sleep({every})\n"
BAR = ("from tqdm.auto import tqdm\nimport time\nfor _ in tqdm(range(20), desc=f'rank {rank}', mininterval=0):\n"
       "    time.sleep(0.02)\n")


# ---- text, as a terminal shows it --------------------------------------------------------------
def _bar(steps: list[int], rate: str) -> str:
    return "".join(f"\rrank 0: {p:3d}%|{'#' * (p // 10):10s}| {p // 5}/20 [00:0{p // 50}<00:01, {rate}it/s]"
                   for p in steps) + "\n"


def test_a_progress_bar_settles_to_its_final_state_whatever_its_timing():
    a = settle("start\n" + _bar([0, 30, 60, 100], "24.1") + "done\n")
    b = settle("start\n" + _bar([0, 10, 20, 50, 70, 90, 100], "31.7") + "done\n")
    assert a == b == "start\nrank 0: 100%|##########| 20/20\ndone\n"
    assert settle("plain text\nwith [00:01<00:02, 3it/s] kept\n") == "plain text\nwith [00:01<00:02, 3it/s] kept\n"


def test_a_lane_redraws_a_line_on_carriage_return_and_keeps_a_bounded_tail():
    lane = Lane(limit=3)
    lane.feed("a\nb\n")
    lane.feed("\r 10%")
    lane.feed("\r 50%")
    assert lane.text() == "a\nb\n 50%"
    lane.feed("\r100%\nc\nd\n")
    assert list(lane.lines) == ["100%", "c", "d"] and lane.dropped == 2
    # a bar on stderr stays the bottom line while stdout lines come above it, as tqdm.write keeps it
    lane = Lane()
    lane.feed("\rbar  10%", "stderr")
    lane.feed("step 1\n", "stdout")
    lane.feed("\rbar  50%", "stderr")
    assert lane.text() == "step 1\nbar  50%"


def test_rank_states_read_as_the_view_shows_them():
    assert RankProgress(0, "running", 14.2, waiting_in="all_reduce", waiting_seconds=12.0).text() == (
        "running 14 s · waiting in all_reduce for 12 s")
    assert RankProgress(1, "finished", 0.42).text() == "finished in 0.4 s"
    assert RankProgress(2, "failed", 1.0, ename="ZeroDivisionError").text() == "failed (ZeroDivisionError)"
    assert RankProgress(3, "lost", 1.0).text() == "lost"


# ---- the live view, without a kernel ---------------------------------------------------------------
def test_every_live_state_has_its_colour():
    """mypy checks that every key is a state; this, that no state is missing."""
    assert set(STATE_COLOURS) == set(get_args(LiveState))


def test_the_live_view_is_a_widget_per_lane_and_an_update_sends_only_what_changed(monkeypatch):
    InteractiveShell.instance()
    sent = []
    send = W.Widget._send

    def spy(self, msg, buffers=None):
        sent.append((self, msg))
        return send(self, msg, buffers)

    monkeypatch.setattr(W.Widget, "_send", spy)
    shown = []
    view = LiveView([0, 1], show=lambda obj, **kw: shown.append(obj))
    assert view.box is None and not shown  # nothing drawn before the first update: a quick cell opens no comm
    running = [RankProgress(0, "running", 1.5), RankProgress(1, "running", 1.5)]
    view.update([OutputEvent(0, "stdout", "hello\n")], running)
    # the widget alone, which nbval skips: no text form for a notebook to keep
    assert shown == [{"application/vnd.jupyter.widget-view+json": {
        "version_major": 2, "version_minor": 0, "model_id": view.box.model_id}}]
    title, grid = view.box.children
    lanes = grid.children
    assert grid._dom_classes == ("pgnb-lanes",)
    assert [lane._dom_classes for lane in lanes] == [("pgnb-lane", "pgnb-lane-0"), ("pgnb-lane", "pgnb-lane-1")]
    assert "hello" in lanes[0].children[1].value and "running 1 s" in lanes[0].children[0].value
    sent.clear()
    time.sleep(draw_every(2))  # the view draws at most ten times a second (for 2 lanes)
    view.update([OutputEvent(1, "stdout", "tick\n")], running)  # the same states; rank 1 printed a line
    changed = [json.dumps(msg["state"]) for w, msg in sent if w is not title]  # (the title's clock moves)
    assert len(changed) == 1 and "data-rank='1'" in changed[0] and "tick" in changed[0], changed
    sent.clear()
    time.sleep(draw_every(2))
    view.update([], [RankProgress(0, "running", 1.7), RankProgress(1, "failed", 0.6, ename="ValueError")])
    changed = [json.dumps(msg["state"]) for w, msg in sent if w is not title]
    assert len(changed) == 1 and "failed (ValueError)" in changed[0], changed  # rank 1's state line only
    parts = [grid, *(w for lane in lanes for w in (lane, *lane.children))]
    view.finish(None)
    assert view.box.children == (title,) and "stopped" in title.value
    assert all(w.comm is None for w in parts)  # the grid's widgets are closed, not left in the kernel
    assert len(shown) == 1  # drawn once


def test_a_view_of_64_lanes_draws_less_of_each_and_less_often(monkeypatch):
    """64 ranks printing at LiveCell's rate: each lane draws its last 4 lines, 2.5 times a second."""
    InteractiveShell.instance()
    sent = []
    monkeypatch.setattr(W.Widget, "_send", lambda self, msg, buffers=None: sent.append(len(json.dumps(msg))))
    assert (shown_lines(4), shown_lines(64)) == (40, 4) and (draw_every(4), draw_every(64)) == (0.1, 0.4)
    view = LiveView(list(range(64)), show=lambda obj, **kw: None)
    t0 = time.monotonic()
    for step in range(20):  # two seconds of updates, ten a second, every rank printing a line each time
        view.update([OutputEvent(r, "stdout", f"step {step}\n") for r in range(64)],
                    [RankProgress(r, "running", time.monotonic() - t0) for r in range(64)])
        time.sleep(0.1)
    seconds = time.monotonic() - t0
    title, grid = view.box.children
    assert len(sent) / seconds < 64 * 2 * 3  # two parts a lane, about 2.5 drawings a second (10 before)
    assert sum(sent) / seconds < 100_000  # bytes a second to the browser
    assert grid.children[0].children[1].value.count("step ") == 4  # the last four lines of rank 0
    view.finish(None)


def test_a_quick_cell_shows_no_live_view(monkeypatch):
    """A cell that ends before the first update: no widget, nothing displayed (a drawn view keeps nothing either)."""
    InteractiveShell.instance()
    made = []
    init = W.Widget.__init__
    monkeypatch.setattr(W.Widget, "__init__", lambda self, **kw: (made.append(type(self).__name__), init(self, **kw)))
    shown = []
    view = LiveView([0, 1, 2], show=lambda obj, **kw: shown.append((obj, kw)))
    view.update([OutputEvent(0, "stdout", "hi\n")], [RankProgress(r, "finished", 0.01) for r in range(3)])
    view.finish(CellResult([RankOutput(r) for r in range(3)], world=3))
    assert made == [] and view.box is None and shown == []


# ---- the stream, from Python -----------------------------------------------------------------
@pytest.mark.integration
def test_on_output_streams_each_rank_as_it_prints(world4):
    got = []
    t0 = time.monotonic()
    res = world4.execute(TICKS.format(n=4, every=0.5), on_output=lambda r, s, d: got.append(
        (time.monotonic() - t0, r, s, d)))
    took = time.monotonic() - t0
    assert res.error() is None and took > 1.9
    first = {r: min(t for t, rr, s, d in got if rr == r and "tick 0" in d) for r in range(4)}
    assert max(first.values()) < 1.0, first  # each rank's first line long before the cell ends
    for r in range(4):  # everything arrived, in order within the rank
        assert "".join(d for _, rr, s, d in got if rr == r and s == "stdout") == "".join(
            f"tick {i}\n" for i in range(4))
    assert res.text() == "".join(f"[rank {r}]\n" + "".join(f"tick {i}\n" for i in range(4)) for r in range(4))


@pytest.mark.integration
def test_a_tqdm_bar_on_every_rank_is_kept_in_one_deterministic_form(world4):
    texts = {world4.execute(BAR).text() for _ in range(3)}
    assert len(texts) == 1, texts
    text = texts.pop()
    for r in range(4):
        assert f"rank {r}: 100%|" in text and "20/20" in text
    assert "it/s" not in text and "\r" not in text


@pytest.mark.integration
def test_a_rank_blocked_in_a_collective_is_seen_waiting_without_trace_or_timeout(world4):
    seen: list[tuple[float, list[str]]] = []

    class Sink:
        def update(self, events, ranks):
            seen.append((time.monotonic() - t0, [p.text() for p in ranks]))

    t0 = time.monotonic()
    res = world4.run_cell("if rank == 0:\n    dist.all_reduce(torch.ones(1))\n", CellOptions(timeout=6),
                          CellHooks(output=Sink()))
    assert res.error() is not None  # rank 0 is still waiting at the --timeout
    first = next(t for t, states in seen if states[0].startswith("running") and "waiting in all_reduce" in states[0])
    assert first < 5.0, seen[-1]
    assert [s.startswith("finished") for s in seen[-1][1][1:]] == [True] * 3
    world4.execute("dist.all_reduce(torch.ones(1))", ranks=[1, 2, 3])  # release rank 0


# ---- the live view, in a real kernel -------------------------------------------------------------
def _run_timed(kernel, code: str, timeout: float = 120):
    """Execute ``code``; every iopub message for it with the seconds since the request, and the reply."""
    t0 = time.monotonic()
    msg_id = kernel.kc.execute(code)
    msgs = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append((time.monotonic() - t0, msg))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kernel.kc.get_shell_msg(timeout=timeout)
    return msgs, reply["content"]


def _kept(msgs) -> list:
    """What the notebook keeps of a cell (nbval's view): streams and display_data/execute_result bundles,
    widget model ids left out."""
    out = []
    for _, m in msgs:
        if m["msg_type"] == "stream":
            out.append(("stream", m["content"]["name"], m["content"]["text"]))
        elif m["msg_type"] in ("display_data", "execute_result"):
            data = {k: v for k, v in m["content"]["data"].items() if k != "application/vnd.jupyter.widget-view+json"}
            out.append((m["msg_type"], json.dumps(data, sort_keys=True)))
    return out


@pytest.mark.integration
@pytest.mark.kernel
def test_the_frontend_gets_each_ranks_first_tick_at_once_and_the_kept_output_is_the_same_every_run(kernel4):
    kept = set()
    for run in range(5):
        msgs, reply = _run_timed(kernel4, "%%pg\n" + TICKS.format(n=10, every=0.5))
        assert reply["status"] == "ok"
        end = msgs[-1][0]
        assert end > 4.5
        live = [(t, json.dumps(m["content"])) for t, m in msgs if m["msg_type"].startswith("comm")]
        for r in range(4):
            first = min(t for t, text in live if f"data-rank='{r}'" in text and "tick 0" in text)
            assert first < 1.0, (run, r, first)
        kept.add(json.dumps(_kept(msgs)))
    assert len(kept) == 1
    outputs = json.loads(kept.pop())
    assert outputs[0] == ["display_data", "{}"]  # the drawn view: its widget alone, which nbval skips
    assert outputs[1] == ["stream", "stdout", "".join(
        f"[rank {r}]\n" + "".join(f"tick {i}\n" for i in range(10)) for r in range(4))]


@pytest.mark.integration
@pytest.mark.kernel
def test_the_live_view_shows_a_blocked_rank_waiting_and_collapses_when_the_cell_ends(kernel4):
    msgs, reply = _run_timed(kernel4, "%%pg --timeout 7\nif rank == 0:\n    dist.all_reduce(torch.ones(1))\n")
    assert reply["status"] == "error"
    live = [(t, json.dumps(m["content"])) for t, m in msgs if m["msg_type"].startswith("comm")]
    waiting = [t for t, text in live if "waiting in all_reduce" in text]
    assert waiting and waiting[0] < 5.0
    # the view collapsed to its summary line: lanes closed, one line that says how each rank ended
    assert any("rank 0 still running" in text and "ranks 1-3 finished" in text for _, text in live)
    released, reply = _run_timed(kernel4, "%%pg --ranks 1-3\ndist.all_reduce(torch.ones(1))\n")
    assert reply["status"] == "ok"


@pytest.mark.integration
@pytest.mark.kernel
def test_a_rank_lost_while_streaming_is_shown_lost_and_what_arrived_is_kept(kernel4):
    msgs, reply = _run_timed(kernel4, "%%pg\nimport os, time\nprint('before', rank, flush=True)\ntime.sleep(1.5)\n"
                                     "if rank == 1:\n    os._exit(1)\nprint('after', rank)\n")
    assert reply["status"] == "error"
    live = [json.dumps(m["content"]) for _, m in msgs if m["msg_type"].startswith("comm")]
    assert any("data-rank='1'" in text and "before 1" in text for text in live)  # streamed before it died
    assert any("rank 1 lost" in text for text in live)  # the collapsed summary
    kept = "".join(m["content"]["text"] for _, m in msgs
                   if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
    assert "[rank 1]\nbefore 1\n" in kept and "before 0\nafter 0\n" in kept
    assert "rank 1 lost" in reply["evalue"]
    assert _run_timed(kernel4, "%pg_init --backend gloo --world 4 --force")[1]["status"] == "ok"


# ---- a terminal ------------------------------------------------------------------------------------
@pytest.mark.integration
def test_a_terminal_shows_lines_as_they_come_prefixed_by_rank(tmp_path):
    script = tmp_path / "live.ipy"
    # a script runs as one cell, where %%pg cannot start a line: call the cell magic as IPython would
    cell = TICKS.format(n=4, every=0.5) + "rank * 10\n"
    script.write_text(f"%load_ext pgnb\n%pg_init --world 2\nget_ipython().run_cell_magic('pg', '', {cell!r})\n")
    ipython = os.path.join(os.path.dirname(sys.executable), "ipython")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    proc = subprocess.Popen([ipython, "--no-banner", "--colors=NoColor", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=120) == 0, lines
    text = [ln for _, ln in lines]
    for r in range(2):
        assert [ln for ln in text if ln.startswith(f"[rank {r}] tick")] == [f"[rank {r}] tick {i}" for i in range(4)]
        assert f"Out[rank {r}]: {r * 10}" in text  # values still follow the stream
    assert "tick 0" not in text  # the grouped text is not printed a second time
    ticks = [t for t, ln in lines if "] tick 0" in ln]
    last = [t for t, ln in lines if "] tick 3" in ln]
    assert max(last) - min(ticks) > 1.0  # lines came as they were printed, not all at the end
