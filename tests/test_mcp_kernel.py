"""``%pg_mcp`` in a real kernel: an MCP client (the SDK's own, over streamable HTTP) on the notebook's world.

One kernel and one world for the module: the reading tools answer while a ``%%pg`` cell
hangs, ``pg_run`` is refused while it runs and works once it has ended, a request without
the token is refused, and nothing listens after ``%pg_mcp --stop`` or ``%pg_shutdown``.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import psutil
import pytest
from conftest import inet_sockets
from kernel_util import Kernel
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

#: rank 0 sleeps, rank 1 waits for it in all_reduce: a hang that ends by itself after HANG s
HANG = 10
HANGING = f"%%pg\nimport time\nif rank == 0:\n    time.sleep({HANG})\ndist.all_reduce(torch.ones(1))\n"


def serve(kernel: Kernel) -> tuple[str, str]:
    """``%pg_mcp`` in the kernel: the URL and token it printed."""
    ex = kernel.execute("%pg_mcp")
    assert ex.status == "ok", ex.text()
    out = "".join(o["text"] for o in ex.outputs if o.get("name") == "stdout")
    config = json.loads(out[out.index("{"):])["mcpServers"]["pgnb-notebook"]
    url, auth = config["url"], config["headers"]["Authorization"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", url) and auth.startswith("Bearer "), out
    assert auth.split()[1] not in url
    return url, auth.split()[1]


def call(url: str, token: str, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """Each tool call in turn with the SDK's client over streamable HTTP, the token in the header."""

    async def go() -> list[Any]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            return [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(go)


def listening(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(env={"IPYTHONDIR": str(tmp_path_factory.mktemp("ipython"))})
    try:
        for code in ("%load_ext pgnb", "%pg_init --backend gloo --world 2"):
            ex = k.execute(code)
            assert ex.status == "ok", ex.text()
        yield k
    finally:
        k.execute("%pg_shutdown", timeout=60)
        k.shutdown()


def test_tools_on_a_hanging_cell(kernel: Kernel) -> None:
    url, token = serve(kernel)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    bound = {c.laddr.ip for c in inet_sockets(kernel.pid)
             if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert bound == {"127.0.0.1"}, bound
    # no token, or a wrong one: refused before the SDK sees the request
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": token}):
        req = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        assert "bearer token" in refused.value.read().decode()

    pending = kernel.pending(kernel.kc.execute(HANGING))
    t0 = time.monotonic()
    stacks = None
    while time.monotonic() - t0 < HANG - 3:  # until rank 1 is seen in the collective and rank 0 in its sleep
        (stacks,) = call(url, token, ("pg_stacks", {}))  # (at 0.1 s rank 0 may not have reached its cell's code)
        if "all_reduce" in stacks.content[0].text and "time.sleep" in stacks.content[0].text:
            break
        time.sleep(0.3)
    assert stacks is not None and not stacks.is_error
    rows = {r["rank"]: r for r in stacks.structured_content["ranks"]}
    assert rows[1]["state"] == "running" and rows[1]["blocked_in"].startswith("all_reduce"), stacks.content[0].text
    assert rows[0]["state"] == "running" and any("time.sleep" in f for f in rows[0]["frames"]), stacks.content[0].text

    t1 = time.monotonic()
    run, status = call(url, token, ("pg_run", {"code": "print(rank)"}), ("pg_status", {}))
    assert run.is_error and "while a notebook cell runs" in run.content[0].text, run.content[0].text
    assert len(run.content[0].text.splitlines()) == 1
    assert time.monotonic() - t1 < 5  # refused at once, not queued behind the cell
    assert status.structured_content["running"] == [0, 1], status.content[0].text
    assert not pending.ended, "the cell ended before the checks: they did not run while it hung"

    assert pending.read(HANG + 60), "the hanging cell never ended"
    assert pending.execution.status == "ok", pending.execution.text()
    run, cells = call(url, token, ("pg_run", {"code": "print(rank * 10)"}), ("pg_cells", {"count": 2}))
    assert not run.is_error, run.content[0].text
    assert [r["stdout"] for r in run.structured_content["ranks"]] == ["0\n", "10\n"]
    logged = cells.structured_content["cells"]
    assert "time.sleep" in logged[0]["code"] and logged[0]["label"] is not None, cells.content[0].text
    assert logged[1]["code"] == "print(rank * 10)"

    ex = kernel.execute("%pg_mcp --stop")
    assert ex.status == "ok" and "stopped" in ex.text(), ex.text()
    assert not listening(url)


def usage_error(kernel: Kernel, code: str) -> str:
    """The one line a magic failed with, checked to come at once."""
    ex = kernel.execute(code)
    assert ex.error is not None and ex.error["ename"] == "UsageError", ex.text()
    assert ex.seconds < 5, ex.seconds
    line = str(ex.error["evalue"])
    assert "\n" not in line
    return line


def test_shutdown_closes_the_port(kernel: Kernel) -> None:
    url, token = serve(kernel)
    assert "already serving this world at " + url in usage_error(kernel, "%pg_mcp")
    (status, stop) = call(url, token, ("pg_status", {}), ("pg_shutdown", {}))
    assert status.structured_content["phase"] == "initialized", status.content[0].text
    # the notebook owns its world: the agent is told which magic stops it
    assert stop.is_error and "run %pg_shutdown in the notebook" in stop.content[0].text, stop.content[0].text
    ex = kernel.execute("%pg_shutdown")
    assert ex.status == "ok", ex.text()
    deadline = time.monotonic() + 5
    while listening(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not listening(url)
    # no world, a bad port: one line each, nothing served
    assert usage_error(kernel, "%pg_mcp").startswith("no process group yet: run %pg_init first")
    assert "--port must be 0-65535, not 70000" in usage_error(kernel, "%pg_mcp --port 70000")
    ex = kernel.execute("%pg_mcp --stop")
    assert ex.status == "ok" and "no MCP server to stop" in ex.text(), ex.text()
