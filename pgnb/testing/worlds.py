"""Warm worlds for tests: one ``pgnb.Sandbox`` per distinct configuration, kept between tests.

A test asks the pool for a world by its options (the ``pgnb.Sandbox`` keywords:
``world``, ``backend``, ``init_method``, ``timeout``, ...). The first ask starts
it; later asks with the same options get the same warm world, across tests,
modules and classes. A test that failed, hung or left the world unusable
``recycle``s it: the next ask starts a fresh one (and shuts the retired one
down first). A test that failed but left every rank idle only needs a fresh
process group on the same engines: ``refresh``. A test that lost a rank, or left one
stuck, while the others are clean costs only those ranks: ``repair`` replaces them in
place. ``close`` stops them all (the end of a pytest session).

A world a test failed on is ``suspect``: before its next test, ``get`` (and the
runners of torch's suites, through ``healthy``) probe it (``pgnb.rank.probe``:
every rank answers, and a barrier on a group it holds completes, within
``PROBE_TIMEOUT``); a world that fails the probe is retired and a fresh one started.

Nothing here knows pytest; the plugin (``pgnb.testing.plugin``) and the runner
of torch's own suites (``pgnb.testing.torch_suites``) build on it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..core.sandbox import Sandbox
from ..spec import WorldSpec

_log = logging.getLogger(__name__)

#: A world's identity in the pool: its validated options (frozen, hashable).
WorldKey = WorldSpec
#: Seconds a suspect world's probe may take before the world is retired.
PROBE_TIMEOUT = 5.0


class WorldPool:
    """Warm worlds by configuration.

    >>> pool = WorldPool()                                 # doctest: +SKIP
    >>> sb = pool.get({"world": 4})                        # starts it (~2 s)
    >>> pool.get({"world": 4, "backend": "gloo"}) is sb    # the same options: the same warm world
    True
    >>> pool.recycle(pool.key({"world": 4}))               # dirty: stopped now, started afresh next time
    >>> pool.close()
    """

    def __init__(self) -> None:
        self._worlds: dict[WorldKey, Sandbox] = {}
        #: recycled worlds not yet shut down: the next ``get`` (or ``close``) stops them, so that a failed
        #: test's own time is not spent on its world's shutdown
        self._retired: list[Sandbox] = []
        self.starts = 0  # how many worlds this pool started (a test's report says when it paid for one)
        self._suspects: set[int] = set()  # id() of worlds a test failed on: probed before their next test
        self._repairs: dict[WorldKey, list[int]] = {}  # ranks to replace in place before a world's next test
        #: called with each world once this pool has started it, and with each before it is shut down
        #: (pytest-cov's measurement of the ranks, ``pgnb.testing.coverage``)
        self.on_start: list[Callable[[Sandbox], None]] = []
        self.on_stop: list[Callable[[Sandbox], None]] = []

    @staticmethod
    def key(options: Mapping[str, Any]) -> WorldKey:
        """The validated configuration; raises ``pgnb.SpecError`` (one line) for bad options."""
        return WorldSpec.validate(**dict(options))

    def get(self, options: Mapping[str, Any] | WorldKey) -> Sandbox:
        """The warm world for these options, started (and its group initialised) if need be.

        Raises what ``Sandbox.start`` raises (``pgnb.EngineStartError``, ``pgnb.InitError``, ...);
        a world that failed to start is not kept.
        """
        key = options if isinstance(options, WorldSpec) else self.key(options)
        self.stop_retired()
        sb = self._worlds.get(key)
        if sb is not None and not (self._repaired(key, sb) and self.healthy(sb)):
            self.recycle(key)
            self.stop_retired()
            sb = None
        if sb is not None:
            if not sb.is_initialized:  # torch's suites destroy its group (pgnb.testing.torch_suites): ~70 ms
                sb.start()
            return sb
        sb = Sandbox(spec=key)
        try:
            sb.start()
        except BaseException:
            with contextlib.suppress(Exception):
                sb.shutdown()
            raise
        self.starts += 1
        self._worlds[key] = sb
        for hook in self.on_start:
            hook(sb)
        return sb

    def suspect(self, sb: Sandbox) -> None:
        """A test failed on this world: probe it before its next test."""
        self._suspects.add(id(sb))

    def healthy(self, sb: Sandbox, group: bool = True) -> bool:
        """True unless the world is suspect and fails its probe (a world that passes is no longer suspect).
        ``group``: the probe includes a barrier on the ranks' default group (pgnb's own)."""
        if id(sb) not in self._suspects:
            return True
        from ..rank.probe import probe

        try:
            ok = all(sb.run(probe, PROBE_TIMEOUT, group, timeout=PROBE_TIMEOUT + 2.0))
        except Exception as e:  # a rank raised, was lost or did not answer in time
            _log.debug("a suspect world failed its probe: %s", e)
            ok = False
        self._suspects.discard(id(sb))
        return ok

    def has(self, key: WorldKey) -> bool:
        """A warm world of this configuration is running now."""
        return key in self._worlds

    def recycle(self, key: WorldKey | Sandbox) -> None:
        """Retire this world: the next ``get`` of its configuration starts a fresh one (the next ``get`` of
        any, or ``close``, shuts the retired one down first)."""
        if isinstance(key, Sandbox):
            key = next((k for k, v in self._worlds.items() if v is key), key.spec)
        sb = self._worlds.pop(key, None)
        self._repairs.pop(key, None)
        if sb is not None:
            self._suspects.discard(id(sb))
            self._retired.append(sb)

    def stop_retired(self) -> None:
        """Shut down the retired worlds now."""
        while self._retired:
            sb = self._retired.pop()
            for hook in self.on_stop:
                try:
                    hook(sb)
                except Exception as e:  # the world goes all the same
                    _log.debug("before stopping a recycled world: %s", e)
            try:
                sb.shutdown()
            except Exception as e:  # it is going anyway; its processes are the reaper's if shutdown failed
                _log.debug("stopping a recycled world: %s", e)

    def refresh(self, key: WorldKey) -> None:
        """A fresh default process group on the same engines (~0.1 s): after a test that failed but left
        every rank idle. A world that cannot re-initialise is recycled instead."""
        sb = self._worlds.get(key)
        if sb is None:
            return
        try:
            sb.destroy()
            sb.start()
        except Exception as e:
            _log.debug("re-initialising a world: %s", e)
            self.recycle(key)
            return
        self.suspect(sb)  # a test failed on it: probed before the next test

    def repair(self, key: WorldKey, ranks: list[int]) -> None:
        """Replace these ranks in place (lost, or a thread of theirs stuck in a test) at the next ``get``: the
        others keep their engines and what they imported. A world that cannot be repaired is recycled."""
        if key in self._worlds:
            self._repairs[key] = sorted({*self._repairs.get(key, ()), *ranks})

    def _repaired(self, key: WorldKey, sb: Sandbox) -> bool:
        ranks = self._repairs.pop(key, None)
        if ranks is None:
            return True
        try:
            sb.init(replace=ranks)
        except Exception as e:
            _log.debug("replacing ranks %s in place: %s", ranks, e)
            return False
        self.suspect(sb)  # probed now, before the test
        return True

    def worlds(self) -> dict[WorldKey, Sandbox]:
        """The warm worlds now, by configuration (a copy)."""
        return dict(self._worlds)

    def close(self) -> None:
        """Shut every world down (idempotent)."""
        for key in list(self._worlds):
            self.recycle(key)
        self.stop_retired()
