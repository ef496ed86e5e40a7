"""A rank under JupyterLab's Debugger panel: pydevd in the engine, connected to the kernel's bridge.

While the kernel's visual debugger is on, a ``%%pg`` cell's ``DebugArgs``
carry ``panel`` (``pgnb._wire.PanelArgs``). Before the cell runs, the rank's
pydevd (debugpy's debugger, in process, no adapter process) connects to the
kernel's Debug Adapter Protocol listener on 127.0.0.1 (``pgnb.debugger``) and
waits until the kernel has set the panel's breakpoints (``configurationDone``);
it stays connected for the next cells. The cell is compiled under the file name
``dumpCell`` gives its full text, with the ``%%pg`` line(s) above its body as
comment lines, so a breakpoint on line 3 of the cell in the panel is line 3 here.

With the debugger off nothing of this is imported; a cell that finds a
connection the kernel has closed (the panel was switched off) ends it, so the
rank runs untraced again.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from .._wire import PanelArgs

#: Seconds a rank waits for the kernel to configure its debugger before it runs the cell without it.
ATTACH_WAIT = 10.0
#: The port this rank's pydevd is connected to (absent: none).
_STATE: dict[str, int] = {}


def _pydevd() -> Any:
    # pydevd warns on stderr about frozen stdlib modules (the cell's output): breakpoints are in cell files only
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import importlib

    importlib.import_module("debugpy.server.api")  # puts debugpy's vendored pydevd on sys.path
    return importlib.import_module("pydevd")


def connected() -> bool:
    return "port" in _STATE


def connect(args: PanelArgs) -> str:
    """Connect to the kernel's bridge (once per debug session) and wait until it configured us; ``""``
    when the cell can run under the debugger, else one line that says why it runs without."""
    import socket

    if socket.gethostname() != args["host"]:
        return "the visual debugger reaches the ranks on the kernel's host only"
    pydevd = _pydevd()
    db = pydevd.get_global_debugger()
    if _STATE.get("port") == args["port"] and db is not None and not db.pydb_disposed and sys.gettrace() is not None:
        return ""  # (an interrupt that lands inside pydevd's own code stops its tracing: then a fresh session)
    disconnect()
    try:
        pydevd.settrace(host="127.0.0.1", port=args["port"], protocol="dap", suspend=False,
                        trace_only_current_thread=False, patch_multiprocessing=False, notify_stdin=False,
                        block_until_connected=True, wait_for_ready_to_run=False,
                        client_access_token=args["token"])
    except OSError as e:
        return f"the rank cannot reach the kernel's debugger ({e.strerror or e})"
    _STATE["port"] = args["port"]
    db = pydevd.get_global_debugger()
    if db is None or db.pydb_disposed:
        disconnect()
        return "the rank's debugger session did not start"
    gave_up = threading.Event()
    timer = threading.Timer(ATTACH_WAIT, gave_up.set)
    timer.daemon = True
    timer.start()
    try:
        db.block_until_configuration_done(cancel=gave_up)  # the kernel sets the breakpoints meanwhile
    finally:
        timer.cancel()
    if not db.is_attached():
        disconnect()
        return f"the kernel's debugger did not configure this rank in {ATTACH_WAIT:g} s"
    return ""


def disconnect() -> None:
    """End this rank's debug session (if any): pydevd stops tracing and its threads end."""
    if _STATE.pop("port", None) is None and "pydevd" not in sys.modules:
        return
    pydevd = _pydevd()
    db = pydevd.get_global_debugger()
    if db is None:
        return
    pydevd.stoptrace()
    # When the kernel closed the connection first (the panel switched off), pydevd's reader thread is disposing
    # the session and lets go of it only at its end, up to a second later; a settrace meanwhile would take it up
    # again, connected to nothing, and the cell would run past every breakpoint
    if pydevd.get_global_debugger() is db:
        pydevd.set_global_debugger(None)
    pydevd.SetupHolder.setup = None  # the next settrace starts a fresh session, on the port it is given


def stale() -> bool:
    """The kernel closed this rank's connection (the panel was switched off): pydevd disposed itself."""
    if "port" not in _STATE:
        return False
    db = sys.modules["pydevd"].get_global_debugger()
    return db is None or bool(db.pydb_disposed)


@contextmanager
def compiled_as(shell: Any, args: PanelArgs) -> Iterator[str]:
    """Compile the cell under ``args["cell_file"]``; yields the prefix that puts its body on the right lines."""
    compiler = shell.compile
    compiler.get_code_name = lambda raw, transformed, number: args["cell_file"]
    try:
        yield "#\n" * args["line_offset"]
    finally:
        del compiler.get_code_name


def breakpoint_here(frame: FrameType) -> None:
    """``breakpoint()`` in a cell under the panel: stop at the caller, as ``debugpy.breakpoint()`` does."""
    pydevd = _pydevd()
    pydevd.settrace(suspend=True, trace_only_current_thread=True, patch_multiprocessing=False,
                    stop_at_frame=frame, notify_stdin=False)
