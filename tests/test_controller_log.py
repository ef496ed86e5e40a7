"""The controller's config file: one harmless ipyparallel ERROR (an engine's ``iopub_welcome``) is dropped from its
log, nothing else; and its heart monitor reports a new engine's heart at its first answer."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from traitlets.config.loader import PyFileConfigLoader

from pgnb.procs import ipcontroller_config

WELCOME = [b"d3adb33f", b'{"msg_id": "x_1", "msg_type": "iopub_welcome", "version": "5.4"}', b"{}", b"{}",
           b'{"subscription": ""}']


def _record(msg, *args, level=logging.ERROR):
    return logging.LogRecord("IPController", level, "hub.py", 331, msg, args, None)


@pytest.fixture
def controller_logger():
    """The controller's logger as it is after traitlets ran the config file (in this process)."""
    log = logging.getLogger("IPController")
    before = list(log.filters)
    path = ipcontroller_config.__file__
    PyFileConfigLoader(os.path.basename(path), path=os.path.dirname(path)).load_config()
    yield log
    log.filters[:] = before


def test_only_the_welcome_is_dropped(controller_logger):
    assert not controller_logger.filter(_record(ipcontroller_config.NO_TOPIC, WELCOME))
    other = [b"d3adb33f", b'{"msg_type": "execute_request"}']
    assert controller_logger.filter(_record(ipcontroller_config.NO_TOPIC, other))
    assert controller_logger.filter(_record("Unrecognized monitor topic: %r", b"iopub_welcome"))
    assert controller_logger.filter(_record("DB Error saving iopub message %r", "x"))


def test_importing_it_changes_no_logger():
    assert not any(isinstance(f, ipcontroller_config.IOPubWelcomeFilter)
                   for f in logging.getLogger("IPController").filters)


@pytest.mark.integration
def test_a_started_controller_logs_no_error():
    """A real start: engines greet the controller (ipykernel 7), and its log file holds no ERROR line."""
    import pgnb

    with pgnb.Sandbox(backend="gloo", world=2) as sb:
        assert sb.run(lambda: 1) == [1, 1]
        log = sb.cluster.controller.output_file  # where ipyparallel sends the controller's output
        assert os.path.dirname(log) == os.path.join(sb.cluster.profile_dir, "log")
        with open(log) as f:
            text = f.read()
    assert "[IPController] heartbeat" in text  # the log is the controller's, and it logs
    assert "ERROR" not in text, text


#: ipyparallel's heart monitor, as the controller runs it (``start_heartmonitor``) after pgnb's config file ran
MONITOR = textwrap.dedent("""
    import sys
    from traitlets.config import Config
    from ipyparallel.controller.heartmonitor import start_heartmonitor
    from pgnb.procs import ipcontroller_config
    ipcontroller_config._new_hearts_at_first_answer()
    if sys.argv[5:] == ["ping-on-connect"]:
        ipcontroller_config._ping_hearts_as_they_connect()
    config = Config()
    config.HeartMonitor.period = int(sys.argv[4])
    start_heartmonitor(*sys.argv[1:4], config=config)
""")


@pytest.mark.integration
def test_a_new_heart_is_reported_at_its_first_answer():
    """A real heart monitor, and an engine's heart as ipyparallel's ``Heart`` device is (pings in on a SUB, each
    sent back on a DEALER named by the heart): the hub hears of the new heart right after the heart first
    answers, not at the next beat (ipyparallel's own way, one period later: 1 s here)."""
    import zmq

    period = 1.0
    ctx = zmq.Context()
    monitor, hub, ping, pong = _heart_monitor(ctx, period)
    try:
        heart_in, heart_out = _heart(ctx, b"pgnb-test-heart", ping, pong)
        poller = zmq.Poller()
        poller.register(hub, zmq.POLLIN)
        poller.register(heart_in, zmq.POLLIN)
        first_ping = reported = None
        deadline = time.monotonic() + 10 * period
        while reported is None and time.monotonic() < deadline:
            for sock, _ in poller.poll(50):
                msg = sock.recv_multipart()
                if sock is heart_in:
                    first_ping = first_ping or time.monotonic()
                    heart_out.send_multipart(msg)
                elif any(b"new_heart" in part for part in msg):
                    reported = time.monotonic()
        assert first_ping is not None and reported is not None, "the heart monitor reported no new heart"
        assert reported - first_ping < period / 2, f"reported {reported - first_ping:.2f} s after the first ping"
    finally:
        monitor.kill()
        monitor.wait()
        ctx.destroy(linger=0)


def _heart_monitor(ctx, period: float, *extra: str):
    """A real heart monitor in a process of its own (pgnb's config applied), and the hub's socket that hears it."""
    import zmq

    hub = ctx.socket(zmq.SUB)  # what the hub's monitor socket is to the heart monitor
    hub.setsockopt(zmq.SUBSCRIBE, b"")
    ports = [hub.bind_to_random_port("tcp://127.0.0.1")]
    for _ in range(2):  # the monitor's ping and pong sockets bind in its own process
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.insert(-1, s.getsockname()[1])
    ping, pong, monitor_url = (f"tcp://127.0.0.1:{p}" for p in ports)
    args = [sys.executable, "-c", MONITOR, ping, pong, monitor_url, str(int(period * 1000)), *extra]
    return subprocess.Popen(args), hub, ping, pong


def _heart(ctx, name: bytes, ping: str, pong: str):
    """An engine's heart as ipyparallel's ``Heart`` device is: pings in on a SUB, each sent back on a DEALER."""
    import zmq

    heart_in, heart_out = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)
    heart_in.setsockopt(zmq.SUBSCRIBE, b"")
    heart_out.setsockopt(zmq.IDENTITY, name)
    heart_in.connect(ping)
    heart_out.connect(pong)
    return heart_in, heart_out


@pytest.mark.integration
@pytest.mark.parametrize("ping_on_connect", [True, False], ids=["pgnb", "ipyparallel"])
def test_a_heart_that_connects_between_beats_is_pinged_at_once(ping_on_connect):
    """Heart B connects right after a beat (heart A has just been pinged): with pgnb's config the monitor sends
    the beat's ping again as B connects, and the hub hears of B within a fraction of the period (3 s here);
    ipyparallel's own way, the control, waits for the next beat."""
    import json

    import zmq

    period = 3.0
    ctx = zmq.Context()
    monitor, hub, ping, pong = _heart_monitor(ctx, period, *(["ping-on-connect"] if ping_on_connect else []))
    try:
        a_in, a_out = _heart(ctx, b"heart-a", ping, pong)
        poller = zmq.Poller()
        for sock in (hub, a_in):
            poller.register(sock, zmq.POLLIN)
        b_in = b_out = None
        connected = reported = None
        deadline = time.monotonic() + 5 * period
        while reported is None and time.monotonic() < deadline:
            for sock, _ in poller.poll(20):
                msg = sock.recv_multipart()
                if sock is a_in:
                    a_out.send_multipart(msg)
                    if b_in is None:  # a beat has just been sent: B connects now, a period before the next
                        b_in, b_out = _heart(ctx, b"heart-b", ping, pong)
                        connected = time.monotonic()
                        poller.register(b_in, zmq.POLLIN)
                elif sock is b_in:
                    b_out.send_multipart(msg)
                elif msg[-1:] and b"heart-b" in msg[-1] and "heart-b" in json.loads(msg[-1]).get("hearts", []):
                    reported = time.monotonic()
        assert connected is not None and reported is not None, "the heart monitor reported no new heart B"
        took = reported - connected
        if ping_on_connect:
            assert took < period / 6, f"heart B reported {took:.2f} s after it connected"
        else:
            assert took > period / 2, f"without pgnb's config, heart B was reported {took:.2f} s after it connected"
    finally:
        monitor.kill()
        monitor.wait()
        ctx.destroy(linger=0)
