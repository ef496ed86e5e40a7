"""The exceptions pgnb raises.

Every message is one line that says what went wrong and what to do next.
The magics turn these into a plain ``UsageError`` (one line in a notebook).

    PgnbError
    ├── SpecError            bad input, refused before anything starts
    │   └── BackendUnavailable
    ├── NotStartedError      %%pg / status before %pg_init (or after shutdown)
    ├── EngineStartError     ipyparallel engines did not come up
    ├── InitError            one or more ranks failed to initialise
    │   └── InitTimeout      ranks missed pgnb's own deadline
    └── RankError            code run on ranks failed
        ├── CellTimeout      ranks still running at the --timeout
        └── RankLost         a rank's engine died
            └── WorldBroken  a process every rank needs died (controller, scheduler)

    KeyboardInterrupt
    └── Interrupted          Ctrl-C stopped %pg_init / %pg_destroy / %pg_shutdown; the state is coherent
"""

from __future__ import annotations

#: What every recovery hint points at.
RECOVER_HINT = "run `%pg_init ... --force` (Sandbox.start(force=True)) to restart the engines"
#: A lost or stuck rank's recovery where the options are not at hand (``pgnb.core.text.replace_text`` names them).
REPLACE_HINT = "run the same %pg_init again (Sandbox.start()) to replace it in place; the other ranks keep their state"
#: Said by every entry point that needs a world when there is none.
NOT_STARTED = "no process group yet: run %pg_init first (e.g. %pg_init --backend gloo --world 2), or Sandbox.start()"


class PgnbError(Exception):
    """Base class of every error pgnb raises on purpose."""


class SpecError(PgnbError, ValueError):
    """What the user asked for cannot work; nothing was started."""


class BackendUnavailable(SpecError):
    """The backend exists but this torch build or machine cannot run it."""


class NotStartedError(PgnbError):
    """There is no world to talk to yet."""

    def __init__(self, message: str = NOT_STARTED) -> None:
        super().__init__(message)


class EngineStartError(PgnbError):
    """The ipyparallel engines did not all register in time."""


class InitError(PgnbError):
    """``init_process_group`` failed on some ranks."""

    def __init__(self, message: str, failed_ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks or [])


class InitTimeout(InitError):
    """Ranks did not finish initialising within ``timeout`` seconds."""


class RankError(PgnbError):
    """Code run on the ranks raised on at least one rank."""

    def __init__(self, message: str, failed_ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks or [])


class CellTimeout(RankError):
    """Some ranks were still running when ``--timeout`` expired."""


class RankLost(RankError):
    """A rank's engine process died."""


class WorldBroken(RankLost):
    """A process the whole world depends on died (the ipyparallel controller or one of its schedulers)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (the stop button) interrupted a lifecycle call; pgnb cleaned up before raising this.

    A ``KeyboardInterrupt``, so a script calling ``Sandbox.start`` still stops on Ctrl-C.
    ``action`` is ``init``, ``destroy`` or ``shutdown``; ``phase`` what it was doing;
    ``outcome`` what exists now and what to run next.
    """

    def __init__(self, action: str, phase: str, outcome: str) -> None:
        super().__init__(f"{action} interrupted while {phase}; {outcome}")
        self.action, self.phase, self.outcome = action, phase, outcome
