"""The zygote: import torch and the ipyparallel engine once, then fork engines.

:class:`pgnb._forklauncher.ForkEngineSetLauncher` starts one zygote per engine
set as ``python -m pgnb._zygote --grace S [--preload MODULE ...]``.  The zygote
imports the engine's modules and the preload modules (torch by default) while
it is still single-threaded and has no zmq context, then forks one child per
engine.  Each child sets up its own stdio, environment and working directory
and becomes an ordinary ipyparallel engine (``IPEngine.launch_instance``, the
same code ``ipengine`` runs), so copy-on-write shares torch's pages and no
engine pays for importing torch again.

Lifetime rules (nothing may outlive the notebook kernel):

- every child sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: it dies with the
  zygote, whatever kills the zygote;
- the zygote's stdin is a pipe from the launcher: EOF means the launcher is
  gone (or asked us to stop), so the zygote sends SIGTERM to every child at
  once, SIGKILL after ``--grace`` seconds, reaps them and exits.  SIGTERM to
  the zygote does the same.

Protocol: JSON lines.  Launcher to zygote (stdin)::

    {"op": "spawn", "engines": [{"key", "argv", "env", "output", "cwd"}, ...]}
    {"op": "signal", "sig": 15}

Zygote to launcher (stdout)::

    {"event": "ready", "pid", "import_seconds", "threads"}
    {"event": "started", "key", "pid"}
    {"event": "exited", "key", "pid", "exit_code"}   # exit_code < 0: killed by -exit_code
    {"event": "error", "message"}

The zygote's own diagnostics go to its stderr, which the launcher points at a
log file in the profile's log directory.
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
import select
import signal
import sys
import time
import traceback
from typing import Any

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
)

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


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


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


class Zygote:
    """Fork engines on request, reap them, and take them down when told or orphaned."""

    def __init__(self, grace: float) -> None:
        self.pid = os.getpid()
        self.grace = grace
        self.children: dict[int, str] = {}  # pid -> key, only children not yet reaped
        self.stdin_open = True
        self.shutdown_at: float | None = None
        self.killed = False
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
            if self.shutdown_at is not None:
                if not self.children:
                    return 0
                now = time.monotonic()
                if not self.killed and now >= self.shutdown_at + self.grace:
                    _log(f"children {sorted(self.children)} ignored SIGTERM; sending SIGKILL")
                    self._signal_children(signal.SIGKILL)
                    self.killed = True
                if self.killed and now >= self.shutdown_at + self.grace + 10:
                    # SIGKILLed children that still did not go are not ours to wait for.
                    _log(f"giving up on children {sorted(self.children)}")
                    return 1
                timeout: float | None = 0.1
            else:
                timeout = None
            fds = [self.wake_r] + ([0] if self.stdin_open else [])
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if 0 in ready:
                self._read_stdin()

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
                self._spawn(spec)
        elif op == "signal":
            self._signal_children(int(command["sig"]))
        else:
            _log(f"unknown command {command!r}")

    def _begin_shutdown(self, why: str) -> None:
        if self.shutdown_at is not None:
            return
        _log(f"shutting down ({why}); stopping {len(self.children)} engine(s)")
        self.shutdown_at = time.monotonic()
        self._signal_children(signal.SIGTERM)

    def _signal_children(self, sig: int) -> None:
        # Only unreaped children: their pids cannot have been reused yet.
        for pid in list(self.children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            key = self.children.pop(pid, None)
            if key is None:
                continue
            code = _exit_code(status)
            _send({"event": "exited", "key": key, "pid": pid, "exit_code": code})

    # -- forking --------------------------------------------------------------

    def _spawn(self, spec: dict[str, Any]) -> None:
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_engine(spec)  # never returns
        self.children[pid] = spec["key"]
        _send({"event": "started", "key": spec["key"], "pid": pid})

    def _become_engine(self, spec: dict[str, Any]) -> None:
        code = 1
        try:
            # Die with the zygote; the getppid check closes the race where the
            # zygote died between fork and prctl.
            if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
            if os.getppid() != self.pid:
                os._exit(1)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.close(self.wake_r)
            os.close(self.wake_w)
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
            _reseed_numpy()
            code = _run_engine(list(spec["argv"]))
        except SystemExit as e:
            code = _system_exit_code(e)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            # Never return into the zygote's loop.
            os._exit(code)


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
    print(e.code, file=sys.stderr)
    return 1


def _run_engine(argv: list[str]) -> int:
    """Run ``ipengine argv`` in this process, as the interpreter would at ``python -m ipyparallel.engine``."""
    import ipyparallel.engine.__main__ as engine_main
    from ipyparallel.engine.app import IPEngine

    sys.argv = [engine_main.__file__, *argv]
    try:
        IPEngine.launch_instance(argv)
        code = 0
    except SystemExit as e:
        import traceback as tb; tb.print_exc()  # DEBUGX
        code = _system_exit_code(e)
    # os._exit skips interpreter shutdown: run what a normal exit would.
    atexit._run_exitfuncs()
    return code


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgnb._zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL at shutdown")
    parser.add_argument("--preload", action="append", default=[], help="module to import before forking (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # Own session (the launcher starts us with start_new_session): no terminal
    # SIGINT should reach us, and a stray one must not kill every engine.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # c10d prints C++ stack traces to stderr unless its log level is raised.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    tic = time.monotonic()
    for name in (*ENGINE_MODULES, *args.preload):
        try:
            importlib.import_module(name)
        except BaseException as e:
            traceback.print_exc()
            _send({"event": "error", "message": f"cannot import {name!r}: {type(e).__name__}: {e}"})
            return 1
    import_seconds = time.monotonic() - tic
    threads = _thread_count()
    _log(f"imported {len(args.preload)} preload module(s) in {import_seconds:.2f}s; threads={threads}")
    # Keep the imported objects out of the collector's reach so that it does
    # not write to (and un-share) their pages in the children.
    gc.collect()
    gc.freeze()
    zygote = Zygote(args.grace)
    _send({"event": "ready", "pid": zygote.pid, "import_seconds": import_seconds, "threads": threads})
    return zygote.run()


if __name__ == "__main__":
    sys.exit(main())
