"""Baselines that pgnb's benchmarks are measured against.

Plain ipyparallel with its defaults, the real ``%%px`` magic, and ``torchrun``
(``python -m torch.distributed.run``): each function starts what it needs,
measures, stops it again and makes sure no process it started is left.

Every cluster here runs under a fresh temporary ``IPYTHONDIR`` so that a
benchmark neither reads nor writes the user's profiles.

Run ``python benchmarks/baselines.py`` to print one measurement of each as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil
from ipyparallel import interactive

__all__ = [
    "plain_engine_uss_after_torch",
    "plain_ipyparallel_cold_init",
    "plain_ipyparallel_stop",
    "px_trivial_roundtrip",
    "torchrun_allreduce_bandwidth",
]

# Seconds to wait for the processes of a stopped cluster to exit.  Engine
# nannies outlive stop_cluster by ~3 s (they notice their engine is gone on
# their own poll), so "stopped" and "nothing left" are measured separately.
EXIT_DEADLINE = 15.0
# Client-side deadline for any one remote step (torch import, rendezvous).
STEP_TIMEOUT = 120.0


# --------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def _temporary_ipython_dir() -> Iterator[str]:
    """Point IPYTHONDIR (inherited by controller and engines) at a fresh dir."""
    old = os.environ.get("IPYTHONDIR")
    path = tempfile.mkdtemp(prefix="pgnb-bench-ipython-")
    os.environ["IPYTHONDIR"] = path
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = old
        shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    """A free TCP port on loopback (plain-user style; racy but usual)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_gone(pids: set[int], deadline: float = EXIT_DEADLINE) -> tuple[float, int]:
    """Wait until every pid has exited; kill stragglers (ours) after deadline.

    Returns (seconds waited, number of processes that had to be killed).
    """
    start = time.perf_counter()
    while time.perf_counter() - start < deadline:
        if not _alive(pids):
            return time.perf_counter() - start, 0
        time.sleep(0.05)
    stragglers = _alive(pids)
    for pid in stragglers:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    return time.perf_counter() - start, len(stragglers)


def _reap_children() -> None:
    """Collect exit statuses of our direct children so they leave no zombies."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                child.wait(timeout=0)


def _rank_order(client: Any) -> list[int]:
    # rank = position of the engine id in sorted(client.ids), as in pgnb
    return sorted(client.ids)


# --------------------------------------------------------------------------
# engine-side functions: @interactive ships them by value (run with the
# engine's namespace as globals), so this module need not be importable
# there; imports must be inside


@interactive
def _engine_init_process_group(rank: int, world: int, port: int) -> float:
    import datetime
    import os
    import time

    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    start = time.perf_counter()
    dist.init_process_group(
        backend="gloo",
        init_method="env://",
        timeout=datetime.timedelta(seconds=60),
    )
    return time.perf_counter() - start


@interactive
def _engine_uss() -> int:
    import psutil

    return int(psutil.Process().memory_full_info().uss)


def _init_all(client: Any) -> None:
    """init_process_group on every engine at once (apply_async to each)."""
    ids = _rank_order(client)
    port = _free_port()
    pending = [
        client[eid].apply_async(_engine_init_process_group, rank, len(ids), port)
        for rank, eid in enumerate(ids)
    ]
    for ar in pending:
        ar.get(timeout=STEP_TIMEOUT)


# --------------------------------------------------------------------------
# plain ipyparallel


def plain_ipyparallel_cold_init(n: int = 4) -> dict[str, float]:
    """Cold start of a plain gloo world on ipyparallel with its defaults.

    ``ipp.Cluster(n=n).start_and_connect_sync()``, ``import torch`` on all
    engines, then ``init_process_group(backend="gloo", init_method="env://")``
    on all engines concurrently (MASTER_ADDR=127.0.0.1, a free MASTER_PORT).

    Returns seconds: ``engines_up``, ``torch_imported``, ``initialized`` (each
    the duration of that phase), ``total`` (wall clock from ``Cluster()`` to
    the last rank initialized); plus, outside ``total``: ``stop`` (the
    ``stop_cluster_sync`` call), ``all_exited`` (until every process it
    started was gone) and ``killed`` (stragglers killed after the deadline).
    """
    import ipyparallel as ipp

    with _temporary_ipython_dir():
        before = _descendants()
        cluster = None
        client = None
        try:
            t0 = time.perf_counter()
            cluster = ipp.Cluster(n=n)
            client = cluster.start_and_connect_sync()
            t1 = time.perf_counter()
            client[:].execute("import torch", block=True)
            t2 = time.perf_counter()
            _init_all(client)
            t3 = time.perf_counter()
        finally:
            started = _descendants() - before
            if client is not None:
                client.close()
            ts = time.perf_counter()
            if cluster is not None:
                cluster.stop_cluster_sync()
            stop = time.perf_counter() - ts
            exited, killed = _wait_gone(started)
            _reap_children()
    return {
        "engines_up": t1 - t0,
        "torch_imported": t2 - t1,
        "initialized": t3 - t2,
        "total": t3 - t0,
        "stop": stop,
        "all_exited": stop + exited,
        "killed": float(killed),
    }


def plain_ipyparallel_stop(n: int = 4, init_process_group: bool = True) -> dict[str, float]:
    """Time ``Cluster.stop_cluster_sync()`` (defaults) for a world of ``n``.

    The world is brought to the state a pgnb world has before shutdown
    (torch imported and, by default, the gloo process group initialized);
    only the stop is timed.  Returns seconds: ``stop`` (the call),
    ``all_exited`` (from the call until every process the cluster started
    has exited) and ``killed`` (stragglers killed after the deadline).
    """
    import ipyparallel as ipp

    with _temporary_ipython_dir():
        before = _descendants()
        cluster = ipp.Cluster(n=n)
        try:
            client = cluster.start_and_connect_sync()
            client[:].execute("import torch", block=True)
            if init_process_group:
                _init_all(client)
            client.close()
        finally:
            started = _descendants() - before
            ts = time.perf_counter()
            cluster.stop_cluster_sync()
            stop = time.perf_counter() - ts
            exited, killed = _wait_gone(started)
            _reap_children()
    return {"stop": stop, "all_exited": stop + exited, "killed": float(killed)}


def plain_engine_uss_after_torch(n: int = 1) -> int:
    """USS in bytes of a plain ipyparallel engine after ``import torch``.

    USS counts only pages no other process maps, so it depends on how many
    other processes have torch loaded: start ``n`` engines, import torch on
    all, and return the median engine's USS.  Compare like with like (same
    ``n``, nothing else running torch).
    """
    import ipyparallel as ipp

    with _temporary_ipython_dir():
        before = _descendants()
        cluster = ipp.Cluster(n=n)
        try:
            client = cluster.start_and_connect_sync()
            client[:].execute("import torch", block=True)
            uss = int(statistics.median(client[:].apply_sync(_engine_uss)))
            client.close()
        finally:
            started = _descendants() - before
            cluster.stop_cluster_sync()
            _wait_gone(started)
            _reap_children()
    return uss


# --------------------------------------------------------------------------
# %%px


def px_trivial_roundtrip(client: Any, repeats: int = 30, via: str = "magic") -> float:
    """Median seconds of a trivial cell (``x = 1``) on all engines of ``client``.

    ``via="magic"`` runs the real ``%%px`` cell magic in an IPython
    ``InteractiveShell`` (works outside a kernel), blocking like
    ``start_and_connect(activate=True)`` sets it up; ``via="execute"`` calls
    ``DirectView.execute(block=True)`` for comparison.  Three unmeasured
    warm-up runs come first.
    """
    view = client[:]
    view.block = True
    if via == "magic":
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        # no history database: this shell may live in a temporary IPYTHONDIR
        config = Config()
        config.HistoryManager.enabled = False
        ip = InteractiveShell.instance(config=config)
        view.activate()

        def once() -> None:
            ip.run_cell_magic("px", "", "x = 1")

    elif via == "execute":

        def once() -> None:
            view.execute("x = 1", block=True)

    else:
        raise ValueError(f"via must be 'magic' or 'execute', not {via!r}")

    for _ in range(3):
        once()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# --------------------------------------------------------------------------
# torchrun

TORCHRUN_ALLREDUCE_SCRIPT = '''\
"""gloo all_reduce timing under torchrun (written by pgnb benchmarks)."""
import json
import sys
import time

import torch
import torch.distributed as dist


def main():
    numel, iters, warmup = (int(a) for a in sys.argv[1:4])
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(numel, dtype=torch.float32)
    dist.all_reduce(t)
    assert t[0].item() == world, "all_reduce gave a wrong sum"
    # zeros keep the values finite however many iterations run
    t.zero_()
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    elapsed = time.perf_counter() - start
    # the slowest rank defines the time of the collective
    slowest = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("PGNB_RESULT " + json.dumps({"elapsed": slowest.item(), "world": world}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def torchrun_allreduce_bandwidth(
    nproc: int = 4, numel: int = 1 << 22, iters: int = 20, warmup: int = 3
) -> dict[str, float]:
    """gloo ``all_reduce`` of ``numel`` float32 under torchrun, loopback only.

    ``python -m torch.distributed.run --nproc-per-node nproc --nnodes 1
    --master-addr 127.0.0.1 --master-port <free>`` with
    ``GLOO_SOCKET_IFNAME=lo``; ``warmup`` unmeasured ops, then ``iters``
    timed ones (slowest rank).  Returns ``seconds_per_op``,
    ``algbw_GBps`` (bytes / time), ``busbw_GBps`` (algbw * 2(n-1)/n, the
    nccl-tests convention for all_reduce) and ``launch_total`` (wall clock
    of the whole torchrun command).
    """
    with tempfile.TemporaryDirectory(prefix="pgnb-bench-torchrun-") as tmp:
        script = os.path.join(tmp, "allreduce.py")
        with open(script, "w") as f:
            f.write(TORCHRUN_ALLREDUCE_SCRIPT)
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(nproc),
            "--nnodes", "1",
            "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()),
            script, str(numel), str(iters), str(warmup),
        ]  # fmt: skip
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        start = time.perf_counter()
        # own session, so a timeout can stop torchrun and its workers together
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        launch_total = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{out}")
    lines = [ln for ln in out.splitlines() if ln.startswith("PGNB_RESULT ")]
    if not lines:
        raise RuntimeError(f"torchrun printed no result:\n{out}")
    result = json.loads(lines[-1].split(" ", 1)[1])
    per_op = result["elapsed"] / iters
    algbw = numel * 4 / per_op / 1e9
    return {
        "seconds_per_op": per_op,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (nproc - 1) / nproc,
        "launch_total": launch_total,
    }


# --------------------------------------------------------------------------


def main() -> None:
    import ipyparallel as ipp

    results: dict[str, Any] = {}
    # ipyparallel logs to stdout; keep stdout for the JSON alone
    with contextlib.redirect_stdout(sys.stderr):
        results["plain_ipyparallel_cold_init"] = plain_ipyparallel_cold_init(4)
        results["plain_ipyparallel_stop"] = plain_ipyparallel_stop(4)
        with _temporary_ipython_dir():
            before = _descendants()
            cluster = ipp.Cluster(n=4)
            try:
                client = cluster.start_and_connect_sync()
                results["px_trivial_roundtrip"] = {
                    "magic": px_trivial_roundtrip(client, 30, via="magic"),
                    "execute": px_trivial_roundtrip(client, 30, via="execute"),
                }
                client.close()
            finally:
                started = _descendants() - before
                cluster.stop_cluster_sync()
                _wait_gone(started)
                _reap_children()
        results["torchrun_allreduce_bandwidth"] = torchrun_allreduce_bandwidth(
            4, 1 << 22, 20
        )
        results["plain_engine_uss_after_torch"] = {
            "n=1": plain_engine_uss_after_torch(1),
            "n=4": plain_engine_uss_after_torch(4),
        }
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
