"""Running ``%%pg --profile``: torch.profiler on every rank around one cell, the traces merged.

``Profiling`` measures each rank's clock offset (``pgnb.core.trace_run``),
starts the profiler on every rank just before the cell is sent
(``pgnb.rank.profile.start``; an engine runs its requests in order, so the
profiler is on when the cell begins), and, once the cell has ended, stops it
on the ranks that finished and writes their Chrome traces as one file
(``pgnb.core.profile.merge``). A rank still running has no profile; a request
to stop its profiler (keeping nothing) waits behind its cell on its engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterable
from typing import Any

from .._wire import ProfileSummary
from ..rank import profile as rank_profile
from .dispatch import Dispatch
from .profile import Profile, default_path, merge
from .trace import ClockOffset
from .trace_run import measure_offsets


class Profiling:
    """One profiled cell: offsets measured and profilers started (on creation), then ``finish``."""

    def __init__(self, world: Dispatch, ranks: Iterable[int] | None = None, path: str | None = None,
                 offsets: dict[int, ClockOffset] | None = None) -> None:
        self.world = world
        self.ranks = list(range(len(world.engine_ids))) if ranks is None else list(ranks)
        self.path = path or default_path()
        self.offsets = offsets if offsets is not None else measure_offsets(world, self.ranks)
        self.token = uuid.uuid4().hex[:12]
        world.run(rank_profile.start, {}, ranks=self.ranks)

    def finish(self, running: Iterable[int], lost: Iterable[int] = ()) -> Profile:
        """Stop the profilers of the ranks that finished; merge their traces into ``self.path``."""
        busy, gone = set(running), set(lost)
        done = [r for r in self.ranks if r not in busy | gone]
        missing = {r: "lost" if r in gone else "still running" for r in self.ranks if r in busy | gone}
        for r in sorted(busy - gone):  # runs when its cell ends: no profiler stays on after it
            with contextlib.suppress(Exception):
                self.world.client[self.world.engine_ids[r]].apply_async(rank_profile.abandon)
        summaries: dict[int, ProfileSummary] = {}
        for r in done:  # one by one: a rank that fails to stop costs only its own profile
            try:
                summary = self.world.run(rank_profile.stop, self.world.scratch_dir, f"profile-{self.token}-{r}.json",
                                         ranks=[r])[0]
            except Exception as e:  # lost, or the export failed
                missing[r] = f"{type(e).__name__}"
                continue
            if summary.get("ok"):
                summaries[r] = summary
            else:
                missing[r] = str(summary.get("why", "no profile"))
        traces = {r: self._trace(s) for r, s in summaries.items()}
        path = None
        if traces:
            path = self.path
            merged = merge(traces, summaries, self.offsets)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                json.dump(merged, f)
        for s in summaries.values():
            s.pop("trace", None)  # the file has them; the summary stays small
        return Profile(self.ranks, summaries, missing, path, self.offsets)

    def _trace(self, summary: ProfileSummary) -> dict[str, Any]:
        if "trace" in summary:
            return summary["trace"]
        path = summary.get("path", "")
        try:
            with open(path) as f:
                data: dict[str, Any] = json.load(f)
                return data
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
