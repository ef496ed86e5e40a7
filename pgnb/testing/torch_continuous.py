"""``pytest --pgnb-torch`` for torch's continuous harness: ``MultiProcContinuousTest`` classes on warm ranks.

How torch runs such a class (``torch/testing/_internal/common_distributed.py``): the
first test's ``setUp`` calls ``_ensure_processes_spawned``, whose
``_spawn_processes(world_size)`` starts ``world_size`` processes for the class, each
in ``_worker_loop`` (``cls._init_pg``, then the test ids it is sent, one by one,
torch's seed before each); ``setUp`` sends each test's id, the test method
(wrapped by ``_worker_run_main_wait``) waits for every process's answer, and
``tearDownClass`` sends ``None`` and joins the processes. After any failure a
``poison_pill`` skips the rest of the class; the join has no timeout.

With ``--pgnb-torch`` the plugin replaces, for the test's call, the class's
``_spawn_processes`` and the instance's test method, and nothing else of torch's:

- ``_spawn_processes``: the ranks of the warm world (``pgnb.testing.torch_suites.world_for``)
  stand in for the processes; the class's group is made on them by the class's own
  ``_init_pg`` (so its ``backend_str()``, ``opts()`` and ``timeout``, or its override)
  with ``cls.rank``/``cls.world_size``/``cls.pg`` set as ``_worker_loop`` sets them
  (``pgnb.rank.torch_continuous``). A subclass whose base already started its
  processes gets its own (pytorch#189362).
- the test method: one cell runs ``cls._run_test_given_id(test_id)`` on the ranks under
  the plugin's timeout. A failure is pgnb's report (first failing rank first) and
  costs only its test: there is no poison pill, and the next test of the class runs
  on the class's group made afresh (or a fresh world after a hang). A ``TEST_SKIPS``
  exit in ``_init_pg`` skips every test of the class with torch's reason.
- the processes' join at ``tearDownClass``: the class's group is destroyed on the
  ranks and each rank is put back as it was before the class (environment,
  directory, import path, torch's flags, its modules' globals), within a bounded
  time; the world then serves the next class, of any configuration.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import types
import unittest
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .._wire import TorchClassRun
    from ..core.results import CellResult
    from ..core.sandbox import Sandbox
    from .verdict import RankRow

from .torch_suites import HARNESS, collected, enabled, warm_up

#: Seconds a class's set-up or tear-down on the ranks may take (an _init_pg over a FileStore, a destroy).
CLASS_STEP_TIMEOUT = 60.0

_CLASSES = pytest.StashKey[dict[type, "ClassWorld"]]()
#: config: which class's group each warm world's ranks hold now
_HOLDER = pytest.StashKey[dict[int, "ClassWorld"]]()
#: config: the session's last test is running (its class's end on the ranks would precede their shutdown)
_LAST = pytest.StashKey[bool]()


def continuous_case(item: pytest.Item) -> type | None:
    """The item's ``MultiProcContinuousTest`` class, if torch's processes would run it (else None)."""
    harness = sys.modules.get(HARNESS)
    cls = getattr(item, "cls", None)
    if harness is None or cls is None or type(item).__name__ != "TestCaseFunction":
        return None
    base = harness.MultiProcContinuousTest
    if not issubclass(cls, base):
        return None
    # a class that starts its processes its own way (torch's local-tensor bases start none) runs as it is
    own = getattr(cls._spawn_processes, "__func__", None) is not base._spawn_processes.__func__ \
        or getattr(cls._ensure_processes_spawned, "__func__", None) is not base._ensure_processes_spawned.__func__
    return None if own else cls


def world_size(cls: type) -> int:
    """The world a continuous class asks for, as torch reads it (0 if it cannot be told yet)."""
    with contextlib.suppress(Exception):
        return int(cls._get_world_size("cpu"))  # type: ignore[attr-defined]
    return 0


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if not enabled(session.config):
        return
    classes = {cls for cls in map(continuous_case, session.items) if cls is not None}
    collected(session.config, [world_size(cls) for cls in classes], list(classes))


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """The class's world is started before the test's own time begins, as for torch's other harness."""
    cls = continuous_case(item) if enabled(item.config) else None
    if cls is not None:
        warm_up(item, cls)
        item.config.stash[_LAST] = nextitem is None
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    cls = continuous_case(item) if enabled(item.config) else None
    if cls is None:
        return (yield)
    classes = item.config.stash.setdefault(_CLASSES, {})
    state = classes.get(cls)
    if state is None:
        state = classes[cls] = ClassWorld(item.config, cls)
        if cls._processes_spawned and "_processes_spawned" not in cls.__dict__:  # type: ignore[attr-defined]
            cls._processes_spawned = False  # type: ignore[attr-defined]  # a base's processes are not its own
    case = item.instance  # type: ignore[attr-defined]
    waits = item.obj  # type: ignore[attr-defined]  # torch's _worker_run_main_wait wrapper, bound to case
    # a partial, not the bound method: Python 3.10's classmethod binds through a bound method's __get__ and
    # drops cls (TypeError: spawn() missing 'world_size'; the support matrix's oldest column)
    cls._spawn_processes = classmethod(functools.partial(ClassWorld.spawn, state))  # type: ignore[attr-defined]
    # pytest calls item.obj as the test method (it sets it on the instance for unittest's run)

    @functools.wraps(waits)  # unittest's skip marks stay: a skipped test is skipped here, as torch's harness does
    def on_ranks(self: Any) -> None:
        state.run(item, self, waits)

    item.obj = types.MethodType(on_ranks, case)  # type: ignore[attr-defined]
    try:
        return (yield)
    finally:
        item.obj = waits  # type: ignore[attr-defined]
        with contextlib.suppress(AttributeError):
            delattr(cls, "_spawn_processes")


class _Queue:
    """A task queue of the class's processes: torch's setUp sends each test's id; the test's cell carries it."""

    def put(self, item: Any) -> None:
        pass


class _RankProcess:
    """What torch's ``tearDownClass`` joins: the first join ends the class on the ranks."""

    def __init__(self, state: ClassWorld, rank: int) -> None:
        self.state = state
        self.name = f"process {rank}"
        self.exitcode: int | None = None

    def join(self, timeout: float | None = None) -> None:
        self.state.end()
        self.exitcode = 0

    def is_alive(self) -> bool:
        return False

    def terminate(self) -> None:
        pass

    kill = terminate


class ClassWorld:
    """One continuous class on warm ranks: its world, whether its group is made there, its init-time skip."""

    def __init__(self, config: pytest.Config, cls: type) -> None:
        self.config = config
        self.cls = cls
        self.size = 0  # 0: torch has not asked for processes (the class runs as torch runs it)
        self.world: Sandbox | None = None
        self.skip = ""  # torch's reason, when _init_pg exited with a TEST_SKIPS code
        self.ended = False
        self.file = ""  # the rendezvous file of the class's group now (removed when the group goes)

    # ---- what torch calls -------------------------------------------------
    def spawn(self, cls: type, world_size: int) -> None:
        """``cls._spawn_processes(world_size)``: stand-ins for the processes; the ranks come at the test."""
        self.size, self.ended = int(world_size), False
        cls.processes = [_RankProcess(self, r) for r in range(self.size)]  # type: ignore[attr-defined]
        cls.task_queues = [_Queue() for _ in range(self.size)]  # type: ignore[attr-defined]
        cls.completion_queues = []  # type: ignore[attr-defined]
        # no file yet: the class's FileStore is made in its world's scratch folder at its set-up, where
        # the world's reaper removes it if pytest is killed (torch's tearDownClass ignores a missing file)
        cls.rdvz_file = ""  # type: ignore[attr-defined]

    def run(self, item: pytest.Item, case: Any, waits: Any) -> None:
        """The test method in the pytest process: the test on the ranks, and its verdict."""
        __tracebackhide__ = True
        if not self.size:  # torch's own processes run it (a class that set them up its own way)
            waits()
            return
        from .plugin import WorldTestFailed, _timeouts, reply_cell, world_pool
        from .verdict import decide

        limit, timeout = _timeouts(item)  # under pytest-timeout the ranks' is shorter: pgnb's report comes first
        pool = world_pool(self.config)
        sb = self._set_up(item, timeout)
        if self.skip:
            raise unittest.SkipTest(self.skip)
        ranks = self._ranks(sb)
        call = (f"__import__('pgnb.rank.torch_continuous', fromlist=['run_test']).run_test("
                f"{case.id()!r}, {ranks!r}[__import__('os').getpid()])")
        try:
            result = reply_cell(sb, call, range(self.size), timeout)
        except BaseException:
            self._lose(sb, recycle=True)
            raise
        rows = _rows(result, str(self.config.rootpath))
        verdict = decide(rows, timeout, limit)
        if verdict.kind == "passed":
            for r, text in verdict.outputs.items():
                item.add_report_section("call", f"rank {r}", text)
            return
        if verdict.kind == "skipped":
            raise unittest.SkipTest(verdict.message)
        # no poison pill: the next test of the class gets its group made afresh, or new engines after a hang
        stuck = _stuck(rows)
        self._lose(sb, recycle=stuck)
        if not stuck:
            pool.suspect(sb)  # probed before its next test
        raise WorldTestFailed(verdict.message, verdict.report)

    def end(self) -> None:
        """The class is over: its group destroyed and each rank put back as it was (bounded)."""
        if self.ended:
            return
        self.ended = True
        try:
            self._end_on_ranks()
        finally:
            self._forget_file()

    def _end_on_ranks(self) -> None:
        sb = self.world
        holders = self.config.stash.get(_HOLDER, {})
        if sb is None or holders.get(id(sb)) is not self:
            return
        holders.pop(id(sb), None)
        self.world = None
        from . import keeper
        from .plugin import reply_cell, world_pool

        pool = world_pool(self.config)
        if self.config.stash.get(_LAST, False) and pool is not keeper.pool:
            return  # the session's end shuts the world down next: its ranks need not be put back as they were
        call = "__import__('pgnb.rank.torch_continuous', fromlist=['tear_down']).tear_down()"
        try:
            result = reply_cell(sb, call, range(self.size), CLASS_STEP_TIMEOUT)
        except Exception:
            pool.recycle(sb)
            return
        if not all(out.value is True for out in result.ranks):
            pool.recycle(sb)  # a rank could not let go of the class's group: new engines for the next

    # ---- on the ranks -----------------------------------------------------
    def _set_up(self, item: pytest.Item, timeout: float) -> Sandbox:
        """The warm world with this class's group made on it (once per class, again after a failure)."""
        __tracebackhide__ = True
        from .plugin import WorldTestFailed, reply_cell, world_pool
        from .torch_suites import world_for
        from .verdict import decide

        sb = world_for(self.config, self.size)
        holders = self.config.stash.setdefault(_HOLDER, {})
        if self.world is sb and holders.get(id(sb)) is self:
            return sb
        previous = holders.pop(id(sb), None)
        if previous is not None and previous is not self:
            previous.world = None  # its group goes now (set_up tears it down first)
        self.skip = ""
        run: TorchClassRun = {
            "module": self.cls.__module__,
            "path": str(getattr(sys.modules[self.cls.__module__], "__file__", "") or ""),
            "qualname": self.cls.__qualname__,
            "world_size": self.size,
            "rdvz_file": _rendezvous_file(sb.scratch_dir),  # a fresh file for every init of the class's group
            "env": dict(os.environ),  # what torch's spawned workers inherit
            "cwd": os.getcwd(),
            "sys_path": [p for p in sys.path if isinstance(p, str)],
        }
        call = (f"__import__('pgnb.rank.torch_continuous', fromlist=['set_up']).set_up("
                f"{run!r}, {self._ranks(sb)!r})")
        self._forget_file()
        self.file = run["rdvz_file"]  # the group's FileStore: new_group (a DeviceMesh) meets there later
        self.cls.rdvz_file = self.file  # type: ignore[attr-defined]
        try:
            result = reply_cell(sb, call, range(self.size), min(timeout, CLASS_STEP_TIMEOUT))
        except BaseException:
            world_pool(self.config).recycle(sb)
            raise
        rows = _rows(result, str(self.config.rootpath))
        verdict = decide(rows, timeout)
        if verdict.kind == "failed":
            self._lose(sb, recycle=_stuck(rows))
            message = f"the class's set-up on the ranks ({self.cls.__name__}._init_pg) failed: {verdict.message}"
            raise WorldTestFailed(message, message + "\n\n" + verdict.report.partition("\n\n")[2])
        if verdict.kind == "skipped":
            self.skip = verdict.message  # torch: every test of the class is skipped with this reason
        self.world = sb
        holders[id(sb)] = self
        return sb

    def _forget_file(self) -> None:
        if self.file:
            with contextlib.suppress(OSError):
                os.remove(self.file)
            self.file = ""

    def _ranks(self, sb: Sandbox) -> dict[int, int]:
        """Each engine's pid -> its rank in the class's world (each rank looks itself up)."""
        pids = [r.pid or 0 for r in sb.snapshot().ranks[:self.size]]
        return {pid: r for r, pid in enumerate(pids)}

    def _lose(self, sb: Sandbox, recycle: bool) -> None:
        """The class's group on this world is gone (a failure): the next test makes it afresh."""
        from .plugin import world_pool

        self.world = None
        self.config.stash.get(_HOLDER, {}).pop(id(sb), None)
        if recycle:
            world_pool(self.config).recycle(sb)


def _rendezvous_file(folder: str) -> str:
    fd, path = tempfile.mkstemp(prefix="continuous-", dir=folder)
    os.close(fd)
    return path


def _rows(result: CellResult, rootdir: str) -> list[RankRow]:
    from ..rank.testing import _relative
    from .verdict import RankRow

    rows = []
    for out in result.ranks:
        value = out.value
        if isinstance(value, dict) and "outcome" in value:
            reply = dict(value)
            reply["stdout"], reply["stderr"] = out.stdout, out.stderr
            if reply.get("traceback"):  # paths as pytest shows them, as for a world test
                reply["traceback"] = _relative("\n".join(reply["traceback"]), rootdir).split("\n")
            rows.append(RankRow(out.rank, reply))  # type: ignore[arg-type]
            continue
        error = f"{out.ename}: {out.evalue}" if out.ename else out.state
        rows.append(RankRow(out.rank, None, out.state, error, tuple(out.traceback), tuple(out.stack)))
    return rows


def _stuck(rows: list[RankRow]) -> bool:
    """A rank did not answer (hung past the timeout, or lost) or could not let go of its group."""
    return any(r.reply is None or not r.reply.get("clean", True) for r in rows)
