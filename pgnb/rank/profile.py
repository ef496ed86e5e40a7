"""The rank side of ``%%pg --profile``: torch.profiler around one cell, a summary, the Chrome trace.

The kernel calls ``start`` on every rank just before it sends the cell (an
engine runs its requests in order, so the profiler is on when the cell
begins) and ``stop`` once the rank has finished it. Nothing is imported or
switched on otherwise: this module is loaded on a rank only by its first
profiled cell, and ``profiling()`` says whether a profile is running.

``stop`` exports the rank's Chrome trace into the kernel's 0700 directory
(or returns it, for a rank on another host) and summarizes it: op counts,
the ops with the most self time, time in the backend's collectives vs in
other ops, peak memory. A marker event at the start ties the profiler's
clock to ``pgnb.rank.trace.clock()``, whose offset from the kernel's the
kernel measures, so the kernel can put every rank on one clock.

Sent by reference to the engines; torch only inside the functions.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from .._wire import ProfileArgs, ProfileSummary
from .trace import clock

#: The name of the marker event ``start`` records (its time on ``pgnb.rank.trace.clock()`` is kept).
MARKER = "pgnb: profile start"
#: Ops whose names start so are communication; the backend's spans (gloo:, nccl:) are its
#: collectives as they ran, on the backend's threads.
COMM_SPANS = ("gloo:", "nccl:", "ucc:", "mpi:")
COMM_OPS = ("c10d::", "_c10d_functional::", "_c10d_functional_autograd::", "c10d_functional::",
            "record_param_comms", *COMM_SPANS)
#: Ops kept per rank, by self time (the summary's table; the file has them all).
TOP = 8
_STATE: dict[str, Any] = {}


def profiling() -> bool:
    """Whether this rank's profiler runs now (a profiled cell is running)."""
    return "prof" in _STATE


def start(args: ProfileArgs) -> None:
    """Start torch.profiler (CPU ops, memory) on this rank; stop an earlier one left running."""
    abandon()
    # kineto prints "USDT: <time> <pid> ... profiler_start" and "... profiler_stop" on stderr at
    # every start and stop (its USDT log level, 5, is above ERROR, 4): a cell's stderr would differ
    # on every run. Level 6 silences kineto's own log (read at its first use in the process);
    # a level the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile, record_function

    prof: Any = profile(activities=[ProfilerActivity.CPU], profile_memory=args.get("memory", True),
                        record_shapes=False, with_stack=False)
    prof.__enter__()
    with record_function(MARKER):
        _STATE["marker_clock"] = clock()
    _STATE["prof"] = prof


def abandon() -> None:
    """Stop a profiler left running by an earlier profiled cell that never ended (nothing kept)."""
    prof = _STATE.pop("prof", None)
    if prof is not None:
        with contextlib.suppress(Exception):
            prof.__exit__(None, None, None)


def stop(trace_dir: str | None, name: str) -> ProfileSummary:
    """Stop the profiler; write the Chrome trace to ``trace_dir/name`` (0600) or keep it in the
    summary (``trace_dir`` None or not on this host); return the summary."""
    prof = _STATE.pop("prof", None)
    if prof is None:
        return {"ok": False, "why": "no profile was running on this rank"}
    prof.__exit__(None, None, None)
    tmp = None
    path = None if trace_dir is None or not os.path.isdir(trace_dir) else os.path.join(trace_dir, name)
    try:
        if path is None:
            import tempfile

            fd, tmp = tempfile.mkstemp(suffix=".json")
            os.close(fd)
        target = path or tmp
        assert target is not None
        if path is not None:  # the kernel's directory: a 0600 file of ours, never a link planted there
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        prof.export_chrome_trace(target)
        with open(target) as f:
            trace = json.load(f)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    summary = summarize(trace, prof)
    summary["pid"] = os.getpid()
    summary["marker_clock"] = float(_STATE.pop("marker_clock", 0.0))
    if path is None:
        summary["trace"] = trace
    else:
        summary["path"] = path
    return summary


def summarize(trace: dict[str, Any], prof: Any) -> ProfileSummary:
    """Counts, top ops by self time, communication vs other time, peak memory, the marker's time."""
    counts: dict[str, int] = {}
    comm_us = 0.0
    collectives = 0
    peak = 0
    marker_ts = None
    for e in trace.get("traceEvents", []):
        name = str(e.get("name", ""))
        if e.get("ph") == "X":
            if name == MARKER:
                marker_ts = float(e["ts"])
                continue
            if name.startswith(COMM_SPANS):
                comm_us += float(e.get("dur", 0.0))
                collectives += 1
            if e.get("cat") == "cpu_op":
                counts[name] = counts.get(name, 0) + 1
        elif name == "[memory]":
            peak = max(peak, int((e.get("args") or {}).get("Total Allocated", 0)))
    top: list[list[Any]] = []
    compute_us = 0.0
    for avg in prof.key_averages():
        key = str(avg.key)
        if key == MARKER:
            continue
        self_us = float(avg.self_cpu_time_total)
        # a user annotation's self time (FSDP::all_gather, ...) is mostly waiting: not computation
        if not key.startswith(COMM_OPS) and key != "[memory]" and not getattr(avg, "is_user_annotation", False):
            compute_us += self_us
        top.append([key, int(avg.count), self_us])
    top.sort(key=lambda t: (-t[2], t[0]))
    return {"ok": True, "counts": counts, "top": top[:TOP], "comm_us": comm_us, "collectives": collectives,
            "compute_us": compute_us, "peak_bytes": peak, "marker_ts": marker_ts}
