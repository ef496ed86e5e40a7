"""The controller's log: one harmless ipyparallel ERROR (an engine's ``iopub_welcome``) is dropped, nothing else."""

from __future__ import annotations

import logging
import os

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
