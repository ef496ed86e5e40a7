"""What one world's processes run under: the engine pool, its reaper, the engines met, the store they own.

A ``Hosting`` is made at a cold start (a reaper and a pool that knows it, or
neither: pgnb attached to an ipyparallel cluster it did not start gets no
reaper) and stopped whole: every engine at once, then the controller, then
anything still carrying the world's owner token, then its files. The
``World`` decides when; this knows what there is to stop.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from ..errors import EngineStartError
from ..procs.processes import kill_all, owned_by_token, process_running
from ..procs.reaper_handle import Reaper
from ..rank import engine
from ..spec import WorldSpec
from .cluster import EnginePool
from .files import OwnedDir
from .health import Health
from .remote import error_line, is_local
from .rendezvous import STORE_FILE, EngineInfo
from .sending import send
from .waiting import poll_until

_log = logging.getLogger("pgnb")


class Hosting:
    """The pool of ``spec`` (its launcher, profile, cluster id) and what belongs to it.

    ``check`` is called in every wait for the engines; it raises to stop the wait.
    """

    def __init__(self, spec: WorldSpec, check: Callable[[], None]) -> None:
        self.reaper = Reaper(uuid.uuid4().hex) if not spec.attached else None
        try:
            self.pool = EnginePool(spec.launcher, spec.profile, spec.cluster_id, reaper=self.reaper)
        except BaseException:
            if self.reaper is not None:
                self.reaper.release()
            raise
        self.pool.check = check
        #: every engine met so far, by engine id
        self.known: dict[int, EngineInfo] = {}
        self._store: OwnedDir | None = None

    @property
    def store_dir(self) -> str | None:
        """The directory of pgnb's own ``file://`` store, while one exists."""
        return self._store.path if self._store else None

    def pids(self) -> set[int]:
        """Every live process of this hosting on this machine (engines, nannies, controller, reaper, what the
        launchers started); an engine on another host has a pid there, which names nothing here."""
        known = [e for e in self.known.values() if is_local(e)]
        out = {e.pid for e in known} | {e.nanny_pid for e in known if e.nanny_pid}
        cluster = self.pool.cluster
        ctl = cluster and getattr(cluster.controller, "process", None)
        if ctl is not None:
            out.add(ctl.pid)
        if self.reaper is not None:
            out.add(self.reaper.pid)
            out.update(owned_by_token(self.reaper.token))  # what the launchers started beneath
        # a zygote forked from this process (pgnb.procs.prefork) carries no token
        out.update(pid for pid in self.pool.processes()["zygote"] if process_running(pid))
        return out

    def own_path(self, path: str) -> None:
        """If the kernel is killed, the reaper removes ``path`` with the rest."""
        if self.reaper is not None:
            self.reaper.own_path(path)

    def exit_status(self, pid: int) -> int | None:
        """How ``pid`` ended, if a launcher or the reaper knows (any thread)."""
        status = self.pool.exit_status(pid)
        if status is None and self.reaper is not None:
            status = self.reaper.exit_status(pid)
        return status

    def respawn_reaper(self, pid: int) -> int | None:
        """The reaper ``pid`` died: a new one's pid, told of every process of this world (None: not ours)."""
        reaper = self.reaper
        return reaper.respawn() if reaper is not None and reaper.pid == pid else None

    def meet(self, ids: list[int], health: Health) -> None:
        """Engines not seen before: ask who they are, have ``health`` watch them, import torch on them."""
        infos = self.pool.describe(ids)
        for info in infos:
            self.known[info.engine_id] = info
        health.watch_engines(infos, self.pool.forked_by())
        health.watch_pool(self.pool.processes())
        self.pool.warm_up(ids)

    def stop_stuck(self, infos: list[EngineInfo], health: Health, lost_as: str | None = None) -> None:
        """SIGKILL engines stuck in a wait (a rank in gloo's ignores SIGINT). With ``lost_as`` they stay
        known, lost for that cause, and the next init replaces them once the Client dropped them;
        otherwise they are forgotten at once, the Client having dropped them."""
        if not infos:
            return
        if lost_as is not None:
            health.stopped_on_purpose(infos, lost_as)
            self.pool.kill(infos)
            return
        health.unwatch(e.pid for e in infos if is_local(e))
        self.pool.kill_engines(infos)
        for e in infos:
            self.known.pop(e.engine_id, None)

    def forget_lost(self, health: Health) -> None:
        """Drop dead engines before a re-init, once the Client has noticed they are gone."""
        pool, known = self.pool, self.known
        dead = [e.engine_id for e in known.values() if health.lost_cause(e.pid) is not None]
        if not dead or pool.client is None:
            return
        poll_until(lambda: not set(dead) & set(pool.ids()), 5.0)
        for eid in dead:
            known.pop(eid, None)

    def new_store(self) -> str:
        """A fresh directory for a ``file://`` store, its (empty) store file made; its path."""
        self._store = store = OwnedDir()
        store.private_file(STORE_FILE)  # torch opens it as it is: empty is allowed
        self.own_path(store.path)
        return store.path

    def remove_store(self) -> None:
        if self._store is not None:
            self._store.remove()
            self._store = None

    def destroy_group(self, ranks: list[EngineInfo], health: Health, timeout: float, clear: bool = False) -> list[str]:
        """``destroy_process_group()`` at once on those of ``ranks`` whose engine is up and not lost;
        their errors, one line each. The ``file://`` store goes with the group. ``clear``: their
        namespaces are emptied first (``pgnb.rank.engine.destroy``)."""
        client = self.pool.client
        if client is None:
            return []
        alive = set(self.pool.ids())
        ars = [ar for _, ar in send(client, [(i, e.engine_id) for i, e in enumerate(ranks)
                                             if e.engine_id in alive and health.lost_cause(e.pid) is None],
                                    engine.destroy, clear)]
        deadline = time.monotonic() + timeout
        errors = []
        for ar in ars:
            try:
                ar.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:
                errors.append(error_line(e))
        self.remove_store()
        return errors

    def recover(self, ranks: list[EngineInfo], health: Health, world: int, stuck: list[int],
                replace_stuck: bool) -> None:
        """After a failed init, a state from which the next init works: the ranks ``stuck`` in the
        rendezvous replaced (or, without ``replace_stuck``, stopped and left to the next init to
        replace), the group destroyed on the others."""
        stuck_infos = [ranks[r] for r in stuck]
        self.stop_stuck(stuck_infos, health,
                        lost_as=None if replace_stuck else "engine stopped (it was left waiting for a lost rank)")
        self.destroy_group(ranks, health, timeout=10.0 if replace_stuck else 2.0)  # quiet: what failed is known
        if stuck_infos and not self.pool.attached and replace_stuck:
            with contextlib.suppress(EngineStartError):
                self.pool.ensure_engines(world)

    def stop(self, grace: float) -> None:
        """Stop everything (SIGTERM, SIGKILL after ``grace`` s) and remove its files; the reaper last."""
        try:
            self.pool.stop([e.pid for e in self.known.values() if is_local(e)], grace=grace)
        except Exception as e:  # a half-started cluster: the sweep below still stops its processes
            _log.debug("stopping the pool: %s", e)
        if self.reaper is not None:  # anything started late (an interrupted start goes on in ipyparallel's thread)
            kill_all(owned_by_token(self.reaper.token), grace=0.5)
        self.remove_store()
        if self.reaper is not None:
            self.reaper.release()
