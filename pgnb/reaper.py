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
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import IO

OWNER_ENV = "PGNB_OWNER"


class Reaper:
    """The owner's handle on its reaper process."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pgnb.reaper", str(os.getpid()), token],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # must outlive the kernel's process group
            text=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, line: str) -> None:
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

            created = psutil.Process(pid).create_time()
        except Exception:  # gone already, or psutil missing: the token scan still covers it
            return
        self._send(f"pid {pid} {created!r}")

    def own_path(self, path: str) -> None:
        self._send(f"path {path}")

    def release(self) -> None:
        """The owner cleaned up itself: the reaper exits without killing anything."""
        self._send("release")
        self._close()

    def reap_now(self) -> None:
        """Close the pipe as a dying owner would: the reaper kills what it owns."""
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


def _owner_alive(owner_pid: int) -> bool:
    try:
        os.kill(owner_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(owner_pid: int, stdin: IO[str]) -> tuple[bool, dict[int, float], list[str]]:
    """Read the owner's messages until release (True) or its death (False)."""
    pids: dict[int, float] = {}
    paths: list[str] = []
    buf = ""
    fd = stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if not _owner_alive(owner_pid):
                return False, pids, paths
            continue
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            return False, pids, paths
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            kind, _, rest = line.partition(" ")
            if kind == "release":
                return True, pids, paths
            if kind == "pid":
                pid, created = rest.split()
                pids[int(pid)] = float(created)
            elif kind == "path":
                paths.append(rest)


def main(argv: list[str]) -> int:
    owner_pid, token = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook interrupt is not a death
    released, pids, paths = _watch(owner_pid, sys.stdin)
    if released:
        return 0
    import psutil

    victims = set(owned_by_token(token))
    for pid, created in pids.items():
        try:
            if abs(psutil.Process(pid).create_time() - created) < 0.01:
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
