"""%%pg in a real Jupyter kernel (jupyter_client), seen as nbval and nbclient see it.

One kernel and one 4-rank gloo world for the whole module; the hang test
restarts the world with the exact ``%pg_init ... --force`` line it was told.
"""

from __future__ import annotations

import re
import time

import pytest
from kernel_util import Execution

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ALL_REDUCE = "%%pg\nt = torch.ones(2) * dist.get_rank(); dist.all_reduce(t); print(t)"
EXPECTED = "".join(f"[rank {r}]\ntensor([6., 6.])\n" for r in range(4))


@pytest.fixture(scope="module")
def kernel(kernel4):
    """The module's kernel with a world of 4 (conftest; nothing it started is left after the module)."""
    return kernel4


def streams(ex: Execution, name: str) -> str:
    return ANSI.sub("", "".join(o["text"] for o in ex.outputs if o.get("name") == name))


def kept(ex: Execution) -> list:
    """The outputs as nbval compares them (a widget's model id differs every run; nbval skips it)."""
    return [{**o, "data": {k: v for k, v in o["data"].items() if k != "application/vnd.jupyter.widget-view+json"}}
            if "data" in o else o for o in ex.outputs]


def test_all_reduce_in_rank_order_identical_every_run(kernel):
    runs = [kernel.execute(ALL_REDUCE) for _ in range(10)]
    assert {ex.status for ex in runs} == {"ok"}
    # a live view drawn (a cell slower than a tenth of a second) is the widget alone, which nbval skips
    assert [o for o in kept(runs[0]) if o.get("data") != {}] == [{"type": "stream", "name": "stdout", "text": EXPECTED}]
    assert all([o for o in kept(ex) if o.get("data") != {}] == kept(runs[0])[-1:] for ex in runs)


def test_error_on_rank_2_names_it_and_keeps_the_others_output(kernel):
    ex = kernel.execute("%%pg\nprint('rank', rank, 'here')\nif rank == 2:\n    raise ValueError('bad shard')\n"
                        "print('rank', rank, 'done')")
    assert ex.status == "error"
    assert ex.error["ename"] == "UsageError"
    assert ex.error["evalue"] == "rank 2 raised ValueError: bad shard"
    out, err = streams(ex, "stdout"), streams(ex, "stderr")
    for r in (0, 1, 3):
        assert f"[rank {r}]\nrank {r} here\nrank {r} done\n" in out
    assert "[rank 2]\nrank 2 here\n" in out and "rank 2 done" not in out
    assert "Traceback (most recent call last):\n  Cell, line 3, in <module>\n    raise ValueError('bad shard')\n" in err
    assert err.count("ValueError: bad shard") == 2  # the rank's traceback, then the one-line error
    assert err.rstrip().endswith("UsageError: rank 2 raised ValueError: bad shard")
    # the one line comes after every rank's output
    assert [o.get("name") for o in ex.outputs][-1] == "stderr"


def test_values_reach_the_notebook(kernel):
    assert kernel.execute("%%pg --out doubled\nrank * 2").status == "ok"
    ex = kernel.execute("assert _pg == doubled == [0, 2, 4, 6], _pg\nx = 5")
    assert ex.status == "ok", ex.text()
    ex = kernel.execute("%%pg --push x --ranks 3\nx + rank")
    assert ex.status == "ok" and streams(ex, "stdout") == "[rank 3]\nOut[rank 3]: 8\n"
    assert kernel.execute("assert _pg == [None, None, None, 8], _pg").status == "ok"


def test_interrupt_stops_the_ranks_then_the_next_cell_runs(kernel):
    msg_id = kernel.kc.execute("%%pg\nimport time\ntime.sleep(60)")
    time.sleep(2.0)
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    ex = kernel.collect(msg_id)
    assert time.monotonic() - t0 < 5
    assert ex.status == "error" and ex.error["ename"] == "UsageError"
    assert ex.error["evalue"] == "interrupted: ranks 0-3 stopped"
    assert "[rank 0] interrupted\n" in streams(ex, "stdout")
    ex = kernel.execute(ALL_REDUCE)  # no stale TaskAborted or KeyboardInterrupt
    assert ex.status == "ok" and streams(ex, "stdout") == EXPECTED


def test_hang_with_timeout_then_the_same_init_gives_a_working_world(kernel):
    ex = kernel.execute("%%pg --ranks 0 --timeout 3\nt = torch.ones(2)\ndist.all_reduce(t)")
    assert ex.seconds < 5, ex.seconds
    assert ex.status == "error" and ex.error["ename"] == "UsageError"
    msg = ex.error["evalue"]
    assert msg.startswith("rank 0 still running after the 3 s --timeout, blocked in all_reduce (distributed_c10d.py);")
    recover = re.search(r"run `(%pg_init [^`]+)` to replace rank 0 in place \(the other ranks keep their state\)$",
                        msg)[1]
    assert recover == "%pg_init --backend gloo --world 4"
    assert streams(ex, "stdout").startswith("[rank 0] still running\n")
    stack = streams(ex, "stderr")
    assert "rank 0 is blocked here (most recent call last):\n  Cell, line 2\n    dist.all_reduce(t)\n" in stack
    assert "\n  torch/distributed/distributed_c10d.py, in all_reduce\n" in stack  # no torch line numbers
    ex = kernel.execute(recover)
    assert ex.status == "ok", ex.text()
    ex = kernel.execute(ALL_REDUCE)
    assert ex.status == "ok" and streams(ex, "stdout") == EXPECTED
