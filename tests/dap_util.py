"""JupyterLab's side of the kernel's debugger, as Lab 4 speaks it: ``debug_request`` on the control channel,
``debug_event`` on iopub, while cells run on the shell channel (jupyter_client, one thread)."""

from __future__ import annotations

import queue
import time
from typing import Any

from kernel_util import Execution, Kernel, Pending

#: Lab 4's initialize arguments (packages/debugger, session.ts)
INITIALIZE = {"clientID": "jupyterlab", "clientName": "JupyterLab", "adapterID": "python", "pathFormat": "path",
              "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True,
              "supportsVariablePaging": True, "supportsRunInTerminalRequest": True, "locale": "en"}


class Panel:
    """The Debugger panel of one kernel: requests answered in order, events kept until a test takes them."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel, self.kc = kernel, kernel.kc
        self.seq = 0
        self.events: list[dict[str, Any]] = []
        self.running: Pending | None = None  # the cell started last: what iopub brings for it is its own

    def request(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30,
                running: Pending | None = None) -> dict[str, Any]:
        """A debug_request and its reply; iopub is read meanwhile (events kept, a running cell's output taken)."""
        self.seq += 1
        msg = self.kc.session.msg("debug_request", {"type": "request", "seq": self.seq, "command": command,
                                                    "arguments": arguments or {}})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.kc.control_channel.get_msg(timeout=0.05)
            except queue.Empty:
                self.pump(0.0, running)
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]
        raise TimeoutError(f"no debug_reply to {command} in {timeout} s")

    def start(self) -> None:
        """The bug button: Lab's first requests."""
        reply = self.request("initialize", INITIALIZE)
        if not reply["success"]:
            # ipykernel's debugger could not start debugpy (its listen ran on the kernel's shell and did not
            # answer ok: seen once in a fresh clone's make test, right after a restart, on a loaded machine);
            # Lab shows the button off then, and a user clicks it again
            time.sleep(2.0)
            reply = self.request("initialize", INITIALIZE)
        assert reply["success"], reply
        assert self.request("attach", {})["success"]
        assert self.request("configurationDone")["success"]

    def lab_start(self) -> None:
        """The bug button on a kernel that has run nothing yet (a new kernel, or one just restarted): Lab asks what
        the kernel's debugger holds (``restoreState``), then starts it, before any cell of "Run All" runs."""
        assert self.request("debugInfo")["success"]
        self.start()

    def update_breakpoints(self, code: str, lines: list[int]) -> str:
        """A click in the gutter of the cell ``code`` as Lab 4 sends it (``updateBreakpoints``); the cell's path."""
        path = self.request("dumpCell", {"code": code})["body"]["sourcePath"]
        assert self.request("debugInfo")["success"]
        reply = self.request("setBreakpoints", {"source": {"path": path},
                                                "breakpoints": [{"line": n} for n in lines]})
        assert reply["success"], reply
        assert self.request("configurationDone")["success"]
        return str(path)

    def stop(self) -> dict[str, Any]:
        return self.request("disconnect", {"restart": False, "terminateDebuggee": False})

    def pump(self, seconds: float, running: Pending | None = None) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return
                continue
            if msg["msg_type"] == "debug_event":
                self.events.append(msg["content"])
            elif (running or self.running) is not None:
                (running or self.running)._take(msg)

    def event(self, name: str, timeout: float = 30, running: Pending | None = None, **body: Any) -> dict[str, Any]:
        """The first kept event ``name`` whose body has ``body``'s items (waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("event") == name and all(e.get("body", {}).get(k) == v for k, v in body.items()):
                    self.events.remove(e)
                    return e
            if time.monotonic() >= deadline:
                kept = [e.get("event") for e in self.events]
                raise TimeoutError(f"no {name} event {body} in {timeout} s; kept: {kept}")
            self.pump(0.1, running)

    def run(self, code: str) -> Pending:
        """Start a cell; read it with ``pump``/``event``/``finish``."""
        self.running = self.kernel.pending(self.kernel.kc.execute(code))
        return self.running

    def finish(self, running: Pending, timeout: float = 60) -> Execution:
        deadline = time.monotonic() + timeout
        while not running.idle:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the cell did not end in {timeout} s")
            self.pump(0.1, running)
        assert running.read(max(1.0, deadline - time.monotonic()))
        return running.execution

    def execute(self, code: str, timeout: float = 60) -> Execution:
        return self.finish(self.run(code), timeout)

    # ---- what a test asks about a stop ----
    def frames(self, thread_id: int) -> list[dict[str, Any]]:
        reply = self.request("stackTrace", {"threadId": thread_id})
        assert reply["success"], reply
        return reply["body"]["stackFrames"]

    def variables(self, frame_id: int, scope: int = 0) -> dict[str, str]:
        scopes = self.request("scopes", {"frameId": frame_id})["body"]["scopes"]
        ref = scopes[scope]["variablesReference"]
        found = self.request("variables", {"variablesReference": ref})["body"]["variables"]
        return {v["name"]: v["value"] for v in found}
