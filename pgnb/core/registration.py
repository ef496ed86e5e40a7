"""Registration notices a Client missed: the hub asked, and a new Client where it knows more engines.

An ipyparallel Client learns of each engine from the hub's registration notice,
sent once on a PUB socket. A notice sent while the Client's subscription is
still joining (a Client that connected while engines registered, on a loaded
machine) is lost, and the Client never counts that engine: a start would wait
its whole timeout for an engine the hub has. While a start waits,
``MissedNotices`` asks the hub every ``HUB_LOOK`` seconds how many engines it
has and, where it has more than the Client knows, connects a new Client (whose
connection reply lists them all) and closes the stale one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

#: Seconds between asking the hub how many engines it has, while a start waits for them
HUB_LOOK = 2.0

_log = logging.getLogger(__name__)


class MissedNotices:
    """For one start's wait: ``caught_up`` gives the Client to go on with."""

    def __init__(self, reconnect: Callable[[], Any]) -> None:
        self.reconnect = reconnect
        self.next_look = time.monotonic() + HUB_LOOK

    def caught_up(self, client: Any, known: int) -> Any:
        """``client``; or, where the hub has more engines than the ``known`` ones, a new Client (the old closed)."""
        now = time.monotonic()
        if now < self.next_look:
            return client
        self.next_look = now + HUB_LOOK
        try:
            hub = [key for key in client.queue_status() if isinstance(key, int)]
        except Exception as e:  # the hub is busy or gone: the wait's own checks say which
            _log.debug("queue_status: %s", e)
            return client
        if len(hub) <= known:
            return client
        _log.info("the Client missed %d engine registration(s); connecting again", len(hub) - known)
        fresh = self.reconnect()
        client.close()
        return fresh
