"""The reaper process (``python -m pgnb.procs.reaper OWNER_PID TOKEN``): kills what its owner owned once
the owner is gone, removes pgnb's files, then exits.

Started and told what to watch by the owner's handle
(:class:`pgnb.procs.reaper_handle.Reaper`), over its stdin, one line each::

    pid PID START       a process, with its start time (``start_time``): a reused pid is not killed
    path PATH           a file or folder to remove
    cluster STATE_FILE  a cluster's files to remove (``pgnb.procs.ownership.remove_cluster_files``)
    launched FILE       an ipyparallel cluster file whose engines run elsewhere (ssh, a batch job)
    release             the owner cleaned up itself: exit, killing nothing

When stdin closes without ``release``, or the owner's pid is gone, it kills
every process carrying the owner's token and every listed process that is
still the one it was told of; then it kills the engines of each ``launched``
cluster through their own launcher (``ssh HOST kill``, ``scancel``): no pid or
token of this machine reaches them.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, NamedTuple

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


class Owned(NamedTuple):
    """What the owner told: processes (pid -> start time), paths, state files, launched cluster files."""

    pids: dict[int, float]
    paths: list[str]
    clusters: list[str]
    launched: list[str]


def _watch(owner_pid: int, stdin: IO[str]) -> tuple[bool, Owned]:
    """Read the owner's messages until release (True) or its death (False)."""
    owned = Owned({}, [], [], [])
    buf = ""
    fd = stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if not _owner_alive(owner_pid):
                return False, owned
            continue
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            return False, owned
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            kind, _, rest = line.partition(" ")
            if kind == "release":
                return True, owned
            if kind == "pid":
                pid, created = rest.split()
                owned.pids[int(pid)] = float(created)
            elif kind == "path":
                owned.paths.append(rest)
            elif kind == "cluster":
                owned.clusters.append(rest)
            elif kind == "launched":
                owned.launched.append(rest)


def kill_launched(cluster_file: str) -> None:
    """Kill the engines of an ipyparallel cluster file through their launchers, all at once.

    Engines on other hosts carry no pid or token this machine can see: an SSH engine is killed
    with ``ssh HOST kill -9 PID`` (its nanny follows it), a batch job is cancelled. SIGKILL, not
    the launcher's polite stop: that waits on each engine in turn (19 s for 4 SSH engines here)
    and their owner is gone anyway.
    """
    try:
        import ipyparallel as ipp
        from ipyparallel.cluster.launcher import BatchSystemLauncher

        # ipyparallel rebuilds a batch launcher before it sets its profile_dir, and meanwhile makes the
        # launcher's "log" folder relative to the working directory: the profile's own, not the notebook's
        # folder this process was started in
        os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(cluster_file))))
        cluster = ipp.Cluster.from_file(cluster_file, log_level=50)
    except Exception:  # no such file (stopped already), or not readable: nothing to reach
        return
    calls: list[Callable[[], object]] = []
    for engine_set in list(cluster.engines.values()):
        if isinstance(engine_set, BatchSystemLauncher):
            calls.append(engine_set.stop)  # scancel/qdel: the job and everything in it
        else:
            per_engine = list(dict(getattr(engine_set, "launchers", {}) or {}).values()) or [engine_set]
            calls += [functools.partial(el.signal, signal.SIGKILL) for el in per_engine]

    def call(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:  # that host or queue is unreachable now: nothing more to do from here
            pass

    threads = [threading.Thread(target=call, args=(fn,), daemon=True) for fn in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


def main(argv: list[str]) -> int:
    owner_pid, token = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook interrupt is not a death
    released, owned = _watch(owner_pid, sys.stdin)
    if released:
        return 0
    pids, paths, clusters = owned.pids, owned.paths, owned.clusters
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
    for cluster_file in owned.launched:  # the cluster file still says where they run: before it is removed
        kill_launched(cluster_file)
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
