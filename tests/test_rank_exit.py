"""A rank's cell that exits or spawns: ``sys.exit()`` / ``exit()`` / ``quit()`` end it in one line naming the
call and the engine lives on; a spawned child's own error reaches the cell, and the child ends with the world.

Tutorials written for ``torchrun`` exit when they find fewer GPUs than they want; IPython would show
its ``To exit: use 'exit', 'quit', or Ctrl-D.`` warning with an absolute path and a ``SystemExit``
traceback, and ``exit()`` would do nothing at all on an engine.
"""

from __future__ import annotations

import re

import pytest
from conftest import alive, pg

from pgnb.core.sandbox import dispatch_of

pytestmark = pytest.mark.integration

ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")


@pytest.fixture(scope="module")
def world(world4):
    return world4


def _pids(world) -> list[int]:
    return [info.pid for info in dispatch_of(world).rank_infos]


@pytest.mark.parametrize(("call", "said"), [
    ("sys.exit(0)", "sys.exit(0)"),
    ("exit()", "exit()"),
    ("quit(3)", "quit(3)"),
])
def test_an_exit_on_a_rank_ends_its_cell_in_one_line_and_the_engine_lives_on(ip, world, call, said):
    pids = _pids(world)
    cap, err = pg(ip, "", f"import sys\nprint('before', rank)\nif rank == 2:\n    {call}\nprint('after', rank)\n")
    assert str(err) == f"rank 2 called {said}"
    assert cap.stdout == "".join(f"[rank {r}]\nbefore {r}\n" + ("" if r == 2 else f"after {r}\n") for r in range(4))
    assert cap.stderr == ""  # no traceback, no IPython warning: the one line is the UsageError's
    assert not ABSOLUTE_PATH.search(cap.stdout + cap.stderr + str(err))
    cap, err = pg(ip, "", "print(rank)")
    assert err is None and cap.stdout == "".join(f"[rank {r}]\n{r}\n" for r in range(4))
    assert _pids(world) == pids  # the same engines: none exited


def test_every_rank_exiting_is_said_once_for_all_of_them(world):
    result = world.execute("import sys\nsys.exit()")
    assert str(result.error()) == "ranks 0-3 called sys.exit()"
    assert result.text() == ""
    assert [r.state for r in world.execute("x = 1").ranks] == ["finished"] * 4


# ---- processes a cell spawns ------------------------------------------------------------------------
SPAWN = """
import torch.multiprocessing as mp

def demo_basic(r):
    print("child", r)

mp.spawn(demo_basic, nprocs=2)
"""
#: how __main__ reads varies: "(built-in)" up to Python 3.12, "(<class '_frozen_importlib.BuiltinImporter'>)" after
MISSING = re.compile(r"\nAttributeError: Can't get attribute 'demo_basic' on <module '__main__' \(.+\)>\n")


def test_a_spawned_childs_own_error_and_the_hint_reach_the_cell(world):
    import psutil

    engine = psutil.Process(dispatch_of(world).rank_infos[0].pid)
    result = world.execute(SPAWN, ranks=[0], timeout=120)
    row = result.ranks[0]
    assert str(result.error()).startswith("rank 0 raised ProcessExitedException: process "), result.error()
    # before pgnb's text, only torch's own line for a child it stopped, when the other one failed first
    before, found, _ = row.stderr.partition("a process spawned by the cell failed:\nTraceback (most recent call last):")
    assert found, row.stderr
    assert all("Terminating process" in line for line in before.splitlines()), row.stderr
    missing = MISSING.findall(row.stderr)
    assert len(missing) == 1, row.stderr  # both children failed alike: said once
    assert f"{missing[0]}hint: 'demo_basic' was defined in a cell" in row.stderr, row.stderr
    assert not ABSOLUTE_PATH.search(row.stderr), row.stderr
    left = [c.cmdline() for c in engine.children() if alive([c.pid])]
    assert all("resource_tracker" in " ".join(c) for c in left), left  # multiprocessing's one helper stays
    assert [r.state for r in world.execute("x = 1").ranks] == ["finished"] * 4


def test_a_process_a_cell_spawned_is_stopped_with_its_world(make_world):
    sb = make_world(backend="gloo", world=1)
    result = sb.execute("import multiprocessing, time\n"
                        "child = multiprocessing.get_context('spawn').Process(target=time.sleep, args=(60,))\n"
                        "child.start()\nchild.pid")
    assert result.error() is None, result.text()
    assert result.ranks[0].value in sb.pids  # it carries the world's owner token: shutdown stops it (conftest)
