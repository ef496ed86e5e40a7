"""``--pgnb-torch``: pytest's process spends no time on the garbage collector's walks of torch's heap.

Collecting torch's tests imports torch and torch's harness into pytest's process: a heap of millions of
objects that lives as long as the process. Python's collector walks it again and again while the imports
grow it (1.1-1.3 s of a 3.9 s collection of four of torch's DTensor test files, on 2 cores), and at the
interpreter's exit it walks it again, several times, to free what the exit frees anyway (1.4 s).

So, with ``--pgnb-torch``: the collector is off while pytest collects; once collected, everything alive
is frozen (``gc.freeze``: the collector leaves those objects alone, garbage made later is collected as
usual) and the collector is on again, before any zygote or kept process is forked from here (a frozen
object's pages stay shared with them). At exit, the collector leaves alone what is alive then too.
The kept process (``--pgnb-keep``) freezes nothing after a run's collection: it collects again and
again, and what a run imported is garbage once the next run has imported the project anew.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Generator

import pytest

from . import keeper, torch_suites

_WAS_ENABLED = pytest.StashKey[bool]()
_at_exit = False


def pytest_configure(config: pytest.Config) -> None:
    global _at_exit
    if torch_suites.enabled(config) and not _at_exit:
        _at_exit = True
        atexit.register(gc.freeze)  # what is alive at exit is freed by the exit, not by walks of the heap


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    config = session.config
    if not torch_suites.enabled(config):
        return (yield)
    config.stash[_WAS_ENABLED] = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        _collector_on(config)  # collection failed before its end, or ended: on again either way


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """After the other plugins' (a plain hook runs before any wrapper's end, where the forks happen)."""
    config = session.config
    if torch_suites.enabled(config) and config.stash.get(_WAS_ENABLED, False) and not gc.isenabled():
        if keeper.root is None:
            gc.freeze()
        _collector_on(config)


def _collector_on(config: pytest.Config) -> None:
    if config.stash.get(_WAS_ENABLED, False):
        gc.enable()
