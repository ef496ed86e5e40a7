"""Drive a real Jupyter kernel (jupyter_client) and collect what it sends, as nbval sees it."""

from __future__ import annotations

import os
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


class Kernel:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.km = KernelManager(kernel_name="python3")
        # the kernel runs this interpreter, so it sees the same pgnb
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        self.km.start_kernel(env={**os.environ, **(env or {})})
        self.kc = self.km.client()
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
        ex = Execution(status="")
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind in ("display_data", "execute_result"):
                ex.outputs.append({"type": kind, "data": content["data"]})
            elif kind == "stream":
                ex.outputs.append({"type": kind, "name": content["name"], "text": content["text"]})
            elif kind == "error":
                ex.outputs.append({"type": kind, "ename": content["ename"], "evalue": content["evalue"],
                                   "traceback": content["traceback"]})
            elif kind.startswith("comm"):
                ex.comm_msgs.append(content)
        while True:  # replies to requests sent earlier (e.g. an interrupted cell's) come first
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        ex.status = reply["content"]["status"]
        ex.reply = reply["content"]
        return ex

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
