"""The bottom of the kernel side: one torch.distributed world's lifecycle and state (no IPython).

``World`` starts (or reuses) ipyparallel engines (``hosting``), makes each one a
rank, initialises the default process group on all of them at once under its own
deadline (``rendezvous_run``), answers status queries from the ranks themselves
(``status``), keeps what the liveness watcher learns (``health``), and stops
everything it started; Ctrl-C leaves each of these coherent. Views subscribe with
``add_listener`` and render ``snapshot()``; nothing here draws. Work goes to the
ranks through ``pgnb.core.dispatch``; ``pgnb.Sandbox`` is the facade over all.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from enum import Enum
from typing import Any

from .._wire import RankState
from ..errors import (
    RECOVER_HINT,
    EngineStartError,
    InitError,
    Interrupted,
    PgnbError,
    RankError,
    WorldBroken,
)
from ..spec import WorldSpec, keywords_signature
from . import head_start
from .busy import Busy
from .cluster import EnginePool, exit_status
from .files import OwnedDir
from .health import Health
from .hosting import Hosting
from .interrupts import deferred
from .remote import error_line
from .rendezvous import EngineInfo, engines_wanted, keep_rank_numbers
from .rendezvous_run import Rendezvous
from .snapshot import RankStatus, Snapshot, fresh_rows
from .status import ask_ranks
from .text import ranks_text, reinit_note

STATUS_TIMEOUT = 5.0
#: Cold starts of a controller that failed as it started (a process of it exited with status 1, or its log
#: says a port was taken where the controller reaped it first) before pgnb reports it. ipyparallel picks
#: each of the controller's ~20 ports by binding port 0 and closing it; a scheduler process binds it a
#: moment later, and another process can take it in between (seen here: 1 in 60 forced restarts with
#: three worlds starting at once, "Address already in use"). A fresh controller picks fresh ports. A
#: controller killed by a signal is not started again.
CONTROLLER_STARTS = 2
#: After Ctrl-C in a re-init, how long ranks already in the rendezvous get to finish before their
#: engines are stopped (a rank blocked in gloo's connect ignores SIGINT).
INTERRUPT_SETTLE = 0.5
#: The cause a rank replaced after a failed init is lost for, until the next init makes it a rank again.
REPLACED = "engine replaced: it did not join the last init"
#: The cause a rank stuck in earlier work (a gloo collective ignores SIGINT) is lost for, once a re-init stopped it.
STUCK = "engine stopped: it was stuck in earlier work"


class Step(Enum):
    """What the lifecycle call in progress does now: what an interrupt interrupts (the value says it)."""

    CHECKING = "checking the running world"
    STOPPING = "stopping the engines that were running"
    DESTROYING_PREVIOUS = "destroying the previous process group"
    STARTING_ENGINES = "starting engines"
    RENDEZVOUS = "in the rendezvous (init_process_group)"
    DESTROYING = "destroying the process group"


_LIVE: weakref.WeakSet[World] = weakref.WeakSet()
_log = logging.getLogger("pgnb")


class World:
    """A torch.distributed world on ipyparallel engines: its lifecycle and its state.

    ``World(spec=...)`` or ``World(backend="gloo", world=4, ...)`` with the options of
    ``pgnb.spec.WorldSpec`` (validated before anything starts).
    """

    def __init__(self, *, spec: WorldSpec | None = None, **options: Any) -> None:
        self.spec = spec or WorldSpec.validate(**options)
        self._hosting: Hosting | None = None  # made at a cold start, stopped whole
        self._ranks: list[EngineInfo] = []
        self._previous: list[EngineInfo] = []  # the ranks before the init in progress (rank order), when engines stay
        self._listeners: list[Callable[[World], None]] = []
        self._lock = threading.RLock()
        # the liveness watcher publishes from its own thread: one publisher at a time
        self._publish_lock = threading.RLock()
        self._scratch: OwnedDir | None = None
        #: what the watcher learnt of this world's processes; replaced whole when they are stopped
        self._health = self._new_health()
        self._zygotes_before: set[int] = set()  # the zygotes there were when the present init began
        self._step: Step | None = None  # what the lifecycle call in progress does now
        self._spec_before = self.spec  # the spec before the init in progress (an interrupted re-init keeps it)
        self._rendezvous: Rendezvous | None = None  # while it runs
        self._next_look = 0.0  # when the start-up wait next looks for new controller/zygote processes
        #: ranks still running an earlier cell; every entry point that talks to the ranks asks it first
        self.busy = Busy()
        self._snapshot = Snapshot(self.spec, fresh_rows(self.spec, "starting"), "new")
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
            if self._health.any_loss():  # a dead engine stays lost whatever the main thread last thought of it
                snap = replace(snap, ranks=tuple(self._health.as_lost(r) for r in snap.ranks))
            self._snapshot = snap
            for fn in list(self._listeners):
                fn(self)

    def _set_rows(self, rows: Iterable[RankStatus], **changes: Any) -> None:
        self._publish(ranks=tuple(rows), **changes)

    # ---- properties -----------------------------------------------------
    @property
    def _pool(self) -> EnginePool | None:
        return self._hosting.pool if self._hosting is not None else None

    @property
    def client(self) -> Any:
        """The ipyparallel ``Client`` (for ``%px`` on the same engines)."""
        return self._pool.client if self._pool else None

    @property
    def hosting(self) -> Hosting | None:
        """What this world's processes run under (its pool, reaper, engines and store), once started."""
        return self._hosting

    @property
    def engine_ids(self) -> list[int]:
        """Engine id of each rank, in rank order."""
        return [e.engine_id for e in self._ranks]

    @property
    def rank_infos(self) -> list[EngineInfo]:
        """What each rank's engine said about itself, in rank order."""
        return list(self._ranks)

    @property
    def health(self) -> Health:
        """What the liveness watcher knows of this world's processes now."""
        return self._health

    @property
    def scratch_dir(self) -> str:
        """This world's 0700 directory: stack dumps and sockets, trace files, FileStores (its reaper removes it too)."""
        if self._scratch is None:
            self._scratch = OwnedDir(prefix="pgnb-stacks-", sockets=True)  # ranks' stack sockets, the debug link
            if self._hosting is not None:  # if the kernel is killed, the reaper removes it with the rest
                self._hosting.own_path(self._scratch.path)
        return self._scratch.path

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
        return self._health.lost_ranks(list(self._ranks), ranks)

    # ---- lifecycle ------------------------------------------------------
    def init(self, spec: WorldSpec | None = None, force: bool = False, keep: bool = False,
             replace: Iterable[int] = ()) -> World:
        """(Re-)initialise as ``spec``: same spec and healthy = no-op; ``force`` = restart engines; a lost
        rank, or one of ``replace`` (stuck: stopped first), is replaced in place (``Sandbox.init``).

        Ctrl-C raises ``Interrupted`` once the state is coherent again: what a cold start (or
        ``force``) had started is stopped; engines that were running before are kept (those stuck
        in the rendezvous are stopped, and the next init replaces them). docs/reliability.md.
        """
        spec = spec or self.spec
        with self._lock:
            before = self._pool
            try:
                return self._init(spec, force, keep, sorted(set(replace)))
            except KeyboardInterrupt:
                raise self._interrupted("init", fresh=self._pool is not before) from None
            except PgnbError:
                raise
            except Exception as e:  # a bug of pgnb's: no half-made world stays behind it
                with deferred():
                    self._stop_pool(grace=INTERRUPT_SETTLE)
                    self._set_rows(fresh_rows(self.spec, "failed"), phase="failed",
                                   message=f"init failed ({error_line(e)}); pgnb stopped the engines; {RECOVER_HINT}")
                raise
            finally:
                self._step = None

    def _init(self, spec: WorldSpec, force: bool, keep: bool, replace: list[int]) -> World:
        self._step = Step.CHECKING
        if (stuck := [self._ranks[r] for r in replace if r < len(self._ranks)]) and self._hosting and not force:
            self._hosting.stop_stuck(stuck, self._health, lost_as=STUCK)  # gloo ignores SIGINT there
        self._health.look()  # a process that died a moment ago decides what can be reused
        if not force and not stuck and spec == self.spec and self.is_initialized and self._healthy() and all(
            r.state == "initialized" for r in self.status()  # a cell may have destroyed the group
        ):
            self._publish()  # listeners redraw; nothing else happens
            return self
        hosting_options = ("launcher", "profile", "cluster_id")
        new_hosting = self._pool is not None and any(getattr(spec, o) != getattr(self.spec, o) for o in hosting_options)
        # a dead controller (or a pool left half made) cannot be reused: start over, as --force would
        unusable = self._pool is not None and (self._health.broken is not None or self._pool.client is None)
        if force or new_hosting or unusable:
            self._step = Step.STOPPING
            if self._stop_pool():
                raise KeyboardInterrupt  # seen while stopping: nothing runs now, say so
        elif self._hosting is not None:
            self._step = Step.DESTROYING_PREVIOUS
            self._hosting.forget_lost(self._health)
            # a world of another size is a new world: no rank keeps what cells defined (docs/cells.md)
            clear = spec.world != self.spec.world and not keep
            if self._snapshot.phase != "destroyed" or clear:  # after %pg_destroy there is nothing to destroy
                self._destroy_ranks(self._hosting, quiet=True, clear=clear)
        # kept engines keep their rank numbers (a rank is never renumbered): new ranks are chosen around them
        self._previous, before = (list(self._ranks), self.spec.world) if self._hosting is not None else ([], None)
        self._spec_before = self.spec
        self.spec = spec
        self._init_world()
        note, fresh = reinit_note(before, spec.world, keep, [e.engine_id for e in self._previous], self.engine_ids)
        self._publish(note=note, fresh=fresh)
        return self

    def sent_to(self, ranks: Iterable[int]) -> None:
        """Work is going to ``ranks``: those among the fresh are fresh no more (with none left, nor is the note)."""
        if not self._snapshot.fresh:
            return
        sent = set(ranks)
        if (fresh := tuple(r for r in self._snapshot.fresh if r not in sent)) != self._snapshot.fresh:
            self._publish(fresh=fresh, **({} if fresh else {"note": ""}))

    def _phase(self) -> str:
        """What the lifecycle call in progress is doing, in words (``starting the controller``, ...)."""
        pool = self._pool
        if self._step is Step.STARTING_ENGINES:
            return pool.step if pool is not None and pool.step else "starting the controller"
        return self._step.value if self._step is not None else "starting"

    def _interrupted(self, action: str, fresh: bool) -> Interrupted:
        """After Ctrl-C in ``action`` (init, destroy): leave a coherent state and say what exists.

        ``fresh``: the pool was started by the interrupted call, so it is stopped, all of it.
        Otherwise the engines are kept; the ranks still in the rendezvous after ``INTERRUPT_SETTLE``
        are stopped (gloo ignores SIGINT there), and the half-made group is destroyed.
        """
        phase = self._phase()
        with deferred():  # a second Ctrl-C must not cut the cleanup short
            if self._pool is None or fresh:
                started = self._hosting is not None
                self._stop_pool(grace=INTERRUPT_SETTLE)  # half started: no need to wait for polite exits
                after = ("pgnb stopped what it had started; " if started else "") + \
                    "nothing is running; run %pg_init to start again"
                self._set_rows(fresh_rows(self.spec, "failed"), phase="failed",
                               message=f"{action} interrupted while {phase}; {after}")
                return Interrupted(action, phase, after)
            stopped = self._settle_after_interrupt()
            kept = "the engines are kept" + (f" ({ranks_text(stopped)} stuck in the rendezvous stopped)"
                                             if stopped else "")
            if action == "destroy":
                after = f"{kept}; the group is destroyed; run %pg_init to make a new one"
                self._set_rows(self._snapshot.rows_now("destroyed"), phase="destroyed",
                               message=f"{action} interrupted while {phase}; {after}")
            else:
                after = f"{kept}; run %pg_init again to make the group"
                if len(self._snapshot.ranks) != len(self._ranks):  # interrupted before the new ranks were chosen
                    if self._spec_before.world == len(self._ranks):
                        self.spec = self._spec_before
                    self._publish(ranks=self._rank_rows("failed"), spec=self.spec)
                self._set_rows(self._snapshot.rows_now("failed", "interrupted"), phase="failed",
                               message=f"{action} interrupted while {phase}; {after}")
            return Interrupted(action, phase, after)

    def _rank_rows(self, state: RankState, world: int | None = None) -> tuple[RankStatus, ...]:
        """A row per rank of ``self._ranks`` (the engines the world has now), each saying ``world`` ranks."""
        spec, n = self.spec, len(self._ranks) if world is None else world
        return tuple(RankStatus(r, n, spec.backend, state, host=e.host, pid=e.pid, engine_id=e.engine_id,
                                launcher_rank=e.launcher_rank) for r, e in enumerate(self._ranks))

    def _settle_after_interrupt(self) -> list[int]:
        """Engines kept after an interrupt: stop those stuck in the rendezvous, destroy the group on the others."""
        run, self._rendezvous = self._rendezvous, None
        stuck = [r for r in run.stuck_after(INTERRUPT_SETTLE) if r < len(self._ranks)] if run is not None else []
        if self._hosting is not None:
            self._hosting.stop_stuck([self._ranks[r] for r in stuck], self._health, lost_as="engine stopped after "
                                     "an interrupt (it was blocked in init_process_group)")
            with contextlib.suppress(Exception):
                self._destroy_ranks(self._hosting, quiet=True, timeout=1.0)
        return stuck

    def _healthy(self) -> bool:
        if self._pool is None or self._pool.client is None or self._health.broken is not None or self.lost_ranks():
            return False
        return set(self.engine_ids) <= set(self._pool.ids())

    # ---- liveness -----------------------------------------------------
    def _new_health(self) -> Health:
        # the watcher's thread calls these: each reads the hosting once (the main thread may swap it)
        return Health(announce=lambda message: self._publish(message=message), rank_of=self._rank_of,
                      exit_status=lambda pid: h.exit_status(pid) if (h := self._hosting) else exit_status(pid),
                      respawn_reaper=lambda pid: h.respawn_reaper(pid) if (h := self._hosting) else None,
                      ended=lambda: h.pool.ended_job() if (h := self._hosting) else None,
                      controller_error=lambda: h.pool.controller_error() if (h := self._hosting) else "")

    def _known(self) -> dict[int, EngineInfo]:
        return self._hosting.known if self._hosting is not None else {}

    def _rank_of(self, pid: int) -> int | None:
        return next((r for r, e in enumerate(self._ranks) if e.pid == pid), None)

    def _watch_pool(self) -> None:
        if self._pool is not None:
            self._health.watch_pool(self._pool.processes())

    def _check_dependencies(self) -> None:
        """Called while engines start: stop waiting once a process they need died (and watch new ones)."""
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + 0.25
            self._watch_pool()
        if (pool := self._pool) is not None and pool.queued != self._snapshot.waiting:  # a batch job in the queue
            self._publish(waiting=pool.queued)
        self._health.check_start(self._zygotes_before, [e.pid for e in list(self._known().values())])

    # ---- start ----------------------------------------------------------
    def _init_world(self) -> None:
        spec = self.spec
        started = time.monotonic()
        self._set_rows(fresh_rows(self.spec, "starting"), phase="starting engines", message="",
                       engines_up=0, started_at=started, spec=spec, generation=self._snapshot.generation + 1, note="",
                       waiting="", fresh=())
        # a zygote of before that dies now costs only its own engines (the lost-engine check sees those)
        self._zygotes_before = self._health.pids_of("zygote")
        try:
            self._start_engines(spec)
        except BaseException as e:
            # anything else than a PgnbError is ipyparallel's or a lost engine's: one line, and a clean slate
            err = e if isinstance(e, (PgnbError, KeyboardInterrupt)) else EngineStartError(
                f"the engines did not start ({self._phase()}: {error_line(e)}); {RECOVER_HINT}")
            self._set_rows(fresh_rows(self.spec, "failed"), phase="failed", message=str(err))
            if self._pool is not None and not isinstance(e, KeyboardInterrupt):
                self._stop_pool()
            if err is e:
                raise
            raise err from None
        rows = list(self._rank_rows("pending", spec.world))
        self._set_rows(rows, phase="rendezvous", waiting="")
        self._step = Step.RENDEZVOUS
        try:
            self._meet(rows)
        finally:
            self._rendezvous = None

    def _start_engines(self, spec: WorldSpec) -> None:
        """Engines up and known, the ranks chosen; a cold start whose controller failed gets a fresh one."""
        for start in range(1, CONTROLLER_STARTS + 1):
            cold = self._pool is None
            try:
                self._ensure_engines(spec)
                self._meet_new_engines()
                return
            except WorldBroken:
                broken = self._health.broken
                if not (cold and broken is not None and broken.failed_by_itself and start < CONTROLLER_STARTS):
                    raise
                # info, not a warning: a warning reaches the cell's stderr, and a recovered start must
                # leave a notebook's recorded outputs as they are (strict nbval compares stderr)
                _log.info("pgnb: %s as it started; starting a new controller", broken.cause)
                self._publish(message=f"{broken.cause} as it started; pgnb is starting a new one")
                if self._stop_pool():
                    raise KeyboardInterrupt from None  # seen while stopping: nothing runs now

    def _ensure_engines(self, spec: WorldSpec) -> None:
        def progress(k: int, n: int) -> None:
            self._publish(engines_up=k)

        self._step = Step.STARTING_ENGINES
        if self._hosting is None:
            with deferred() as note:  # a reaper and a pool that knows it, or neither
                self._hosting = hosting = head_start.hosting_for(spec, self._check_dependencies)
                if hosting.reaper is not None:
                    self._health.watch_pids("reaper", [hosting.reaper.pid])
            if note.seen:
                raise KeyboardInterrupt
            hosting.pool.connect(spec.world, progress)
        else:
            pool = self._hosting.pool
            pool.step = ""
            pool.check = self._check_dependencies
            pool.ensure_engines(engines_wanted(self._previous, pool.ids(), spec.world), progress)
        self._watch_pool()

    def _meet_new_engines(self) -> None:
        """Ask engines not seen before who they are, watch them, import torch on them; choose the ranks."""
        hosting = self._hosting
        assert hosting is not None
        known, pool = hosting.known, hosting.pool
        new = [i for i in pool.ids() if i not in known]
        if new:
            self._publish(phase="importing torch")
            hosting.meet(new, self._health)
        spec = self.spec
        self._ranks = keep_rank_numbers(self._previous, [known[i] for i in pool.ids() if i in known], spec.world,
                                        use_launcher_rank=not spec.local)
        if len(self._ranks) < spec.world:  # one was lost after it registered (the others would wait for it)
            self._health.look()
            raise EngineStartError(f"only {len(self._ranks)} of the {spec.world} engines are up: one was lost "
                                   f"while the world started; {RECOVER_HINT}")

    def _meet(self, rows: list[RankStatus]) -> None:
        """The rendezvous (``pgnb.core.rendezvous_run``): rank 0's store, then every rank's init at once."""
        hosting = self._hosting
        assert hosting is not None
        self._rendezvous = run = Rendezvous(self.spec, hosting.pool.client, self._ranks, self._health)
        try:
            run.send(hosting.pool.wait_all, hosting.new_store)
        except InitError as e:  # rank 0 could not listen
            self._set_rows(fresh_rows(self.spec, "failed"), phase="failed", message=str(e))
            raise
        run.run(rows, self._set_rows, self._recover_after_failed_init)

    def _recover_after_failed_init(self, stuck: list[int], replace_stuck: bool) -> None:
        if self._hosting is not None:
            self._hosting.recover(list(self._ranks), self._health, self.spec.world, stuck, replace_stuck)
            if replace_stuck:  # their engines are gone until the next init meets the new ones: cells refuse them
                self._health.stopped_on_purpose([self._ranks[r] for r in stuck], REPLACED)

    # ---- queries ------------------------------------------------------
    def status(self, timeout: float = STATUS_TIMEOUT) -> list[RankStatus]:
        """Ask every rank what torch says about it; rank order."""
        with self._lock:
            self._health.look()
            client = self.client
            if client is None or self._health.broken is not None:
                self._publish()  # a dead controller's world: every rank is lost, nothing to ask
                return list(self._snapshot.ranks)
            rows = list(self._snapshot.ranks)
            if len(rows) != len(self._ranks):  # never expected; a row per rank whatever the snapshot says
                rows = list(self._rank_rows("failed"))
            rows = ask_ranks(self.spec, client, list(self._ranks), rows, self.busy, self.lost_ranks(), timeout)
            self._set_rows(rows)
            return rows

    # ---- teardown -----------------------------------------------------
    def _destroy_ranks(self, hosting: Hosting, quiet: bool = False, timeout: float = 10.0, clear: bool = False) -> None:
        errors = hosting.destroy_group(self._ranks, self._health, timeout, clear)
        if errors and not quiet:
            raise RankError("destroy_process_group: " + "; ".join(errors) + f"; {RECOVER_HINT}")

    def destroy(self) -> None:
        """``destroy_process_group()`` on every rank; engines stay for a fast re-init."""
        with self._lock:
            self._health.look()
            broken = self._health.broken
            if broken is not None:
                raise WorldBroken(f"{broken.cause}; {RECOVER_HINT}", list(range(len(self._ranks))))
            self._step = Step.DESTROYING
            try:
                if self._hosting is not None:
                    self._destroy_ranks(self._hosting)
            except KeyboardInterrupt:
                raise self._interrupted("destroy", fresh=False) from None
            finally:
                self._step = None
            self._set_rows(self._snapshot.rows_now("destroyed"), phase="destroyed", message="", note="", fresh=())

    def _stop_pool(self, grace: float = 1.0) -> bool:
        """Stop everything this world started (SIGTERM, SIGKILL after ``grace`` s); True if Ctrl-C was
        pressed meanwhile (it waits till the end)."""
        with deferred() as note:
            self._health.stop()  # what dies from here on is pgnb's doing, not a loss
            hosting = self._hosting
            if hosting is not None:
                # with a rank lost, the others may be stuck waiting for it: no polite destroy; nor when
                # the ranks are not all initialised (a rank in the rendezvous would make destroy wait),
                # nor when one still runs earlier work (the destroy would queue behind it)
                client = hosting.pool.client
                if client is not None and not self.lost_ranks() and self.is_initialized and not (
                        self.busy.still_running(range(len(self._ranks)), self.engine_ids, client, settle=0.0)):
                    with contextlib.suppress(Exception):
                        self._destroy_ranks(hosting, quiet=True, timeout=2.0)
                self._hosting = None
                hosting.stop(grace)
            if self._scratch is not None:
                self._scratch.remove()
                self._scratch = None
            self._ranks = []
            self._health = self._new_health()  # nothing learnt of the stopped processes reaches the next ones
            self._rendezvous = None
            self.busy.clear()  # nothing of the stopped engines runs any more
        return note.seen

    def shutdown(self) -> None:
        """Destroy the group, then stop the engines and controller pgnb started.

        Ctrl-C does not stop a shutdown half way: it finishes, then raises ``Interrupted``.
        """
        with self._lock:
            phase = "stopping the engines and the controller"
            seen = self._stop_pool()
            self._set_rows(self._snapshot.rows_now("destroyed"), phase="shut down", message="", note="", fresh=())
            if seen:
                raise Interrupted("shutdown", phase, "pgnb finished stopping them first: nothing is running")


setattr(World.__init__, "__signature__", keywords_signature(World.__init__))  # noqa: B010 - help() shows the options


@atexit.register
def _shutdown_all() -> None:
    # runs after pgnb.core.sandbox's (atexit is last in, first out): what a Sandbox did not shut down
    for world in list(_LIVE):
        if world.hosting is not None:
            with contextlib.suppress(Exception):
                world.shutdown()
