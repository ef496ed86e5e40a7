"""``pytest --pgnb-torch``: torch's own ``MultiProcessTestCase`` suites on warm pgnb ranks, unchanged.

How torch runs such a test (``torch/testing/_internal/common_distributed.py``): in the
pytest process the test's ``setUp`` calls ``_spawn_processes``, whose
``_start_processes(proc)`` starts ``world_size`` processes, each calling the class's
``_run(rank, test_name, file_name, pipe)``; the test method is wrapped
(``join_or_run``) so that in this process it calls ``_join_processes(fn)``, which
waits for them and turns their exit statuses into the verdict
(``_check_return_codes``: 0 passes, a ``TEST_SKIPS`` code skips with torch's
reason, ``TEST_ERROR_EXIT_CODE`` fails with the traceback the process sent).

With ``--pgnb-torch`` (or the ini setting ``pgnb_torch = true``) the plugin replaces
those two methods on each test's instance, and nothing else of torch's:

- ``_start_processes``: the ranks of a warm world (``pgnb.testing.worlds``) will make
  the ``_run`` call instead, with this process's environment as ``setUp`` left it,
  its directory and import path (``pgnb.rank.torch_suites``). Stand-ins for the
  processes let torch's code read a ``pid`` and an ``exitcode`` as usual.
- ``_join_processes``: one cell runs the test on the ranks, under the plugin's
  per-test timeout (``pgnb_timeout``, pytest-timeout's, or the plugin's default).
  The exit statuses go to the stand-ins and torch's own ``_check_return_codes``
  (or the class's override) decides pass, skip and exit-status failures; a test
  that raised is reported rank by rank, the rank that failed first first
  (``pgnb.testing.verdict``). At the timeout the test fails with every rank's
  stack and its world is replaced; so is a world a rank was lost from.

Every torch test runs on one warm world as large as the largest ``world_size``
collected (a test of 2 runs on its first 2 ranks), whose own process group is
destroyed: torch's tests make theirs from ``file_name``. Classes that override
``_run`` keep it (the ranks call the class's own); torch's other harness,
``MultiProcContinuousTest``, is ``pgnb.testing.torch_continuous``'s (on the same
world); classes that start no processes through either (torch's thread-based and
local-tensor bases) run as they always do.

Left to torch's spawning (the rule; the terminal summary lists each with its
reason): a test that expects an exit status of its own (its own method is in
``special_return_code_checks`` or ``skip_return_code_checks``; another test listed
there for every test, as torch's ``TestDistBackend`` lists one, does not count), a test whose own
code ends, kills or forks its process (it calls one of ``PROCESS_CALLS``), and a
test marked ``pgnb_torch_spawn`` or matched by the ini setting ``pgnb_torch_spawn``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import os
import pickle
import sys
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from .._private_names import PrivateNameMoved, require

if TYPE_CHECKING:
    from .._wire import TestReply, TorchTestOutcome, TorchTestRun
    from ..core.results import RankOutput
    from ..core.sandbox import Sandbox

OPTION = "--pgnb-torch"
INI = "pgnb_torch"
SPAWN_INI = "pgnb_torch_spawn"
SPAWN_MARKER = ("pgnb_torch_spawn(reason): with --pgnb-torch, leave this torch MultiProcessTestCase test "
                "to torch's own spawned processes (pgnb's plugin)")
#: What a test's own code calls when it ends, kills or forks its process: such a test needs a process of its own.
PROCESS_CALLS = ("os._exit", "os.kill", "os.killpg", "os.abort", "os.fork", "signal.raise_signal",
                 "signal.pthread_kill")
#: Where torch's harness lives (imported by every MultiProcessTestCase suite, never by this plugin).
HARNESS = "torch.testing._internal.common_distributed"

#: torch's continuous harness (MultiProcContinuousTest classes), the same option's other half
pytest_plugins = ["pgnb.testing.torch_continuous", "pgnb.testing.zygotes", "pgnb.testing.collection_gc",
                  "pgnb.testing.head_start"]

_LEFT = pytest.StashKey[list[tuple[str, str]]]()  # config: (nodeid, reason) of each test left to torch's spawning
SIZE = pytest.StashKey[int]()  # config: the largest world_size among the collected torch tests (both harnesses)
_REASON = pytest.StashKey[str]()  # item: why it is left to torch's spawning, known at collection
_START_ERROR = pytest.StashKey[str]()  # item: why its world did not start (said in the test's call)


# ---- hooks ---------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("pgnb").addoption(
        OPTION, action="store_true", dest="pgnb_torch", default=False,
        help="run torch's MultiProcessTestCase tests on warm pgnb ranks instead of spawning processes per test")
    parser.addini(INI, f"as {OPTION}: run torch's MultiProcessTestCase tests on warm pgnb ranks", type="bool",
                  default=False)
    parser.addini(SPAWN_INI, f"with {OPTION}: node ids (fnmatch patterns) of tests left to torch's own spawning",
                  type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SPAWN_MARKER)


def enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("pgnb_torch", False) or config.getini(INI))


def torch_case(item: pytest.Item) -> type | None:
    """The item's ``MultiProcessTestCase`` class, or None (torch's harness is not even imported)."""
    harness = sys.modules.get(HARNESS)
    cls = getattr(item, "cls", None)
    if harness is None or cls is None or type(item).__name__ != "TestCaseFunction":
        return None
    return cls if issubclass(cls, harness.MultiProcessTestCase) else None


def pytest_collection_finish(session: pytest.Session) -> None:
    if not enabled(session.config):
        return
    if HARNESS in sys.modules:  # torch's harness is in use: the private names of it this option cannot do without
        try:
            require("torch_suites")
        except PrivateNameMoved as e:
            raise pytest.UsageError(str(e)) from None
    sizes, classes = [], []
    for item in session.items:
        cls = torch_case(item)
        if cls is None:
            continue
        reason = spawn_reason(item, cls)
        if reason:
            item.stash[_REASON] = reason
            continue
        classes.append(cls)
        with contextlib.suppress(Exception):  # a property that needs a running test: asked again then
            sizes.append(int(cls("runTest").world_size))
    collected(session.config, sizes, classes)


def collected(config: pytest.Config, sizes: list[int], classes: list[type]) -> None:
    """The collected torch tests' world sizes and classes: one warm world as large as the largest, whose
    zygote imports torch's test harness (the modules the classes come from) and pgnb's rank side of it once,
    before forking the ranks."""
    config.stash[SIZE] = max([config.stash.get(SIZE, 0), *sizes])
    harness = {c.__module__ for cls in classes for c in cls.__mro__ if c.__module__.startswith("torch.testing.")}
    if harness:
        from ..core import cluster

        # pgnb's side of a test on the ranks (it imports pgnb.rank.torch_suites): once in the zygote rather than
        # in every rank at the first test (18 ms or more each, compiled from source when no bytecode is cached)
        harness.add("pgnb.rank.torch_continuous")
        cluster.ZYGOTE_PRELOAD[:] = sorted(set(cluster.ZYGOTE_PRELOAD) | harness)


def pytest_unconfigure(config: pytest.Config) -> None:
    if enabled(config):
        from ..core import cluster

        cluster.ZYGOTE_PRELOAD.clear()


def spawn_reason(item: pytest.Item, cls: type) -> str:
    """Why this test is left to torch's spawning, as far as collection can tell ("" if it is not)."""
    marker = item.get_closest_marker("pgnb_torch_spawn")
    if marker is not None:
        return str(marker.kwargs.get("reason") or (marker.args[0] if marker.args else "marked pgnb_torch_spawn"))
    for pattern in item.config.getini(SPAWN_INI):
        if fnmatch.fnmatchcase(item.nodeid, pattern):
            return f"listed in {SPAWN_INI} ({pattern})"
    name = getattr(item, "name", "")
    try:
        source = inspect.getsource(inspect.unwrap(getattr(cls, name)))
    except (AttributeError, OSError, TypeError):
        return ""
    called = [c for c in PROCESS_CALLS if f"{c}(" in source]
    if called:
        return f"its code calls {called[0]} (a test that ends, kills or forks its process needs one of its own)"
    return ""


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """Have the warm world ready before the test's own time begins (timeouts, durations), as for a world test."""
    cls = torch_case(item) if enabled(item.config) else None
    if cls is not None and not item.stash.get(_REASON, ""):
        warm_up(item, cls)
    return (yield)


def warm_up(item: pytest.Item, cls: type) -> None:
    """Start the torch tests' world now, unless unittest skips the test before its setUp."""
    if item.config.stash.get(SIZE, 0) > 0 and not _unittest_skipped(cls, getattr(item, "name", "")):
        try:
            world_for(item.config, 0)
        except Exception as e:  # said at the test, in its call
            item.stash[_START_ERROR] = str(e)


def _unittest_skipped(cls: type, name: str) -> bool:
    """unittest skips it before setUp (torch's ``skip_but_pass_in_sandcastle_if`` and friends)."""
    method = getattr(cls, name, None)
    return bool(getattr(cls, "__unittest_skip__", False) or getattr(method, "__unittest_skip__", False))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if not enabled(item.config) or torch_case(item) is None:
        return (yield)
    reason = item.stash.get(_REASON, "")
    if reason:
        left_to_spawning(item, reason)
        return (yield)
    case = item.instance  # type: ignore[attr-defined]
    warm = WarmRun(item, case)
    case._start_processes = warm.start
    case._join_processes = warm.join
    try:
        return (yield)
    finally:
        for name in ("_start_processes", "_join_processes"):
            with contextlib.suppress(AttributeError):
                delattr(case, name)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    left = config.stash.get(_LEFT, [])
    if left:
        terminalreporter.write_sep("-", f"{OPTION}: {len(left)} left to torch's own spawning")
        for nodeid, reason in left:
            terminalreporter.write_line(f"{nodeid}: {reason}")


def left_to_spawning(item: pytest.Item, reason: str) -> None:
    item.config.stash.setdefault(_LEFT, []).append((item.nodeid, reason))


# ---- one test on warm ranks ----------------------------------------------
class RankProcess:
    """What torch's parent reads of a process it spawned, for a rank that ran the test instead."""

    def __init__(self, rank: int, pid: int) -> None:
        self.name = f"process {rank}"
        self.pid = pid
        self.exitcode: int | None = None
        self.pipe = SentText()

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        pass

    kill = terminate
    close = terminate


class SentText:
    """The parent's end of a rank's pipe: what the test sent (its traceback), read once."""

    def __init__(self) -> None:
        self.text = ""
        self.closed = False

    def recv(self) -> str:
        return self.text

    def poll(self, timeout: float | None = 0.0) -> bool:
        return bool(self.text)

    def close(self) -> None:
        self.closed = True


class WarmRun:
    """The two methods a test's instance gets instead of torch's: start on warm ranks, join with a deadline."""

    def __init__(self, item: pytest.Item, case: Any) -> None:
        self.item = item
        self.case = case
        self.run: TorchTestRun | None = None
        self.world: Sandbox | None = None
        self.processes: list[RankProcess] = []

    def start(self, proc: Any) -> None:
        case = self.case
        listed = own_exit_status(case)
        if listed:
            left_to_spawning(self.item, f"it expects an exit status of its own ({listed})")
            type(case)._start_processes(case, proc)
            return
        n = int(case.world_size)
        if _START_ERROR in self.item.stash:
            from .plugin import WorldTestFailed

            raise WorldTestFailed(self.item.stash[_START_ERROR])
        self.world = world_for(self.item.config, n)
        pids = [r.pid or 0 for r in self.world.snapshot().ranks[:n]]
        cls = type(case)
        module = sys.modules[cls.__module__]
        self.run = {
            "module": cls.__module__,
            "path": str(getattr(module, "__file__", "") or ""),
            "qualname": cls.__qualname__,
            "test_name": case._current_test_name(),
            "file_name": case.file_name,
            "kwargs": {"fake_pg": getattr(case, "fake_pg", False)},
            "env": dict(os.environ),  # what a spawned process inherits, setUp's changes included
            "cwd": os.getcwd(),
            "sys_path": [p for p in sys.path if isinstance(p, str)],
        }
        self.processes = [RankProcess(r, pid) for r, pid in enumerate(pids)]
        case.processes = self.processes
        case.pid_to_pipe = {p.pid: p.pipe for p in self.processes}

    def join(self, fn: Any) -> None:
        __tracebackhide__ = True
        case = self.case
        if self.run is None or self.world is None:
            type(case)._join_processes(case, fn)
            return
        from .plugin import WorldTestFailed, _timeouts, reply_cell, world_pool
        from .verdict import decide

        limit, timeout = _timeouts(self.item)  # under pytest-timeout the ranks' is shorter: pgnb's report first
        pool, sb = world_pool(self.item.config), self.world
        ranks = {p.pid: r for r, p in enumerate(self.processes)}  # the engines' pids: each knows its rank
        blob = pickle.dumps(self.run, protocol=pickle.HIGHEST_PROTOCOL)
        # two lines: a stack at the timeout shows the call's line, not the blob's
        before = f"_pgnb_torch_test = __import__('pickle').loads({blob!r})\n"
        call = (f"__import__('pgnb.rank.torch_suites', fromlist=['run_torch_test']).run_torch_test("
                f"_pgnb_torch_test, {ranks!r})")
        t0 = time.monotonic()
        try:
            result = reply_cell(sb, call, range(len(self.processes)), timeout, before=before)
        except BaseException:
            pool.recycle(sb)
            raise
        elapsed = time.monotonic() - t0
        outcomes = [_outcome(out) for out in result.ranks]
        if any(o is None for o in outcomes) or not all(o["clean"] for o in outcomes if o is not None):
            pool.recycle(sb)  # a rank hung, was lost, or kept a group: the next test gets a fresh world
        harness = sys.modules[HARNESS]
        error_code = harness.MultiProcessTestCase.TEST_ERROR_EXIT_CODE
        overridden = type(case)._check_return_codes is not harness.MultiProcessTestCase._check_return_codes
        raised = any(o is None or o["exit_code"] == error_code for o in outcomes)
        if raised:
            pool.suspect(sb)  # the next test on it is probed first
        if raised and not (overridden and all(o is not None for o in outcomes)):
            rows = [_row(out, o, harness) for out, o in zip(result.ranks, outcomes, strict=True)]
            verdict = decide(rows, timeout, limit)
            raise WorldTestFailed(verdict.message, verdict.report)  # its report has what each rank printed
        for out, p, o in zip(result.ranks, self.processes, outcomes, strict=True):
            assert o is not None
            text = _printed(out, o)
            if text:
                self.item.add_report_section("call", f"rank {out.rank}", text)
            p.exitcode = o["exit_code"]
            p.pipe.text = o["error"]
        case._check_return_codes(fn, elapsed)


def own_exit_status(case: Any) -> str:
    """Which of torch's lists names this test's own method ("" if neither): torch's ``_check_return_codes``
    looks up the method it joins (``fn in self.skip_return_code_checks``), so only an entry for this very
    method changes its verdict; a ``setUp`` that lists another test (torch's ``TestDistBackend`` lists
    ``test_ddp_has_finalized`` for every test) says nothing about this one."""
    name = case._current_test_name()
    method = getattr(case, name, None)
    fn = getattr(method, "__wrapped__", method)  # join_or_run's wrapper holds the method it joins
    for attr in ("special_return_code_checks", "skip_return_code_checks"):
        for entry in getattr(case, attr, None) or ():
            if entry is fn or entry == fn or _method_name(entry) == name:
                return attr
    return ""


def _method_name(entry: Any) -> str:
    entry = getattr(entry, "__func__", entry)
    return str(getattr(inspect.unwrap(entry), "__name__", entry)) if callable(entry) else str(entry)


def world_for(config: pytest.Config, n: int) -> Sandbox:
    """The warm world torch's tests run on: the largest size collected (or ``n``), its own group destroyed."""
    from .plugin import WorldTestFailed, world_pool

    pool = world_pool(config)
    key = pool.key({"world": max(n, config.stash.get(SIZE, 0))})
    sb = pool.worlds().get(key)  # as it is: a world whose group torch's tests destroyed stays so
    # a test failed on it: the probe says whether it can go on (its ranks answer; the group there, if any, is
    # a torch test's own, made again by the next test)
    if sb is not None and not pool.healthy(sb, group=False):
        pool.recycle(sb)
        sb = None
    if sb is None:
        try:
            sb = pool.get(key)
        except Exception as e:
            pool.recycle(key)
            raise WorldTestFailed(f"the world for this test did not start: {e}") from None
    if sb.is_initialized:
        sb.destroy()  # each test makes its own group from its file_name
    return sb


def _outcome(out: RankOutput) -> TorchTestOutcome | None:
    value = out.value
    return value if isinstance(value, dict) and "exit_code" in value else None  # type: ignore[return-value]


def _printed(out: RankOutput, o: TorchTestOutcome | None) -> str:
    parts = [(name, text) for name, text in (("stdout", out.stdout), ("stderr", out.stderr),
                                             ("fd 1/2", o["fd_output"] if o else "")) if text]
    return "\n".join(f"--- rank {out.rank} {name} ---\n{text.rstrip()}" for name, text in parts)


def _row(out: RankOutput, o: TorchTestOutcome | None, harness: Any) -> Any:
    """One rank's part in ``pgnb.testing.verdict``'s terms."""
    from .verdict import RankRow

    if o is None:
        error = f"{out.ename}: {out.evalue}" if out.ename else out.state
        return RankRow(out.rank, None, out.state, error, tuple(out.traceback), tuple(out.stack))
    reply: TestReply = {"rank": o["rank"], "outcome": "passed", "seconds": o["seconds"], "stdout": out.stdout,
                        "stderr": out.stderr, "fd_output": o["fd_output"], "clean": o["clean"]}
    code = o["exit_code"]
    skip = next((s for s in harness.TEST_SKIPS.values() if s.exit_code == code), None)
    if skip is not None:
        reply["outcome"], reply["reason"] = "skipped", skip.message
    elif code != 0:
        ename, evalue = _exception_line(o["error"]) or ("SystemExit", f"the test exited with status {code}")
        reply["outcome"], reply["ename"], reply["evalue"] = "failed", ename, evalue
        reply["traceback"], reply["failed_at"] = o["error"].rstrip("\n").split("\n"), o["ended"]
    return RankRow(out.rank, reply)


def _exception_line(text: str) -> tuple[str, str] | None:
    """``(name, message)`` of the exception a formatted traceback ends with."""
    lines = text.rstrip("\n").split("\n")
    last_frame = max((i for i, ln in enumerate(lines) if ln.startswith("  File ")), default=-1)
    for i in range(last_frame + 1, len(lines)):
        line = lines[i]
        if line and not line.startswith(" "):
            name, _, message = line.partition(": ")
            return name.strip(), "\n".join([message, *lines[i + 1:]]).strip()
    return None
