"""Processes pgnb starts are plain Python processes, even while a debugger traces the one starting them.

When JupyterLab's Debugger panel is switched on, ipykernel calls ``debugpy.listen`` in the
kernel, and debugpy's pydevd rewrites the command line of every Python child the kernel
starts from then on (``subprocess``, ``os.posix_spawn``, ``os.exec*``), so that the child
runs under pydevd, reports itself to debugpy's adapter and waits to be configured. Lab
ignores that report (the adapter's ``debugpyAttach`` event), so a controller, zygote or
reaper started then would wait forever, even after the debugger is switched off.

pydevd's own switch for a child that must start as asked is ``skip_subprocess_arg_patch``;
it holds for the calling thread only, so it wraps the very call that starts the process.
Without a debugger (pydevd not imported, or never told to patch) it changes nothing.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from typing import Any


def undebugged() -> AbstractContextManager[Any]:
    """Around a call that starts a process: the process starts as asked, outside any debugger of this one."""
    pydevd = sys.modules.get("pydevd")  # imported by debugpy (ipykernel loads it with every kernel)
    skip = getattr(pydevd, "skip_subprocess_arg_patch", None)
    return skip() if callable(skip) else nullcontext()
