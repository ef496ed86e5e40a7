"""``--pgnb-torch``: the worlds' zygotes forked from pytest once it has collected torch's tests.

By the end of collection this process has imported torch, torch's test harness and
the test files, the very modules the ranks need. A zygote started afresh would import
them again (2-4 s on 2 cores, per world); forked from here it has them, and only the
engine's own modules are left for it to import, in the background, while pytest goes
on (``pgnb.core.cluster.fork_zygotes``). The ranks then run the test files as pytest collected
them a moment ago: an edit between two runs is the new code on the ranks.

Two are forked: the run's world, and one for a world started again after a failure
(which imports the engine's modules only then: ``pgnb.procs.prefork.fork_dormant``).
Where this process cannot fork safely (a thread, as under pytest-xdist's workers, or
a tracer, as under coverage) nothing is forked (``-v`` says why); each world's
zygote is then started as usual. Those no world took end with the session.
"""

from __future__ import annotations

import sys
import time

import pytest

#: Zygotes forked at the end of collection: the run's world and one spare.
COUNT = 2


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_collection_finish(session: pytest.Session) -> object:
    """After every collection_finish hook: the world's size and its preload are known."""
    result = yield
    from . import torch_suites

    config = session.config
    if torch_suites.enabled(config) and config.stash.get(torch_suites.SIZE, 0) > 0:
        from ..core import cluster

        tic = time.perf_counter()
        why = cluster.fork_zygotes(COUNT)
        said = (f"zygotes not forked from pytest ({why}): each world imports torch again" if why
                else f"{COUNT} zygotes forked from pytest in {time.perf_counter() - tic:.2f} s")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and config.option.verbose > 0:
            reporter.write_line(f"pgnb: {said}")
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    if "pgnb.core.cluster" in sys.modules:  # nothing forked otherwise
        sys.modules["pgnb.core.cluster"].close_zygotes()
