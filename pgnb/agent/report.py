"""What the tools answer: typed results (the structured form) and the short text an agent reads.

Pure values made from pgnb's own (``Snapshot``, ``CellResult``, ``Stack``): no World, no
engines. Every text form has one section per rank, in rank order; a long stream is cut in
the middle and says how much was cut, in both forms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pydantic import BaseModel, Field

from ..core.cell_log import LoggedCell, RunningCell
from ..core.results import CellResult, RankOutput
from ..core.snapshot import Snapshot
from ..core.stacks import Stack
from ..core.text import ranks_text

#: Characters of one rank's stream kept: its head and its tail, the middle cut.
HEAD, TAIL = 1000, 3000


class RankRow(BaseModel):
    rank: int
    state: str = Field(description="starting, pending, initialized, failed, destroyed or lost")
    host: str = ""
    pid: int | None = None
    device: str = ""
    error: str = ""


class WorldState(BaseModel):
    phase: str = Field(description="new, starting engines, importing torch, rendezvous, initialized, failed, "
                                   "destroyed, shut down; 'none' before pg_init")
    backend: str = ""
    world: int = 0
    init_method: str = ""
    ranks: list[RankRow] = []
    running: list[int] = Field(default=[], description="ranks running code now (a pg_run, or the notebook's cell)")
    running_for: float | None = Field(default=None, description="seconds the code running now has run")
    busy: list[int] = Field(default=[], description="ranks still running earlier code that timed out: "
                                                     "new code on them is refused")
    frees: str = Field(default="", description="what frees the stuck ranks, when some are stuck")
    message: str = ""


class RankRun(BaseModel):
    rank: int
    state: str = Field(description="finished, failed, still running or lost")
    stdout: str = ""
    stderr: str = ""
    cut: int = Field(default=0, description="characters cut from the middle of stdout and stderr")
    value: str | None = Field(default=None, description="repr of the code's last expression")
    error: str = Field(default="", description="'ExceptionName: message' of a failed rank")
    traceback: str = ""
    stack: list[str] = Field(default=[], description="where a still-running rank is blocked, most recent call last")
    blocked_in: str = Field(default="", description="the innermost frame, e.g. 'all_reduce (distributed_c10d.py)'")
    stack_note: str = ""


class RunResult(BaseModel):
    ok: bool
    error: str = Field(default="", description="one line: which ranks failed, timed out or were lost, and why")
    timed_out: bool = False
    ranks: list[RankRun] = []
    trace: str = Field(default="", description="the collective trace's summary, when run with trace")
    world: WorldState | None = None


class RankStack(BaseModel):
    rank: int
    state: str = Field(description="running (this run or cell), busy (earlier code that timed out) or idle")
    frames: list[str] = []
    blocked_in: str = ""
    note: str = ""


class StacksResult(BaseModel):
    ranks: list[RankStack] = []
    world: WorldState


class CellRecord(BaseModel):
    label: int | None = Field(default=None, description="the notebook's cell number (In [N])")
    code: str
    result: RunResult


class CellsResult(BaseModel):
    cells: list[CellRecord] = []


class TextResult(BaseModel):
    text: str


# ---- structured forms ---------------------------------------------------------------


def cut(text: str) -> tuple[str, int]:
    """``text`` with its middle cut to ``HEAD + TAIL`` characters, and how many were cut."""
    if len(text) <= HEAD + TAIL:
        return text, 0
    gone = len(text) - HEAD - TAIL
    return f"{text[:HEAD]}\n... [{gone} characters cut] ...\n{text[-TAIL:]}", gone


def world_state(snap: Snapshot | None, running: RunningCell | None = None, busy: Iterable[int] = (),
                frees: str = "") -> WorldState:
    """The world as ``snap`` last saw it, with what runs now and what is stuck."""
    if snap is None:
        return WorldState(phase="none", message="no world yet: call pg_init")
    rows = [RankRow(rank=r.rank, state=r.state, host=r.host, pid=r.pid, device=r.device, error=r.error)
            for r in snap.ranks]
    now: list[int] = []
    if running is not None:
        now = list(running.ranks) if running.ranks is not None else [r.rank for r in snap.ranks]
    stuck = sorted(busy)
    return WorldState(phase=snap.phase, backend=snap.spec.backend, world=snap.spec.world,
                      init_method=snap.spec.init_method, ranks=rows, running=now,
                      running_for=None if running is None else round(running.seconds, 1),
                      busy=stuck, frees=frees if stuck else "", message=snap.message)


def rank_run(r: RankOutput) -> RankRun:
    stdout, cut_out = cut(r.stdout)
    stderr, cut_err = cut(r.stderr)
    error = ""
    if r.state == "failed" or r.state == "lost":
        error = f"{r.ename}: {r.evalue}" if r.evalue else r.ename
    return RankRun(rank=r.rank, state=r.state, stdout=stdout, stderr=stderr, cut=cut_out + cut_err,
                   value=r.value_text, error=error, traceback="\n".join(r.traceback), stack=list(r.stack),
                   blocked_in=r.blocked_in, stack_note=r.stack_note)


def run_result(result: CellResult, world: WorldState | None = None, recover: str = "") -> RunResult:
    """``result`` as a tool answers it; ``recover``: what frees the world, instead of ``%pg_init ... --force``."""
    err = (replace(result, recover=recover) if recover else result).error()
    return RunResult(ok=err is None, error="" if err is None else str(err),
                     timed_out=any(r.state == "still running" for r in result.ranks),
                     ranks=[rank_run(r) for r in result.ranks],
                     trace="" if result.trace is None else result.trace.summary(), world=world)


def stacks_result(world: WorldState, stacks: Mapping[int, Stack], busy: Iterable[int]) -> StacksResult:
    """Every rank: the stacks of those running (``stacks``), the others idle."""
    stuck = set(busy)
    rows = []
    for row in world.ranks:
        s = stacks.get(row.rank)
        if s is None:
            rows.append(RankStack(rank=row.rank, state="idle"))
        else:
            rows.append(RankStack(rank=row.rank, state="busy" if row.rank in stuck else "running",
                                  frames=list(s.frames), blocked_in=s.blocked_in, note=s.note))
    return StacksResult(ranks=rows, world=world)


def cells_result(cells: list[LoggedCell], recover: str = "") -> CellsResult:
    return CellsResult(cells=[CellRecord(label=c.label, code=c.code, result=run_result(c.result, recover=recover))
                              for c in cells])


# ---- text forms -------------------------------------------------------------------


def world_text(w: WorldState) -> str:
    if w.phase == "none":
        return w.message
    head = f"world: {w.backend}, {w.world} rank{'s' if w.world != 1 else ''}, {w.init_method}, {w.phase}"
    if w.message:
        head += f" ({w.message})"
    lines = [head]
    by_state: dict[str, list[int]] = {}
    for r in w.ranks:
        by_state.setdefault(r.state, []).append(r.rank)
    lines.append("; ".join(f"{ranks_text(rs)} {state}" for state, rs in by_state.items()))
    lines.extend(f"rank {r.rank}: {r.error}" for r in w.ranks if r.error)
    if w.running:
        lines.append(f"running now on {ranks_text(w.running)} for {w.running_for or 0:g} s "
                     "(pg_stacks shows where)")
    if w.busy:
        lines.append(f"{ranks_text(w.busy)} still running earlier code; {w.frees}")
    return "\n".join(lines)


def run_text(res: RunResult) -> str:
    lines = [res.error or f"{ranks_text([r.rank for r in res.ranks])} finished"]
    for r in res.ranks:
        lines.append(f"[rank {r.rank}] {r.state}" + (f", blocked in {r.blocked_in}" if r.blocked_in else ""))
        if r.stdout:
            lines.append(r.stdout.rstrip("\n"))
        if r.stderr:
            lines.append("stderr:\n" + r.stderr.rstrip("\n"))
        if r.value is not None:
            lines.append(f"Out: {r.value}")
        if r.traceback:
            lines.append(r.traceback.rstrip("\n"))
        elif r.error:
            lines.append(r.error)
        if r.stack:
            lines.append("stack (most recent call last):")
            lines.extend(r.stack)
        elif r.stack_note:
            lines.append(f"(no stack: {r.stack_note})")
    if res.trace:
        lines.append(res.trace.rstrip("\n"))
    if res.world is not None:
        lines.append(world_text(res.world))
    return "\n".join(lines)


def stacks_text(res: StacksResult) -> str:
    if not any(r.state != "idle" for r in res.ranks):
        lines = ["no rank is running anything: every rank is idle"]
    else:
        lines = []
        for r in res.ranks:
            if r.state == "idle":
                lines.append(f"[rank {r.rank}] idle")
                continue
            where = f", blocked in {r.blocked_in}" if r.blocked_in else ""
            lines.append(f"[rank {r.rank}] {r.state}{where}")
            lines.extend(r.frames)
            if r.note:
                lines.append(f"(no stack: {r.note})" if not r.frames else f"({r.note})")
    lines.append(world_text(res.world))
    return "\n".join(lines)


def cells_text(res: CellsResult) -> str:
    if not res.cells:
        return "no %%pg cell has ended yet"
    parts = []
    for c in res.cells:
        name = f"In [{c.label}]" if c.label is not None else "a pg_run"
        parts.append(f"=== {name}:\n{c.code.rstrip()}\n--- output:\n{run_text(c.result)}")
    return "\n".join(parts)
