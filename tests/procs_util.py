"""A Jupyter kernel whose pgnb processes and files can be found from outside, whatever it is doing.

``MarkedKernel`` starts a kernel with its own ``TMPDIR`` and ``IPYTHONDIR`` and
a marker in its environment, which every process it starts inherits
(controller and schedulers, zygote, engines, nannies, reaper). So the test
sees them through ``/proc`` while the kernel is busy in a magic, and tells
them apart by their command line and their place in the process tree; it
kills only those, by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import uuid
from typing import get_args

import psutil
from kernel_util import Kernel

from pgnb.core.waiting import poll_until
from pgnb.procs.processes import ProcessKind, carrying, process_running
from pgnb.procs.reaper_handle import REAPER_MAIN

MARK = "PGNB_TEST_MARK"
KINDS: tuple[ProcessKind, ...] = get_args(ProcessKind)

class MarkedKernel(Kernel):
    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.tmpdir = tempfile.mkdtemp(prefix="pgnb-chaos-tmp-")
        self.ipythondir = tempfile.mkdtemp(prefix="pgnb-chaos-ipython-")
        super().__init__(env={MARK: self.mark, "TMPDIR": self.tmpdir, "IPYTHONDIR": self.ipythondir})

    # ---- what exists, seen from outside ----------------------------------
    def processes(self) -> list[psutil.Process]:
        """Every live process this kernel started (through pgnb), the kernel itself excluded."""
        found = []
        for pid in carrying(MARK, self.mark, exclude=self.pid):
            try:
                p = psutil.Process(pid)
            except psutil.Error:
                continue
            if process_running(p.pid):
                found.append(p)
        return found

    def by_kind(self) -> dict[ProcessKind, list[int]]:
        """The live processes by what they are for pgnb."""
        out: dict[ProcessKind, list[int]] = {k: [] for k in KINDS}
        procs = self.processes()
        info = {}
        for p in procs:
            try:
                info[p.pid] = (" ".join(p.cmdline()), p.ppid(), os.getsid(p.pid))
            except (OSError, psutil.Error):
                continue
        zygotes = {pid for pid, (cmd, _, _) in info.items() if "pgnb.procs.zygote" in cmd and info[pid][1] == self.pid}
        controllers = {pid for pid, (cmd, ppid, _) in info.items()
                       if "ipyparallel.controller" in cmd and ppid == self.pid}
        for pid, (cmd, ppid, sid) in info.items():
            if REAPER_MAIN in cmd:
                out["reaper"].append(pid)
            elif pid in controllers:
                out["controller"].append(pid)
            elif "ipyparallel.controller" in cmd:
                out["scheduler"].append(pid)
            elif pid in zygotes:
                out["zygote"].append(pid)
            elif ppid in zygotes:
                out["nanny" if sid == pid else "engine"].append(pid)
        return out

    def files(self) -> list[str]:
        """pgnb's files of this kernel: its temp dirs, and the cluster files in the profile's security folder."""
        sec = os.path.join(self.ipythondir, "profile_default", "security")
        tmp = sorted(os.path.join(self.tmpdir, f) for f in os.listdir(self.tmpdir) if f.startswith("pgnb")) \
            if os.path.isdir(self.tmpdir) else []
        return tmp + (sorted(os.path.join(sec, f) for f in os.listdir(sec)) if os.path.isdir(sec) else [])

    def wait_nothing_left(self, timeout: float) -> tuple[list[int], list[str]]:
        """Wait until no process and no file of this kernel's pgnb is left; what is left at ``timeout``."""
        poll_until(lambda: not self.processes() and not self.files(), timeout, step=0.1)
        return [p.pid for p in self.processes()], self.files()

    # ---- asking the kernel (when idle) -------------------------------------
    def world(self) -> dict:
        """What pgnb in the kernel says: phase, message, rows (rank, state, pid, error)."""
        ex = self.execute(
            "import json, pgnb\n"
            "_sb = pgnb.current()\n"
            "_snap = _sb.snapshot() if _sb is not None else None\n"
            "print(json.dumps(None if _snap is None else {'phase': _snap.phase, 'message': _snap.message,\n"
            "    'engines': len(_sb.engine_ids),\n"
            "    'rows': [(r.rank, r.state, r.pid, r.error) for r in _snap.ranks]}))", timeout=60)
        assert ex.status == "ok", ex.text()
        # print's text may come in more than one stream message
        return json.loads("".join(o["text"] for o in ex.outputs if o["type"] == "stream" and o["name"] == "stdout"))

    def kill_pid(self, pid: int, sig: int = signal.SIGKILL) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def close(self, kill: bool = True) -> None:
        """SIGKILL the kernel (as nbval does), or shut it down normally; once."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if kill:
            self.kill()
        else:
            self.shutdown()

    def forget(self) -> None:
        """Remove the kernel's own temp dirs (after checking that pgnb left nothing in them)."""
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        shutil.rmtree(self.ipythondir, ignore_errors=True)
