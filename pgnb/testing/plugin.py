"""The pytest plugin: ``@pytest.mark.world(n, ...)`` runs a test on every rank of a warm pgnb world.

Registered as ``pgnb`` through the ``pytest11`` entry point. It is inert unless a
test asks for a world: importing it imports neither torch nor ipyparallel, and
nothing starts until the first test marked ``world`` (or using the
``pgnb_world`` fixture) runs. docs/testing_distributed_code.md is the guide.

How a test runs: the pytest process makes the test's fixtures, then one
``Sandbox.execute`` cell calls ``pgnb.rank.testing.run_test`` on every rank. That
one call imports the test module on the rank (by path, as pytest imported it),
reseeds, runs the function, captures its output, and checks and undoes what it
left behind. The verdict (``pgnb.testing.verdict``) comes back here: a pass, a
skip that every rank agreed on, or a failure report with a section per rank,
the first failing rank first. A test that failed, hung or left the world
unusable has its world replaced; the next test gets a fresh one.
"""

from __future__ import annotations

import bdb
import contextlib
import inspect
import os
import pickle
import sys
import warnings
import zlib
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from . import keeper

if TYPE_CHECKING:
    from ..core.cells import CellHooks
    from ..core.results import CellResult
    from ..core.sandbox import Sandbox
    from ..spec import WorldSpec
    from .verdict import Verdict
    from .worlds import WorldPool

MARKER = ("world(n, backend='gloo', init_method='env', timeout=None, **options): run the test on every rank "
          "of a warm pgnb world of n ranks, with the default process group initialised (pgnb's plugin)")
#: A world test's timeout when neither its marker, pgnb_timeout nor pytest-timeout says one (seconds).
DEFAULT_TIMEOUT = 60.0
#: pgnb's own deadline for the cell, past the test's (the ranks stop at the test's; this is for a rank that cannot).
BACKSTOP = 5.0
#: The name a test's cell gives each rank's reply: it comes back as the rank's value without being displayed.
REPLY = "_pgnb_reply"
#: The parameters a world test's ranks fill in themselves.
ON_RANK = ("rank", "world_size", "device")
#: The marker's options that are not the world's: they do not pick a different world.
TEST_OPTIONS = ("timeout",)

_POOL = pytest.StashKey["WorldPool"]()
_SPEC = pytest.StashKey["WorldSpec | str"]()  # the world a test runs on, or the one line why it cannot
_COUNT = pytest.StashKey[int]()
_START_ERROR = pytest.StashKey[str]()  # the test's world did not start
_DRIVEN = pytest.StashKey[bool]()  # a collected test drives its world from here (pgnb_world)
#: ``pytest --pgnb-torch``: torch's MultiProcessTestCase suites on warm ranks (its hooks, registered with this plugin)
pytest_plugins = ["pgnb.testing.torch_suites", "pgnb.testing.keep"]


class WorldLeakWarning(UserWarning):
    """A world test left something on its ranks (a process group, an environment variable, ...); pgnb undid it."""


class WorldTestFailed(Exception):
    """A world test's failure: its first line, and the report with a section per failing rank."""

    def __init__(self, message: str, report: str = "") -> None:
        super().__init__(message)
        self.report = report or message


class WorldTestDebugged(WorldTestFailed, bdb.BdbQuit):
    """A world test's failure under ``--pdb``: pdb ran on the failing rank, so pytest opens none here (it
    would show the plugin's frames, not the test's)."""


# ---- hooks ---------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("pgnb_timeout", f"seconds a @pytest.mark.world test may run (default {DEFAULT_TIMEOUT:g}, "
                  "or pytest-timeout's timeout where given)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = pool_of(config)
    if pool is None:
        return
    if pool is keeper.pool:  # --pgnb-keep: the worlds wait for the next run (those a failure retired stop now)
        pool.stop_retired()
    else:
        pool.close()


def pool_of(config: pytest.Config) -> WorldPool | None:
    """This run's warm worlds, if it made any."""
    return config.stash.get(_POOL, None)


def world_pool(config: pytest.Config) -> WorldPool:
    """This pytest process's warm worlds (made on first use; closed when the session ends, or kept for the
    next run in ``--pgnb-keep``'s kept process)."""
    pool = pool_of(config)
    if pool is None:
        from .worlds import WorldPool

        if keeper.root is not None:
            if keeper.pool is None:
                keeper.pool = WorldPool()
            pool = config.stash[_POOL] = keeper.pool
            return pool
        pool = config.stash[_POOL] = WorldPool()
        if _measured(config):  # pytest-cov measures this run: the ranks too
            from .coverage import measure

            # what a pgnb_world test runs on the ranks runs in the engines' own thread
            measure(config, pool, engine_thread=config.stash.get(_DRIVEN, False))
    return pool


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, Any, Any]:
    """The ranks save their coverage when the tests are over: inside pytest-cov's wrapper, which combines next."""
    try:
        return (yield)
    finally:
        if _POOL in session.config.stash and _measured(session.config):
            from .coverage import save_all

            save_all(session.config)


def _measured(config: pytest.Config) -> bool:
    """pytest-cov measures this run (``--cov``, and no ``--no-cov``); nothing of it is imported here."""
    return getattr(config.pluginmanager.get_plugin("_cov"), "cov_controller", None) is not None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("world")
        if marker is not None:
            _check(item, marker)
    config.stash[_DRIVEN] = any("pgnb_world" in getattr(item, "fixturenames", ()) for item in items)


def _check(item: pytest.Item, marker: pytest.Mark) -> None:
    """Read the marker once, at collection: the world it asks for, or one line why it cannot run."""
    from ..errors import BackendUnavailable, SpecError

    where = "@pytest.mark.world"
    if not isinstance(item, pytest.Function) or type(item).__name__ == "TestCaseFunction":
        item.stash[_SPEC] = (f"{where} cannot apply to {item.name!r}: it runs plain test functions and methods "
                             "(for torch's MultiProcessTestCase classes use --pgnb-torch)")
        return
    fn = item.obj
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        item.stash[_SPEC] = f"{where} cannot apply to {item.name!r}: async and generator tests cannot run on ranks"
        return
    try:
        item.stash[_SPEC] = world_spec(marker)
    except BackendUnavailable as e:  # nccl with fewer GPUs than ranks: a skip, as torch's own tests do
        item.add_marker(pytest.mark.skip(reason=str(e)))
    except (SpecError, TypeError) as e:
        item.stash[_SPEC] = f"{where}{_marker_args(marker)}: {e}"


def world_spec(marker: pytest.Mark) -> WorldSpec:
    """The world a ``world`` marker asks for (raises ``pgnb.SpecError`` in one line)."""
    from .worlds import WorldPool

    if len(marker.args) > 1:
        raise TypeError("give the world size as its one positional argument and the rest by name")
    options = {k: v for k, v in marker.kwargs.items() if k not in TEST_OPTIONS}
    if marker.args:
        if "world" in options:
            raise TypeError("the world size is given twice")
        options["world"] = marker.args[0]
    options.setdefault("world", 2)
    return WorldPool.key(options)


def _marker_args(marker: pytest.Mark) -> str:
    return "(" + ", ".join([*map(repr, marker.args), *(f"{k}={v!r}" for k, v in marker.kwargs.items())]) + ")"


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """Start the test's world before the test's own time begins (pytest-timeout's timer, its durations)."""
    spec = item.stash.get(_SPEC, None)
    if spec is not None and not isinstance(spec, str) and not _skipped(item):
        from ..errors import PgnbError

        try:
            world_pool(item.config).get(spec)
        except PgnbError as e:  # said at the test, in its call
            item.stash[_START_ERROR] = str(e)
    return (yield)


def _skipped(item: pytest.Item) -> bool:
    try:
        from _pytest.skipping import evaluate_skip_marks
    except ImportError:  # a pytest without it: start the world; the skip still holds
        return False
    try:
        return evaluate_skip_marks(item) is not None
    except Exception:  # a skipif that cannot be evaluated is pytest's to report, in setup
        return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    spec = item.stash.get(_SPEC, None)
    if isinstance(spec, str):
        raise WorldTestFailed(spec)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    spec = pyfuncitem.stash.get(_SPEC, None)
    if spec is None or isinstance(spec, str) or "pgnb_world" in pyfuncitem.fixturenames:
        return None  # not a world test, or one that drives the world from here
    run_on_ranks(pyfuncitem, spec)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, WorldTestFailed):
        report.longrepr = call.excinfo.value.report
    elif report.skipped and call.when == "call" and isinstance(item.stash.get(_SPEC, None), _spec_type()) \
            and isinstance(report.longrepr, tuple):  # the ranks skipped it: say where the test is, not the plugin
        path, line, _ = item.location
        report.longrepr = (os.path.join(str(item.config.rootpath), path), (line or 0) + 1, report.longrepr[2])
    if report.failed and "pgnb_world" in getattr(item, "fixturenames", ()):
        spec = item.stash.get(_SPEC, None)
        if not isinstance(spec, str):  # a test that drove the world and failed leaves it dirty
            world_pool(item.config).recycle(spec if spec is not None else _default_spec())
    return report


# ---- fixtures ------------------------------------------------------------
def _on_rank(name: str) -> str:
    return f"<{name}: filled in on each rank of a @pytest.mark.world test>"


def _only_on_ranks(request: pytest.FixtureRequest, name: str) -> str:
    if request.node.get_closest_marker("world") is None:
        pytest.fail(f"the {name!r} fixture is for tests marked @pytest.mark.world(n): it is filled in on each rank",
                    pytrace=False)
    return _on_rank(name)


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's number (``torch.distributed.get_rank()``), in a ``@pytest.mark.world`` test."""
    return _only_on_ranks(request, "rank")


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks, in a ``@pytest.mark.world`` test."""
    return _only_on_ranks(request, "world_size")


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Any:
    """This rank's ``torch.device``: its GPU with nccl, else the CPU, in a ``@pytest.mark.world`` test."""
    return _only_on_ranks(request, "device")


@pytest.fixture
def pgnb_world(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """The warm ``pgnb.Sandbox`` of the test's ``world`` marker (or a gloo world of 2): the test runs here,
    in the pytest process, and drives the ranks itself (``run``, ``execute``, ``push``, ``pull``)."""
    spec = request.node.stash.get(_SPEC, None)
    if isinstance(spec, str):
        raise WorldTestFailed(spec)
    yield world_pool(request.config).get(spec if spec is not None else _default_spec())


def _spec_type() -> type:
    from ..spec import WorldSpec

    return WorldSpec


def _default_spec() -> WorldSpec:
    from .worlds import WorldPool

    return WorldPool.key({"world": 2})


# ---- running a test on the ranks ------------------------------------------
def reply_cell(sb: Sandbox, call: str, ranks: range | None = None, timeout: float | None = None,
               hooks: CellHooks | None = None, before: str = "") -> CellResult:
    """A cell of pgnb's own on the ranks: ``call`` is an expression whose value is each rank's reply (``before``:
    lines that run first). The reply is assigned, not displayed (``CellOptions.value_of``): no ``execute_result``
    per rank to publish and relay."""
    from ..core.cells import NO_HOOKS, CellOptions

    options = CellOptions(ranks=None if ranks is None else tuple(ranks), timeout=timeout, value_of=REPLY)
    return sb.run_cell(f"{before}{REPLY} = {call}", options, NO_HOOKS if hooks is None else hooks)


def run_on_ranks(item: pytest.Function, spec: WorldSpec) -> None:
    """Run ``item`` on every rank of its warm world; raise what pytest should report."""
    from ..errors import PgnbError
    from ..rank.testing import run_test  # noqa: F401 - the ranks import it; a broken import fails here first
    from .verdict import decide

    pool = world_pool(item.config)
    timeout, rank_timeout = _timeouts(item)
    debugging = _debugging(item.config)
    call = _call(item, rank_timeout)
    blob = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
    code = f"__import__('pgnb.rank.testing', fromlist=['run_test']).run_test(__import__('pickle').loads({blob!r}))"
    started = item.stash.get(_START_ERROR, None)
    try:
        if started is not None:
            raise WorldTestFailed(f"the world for this test did not start: {started}")
        sb = pool.get(spec)
    except PgnbError as e:
        pool.recycle(spec)
        raise WorldTestFailed(f"the world for this test did not start: {e}") from None
    hooks = None
    if debugging:
        from ..core.cells import CellHooks

        hooks = CellHooks.calling(on_input=_terminal_input(item.config))
    try:
        result = reply_cell(sb, code, timeout=timeout + BACKSTOP, hooks=hooks)
    except BaseException:
        pool.recycle(spec)
        raise
    verdict = decide(_rows(result), rank_timeout, pytest_timeout=timeout)
    for leak in verdict.leaks:
        warnings.warn(WorldLeakWarning(f"{item.nodeid} {leak}"), stacklevel=1)
    if verdict.dirty and verdict.replace:
        pool.repair(spec, verdict.replace)  # only these ranks lost or stuck: replaced in place, the rest kept
    elif verdict.dirty:
        pool.recycle(spec)  # a rank is out of step (or every rank is stuck): new engines
    elif verdict.kind == "failed":
        pool.refresh(spec)  # every rank is idle: a fresh process group is enough
    _outcome(item, verdict, debugging)


def _outcome(item: pytest.Function, verdict: Verdict, debugging: bool) -> None:
    if debugging:
        for r, text in verdict.outputs.items():
            sys.stdout.write(f"\n[rank {r}]\n{text}\n")
    else:
        for r, text in verdict.outputs.items():
            item.add_report_section("call", f"rank {r}", text)
    if verdict.kind == "skipped":
        pytest.skip(verdict.message)
    if verdict.kind == "xfailed":
        pytest.xfail(verdict.message)
    if verdict.kind == "failed":
        if item.config.getoption("usepdb", False):
            raise WorldTestDebugged(verdict.message, verdict.report)
        raise WorldTestFailed(verdict.message, verdict.report)


def _rows(result: Any) -> list[Any]:
    from .verdict import RankRow

    rows = []
    for out in result.ranks:
        value = out.value
        if isinstance(value, dict) and "outcome" in value:
            rows.append(RankRow(out.rank, value))  # type: ignore[arg-type]
            continue
        error = f"{out.ename}: {out.evalue}" if out.ename else ""
        rows.append(RankRow(out.rank, None, out.state, error, tuple(out.traceback), tuple(out.stack),
                            out.stdout, out.stderr))
    return rows


def _call(item: pytest.Function, rank_timeout: float | None) -> dict[str, Any]:
    """The ``pgnb._wire.TestCall`` for ``item``: its module, its name, its fixture values."""
    params = list(inspect.signature(item.obj).parameters)
    on_rank = [n for n in params if n in ON_RANK and _ours(item, n)]
    values = {n: item.funcargs[n] for n in params if n not in on_rank and n in item.funcargs}
    kwargs = _pickled(values)
    module = item.module
    name = module.__name__ if module is not None else ""
    path = str(getattr(module, "__file__", "") or item.path)
    count = item.config.stash.get(_COUNT, 0) + 1
    item.config.stash[_COUNT] = count
    owner = f"{item.cls.__qualname__}." if item.cls is not None else ""
    return {
        "test_id": f"{os.getpid()}-{count}",
        "nodeid": item.nodeid,
        "module": name,
        "path": path,
        "base": _base(name, path),
        "qualname": owner + item.originalname,
        "kwargs": kwargs,
        "on_rank": on_rank,
        "seed": zlib.crc32(item.nodeid.encode()),
        "timeout": rank_timeout,
        "cwd": str(item.config.invocation_params.dir),
        "rootdir": str(item.config.rootpath),
        "pdb": bool(item.config.getoption("usepdb", False)),
    }


def _ours(item: pytest.Function, name: str) -> bool:
    """The parameter comes from this plugin's fixture (a conftest may define its own ``device``)."""
    defs = item._fixtureinfo.name2fixturedefs.get(name) or ()
    return bool(defs) and getattr(defs[-1].func, "__module__", "") == __name__


def _pickled(values: dict[str, Any]) -> bytes:
    try:
        return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        for name, value in values.items():
            try:
                pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise WorldTestFailed(f"the value of {name!r} cannot be sent to the ranks "
                                      f"({type(e).__name__}: {e}); a world test's fixtures must pickle") from None
        raise


def _base(name: str, path: str) -> str:
    """The directory ``name`` is relative to: ``/r/a/b/test_x.py`` as ``a.b.test_x`` -> ``/r``."""
    parts = name.split(".")
    base = os.path.dirname(os.path.abspath(path))
    for _ in parts[:-1]:
        base = os.path.dirname(base)
    return base


def _timeouts(item: pytest.Item) -> tuple[float, float]:
    """The test's timeout, and the one its ranks keep (a little shorter under pytest-timeout, so pgnb's
    report with every rank's stack comes before pytest-timeout's)."""
    marker = item.get_closest_marker("world")
    given = marker.kwargs.get("timeout") if marker is not None else None
    if given is not None:
        return float(given), float(given)
    ini = str(item.config.getini("pgnb_timeout") or "")
    if ini:
        return float(ini), float(ini)
    pt = item.get_closest_marker("timeout")
    value: Any = pt.args[0] if pt is not None and pt.args else (pt.kwargs.get("timeout") if pt is not None else None)
    if value is None:
        value = _pytest_timeout(item.config)
    if value not in (None, "", 0, "0"):
        t = float(value)
        return t, max(t * 0.5, t - 2.0)
    return DEFAULT_TIMEOUT, DEFAULT_TIMEOUT


def _pytest_timeout(config: pytest.Config) -> Any:
    """pytest-timeout's timeout for a test without its marker, in its own order: ``--timeout``, else the
    ``PYTEST_TIMEOUT`` environment variable, else its ``timeout`` ini setting (None without pytest-timeout)."""
    if not config.pluginmanager.hasplugin("timeout"):
        return None
    value = config.getoption("timeout", None)
    if value is None:
        value = os.environ.get("PYTEST_TIMEOUT") or None
    if value is None:
        value = config.getini("timeout") or None
    return value


def _debugging(config: pytest.Config) -> bool:
    """A rank's ``breakpoint()`` can be answered from this terminal (``-s``, or ``--pdb``)."""
    return bool(config.getoption("capture", "fd") == "no" or config.getoption("usepdb", False))


def _terminal_input(config: pytest.Config) -> Any:
    capture = config.pluginmanager.getplugin("capturemanager")

    def answer(rank: int, text: str) -> str | None:
        head, _, prompt = text.rpartition("\n")
        with _terminal(capture):
            if head:
                sys.stdout.write(head + "\n")
            try:
                return input(prompt)
            except EOFError:
                return None

    return answer


@contextlib.contextmanager
def _terminal(capture: Any) -> Iterator[None]:
    """The real stdin and stdout for a moment, as pytest's own pdb has them."""
    if capture is None:
        yield
        return
    capture.suspend_global_capture(in_=True)
    try:
        yield
    finally:
        capture.resume_global_capture()
