"""Shared fixtures: a temporary IPYTHONDIR, one shared world, leak checks."""

from __future__ import annotations

import os
import tempfile

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


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (make soak)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def alive(pids):
    """The pids still running (zombies count as gone)."""
    from pgnb.procs.processes import process_running

    return [pid for pid in pids if process_running(pid)]


def wait_gone(pids, timeout=10.0):
    from pgnb.core.waiting import poll_until

    poll_until(lambda: not alive(pids), timeout, step=0.1)
    return alive(pids)


@pytest.fixture(scope="session")
def world4():
    """One gloo world of 4 shared by the tests that only read or run collectives."""
    import pgnb

    sb = pgnb.Sandbox(backend="gloo", world=4)
    sb.start()
    yield sb
    pids = sb.pids
    sb.shutdown()
    assert wait_gone(pids) == []


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
    """A real Jupyter kernel with pgnb loaded and a gloo world of ``world`` ranks; shut down after the module."""
    from kernel_util import Kernel

    k = Kernel()
    assert k.execute("%load_ext pgnb").status == "ok"
    assert k.execute(f"%pg_init --backend gloo --world {world}").status == "ok"
    yield k
    k.execute("%pg_shutdown")
    k.shutdown()


@pytest.fixture(scope="module")
def kernel4():
    """A kernel with a world of 4, shared by the requesting module's kernel tests."""
    yield from _pgnb_kernel(4)


@pytest.fixture(scope="module")
def kernel2():
    """A kernel with a world of 2, shared by the requesting module's kernel tests."""
    yield from _pgnb_kernel(2)
