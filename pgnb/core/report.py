"""A world in words: the deterministic text forms of a ``Snapshot`` (no pids, hosts, ports or timings).

What nbval compares and a terminal shows: the status view's text form, the
report under a magic, ``pgnb demo``'s table.
"""

from __future__ import annotations

from .snapshot import Snapshot
from .text import ranks_text


def header_text(snap: Snapshot) -> str:
    return f"pgnb world: {snap.spec.describe()}"


def summary_text(snap: Snapshot) -> str:
    n = snap.spec.world
    counts: dict[str, int] = {}
    for r in snap.ranks:
        counts[r.state] = counts.get(r.state, 0) + 1
    parts = [f"{k} {s}" for s, k in sorted(counts.items(), key=lambda kv: kv[0]) if s != "initialized"]
    head = f"{snap.initialized}/{n} initialized"
    fresh = f"; {ranks_text(snap.fresh)} fresh (started empty, nothing run there yet)" if snap.fresh else ""
    return head + (f" ({', '.join(parts)})" if parts else "") + fresh


def status_table(snap: Snapshot) -> str:
    """The deterministic text form: the same facts every run, nothing machine-specific."""
    rows = [("rank", "world", "backend", "device", "state", "error")]
    for r in snap.ranks:
        rows.append((str(r.rank), str(r.world_size), r.backend, r.device or "-", r.state, r.error))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [f"{header_text(snap)} | {summary_text(snap)}"]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:5], widths, strict=True)]
        line = "  ".join(cells)
        if row[5]:
            line += "  " + row[5]
        lines.append(line.rstrip())
    if snap.note:
        lines.append(snap.note)
    return "\n".join(lines)
