"""pytest-cov counts what the ranks ran: ``pytest --cov=PKG`` reports the lines the ranks executed.

pytest-cov measures the pytest process only, and pgnb's ranks are engines that
were forked before any test began, so nothing of coverage's own subprocess
machinery reaches them. When pytest-cov measures a run (``--cov`` given, no
``--no-cov``), the plugin hooks the run's ``WorldPool`` (``measure``): every world
the pool starts measures its ranks with the run's own settings (sources,
branch, config file, data file; ``pgnb.rank.coverage``), and every world the
pool retires saves what its ranks measured before it is stopped. When the tests
are over, ``save_all`` saves the rest: each rank writes a data file of its own
beside the pytest process's, before pytest-cov combines that directory's files
into its report (the plugin's ``pytest_runtestloop`` wrapper runs inside
pytest-cov's). Marker tests and ``--pgnb-torch`` alike: both get their worlds from
the pool.

Without pytest-cov, or with ``--no-cov``, this module is not imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .._wire import CoverageRun
    from ..core.sandbox import Sandbox
    from .worlds import WorldPool

_log = logging.getLogger(__name__)

#: Seconds the ranks get to start measuring (the first imports coverage: ~0.1 s) and to save.
TIMEOUT = 30.0
#: The run's ``save_all``, once its pool is measured.
_SAVE_ALL = pytest.StashKey[Callable[[], None]]()


class RankCoverageWarning(UserWarning):
    """pytest-cov could not measure a world's ranks (their lines count as not run); the warning says why."""


def coverage_run(config: pytest.Config, engine_thread: bool = False) -> CoverageRun | None:
    """How the ranks should measure, as pytest-cov measures this process; None if it does not.
    ``engine_thread``: the engines' own thread too (it is under ``--pgnb-torch`` in any case)."""
    plugin = config.pluginmanager.get_plugin("_cov")
    controller = getattr(plugin, "cov_controller", None)
    cov = getattr(controller, "cov", None)
    if controller is None or cov is None or getattr(plugin, "_disabled", False):
        return None
    topdir = str(controller.topdir)
    options = getattr(plugin, "options", None)
    return {
        "source": list(controller.cov_source) if controller.cov_source is not None else None,
        "branch": controller.cov_branch,
        "config_file": controller.cov_config,
        "data_file": os.path.join(topdir, str(cov.config.data_file)),  # absolute stays absolute
        "topdir": topdir,
        "contexts": getattr(options, "cov_context", None) == "test",
        "main_thread": engine_thread or _torch_on_ranks(config),
    }


def _torch_on_ranks(config: pytest.Config) -> bool:
    """``--pgnb-torch``: torch's tests (both harnesses) run in the engines' own thread. Its plugin is looked up
    as pytest registered it (an import would make a cycle: torch_suites -> plugin -> this module)."""
    suites = config.pluginmanager.get_plugin("pgnb.testing.torch_suites")
    return bool(suites is not None and suites.enabled(config))


def measure(config: pytest.Config, pool: WorldPool, engine_thread: bool = False) -> None:
    """Measure the ranks of every world ``pool`` starts from now on, and save before each is stopped;
    ``engine_thread``: a test runs code in the engines' own thread (``pgnb_world.run``)."""
    state: dict[str, bool] = {"done": False}

    def on_start(sb: Sandbox) -> None:
        run = coverage_run(config, engine_thread)
        if run is not None and not state["done"]:
            start(sb, run)

    def on_stop(sb: Sandbox) -> None:
        if not state["done"]:
            save(sb)

    def save_all() -> None:
        state["done"] = True
        for sb in pool.worlds().values():
            save(sb)

    pool.on_start.append(on_start)
    pool.on_stop.append(on_stop)
    config.stash[_SAVE_ALL] = save_all


def save_all(config: pytest.Config) -> None:
    """Save what every warm world's ranks measured (the tests are over; pytest-cov combines next)."""
    fn = config.stash.get(_SAVE_ALL, None)
    if fn is not None:
        fn()


def measure_world(config: pytest.Config, sb: Sandbox, engine_thread: bool = True) -> None:
    """Measure the ranks of a world the run's pool did not start, if pytest-cov measures this run; whoever
    started it calls ``save(sb)`` before stopping it, and before the tests are over (pytest-cov combines then)."""
    run = coverage_run(config, engine_thread)
    if run is not None:
        start(sb, run)


def start(sb: Sandbox, run: CoverageRun) -> None:
    """Measure the ranks of ``sb``; a world that cannot gives one warning line and runs its tests unmeasured."""
    from ..errors import PgnbError
    from ..rank import coverage as rank_coverage

    try:
        sb.run(rank_coverage.start, run, timeout=TIMEOUT)
    except PgnbError as e:
        warnings.warn(RankCoverageWarning(f"pytest-cov cannot measure the ranks of a world of {sb.spec.world} "
                                          f"(their lines count as not run): {_line(e)}"), stacklevel=1)


def save(sb: Sandbox) -> None:
    """Save what the ranks of ``sb`` measured; a rank that was lost or is stuck keeps its data (lost)."""
    from ..errors import PgnbError
    from ..rank import coverage as rank_coverage

    try:
        sb.run(rank_coverage.save, timeout=TIMEOUT)
        return
    except PgnbError as e:
        _log.debug("saving the ranks' coverage: %s", e)
    for r in range(sb.spec.world):  # one at a time: the ranks that can still answer do
        with contextlib.suppress(PgnbError):
            sb.run(rank_coverage.save, ranks=[r], timeout=TIMEOUT)


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__

