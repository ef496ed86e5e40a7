"""A status query: every rank asked, at once, what torch says about it (``World.status``).

Ranks whose engine is gone, or that are still running earlier work (they would
answer only after it), are not asked: their rows say so instead. Each asked
rank gets the same deadline; one that does not answer in time is said to be
busy, not lost.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from .._wire import RankReport
from ..rank import engine
from ..spec import WorldSpec
from .busy import Busy
from .remote import error_line, outcome
from .rendezvous import EngineInfo
from .rendezvous_run import shown_backend
from .sending import send
from .snapshot import RankStatus


def ask_ranks(spec: WorldSpec, client: Any, infos: list[EngineInfo], rows: list[RankStatus], busy: Busy,
              lost: dict[int, str], timeout: float) -> list[RankStatus]:
    """``rows`` (one per rank of ``infos``) brought up to date by asking each rank, within ``timeout`` s."""
    alive = set(client.ids)
    # a rank still running earlier work would answer only after it: say so instead of asking
    # (as long as asking it would take: a cell that ends meanwhile, e.g. after a lost peer, is not busy)
    busy_ranks = set(busy.still_running(range(len(infos)), [e.engine_id for e in infos], client, settle=timeout))
    ars = dict(send(client, [(r, e.engine_id) for r, e in enumerate(infos)
                             if e.engine_id in alive and r not in lost and r not in busy_ranks], engine.rank_status))
    deadline = time.monotonic() + timeout
    rows = list(rows)
    for r in range(len(infos)):
        entry = busy.entry(r) if r in busy_ranks else None
        if entry is not None:
            rows[r] = replace(rows[r], error=f"busy: still running {entry.what}")
            continue
        if r not in ars:
            rows[r] = replace(rows[r], state="lost", error=lost.get(r, "engine process is gone"))
            continue
        try:
            res: RankReport = ars[r].get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            if outcome(exc) == "lost":
                rows[r] = replace(rows[r], state="lost", error=error_line(exc))
            else:
                rows[r] = replace(rows[r], error=f"did not answer within {timeout:g} s (busy?)")
            continue
        if res["initialized"]:
            rows[r] = replace(rows[r], state="initialized", error="", backend=shown_backend(spec, res),
                              world_size=res["world_size"], device=res["device"])
        elif rows[r].state == "initialized":
            rows[r] = replace(rows[r], state="destroyed", error="")
    return rows
