"""``%pg_mcp``: the agent tools (``pgnb.agent``) on this notebook's world, over streamable HTTP on 127.0.0.1.

The server runs in a thread of its own (the kernel's main thread is busy while a cell
runs), behind a bearer token printed once with the client configuration to paste.
Reading tools answer from that thread at any time, even while a ``%%pg`` cell hangs.
Tools that run code on the ranks (``pg_run``, ``pg_show``) run on the kernel's main
thread between cells, scheduled on its event loop, so they never interleave with the
notebook's own cells; while a cell runs they are refused in one line. The notebook owns
its world: the tools that start or stop it point at the magics instead. ``%pg_mcp --stop``,
``%pg_shutdown`` and the kernel's end close the port.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import secrets
import threading
from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class

from ..core.sandbox import Sandbox
from ..errors import NOT_STARTED
from .current import current
from .guard import ErrorLog, guarded
from .magics import _parse, argument, line_magic, magic_arguments

if TYPE_CHECKING:
    from ..agent.http import HttpServer

T = TypeVar("T")

#: Seconds an action waits for the kernel's main thread to take it (a cell that started meanwhile holds it).
START_WAIT = 2.0
NO_SDK = '%pg_mcp needs the MCP SDK: pip install "pgnb[mcp]"'


class NotebookWorld:
    """The agent tools' host for this notebook's world (``pgnb.agent.hosts.Host``)."""

    owns_world = False
    frees = "the notebook's `%pg_init ... --force` restarts the engines"
    not_started = "the notebook has no world: run %pg_init in the notebook first"

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._cell = 0  # cells running now: pre_run_cell .. post_run_cell
        shell.events.register("pre_run_cell", self._cell_starts)
        shell.events.register("post_run_cell", self._cell_ends)

    def _cell_starts(self, info: Any) -> None:
        self._cell += 1

    def _cell_ends(self, result: Any) -> None:
        self._cell = max(0, self._cell - 1)

    def close(self) -> None:
        for event, fn in (("pre_run_cell", self._cell_starts), ("post_run_cell", self._cell_ends)):
            try:
                self._shell.events.unregister(event, fn)
            except ValueError:  # not registered (any more)
                pass

    def sandbox(self) -> Sandbox | None:
        return current()

    def set_sandbox(self, sb: Sandbox | None) -> None:
        raise RuntimeError("the notebook's world is set by its magics")

    def say(self, message: str) -> str:
        return message  # pgnb's hints name the notebook's magics already

    def _refusal(self, what: str) -> str:
        running = self.sandbox()
        now = running.cells.now() if running is not None else None
        where = " (pg_stacks shows where its ranks are)" if now is not None else ""
        return f"cannot {what} while a notebook cell runs{where}; call it again once the cell has ended"

    def act(self, what: str, fn: Callable[[], T]) -> T:
        from mcp.server.mcpserver.exceptions import ToolError

        if self._cell:
            raise ToolError(self._refusal(what))
        loop = getattr(getattr(self._shell, "kernel", None), "io_loop", None)
        if loop is None:
            raise ToolError(f"cannot {what} here: code runs on the ranks only from a Jupyter kernel's notebook")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        taken = threading.Event()

        def on_main_thread() -> None:
            if not future.set_running_or_notify_cancel():
                return  # given up: a cell held the main thread too long
            taken.set()
            if self._cell:  # a cell began between the check and now: it ran first, and may not be over
                future.set_exception(ToolError(self._refusal(what)))
                return
            try:
                future.set_result(fn())
            except BaseException as e:  # the tool's thread raises it
                future.set_exception(e)

        loop.add_callback(on_main_thread)
        if not taken.wait(START_WAIT) and future.cancel():
            raise ToolError(self._refusal(what))
        return future.result()


@magics_class
class McpMagics(Magics):
    """``%pg_mcp``: serve this notebook's world to an MCP client."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.errors = ErrorLog()
        self._http: HttpServer | None = None
        self._host: NotebookWorld | None = None
        self._world: Sandbox | None = None

    @line_magic
    @guarded("%pg_mcp", "serving the world to an MCP client")
    @magic_arguments()
    @argument("--stop", action="store_true", help="stop serving and close the port")
    @argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    def pg_mcp(self, line: str) -> None:
        """Serve this notebook's world to an AI agent: pgnb's MCP tools over streamable HTTP on 127.0.0.1.

        Prints the URL and a bearer token once, with the client configuration to paste. The agent reads
        pg_status, pg_stacks and pg_cells (the last %%pg cells' per-rank output) at any time, even while a
        cell hangs; pg_run and pg_show run between the notebook's cells and are refused while one runs.
        %pg_mcp --stop, %pg_shutdown and the kernel's end close the port."""
        args = _parse(self.pg_mcp, line)
        if args.stop:
            print("pgnb: MCP server stopped; the port is closed" if self.stop() else "pgnb: no MCP server to stop")
            return
        if self._http is not None and self._http.running:
            raise UsageError(f"already serving this world at {self._http.url} (its token was printed when it "
                             "started); %pg_mcp --stop, then %pg_mcp for a new token")
        if not 0 <= args.port < 65536:
            raise UsageError(f"--port must be 0-65535, not {args.port}")
        if find_spec("mcp") is None:
            raise UsageError(NO_SDK)
        sb = current()
        if sb is None or not sb.engine_ids:
            raise UsageError(NOT_STARTED)
        print(self.start(sb, args.port))

    def start(self, sb: Sandbox, port: int = 0) -> str:
        """Serve ``sb`` (the notebook's world); the lines to show the user, token included (shown once)."""
        from ..agent.http import HttpServer
        from ..agent.tools import server

        self.stop()
        token = secrets.token_urlsafe(32)
        host = NotebookWorld(self.shell)
        try:
            http = HttpServer(server(host, name="pgnb-notebook"), token, port).start()
        except OSError as e:
            host.close()
            raise UsageError(f"cannot listen on 127.0.0.1:{port}: {e.strerror or e}") from None
        self._http, self._host, self._world = http, host, sb
        sb.add_listener(self._on_world)
        atexit.register(self.stop)
        config = {"mcpServers": {"pgnb-notebook": {
            "type": "http", "url": http.url, "headers": {"Authorization": f"Bearer {token}"}}}}
        return (f"pgnb: serving this notebook's world to MCP clients at {http.url} until %pg_mcp --stop\n"
                "the token is shown this once (clear this output before sharing the notebook); client config:\n"
                + json.dumps(config, indent=2))

    def _on_world(self, sb: Sandbox) -> None:
        if sb.snapshot().phase == "shut down":
            # %pg_shutdown, on the main thread, which a tool of the server may be waiting for: the server is
            # told to stop now (its port closes within a moment) and joined from a thread of its own
            http = self._detach()
            if http is not None:
                http.close_soon()
                threading.Thread(target=http.stop, name="pgnb-mcp-stop", daemon=True).start()

    def _detach(self) -> HttpServer | None:
        """Forget the server (this magic serves nothing from now on); the server itself, still to stop."""
        http, host, world = self._http, self._host, self._world
        self._http = self._host = self._world = None
        if world is not None:
            world.remove_listener(self._on_world)
        if host is not None:
            host.close()
        if http is not None:
            atexit.unregister(self.stop)
        return http

    def stop(self) -> bool:
        """Stop serving and close the port (idempotent); whether a server was running."""
        http = self._detach()
        if http is None:
            return False
        running = http.running
        http.stop()
        return running
