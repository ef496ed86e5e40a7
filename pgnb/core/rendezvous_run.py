"""The rendezvous, run: ``init_process_group`` on every rank at once, under pgnb's own deadline.

``pgnb.core.rendezvous`` plans it (pure). A ``Rendezvous`` has rank 0 bind its
store's socket, sends each rank its plan, and waits on the results, turning
each rank's row ``initialized`` or ``failed`` as its result arrives. A rank (or
the controller) lost on the way never joins, and the others would wait for it
until torch's timeout: the wait ends ``LOST_GRACE`` seconds after the loss.
What did not make it is said in one line; what becomes of the engines then is
the world's (the ``recover`` it passes).
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .._wire import RankReport, RankState
from ..errors import RECOVER_HINT, InitError, InitTimeout, PgnbError, WorldBroken
from ..rank import engine
from ..spec import WorldSpec
from .health import Health
from .remote import error_line, outcome
from .rendezvous import EngineInfo, plans, store_bind
from .snapshot import RankStatus
from .text import lost_text, ranks_text

#: Extra seconds pgnb waits past torch's own timeout, so torch's clearer error wins when it fires (2 s: a rank
#: that gave up at its timeout still has to format and send its error, which takes over a second under load).
DEADLINE_SLACK = 2.0
#: Once a rank is lost, how long the other ranks get to finish on their own before pgnb stops
#: waiting: they may be blocked in a collective waiting for the lost rank.
LOST_GRACE = 1.0
#: Seconds between two looks at the world's health while the results are awaited (a result
#: wakes the wait at once; a death the watcher records does not).
LOOK = 0.05

#: ``publish(rows, **changes)``: the world shows these rows (and phase, message) to its views.
Publish = Callable[..., None]
#: ``recover(stuck, replace_stuck)``: the world leaves its engines so that the next init works.
Recover = Callable[[list[int], bool], None]


def shown_backend(spec: WorldSpec, res: RankReport) -> str:
    """The backend a rank's row shows: ``get_backend()`` says "undefined" for multi-device strings;
    the config says what runs where."""
    return res["backend_config"] if "," in spec.backend else res["backend"]


def row_from_init(spec: WorldSpec, row: RankStatus, ar: Any) -> RankStatus:
    """The row of a rank whose ``init_rank`` has returned (``ar``, ready)."""
    try:
        res: RankReport = ar.get(timeout=0)
    except Exception as e:
        state: RankState = "failed" if outcome(e) == "raised" else "lost"
        return replace(row, state=state, error=error_line(e))
    return replace(row, state="initialized", backend=shown_backend(spec, res), device=res["device"],
                   world_size=res["world_size"], init_seconds=res["init_seconds"])


def failure_message(rows: list[RankStatus], stuck: set[int], timeout: float) -> str:
    """One line for a failed rendezvous: each error once with the ranks that had it, then those that never joined."""
    parts = []
    errors = [r for r in rows if r.state in ("failed", "lost") and r.rank not in stuck]
    # the same error on many ranks is said once
    by_error: dict[str, list[int]] = {}
    for r in errors:
        by_error.setdefault(r.error, []).append(r.rank)
    for err, ranks in by_error.items():
        parts.append(f"{ranks_text(ranks)} failed: {err}")
    if stuck:
        parts.append(f"{ranks_text(sorted(stuck))} did not join within the {timeout:g} s timeout")
    return "init_process_group: " + "; ".join(parts) + f"; {RECOVER_HINT}"


class Rendezvous:
    """One ``init_process_group`` of the ranks ``ranks`` (engines in rank order) through ``client``."""

    def __init__(self, spec: WorldSpec, client: Any, ranks: list[EngineInfo], health: Health) -> None:
        self.spec = spec
        self._client = client
        self._ranks = ranks
        self._health = health
        #: each rank's ``AsyncResult`` of ``init_rank``, once sent
        self.results: list[Any] = []

    def listen(self, wait: Callable[[list[Any], float], None]) -> tuple[str, int]:
        """Rank 0 binds its store's socket; the address and port it listens on.

        ``InitError`` if it cannot; ``wait(results, timeout)`` raises what ends the wait early.
        """
        master = self._ranks[0]
        bind_addr, bind_port = store_bind(self.spec, master)
        try:
            listen = self._client[master.engine_id].apply_async(engine.listen_for_store, bind_addr, bind_port)
            wait([listen], self.spec.timeout)
            return bind_addr, int(listen.get(timeout=0))
        except PgnbError:
            raise
        except Exception as e:
            msg = f"rank 0 cannot listen on {bind_addr}:{bind_port} ({error_line(e)}); pick another port"
            raise InitError(msg, [0]) from None

    def send(self, wait: Callable[[list[Any], float], None], new_store: Callable[[], str]) -> None:
        """Rank 0's store socket (and ``new_store()``'s directory for a ``file://`` of pgnb's own), then
        every rank's ``init_rank`` at once (collectives need all ranks inside the call together).
        ``InitError`` if rank 0 cannot listen."""
        spec, store_dir = self.spec, None
        # a file:// world's rank 0 listens too: the inits cells make from MASTER_ADDR/PORT meet on that store
        master_addr, port = self.listen(wait)
        if spec.scheme == "file" and spec.init_url is None:
            store_dir = new_store()
        self.results = [self._client[e.engine_id].apply_async(engine.init_rank, p)
                        for e, p in zip(self._ranks, plans(spec, self._ranks, master_addr, port, store_dir,
                                                           uuid.uuid4().hex),
                                        strict=True)]

    def run(self, rows: list[RankStatus], publish: Publish, recover: Recover) -> None:
        """Wait for the ranks, updating ``rows`` as they answer; return once all are initialised.

        Otherwise ``recover`` the engines and raise, in one line: ``WorldBroken`` (the controller
        died), ``InitError`` (a rank failed or was lost), ``InitTimeout`` (ranks never joined).
        """
        pending, lost = self._wait(rows, publish)
        failed = [r.rank for r in rows if r.state != "initialized"]
        if not failed:
            publish(rows, phase="initialized", message="")
            return
        if lost:
            self._lost(rows, pending, publish, recover)
        for r in pending:
            rows[r] = replace(rows[r], state="failed",
                              error=f"did not join within the {self.spec.timeout:g} s timeout (engine restarted)")
        msg = failure_message(rows, set(pending), self.spec.timeout)
        publish(rows, phase="failed", message=msg)
        recover(pending, True)
        publish(rows, phase="failed", message=msg)
        err = InitTimeout if pending else InitError
        raise err(msg, failed)

    def stuck_after(self, grace: float) -> list[int]:
        """The ranks whose ``init_rank`` has still not returned ``grace`` seconds from now."""
        deadline = time.monotonic() + grace
        for ar in self.results:
            ar.wait(max(0.0, deadline - time.monotonic()))
        return [r for r, ar in enumerate(self.results) if not ar.ready()]

    def _wait(self, rows: list[RankStatus], publish: Publish) -> tuple[list[int], bool]:
        """Until every rank answered, pgnb's deadline, or ``LOST_GRACE`` after a loss; the ranks that
        did not answer, and whether a loss ended the wait."""
        ars = self.results
        deadline = time.monotonic() + self.spec.timeout + DEADLINE_SLACK
        pending = set(range(len(ars)))
        lost_since = None
        while pending:
            done = [r for r in pending if ars[r].ready()]
            for r in done:
                pending.discard(r)
                rows[r] = row_from_init(self.spec, rows[r], ars[r])
            if done:
                publish(rows)
            now = time.monotonic()
            # a lost rank (or controller) never joins: the others wait for it until torch's timeout
            if lost_since is None and (self._health.broken is not None or self._health.lost_ranks(self._ranks)):
                lost_since = now
            if not pending or now >= deadline or (lost_since is not None and now - lost_since >= LOST_GRACE):
                break
            concurrent.futures.wait([ars[r] for r in pending], timeout=min(LOOK, deadline - now),
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        return sorted(pending), lost_since is not None

    def _lost(self, rows: list[RankStatus], pending: list[int], publish: Publish, recover: Recover) -> None:
        """A rank (or the controller) was lost in the rendezvous: stop the ranks left waiting for it, say so."""
        broken = self._health.broken
        if broken is not None:
            msg = f"init_process_group: {broken.cause}; {RECOVER_HINT}"
            publish(rows, phase="failed", message=msg)
            raise WorldBroken(msg, list(range(len(rows))))
        lost = self._health.lost_ranks(self._ranks)
        waiting = [r for r in pending if r not in lost]
        for r in waiting:
            rows[r] = replace(rows[r], state="failed", error="waited for a lost rank (engine stopped)")
        msg = f"init_process_group: {lost_text(lost)}" + (
            f"; {ranks_text(waiting)} stopped waiting for it" if waiting else "") + f"; {RECOVER_HINT}"
        publish(rows, phase="failed", message=msg)
        recover(waiting, False)
        publish(rows, phase="failed", message=msg)
        raise InitError(msg, sorted({*lost, *waiting}))
