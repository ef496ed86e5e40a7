"""What the kernel's own debugger was told before pgnb was loaded, and breakpoints no rank can stop at.

JupyterLab switches the kernel's debugger on as soon as a kernel starts (on every
"Restart Kernel and Run All" with the bug button on): ``initialize``, ``attach``,
``setBreakpoints`` reach ipykernel before ``%load_ext pgnb`` puts the bridge in
their way. ipykernel's ``Debugger`` keeps what they said: ``is_started``, and
``breakpoint_list`` (cell file -> its breakpoints, as its debugpy placed them;
ipykernel keeps their lines only). ``CatchUp`` takes from it what the bridge
would have kept itself: the breakpoints of ``%%pg`` cells, which are the ranks'
(then released in the kernel's debugpy, where they would stop the kernel on the
``%%pg`` line); and as the kernel's debugpy was attached without the bridge's
rules, it is told not to trace pgnb and the libraries it drives a world with
(pydevd's ``setDebuggerProperty``), or "raised exceptions" would stop the kernel
in the exceptions they raise and catch while a cell runs. It also says, once and
in one line, which of a cell's breakpoints no rank can stop at, rather than let a
cell run past them silently.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .link import Message


def kernel_debugger_on(kernel: Any) -> bool:
    """Whether ipykernel's debugger is started (Lab's ``initialize`` reached it), whoever saw it happen."""
    return getattr(getattr(kernel, "debugger", None), "is_started", False) is True


def _kept(kernel: Any) -> dict[str, Any]:
    held = getattr(getattr(kernel, "debugger", None), "breakpoint_list", None)
    return held if isinstance(held, dict) else {}


def unreachable(raw_cell: str, offset: int, lines: list[int]) -> dict[int, str]:
    """Which of a ``%%pg`` cell's breakpoint lines (as Lab counts them: the ``%%pg`` line is ``offset``) run
    nothing on a rank, and why. A line inside a statement that spans lines is left to pydevd."""
    text = raw_cell.splitlines()
    out: dict[int, str] = {}
    for n in sorted(set(lines)):
        if n == offset:
            out[n] = "is the %%pg line"
        elif n > len(text):
            out[n] = "is past the cell's end"
        elif n < offset or not text[n - 1].strip() or text[n - 1].lstrip().startswith("#"):
            out[n] = "has no code"
    return out


class CatchUp:
    """The bridge's debts to ipykernel's debugger (breakpoints taken from it) and to the user (lines said)."""

    def __init__(self) -> None:
        self.held: set[str] = set()  # cell files whose breakpoints the kernel's debugpy still has
        self.hide: list[str] = []  # folders the kernel's debugpy is still to be told not to trace
        self._told: set[tuple[str, int]] = set()
        self._serial: asyncio.Lock | None = None

    def serial(self) -> asyncio.Lock:
        """Held while a request goes to ipykernel's debugger, which takes its debugpy's next answer as the answer
        to the request it sent last (created on the control channel's loop, where every debug request runs)."""
        if self._serial is None:
            self._serial = asyncio.Lock()
        return self._serial

    def schedule(self, kernel: Any, ipykernel: Callable[[Message], Awaitable[Message]]) -> None:
        """``release`` now, on the control channel's loop, rather than at Lab's next request: a cell run before it
        would stop the kernel on a ``%%pg`` line, or in pgnb (with no control thread, the next request does it)."""
        loop = getattr(getattr(kernel, "control_thread", None), "io_loop", None)
        if (self.held or self.hide) and loop is not None:
            loop.add_callback(self._release_serially, kernel, ipykernel)

    async def _release_serially(self, kernel: Any, ipykernel: Callable[[Message], Awaitable[Message]]) -> None:
        async with self.serial():
            await self.release(kernel, ipykernel)

    def take(self, kernel: Any, is_pg_cell: Callable[[str], bool]) -> dict[str, list[dict[str, Any]]]:
        """The breakpoints ipykernel keeps for ``%%pg`` cells, taken out of its list (``debugInfo`` then lists
        them once, as the ranks')."""
        kept = _kept(kernel)
        out: dict[str, list[dict[str, Any]]] = {}
        for path in [p for p in list(kept) if is_pg_cell(p)]:
            out[path] = [dict(b) for b in kept.pop(path, None) or []]
            self.held.add(path)
        return out

    async def release(self, kernel: Any, ipykernel: Callable[[Message], Awaitable[Message]]) -> None:
        """The kernel's debugpy stops tracing the folders to hide and lets go of the breakpoints taken (from the
        control channel's loop, as each request to ipykernel must be: it waits for its debugpy's answers one at
        a time)."""
        hide, self.hide = self.hide, []
        if hide and kernel_debugger_on(kernel):  # (a folder's own name is no prefix of its sibling's)
            await ipykernel({"type": "request", "seq": 0, "command": "setDebuggerProperty", "arguments": {
                "dontTraceStartPatterns": [os.path.join(f, "") for f in hide], "dontTraceEndPatterns": []}})
        while self.held:
            path = self.held.pop()
            if kernel_debugger_on(kernel):
                await ipykernel({"type": "request", "seq": 0, "command": "setBreakpoints",
                                 "arguments": {"source": {"path": path}, "breakpoints": []}})
            _kept(kernel).pop(path, None)

    def tell(self, path: str, raw_cell: str, offset: int, breakpoints: list[dict[str, Any]]) -> None:
        """Say on the cell's stderr, once for each, which of its breakpoints no rank can stop at."""
        found = unreachable(raw_cell, offset, [int(b.get("line", 0)) for b in breakpoints])
        new = {n: why for n, why in found.items() if (path, n) not in self._told}
        if not new:
            return
        self._told |= {(path, n) for n in new}
        which = "this breakpoint" if len(new) == 1 else "these breakpoints"
        whys = "; ".join(f"line {n} {why}" for n, why in new.items())
        print(f"pgnb: no rank can stop at {which} of the cell: {whys}", file=sys.stderr)
