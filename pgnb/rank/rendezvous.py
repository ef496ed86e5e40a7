"""The rendezvous on a rank: the variables pgnb set at init, and the store every later init meets on.

``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are pgnb's: it
sets them at every init (``pgnb.rank.engine.init_rank``). A cell that rewrites them (a
tutorial's ``setup()`` doing ``os.environ["MASTER_PORT"] = "12355"``) keeps its values for
itself only: torchrun-style code in a later cell reads the world's, and the cell says so once.

Code written for torchrun calls ``init_process_group()`` from those variables once per process;
a rank lives on, and a cell may init and destroy the default group again and again. torch would
have rank 0 listen on ``MASTER_PORT`` each time, where the world's store (or a group an old DDP
model still holds) already listens: EADDRINUSE on rank 0, and the others wait on the old store.
So rank 0 keeps the world's store for the world's life (a ``file://`` world's too, which meets
on its file but listens all the same), and every init addressed to pgnb's
``MASTER_ADDR:MASTER_PORT`` (``env://``, or ``tcp://`` built from them) meets on it, each under
a prefix of its own: the same port every time, never a key of an earlier init. An init while a
group is up gets torch's error and what to do, in one line.
Stdlib here; torch is imported inside the functions, only once pgnb's group exists.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import time
import weakref
from collections.abc import Mapping
from typing import Any

#: The variables of pgnb's rendezvous that no cell keeps changed.
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
_SET: dict[str, str] = {}
#: "server": rank 0's store (kept across destroys), "inits": the inits it served on this rank in this
#: round, "rounds": the ``%pg_destroy``s since pgnb's init, "group": a weak reference to pgnb's own default group
_WORLD: dict[str, Any] = {}

#: The ranks of one host (by local rank) that connect to a TCP store at once; the others wait their turn.
CONNECT_AT_ONCE = 16
#: Seconds between two connections of the ranks past ``CONNECT_AT_ONCE`` (4 ms was too few where it was tried).
CONNECT_GAP = 0.008


def connect_pace(local_rank: int) -> float:
    """Seconds a rank waits before it connects to a TCP store, so that a host's ranks do not all connect at once.

    torch's store client reverse-resolves (``getnameinfo``) the address it connects to, and the store's server
    the address of each client it accepts. A DNS server that limits its rate drops part of a burst of such
    lookups (64 ranks on one host make 128 at once): those ranks wait out the resolver's 5 s timeout, and the
    world with them (docs/performance.md). 0.38 s more for 64 ranks on a host; nothing for 16 or fewer.
    """
    return max(0, local_rank - CONNECT_AT_ONCE + 1) * CONNECT_GAP


def remember(env: Mapping[str, str]) -> None:
    """At init: the values of ``RENDEZVOUS_VARS`` pgnb put in ``env`` (and in ``os.environ``).

    A new rendezvous: the store of the previous world serves no more inits."""
    _SET.clear()
    _SET.update({k: env[k] for k in RENDEZVOUS_VARS if k in env})
    forget_store()


def restore() -> str:
    """After a cell: put back what ``remember`` saw; one line naming the variables the cell changed
    or removed ("" when it changed none)."""
    changed = [k for k, v in _SET.items() if os.environ.get(k) != v]
    if not changed:
        return ""
    os.environ.update({k: _SET[k] for k in changed})
    value = "value" if len(changed) == 1 else "values"
    return (f"pgnb: this cell changed {', '.join(changed)}; later cells see pgnb's {value} again "
            "(the rendezvous variables are pgnb's)")


def keep_store(server: Any, group: Any, serves: bool) -> None:
    """After pgnb's own init: ``group`` is pgnb's; if ``serves`` (rank 0 listens on ``MASTER_PORT``),
    later inits to pgnb's address meet on this world's store (``server``, rank 0's ``TCPStore``;
    None on the other ranks, which connect to it)."""
    _WORLD.update(server=server, inits=0, rounds=0, group=weakref.ref(group), serves=serves)
    _install()


def new_round() -> None:
    """At ``%pg_destroy``, which every rank gets: inits count from 0 again, under a prefix no earlier
    init used, so ranks that made different inits before (some ranks only, or one that failed
    on some) are in step again."""
    if "inits" in _WORLD:
        _WORLD.update(rounds=_WORLD["rounds"] + 1, inits=0)


def forget_store() -> None:
    """Before rank 0 listens again (a fixed port must be free) and at every new rendezvous."""
    _WORLD.clear()


def _install() -> None:
    """Once per process: torch's env:// and tcp:// stores, and init_process_group, go through pgnb first."""
    import importlib

    import torch.distributed as dist

    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    # the module, not torch.distributed's function of the same name that ``import ... as`` would give
    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
    create = getattr(torch_rendezvous, "_create_c10d_store", None)  # what env:// and tcp:// both call
    if create is not None and not hasattr(create, "pgnb_original"):
        setattr(torch_rendezvous, "_create_c10d_store", _served(create))  # noqa: B010  (a private name of torch's)
    if not hasattr(dist.init_process_group, "pgnb_original"):
        once = _once(dist.init_process_group, dist)
        for module in (dist, c10d):  # ``from torch.distributed import init_process_group`` in a cell gets it too
            setattr(module, "init_process_group", once)  # noqa: B010


def _served(original: Any) -> Any:
    @functools.wraps(original)
    def create_c10d_store(hostname: str, port: int, rank: int, world_size: int, timeout: Any,
                          use_libuv: bool = True) -> Any:
        if not _is_worlds(hostname, port):
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        from torch.distributed import PrefixStore, TCPStore

        n = _WORLD["inits"]
        _WORLD["inits"] = n + 1  # SPMD code inits in the same order on every rank: the same prefix
        time.sleep(connect_pace(int(_SET.get("LOCAL_RANK", "0"))))
        client = TCPStore(_SET["MASTER_ADDR"], port, world_size, False, timeout)
        return PrefixStore(f"pgnb/round{_WORLD['rounds']}/init{n}", client)

    create_c10d_store.pgnb_original = original  # type: ignore[attr-defined]
    return create_c10d_store


def _is_worlds(hostname: str, port: int) -> bool:
    """Whether an init is addressed to the store pgnb keeps (its MASTER_ADDR and MASTER_PORT)."""
    addr = _SET.get("MASTER_ADDR")
    if not _WORLD.get("serves") or addr is None or str(port) != _SET.get("MASTER_PORT"):
        return False
    return hostname == addr or (_is_loopback(hostname) and _is_loopback(addr))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reset_group_counter(dist: Any) -> None:
    """A failed init leaves torch's group counter at 1, so this rank would name its
    default group differently from a fresh rank and the rendezvous keys would never
    match. destroy_process_group() resets it; do the same after a failure."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def _once(original: Any, dist: Any) -> Any:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if dist.is_initialized():  # torch would say only "twice!"; say whose group it is and what to do
            raise ValueError(twice_text(dist))
        try:
            return original(*args, **kwargs)
        except BaseException:
            if not dist.is_initialized():  # a cell's init that failed: the next one names its group as a fresh one
                reset_group_counter(dist)
            raise

    init_process_group.pgnb_original = original  # type: ignore[attr-defined]
    return init_process_group


def twice_text(dist: Any) -> str:
    """torch's error for a second init_process_group, and what to do, in one line."""
    group = dist.group.WORLD
    what = f"backend {dist.get_backend()}, world {dist.get_world_size()}"
    ours = _WORLD.get("group")
    if ours is not None and ours() is group:
        return (f"trying to initialize the default process group twice! pgnb's group is up on this rank "
                f"({what}): use it as it is (dist, rank and world_size are ready in every cell), "
                "or run %pg_destroy first")
    return (f"trying to initialize the default process group twice! a group an earlier init_process_group made "
            f"is up on this rank ({what}): call destroy_process_group() first")
