"""Ctrl-C (the notebook's stop button) while pgnb starts, stops or repairs a world.

A ``KeyboardInterrupt`` can arrive anywhere in the main thread. The world's
lifecycle calls (``pgnb.core.world``) let it interrupt the long waits, then
clean up with ``deferred()``: a second Ctrl-C during the cleanup is noted,
not raised, so the cleanup always finishes and leaves a coherent state.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class _Note:
    """Whether a SIGINT arrived while deferred."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True


@contextmanager
def deferred() -> Iterator[_Note]:
    """Hold off SIGINT in this block (main thread only; elsewhere there is nothing to hold off).

    The yielded note says whether one arrived meanwhile; it is not raised afterwards.
    """
    note = _Note()
    if threading.current_thread() is not threading.main_thread():
        yield note
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except ValueError:
        yield note
        return
    if previous in (signal.SIG_IGN, None):
        yield note
        return
    signal.signal(signal.SIGINT, note)
    try:
        yield note
    finally:
        signal.signal(signal.SIGINT, previous)
