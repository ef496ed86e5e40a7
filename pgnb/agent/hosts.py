"""Whose world the tools serve, and where code may run on it.

``Host`` is what the tools need of their world's owner: the Sandbox, whether they may
start and stop it, how a stuck world is freed, and ``act``, which runs a piece of work
that talks to the ranks where it cannot interleave with other such work (or refuses in
one line). ``OwnWorld`` is ``pgnb mcp``'s: the server's own Sandbox, one action at a time.
The notebook's host (``pgnb.notebook.mcp``) runs actions on the kernel's main thread.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from mcp.server.mcpserver.exceptions import ToolError

from ..core.sandbox import Sandbox

T = TypeVar("T")

#: pgnb's notebook hint for a stuck world, in the messages of pgnb's errors
_NOTEBOOK_RECOVER = re.compile(r"run `%pg_init[^`]*`(?: \(Sandbox\.start\(force=True\)\))? to restart the engines"
                               r"|run `%pg_init[^`]*` to replace .+? in place \(the other ranks keep their state\)"
                               r"|run the same %pg_init again \(Sandbox\.start\(\)\) to replace it in place; "
                               r"the other ranks keep their state")


class Host(Protocol):
    """What the tools need of the owner of the world they serve."""

    #: the tools may start, restart and stop the world (pg_init, pg_restart, pg_destroy, pg_shutdown)
    owns_world: bool
    #: what frees ranks stuck in earlier code, in words an agent acts on
    frees: str
    #: why there is no world, and what to do
    not_started: str

    def sandbox(self) -> Sandbox | None: ...

    def set_sandbox(self, sb: Sandbox | None) -> None: ...

    def act(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` where it cannot interleave with other work on the ranks, or a one-line ``ToolError``."""
        ...

    def say(self, message: str) -> str:
        """One of pgnb's messages, its recovery hint pointing at what frees a world here."""
        ...


class OwnWorld:
    """``pgnb mcp``'s world: one Sandbox for the session, one action on it at a time.

    The SDK runs each tool call in a worker thread; an action that finds another one
    going (a ``pg_run`` waiting for its ranks) is refused at once rather than queued:
    ``pg_stacks`` and ``pg_status`` answer meanwhile without it.
    """

    owns_world = True
    frees = "call pg_restart (restarts the engines with the same options), or pg_shutdown"
    not_started = "no world yet: call pg_init first (e.g. backend gloo, world 2)"

    def __init__(self) -> None:
        self._sb: Sandbox | None = None
        self._lock = threading.Lock()
        self._doing = ""

    def sandbox(self) -> Sandbox | None:
        return self._sb

    def set_sandbox(self, sb: Sandbox | None) -> None:
        self._sb = sb
        if sb is not None and "torch" not in sys.modules:
            # a run's values come back pickled, and the first tensor unpickled imports torch here (3-10 s on
            # 2 busy cores): import it now, beside the world's start, not inside the first run's time
            threading.Thread(target=importlib.import_module, args=("torch",), name="pgnb-import-torch",
                             daemon=True).start()

    def act(self, what: str, fn: Callable[[], T]) -> T:
        if not self._lock.acquire(blocking=False):
            raise ToolError(f"cannot {what} now: {self._doing or 'another call'} is still going; "
                            "pg_stacks shows where the ranks are, pg_status what the world is")
        self._doing = what
        try:
            return fn()
        finally:
            self._doing = ""
            self._lock.release()

    def say(self, message: str) -> str:
        return _NOTEBOOK_RECOVER.sub("call pg_restart to restart the engines", message)

    def close(self) -> None:
        """Shut the world down (the session ended); the reaper covers a server that cannot get here."""
        sb, self._sb = self._sb, None
        if sb is not None:
            with contextlib.suppress(Exception):
                sb.shutdown()
