"""The ids JupyterLab sees for the ranks' threads, frames and variables (pure).

Lab holds one debug session per kernel, whose ids (threads, frames, variable
references) must not collide with those of the kernel's own debugpy. A rank is
the thread ``RANK_THREAD + rank``; a rank's frame or variable reference gets a
fresh id from ``Ids`` (counted from ``FIRST_ID``, below any address CPython uses
for an ``id()``, which is what debugpy hands out, and exact in JavaScript).
"""

from __future__ import annotations

import itertools
import threading
from typing import Literal

#: The thread id of rank 0; rank N is ``RANK_THREAD + N``.
RANK_THREAD = 1 << 20
#: The first id ``Ids`` gives.
FIRST_ID = 1 << 32
#: What an id stands for: a frame, scope (a frame's Locals or Globals) or other variable reference of a stopped
#: rank's pydevd, or pgnb's read-only view of a rank that is running (blocked) while another is stopped.
Kind = Literal["frame", "scope", "vars", "blocked", "blocked-vars"]


def rank_thread(rank: int) -> int:
    return RANK_THREAD + rank


def thread_rank(thread_id: object) -> int | None:
    """The rank of a thread id, or None when the id is the kernel's own."""
    if isinstance(thread_id, int) and RANK_THREAD <= thread_id < FIRST_ID:
        return thread_id - RANK_THREAD
    return None


class Ids:
    """Local id <-> (rank, kind, the rank's own id). A rank's ids are forgotten when it runs on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = itertools.count(FIRST_ID)
        self._to: dict[int, tuple[int, Kind, int]] = {}
        self._from: dict[tuple[int, Kind, int], int] = {}

    def local(self, rank: int, kind: Kind, remote: int) -> int:
        key = (rank, kind, remote)
        with self._lock:
            found = self._from.get(key)
            if found is None:
                found = self._from[key] = next(self._next)
                self._to[found] = key
            return found

    def remote(self, local: object) -> tuple[int, Kind, int] | None:
        if not isinstance(local, int) or local < FIRST_ID:
            return None
        with self._lock:
            return self._to.get(local)

    def forget(self, rank: int) -> None:
        with self._lock:
            for key in [k for k in self._from if k[0] == rank]:
                del self._to[self._from.pop(key)]
