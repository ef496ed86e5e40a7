"""The rank side of ``%%pg --trace``: record torch.distributed calls while a traced cell runs.

Tracing costs nothing when it is off: nothing is wrapped. ``start`` replaces
the collective and point-to-point functions of ``torch.distributed`` by
recording wrappers for the duration of one traced cell, and ``stop`` puts the
originals back.

Each call appends two JSON lines to this rank's trace file, one when it
starts and one when it returns, each with a single ``os.write`` on an
``O_APPEND`` file in a 0700 directory the kernel made. The kernel reads the
file itself, so it learns how far a rank got even while the rank is blocked
inside a collective (and cannot answer an apply request). A rank on another
host, where that directory does not exist, keeps its records in memory and the
kernel fetches them with ``take`` once the rank is free.

Times come from ``clock()``, which the kernel also samples to measure this
rank's clock offset (``pgnb.core.recording.measure_offsets``). Tests skew it with
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
import threading
import time
from typing import Any

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
        try:
            index = _begin(rec, self, args, kwargs)
            try:
                out = self.original(*args, **kwargs)
            except BaseException as e:
                _end(rec, index, error=f"{type(e).__name__}: {_first_line(e)}")
                raise
            _end(rec, index, result=out, name=self.name)
            return out
        finally:
            _LOCAL.depth = 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if first.startswith("[") and "] " in first:  # gloo's C++ source location
        first = first.split("] ", 1)[1]
    return first


def _begin(rec: _Recorder, fn: _Traced, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    index = next(rec.counter)
    try:
        key = _describe(rec, fn, args, kwargs)
        head = rec.heads.get(key)
        if head is None:  # the JSON of a call like this one, made once
            head = rec.heads[key] = json.dumps(_record(rec, key), separators=(",", ":"))[:-1] + ","
    except Exception as e:  # a call we cannot describe is still recorded, with its name
        head = json.dumps({"e": "b", "op": fn.name, "note": f"not described ({type(e).__name__})"})[:-1] + ","
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


def _when_done(rec: _Recorder, index: int, work: Any) -> None:
    """For async calls (``async_op=True``, ``isend``, ...): record when the work completes."""
    works = work if isinstance(work, list) else [work]
    futures = []
    for w in works:
        get_future = getattr(w, "get_future", None)
        if get_future is None:
            return
        try:
            futures.append(get_future())
        except Exception:  # some backends have no futures for some works
            return
    if not futures:
        return
    left = [len(futures)]
    lock = threading.Lock()

    def done(_: Any) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            with contextlib.suppress(OSError):
                rec.write_line(f'{{"e":"d","i":{index},"t2":{clock()!r}}}\n')

    for f in futures:
        f.add_done_callback(done)


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
            if v is not None:
                roles += ((k, (getattr(v, "name", None) or str(v)) if k == "op" else v),)
    return (name, "coll", tensors, roles, group, bool(fn.arg(args, kwargs, "async_op")), uneven, None, "", ())


def _record(rec: _Recorder, key: tuple[Any, ...]) -> dict[str, Any]:
    """The begin record (without index and time) for a ``_describe`` key."""
    name, kind, tensors, roles, group, async_op, uneven, peer, direction, batch = key
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
    _STATE.update(recorder=rec, patched=patched)
    return path


def stop() -> None:
    """Put the original functions back and close the trace file (nothing is wrapped afterwards)."""
    rec = _STATE.pop("recorder", None)
    for module, fn_name, fn in reversed(_STATE.pop("patched", [])):
        setattr(module, fn_name, fn)
    if rec is not None:
        _STATE["kept"] = rec.kept
        rec.close()


def take() -> list[dict[str, Any]]:
    """The records kept in memory by the last trace (a rank whose trace directory was elsewhere)."""
    return [json.loads(line) for line in _STATE.pop("kept", [])]
