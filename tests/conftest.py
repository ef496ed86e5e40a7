"""Shared fixtures: a temporary IPYTHONDIR, one shared world per size, factories that check for leaks, a fresh shell.

- ``world4``: one gloo world of 4 for the whole session, for the modules that only read or run cells
  (each leaves it whole: a cell that blocks a rank releases it before the test ends).
- ``make_world(**options)`` / ``start_world(request, **options)``: a world of a test's or a module's own,
  for tests that kill ranks or change options; ``make_marked_kernel()``: a kernel whose processes are
  seen from outside. At teardown each is stopped and nothing it started may be left.
- Every module starts without an IPython shell and leaves none behind (``_fresh_shell``).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

# What the tests and the processes they start leave in the temporary folder (ipykernel's cell files,
# a killed run's files) goes in one folder of the run's, removed at its end by the session that made it
# (pytest_unconfigure); pytest-xdist's workers share their controller's. 0711: daemons the tests start
# (munged) want every folder above their sockets searchable by all; nobody else can list it.
_PREFIX = "pgnb-tests-"
_inherited = os.path.basename(os.environ.get("TMPDIR", "")).startswith(_PREFIX)
_session_temp = os.environ["TMPDIR"] if _inherited else tempfile.mkdtemp(prefix=_PREFIX)
os.chmod(_session_temp, 0o711)
os.environ["TMPDIR"] = _session_temp
tempfile.tempdir = None  # tempfile read TMPDIR once already

# Before anything imports IPython or ipyparallel: never touch the user's profile.
if not os.environ.get("IPYTHONDIR", "").startswith(tempfile.gettempdir()):
    os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="pgnb-test-ipython-")

# Engines inherit this: functions defined in test modules are sent by reference.
_here = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_here, os.environ.get("PYTHONPATH")) if p)

import pytest  # noqa: E402  (IPYTHONDIR and PYTHONPATH must be set first)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (the soak set: `make soak`)")


def pytest_unconfigure(config):
    if not _inherited:
        shutil.rmtree(_session_temp, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (make soak)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def inet_sockets(pid):
    """psutil's ``net_connections("inet")`` of the process (``connections`` before psutil 6, the floor's 5.9)."""
    import psutil

    proc = psutil.Process(pid)
    return (proc.net_connections if hasattr(proc, "net_connections") else proc.connections)(kind="inet")


def alive(pids):
    """The pids still running (zombies count as gone)."""
    from pgnb.procs.processes import process_running

    return [pid for pid in pids if process_running(pid)]


def wait_gone(pids, timeout=10.0):
    from pgnb.core.waiting import poll_until

    poll_until(lambda: not alive(pids), timeout, step=0.1)
    return alive(pids)


def left_in(folder, timeout=10.0):
    """What is in ``folder`` once no process works in it (a killed kernel's reaper, which started there, has
    left or exited: a helper that writes to its working directory wrote there), waiting at most ``timeout``."""
    import psutil

    from pgnb.core.waiting import poll_until

    def working_there():
        return [p.pid for p in psutil.process_iter(["cwd"]) if p.info["cwd"] == str(folder)]

    poll_until(lambda: not working_there(), timeout, step=0.1)
    return sorted(os.listdir(folder)) + [f"(pid {pid} still works there)" for pid in working_there()]


#: Seconds a stopped world or kernel has for every process it started to end.
GONE_WITHIN = 10.0


def stop_leaving_nothing(sb) -> None:
    """Shut ``sb`` down; every process it started ends within ``GONE_WITHIN`` s and its scratch directory is gone."""
    from pgnb.core.sandbox import dispatch_of

    pids = sb.pids
    # made now if no test made it: shutdown must remove it all the same
    scratch = dispatch_of(sb).scratch_dir if pids else None
    sb.shutdown()
    assert wait_gone(pids, timeout=GONE_WITHIN) == [], f"left running after shutdown: {alive(pids)}"
    assert scratch is None or not os.path.exists(scratch), f"left behind: {scratch}"


def start_world(request, **options):
    """A started ``pgnb.Sandbox(**options)``, stopped when ``request``'s scope ends (``stop_leaving_nothing``).

    From a module-scoped fixture it is the module's own world; ``make_world`` is the same for one test.
    """
    import pgnb

    sb = pgnb.Sandbox(**options)
    request.addfinalizer(lambda: stop_leaving_nothing(sb))  # before start: a start that fails half-way is stopped too
    sb.start()
    return sb


@pytest.fixture
def make_world(request):
    """``make_world(**options)``: a world of this test's own (it kills ranks, changes options); checked at teardown."""
    return functools.partial(start_world, request)


@pytest.fixture(scope="session")
def world4(request):
    """One gloo world of 4 shared by every module that only reads or runs cells."""
    return start_world(request, backend="gloo", world=4)


@pytest.fixture
def make_marked_kernel(request):
    """``make_marked_kernel()``: a ``procs_util.MarkedKernel``; at teardown it is SIGKILLed (as nbval does, if the
    test did not close it) and no process or file of its pgnb may be left within ``GONE_WITHIN`` s."""
    from procs_util import MarkedKernel

    def make():
        k = MarkedKernel()

        def check():
            try:
                k.close(kill=True)
                assert k.wait_nothing_left(GONE_WITHIN) == ([], [])
            finally:
                k.forget()

        request.addfinalizer(check)
        return k

    return make


@pytest.fixture(scope="module", autouse=True)
def _fresh_shell():
    """Each module gets its own ``InteractiveShell.instance()``: another module's shell (its magics, user
    namespace, history) is closed and forgotten when that module ends, so no test depends on what one left."""
    _forget_shell()
    yield
    _forget_shell()


def _forget_shell() -> None:
    import sys

    if "IPython" not in sys.modules:
        return  # nothing made a shell yet
    import atexit

    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        shell = InteractiveShell.instance()
        atexit.unregister(shell.atexit_operations)  # it runs once, now: it cannot run twice
        shell.atexit_operations()  # clears the namespaces, closes the history database and its thread
        InteractiveShell.clear_instance()


@pytest.fixture
def shell():
    """An IPython shell with pgnb loaded; its world is shut down afterwards."""
    from IPython.core.interactiveshell import InteractiveShell

    import pgnb
    from pgnb.notebook.current import set_current

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pgnb")
    yield ip
    sb = pgnb.current()
    if sb is not None:
        sb.shutdown()
    set_current(None)


@pytest.fixture(scope="module")
def ip(world):
    """An IPython shell whose magics drive the requesting module's ``world``."""
    from IPython.core.interactiveshell import InteractiveShell

    from pgnb.notebook.current import current, set_current

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pgnb")
    before = current()
    set_current(world)
    yield shell
    set_current(before)


def pg(shell, line, cell):
    """Run ``%%pg line`` with ``cell``; (captured output, the UsageError or None)."""
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        try:
            shell.run_cell_magic("pg", line, cell)
            err = None
        except UsageError as e:
            err = e
    return cap, err


def timed(fn, *args):
    """``fn(*args)``'s results (a tuple), with the seconds it took appended."""
    import time

    t0 = time.monotonic()
    out = fn(*args)
    return (*out, time.monotonic() - t0)


def _pgnb_kernel(world: int):
    """A real Jupyter kernel with pgnb loaded and a gloo world of ``world`` ranks; shut down after the module,
    and nothing it started left."""
    import json

    from kernel_util import Kernel

    k = Kernel()
    assert k.execute("%load_ext pgnb").status == "ok"
    ex = k.execute(f"%pg_init --backend gloo --world {world}")
    assert ex.status == "ok", ex.text()
    yield k
    ex = k.execute("import json, pgnb\nprint(json.dumps(pgnb.current().pids if pgnb.current() else []))")
    pids = json.loads("".join(o["text"] for o in ex.outputs if o.get("name") == "stdout") or "[]")
    pids.append(k.pid)
    k.execute("%pg_shutdown")
    k.shutdown()
    assert wait_gone(pids, timeout=GONE_WITHIN) == [], f"left running: {alive(pids)}"


@pytest.fixture(scope="module")
def kernel4():
    """A kernel with a world of 4, shared by the requesting module's kernel tests."""
    yield from _pgnb_kernel(4)


@pytest.fixture(scope="module")
def kernel2():
    """A kernel with a world of 2, shared by the requesting module's kernel tests."""
    yield from _pgnb_kernel(2)
