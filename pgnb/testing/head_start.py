"""``--pgnb-torch``: the world's controller boots while pytest collects (``pgnb.core.head_start``).

The controller, a fresh Python, needs nothing pytest collects; started before collection, it is
up by the time the first world starts, which then only forks its engines from the zygote
collection left (``pgnb.testing.zygotes``). Not in a run that starts no world here: one that only
collects, pytest-xdist's (its workers run the tests), or a run of the kept process
(``--pgnb-keep``: its worlds are warm). What no world took is stopped when pytest ends.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Generator

import pytest

from . import keeper, torch_suites

_log = logging.getLogger("pgnb")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    config = session.config
    if torch_suites.enabled(config) and keeper.root is None and not config.option.collectonly \
            and not getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from ..core import head_start
        from ..spec import WorldSpec

        try:
            head_start.start(WorldSpec.validate(world=1))
        except Exception as e:  # only a head start: the world starts its own controller, and says what fails
            _log.debug("pgnb: no controller started while pytest collects: %s", e)
    return (yield)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    head_start = sys.modules.get("pgnb.core.head_start")
    if head_start is not None and head_start.taken() and config.option.verbose > 0:
        terminalreporter.write_line("pgnb: the world took the controller started while pytest collected")


def pytest_unconfigure(config: pytest.Config) -> None:
    if "pgnb.core.head_start" in sys.modules:  # nothing started otherwise
        sys.modules["pgnb.core.head_start"].close()
