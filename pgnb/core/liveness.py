"""Notices, while the notebook is idle, that a process pgnb depends on died.

The ipyparallel Client hears of a dead engine only when it is used, and it is
not thread-safe, so a status view would go on showing a killed rank as
``initialized``. A ``Watcher`` thread looks at the pids it was given every
``PERIOD`` seconds (one ``poll`` of their pidfds, ``pgnb.procs.processes.Handles``;
never the Client), and calls back with the pid and the cause: the exit status when a launcher reaped the process
(``cluster.exit_status``) or when it is a zombie nobody reaped yet
(``zombie_status``), else only that it is gone.

pgnb watches every process of a world (``pgnb.core.world``): the controller
and its schedulers, the zygote, the nannies, the engines and the reaper.
Deaths seen in the same look are reported in ``priority`` order (lowest
first), so a controller or zygote is named before the engines that die with it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping

from ..procs.processes import Handles, zombie_status
from .waiting import poll_until

#: Seconds between two looks at the watched pids.
PERIOD = 0.3
#: How long to wait for the launcher to reap a dead process and learn its exit status.
STATUS_WAIT = 0.3

_log = logging.getLogger("pgnb")

_SIGNAL_WORDS = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "floating-point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
}


def describe_exit(status: int | None, what: str = "engine") -> str:
    """``-11`` -> ``"engine killed by SIGSEGV (segmentation fault)"``; ``1`` -> ``"engine exited with status 1"``."""
    if status is None:
        return f"{what} process died"
    if status < 0:
        try:
            sig = signal.Signals(-status)
        except ValueError:
            return f"{what} killed by signal {-status}"
        words = _SIGNAL_WORDS.get(sig)
        return f"{what} killed by {sig.name}" + (f" ({words})" if words and words != "killed" else "")
    return f"{what} exited with status {status}"


def died_text(what: str, status: int | None) -> str:
    """``("the ipyparallel controller", -9)`` -> ``"the ipyparallel controller died (SIGKILL)"``."""
    if status is None:
        return f"{what} died"
    if status < 0:
        try:
            return f"{what} died ({signal.Signals(-status).name})"
        except ValueError:
            return f"{what} died (signal {-status})"
    return f"{what} died (exit status {status})"


def last_exception(log: str) -> str:
    """The line that ends the last traceback in ``log`` (``zmq.error.ZMQError: Address already in use
    (addr='tcp://127.0.0.1:40123')``), "" if there is none."""
    lines = log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            return next((line.strip() for line in lines[i + 1:] if line and not line[0].isspace()), "")
    return ""


def logged_exception(path: str, tail: int = 65536) -> str:
    """``last_exception`` of the last ``tail`` bytes of the log file ``path`` ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
            return last_exception(f.read().decode(errors="replace"))
    except OSError:
        return ""


class Watcher:
    """A daemon thread that reports each watched pid's death once: ``on_death(pid, cause, status)``.

    ``status`` is what ``exit_status(pid)`` or the zombie's ``/proc`` entry says (negative: killed
    by that signal), or None; ``cause`` is ``describe(pid, status)`` (default: ``describe_exit(status)``).
    """

    def __init__(
        self,
        on_death: Callable[[int, str, int | None], None],
        exit_status: Callable[[int], int | None] = lambda pid: None,
        period: float = PERIOD,
        describe: Callable[[int, int | None], str] | None = None,
    ) -> None:
        self._on_death = on_death
        self._exit_status = exit_status
        self._describe = describe or (lambda pid, status: describe_exit(status))
        self._period = period
        self._procs: dict[int, tuple[float, int]] = {}  # pid -> (start time, priority)
        self._handles = Handles()  # their pidfds: a look is one poll (under _lock, as _procs)
        self._lock = threading.Lock()
        # one report at a time: once a look returns, every death it saw has been reported, by it or the thread
        self._reporting = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, procs: Mapping[int, float], priority: int = 0) -> None:
        """Watch these ``pid -> start time`` (starts the thread on first use)."""
        with self._lock:
            self._procs.update({pid: (started, priority) for pid, started in procs.items()})
            for pid, started in procs.items():
                self._handles.add(pid, started)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="pgnb-liveness", daemon=True)
                self._thread.start()

    def unwatch(self, pids: Iterable[int]) -> None:
        """Stop watching (before pgnb stops these processes itself)."""
        with self._lock:
            for pid in pids:
                self._procs.pop(pid, None)
                self._handles.remove(pid)

    def watched(self) -> list[int]:
        with self._lock:
            return list(self._procs)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            self._handles.close()  # a later look reads /proc instead

    def look(self, max_priority: int | None = None) -> None:
        """One look now, in the caller's thread (those of at most ``max_priority``): what a magic does
        before it sends work, so that a death of a moment ago is named rather than run into."""
        with self._lock:
            procs = {pid: v for pid, v in self._procs.items() if max_priority is None or v[1] <= max_priority}
            ended = self._handles.ended({pid: started for pid, (started, _) in procs.items()})
        self._report([(procs[pid][1], pid) for pid in ended])
        if threading.current_thread() is not self._thread:
            with self._reporting:  # a death the thread took off the watch but has not told yet is told first
                pass

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with self._lock:
                procs = dict(self._procs)
                ended = self._handles.ended({pid: started for pid, (started, _) in procs.items()})
            self._report([(procs[pid][1], pid) for pid in ended])

    def _report(self, dead: list[tuple[int, int]]) -> None:
        if not dead or self._stop.is_set():
            return
        dead.sort()
        with self._reporting:
            with self._lock:  # those the other look reported meanwhile are not watched any more
                dead = [(prio, pid) for prio, pid in dead if pid in self._procs]
            statuses = self._statuses([pid for _, pid in dead])
            for _, pid in dead:
                if self._stop.is_set():
                    return
                with self._lock:
                    self._handles.remove(pid)
                    if self._procs.pop(pid, None) is None:
                        continue  # unwatched meanwhile: pgnb stopped it on purpose
                status = statuses.get(pid)
                try:
                    self._on_death(pid, self._describe(pid, status), status)
                except Exception:  # a listener's bug (a view draws there) must not end the watch
                    _log.debug("pgnb: reporting the death of pid %d raised", pid, exc_info=True)

    def _statuses(self, pids: list[int]) -> dict[int, int | None]:
        """Each dead pid's exit status, waiting up to ``STATUS_WAIT`` in all for launchers to reap them."""
        found: dict[int, int | None] = {}

        def all_known() -> bool:
            for pid in pids:
                if found.get(pid) is None:
                    status = self._exit_status(pid)
                    found[pid] = zombie_status(pid) if status is None else status
            return all(s is not None for s in found.values())

        poll_until(all_known, STATUS_WAIT)
        return found
