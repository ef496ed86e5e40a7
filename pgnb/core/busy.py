"""The one busy registry: which ranks still run something pgnb sent them earlier.

A rank left running by a ``--timeout``, by an interrupt it could not obey
(a gloo collective ignores SIGINT) or by ``Sandbox.run(timeout=...)`` would
queue anything sent to it behind that work. Every entry point that talks to
the ranks asks the registry first (``World.check_idle``), so it can refuse at
once instead of hanging.

The registry asks before it refuses: a recorded entry is dropped as soon as
its result has arrived, and a result that is on its way (the rank was just
released by the ranks it waited for, and is sending its reply) gets a short,
bounded wait (``SETTLE``). Only a rank that is still running then counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Seconds pgnb waits for a recorded rank's result to arrive before calling the rank busy.
#: A released rank raises its pending KeyboardInterrupt, formats its traceback and replies:
#: tens of milliseconds on an idle machine, a few hundred under load.
SETTLE = 1.0


@dataclass(frozen=True)
class BusyEntry:
    """What one rank was left running."""

    engine_id: int
    result: Any  # the ipyparallel AsyncResult of that work
    client: Any  # the Client that sent it: after a restart its results never arrive
    what: str  # how a message names it: "cell In [12]", "an earlier cell", "run(pull_value)"
    code: str = ""  # the cell's source, for its stack lines


class Busy:
    """``rank -> BusyEntry`` for ranks still running earlier work."""

    def __init__(self) -> None:
        self._entries: dict[int, BusyEntry] = {}

    def add(self, rank: int, entry: BusyEntry) -> None:
        self._entries[rank] = entry

    def clear(self) -> None:
        """Forget everything (the engines were restarted: nothing of theirs is running)."""
        self._entries.clear()

    def entry(self, rank: int) -> BusyEntry | None:
        return self._entries.get(rank)

    def still_running(self, ranks: Iterable[int], engine_ids: list[int], client: Any,
                      settle: float = SETTLE) -> list[int]:
        """Of ``ranks``, those really still running their recorded work, after at most ``settle`` s.

        ``engine_ids`` and ``client`` are the world's now: an entry for another engine (the
        rank's engine was replaced) or another client (the world was restarted) is stale.
        """
        self._drop_stale(engine_ids, client)
        chosen = [r for r in ranks if r in self._entries]
        deadline = time.monotonic() + settle
        while chosen:
            waiting = [r for r in chosen if not self._entries[r].result.ready()]
            for r in set(chosen) - set(waiting):
                del self._entries[r]
            chosen = waiting
            left = deadline - time.monotonic()
            if not chosen or left <= 0:
                break
            self._entries[chosen[0]].result.wait(min(left, 0.05))
        return sorted(chosen)

    def _drop_stale(self, engine_ids: list[int], client: Any) -> None:
        for r in list(self._entries):
            e = self._entries[r]
            if r >= len(engine_ids) or engine_ids[r] != e.engine_id or e.client is not client:
                del self._entries[r]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rank: object) -> bool:
        return rank in self._entries
