"""Processes a cell spawns (``torch.multiprocessing.spawn``, a ``spawn`` context): their errors reach the cell.

A spawned child is a new interpreter whose fd 2 is the engine's log, and its
parent learns only its exit code (``ProcessExitedException: process 0
terminated with exit code 1``). While a cell runs, every child spawned from it
first points its own fd 2 at a 0600 file in the world's 0700 directory; when
the cell fails, the tracebacks found there are printed under the rank (``pgnb.rank.cell``) (paths
shortened as pgnb's tracebacks are), with a hint when the child could not find
a function the cell defined: it lives in the engine's ``__main__``, which a new
interpreter cannot import. Whatever the children wrote is then copied to the
engine's log, where it went before. Children outlive nothing: they carry the
world's owner token, so stopping the world stops them too.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

_STATE: dict[str, Any] = {}
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+, in (?P<func>.*)$')
_MAIN_MISSING = re.compile(r"Can't get attribute '(?P<name>[^']+)' on <module '__main__'")
#: Python 3.13+ colours a traceback when FORCE_COLOR is set, and ipykernel sets it in the engine's environment
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def children_file(stack_dir: str, pid: int) -> str:
    """Where the children the engine ``pid`` spawns during a cell write their stderr."""
    return os.path.join(stack_dir, f"children-{pid}.txt")


def watch(stack_dir: str | None) -> None:
    """Until ``unwatch``: each child spawned by multiprocessing writes its stderr to ``children_file``."""
    if stack_dir is None or not os.path.isdir(stack_dir):
        return  # on another host the world's directory does not exist: children keep the engine's log
    import multiprocessing.spawn as spawn

    path = children_file(stack_dir, os.getpid())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # an earlier cell's
    original: Callable[..., list[str]] = spawn.get_command_line

    def command_line(**kwds: Any) -> list[str]:
        cmd = list(original(**kwds))
        if "-c" in cmd:  # a frozen executable has no program to prefix
            at = cmd.index("-c") + 1
            cmd[at] = (f"import os; os.dup2(os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND"
                       f" | os.O_NOFOLLOW, 0o600), 2); " + cmd[at])
        return cmd

    spawn.get_command_line = command_line
    _STATE.update(path=path, original=original)


def unwatch(shorten: Callable[[str], str]) -> str:
    """Children spawned from now on keep the engine's log; the tracebacks the cell's children wrote
    (``failures_text``, files named by ``shorten``), for the cell to print if it failed."""
    original = _STATE.pop("original", None)
    path = _STATE.pop("path", None)
    if original is None or path is None:
        return ""
    import multiprocessing.spawn as spawn

    spawn.get_command_line = original
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""  # no child was spawned
    with contextlib.suppress(OSError):
        os.unlink(path)  # children still running write on into the unlinked file
    with contextlib.suppress(OSError):
        os.write(2, data)  # the engine's log keeps what it always had
    return failures_text(data.decode("utf-8", "replace"), shorten)


def failures_text(stderr: str, shorten: Callable[[str], str] = os.path.basename) -> str:
    """The distinct tracebacks in what the children wrote, and the hint they call for; each frame is
    ``shorten(file), in function`` (``pgnb.rank.cell.short_path``: as pgnb shows tracebacks)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in _COLOUR.sub("", stderr).splitlines():
        if line.startswith("Traceback (most recent call last):"):
            current = [line]
            continue
        if current is None:
            continue
        m = _FRAME.match(line)
        if m:
            current.append(f"  {shorten(m['file'])}, in {m['func']}")
        elif line.startswith("    ") or not line.strip():
            continue  # a frame's source line: its line number changes with every release, as tracebacks show
        else:  # the exception's line ends the traceback
            current.append(line)
            if current not in blocks:
                blocks.append(current)
            current = None
    if not blocks:
        return ""
    out = ["a process spawned by the cell failed:" if len(blocks) == 1 else "processes spawned by the cell failed:"]
    for block in blocks:
        out.extend(block)
    missing = next((m["name"] for b in blocks for m in [_MAIN_MISSING.search(b[-1])] if m), None)
    if missing is not None:
        out.append(f"hint: {missing!r} was defined in a cell, which a spawned process cannot import: define it in "
                   "a module the ranks can import, or run it on the world pgnb already has (each rank is a process)")
    return "\n".join(out) + "\n"
