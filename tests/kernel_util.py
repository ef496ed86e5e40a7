"""Drive a real Jupyter kernel (jupyter_client) and collect what it sends, as nbval sees it."""

from __future__ import annotations

import functools
import os
import queue
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager


@dataclass
class Execution:
    status: str
    outputs: list[dict[str, Any]] = field(default_factory=list)  # display_data / execute_result / stream / error
    comm_msgs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    reply: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """Everything nbval would compare: streams and text/plain, in order."""
        parts = []
        for o in self.outputs:
            if o["type"] == "stream":
                parts.append(f"<{o['name']}>{o['text']}")
            elif o["type"] in ("display_data", "execute_result"):
                parts.append(o["data"].get("text/plain", ""))
            elif o["type"] == "error":
                parts.append(f"<error>{o['ename']}: {o['evalue']}")
        return "\n".join(parts)

    @property
    def error(self) -> dict[str, Any] | None:
        """The error as the execute reply has it (a UsageError sends no iopub error, only stderr)."""
        if self.status != "error":
            return None
        return {"ename": self.reply.get("ename"), "evalue": self.reply.get("evalue"),
                "stderr": "".join(o["text"] for o in self.outputs if o.get("name") == "stderr")}


class Pending:
    """A request sent to the kernel whose messages are read as they come, on the caller's thread.

    A test that acts while a cell runs (interrupts it, kills a process) reads in short steps between its
    actions rather than in a second thread: the client's sockets are then only ever used by one thread."""

    def __init__(self, kernel: Kernel, msg_id: str) -> None:
        self.kc, self.msg_id = kernel.kc, msg_id
        self.execution = Execution(status="")
        self.idle = False
        self.ended_at: float | None = None  # time.monotonic() when the reply was read

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def read(self, seconds: float) -> bool:
        """Read what comes for up to ``seconds``; whether the request has ended (the kernel idle, its reply read)."""
        deadline = time.monotonic() + seconds
        while not self.idle:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                return False
            self._take(msg)
        while not self.ended:  # replies to requests sent earlier (e.g. an interrupted cell's) come first
            reply = self.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 10))
            if reply["parent_header"].get("msg_id") == self.msg_id:
                self.execution.status = reply["content"]["status"]
                self.execution.reply = reply["content"]
                self.ended_at = time.monotonic()
        return True

    def _take(self, msg: dict[str, Any]) -> None:
        if msg["parent_header"].get("msg_id") != self.msg_id:
            return
        ex, kind, content = self.execution, msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            self.idle = True
        elif kind in ("display_data", "execute_result"):
            ex.outputs.append({"type": kind, "data": content["data"]})
        elif kind == "stream":
            ex.outputs.append({"type": kind, "name": content["name"], "text": content["text"]})
        elif kind == "error":
            ex.outputs.append({"type": kind, "ename": content["ename"], "evalue": content["evalue"],
                               "traceback": content["traceback"]})
        elif kind.startswith("comm"):
            ex.comm_msgs.append(content)


class Kernel:
    def __init__(self, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.km = KernelManager(kernel_name="python3")
        # the kernel runs this interpreter, so it sees the same pgnb
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        self.km.start_kernel(env={**os.environ, **(env or {})}, cwd=cwd)
        self.kc = self.km.client()
        # Each test reads a reply before it sends the next cell, so a failed cell must not abort the next
        # one: ipykernel 6.29 aborts any request that arrives before its abort window closes, on a busy machine
        self.kc.execute = functools.partial(self.kc.execute, stop_on_error=False)  # type: ignore[method-assign]
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def execute(self, code: str, timeout: float = 120) -> Execution:
        t0 = time.monotonic()
        ex = self.collect(self.kc.execute(code), timeout)
        ex.seconds = time.monotonic() - t0
        return ex

    def collect(self, msg_id: str, timeout: float = 120) -> Execution:
        """Everything the kernel sends for the request ``msg_id``, until it is idle, and its reply."""
        pending = self.pending(msg_id)
        if not pending.read(timeout):
            raise TimeoutError(f"no reply to {msg_id} in {timeout} s")
        return pending.execution

    def pending(self, msg_id: str) -> Pending:
        return Pending(self, msg_id)

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    def kill(self) -> None:
        """SIGKILL, as nbval ends its kernels."""
        import signal

        self.kc.stop_channels()
        os.kill(self.pid, signal.SIGKILL)
        self.km.provisioner.process.wait()
        self.km.cleanup_resources()
