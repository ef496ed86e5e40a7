"""The bottom of the kernel side: one torch.distributed world's lifecycle and state (no IPython).

``World`` starts (or reuses) ipyparallel engines, makes each one a rank,
initialises the default process group on all of them at once under its own
deadline, answers status queries from the ranks themselves, runs functions on
them, and stops everything it started. Views subscribe with ``add_listener``
and render ``snapshot()``; nothing here draws. Running cells, tracing and
showing are built on a ``World`` (``pgnb.core.cells``, ``trace_run``,
``show``); ``pgnb.Sandbox`` is the facade over all of them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .._wire import RankReport, RankState, WorldPhase
from ..errors import (
    RECOVER_HINT,
    CellTimeout,
    EngineStartError,
    InitError,
    InitTimeout,
    Interrupted,
    NotStartedError,
    PgnbError,
    RankError,
    RankLost,
    WorldBroken,
)
from ..procs.processes import kill_all, owned_by_token, process_running, start_time
from ..procs.reaper_handle import Reaper
from ..rank import engine
from ..rank.cell import clean_message
from ..spec import WorldSpec, init_command, keywords_signature
from .busy import Busy, BusyEntry
from .cluster import EnginePool, exit_status
from .files import OwnedDir
from .interrupts import deferred
from .liveness import PERIOD, STATUS_WAIT, Watcher, describe_exit, died_text
from .rendezvous import STORE_FILE, EngineInfo, plans, rank_order, store_bind
from .stacks import NO_CELL_CODE, dump_stacks
from .text import lost_text, one_line, ranks_text

#: Extra seconds pgnb waits past torch's own timeout, so torch's clearer error wins when it fires (2 s: a rank
#: that gave up at its timeout still has to format and send its error, which takes over a second under load).
DEADLINE_SLACK = 2.0
STATUS_TIMEOUT = 5.0
#: Once a rank is lost, how long the other ranks get to finish on their own before pgnb stops
#: waiting: they may be blocked in a collective waiting for the lost rank.
LOST_GRACE = 1.0
#: Seconds between two looks at a cell's ranks while its output is shown live.
TICK = 0.05
#: Seconds a busy rank that has left its cell's code gets for its reply (IPython formatting a traceback
#: can take a second or more on a loaded machine).
LEAVING = 5.0
#: Every local process a world depends on, as messages name it, in the order the liveness watcher
#: reports deaths seen in one look (a controller or zygote before the engines that die with it).
DEPENDENCIES = {
    "controller": "the ipyparallel controller",
    "scheduler": "an ipyparallel scheduler (part of the controller)",
    "zygote": "the zygote that forked the engines",
    "reaper": "pgnb's reaper",
    "engine": "engine",
    "nanny": "its nanny",  # after its engine: a nanny ends when its engine does
}
_PRIORITY = {kind: i for i, kind in enumerate(DEPENDENCIES)}
#: Cold starts of a controller that failed as it started (a process of it exited with status 1) before
#: pgnb reports it. ipyparallel picks each of the controller's ~20 ports by binding port 0 and closing
#: it; a scheduler process binds it a moment later, and another process can take it in between (seen
#: here: 1 in 60 forced restarts with three worlds starting at once, "Address already in use"). A fresh
#: controller picks fresh ports. A controller killed by a signal is not started again.
CONTROLLER_STARTS = 2
#: After Ctrl-C in a re-init, how long ranks already in the rendezvous get to finish before their
#: engines are stopped (a rank blocked in gloo's connect ignores SIGINT).
INTERRUPT_SETTLE = 0.5


@dataclass(frozen=True)
class RankStatus:
    """One rank as the rank itself reported it (``state`` is pgnb's summary)."""

    rank: int
    world_size: int
    backend: str
    state: RankState
    host: str = ""
    pid: int | None = None
    device: str = ""
    error: str = ""
    init_seconds: float | None = None
    engine_id: int | None = None
    launcher_rank: int | None = None

    def __repr__(self) -> str:  # deterministic: no pid, host or timing
        err = f", error={self.error!r}" if self.error else ""
        return (f"RankStatus(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
                f"state={self.state!r}, device={self.device!r}{err})")


@dataclass(frozen=True)
class Snapshot:
    """Everything a view needs to draw one moment of the world."""

    spec: WorldSpec
    ranks: tuple[RankStatus, ...]
    phase: WorldPhase
    message: str = ""
    engines_up: int = 0
    started_at: float = field(default=0.0, compare=False)
    #: which world of its ``World`` this is: a new one begins at every real (re-)init
    generation: int = 0

    @property
    def initialized(self) -> int:
        return sum(r.state == "initialized" for r in self.ranks)


_LIVE: weakref.WeakSet[World] = weakref.WeakSet()
_log = logging.getLogger("pgnb")


def _one_line(exc: BaseException) -> str:
    """``ename: first line of the message`` for a remote or local exception, without C++ locations or ports."""
    evalue = getattr(exc, "evalue", None)
    return one_line(_ename(exc), clean_message(str(evalue if evalue is not None else exc).strip()))


class World:
    """A torch.distributed world on ipyparallel engines: its lifecycle, its state, running functions on it.

    ``World(spec=...)`` or ``World(backend="gloo", world=4, ...)`` with the options of
    ``pgnb.spec.WorldSpec`` (validated before anything starts).
    """

    def __init__(self, *, spec: WorldSpec | None = None, **options: Any) -> None:
        self.spec = spec or WorldSpec.validate(**options)
        self._pool: EnginePool | None = None
        self._reaper: Reaper | None = None
        self._known: dict[int, EngineInfo] = {}
        self._ranks: list[EngineInfo] = []
        self._store_dir: OwnedDir | None = None
        self._listeners: list[Callable[[World], None]] = []
        self._lock = threading.RLock()
        # the liveness watcher publishes from its own thread: one publisher at a time
        self._publish_lock = threading.RLock()
        self._lost: dict[int, str] = {}  # engine pid -> why it died (written by the watcher thread)
        self._watcher: Watcher | None = None
        self._scratch: OwnedDir | None = None
        self._kinds: dict[int, str] = {}  # watched pid -> its kind (a key of DEPENDENCIES)
        self._forked: dict[int, tuple[int, int | None]] = {}  # engine pid -> (its zygote's pid, its nanny's pid)
        self._dead_zygotes: dict[int, str] = {}  # zygote pid -> how it died (watcher thread)
        self._zygotes_before: set[int] = set()  # the zygotes there were when the present init began
        #: one line, set by the watcher thread when a process every rank needs died (controller, scheduler)
        self._broken = ""
        self._broken_status: int | None = None  # that process's exit status (negative: a signal)
        self._step = ""  # what the lifecycle call in progress does now: what an interrupt interrupts
        self._spec_before = self.spec  # the spec before the init in progress (an interrupted re-init keeps it)
        self._inflight: list[tuple[int, Any]] = []  # the rendezvous' (rank, AsyncResult) while it runs
        self._next_look = 0.0  # when the start-up wait next looks for new controller/zygote processes
        #: ranks still running an earlier cell; every entry point that talks to the ranks asks it first
        self.busy = Busy()
        self._snapshot = Snapshot(self.spec, self._fresh_rows("starting"), "new")
        _LIVE.add(self)

    # ---- observers ----------------------------------------------------
    def add_listener(self, fn: Callable[[World], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[World], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(fn)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _publish(self, **changes: Any) -> None:
        with self._publish_lock:
            snap = replace(self._snapshot, **changes)
            if self._lost or self._broken:  # a dead engine stays lost whatever the main thread last thought of it
                snap = replace(snap, ranks=tuple(self._as_lost(r) for r in snap.ranks))
            self._snapshot = snap
            for fn in list(self._listeners):
                fn(self)

    def _as_lost(self, row: RankStatus) -> RankStatus:
        cause = self._lost.get(row.pid) if row.pid is not None else None
        if cause is None and self._broken:  # without its controller no rank can be reached
            cause = self._broken
        if cause is None or (row.state == "lost" and row.error == cause):
            return row
        return replace(row, state="lost", error=cause)

    def _set_rows(self, rows: Iterable[RankStatus], **changes: Any) -> None:
        self._publish(ranks=tuple(rows), **changes)

    def _fresh_rows(self, state: RankState, spec: WorldSpec | None = None) -> tuple[RankStatus, ...]:
        spec = spec or self.spec
        return tuple(RankStatus(r, spec.world, spec.backend, state) for r in range(spec.world))

    # ---- properties -----------------------------------------------------
    @property
    def client(self) -> Any:
        """The ipyparallel ``Client`` (for ``%px`` on the same engines)."""
        return self._pool.client if self._pool else None

    @property
    def cluster(self) -> Any:
        """The ``ipyparallel.Cluster`` pgnb started (None when attached to one, or before start)."""
        return self._pool.cluster if self._pool else None

    @property
    def cluster_id(self) -> str | None:
        cluster = self.cluster
        return None if cluster is None else str(cluster.cluster_id)

    @property
    def owner_token(self) -> str | None:
        """The ``PGNB_OWNER`` token every process this world launched carries (None: attached)."""
        return self._reaper.token if self._reaper else None

    @property
    def reaper_pid(self) -> int | None:
        return self._reaper.pid if self._reaper else None

    @property
    def store_dir(self) -> str | None:
        """The directory of pgnb's own ``file://`` store, while one exists."""
        return self._store_dir.path if self._store_dir else None

    @property
    def engine_ids(self) -> list[int]:
        """Engine id of each rank, in rank order."""
        return [e.engine_id for e in self._ranks]

    @property
    def pids(self) -> list[int]:
        """Every live process pgnb started for this world (engines, nannies, zygotes, controller, reaper)."""
        out = {e.pid for e in self._known.values()} | {e.nanny_pid for e in self._known.values() if e.nanny_pid}
        cluster = self.cluster
        ctl = cluster and getattr(cluster.controller, "process", None)
        if ctl is not None:
            out.add(ctl.pid)
        if self._reaper is not None:
            out.add(self._reaper.pid)
            out.update(owned_by_token(self._reaper.token))  # what the launchers started beneath
        return sorted(out)

    @property
    def generation(self) -> int:
        """Which world this is: 0 before the first init, one more at every init that is not a no-op
        (a re-init, ``force``, an init after ``shutdown``). A view keeps to its own generation."""
        return self._snapshot.generation

    @property
    def is_initialized(self) -> bool:
        snap = self._snapshot
        return snap.phase == "initialized" and snap.initialized == len(snap.ranks)

    def lost_ranks(self, ranks: Iterable[int] | None = None) -> dict[int, str]:
        """Ranks (of ``ranks``, default all) whose engine process died: ``rank -> cause``.

        Safe from any thread: it reads what the liveness watcher recorded, and asks no engine.
        """
        infos = list(self._ranks)
        chosen = range(len(infos)) if ranks is None else ranks
        if self._broken:
            return {r: self._broken for r in chosen if 0 <= r < len(infos)}
        lost = dict(self._lost)
        return {r: lost[infos[r].pid] for r in chosen if 0 <= r < len(infos) and infos[r].pid in lost}

    # ---- lifecycle ------------------------------------------------------
    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self, force: bool = False) -> World:
        """Start engines and initialise the world (a no-op if it already is)."""
        return self.init(self.spec, force=force)

    def init(self, spec: WorldSpec | None = None, force: bool = False) -> World:
        """(Re-)initialise as ``spec``: same spec and healthy = no-op; ``force`` = restart engines.

        Ctrl-C raises ``Interrupted`` once the state is coherent again: what a cold start (or
        ``force``) had started is stopped; engines that were running before are kept (those stuck
        in the rendezvous are stopped, and the next init replaces them). docs/reliability.md.
        """
        spec = spec or self.spec
        with self._lock:
            before = self._pool
            try:
                return self._init(spec, force)
            except KeyboardInterrupt:
                raise self._interrupted("init", fresh=self._pool is not before) from None
            except PgnbError:
                raise
            except Exception as e:  # a bug of pgnb's: no half-made world stays behind it
                with deferred():
                    self._stop_pool(grace=INTERRUPT_SETTLE)
                    self._set_rows(self._fresh_rows("failed"), phase="failed",
                                   message=f"init failed ({_one_line(e)}); pgnb stopped the engines; {RECOVER_HINT}")
                raise
            finally:
                self._step = ""

    def _init(self, spec: WorldSpec, force: bool) -> World:
        self._step = "checking the running world"
        self._look()  # a process that died a moment ago decides what can be reused
        if not force and spec == self.spec and self.is_initialized and self._healthy() and all(
            r.state == "initialized" for r in self.status()  # a cell may have destroyed the group
        ):
            self._publish()  # listeners redraw; nothing else happens
            return self
        new_hosting = self._pool is not None and (
            spec.launcher, spec.profile, spec.cluster_id
        ) != (self.spec.launcher, self.spec.profile, self.spec.cluster_id)
        # a dead controller (or a pool left half made) cannot be reused: start over, as --force would
        unusable = self._pool is not None and (self._broken != "" or self._pool.client is None)
        if force or new_hosting or unusable:
            self._step = "stopping the engines that were running"
            if self._stop_pool():
                raise KeyboardInterrupt  # seen while stopping: nothing runs now, say so
        elif self._pool is not None:
            self._step = "destroying the previous process group"
            self._forget_lost()
            if self._snapshot.phase != "destroyed":  # after %pg_destroy there is nothing to destroy
                self._destroy_ranks(quiet=True)
        self._spec_before = self.spec
        self.spec = spec
        self._init_world()
        return self

    def _phase(self) -> str:
        """What the lifecycle call in progress is doing, in words (``starting the controller``, ...)."""
        pool = self._pool
        if self._step == "starting engines":
            return pool.step if pool is not None and pool.step else "starting the controller"
        return self._step or "starting"

    def _interrupted(self, action: str, fresh: bool) -> Interrupted:
        """After Ctrl-C in ``action`` (init, destroy): leave a coherent state and say what exists.

        ``fresh``: the pool was started by the interrupted call, so it is stopped, all of it.
        Otherwise the engines are kept; the ranks still in the rendezvous after ``INTERRUPT_SETTLE``
        are stopped (gloo ignores SIGINT there), and the half-made group is destroyed.
        """
        phase = self._phase()
        with deferred():  # a second Ctrl-C must not cut the cleanup short
            if self._pool is None or fresh:
                started = self._pool is not None or self._reaper is not None
                self._stop_pool(grace=INTERRUPT_SETTLE)  # half started: no need to wait for polite exits
                outcome = ("pgnb stopped what it had started; " if started else "") + \
                    "nothing is running; run %pg_init to start again"
                self._set_rows(self._fresh_rows("failed"), phase="failed",
                               message=f"{action} interrupted while {phase}; {outcome}")
                return Interrupted(action, phase, outcome)
            stopped = self._settle_after_interrupt()
            kept = "the engines are kept" + (f" ({ranks_text(stopped)} stuck in the rendezvous stopped)"
                                             if stopped else "")
            if action == "destroy":
                outcome = f"{kept}; the group is destroyed; run %pg_init to make a new one"
                rows = (replace(r, state="destroyed", error="") if r.state != "lost" else r
                        for r in self._snapshot.ranks)
                self._set_rows(rows, phase="destroyed", message=f"{action} interrupted while {phase}; {outcome}")
            else:
                outcome = f"{kept}; run %pg_init again to make the group"
                if len(self._snapshot.ranks) != len(self._ranks):  # interrupted before the new ranks were chosen
                    if self._spec_before.world == len(self._ranks):
                        self.spec = self._spec_before
                    self._publish(ranks=self._rank_rows("failed"), spec=self.spec)
                rows = (replace(r, state="failed", error="interrupted") if r.state != "lost" else r
                        for r in self._snapshot.ranks)
                self._set_rows(rows, phase="failed", message=f"{action} interrupted while {phase}; {outcome}")
            return Interrupted(action, phase, outcome)

    def _rank_rows(self, state: RankState) -> tuple[RankStatus, ...]:
        """A row per rank of ``self._ranks`` (the engines the world has now)."""
        spec, n = self.spec, len(self._ranks)
        return tuple(RankStatus(r, n, spec.backend, state, host=e.host, pid=e.pid, engine_id=e.engine_id,
                                launcher_rank=e.launcher_rank) for r, e in enumerate(self._ranks))

    def _settle_after_interrupt(self) -> list[int]:
        """Engines kept after an interrupt: stop those stuck in the rendezvous, destroy the group on the others."""
        inflight, self._inflight = self._inflight, []
        deadline = time.monotonic() + INTERRUPT_SETTLE
        while any(not ar.ready() for _, ar in inflight) and time.monotonic() < deadline:
            time.sleep(0.01)
        stuck = [r for r, ar in inflight if not ar.ready() and r < len(self._ranks)]
        if stuck:
            infos = [self._ranks[r] for r in stuck]
            self._stop_watching([e.pid for e in infos])
            for e in infos:  # lost on purpose: the next init waits for the Client to drop them, then replaces them
                self._lost[e.pid] = "engine stopped after an interrupt (it was blocked in init_process_group)"
            kill_all([e.pid for e in infos], grace=0.0)
        with contextlib.suppress(Exception):
            self._destroy_ranks(quiet=True, timeout=1.0)
        return stuck

    def _healthy(self) -> bool:
        if self._pool is None or self._pool.client is None or self._broken or self.lost_ranks():
            return False
        return set(self.engine_ids) <= set(self._pool.ids())

    # ---- liveness -----------------------------------------------------
    def _watch(self, infos: Iterable[EngineInfo]) -> None:
        """Have the watcher thread look after the engines of this host (pids mean nothing elsewhere),
        their nannies, and the controller, schedulers and zygotes of the pool."""
        here = socket.gethostname()
        forked = self._pool.forked_by() if self._pool is not None else {}
        for e in infos:
            if e.host != here:
                continue
            zygote, nanny = forked.get(e.pid, (0, None))
            nanny = nanny or e.nanny_pid
            self._forked[e.pid] = (zygote, nanny)
            self._watch_pids("engine", [e.pid])
            if nanny:
                self._watch_pids("nanny", [nanny])
        self._watch_pool()

    def _watch_pool(self) -> None:
        """Watch the pool's controller, schedulers and zygotes that are not watched yet."""
        pool = self._pool
        if pool is None:
            return
        for kind, pids in pool.processes().items():
            if kind != "nanny":  # a nanny is watched with its engine (its death costs that rank)
                self._watch_pids(kind, [p for p in pids if p not in self._kinds])

    def _watch_pids(self, kind: str, pids: Iterable[int]) -> None:
        import psutil

        procs = {}
        for pid in pids:
            try:
                procs[pid] = start_time(psutil.Process(pid))
            except psutil.Error:  # already gone: the next look marks it
                procs[pid] = 0.0
            self._kinds[pid] = kind
        if not procs:
            return
        if self._watcher is None:
            self._watcher = Watcher(self._on_death, self._exit_status, describe=self._describe_death)
        self._watcher.watch(procs, priority=_PRIORITY[kind])

    def _look(self, max_priority: int | None = None) -> None:
        """A look at the watched processes now, in this thread (the watcher looks only every ``PERIOD`` s)."""
        watcher = self._watcher
        if watcher is not None:
            watcher.look(max_priority)

    def _check_dependencies(self) -> None:
        """Called while engines start: stop waiting once a process they need died (and watch new ones)."""
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + 0.25
            self._watch_pool()
        if self._broken:
            raise WorldBroken(f"{self._broken}; {RECOVER_HINT}", [])
        dead = next((c for z, c in self._dead_zygotes.items() if z not in self._zygotes_before), "")
        if not dead:  # an engine kept from before, lost while new ones start: they would wait for it forever
            dead = next((self._lost[e.pid] for e in list(self._known.values()) if e.pid in self._lost), "")
            dead = dead and f"an engine was lost while the others started ({dead})"
        if dead:
            raise EngineStartError(f"{dead}; {RECOVER_HINT}")

    def _exit_status(self, pid: int) -> int | None:
        pool, reaper = self._pool, self._reaper  # read once: the main thread may swap them
        status = pool.exit_status(pid) if pool is not None else exit_status(pid)
        if status is None and reaper is not None:
            status = reaper.exit_status(pid)
        return status

    def _describe_death(self, pid: int, status: int | None) -> str:
        """Watcher thread: how the death of ``pid`` reads (an engine's names its zygote if that died first)."""
        kind = self._kinds.get(pid, "engine")
        if kind != "engine":
            return died_text(DEPENDENCIES[kind], status)
        zygote = self._forked.get(pid, (0, None))[0]
        return self._dead_zygotes.get(zygote) or describe_exit(status)

    def _on_death(self, pid: int, cause: str, status: int | None) -> None:
        """Watcher thread: a process of this world died. Mark what it costs, repair what can be, tell the views."""
        kind = self._kinds.get(pid, "engine")  # kept: a dead process is not watched again
        if kind == "engine":
            self._on_engine_death(pid, cause)
        elif kind == "nanny":
            engine = next((e for e, (_, n) in self._forked.items() if n == pid), None)
            if engine is None or engine in self._lost or not process_running(engine):
                return  # it ended with its engine, as nannies do (the engine's death is reported on its own)
            # without its nanny pgnb cannot interrupt the rank nor hear at once of its death: stop it
            self._stop_watching([engine])
            self._on_engine_death(engine, cause)
            kill_all([engine], grace=0.0)
        elif kind == "zygote":
            self._dead_zygotes[pid] = cause
            for engine, (zygote, _) in self._forked.items():  # engines reported before it: name the cause
                if zygote == pid and engine in self._lost:
                    self._lost[engine] = cause
            self._publish(message=f"{cause}; {RECOVER_HINT}")
        elif kind == "reaper":
            reaper = self._reaper
            new = reaper.respawn() if reaper is not None and reaper.pid == pid else None
            if new is not None:
                self._watch_pids("reaper", [new])
                self._publish(message=f"{cause}; pgnb started a new one, told of every process of this world")
        else:  # the controller or a scheduler: no rank can be reached any more
            if not self._broken:
                self._broken, self._broken_status = cause, status
            self._publish(message=f"{self._broken}; {RECOVER_HINT}")

    def _on_engine_death(self, pid: int, cause: str) -> None:
        """Watcher thread: an engine died. Mark its rank lost and tell the views."""
        self._lost[pid] = self._broken or cause  # after the controller, engines exit: the controller is the cause
        rank = next((r for r, e in enumerate(self._ranks) if e.pid == pid), None)
        if rank is None or self._broken:
            return  # a spare engine, in no rank; or the controller's death is the news
        self._publish(message=f"rank {rank} lost ({self._lost[pid]}); {RECOVER_HINT}")

    def _stop_watching(self, pids: Iterable[int] | None = None) -> None:
        """Before pgnb stops engines itself: those deaths are not losses."""
        if self._watcher is None:
            return
        if pids is None:
            self._watcher.stop()
            self._watcher = None
        else:
            self._watcher.unwatch(pids)

    def _forget_lost(self) -> None:
        """Drop dead engines before a re-init, once the Client has noticed they are gone."""
        dead = [e.engine_id for e in self._known.values() if e.pid in self._lost]
        if not dead or self._pool is None or self._pool.client is None:
            return
        deadline = time.monotonic() + 5.0
        while set(dead) & set(self._pool.ids()) and time.monotonic() < deadline:
            time.sleep(0.02)
        for eid in dead:
            self._known.pop(eid, None)

    def _init_world(self) -> None:
        spec = self.spec
        started = time.monotonic()
        self._set_rows(self._fresh_rows("starting"), phase="starting engines", message="",
                       engines_up=0, started_at=started, spec=spec, generation=self._snapshot.generation + 1)
        # a zygote of before that dies now costs only its own engines (the lost-engine check sees those)
        self._zygotes_before = {pid for pid, kind in self._kinds.items() if kind == "zygote"}
        try:
            self._start_engines(spec)
        except BaseException as e:
            # anything else than a PgnbError is ipyparallel's or a lost engine's: one line, and a clean slate
            err = e if isinstance(e, (PgnbError, KeyboardInterrupt)) else EngineStartError(
                f"the engines did not start ({self._phase()}: {_one_line(e)}); {RECOVER_HINT}")
            self._set_rows(self._fresh_rows("failed"), phase="failed", message=str(err))
            if self._pool is not None and not isinstance(e, KeyboardInterrupt):
                self._stop_pool()
            if err is e:
                raise
            raise err from None
        rows = [RankStatus(r, spec.world, spec.backend, "pending", host=e.host, pid=e.pid,
                           engine_id=e.engine_id, launcher_rank=e.launcher_rank)
                for r, e in enumerate(self._ranks)]
        self._set_rows(rows, phase="rendezvous")
        self._step = "in the rendezvous (init_process_group)"
        try:
            self._rendezvous(rows)
        finally:
            self._inflight = []

    def _start_engines(self, spec: WorldSpec) -> None:
        """Engines up and known, the ranks chosen; a cold start whose controller failed as it started
        (``CONTROLLER_STARTS``) is started again with a fresh controller."""
        for start in range(1, CONTROLLER_STARTS + 1):
            cold = self._pool is None
            try:
                self._ensure_engines(spec)
                self._meet_new_engines()
                return
            except WorldBroken:
                if not (cold and self._broken_status == 1 and start < CONTROLLER_STARTS):
                    raise
                # info, not a warning: a warning reaches the cell's stderr, and a recovered start must
                # leave a notebook's recorded outputs as they are (strict nbval compares stderr)
                _log.info("pgnb: %s as it started; starting a new controller", self._broken)
                self._publish(message=f"{self._broken} as it started; pgnb is starting a new one")
                if self._stop_pool():
                    raise KeyboardInterrupt from None  # seen while stopping: nothing runs now

    def _ensure_engines(self, spec: WorldSpec) -> None:
        def progress(k: int, n: int) -> None:
            self._publish(engines_up=k)

        self._step = "starting engines"
        if self._pool is None:
            with deferred() as note:  # a reaper and a pool that knows it, or neither
                token = uuid.uuid4().hex
                self._reaper = Reaper(token) if not spec.attached else None
                self._pool = EnginePool(spec.launcher, spec.profile, spec.cluster_id, reaper=self._reaper)
                self._pool.check = self._check_dependencies
                if self._reaper is not None:
                    self._watch_pids("reaper", [self._reaper.pid])
            if note.seen:
                raise KeyboardInterrupt
            self._pool.connect(spec.world, progress)
        else:
            self._pool.step = ""
            self._pool.check = self._check_dependencies
            self._pool.ensure_engines(spec.world, progress)
        self._watch_pool()

    def _meet_new_engines(self) -> None:
        """Ask engines not seen before who they are, watch them, import torch on them; choose the ranks."""
        pool = self._pool
        assert pool is not None
        new = [i for i in pool.ids() if i not in self._known]
        if new:
            self._publish(phase="importing torch")
            infos = pool.describe(new)
            for info in infos:
                self._known[info.engine_id] = info
            self._watch(infos)
            pool.warm_up(new)
        spec = self.spec
        self._ranks = rank_order([self._known[i] for i in pool.ids() if i in self._known], spec.world,
                                 use_launcher_rank=not spec.local)
        if len(self._ranks) < spec.world:  # one was lost after it registered (the others would wait for it)
            self._look()
            raise EngineStartError(f"only {len(self._ranks)} of the {spec.world} engines are up: one was lost "
                                   f"while the world started; {RECOVER_HINT}")

    def _rendezvous(self, rows: list[RankStatus]) -> None:
        spec, pool = self.spec, self._pool
        assert pool is not None
        client = pool.client
        master = self._ranks[0]
        port = 0
        store_dir = None
        if spec.scheme in ("env", "tcp"):
            bind_addr, bind_port = store_bind(spec, master)
            try:
                listen = client[master.engine_id].apply_async(engine.listen_for_store, bind_addr, bind_port)
                pool._wait_all([listen], spec.timeout)
                port = listen.get(timeout=0)
            except PgnbError:
                raise
            except Exception as e:
                msg = f"rank 0 cannot listen on {bind_addr}:{bind_port} ({_one_line(e)}); pick another port"
                self._set_rows(self._fresh_rows("failed"), phase="failed", message=msg)
                raise InitError(msg, [0]) from None
            master_addr = bind_addr
        else:
            master_addr = master.addr
            if spec.init_url is None:
                self._store_dir = store_dir_obj = OwnedDir()
                store_dir = store_dir_obj.path
                store_dir_obj.private_file(STORE_FILE)  # torch opens it as it is: empty is allowed
                if self._reaper:
                    self._reaper.own_path(store_dir)
        rank_plans = plans(spec, self._ranks, master_addr, port, store_dir)
        ars = [client[e.engine_id].apply_async(engine.init_rank, p)
               for e, p in zip(self._ranks, rank_plans, strict=True)]
        self._inflight = list(enumerate(ars))
        deadline = time.monotonic() + spec.timeout + DEADLINE_SLACK
        pending = set(range(len(ars)))
        lost_since = None
        while pending and time.monotonic() < deadline:
            done = [r for r in pending if ars[r].ready()]
            for r in done:
                pending.discard(r)
                rows[r] = self._row_from_init(rows[r], ars[r])
            if done:
                self._set_rows(rows)
            else:
                time.sleep(0.005)
            # a lost rank (or controller) never joins: the others wait for it until torch's timeout
            if lost_since is None and (self._broken or self.lost_ranks()):
                lost_since = time.monotonic()
            if lost_since is not None and time.monotonic() - lost_since >= LOST_GRACE:
                break
        failed = [r.rank for r in rows if r.state != "initialized"]
        if not failed:
            self._set_rows(rows, phase="initialized", message="")
            return
        if lost_since is not None:
            self._init_lost(rows, sorted(pending))
        for r in pending:
            rows[r] = replace(rows[r], state="failed",
                              error=f"did not join within the {spec.timeout:g} s timeout (engine restarted)")
        msg = self._init_failure_message(rows, pending)
        self._set_rows(rows, phase="failed", message=msg)
        self._recover_after_failed_init(stuck=sorted(pending))
        self._set_rows(rows, phase="failed", message=msg)
        err = InitTimeout if pending else InitError
        raise err(msg, failed)

    def _init_lost(self, rows: list[RankStatus], pending: list[int]) -> None:
        """A rank (or the controller) was lost in the rendezvous: stop the ranks left waiting for it, say so."""
        if self._broken:
            msg = f"init_process_group: {self._broken}; {RECOVER_HINT}"
            self._set_rows(rows, phase="failed", message=msg)
            raise WorldBroken(msg, list(range(len(rows))))
        lost = self.lost_ranks()
        waiting = [r for r in pending if r not in lost]
        for r in waiting:
            rows[r] = replace(rows[r], state="failed", error="waited for a lost rank (engine stopped)")
        msg = f"init_process_group: {lost_text(lost)}" + (
            f"; {ranks_text(waiting)} stopped waiting for it" if waiting else "") + f"; {RECOVER_HINT}"
        self._set_rows(rows, phase="failed", message=msg)
        self._recover_after_failed_init(stuck=waiting, replace_stuck=False)
        self._set_rows(rows, phase="failed", message=msg)
        raise InitError(msg, sorted({*lost, *waiting}))

    def _row_from_init(self, row: RankStatus, ar: Any) -> RankStatus:
        try:
            res: RankReport = ar.get(timeout=0)
        except Exception as e:
            state: RankState = "lost" if _ename(e) in ("EngineError", "TaskAborted") else "failed"
            return replace(row, state=state, error=_one_line(e))
        return replace(row, state="initialized", backend=self._shown_backend(res), device=res["device"],
                       world_size=res["world_size"], init_seconds=res["init_seconds"])

    def _shown_backend(self, res: RankReport) -> str:
        # get_backend() says "undefined" for multi-device strings; the config says what runs where
        return res["backend_config"] if "," in self.spec.backend else res["backend"]

    def _init_failure_message(self, rows: list[RankStatus], stuck: set[int]) -> str:
        parts = []
        errors = [r for r in rows if r.state in ("failed", "lost") and r.rank not in stuck]
        # the same error on many ranks is said once
        by_error: dict[str, list[int]] = {}
        for r in errors:
            by_error.setdefault(r.error, []).append(r.rank)
        for err, ranks in by_error.items():
            parts.append(f"{ranks_text(ranks)} failed: {err}")
        if stuck:
            parts.append(f"{ranks_text(sorted(stuck))} did not join within the {self.spec.timeout:g} s timeout")
        return "init_process_group: " + "; ".join(parts) + f"; {RECOVER_HINT}"

    def _recover_after_failed_init(self, stuck: list[int] | None = None, replace_stuck: bool = True) -> None:
        """Leave a state from which the next init works: stuck engines replaced (or, without
        ``replace_stuck``, stopped and left to the next init to replace), others clean."""
        pool = self._pool
        if pool is None:
            return
        stuck_infos = [self._ranks[r] for r in (stuck or [])]
        if stuck_infos and not replace_stuck:
            self._stop_watching([e.pid for e in stuck_infos])
            for e in stuck_infos:  # lost on purpose: the next init waits for the Client to drop them, replaces them
                self._lost[e.pid] = "engine stopped (it was left waiting for a lost rank)"
            kill_all([e.pid for e in stuck_infos], grace=0.0)
        elif stuck_infos:
            self._stop_watching([e.pid for e in stuck_infos])
            pool.kill_engines([e.pid for e in stuck_infos], [e.engine_id for e in stuck_infos])
            for e in stuck_infos:
                self._known.pop(e.engine_id, None)
        self._destroy_ranks(quiet=True, timeout=10.0 if replace_stuck else 2.0)
        if stuck_infos and not pool.attached and replace_stuck:
            with contextlib.suppress(EngineStartError):
                pool.ensure_engines(self.spec.world)

    # ---- queries ------------------------------------------------------
    def status(self, timeout: float = STATUS_TIMEOUT) -> list[RankStatus]:
        """Ask every rank what torch says about it; rank order."""
        with self._lock:
            self._look()
            if self._pool is None or self._pool.client is None or self._broken:
                self._publish()  # a dead controller's world: every rank is lost, nothing to ask
                return list(self._snapshot.ranks)
            lost = self.lost_ranks()
            alive = set(self._pool.ids())
            # a rank still running earlier work would answer only after it: say so instead of asking
            # (as long as asking it would take: a cell that ends meanwhile, e.g. after a lost peer, is not busy)
            busy = set(self.busy.still_running(range(len(self._ranks)), self.engine_ids, self.client,
                                               settle=timeout))
            ars = {r: self.client[e.engine_id].apply_async(engine.rank_status)
                   for r, e in enumerate(self._ranks) if e.engine_id in alive and r not in lost and r not in busy}
            deadline = time.monotonic() + timeout
            rows = list(self._snapshot.ranks)
            if len(rows) != len(self._ranks):  # never expected; a row per rank whatever the snapshot says
                rows = list(self._rank_rows("failed"))
            for r in range(len(self._ranks)):
                entry = self.busy.entry(r) if r in busy else None
                if entry is not None:
                    rows[r] = replace(rows[r], error=f"busy: still running {entry.what}")
                    continue
                if r not in ars:
                    rows[r] = replace(rows[r], state="lost", error=lost.get(r, "engine process is gone"))
                    continue
                try:
                    res: RankReport = ars[r].get(timeout=max(0.0, deadline - time.monotonic()))
                except Exception as exc:
                    if _ename(exc) == "EngineError":
                        rows[r] = replace(rows[r], state="lost", error=_one_line(exc))
                    else:
                        rows[r] = replace(rows[r], error=f"did not answer within {timeout:g} s (busy?)")
                    continue
                if res["initialized"]:
                    rows[r] = replace(rows[r], state="initialized", error="", backend=self._shown_backend(res),
                                      world_size=res["world_size"], device=res["device"])
                elif rows[r].state == "initialized":
                    rows[r] = replace(rows[r], state="destroyed", error="")
            self._set_rows(rows)
            return rows

    # ---- running code -------------------------------------------------
    @property
    def rank_infos(self) -> list[EngineInfo]:
        """What each rank's engine said about itself, in rank order."""
        return list(self._ranks)

    @property
    def scratch_dir(self) -> str:
        """This world's 0700 directory for stack dumps and trace files (its reaper removes it too)."""
        if self._scratch is None:
            self._scratch = OwnedDir(prefix="pgnb-stacks-")
            if self._reaper is not None:  # if the kernel is killed, the reaper removes it with the rest
                self._reaper.own_path(self._scratch.path)
        return self._scratch.path

    def engines_for(self, ranks: Iterable[int] | None) -> list[tuple[int, int]]:
        """``(rank, engine id)`` of the chosen ranks (default all), ready for work.

        Every entry point that sends work to the ranks asks here first: it refuses at
        once (``NotStartedError``, ``RankLost``, ``CellTimeout``) rather than send work
        that would fail or queue behind a rank still running something earlier.
        """
        if self._pool is None or self._pool.client is None or not self._ranks:
            raise NotStartedError()
        chosen = list(range(len(self._ranks)) if ranks is None else ranks)
        self._look(_PRIORITY["zygote"])  # a controller killed a moment ago: name it, rather than run into it
        if self._broken:  # the cause, not its consequence on every rank
            raise WorldBroken(f"{self._broken}; {RECOVER_HINT}", chosen)
        lost = self.lost_ranks(chosen)
        if lost:
            raise RankLost(lost_text(lost) + f"; {RECOVER_HINT}", sorted(lost))
        self.check_idle(chosen)
        return [(r, self._ranks[r].engine_id) for r in chosen]

    def check_idle(self, ranks: Iterable[int]) -> None:
        """Refuse (``CellTimeout``) if a chosen rank is really still running earlier work.

        The refusal names that work and, from a fresh look at the rank's stack, where it is blocked.
        """
        stuck = self.busy.still_running(ranks, self.engine_ids, self.client)
        if not stuck:
            return
        entries = {r: self.busy.entry(r) for r in stuck}
        code = next((e.code for e in entries.values() if e is not None and e.code), "")
        stacks = dump_stacks({r: self._ranks[r] for r in stuck}, self.scratch_dir, code)
        leaving = [r for r in stuck if r in stacks and stacks[r].note == NO_CELL_CODE]
        if leaving:  # out of the cell's code (IPython formats its error, or it replies): its result is coming
            done = set(leaving) - set(self.busy.still_running(leaving, self.engine_ids, self.client, settle=LEAVING))
            stuck = [r for r in stuck if r not in done]
            if not stuck:
                return
        what = {e.what for e in entries.values() if e is not None}
        where = {stacks[r].blocked_in for r in stuck if r in stacks}
        blocked = f", blocked in {where.pop()}" if len(where) == 1 and "" not in where else ""
        raise CellTimeout(
            f"{ranks_text(stuck)} still running {what.pop() if len(what) == 1 else 'earlier work'}{blocked}; "
            f"run the ranks it waits for, or run `{init_command(self.spec)}` to restart the engines",
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
            if lost_since is None and (self.lost_ranks(ranks) or any(_died(ar) for _, ar in ars)):
                lost_since = now
            if lost_since is not None and now - lost_since >= LOST_GRACE:
                break
            pending[0].wait(step if until is None else max(0.0, min(step, until - now)))
        return self._lost_with_causes(ars)

    def _lost_with_causes(self, ars: list[tuple[int, Any]]) -> dict[int, str]:
        """Lost ranks among ``ars``; a task that failed with EngineError before the watcher
        noticed waits (briefly) for the watcher's cause."""
        died = [r for r, ar in ars if _died(ar)]
        watched = self._watcher is not None and any(self._ranks[r].host == socket.gethostname() for r in died)
        deadline = time.monotonic() + (PERIOD + STATUS_WAIT + 0.2 if watched else 0.0)
        while set(died) - set(self.lost_ranks(died)) and time.monotonic() < deadline:
            time.sleep(0.02)
        lost = self.lost_ranks([r for r, _ in ars])
        for r in died:
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
        ars = [(r, client[e].apply_async(fn, *args, **kwargs)) for r, e in pairs]
        lost = self.wait_ranks(ars, None if timeout is None else time.monotonic() + timeout)
        results: list[Any] = []
        failures: list[tuple[int, Exception]] = []
        running: list[int] = []
        for r, ar in ars:
            results.append(None)
            if r in lost:
                continue
            if not ar.ready():
                running.append(r)
                name = getattr(fn, "__name__", "a function")
                self.busy.add(r, BusyEntry(self._ranks[r].engine_id, ar, client, f"an earlier run({name})"))
                continue
            try:
                results[-1] = ar.get(timeout=0)
            except Exception as e:
                failures.append((r, e))
        if not (lost or failures or running):
            return results
        parts = [f"rank {r}: {_one_line(e)}" for r, e in failures]
        if lost:
            parts.insert(0, lost_text(lost))
        if running:
            why = "probably blocked waiting for the lost rank" if lost else f"still running after {timeout:g} s"
            parts.append(f"{ranks_text(running)} {why}")
        if lost or running:
            parts.append(RECOVER_HINT)
        bad = sorted([*lost, *running, *(r for r, _ in failures)])
        err = RankLost if lost else CellTimeout if running else RankError
        raise err("; ".join(parts), bad)

    # ---- teardown -----------------------------------------------------
    def _destroy_ranks(self, quiet: bool = False, timeout: float = 10.0) -> None:
        if self._pool is None or self._pool.client is None:
            return
        alive = set(self._pool.ids())
        ars = [self.client[e.engine_id].apply_async(engine.destroy) for e in self._ranks
               if e.engine_id in alive and e.pid not in self._lost]
        deadline = time.monotonic() + timeout
        errors = []
        for ar in ars:
            try:
                ar.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:
                errors.append(_one_line(e))
        if self._store_dir is not None:
            self._store_dir.remove()
            self._store_dir = None
        if errors and not quiet:
            raise RankError("destroy_process_group: " + "; ".join(errors) + f"; {RECOVER_HINT}")

    def destroy(self) -> None:
        """``destroy_process_group()`` on every rank; engines stay for a fast re-init."""
        with self._lock:
            self._look()
            if self._broken:
                raise WorldBroken(f"{self._broken}; {RECOVER_HINT}", list(range(len(self._ranks))))
            self._step = "destroying the process group"
            try:
                self._destroy_ranks()
            except KeyboardInterrupt:
                raise self._interrupted("destroy", fresh=False) from None
            finally:
                self._step = ""
            self._set_rows((replace(r, state="destroyed", error="") if r.state != "lost" else r
                            for r in self._snapshot.ranks), phase="destroyed", message="")

    def _stop_pool(self, grace: float = 1.0) -> bool:
        """Stop everything this world started (SIGTERM, SIGKILL after ``grace`` s); True if Ctrl-C was
        pressed meanwhile (it waits till the end)."""
        with deferred() as note:
            self._stop_watching()
            pool, self._pool = self._pool, None
            token = self._reaper.token if self._reaper is not None else None
            if pool is not None:
                with contextlib.suppress(Exception):
                    # with a rank lost, the others may be stuck waiting for it: no polite destroy; nor when
                    # the ranks are not all initialised (a rank in the rendezvous would make destroy wait)
                    if pool.client is not None and not self.lost_ranks() and self.is_initialized:
                        self._pool = pool
                        self._destroy_ranks(quiet=True, timeout=2.0)
                        self._pool = None
                try:
                    pool.stop([e.pid for e in self._known.values()], grace=grace)
                except Exception as e:  # a half-started cluster: the sweep below still stops its processes
                    _log.debug("stopping the pool: %s", e)
            if token is not None:  # anything started late (an interrupted start goes on in ipyparallel's thread)
                kill_all(owned_by_token(token), grace=0.5)
            for owned in (self._store_dir, self._scratch):
                if owned is not None:
                    owned.remove()
            self._store_dir = self._scratch = None
            if self._reaper is not None:
                self._reaper.release()
                self._reaper = None
            self._known.clear()
            self._ranks = []
            self._lost.clear()
            self._kinds.clear()
            self._forked.clear()
            self._dead_zygotes.clear()
            self._broken, self._broken_status = "", None
            self._inflight = []
            self.busy.clear()  # nothing of the stopped engines runs any more
        return note.seen

    def shutdown(self) -> None:
        """Destroy the group, then stop the engines and controller pgnb started.

        Ctrl-C does not stop a shutdown half way: it finishes, then raises ``Interrupted``.
        """
        with self._lock:
            phase = "stopping the engines and the controller"
            seen = self._stop_pool()
            self._set_rows((replace(r, state="destroyed", error="") if r.state != "lost" else r
                            for r in self._snapshot.ranks), phase="shut down", message="")
            if seen:
                raise Interrupted("shutdown", phase, "pgnb finished stopping them first: nothing is running")


setattr(World.__init__, "__signature__", keywords_signature(World.__init__))  # noqa: B010 - help() shows the options


def _ename(exc: BaseException) -> str:
    """The remote exception's name (ipyparallel wraps engine-side errors in RemoteError)."""
    return str(getattr(exc, "ename", None) or type(exc).__name__)


def _died(ar: Any) -> bool:
    """The task failed because its engine died (ipyparallel says EngineError)."""
    if not ar.ready():
        return False
    try:
        ar.get(timeout=0)
    except Exception as e:
        return _ename(e) == "EngineError"
    return False


@atexit.register
def _shutdown_all() -> None:
    for sb in list(_LIVE):
        with contextlib.suppress(Exception):
            sb.shutdown()
