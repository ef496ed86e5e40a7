"""Which cluster files are pgnb's, proven by a state file that names their owner.

Every cluster pgnb starts gets a state file next to ipyparallel's cluster
file (``security/pgnb-<cluster_id>.json``, 0600) naming its owner (pid and
start time) and the owner token its processes carry. A state file whose owner
is dead proves that the processes carrying its token and the files named
after its cluster id are leftovers of pgnb's: ``sweep`` (the next
``%pg_init``) and the reaper remove exactly those; nothing else is touched.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from .ipcontroller_config import schedulers_path
from .processes import kill_all, owned_by_token, process_alive, start_time

STATE_PREFIX = "pgnb-"


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
