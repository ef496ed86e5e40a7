"""The reaper process (``python -m pgnb.procs.reaper OWNER_PID TOKEN``): kills what its owner owned once
the owner is gone, removes pgnb's files, then exits.

Started and told what to watch by the owner's handle
(:class:`pgnb.procs.reaper_handle.Reaper`), over its stdin, one line each::

    pid PID START       a process, with its start time (``start_time``): a reused pid is not killed
    path PATH           a file or folder to remove
    cluster STATE_FILE  a cluster's files to remove (``pgnb.procs.ownership.remove_cluster_files``)
    release             the owner cleaned up itself: exit, killing nothing

When stdin closes without ``release``, or the owner's pid is gone, it kills
every process carrying the owner's token and every listed process that is
still the one it was told of.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time
from typing import IO

from .ownership import remove_cluster_files
from .processes import kill_all, owned_by_token, start_time


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
