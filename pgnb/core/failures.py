"""Failures on demand, for lessons: make the classic failures happen when a course wants them.

* a rank that joins the rendezvous late: ``%pg_init ... --delay-rank 2:5``
  (``WorldSpec.delay_ranks``);
* a rank that dies: ``kill_rank`` (``%pg_kill 2``) sends SIGKILL to the rank's
  engine, as the out-of-memory killer would; pgnb then reports the rank
  ``lost`` and ``%pg_init ... --force`` restarts the world;
* a rank that skips a collective: plain code in a cell
  (``if rank != 1: dist.all_reduce(t)``) with ``%%pg --trace --timeout 3``.

Each one leads to pgnb's ordinary diagnosis and recovery; nothing here is a
special path.
"""

from __future__ import annotations

import os
import signal

from ..errors import NotStartedError, RankLost, SpecError
from .dispatch import Dispatch
from .remote import is_local
from .waiting import poll_until

#: Seconds to wait for pgnb's liveness watcher to notice the killed engine.
NOTICE_WAIT = 5.0


def kill_rank(sb: Dispatch, rank: int, wait: float = NOTICE_WAIT) -> str:
    """SIGKILL the engine of ``rank`` and wait until pgnb has noticed; the one-line account.

    Only the engine process pgnb started for that rank is signalled, by pid.
    """
    engines = sb.engine_ids
    if not engines:
        raise NotStartedError()
    if not 0 <= rank < len(engines):
        raise SpecError(f"no rank {rank}: the world has ranks 0-{len(engines) - 1}")
    lost = sb.lost_ranks([rank])
    if lost:
        raise RankLost(f"rank {rank} is already lost ({lost[rank]})", [rank])
    row = sb.snapshot().ranks[rank]
    if row.pid is None:
        raise SpecError(f"rank {rank} has no engine process yet")
    if row.host and not is_local(row.host):
        # another host: the engine's nanny passes the signal on
        sb.client.send_signal(signal.SIGKILL, targets=[engines[rank]], block=True)
        return f"sent SIGKILL to rank {rank}'s engine on host {row.host}"
    os.kill(row.pid, signal.SIGKILL)
    poll_until(lambda: sb.lost_ranks([rank]), wait)  # the watcher's notice is a look at the world, not an event
    return f"killed rank {rank}'s engine (SIGKILL), as a crash or the out-of-memory killer would"
