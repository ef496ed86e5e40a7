"""Where a rank that is still running is blocked: its Python stack, trimmed to the cell.

Every engine answers stack requests on a Unix socket, into a 0600 file, both
in a 0700 directory the world owns (``pgnb.rank.stacks``). A thread of the
rank answers, so it does even while the rank is blocked inside a gloo
collective (which ignores SIGINT). The stack is trimmed to the frames that
matter: the cell's own code and what it called. Library frames are shown as
tracebacks show them (``pgnb.rank.cell.plain_traceback``): file and function,
no line number or source line, which change with every torch release.
"""

from __future__ import annotations

import linecache
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .._wire import stack_file, stack_socket
from ..rank import trace as rank_trace
from ..rank.cell import short_path
from .remote import is_local
from .rendezvous import EngineInfo
from .waiting import poll_until

#: Seconds to wait for a rank's stack dump to be written.
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


@dataclass(frozen=True)
class Stack:
    """Where one still-running rank is: its frames (most recent call last) and the innermost one."""

    frames: tuple[str, ...] = ()
    blocked_in: str = ""  # e.g. "all_reduce (distributed_c10d.py)" or "the cell, line 3"
    note: str = ""  # why there are no frames


def dump_stacks(infos: Mapping[int, EngineInfo], stack_dir: str, code: str = "") -> dict[int, Stack]:
    """Ask each rank of ``infos`` (``rank -> its engine``) for its Python stack.

    ``code`` is the cell's source, for the source lines of its own frames.
    """
    out: dict[int, Stack] = {}
    asked: dict[int, tuple[str, int]] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as asker:
        for r, info in infos.items():
            path = stack_file(stack_dir, info.pid)
            if not is_local(info):
                out[r] = Stack(note=f"it runs on host {info.host}")
                continue
            if not os.path.exists(path):
                out[r] = Stack(note="the engine has no stack dumps enabled")
                continue
            size = os.path.getsize(path)
            try:
                asker.sendto(b"?", stack_socket(stack_dir, info.pid))
            except OSError:
                out[r] = Stack(note="the engine process is gone")
                continue
            asked[r] = (path, size)
    # the rank writes its whole dump in one write, ending in a blank line (pgnb.rank.stacks.dump_text)
    dumps: dict[int, str] = {}

    def all_written() -> bool:
        for r, (path, size) in asked.items():
            if r not in dumps:
                text = _read_from(path, size)
                if text.endswith("\n\n"):
                    dumps[r] = text
        return not asked.keys() - dumps.keys()

    poll_until(all_written, STACK_WAIT, step=0.01)
    for r in asked:
        if r in dumps:
            frames, where = trim_stack(dumps[r], code)
            out[r] = Stack(tuple(frames), where, "" if frames else NO_CELL_CODE)
        else:
            out[r] = Stack(note="it did not answer the stack request in time")
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
        # innermost first
        mine = [f for f in frames[:cut] if not f[0].endswith(_TRACER_FILE)][:STACK_FRAMES]
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


def _source_line(path: str, line: int, cell_file: str, code: str) -> str:
    if path == cell_file:
        lines = code.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    if _CELL_FILE.search(path):
        return linecache.getline(path, line).strip()
    return ""  # a library's source line changes between its releases, like its line number


def _frame_text(path: str, line: int, func: str, cell_file: str) -> str:
    where = "" if func == "<module>" else f", in {func}"
    if path == cell_file:
        return f"  Cell, line {line}{where}"
    if _CELL_FILE.search(path):
        return f"  Earlier cell, line {line}{where}"
    return f"  {short_path(path)}{where}"
