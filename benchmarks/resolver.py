"""The resolver's share of a big world's start: the same starts with and without a DNS server to ask.

torch's store client formats the address it connects to with ``getnameinfo`` (a reverse
lookup) in its socket's constructor, and the store's server (rank 0) the address of each
client it accepts, one after the other in its one event loop. The client connects over IPv6
first, to ``::ffff:127.0.0.1``, which ``/etc/hosts``' IPv4 lines do not match, so each
connection asks the DNS server twice, and a world's ranks connect at the same moment. A
server that drops part of such a burst makes the ranks wait out the resolver's timeout (5 s);
pgnb has a host's ranks past the 16th connect 8 ms apart (``pgnb.rank.rendezvous.connect_pace``),
plain torch does not. This module measures that share two ways:

- ``torch_forked_init``: plain torch, no pgnb: ``n`` ranks forked after ``import torch``,
  each calling ``init_process_group("gloo")`` from ``env://``;
- ``run_case(..., isolated_net=True)`` (``benchmarks._runner``) runs any case in a network
  namespace with only loopback, where a lookup fails at once instead of waiting.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import time
from typing import Any

#: A rank whose init took longer than this waited out the resolver's timeout (5 s) at least once.
WAITED = 4.0
#: Runs a command in a new network namespace with only loopback up (root, util-linux's unshare, iproute2).
ISOLATED_NET = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def isolated_net_missing() -> str:
    """Why a network namespace cannot be made here ("" when it can)."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "unshare or ip is not installed"
    proc = subprocess.run([*ISOLATED_NET, "true"], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"unshare --net failed: {proc.stderr.strip() or proc.returncode}"


def torch_forked_init(n: int = 64) -> dict[str, Any]:
    """``n`` forked ranks' ``init_process_group`` (gloo, ``env://``): the wall time from the first fork
    until every rank has passed a barrier and exited; each rank's own init time (the slowest, and
    how many took more than ``WAITED`` seconds)."""
    import torch.distributed as dist

    from benchmarks import baselines

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(baselines._free_port()), WORLD_SIZE=str(n))
    read, write = os.pipe()
    pids = []
    t0 = time.perf_counter()
    for rank in range(n):
        pid = os.fork()
        if pid == 0:  # the rank: init, report its time, leave without running the parent's atexit
            code = 1
            try:
                os.close(read)
                os.environ["RANK"] = str(rank)
                started = time.perf_counter()
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
                os.write(write, f"{time.perf_counter() - started:.4f}\n".encode())
                dist.barrier()  # a rank that left at once would close the pairs another rank is still connecting
                dist.destroy_process_group()
                code = 0
            except BaseException as e:  # os._exit below would swallow it
                os.write(2, f"rank {rank}: {type(e).__name__}: {e}\n".encode())
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(write)
    failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in pids)
    wall = time.perf_counter() - t0
    with os.fdopen(read) as f:
        times = [float(line) for line in f.read().split()]
    return {"init": wall, "ranks": n, "failed": failed, "waited": sum(t > WAITED for t in times),
            "slowest": max(times, default=float("nan"))}
