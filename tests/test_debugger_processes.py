"""pgnb's processes with JupyterLab's debugger on: a real kernel, its debugger switched on and off as Lab 4 does it.

Lab's bug button sends ``debug_request``s on the kernel's control channel: ``initialize``, ``attach``,
``debugInfo``, ``configurationDone`` (on), ``disconnect`` (off). From the first ``attach`` on,
ipykernel's debugpy rewrites every Python child the kernel starts so that it waits for a debug
client Lab never gives it; pgnb's controller, zygote, engines and reaper must start as if it did not.
"""

from __future__ import annotations

import itertools
import re
import time

import psutil
import pytest
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
#: Lab's own initialize arguments (packages/debugger, DebuggerSession.start)
INITIALIZE = {"clientID": "jupyterlab", "clientName": "JupyterLab", "adapterID": "python", "pathFormat": "path",
              "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True,
              "supportsVariablePaging": True, "supportsRunInTerminalRequest": True, "locale": "en"}


class Debugger:
    """The kernel's debugger, switched on and off through ``debug_request``s, as JupyterLab's bug button does."""

    def __init__(self, kernel: MarkedKernel) -> None:
        self.kernel = kernel
        self.seq = itertools.count(1)

    def request(self, command: str, arguments: dict | None = None, timeout: float = 30) -> dict:
        kc = self.kernel.kc
        msg = kc.session.msg("debug_request", {"type": "request", "seq": next(self.seq), "command": command,
                                               "arguments": arguments or {}})
        kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = kc.get_control_msg(timeout=max(deadline - time.monotonic(), 0.1))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                content = reply["content"]
                assert content.get("success"), content
                return content

    def on(self) -> None:
        self.request("initialize", INITIALIZE)
        self.request("attach")
        self.request("debugInfo")
        self.request("configurationDone")

    def off(self) -> None:
        self.request("disconnect", {"restart": False, "terminateDebuggee": False})


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
    return Debugger(kernel)


def test_world_starts_with_the_debugger_on_as_fast_as_off(kernel, debugger):
    off = kernel.execute(INIT)
    assert off.status == "ok", off.text()
    assert kernel.execute("%pg_shutdown").status == "ok"
    assert _nothing_left(kernel) == ([], [])

    debugger.on()
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
    for switch in (debugger.off, debugger.on, debugger.off, debugger.on):
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
    debugger.off()
