"""Text as a terminal shows it: carriage returns redraw the line, a progress bar ends in one state.

A rank's ``tqdm`` bar writes ``\r`` and a whole new line many times a second.
``Lane`` keeps the lines a live view shows (bounded); ``settle`` gives the form
the notebook keeps, the same bytes on every run. ``TerminalSink`` is a running
cell's live output in a terminal IPython (or ``pgnb demo``): each line as it
comes, prefixed ``[rank N]``, as ``%%px`` does.
"""

from __future__ import annotations

import re
import sys
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: at run time this module needs nothing of the running cell's
    from .live import OutputEvent, RankProgress

#: Lines a lane keeps per rank (the notebook keeps everything, in the grouped output).
LANE_LINES = 300
#: tqdm's (and most bars') closing stats: "[00:02<00:00, 24.50it/s]", "[00:00<?, ?it/s]"
_BAR_TIMING = re.compile(r"\s*\[[0-9:]+<[0-9:?]+(?:,[^\]]*)?\]\s*$")
#: a percentage bar: "100%|##########|"
_BAR = re.compile(r"\d+%\|")


class Lane:
    """One rank's text as a terminal would show it: ``\r`` rewrites the line, at most ``limit`` lines kept.

    Each stream has its own open line: a progress bar redrawn on stderr stays one
    line at the bottom while the rank prints finished lines to stdout above it
    (``tqdm.write`` does this in a terminal).
    """

    def __init__(self, limit: int = LANE_LINES) -> None:
        self.lines: deque[str] = deque(maxlen=limit)
        self.open: dict[str, str] = {}  # stream -> its line not ended yet
        self.dropped = 0

    @property
    def current(self) -> list[str]:
        """The open lines, one per stream that has one (stdout first)."""
        return [self.open[k] for k in sorted(self.open) if self.open[k]][::-1]

    def feed(self, text: str, stream: str = "stdout") -> None:
        parts = text.split("\n")
        current = self.open.get(stream, "")
        for i, part in enumerate(parts):
            if "\r" in part:
                # a bar redraws the whole line; what is left after the last \r (if anything) is the line now
                tail = part.rsplit("\r", 1)[1]
                current = tail if tail else current
            else:
                current += part
            if i < len(parts) - 1:
                if len(self.lines) == self.lines.maxlen:
                    self.dropped += 1
                self.lines.append(current)
                current = ""
        self.open[stream] = current

    def text(self) -> str:
        return "\n".join([*self.lines, *self.current])


def settle(text: str) -> str:
    """A rank's stream as the notebook keeps it: the same bytes on every run.

    Carriage returns are collapsed as a terminal shows them (each line keeps
    what was drawn last; ipyparallel has often done so already), and on a
    progress bar's line, trailing timing like ``[00:02<00:00, 24.5it/s]`` is
    dropped: a bar keeps its final state (``100%|##########| 50/50``), not how
    fast it got there.
    """
    if "\r" not in text and "%|" not in text:
        return text
    out = []
    for line in text.split("\n"):
        if "\r" in line:
            segments = [s for s in line.split("\r") if s]
            line = segments[-1] if segments else ""
        if _BAR.search(line):
            line = _BAR_TIMING.sub("", line)
        out.append(line)
    return "\n".join(out)


class TerminalSink:
    """A terminal's live output: every line as it comes, ``[rank N]`` first (stderr lines on stderr)."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def update(self, events: list[OutputEvent], ranks: list[RankProgress]) -> None:
        for e in events:
            if e.stream == "display":
                continue  # a terminal cannot show it; the grouped output has its text form
            key = (e.rank, e.stream)
            text = self._partial.pop(key, "") + str(e.data)
            *lines, rest = text.split("\n")
            if rest:
                self._partial[key] = rest
            out = sys.stdout if e.stream == "stdout" else sys.stderr
            for line in lines:
                out.write(f"[rank {e.rank}] {line.rsplit(chr(13), 1)[-1]}\n")
            out.flush()

    def close(self) -> None:
        """Lines that never got their newline."""
        for (rank, stream), rest in sorted(self._partial.items()):
            (sys.stdout if stream == "stdout" else sys.stderr).write(f"[rank {rank}] {rest.rsplit(chr(13), 1)[-1]}\n")
        self._partial.clear()
