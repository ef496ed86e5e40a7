"""Makes pgnb's processes die with the kernel that owns them.

ipyparallel starts its controller, engines and nannies in their own
sessions and never watches its parent, so a kernel killed with SIGKILL
(nbval does that) would leave them running. pgnb starts one small reaper
process per world, in its own session, connected to the owner by a pipe.
The owner tells it what it owns; when the pipe closes without a
``release`` (or the owner pid is gone) the reaper kills exactly those
processes and removes pgnb's files, then exits.

What it owns is proven, never guessed by name: pids recorded with their
start times, and processes whose environment carries this world's
``PGNB_OWNER`` token (set by pgnb on everything it launches).

A reaper that dies while its owner lives is noticed by the owner's liveness
watcher and replaced at once (``Reaper.respawn``) by one told everything the
old one knew.

If the reaper dies with its owner (the whole process group was SIGKILLed, the machine
ran out of memory), the next ``%pg_init`` sweeps up after it: every cluster
pgnb starts gets a state file next to ipyparallel's cluster file
(``security/pgnb-<cluster_id>.json``, 0600) naming its owner (pid and start
time) and token. A state file whose owner is dead proves that the
processes carrying its token and the files named after its cluster id are
leftovers of pgnb's; nothing else is touched.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from .ipcontroller_config import schedulers_path

OWNER_ENV = "PGNB_OWNER"
STATE_PREFIX = "pgnb-"


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
        return subprocess.Popen(
            [sys.executable, "-m", "pgnb.procs.reaper", str(os.getpid()), self.token],
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


# ---------------------------------------------------------------- reaper side
def owned_by_token(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``PGNB_OWNER=token``."""
    needle = f"{OWNER_ENV}={token}".encode()
    me = os.getpid()
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


def kill_all(pids: list[int], grace: float = 1.0) -> None:
    """SIGTERM every pid at once, wait ``grace`` seconds, SIGKILL the rest."""
    import psutil

    procs = []
    for pid in set(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


# ------------------------------------------------------------ state files
def state_path(profile_dir: str, cluster_id: str) -> str:
    return os.path.join(profile_dir, "security", f"{STATE_PREFIX}{cluster_id}.json")


def write_state(profile_dir: str, cluster_id: str, token: str) -> str:
    """Record that this process owns cluster ``cluster_id`` (a 0600 file next to its cluster file)."""
    import psutil

    path = state_path(profile_dir, cluster_id)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    me = psutil.Process()
    state = {"cluster_id": cluster_id, "profile_dir": profile_dir, "token": token,
             "owner_pid": me.pid, "owner_started": start_time(me)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    return path


def read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    keys = ("cluster_id", "profile_dir", "token", "owner_pid", "owner_started")
    return state if isinstance(state, dict) and all(k in state for k in keys) else None


def cluster_files(profile_dir: str, cluster_id: str, logs: bool = True) -> list[str]:
    """The files ipyparallel writes for one cluster id (and pgnb's state file) that exist."""
    sec, log = os.path.join(profile_dir, "security"), os.path.join(profile_dir, "log")
    found = [
        os.path.join(sec, f"cluster-{cluster_id}.json"),
        os.path.join(sec, f"ipcontroller-{cluster_id}-client.json"),
        os.path.join(sec, f"ipcontroller-{cluster_id}-engine.json"),
        os.path.join(log, f"engines{cluster_id}.json"),  # the hub's engine state
        schedulers_path(profile_dir, cluster_id),  # the controller's list of its processes
        state_path(profile_dir, cluster_id),
    ]
    if logs:
        cid = glob.escape(cluster_id)
        found += glob.glob(os.path.join(glob.escape(log), f"ipcontroller-{cid}-*.log"))
        found += glob.glob(os.path.join(glob.escape(log), f"ipengine-{cid}-*.log"))
    return [p for p in found if os.path.lexists(p)]


def remove_cluster_files(state_file: str) -> list[str]:
    """Remove the files of the cluster a state file describes; the removed paths."""
    state = read_state(state_file)
    if state is None:
        return []
    removed = []
    for path in cluster_files(str(state["profile_dir"]), str(state["cluster_id"])):
        try:
            os.remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


_HAS_PROC = os.path.isdir("/proc/self")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name, from one read (``[0]`` the state, ``[19]``
    the start in clock ticks since boot, ``[49]`` the exit status of a zombie), or None when there is no
    such process. Raises ``OSError`` where there is no ``/proc``, ``ValueError`` on a line it cannot read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        if _HAS_PROC:
            return None
        raise
    return stat[stat.rindex(b")") + 2:].split()


def _started(fields: list[bytes]) -> float:
    return int(fields[19]) / _CLK_TCK


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
        started = None if fields is None else _started(fields)
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
        return fields is not None and fields[0] not in (b"Z", b"X") and abs(_started(fields) - started) < 0.01
    except (OSError, ValueError, IndexError):
        return _process_alive_psutil(pid, started)


def _process_alive_psutil(pid: int, started: float) -> bool:
    import psutil

    try:
        p = psutil.Process(pid)
        return bool(abs(float(p.create_time() - psutil.boot_time()) - started) < 0.01
                    and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def process_running(pid: int) -> bool:
    """``pid`` runs now (a zombie does not); for a moment's check, where pid reuse cannot happen yet."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def sweep(profile_dir: str) -> list[str]:
    """Clean up after pgnb owners that died uncleanly: kill their processes, remove their files.

    Only clusters with a pgnb state file whose owner process is gone are
    touched; the removed paths are returned.
    """
    removed: list[str] = []
    pattern = os.path.join(glob.escape(os.path.join(profile_dir, "security")), f"{STATE_PREFIX}*.json")
    for path in glob.glob(pattern):
        state = read_state(path)
        if state is None or process_alive(int(state["owner_pid"]), float(state["owner_started"])):
            continue
        kill_all(owned_by_token(str(state["token"])))
        removed += remove_cluster_files(path)
    return removed


def _owner_alive(owner_pid: int) -> bool:
    try:
        os.kill(owner_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(owner_pid: int, stdin: IO[str]) -> tuple[bool, dict[int, float], list[str], list[str]]:
    """Read the owner's messages until release (True) or its death (False)."""
    pids: dict[int, float] = {}
    paths: list[str] = []
    clusters: list[str] = []
    buf = ""
    fd = stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if not _owner_alive(owner_pid):
                return False, pids, paths, clusters
            continue
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            return False, pids, paths, clusters
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            kind, _, rest = line.partition(" ")
            if kind == "release":
                return True, pids, paths, clusters
            if kind == "pid":
                pid, created = rest.split()
                pids[int(pid)] = float(created)
            elif kind == "path":
                paths.append(rest)
            elif kind == "cluster":
                clusters.append(rest)


def main(argv: list[str]) -> int:
    owner_pid, token = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook interrupt is not a death
    released, pids, paths, clusters = _watch(owner_pid, sys.stdin)
    if released:
        return 0
    import psutil

    victims = set(owned_by_token(token))
    for pid, created in pids.items():
        try:
            if abs(start_time(psutil.Process(pid)) - created) < 0.01:
                victims.add(pid)
        except psutil.NoSuchProcess:
            pass
    kill_all(sorted(victims))
    # a second sweep catches children started while we were killing (nannies, mpiexec ranks)
    time.sleep(0.1)
    kill_all(owned_by_token(token))
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass
    for state_file in clusters:
        remove_cluster_files(state_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
