"""The health of a world's processes: which died, why, and what that costs (no IPython, no Client).

A ``Health`` is everything pgnb learns from the liveness watcher
(``pgnb.core.liveness.Watcher``) about one world's processes: the kind of every
watched pid, the engines lost and why, the zygotes that died, and whether a
process every rank needs (the controller, a scheduler) died, which breaks the
whole world. The watcher's thread writes here, the kernel's thread reads, so
it has its own lock, and it never calls out while holding it. When the world's
processes are stopped the ``World`` replaces its ``Health`` whole: nothing
learnt of one set of processes reaches the next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from ..errors import RECOVER_HINT, REPLACE_HINT, EngineStartError, WorldBroken
from ..procs.processes import ProcessKind, kill_all, process_running, start_time
from .liveness import Watcher, describe_exit, died_text
from .remote import is_local
from .rendezvous import EngineInfo
from .snapshot import RankStatus

#: Every local process a world depends on, as messages name it, in the order the liveness watcher
#: reports deaths seen in one look (a controller or zygote before the engines that die with it).
DEPENDENCIES: dict[ProcessKind, str] = {
    "controller": "the ipyparallel controller",
    "scheduler": "an ipyparallel scheduler (part of the controller)",
    "zygote": "the zygote that forked the engines",
    "reaper": "pgnb's reaper",
    "engine": "engine",
    "nanny": "its nanny",  # after its engine: a nanny ends when its engine does
}
PRIORITY: dict[ProcessKind, int] = {kind: i for i, kind in enumerate(DEPENDENCIES)}


#: How a controller process's log ends when a port ipyparallel chose for it was taken before it bound it:
#: ipyparallel finds a free port by binding and closing it, and the scheduler binds it a moment later.
PORT_TAKEN = "Address already in use"


@dataclass(frozen=True)
class Broken:
    """A process every rank needs died (the controller or a scheduler): no rank can be reached."""

    cause: str  # one line: "the ipyparallel controller died (SIGKILL)"
    status: int | None  # that process's exit status (negative: a signal), None when unknown

    @property
    def failed_by_itself(self) -> bool:
        """It ended on an error (exit status 1, or a port taken from it), not killed: a fresh controller may
        do better. A scheduler the controller reaped before pgnb saw it has no status, only its log."""
        return self.status == 1 or (self.status is None and PORT_TAKEN in self.cause)


class Health:
    """What the watcher learnt of one world's processes, and the watcher itself.

    ``announce(message)`` tells the world's views of a death; ``rank_of(pid)`` is the
    rank of an engine pid (None: a spare engine); ``exit_status(pid)`` asks the
    launchers and the reaper; ``respawn_reaper(pid)`` starts a new reaper if ``pid``
    was the world's, and returns its pid. All are called from the watcher's thread.
    """

    def __init__(self, announce: Callable[[str], None], rank_of: Callable[[int], int | None],
                 exit_status: Callable[[int], int | None], respawn_reaper: Callable[[int], int | None],
                 ended: Callable[[], str | None] = lambda: None,
                 controller_error: Callable[[], str] = lambda: "") -> None:
        self._announce = announce
        self._ended = ended  # how the batch job of the engines ended, if it did (a lost engine's cause then)
        self._controller_error = controller_error  # the last exception in the controller's log, "" if none
        self._rank_of = rank_of
        self._exit_status = exit_status
        self._respawn_reaper = respawn_reaper
        self._lock = threading.Lock()
        self._lost: dict[int, str] = {}  # engine pid -> why it died (or why pgnb stopped it)
        self._dead_zygotes: dict[int, str] = {}  # zygote pid -> how it died
        self._kinds: dict[int, ProcessKind] = {}  # watched pid -> its kind (kept after its death)
        self._forked: dict[int, tuple[int, int | None]] = {}  # engine pid -> (its zygote's pid, its nanny's pid)
        self._broken: Broken | None = None
        self._watcher: Watcher | None = None
        self._stopped = False

    # ---- what is known ------------------------------------------------
    @property
    def broken(self) -> Broken | None:
        """Set once a process every rank needs died; then every rank is lost for that cause."""
        return self._broken

    @property
    def watching(self) -> bool:
        """Whether a watcher runs: a death it sees gets its cause (an exit status, a signal)."""
        return self._watcher is not None

    def lost_cause(self, pid: int | None) -> str | None:
        """Why the engine ``pid`` is lost, or None if it is not."""
        if pid is None:
            return None
        with self._lock:
            return self._lost.get(pid)

    def any_loss(self) -> bool:
        with self._lock:
            return bool(self._lost) or self._broken is not None

    def as_lost(self, row: RankStatus) -> RankStatus:
        """``row`` as it is now: lost, with its cause, if its engine died (or the controller did)."""
        broken = self._broken  # without its controller no rank can be reached
        cause = self.lost_cause(row.pid) or (broken.cause if broken is not None else None)
        if cause is None or (row.state == "lost" and row.error == cause):
            return row
        return replace(row, state="lost", error=cause)

    def lost_ranks(self, infos: list[EngineInfo], ranks: Iterable[int] | None = None) -> dict[int, str]:
        """Ranks (of ``ranks``, default all) of the engines ``infos`` (rank order) that are lost: ``rank -> cause``."""
        chosen = range(len(infos)) if ranks is None else ranks
        broken = self._broken
        if broken is not None:
            return {r: broken.cause for r in chosen if 0 <= r < len(infos)}
        with self._lock:
            lost = dict(self._lost)
        return {r: lost[infos[r].pid] for r in chosen if 0 <= r < len(infos) and infos[r].pid in lost}

    def pids_of(self, kind: ProcessKind) -> set[int]:
        """The pids watched (now or before their death) as ``kind``."""
        with self._lock:
            return {pid for pid, k in self._kinds.items() if k == kind}

    def zygote_death(self, exclude: set[int]) -> str:
        """How a zygote not in ``exclude`` died ("" if none did)."""
        with self._lock:
            return next((c for z, c in self._dead_zygotes.items() if z not in exclude), "")

    def check_start(self, zygotes_before: set[int], kept: list[int]) -> None:
        """While engines start: raise once a process they need died (``WorldBroken``: the controller;
        ``EngineStartError``: a zygote not in ``zygotes_before``, or an engine of ``kept`` from before,
        which the new ones would wait for forever)."""
        broken = self._broken
        if broken is not None:
            raise WorldBroken(f"{broken.cause}; {RECOVER_HINT}", [])
        dead = self.zygote_death(exclude=zygotes_before)
        if not dead:
            causes = (self.lost_cause(pid) for pid in kept)
            dead = next((c for c in causes if c), "")
            dead = dead and f"an engine was lost while the others started ({dead})"
        if dead:
            raise EngineStartError(f"{dead}; {RECOVER_HINT}")

    # ---- watching -------------------------------------------------------
    def watch_engines(self, infos: Iterable[EngineInfo], forked: Mapping[int, tuple[int, int | None]]) -> None:
        """Watch the engines of this host (pids mean nothing elsewhere) and their nannies;
        ``forked`` is ``engine pid -> (zygote pid, nanny pid)`` for engines a zygote forked."""
        for e in infos:
            if not is_local(e):
                continue
            zygote, nanny = forked.get(e.pid, (0, None))
            nanny = nanny or e.nanny_pid
            with self._lock:
                self._forked[e.pid] = (zygote, nanny)
            self.watch_pids("engine", [e.pid])
            if nanny:
                self.watch_pids("nanny", [nanny])

    def watch_pool(self, processes: Mapping[ProcessKind, list[int]]) -> None:
        """Watch the pool's controller, schedulers and zygotes that are not watched yet."""
        for kind, pids in processes.items():
            if kind != "nanny":  # a nanny is watched with its engine (its death costs that rank)
                with self._lock:
                    new = [p for p in pids if p not in self._kinds]
                self.watch_pids(kind, new)

    def watch_pids(self, kind: ProcessKind, pids: Iterable[int]) -> None:
        import psutil

        procs = {}
        for pid in pids:
            try:
                procs[pid] = start_time(psutil.Process(pid))
            except psutil.Error:  # already gone: the next look marks it
                procs[pid] = 0.0
        if not procs:
            return
        with self._lock:
            if self._stopped:  # a late call from the watcher's thread (a reaper respawned as the world stopped)
                return
            self._kinds.update(dict.fromkeys(procs, kind))
            if self._watcher is None:
                self._watcher = Watcher(self._on_death, self._exit_status, describe=self._describe_death)
            watcher = self._watcher
        watcher.watch(procs, priority=PRIORITY[kind])

    def look(self, max_priority: int | None = None) -> None:
        """A look at the watched processes now, in this thread (the watcher looks only every ``PERIOD`` s)."""
        watcher = self._watcher
        if watcher is not None:
            watcher.look(max_priority)

    def unwatch(self, pids: Iterable[int]) -> None:
        """Before pgnb stops these processes itself: their deaths are not losses."""
        watcher = self._watcher
        if watcher is not None:
            watcher.unwatch(pids)

    def stopped_on_purpose(self, engines: list[EngineInfo], cause: str) -> None:
        """pgnb is stopping these engines itself: not watched, lost for ``cause`` (the next init replaces them)."""
        self.unwatch(e.pid for e in engines if is_local(e))  # only this host's are watched
        with self._lock:
            self._lost.update(dict.fromkeys((e.pid for e in engines), cause))

    def stop(self) -> None:
        """Before pgnb stops every process of the world: the watcher ends, nothing more is learnt."""
        with self._lock:
            self._stopped = True
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()

    # ---- the watcher's thread ---------------------------------------------
    def _describe_death(self, pid: int, status: int | None) -> str:
        """How the death of ``pid`` reads (an engine's names its zygote if that died first)."""
        with self._lock:
            kind = self._kinds.get(pid, "engine")
            zygote = self._forked.get(pid, (0, None))[0]
            zygote_death = self._dead_zygotes.get(zygote)
        if kind in ("controller", "scheduler") and (status is None or status > 0):
            # not killed: why is in the controller's log (its schedulers, forked from it, write there too)
            error = self._controller_error()
            return died_text(DEPENDENCIES[kind], status) + (f": {error}" if error else "")
        if kind != "engine":
            return died_text(DEPENDENCIES[kind], status)
        return zygote_death or self._ended() or describe_exit(status)

    def _on_death(self, pid: int, cause: str, status: int | None) -> None:
        """A process of this world died. Mark what it costs, repair what can be, tell the views."""
        with self._lock:
            kind = self._kinds.get(pid, "engine")  # kept: a dead process is not watched again
        if kind == "engine":
            self._on_engine_death(pid, cause)
        elif kind == "nanny":
            with self._lock:
                engine = next((e for e, (_, n) in self._forked.items() if n == pid), None)
                gone = engine is None or engine in self._lost
            if engine is None or gone or not process_running(engine):
                return  # it ended with its engine, as nannies do (the engine's death is reported on its own)
            # without its nanny pgnb cannot interrupt the rank nor hear at once of its death: stop it
            self.unwatch([engine])
            self._on_engine_death(engine, cause)
            kill_all([engine], grace=0.0)
        elif kind == "zygote":
            if status == 0:
                # a zygote exits 0 only when told to: its launcher let it go once its engines had ended (a
                # replaced rank's set, after that rank was lost), or pgnb stopped it; the engines' own deaths
                # say what happened to them
                return
            with self._lock:
                self._dead_zygotes[pid] = cause
                for engine, (zygote, _) in self._forked.items():  # engines reported before it: name the cause
                    if zygote == pid and engine in self._lost:
                        self._lost[engine] = cause
            self._announce(f"{cause}; {RECOVER_HINT}")
        elif kind == "reaper":
            new = self._respawn_reaper(pid)
            if new is not None:
                self.watch_pids("reaper", [new])
                self._announce(f"{cause}; pgnb started a new one, told of every process of this world")
        else:  # the controller or a scheduler: no rank can be reached any more
            with self._lock:
                if self._broken is None:
                    self._broken = Broken(cause, status)
                broken = self._broken
            self._announce(f"{broken.cause}; {RECOVER_HINT}")

    def _on_engine_death(self, pid: int, cause: str) -> None:
        """An engine died. Mark its rank lost and tell the views."""
        with self._lock:
            broken = self._broken
            # after the controller, engines exit: the controller is the cause
            self._lost[pid] = cause = broken.cause if broken is not None else cause
        rank = self._rank_of(pid)
        if rank is None or broken is not None:
            return  # a spare engine, in no rank; or the controller's death is the news
        self._announce(f"rank {rank} lost ({cause}); {REPLACE_HINT}")
