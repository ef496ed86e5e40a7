"""pgnb's processes with JupyterLab's debugger on: a real kernel, its debugger switched on and off as Lab 4 does it.

Lab's bug button sends ``debug_request``s on the kernel's control channel: ``initialize``, ``attach``,
``configurationDone`` (on), ``disconnect`` (off) (``dap_util.Panel``). From the first ``attach`` on,
ipykernel's debugpy rewrites every Python child the kernel starts so that it waits for a debug
client Lab never gives it; pgnb's controller, zygote, engines and reaper must start as if it did not.
"""

from __future__ import annotations

import re

import psutil
import pytest
from dap_util import Panel
from procs_util import MarkedKernel

from pgnb.core.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

INIT = "%pg_init --backend gloo --world 2"
CELL = """%%pg
import torch, torch.distributed as dist
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", int(t.item()))"""
GROUPED = re.compile(r"\[rank 0\].*sum 3.*\[rank 1\].*sum 3", re.S)


def _is_debug_adapter(p: psutil.Process) -> bool:
    """debugpy's adapter: the kernel's own (ipykernel starts it at the first attach), not pgnb's."""
    try:
        return any("debugpy" in a and "adapter" in a for a in p.cmdline())
    except psutil.Error:
        return False


def _pgnb_processes(k: MarkedKernel) -> list[psutil.Process]:
    return [p for p in k.processes() if not _is_debug_adapter(p)]


def _under_debugger(k: MarkedKernel) -> list[str]:
    """The command lines of pgnb's processes that debugpy rewrote (they run pydevd)."""
    found = []
    for p in _pgnb_processes(k):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "pydevd" in cmd:
            found.append(cmd[:200])
    return found


def _nothing_left(k: MarkedKernel) -> tuple[list[int], list[str]]:
    poll_until(lambda: not _pgnb_processes(k) and not k.files(), 10, step=0.1)
    return [p.pid for p in _pgnb_processes(k)], k.files()


def _engine_pids(k: MarkedKernel) -> list[int]:
    world = k.world()
    assert [state for _, state, _, _ in world["rows"]] == ["initialized", "initialized"], world
    return [pid for _, _, pid, _ in world["rows"]]


@pytest.fixture(scope="module")
def kernel():
    k = MarkedKernel()
    try:
        assert k.execute("%load_ext pgnb").status == "ok"
        # what a first %pg_init imports in the kernel, so the timings below compare worlds, not imports
        assert k.execute("import ipyparallel, pgnb.core.sandbox, pgnb.notebook.view").status == "ok"
        yield k
        k.execute("%pg_shutdown")
        assert _nothing_left(k) == ([], [])
    finally:
        k.close(kill=False)
        k.forget()


@pytest.fixture(scope="module")
def debugger(kernel):
    """The kernel's debugger, switched on (``start``) and off (``stop``) as JupyterLab's bug button does."""
    return Panel(kernel)


def test_world_starts_with_the_debugger_on_as_fast_as_off(kernel, debugger):
    off = kernel.execute(INIT)
    assert off.status == "ok", off.text()
    assert kernel.execute("%pg_shutdown").status == "ok"
    assert _nothing_left(kernel) == ([], [])

    debugger.start()
    # before pgnb started its processes outside debugpy, this failed after 120 s (the zygote never forked)
    on = kernel.execute(INIT, timeout=90)
    assert on.status == "ok", on.text()
    print(f"%pg_init world 2: debugger off {off.seconds:.1f} s, on {on.seconds:.1f} s")
    assert on.seconds < 2.5 * off.seconds + 2, (off.seconds, on.seconds)
    kinds = kernel.by_kind()
    assert all(kinds[kind] for kind in ("controller", "zygote", "reaper", "engine")), kinds
    assert _under_debugger(kernel) == []
    ex = kernel.execute(CELL, timeout=60)
    assert ex.status == "ok" and GROUPED.search(ex.text()), ex.text()


def test_switching_the_debugger_off_and_on_leaves_the_world_alone(kernel, debugger):
    pids = _engine_pids(kernel)
    for switch in (debugger.stop, debugger.start, debugger.stop, debugger.start):
        switch()
        ex = kernel.execute(CELL, timeout=60)
        assert ex.status == "ok" and GROUPED.search(ex.text()), (switch.__name__, ex.text())
        assert _engine_pids(kernel) == pids
    assert _under_debugger(kernel) == []


def test_force_and_shutdown_with_the_debugger_on_leave_nothing(kernel, debugger):
    before = _engine_pids(kernel)
    ex = kernel.execute(INIT + " --force", timeout=90)
    assert ex.status == "ok", ex.text()
    assert set(_engine_pids(kernel)).isdisjoint(before)
    assert _under_debugger(kernel) == []
    ex = kernel.execute("%pg_shutdown")
    assert ex.status == "ok", ex.text()
    assert _nothing_left(kernel) == ([], [])
    debugger.stop()
