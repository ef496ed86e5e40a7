"""What a ``%%pg`` cell did on every rank, as one deterministic result (a pure model).

``CellResult.pieces()`` is the one ordered form the notebook shows: grouped by
rank in rank order, whatever order the output arrived in, the same on every
run. ``CellResult.text()`` flattens it; ``CellResult.error()`` is the one-line
error for the ranks that did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .._wire import CellState
from ..errors import CellTimeout, RankError, RankLost
from .profile import Profile
from .remote import ENGINE_DIED
from .terminal import settle
from .text import lost_text, one_line, ranks_text, replace_text
from .trace import Trace

_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")

#: what a rank's heading says when the cell ended early: its state, or ``interrupted`` for a rank Ctrl-C stopped
RankLabel = CellState | Literal["interrupted"]


class CellInterrupted(KeyboardInterrupt):
    """The kernel was interrupted while ranks ran a cell; ``result`` says what each rank did.

    A ``KeyboardInterrupt``, so a script calling ``Sandbox.execute`` still stops on Ctrl-C.
    """

    def __init__(self, result: CellResult) -> None:
        super().__init__(str(result.error() or "interrupted"))
        self.result = result


@dataclass(frozen=True)
class RankValue:
    """Stands in, in ``_pg``, for a last-expression value that stayed on its rank.

    Its repr is the value's text on the rank; ``reason`` says why it was not copied.
    """

    rank: int
    text: str
    reason: str

    def __repr__(self) -> str:
        return self.text


@dataclass
class RankOutput:
    rank: int
    state: CellState = "finished"
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # display_data bundles
    result: dict[str, Any] | None = None  # the mime bundle of the last expression
    value: Any = None  # the last expression's value itself (or a RankValue stand-in)
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    before_exec: bool = False  # the cell never ran (SyntaxError and friends)
    stack: list[str] = field(default_factory=list)  # where a still-running rank is blocked
    blocked_in: str = ""  # the innermost frame of that stack, e.g. "all_reduce (distributed_c10d.py)"
    stack_note: str = ""  # why there is no stack

    @property
    def value_text(self) -> str | None:
        return None if self.result is None else str(self.result.get("text/plain", ""))


@dataclass
class CellResult:
    ranks: list[RankOutput]
    world: int = 0
    recover: str = "%pg_init ..."  # the line that asks for this world again (it replaces lost and stuck ranks)
    timeout: float | None = None
    interrupted: bool = False
    trace: Trace | None = None  # when the cell ran with --trace
    profile: Profile | None = None  # when the cell ran with --profile

    @property
    def failed(self) -> list[RankOutput]:
        return [r for r in self.ranks if r.state != "finished"]

    @property
    def values(self) -> list[Any]:
        """The last expression's value per rank, indexed by rank (None: did not run or no value)."""
        out: list[Any] = [None] * max(self.world, max((r.rank + 1 for r in self.ranks), default=0))
        for r in self.ranks:
            out[r.rank] = r.value
        return out

    def _syntax_error(self) -> RankOutput | None:
        """The one SyntaxError every rank refused the cell with, if that is what happened."""
        if not self.ranks or not all(r.before_exec and r.ename in _SYNTAX_ERRORS for r in self.ranks):
            return None
        first = self.ranks[0]
        same = all((r.ename, r.evalue, r.traceback) == (first.ename, first.evalue, first.traceback)
                   for r in self.ranks)
        return first if same else None

    def pieces(self) -> list[tuple[str, Any]]:
        """What to show, in order: ``("stdout"|"stderr", text)`` or ``("display", bundle)``.

        Grouped by rank in rank order; the same cell gives the same pieces on every run.
        """
        syntax = self._syntax_error()
        if syntax is not None:  # nothing ran anywhere: say it once
            return [("stdout", f"[{ranks_text([r.rank for r in self.ranks])}]\n"),
                    ("stderr", _lines(syntax.traceback))]
        out: list[tuple[str, Any]] = []
        with_state = self.interrupted or any(r.state == "still running" for r in self.ranks)
        peer_lost = any(r.state == "lost" for r in self.ranks)
        for r in self.ranks:
            if not with_state and (r.state == "finished" or _exited(r)) and not (
                r.stdout or r.stderr or r.outputs or r.result is not None
            ):
                continue
            state: RankLabel = r.state
            if self.interrupted and r.ename == "KeyboardInterrupt":
                state = "interrupted"
            out.append(("stdout", f"[rank {r.rank}]" + (f" {state}" if with_state else "") + "\n"))
            if r.stdout:
                out.append(("stdout", _ended(settle(r.stdout))))
            if r.stderr:
                out.append(("stderr", _ended(settle(r.stderr))))
            out.extend(("display", b) for b in r.outputs)
            if r.result is not None:
                out.append(_value_piece(r))
            echo = peer_lost and r.state == "failed" and not (self.interrupted and r.ename == "KeyboardInterrupt")
            # a survivor's error echoes the lost peer; gloo words it by timing (closed, reset, read error)
            last = (f"{r.ename} (message replaced by pgnb, as gloo's varies with timing): "
                    "the connection to the lost peer broke")
            if r.traceback:
                out.append(("stderr", _lines([*r.traceback[:-1], last] if echo else r.traceback)))
            elif r.state == "failed" and r.ename and not _exited(r):  # an exit is said once, in error()
                out.append(("stderr", (last if echo else f"{r.ename}: {r.evalue}") + "\n"))
            if r.stack:
                out.append(("stderr", f"rank {r.rank} is blocked here (most recent call last):\n"
                            + _lines(r.stack)))
            elif r.state == "still running" and r.stack_note:
                out.append(("stderr", f"(no stack for rank {r.rank}: {r.stack_note})\n"))
        return _merge(out)

    def text(self) -> str:
        """Everything the ranks showed, grouped by rank: the same text every run."""
        return "".join(p if kind != "display" else _ended(str(p.get("text/plain", ""))) for kind, p in self.pieces())

    def error(self) -> RankError | None:
        """The one-line error for the failed ranks, or None."""
        bad = self.failed
        if not bad:
            return None
        running = [r for r in bad if r.state == "still running"]
        lost = [r for r in bad if r.state == "lost"]
        errors = [r for r in bad if r.state == "failed" and not (self.interrupted and r.ename == "KeyboardInterrupt")]
        stopped = [r.rank for r in bad if self.interrupted and r.ename == "KeyboardInterrupt"]
        syntax = self._syntax_error()
        if syntax is not None:
            return RankError(f"{syntax.ename}: {syntax.evalue}; the cell did not run on any rank",
                             [r.rank for r in bad])
        parts = []
        if self.interrupted:
            parts.append("interrupted" + (f": {ranks_text(stopped)} stopped" if stopped else ""))
        if errors and lost:
            # a peer died mid-collective: the survivors' gloo errors are its echo, worded by timing
            parts.append(f"{_ranks(errors)} failed ({', '.join(sorted({r.ename for r in errors}))}) "
                         "because a peer was lost")
        elif errors:
            quit_ = [r for r in errors if r.ename == "BdbQuit"]  # q at a breakpoint: the user's choice, not a bug
            if quit_:
                parts.append(f"{_ranks(quit_)} quit in the debugger")
                errors = [r for r in errors if r.ename != "BdbQuit"]
            exits: dict[str, list[int]] = {}  # sys.exit() / exit() on a rank: the call it made, e.g. sys.exit(0)
            for r in errors:
                if _exited(r):
                    exits.setdefault(r.evalue, []).append(r.rank)
            parts.extend(f"{ranks_text(rs)} called {call}" for call, rs in exits.items())
            errors = [r for r in errors if not _exited(r)]
            if errors and len({(r.ename, r.evalue) for r in errors}) == 1:
                parts.append(f"{_ranks(errors)} raised {_one_line(errors[0])}")
            elif errors:
                parts.append("; ".join(f"rank {r.rank} raised {_one_line(r)}" for r in errors))
        if lost:
            # the cause is the watcher's, e.g. "engine killed by SIGSEGV (segmentation fault)"
            parts.append(lost_text({r.rank: r.evalue if r.ename == ENGINE_DIED and r.evalue else "engine died"
                                    for r in lost}))
        if running:
            why = "could not be interrupted" if self.interrupted else (
                f"still running after the {self.timeout:g} s --timeout" if self.timeout else "still running")
            where = {r.blocked_in for r in running}
            blocked = f", blocked in {where.pop()}" if len(where) == 1 and "" not in where else ""
            parts.append(f"{_ranks(running)} {why}{blocked}")
            done = [r.rank for r in self.ranks if r.state == "finished"]
            if done:
                parts.append(f"{ranks_text(done)} finished")
        if lost or running:
            # the notebook's %pg_init replaces those ranks in place; a face whose world restarts whole names its own
            parts.append(replace_text(self.recover, [r.rank for r in [*lost, *running]])
                         if self.recover.startswith("%pg_init") else f"run `{self.recover}` to restart the engines")
        msg = "; ".join(parts)
        failed = [r.rank for r in bad]
        if running:
            return CellTimeout(msg, failed)
        if lost:
            return RankLost(msg, failed)
        return RankError(msg, failed)


def _exited(r: RankOutput) -> bool:
    """The rank's cell ended in ``sys.exit()`` / ``exit()`` (``pgnb.rank.cell.exit_call`` named the call)."""
    return r.state == "failed" and r.ename == "SystemExit" and not r.traceback


def _one_line(r: RankOutput) -> str:
    return one_line(r.ename, r.evalue, where=f"under rank {r.rank} above")  # pieces() show it whole there


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _lines(lines: list[str]) -> str:
    return _ended("\n".join(lines))


def _value_piece(r: RankOutput) -> tuple[str, Any]:
    bundle = r.result or {}
    if set(bundle) - {"text/plain"}:  # rich value: show it as the rank's own Out[] would
        labelled = dict(bundle)
        labelled["text/plain"] = f"Out[rank {r.rank}]: {bundle.get('text/plain', '')}"
        return ("display", labelled)
    return ("stdout", f"Out[rank {r.rank}]: {r.value_text}\n")


def _merge(pieces: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Join neighbouring text pieces of the same stream (fewer messages, same text)."""
    out: list[tuple[str, Any]] = []
    for kind, p in pieces:
        if out and kind != "display" and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + p)
        else:
            out.append((kind, p))
    return out


def _ranks(rows: list[RankOutput]) -> str:
    return ranks_text([r.rank for r in rows])
