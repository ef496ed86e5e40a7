"""Facts about processes, for the kernel and pgnb's own processes alike: stateless, no process's main.

What kind of process pgnb starts (``ProcessKind``); which processes a world's
owner token marks (``owned_by_token``); whether a process runs, is a zombie
or is gone (``process_state``, the one zombie check); when it started
(``start_time``), so that a later process with the same pid is not taken for
it (``process_alive``); and killing many at once (``kill_all``).

On Linux every look is one read of ``/proc/PID/stat`` (``proc_stat``, the one
reader of that file); elsewhere psutil answers.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any, Literal

#: The environment variable pgnb sets on every process it launches: its value is the owner's token.
OWNER_ENV = "PGNB_OWNER"

#: The processes a world depends on, in the order a death is reported when several die at once
#: (a controller or zygote is named before the engines that die with it).
ProcessKind = Literal["controller", "scheduler", "zygote", "reaper", "engine", "nanny"]

#: What ``process_state`` says: ``zombie`` has ended and waits for its parent to reap it (it holds
#: nothing but its exit status); ``gone`` has no entry any more.
ProcessState = Literal["running", "zombie", "gone"]

_HAS_PROC = os.path.isdir("/proc/self")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def owned_by_token(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``PGNB_OWNER=token``."""
    return carrying(OWNER_ENV, token)


def carrying(name: str, value: str, exclude: int | None = None) -> list[int]:
    """Pids of processes whose environment (as they started) has ``name=value``; ``exclude`` (default:
    this process) is left out. Zombies may be among them: ask ``process_state``."""
    needle = f"{name}={value}".encode()
    me = os.getpid() if exclude is None else exclude
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_all(pids: list[int], grace: float = 1.0, awaited: list[int] | None = None) -> None:
    """SIGTERM every pid at once, wait ``grace`` seconds, SIGKILL the rest.

    ``awaited``: wait only for these (a world's engines, which may save something on SIGTERM), then
    SIGKILL the rest at once: a zygote waits for its nannies, and a nanny for a controller, with
    nothing left to save (at 64 ranks that wait was the grace itself, 1 s of a 2.9 s shutdown).
    """
    import psutil

    procs = []
    for pid in set(pids):
        try:
            p = psutil.Process(pid)
            procs.append((p, start_time(p)))
        except psutil.NoSuchProcess:
            pass
    for p, _ in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    waited = None if awaited is None else set(awaited)
    first = procs if waited is None else [(p, t) for p, t in procs if p.pid in waited]
    alive = _wait_ended(first, timeout=grace)
    if waited is not None:
        alive += [(p, t) for p, t in procs if p.pid not in waited and not _ended(p.pid, t)]
    for p, _ in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_ended(alive, timeout=grace)


def _wait_ended(procs: list[tuple[Any, float]], timeout: float) -> list[tuple[Any, float]]:
    """Wait up to ``timeout`` s for each ``(process, start_time)`` to end; those still running.

    Polled every few milliseconds (an engine ends 5-40 ms after SIGTERM): psutil's wait backs off to
    40 ms, which made a world's stop wait 100-130 ms for engines gone after 30. Not ``pgnb.core.waiting``:
    that layer is above this one, and this wait hands back what is left."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        procs = [(p, t) for p, t in procs if not _ended(p.pid, t)]
        left = deadline - time.monotonic()
        if not procs or left <= 0:
            return procs
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.01)


def _ended(pid: int, started: float) -> bool:
    """Ended: a child of this process is reaped as it ends; another's zombie is its parent's to reap."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
    except ChildProcessError:  # not this process's child (or reaped already)
        pass
    return not process_alive(pid, started)


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name, from one read (``[0]`` the state, ``[1]`` the
    parent's pid, ``[11]``/``[12]`` user/system CPU in clock ticks, ``[19]`` the start in clock ticks since
    boot, ``[49]`` the exit status of a zombie), or None when there is no such process. Raises ``OSError``
    where there is no ``/proc``, ``ValueError`` on a line it cannot read."""
    try:  # os.open/os.read: a third of open()'s cost, and every cell's look reads ten of these
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError):
        if _HAS_PROC:
            return None
        raise
    try:
        stat = os.read(fd, 4096)
    except ProcessLookupError:  # it ended between the open and the read
        return None
    finally:
        os.close(fd)
    return stat[stat.rindex(b")") + 2:].split()


def clock_ticks(field: bytes) -> float:
    """A ``proc_stat`` field counted in clock ticks (a start, a CPU time), in seconds."""
    return int(field) / _CLK_TCK


def _state(fields: list[bytes]) -> ProcessState:
    # Z: a zombie; X: dead, its entry being torn down (a moment only)
    return "zombie" if fields[0] == b"Z" else "gone" if fields[0] == b"X" else "running"


def _state_psutil(pid: int) -> ProcessState:
    import psutil

    try:
        return "zombie" if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else "running"
    except psutil.Error:
        return "gone"


def process_state(pid: int) -> ProcessState:
    """Whether ``pid`` runs, is a zombie (ended; its parent has not reaped it yet) or is gone: the one zombie
    check, which everything that asks uses."""
    try:
        fields = proc_stat(pid)
    except (OSError, ValueError, IndexError):  # no /proc: psutil's answer
        return _state_psutil(pid)
    return "gone" if fields is None else _state(fields)


def process_running(pid: int) -> bool:
    """``pid`` runs now (a zombie does not); for a moment's check, where pid reuse cannot happen yet."""
    return process_state(pid) == "running"


def zombie_status(pid: int) -> int | None:
    """The exit status of ``pid`` if it is a zombie its parent has not reaped yet (Linux ``/proc``), else None.

    Negative: killed by that signal, as ``subprocess`` says it.
    """
    try:
        fields = proc_stat(pid)
    except (OSError, ValueError):
        return None
    if not fields or _state(fields) != "zombie" or len(fields) < 50:
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[49]))
    except ValueError:
        return None


def start_time(p: Any) -> float:
    """When the ``psutil.Process`` ``p`` started, in seconds since boot: what pgnb compares to tell a
    process from a later one with the same pid.

    Not ``create_time()``: that is boot time + this, and psutil reads the boot time from the kernel
    (``btime``) at every call, which moves whenever the system clock is stepped (a VM's clock sync
    moved it by 41 s here), and every watched process would then look dead. On Linux this reads the
    process's start in clock ticks from ``/proc``, which never changes.
    """
    import psutil

    try:
        fields = proc_stat(p.pid)
        started = None if fields is None else clock_ticks(fields[19])
    except (OSError, ValueError, IndexError):  # no /proc: psutil's answer (it raises if the process is gone)
        return float(p.create_time() - psutil.boot_time())
    if started is None:
        raise psutil.NoSuchProcess(p.pid)
    return started


def process_alive(pid: int, started: float) -> bool:
    """The process ``pid`` that started at ``started`` (``start_time``) still runs (a zombie or a reused pid
    does not). One read of ``/proc`` on Linux: the liveness watcher and every magic's look call it for
    each process of the world."""
    try:
        fields = proc_stat(pid)
        return fields is not None and _state(fields) == "running" and abs(clock_ticks(fields[19]) - started) < 0.01
    except (OSError, ValueError, IndexError):
        return _process_alive_psutil(pid, started)


def _process_alive_psutil(pid: int, started: float) -> bool:
    import psutil

    try:
        created = float(psutil.Process(pid).create_time() - psutil.boot_time())
    except psutil.Error:
        return False
    return abs(created - started) < 0.01 and _state_psutil(pid) == "running"



class Handles:
    """Processes watched by pidfd: which of them have ended, all in one ``poll``, not a ``/proc`` read each.

    A pidfd names one process, never a later one with its pid, and is readable once the process
    has ended (a zombie too). Every ``%%pg`` cell looks at a world's controller, schedulers and
    zygote before it runs: ten reads of ``/proc`` took ~0.2 ms of a 10 ms cell. Where
    ``os.pidfd_open`` is missing or refused, ``process_alive`` answers for that process.
    Not thread-safe: its owner (``pgnb.core.liveness.Watcher``) holds its lock around every call.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def add(self, pid: int, started: float) -> None:
        if pid in self._fds or not hasattr(os, "pidfd_open"):
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already, or no pidfds here
            return
        if process_alive(pid, started):  # the process started then, not a later one with its pid
            self._fds[pid] = fd
        else:
            os.close(fd)

    def remove(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def ended(self, procs: dict[int, float]) -> list[int]:
        """Those of ``procs`` (pid -> start time, as ``start_time`` gives it) that no longer run."""
        polled = {self._fds[pid]: pid for pid in procs if pid in self._fds}
        ended = []
        if polled:
            poller = select.poll()
            for fd in polled:
                poller.register(fd, select.POLLIN)
            ended = [polled[fd] for fd, _ in poller.poll(0)]
        return ended + [pid for pid, started in procs.items()
                        if pid not in self._fds and not process_alive(pid, started)]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
