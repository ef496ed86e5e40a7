"""Every deadline holds whatever a rank does: a rank that holds the GIL cannot hold the kernel up.

A rank in ``ctypes.PyDLL(None).sleep(N)`` holds the GIL: no thread of it runs Python, so it never
answers the live view's stack requests, a status query or a fetch. In a real kernel with the live view
on, each entry point that has a deadline ends within it (+ ``SLACK`` s) and names rank 0; then
``%pg_init ... --force`` restarts the world, the next cell works, and the old engines are gone.
The slow test is the issue's own figure: ``--timeout 30`` against a 90 s sleep.
"""

from __future__ import annotations

import json

import pytest
from conftest import GONE_WITHIN, wait_gone

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

#: Seconds past a deadline an entry point may take to end (the stack request's second, a busy machine).
SLACK = 3.0
#: Seconds rank 0 holds the GIL: past every deadline here (the world is restarted before it ends)
NAP = 9
NOT_ANSWERING = "(no stack for rank 0: it did not answer within 1 s; it holds the GIL or is in native code)"
INIT = "%pg_init --backend gloo --world 2 --force"

HOLD = "import ctypes\nif rank == 0:\n    ctypes.PyDLL(None).sleep({n})\nprint('done', rank)\n"
#: rank 0's cell ends at once, and a thread of it then holds the GIL (as a C extension's worker might)
HOLD_LATER = ("import ctypes, threading, time\nx = rank\nif rank == 0:\n    threading.Thread(\n"
              "        target=lambda: (time.sleep(0.3), ctypes.PyDLL(None).sleep({n})), daemon=True).start()\n")
SETUP = """
import pgnb, pgnb.core.live, pgnb.core.show
sb = pgnb.current()
SAMPLING = pgnb.core.live.SAMPLE_AFTER, pgnb.core.live.SAMPLE_EVERY
pgnb.core.show.SHOW_TIMEOUT = 2.0
# the live view asks a long cell's ranks for their stacks ten times a second (it asks every second after
# 2 s): a rank's socket queue (10 datagrams) would be full within the 2 s deadline, as after 12 s it is
pgnb.core.live.SAMPLE_AFTER, pgnb.core.live.SAMPLE_EVERY = 0.2, 0.1

def fill_queue_later(after=1.0):
    # in ``after`` s (rank 0 then holds the GIL), fill rank 0's stack socket queue, as the live view left
    # it after some 20 s of asking every 2 s: a blocking send would then block the kernel
    import socket, threading
    from pgnb._wire import stack_socket
    from pgnb.core.sandbox import dispatch_of

    d = dispatch_of(sb)
    address = stack_socket(d.scratch_dir, d.rank_infos[0].pid)

    def fill():
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            try:
                while True:
                    s.sendto(b"?", address)
            except OSError:
                pass

    threading.Timer(after, fill).start()

def nap(seconds):
    import ctypes, torch.distributed as dist
    if dist.get_rank() == 0:
        ctypes.PyDLL(None).sleep(seconds)
    return dist.get_rank()

"""

RUNNING = "rank 0 still running after the 2 s --timeout; rank 1 finished"
#: entry point -> (a cell run first, if any; the call with a deadline; its deadline; what its output says)
FILL = "fill_queue_later()"
CASES = {
    "%%pg --timeout": (FILL, "%%pg --timeout 2\n" + HOLD.format(n=NAP), 2.0, [RUNNING, NOT_ANSWERING]),
    "%%pg --trace": (FILL, "%%pg --trace --timeout 2\n" + HOLD.format(n=NAP), 2.0, [RUNNING, NOT_ANSWERING]),
    "Sandbox.run": (None, f"try:\n    sb.run(nap, {NAP}, timeout=2)\nexcept Exception as e:\n    print(repr(e))", 2.0,
                    ["CellTimeout('rank 0 still running after 2 s"]),
    "%pg_status": ("%%pg\n" + HOLD_LATER.format(n=NAP), "%pg_status", 5.0, ["did not answer within 5 s"]),
    "%pg_show": ("%%pg\n" + HOLD_LATER.format(n=NAP), "%pg_show x", 2.0, ["rank 0 still running after 2 s"]),
}


@pytest.fixture(scope="module")
def kernel(kernel2):
    assert kernel2.execute(SETUP).status == "ok"
    return kernel2


def _pids(kernel) -> list[int]:
    ex = kernel.execute("import json\nprint(json.dumps(pgnb.current().pids))")
    return json.loads("".join(o["text"] for o in ex.outputs if o.get("name") == "stdout"))


@pytest.mark.parametrize("entry", list(CASES))
def test_a_rank_holding_the_gil_does_not_hold_up_the_deadline(kernel, entry):
    _check(kernel, *CASES[entry], entry=entry)


LONG = HOLD.format(n=90)
#: the issue's figure: world 2, the live view as it is (not sampled faster), 90 s in native code against 30 s
LONG_CASES = {
    "%%pg --timeout": ("%%pg --timeout 30\n" + LONG,
                       ["rank 0 still running after the 30 s --timeout; rank 1 finished", NOT_ANSWERING]),
    "Sandbox.execute": (f"r = sb.execute({LONG!r}, timeout=30, on_output=lambda *a: None)\n"
                        "print(r.text(), r.error(), sep='')",
                        ["rank 0 still running after the 30 s --timeout; rank 1 finished", NOT_ANSWERING]),
    "Sandbox.run": ("try:\n    sb.run(nap, 90, timeout=30)\nexcept Exception as e:\n    print(repr(e))",
                    ["CellTimeout('rank 0 still running after 30 s"]),
}


@pytest.mark.slow
def test_a_30_s_deadline_holds_against_90_s_in_native_code(kernel):
    assert kernel.execute("pgnb.core.live.SAMPLE_AFTER, pgnb.core.live.SAMPLE_EVERY = SAMPLING").status == "ok"
    try:
        for entry, (call, said) in LONG_CASES.items():
            _check(kernel, None, call, 30.0, said, entry=entry)
    finally:
        kernel.execute("pgnb.core.live.SAMPLE_AFTER, pgnb.core.live.SAMPLE_EVERY = 0.2, 0.1")


def _check(kernel, before, call, deadline, said, entry):
    """``call`` ends within ``deadline + SLACK`` s saying ``said``; then a forced restart and a cell that works."""
    if before is not None:
        assert kernel.execute(before).status == "ok"
        if before.startswith("%%pg"):
            assert kernel.execute("import time; time.sleep(0.6)").status == "ok"  # the thread now holds the GIL
    ex = kernel.execute(call, timeout=deadline + 120)
    text = ex.text() + (ex.error or {}).get("evalue", "")
    print(f"{entry}: ended after {ex.seconds:.1f} s against a {deadline:g} s deadline")
    assert ex.seconds < deadline + SLACK, (entry, ex.seconds, text)
    for line in said:
        assert line in text, (entry, text)
    pids = _pids(kernel)
    assert kernel.execute(INIT).status == "ok"
    kept = set(_pids(kernel))  # what the restart kept (the controller): the rest, rank 0's engine too, is gone
    assert wait_gone([p for p in pids if p not in kept], GONE_WITHIN) == []
    ex = kernel.execute("%%pg\nprint('next', rank)")
    assert ex.status == "ok" and "[rank 0]\nnext 0\n[rank 1]\nnext 1\n" in ex.text(), ex.text()
