"""``pgnb.current()``: the Sandbox the magics drive (one per kernel), or None.

The magics set it when ``%pg_init`` makes a world; it goes back to None
when that world is shut down (from a magic, a view's button or the API).
"""

from __future__ import annotations

from ..core.sandbox import Sandbox

_current: Sandbox | None = None


def current() -> Sandbox | None:
    """The Sandbox the magics drive, or None."""
    return _current


def set_current(sandbox: Sandbox | None) -> None:
    global _current
    if _current is not None:
        _current.remove_listener(_forget_when_shut_down)
    _current = sandbox
    if sandbox is not None:
        sandbox.add_listener(_forget_when_shut_down)


def _forget_when_shut_down(sandbox: Sandbox) -> None:
    global _current
    if sandbox is _current and sandbox.snapshot().phase == "shut down":
        sandbox.remove_listener(_forget_when_shut_down)
        _current = None
