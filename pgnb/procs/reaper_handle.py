"""The kernel's handle on its reaper: the process (``python -m pgnb.procs.reaper``) that makes pgnb's
processes die with the kernel that owns them.

ipyparallel starts its controller, engines and nannies in their own
sessions and never watches its parent, so a kernel killed with SIGKILL
(nbval does that) would leave them running. pgnb starts one small reaper
process per world, in its own session, connected to the owner by a pipe.
The owner tells it what it owns (``Reaper.own``, ``own_path``,
``own_cluster``, ``own_launched``); when the pipe closes without a ``release`` (or the owner
pid is gone) the reaper kills exactly those processes and removes pgnb's
files, then exits (:mod:`pgnb.procs.reaper`).

What it owns is proven, never guessed by name: pids recorded with their
start times, and processes whose environment carries this world's
``PGNB_OWNER`` token (set by pgnb on everything it launches).

A reaper that dies while its owner lives is noticed by the owner's liveness
watcher and replaced at once (``Reaper.respawn``) by one told everything the
old one knew. If the reaper dies with its owner (the whole process group was
SIGKILLed, the machine ran out of memory), the next ``%pg_init`` sweeps up
after it (:mod:`pgnb.procs.ownership`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

from .processes import start_time
from .spawning import undebugged

#: The reaper process's module, run as ``python -m`` (named, not imported: the kernel runs none of it).
REAPER_MAIN = "pgnb.procs.reaper"


class Reaper:
    """The owner's handle on its reaper process.

    It remembers everything it told the reaper, so that a reaper that died can
    be replaced at once by one that knows the same (``respawn``): the world
    keeps running and a later death of the owner still leaves nothing.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self._lock = threading.Lock()
        self._told: list[str] = []  # every "pid"/"path"/"cluster" line, to tell a replacement
        self._released = False
        self._proc = self._start()

    def _start(self) -> subprocess.Popen[str]:
        with undebugged():
            return subprocess.Popen(
                [sys.executable, "-m", REAPER_MAIN, str(os.getpid()), self.token],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # must outlive the kernel's process group
                text=True,
            )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exit_status(self, pid: int) -> int | None:
        """How the reaper ``pid`` ended (negative: the signal), once it has; None otherwise."""
        proc = self._proc
        return proc.poll() if proc.pid == pid else None

    def respawn(self) -> int | None:
        """Start a new reaper that knows all the old one knew (the old one died); its pid, or None once released."""
        with self._lock:
            if self._released:
                return None
            old = self._proc
            with contextlib.suppress(Exception):
                if old.stdin is not None:
                    old.stdin.close()
            with contextlib.suppress(Exception):
                old.wait(timeout=1)  # it is dead: reap it
            self._proc = self._start()
            for line in self._told:
                self._write(line)
            return self._proc.pid

    def _send(self, line: str, remember: bool = True) -> None:
        with self._lock:
            if remember:
                self._told.append(line)
            self._write(line)

    def _write(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def own(self, pid: int) -> None:
        """Kill ``pid`` too if the owner dies (its start time guards against reuse)."""
        try:
            import psutil

            created = start_time(psutil.Process(pid))
        except Exception:  # gone already, or psutil missing: the token scan still covers it
            return
        self._send(f"pid {pid} {created!r}")

    def own_path(self, path: str) -> None:
        self._send(f"path {path}")

    def own_cluster(self, state_path: str) -> None:
        """Remove this cluster's files (see ``cluster_files``) after killing its processes."""
        self._send(f"cluster {state_path}")

    def own_launched(self, cluster_file: str) -> None:
        """Kill the engines of this ipyparallel cluster file through their launchers (other hosts' engines)."""
        self._send(f"launched {cluster_file}")

    def release(self) -> None:
        """The owner cleaned up itself: the reaper exits without killing anything."""
        with self._lock:
            self._released = True
            self._write("release")
        self._close()

    def _close(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
