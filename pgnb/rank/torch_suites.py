"""One test of a torch ``MultiProcessTestCase`` class, run on a warm rank as torch's spawned process would run it.

torch's harness starts ``world_size`` processes per test, each calling the class's
``_run(rank, test_name, file_name, parent_pipe, **kwargs)`` and exiting with 0, a
``TEST_SKIPS`` code or ``TEST_ERROR_EXIT_CODE`` (after sending its traceback down
the pipe). Here a warm rank makes the call instead: with the parent's environment,
working directory and import path, a pipe of its own, fd 1 and 2 caught in a file,
and ``SystemExit`` caught as the exit status. Afterwards it puts back what the
process would have taken with it when it exited: its environment, directory, import
path and torch's global flags, the globals of the test's modules
(``pgnb.rank.module_state``), and every process group the test left.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from .._wire import TorchClassRun, TorchTestOutcome, TorchTestRun
from . import module_state
from .engine import fresh_threads
from .rendezvous import reset_group_counter

#: ``multiprocessing``'s exit status for a target that raised
UNCAUGHT_EXIT_CODE = 1
#: Seconds to wait for what the test sent down its pipe once it has ended
PIPE_DRAIN = 2.0


def run_torch_test(run: TorchTestRun, ranks: dict[int, int]) -> TorchTestOutcome:
    """``cls._run(rank, ...)`` as a spawned process would, on the rank ``ranks[os.getpid()]``."""
    import torch.distributed as dist

    rank = ranks[os.getpid()]
    if dist.is_initialized():  # the world's own group: the test makes its own from file_name
        dist.destroy_process_group()
    reset_group_counter(dist)  # a fresh process names its first group "0"
    started = time.time()
    with as_spawned(run), fd_output() as output:
        cls = test_class(run)
        module_state.remember(module_state.watched([c.__module__ for c in cls.__mro__]))
        parent, child = multiprocessing.Pipe()
        sent: list[str] = []
        reader = threading.Thread(target=_drain, args=(parent, sent), name="pgnb-torch-pipe", daemon=True)
        reader.start()
        code, uncaught = _call(cls, rank, run, child)
        ended = time.time()
        with contextlib.suppress(OSError):
            child.close()  # run_test closes it; an overridden _run may not
        reader.join(PIPE_DRAIN)
        clean = destroy_groups(dist)
        module_state.restore()  # a spawned process's module globals ended with it
    return {"rank": rank, "exit_code": code, "error": "".join(sent) or uncaught, "ended": ended,
            "seconds": ended - started, "fd_output": output[0], "clean": clean}


def _call(cls: Any, rank: int, run: TorchTestRun, pipe: Any) -> tuple[int, str]:
    """The exit status ``_run`` would give its process, and the traceback of an uncaught error."""
    try:
        cls._run(rank, run["test_name"], run["file_name"], pipe, **run["kwargs"])
    except SystemExit as e:
        return exit_status(e.code), ""
    except Exception:
        text = traceback.format_exc()
        sys.stderr.write(text)  # a spawned process prints it on its stderr as it dies
        return UNCAUGHT_EXIT_CODE, text
    return 0, ""


def exit_status(code: object) -> int:
    """What ``sys.exit(code)`` makes a process's exit status (as ``multiprocessing`` reports it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return UNCAUGHT_EXIT_CODE


def _drain(conn: multiprocessing.connection.Connection, into: list[str]) -> None:
    """Read what the test sends its parent until the pipe closes (a traceback may not fit a pipe's buffer)."""
    try:
        while True:
            into.append(str(conn.recv()))
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


def test_class(run: TorchTestRun | TorchClassRun) -> Any:
    """The test's class, from its module as pytest imported it (imported once per rank, then kept)."""
    module = sys.modules.get(run["module"])
    if module is None or os.path.realpath(getattr(module, "__file__", "") or "") != os.path.realpath(run["path"]):
        module = _import(run["module"], run["path"])
    obj: Any = module
    for part in run["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def _import(name: str, path: str) -> Any:
    try:
        module = importlib.import_module(name)
        if os.path.realpath(getattr(module, "__file__", "") or "") == os.path.realpath(path):
            return module
    except ImportError:
        pass
    # pytest's importmode=importlib gives a module a name no sys.path entry resolves: load it by file
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def as_spawned(run: TorchTestRun | TorchClassRun) -> Iterator[None]:
    """The parent's environment, directory and import path for the test, and the intra-op threads torch
    gives the process it would spawn; this rank's back afterwards."""
    import torch

    env, cwd = dict(os.environ), os.getcwd()
    flags = (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.is_grad_enabled(), torch.get_num_threads())
    keep = {k: v for k, v in env.items() if k.startswith("GLOO_SOCKET_IFNAME")}  # the world stays on loopback
    _set_environ({**run["env"], **keep})
    path = list(sys.path)
    sys.path[:0] = [p for p in run["sys_path"] if p not in sys.path]
    with contextlib.suppress(OSError):
        os.chdir(run["cwd"])
    torch.set_num_threads(fresh_threads(run["env"]))  # not the world's share of the cores: torch's own default
    try:
        yield
    finally:
        _set_environ(env)
        sys.path[:] = path
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        torch.set_default_dtype(flags[0])
        torch.use_deterministic_algorithms(flags[1], warn_only=flags[2])
        torch.set_grad_enabled(flags[3])
        torch.set_num_threads(flags[4])


def _set_environ(values: dict[str, str]) -> None:
    for k in [k for k in os.environ if k not in values]:
        del os.environ[k]
    for k, v in values.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


@contextlib.contextmanager
def fd_output() -> Iterator[list[str]]:
    """What C and C++ code (and torch's logging) write to fd 1 and 2 while the test runs, in one text."""
    out = [""]
    with tempfile.TemporaryFile() as f:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)
            f.seek(0)
            out[0] = f.read().decode("utf-8", "replace")


def destroy_groups(dist: Any) -> bool:
    """Destroy every process group the test left (a failed test leaves its own, and its peers'
    collectives then fail at once instead of waiting); False if that failed."""
    clean = True
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            clean = False
    reset_group_counter(dist)
    return clean
