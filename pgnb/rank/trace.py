"""The rank side of ``%%pg --trace``: record torch.distributed calls while a traced cell runs.

Tracing costs nothing when it is off: nothing is wrapped. ``start`` replaces
the collective and point-to-point functions of ``torch.distributed`` by
recording wrappers for the duration of one traced cell, and ``stop`` puts the
originals back.

DTensor, FSDP2, tensor parallelism and pipelining mostly do not call those
functions: they issue **functional collectives** (``torch.ops._c10d_functional``)
or call torch's C++ ops (``torch.ops.c10d``) through names bound at import.
For those, ``start`` also enters a ``TorchDispatchMode`` (as torch's own
``CommDebugMode`` does) that sees every collective op the dispatcher runs on
this thread and records it under the name of the ``torch.distributed``
function it stands for, so both kinds pair up across ranks. An op issued
inside a wrapped call is part of that call and is not recorded twice. Each
record also says, where the Python stack tells, which library call issued it
(``fully_shard unshard of layers.0``, ``RowwiseParallel output``, ...).

Each call appends two JSON lines to this rank's trace file, one when it
starts and one when it returns, each with a single ``os.write`` on an
``O_APPEND`` file in a 0700 directory the kernel made. The kernel reads the
file itself, so it learns how far a rank got even while the rank is blocked
inside a collective (and cannot answer an apply request). A rank on another
host, where that directory does not exist, keeps its records in memory and the
kernel fetches them with ``take`` once the rank is free.

Times come from ``clock()``, which the kernel also samples to measure this
rank's clock offset (``pgnb.core.trace_run.measure_offsets``). Tests skew it with
``set_clock_skew`` to check that the kernel measures and corrects the offset.

Like ``pgnb.rank.engine``, this module is sent by reference to the engines: it imports
nothing heavy at the top, and torch only inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import json
import os
import sys
import threading
import time
from typing import Any

from .._private_names import require

#: Collective functions: name -> the parameters whose tensors describe the call
#: (the ones every rank must agree on; outputs that only some ranks pass are left out).
COLLECTIVES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("tensor",),
    "all_reduce_coalesced": ("tensors",),
    "broadcast": ("tensor",),
    "reduce": ("tensor",),
    "all_gather": ("tensor",),
    "all_gather_into_tensor": ("input_tensor",),
    "_all_gather_base": ("input_tensor",),
    "gather": ("tensor",),
    "scatter": ("tensor",),
    "reduce_scatter": ("output",),
    "reduce_scatter_tensor": ("input",),
    "_reduce_scatter_base": ("input",),
    "all_to_all": ("input_tensor_list",),
    "all_to_all_single": ("input",),
    "barrier": (),
    "monitored_barrier": (),
    "all_gather_object": (),
    "gather_object": (),
    "scatter_object_list": (),
    "broadcast_object_list": (),
}
#: Point-to-point functions: name -> (direction, the peer parameter).
P2P: dict[str, tuple[str, str]] = {
    "send": ("send", "dst"),
    "recv": ("recv", "src"),
    "isend": ("send", "dst"),
    "irecv": ("recv", "src"),
    "send_object_list": ("send", "dst"),
    "recv_object_list": ("recv", "src"),
}
#: Parameters that say how ranks take part; every rank must pass the same.
ROLE_ARGS = ("op", "src", "dst", "group_src", "group_dst")
#: ``batch_isend_irecv`` compares ``P2POp.op is isend`` against torch's own module global,
#: so ``distributed_c10d.isend`` / ``irecv`` stay as they are (users call ``dist.isend``).
_KEEP_IN_C10D = ("isend", "irecv")

#: Dispatcher-level collective ops -> (the torch.distributed function they stand for, the argument
#: holding the tensors that describe the call, {role: argument}). ``torch.ops.c10d`` ops are what every
#: Python-level call becomes (and what names bound before the trace call); the functional ones are
#: what DTensor, tensor parallelism and compiled code issue.
C10D_OPS: dict[str, tuple[str, str, dict[str, str]]] = {
    "allreduce_": ("all_reduce", "tensors", {"op": "reduce_op"}),
    "allreduce_coalesced_": ("all_reduce_coalesced", "tensors", {"op": "reduce_op"}),
    "broadcast_": ("broadcast", "tensors", {"src": "root_rank"}),
    "reduce_": ("reduce", "tensors", {"op": "reduce_op", "dst": "root_rank"}),
    "allgather_": ("all_gather", "input_tensors", {}),
    "_allgather_base_": ("all_gather_into_tensor", "input_tensor", {}),
    "allgather_coalesced_": ("all_gather_coalesced", "input_list", {}),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", "inputs", {}),
    "reduce_scatter_": ("reduce_scatter", "output_tensors", {"op": "reduce_op"}),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", "input_tensor", {"op": "reduce_op"}),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", "inputs", {"op": "reduce_op"}),
    "gather_": ("gather", "input_tensors", {"dst": "root_rank"}),
    "scatter_": ("scatter", "output_tensors", {"src": "root_rank"}),
    "alltoall_": ("all_to_all", "input_tensors", {}),
    "alltoall_base_": ("all_to_all_single", "input", {}),
    "barrier": ("barrier", "", {}),
    "monitored_barrier_": ("monitored_barrier", "", {}),
    "send": ("send", "tensors", {"dst": "dst"}),
    "recv_": ("recv", "tensors", {"src": "src"}),
    "recv_any_source_": ("recv", "tensors", {}),
}
FUNCTIONAL_OPS: dict[str, tuple[str, str, dict[str, str]]] = {
    "all_reduce": ("all_reduce", "input", {"op": "reduce_op"}),
    "all_reduce_": ("all_reduce", "input", {"op": "reduce_op"}),
    "all_reduce_coalesced": ("all_reduce_coalesced", "inputs", {"op": "reduce_op"}),
    "all_reduce_coalesced_": ("all_reduce_coalesced", "inputs", {"op": "reduce_op"}),
    "all_gather_into_tensor": ("all_gather_into_tensor", "input", {}),
    "all_gather_into_tensor_out": ("all_gather_into_tensor", "input", {}),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "inputs", {}),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "input", {"op": "reduce_op"}),
    "reduce_scatter_tensor_out": ("reduce_scatter_tensor", "input", {"op": "reduce_op"}),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "inputs", {"op": "reduce_op"}),
    "all_to_all_single": ("all_to_all_single", "input", {}),
    "broadcast": ("broadcast", "input", {"src": "src"}),
    "broadcast_": ("broadcast", "input", {"src": "src"}),
    "isend": ("send", "tensor", {"dst": "dst"}),
    "irecv": ("recv", "tensor", {"src": "src"}),
    "batch_p2p_ops": ("batch_isend_irecv", "tensors", {}),
}
#: Frames of these files say nothing about who issued a collective (torch's plumbing).
_PLUMBING = ("distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py", "_python_dispatch.py",
             "_ops.py", "utils/_contextlib.py")

_SKEW = 0.0
class _Depth(threading.local):
    depth = 0  # > 0 inside a traced call, in this thread


_LOCAL = _Depth()
_STATE: dict[str, Any] = {}


def clock() -> float:
    """This rank's trace clock (wall time, plus a skew that only tests set)."""
    return time.time() + _SKEW


def set_clock_skew(seconds: float) -> float:
    """Make this rank's trace clock run ``seconds`` ahead (tests of the offset correction)."""
    global _SKEW
    _SKEW = float(seconds)
    return _SKEW


def wrapped_names() -> list[str]:
    """Names in ``torch.distributed`` that are tracing wrappers right now (none when tracing is off)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return []
    return sorted(n for n in (*COLLECTIVES, *P2P, "batch_isend_irecv")
                  if isinstance(getattr(dist, n, None), _Traced))


# ---- recording -------------------------------------------------------------------
class _Recorder:
    """Numbers the calls and writes (or keeps) their records."""

    def __init__(self, path: str | None) -> None:
        self.fd = None if path is None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.kept: list[str] = []
        self.counter = itertools.count(1)  # next() is atomic under the GIL
        self.write_lock = threading.Lock()  # async completions write from torch's threads
        self.groups: dict[int, tuple[list[int], bool]] = {}
        self.keep: list[Any] = []
        self.heads: dict[tuple[Any, ...], str] = {}
        self.pending: dict[int, tuple[int, Any]] = {}  # functional collectives' results not yet waited for
        self.closed = False

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(json.dumps(record, separators=(",", ":")) + "\n")

    def write_line(self, line: str) -> None:
        with self.write_lock:
            if self.closed:
                return
            if self.fd is None:
                self.kept.append(line)
            else:
                os.write(self.fd, line.encode())

    def close(self) -> None:
        with self.write_lock:
            self.closed = True
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


class _Traced:
    """A recording stand-in for one torch.distributed function.

    It compares equal to the function it wraps, so torch's own checks such as
    ``op in [isend, irecv]`` (in ``P2POp``) still accept it.
    """

    def __init__(self, name: str, fn: Any) -> None:
        functools.update_wrapper(self, fn)
        self.name = name
        self.original = fn
        empty = inspect.Parameter.empty
        # where each parameter sits, so a call is described without inspect.Signature.bind (slow)
        self.params = {p.name: (i, None if p.default is empty else p.default)
                       for i, p in enumerate(inspect.signature(fn).parameters.values())}

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.original or (
            isinstance(other, _Traced) and other.original is self.original)

    def __hash__(self) -> int:
        return hash(self.original)

    def __repr__(self) -> str:
        return f"<traced {self.original!r}>"

    def arg(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        spec = self.params.get(name)
        if spec is None:
            return None
        return args[spec[0]] if spec[0] < len(args) else spec[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = _STATE.get("recorder")
        if rec is None or _LOCAL.depth:
            # torch's own calls inside a traced one (all_gather_object -> all_gather) are part of it
            return self.original(*args, **kwargs)
        _LOCAL.depth = 1
        mode = _off_stack()
        try:
            index = _begin(rec, self, args, kwargs, sys._getframe(1))
            try:
                out = self.original(*args, **kwargs)
            except BaseException as e:
                _end(rec, index, error=f"{type(e).__name__}: {_first_line(e)}")
                raise
            _end(rec, index, result=out, name=self.name)
            return out
        finally:
            _LOCAL.depth = 0
            if mode is not None:
                _STATE["torch_c"]._push_on_torch_dispatch_stack(mode)


def _off_stack() -> Any:
    """Take the dispatch mode off this thread's stack for a wrapped call (the call is recorded
    already; its ops would only pay for a detour through Python, ~0.1 ms a call). Returns it, to
    be put back, or None when it is not on top (another mode above it) or not running."""
    mode = _STATE.get("mode")
    torch_c = _STATE.get("torch_c")
    if mode is None or torch_c is None:
        return None
    depth = torch_c._len_torch_dispatch_stack()
    if not depth or torch_c._get_dispatch_stack_at(depth - 1) is not mode:
        return None
    return torch_c._pop_torch_dispatch_stack(None)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if first.startswith("[") and "] " in first:  # gloo's C++ source location
        first = first.split("] ", 1)[1]
    return first


def _begin(rec: _Recorder, fn: _Traced, args: tuple[Any, ...], kwargs: dict[str, Any], caller: Any) -> int:
    try:
        key = (*_describe(rec, fn, args, kwargs), _issuer(caller))
    except Exception as e:  # a call we cannot describe is still recorded, with its name
        key = (fn.name, f"not described ({type(e).__name__})")
    return _start(rec, key)


def _start(rec: _Recorder, key: tuple[Any, ...]) -> int:
    """Write a call's begin record (``key``: a ``_describe`` tuple and the issuer, or (name, note))."""
    index = next(rec.counter)
    head = rec.heads.get(key)
    if head is None:  # the JSON of a call like this one, made once
        record = _record(rec, key) if len(key) > 2 else {"e": "b", "op": key[0], "note": key[1]}
        head = rec.heads[key] = json.dumps(record, separators=(",", ":"))[:-1] + ","
    t0 = clock()
    rec.write_line(f'{head}"i":{index},"t0":{t0!r}}}\n')
    return index


def _end(rec: _Recorder, index: int, result: Any = None, error: str = "", name: str = "") -> None:
    t1 = clock()
    if error:
        rec.write({"e": "e", "i": index, "t1": t1, "err": error})
        return
    if name == "recv" and isinstance(result, int):  # recv(src=None) says who sent
        rec.write_line(f'{{"e":"e","i":{index},"t1":{t1!r},"peer":{result}}}\n')
    else:
        rec.write_line(f'{{"e":"e","i":{index},"t1":{t1!r}}}\n')
    if result is not None and not isinstance(result, int):
        _when_done(rec, index, result)


def _when_done(rec: _Recorder, index: int, work: Any, returns: bool = False) -> bool:
    """For async calls (``async_op=True``, ``isend``, ...): record when the work completes.

    ``returns``: the completion is when the call returns for its caller (a dispatcher-level op
    whose Python caller waits on it), so write the "e" record then, with the error if it failed.
    False when there is no future to watch (nothing will be written).
    """
    works = work if isinstance(work, list) else [work]
    futures = []
    for w in works:
        get_future = getattr(w, "get_future", None)
        if get_future is None:
            return False
        try:
            futures.append(get_future())
        except Exception:  # some backends have no futures for some works
            return False
    if not futures:
        return False
    left = [len(futures)]
    lock = threading.Lock()

    def done(fut: Any) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if not last:
            return
        with contextlib.suppress(OSError):
            if not returns:
                rec.write_line(f'{{"e":"d","i":{index},"t2":{clock()!r}}}\n')
                return
            try:
                fut.value()
            except Exception as e:
                rec.write({"e": "e", "i": index, "t1": clock(), "err": f"{type(e).__name__}: {_first_line(e)}"})
            else:
                rec.write_line(f'{{"e":"e","i":{index},"t1":{clock()!r}}}\n')

    for f in futures:
        f.add_done_callback(done)
    return True


def _describe(rec: _Recorder, fn: _Traced, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable description of the call: (op, kind, tensors, roles, group key, flags)."""
    name = fn.name
    if name == "batch_isend_irecv":
        ops = []
        group = None
        for p in fn.arg(args, kwargs, "p2p_op_list") or []:
            original = getattr(p.op, "original", p.op)
            kind = "send" if getattr(original, "__name__", "") == "isend" else "recv"
            ops.append((kind, p.peer, _tensors(p.tensor)))
            group = p.group
        return (name, "p2p", (), (), _group_key(rec, group), False, False, None, "", tuple(ops))
    group = _group_key(rec, fn.arg(args, kwargs, "group"))
    if name in P2P:
        direction, peer_arg = P2P[name]
        tensor = fn.arg(args, kwargs, "tensor")
        return (name, "p2p", _tensors(tensor), (), group, False, False, fn.arg(args, kwargs, peer_arg), direction, ())
    tensors: tuple[Any, ...] = ()
    for p in COLLECTIVES.get(name, ()):
        tensors += _tensors(fn.arg(args, kwargs, p))
    uneven = name == "all_to_all" or (name == "all_to_all_single" and bool(
        fn.arg(args, kwargs, "input_split_sizes") or fn.arg(args, kwargs, "output_split_sizes")))
    roles: tuple[Any, ...] = ()
    for k in ROLE_ARGS:
        if k in fn.params:
            v = fn.arg(args, kwargs, k)
            if v is not None and k in ("group_src", "group_dst"):  # as src/dst (global), as the ops say it
                roles += ((k[6:], _global(fn.arg(args, kwargs, "group"), v)),)
            elif v is not None:
                roles += ((k, (getattr(v, "name", None) or str(v)) if k == "op" else v),)
    return (name, "coll", tensors, roles, group, bool(fn.arg(args, kwargs, "async_op")), uneven, None, "", ())


def _record(rec: _Recorder, key: tuple[Any, ...]) -> dict[str, Any]:
    """The begin record (without index and time) for a ``_describe`` key."""
    name, kind, tensors, roles, group, async_op, uneven, peer, direction, batch, via = key
    ranks, world = rec.groups[group]
    out: dict[str, Any] = {"e": "b", "op": name, "kind": kind, "g": ranks, "w": world,
                           "t": [list(t) for t in tensors]}
    if kind == "p2p":
        if batch:
            out["batch"] = [[d, p, [list(t) for t in ts]] for d, p, ts in batch]
        else:
            out.update(dir=direction, peer=peer)
    if roles:
        out["a"] = dict(roles)
    if async_op:
        out["async"] = True
    if uneven:
        out["uneven"] = True
    if via:
        out["via"] = via
    return out


# ---- who issued it -------------------------------------------------------------------
def _issuer(frame: Any) -> str:
    """Which library call issued a collective, from the Python stack; ``""`` when the cell called it.

    Walks out from the call through torch's frames (stopping at the first frame of
    other code: the cell, or a user's library) and names the innermost one that
    says something: FSDP2's param group and method with the module's name, a
    DTensor redistribution with its placements, a tensor-parallel style's input or
    output hook, a DTensor op, a pipeline schedule's batch, DDP; else ``backward`` when
    autograd issued it (DDP's gradient buckets, from its C++ reducer).
    """
    torch_dir = _STATE.get("torch_dir")
    inner = ""
    during = ""
    steps = 0
    while frame is not None and steps < 80:
        steps += 1
        code = frame.f_code
        path = code.co_filename
        if torch_dir is None or not path.startswith(torch_dir):
            if path == __file__:
                frame = frame.f_back
                continue
            break
        name = code.co_name
        if path.endswith(_PLUMBING):
            pass
        elif path.endswith("_fsdp_param_group.py"):
            fqn = getattr(frame.f_locals.get("self"), "_module_fqn", None)
            return _join(f"fully_shard {name} of {fqn or 'the root module'}", inner)
        elif path.endswith("tensor/_redistribute.py") and name == "redistribute_local_tensor":
            here = frame.f_locals
            inner = inner or (f"redistribute {_placements(here.get('current_spec'))} -> "
                              f"{_placements(here.get('target_spec'))}")
        elif path.endswith("tensor/parallel/style.py"):
            owner = getattr(code, "co_qualname", name).split(".")[0]
            part = "input" if "input" in name else "output" if "output" in name else name
            return _join(f"{owner} {part}", inner)
        elif path.endswith("tensor/_dispatch.py") and "op_call" in code.co_varnames:
            op = frame.f_locals.get("op_call")
            if op is not None:
                return _join(f"DTensor {op}", inner)
        elif path.endswith("tensor/_api.py"):
            if name != "redistribute" or not inner:
                return _join(name, inner)  # distribute_tensor, full_tensor, ...; an explicit
            # redistribute says it all, unless a tensor-parallel hook further out made it
        elif "/pipelining/" in path:
            here = frame.f_locals
            if name in ("_batch_p2p", "_sorted_batch_p2p") and here.get("desc"):
                inner = inner or str(here["desc"])
                frame = frame.f_back
                continue
            owner = here.get("self")
            if owner is not None and hasattr(owner, "stage_index"):
                return _join(f"pipeline stage {owner.stage_index} {name}", inner)
            if owner is not None and type(owner).__name__.startswith("Schedule"):
                return f"{type(owner).__name__} {inner or name}"
        elif path.endswith("nn/parallel/distributed.py"):
            return _join(f"DDP {name}", inner)
        elif path.endswith("device_mesh.py"):
            return _join(f"DeviceMesh {name}", inner)
        elif path.endswith(("autograd/graph.py", "autograd/__init__.py")):
            during = during or "backward"
        frame = frame.f_back
    return inner or during


def _join(outer: str, inner: str) -> str:
    return f"{outer}: {inner}" if inner else outer


def _placements(spec: Any) -> str:
    placements = getattr(spec, "placements", None)
    if placements is None:
        return "?"
    return "[" + ", ".join(repr(p).replace("dim=", "") for p in placements) + "]"


# ---- dispatcher-level collectives -------------------------------------------------------
class _OpSpec:
    """How to read one dispatcher op's arguments."""

    def __init__(self, op: Any, name: str, tensors: str, roles: dict[str, str], functional: bool) -> None:
        self.name = name
        self.tensors = tensors
        self.roles = roles
        self.functional = functional
        self.kind = "p2p" if name in ("send", "recv", "batch_isend_irecv") else "coll"
        self.params: dict[str, tuple[int, Any]] = {}
        for i, a in enumerate(op._schema.arguments):
            self.params[a.name] = (-1 if a.kwarg_only else i, a.default_value if a.has_default_value() else None)

    def arg(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        spec = self.params.get(name)
        if spec is None:
            return None
        return args[spec[0]] if 0 <= spec[0] < len(args) else spec[1]


def _op_specs() -> dict[Any, _OpSpec]:
    """Every overload of the collective ops this torch has -> how to read it."""
    import torch

    out: dict[Any, _OpSpec] = {}
    for namespace, table, functional in (("c10d", C10D_OPS, False), ("_c10d_functional", FUNCTIONAL_OPS, True),
                                         ("_c10d_functional_autograd", FUNCTIONAL_OPS, True)):
        ops = getattr(torch.ops, namespace)
        for op_name, (name, tensors, roles) in table.items():
            try:
                packet = getattr(ops, op_name)
                overloads = [getattr(packet, o) for o in packet.overloads()]
            except (AttributeError, RuntimeError):  # not in this torch, or not in this namespace
                continue
            for op in overloads:
                out[op] = _OpSpec(op, name, tensors, roles, functional)
    return out


def _process_group(value: Any) -> Any:
    """The ProcessGroup a dispatcher op names: a group name (functional ops) or a boxed ProcessGroup."""
    import torch.distributed as dist

    if isinstance(value, str):
        return getattr(dist.distributed_c10d, "_resolve_process_group")(value)  # noqa: B009 - private in torch
    if isinstance(value, dist.ProcessGroup):
        return value
    return dist.ProcessGroup.unbox(value)


def _global(group: Any, rank: Any) -> Any:
    """A group-local rank (what dispatcher ops take) as a global one."""
    import torch.distributed as dist

    if not isinstance(rank, int) or group is None or group is dist.GroupMember.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def _reduce_op(value: Any) -> str:
    if isinstance(value, str):
        return value.upper()  # functional ops: "sum", "avg", ...
    import torch.distributed as dist

    try:
        code = value.op()  # a boxed ReduceOp
    except Exception:
        return str(getattr(value, "name", value))
    try:
        return str(dist.ReduceOp.RedOpType(int(code)).name)
    except Exception:
        return str(code)


def _describe_op(rec: _Recorder, spec: _OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A dispatcher op as ``_describe`` describes a wrapped call (the same key shape)."""
    group = _process_group(spec.arg(args, kwargs, "group_name" if spec.functional else "process_group"))
    key = _group_key(rec, group)
    name = spec.name
    if name == "batch_isend_irecv":
        ops = spec.arg(args, kwargs, "op_list") or []
        peers = spec.arg(args, kwargs, "peer_list") or []
        tensors = spec.arg(args, kwargs, "tensors") or []
        batch = tuple(("send" if "send" in str(o) else "recv", _global(group, p), _tensors(t))
                      for o, p, t in zip(ops, peers, tensors, strict=False))
        return (name, "p2p", (), (), key, True, False, None, "", batch)
    tensors = _tensors(spec.arg(args, kwargs, spec.tensors)) if spec.tensors else ()
    if spec.kind == "p2p":
        peer_arg = next(iter(spec.roles.values()), "")
        peer = _global(group, spec.arg(args, kwargs, peer_arg)) if peer_arg else None
        return (name, "p2p", tensors, (), key, spec.functional, False, peer, name, ())
    roles: tuple[Any, ...] = ()
    for role, arg in spec.roles.items():
        value = spec.arg(args, kwargs, arg)
        roles += ((role, _reduce_op(value) if role == "op" else _global(group, value)),)
    uneven = name == "all_to_all" or (name == "all_to_all_single" and bool(
        spec.arg(args, kwargs, "input_split_sizes") or spec.arg(args, kwargs, "output_split_sizes")))
    async_op = spec.functional or bool(spec.arg(args, kwargs, "async_op"))
    return (name, "coll", tensors, roles, key, async_op, uneven, None, "", ())


def _make_mode(skip_dynamo: bool) -> Any:
    """The dispatch mode that records collective ops (made on the first traced cell; entered per cell).

    ``skip_dynamo``: let torch wrap ``__torch_dispatch__`` in ``torch._dynamo.disable`` (its
    default), which imports torch._dynamo on the first op: ~7 s of CPU on a busy 2-core
    machine, so only when the rank has already imported it (its cells compile).
    """
    import importlib

    import torch

    # typed as Any: torch's class is not fully annotated
    TorchDispatchMode: Any = importlib.import_module("torch.utils._python_dispatch").TorchDispatchMode
    specs = _op_specs()
    wait = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
    wait_ops = {getattr(wait, o) for o in wait.overloads()} if wait is not None else set()
    wrap = getattr(getattr(torch.ops, "_c10d_functional", None), "_wrap_tensor_autograd", None)
    wrap_ops = {getattr(wrap, o) for o in wrap.overloads()} if wrap is not None else set()

    class CollectiveMode(TorchDispatchMode):  # type: ignore[misc]
        """Records collective ops; every other op runs as it would (DTensor's first, so its
        collectives come back through here)."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return skip_dynamo

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            spec = specs.get(func)
            if spec is None:
                if func in wait_ops:
                    return _waited(func, args, kwargs)
                if types and _defer(types):
                    return NotImplemented  # let DTensor run first and desugar into plain ops and collectives
                out = func(*args, **kwargs)
                if func in wrap_ops:  # the same result, as autograd sees it: still waited for later
                    _rewrap(args, out)
                return out
            rec = _STATE.get("recorder")
            if rec is None or _LOCAL.depth:  # inside a wrapped torch.distributed call: part of it
                return func(*args, **kwargs)
            return _record_op(rec, spec, func, args, kwargs)

    return CollectiveMode


def _defer(types: Any) -> bool:
    """Whether an op on these tensor subclasses should go to the subclass first (DTensor, and the
    async result of a functional collective, whose wait then comes back through the mode)."""
    classes = _STATE.get("subclasses", ())
    if len(classes) < 2:  # looked up until both are imported (a cell may import DTensor itself)
        found = (getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None),
                 getattr(sys.modules.get("torch.distributed._functional_collectives"), "AsyncCollectiveTensor", None))
        classes = _STATE["subclasses"] = tuple(c for c in found if c is not None)
    return bool(classes) and any(issubclass(t, classes) for t in types)


def _rewrap(args: tuple[Any, ...], out: Any) -> None:
    rec = _STATE.get("recorder")
    if rec is not None and args and id(args[0]) in rec.pending:
        rec.pending[id(out)] = (rec.pending[id(args[0])][0], out)


def _record_op(rec: _Recorder, spec: _OpSpec, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        key = (*_describe_op(rec, spec, args, kwargs), _issuer(sys._getframe(2)))
    except Exception as e:
        key = (spec.name, f"not described ({type(e).__name__})")
    index = _start(rec, key)
    _LOCAL.depth = 1
    try:
        out = func(*args, **kwargs)
    except BaseException as e:
        _end(rec, index, error=f"{type(e).__name__}: {_first_line(e)}")
        raise
    finally:
        _LOCAL.depth = 0
    if spec.functional:  # the tensor is waited for later (wait_tensor): that is when it completes
        _end(rec, index)
        pending = rec.pending
        for t in out if isinstance(out, (list, tuple)) else (out,):
            pending[id(t)] = (index, t)
        return out
    work = _work(out)
    caller_waits = len(key) > 2 and not key[5]  # async_op=False: the Python caller waits right away
    if work is None or not _when_done(rec, index, work, returns=caller_waits):
        _end(rec, index)
    elif not caller_waits:
        _end(rec, index)
    return out


def _work(out: Any) -> Any:
    import torch.distributed as dist

    found = out[-1] if isinstance(out, tuple) and out else out
    if isinstance(found, dist.Work):
        return found
    try:
        return dist.Work.unbox(found)
    except Exception:
        return None


def _waited(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``wait_tensor``: a functional collective's result is ready; record when."""
    out = func(*args, **kwargs)
    rec = _STATE.get("recorder")
    if rec is not None and args:
        entry = rec.pending.pop(id(args[0]), None)
        if entry is not None:
            rec.write_line(f'{{"e":"d","i":{entry[0]},"t2":{clock()!r}}}\n')
    return out


def _group_key(rec: _Recorder, group: Any) -> int:
    """A key for the group; its global ranks, and whether it is the default group, are kept in ``rec.groups``."""
    key = id(group)
    if key not in rec.groups:
        import torch.distributed as dist

        world = group is None or group is dist.GroupMember.WORLD
        ranks = list(range(dist.get_world_size())) if world else list(dist.get_process_group_ranks(group))
        rec.groups[key] = (ranks, world)
        rec.keep.append(group)  # the id stays this group's while the trace runs
    return key


_DTYPES: dict[Any, str] = {}


def _tensors(value: Any) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """``((dtype, shape, bytes), ...)`` of a tensor or a list of tensors."""
    tensor = _STATE["tensor_type"]
    if isinstance(value, tensor):
        dtype = _DTYPES.get(value.dtype)
        if dtype is None:
            dtype = _DTYPES[value.dtype] = str(value.dtype).replace("torch.", "")
        return ((dtype, tuple(value.shape), value.numel() * value.element_size()),)
    if isinstance(value, (list, tuple)):
        return tuple(t for v in value if isinstance(v, tensor) for t in _tensors(v))
    return ()


# ---- switching it on and off --------------------------------------------------------
def _namespaces() -> list[tuple[Any, bool]]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    return [(dist, True), (c10d, False)]


def start(trace_dir: str | None, name: str, meta: dict[str, Any] | None = None) -> str | None:
    """Wrap the torch.distributed functions and record into ``trace_dir/name``.

    ``trace_dir`` None, or missing on this host: keep the records in memory
    for ``take``. Returns the file's path, or None. Idempotent per cell: a
    trace still on (an earlier traced cell that never ended) is stopped first.
    """
    import torch.distributed as dist

    stop()
    require("trace")  # one line naming a private name of torch's that moved, before any wrapping
    path = None
    if trace_dir is not None and os.path.isdir(trace_dir):
        path = os.path.join(trace_dir, name)
    import torch

    _STATE["tensor_type"] = torch.Tensor
    rec = _Recorder(path)
    rec.write({"e": "h", "pid": os.getpid(), "t": clock(), **(meta or {})})
    patched: list[tuple[Any, str, Any]] = []
    for module, public in _namespaces():
        for fn_name in (*COLLECTIVES, *P2P, "batch_isend_irecv"):
            if not public and fn_name in _KEEP_IN_C10D:
                continue
            fn = getattr(module, fn_name, None)
            if fn is None or isinstance(fn, _Traced):
                continue
            patched.append((module, fn_name, fn))
    wrappers: dict[int, _Traced] = {}
    for module, fn_name, fn in patched:
        w = wrappers.get(id(fn)) or _Traced(fn_name, fn)
        wrappers[id(fn)] = w
        setattr(module, fn_name, w)
    # a P2POp keeps the function it was given; keep torch's own there, for its `is isend` checks
    p2p_init = dist.P2POp.__init__

    @functools.wraps(p2p_init)
    def init(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        p2p_init(self, getattr(op, "original", op), *args, **kwargs)

    setattr(dist.P2POp, "__init__", init)  # noqa: B010 - a method, put back by stop()
    patched.append((dist.P2POp, "__init__", p2p_init))
    _STATE.update(recorder=rec, patched=patched, torch_dir=os.path.dirname(torch.__file__) + os.sep, torch_c=torch._C)
    skip_dynamo = "torch._dynamo" in sys.modules
    classes = _STATE.setdefault("mode_classes", {})
    if skip_dynamo not in classes:
        classes[skip_dynamo] = _make_mode(skip_dynamo)
    mode = classes[skip_dynamo]()
    mode.__enter__()
    _STATE["mode"] = mode
    return path


def stop() -> None:
    """Put the original functions back, leave the dispatch mode and close the trace file
    (nothing is wrapped or active afterwards)."""
    rec = _STATE.pop("recorder", None)
    mode = _STATE.pop("mode", None)
    if mode is not None:
        _leave(mode)
    for module, fn_name, fn in reversed(_STATE.pop("patched", [])):
        setattr(module, fn_name, fn)
    if rec is not None:
        _STATE["kept"] = rec.kept
        rec.pending.clear()
        rec.close()


def _leave(mode: Any) -> None:
    """Take the mode off this thread's dispatch stack, also when the cell left one of its own above it."""
    import torch

    above = []
    while torch._C._len_torch_dispatch_stack():
        top = torch._C._get_dispatch_stack_at(torch._C._len_torch_dispatch_stack() - 1)
        if top is mode:
            mode.__exit__(None, None, None)
            break
        above.append(torch._C._pop_torch_dispatch_stack(None))
    for other in reversed(above):
        torch._C._push_on_torch_dispatch_stack(other)


def active_modes() -> int:
    """How many dispatch modes are on this thread's stack (0 when no traced cell runs and the user set none)."""
    torch = sys.modules.get("torch")
    return 0 if torch is None else int(torch._C._len_torch_dispatch_stack())


def take() -> list[dict[str, Any]]:
    """The records kept in memory by the last trace (a rank whose trace directory was elsewhere)."""
    return [json.loads(line) for line in _STATE.pop("kept", [])]
