"""The cell a Sandbox runs now and the last ones it ran, readable from any thread (a pure model).

A face that watches a world from another thread (the MCP server beside a notebook whose
main thread is busy in a ``%%pg`` cell) asks here which ranks run which code now, for
their stacks, and what the last cells printed, without touching the engines or the
Client the running cell uses.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .results import CellInterrupted, CellResult

#: How many finished cells a log keeps.
KEEP = 8


@dataclass(frozen=True)
class RunningCell:
    """A cell on its way: its code, its ranks (None: every rank), the notebook's cell number, since when."""

    code: str
    ranks: tuple[int, ...] | None
    label: int | None
    started: float  # time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class LoggedCell:
    """A cell that ended (or was interrupted) and what every rank did."""

    code: str
    label: int | None
    result: CellResult


class _Slot:
    """What ``CellLog.running`` hands the runner: ``done(result)`` records the cell's result."""

    def __init__(self) -> None:
        self.result: CellResult | None = None

    def done(self, result: CellResult) -> None:
        self.result = result


class CellLog:
    """The running cell and the last ``KEEP`` results, behind one lock."""

    def __init__(self, keep: int = KEEP) -> None:
        self._lock = threading.Lock()
        self._running: RunningCell | None = None
        self._done: deque[LoggedCell] = deque(maxlen=keep)

    @contextmanager
    def running(self, code: str, ranks: tuple[int, ...] | None, label: int | None = None) -> Iterator[_Slot]:
        """The block runs the cell; the result given to ``slot.done`` (or an interrupt's) is kept."""
        cell = RunningCell(code, ranks, label, time.monotonic())
        slot = _Slot()
        with self._lock:
            self._running = cell
        try:
            yield slot
        except CellInterrupted as e:
            slot.done(e.result)
            raise
        finally:
            with self._lock:
                if self._running is cell:
                    self._running = None
                if slot.result is not None:
                    self._done.append(LoggedCell(code, label, slot.result))

    def now(self) -> RunningCell | None:
        """The cell running now, or None."""
        with self._lock:
            return self._running

    def last(self, count: int = 1) -> list[LoggedCell]:
        """The last ``count`` cells that ended, oldest first."""
        with self._lock:
            done = list(self._done)
        return done[-count:] if count > 0 else []
