"""One moment of a world, as the views draw it: ``RankStatus`` per rank and the ``Snapshot`` of all of them.

Plain frozen values (no engines, no IPython): ``pgnb.core.world`` makes them,
the status view, the report and ``Sandbox.status()`` hand them on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .._wire import RankState, WorldPhase
from ..spec import WorldSpec


@dataclass(frozen=True)
class RankStatus:
    """One rank as the rank itself reported it (``state`` is pgnb's summary)."""

    rank: int
    world_size: int
    backend: str
    state: RankState
    host: str = ""
    pid: int | None = None
    device: str = ""
    error: str = ""
    init_seconds: float | None = None
    engine_id: int | None = None
    launcher_rank: int | None = None

    def __repr__(self) -> str:  # deterministic: no pid, host or timing
        err = f", error={self.error!r}" if self.error else ""
        return (f"RankStatus(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
                f"state={self.state!r}, device={self.device!r}{err})")


@dataclass(frozen=True)
class Snapshot:
    """Everything a view needs to draw one moment of the world."""

    spec: WorldSpec
    ranks: tuple[RankStatus, ...]
    phase: WorldPhase
    message: str = ""
    engines_up: int = 0
    started_at: float = field(default=0.0, compare=False)
    #: which world of its ``World`` this is: a new one begins at every real (re-)init
    generation: int = 0
    #: what the init that made this world did that a user must know (``pgnb.core.text.resized_text``), or ""
    note: str = ""
    #: what the start waits for outside pgnb: its batch job in the queue ("Slurm job 12: PENDING (Resources)"), or ""
    waiting: str = ""
    #: ranks that started empty beside ranks that kept their namespaces, until work is sent to them
    fresh: tuple[int, ...] = ()

    @property
    def initialized(self) -> int:
        return sum(r.state == "initialized" for r in self.ranks)

    def rows_now(self, state: RankState, error: str = "") -> tuple[RankStatus, ...]:
        """The rows, each ``state`` now (with ``error``), but those lost."""
        return tuple(replace(r, state=state, error=error) if r.state != "lost" else r for r in self.ranks)


def fresh_rows(spec: WorldSpec, state: RankState) -> tuple[RankStatus, ...]:
    """A row per rank of ``spec``, each ``state``, before any engine is known."""
    return tuple(RankStatus(r, spec.world, spec.backend, state) for r in range(spec.world))
