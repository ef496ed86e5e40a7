"""A kernel asked to shut down (or restart) stops pgnb's worlds at once, not at the interpreter's exit.

Jupyter gives a kernel ``shutdown_wait_time`` (5 s) from its shutdown request: SIGTERM after half of it,
SIGKILL after all of it. ipykernel's own teardown (its event loops, sockets, the history's last write) runs
before ``atexit``, and on a loaded machine it can take most of that time, so a world's shutdown left to
``atexit`` could be cut off by the SIGTERM (the reaper then stops the processes: nothing is leaked, but it is
slower). The request sets the shell's ``exit_now``; the worlds' shutdown starts there, on a thread of its own
(the kernel's reply is not held up), and ``atexit``'s shutdown waits for it (a world's lock).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..core.sandbox import shutdown_all

_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def stop_worlds_when_exiting(shell: Any) -> None:
    """Watch ``shell.exit_now`` (once per shell, however often the extension is loaded)."""
    if shell not in _watched:
        _watched.add(shell)
        shell.observe(_on_exit_now, names="exit_now")


def _on_exit_now(change: Any) -> None:
    if change["new"]:
        threading.Thread(target=shutdown_all, name="pgnb-shutdown", daemon=True).start()
