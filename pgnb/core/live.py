"""A running cell, live: what each rank has printed so far, its state, and where it waits.

While ``run_cell`` waits for the ranks it calls ``LiveCell.tick`` about every
``pgnb.core.dispatch.TICK`` seconds. At most ``UPDATES_PER_SECOND`` times a
second the tick reads what arrived since the last look, from each rank's
AsyncResult (its stdout, stderr and displays, which the Client's I/O thread
fills in as the engine's iopub messages come), and hands it with every
rank's state to a ``LiveSink``: the notebook's live view, a terminal's
``[rank N]`` lines, or a ``Sandbox.execute(on_output=...)`` callback.

Which ``torch.distributed`` call a rank waits in comes from sampling: a rank
that has run longer than ``SAMPLE_AFTER`` seconds is asked for its Python
stack (the dump ``--timeout`` uses, ``pgnb.rank.stacks``) every ``SAMPLE_EVERY``
seconds, without waiting for the answer: each sample reads the answer to the
previous one's request, so a rank that cannot answer (it holds the GIL) never
holds the tick up. Nothing on the rank is wrapped.

What the notebook keeps of a rank's stream is ``pgnb.core.terminal.settle``'s form.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .dispatch import Dispatch
from .remote import ename, outcome
from .sending import sent_back
from .stacks import ASKED, dump_stacks

#: At most this many updates reach a sink per second (a print loop cannot flood the browser).
UPDATES_PER_SECOND = 10
#: A rank running this long is sampled for the torch.distributed call it waits in ...
SAMPLE_AFTER = 2.0
#: ... this often.
SAMPLE_EVERY = 1.0

Stream = Literal["stdout", "stderr", "display"]
LiveState = Literal["running", "finished", "failed", "lost"]
#: ``Sandbox.execute(on_output=fn)``: ``fn(rank, stream, data)``
OutputFn = Callable[[int, Stream, Any], None]

#: a frame line of a trimmed stack in torch.distributed, with or without its line number
_TORCH_FRAME = re.compile(r'torch/distributed/[^\s",]+"?(?:, line \d+)?, in (?P<func>\w+)')


@dataclass(frozen=True)
class OutputEvent:
    """Something one rank sent: text on a stream, or a display's mime bundle."""

    rank: int
    stream: Stream
    data: Any  # str for stdout/stderr, a mime bundle (dict) for display


@dataclass(frozen=True)
class RankProgress:
    """One rank of a running cell, as the live view shows it."""

    rank: int
    state: LiveState
    seconds: float  # since the cell started on it (until it ended)
    ename: str = ""  # failed: the exception's name
    waiting_in: str = ""  # the torch.distributed call it was last seen blocked in
    waiting_seconds: float = 0.0  # how long it has been seen there

    def text(self, whole: bool = False) -> str:
        """``running 14 s · waiting in all_reduce for 12 s``, ``finished in 0.4 s``, ``failed (ZeroDivisionError)``.

        ``whole``: a running rank's times in whole seconds (a live view's lane then changes once a second).
        """
        secs = (lambda s: f"{int(s)} s") if whole else _secs
        if self.state == "running":
            out = f"running {secs(self.seconds)}"
            if self.waiting_in:
                out += f" · waiting in {self.waiting_in}" + (
                    f" for {secs(self.waiting_seconds)}" if self.waiting_seconds >= 1 else "")
            return out
        if self.state == "finished":
            return f"finished in {_secs(self.seconds)}"
        if self.state == "failed":
            return f"failed ({self.ename})" if self.ename else "failed"
        return "lost"


class LiveSink(Protocol):
    """Where a live cell's news goes (the notebook's view, a terminal, an API callback)."""

    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None: ...


class CallbackSink:
    """``Sandbox.execute(on_output=fn)``: ``fn(rank, stream, data)`` for every piece, in arrival order."""

    def __init__(self, fn: OutputFn) -> None:
        self.fn = fn

    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        for e in events:
            self.fn(e.rank, e.stream, e.data)


@dataclass
class _Seen:
    stdout: str = ""
    stderr: str = ""
    outputs: int = 0
    waiting_in: str = ""
    waiting_since: float = 0.0
    sampled_at: float = 0.0


class LiveCell:
    """Reads a running cell's ranks for a ``LiveSink`` (main thread: it uses the Client)."""

    def __init__(self, world: Dispatch, ars: list[tuple[int, Any]], sink: LiveSink, code: str = "") -> None:
        self.world = world
        self.ars = ars
        self.sink = sink
        self.code = code
        self.started = time.monotonic()
        self._seen = {r: _Seen() for r, _ in ars}
        self._ended: dict[int, float] = {}
        self._last = self.started  # the first look after 1/UPDATES_PER_SECOND: a quick cell sends nothing live

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last < 1.0 / UPDATES_PER_SECOND:
            return
        self._last = now
        self._sample(now)
        self.sink.update(self._events(), self._progress(now))

    def flush(self, lost: dict[int, str] | None = None) -> None:
        """The last update, once the wait is over (whatever arrived meanwhile, the final states)."""
        self.sink.update(self._events(), self._progress(time.monotonic(), lost or {}))

    # ---- reading ------------------------------------------------------------
    def _events(self) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        for r, ar in self.ars:
            seen = self._seen[r]
            for name in ("stdout", "stderr"):
                text = _text(sent_back(ar, name))
                delta = _since(getattr(seen, name), text)
                if delta:
                    out.append(OutputEvent(r, name, delta))
                    setattr(seen, name, text)
            outputs = list(sent_back(ar, "outputs") or [])
            for o in outputs[seen.outputs:]:
                out.append(OutputEvent(r, "display", dict(o.get("data", {}))))
            seen.outputs = max(seen.outputs, len(outputs))
        return out

    def _progress(self, now: float, lost: dict[int, str] | None = None) -> list[RankProgress]:
        rows = []
        for r, ar in self.ars:
            seen = self._seen[r]
            if lost and r in lost:
                rows.append(RankProgress(r, "lost", self._end(r, now)))
                continue
            if not ar.ready():
                waiting = seen.waiting_in
                rows.append(RankProgress(r, "running", now - self.started, waiting_in=waiting,
                                         waiting_seconds=now - seen.waiting_since if waiting else 0.0))
                continue
            state, ename = _outcome(ar)
            rows.append(RankProgress(r, state, self._end(r, now), ename=ename))
        return rows

    def _end(self, rank: int, now: float) -> float:
        return self._ended.setdefault(rank, now) - self.started

    def _sample(self, now: float) -> None:
        """Ask the ranks that have run long where they are (one stack dump each, at most every SAMPLE_EVERY s)."""
        if now - self.started < SAMPLE_AFTER:
            return
        due = [r for r, ar in self.ars if not ar.ready() and now - self._seen[r].sampled_at >= SAMPLE_EVERY]
        if not due:
            return
        infos = self.world.rank_infos
        # wait=0: the answers to the previous sample's requests; a rank that cannot answer holds nothing up
        stacks = dump_stacks({r: infos[r] for r in due}, self.world.scratch_dir, self.code, wait=0)
        for r in due:
            seen = self._seen[r]
            seen.sampled_at = time.monotonic()
            stack = stacks.get(r)
            if stack is not None and stack.note == ASKED:
                continue  # its answer is read at the next sample
            call = _waiting_in(stack.frames) if stack is not None else ""
            if call != seen.waiting_in:
                seen.waiting_in, seen.waiting_since = call, now


def _since(before: str, now: str) -> str:
    """What ``now`` adds to ``before``. ipyparallel collapses carriage returns as they arrive, so the
    last line of a stream can be redrawn rather than grown: then the new text redraws that line."""
    if now.startswith(before):
        return now[len(before):]
    same = 0
    for a, b in zip(before, now, strict=False):
        if a != b:
            break
        same += 1
    return "\r" + now[before.rfind("\n", 0, same) + 1:]


def _waiting_in(frames: tuple[str, ...]) -> str:
    """The innermost torch.distributed function in a trimmed stack, or ``""``."""
    for line in reversed(frames):
        m = _TORCH_FRAME.search(line)
        if m and m["func"] != "wrapper":
            return m["func"]
    return ""


def _outcome(ar: Any) -> tuple[LiveState, str]:
    try:
        reply = ar.get(timeout=0)
    except Exception as e:  # the apply failed: an engine that died, or an interrupt outside the cell
        return ("lost", "") if outcome(e) == "lost" else ("failed", ename(e))
    if isinstance(reply, dict) and not reply.get("ok", True):
        return "failed", str(reply.get("ename", ""))
    return "finished", ""


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(v or "" for v in value)
    return str(value or "")


def _secs(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
