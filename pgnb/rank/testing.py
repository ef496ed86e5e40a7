"""One test of the pytest plugin on one rank: import it, run it, say what it did and what it left.

``run_test`` is what the plugin's cell calls on every rank (``pgnb.testing.plugin``).
In one call it reseeds the RNGs, runs the test function in a fresh thread of
its own (so this, the engine's main thread, can stop waiting for it: at the
test's deadline, or as soon as another rank's test failed, told through the
world's store), captures what the test printed (``sys.stdout``/``sys.stderr``
and fd 1/2), then checks what the test left behind and undoes it: process
groups it created (destroyed), environment variables, the current directory,
torch's global flags. The reply (``pgnb._wire.TestReply``) says all of it.

A fresh thread per test also means a test's grad mode (per thread in torch)
cannot outlive it. A test whose thread is still running when the call returns
leaves the world unusable (``clean`` is False): the plugin replaces it.

Nothing heavy is imported at the top; torch comes in with the first test.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import pickle
import random
import re
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .._wire import TestCall, TestReply
from . import coverage as rank_coverage, debug as rank_debug
from .cell import clean_message

#: How often the waiting main thread looks at the store for another rank's failure (seconds).
PEER_POLL = 0.05
#: Once another rank failed, how long this rank's test gets to end on its own (its collective may error out).
PEER_GRACE = 0.3
#: Environment variables libraries set for themselves on first use (not a test's doing).
_LIBRARY_ENV = ("CUDA_MODULE_LOADING", "KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK")
_FAILED_KEY = "pgnb-test/{test_id}/failed"
_DEBUG_KEY = "pgnb-test/{test_id}/debugging"
#: The state each rank had before its first test: what every test must leave as it found it.
_BASELINE: dict[str, Any] = {}
#: Modules this rank loaded itself (by path, with pytest's assertion rewriting), by name.
_LOADED: dict[str, types.ModuleType] = {}


class _Capture(io.TextIOBase):
    """A test's ``sys.stdout``/``sys.stderr``: text kept for the reply."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "".join(self.parts)


def run_test(call: TestCall) -> TestReply:
    """Run ``call``'s test function on this rank; what it did, in a ``TestReply``."""
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    rank = dist.get_rank() if dist.is_initialized() else -1
    _remember_baseline(call, torch, dist)
    reply: TestReply = {"rank": rank, "outcome": "passed", "seconds": 0.0}
    try:
        fn = _resolve(call)
    except BaseException as e:  # noqa: BLE001 - whatever the import raised is the test's one line
        reply.update({"outcome": "unimportable", "ename": type(e).__name__, "evalue": str(e),
                      "traceback": _format(e, call["rootdir"])})
        reply["seconds"] = time.monotonic() - t0
        reply["clean"] = True
        return reply
    try:
        kwargs = pickle.loads(call["kwargs"])  # noqa: S301 - made by the plugin from the test's own fixtures
    except Exception as e:
        reply.update({"outcome": "unimportable", "ename": type(e).__name__,
                      "evalue": f"the test's fixture values cannot be unpickled on the ranks: {e}",
                      "traceback": [], "clean": True})
        return reply
    device = _device(torch, dist)
    path = list(sys.path)  # as the test finds it (its module's directory included): put back afterwards
    for name in call["on_rank"]:
        kwargs[name] = {"rank": rank, "world_size": dist.get_world_size(), "device": device}[name]
    _reseed(call["seed"], torch)
    box: dict[str, Any] = {}
    out, err = _Capture(), _Capture()

    def body() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the current GPU is per thread
        try:
            fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - reported, not lost
            box["error"], box["at"] = e, time.time()
            if call["pdb"] and _skip_kind(e) is None:  # pytest --pdb: pdb here, where it raised
                note = rank_debug.debug_exception(e, rank)
                if note:
                    print(note, file=sys.stderr)
        box["grad"] = torch.is_grad_enabled()

    thread = threading.Thread(target=body, name=f"pgnb-test-{call['test_id']}", daemon=True)
    debugging = threading.Event()

    def on_breakpoint() -> None:  # pdb is open on this rank: no deadline now, here or on the others
        debugging.set()
        _tell_peers(dist, _DEBUG_KEY.format(test_id=call["test_id"]), rank)

    rank_debug.ON_STOP.append(on_breakpoint)
    rank_coverage.label(call["nodeid"])  # pytest-cov --cov-context=test: the test's lines carry its id
    try:
        with _fd_capture() as fd_text, _streams(out, err):
            thread.start()
            outcome = _wait(thread, call, dist, rank, debugging)
    finally:
        rank_coverage.label(None)
        rank_debug.ON_STOP.remove(on_breakpoint)
    reply["stdout"], reply["stderr"], reply["fd_output"] = out.text(), err.text(), fd_text()
    if outcome is not None:  # still running: blocked by a peer, or past its deadline
        kind, peer = outcome
        reply.update({"outcome": kind, "stack": _thread_stack(thread, call["rootdir"]), "clean": False})
        if peer is not None:
            reply["blocked_by"] = peer
    elif "error" in box:
        _report_error(reply, box["error"], box["at"], call, dist)
    leaks = _undo_leaks(torch, dist, box.get("grad", True), path)
    reply["leaks"] = leaks
    reply.setdefault("clean", dist.is_initialized())
    reply["group_count"] = int(getattr(getattr(dist.distributed_c10d, "_world", None), "group_count", 0))
    reply["seconds"] = time.monotonic() - t0
    return reply


# ---- the test function -------------------------------------------------------
def _resolve(call: TestCall) -> Callable[..., Any]:
    """The test function: its module imported here as pytest imported it, then looked up by name."""
    module = _module(call["module"], call["path"], call["base"])
    owner: Any = module
    parts = call["qualname"].split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if isinstance(owner, type):  # a test class: a fresh instance per test, as pytest makes one
        owner = owner()
    return getattr(owner, parts[-1])  # type: ignore[no-any-return]


def forget_loaded(name: str) -> None:
    """The next test imports this module anew (``pgnb.rank.project_code``: its file may have changed)."""
    _LOADED.pop(name, None)


def _module(name: str, path: str, base: str) -> types.ModuleType:
    loaded = _LOADED.get(name) or sys.modules.get(name)
    if loaded is not None and os.path.realpath(getattr(loaded, "__file__", "") or "") == os.path.realpath(path):
        return loaded
    if base and base not in sys.path:
        sys.path.insert(0, base)  # what the test module imports from beside it (conftest, helpers)
    parent = name.rpartition(".")[0]
    if parent:
        importlib.import_module(parent)  # for the module's relative imports
    module = _load_rewritten(name, path)
    _LOADED[name] = module
    return module


def _load_rewritten(name: str, path: str) -> types.ModuleType:
    """Import ``path`` as ``name`` with pytest's assertion rewriting, so a failed ``assert`` says why."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    with open(path, "rb") as f:
        source = f.read()
    try:
        import ast

        from _pytest.assertion.rewrite import rewrite_asserts

        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, None, None)
        code = compile(tree, path, "exec", dont_inherit=True)
    except ImportError:  # no pytest on this rank: plain asserts
        code = compile(source, path, "exec", dont_inherit=True)
    sys.modules[name] = module  # functions pickled by reference find it, as they would pytest's
    try:
        exec(code, module.__dict__)  # noqa: S102 - the user's own test module
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# ---- waiting -----------------------------------------------------------------
def _wait(thread: threading.Thread, call: TestCall, dist: Any, rank: int,
          debugging: threading.Event) -> tuple[Literal["blocked", "timeout"], int | None] | None:
    """None when the test's thread ended; else ``("blocked", peer)`` or ``("timeout", None)``.

    Once pdb is open on any rank the test has no deadline here: the kernel's, which does not
    count the time at pdb's prompt, still holds.
    """
    deadline = None if call["timeout"] is None else time.monotonic() + call["timeout"]
    store = _store(dist)
    failed_key = _FAILED_KEY.format(test_id=call["test_id"])
    debug_key = _DEBUG_KEY.format(test_id=call["test_id"])
    step = 0.001
    next_look = time.monotonic() + PEER_POLL
    while True:
        if debugging.is_set():
            deadline = None
        thread.join(step if deadline is None else max(0.0, min(step, deadline - time.monotonic())))
        if not thread.is_alive():
            return None
        step = min(step * 2, PEER_POLL)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return ("timeout", None)
        if store is not None and now >= next_look:
            next_look = now + PEER_POLL
            peer = _peer_said(store, failed_key)
            if peer is not None and peer != rank:
                thread.join(PEER_GRACE)
                return None if not thread.is_alive() else ("blocked", peer)
            if deadline is not None and _peer_said(store, debug_key) is not None:
                debugging.set()


def _store(dist: Any) -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no default group, or a torch without it: no early stop, the deadline still holds
        return None


def _peer_said(store: Any, key: str) -> int | None:
    """The rank that set ``key`` in the store, if one did."""
    try:
        if store.check([key]):
            return int(store.get(key).decode())
    except Exception:  # the store went away (rank 0's engine died): the kernel sees the lost rank
        return None
    return None


def _report_error(reply: TestReply, error: BaseException, at: float, call: TestCall, dist: Any) -> None:
    kind = _skip_kind(error)
    if kind is not None:
        reply.update({"outcome": kind, "reason": str(getattr(error, "msg", "") or error)})
        return
    reply.update({"outcome": "failed", "ename": type(error).__name__, "evalue": clean_message(str(error)),
                  "failed_at": at, "traceback": _format(error, call["rootdir"])})
    _tell_peers(dist, _FAILED_KEY.format(test_id=call["test_id"]), reply["rank"])  # they stop waiting for it


def _tell_peers(dist: Any, key: str, rank: int) -> None:
    store = _store(dist)
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(key, str(rank))


def _skip_kind(error: BaseException) -> Literal["skipped", "xfailed"] | None:
    """``skipped`` for ``pytest.skip`` / ``unittest.SkipTest``, ``xfailed`` for ``pytest.xfail``."""
    import unittest

    if isinstance(error, unittest.SkipTest):
        return "skipped"
    outcomes = sys.modules.get("_pytest.outcomes")  # loaded if the test could call pytest.skip
    if outcomes is not None and isinstance(error, outcomes.Skipped):
        return "skipped"
    if outcomes is not None and isinstance(error, outcomes.XFailed):
        return "xfailed"
    return None


def _format(error: BaseException, rootdir: str) -> list[str]:
    """Python's traceback of ``error`` without this module's frames, paths relative to ``rootdir``."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = _relative("".join(traceback.format_exception(type(error), error, tb)), rootdir)
    return [clean_message(line) for line in text.rstrip("\n").split("\n")]


def _thread_stack(thread: threading.Thread, rootdir: str) -> list[str]:
    """Where the test's thread is now, innermost last (the thread's own frames only)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return []
    frames = traceback.extract_stack(frame)
    first = next((i for i, f in enumerate(frames) if f.filename != __file__ and "threading.py" not in f.filename
                  and i > 0), 0)
    return _relative("".join(traceback.format_list(frames[first:])), rootdir).rstrip("\n").split("\n")


def _relative(text: str, rootdir: str) -> str:
    """Paths under ``rootdir`` as pytest shows them (relative), installed packages from the package down."""
    if rootdir:
        text = text.replace(f'File "{rootdir.rstrip(os.sep)}{os.sep}', 'File "')
    return re.sub(r'File "[^"]*/(?:site|dist)-packages/', 'File "', text)


# ---- capture -----------------------------------------------------------------
@contextlib.contextmanager
def _streams(out: _Capture, err: _Capture) -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _fd_capture() -> Iterator[Callable[[], str]]:
    """fd 1 and 2 into one temporary file for the test (what C++ writes there keeps its order)."""
    text = ""
    try:
        sink = tempfile.TemporaryFile()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    except OSError:  # no fd 1/2 here: nothing to capture
        yield lambda: ""
        return
    try:
        yield lambda: text
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sink.seek(0)
        text = sink.read().decode("utf-8", "replace")
        sink.close()


# ---- state before and after ----------------------------------------------------
def _device(torch: Any, dist: Any) -> Any:
    try:
        config = str(dist.get_backend_config())
    except Exception:
        config = ""
    if "nccl" in config and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reseed(seed: int, torch: Any) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def _flags(torch: Any) -> dict[str, Any]:
    """torch's process-wide settings a test may change (and forget)."""
    flags: dict[str, Any] = {
        "default dtype": torch.get_default_dtype(),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                     torch.is_deterministic_algorithms_warn_only_enabled()),
        "anomaly detection": torch.is_anomaly_enabled(),
        "intra-op threads": torch.get_num_threads(),
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
    }
    if hasattr(torch, "get_default_device"):
        flags["default device"] = str(torch.get_default_device())
    return flags


def _set_flag(torch: Any, name: str, value: Any) -> None:
    if name == "default dtype":
        torch.set_default_dtype(value)
    elif name == "deterministic algorithms":
        torch.use_deterministic_algorithms(value[0], warn_only=value[1])
    elif name == "anomaly detection":
        torch.set_anomaly_enabled(value)
    elif name == "intra-op threads":
        torch.set_num_threads(value)
    elif name == "cudnn.benchmark":
        torch.backends.cudnn.benchmark = value
    elif name == "cudnn.deterministic":
        torch.backends.cudnn.deterministic = value
    elif name == "default device":
        torch.set_default_device(value)


def _groups(dist: Any) -> list[Any]:
    world = getattr(dist.distributed_c10d, "_world", None)
    return list(getattr(world, "pg_map", {}) or {})


def _remember_baseline(call: TestCall, torch: Any, dist: Any) -> None:
    world = dist.group.WORLD if dist.is_initialized() else None
    if _BASELINE and _BASELINE["world"] is world:
        return
    if _BASELINE:  # the plugin gave the world a fresh default group (after a failure): its groups and its
        # rendezvous variables (MASTER_PORT) are new; the rest stays as the first test found it
        _BASELINE.update(world=world, groups=set(_groups(dist)), env=dict(os.environ))
        return
    os.chdir(call["cwd"])
    _BASELINE.update(env=dict(os.environ), cwd=call["cwd"], flags=_flags(torch), groups=set(_groups(dist)),
                     world=world)


def _undo_leaks(torch: Any, dist: Any, grad_enabled: bool, path: list[str]) -> list[str]:
    """Put back what the test changed; one line for each thing."""
    leaks: list[str] = []
    if sys.path != path:  # the next test would import from where this one pointed
        added = [p for p in sys.path if p not in path]
        sys.path[:] = path
        leaks.append(f"changed sys.path{' (added ' + ', '.join(map(str, added)) + ')' if added else ''}; "
                     "pgnb put it back")
    if not grad_enabled:
        leaks.append("left grad mode off (torch.set_grad_enabled(False)); it ended with the test's thread")
    if _BASELINE["groups"] and not dist.is_initialized():
        leaks.append("destroyed the default process group; pgnb starts the world again")
    made = [g for g in _groups(dist) if g not in _BASELINE["groups"]]
    if made:
        for group in made:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
        leaks.append(f"left {len(made)} process group(s) it created (new_group, a DeviceMesh); pgnb destroyed them")
    _forget_meshes()
    env: dict[str, str] = _BASELINE["env"]
    now = dict(os.environ)
    changed = sorted(k for k in set(env) | set(now) if env.get(k) != now.get(k) and k not in _LIBRARY_ENV)
    if changed:
        for k in changed:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        leaks.append("changed environment variable(s) " + ", ".join(changed) + "; pgnb put them back")
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was removed under it
        cwd = ""
    if cwd != _BASELINE["cwd"]:
        os.chdir(_BASELINE["cwd"])
        leaks.append(f"changed the current directory (to {cwd or 'a removed directory'}); pgnb changed it back")
    flags = _flags(torch)
    for name, value in _BASELINE["flags"].items():
        if flags.get(name) != value:
            with contextlib.suppress(Exception):
                _set_flag(torch, name, value)
            leaks.append(f"changed torch's {name} (to {_shown(flags.get(name))}); pgnb put it back")
    return leaks


def _shown(value: Any) -> str:
    return str(value).replace("torch.", "")


def _forget_meshes() -> None:
    """DeviceMesh keeps its meshes in a process-wide registry; a destroyed group's mesh must not stay there."""
    module = sys.modules.get("torch.distributed.device_mesh")
    resources = getattr(module, "_mesh_resources", None)
    for name in ("mesh_stack", "child_to_root_mapping", "root_to_flatten_mapping", "flatten_name_to_root_dims"):
        holder = getattr(resources, name, None)
        if isinstance(holder, (list, dict)):
            holder.clear()
