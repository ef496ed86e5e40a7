"""Ranks that run while another is stopped, as Lab's Call Stack shows them: read-only frames of pgnb's stack.

A rank blocked in a collective waiting for a stopped peer cannot be paused (gloo
waits in native code), so pydevd has no frame of it. pgnb's own stack of it
(``pgnb.core.stacks``: the cell's lines and the call it waits in) becomes a
labelled frame per line, on the file and line the rank's stack dump gives it; its
one scope says it is running.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..core.rendezvous import EngineInfo
from ..core.stacks import NO_CELL_CODE, Place, dump_stacks
from .ids import Ids

#: A cell's frame in pgnb's stack text: ``  Cell, line 5`` or ``  Cell, line 3, in f``.
_CELL_LINE = re.compile(r"^\s*Cell, line (\d+)")


def blocked_frames(running: Mapping[int, EngineInfo], stack_dir: str, code: str, cell_file: str, ids: Ids,
                   first: int) -> list[dict[str, Any]]:
    """Each running rank's stack (``first`` first, then by rank): a heading frame, then its frames, innermost first.

    Every frame has a ``source`` (Lab's Call Stack draws none without one): the cell's own lines are on the
    cell's file, so clicking one shows its line; the others on their own file and line where the file is on
    this machine (a library's, an earlier cell's); the heading on the innermost frame's (where the rank waits)."""
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
        texts = [t for t in reversed(stack.frames) if not t.startswith("    ")]
        places: list[Place | None] = [*reversed(stack.places)]
        if len(places) != len(texts):  # a Stack made without them
            places = [None] * len(texts)
        wheres = [_where(r, text, place, cell_file) for text, place in zip(texts, places, strict=True)]
        heading = wheres[0] if wheres else {"source": {"name": f"rank {r}"}, "line": 0}
        out.append({"id": ids.local(r, "blocked", 0), "name": head, "column": 0, "presentationHint": "label",
                    **heading})
        for i, (text, where) in enumerate(zip(texts, wheres, strict=True)):
            out.append({"id": ids.local(r, "blocked", i + 1), "name": f"rank {r}: {text.strip()}", "column": 0,
                        "presentationHint": "subtle", **where})
    return out


def _where(rank: int, text: str, place: Place | None, cell_file: str) -> dict[str, Any]:
    """A frame's ``source`` and ``line``: the cell's line on the kernel's file of the cell, another frame's own."""
    in_cell = _CELL_LINE.match(text)
    if in_cell:
        return {"source": {"name": f"rank {rank}", "path": cell_file}, "line": int(in_cell[1])}
    if place is not None and os.path.isfile(place.path):
        return {"source": {"name": os.path.basename(place.path), "path": place.path}, "line": place.line}
    return {"source": {"name": f"rank {rank}"}, "line": 0}


def blocked_view(command: str, rank: int, remote: int, ids: Ids) -> dict[str, Any]:
    """What Lab's request about a running rank's frame gets: one scope, one variable saying what it is."""
    if command == "scopes":
        return {"scopes": [{"name": f"rank {rank} (running, not stopped)", "expensive": False,
                            "variablesReference": ids.local(rank, "blocked-vars", remote)}]}
    if command == "variables":
        note = "read-only: this rank runs; it is shown where it waits while another rank is stopped"
        return {"variables": [{"name": "state", "value": note, "variablesReference": 0}]}
    return {"result": f"rank {rank} is running, not stopped: nothing to evaluate there", "variablesReference": 0}
