"""Where a rank that is still running is blocked: its Python stack, trimmed to the cell.

Every engine answers stack requests on a Unix socket, into a 0600 file, both
in a 0700 directory the world owns (``pgnb.rank.stacks``). A thread of the
rank answers, so it does even while the rank is blocked inside a gloo
collective (which ignores SIGINT). The stack is trimmed to the frames that
matter: the cell's own code and what it called. Library frames are shown as
tracebacks show them (``pgnb.rank.cell.plain_traceback``): file and function,
no line number or source line, which change with every torch release. Frames of
the user's own files (a test file, the project under test) get both.

Asking never holds the kernel up, whatever the rank does: a rank that holds
the GIL (native code that never releases it) cannot answer, so the request is
sent without blocking, each rank has at most one request waiting at its socket
(it is not asked again until it answers, so its queue never fills), and the
kernel waits for an answer at most ``STACK_WAIT`` seconds, once: a rank whose
earlier request is still unanswered is reported at once (``NO_ANSWER``).
"""

from __future__ import annotations

import linecache
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from .._wire import stack_file, stack_socket
from ..rank import trace as rank_trace
from ..rank.cell import short_path, users_file
from .remote import is_local
from .rendezvous import EngineInfo
from .waiting import poll_until

#: Seconds a rank has to answer a stack request before it is reported as not answering.
STACK_WAIT = 1.0
#: Frames shown at most per stuck rank (innermost kept).
STACK_FRAMES = 12

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_CELL_FILE = re.compile(r"(^<ipython-input-)|(/ipykernel_\d+/\d+\.py$)")
#: pgnb's own trace wrapper (%%pg --trace) is not where the user is blocked
_TRACER_FILE = os.path.join(*rank_trace.__name__.split(".")) + ".py"


#: The note of a rank that answered but is in no cell's code: it has left the cell (IPython formats its
#: error, or it is replying), so its result is on its way.
NO_CELL_CODE = "its stack shows no cell code"
#: The note of a rank that has not answered a request for ``STACK_WAIT`` s: no thread of it can run Python.
NO_ANSWER = f"it did not answer within {STACK_WAIT:g} s; it holds the GIL or is in native code"
#: The note of a rank asked by ``dump_stacks(wait=0)`` whose answer is not in yet (the next call reads it).
ASKED = "its stack was asked for"


@dataclass(frozen=True)
class Place:
    """A frame's own file, line and function, as the rank's stack dump gives them."""

    path: str
    line: int
    func: str


@dataclass(frozen=True)
class Stack:
    """Where one still-running rank is: its frames (most recent call last) and the innermost one."""

    frames: tuple[str, ...] = ()
    blocked_in: str = ""  # e.g. "all_reduce (distributed_c10d.py)" or "the cell, line 3"
    note: str = ""  # why there are no frames
    #: each frame's file and line, one per frame of ``frames`` (its lines not indented as a source line), in order:
    #: the text shows a library's frame without them, a debugger shows where it is
    places: tuple[Place, ...] = ()


@dataclass(frozen=True)
class _Request:
    """A stack request sent to one rank: its answer is what its dump file holds past ``offset``."""

    path: str
    offset: int
    at: float  # time.monotonic() when it was sent

    def answer(self) -> str | None:
        """The rank's whole dump, once written (one write, ending in a blank line: ``pgnb.rank.stacks``)."""
        text = _read_from(self.path, self.offset)
        return text if text.endswith("\n\n") else None


#: socket address -> the request sent there and not answered yet (at most one per rank)
_UNANSWERED: dict[str, _Request] = {}
#: the live view samples from the main thread while ``Sandbox.execute`` may run in another
_LOCK = threading.Lock()


def dump_stacks(infos: Mapping[int, EngineInfo], stack_dir: str, code: str = "",
                wait: float = STACK_WAIT) -> dict[int, Stack]:
    """Ask each rank of ``infos`` (``rank -> its engine``) for its Python stack; never blocks for longer than ``wait``.

    ``code`` is the cell's source, for the source lines of its own frames.
    ``wait=0`` (the live view's sampling) waits for no answer: a rank's stack is
    the answer to the request an earlier call sent (``ASKED`` until it is in),
    and a new request goes out.
    """
    out: dict[int, Stack] = {}
    if not infos:  # every cell asks, for its ranks still running: most often none
        return out
    answers: dict[int, str] = {}
    waiting: dict[int, _Request] = {}
    with _LOCK:
        for address in [a for a in _UNANSWERED if not os.path.exists(a)]:  # engines gone, worlds removed
            del _UNANSWERED[address]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as asker:
            asker.setblocking(False)
            now = time.monotonic()
            for r, info in infos.items():
                path = stack_file(stack_dir, info.pid)
                address = stack_socket(stack_dir, info.pid)
                if not is_local(info):
                    out[r] = Stack(note=f"it runs on host {info.host}")
                    continue
                if not os.path.exists(path):
                    out[r] = Stack(note="the engine has no stack dumps enabled")
                    continue
                earlier = _UNANSWERED.get(address)
                if earlier is not None:
                    text = earlier.answer()
                    if text is None:  # never a second request: it would queue behind the first
                        if now - earlier.at >= STACK_WAIT:
                            out[r] = Stack(note=NO_ANSWER)
                        elif wait > 0:
                            waiting[r] = earlier
                        else:
                            out[r] = Stack(note=ASKED)
                        continue
                    del _UNANSWERED[address]
                    if wait <= 0:
                        answers[r] = text
                request = _Request(path, os.path.getsize(path), now)
                try:
                    asker.sendto(b"?", address)
                except BlockingIOError:  # its queue is full (asked by another process): it is not reading
                    out[r] = Stack(note=NO_ANSWER)
                    continue
                except OSError:
                    out[r] = Stack(note="the engine process is gone")
                    continue
                _UNANSWERED[address] = request
                if wait > 0:
                    waiting[r] = request
                elif r not in answers:
                    out[r] = Stack(note=ASKED)

        def all_written() -> bool:
            for r, request in waiting.items():
                if r not in answers:
                    text = request.answer()
                    if text is not None:
                        answers[r] = text
                        _UNANSWERED.pop(stack_socket(stack_dir, infos[r].pid), None)
            return not waiting.keys() - answers.keys()

        if waiting:
            poll_until(all_written, wait, step=0.01)
    for r in waiting.keys() - answers.keys():
        out[r] = Stack(note=NO_ANSWER)
    for r, text in answers.items():
        frames, where = trim_stack(text, code)
        out[r] = Stack(tuple(frames), where, "" if frames else NO_CELL_CODE, stack_places(text))
    return out


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def trim_stack(dump: str, code: str = "") -> tuple[list[str], str]:
    """The cell's frames from a stack dump (faulthandler's layout), most recent call last, and where it is blocked.

    The thread running the cell is the one with IPython's ``run_code`` frame;
    the frames above it (IPython, ipykernel, ipyparallel) are dropped. The
    cell's frames (and earlier cells') get their line and source, from
    ``code`` for this cell; library frames only their file and function.
    """
    mine, cell_file = _cell_thread(dump)
    if mine:
        lines = []
        for f, ln, fn in reversed(mine):
            lines.append(_frame_text(f, ln, fn, cell_file))
            src = _source_line(f, ln, cell_file, code)
            if src:
                lines.append(f"    {src}")
        f, ln, fn = mine[0]
        if f == cell_file:
            where = f"the cell, line {ln}"
        elif _CELL_FILE.search(f):
            where = f"{fn} (an earlier cell, line {ln})"
        else:
            where = f"{fn} ({os.path.basename(f)})"
        return lines, where
    return [], ""


def stack_places(dump: str) -> tuple[Place, ...]:
    """The file and line of each frame ``trim_stack`` keeps, in its order (most recent call last)."""
    return tuple(Place(f, ln, fn) for f, ln, fn in reversed(_cell_thread(dump)[0]))


def _cell_thread(dump: str) -> tuple[list[tuple[str, int, str]], str]:
    """The frames of the thread running the cell, innermost first (at most ``STACK_FRAMES``), and the cell's file."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent call first)")):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"].strip()))
    for frames in threads:
        cut = next((i for i, (f, _, fn) in enumerate(frames)
                    if fn == "run_code" and f.endswith(os.path.join("IPython", "core", "interactiveshell.py"))), None)
        if not cut:
            continue
        cell_file = frames[cut - 1][0]
        if not _CELL_FILE.search(cell_file):
            continue  # past the cell's code: IPython is ending the cell (e.g. formatting its error)
        return [f for f in frames[:cut] if not f[0].endswith(_TRACER_FILE)][:STACK_FRAMES], cell_file
    return [], ""


def _source_line(path: str, line: int, cell_file: str, code: str) -> str:
    if path == cell_file:
        lines = code.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    if _CELL_FILE.search(path) or users_file(path):
        return linecache.getline(path, line).strip()
    return ""  # a library's source line changes between its releases, like its line number


def _frame_text(path: str, line: int, func: str, cell_file: str) -> str:
    where = "" if func == "<module>" else f", in {func}"
    if path == cell_file:
        return f"  Cell, line {line}{where}"
    if _CELL_FILE.search(path):
        return f"  Earlier cell, line {line}{where}"
    if users_file(path):  # a test file, the project under test: the reader needs the line
        return f"  {short_path(path)}, line {line}{where}"
    return f"  {short_path(path)}{where}"
