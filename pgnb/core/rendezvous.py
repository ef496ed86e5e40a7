"""Where the ranks meet: MASTER_ADDR/PORT, init_method URLs, store files.

Pure planning (no engines, no torch): given the spec, the port rank 0
bound, and what each engine said about itself, build each rank's
``init_rank`` plan. Rank 0 always serves the TCP store on a socket it bound
itself (see ``pgnb.rank.engine.listen_for_store``); ranks 1.. reach it through the
``init_method`` the user asked for, so ``env://`` and ``tcp://`` mean what
the torch docs say. A ``file://`` world meets on its file; its store serves
the inits cells make from ``MASTER_ADDR``/``MASTER_PORT``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlparse

from .._wire import InitPlan
from ..spec import DEBUG_LEVELS, WorldSpec
from .torchrun_env import torchrun_env

#: The file:// store's name in pgnb's store directory.
STORE_FILE = "store"


@dataclass(frozen=True)
class EngineInfo:
    """What one engine told us about itself (``pgnb.rank.engine.describe``)."""

    engine_id: int
    pid: int
    host: str
    addr: str
    iface: str | None
    launcher_rank: int | None = None
    nanny_pid: int | None = None


def rank_order(engines: list[EngineInfo], world: int, use_launcher_rank: bool) -> list[EngineInfo]:
    """Pick ``world`` engines and put them in rank order.

    Rank = position of the engine id in ``sorted(ids)``, unless the launcher
    numbered its processes (MPI's COMM_WORLD rank, SLURM_PROCID): then the
    torch rank is that number, so ``mpiexec``'s rank and torch's agree.
    """
    numbered = [e.launcher_rank for e in engines]
    # distinct numbers only: engines of two mpiexec runs (a grown world), or local engines that
    # inherited the kernel's own SLURM_PROCID, do not number one world
    if use_launcher_rank and engines and None not in numbered and len(set(numbered)) == len(numbered):
        ordered = sorted(engines, key=lambda e: (e.launcher_rank, e.engine_id))
    else:
        ordered = sorted(engines, key=lambda e: e.engine_id)
    return ordered[:world]


def keep_rank_numbers(previous: list[EngineInfo], engines: list[EngineInfo], world: int,
                      use_launcher_rank: bool) -> list[EngineInfo]:
    """``rank_order``, where a rank number belongs to its process for the process's life.

    Each engine of ``previous`` (the world before, in rank order) still among ``engines`` keeps its
    rank (those at ``world`` or above leave it); the other engines fill the free numbers in
    ``rank_order``'s order. So a lost rank's replacement takes the lost number, and no survivor is
    renumbered; with no ``previous`` (a cold start) this is ``rank_order``.
    """
    by_id = {e.engine_id: e for e in engines}
    kept = {r: by_id[e.engine_id] for r, e in enumerate(previous[:world]) if e.engine_id in by_id}
    was = {e.engine_id for e in previous}
    spare = iter(rank_order([e for e in engines if e.engine_id not in was], world, use_launcher_rank))
    out: list[EngineInfo] = []
    for r in range(world):
        engine = kept.get(r) or next(spare, None)
        if engine is None:
            break
        out.append(engine)
    return out


def engines_wanted(previous: list[EngineInfo], engine_ids: list[int], world: int) -> int:
    """How many engines ``keep_rank_numbers`` needs to fill ``world`` ranks, given the pool's ``engine_ids``.

    A free number below ``world`` (its engine lost, or beyond the previous world) takes an engine that was
    not a rank before; a survivor numbered ``world`` or above leaves and never takes a lower number. So
    shrinking 3 -> 2 with rank 1 lost starts an engine for rank 1 while the old rank 2 sits idle.
    """
    have = set(engine_ids)
    was = {e.engine_id for e in previous}
    free = sum(1 for r in range(world) if r >= len(previous) or previous[r].engine_id not in have)
    return len(have) + max(0, free - len(have - was))


def store_bind(spec: WorldSpec, rank0: EngineInfo) -> tuple[str, int]:
    """The (address, port) rank 0 binds its store socket to; port 0 = any free port."""
    url = spec.init_url
    if url and url.startswith("tcp://"):
        parsed = urlparse(url)
        return str(parsed.hostname), int(parsed.port or 0)
    return rank0.addr, 0


def local_ranks(ordered: list[EngineInfo]) -> list[int]:
    """Each rank's index among the ranks on the same host (for cuda:{local_rank})."""
    seen: dict[str, int] = {}
    out = []
    for e in ordered:
        out.append(seen.get(e.host, 0))
        seen[e.host] = out[-1] + 1
    return out


def init_url(spec: WorldSpec, master_addr: str, port: int, store_dir: str | None) -> str:
    if spec.init_url:
        return spec.init_url
    if spec.scheme == "env":
        return "env://"
    if spec.scheme == "tcp":
        host = f"[{master_addr}]" if ":" in master_addr else master_addr
        return f"tcp://{host}:{port}"
    assert store_dir is not None, "file:// needs a store directory"
    return f"file://{os.path.join(store_dir, STORE_FILE)}"


def plans(
    spec: WorldSpec,
    ordered: list[EngineInfo],
    master_addr: str,
    port: int,
    store_dir: str | None,
    run_id: str,
) -> list[InitPlan]:
    """One ``pgnb.rank.engine.init_rank`` plan per rank, in rank order; ``run_id`` names this world's
    run as torchrun's ``TORCHELASTIC_RUN_ID`` does."""
    url = init_url(spec, master_addr, port, store_dir)
    hosts = [e.host for e in ordered]
    uses_store_socket = spec.scheme in ("env", "tcp")
    delays = dict(spec.delay_ranks)
    out = []
    for rank, (engine, local_rank) in enumerate(zip(ordered, local_ranks(ordered), strict=True)):
        env = {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(spec.world),
            "LOCAL_RANK": str(local_rank),
            "TORCH_DISTRIBUTED_DEBUG": DEBUG_LEVELS[spec.debug],
            **torchrun_env(hosts, rank, run_id, spec.threads_per_rank),
        }
        if engine.iface:
            # gloo binds to the hostname's address unless told; keep it on the route we know works
            env["GLOO_SOCKET_IFNAME"] = engine.iface
        plan: InitPlan = {
            "backend": spec.backend,
            "init_method": url,
            "timeout": spec.timeout,
            "group_name": spec.group_name,
            "threads": spec.threads_per_rank,
            "env": env,
            "cuda": spec.uses_cuda,
            "local_rank": local_rank,
            "delay": delays.get(rank, 0.0),
            "master_addr": master_addr,
            "world_size": spec.world,
        }
        if spec.scheme != "env" or (uses_store_socket and rank == 0):
            # env:// reads RANK/WORLD_SIZE from the environment, as the docs say
            plan["rank"] = rank
        else:
            plan["rank_from_env"] = rank
        out.append(plan)
    return out
