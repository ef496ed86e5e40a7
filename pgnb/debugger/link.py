"""One rank's Debug Adapter Protocol connection: its pydevd, spoken to from the kernel.

DAP messages are JSON with a ``Content-Length`` header (the base protocol of the
Debug Adapter Protocol). A ``RankLink`` owns one accepted socket: a reader
thread hands each response to the ``Future`` of its request and each event to a
callback; requests may come from any thread.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: A DAP message (request, response or event), as JSON decodes it.
Message = dict[str, Any]
#: Seconds a rank's pydevd gets to answer one request.
ANSWER_WAIT = 10.0
_HEADER = b"Content-Length: "
_SEPARATOR = b"\r\n\r\n"


def frame(message: Message) -> bytes:
    body = json.dumps(message).encode()
    return _HEADER + str(len(body)).encode() + _SEPARATOR + body


def unframe(buffer: bytes) -> tuple[list[Message], bytes]:
    """The whole messages at the start of ``buffer``, and what is left of it."""
    out: list[Message] = []
    while True:
        head, sep, rest = buffer.partition(_SEPARATOR)
        if not sep:
            return out, buffer
        size = int(head.rsplit(b":", 1)[1])
        if len(rest) < size:
            return out, buffer
        out.append(json.loads(rest[:size]))
        buffer = rest[size:]


def bridge_thread(target: Callable[..., None], args: tuple[Any, ...] = (), name: str = "") -> threading.Thread:
    """A daemon thread of the bridge that the kernel's own debugger neither lists nor stops in: pydevd skips a
    thread marked as one of its own (ipykernel 6.29's "raised" filter otherwise stopped in the link's reader)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
    thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]
    return thread


class RankLink:
    """The kernel's end of one rank's pydevd connection."""

    def __init__(self, sock: socket.socket, on_event: Callable[[RankLink, Message], None],
                 on_close: Callable[[RankLink], None]) -> None:
        self.sock = sock
        self.rank = -1  # known once the rank said its pid (``pydevdSystemInfo``)
        self.on_event = on_event
        self.on_close = on_close
        self._seq = 0
        self._lock = threading.Lock()
        self._waiting: dict[int, Future[Message]] = {}
        self.closed = False
        self._reader = bridge_thread(self._read, name="pgnb-dap-link")
        self._reader.start()

    def send(self, command: str, arguments: dict[str, Any] | None = None) -> Future[Message]:
        """Send a request; its response arrives in the returned future (a failed one if the link closes)."""
        done: Future[Message] = Future()
        with self._lock:
            if self.closed:
                done.set_exception(ConnectionError(f"rank {self.rank}'s debugger connection is closed"))
                return done
            self._seq += 1
            seq = self._seq
            self._waiting[seq] = done
            message: Message = {"seq": seq, "type": "request", "command": command}
            if arguments is not None:
                message["arguments"] = arguments
            try:
                self.sock.sendall(frame(message))
            except OSError as e:
                self._waiting.pop(seq, None)
                done.set_exception(ConnectionError(str(e)))
        return done

    def call(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = ANSWER_WAIT) -> Message:
        """Send a request and wait for its response (not from the reader thread)."""
        return self.send(command, arguments).result(timeout)

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                messages, buffer = unframe(buffer + data)
                for message in messages:
                    if message.get("type") == "response":
                        with self._lock:
                            done = self._waiting.pop(int(message.get("request_seq", -1)), None)
                        if done is not None:
                            done.set_result(message)
                    elif message.get("type") == "event":
                        self.on_event(self, message)
        except (OSError, ValueError):
            pass
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            waiting, self._waiting = self._waiting, {}
        for done in waiting.values():
            done.set_exception(ConnectionError(f"rank {self.rank}'s debugger connection closed"))
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.on_close(self)
