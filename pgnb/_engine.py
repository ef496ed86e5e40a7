"""Plain functions that run on the ranks (inside ipyparallel engines).

They are sent by reference (``pgnb._engine.init_rank``) so they must stay
importable, top-level and self-contained; torch is imported inside them.
State that must outlive one call lives in ``_STATE`` of the engine process.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

_STATE: dict[str, Any] = {}


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
            return name
    return None


def describe(controller_host: str) -> dict[str, Any]:
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

    return str(torch.__version__)


def listen_for_store(addr: str, port: int) -> int:
    """Rank 0: hold a listening socket for the TCPStore, bound to ``addr`` only.

    torch's own store listens on every interface; binding it ourselves keeps a
    local world on loopback, and port 0 lets the kernel pick a free port with
    no race between two notebooks initialising at once.
    """
    close_store_socket()
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


def init_rank(plan: dict[str, Any]) -> dict[str, Any]:
    """Join the world: set the environment torch reads, then init_process_group."""
    t0 = time.monotonic()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.update(plan["env"])
    delay = plan.get("delay", 0.0)
    if delay:
        time.sleep(delay)  # a late joiner, on request (lessons and tests)

    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(plan["threads"])
    dist.set_debug_level_from_env()
    if dist.is_initialized():
        dist.destroy_process_group()
    _reset_group_counter(dist)

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
    if sock is not None:
        # rank 0 serves the store on the socket it bound; the others reach it via init_method
        # init_process_group prefixes a rendezvous store with "default_pg"; do the same by hand
        kwargs["store"] = dist.PrefixStore("default_pg", dist.TCPStore(
            plan["master_addr"],
            sock.getsockname()[1],
            plan["world_size"],
            True,
            kwargs["timeout"],
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        ))
        kwargs.update(rank=plan["rank"], world_size=plan["world_size"])
        _STATE.pop("store_socket").detach()  # the store owns (and will close) the fd now
    else:
        kwargs["init_method"] = plan["init_method"]
    dist.init_process_group(**kwargs)
    _STATE["device"] = device
    _STATE["init_seconds"] = time.monotonic() - t0
    _publish_names(torch, dist, device)
    return rank_status()


def _reset_group_counter(dist: Any) -> None:
    """A failed init leaves torch's group counter at 1, so this rank would name its
    default group differently from a fresh rank and the rendezvous keys would never
    match. destroy_process_group() resets it; do the same after a failure."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


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


def rank_status() -> dict[str, Any]:
    """What torch itself says about this rank's default group."""
    out: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "initialized": False}
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return out
    backend = str(dist.get_backend())
    try:
        config = str(dist.get_backend_config())
    except Exception:  # older torch, or a backend without a config
        config = backend
    out.update(
        initialized=True,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        backend=backend,
        backend_config=config,
        device=_STATE.get("device", "cpu"),
        init_seconds=_STATE.get("init_seconds"),
    )
    return out


def destroy() -> bool:
    """destroy_process_group() if there is one; True when something was destroyed."""
    import sys

    dist = sys.modules.get("torch.distributed")
    destroyed = False
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
        destroyed = True
    close_store_socket()
    return destroyed


# ---- %%pg cells ------------------------------------------------------------
#: Last-expression values bigger than this stay on the rank (``_pg`` gets a stand-in).
VALUE_LIMIT = 64 * 2**20


def stack_file(stack_dir: str, pid: int) -> str:
    """Where the engine with ``pid`` writes its faulthandler dumps (one 0600 file per engine)."""
    return os.path.join(stack_dir, f"stacks-{pid}.txt")


def enable_stack_dumps(stack_dir: str | None) -> str | None:
    """Dump every thread's Python stack into a 0600 file on SIGUSR1.

    faulthandler writes from a C signal handler, so the dump works while the
    main thread is blocked inside a gloo collective (which ignores SIGINT).
    ``stack_dir`` is a 0700 directory the kernel made; on another host it does
    not exist and the rank simply has no dumps. Idempotent.
    """
    import faulthandler
    import signal

    path = None if stack_dir is None else stack_file(stack_dir, os.getpid())
    if path is None or _STATE.get("stack_path") == path:
        return _STATE.get("stack_path")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    old = _STATE.pop("stack_file", None)
    _STATE["stack_file"] = f = os.fdopen(fd, "w")
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    if old is not None:
        old.close()
    _STATE["stack_path"] = path
    return path


def run_cell(code: str, label: int | None = None, stack_dir: str | None = None,
             want_value: bool = True, trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a notebook cell in this rank's IPython namespace, as ``%%pg`` does.

    Runs through ``shell.run_cell`` (so magics, ``display()`` and the
    last-expression value behave as in a notebook), but as an apply request:
    a failing cell is reported in the return value, so the engine never
    aborts the requests queued behind it (``TaskAborted``). ``label`` is the
    notebook's cell number, so tracebacks say ``Cell In[label]`` on every run.
    ``trace`` (``%%pg --trace``): the arguments of ``_tracer.start``; the
    torch.distributed calls are recorded while the cell runs, and only then.
    """
    enable_stack_dumps(stack_dir)
    from IPython import get_ipython

    shell = get_ipython()
    error: dict[str, Any] = {}

    def grab(etype: Any, evalue: Any, stb: list[str]) -> None:
        error.update(ename=getattr(etype, "__name__", str(etype)), evalue=clean_message(str(evalue)),
                     traceback=plain_traceback(evalue, shell))

    if trace is not None:
        from . import _tracer

        _tracer.start(**trace)
    saved_count = shell.execution_count
    shadowed = shell.__dict__.get("_showtraceback")
    shell._showtraceback = grab  # the formatted traceback comes back in the reply, not on iopub
    if label is not None:
        shell.execution_count = label
    try:
        res = shell.run_cell(code, store_history=False, silent=False)
    finally:
        if trace is not None:
            _tracer.stop()
        if shadowed is None:
            del shell._showtraceback
        else:
            shell._showtraceback = shadowed
        shell.execution_count = saved_count
    out: dict[str, Any] = {"ok": bool(res.success), "before_exec": res.error_before_exec is not None}
    if not res.success:
        exc = res.error_before_exec or res.error_in_exec
        out.update(ename=type(exc).__name__, evalue=str(exc), traceback=[])
        out.update(error)
        if isinstance(exc, SyntaxError):  # str() names the cell's temp file; say the line instead
            out["evalue"] = f"{exc.msg} (line {exc.lineno})" if exc.lineno else str(exc.msg)
    if want_value and res.result is not None:
        out["value"] = pack_value(res.result)
    return out


def clean_message(text: str) -> str:
    """An error message without what differs between runs and machines.

    torch prefixes C++ errors with a source location (``[/__w/pytorch/.../pair.cc:553]``)
    and names peers by address and port (``[127.0.0.1]:24230``).
    """
    import re

    text = re.sub(r"\[[^\]\s]*\.(?:cpp|cc|h|hpp):\d+\]\s*", "", text)
    return re.sub(r"\[?\b\d{1,3}(?:\.\d{1,3}){3}\]?:\d+", "<peer>", text)


def plain_traceback(exc: BaseException, shell: Any) -> list[str]:
    """The traceback trimmed to the user's code, the same text on every run and machine.

    Cell frames show their line and source; library frames show only where
    (no line numbers, no absolute paths: they differ between installs).
    IPython's own frames above the cell are dropped.
    """
    import traceback

    cells = set(getattr(getattr(shell, "compile", None), "_filename_map", {}) or {})
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename in cells), 0)
    lines = ["Traceback (most recent call last):"] if frames[first:] else []
    for f in frames[first:]:
        if f.filename in cells:
            lines.append(f"  Cell, line {f.lineno}, in {f.name}")
            if f.line:
                lines.append(f"    {f.line.strip()}")
        else:
            lines.append(f"  {_short_path(f.filename)}, in {f.name}")
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    lines.append(clean_message(last))
    return lines


def _short_path(filename: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    if "/ipykernel_" in filename:
        return "a kernel cell"  # a function defined in the notebook and sent to the ranks
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    if filename.startswith(stdlib + "/"):
        return filename[len(stdlib) + 1:]
    return os.path.basename(filename)


def pack_value(value: Any) -> tuple[str, Any]:
    """``("pickle", bytes)`` if the value can travel safely, else ``("text", why)``.

    Tensors come back on the CPU (the kernel may have no GPU); anything that
    does not pickle, or is over ``VALUE_LIMIT``, stays on the rank.
    """
    import pickle

    try:
        data = pickle.dumps(_to_cpu(value, 3), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # lambdas, open files, process groups, ...
        return ("text", f"cannot be pickled ({type(e).__name__})")
    if len(data) > VALUE_LIMIT:
        return ("text", f"too big to copy ({len(data) // 2**20} MiB)")
    return ("pickle", data)


def _to_cpu(value: Any, depth: int) -> Any:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if depth <= 0:
        return value
    if type(value) in (list, tuple):
        return type(value)(_to_cpu(v, depth - 1) for v in value)
    if type(value) is dict:
        return {k: _to_cpu(v, depth - 1) for k, v in value.items()}
    return value


def push_values(values: dict[str, Any]) -> None:
    """``Sandbox.push``: put the values into this rank's namespace, as cells see it."""
    from IPython import get_ipython

    get_ipython().user_ns.update(values)


def pull_value(name: str) -> Any:
    """``Sandbox.pull``: this rank's value of ``name`` (tensors come back on the CPU)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return _to_cpu(ns[name], 3)
