"""An MCP server over streamable HTTP on 127.0.0.1, in a thread of its own, behind a bearer token.

``%pg_mcp`` serves a notebook's world this way: the kernel's main thread is busy while a
cell runs, so the server has its own thread and event loop (uvicorn's), and the tools it
serves read the world without the main thread. Every request must carry
``Authorization: Bearer <token>`` (compared in constant time); anything else gets 401
before it reaches the SDK. The token never goes into a URL, where logs would keep it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.waiting import poll_until

#: Seconds the server gets to start listening, and to stop.
START_WAIT = 10.0
STOP_WAIT = 5.0
#: What a request without the right token gets.
UNAUTHORIZED = "this MCP server needs the bearer token %pg_mcp printed: send 'Authorization: Bearer <token>'"


class BearerGate:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <token>`` gets 401 and goes no further."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps({"error": UNAUTHORIZED}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class HttpServer:
    """``mcp`` served at ``http://127.0.0.1:PORT/mcp`` from a daemon thread until ``stop()``."""

    def __init__(self, mcp: MCPServer, token: str, port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))  # loopback only; port 0: the kernel picks a free one, no race
        self.port: int = self._sock.getsockname()[1]
        app = BearerGate(mcp.streamable_http_app(host="127.0.0.1"), token)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="pgnb-mcp-http", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as e:  # told to start(), which raises it
            self._error = e

    def start(self) -> HttpServer:
        self._thread.start()
        poll_until(lambda: self._server.started or not self._thread.is_alive(), START_WAIT)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the MCP server did not start listening on 127.0.0.1:{self.port}: {self._error!r}")
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close_soon(self) -> None:
        """Ask the server to stop, without waiting (from a thread the server may be waiting for)."""
        self._server.should_exit = True

    def stop(self) -> None:
        """Stop serving and close the port (idempotent)."""
        self._server.should_exit = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(STOP_WAIT)
        self._sock.close()
