"""Engines from ipyparallel: start, grow, attach, kill, stop.

Everything here goes through ``ipyparallel.Cluster`` and its launchers
(``local``, ``mpi``, ``slurm``, ``ssh``, pgnb's own ``pgnb.fork``); pgnb
never launches engines by hand. A local cluster binds to loopback only.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse

from ..errors import RECOVER_HINT, EngineStartError, SpecError
from ..procs import ipcontroller_config, prefork
from ..procs.ownership import cluster_files, sweep, write_state
from ..procs.processes import OWNER_ENV, ProcessKind, kill_all, owned_by_token, process_running, process_state
from ..procs.reaper_handle import Reaper
from ..procs.spawning import undebugged
from ..rank import engine
from ..spec import LOCAL_LAUNCHERS
from . import batchjobs
from .files import private_file
from .liveness import STATUS_WAIT, describe_exit, logged_exception
from .registration import MissedNotices
from .remote import is_local
from .rendezvous import EngineInfo
from .waiting import poll_until

#: How often the controller pings engines (ms). ipyparallel's 3 s default
#: makes every registration wait up to 3 s; 100 ms is cheap on one machine.
HEARTBEAT_MS = 100
ENGINE_START_TIMEOUT = 120.0
OUT_STREAM = "pgnb.rank.streams.PythonOutStream"  # named, not imported: the engines load it
#: Modules the fork launcher's zygote imports besides torch, once for all its engines (pgnb.testing.torch_suites
#: adds torch's test harness while it runs torch's suites: ~1-3 s less per world on 2 cores).
ZYGOTE_PRELOAD: list[str] = []
#: Engines of local launchers (``pgnb.spec.LOCAL_LAUNCHERS``) are started as soon as the controller
#: process is (not once it has written its connection files) and read those files themselves,
#: so a zygote imports torch while the controller boots (~0.6-1 s less per cold start here).
#: Launchers pgnb keeps on loopback (one machine). Others (slurm, ssh, pbs, ...) listen where the profile says.
LOOPBACK_LAUNCHERS = (*LOCAL_LAUNCHERS, "mpi")


def fork_zygotes(count: int) -> str:
    """Fork ``count`` zygotes from this process now, for the next worlds' fork launchers to take (they have
    what this process imported; ``pgnb.procs.prefork``); "" when done, else why none was forked."""
    return prefork.fork_dormant(count, list(ZYGOTE_PRELOAD))


def close_zygotes() -> None:
    """End the forked zygotes no world took."""
    prefork.close_dormant()


def fork_waiting(then: Callable[[dict[str, Any]], int], log: str) -> prefork.Waiting | str:
    """A child forked from this process now, that waits to be woken and then exits with ``then(message)``
    (``pgnb.procs.prefork.fork_waiting``); why not, if it cannot be forked."""
    return prefork.fork_waiting(then, log)


_log = logging.getLogger("pgnb")
# ipyparallel's Cluster logs from its own threads (engine output, "engine set stopped {...}"),
# which in a kernel lands in the notebook's stdout; pgnb reports outcomes itself.
_ipp_log = logging.getLogger("pgnb.ipyparallel")
_ipp_log.addHandler(logging.NullHandler())
_ipp_log.propagate = False

#: engine pid -> exit status (negative: the signal that killed it), as ipyparallel's local launcher reaped it
_EXIT_STATUS: dict[int, int] = {}
_EXIT_STATUS_KEEP = 256
_local_engine_set: type | None = None
_local_controller: type | None = None
_reaped: type | None = None
#: While not None, a local controller started by this pid waits for its process in a thread only once
#: ``start_deferred_waits`` runs (each thread's start is kept here meanwhile).
_deferred_waits: tuple[int, list[Callable[[], None]]] | None = None


def exit_status(pid: int) -> int | None:
    """How a local engine ended, once its launcher has reaped it (None: not known / still running)."""
    return _EXIT_STATUS.get(pid)


def _record_exit(pid: int, status: int) -> None:
    while len(_EXIT_STATUS) >= _EXIT_STATUS_KEEP:
        _EXIT_STATUS.pop(next(iter(_EXIT_STATUS)))
    _EXIT_STATUS[pid] = status


def _reaped_process() -> type:
    """A ``psutil.Process`` whose ``wait`` records the exit status it reaps (see ``exit_status``)."""
    global _reaped
    if _reaped is None:
        import psutil

        class _Reaped(psutil.Process):  # type: ignore[misc]
            def wait(self, timeout: float | None = None) -> Any:
                status = super().wait(timeout)
                if status is not None:
                    _record_exit(self.pid, int(status))
                return status

        _reaped = _Reaped
    return _reaped


def local_engine_set() -> type:
    """ipyparallel's ``local`` engine-set launcher, unchanged except that it remembers exit statuses
    and starts its engines outside the kernel's debugger (:mod:`pgnb.procs.spawning`).

    Its wait thread reaps each engine (the kernel is the engines' parent); the
    status it gets is otherwise only delivered through the launcher's event
    loop, which does not run between cells. pgnb reports it as the cause when
    a rank is lost ("killed by SIGSEGV").
    """
    global _local_engine_set
    if _local_engine_set is None:
        from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

        reaped = _reaped_process()

        class _Engine(LocalEngineLauncher):  # type: ignore[misc]
            def start(self) -> Any:
                with undebugged():
                    return super().start()

            def _wait(self) -> None:
                with contextlib.suppress(Exception):  # no process, or an ipyparallel without it: no cause
                    self.process = reaped(self.pid)
                super()._wait()

        class _EngineSet(LocalEngineSetLauncher):  # type: ignore[misc]
            entrypoint_name = "local"  # what the cluster file and `ipcluster` call it
            launcher_class = _Engine

        _local_engine_set = _EngineSet
    return _local_engine_set


def local_controller() -> type:
    """ipyparallel's ``local`` controller launcher, remembering how the controller ended and starting it
    outside the kernel's debugger (as engines do)."""
    global _local_controller
    if _local_controller is None:
        from ipyparallel.cluster.launcher import LocalControllerLauncher

        reaped = _reaped_process()

        class _Controller(LocalControllerLauncher):  # type: ignore[misc]
            entrypoint_name = "local"  # what the cluster file and `ipcluster` call it

            def start(self) -> Any:
                with undebugged():
                    return super().start()

            def _start_waiting(self) -> None:
                if _deferred_waits is not None and _deferred_waits[0] == os.getpid():  # pgnb.core.head_start
                    _deferred_waits[1].append(super()._start_waiting)  # no thread until the forks are done
                else:  # a process forked meanwhile (the kept one) defers nothing
                    super()._start_waiting()

            def _wait(self) -> None:
                with contextlib.suppress(Exception):
                    self.process = reaped(self.pid)
                super()._wait()

        _local_controller = _Controller
    return _local_controller


def defer_waits() -> None:
    """From now on, a local controller started waits for its process in no thread, until
    ``start_deferred_waits``: this process may still fork (``pgnb.procs.prefork``)."""
    global _deferred_waits
    if _deferred_waits is None or _deferred_waits[0] != os.getpid():
        _deferred_waits = (os.getpid(), [])


def can_defer_waits() -> bool:
    """ipyparallel's local launchers still start their waiting thread where ``defer_waits`` defers it."""
    from ipyparallel.cluster.launcher import LocalProcessLauncher

    return callable(getattr(LocalProcessLauncher, "_start_waiting", None))


def start_deferred_waits() -> None:
    """Start the threads that wait on the controllers started since ``defer_waits``; defer no more."""
    global _deferred_waits
    pending, _deferred_waits = _deferred_waits, None
    for start in pending[1] if pending is not None and pending[0] == os.getpid() else []:
        start()


def with_local_controller(cluster: Any) -> Any:
    """``cluster`` with pgnb's local controller launcher where its profile left ipyparallel's: the controller
    is then a Python process of this machine, which starts outside the kernel's debugger too."""
    from ipyparallel.cluster.launcher import LocalControllerLauncher

    if cluster.controller_launcher_class is LocalControllerLauncher:
        cluster.controller_launcher_class = local_controller()
    return cluster


def mpi_environment(environ: Mapping[str, str] | None = None, is_root: bool | None = None) -> dict[str, str]:
    """What ``mpiexec`` (OpenMPI 4) needs to start a notebook-sized world on one machine.

    A laptop user asking for ``--launcher mpi --world 4`` on 2 cores expects it
    to work: OpenMPI refuses more ranks than cores unless oversubscription is
    allowed, and refuses root (containers, CI) without two variables. Set as
    environment, not as ``--oversubscribe``/``--allow-run-as-root``
    arguments, so another MPI (MPICH ignores ``OMPI_*``) is not handed
    options it rejects. ``mca_base_env_list`` forwards pgnb's owner token to
    ranks on other nodes too (OpenMPI passes the local environment on only
    locally). A user's own settings in ``environ`` win.
    """
    environ = os.environ if environ is None else environ
    root = (os.geteuid() == 0) if is_root is None else is_root
    env = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mca_base_env_list": f"{OWNER_ENV};TORCH_CPP_LOG_LEVEL"}
    if root:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return {k: v for k, v in env.items() if k not in environ}


def _stop_sync_thread(cluster: Any) -> None:
    """Stop the event-loop thread ipyparallel started for this Cluster's ``*_sync`` calls.

    Called from a running event loop (a Jupyter kernel), ipyparallel runs them
    on a thread and loop of the Cluster's own and never stops it: without this
    every ``%pg_init --force`` would leave a thread and three fds in the kernel.
    """
    loop, thread = getattr(cluster, "_thread_loop", None), getattr(cluster, "_async_thread", None)
    if loop is None or thread is None:
        return
    with contextlib.suppress(Exception):
        loop.add_callback(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
            cluster._async_thread = None


def _first_message(output: str) -> str:
    """The first sentence of a launcher's complaint (mpiexec frames it in dashes, over several lines)."""
    lines = [ln.strip() for ln in output.splitlines()]
    words: list[str] = []
    for ln in lines:
        if not ln or set(ln) <= {"-", "="} or ln.startswith(("[IPEngine", "[IPController")):
            if words:
                break
            continue
        words.append(ln)
        if ln.endswith((".", ":")):
            break
    return " ".join(words).rstrip(":")


def _launcher_exited(engine_set: Any) -> bool:
    """The launcher's process (mpiexec, srun, ...) is gone, whether or not its event loop has said so yet."""
    if getattr(engine_set, "state", "running") == "after":
        return True
    proc = getattr(engine_set, "process", None)  # psutil.Process for process-based launchers
    if proc is None or getattr(engine_set, "state", None) != "running":
        return False
    return process_state(int(proc.pid)) != "running"  # a zombie, or reaped already


def _preload_serializer() -> None:
    """Do the imports ipyparallel's first ``apply`` does (its canning map: numpy, ~0.1 s)."""
    with contextlib.suppress(Exception):  # an optimisation only: the first apply imports them anyway
        from ipyparallel.serialize import canning

        canning.can(None)


@contextlib.contextmanager
def _quiet() -> Any:
    """ipyparallel prints progress and logs to stdout/stderr; nbval would see it."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def claim_files(cluster: Any, launcher: str, reaper: Reaper | None) -> str | None:
    """Before ``cluster``'s controller writes anything: sweep up after dead owners, then mark the cluster as
    ``reaper``'s; the state file written, if any.

    The state file lets a later pgnb (or this world's reaper) prove these
    files are pgnb's; the cluster file is made 0600 before ipyparallel
    writes into it (it would be 0644; the connection files are 0600 already).
    """
    profile_dir = str(cluster.profile_dir)
    try:
        removed = sweep(profile_dir)
    except Exception as e:  # never let cleanup of someone's leftovers block a start
        _log.debug("sweep of %s: %s", profile_dir, e)
        removed = []
    if removed:
        _log.info("pgnb removed %d leftover file(s) of a dead kernel's cluster", len(removed))
    if reaper is None:
        return None
    state_file = write_state(profile_dir, str(cluster.cluster_id), reaper.token)
    reaper.own_cluster(state_file)
    private_file(str(cluster.cluster_file))
    if launcher not in LOOPBACK_LAUNCHERS:  # engines elsewhere (ssh, slurm): only their launcher reaches them
        reaper.own_launched(str(cluster.cluster_file))
    return state_file


class EnginePool:
    """An ipyparallel controller + engines, started by pgnb or attached to."""

    def __init__(
        self,
        launcher: str = "local",
        profile: str | None = None,
        cluster_id: str | None = None,
        reaper: Reaper | None = None,
        profile_dir: str | None = None,
    ) -> None:
        import ipyparallel as ipp

        self.launcher = launcher
        self.attached = profile is not None or cluster_id is not None
        self.reaper = reaper
        self._ipp = ipp
        self.cluster: Any = None
        self.client: Any = None
        self._profile = profile
        self._cluster_id = cluster_id
        self._profile_dir = profile_dir
        self.state_file: str | None = None
        #: what the pool is doing now, in words ("starting the controller", ...): what an interrupt interrupted
        self.step = ""
        #: called in every wait for the engines: raises to stop waiting (a process the world needs died)
        self.check: Callable[[], None] = lambda: None
        #: engines launched earlier that were dead already when the present wait for engines began
        self._dead_before: set[int] = set()
        self._schedulers: list[int] | None = None  # as the controller listed them
        #: what the start waits for in a batch system's queue ("Slurm job 12: PENDING (Resources)"), or ""
        self.queued = ""
        self._next_queue_look = 0.0
        self._missed: MissedNotices | None = None  # while a start's first wait for its engines goes on

    # ---- start / attach -------------------------------------------------
    def connect(self, n: int, progress: Callable[[int, int], None] | None = None) -> None:
        """Start (or attach to) a controller and make sure ``n`` engines are up."""
        if self.attached:
            self._attach()
        elif self.launcher in LOCAL_LAUNCHERS:
            self._start_controller(engines=n)
            self.wait_for(n, progress)
            return
        else:
            self._start_controller()
        self.ensure_engines(n, progress)

    def _attach(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._profile is not None:
            kwargs["profile"] = self._profile
        if self._cluster_id is not None:
            kwargs["cluster_id"] = self._cluster_id
        try:
            with _quiet():
                self.client = self._ipp.Client(**kwargs)
        except (OSError, TimeoutError) as e:
            what = ", ".join(f"{k} {v!r}" for k, v in kwargs.items())
            start = " ".join(["ipcluster start -n N", *(f"--{k.replace('_', '-')} {v}" for k, v in kwargs.items())])
            first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")  # ipyparallel's runs to 3 lines
            raise EngineStartError(
                f"no ipyparallel cluster found for {what}: {first}; start one with `{start}`") from None

    def start_controller(self, engines: int = 0) -> None:
        """Start the controller alone (its engines, ``engines`` of them when local, come later)."""
        self.step = "starting the controller"
        self.cluster = self.make_cluster(engines)
        self.state_file = claim_files(self.cluster, self.launcher, self.reaper)
        with _quiet():
            self.cluster.start_controller_sync()
        self._own_controller()

    def _start_controller(self, engines: int = 0) -> None:
        """Start the controller (unless started ahead), then a local launcher's ``engines``, then connect."""
        early = engines > 0 and self.launcher in LOCAL_LAUNCHERS
        if self.cluster is None:
            self.start_controller(engines)
        if early:
            self.step = "starting the engines (the zygote imports torch)" if self.launcher == "pgnb.fork" \
                else "starting the engines"
            # the kernel only waits while the zygote imports torch: do the first apply's imports meanwhile
            preload = threading.Thread(target=_preload_serializer, name="pgnb-preload", daemon=True)
            preload.start()
            with _quiet():
                self._checked(self.cluster.start_engines_sync, engines)
            preload.join()  # before any apply: both would fill ipyparallel's canning map
        self.step = "connecting to the controller"
        self.check()
        with _quiet():  # the Client waits up to 10 s for a controller that died meanwhile: check while it waits
            self.client = self._checked(self.cluster.connect_client_sync)
        self._missed = MissedNotices(lambda: self._checked(self.cluster.connect_client_sync))

    def make_cluster(self, engines: int = 0) -> Any:
        """The ``ipyparallel.Cluster`` pgnb would start, not started yet.

        The launcher name goes to ipyparallel as it is, and the profile's own
        ``ipcluster_config.py`` (Slurm account, SSH hosts, mpiexec arguments...)
        applies; pgnb adds only its owner token, log levels and, for launchers
        whose engines run on this machine, a loopback-only controller.
        """
        from traitlets.config import Config

        token = self.reaper.token if self.reaper else ""
        cfg = Config()
        # every process pgnb launches carries the owner token, so the reaper can prove ownership
        cfg.BaseLauncher.environment = {OWNER_ENV: token, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        # a rank's cell output is what Python printed, wherever the kernel runs (pgnb.rank.streams)
        cfg.EngineLauncher.engine_args = ["--log-level=WARN", "--IPEngine.out_stream_factory=" + OUT_STREAM]
        early = engines > 0 and self.launcher in LOCAL_LAUNCHERS
        if early:  # the engine polls for the controller's connection file (10 s by default; a loaded machine)
            cfg.EngineLauncher.engine_args.append(f"--IPEngine.wait_for_url_file={ENGINE_START_TIMEOUT:g}")
        if ZYGOTE_PRELOAD:
            from ..procs.forklauncher import ForkEngineSetLauncher

            cfg.ForkEngineSetLauncher.preload = [*(ForkEngineSetLauncher.preload.default() or []), *ZYGOTE_PRELOAD]
        if self.launcher == "ssh":  # ipyparallel's, quiet and all at once when it stops
            from ..procs.sshlauncher import QuietSSHEngineSetLauncher
        if self.launcher in LOCAL_LAUNCHERS:  # the controller's exit status, when it dies (pgnb names the cause)
            kwargs_controller: dict[str, Any] = {"controller": local_controller()}
        else:
            kwargs_controller = {}
        if self.launcher == "mpi":
            # a more specific section replaces BaseLauncher's dict: carry the owner token over
            cfg.MPILauncher.environment = {**cfg.BaseLauncher.environment, **mpi_environment()}
        kwargs: dict[str, Any] = dict(
            engines=local_engine_set() if self.launcher == "local" else
            QuietSSHEngineSetLauncher if self.launcher == "ssh" else self.launcher,
            delay=0,
            # the config file drops one harmless ERROR line per engine (see pgnb/procs/ipcontroller_config.py)
            controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}", "--log-level=WARN",
                             f"--config={ipcontroller_config.__file__}"],
            log_level=logging.WARNING,
            log=_ipp_log,
            shutdown_atexit=False,  # pgnb stops its cluster itself, all engines at once
            send_engines_connection_env=not early,  # True would wait for the controller's files first
            config=cfg,
            **kwargs_controller,
        )
        if self.launcher in LOOPBACK_LAUNCHERS:
            kwargs["controller_ip"] = "127.0.0.1"
        # else (slurm, ssh, pbs, ...): engines on other hosts must reach the controller, so where it
        # listens is the profile's choice (c.Cluster.controller_ip): multi-host is the user's opt-in
        if self._profile_dir:
            kwargs["profile_dir"] = self._profile_dir
        try:
            cluster = self._ipp.Cluster(**kwargs)
        except Exception as e:  # traitlets rejects an unknown launcher name here
            raise SpecError(f"ipyparallel has no engine launcher {self.launcher!r}: {e}") from None
        return with_local_controller(cluster)

    def _checked(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a blocking ipyparallel call) in a thread of its own, calling ``check`` meanwhile.

        Starting engines blocks while the zygote imports torch (seconds); a controller that dies
        meanwhile stops the wait at once instead of when the engines are up. If ``check`` (or Ctrl-C)
        ends the wait, the call goes on in its thread until the caller stops what it started.
        """
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # handed to the caller
                box["error"] = e

        worker = threading.Thread(target=run, name="pgnb-start", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if worker.is_alive():
                self.check()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _own_controller(self) -> None:
        proc = getattr(self.cluster.controller, "process", None)
        if self.reaper and proc is not None:
            self.reaper.own(proc.pid)

    def ensure_engines(self, n: int, progress: Callable[[int, int], None] | None = None) -> None:
        """Grow to at least ``n`` engines (attached clusters cannot grow: say so)."""
        self._dead_before = {pid for pid in self._launched_engines() if not process_running(pid)}
        have = len(self.client.ids)
        if have < n and not self.attached:
            self.step = "starting more engines"
            with _quiet():
                self._checked(self.cluster.start_engines_sync, n - have)
        self.wait_for(n, progress)

    def wait_for(self, n: int, progress: Callable[[int, int], None] | None = None) -> None:
        k = -1  # engines registered at the last look
        self.step = "waiting for the engines to register"

        def registered() -> bool:
            nonlocal k
            self.check()
            last, k = k, len(self.client.ids)
            if k != last and progress:
                progress(min(k, n), n)
            if k >= n:
                self.queued = ""
                return True
            self._check_launchers_alive(n)
            self._check_batch_jobs()
            if self._missed is not None:
                self.client = self._missed.caught_up(self.client, k)
            return False

        found = poll_until(registered, 5.0 if self.attached else ENGINE_START_TIMEOUT)
        self._missed = None  # from now on views and results hold this Client (a failed start is stopped)
        if found:
            return
        if self.attached:
            raise EngineStartError(
                f"the attached cluster has {k} engine(s) but --world asks for {n}; "
                f"start more with `ipcluster engines -n {n - k}` or use --world {k}"
            )
        raise EngineStartError(
            f"only {k} of {n} engines registered within {ENGINE_START_TIMEOUT:.0f} s; "
            "see the engine logs in the IPython profile's log folder"
        )

    def _launched_engines(self) -> list[int]:
        """The pids of the engines pgnb's local launchers started (pgnb.fork and local; others do not say)."""
        pids: list[int] = []
        with contextlib.suppress(Exception):  # the engine sets may change under us
            for engine_set in list(self.cluster.engines.values()):
                pids += [int(p) for p in dict(getattr(engine_set, "engine_pids", {}) or {}).values()]
                for launcher in dict(getattr(engine_set, "launchers", {}) or {}).values():
                    pid = getattr(launcher, "pid", None)
                    if isinstance(pid, int) and pid > 0:
                        pids.append(pid)
        return pids

    def _check_launchers_alive(self, n: int) -> None:
        if self.cluster is None:
            return
        # an engine that dies before all have registered (or one kept from before) makes the wait endless
        dead = [pid for pid in self._launched_engines() if pid not in self._dead_before and not process_running(pid)]
        if dead and len(self.client.ids) < n:
            status: int | None = None

            def reaped() -> bool:
                nonlocal status
                status = self.exit_status(dead[0])
                return status is not None

            poll_until(reaped, STATUS_WAIT)  # the launcher reaps it in a moment
            raise EngineStartError(f"an engine died before all {n} had registered "
                                   f"({describe_exit(status)}); {RECOVER_HINT}")
        sets = list(self.cluster.engines.values())
        if sets and all(_launcher_exited(s) for s in sets):
            output = ""
            with contextlib.suppress(Exception):
                output = sets[-1].get_output()
            raise EngineStartError(
                f"the {self.launcher!r} launcher's engines exited before registering"
                + (f": {line}" if (line := _first_message(output)) else "")
            )

    def _check_batch_jobs(self) -> None:
        now = time.monotonic()
        if self.cluster is not None and now >= self._next_queue_look:  # squeue is a process: not every look
            self._next_queue_look = now + 0.5
            self.queued = batchjobs.check_queue(self.cluster)

    def controller_error(self) -> str:
        """The last exception in the log of this pool's local controller, "" if none (any thread)."""
        controller = getattr(self.cluster, "controller", None)
        path = getattr(controller, "output_file", "") if self.launcher in LOCAL_LAUNCHERS else ""
        return logged_exception(path) if path else ""

    def ended_job(self) -> str | None:
        """How the batch job of these engines ended, if it has ("Slurm job 12 was cancelled"); any thread."""
        return batchjobs.ended_job(self.cluster) if self.cluster is not None else None

    # ---- facts about engines -----------------------------------------
    def exit_status(self, pid: int) -> int | None:
        """How engine ``pid`` ended, if its launcher knows (any thread: no Client, no event loop)."""
        status = exit_status(pid)
        if status is None and self.cluster is not None:
            with contextlib.suppress(Exception):  # the engine sets may change under us
                for engine_set in list(self.cluster.engines.values()):
                    known = getattr(engine_set, "exit_status", None)  # pgnb.fork's launcher has one
                    status = known(pid) if callable(known) else None
                    if status is not None:
                        break
        return status

    def ids(self) -> list[int]:
        return sorted(self.client.ids)

    def controller_host(self) -> str:
        cfg = getattr(self.client, "_config", {}) or {}
        host = urlparse(str(cfg.get("interface", ""))).hostname or ""
        if host in ("", "*", "0.0.0.0", "::"):
            host = str(cfg.get("location") or "127.0.0.1")
        return host

    def describe(self, ids: list[int], timeout: float = 30.0) -> list[EngineInfo]:
        """Ask every engine who and where it is (before any torch import)."""
        host = self.controller_host()
        self.step = "asking the engines who they are"
        ars = {eid: self.client[eid].apply_async(engine.describe, host) for eid in ids}
        self.wait_all(list(ars.values()), timeout)
        infos = []
        for eid, ar in ars.items():
            d = ar.get(timeout=0)
            infos.append(EngineInfo(engine_id=eid, pid=d["pid"], host=d["host"], addr=d["addr"],
                                    iface=d["iface"], launcher_rank=d["launcher_rank"],
                                    nanny_pid=d["nanny_pid"]))
            if is_local(infos[-1]) and self.reaper and not self.attached:  # a pid elsewhere names nothing here
                # its zygote too: one forked from this process (pgnb.procs.prefork) carries no owner token
                for pid in (d["pid"], d["nanny_pid"], self.forked_by().get(d["pid"], (0,))[0]):
                    if pid:
                        self.reaper.own(pid)
        return infos

    def warm_up(self, ids: list[int], timeout: float = 120.0) -> None:
        """Import torch on these engines, all at once."""
        self.step = "importing torch on the engines"
        ars = [self.client[eid].apply_async(engine.warm_up) for eid in ids]
        self.wait_all(ars, timeout)
        for ar in ars:
            ar.get(timeout=0)

    def wait_all(self, ars: list[Any], timeout: float) -> None:
        """Wait for every result (``check`` between looks), at most ``timeout`` seconds; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        for ar in ars:
            while not ar.ready():
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    ar.get(timeout=0)  # ipyparallel's own TimeoutError
                ar.wait(min(0.1, max(left, 0.0)))

    # ---- the processes a world depends on ----------------------------
    def processes(self) -> dict[ProcessKind, list[int]]:
        """The local processes of this pool by kind (``controller``, ``scheduler``, ``zygote``, ``nanny``),
        as far as they are known now. Engines are asked for themselves (``describe``)."""
        out: dict[ProcessKind, list[int]] = {"controller": [], "scheduler": [], "zygote": [], "nanny": []}
        cluster = self.cluster
        if cluster is None or self.attached:
            return out
        proc = getattr(cluster.controller, "process", None)
        if proc is not None:
            out["controller"].append(proc.pid)
            listed = self._listed_schedulers()
            if listed is not None:  # the controller's own list (pgnb/procs/ipcontroller_config.py)
                out["scheduler"] += listed
            else:
                with contextlib.suppress(Exception):  # gone, or not started yet
                    out["scheduler"] += [c.pid for c in proc.children(recursive=True)]
        with contextlib.suppress(Exception):  # the engine sets may change under us
            for engine_set in list(cluster.engines.values()):
                zygote = getattr(engine_set, "zygote_pid", -1)
                if zygote and zygote > 0:
                    out["zygote"].append(int(zygote))
                out["nanny"] += [int(p) for p in dict(getattr(engine_set, "nanny_pids", {})).values()]
        return out

    def _listed_schedulers(self) -> list[int] | None:
        """The pids the controller listed once it started them (None: not yet); ``exit_status`` keeps those ended."""
        if self._schedulers is None:
            listed = ipcontroller_config.read_schedulers(str(self.cluster.profile_dir), str(self.cluster.cluster_id))
            if listed is None:
                return None
            self._schedulers = list(listed)
            for pid, code in listed.items():
                if code is not None:
                    _record_exit(pid, code)
        return self._schedulers

    def forked_by(self) -> dict[int, tuple[int, int | None]]:
        """``engine pid -> (zygote pid, nanny pid)`` for engines pgnb's fork launcher started."""
        out: dict[int, tuple[int, int | None]] = {}
        cluster = self.cluster
        if cluster is None:
            return out
        with contextlib.suppress(Exception):
            for engine_set in list(cluster.engines.values()):
                zygote = int(getattr(engine_set, "zygote_pid", -1))
                nannies = dict(getattr(engine_set, "nanny_pids", {}))
                for key, pid in dict(getattr(engine_set, "engine_pids", {})).items():
                    out[int(pid)] = (zygote, nannies.get(key))
        return out

    # ---- stopping -------------------------------------------------------
    def kill_engines(self, infos: list[EngineInfo], timeout: float = 5.0) -> None:
        """SIGKILL engines that are stuck (a rank in a gloo wait ignores SIGINT), then wait until the
        Client has dropped them."""
        if self.attached:
            return
        self.kill(infos)
        ids = {e.engine_id for e in infos}
        poll_until(lambda: not ids & set(self.client.ids), timeout)

    def kill(self, infos: list[EngineInfo]) -> None:
        """SIGKILL these engines, all at once: by pid on this host; on other hosts, where their pids
        name nothing of this machine, through their nannies (the controller relays the signal)."""
        kill_all([e.pid for e in infos if is_local(e)], grace=0.0)
        targets = [e.engine_id for e in infos if not is_local(e)]
        if targets and self.client is not None:
            with contextlib.suppress(Exception):  # gone already: nothing to kill
                self.client.send_signal("SIGKILL", targets=targets, block=False).wait(2.0)

    def stop(self, engine_pids: list[int], grace: float = 1.0) -> None:
        """Stop what pgnb started: every engine at once (``engine_pids``: those on this host; the
        launchers stop the others), then the controller.

        An attached cluster is only disconnected: pgnb never stops what it did not start.
        """
        client, self.client = self.client, None
        if self.attached or self.cluster is None:
            if client is not None:
                client.close()
            return
        # the nannies by pid: those a zygote forked from this process made (pgnb.procs.prefork) carry no token
        pids = [*engine_pids, *self.processes()["nanny"], *(owned_by_token(self.reaper.token) if self.reaper else ())]
        if client is not None:
            client.close()
        kill_all(pids, grace=grace, awaited=list(engine_pids))  # all at once; ipyparallel would stop them one by one
        with _quiet():
            try:
                self.cluster.stop_cluster_sync()
            except Exception as e:  # already-dead launchers: nothing left to stop
                _log.debug("stop_cluster: %s", e)
            self.cluster.remove_cluster_file()
        _stop_sync_thread(self.cluster)
        if self.state_file is not None:  # what ipyparallel leaves (the hub's engine state); logs stay for debugging
            for path in cluster_files(str(self.cluster.profile_dir), str(self.cluster.cluster_id), logs=False):
                with contextlib.suppress(OSError):
                    os.remove(path)
            self.state_file = None
        self.cluster = None
