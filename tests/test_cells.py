"""%%pg and Sandbox.execute / push / pull on the shared 4-rank gloo world (real engines).

Every behaviour goes through the API (``Sandbox.execute``) and, where the
magic adds something (rendering, ``_pg``, ``--push``, ``--out``, UsageErrors),
through ``%%pg`` in an in-process IPython shell too.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import threading
import time

import pytest
from conftest import pg
from IPython.core.error import UsageError

import pgnb
from pgnb import CellInterrupted, RankValue
from pgnb.core.busy import SETTLE
from pgnb.core.cells import CellOptions
from pgnb.core.sandbox import dispatch_of
from pgnb.core.stacks import trim_stack
from pgnb.spec import init_command

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ALL_REDUCE = "t = torch.ones(2) * dist.get_rank(); dist.all_reduce(t); print(t)"
STUCK = "t = torch.ones(2)\ndist.all_reduce(t)\n"


def plain(text: str) -> str:
    return ANSI.sub("", text)


@pytest.fixture(scope="module")
def world(world4):
    """The shared world of 4 (conftest; its teardown checks that no stack file is left); it drives ``ip`` too."""
    return world4


# ---- output, in rank order ------------------------------------------------
def test_all_reduce_prints_in_rank_order_the_same_every_run(world):
    texts = {world.execute(ALL_REDUCE).text() for _ in range(10)}
    assert texts == {"".join(f"[rank {r}]\ntensor([6., 6.])\n" for r in range(4))}


def test_output_waits_for_the_slowest_rank_and_keeps_rank_order(world):
    # rank 3 prints first, rank 0 last: the result is still in rank order
    res = world.execute("import time, sys\ntime.sleep(0.05 * (3 - rank))\nprint('out', rank)\n"
                        "print('err', rank, file=sys.stderr)\nrank * 10")
    assert res.error() is None
    pieces = res.pieces()
    assert pieces[0] == ("stdout", "[rank 0]\nout 0\n") and pieces[-1] == ("stdout", "Out[rank 3]: 30\n")
    for r in range(4):  # stdout and stderr alternate, each rank's in its place
        assert ("stderr", f"err {r}\n") == pieces[2 * r + 1]
    assert res.text() == "".join(f"[rank {r}]\nout {r}\nerr {r}\nOut[rank {r}]: {r * 10}\n" for r in range(4))
    assert res.values == [0, 10, 20, 30]


def test_magic_output_and_values(ip):
    cap, err = pg(ip, "", "print('hi from', rank)\ntorch.ones(1) * rank")
    assert err is None
    assert cap.stdout == "".join(f"[rank {r}]\nhi from {r}\nOut[rank {r}]: tensor([{r}.])\n" for r in range(4))
    assert [v.tolist() for v in ip.user_ns["_pg"]] == [[0.0], [1.0], [2.0], [3.0]]
    cap, err = pg(ip, "--ranks 1,3 --out picked", "rank + 100")
    assert err is None and cap.stdout == "[rank 1]\nOut[rank 1]: 101\n[rank 3]\nOut[rank 3]: 103\n"
    assert ip.user_ns["picked"] == ip.user_ns["_pg"] == [None, 101, None, 103]


def test_values_that_cannot_travel_stay_on_the_ranks(ip):
    cap, err = pg(ip, "--ranks 0", "class Local:\n    def __repr__(self):\n        return 'Local()'\nLocal()")
    assert err is None
    v = ip.user_ns["_pg"][0]
    assert isinstance(v, RankValue) and repr(v) == "Local()" and "unpickled" in v.reason
    cap, err = pg(ip, "--ranks 0", "lambda: 1")
    v = ip.user_ns["_pg"][0]
    assert isinstance(v, RankValue) and "pickled" in v.reason


def test_rich_display_comes_back_under_its_rank(ip):
    cap, err = pg(ip, "--ranks 0-1", "from IPython.display import HTML, display\ndisplay(HTML(f'<b>{rank}</b>'))")
    assert err is None
    assert [o.data.get("text/html") for o in cap.outputs] == ["<b>0</b>", "<b>1</b>"]
    assert cap.stdout == "[rank 0]\n[rank 1]\n"


# ---- failures -------------------------------------------------------------
def test_error_on_one_rank_names_it_with_its_traceback(world, ip):
    cell = "print('before', rank)\nif rank == 2:\n    raise RuntimeError('only rank 2')\nprint('after', rank)"
    res = world.run_cell(cell, CellOptions(label=7))
    err = res.error()
    assert isinstance(err, pgnb.RankError) and err.failed_ranks == [2]
    assert str(err) == "rank 2 raised RuntimeError: only rank 2"
    text = plain(res.text())
    for r in (0, 1, 3):
        assert f"[rank {r}]\nbefore {r}\nafter {r}\n" in text
    rank2 = text.split("[rank 2]\n", 1)[1].split("[rank 3]", 1)[0]
    assert rank2.startswith("before 2\n")
    # trimmed to the user's code, and the same text whatever the cell number, machine or install
    assert rank2 == ("before 2\nTraceback (most recent call last):\n  Cell, line 3, in <module>\n"
                     "    raise RuntimeError('only rank 2')\nRuntimeError: only rank 2\n")
    assert "RuntimeError: only rank 2" in rank2
    assert "ipyparallel" not in rank2 and "pgnb/rank" not in rank2  # trimmed to the user's code
    # the magic: ranks' output first, then one plain line
    cap, uerr = pg(ip, "", cell)
    assert type(uerr) is UsageError and str(uerr) == "rank 2 raised RuntimeError: only rank 2"
    assert "before 0\nafter 0\n" in cap.stdout and "after 3\n" in cap.stdout
    assert "RuntimeError: only rank 2" in plain(cap.stderr)
    # nothing was aborted behind the error: the very next cell runs everywhere
    assert world.execute("rank").values == [0, 1, 2, 3]


def test_value_of_sends_a_name_back_as_the_value_and_displays_nothing(world):
    """What the pytest plugin's cells use: each rank's value of the name, taken out of its namespace."""
    res = world.run_cell("_reply = {'rank': rank, 'twice': [rank] * 2}", CellOptions(value_of="_reply"))
    assert [out.value for out in res.ranks] == [{"rank": r, "twice": [r, r]} for r in range(4)]
    assert all(out.result is None for out in res.ranks)  # no execute_result: nothing was displayed
    assert [out.ename for out in world.execute("_reply").ranks] == ["NameError"] * 4
    failed = world.run_cell("_reply = 1 / (rank - 2)", CellOptions(value_of="_reply"))  # rank 2 raises
    assert [out.state for out in failed.ranks] == ["finished", "finished", "failed", "finished"]
    assert [out.value for out in failed.ranks] == [-0.5, -1.0, None, 1.0]


def test_syntax_error_is_reported_once(world):
    res = world.execute("def broken(:\n    pass\n")
    assert str(res.error()) == "SyntaxError: invalid syntax (line 1); the cell did not run on any rank"
    text = plain(res.text())
    assert text.count("SyntaxError") == 1 and text.startswith("[ranks 0-3]\n")


def test_bad_arguments_are_one_line_usage_errors(ip):
    for line, words in [("--ranks 7", "names rank 7"), ("--ranks x", "not a rank"), ("--timeout 0", "positive"),
                        ("--push no_such_var", "no variable 'no_such_var'"), ("--push 'a b'", "not a variable"),
                        ("--out 1x", "not a variable"), ("--out a,b", "one variable")]:
        cap, err = pg(ip, line, "print(1)")
        assert type(err) is UsageError and words in str(err) and "\n" not in str(err), (line, err)
        assert cap.stdout == ""


def test_pg_before_init_says_run_pg_init(ip):
    from pgnb.notebook.current import current, set_current

    saved = current()
    set_current(None)
    try:
        cap, err = pg(ip, "", "print(1)")
    finally:
        set_current(saved)
    assert type(err) is UsageError and "run %pg_init first" in str(err)


# ---- moving data ------------------------------------------------------------
def test_push_and_pull_in_rank_order(world, ip):
    import torch

    world.push(scale=3, base=torch.arange(2.0))
    world.execute("mine = base * scale + rank")
    assert [t.tolist() for t in world.pull("mine")] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    world.push({"ranks": "shadow"}, ranks=[1])  # a name that clashes with the keyword, via a dict
    assert world.pull("ranks", ranks=[1]) == ["shadow"]
    with pytest.raises(pgnb.RankError, match=r"rank 0: NameError: name 'nowhere' is not defined on this rank"):
        world.pull("nowhere", ranks=[0])
    with pytest.raises(pgnb.SpecError, match="identifier"):
        world.push({"not a name": 1})
    # the magic pushes notebook variables first
    ip.user_ns.update(lr=0.5, steps=4)
    cap, err = pg(ip, "--push lr,steps", "lr * steps + rank")
    assert err is None and ip.user_ns["_pg"] == [2.0, 3.0, 4.0, 5.0]


# ---- hangs and interrupts -----------------------------------------------------
def test_timeout_names_the_stuck_rank_and_where_it_is_blocked(world, ip):
    t0 = time.monotonic()
    cap, err = pg(ip, "--ranks 0 --timeout 3", STUCK)
    took = time.monotonic() - t0
    assert took < 5, took
    assert type(err) is UsageError and "\n" not in str(err)
    msg = str(err)
    assert msg.startswith("rank 0 still running after the 3 s --timeout, blocked in all_reduce (distributed_c10d.py);")
    assert msg.endswith("run `%pg_init --backend gloo --world 4` to replace rank 0 in place "
                        "(the other ranks keep their state)")
    assert cap.stdout.startswith("[rank 0] still running\n")
    stack = cap.stderr
    assert stack.startswith("rank 0 is blocked here (most recent call last):\n  Cell, line 2\n    dist.all_reduce(t)\n")
    assert "\n  torch/distributed/distributed_c10d.py, in all_reduce\n" in stack  # no torch line numbers
    assert not re.search(r"line \d|\.py:\d", stack.split("dist.all_reduce(t)\n", 1)[1])
    assert "ipykernel" not in stack and "ipyparallel" not in stack
    # the stuck rank is refused at once, not queued behind its collective
    t0 = time.monotonic()
    with pytest.raises(pgnb.CellTimeout, match=r"rank 0 still running cell In \[\d+\], blocked in all_reduce"):
        world.execute("1", ranks=[0])
    with pytest.raises(pgnb.CellTimeout):
        world.push(x=1)
    assert time.monotonic() - t0 < 2 * (SETTLE + 0.5)  # a short wait for a reply on its way
    # the other ranks can join the collective: rank 0 is released and the world goes on
    joined = world.execute(STUCK + "t.tolist()", ranks=[1, 2, 3])
    assert joined.values == [None, [4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            assert world.execute("rank").values == [0, 1, 2, 3]
            break
        except pgnb.CellTimeout:
            time.sleep(0.05)
    else:
        pytest.fail("rank 0 was not released")
    assert world.execute(ALL_REDUCE).error() is None


def _interrupt_soon(delay: float) -> threading.Timer:
    # a shell starts a background job (`make test &`) with SIGINT ignored: be the terminal's Ctrl-C again
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_interrupt_stops_the_ranks_and_leaves_no_stale_abort(world):
    _interrupt_soon(1.0)
    t0 = time.monotonic()
    with pytest.raises(CellInterrupted) as info:
        world.execute("import time\nprint('sleeping', rank)\ntime.sleep(60)")
    assert time.monotonic() - t0 < 5
    res = info.value.result
    assert str(res.error()) == "interrupted: ranks 0-3 stopped"
    text = plain(res.text())
    assert "[rank 0] interrupted\nsleeping 0\n" in text and "KeyboardInterrupt" in text
    for _ in range(3):  # no TaskAborted, no KeyboardInterrupt left over
        res = world.execute("rank")
        assert res.error() is None and res.values == [0, 1, 2, 3]


def test_interrupt_reports_a_rank_blocked_in_a_collective(world):
    _interrupt_soon(1.0)
    with pytest.raises(CellInterrupted) as info:
        world.execute(STUCK, ranks=[0])
    res = info.value.result
    err = res.error()
    assert isinstance(err, pgnb.CellTimeout)
    assert str(err).startswith("interrupted; rank 0 could not be interrupted, blocked in all_reduce")
    assert str(err).endswith("run `%pg_init --backend gloo --world 4` to replace rank 0 in place "
                             "(the other ranks keep their state)")
    assert "rank 0 is blocked here" in res.text()
    # release it: the pending SIGINT lands in rank 0's old cell, never in a new one
    world.execute(STUCK, ranks=[1, 2, 3])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            res = world.execute("rank")
            break
        except pgnb.CellTimeout:
            time.sleep(0.05)
    assert res.error() is None and res.values == [0, 1, 2, 3]


# ---- pure parts ---------------------------------------------------------------
def test_stack_files_are_private(world):
    d = dispatch_of(world).scratch_dir
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    files = os.listdir(d)
    assert files and all(stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o600 for f in files)


THREAD_CHURN = """
import threading, time
end, n = time.monotonic() + 4, 0
while time.monotonic() < end:
    ts = [threading.Thread(target=sum, args=(range(200),)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    n += 1
print("churned", n > 0)
"""


def test_stack_samples_do_not_crash_a_rank_whose_threads_come_and_go(world):
    """The live view samples a long cell's stack every second; a cell starting threads must survive it.

    Dumping every thread from the signal handler crashed such a rank (SIGSEGV inside faulthandler);
    only the cell's thread is dumped now, and the kernel signals that thread. Sampled here every 20 ms.
    """
    from pgnb.core.stacks import dump_stacks

    done: dict[str, pgnb.CellResult] = {}
    runner = threading.Thread(target=lambda: done.setdefault("r", world.execute(THREAD_CHURN, timeout=60)))
    runner.start()
    time.sleep(0.5)
    wheres: set[str] = set()
    samples = 0
    ranks = dispatch_of(world)
    while runner.is_alive():
        stacks = dump_stacks(dict(enumerate(ranks.rank_infos)), ranks.scratch_dir, THREAD_CHURN)
        wheres |= {s.blocked_in for s in stacks.values() if s.blocked_in}
        samples += 1
        time.sleep(0.02)
    runner.join()
    result = done["r"]
    assert samples > 20, samples
    assert [(r.state, r.stdout) for r in result.ranks] == [("finished", "churned True\n")] * 4, result.ranks
    assert wheres, "no sample showed the cell's own frames"  # the dumps are of the thread running the cell
    assert world.status() and {r.state for r in world.status()} == {"initialized"}


def test_init_command_repeats_the_options():
    spec = pgnb.WorldSpec.validate(world=4)
    assert init_command(spec) == "%pg_init --backend gloo --world 4 --force"
    spec = pgnb.WorldSpec.validate(world=2, init_method="tcp", timeout=30, group_name="my group",
                                   launcher="local", threads=1, debug="info", delay_ranks="1:2.5")
    assert init_command(spec) == ("%pg_init --backend gloo --world 2 --init-method tcp --timeout 30 "
                                  "--group-name 'my group' --launcher local --threads 1 --debug info "
                                  "--delay-rank 1:2.5 --force")


def test_trim_stack_keeps_the_cell_and_what_it_called():
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 10 in all_reduce\n'
        '  File "/tmp/ipykernel_1/22.py", line 3 in helper\n'
        '  File "/tmp/ipykernel_1/11.py", line 2 in <module>\n'
        '  File "/v/lib/python3.11/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code\n'
        '  File "/v/lib/python3.11/site-packages/ipykernel/zmqshell.py", line 686 in run_cell\n'
    )
    lines, where = trim_stack(dump, "x = 1\nhelper()\n")
    assert lines == ["  Cell, line 2", "    helper()", "  Earlier cell, line 3, in helper",
                     "  torch/distributed/distributed_c10d.py, in all_reduce"]
    assert where == "all_reduce (distributed_c10d.py)"
    assert trim_stack("Thread 0x1 (most recent call first):\n  File \"/a.py\", line 1 in f\n") == ([], "")
    # a rank whose cell has raised, while IPython formats the error, is not in the cell's code
    ending = (
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/v/lib/python3.11/site-packages/asttokens/line_numbers.py", line 42 in from_utf8_col\n'
        '  File "/v/lib/python3.11/site-packages/IPython/core/interactiveshell.py", line 2200 in showtraceback\n'
        '  File "/v/lib/python3.11/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code\n'
    )
    assert trim_stack(ending) == ([], "")


def test_the_users_own_files_show_their_line_and_source(tmp_path):
    """A hang in the user's own module (a test file, the project under test) names its line and source, in a
    stack and in a traceback; installed libraries keep only file and function."""
    import threading

    mine = tmp_path / "my_training.py"
    mine.write_text("import time\n\n\ndef wait_for_data():\n    time.sleep(3600)\n")
    dump = (
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{threading.__file__}", line 320 in wait\n'  # Python's own: no line
        f'  File "{mine}", line 5 in wait_for_data\n'
        '  File "/tmp/ipykernel_1/11.py", line 2 in <module>\n'
        '  File "/v/lib/python3.11/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code\n'
    )
    lines, _ = trim_stack(dump, "import my_training\nmy_training.wait_for_data()\n")
    assert lines[2:] == ["  my_training.py, line 5, in wait_for_data", "    time.sleep(3600)",
                         "  threading.py, in wait"], lines

    import sys

    from pgnb.rank.cell import plain_traceback

    sys.path.insert(0, str(tmp_path))
    try:
        mine.write_text("def broken():\n    raise ValueError('no data')\n")
        import importlib

        module = importlib.import_module("my_training")
        try:
            module.broken()
        except ValueError as e:
            text = plain_traceback(e, None)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_training", None)
    assert text[-3:] == ["  my_training.py, line 2, in broken", "    raise ValueError('no data')",
                         "ValueError: no data"], text
