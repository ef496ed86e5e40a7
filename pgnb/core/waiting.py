"""Waiting with a deadline, written once: every bounded wait on a condition pgnb cannot be told of.

Where a real event exists (an ``AsyncResult``'s ``wait``, a thread's ``Event``),
wait on it instead; this is for facts only a look can tell (a process gone,
a file complete, a Client that noticed an engine leave).
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: seconds between two looks: short against what pgnb waits for (tens of ms to seconds), cheap to look
STEP = 0.02


def poll_until(done: Callable[[], object], timeout: float, step: float = STEP) -> bool:
    """Look at ``done()`` until it is true or ``timeout`` seconds have passed; whether it became true.

    ``done`` is asked at least once, also with ``timeout <= 0``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(step, left))
