"""Recording a traced cell: each rank's clock offset, and reading the ranks' records back.

``measure_offsets`` measures each rank's clock offset from the kernel's, NTP
style: the kernel reads its clock, asks the rank for its clock (an apply
round trip), reads its clock again; of several round trips the shortest is
trusted, offset = rank clock - midpoint, uncertain by half the round trip.
Every traced time is corrected by it, so ranks on hosts whose clocks differ
still line up.

A rank stuck in a collective cannot answer the kernel, so ranks on this host
write their records to a file in the world's 0700 directory and the kernel
reads it directly; that is how a ``--timeout`` still shows the trace up to
the hang. A rank on another host keeps its records in memory and they are
fetched once it is free.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from .._wire import TraceArgs, TraceRecord
from ..rank import trace as rank_trace
from .dispatch import Dispatch
from .sending import send
from .trace import Call, ClockOffset, Trace, calls_from_records

#: Round trips per rank when measuring its clock offset (the shortest one is used).
OFFSET_SAMPLES = 5
#: Seconds one clock round trip may take before the rank counts as not answering.
OFFSET_TIMEOUT = 5.0
#: Seconds to wait for the records of a rank on another host (it must be idle to answer).
FETCH_TIMEOUT = 5.0


def measure_offsets(world: Dispatch, ranks: Iterable[int] | None = None,
                    samples: int = OFFSET_SAMPLES) -> dict[int, ClockOffset]:
    """Each rank's clock offset from the kernel's, measured over ``samples`` apply round trips.

    All ranks are asked at once, round after round. The kernel-side times of a
    round trip are the Client's own stamps (when the request was built, when
    the reply arrived on its I/O thread), so a slow wake-up of this thread does
    not count as network delay.
    """
    pairs = world.engines_for(None if ranks is None else list(ranks))
    best: dict[int, tuple[float, float]] = {}  # rank -> (round trip, offset)
    count = dict.fromkeys((r for r, _ in pairs), 0)
    alive = dict(pairs)
    for _ in range(samples):
        t0 = time.time()
        asked = list(send(world.client, alive.items(), rank_trace.clock))
        for r, ar in asked:
            try:
                theirs = float(ar.get(timeout=OFFSET_TIMEOUT))
            except Exception:  # busy or gone: no more samples from this rank
                alive.pop(r, None)
                continue
            t3 = time.time()
            sent, got = _stamp(ar, "submitted", t0), _stamp(ar, "received", t3)
            if not sent <= got:
                sent, got = t0, t3
            count[r] += 1
            sample = (got - sent, theirs - (sent + got) / 2)
            if r not in best or sample[0] < best[r][0]:
                best[r] = sample
    return {r: ClockOffset(r, best[r][1], best[r][0] / 2, count[r]) if r in best
            else ClockOffset(r, 0.0, math.inf, 0) for r, _ in pairs}


def _stamp(ar: Any, key: str, fallback: float) -> float:
    """An AsyncResult's metadata time (a datetime) as epoch seconds, or ``fallback``."""
    import datetime

    value = getattr(ar, key, None)
    return float(value.timestamp()) if isinstance(value, datetime.datetime) else fallback


class Recording:
    """One traced cell: the offsets measured before it, the file names, and reading them back."""

    def __init__(self, world: Dispatch, ranks: Iterable[int] | None = None, trace_dir: str | None = None) -> None:
        """``ranks`` default to all; ``trace_dir`` to the world's own directory (None: as on another host)."""
        self.world = world
        self.ranks = list(range(len(world.engine_ids))) if ranks is None else list(ranks)
        self.dir = world.scratch_dir if trace_dir is None else trace_dir
        self.token = uuid.uuid4().hex[:12]
        self.offsets = measure_offsets(world, self.ranks)

    def name(self, rank: int) -> str:
        return f"trace-{self.token}-{rank}.jsonl"

    def engine_args(self, rank: int) -> TraceArgs:
        """The ``trace=`` argument of ``pgnb.rank.cell.run_cell`` for ``rank``."""
        return {"trace_dir": self.dir, "name": self.name(rank), "meta": {"rank": rank}}

    def collect(self, running: list[int]) -> Trace:
        """Read every rank's records (a running rank's from its file; it cannot answer)."""
        running = sorted(running)
        calls: dict[int, list[Call]] = {}
        began: dict[int, float] = {}
        unreadable: dict[int, str] = {}
        read_at = time.time()
        for r in self.ranks:
            records = self._records(r, running)
            if records is None:
                unreadable[r] = ("it runs on another host and is still busy" if r in running
                                 else "its records could not be read")
                continue
            off = self.offsets.get(r)
            calls[r], start = calls_from_records(r, records, off.correction if off else 0.0)
            if start is not None:
                began[r] = start
        return Trace(self.ranks, calls, offsets=self.offsets, running=running, began=began, read_at=read_at,
                     unreadable=unreadable)

    def _records(self, rank: int, running: list[int]) -> list[TraceRecord] | None:
        path = None if self.dir is None else os.path.join(self.dir, self.name(rank))
        if path is not None and os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            out = []
            for line in data.split(b"\n"):
                if line.strip():
                    with contextlib.suppress(ValueError):  # a line being written right now
                        out.append(json.loads(line))
            return out
        if rank in running:
            return None
        try:  # a rank on another host kept them in memory
            eid = self.world.engine_ids[rank]
            return list(self.world.client[eid].apply_async(rank_trace.take).get(timeout=FETCH_TIMEOUT))
        except Exception:
            return None
