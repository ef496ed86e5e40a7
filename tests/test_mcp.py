"""``pgnb mcp``: the MCP tools driven by the SDK's own client, in-process and over stdio.

In-process, one world for the module: the tool list, ``pg_init`` world 2, an all_reduce's
per-rank output, a hang that returns at its timeout with both ranks' stacks (and
``pg_stacks`` answering meanwhile), bad input as one-line tool errors with the server still
usable. Over stdio, against the installed ``pgnb mcp`` command, the same session, then
nothing of the world left 10 s after the client closes, or after the server is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client, StdioServerParameters

from pgnb.agent.hosts import OwnWorld
from pgnb.agent.report import HEAD, TAIL
from pgnb.agent.tools import server
from pgnb.procs.processes import process_running

pytestmark = pytest.mark.integration

TOOLS = {"pg_init", "pg_status", "pg_run", "pg_stacks", "pg_shutdown",
         "pg_show", "pg_trace", "pg_cells", "pg_destroy", "pg_restart"}
ALL_REDUCE = "t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nprint(t)"
#: rank 0 sleeps while rank 1 waits for it in all_reduce
HANG = "import time\nif rank == 0:\n    time.sleep(60)\nelse:\n    dist.all_reduce(torch.ones(1))\n"
BAD = [
    ("pg_run", {"code": "print(1)", "ranks": [0, 7]}, "unknown rank 7"),
    ("pg_run", {"code": "def f(:\n  pass"}, "the code does not compile: SyntaxError"),
    ("pg_init", {"world": 0}, "--world must be at least 1"),
    ("pg_init", {"backend": "bogus"}, "unknown backend 'bogus'"),
]
#: seconds the world's processes get to be gone
GONE = 10.0

Session = Callable[[Client], Awaitable[Any]]


def with_client(target: Any, session: Session) -> Any:
    async def go() -> Any:
        async with Client(target) as client:
            return await session(client)

    return anyio.run(go)


def text(result: Any) -> str:
    return str(result.content[0].text)


# ---- what every session checks, in-process and over stdio -------------------------------------


async def check_tools(client: Client) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    assert TOOLS <= names, names


async def check_init_and_all_reduce(client: Client) -> None:
    init = await client.call_tool("pg_init", {"backend": "gloo", "world": 2})
    assert not init.is_error, text(init)
    assert init.structured_content["phase"] == "initialized"
    assert [r["state"] for r in init.structured_content["ranks"]] == ["initialized"] * 2
    run = await client.call_tool("pg_run", {"code": ALL_REDUCE})
    assert not run.is_error and run.structured_content["ok"], text(run)
    assert [r["stdout"] for r in run.structured_content["ranks"]] == ["tensor([3., 3.])\n"] * 2
    assert text(run).index("[rank 0]") < text(run).index("[rank 1]")


async def check_hang(client: Client, restart: bool = True) -> None:
    """A rank-0 sleep against a rank-1 all_reduce, timeout 5: back within 8 s with both stacks; then
    ``restart`` frees the world with pg_restart (else it is left stuck for the session's end to clean up)."""
    stacks: list[Any] = []

    async def look() -> None:  # while the run goes (until its 5 s timeout): until rank 1 is seen in the collective
        for _ in range(6):
            await anyio.sleep(0.6)
            stacks[:] = [await client.call_tool("pg_stacks", {})]
            if stacks[0].structured_content["ranks"][1]["blocked_in"].startswith("all_reduce"):
                return

    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(look)
        run = await client.call_tool("pg_run", {"code": HANG, "timeout": 5})
    took = time.monotonic() - t0
    assert took < 8, f"pg_run took {took:.1f} s"
    assert not run.is_error and run.structured_content["timed_out"], text(run)
    ranks = run.structured_content["ranks"]
    assert [r["state"] for r in ranks] == ["still running"] * 2
    assert any("time.sleep(60)" in f for f in ranks[0]["stack"]), text(run)
    assert ranks[1]["blocked_in"].startswith("all_reduce"), text(run)
    world = run.structured_content["world"]
    assert world["busy"] == [0, 1] and "pg_restart" in world["frees"], text(run)
    assert "pg_restart" in run.structured_content["error"]
    # pg_stacks answered while the run was going
    (during,) = stacks
    assert not during.is_error
    rows = during.structured_content["ranks"]
    assert rows[1]["blocked_in"].startswith("all_reduce") and rows[0]["state"] == "running", text(during)
    # the stuck ranks refuse new code in one line, and pg_restart frees them
    refused = await client.call_tool("pg_run", {"code": "print(1)"})
    assert refused.is_error and "still running" in text(refused) and "pg_restart" in text(refused), text(refused)
    if not restart:
        return
    freed = await client.call_tool("pg_restart", {})
    assert not freed.is_error and freed.structured_content["busy"] == [], text(freed)


async def check_bad_inputs(client: Client) -> None:
    for tool, args, said in BAD:
        t0 = time.monotonic()
        bad = await client.call_tool(tool, args)
        assert bad.is_error, (tool, args, text(bad))
        assert said in text(bad) and len(text(bad).splitlines()) == 1, text(bad)
        assert time.monotonic() - t0 < 5
        after = await client.call_tool("pg_run", {"code": "rank"})
        assert not after.is_error and [r["value"] for r in after.structured_content["ranks"]] == ["0", "1"], \
            text(after)


async def session(client: Client, restart: bool = True) -> dict[str, Any]:
    """Every check in turn, the hang last; the world's state at the end (pg_status)."""
    await check_tools(client)
    await check_init_and_all_reduce(client)
    await check_bad_inputs(client)
    await check_hang(client, restart)
    status = await client.call_tool("pg_status", {})
    assert status.structured_content["phase"] == "initialized", text(status)
    return dict(status.structured_content)


# ---- in-process ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inproc() -> Iterator[Any]:
    host = OwnWorld()
    try:
        yield server(host)
    finally:
        host.close()


def test_in_process_session(inproc: Any) -> None:
    with_client(inproc, session)


def test_long_output_is_cut_and_says_how_much(inproc: Any) -> None:
    async def go(client: Client) -> None:
        run = await client.call_tool("pg_run", {"code": "print('x' * 20000)", "ranks": [1]})
        (rank,) = run.structured_content["ranks"]
        gone = 20001 - HEAD - TAIL
        assert rank["rank"] == 1 and rank["cut"] == gone and len(rank["stdout"]) < 20000
        assert f"[{gone} characters cut]" in text(run)

    with_client(inproc, go)


def test_show_trace_and_cells(inproc: Any) -> None:
    async def go(client: Client) -> None:
        traced = await client.call_tool("pg_run", {"code": ALL_REDUCE, "trace": True})
        assert "all_reduce" in traced.structured_content["trace"], text(traced)
        trace = await client.call_tool("pg_trace", {})
        assert "all_reduce(float32[2], op=SUM)" in text(trace), text(trace)
        shown = await client.call_tool("pg_show", {"name": "t"})
        assert not shown.is_error and "3" in text(shown), text(shown)
        missing = await client.call_tool("pg_show", {"name": "no such"})
        assert missing.is_error and len(text(missing).splitlines()) == 1
        cells = await client.call_tool("pg_cells", {"count": 2})
        assert [c["code"] for c in cells.structured_content["cells"]][-1] == ALL_REDUCE
        # the ranks compile the code as IPython does: a magic is no syntax error
        magic = await client.call_tool("pg_run", {"code": "%time y = rank + 1\ny"})
        assert not magic.is_error and [r["value"] for r in magic.structured_content["ranks"]] == ["1", "2"], \
            text(magic)

    with_client(inproc, go)


# ---- over stdio, the installed command -----------------------------------------------------------


def command(tmp_path: Path) -> StdioServerParameters:
    pgnb = Path(sys.executable).parent / "pgnb"
    assert pgnb.exists(), f"{pgnb}: pgnb is not installed in this venv"
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    return StdioServerParameters(command=str(pgnb), args=["mcp"], env=env)


def the_server() -> psutil.Process:
    (proc,) = [p for p in psutil.Process().children() if p.cmdline()[-1:] == ["mcp"]]
    return proc


def world_of(proc: psutil.Process) -> list[psutil.Process]:
    """The server and every process it started (engines, nannies, zygote, controller, reaper)."""
    return [proc, *proc.children(recursive=True)]


def assert_gone(procs: list[psutil.Process], after: str) -> None:
    deadline = time.monotonic() + GONE
    alive = procs
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if p.is_running() and process_running(p.pid)]  # is_running: not a reused pid
    assert not alive, f"{GONE:g} s after {after}: {[(p.pid, p.name()) for p in alive]}"


def test_stdio_session_then_client_closes(tmp_path: Path) -> None:
    procs: list[psutil.Process] = []

    async def go(client: Client) -> None:
        state = await session(client, restart=False)  # the session ends with ranks stuck in a collective
        procs.extend(world_of(the_server()))
        pids = {p.pid for p in procs}
        assert {r["pid"] for r in state["ranks"]} <= pids  # the ranks are among them
        assert len(procs) >= 5, procs

    with_client(command(tmp_path), go)
    assert_gone(procs, "the client closed")


def test_stdio_server_killed(tmp_path: Path) -> None:
    procs: list[psutil.Process] = []

    async def go(client: Client) -> None:
        init = await client.call_tool("pg_init", {"world": 2})
        assert not init.is_error, text(init)
        proc = the_server()
        procs.extend(world_of(proc))
        proc.send_signal(signal.SIGKILL)

    try:
        with_client(command(tmp_path), go)
    except Exception:  # the session breaks with its server; how it says so is the SDK's business
        pass
    assert len(procs) >= 5, f"the world was not up when the server was killed: {procs}"
    assert_gone(procs, "SIGKILL of the server")
