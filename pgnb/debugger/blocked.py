"""Ranks that run while another is stopped, as Lab's Call Stack shows them: read-only frames of pgnb's stack.

A rank blocked in a collective waiting for a stopped peer cannot be paused (gloo
waits in native code), so pydevd has no frame of it. pgnb's own stack of it
(``pgnb.core.stacks``: the cell's lines and the call it waits in) becomes a
labelled frame per line; its one scope says it is running.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..core.rendezvous import EngineInfo
from ..core.stacks import NO_CELL_CODE, dump_stacks
from .ids import Ids

#: A cell's frame in pgnb's stack text: ``  Cell, line 5`` or ``  Cell, line 3, in f``.
_CELL_LINE = re.compile(r"^\s*Cell, line (\d+)")


def blocked_frames(running: Mapping[int, EngineInfo], stack_dir: str, code: str, cell_file: str, ids: Ids,
                   first: int) -> list[dict[str, Any]]:
    """Each running rank's stack (``first`` first, then by rank): a heading frame, then its frames, innermost first.

    Every frame has a ``source`` (Lab's Call Stack draws none without one): the cell's own lines are on the
    cell's file, so clicking one shows its line; the rest are named after their rank."""
    out: list[dict[str, Any]] = []
    stacks = dump_stacks(running, stack_dir, code)
    for r in sorted(stacks, key=lambda r: (r != first, r)):
        stack = stacks[r]
        if stack.blocked_in:
            head = f"rank {r}: running, waiting in {stack.blocked_in}"
        elif stack.note == NO_CELL_CODE:
            head = f"rank {r}: done with the cell"
        else:
            head = f"rank {r}: running ({stack.note})" if stack.note else f"rank {r}: running"
        label = {"name": f"rank {r}"}
        out.append({"id": ids.local(r, "blocked", 0), "name": head, "line": 0, "column": 0, "source": label,
                    "presentationHint": "label"})
        for i, text in enumerate(t for t in reversed(stack.frames) if not t.startswith("    ")):
            in_cell = _CELL_LINE.match(text)
            where = ({"source": {"name": f"rank {r}", "path": cell_file}, "line": int(in_cell[1])} if in_cell
                     else {"source": label, "line": 0})
            out.append({"id": ids.local(r, "blocked", i + 1), "name": f"rank {r}: {text.strip()}", "column": 0,
                        "presentationHint": "subtle", **where})
    return out


def blocked_view(command: str, rank: int, remote: int, ids: Ids) -> dict[str, Any]:
    """What Lab's request about a running rank's frame gets: one scope, one variable saying what it is."""
    if command == "scopes":
        return {"scopes": [{"name": f"rank {rank} (running, not stopped)", "expensive": False,
                            "variablesReference": ids.local(rank, "blocked-vars", remote)}]}
    if command == "variables":
        note = "read-only: this rank runs; it is shown where it waits while another rank is stopped"
        return {"variables": [{"name": "state", "value": note, "variablesReference": 0}]}
    return {"result": f"rank {rank} is running, not stopped: nothing to evaluate there", "variablesReference": 0}
