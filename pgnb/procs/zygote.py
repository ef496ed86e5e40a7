"""The zygote: import torch and the ipyparallel engine once, then fork engines.

:class:`pgnb.procs.forklauncher.ForkEngineSetLauncher` starts one zygote per engine
set, running :func:`main` with ``--grace S [--preload MODULE ...]`` (what
``python -m pgnb.procs.zygote`` does), in its own session.  The zygote
imports the engine's modules and the preload modules (torch by default) while
it is still single-threaded and has no zmq context, then forks one child per
engine.  Each child sets up its own stdio, environment and working directory
and becomes an ordinary ipyparallel engine (``IPEngine``, the code
``ipengine`` runs), so copy-on-write shares torch's pages and no engine pays
for importing torch again.

The engine's nanny (ipyparallel's per-engine helper that relays signals and
tells the controller at once when its engine dies) is normally a fresh
``python -m ipyparallel.engine.nanny``: about as much private memory as a
forked engine and a second or more of CPU at start.  With ``fork_nanny`` the
engine instead asks the zygote, over a socketpair made at fork time, to fork
the nanny; the nanny then runs ipyparallel's own ``KernelNanny`` with the same
arguments and the same pipe protocol (the engine holds the read end of a pipe
whose write end is the nanny's; the nanny writes its URL on it and takes its
closing as its engine's death).

Lifetime rules (nothing may outlive the notebook kernel):

- every engine sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: it dies with the
  zygote, whatever kills the zygote; a nanny ends with its engine, as usual;
- the zygote's stdin is a pipe from the launcher: EOF means the launcher is
  gone (or asked us to stop), so the zygote sends SIGTERM to every engine at
  once, SIGKILL to whatever is left after ``--grace`` seconds, reaps engines
  and nannies, and exits.  SIGTERM to the zygote does the same.

Protocol: JSON lines.  Launcher to zygote (stdin)::

    {"op": "spawn", "engines": [{"key", "argv", "env", "output", "cwd", "fork_nanny"}, ...]}
    {"op": "signal", "sig": 15}
    {"op": "attach", "log", "grace", "env", "cwd", "preload"}  # a dormant zygote (pgnb.procs.prefork), taken

Zygote to launcher (stdout)::

    {"event": "ready", "pid", "import_seconds", "threads"}
    {"event": "started", "key", "pid"}
    {"event": "exited", "key", "pid", "exit_code"}   # exit_code < 0: killed by -exit_code
    {"event": "nanny-started", "key", "pid"}          # with fork_nanny: engine ``key``'s nanny
    {"event": "nanny-exited", "key", "pid", "exit_code"}
    {"event": "error", "message"}

The zygote's own diagnostics go to its stderr, which the launcher points at a
log file in the profile's log directory.

Under Slurm (``--slurm LOG_PREFIX -- ENGINE_ARGS``, started by
:class:`pgnb.procs.slurmlauncher.SlurmForkEngineSetLauncher` as one srun task per node)
there is no launcher on the other end: the zygote forks its node's share of the
job's tasks at once (``slurm_tasks``), each engine with the ``SLURM_PROCID``,
``SLURM_LOCALID`` and ``SLURM_NODEID`` it would have had as its own srun task,
writes no events, and exits once every engine has (Slurm's SIGTERM stops them
all, as above).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import gc
import importlib
import json
import os
import pickle
import select
import signal
import socket
import struct
import sys
import termios
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

#: Imported before forking whatever ``--preload`` says: what an engine needs.
ENGINE_MODULES = (
    "zmq",
    "tornado.ioloop",
    "IPython",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipyparallel",
    "ipyparallel.engine.app",
    "ipyparallel.engine.kernel",
    "ipyparallel.engine.nanny",
    "ipyparallel.serialize",
    # imported while the engine starts: debugpy alone is ~150 modules
    "ipykernel.debugger",
    "IPython.core.completerlib",
    "IPython.extensions.storemagic",
    "sqlite3",
    "tornado.platform.asyncio",
    "tornado.queues",
    # tqdm.auto loads ipywidgets wherever ipykernel is loaded: once here, shared by every engine,
    # rather than ~80 ms a rank at init (pgnb.rank.engine.text_progress_bars then picks the text bar)
    "tqdm.auto",
    # what every rank runs: pgnb's side of the rendezvous and of each cell (its typed messages take ~20 ms to
    # define, once here rather than in each rank); oinspect is what the shell imports as it starts
    "pgnb.rank.engine",
    "IPython.core.oinspect",
)

#: At shutdown, how long nannies may outlive the last engine.
NANNY_GRACE = 0.5

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_LENGTH = struct.Struct("!Q")


def _log(message: str) -> None:
    print(f"[pgnb zygote {os.getpid()}] {message}", file=sys.stderr, flush=True)


def _send(event: dict[str, Any]) -> None:
    """Write one event line to the launcher; a vanished launcher shows up as stdin EOF."""
    data = (json.dumps(event) + "\n").encode()
    try:
        while data:
            data = data[os.write(1, data) :]
    except BrokenPipeError:
        pass


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


class Zygote:
    """Fork engines (and their nannies) on request, reap them, take them down when told or orphaned."""

    def __init__(self, grace: float, standalone: bool = False) -> None:
        self.pid = os.getpid()
        #: no launcher on stdin (Slurm): done when the engines are
        self.standalone = standalone
        self.grace = grace
        self.engines: dict[int, str] = {}  # pid -> key; unreaped engines only
        self.nannies: dict[int, str] = {}  # pid -> engine key; unreaped nannies only
        self.specs: dict[str, dict[str, Any]] = {}  # key -> spawn spec
        self.nanny_socks: dict[int, tuple[socket.socket, str]] = {}  # fileno -> (our end, key)
        self.stdin_open = not standalone
        self.shutdown_at: float | None = None
        self.killed = False
        self.gave_up = False
        self.engines_gone_at: float | None = None
        self._term_requested = False
        self._pending = b""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        # Signals only wake the select loop; the work happens in the loop.
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self._term_requested = True

    # -- the loop -------------------------------------------------------------

    def run(self) -> int:
        while True:
            self._reap()
            if self._term_requested:
                self._begin_shutdown("SIGTERM")
            if self.standalone and not self.engines:
                self._begin_shutdown("every engine exited")
            timeout: float | None = None
            if self.shutdown_at is not None:
                if not self.engines and not self.nannies:
                    return 0
                self._shutdown_step(time.monotonic())
                if self.gave_up:
                    return 1
                timeout = 0.1
            fds = [self.wake_r, *self.nanny_socks] + ([0] if self.stdin_open else [])
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                continue
            for fd in ready:
                if fd == self.wake_r:
                    self._drain_wakeups()
                elif fd == 0:
                    self._read_stdin()
                elif fd in self.nanny_socks:
                    self._nanny_request(fd)

    def _shutdown_step(self, now: float) -> None:
        assert self.shutdown_at is not None
        if self.engines:
            self.engines_gone_at = None
        elif self.engines_gone_at is None:
            self.engines_gone_at = now
        if (
            self.nannies
            and self.engines_gone_at is not None
            and now >= self.engines_gone_at + NANNY_GRACE
            and not self.killed
        ):
            # A nanny tells the controller about its engine in milliseconds;
            # one still here is lingering (zmq LINGER, 3 s) on a controller
            # that is gone.
            self._signal(signal.SIGKILL, nannies=True)
            self.killed = True
        if not self.killed and now >= self.shutdown_at + self.grace:
            _log(f"still running after {self.grace:g}s: {self._running()}; sending SIGKILL")
            self._signal(signal.SIGKILL, nannies=True)
            self.killed = True
        if self.killed and now >= self.shutdown_at + self.grace + 10:
            # SIGKILLed processes that still do not go are not ours to wait for.
            _log(f"giving up on {self._running()}")
            self.gave_up = True

    def _running(self) -> str:
        return f"engines {sorted(self.engines)}, nannies {sorted(self.nannies)}"

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _read_stdin(self) -> None:
        data = os.read(0, 65536)
        if not data:
            self.stdin_open = False
            self._begin_shutdown("launcher closed the pipe")
            return
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                self._handle(json.loads(line))
            except Exception:
                _log(f"bad command {line[:200]!r}:\n{traceback.format_exc()}")

    def _handle(self, command: dict[str, Any]) -> None:
        op = command.get("op")
        if op == "spawn":
            if self.shutdown_at is not None:
                _send({"event": "error", "message": "zygote is shutting down; spawn refused"})
                return
            for spec in command["engines"]:
                self._spawn_engine(spec)
        elif op == "signal":
            self._signal(int(command["sig"]))
        elif op == "attach":
            self._attach(command)
        else:
            _log(f"unknown command {command!r}")

    def _attach(self, command: dict[str, Any]) -> None:
        """A dormant zygote's launcher: its log file, stop grace, environment and directory, as a launcher
        gives them to a zygote it starts."""
        log = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 2)
        os.close(log)
        self.grace = float(command.get("grace", self.grace))
        os.environ.update(command.get("env", {}))
        os.chdir(command.get("cwd", os.getcwd()))
        for name in command.get("preload", []):  # what the launcher's zygote would import that the parent had not
            try:
                importlib.import_module(name)
            except BaseException as e:
                traceback.print_exc()
                _send({"event": "error", "message": f"cannot import {name!r}: {type(e).__name__}: {e}"})
                self._begin_shutdown("a preload module failed to import")
                return

    def _begin_shutdown(self, why: str) -> None:
        if self.shutdown_at is not None:
            return
        _log(f"shutting down ({why}); stopping {len(self.engines)} engine(s)")
        self.shutdown_at = time.monotonic()
        # Nannies are not signalled: each ends when its engine does, after
        # telling the controller.
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int, nannies: bool = False) -> None:
        # Only unreaped children: their pids cannot have been reused yet.
        pids = [*self.engines, *(self.nannies if nannies else ())]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            if pid in self.nannies:
                key = self.nannies.pop(pid)
                if code:
                    _log(f"nanny {pid} of engine {key} exited with {code}")
                _send({"event": "nanny-exited", "key": key, "pid": pid, "exit_code": code})
                continue
            if pid in self.engines:
                key = self.engines.pop(pid)
                _send({"event": "exited", "key": key, "pid": pid, "exit_code": code})

    # -- forking engines ------------------------------------------------------

    def _spawn_engine(self, spec: dict[str, Any]) -> None:
        key = spec["key"]
        self.specs[key] = spec
        ours = theirs = None
        if spec.get("fork_nanny", True):
            ours, theirs = socket.socketpair()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            if ours is not None:
                ours.close()
            self._become_engine(spec, theirs)
        if ours is not None and theirs is not None:
            theirs.close()
            self.nanny_socks[ours.fileno()] = (ours, key)
        self.engines[pid] = key
        _send({"event": "started", "key": key, "pid": pid})

    def _child_setup(self, spec: dict[str, Any]) -> None:
        """In a fresh child: our signal handling, fds and stdio out, the engine's in."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(self.wake_r)
        os.close(self.wake_w)
        for sock, _ in self.nanny_socks.values():
            sock.close()
        # stdout/stderr to the engine's log file, as the local launcher does;
        # this also drops our copies of the launcher's pipes on fds 0 and 1.
        out = os.open(spec["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(spec["cwd"])
        os.environ.update(spec["env"])

    def _become_engine(self, spec: dict[str, Any], nanny_sock: socket.socket | None) -> NoReturn:
        def body() -> int:
            # Die with the zygote; the getppid check closes the race where the
            # zygote died between fork and prctl.
            if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
            if os.getppid() != self.pid:
                os._exit(1)
            self._child_setup(spec)
            _reseed_numpy()
            return _run_engine(list(spec["argv"]), nanny_sock)

        _run_child(body)

    # -- forking nannies ------------------------------------------------------

    def _nanny_request(self, fd: int) -> None:
        sock, key = self.nanny_socks[fd]
        pipe_fd = None
        try:
            data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
            if fds:
                pipe_fd = fds[0]
            if not data:  # the engine is gone, or runs without a nanny
                del self.nanny_socks[fd]
                sock.close()
                return
            sock.settimeout(5)  # the rest of one request is already on its way
            (length,) = _LENGTH.unpack(data[: _LENGTH.size])
            payload = data[_LENGTH.size :]
            while len(payload) < length:
                chunk = sock.recv(length - len(payload))
                if not chunk:
                    raise EOFError("engine closed its nanny socket mid-request")
                payload += chunk
            if pipe_fd is None:
                raise ValueError("nanny request without a pipe")
            if self.shutdown_at is not None:
                return  # closing the pipe tells the engine "nanny failed"
            self._spawn_nanny(key, payload, pipe_fd)
        except Exception:
            _log(f"nanny request from engine {key} failed:\n{traceback.format_exc()}")
        finally:
            if pipe_fd is not None:
                os.close(pipe_fd)

    def _spawn_nanny(self, key: str, payload: bytes, pipe_fd: int) -> None:
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_nanny(self.specs[key], payload, pipe_fd)
        self.nannies[pid] = key
        _send({"event": "nanny-started", "key": key, "pid": pid})

    def _become_nanny(self, spec: dict[str, Any], payload: bytes, pipe_fd: int) -> NoReturn:
        def body() -> int:
            # Like ipyparallel's nanny: its own session, no PR_SET_PDEATHSIG
            # (it outlives its engine just long enough to tell the controller).
            os.setsid()
            self._child_setup(spec)
            from ipyparallel.engine.nanny import KernelNanny

            kwargs = pickle.loads(payload)
            kwargs["pipe"] = os.fdopen(pipe_fd, "w", buffering=1)
            KernelNanny.main(**kwargs)
            return 0

        _run_child(body)


def _run_child(body: Callable[[], int]) -> NoReturn:
    """Run a forked child and leave with its exit code: never return into the zygote's loop."""
    code = 1
    try:
        code = body()
    except SystemExit as e:
        code = _system_exit_code(e)
    except BaseException:
        # sys.stderr may still be the kernel's OutStream: write to the log file itself.
        traceback.print_exc(file=sys.__stderr__)
        code = 1
    finally:
        _flush_stdio()
        os._exit(code)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _reseed_numpy() -> None:
    """Forked children share the zygote's numpy global RNG state; separately started engines do not."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _system_exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.__stderr__)
    return 1


def _nanny_via_zygote(sock: socket.socket) -> Any:
    """A stand-in for ``ipyparallel.engine.nanny.start_nanny`` that has the zygote fork the nanny."""

    def start_nanny(**kwargs: Any) -> tuple[str, Any]:
        kwargs["pid"] = os.getpid()
        payload = pickle.dumps(kwargs)
        data = _LENGTH.pack(len(payload)) + payload
        read_fd, write_fd = os.pipe()
        try:
            sent = socket.send_fds(sock, [data], [write_fd])
            sock.sendall(data[sent:])
        finally:
            os.close(write_fd)
        # As with ipyparallel's Popen handle: the engine keeps this open for
        # its lifetime; the nanny takes its closing as the engine's death.
        pipe = os.fdopen(read_fd, "rb")
        url = pipe.readline().decode("utf8").strip()
        if not url:
            pipe.close()
            raise RuntimeError("nanny failed")
        return url, pipe

    return start_nanny


def _run_engine(argv: list[str], nanny_sock: socket.socket | None) -> int:
    """Run ``ipengine argv`` in this process, as ``python -m ipyparallel.engine`` would."""
    import ipyparallel.engine.__main__ as engine_main
    import ipyparallel.engine.app as engine_app
    from ipyparallel.engine.app import IPEngine

    sys.argv = [engine_main.__file__, *argv]
    if nanny_sock is not None:
        engine_app.start_nanny = _nanny_via_zygote(nanny_sock)
    app = IPEngine.instance()
    # ipengine's SIGTERM handler stops the loop under run_sync, which then
    # raises "Event loop stopped before Future completed" and exits 1.  Note
    # the signal so that a requested stop exits 0 instead.
    stop_signals: list[int] = []
    signal_stop = getattr(app, "_signal_stop", None)
    if signal_stop is not None:

        def record_stop(sig: int, frame: object) -> None:
            stop_signals.append(sig)
            signal_stop(sig, frame)

        app._signal_stop = record_stop
    try:
        app.initialize(argv)
        app.start()
        code = 0
    except SystemExit as e:
        code = _system_exit_code(e)
    except RuntimeError:
        if not stop_signals:
            raise
        code = 0
    # os._exit skips interpreter shutdown: run what a normal exit would, but for torch's own teardown of its
    # operator registrations, about to vanish with the process (30 ms of CPU an engine: 1 s at 64 ranks on 2 cores)
    _skip_torch_library_teardown()
    atexit._run_exitfuncs()
    return code


def _skip_torch_library_teardown() -> None:
    registry: dict[Any, Any] = getattr(weakref.finalize, "_registry", {})  # the stdlib's: every live finalizer
    for finalizer, info in list(registry.items()):
        if getattr(info.func, "__module__", None) == "torch.library":
            finalizer.atexit = False


def slurm_tasks(environ: dict[str, str] | os._Environ[str]) -> list[dict[str, str]]:
    """This node's share of the job's tasks: the ``SLURM_*`` variables of each, as srun would set them.

    The job's layout is ``PGNB_SLURM_TASKS_PER_NODE`` (the batch script's
    ``SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1``: node i's task count, in node order);
    Slurm's default block distribution numbers a node's tasks after the nodes before it.
    """
    counts: list[int] = []
    for part in environ["PGNB_SLURM_TASKS_PER_NODE"].split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * (int(times.rstrip(")")) if times else 1)
    node = int(environ["SLURM_NODEID"])
    first = sum(counts[:node])
    return [{"SLURM_PROCID": str(first + local), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
             "SLURM_NTASKS": str(sum(counts)), "SLURM_NPROCS": str(sum(counts))} for local in range(counts[node])]


def _slurm_specs(log_prefix: str, engine_argv: list[str]) -> list[dict[str, Any]]:
    cwd = os.getcwd()
    return [{"key": task["SLURM_PROCID"], "argv": engine_argv, "env": task, "cwd": cwd, "fork_nanny": True,
             "output": f"{log_prefix}{task['SLURM_PROCID']}.log"} for task in slurm_tasks(os.environ)]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgnb.procs.zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL at shutdown")
    parser.add_argument("--preload", action="append", default=[], help="module to import before forking (repeatable)")
    parser.add_argument("--slurm", metavar="LOG_PREFIX", help="fork this node's tasks of the Slurm job at once, "
                        "engine output to LOG_PREFIX{SLURM_PROCID}.log; the engines' arguments follow --")
    parser.add_argument("engine_argv", nargs="*", help="(with --slurm) the engines' arguments")
    return parser.parse_args(argv)


def _prepare(preload: list[str]) -> float | None:
    """Import what the engines need, before any fork: seconds taken, or None (an error event sent)."""
    # Own session (the launcher starts us with start_new_session): no terminal
    # SIGINT should reach us, and a stray one must not kill every engine.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # c10d prints C++ stack traces to stderr unless its log level is raised.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # What IPEngine sets before importing the debugger (a warning otherwise).
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    tic = time.monotonic()
    for name in (*ENGINE_MODULES, *preload):
        try:
            importlib.import_module(name)
        except BaseException as e:
            traceback.print_exc()
            _send({"event": "error", "message": f"cannot import {name!r}: {type(e).__name__}: {e}"})
            return None
    import_seconds = time.monotonic() - tic
    _log(f"imported {len(preload)} preload module(s) in {import_seconds:.2f}s; threads={_thread_count()}")
    # Keep the imported objects out of the collector's reach so that it does
    # not write to (and un-share) their pages in the children.
    gc.collect()
    gc.freeze()
    return import_seconds


def serve(grace: float, preload: list[str], when_taken: bool = False) -> int:
    """Be a zygote on stdin/stdout: import, say "ready", fork engines as told (a process forked by
    ``pgnb.procs.prefork`` runs this too, its launcher's pipes on fds 0 and 1; ``when_taken``: it
    imports only once the launcher's first message is there, and exits at the pipe's end before)."""
    if when_taken and not _taken():
        return 0
    import_seconds = _prepare(preload)
    if import_seconds is None:
        return 1
    zygote = Zygote(grace)
    # Threads here would be copied into no child; 2 is numpy's OpenBLAS
    # server, which stops itself at fork (pthread_atfork).
    _send({"event": "ready", "pid": zygote.pid, "import_seconds": import_seconds, "threads": _thread_count()})
    return zygote.run()


def _taken() -> bool:
    """Wait until stdin has data (True) or is closed (False)."""
    select.select([0], [], [])  # retried by Python across signals (PEP 475)
    waiting = fcntl.ioctl(0, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(waiting, sys.byteorder) > 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.slurm is None:
        return serve(args.grace, args.preload)
    if _prepare(args.preload) is None:
        return 1
    zygote = Zygote(args.grace, standalone=True)
    os.dup2(2, 1)  # no launcher reads events: they go to the log with the rest
    for spec in _slurm_specs(args.slurm, args.engine_argv):
        zygote._spawn_engine(spec)
    return zygote.run()


if __name__ == "__main__":
    sys.exit(main())
