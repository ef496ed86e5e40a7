"""A rank's life in its engine: who it is, the store socket, init_process_group, status, destroy.

Plain functions sent by reference (``pgnb.rank.engine.init_rank``): they must
stay importable, top-level and self-contained; torch is imported inside them.
State that must outlive one call lives in ``_STATE`` of the engine process.
Nothing here imports pgnb's kernel side (``pgnb.core``, ``pgnb.notebook``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, cast

from .._wire import EngineFacts, InitPlan, RankReport
from . import rendezvous as rank_rendezvous
from .library_state import forget_world
from .rendezvous import reset_group_counter

#: "fresh_threads": torch's intra-op thread count before pgnb first set one (what a fresh process here has)
_STATE: dict[str, Any] = {}


def fresh_threads(env: dict[str, str]) -> int:
    """The intra-op threads torch gives a fresh process started with ``env``: ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` where set (torch reads both, MKL's last), else this process's count before pgnb
    set one (a world's ranks share the cores: ``threads``)."""
    import torch

    count = 0
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            count = int(value)
    return count or int(_STATE.get("fresh_threads") or torch.get_num_threads())


def route_to(host: str) -> tuple[str, str | None]:
    """This engine's address on the route to ``host``, and that interface's name."""
    addr = "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP connect sends nothing; it only picks a route
            addr = s.getsockname()[0]
    except OSError:
        pass
    return addr, _interface_of(addr)


def _interface_of(addr: str) -> str | None:
    try:
        import psutil
    except ImportError:
        return "lo" if addr.startswith("127.") else None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return cast(str, name)  # psutil is untyped here
    return None


def describe(controller_host: str) -> EngineFacts:
    """Who and where this engine is; answered before any torch import."""
    addr, iface = route_to(controller_host)
    mpi_rank = None
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            mpi_rank = int(os.environ[var])
            break
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "addr": addr,
        "iface": iface,
        "launcher_rank": mpi_rank,
        "nanny_pid": _nanny_pid(),
    }


def _nanny_pid() -> int | None:
    try:
        from ipyparallel.engine.app import IPEngine

        if IPEngine.initialized():
            pipe = getattr(IPEngine.instance(), "nanny_pipe", None)
            return getattr(pipe, "pid", None)
    except Exception:  # the nanny is optional; its pid only helps cleanup
        pass
    return None


def warm_up() -> str:
    """Import torch before the rendezvous, so its deadline is not spent importing."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch
    import torch.distributed  # noqa: F401

    text_progress_bars()
    no_prompts()
    import warnings

    from .streams import format_warning

    warnings.formatwarning = format_warning  # a warning says where as a traceback does, the same every run
    return str(torch.__version__)


def no_prompts() -> None:
    """Take IPython's ``sys.ps1``, ``ps2`` and ``ps3`` away on this rank, as a torchrun worker has none.

    IPython sets them "so that scripts can decide if they are running interactively", and Lightning
    does (``_IS_INTERACTIVE``): it then refuses ``strategy="ddp"``, whose processes the ranks already
    are, and advises forking more inside each rank. Nothing on a rank needs them: an engine never prompts.
    """
    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)


def text_progress_bars() -> None:
    """Make ``from tqdm.auto import tqdm`` give the text bar on this rank.

    tqdm.auto picks its widget bar inside an IPython kernel, and an engine looks like
    one (ipyparallel has imported tqdm.auto already): the widget would be made here,
    where no frontend shows it, and the cell's output would keep only its first frame.
    A text bar reaches the notebook's live view (one updating line per rank) and its
    final state reaches the grouped output. Plain ``from tqdm import tqdm`` is the text bar anyway.
    """
    try:
        import tqdm.asyncio
        import tqdm.auto
        import tqdm.autonotebook
        import tqdm.std
    except ImportError:  # tqdm is optional for the user's code
        return
    tqdm.autonotebook.tqdm, tqdm.autonotebook.trange = tqdm.std.tqdm, tqdm.std.trange
    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.asyncio.tqdm, tqdm.asyncio.trange


def listen_for_store(addr: str, port: int) -> int:
    """Rank 0: hold a listening socket for the TCPStore, bound to ``addr`` only.

    torch's own store listens on every interface; binding it ourselves keeps a
    local world on loopback, and port 0 lets the kernel pick a free port with
    no race between two notebooks initialising at once.
    """
    close_store_socket()
    rank_rendezvous.forget_store()  # the previous world's store may hold this very port
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(1024)
    _STATE["store_socket"] = sock
    return int(sock.getsockname()[1])


def close_store_socket() -> None:
    sock = _STATE.pop("store_socket", None)
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


def init_rank(plan: InitPlan) -> RankReport:
    """Join the world: set the environment torch reads, then init_process_group."""
    t0 = time.monotonic()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.update(plan["env"])
    rank_rendezvous.remember(plan["env"])  # what no cell keeps changed
    delay = plan.get("delay", 0.0)
    if delay:
        time.sleep(delay)  # a late joiner, on request (lessons and tests)

    import datetime

    import torch
    import torch.distributed as dist

    _STATE.setdefault("fresh_threads", torch.get_num_threads())
    torch.set_num_threads(plan["threads"])
    dist.set_debug_level_from_env()
    if dist.is_initialized():
        dist.destroy_process_group()
    forget_world()
    reset_group_counter(dist)

    kwargs: dict[str, Any] = {
        "backend": plan["backend"],
        "timeout": datetime.timedelta(seconds=plan["timeout"]),
        "group_name": plan["group_name"],
    }
    device = "cpu"
    if plan["cuda"]:
        index = plan["local_rank"] % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
        import inspect

        if "device_id" in inspect.signature(dist.init_process_group).parameters:  # torch >= 2.3
            kwargs["device_id"] = torch.device(device)  # binds the NCCL communicator to this GPU eagerly
    if "rank" in plan:
        kwargs.update(rank=plan["rank"], world_size=plan["world_size"])

    sock = _STATE.get("store_socket")
    server = None
    if sock is not None:
        # rank 0 serves the store on the socket it bound; the others reach it via init_method
        server = dist.TCPStore(
            plan["master_addr"],
            sock.getsockname()[1],
            plan["world_size"],
            True,
            kwargs["timeout"],
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
        _STATE.pop("store_socket").detach()  # the store owns (and will close) the fd now
    if server is not None and not plan["init_method"].startswith("file:"):
        # init_process_group prefixes a rendezvous store with "default_pg"; do the same by hand
        kwargs["store"] = dist.PrefixStore("default_pg", server)
        kwargs.update(rank=plan["rank"], world_size=plan["world_size"])
    else:  # a file:// world meets on its file; rank 0's store serves only the inits of cells
        kwargs["init_method"] = plan["init_method"]
        if not plan["init_method"].startswith("file:"):
            time.sleep(rank_rendezvous.connect_pace(plan["local_rank"]))  # not all of a big host's ranks at once
    dist.init_process_group(**kwargs)
    # the inits cells make from pgnb's MASTER_ADDR/PORT meet on this world's store too
    rank_rendezvous.keep_store(server, dist.group.WORLD, serves=plan["env"]["MASTER_PORT"] != "0")
    _STATE["device"] = device
    _STATE["init_seconds"] = time.monotonic() - t0
    _publish_names(torch, dist, device)
    return rank_status()


def _publish_names(torch: Any, dist: Any, device: str) -> None:
    """Give %%pg cells the names every lesson starts with."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.user_ns.update(torch=torch, dist=dist, rank=dist.get_rank(),
                             world_size=dist.get_world_size(), device=torch.device(device))


def rank_status() -> RankReport:
    """What torch itself says about this rank's default group."""
    out: RankReport = {"pid": os.getpid(), "host": socket.gethostname(), "initialized": False}
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return out
    backend = str(dist.get_backend())
    try:
        config = str(dist.get_backend_config())
    except Exception:  # older torch, or a backend without a config
        config = backend
    out.update({
        "initialized": True,
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": backend,
        "backend_config": config,
        "device": _STATE.get("device", "cpu"),
        "init_seconds": _STATE.get("init_seconds"),
    })
    return out


def destroy(clear: bool = False) -> bool:
    """destroy_process_group() if there is one; True when something was destroyed.

    ``clear``: first empty this rank's namespace (``pgnb.rank.values.clear_namespace``), while the
    group its objects may hold is still alive.
    """
    import sys

    if clear:
        from .values import clear_namespace

        clear_namespace()
    dist = sys.modules.get("torch.distributed")
    destroyed = False
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
        destroyed = True
    forget_world()
    close_store_socket()
    rank_rendezvous.new_round()  # the inits of later cells are in step on every rank again
    return destroyed
