"""pytest-cov's measurement on this rank: the lines a rank runs count in the pytest run's report.

The pytest side (``pgnb.testing.coverage``) calls ``start`` on every rank of a
world when the world starts, if pytest-cov measures that run, and ``save`` when
the tests are over (or before the world is stopped). ``start`` measures every
thread started after it (a world test's body runs in one, ``pgnb.rank.testing``)
and, under ``--pgnb-torch``, which runs torch's tests there, the engine's own
thread; ``save`` stops and writes the data beside the pytest
process's own data file, under a name of its own (host, pid, random), where
pytest-cov's combine finds it.

coverage is imported by ``start`` only: a run without pytest-cov loads nothing here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from .._wire import CoverageRun

#: Warnings a rank would give for what only the whole run can tell (pytest-cov's xdist workers drop them too).
_QUIET = ["module-not-imported", "module-not-measured", "no-data-collected", "already-imported", "trace-changed"]
#: The Coverage measuring this rank, and how it was started.
_COV: dict[str, Any] = {}


def start(run: CoverageRun) -> bool:
    """Measure this rank from now on; False if it is measured already (a world that got a fresh group)."""
    if _COV:
        return False
    import coverage

    with _in(run["topdir"]):
        cov = coverage.Coverage(source=run["source"], branch=run["branch"], config_file=run["config_file"],
                                data_file=run["data_file"], data_suffix=True)
        cov.set_option("run:disable_warnings", _QUIET)
        cov.start()
        if not run["main_thread"]:
            # the engine's own work (every cell's messages) untraced: ~1 ms a cell less at world 2; the tracer
            # went in within cov.start(), whose frames have returned: set aside now, it has nothing pending
            sys.settrace(None)
    _COV.update(cov=cov, run=run)
    return True


def label(nodeid: str | None) -> None:
    """``--cov-context=test``: what runs from now on is the call of test ``nodeid``, labelled as pytest-cov
    labels its own process's (``<nodeid>|run``); None: no test's (``--pgnb-torch`` runs its tests unlabelled)."""
    if _COV and _COV["run"]["contexts"]:
        with contextlib.suppress(Exception):  # a coverage that is not measuring has no context to switch
            _COV["cov"].switch_context("" if nodeid is None else f"{nodeid}|run")


def save() -> bool:
    """Stop measuring and write what was measured; False if this rank was not measured."""
    if not _COV:
        return False
    cov, run = _COV.pop("cov"), _COV.pop("run")
    with _in(run["topdir"]):
        cov.stop()
        cov.save()
    return True


@contextlib.contextmanager
def _in(directory: str) -> Iterator[None]:
    """As pytest-cov does: relative sources and config files are read from its top directory."""
    try:
        before: str | None = os.getcwd()
    except OSError:  # removed under this process: stay wherever we end up
        before = None
    os.chdir(directory)
    try:
        yield
    finally:
        if before is not None:
            os.chdir(before)
