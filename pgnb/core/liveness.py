"""Notices, while the notebook is idle, that a rank's engine process died.

The ipyparallel Client hears of a dead engine only when it is used, and it is
not thread-safe, so a status view would go on showing a killed rank as
``initialized``. A ``Watcher`` thread looks at the engine pids of ranks on this
host every ``PERIOD`` seconds, with psutil only (never the Client), and calls
back with the pid and the cause: the exit status when pgnb's local launcher
reaped the engine (``cluster.exit_status``), else only that it is gone.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from ..procs.reaper import process_alive

#: Seconds between two looks at the engine pids.
PERIOD = 0.3
#: How long to wait for the launcher to reap a dead engine and learn its exit status.
STATUS_WAIT = 0.3

_SIGNAL_WORDS = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "floating-point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
}


def describe_exit(status: int | None) -> str:
    """``-11`` -> ``"engine killed by SIGSEGV (segmentation fault)"``; ``1`` -> ``"engine exited with status 1"``."""
    if status is None:
        return "engine process died"
    if status < 0:
        try:
            sig = signal.Signals(-status)
        except ValueError:
            return f"engine killed by signal {-status}"
        words = _SIGNAL_WORDS.get(sig)
        return f"engine killed by {sig.name}" + (f" ({words})" if words and words != "killed" else "")
    return f"engine exited with status {status}"


class Watcher:
    """A daemon thread that reports each watched pid's death once: ``on_death(pid, cause)``."""

    def __init__(
        self,
        on_death: Callable[[int, str], None],
        exit_status: Callable[[int], int | None] = lambda pid: None,
        period: float = PERIOD,
    ) -> None:
        self._on_death = on_death
        self._exit_status = exit_status
        self._period = period
        self._procs: dict[int, float] = {}  # pid -> start time
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, procs: Mapping[int, float]) -> None:
        """Watch these ``pid -> start time`` (starts the thread on first use)."""
        with self._lock:
            self._procs.update(procs)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="pgnb-liveness", daemon=True)
                self._thread.start()

    def unwatch(self, pids: Iterable[int]) -> None:
        """Stop watching (before pgnb kills these engines itself)."""
        with self._lock:
            for pid in pids:
                self._procs.pop(pid, None)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with self._lock:
                procs = list(self._procs.items())
            for pid, started in procs:
                if self._stop.is_set():
                    return
                if process_alive(pid, started):
                    continue
                cause = self._cause(pid)
                with self._lock:
                    if self._procs.pop(pid, None) is None:
                        continue  # unwatched meanwhile: pgnb stopped it on purpose
                with contextlib.suppress(Exception):  # a listener's bug must not end the watch
                    self._on_death(pid, cause)

    def _cause(self, pid: int) -> str:
        deadline = time.monotonic() + STATUS_WAIT
        while True:
            status = self._exit_status(pid)
            if status is not None or time.monotonic() > deadline:
                return describe_exit(status)
            time.sleep(0.02)
