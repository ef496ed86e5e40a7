"""An extra config file for the ipyparallel controllers pgnb starts (``ipcontroller --config=<this file>``).

It silences one harmless message. ipykernel 7's IOPub thread, which
ipyparallel 9 engines use with an XPUB socket, greets every new subscriber
with an ``iopub_welcome`` message. The controller's IOPub relay subscribes
to each engine, so the welcome reaches the hub's monitor, which logs it as
``[IPController] ERROR | Monitor message without topic: [... "msg_type":
"iopub_welcome" ...]``: once per engine start, in the controller's log file,
and in the Jupyter server's terminal whenever ipyparallel's server extension
prints that log when the controller stops. Nothing is wrong; the message only
reads like a failure.

The filter drops exactly that record (that format, with ``iopub_welcome`` in
its argument); every other message of the controller, errors included, is
logged as before. traitlets runs this file in the controller process, so it
needs nothing of pgnb there; imported as a module it does nothing.
"""

from __future__ import annotations

import logging

#: the hub's format string for a monitor message it cannot route (ipyparallel/controller/hub.py)
NO_TOPIC = "Monitor message without topic: %r"


class IOPubWelcomeFilter(logging.Filter):
    """Drop the hub's "Monitor message without topic" record when the message is an ``iopub_welcome``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == NO_TOPIC and "iopub_welcome" in repr(record.args))


if "get_config" in globals():  # run by traitlets as a config file: the controller's logger is IPController
    logging.getLogger("IPController").addFilter(IOPubWelcomeFilter())
