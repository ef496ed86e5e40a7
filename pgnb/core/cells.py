"""Running a ``%%pg`` cell on the ranks of a ``World``, gathered in rank order.

``run_cell`` submits the code to every chosen rank at once (collectives need
all ranks inside the call together) and waits, without a deadline unless one
is given. It returns a ``CellResult`` (``pgnb.core.results``): per rank,
stdout, stderr, rich outputs, the last expression's value and the error.

Each cell runs on its engine as ``pgnb.rank.cell.run_cell`` (an apply
request), not as an ipyparallel ``execute``: an execute that fails makes the
engine abort whatever was queued behind it, so the next cell would fail with a
stale ``TaskAborted``.

Ranks still running at the deadline (or after an interrupt they could not
obey) are asked where they are blocked (``pgnb.core.stacks``) and recorded in
the world's busy registry, so the next call to them refuses at once.
Tracing is passed in (a ``Recorder``, see ``pgnb.core.trace_run``): this
module knows only its shape.

A cell's options are one value (``CellOptions``: ranks, timeout, label, trace,
profile, pdb) and what hears from it while it runs is one object
(``CellHooks``: the live output's sink, the prompter that answers pdb).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from dataclasses import dataclass
from typing import Any, Protocol

from .._wire import CellReply, DebugArgs, PanelArgs, TraceArgs
from ..rank import cell as rank_cell
from ..spec import init_command
from .busy import BusyEntry
from .debug import CallbackPrompter, DebugServer, InputFn, Prompter
from .dispatch import Dispatch
from .live import CallbackSink, LiveCell, LiveSink, OutputFn
from .remote import ENGINE_DIED, ename, is_local, outcome
from .results import CellInterrupted, CellResult, RankOutput, RankValue
from .sending import send, sent_back
from .stacks import Stack, dump_stacks
from .trace import Trace

#: Seconds interrupted ranks get to stop before pgnb calls them stuck.
INTERRUPT_GRACE = 2.0
#: What a skipped breakpoint says when nothing was given to answer it.
NO_INPUT = "no input is possible here (pass on_input= to Sandbox.execute)"


class Recorder(Protocol):
    """What a traced cell needs of its recording (``pgnb.core.trace_run.Recording``)."""

    def engine_args(self, rank: int) -> TraceArgs: ...

    def collect(self, running: list[int]) -> Trace: ...


class Panel(Protocol):
    """JupyterLab's Debugger panel as a cell sees it (``pgnb.debugger.Bridge``): off, or where ranks stop."""

    def cell_args(self, world: Dispatch, code: str, ranks: list[int]) -> PanelArgs | None:
        """What ``ranks`` need to run this cell under the panel; None while the debugger is off."""

    def stopped_seconds(self) -> float:
        """Seconds of this cell so far during which a rank was stopped in the panel."""

    def tick(self) -> None:
        """Called from the cell's wait loop (main thread)."""

    def release(self) -> None:
        """Let every stopped rank run on, breakpoints off until the next cell (an interrupt)."""

    def cell_done(self) -> None:
        """The cell's wait is over."""


@dataclass(frozen=True)
class CellOptions:
    """How one cell runs, as one value: ``%%pg``'s options, ``Sandbox.execute``'s keywords."""

    ranks: tuple[int, ...] | None = None  # which ranks run it; None: every rank
    timeout: float | None = None  # seconds until the ranks still running are reported; None: no deadline
    label: int | None = None  # the notebook's cell number, which tracebacks show (``Cell In[label]``)
    trace: bool = False  # record every torch.distributed call into ``result.trace``
    profile: bool | str = False  # torch.profiler on every rank; a str is the path of the merged trace file
    pdb: bool = False  # a rank that raises opens pdb where it raised (needs a prompter)
    # each rank's value is this name of its namespace after the cell (taken out of it), not the cell's last
    # expression: nothing is displayed, so no execute_result crosses the controller (pgnb's own cells)
    value_of: str | None = None


@dataclass(frozen=True)
class CellHooks:
    """Who hears from a cell while it runs: where the ranks' output goes, who answers their pdb."""

    output: LiveSink | None = None  # what the ranks print, and their states, as the cell runs (``pgnb.core.live``)
    prompter: Prompter | None = None  # answers a rank's ``breakpoint()`` (``pgnb.core.debug``)
    no_input: str = NO_INPUT  # without a prompter a breakpoint is skipped with this line
    panel: Panel | None = None  # JupyterLab's Debugger panel, when the kernel has one (``pgnb.debugger``)

    @classmethod
    def calling(cls, on_output: OutputFn | None = None, on_input: InputFn | None = None) -> CellHooks:
        """Hooks that call plain functions: ``on_output(rank, stream, data)``, ``on_input(rank, text)``."""
        return cls(output=None if on_output is None else CallbackSink(on_output),
                   prompter=None if on_input is None else CallbackPrompter(on_input))


#: every rank, no deadline, nothing recorded
DEFAULT_OPTIONS = CellOptions()
#: no live output; a breakpoint is skipped with ``NO_INPUT``
NO_HOOKS = CellHooks()


def cell_name(label: int | None) -> str:
    """How messages name a cell: ``cell In [12]``, or ``an earlier cell`` from the API."""
    return f"cell In [{label}]" if label is not None else "an earlier cell"


def run_cell(world: Dispatch, code: str, options: CellOptions = DEFAULT_OPTIONS,
             hooks: CellHooks = NO_HOOKS, recording: Recorder | None = None) -> CellResult:
    """Run ``code`` on the ranks at once; wait until all finish (or ``options.timeout``); gather in rank order.

    A ``KeyboardInterrupt`` while waiting interrupts the ranks and raises
    ``CellInterrupted`` carrying the result. ``recording``: the ranks'
    torch.distributed calls are recorded into ``result.trace`` (``options.trace``
    is the caller's: it makes the recording). Time spent at a debugger prompt
    does not count against the timeout.
    """
    label, timeout, prompter = options.label, options.timeout, hooks.prompter
    pairs = world.engines_for(options.ranks)
    client = world.client
    stack_dir = world.scratch_dir
    ars: list[tuple[int, Any]] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = False
    lost: dict[int, str] = {}
    watch: LiveCell | None = None
    server = None if prompter is None else DebugServer(stack_dir, prompter, options.pdb)
    debug: DebugArgs = server.args() if server is not None else {"path": None, "why": hooks.no_input}
    panel = hooks.panel
    panel_args = None if panel is None else panel.cell_args(world, code, [r for r, _ in pairs])
    if panel_args is not None:
        debug["panel"] = panel_args

    def tick() -> None:
        if server is not None:
            server.poll()
        if watch is not None:
            watch.tick()
        if panel is not None and panel_args is not None:
            panel.tick()

    def until() -> float | None:  # time at a debugger prompt or stopped in the panel is not the cell's
        if deadline is None:
            return None
        stopped = panel.stopped_seconds() if panel is not None and panel_args is not None else 0.0
        return deadline + (server.waited if server is not None else 0.0) + stopped

    per_rank = None if recording is None else (lambda r: {"trace": recording.engine_args(r)})
    try:  # an interrupt even while submitting reaches the ranks already started (``ars`` grows in place)
        value_of = {} if options.value_of is None else {"value_of": options.value_of}
        ars.extend(send(client, pairs, rank_cell.run_cell, code, label, stack_dir, debug=debug, per_rank=per_rank,
                        **value_of))
        watch = None if hooks.output is None else LiveCell(world, ars, hooks.output, code)
        # also stops soon after a rank's engine dies
        lost = world.wait_ranks(ars, until, tick=tick if (watch or server or panel_args) else None)
    except KeyboardInterrupt:
        interrupted = True
        if panel is not None and panel_args is not None:
            panel.release()  # a rank stopped in the panel runs on, into the interrupt
        _interrupt(world, [(r, ar) for r, ar in ars if not ar.ready()])
    finally:
        if server is not None:
            server.close()
        if panel is not None and panel_args is not None:
            panel.cell_done()
    if watch is not None:
        watch.flush(lost)
    running = [r for r, ar in ars if not ar.ready() and r not in lost]
    stacks = dump_stacks({r: world.rank_infos[r] for r in running}, stack_dir, code)
    for r, ar in ars:
        if r in running:
            world.busy.add(r, BusyEntry(world.engine_ids[r], ar, client, cell_name(label), code))
    rows = [_collect(r, ar, stacks.get(r)) for r, ar in ars]
    for row in rows:
        if row.rank in lost:
            row.state, row.ename, row.evalue, row.traceback = "lost", ENGINE_DIED, lost[row.rank], []
    result = CellResult(rows, world=world.spec.world, recover=init_command(world.spec, force=False), timeout=timeout,
                        interrupted=interrupted)
    if recording is not None:
        result.trace = recording.collect([r for r, ar in ars if not ar.ready()])
    if interrupted:
        raise CellInterrupted(result)
    return result


def _wait(ars: list[tuple[int, Any]], deadline: float | None) -> None:
    for _, ar in ars:
        while not ar.ready():
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return
            ar.wait(left)  # wakes as soon as the result is in; short slices keep Ctrl-C responsive


def _interrupt(world: Dispatch, running: list[tuple[int, Any]]) -> None:
    """SIGINT the engines of the running ranks, then give them ``INTERRUPT_GRACE`` to stop."""
    for r, _ in running:
        info = world.rank_infos[r]
        try:
            if is_local(info):
                os.kill(info.pid, signal.SIGINT)
            else:  # the engine's nanny, on its own host, passes the signal on
                world.client.send_signal("SIGINT", targets=[info.engine_id], block=False)
        except Exception:  # the engine is gone: its task fails with EngineError and is reported as lost
            pass
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting, report now
        _wait(running, time.monotonic() + INTERRUPT_GRACE)


def _collect(rank: int, ar: Any, stack: Stack | None) -> RankOutput:
    out = RankOutput(rank)
    if not ar.ready():
        out.state = "still running"
        out.stdout, out.stderr = _streams(ar)
        if stack is not None:
            out.stack, out.blocked_in, out.stack_note = list(stack.frames), stack.blocked_in, stack.note
        return out
    out.stdout, out.stderr = _streams(ar)  # waits for the iopub messages, which can trail the reply
    try:
        reply: CellReply = ar.get(timeout=0)
    except Exception as e:  # the apply itself failed: engine died, or interrupted outside the cell
        if outcome(e) == "lost":
            out.state, out.ename, out.evalue = "lost", ENGINE_DIED, "engine died"
            return out
        out.state = "failed"
        out.ename = ename(e)
        out.evalue = str(getattr(e, "evalue", e))
    else:
        if not reply.get("ok", False):
            out.state = "failed"
            out.ename, out.evalue = str(reply.get("ename", "")), str(reply.get("evalue", ""))
            out.traceback = list(reply.get("traceback") or [])
            out.before_exec = bool(reply.get("before_exec"))
        er = sent_back(ar, "execute_result")
        if er:
            out.result = dict(er.get("data", {}))
        # a displayed last expression, or ``CellOptions.value_of``'s name (nothing displayed)
        out.value = _unpack_value(rank, reply.get("value"), out.value_text or "")
        out.outputs = [dict(o.get("data", {})) for o in sent_back(ar, "outputs") or []]
    return out


def _unpack_value(rank: int, packed: Any, text: str) -> Any:
    if not packed:
        return None
    kind, data = packed
    if kind == "pickle":
        try:
            return pickle.loads(data)  # noqa: S301 - our own engines made it, from the cell's value
        except Exception as e:  # e.g. a class defined only on the rank
            return RankValue(rank, text, f"cannot be unpickled in the kernel ({type(e).__name__})")
    return RankValue(rank, text, str(data))


def _streams(ar: Any) -> tuple[str, str]:
    if ar.ready():
        with contextlib.suppress(Exception):  # streams are best effort once the task is done
            ar.wait_for_output(timeout=1)
    stdout, stderr = sent_back(ar, "stdout"), sent_back(ar, "stderr")
    if isinstance(stdout, list):
        stdout = "".join(s or "" for s in stdout)
    if isinstance(stderr, list):
        stderr = "".join(s or "" for s in stderr)
    return stdout or "", stderr or ""
