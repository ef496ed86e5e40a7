"""``%%pg --profile``: torch.profiler on every rank, one merged Chrome trace, a deterministic summary.

The merge and the text are tested on traces made here (no engines); the real
thing on the session's shared world of 4, two of its ranks, through the magic
and the API. "Off" is checked structurally: before a profiled cell no rank has
loaded pgnb's profiler module or has a profiler running, and after it none runs.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import pg
from ipywidgets.widgets.widget import _instances

from pgnb.core.profile import Profile, merge
from pgnb.core.sandbox import dispatch_of
from pgnb.core.trace import ClockOffset
from pgnb.notebook.profile import ProfileView
from pgnb.rank import trace as rank_trace


def _summary(marker_ts, marker_clock, counts=None):
    return {"ok": True, "counts": counts or {"aten::mm": 3, "c10d::allreduce_": 3, "aten::add": 1},
            "top": [["aten::mm", 3, 900.0]], "comm_us": 500.0, "collectives": 3, "compute_us": 1000.0,
            "peak_bytes": 4096, "marker_ts": marker_ts, "marker_clock": marker_clock, "pid": 100}


def _trace(pid, marker_ts):
    return {"traceEvents": [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": marker_ts,
                             "args": {"name": "python"}},
                            {"ph": "X", "name": "gloo:all_reduce", "pid": pid, "tid": 7, "ts": marker_ts + 1000.0,
                             "dur": 50.0}]}


def test_merge_puts_every_rank_on_the_kernels_clock_as_its_own_process():
    # two ranks whose profiler clocks differ wildly; rank 1's trace clock runs 5 s ahead of the kernel's
    summaries = {0: _summary(1.0e6, 100.0), 1: _summary(9.0e9, 105.0)}
    offsets = {0: ClockOffset(0, 0.0, 0.001, 5), 1: ClockOffset(1, 5.0, 0.001, 5)}
    merged = merge({0: _trace(11, 1.0e6), 1: _trace(22, 9.0e9)}, summaries, offsets)
    spans = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e["name"] == "gloo:all_reduce"}
    assert spans == {0: pytest.approx(0.0), 1: pytest.approx(0.0)}  # the same moment, on one clock
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    json.dumps(merged)  # a plain JSON document


def test_the_text_has_names_and_counts_only():
    p = Profile([0, 1, 2], {0: _summary(0.0, 0.0), 1: _summary(0.0, 0.0)}, {2: "still running"}, "p/cell-3.json")
    assert p.text() == (
        "profile of ranks 0-2: p/cell-3.json (one process per rank, on one clock; open it in ui.perfetto.dev "
        "or chrome://tracing)\n"
        "rank  ops  collectives  most called\n"
        "0     7    3            aten::mm ×3, c10d::allreduce_ ×3, aten::add ×1\n"
        "1     7    3            aten::mm ×3, c10d::allreduce_ ×3, aten::add ×1\n"
        "2     -    -            (no profile: still running)\n"
        "(times: ops by self time, communication vs computation, peak memory: in the HTML view and the file)")
    view = ProfileView(p)
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"] == p.text() and "900 µs" not in bundle["text/plain"]
    # the times travel in the widget's state, which nbval never compares (it does compare text/html)
    assert "text/html" not in bundle and "application/vnd.jupyter.widget-view+json" in bundle
    assert "aten::mm 0.9 ms ×3" in view.value and "4.0 KiB" in view.value
    view.close()


# ---- real ranks -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(world4):
    """The shared world of 4 drives conftest's ``ip`` shell here."""
    return world4


CHECK = "import sys\n('pgnb.rank.profile' in sys.modules, torch.autograd.profiler._is_profiler_enabled)"
CELL = "x = torch.randn(32, 32)\nfor _ in range(3):\n    dist.all_reduce(x @ x, group=pair)\n"


@pytest.mark.integration
def test_a_profiled_cell_on_two_ranks_writes_one_trace_through_magic_and_api(world4, ip, tmp_path, monkeypatch):
    assert world4.execute("pair = dist.new_group([0, 1])").error() is None  # the two ranks' own group
    assert world4.execute(CHECK).values == [(False, False)] * 4  # --profile off: nothing loaded, nothing on

    monkeypatch.chdir(tmp_path)
    cap, err = pg(ip, "--profile --ranks 0,1", CELL)
    assert err is None and cap.stderr == ""  # kineto's own log lines do not reach the cell
    view = cap.outputs[-1].data
    text = view["text/plain"]
    first = re.match(r"profile of ranks 0, 1: (pgnb-profiles/profile-(\d+)\.json) ", text)
    assert first, text  # the n-th profiled cell of this kernel: the same on every replay from a fresh kernel
    assert text.splitlines()[1].split() == ["rank", "ops", "collectives", "most", "called"]
    assert text.splitlines()[2].startswith("0") and " 3 " in text.splitlines()[2]  # three all-reduces
    assert "text/html" not in view and _instances[view["application/vnd.jupyter.widget-view+json"]["model_id"]]
    assert "in collectives" in _instances[view["application/vnd.jupyter.widget-view+json"]["model_id"]].value
    cap2, err2 = pg(ip, "--profile --ranks 0,1", "x = 1")
    assert err2 is None and f"profile-{int(first.group(2)) + 1}.json" in cap2.outputs[-1].data["text/plain"]
    with open(tmp_path / first.group(1)) as f:
        merged = json.load(f)
    events = merged["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}  # a process per rank
    assert {e["pid"] for e in events if e.get("name") == "aten::mm"} == {0, 1}
    assert world4.execute(CHECK).values == [(True, False), (True, False), (False, False), (False, False)]

    world4.run(rank_trace.set_clock_skew, 5.0, ranks=[1])  # rank 1's clock 5 s ahead: the merge still lines up
    try:
        path = tmp_path / "api.json"
        res = world4.execute(CELL, ranks=[0, 1], profile=str(path))
        assert res.error() is None and res.profile.path == str(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        ends = {}
        for e in events:
            if e.get("name") == "gloo:all_reduce":
                ends.setdefault(e["pid"], []).append(e["ts"] + e["dur"])
        assert sorted(ends) == [0, 1] and abs(max(ends[0]) - max(ends[1])) < 100_000  # µs: the last ends together
    finally:
        world4.run(rank_trace.set_clock_skew, 0.0)
    assert all(not enabled for _, enabled in world4.execute(CHECK).values)


@pytest.mark.integration
def test_a_rank_still_running_has_no_profile_and_its_profiler_stops_when_its_cell_ends(world4):
    res = world4.execute("import time\nif rank == 1:\n    time.sleep(2)", ranks=[0, 1], timeout=0.5,
                         profile=str(dispatch_of(world4).scratch_dir) + "/p.json")
    assert res.profile.missing == {1: "still running"} and list(res.profile.summaries) == [0]
    assert "1     -    -            (no profile: still running)" in res.profile.text()
    deadline = time.monotonic() + 10
    while dispatch_of(world4).busy.still_running([1], world4.engine_ids, world4.client) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(not enabled for _, enabled in world4.execute(CHECK).values)
