"""Sending work to a world's ranks and waiting for it: the one surface the layers above a ``World`` use.

``Dispatch`` is that surface, as a ``Protocol``: cells (``pgnb.core.cells``),
tracing and profiling (``trace_run``, ``profile_run``), ``show``, ``failures``,
``debug`` and the live output type against it, so each depends on a shape,
not on the ``World`` that happens to provide it. ``Dispatcher`` provides it
for a ``World``: it refuses at once what would fail or queue (no world, a lost
rank, a rank still busy), waits for results without waiting long for ranks
blocked behind a lost one, and says in one line what went wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..errors import RECOVER_HINT, CellTimeout, NotStartedError, RankError, RankLost, WorldBroken
from ..spec import WorldSpec, init_command
from .busy import Busy, BusyEntry
from .health import PRIORITY
from .liveness import PERIOD, STATUS_WAIT
from .remote import died, error_line, is_local
from .rendezvous import EngineInfo
from .rendezvous_run import LOST_GRACE
from .sending import send
from .snapshot import Snapshot
from .stacks import NO_CELL_CODE, dump_stacks
from .text import lost_text, ranks_text, replace_text
from .waiting import poll_until
from .world import World

#: Seconds between two looks at a cell's ranks while its output is shown live.
TICK = 0.05
#: Seconds a busy rank that has left its cell's code gets for its reply (IPython formatting a traceback
#: can take a second or more on a loaded machine).
LEAVING = 5.0


class Dispatch(Protocol):
    """What the layers above a world need of it: its ranks' engines, work sent to them, and their health."""

    @property
    def spec(self) -> WorldSpec: ...

    @property
    def client(self) -> Any: ...

    @property
    def busy(self) -> Busy: ...

    @property
    def engine_ids(self) -> list[int]: ...

    @property
    def rank_infos(self) -> list[EngineInfo]: ...

    @property
    def scratch_dir(self) -> str: ...

    def snapshot(self) -> Snapshot: ...

    def lost_ranks(self, ranks: Iterable[int] | None = None) -> dict[int, str]: ...

    def engines_for(self, ranks: Iterable[int] | None) -> list[tuple[int, int]]: ...

    def check_idle(self, ranks: Iterable[int]) -> None: ...

    def wait_ranks(self, ars: list[tuple[int, Any]], deadline: float | Callable[[], float | None] | None = None,
                   tick: Callable[[], None] | None = None) -> dict[int, str]: ...

    def run(self, fn: Callable[..., Any], *args: Any, ranks: Iterable[int] | None = None,
            timeout: float | None = None, **kwargs: Any) -> list[Any]: ...


class Dispatcher:
    """``Dispatch`` for a ``World``: everything it reads, it reads from the world as it is now
    (a re-init changes the engines, a stop replaces the world's health)."""

    def __init__(self, world: World) -> None:
        self._world = world

    # ---- what the world is now --------------------------------------------
    @property
    def spec(self) -> WorldSpec:
        return self._world.spec

    @property
    def client(self) -> Any:
        return self._world.client

    @property
    def busy(self) -> Busy:
        """Ranks still running an earlier cell; every entry point that talks to the ranks asks it first."""
        return self._world.busy

    @property
    def engine_ids(self) -> list[int]:
        return self._world.engine_ids

    @property
    def rank_infos(self) -> list[EngineInfo]:
        return self._world.rank_infos

    @property
    def scratch_dir(self) -> str:
        return self._world.scratch_dir

    def snapshot(self) -> Snapshot:
        return self._world.snapshot()

    def lost_ranks(self, ranks: Iterable[int] | None = None) -> dict[int, str]:
        return self._world.lost_ranks(ranks)

    # ---- sending work -------------------------------------------------------
    def engines_for(self, ranks: Iterable[int] | None) -> list[tuple[int, int]]:
        """``(rank, engine id)`` of the chosen ranks (default all), ready for work.

        Every entry point that sends work to the ranks asks here first: it refuses at
        once (``NotStartedError``, ``RankLost``, ``CellTimeout``) rather than send work
        that would fail or queue behind a rank still running something earlier.
        """
        infos = self._world.rank_infos
        if self._world.client is None or not infos:
            raise NotStartedError()
        chosen = list(range(len(infos)) if ranks is None else ranks)
        health = self._world.health
        health.look(PRIORITY["zygote"])  # a controller killed a moment ago: name it, rather than run into it
        broken = health.broken
        if broken is not None:  # the cause, not its consequence on every rank
            raise WorldBroken(f"{broken.cause}; {RECOVER_HINT}", chosen)
        lost = self.lost_ranks(chosen)
        if lost:
            raise RankLost(f"{lost_text(lost)}; {replace_text(init_command(self.spec, force=False), lost)}",
                           sorted(lost))
        self.check_idle(chosen)
        self._world.sent_to(chosen)  # a rank that started empty is no longer fresh
        return [(r, infos[r].engine_id) for r in chosen]

    def check_idle(self, ranks: Iterable[int]) -> None:
        """Refuse (``CellTimeout``) if a chosen rank is really still running earlier work.

        The refusal names that work and, from a fresh look at the rank's stack, where it is blocked.
        """
        busy, client = self.busy, self.client
        stuck = busy.still_running(ranks, self.engine_ids, client)
        if not stuck:
            return
        entries = {r: busy.entry(r) for r in stuck}
        code = next((e.code for e in entries.values() if e is not None and e.code), "")
        infos = self.rank_infos
        stacks = dump_stacks({r: infos[r] for r in stuck}, self.scratch_dir, code)
        leaving = [r for r in stuck if r in stacks and stacks[r].note == NO_CELL_CODE]
        if leaving:  # out of the cell's code (IPython formats its error, or it replies): its result is coming
            done = set(leaving) - set(busy.still_running(leaving, self.engine_ids, client, settle=LEAVING))
            stuck = [r for r in stuck if r not in done]
            if not stuck:
                return
        what = {e.what for e in entries.values() if e is not None}
        where = {stacks[r].blocked_in for r in stuck if r in stacks}
        blocked = f", blocked in {where.pop()}" if len(where) == 1 and "" not in where else ""
        raise CellTimeout(
            f"{ranks_text(stuck)} still running {what.pop() if len(what) == 1 else 'earlier work'}{blocked}; "
            f"run the ranks it waits for, or {replace_text(init_command(self.spec, force=False), stuck)}",
            stuck,
        )

    def wait_ranks(self, ars: list[tuple[int, Any]], deadline: float | Callable[[], float | None] | None = None,
                   tick: Callable[[], None] | None = None) -> dict[int, str]:
        """Wait for ``(rank, AsyncResult)`` pairs; the lost ranks among them, ``rank -> cause``.

        Returns when every result is in, at ``deadline`` (``time.monotonic()``), or
        ``LOST_GRACE`` seconds after one of the ranks is lost: the others may be
        blocked in a collective waiting for it, which gloo gives up only at the
        process group's timeout. ``tick`` is called about every ``TICK`` seconds
        while waiting (live output, a rank's debugger); ``deadline`` may be a
        function, asked each time (time at a debugger prompt moves it). Main
        thread only (it uses the Client).
        """
        deadline_at = deadline if callable(deadline) else (lambda: deadline)
        ranks = [r for r, _ in ars]
        lost_since = None
        step = 0.1 if tick is None else TICK
        while True:
            if tick is not None:
                tick()
            pending = [ar for _, ar in ars if not ar.ready()]
            now = time.monotonic()
            until = deadline_at()
            if not pending or (until is not None and now >= until):
                break
            if lost_since is None and (self.lost_ranks(ranks) or any(died(ar) for _, ar in ars)):
                lost_since = now
            if lost_since is not None and now - lost_since >= LOST_GRACE:
                break
            pending[0].wait(step if until is None else max(0.0, min(step, until - now)))
        return self._lost_with_causes(ars)

    def _lost_with_causes(self, ars: list[tuple[int, Any]]) -> dict[int, str]:
        """Lost ranks among ``ars``; a task that failed with EngineError before the watcher
        noticed waits (briefly) for the watcher's cause."""
        dead = [r for r, ar in ars if died(ar)]
        infos = self.rank_infos
        watched = self._world.health.watching and any(is_local(infos[r]) for r in dead)
        poll_until(lambda: not set(dead) - set(self.lost_ranks(dead)), PERIOD + STATUS_WAIT + 0.2 if watched else 0.0)
        lost = self.lost_ranks([r for r, _ in ars])
        for r in dead:
            lost.setdefault(r, "engine died")
        return lost

    def run(self, fn: Callable[..., Any], *args: Any, ranks: Iterable[int] | None = None,
            timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank at once; results in rank order.

        Raises ``RankError`` naming the ranks that failed, ``RankLost`` if a rank's
        engine died (the others are not waited for longer than ``LOST_GRACE``),
        ``CellTimeout`` for ranks still running at ``timeout`` seconds.
        """
        pairs = self.engines_for(ranks)
        client = self.client
        ars = list(send(client, pairs, fn, *args, **kwargs))
        lost = self.wait_ranks(ars, None if timeout is None else time.monotonic() + timeout)
        results: list[Any] = []
        failures: list[tuple[int, Exception]] = []
        running: list[int] = []
        for (r, ar), (_, engine_id) in zip(ars, pairs, strict=True):
            results.append(None)
            if r in lost:
                continue
            if not ar.ready():
                running.append(r)
                name = getattr(fn, "__name__", "a function")
                self.busy.add(r, BusyEntry(engine_id, ar, client, f"an earlier run({name})"))
                continue
            try:
                results[-1] = ar.get(timeout=0)
            except Exception as e:
                failures.append((r, e))
        if not (lost or failures or running):
            return results
        parts = [f"rank {r}: {error_line(e)}" for r, e in failures]
        if lost:
            parts.insert(0, lost_text(lost))
        if running:
            why = "probably blocked waiting for the lost rank" if lost else f"still running after {timeout:g} s"
            parts.append(f"{ranks_text(running)} {why}")
        if lost or running:
            parts.append(replace_text(init_command(self.spec, force=False), [*lost, *running]))
        bad = sorted([*lost, *running, *(r for r, _ in failures)])
        err = RankLost if lost else CellTimeout if running else RankError
        raise err("; ".join(parts), bad)
