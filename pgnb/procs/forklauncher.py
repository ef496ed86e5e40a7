"""An ipyparallel engine-set launcher that forks engines from a zygote.

``ipyparallel.Cluster(engine_launcher_class="pgnb.fork")`` (entry point) or
``engine_launcher_class="pgnb.procs.forklauncher.ForkEngineSetLauncher"`` starts
each engine set as one zygote process (:mod:`pgnb.procs.zygote`) that imports torch
and the engine once and forks the engines.  Engines are ordinary ipyparallel
engines (nanny included) started with the same arguments and environment the
``local`` launcher would give ``ipengine``; they start without importing torch
again and share its pages copy-on-write.

What differs from the ``local`` launcher:

- ``engine_cmd`` is not used: the engine is ``IPEngine`` in the zygote's
  Python (``sys.executable`` of the launching process); ``engine_args`` are.
- environment variables that act at import time (``OMP_NUM_THREADS``, ...)
  take effect through the zygote, which is started with ``get_env()``; the
  same variables are applied again in each engine before it starts.
- stop signals every engine at once (SIGTERM, then SIGKILL after
  ``stop_seconds_until_kill``) instead of one by one.
- the zygote and its engines die with the launching process (even SIGKILL).
- with ``fork_nanny`` (default) each engine's nanny is forked by the zygote
  too, instead of being a fresh Python process: it runs ipyparallel's own
  ``KernelNanny`` with the same arguments.
- the engines of one set share the zygote's ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from subprocess import PIPE, Popen
from textwrap import indent
from typing import Any

import psutil
from ipyparallel.cluster.launcher import (
    EngineLauncher,
    LauncherError,
    NotRunning,
    ProcessStateError,
)
from tornado.ioloop import IOLoop
from traitlets import Bool, Dict, Float, Integer, List, Unicode

from . import prefork
from .processes import process_state
from .spawning import undebugged

#: How often a waiting coroutine looks at the zygote's events.
_POLL_SECONDS = 0.02


async def _poll(done: Callable[[], bool], timeout: float) -> bool:
    """Look at ``done()`` every ``_POLL_SECONDS`` until it is true or ``timeout`` seconds have passed (``done``
    is asked at least once, and once more at the deadline); whether it became true.

    procs' one polling loop. A launcher's waits are coroutines on ipyparallel's event loop, so they
    cannot block as ``pgnb.core.waiting.poll_until`` does (nor may procs import core); and what they
    wait for is not always an event: the zygote's events are queued by a reader thread whose
    wake-up may go to a loop that is gone, and an attached zygote can only be looked at by pid.
    """
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(_POLL_SECONDS, left))

#: Where this pgnb is imported from: the zygote imports pgnb.procs.zygote from the
#: same place, whatever its working directory (the notebook's) holds.
_PGNB_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The zygote's ``python -c`` program: ``python -m pgnb.procs.zygote`` that finds pgnb.
_ZYGOTE_MAIN = (
    "import sys; p = {path!r}; p in sys.path or sys.path.insert(1, p); "
    "from pgnb.procs.zygote import main; sys.exit(main())"
)


def zygote_command(grace: float, preload: list[str]) -> list[str]:
    """The command that runs a zygote (``python -m pgnb.procs.zygote --grace S --preload M ...``) in this Python."""
    program = _ZYGOTE_MAIN.format(path=_PGNB_PARENT)
    return [sys.executable, "-c", program, "--grace", f"{grace:g}", *(f"--preload={name}" for name in preload)]


def _signal_number(sig: int | str) -> int:
    """``15``, ``"TERM"`` or ``"SIGTERM"`` -> 15, as BaseLauncher.signal documents."""
    if isinstance(sig, str):
        name = sig.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        return int(getattr(signal, name))
    return int(sig)


class ForkEngineSetLauncher(EngineLauncher):  # type: ignore[misc]  # ipyparallel is untyped
    """Launch a set of engines forked from one zygote that has torch imported."""

    preload = List(
        Unicode(),
        ["torch", "torch.distributed"],
        config=True,
        help="""Modules the zygote imports before forking the engines
        (the engine's own modules are always imported).""",
    )

    fork_nanny = Bool(
        True,
        config=True,
        help="""Have the zygote fork each engine's nanny (ipyparallel's
        KernelNanny, same arguments and protocol) instead of the engine
        starting a fresh ``python -m ipyparallel.engine.nanny``.
        Only matters when the engines run with a nanny (IPEngine.enable_nanny).""",
    )

    start_timeout = Float(
        120,
        config=True,
        help="Seconds to wait for the zygote to import and fork every engine.",
    )

    stop_seconds_until_kill = Integer(
        5,
        config=True,
        help="Seconds between SIGTERM and SIGKILL when the engines are stopped.",
    )

    zygote_pid = Integer(-1, help="pid of the zygote process").tag(to_dict=True)

    engine_pids = Dict(help="pid of each engine, by key ('0', '1', ...)").tag(to_dict=True)

    stop_data = Dict()

    def __init__(self, work_dir: str = ".", config: Any = None, **kwargs: Any) -> None:
        super().__init__(work_dir=work_dir, config=config, **kwargs)
        #: None when attached from a cluster file
        self._zygote: Popen[bytes] | prefork.ForkedZygote | None = None
        self._reader: threading.Thread | None = None
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._drain_lock = threading.RLock()
        self._zygote_exit_code: int | None = None
        self._zygote_exited = False
        self._zygote_error = ""
        self._exited: dict[str, dict[str, Any]] = {}
        self._stopping = False
        self._outputs: dict[str, str] = {}
        self._exit_statuses: dict[int, int] = {}  # engine, nanny or zygote pid -> exit status (reader thread)
        #: pid of each engine's nanny, by key, when the zygote forks them (``fork_nanny``)
        self.nanny_pids: dict[str, int] = {}
        #: The zygote's "ready" event: pid, import_seconds, threads (for diagnosis).
        self.zygote_ready: dict[str, Any] = {}

    # -- paths and command -----------------------------------------------------

    def find_args(self) -> list[str]:
        return zygote_command(self.stop_seconds_until_kill, list(self.preload))

    @property
    def _log_dir(self) -> str:
        return os.path.join(self.profile_dir, "log")

    def _engine_output_file(self, key: str) -> str:
        return os.path.join(self._log_dir, f"ipengine-{self.cluster_id}-{self.engine_set_id}-{key}.log")

    @property
    def zygote_output_file(self) -> str:
        return os.path.join(self._log_dir, f"ipengine-{self.cluster_id}-{self.engine_set_id}-zygote.log")

    # -- start -------------------------------------------------------------------

    async def start(self, n: int) -> list[int]:
        """Start the zygote and fork ``n`` engines; return their pids."""
        if self.state != "before":
            raise ProcessStateError(f"The engine set was already started and has state: {self.state}")
        # Events from the reader thread are delivered on the loop we start on.
        self.loop = IOLoop.current()
        self.n = n
        os.makedirs(self._log_dir, exist_ok=True)
        engine_env = self.get_env()
        cwd = os.path.abspath(self.work_dir)
        specs = [
            {
                "key": str(i),
                "argv": list(self.engine_args),
                "env": engine_env,
                "output": self._engine_output_file(str(i)),
                "cwd": cwd,
                "fork_nanny": self.fork_nanny,
            }
            for i in range(n)
        ]
        dormant = prefork.take()
        try:
            if dormant is not None:  # already has torch, and what this process imported (pgnb.procs.prefork)
                self.log.debug("Taking dormant zygote %s", dormant.pid)
                self._zygote = dormant
                self.zygote_pid = dormant.pid
                self._send({"op": "attach", "log": self.zygote_output_file, "grace": self.stop_seconds_until_kill,
                            "env": engine_env, "cwd": cwd, "preload": list(self.preload)})
            else:
                self._zygote = self._start_zygote(engine_env, cwd)
                self.zygote_pid = self._zygote.pid
            self._send({"op": "spawn", "engines": specs})
        except BrokenPipeError:
            pass  # the zygote is already gone: the wait below reports why

        self._reader = threading.Thread(
            target=self._read_events, daemon=True, name=f"pgnb-zygote-reader(pid={self.zygote_pid})"
        )
        self._reader.start()

        failed = False

        def forked_or_failed() -> bool:
            nonlocal failed
            if len(self.engine_pids) >= n:
                return True
            self._drain()
            failed = bool(self._zygote_exited or self._zygote_error)
            return failed

        forked = await _poll(forked_or_failed, self.start_timeout)
        if failed or not forked:
            await self._abandon_zygote()
            if failed:
                raise LauncherError(self._start_failure_message())
            raise TimeoutError(
                f"pgnb zygote did not fork {n} engines in {self.start_timeout:g}s; see {self.zygote_output_file}"
            )
        pids = [self.engine_pids[str(i)] for i in range(n)]
        self.notify_start(pids)
        self._maybe_finished()
        return pids

    def _start_zygote(self, engine_env: dict[str, str], cwd: str) -> Popen[bytes]:
        env = os.environ.copy()
        env.update(engine_env)
        self.log.debug("Starting %s: %r", self.__class__.__name__, self.args)
        with open(self.zygote_output_file, "ab") as log, undebugged():
            return Popen(
                self.args,
                stdin=PIPE,
                stdout=PIPE,
                stderr=log.fileno(),
                env=env,
                cwd=cwd,
                start_new_session=True,  # no SIGINT from the notebook's process group
            )

    def _start_failure_message(self) -> str:
        what = self._zygote_error or f"zygote exited with status {self._zygote_exit_code}"
        tail = self._read_file(self.zygote_output_file).strip().splitlines()[-self.output_limit :]
        message = f"pgnb zygote failed to start engines: {what}"
        if tail:
            message += "\n" + indent("\n".join(tail), "  ")
        return message

    async def _abandon_zygote(self) -> None:
        """After a failed start: make sure the zygote and anything it forked are gone."""
        proc = self._zygote
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()  # its children die with it (PR_SET_PDEATHSIG)
        await self._wait_zygote(self.stop_timeout)
        self._close_pipes()

    # -- the zygote's events -------------------------------------------------------

    def _send(self, command: dict[str, Any]) -> None:
        proc = self._zygote
        if proc is None or proc.stdin is None or proc.stdin.closed:
            raise NotRunning(f"pgnb zygote {self.zygote_pid} is not connected")
        proc.stdin.write((json.dumps(command) + "\n").encode())
        proc.stdin.flush()

    def _read_events(self) -> None:
        """Reader thread: queue every event line, then the zygote's exit."""
        proc = self._zygote
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind in ("exited", "nanny-exited"):
                # Known at once, whether or not an event loop runs the callbacks.
                self._exit_statuses[event["pid"]] = event["exit_code"]
            elif kind == "nanny-started":
                self.nanny_pids[str(event["key"])] = int(event["pid"])
            self._events.append(event)
            self._wake()
        code = proc.wait()
        self._exit_statuses[proc.pid] = code
        self._events.append({"event": "zygote-exited", "exit_code": code})
        self._wake()

    def _wake(self) -> None:
        aio_loop = getattr(self.loop, "asyncio_loop", None)
        if aio_loop is not None and aio_loop.is_closed():
            # The loop we started on is gone (the sync Cluster API runs each
            # call on a fresh loop): nobody would run a callback, so do it here.
            try:
                self._drain()
            except Exception:
                # Never let the reader thread die: later events would be lost.
                self.log.exception("pgnb zygote %s: error handling its events", self.zygote_pid)
        else:
            self.loop.add_callback(self._drain)

    def exit_status(self, pid: int) -> int | None:
        """How engine ``pid`` of this set (or its nanny, or the zygote) ended (negative: killed by that signal);
        None if running or unknown.

        Thread-safe and up to date even when no event loop runs the launcher's callbacks.
        """
        return self._exit_statuses.get(pid)

    def _drain(self) -> None:
        with self._drain_lock:
            while self._events:
                event = self._events.popleft()
                kind = event.get("event")
                if kind == "started":
                    self.engine_pids = {**self.engine_pids, event["key"]: event["pid"]}
                elif kind == "exited":
                    self._engine_exited(event["key"], event["exit_code"])
                elif kind == "error":
                    message = event.get("message", "")
                    self._zygote_error = self._zygote_error or message  # the first says why
                    self.log.error("pgnb zygote %s: %s", self.zygote_pid, message)
                elif kind == "zygote-exited":
                    self._zygote_exited = True
                    self._zygote_exit_code = event["exit_code"]
                    # Whatever it had not reported died with it (PR_SET_PDEATHSIG).
                    for key in list(self.engine_pids):
                        self._engine_exited(key, None)
                elif kind == "ready":
                    self.zygote_ready = event
                    self.log.debug("pgnb zygote %s ready: %s", self.zygote_pid, event)
            self._maybe_finished()

    def _engine_exited(self, key: str, exit_code: int | None) -> None:
        if key in self._exited:
            return
        data = {"exit_code": exit_code, "pid": self.engine_pids.get(key), "identifier": key}
        self._exited[key] = data
        log = self.log.debug
        if exit_code and not self._stopping:
            log = self.log.warning
        log("Engine %s (pid %s) of set %s exited: %s", key, data["pid"], self.engine_set_id, exit_code)

    def _maybe_finished(self) -> None:
        """All engines gone: let the zygote go and tell the observers."""
        if self.state != "running" or len(self._exited) < self.n:
            return
        self._close_stdin()
        # The first engine failure; else a zygote that died (taking with it
        # engines whose status is unknown); else 0.
        codes = [data["exit_code"] for data in self._exited.values()]
        exit_code = next((code for code in codes if code), None)
        if exit_code is None:
            exit_code = self._zygote_exit_code if None in codes and self._zygote_exit_code else 0
        self.notify_stop(
            {"engines": dict(self._exited), "exit_code": exit_code, "zygote_exit_code": self._zygote_exit_code}
        )

    def _close_stdin(self) -> None:
        proc = self._zygote
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    def _close_pipes(self) -> None:
        self._close_stdin()
        if self._reader is not None:
            self._reader.join(timeout=5)
        proc = self._zygote
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()

    async def _wait_zygote(self, timeout: float) -> bool:
        """Wait for the zygote to exit (it exits only once its engines are reaped)."""

        def gone() -> bool:
            self._drain()
            return self._zygote_gone()

        return await _poll(gone, timeout)

    def _zygote_gone(self) -> bool:
        if self._zygote is not None:
            return self._zygote.poll() is not None
        return process_state(self.zygote_pid) != "running"  # a zombie, or reaped already

    # -- signal / stop / join --------------------------------------------------------

    def signal(self, sig: int | str) -> None:
        """Send ``sig`` to every engine of the set at once."""
        if self.state != "running":
            return
        signum = _signal_number(sig)
        if self._zygote is not None:
            # The zygote signals only children it has not reaped: no pid reuse.
            try:
                self._send({"op": "signal", "sig": signum})
            except (BrokenPipeError, NotRunning) as e:
                self.log.debug("Not signalling engine set %s: %r", self.engine_set_id, e)
            return
        for proc in self._attached_engines():
            try:
                proc.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    async def stop(self) -> None:
        """Stop every engine at once: SIGTERM, SIGKILL after ``stop_seconds_until_kill``."""
        if self.state == "before" or self.zygote_pid <= 0:
            return
        self._stopping = True
        if self._zygote is not None:
            # EOF: the zygote TERMs all engines, KILLs stragglers, reaps, exits.
            self._close_stdin()
        else:
            try:
                psutil.Process(self.zygote_pid).terminate()
            except psutil.NoSuchProcess:
                pass
        if not await self._wait_zygote(self.stop_seconds_until_kill + 2):
            self.log.warning(
                "pgnb zygote %s still running %ss after stop; killing it",
                self.zygote_pid,
                self.stop_seconds_until_kill + 2,
            )
            self._kill_zygote()
            if not await self._wait_zygote(self.stop_timeout):
                raise TimeoutError(f"pgnb zygote {self.zygote_pid} did not exit in {self.stop_timeout}s")
        if self._zygote is not None:
            self._close_pipes()  # joins the reader, which queued the zygote's exit
        else:
            self._events.append({"event": "zygote-exited", "exit_code": None})
            # Attached engines are not our children: wait for them by pid.
            psutil.wait_procs(self._attached_engines(), timeout=self.stop_timeout)
        self._drain()

    def _kill_zygote(self) -> None:
        try:
            if self._zygote is not None:
                self._zygote.kill()
            else:
                psutil.Process(self.zygote_pid).kill()
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass

    async def join(self, timeout: float | None = None) -> None:
        """Wait for every engine (and the zygote) to exit."""
        if not await self._wait_zygote(float("inf") if timeout is None else timeout):
            raise TimeoutError(f"pgnb zygote {self.zygote_pid} did not exit in {timeout} seconds.")

    # -- output ----------------------------------------------------------------

    @staticmethod
    def _read_file(path: str) -> str:
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def get_output(self, remove: bool = False) -> str:
        """The engines' and the zygote's output, from their log files."""
        files = {f"engine {key}": self._engine_output_file(key) for key in sorted(self.engine_pids, key=int)}
        files["zygote"] = self.zygote_output_file
        for name, path in files.items():
            if os.path.exists(path):
                self._outputs[name] = self._read_file(path)
                if remove:
                    try:
                        os.remove(path)
                    except OSError as e:
                        self.log.error(f"Failed to remove {path}: {e}")
        chunks = []
        for name, output in self._outputs.items():
            if output:
                if self.output_limit:
                    output = "".join(output.splitlines(True)[-self.output_limit :])
                chunks.append(f"Output for {name}")
                chunks.append(indent(output, "  "))
        return "\n".join(chunks)

    def _log_output(self, stop_data: Any = None) -> None:
        output = self.get_output(remove=True)
        if not output:
            return
        log = self.log.debug
        if stop_data and stop_data.get("exit_code") and not self._stopping:
            log = self.log.warning
        log("Output for %s:\n%s", self.identifier, output)

    # -- restore from a cluster file ---------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], **kwargs: Any) -> ForkEngineSetLauncher:
        """Attach (by pid, without the pipes) to an engine set another process started."""
        self: ForkEngineSetLauncher = super().from_dict(d, **kwargs)
        try:
            psutil.Process(self.zygote_pid)
        except psutil.NoSuchProcess:
            raise NotRunning(f"pgnb zygote {self.zygote_pid}") from None
        if not self._attached_engines():
            raise NotRunning(f"no engines left under pgnb zygote {self.zygote_pid}")
        return self

    def _attached_engines(self) -> list[psutil.Process]:
        """The engines still alive, checked to be the zygote's children (no pid reuse)."""
        alive = []
        for pid in self.engine_pids.values():
            try:
                proc = psutil.Process(pid)
                if proc.ppid() == self.zygote_pid:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return alive
