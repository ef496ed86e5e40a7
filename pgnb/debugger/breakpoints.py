"""The panel's breakpoints for ``%%pg`` cells and its exception filters: kept in the kernel, given to every rank.

Lab sets a cell's breakpoints by the path of the cell's dumped file. Those of a
``%%pg`` cell (a file whose text starts with ``%%pg``) are the ranks': the kernel
keeps them and each rank's pydevd gets them when it connects, whenever Lab changes
them, and again before the next cell when an interrupt took them away. Lab's
exception filters go to the ranks the same way, in pydevd's names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from .link import ANSWER_WAIT, Message, RankLink

#: Lab's "uncaught" means: the cell raised (IPython catches every cell's exception, so for pydevd it is handled
#: in library code, after user code).
_FILTERS = {"uncaught": "userUnhandled"}


class Breakpoints:
    """Lab's breakpoints in ``%%pg`` cells (cell file -> Lab's breakpoints) and its exception filters."""

    def __init__(self) -> None:
        self.by_path: dict[str, list[dict[str, Any]]] = {}
        self.filters: list[str] = []

    def is_pg_cell(self, path: str) -> bool:
        if path in self.by_path:
            return True
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(64).lstrip().startswith("%%pg")
        except OSError:
            return False

    def rank_filters(self) -> list[str]:
        return [_FILTERS.get(f, f) for f in self.filters]

    def listing(self) -> list[dict[str, Any]]:
        """``debugInfo``'s entries for the ranks' breakpoints (Lab redraws them from it after a reload)."""
        return [{"source": path, "breakpoints": bps} for path, bps in self.by_path.items()]

    async def set(self, path: str, wanted: list[dict[str, Any]], links: Iterable[RankLink]) -> None:
        """Lab's breakpoints for one cell, in place on every connected rank before Lab hears back (a cell run
        next must meet them)."""
        if wanted:
            self.by_path[path] = wanted
        else:
            self.by_path.pop(path, None)
        await _settle([link.send("setBreakpoints", {"source": {"path": path}, "breakpoints": wanted})
                       for link in links])

    async def set_filters(self, filters: list[str], links: Iterable[RankLink]) -> None:
        self.filters = list(filters)
        await _settle([link.send("setExceptionBreakpoints", {"filters": self.rank_filters()}) for link in links])

    def adopt(self, found: dict[str, list[dict[str, Any]]], links: Iterable[RankLink]) -> None:
        """Breakpoints the kernel's own debugger was given for ``%%pg`` cells before the bridge was there
        (``catch_up``): kept (unless Lab has set the cell's since), and every connected rank gets them."""
        for path, wanted in found.items():
            if not wanted:
                continue
            wanted = self.by_path.setdefault(path, wanted)
            for link in list(links):
                link.send("setBreakpoints", {"source": {"path": path}, "breakpoints": wanted})

    def give(self, link: RankLink) -> None:
        """A rank that just connected gets them all (before ``configurationDone`` lets it run)."""
        for path, wanted in list(self.by_path.items()):
            link.call("setBreakpoints", {"source": {"path": path}, "breakpoints": wanted})
        link.call("setExceptionBreakpoints", {"filters": self.rank_filters()})

    def give_back(self, links: Iterable[RankLink]) -> list[Future[Message]]:
        """Every rank gets them again (after ``take_away``)."""
        pending: list[Future[Message]] = []
        for link in links:
            pending += [link.send("setBreakpoints", {"source": {"path": p}, "breakpoints": wanted})
                        for p, wanted in list(self.by_path.items())]
            pending.append(link.send("setExceptionBreakpoints", {"filters": self.rank_filters()}))
        return pending

    def take_away(self, link: RankLink) -> list[Future[Message]]:
        """No breakpoint or exception stops this rank (kept here for ``give_back``)."""
        pending = [link.send("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
                   for path in list(self.by_path)]
        pending.append(link.send("setExceptionBreakpoints", {"filters": []}))
        return pending


async def _settle(sent: list[Future[Message]]) -> None:
    if sent:
        await asyncio.wait([asyncio.wrap_future(f) for f in sent], timeout=ANSWER_WAIT)
