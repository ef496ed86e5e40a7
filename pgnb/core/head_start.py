"""A world's hosting started before the world: its reaper and controller boot while the caller does other work.

``pytest --pgnb-torch`` knows, before it collects, that a world will follow and where its
processes will run (pgnb's fork launcher, on this machine). Its controller needs nothing that
pytest collects, so it is started first (``start``), and the world's cold start takes it
(``hosting_for``) instead of starting one: the controller, a fresh Python, boots while pytest
imports torch (a run 0.16-0.26 s shorter on 2 cores, docs/performance.md).

Until the world takes it, no thread waits on the controller's process: the zygotes are forked
from this process at collection's end, which must then have no thread but its own
(``pgnb.procs.prefork``). A head start belongs to the process that made it (a process forked
from it takes nothing), and one that no world took is stopped by ``close``. If this process is
killed, the head start's reaper stops the controller, as any world's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from ..spec import WorldSpec
from . import cluster
from .hosting import Hosting


class _Started(NamedTuple):
    pid: int  # the process that started it: the only one that may take or stop it
    options: tuple[str, str | None, str | None]  # the hosting options it was started for
    hosting: Hosting


_started: _Started | None = None  # until taken or closed
_taken = False  # a world of this process took one


def _options(spec: WorldSpec) -> tuple[str, str | None, str | None]:
    return spec.launcher, spec.profile, spec.cluster_id


def start(spec: WorldSpec) -> None:
    """Start ``spec``'s reaper and controller now, for the first cold world of the same hosting options."""
    global _started, _taken
    _taken = False
    # attached, or engines elsewhere: nothing of ours to start early; nor if its waiting thread cannot wait
    if _started is not None or not spec.local or not cluster.can_defer_waits():
        return
    hosting = Hosting(spec, lambda: None)
    cluster.defer_waits()
    try:
        hosting.pool.start_controller(spec.world)
    except BaseException:
        cluster.start_deferred_waits()
        hosting.stop(grace=0.5)
        raise
    _started = _Started(os.getpid(), _options(spec), hosting)


def _own() -> Hosting | None:
    """The hosting this process started ahead, handed over once (its waiting threads started)."""
    global _started
    if _started is None or _started.pid != os.getpid():
        return None
    hosting, _started = _started.hosting, None
    cluster.start_deferred_waits()
    return hosting


def hosting_for(spec: WorldSpec, check: Callable[[], None]) -> Hosting:
    """A cold world's hosting: the one this process started ahead for ``spec``'s hosting options (once), else a
    new one (``check``: called in every wait for the engines)."""
    global _taken
    if _started is not None and _started.options == _options(spec) and (hosting := _own()) is not None:
        hosting.pool.check = check
        _taken = True
        return hosting
    return Hosting(spec, check)


def taken() -> bool:
    """Whether a world of this process took a hosting started ahead."""
    return _taken


def close() -> None:
    """Stop the hosting started ahead if no world took it (only in the process that started it)."""
    if (hosting := _own()) is not None:
        hosting.stop(grace=0.5)
