"""The kernel's side of a rank's pdb: prompts from the ranks, answered one rank at a time.

A ``DebugServer`` listens on a Unix socket in the world's 0700 directory for
the duration of a cell (or a ``%pg_debug``). A rank at a breakpoint connects
(``pgnb.rank.debug``) and sends what pdb printed with its prompt; ``poll``,
called from the kernel's wait loop, hands it to a ``Prompter`` (the
notebook's ``input()``, or ``Sandbox.execute(on_input=...)``) and sends the
line back. Several ranks at breakpoints are served in rank order: a rank
keeps the prompt until it continues (``c``, ``q``), so its session is not
interleaved with another's. The seconds spent at a prompt are reported, so
``--timeout`` and pgnb's own deadlines do not count them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .._wire import DebugArgs
from ..rank import debug as rank_debug
from .dispatch import Dispatch
from .waiting import poll_until

#: ``Sandbox.execute(on_input=fn)``: ``fn(rank, text)`` gets pdb's output ending in its prompt; the line to type
InputFn = Callable[[int, str], str | None]


class Prompter(Protocol):
    """Who answers a rank's pdb: the notebook's ``input()``, a terminal, an API callback."""

    def show(self, rank: int, text: str) -> None:
        """What pdb printed that asks nothing (its last words after ``c``)."""

    def ask(self, rank: int, text: str, prompt: str) -> str | None:
        """pdb's output, then its prompt: the line typed, or None to quit the debugger."""


class CallbackPrompter:
    """``Sandbox.execute(on_input=fn)``: ``fn(rank, text)`` gets pdb's output ending in its prompt."""

    def __init__(self, fn: InputFn) -> None:
        self.fn = fn
        self.shown: dict[int, str] = {}

    def show(self, rank: int, text: str) -> None:
        self.shown[rank] = self.shown.get(rank, "") + text

    def ask(self, rank: int, text: str, prompt: str) -> str | None:
        return self.fn(rank, self.shown.pop(rank, "") + text + prompt)

#: Commands after which the rank runs on (its session ends until it stops again).
_LEAVING = {"c", "cont", "continue", "q", "quit", "exit"}
#: How long a rank that was just answered gets to print its next prompt before another rank is served.
_NEXT_PROMPT_WAIT = 5.0
#: Ranks reach the same breakpoint a little apart: the first prompt waits this long for lower ranks,
#: so that they are served in rank order.
_GATHER = 0.3


@dataclass
class _Conn:
    sock: socket.socket
    rank: int = -1
    buffer: bytes = b""
    requests: list[str] = field(default_factory=list)  # texts that wait for an answer, oldest first
    since: float = 0.0  # when its oldest waiting request came
    closed: bool = False


class DebugServer:
    """One cell's prompts. Main thread only (the answers may call ``input()``)."""

    def __init__(self, directory: str, prompter: Prompter, post_mortem: bool = False) -> None:
        self.prompter = prompter
        self.post_mortem = post_mortem
        self.path = os.path.join(directory, f"debug-{uuid.uuid4().hex[:8]}.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.conns: list[_Conn] = []
        self.current: _Conn | None = None  # the rank whose session is open
        self.waited = 0.0  # seconds spent at prompts so far

    def args(self) -> DebugArgs:
        return {"path": self.path, "post_mortem": self.post_mortem}

    def poll(self) -> None:
        """Take what the ranks sent; serve the waiting prompts, the open session first, then by rank."""
        self._read(0.0)
        while True:
            conn = self._next()
            if conn is None:
                return
            text, prompt = _split_prompt(conn.requests.pop(0))
            t0 = time.monotonic()
            try:
                line = self.prompter.ask(conn.rank, text, prompt)
            finally:
                self.waited += time.monotonic() - t0
            self._send(conn, line)
            leaving = line is None or line.strip().split(" ")[0] in _LEAVING
            self.current = None if leaving else conn
            if self.current is not None:
                self._wait_next(conn)

    def _next(self) -> _Conn | None:
        if self.current is not None and self.current.requests:
            return self.current
        waiting = [c for c in self.conns if c.requests]
        if not waiting or time.monotonic() - min(c.since for c in waiting) < _GATHER:
            return None
        return min(waiting, key=lambda c: c.rank)

    def _wait_next(self, conn: _Conn) -> None:
        """The rank that was answered prints its next prompt, or ends: wait for it (bounded)."""
        def spoke() -> bool:  # the select in _read is the wait: it returns as soon as the rank writes
            if not (conn.requests or conn.closed):
                self._read(0.05)
            return bool(conn.requests) or conn.closed

        poll_until(spoke, _NEXT_PROMPT_WAIT, step=0)
        if not conn.requests:
            self.current = None

    def _read(self, timeout: float) -> None:
        socks = [self.listener, *(c.sock for c in self.conns if not c.closed)]
        ready, _, _ = select.select(socks, [], [], timeout)
        for s in ready:
            if s is self.listener:
                with contextlib.suppress(BlockingIOError):
                    new, _ = self.listener.accept()
                    self.conns.append(_Conn(new))
                continue
            conn = next(c for c in self.conns if c.sock is s)
            data = conn.sock.recv(65536)
            if not data:
                conn.closed = True
                conn.sock.close()
                continue
            conn.buffer += data
            while b"\n" in conn.buffer:
                raw, conn.buffer = conn.buffer.split(b"\n", 1)
                msg = json.loads(raw)
                conn.rank = int(msg["rank"])
                if msg.get("done"):
                    if msg.get("text"):
                        self.prompter.show(conn.rank, str(msg["text"]))  # the last words: nothing asked
                else:
                    if not conn.requests:
                        conn.since = time.monotonic()
                    conn.requests.append(str(msg["text"]))
        self.conns = [c for c in self.conns if not c.closed or c.requests]

    def _send(self, conn: _Conn, line: str | None) -> None:
        with contextlib.suppress(OSError):  # the rank went away meanwhile
            conn.sock.sendall((json.dumps({"line": line}) + "\n").encode())

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.sock.close()
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _split_prompt(text: str) -> tuple[str, str]:
    """pdb's output and its prompt (the last line)."""
    head, _, prompt = text.rpartition("\n")
    return (head + "\n" if head else ""), prompt


def post_mortem(world: Dispatch, rank: int, prompter: Prompter) -> str:
    """``%pg_debug RANK``: pdb on the rank, in the frame where its last failed cell raised.

    The rank answers at once, with a line, when it has no such frames.
    """
    [(_, engine_id)] = world.engines_for([rank])
    server = DebugServer(world.scratch_dir, prompter)
    try:
        ar = world.client[engine_id].apply_async(rank_debug.post_mortem, server.args(), rank)
        world.wait_ranks([(rank, ar)], tick=server.poll)
        server.poll()  # the last words
        return str(ar.get(timeout=0)) if ar.ready() else ""
    finally:
        server.close()
