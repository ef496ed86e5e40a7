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

It also tells pgnb which processes are the controller's own (issue 15): once
the controller has started its schedulers and heart monitor, it writes their
pids, and the exit status of any that already ended, to
``log/pgnb-schedulers-<cluster_id>.json`` in the profile (0600). pgnb watches
them from that list: a scheduler killed while the controller still boots is
reaped by the controller at once and would otherwise leave no trace, while
the world it serves stays silently broken.

And an engine's registration completes a heartbeat sooner. The hub completes
it when its heart monitor (a process the controller forks after running this
file) reports the engine's heart as new; ipyparallel's monitor does so at the
beat after the one the heart first answered, 100-200 ms after the engine is
ready with pgnb's 100 ms period. Here it reports a new heart at its first
answer (``_new_hearts_at_first_answer``): a cold ``%pg_init --world 4`` is
ready ~0.15 s sooner. What counts as a missed beat, and when an engine is
declared dead, is unchanged. And a heart that connects between two beats is
sent the beat's ping again at once (``_ping_hearts_as_they_connect``), while
the monitor knows few hearts: it need not wait up to a period for the next
beat. A cold ``%pg_init --world 4``: 1.84 s against 1.90 s (median of 8,
alternating). Where the monitor is not forked (a start method other than
fork), it keeps ipyparallel's way.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

#: the hub's format string for a monitor message it cannot route (ipyparallel/controller/hub.py)
NO_TOPIC = "Monitor message without topic: %r"


class IOPubWelcomeFilter(logging.Filter):
    """Drop the hub's "Monitor message without topic" record when the message is an ``iopub_welcome``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == NO_TOPIC and "iopub_welcome" in repr(record.args))


def schedulers_path(profile_dir: str, cluster_id: str) -> str:
    """Where the controller of ``cluster_id`` lists its own processes for pgnb."""
    return os.path.join(profile_dir, "log", f"pgnb-schedulers-{cluster_id}.json")


def read_schedulers(profile_dir: str, cluster_id: str) -> dict[int, int | None] | None:
    """What the controller of ``cluster_id`` listed: pid -> exit status (None: running then); None: no list yet."""
    try:
        with open(schedulers_path(profile_dir, cluster_id)) as f:
            return {int(p["pid"]): (None if p.get("exitcode") is None else int(p["exitcode"])) for p in json.load(f)}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_schedulers(app: Any) -> None:
    """Write the controller's scheduler processes (and heart monitor): name, pid, exit status if ended."""
    procs = [(str(getattr(c, "name", "")), getattr(c, "launcher", c)) for c in app.children]
    monitor = getattr(app, "heartmonitor_process", None)
    if monitor is not None:
        procs.append(("HeartMonitor", monitor))
    listed = [{"name": name, "pid": p.pid, "exitcode": p.exitcode} for name, p in procs
              if getattr(p, "pid", None) is not None]  # threads (use_threads) have no pid: nothing to watch
    path = schedulers_path(str(app.profile_dir.location), str(app.cluster_id))
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(listed, f)
    os.replace(path + ".tmp", path)


def _list_schedulers_once_started() -> None:
    """Have ``IPController.start`` list its processes right after starting them (before its loop runs)."""
    from ipyparallel.controller.app import IPController

    init_signal = IPController.init_signal
    if getattr(init_signal, "pgnb", False):
        return

    def listed_then_init_signal(self: Any) -> None:
        try:
            write_schedulers(self)
        except Exception as e:  # pgnb then watches the processes it can see
            self.log.warning("pgnb: cannot list the controller's processes: %s", e)
        init_signal(self)

    listed_then_init_signal.pgnb = True  # type: ignore[attr-defined]
    IPController.init_signal = listed_then_init_signal


def _new_hearts_at_first_answer() -> None:
    """The heart monitor tells the hub of a new engine's heart when it first answers a ping, not at the beat
    after (the hub completes an engine's registration then: a period sooner, 100 ms with pgnb's period)."""
    from ipyparallel.controller.heartmonitor import HeartMonitor

    handle_pong = getattr(HeartMonitor, "handle_pong", None)
    if handle_pong is None or getattr(handle_pong, "pgnb", False) or not hasattr(HeartMonitor, "handle_new_hearts"):
        return  # (another ipyparallel: registrations complete at the next beat, as it does them)

    def handle_pong_then_new_heart(self: Any, msg: list[bytes]) -> None:
        handle_pong(self, msg)
        try:
            heart = msg[0]
            if heart in self.responses and heart not in self.hearts:  # what the next beat would find new
                self.handle_new_hearts({heart})
        except Exception as e:  # the beat reports it then, as ipyparallel does
            self.log.debug("pgnb: new heart not reported early: %s", e)

    handle_pong_then_new_heart.pgnb = True  # type: ignore[attr-defined]
    HeartMonitor.handle_pong = handle_pong_then_new_heart


#: after a heart connects, when to send it the current beat's ping again (seconds): its subscription reaches the
#: monitor's PUB socket just after the connection, and a ping sent before that is not delivered to it
PING_AGAIN_AFTER = (0.005, 0.03)
#: every heart answers every ping: past this many hearts, the pings again would cost more than a beat's wait saves
#: (a world of 64 took 0.1-0.7 s longer to start with them for every heart)
PING_AGAIN_UP_TO = 16


def _ping_hearts_as_they_connect() -> None:
    """A heart that connects is sent the current beat's ping again a few ms later, rather than waiting up to a
    period for the next beat: with ``_new_hearts_at_first_answer`` its engine's registration completes then.

    It is the ping of the beat under way (the same lifetime), so an answer counts for that beat as any answer
    does: what counts as a missed beat is unchanged. Every connected heart answers it, so it is sent only while
    the monitor knows fewer than ``PING_AGAIN_UP_TO`` hearts, coalesced: those of ``PING_AGAIN_AFTER`` per burst
    of connections."""
    from ipyparallel.controller.heartmonitor import HeartMonitor

    start = HeartMonitor.start
    if getattr(start, "pgnb", False):
        return

    def ping_again(self: Any) -> None:
        self._pgnb_pings_due -= 1
        self.ping_stream.send(str(self.lifetime).encode("ascii"))
        self.ping_stream.flush()

    def connected(self: Any, _event: list[bytes]) -> None:
        if self._pgnb_pings_due or len(self.hearts) >= PING_AGAIN_UP_TO:  # (a burst: the pings due reach them)
            return
        self._pgnb_pings_due = len(PING_AGAIN_AFTER)
        for delay in PING_AGAIN_AFTER:
            self.loop.call_later(delay, ping_again, self)

    def start_then_watch_connections(self: Any) -> None:
        start(self)  # beats from now on (it first waits for the hub to subscribe)
        try:
            import zmq
            from zmq.eventloop.zmqstream import ZMQStream

            self._pgnb_pings_due = 0
            events = self.ping_stream.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self._pgnb_connections = ZMQStream(events)  # kept with the monitor: its stream lives as long
            self._pgnb_connections.on_recv(lambda event: connected(self, event))
        except Exception as e:  # hearts are then first pinged at the next beat, as ipyparallel does
            self.log.debug("pgnb: not watching the hearts' connections: %s", e)

    start_then_watch_connections.pgnb = True  # type: ignore[attr-defined]
    HeartMonitor.start = start_then_watch_connections


if "get_config" in globals():  # run by traitlets as a config file: the controller's logger is IPController
    logging.getLogger("IPController").addFilter(IOPubWelcomeFilter())
    _list_schedulers_once_started()
    _new_hearts_at_first_answer()
    _ping_hearts_as_they_connect()
