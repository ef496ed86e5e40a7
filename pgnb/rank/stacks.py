"""A rank answers "where is your cell now?" from a thread of its own, never from a signal handler.

The kernel asks by sending a datagram to the rank's socket beside its 0600 dump
file (``pgnb._wire.stack_file``); a daemon thread takes the cell thread's
frames from ``sys._current_frames()`` and appends them to the file in
faulthandler's layout, which ``pgnb.core.stacks`` trims. Reading frames needs
the GIL, which a rank blocked in a collective has released (gloo waits without
it), and a rank running Python gives up every few milliseconds.
faulthandler's dump from a SIGUSR1 handler did not need the GIL, but it reads
the frames while the thread is changing them: it crashed ranks (SIGSEGV) that
were importing or starting threads when the live view sampled them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any

from .._wire import stack_file, stack_socket

_STATE: dict[str, Any] = {}


def enable_stack_dumps(stack_dir: str | None) -> str | None:
    """Answer stack requests for the calling thread (the one that runs cells). Idempotent.

    ``stack_dir`` is a 0700 directory the kernel made; on another host it does
    not exist and the rank simply has no dumps.
    """
    path = None if stack_dir is None else stack_file(stack_dir, os.getpid())
    if path is None or _STATE.get("stack_path") == path:
        return _STATE.get("stack_path")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        address = stack_socket(stack_dir or "", os.getpid())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)  # a socket of an earlier world of this engine's pid
        sock.bind(address)
        os.chmod(address, 0o600)
    except OSError:
        return None
    old = _STATE.pop("socket", None)
    if old is not None:  # the previous world's: its thread's recv returns b"" and the thread ends
        with contextlib.suppress(OSError):
            old.shutdown(socket.SHUT_RDWR)
        old.close()
    _STATE.update(socket=sock, stack_path=path)
    with contextlib.suppress(ValueError):  # a kernel of an earlier pgnb asks with SIGUSR1, which would end us
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    cell_thread = threading.get_ident()
    threading.Thread(target=_answer, args=(sock, fd, cell_thread), name="pgnb-stacks", daemon=True).start()
    return path


def _answer(sock: socket.socket, fd: int, thread: int) -> None:
    try:
        while sock.recv(64):
            _drain(sock)  # requests that queued while this process could not run Python: one answer does
            os.write(fd, dump_text(sys._current_frames().get(thread), thread).encode("utf-8", "replace"))
    except OSError:
        pass  # the socket was closed (a newer world) or the directory removed
    finally:
        os.close(fd)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        while sock.recv(64, socket.MSG_DONTWAIT):
            pass


def dump_text(frame: FrameType | None, thread: int) -> str:
    """One thread's frames as faulthandler writes them (innermost first), in one piece."""
    lines = [f"Current thread 0x{thread:016x} (most recent call first):"]
    while frame is not None:
        lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(lines) + "\n\n"

