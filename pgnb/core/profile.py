"""``%%pg --profile``: one cell's profile on every rank (a pure model) and the merged trace file's form.

``merge`` makes the ranks' Chrome traces one: one process per rank (``pid`` =
the rank, named ``rank N``), every time moved onto the kernel's clock with
the rank's measured offset, so the ranks line up in Perfetto
(ui.perfetto.dev) or chrome://tracing. ``pgnb.core.profile_run`` runs the
profilers and calls it.

``Profile`` is what the notebook shows: per rank, names and counts in a
deterministic text (nbval compares it); the times (ops by self time,
communication vs computation, peak memory) are in its HTML
(``pgnb.notebook.profile``) and in the file.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from .._wire import ProfileSummary
from .text import ranks_text
from .trace import ClockOffset

#: Where merged profiles go by default, relative to the kernel's working directory (the notebook's).
PROFILE_DIR = "pgnb-profiles"
#: Op names the text shows per rank (the most called).
MOST_CALLED = 3


_profiled = itertools.count(1)


def default_path() -> str:
    """``pgnb-profiles/profile-3.json`` for the third profiled cell since the kernel started.

    The same on every run of a notebook from a fresh kernel, nbval's replays included (a cell's
    execution count is not: nbval runs cells without history, so every count is 1 there).
    """
    return os.path.join(PROFILE_DIR, f"profile-{next(_profiled)}.json")


@dataclass
class Profile:
    """The profile of one cell: each rank's summary, and the merged trace file."""

    ranks: list[int]
    summaries: dict[int, ProfileSummary]  # ranks that were profiled
    missing: dict[int, str] = field(default_factory=dict)  # rank -> why it has no profile
    path: str | None = None  # the merged Chrome trace (None: nothing to write)
    offsets: dict[int, ClockOffset] = field(default_factory=dict)

    # -- facts --
    def ops(self, rank: int) -> int:
        return sum(self.summaries[rank].get("counts", {}).values())

    def most_called(self, rank: int, n: int = MOST_CALLED) -> list[tuple[str, int]]:
        counts = self.summaries[rank].get("counts", {})
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    # -- text --
    def header(self) -> str:
        head = f"profile of {ranks_text(self.ranks)}"
        if self.path is None:
            return head + ": no trace file (no rank was profiled)"
        return (f"{head}: {self.path} (one process per rank, on one clock; "
                "open it in ui.perfetto.dev or chrome://tracing)")

    def text(self) -> str:
        """Names and counts only: the same on every run of the same cell."""
        table = [["rank", "ops", "collectives", "most called"]]
        for r in self.ranks:
            if r in self.summaries:
                s = self.summaries[r]
                called = ", ".join(f"{name} ×{n}" for name, n in self.most_called(r))
                table.append([str(r), str(self.ops(r)), str(s.get("collectives", 0)), called])
            else:
                table.append([str(r), "-", "-", f"(no profile: {self.missing.get(r, 'not profiled')})"])
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = [self.header()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        if self.summaries:
            lines.append("(times: ops by self time, communication vs computation, peak memory: "
                         "in the HTML view and the file)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.text()}


def merge(traces: dict[int, dict[str, Any]], summaries: dict[int, ProfileSummary],
          offsets: dict[int, ClockOffset]) -> dict[str, Any]:
    """One Chrome trace: a process per rank (pid = rank), times in µs on the kernel's clock from the
    earliest event. Each rank's profiler clock is tied to its trace clock by the start marker
    (else by the trace's ``baseTimeNanoseconds``), then corrected by the rank's offset."""
    shifted: list[tuple[int, dict[str, Any], float]] = []  # rank, event, shift (µs to kernel epoch)
    for r, trace in sorted(traces.items()):
        s = summaries[r]
        off = offsets[r].correction if r in offsets else 0.0
        marker = s.get("marker_ts")
        if marker is not None:
            shift = (float(s.get("marker_clock", 0.0)) - off) * 1e6 - float(marker)
        else:
            shift = float(trace.get("baseTimeNanoseconds", 0)) / 1e3 - off * 1e6
        shifted.extend((r, e, shift) for e in trace.get("traceEvents", []))
    times = [float(e["ts"]) + shift for _, e, shift in shifted if "ts" in e and e.get("ph") != "M"]
    zero = min(times) if times else 0.0
    events: list[dict[str, Any]] = []
    for r, e, shift in shifted:
        e = dict(e, pid=r)
        if "ts" in e:
            e["ts"] = max(0.0, float(e["ts"]) + shift - zero)
        if e.get("ph") == "M":
            name = e.get("name")
            if name == "process_name":
                e["args"] = {"name": f"rank {r}"}
            elif name == "process_sort_index":
                e["args"] = {"sort_index": r}
            elif name == "process_labels":
                e["args"] = {"labels": f"pid {summaries[r].get('pid', '?')}"}
        events.append(e)
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": int(zero * 1e3),
            "otherData": {"pgnb": "one process per rank (pid = rank); times on the notebook kernel's clock",
                          "clock_offsets_s": {str(r): offsets[r].correction for r in sorted(offsets)}}}
