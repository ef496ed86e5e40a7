"""The MCP tools over one world: ``server(host)`` is an ``MCPServer`` whose tools drive ``host``'s world.

Names are fixed (docs/agents.md): ``pg_init``, ``pg_status``, ``pg_run``, ``pg_stacks``,
``pg_shutdown``, and ``pg_show``, ``pg_trace``, ``pg_cells``, ``pg_destroy``, ``pg_restart``.
Every answer has a structured form (``pgnb.agent.report``) and a short text form. Bad
input is a ``ToolError`` (the SDK hides the text of any other exception) in one line,
checked before anything is sent to the ranks. Reading tools (``pg_status``, ``pg_stacks``,
``pg_cells``, ``pg_trace``) never wait for a run: they read what the world last saw and
ask the ranks' stack threads, which answer even inside a collective.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

from ..core.cell_log import KEEP
from ..core.cells import CellOptions
from ..core.sandbox import Sandbox, dispatch_of
from ..core.show import gather
from ..core.stacks import Stack, dump_stacks
from ..core.text import ranks_text
from ..errors import PgnbError
from ..spec import WorldSpec
from .hosts import Host
from .report import (
    CellsResult,
    RunResult,
    StacksResult,
    TextResult,
    WorldState,
    cells_result,
    cells_text,
    run_result,
    run_text,
    stacks_result,
    stacks_text,
    world_state,
    world_text,
)

T = TypeVar("T")

#: what the server tells a client about itself
INSTRUCTIONS = (
    "pgnb: a warm torch.distributed world (ranks on ipyparallel engines). pg_init makes it; pg_run runs Python "
    "on every rank at once (torch, dist, rank, world_size predefined) and returns each rank's output in rank "
    "order; a run that does not finish within its timeout returns with each rank's stack and the collective it "
    "waits in; pg_stacks answers while a run is going; pg_restart frees ranks stuck in a collective."
)
#: what a tool that starts or stops the world says when the notebook owns it
NOTEBOOK_OWNS = "the notebook owns this world: run {magic} in the notebook"
READ = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
ACT = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
STOP = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def answer(model: BaseModel, text: str) -> CallToolResult:
    """The structured form and the text an agent reads, in one result."""
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=model.model_dump(mode="json"))


def server(host: Host, name: str = "pgnb") -> MCPServer:
    """An ``MCPServer`` with pgnb's tools over ``host``'s world."""
    mcp: MCPServer = MCPServer(name, instructions=INSTRUCTIONS, log_level="WARNING")
    tools = _Tools(host)

    @mcp.tool(annotations=ACT)
    def pg_init(backend: str = "gloo", world: int = 2, init_method: str = "env", timeout: float = 60,
                force: bool = False) -> Annotated[CallToolResult, WorldState]:
        """Start the world: `world` ranks, each an engine that has called init_process_group(backend).

        The same options and checks as the notebook's %pg_init (backend: gloo, nccl, mpi, ucc or a device
        map like cpu:gloo,cuda:nccl; init_method: env, tcp, file or a full URL; timeout in seconds, enforced
        by pgnb too). Asking again with the same options does nothing; other options re-initialise, reusing
        the engines; force restarts them."""
        return tools.init(backend, world, init_method, timeout, force)

    @mcp.tool(annotations=READ)
    def pg_status() -> Annotated[CallToolResult, WorldState]:
        """The world's state: each rank's state (initialized, failed, lost, ...), what runs now, which ranks are
        stuck in earlier code and what frees them. Answers while a run is going (from the last look then)."""
        return tools.status()

    @mcp.tool(annotations=ACT)
    def pg_run(code: str, ranks: list[int] | None = None, timeout: float = 60,
               trace: bool = False) -> Annotated[CallToolResult, RunResult]:
        """Run Python `code` on the ranks (default: every rank) at once, each in its own namespace where torch,
        dist (torch.distributed), rank, world_size and device are defined; names persist between runs.

        Returns each rank's stdout, stderr, last expression's value and error, in rank order, and one line
        naming the first failing ranks. At `timeout` seconds it returns anyway: each rank still running with
        its stack and the collective it waits in (those ranks stay busy until freed: see the world state).
        trace: record every torch.distributed call on every rank (summary, mismatches; pg_trace again later)."""
        return tools.run(code, ranks, timeout, trace)

    @mcp.tool(annotations=READ)
    def pg_stacks() -> Annotated[CallToolResult, StacksResult]:
        """Where each rank running code is now: its Python stack (the code's frames, most recent call last) and
        the call it is blocked in, e.g. all_reduce. Answers while a run is going, even inside a collective."""
        return tools.stacks()

    @mcp.tool(annotations=READ)
    def pg_show(name: str, ranks: list[int] | None = None) -> Annotated[CallToolResult, TextResult]:
        """A variable of every rank (or `ranks`) side by side: tensors as a rank x element grid with shapes and
        dtypes, differing ranks flagged; scalars and strings as a column."""
        return tools.show(name, ranks)

    @mcp.tool(annotations=READ)
    def pg_trace() -> Annotated[CallToolResult, TextResult]:
        """The collective trace of the last run made with trace=true: every torch.distributed call per rank,
        which calls matched across ranks, mismatches (different collectives, shapes, dtypes) and who waited."""
        return tools.trace()

    @mcp.tool(annotations=READ)
    def pg_cells(count: int = 1) -> Annotated[CallToolResult, CellsResult]:
        """The last `count` runs that ended (the notebook's %%pg cells too, with their cell numbers): their code
        and each rank's output, in rank order."""
        return tools.cells(count)

    @mcp.tool(annotations=ACT)
    def pg_destroy() -> Annotated[CallToolResult, WorldState]:
        """destroy_process_group() on every rank; the engines stay, so pg_init is fast again."""
        return tools.lifecycle("pg_destroy", "%pg_destroy", lambda sb: sb.destroy())

    @mcp.tool(annotations=STOP)
    def pg_restart() -> Annotated[CallToolResult, WorldState]:
        """Free a stuck world: kill and restart the engines and initialise the world again with the same options.
        Ranks blocked in a collective (which ignore interrupts) cannot be freed any other way; their variables
        are lost."""
        return tools.lifecycle("pg_restart", "%pg_init ... --force", lambda sb: sb.init(sb.spec, force=True))

    @mcp.tool(annotations=STOP)
    def pg_shutdown() -> Annotated[CallToolResult, WorldState]:
        """Destroy the process group and stop every engine and the controller: nothing of the world is left."""
        return tools.shutdown()

    return mcp


class _Tools:
    """The tools' bodies, over one host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    # ---- helpers ------------------------------------------------------------------------
    def _sandbox(self) -> Sandbox:
        sb = self.host.sandbox()
        if sb is None or not sb.engine_ids:
            raise ToolError(self.host.not_started)
        return sb

    def _pgnb(self, fn: Callable[[], T]) -> T:
        """``fn()``, pgnb's own errors as one-line tool errors."""
        try:
            return fn()
        except PgnbError as e:
            raise ToolError(self.host.say(str(e))) from None

    def _world(self, sb: Sandbox | None) -> WorldState:
        if sb is None:
            return world_state(None)
        return world_state(sb.snapshot(), sb.cells.now(), _busy(sb), self.host.frees)

    def _recover(self) -> str:
        """What a run's one-line error names instead of the notebook's ``%pg_init ... --force`` (none: keep it)."""
        return "pg_restart" if self.host.owns_world else ""

    def _ranks(self, sb: Sandbox, ranks: list[int] | None) -> tuple[int, ...] | None:
        if ranks is None:
            return None
        world = sb.spec.world
        if not ranks:
            raise ToolError(f"ranks is empty: give some of ranks 0-{world - 1}, or leave it out for every rank")
        bad = sorted({r for r in ranks if not 0 <= r < world})
        if bad:
            raise ToolError(f"unknown {ranks_text(bad)}: the world has {ranks_text(range(world))}")
        return tuple(sorted(set(ranks)))

    # ---- the tools ----------------------------------------------------------------------
    def init(self, backend: str, world: int, init_method: str, timeout: float, force: bool) -> CallToolResult:
        if not self.host.owns_world:
            raise ToolError(NOTEBOOK_OWNS.format(magic="%pg_init"))
        spec = self._pgnb(lambda: WorldSpec.validate(backend=backend, world=world, init_method=init_method,
                                                     timeout=timeout))

        def start() -> Sandbox:
            sb = self.host.sandbox()
            if (sb is not None and not force and sb.engine_ids and spec == sb.spec and sb.is_initialized
                    and all(r.state == "initialized" for r in sb.status())):
                return sb
            if sb is None or not sb.engine_ids:
                sb = Sandbox(spec=spec)
                self.host.set_sandbox(sb)
            sb.init(spec, force=force)
            return sb

        sb = self._pgnb(lambda: self.host.act("pg_init", start))
        state = self._world(sb)
        return answer(state, world_text(state))

    def status(self) -> CallToolResult:
        sb = self.host.sandbox()
        if sb is not None and sb.engine_ids and self.host.owns_world and sb.cells.now() is None:
            try:  # ask the ranks when nothing runs; else what the world last saw
                self.host.act("pg_status", sb.status)
            except (ToolError, PgnbError):
                pass
        state = self._world(sb)
        return answer(state, world_text(state))

    def run(self, code: str, ranks: list[int] | None, timeout: float, trace: bool) -> CallToolResult:
        sb = self._sandbox()
        chosen = self._ranks(sb, ranks)
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ToolError(f"timeout must be a positive number of seconds, not {timeout!r}")
        options = CellOptions(ranks=chosen, timeout=timeout, trace=trace)
        result = self._pgnb(lambda: self.host.act("pg_run", lambda: sb.run_cell(code, options)))
        if result.ranks and all(r.before_exec for r in result.ranks):
            # IPython on each rank compiles the code (its magics and ! lines too): refused before it ran anywhere
            raise ToolError(f"the code does not compile: {result.error()}")
        res = run_result(result, self._world(sb), recover=self._recover())
        return answer(res, run_text(res))

    def stacks(self) -> CallToolResult:
        sb = self.host.sandbox()
        if sb is None or not sb.engine_ids:
            raise ToolError(self.host.not_started)
        d = dispatch_of(sb)
        infos = d.rank_infos
        stacks: dict[int, Stack] = {}
        now = sb.cells.now()
        busy = _busy(sb)
        if now is not None:
            running = [r for r in (now.ranks if now.ranks is not None else range(len(infos))) if r < len(infos)]
            stacks.update(dump_stacks({r: infos[r] for r in running if r not in busy}, d.scratch_dir, now.code))
        by_code: dict[str, list[int]] = {}
        for r in busy:
            entry = d.busy.entry(r)
            by_code.setdefault(entry.code if entry is not None else "", []).append(r)
        for code, rs in by_code.items():
            stacks.update(dump_stacks({r: infos[r] for r in rs if r < len(infos)}, d.scratch_dir, code))
        res = stacks_result(self._world(sb), stacks, busy)
        return answer(res, stacks_text(res))

    def show(self, name: str, ranks: list[int] | None) -> CallToolResult:
        sb = self._sandbox()
        chosen = self._ranks(sb, ranks)
        if not name.isidentifier():
            raise ToolError(f"cannot show {name!r}: give the plain name of a variable on the ranks")
        values = self._pgnb(lambda: self.host.act("pg_show", lambda: gather(name, ranks=chosen,
                                                                             world=dispatch_of(sb))))
        text = values.text()
        return answer(TextResult(text=text), text)

    def trace(self) -> CallToolResult:
        sb = self.host.sandbox()
        traces = [c.result.trace for c in (sb.cells.last(KEEP) if sb is not None else []) if c.result.trace]
        text = traces[-1].summary() if traces else "no traced run yet: call pg_run with trace=true"
        return answer(TextResult(text=text), text)

    def cells(self, count: int) -> CallToolResult:
        if count < 1:
            raise ToolError(f"count must be 1 or more, not {count}")
        sb = self.host.sandbox()
        logged = [] if sb is None else sb.cells.last(count)
        res = cells_result(logged, recover=self._recover())
        return answer(res, cells_text(res))

    def lifecycle(self, tool: str, magic: str, fn: Callable[[Sandbox], Any]) -> CallToolResult:
        if not self.host.owns_world:
            raise ToolError(NOTEBOOK_OWNS.format(magic=magic))
        sb = self._sandbox()
        self._pgnb(lambda: self.host.act(tool, lambda: fn(sb)))
        state = self._world(sb)
        return answer(state, world_text(state))

    def shutdown(self) -> CallToolResult:
        if not self.host.owns_world:
            raise ToolError(NOTEBOOK_OWNS.format(magic="%pg_shutdown"))
        sb = self.host.sandbox()
        if sb is not None:
            self._pgnb(lambda: self.host.act("pg_shutdown", sb.shutdown))
            self.host.set_sandbox(None)
        state = self._world(sb)
        return answer(state, world_text(state) if sb is not None else "no world: nothing to stop")


def _busy(sb: Sandbox) -> list[int]:
    """Ranks still running earlier code that timed out (read without asking the Client: any thread may)."""
    busy = dispatch_of(sb).busy
    out = []
    for r in range(sb.spec.world):
        entry = busy.entry(r)
        if entry is not None and entry.client is sb.client and not entry.result.done():
            out.append(r)
    return out
