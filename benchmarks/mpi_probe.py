"""Probe: ipyparallel engines started by its MPI launcher (OpenMPI, as root).

Answers, on this machine, what pgnb's ``--launcher mpi`` needs to know:
which settings make ``ipp.Cluster(engines="mpi", n=4)`` start as root on
fewer cores than engines, which ways of passing them work, whether engines
see their MPI rank (mpi4py and ``OMPI_COMM_WORLD_RANK``), how engine ids
relate to MPI ranks, how long start and stop take, whether anything is left
after ``stop_cluster``, and whether a gloo ``all_reduce`` works across the
MPI-launched engines.

``python benchmarks/mpi_probe.py [NAME-PART ...]`` prints one JSON report
(all probes, or those whose name contains one of the arguments).  Every cluster
runs under a fresh temporary IPYTHONDIR; only processes started here are
waited for (and killed by pid if they outlive the deadline).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil
from ipyparallel import interactive
from traitlets.config import Config

# OpenMPI 4.1 refuses to run as root without both of these.
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# ... and refuses more ranks than cores without this (same as --oversubscribe).
OVERSUBSCRIBE_ENV = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
EXIT_DEADLINE = 20.0


@contextlib.contextmanager
def _temporary_ipython_dir() -> Iterator[str]:
    old = os.environ.get("IPYTHONDIR")
    path = tempfile.mkdtemp(prefix="pgnb-mpi-probe-")
    os.environ["IPYTHONDIR"] = path
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = old
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _alive(pids: set[int]) -> dict[int, str]:
    alive = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive[pid] = " ".join(p.cmdline()[:4])
        except psutil.NoSuchProcess:
            pass
    return alive


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- engine-side: @interactive ships them by value; imports inside


@interactive
def _engine_facts() -> dict[str, Any]:
    import os

    from mpi4py import MPI

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "mpi_rank": MPI.COMM_WORLD.Get_rank(),
        "mpi_size": MPI.COMM_WORLD.Get_size(),
        "OMPI_COMM_WORLD_RANK": os.environ.get("OMPI_COMM_WORLD_RANK"),
        "OMPI_COMM_WORLD_SIZE": os.environ.get("OMPI_COMM_WORLD_SIZE"),
        "OMPI_COMM_WORLD_LOCAL_RANK": os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"),
        "PGNB_PROBE_VAR": os.environ.get("PGNB_PROBE_VAR"),
        # DEFAULT_MPI_INIT of `ipengine --mpi` runs in the user namespace
        "ns_mpi_rank": globals().get("mpi_rank"),
    }


@interactive
def _engine_gloo_allreduce(rank: int, world: int, port: int) -> dict[str, Any]:
    import datetime
    import os
    import time

    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        GLOO_SOCKET_IFNAME="lo",
    )
    start = time.perf_counter()
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=60)
    )
    init = time.perf_counter() - start
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    out = {
        "rank": dist.get_rank(),
        "sum": t.tolist(),
        "init_seconds": init,
        "torch_mpi_available": dist.is_mpi_available(),
    }
    dist.destroy_process_group()
    return out


# ---- one probe


def probe(
    name: str,
    n: int = 4,
    os_env: dict[str, str] | None = None,
    environment: dict[str, str] | None = None,
    mpi_args: list[str] | None = None,
    gloo: bool = True,
    grow: bool = False,
    kill_mpiexec: int = 0,
    cluster_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start an MPI cluster one way, look at it, stop it, look again."""
    import ipyparallel as ipp

    report: dict[str, Any] = {"name": name}
    config = Config()
    if environment is not None:
        # reaches mpiexec's own environment (launcher.get_env); OpenMPI
        # passes it on to ranks on the local node
        config.MPIEngineSetLauncher.environment = environment
    if mpi_args is not None:
        config.MPIEngineSetLauncher.mpi_args = mpi_args
    with _temporary_ipython_dir(), _environ(os_env or {}):
        before = _descendants()
        cluster = ipp.Cluster(engines="mpi", n=n, config=config, **(cluster_kwargs or {}))
        client = None
        seen: set[int] = set()
        try:
            t0 = time.perf_counter()
            try:
                client = cluster.start_and_connect_sync()
            except Exception as e:
                report["error"] = f"{type(e).__name__}: {e}"
                report["failed_after"] = time.perf_counter() - t0
                for es in cluster.engines.values():
                    out = es.get_output()
                    report["mpiexec_output_head"] = [
                        ln for ln in out.splitlines() if ln.strip() and "---" not in ln
                    ][:3]
                return report
            report["start_and_connect"] = time.perf_counter() - t0
            # snapshot now: nannies are reparented away once their engine dies
            seen |= _descendants() - before
            es = next(iter(cluster.engines.values()))
            report["mpiexec_args"] = es.args
            report["mpiexec_pid"] = es.pid
            report["ids"] = list(client.ids)
            facts = client[:].apply_async(_engine_facts).get_dict(timeout=60)
            report["engines"] = {str(k): v for k, v in sorted(facts.items())}
            report["id_equals_mpi_rank"] = all(
                k == v["mpi_rank"] == int(v["OMPI_COMM_WORLD_RANK"])
                for k, v in facts.items()
            )
            if gloo:
                t1 = time.perf_counter()
                client[:].execute("import torch", block=True)
                report["torch_import"] = time.perf_counter() - t1
                ids = sorted(client.ids)
                port = _free_port()
                ars = [
                    client[eid].apply_async(_engine_gloo_allreduce, r, len(ids), port)
                    for r, eid in enumerate(ids)
                ]
                report["gloo"] = [ar.get(timeout=120) for ar in ars]
                expected = float(sum(range(1, len(ids) + 1)))
                report["gloo_ok"] = all(
                    g["sum"] == [expected] * 4 for g in report["gloo"]
                )
            if grow:
                # a second engine set on the same controller: a second,
                # separate MPI world whose ranks again request ids 0..n-1
                t2 = time.perf_counter()
                cluster.start_engines_sync(n=2)
                client.wait_for_engines(n + 2, timeout=60)
                report["grow_seconds"] = time.perf_counter() - t2
                seen |= _descendants() - before
                grown = client[:].apply_async(_engine_facts).get_dict(timeout=60)
                report["grown_ids_to_mpi"] = {
                    str(k): f"rank {v['mpi_rank']} of {v['mpi_size']}"
                    for k, v in sorted(grown.items())
                }
            if kill_mpiexec:
                # what a reaper would do: one signal to the one mpiexec pid
                tk = time.perf_counter()
                os.kill(es.pid, kill_mpiexec)
                ranks = {v["pid"] for v in facts.values()}
                while _alive(ranks) and time.perf_counter() - tk < EXIT_DEADLINE:
                    time.sleep(0.05)
                report["after_signal_to_mpiexec"] = {
                    "signal": kill_mpiexec,
                    "ranks_alive": len(_alive(ranks)),
                    "ranks_gone_after": time.perf_counter() - tk,
                    "still_alive": sorted(set(_alive(seen).values())),
                }
            # mpiexec's combined output, minus ipyparallel's own log lines
            out = es.get_output()
            report["mpiexec_output_other_lines"] = sorted(
                {
                    ln.strip()
                    for ln in out.splitlines()
                    if ln.strip() and not ln.startswith(("[IPEngine", "20"))
                }
            )[:10]
        finally:
            started = seen | (_descendants() - before)
            report["processes_started"] = len(started)
            if client is not None:
                client.close()
            ts = time.perf_counter()
            cluster.stop_cluster_sync()
            report["stop_cluster"] = time.perf_counter() - ts
            alive = _alive(started)
            report["alive_right_after_stop"] = sorted(set(alive.values()))
            while alive and time.perf_counter() - ts < EXIT_DEADLINE:
                time.sleep(0.1)
                alive = _alive(started)
            report["all_exited_after"] = time.perf_counter() - ts
            report["killed_after_deadline"] = sorted(set(alive.values()))
            for pid in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
    return report


def main() -> None:
    probes = [
        # the failures first, to see how they surface
        dict(name="no settings"),
        dict(name="root env only", os_env=ROOT_ENV, gloo=False),
        # working variants
        dict(
            name="os.environ: root + OMPI_MCA_rmaps_base_oversubscribe",
            os_env={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
        ),
        dict(
            name="launcher environment trait: root + oversubscribe + probe var",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV, "PGNB_PROBE_VAR": "env"},
            gloo=False,
        ),
        dict(
            name="mpi_args: --allow-run-as-root --oversubscribe -x PGNB_PROBE_VAR",
            os_env={"PGNB_PROBE_VAR": "x"},
            mpi_args=["--allow-run-as-root", "--oversubscribe", "-x", "PGNB_PROBE_VAR"],
            gloo=False,
        ),
    ]
    probes += [
        dict(
            name="fast start: delay=0, HeartMonitor.period=1000, environment trait",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
            cluster_kwargs={
                "delay": 0,
                "controller_args": ["--HeartMonitor.period=1000"],
            },
        ),
        dict(
            name="mpi_args: -x PGNB_PROBE_VAR=value, root+oversubscribe in environment",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
            mpi_args=["-x", "PGNB_PROBE_VAR=x-value"],
            gloo=False,
        ),
        dict(
            name="grow: second MPI engine set on the same cluster",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
            gloo=False,
            grow=True,
        ),
        dict(
            name="SIGKILL to mpiexec (as a reaper would send)",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
            gloo=False,
            kill_mpiexec=int(signal.SIGKILL),
        ),
        dict(
            name="SIGTERM to mpiexec",
            environment={**ROOT_ENV, **OVERSUBSCRIBE_ENV},
            gloo=False,
            kill_mpiexec=int(signal.SIGTERM),
        ),
    ]
    # optional arguments select probes by a piece of their name
    wanted = sys.argv[1:]
    if wanted:
        probes = [p for p in probes if any(w in str(p["name"]) for w in wanted)]
    # ipyparallel logs to stdout; keep stdout for the JSON alone
    with contextlib.redirect_stdout(sys.stderr):
        reports = [probe(**p) for p in probes]  # type: ignore[arg-type]
    json.dump(reports, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
