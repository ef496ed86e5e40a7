"""Zygotes forked from this process, dormant until a fork launcher takes one.

A zygote the launcher starts is a fresh Python that imports torch (and whatever
``preload`` names) before it can fork a rank: on 2 cores, 2-4 s per world. A
process that has imported them already (pytest, once it has collected torch's
test files) can instead fork the zygote itself: the child keeps every imported
module, imports only the engine's own, and waits on a pipe for the launcher
(:class:`pgnb.procs.forklauncher.ForkEngineSetLauncher` takes it in place of
starting one). It is then the same zygote (:func:`pgnb.procs.zygote.serve`),
on the same protocol.

Forking is safe only while this process runs no other Python thread (a lock another
thread holds would stay held in the child for ever) and nothing traces it (a coverage
or debugger tracer would follow every rank): otherwise ``fork_dormant`` forks
nothing and says why, and each world starts its zygote as before. Native threads
of the numerical libraries are no obstacle, as they are none to a zygote that forks
its engines: OpenBLAS's stop at a fork, and torch makes its own pools anew in a
forked child.

The child leaves this process's world behind before it serves: its own session,
default signal handlers, no faulthandler, no atexit handlers, no logging
handlers, no import hook of pytest's, and no file of the parent's open but its
two pipes (every other descriptor is ``/dev/null``, stderr too until a launcher
gives it its log). The first zygote forked imports the engine's modules at once; a spare
waits to be taken before it does, so that its imports leave the cores to the first world's
start. A dormant zygote
ends when this process closes its pipe (``close_dormant``, or this process's
exit, however it ends).

``fork_waiting`` forks a child of the same kind for work of another sort: it waits
on its pipe for one message and then does what it was forked for (``pytest
--pgnb-keep``'s kept process, forked from the run that will start it: pgnb.testing.keeper).
"""

from __future__ import annotations

import atexit
import faulthandler
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, NoReturn

#: Signals whose handlers this process may have set (pytest-timeout's SIGALRM, a test runner's SIGTERM...).
_RESET_SIGNALS = ("SIGALRM", "SIGTERM", "SIGCHLD", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")


class ForkedZygote:
    """A dormant zygote, as much of ``subprocess.Popen`` as the fork launcher uses (``pid``, ``stdin``,
    ``stdout``, ``poll``, ``wait``, ``kill``)."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else: gone, status unknown
                    self.returncode = -signal.SIGKILL
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        # polled rather than a blocking waitpid, so that poll() from another thread never waits on a lock
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"zygote {self.pid} still running after {timeout} s")
            time.sleep(0.02)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Let it go: its stdin's EOF ends it (it has forked nothing yet)."""
        for pipe in (self.stdin, self.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_dormant: list[ForkedZygote] = []


def why_not_fork() -> str:
    """Why this process cannot fork a zygote now ("" if it can)."""
    threads = threading.active_count()
    if threads != 1:
        return f"{threads} Python threads"
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return "a tracer or profiler is on"
    return ""


def fork_dormant(count: int, preload: list[str]) -> str:
    """Fork ``count`` dormant zygotes that import ``preload`` (what this process has not imported yet);
    "" when done, else why nothing was forked.

    The first (the one ``take`` gives first) imports at once; the spares only once taken, so that their
    imports do not compete for the cores with the first world's start (0.15 s of CPU each, on 2 cores
    a world of 4 ready 0.07 s later)."""
    reason = why_not_fork()
    if reason:
        return reason
    for i in range(count):
        _dormant.append(_fork(list(preload), when_taken=i > 0))
    return ""


def take() -> ForkedZygote | None:
    """A dormant zygote that is still there, or None."""
    while _dormant:
        zygote = _dormant.pop(0)
        if zygote.poll() is None:
            return zygote
        zygote.close()
    return None


def dormant() -> int:
    """How many dormant zygotes wait now."""
    return len(_dormant)


def close_dormant() -> None:
    """End every zygote no launcher took."""
    while _dormant:
        _dormant.pop().close()


class Waiting:
    """A child forked by ``fork_waiting``, dormant until ``wake``."""

    def __init__(self, pid: int, pipe: IO[bytes]) -> None:
        self.pid = pid
        self._pipe = pipe

    def wake(self, message: dict[str, Any]) -> None:
        """Hand it its message: it goes on alone (its own session), whatever becomes of this process."""
        try:
            self._pipe.write(json.dumps(message).encode())
        finally:
            self.close()

    def close(self) -> None:
        """Let it go unwoken: the pipe's EOF ends it."""
        try:
            self._pipe.close()
        except OSError:
            pass


def fork_waiting(then: Callable[[dict[str, Any]], int], log: str) -> Waiting | str:
    """Fork a child that leaves this process's world behind (as a zygote does; its output to the file ``log``)
    and waits for ``Waiting.wake``'s message; then it exits with ``then(message)``. It exits at once if this
    process closes the pipe first (``Waiting.close``, or this process's end). Why not, if it cannot fork."""
    reason = why_not_fork()
    if reason:
        return reason
    read_fd, write_fd = os.pipe()
    _flush()
    pid = os.fork()
    if pid == 0:
        _wait_then(read_fd, log, then)
    os.close(read_fd)
    os.set_inheritable(write_fd, False)
    return Waiting(pid, os.fdopen(write_fd, "wb"))


def _wait_then(read_fd: int, log: str, then: Callable[[dict[str, Any]], int]) -> NoReturn:
    code = 1
    try:
        _dormant.clear()  # the parent's zygotes, not this process's children
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        _leave_parent(os.open(os.devnull, os.O_RDONLY), out, out, keep=read_fd)
        data = b""
        while chunk := os.read(read_fd, 65536):
            data += chunk
        os.close(read_fd)
        if not data:  # closed unwoken
            os._exit(0)
        try:
            code = then(json.loads(data))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        atexit._run_exitfuncs()  # what the work registered (it ran in this process as in one of its own)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _fork(preload: list[str], when_taken: bool = False) -> ForkedZygote:
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    _flush()
    pid = os.fork()
    if pid == 0:
        _become_zygote(to_child_r, from_child_w, preload, when_taken)
    os.close(to_child_r)
    os.close(from_child_w)
    # the children forked later must not hold this one's pipes, or its stdin would never see EOF
    os.set_inheritable(to_child_w, False)
    os.set_inheritable(from_child_r, False)
    return ForkedZygote(pid, os.fdopen(to_child_w, "wb"), os.fdopen(from_child_r, "rb"))


def _become_zygote(stdin_fd: int, stdout_fd: int, preload: list[str], when_taken: bool) -> NoReturn:
    code = 1
    try:
        _leave_parent(stdin_fd, stdout_fd)
        from .zygote import serve

        code = serve(5.0, preload, when_taken=when_taken)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _leave_parent(stdin_fd: int, stdout_fd: int, stderr_fd: int | None = None, keep: int | None = None) -> None:
    """In the child: nothing of the parent's handlers, hooks or files stays active (but ``keep``'s)."""
    os.setsid()
    for name in _RESET_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    # as Python sets it at start: a write to a closed pipe raises BrokenPipeError rather than killing silently
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    faulthandler.disable()
    atexit._clear()  # the parent's exit work (a coverage save, a cache write) is not ours
    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    # pytest's assertion rewriting stays with pytest: modules imported here load as a launched zygote's would
    sys.meta_path[:] = [finder for finder in sys.meta_path if not type(finder).__module__.startswith("_pytest")]
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(null if stderr_fd is None else stderr_fd, 2)
    # Every other file of the parent's (its other zygotes' pipes, its terminal, its sockets) let go of:
    # pointed at /dev/null rather than closed, so that an object of the parent's that closes its own fd
    # one day never closes a file of the ranks' that took the same number.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in (null, keep):
            try:
                os.dup2(null, fd)
            except OSError:  # the listing's own fd, closed by now
                pass
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
