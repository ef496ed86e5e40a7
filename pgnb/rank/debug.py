"""pdb on a rank, answered from the notebook: ``breakpoint()`` in ``%%pg``, ``%pg_debug``, ``%%pg --pdb``.

While a ``%%pg`` cell runs, ``breakpoint()`` and ``pdb.set_trace()`` on a rank
open ``RankPdb``, whose input and output go over a Unix socket to the kernel
(``pgnb.core.debug``), which asks the user through the notebook's own
``input()`` and sends the answer back. The prompt names the rank
(``(Pdb rank 2)``) and the cell's frames read ``Cell, line 3``.

Where nothing can answer (the kernel said so: nbval, ``allow_stdin=False``,
``Sandbox.execute`` without ``on_input``, a rank on another host), a
breakpoint prints one line and the cell goes on, as IPython does.

The frames of a cell that raised are kept (``keep_failure``) until the next
cell on the rank, for a post-mortem.
"""

from __future__ import annotations

import json
import os
import pdb
import socket
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import IO, Any, cast

from .._wire import DebugArgs

#: The last failed cell's exception on this rank (its traceback holds the frames), until the next cell.
_FAILURE: dict[str, BaseException] = {}
#: "wanted" (an Event) and the "thread" that collects garbage when it is set (``_collect_soon``)
_COLLECTOR: dict[str, Any] = {}
SKIPPED = "breakpoint skipped on rank {rank}: {why}"
NO_FAILURE = "rank {rank} has no failed cell to debug (its last %%pg cell raised nothing, or a newer cell ran)"


class _Channel:
    """pdb's stdin and stdout: what pdb writes is sent to the kernel with the next prompt; a line comes back."""

    def __init__(self, path: str, rank: int) -> None:
        self.rank = rank
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = self.sock.makefile("r", encoding="utf-8")
        self.pending: list[str] = []

    # -- stdout --
    def write(self, text: str) -> int:
        self.pending.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    # -- stdin --
    def readline(self) -> str:
        text = "".join(self.pending)
        self.pending.clear()
        self.sock.sendall((json.dumps({"rank": self.rank, "text": text}) + "\n").encode())
        answer = self.reader.readline()
        if not answer:  # the kernel went away: leave the debugger
            return "c\n"
        line = json.loads(answer).get("line")
        return "q\n" if line is None else str(line) + "\n"

    def close(self) -> None:
        if self.pending:  # the last words (after `c`) go with a final message that asks nothing
            self.sock.sendall((json.dumps({"rank": self.rank, "text": "".join(self.pending), "done": True})
                               + "\n").encode())
            self.pending.clear()
        self.reader.close()
        self.sock.close()


class RankPdb(pdb.Pdb):
    """pdb with a rank's name in its prompt and the cell's frames shown as ``Cell, line N``."""

    def __init__(self, channel: _Channel, cell_files: set[str]) -> None:
        io = cast("IO[str]", channel)  # a file for pdb: write, flush, readline
        super().__init__(stdin=io, stdout=io, nosigint=True)
        self.use_rawinput = False
        self.prompt = f"(Pdb rank {channel.rank}) "
        self.cell_files = cell_files

    def format_stack_entry(self, frame_lineno: tuple[FrameType, int], lprefix: str = ": ") -> str:
        frame, lineno = frame_lineno
        if frame.f_code.co_filename in self.cell_files:
            func = frame.f_code.co_name
            where = "" if func == "<module>" else f", in {func}"
            import linecache

            line = linecache.getline(frame.f_code.co_filename, lineno, frame.f_globals).strip()
            return f"Cell, line {lineno}{where}" + (f"{lprefix}{line}" if line else "")
        return super().format_stack_entry(frame_lineno, lprefix)


def _cell_files() -> set[str]:
    from IPython import get_ipython

    shell = get_ipython()
    return set(getattr(getattr(shell, "compile", None), "_filename_map", {}) or {})


def _open(args: DebugArgs | None, rank: int) -> tuple[_Channel | None, str]:
    """A channel to the kernel, or why there is none."""
    if args is None or not args.get("path"):
        return None, args.get("why", "no input is possible here") if args else "no input is possible here"
    path = str(args["path"])
    if not os.path.exists(path):
        return None, "the rank runs on another host than the kernel"
    try:
        return _Channel(path, rank), ""
    except OSError as e:
        return None, f"cannot reach the kernel ({e.strerror})"


def install(args: DebugArgs | None, rank: int) -> dict[str, Any]:
    """For the cell about to run: ``breakpoint()`` and ``pdb.set_trace()`` stop here and ask the kernel."""

    def stop(*_: Any, **__: Any) -> None:
        frame = sys._getframe(1)
        channel, why = _open(args, rank)
        if channel is None:
            print(SKIPPED.format(rank=rank, why=why), file=sys.stderr)
            return
        debugger = RankPdb(channel, _cell_files())
        for fn in ON_STOP:
            fn()
        debugger.set_trace(frame)
        _CHANNELS.append(channel)

    saved = {"breakpointhook": sys.breakpointhook, "set_trace": pdb.set_trace}
    _CELL["args"] = args
    sys.breakpointhook = stop
    pdb.set_trace = stop
    _forget_failure()  # a new cell: the last failure's frames go
    return saved


_CHANNELS: list[_Channel] = []
#: Called when a breakpoint opens pdb on this rank (the pytest plugin's runner stops its deadline).
ON_STOP: list[Callable[[], None]] = []
#: The running cell's way to the kernel (``install``'s args), for ``debug_exception``.
_CELL: dict[str, DebugArgs | None] = {}


def uninstall(saved: dict[str, Any]) -> None:
    _CELL.pop("args", None)
    sys.breakpointhook = saved["breakpointhook"]
    pdb.set_trace = saved["set_trace"]
    while _CHANNELS:
        _CHANNELS.pop().close()


def keep_failure(exc: BaseException) -> None:
    _FAILURE["exc"] = exc


def _forget_failure() -> None:
    """The last failed cell's frames go, and what they held: a DataLoader iterator keeps its worker
    processes until it is freed. IPython keeps the traceback too (``sys.last_*``, ``InteractiveTB.tb``
    and its last run's result), and a raised exception's frames are a cycle that only the collector
    frees: drop them all, after a failure only."""
    exc = _FAILURE.pop("exc", None)
    if exc is None:
        return
    if getattr(sys, "last_value", None) is exc:
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                delattr(sys, name)
    from IPython import get_ipython

    shell = get_ipython()
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is not None:
        formatter.tb = None
    if getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None) is exc:
        shell.last_execution_result = None
    del exc
    _collect_soon()


def _collect_soon() -> None:
    """``gc.collect()`` in a thread of pgnb's, not the cell's: an errored DataLoader iterator's shutdown waits
    5 s for each worker (torch's join timeout). One thread, so that no collection asked for is skipped (a
    ``gc.collect()`` while another runs returns at once)."""
    import threading

    if "thread" not in _COLLECTOR:
        import gc

        wanted = _COLLECTOR["wanted"] = threading.Event()

        def collect() -> None:
            while wanted.wait():
                wanted.clear()
                gc.collect()

        _COLLECTOR["thread"] = threading.Thread(target=collect, name="pgnb-collector", daemon=True)
        _COLLECTOR["thread"].start()
    _COLLECTOR["wanted"].set()


def post_mortem(args: DebugArgs | None, rank: int) -> str:
    """``%pg_debug``: pdb in the frame where this rank's last failed cell raised. Returns what to report."""
    exc = _FAILURE.get("exc")
    tb: TracebackType | None = exc.__traceback__ if exc is not None else None
    if tb is None:
        return NO_FAILURE.format(rank=rank)
    channel, why = _open(args, rank)
    if channel is None:
        return f"no debugger for rank {rank}: {why}"
    cells = _cell_files()
    while tb.tb_next is not None and tb.tb_frame.f_code.co_filename not in cells:
        tb = tb.tb_next  # skip IPython's frames above the cell
    return _interact(channel, cells, tb)


def debug_exception(exc: BaseException, rank: int) -> str:
    """pdb now, where ``exc`` was raised, through the running cell's channel (the pytest plugin's ``--pdb``:
    the test's frames are alive in its thread). Returns ``""`` when a debugger ran, else why not."""
    tb = exc.__traceback__
    if tb is None:
        return NO_FAILURE.format(rank=rank)
    channel, why = _open(_CELL.get("args"), rank)
    if channel is None:
        return f"no debugger for rank {rank}: {why}"
    for fn in ON_STOP:
        fn()
    return _interact(channel, _cell_files(), tb)


def _interact(channel: _Channel, cells: set[str], tb: TracebackType) -> str:
    """pdb at ``tb`` over ``channel`` until the user continues or quits; ``""`` (a debugger ran)."""
    debugger = RankPdb(channel, cells)
    debugger.reset()
    try:
        debugger.interaction(None, tb)
    finally:
        channel.close()
    return ""
