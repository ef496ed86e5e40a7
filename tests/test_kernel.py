"""%pg_init and friends in a real Jupyter kernel, seen as nbval and JupyterLab see them."""

from __future__ import annotations

import json
import re

import pytest
from conftest import alive, wait_gone
from kernel_util import Kernel

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

PIDS = "import pgnb, json; print(json.dumps(pgnb.current().pids))"


@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.shutdown()


def _pids(k):
    ex = k.execute(PIDS)
    return json.loads(ex.outputs[0]["text"])


def test_notebook_session(kernel):
    assert kernel.execute("%load_ext pgnb").status == "ok"
    ex = kernel.execute("%pg_init --backend gloo --world 4")
    assert ex.status == "ok", ex.text()
    widget, report = ex.outputs
    assert "application/vnd.jupyter.widget-view+json" in widget["data"]
    assert widget["data"]["text/plain"] == (
        "pgnb world: backend gloo, world 4, init env:// (live view; the outcome follows)")
    assert re.findall(r"^(\d)\s+4\s+gloo\s+cpu\s+initialized$", report["data"]["text/plain"], re.M) == list("0123")
    # the view changed while the cell ran: widget state updates went out as comm messages
    updates = [json.dumps(m.get("data", {})) for m in ex.comm_msgs]
    assert any("pending" in u for u in updates) and any("initialized" in u for u in updates)

    ex = kernel.execute(
        "import pgnb\n"
        "def facts():\n"
        "    import torch.distributed as dist\n"
        "    return (dist.get_rank(), dist.get_world_size(), dist.get_backend())\n"
        "print(pgnb.current().run(facts))"
    )
    assert ex.outputs[0]["text"].strip() == "[(0, 4, 'gloo'), (1, 4, 'gloo'), (2, 4, 'gloo'), (3, 4, 'gloo')]"

    ex = kernel.execute("%pg_destroy")
    assert ex.status == "ok"
    assert re.findall(r"^\d\s+4\s+gloo\s+cpu\s+(\w+)$", ex.outputs[0]["data"]["text/plain"], re.M) == ["destroyed"] * 4

    ex = kernel.execute("%pg_init --world 2 --init-method tcp")
    assert ex.status == "ok", ex.text()
    assert "init tcp://" in ex.outputs[1]["data"]["text/plain"]
    assert "2/2 initialized" in ex.outputs[1]["data"]["text/plain"]

    ex = kernel.execute("%pg_status")
    assert "2/2 initialized" in ex.outputs[0]["data"]["text/plain"]

    pids = _pids(kernel)
    ex = kernel.execute("%pg_shutdown")
    assert ex.status == "ok"
    assert wait_gone(pids) == []


def test_bad_input_is_one_line_and_leaves_nothing(kernel):
    kernel.execute("%load_ext pgnb")
    for line, words in [
        ("--world 0", "--world must be at least 1"),
        ("--backend bogus", "unknown backend 'bogus'"),
        ("--backend nccl", "nccl"),
        ("--backend mpi", "mpi"),
        ("--init-method udp://x:1", "no rendezvous handler"),
        ("--init-method file:///no/such/dir/store", "does not exist"),
        ("--timeout 0", "--timeout must be a positive number"),
        ("--world two", "--world must be a whole number"),
        ("--bogus-option", "unrecognized arguments"),
    ]:
        ex = kernel.execute(f"%pg_init {line}")
        assert ex.status == "error", line
        assert ex.error["ename"] == "UsageError", line
        assert words in ex.error["evalue"], (line, ex.error["evalue"])
        assert "\n" not in ex.error["evalue"].strip()
        assert ex.error["stderr"].strip() == f"UsageError: {ex.error['evalue']}"  # one line, no traceback
        assert ex.seconds < 5, (line, ex.seconds)
    ex = kernel.execute("import pgnb; print(pgnb.current())")
    assert ex.outputs[0]["text"].strip() == "None"  # nothing was started
    ex = kernel.execute("%%pg\nprint(1)")
    assert ex.error["ename"] == "UsageError" and "run %pg_init first" in ex.error["evalue"]
    # and the next %pg_init works
    assert kernel.execute("%pg_init --world 1").status == "ok"


def test_sigkill_of_the_kernel_leaves_nothing():
    k = Kernel()
    try:
        k.execute("%load_ext pgnb")
        assert k.execute("%pg_init --world 2").status == "ok"
        pids = _pids(k)
        assert len(alive(pids)) == len(pids) >= 6
    finally:
        k.kill()  # SIGKILL, as nbval does
    assert wait_gone(pids, timeout=10) == []
