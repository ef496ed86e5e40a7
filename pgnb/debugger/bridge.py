"""JupyterLab's Debugger panel, reaching the ranks of ``%%pg`` cells: the kernel's side of the bridge.

Lab speaks the Debug Adapter Protocol to the kernel (``debug_request`` on the
control channel, ``debug_event`` on iopub), and ipykernel answers it with a
debugpy inside the kernel. ``Bridge`` takes the kernel's ``do_debug_request``
and keeps ipykernel's answer for everything that is not about a rank, so plain
cells debug as before. While the debugger is on, it listens on 127.0.0.1 for the
ranks' pydevd (``pgnb.rank.dap``), which connect when a ``%%pg`` cell starts;
it gives them the panel's breakpoints for ``%%pg`` cells (``breakpoints.Breakpoints``
keeps them), and routes what Lab asks about a rank to that rank:

- each rank is a thread named ``rank N`` (``ids.RANK_THREAD + N``); its frames and
  variable references get ids of the bridge's own (``ids.Ids``);
- a ``stackTrace`` of a rank's thread holds that rank's frames first, then those of
  every other stopped rank, then, read-only, where each running rank is blocked
  (pgnb's stack of it, ``pgnb.core.stacks``), each frame named after its rank;
- ``next``/``stepIn``/``stepOut``/``continue`` act on the rank last shown (the rank
  of the frame Lab last asked the scopes of), which is what Lab's Call Stack
  selects; ``continue`` with ``singleThread: false``, or ``%pg_continue`` typed in
  the panel's console, lets every stopped rank run on;
- when a rank runs on while others stay stopped, Lab is shown the next one.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import secrets
import socket
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Literal

from .._wire import PanelArgs
from ..core.dispatch import Dispatch
from ..core.remote import is_local
from ..core.text import ranks_text
from .blocked import blocked_frames, blocked_view
from .breakpoints import Breakpoints
from .catch_up import CatchUp, kernel_debugger_on
from .ids import Ids, rank_thread, thread_rank
from .link import ANSWER_WAIT, Message, RankLink, bridge_thread

#: What the ranks' pydevd is told at attach: only the thread that stops is suspended (a rank's other threads,
#: pgnb's stack thread among them, keep running); no child process is debugged; just my code (IPython runs
#: each statement of a cell as code of its own: a step goes from statement to statement of the cell, never
#: into IPython's code between them).
ATTACH = {"justMyCode": True, "stopAllThreadsOnSuspend": False, "steppingResumesAllThreads": False,
          "subProcess": False, "redirectOutput": False, "showReturnValue": False}
#: Typed in the panel's console: every stopped rank runs on.
CONTINUE_ALL = "%pg_continue"
#: A stop that lasts this share of the process group's timeout is said, once: peers blocked in a collective fail at it.
WARN_SHARE = 0.75
#: Seconds after a rank runs on before Lab is shown another stopped rank (a step stops the same rank again first).
REANNOUNCE_AFTER = 0.3
#: Seconds an interrupt waits for the ranks stopped in the panel to run again before it reaches them.
RESUME_WAIT = 1.0
#: Packages no debugger looks into, neither the kernel's own nor the ranks' (``Bridge._hide_the_bridge``): pgnb
#: and the libraries it runs cells with raise and catch exceptions, which "raised exceptions" would stop at.
_HIDDEN = ("pgnb", "ipyparallel", "zmq", "tornado", "traitlets", "jupyter_client", "IPython", "ipykernel", "psutil",
           "asyncio", "concurrent", "json")
#: The names ipyparallel's apply puts in the engine's namespace while a call (the cell) runs, and removes after it:
#: ``_{msg_id}_f``, ``_args``, ``_kwargs``, ``_result`` (``ipyparallel.engine.kernel``'s ``do_apply``), where the
#: msg_id is jupyter_client's ``{session}_{pid}_{count}`` with its dashes made underscores. Not the user's.
_APPLY_TEMPORARY = re.compile(r"_\w+_\d+_\d+_(?:f|args|kwargs|result)")
#: pydevd's groups of a scope's variables (``DAPGrouper``: the apply's function is among "function variables").
_GROUPS = ("special variables", "protected variables", "function variables", "class variables")
_STEPS = ("next", "stepIn", "stepOut", "continue", "pause")
_BY_FRAME = ("scopes", "evaluate", "richInspectVariables", "completions", "copyToGlobals", "setExpression")
_BY_VARS = ("variables", "setVariable")


def _hidden_folders() -> list[str]:
    """The folders of ``_HIDDEN``'s packages (the ranks run the kernel's install: the same paths)."""
    import importlib.util

    out = []
    for name in _HIDDEN:
        spec = importlib.util.find_spec(name)
        out.extend(spec.submodule_search_locations or [] if spec is not None else [])
    return out


def reply(request: Message, body: dict[str, Any] | None = None, success: bool = True,
          message: str = "") -> Message:
    out: Message = {"type": "response", "request_seq": request.get("seq", 0), "success": success,
                    "command": request.get("command", "")}
    if body is not None:
        out["body"] = body
    if message:
        out["message"] = message
    return out


def cell_offset(raw_cell: str) -> int:
    """Lines of a ``%%pg`` cell above its body (its ``%%pg`` line, and any blank lines before it)."""
    for i, line in enumerate(raw_cell.splitlines()):
        if line.strip():
            return i + 1
    return 0


def cell_file(text: str) -> str:
    """The path ipykernel's ``dumpCell`` gives a cell's text (and Lab computes from it)."""
    from ipykernel import compiler

    return str(compiler.get_file_name(text))  # type: ignore[no-untyped-call]


def _is_group(variable: dict[str, Any]) -> bool:
    return variable.get("name") in _GROUPS and "evaluateName" not in variable


class Bridge:
    """The kernel's debug requests, shared between ipykernel's debugger and the ranks. One per kernel."""

    def __init__(self, kernel: Any, shell: Any) -> None:
        self.kernel = kernel
        self.shell = shell
        self._ipykernel = kernel.do_debug_request  # ipykernel's own answer (its debugpy in the kernel)
        kernel.do_debug_request = self.handle
        self.on = False
        self._lock = threading.RLock()
        self._listener: socket.socket | None = None
        self.port = 0
        self._token = ""  # a rank's proof, new each time the panel is switched on
        self.links: dict[int, RankLink] = {}
        self._pids: dict[int, int] = {}  # pid -> rank, for the ranks of the running cell
        self._world: Dispatch | None = None
        self._code = ""
        self._cell_file = ""
        self._raw_cell = ""
        self.breakpoints = Breakpoints()
        self._catch_up = CatchUp()
        self.ids = Ids()
        self.stopped: dict[int, dict[str, Any]] = {}  # rank -> the body of its stopped event (its own thread id)
        self.shown: int | None = None  # the rank whose frame Lab showed last
        self._released = False
        self._stop_since: float | None = None
        self._stopped_total = 0.0
        self._warned = False
        self._resumed = threading.Condition()  # a rank's pydevd said it runs again (``continued``)
        self._running: set[int] = set()
        if getattr(shell, "events", None) is not None:  # (a cell run before the debugger is on may meet it)
            shell.events.register("pre_run_cell", self._pre_run_cell)
        self.catch_up()

    def catch_up(self) -> None:
        """What Lab told the kernel's debugger before the bridge was there (``catch_up``), the bridge's now."""
        if not self.on and kernel_debugger_on(self.kernel):
            self.start()
            self._catch_up.hide = _hidden_folders()  # its attach came before ``_hide_the_bridge`` could
        self.breakpoints.adopt(self._catch_up.take(self.kernel, self.breakpoints.is_pg_cell), self.links.values())
        self._catch_up.schedule(self.kernel, self._ipykernel)

    # ---- Lab's requests ------------------------------------------------------------------------------------
    async def handle(self, request: Message) -> Message:
        """``do_debug_request``: one at a time with what ``catch_up`` gives back to the kernel's debugpy."""
        async with self._catch_up.serial():
            await self._catch_up.release(self.kernel, self._ipykernel)
            return await self._handle(request)

    async def _handle(self, request: Message) -> Message:  # a rank's request to the rank, the rest to ipykernel
        command = request.get("command", "")
        args = request.get("arguments") or {}
        if command == "initialize":
            answer: Message = await self._ipykernel(request)
            if answer.get("success"):
                self.start()
            return answer
        if command == "attach":
            self._hide_the_bridge()
        if command == "disconnect":
            self.stop()
            answer = await self._ipykernel(request)
            return answer
        if command == "evaluate" and str(args.get("expression", "")).strip() == CONTINUE_ALL and self.on:
            ranks = await self._continue_all()
            return reply(request, {"result": f"{ranks_text(ranks)} run on" if ranks else "no rank is stopped",
                                   "variablesReference": 0})
        path = str((args.get("source") or {}).get("path", ""))
        if command == "setBreakpoints" and self.breakpoints.is_pg_cell(path):
            wanted = [dict(b) for b in args.get("breakpoints") or []]
            await self.breakpoints.set(path, wanted, list(self.links.values()))
            return reply(request, {"breakpoints": [{"verified": True, "line": b["line"], "source": {"path": path}}
                                                   for b in wanted]})
        if command == "setExceptionBreakpoints":  # the kernel's own debugpy gets them too
            await self.breakpoints.set_filters(list(args.get("filters") or []), list(self.links.values()))
        target = self._rank_of(command, args)
        if target is not None and self.on:
            return await self._for_rank(request, *target)
        answer = await self._ipykernel(request)
        if command == "debugInfo" and answer.get("success"):
            body = answer.setdefault("body", {})
            body.setdefault("breakpoints", []).extend(self.breakpoints.listing())
            body.setdefault("stoppedThreads", []).extend(rank_thread(r) for r in sorted(self.stopped))
        elif command == "threads" and self.on and answer.get("success"):
            answer.setdefault("body", {}).setdefault("threads", []).extend(self._threads())
        return answer

    def _rank_of(self, command: str, args: dict[str, Any]) -> tuple[int, str, int] | None:
        """``(rank, kind, rank's id)`` when the request is about a rank (kind "thread" for a thread's)."""
        if command in (*_STEPS, "stackTrace", "exceptionInfo"):
            rank = thread_rank(args.get("threadId"))
            if rank is None and command in _STEPS and self.stopped and not self._kernel_stopped():
                # Lab 4's Continue forgets the thread it stopped on before it sends the request, so it asks for
                # its default thread (1): with ranks stopped and the kernel not, the user means the rank shown
                rank = self.shown if self.shown in self.stopped else min(self.stopped)
            return None if rank is None else (rank, "thread", -1)
        key = "srcFrameId" if command == "copyToGlobals" else "frameId"
        if command in _BY_FRAME:
            found = self.ids.remote(args.get(key))
        elif command in _BY_VARS:
            found = self.ids.remote(args.get("variablesReference"))
        else:
            return None
        return found

    def _kernel_stopped(self) -> bool:
        """Whether the kernel's own debugpy has a thread stopped (ipykernel's ``Debugger.stopped_threads``)."""
        return bool(getattr(getattr(self.kernel, "debugger", None), "stopped_threads", None))

    async def _for_rank(self, request: Message, rank: int, kind: str, remote: int) -> Message:
        command = request["command"]
        args = dict(request.get("arguments") or {})
        if command == "stackTrace":
            return reply(request, await self._stack_trace(rank))
        if kind.startswith("blocked"):
            return reply(request, blocked_view(command, rank, remote, self.ids))
        if command in _STEPS:
            return await self._step(request, rank, args)
        if command == "scopes":
            self.shown = rank
        if command == "copyToGlobals":  # what ipykernel does: the rank's globals get the frame's variable
            command, args = "setExpression", {"expression": f"globals()[{args['dstVariableName']!r}]",
                                              "value": args["srcVariableName"], "frameId": remote}
        elif command == "richInspectVariables":
            shown = f"get_ipython().display_formatter.format({args['variableName']})"
            command, args = "evaluate", {"expression": shown, "frameId": remote, "context": "clipboard"}
        elif kind == "frame":
            args["srcFrameId" if "srcFrameId" in args else "frameId"] = remote
        else:
            args["variablesReference"] = remote
        answer = await self._ask(rank, command, args)
        if request["command"] == "richInspectVariables":
            data: dict[str, Any] = {}
            meta: dict[str, Any] = {}
            if answer.get("success"):
                with contextlib.suppress(ValueError, SyntaxError, TypeError):
                    data, meta = ast.literal_eval(answer["body"]["result"])
            return reply(request, {"data": data, "metadata": {k: v for k, v in meta.items() if k in data}})
        return self._answer(request, answer, rank, namespace=kind == "scope")

    async def _ask(self, rank: int, command: str, args: dict[str, Any]) -> Message:
        link = self.links.get(rank)
        if link is None:
            return {"success": False, "message": f"rank {rank} is not connected to the debugger"}
        try:
            return await asyncio.wait_for(asyncio.wrap_future(link.send(command, args)), ANSWER_WAIT)
        except (ConnectionError, asyncio.TimeoutError) as e:
            return {"success": False, "message": f"rank {rank} did not answer {command} ({e or 'timeout'})"}

    def _answer(self, request: Message, answer: Message, rank: int, namespace: bool = False) -> Message:
        """A rank's response to Lab's request, its frame and variable ids made the bridge's; a scope's variables
        (``namespace``) without ipyparallel's temporaries."""
        body = answer.get("body")
        if isinstance(body, dict):
            body = dict(body)
            if "variables" in body:
                accept = getattr(getattr(self.kernel, "debugger", None), "accept_variable", lambda name: True)
                body["variables"] = [
                    self._vars(v, rank, "scope" if namespace and _is_group(v) else "vars") for v in body["variables"]
                    if accept(v.get("name", "")) and not (namespace and _APPLY_TEMPORARY.fullmatch(str(v.get("name"))))]
            if "scopes" in body:
                body["scopes"] = [self._vars(s, rank, "scope") for s in body["scopes"]]
            body = self._vars(body, rank)
        return reply(request, body, bool(answer.get("success")), str(answer.get("message", "")))

    def _vars(self, item: dict[str, Any], rank: int, kind: Literal["scope", "vars"] = "vars") -> dict[str, Any]:
        ref = item.get("variablesReference")
        if isinstance(ref, int) and ref > 0:
            item = {**item, "variablesReference": self.ids.local(rank, kind, ref)}
        return item

    # ---- stacks: stopped ranks, then blocked ones ----------------------------------------------------------
    async def _stack_trace(self, rank: int) -> dict[str, Any]:
        frames: list[dict[str, Any]] = []
        for r in [rank, *sorted(r for r in self.stopped if r != rank)]:
            stop = self.stopped.get(r)
            if stop is None:
                continue
            answer = await self._ask(r, "stackTrace", {"threadId": stop["threadId"]})
            for f in self._trim((answer.get("body") or {}).get("stackFrames") or []):
                frames.append({**f, "id": self.ids.local(r, "frame", int(f["id"])), "name": f"rank {r}: {f['name']}"})
        frames.extend(await asyncio.get_running_loop().run_in_executor(None, self._blocked_frames, rank))
        return {"stackFrames": frames, "totalFrames": len(frames)}

    def _trim(self, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A rank's frames from the innermost to the cell's own (IPython's frames above the cell dropped)."""
        cells = {i for i, f in enumerate(frames) if (f.get("source") or {}).get("path") in self.breakpoints.by_path
                 or "/ipykernel_" in str((f.get("source") or {}).get("path", ""))}
        return frames[: max(cells) + 1] if cells else frames

    def _blocked_frames(self, first: int) -> list[dict[str, Any]]:
        world = self._world
        if world is None or not self.stopped:
            return []
        running = {r: world.rank_infos[r] for r in sorted(self._pids.values()) if r not in self.stopped}
        return blocked_frames(running, world.scratch_dir, self._code, self._cell_file, self.ids, first)

    # ---- stepping ------------------------------------------------------------------------------------------
    async def _step(self, request: Message, rank: int, args: dict[str, Any]) -> Message:
        command = request["command"]
        if command == "continue" and args.get("singleThread") is False:
            await self._continue_all()
            return reply(request, {"allThreadsContinued": True})
        if command == "pause":
            return await self._pause(request, rank)
        if self.shown in self.stopped:
            rank = self.shown  # Lab steps its "current thread": the rank it last showed is the one the user sees
        stop = self.stopped.get(rank)
        if stop is None:
            return reply(request, success=False, message=f"rank {rank} is not stopped")
        self._ran_on(rank)  # before it runs: its next stop may come before this answer
        answer = await self._ask(rank, command, {**args, "threadId": stop["threadId"]})
        body = {"allThreadsContinued": False} if command == "continue" else None
        return reply(request, body, bool(answer.get("success")), str(answer.get("message", "")))

    async def _pause(self, request: Message, rank: int) -> Message:
        """Pause a running rank: its main thread, which runs the cell (its other threads, pgnb's among them, run on)."""
        threads = (await self._ask(rank, "threads", {})).get("body", {}).get("threads", [])
        main = next((t["id"] for t in threads if t.get("name") == "MainThread"), None)
        if main is None:
            return reply(request, success=False, message=f"rank {rank} is not connected to the debugger")
        answer = await self._ask(rank, "pause", {"threadId": main})
        return reply(request, None, bool(answer.get("success")), str(answer.get("message", "")))

    async def _continue_all(self) -> list[int]:
        stops = dict(self.stopped)
        for r in stops:
            self._ran_on(r)  # before it runs: its next stop may come before the answer
        for r, stop in sorted(stops.items()):
            await self._ask(r, "continue", {"threadId": stop["threadId"]})
        return sorted(stops)

    # ---- the debugger on and off ---------------------------------------------------------------------------
    def _hide_the_bridge(self) -> None:
        """The kernel's own debugpy does not look into pgnb and the libraries it drives a world with: ipykernel
        skips the modules loaded when the kernel started (``filter_internal_frames``), and these come later. With
        "raised exceptions" on, the kernel would stop in the exceptions they raise and catch while a cell runs."""
        modules = getattr(getattr(self.kernel, "debugger", None), "kernel_modules", None)
        if not isinstance(modules, list):
            return
        modules.extend(f for f in _hidden_folders() if f not in modules)  # a folder: pydevd skips what is below it

    def start(self) -> None:
        with self._lock:
            if self.on:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))  # loopback only: a rank on another host is not reached
            listener.listen(64)
            self._listener, self.port, self.on = listener, listener.getsockname()[1], True
            self._token = secrets.token_hex(16)  # reaches the ranks with their cell, over ipyparallel's signed messages
        bridge_thread(self._accept, (listener,), "pgnb-dap-accept").start()

    def stop(self) -> None:
        """The panel was switched off: stopped ranks run on, every rank's session ends, the listener closes."""
        with self._lock:
            if not self.on:
                return
            self.on = False
            listener, self._listener = self._listener, None
            links, self.links = list(self.links.values()), {}
        for link in links:
            with contextlib.suppress(Exception):
                link.call("disconnect", {"restart": False, "terminateDebuggee": False}, timeout=2.0)
            link.close()
        if listener is not None:
            listener.close()
        self.breakpoints.by_path.clear()
        self._ran_on_all()

    def _pre_run_cell(self, info: Any) -> None:
        self._raw_cell = str(getattr(info, "raw_cell", "") or "")

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed: the debugger is off
            bridge_thread(self._configure, (sock,), "pgnb-dap-configure").start()

    def _configure(self, sock: socket.socket) -> None:
        """A rank's pydevd connected: learn which rank, then give it the panel's breakpoints, then let it run."""
        link = RankLink(sock, self._on_event, self._on_close)
        try:
            link.call("initialize", {"adapterID": "pgnb", "clientID": "pgnb", "linesStartAt1": True,
                                     "columnsStartAt1": True, "pathFormat": "path"})
            said = link.call("pydevdAuthorize", {"debugServerAccessToken": None})["body"].get("clientAccessToken")
            if not isinstance(said, str) or not secrets.compare_digest(said, self._token):
                link.close()  # anything on this machine may connect to a loopback port: only the ranks know the token
                return
            info = link.call("pydevdSystemInfo")
            rank = self._pids.get(int(info["body"]["process"]["pid"]))
            if rank is None or not self.on:
                link.close()  # not a rank of the cell that runs
                return
            link.rank = rank
            link.call("attach", {**ATTACH, "rules": [{"path": f, "include": False} for f in _hidden_folders()]})
            self.breakpoints.give(link)
            with self._lock:
                old = self.links.get(rank)
                self.links[rank] = link
            if old is not None:
                old.close()
            link.call("configurationDone")
        except Exception:  # the rank went away, or is not a pydevd: it runs without the panel
            link.close()

    def _on_close(self, link: RankLink) -> None:
        with self._lock:
            if self.links.get(link.rank) is link:
                del self.links[link.rank]
        if link.rank in self.stopped:
            self._ran_on(link.rank)

    # ---- the ranks' events ---------------------------------------------------------------------------------
    def _on_event(self, link: RankLink, event: Message) -> None:
        rank = link.rank
        name = event.get("event")
        body = dict(event.get("body") or {})
        if name == "stopped" and rank >= 0:
            with self._lock:
                if not self.stopped:
                    self._stop_since = time.monotonic()
                self.stopped[rank] = body
            self._publish("stopped", {**body, "threadId": rank_thread(rank), "allThreadsStopped": False,
                                      "description": f"rank {rank}: {body.get('reason', 'stopped')}"})
        elif name == "continued" and rank >= 0:
            self._ran_on(rank)
            with self._resumed:
                self._running.add(rank)
                self._resumed.notify_all()

    def _ran_on(self, rank: int) -> None:
        """A rank runs again: Lab forgets its frames; if another rank stays stopped, Lab is shown it soon."""
        with self._lock:
            if self.stopped.pop(rank, None) is None:
                return
            self.ids.forget(rank)
            if not self.stopped and self._stop_since is not None:
                self._stopped_total += time.monotonic() - self._stop_since
                self._stop_since = None
        self._publish("continued", {"threadId": rank_thread(rank), "allThreadsContinued": False})
        if self.stopped:
            bridge_thread(self._reannounce_later, name="pgnb-dap-reannounce").start()

    def _reannounce_later(self) -> None:
        time.sleep(REANNOUNCE_AFTER)
        self._reannounce()

    def _ran_on_all(self) -> None:
        for rank in list(self.stopped):
            self._ran_on(rank)

    def _reannounce(self) -> None:
        with self._lock:
            if not self.stopped or (self.shown in self.stopped):
                return
            rank = min(self.stopped)
            body = self.stopped[rank]
        self._publish("stopped", {**body, "threadId": rank_thread(rank), "allThreadsStopped": False,
                                  "description": f"rank {rank}: still stopped"})

    def _publish(self, event: str, body: dict[str, Any]) -> None:
        self.kernel._publish_debug_event({"type": "event", "event": event, "body": body, "seq": 0})

    def _threads(self) -> list[dict[str, Any]]:
        world = self._world
        if world is None:
            return []
        out = []
        for r, info in enumerate(world.rank_infos):
            name = f"rank {r}" if is_local(info) else f"rank {r} on {info.host}"
            out.append({"id": rank_thread(r), "name": name})
        return out

    # ---- a %%pg cell (``pgnb.core.cells.Panel``) -----------------------------------------------------------
    def cell_args(self, world: Dispatch, code: str, ranks: list[int]) -> PanelArgs | None:
        self.catch_up()
        if not self.on:
            return None
        raw = self._raw_cell
        offset = cell_offset(raw) if raw.lstrip().startswith("%%pg") else 0
        path = cell_file(raw if offset else code)
        self._catch_up.tell(path, raw if offset else code, offset, self.breakpoints.by_path.get(path, []))
        if not os.path.exists(path):  # dumpCell writes it when Lab asks; a cell run before that needs it too
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(raw if offset else code)
        with self._lock:
            self._world, self._code, self._cell_file = world, "#\n" * offset + code, path
            self._pids = {world.rank_infos[r].pid: r for r in ranks}  # the ranks that run the cell
            self._stopped_total, self._stop_since, self._warned = 0.0, None, False
            released, self._released = self._released, False
        if released:  # after an interrupt the ranks got no breakpoints: the panel's are back before the cell runs
            for done in self.breakpoints.give_back(list(self.links.values())):
                with contextlib.suppress(Exception):
                    done.result(ANSWER_WAIT)
        return {"host": socket.gethostname(), "port": self.port, "cell_file": path, "line_offset": offset,
                "token": self._token}

    def stopped_seconds(self) -> float:
        with self._lock:
            since = self._stop_since
            return self._stopped_total + (time.monotonic() - since if since is not None else 0.0)

    def tick(self) -> None:
        """Say once when a stop lasts long enough for a peer blocked in a collective to hit torch's timeout."""
        since, world = self._stop_since, self._world
        if since is None or world is None or self._warned:
            return
        limit = float(world.spec.timeout)
        if time.monotonic() - since < WARN_SHARE * limit:
            return
        self._warned = True
        ranks = ranks_text(sorted(self.stopped))
        print(f"pgnb: {ranks} stopped in the debugger for over {WARN_SHARE * limit:.0f} s: a rank waiting for a "
              f"stopped one in a collective fails at the process group's timeout ({limit:g} s, %pg_init --timeout)",
              file=sys.stderr)

    def release(self) -> None:
        """The cell is interrupted: no breakpoint stops a rank until the next cell, and the stopped ones run on."""
        with self._lock:
            self._released = True
            links = list(self.links.items())
        with self._resumed:
            self._running.clear()
        pending: list[Future[Message]] = []
        waking = set()
        for rank, link in links:
            pending += self.breakpoints.take_away(link)
            stop = self.stopped.get(rank)
            if stop is not None:
                self._ran_on(rank)
                waking.add(rank)
                pending.append(link.send("continue", {"threadId": stop["threadId"]}))
        for done in pending:
            with contextlib.suppress(Exception):
                done.result(2.0)
        # the interrupt comes next: it must find the rank in the cell's code, not in pydevd's wait (which it breaks)
        with self._resumed:
            self._resumed.wait_for(lambda: waking <= self._running, timeout=RESUME_WAIT)
        time.sleep(RESUME_WAIT / 10 if waking else 0)

    def cell_done(self) -> None:
        """The cell ended: no rank of it is stopped any more (a rank that ended while stopped was released)."""
        with self._lock:
            self._ran_on_all()
