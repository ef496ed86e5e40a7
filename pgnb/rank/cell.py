"""A ``%%pg`` cell on one rank: run it, trim its traceback, pack its value, dump stacks on request.

Sent by reference to the engines (``pgnb.rank.cell.run_cell``); nothing heavy
is imported at the top. The cell's output travels on the engine's iopub
stream; the reply (``pgnb._wire.CellReply``) says how the cell ended.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from .._wire import CellError, CellReply, DebugArgs, PackedValue, TraceArgs
from . import children as rank_children, dap as rank_dap, debug as rank_debug, rendezvous as rank_rendezvous
from .stacks import enable_stack_dumps
from .values import to_cpu

#: Last-expression values bigger than this stay on the rank (``_pg`` gets a stand-in).
VALUE_LIMIT = 64 * 2**20
#: A file's absolute path in a traceback's frame line (``File "/.../worker.py", line 374``).
_FILE = re.compile(r'File "(/[^"]+)"')
_STATE: dict[str, Any] = {}


def run_cell(code: str, label: int | None = None, stack_dir: str | None = None,
             trace: TraceArgs | None = None, debug: DebugArgs | None = None, value_of: str | None = None) -> CellReply:
    """Run a notebook cell in this rank's IPython namespace, as ``%%pg`` does.

    Runs through ``shell.run_cell`` (so magics, ``display()`` and the
    last-expression value behave as in a notebook), but as an apply request:
    a failing cell is reported in the return value, so the engine never
    aborts the requests queued behind it (``TaskAborted``). ``label`` is the
    notebook's cell number, so tracebacks say ``Cell In[label]`` on every run.
    ``trace`` (``%%pg --trace``): the arguments of ``trace.start``; the
    torch.distributed calls are recorded while the cell runs, and only then.
    ``debug``: where ``breakpoint()`` reaches the kernel (``pgnb.rank.debug``);
    the frames of a cell that raises are kept for ``%pg_debug`` until the next cell.
    ``value_of``: the value sent back is this name of the namespace, taken out of it after the cell
    (pgnb's own cells assign their reply: nothing is displayed).
    """
    enable_stack_dumps(stack_dir)
    from IPython import get_ipython

    shell = get_ipython()
    error: CellError = {}

    def grab(etype: Any, evalue: Any, stb: list[str]) -> None:
        error.update({"ename": getattr(etype, "__name__", str(etype)), "evalue": clean_message(str(evalue)),
                      "traceback": plain_traceback(evalue, shell)})
        if isinstance(evalue, BaseException):
            rank_debug.keep_failure(evalue)

    rank = int(shell.user_ns.get("rank", -1))
    hooks = rank_debug.install(debug, rank)
    panel = None if debug is None else debug.get("panel")
    if panel is not None:  # JupyterLab's Debugger panel is on: the cell runs under pydevd
        why = rank_dap.connect(panel)
        if why:
            print(f"pgnb: rank {rank} runs without the visual debugger: {why}", file=sys.stderr)
            panel = None
        else:
            sys.breakpointhook = lambda *_, **__: rank_dap.breakpoint_here(sys._getframe(1))
    elif rank_dap.connected():  # the panel was switched off: trace no more
        rank_dap.disconnect()
    _exits_like_sys_exit(shell)

    if trace is not None:
        from . import trace as rank_trace

        rank_trace.start(**trace)
    saved_count = shell.execution_count
    shadowed = shell.__dict__.get("_showtraceback")
    shell._showtraceback = grab  # the formatted traceback comes back in the reply, not on iopub
    # grab() ignores IPython's formatted text: do not pay for its verbose form (stack_data parses every
    # library file on the stack, ~1 s for torch's distributed_c10d.py on a loaded machine)
    tb_mode = shell.InteractiveTB.mode
    shell.InteractiveTB.set_mode("Plain")
    if label is not None:
        shell.execution_count = label
    try:
        rank_children.watch(stack_dir)  # a spawned child's traceback goes to its fd 2, the engine's log
        if panel is None:
            res = shell.run_cell(code, store_history=False, silent=False)
        else:
            with rank_dap.compiled_as(shell, panel) as lines_above:
                res = shell.run_cell(lines_above + code, store_history=False, silent=False)
    finally:
        spawned = rank_children.unwatch(short_path)
        if trace is not None:
            rank_trace.stop()
        if shadowed is None:
            del shell._showtraceback
        else:
            shell._showtraceback = shadowed
        shell.execution_count = saved_count
        shell.InteractiveTB.set_mode(tb_mode)
        rank_debug.uninstall(hooks)
    moved = rank_rendezvous.restore()  # a cell's os.environ["MASTER_PORT"] = ... is not the next cell's
    if moved:
        print(moved, file=sys.stderr)
    if spawned and not res.success:  # e.g. torch.multiprocessing.spawn's "process 0 terminated with exit code 1"
        print(spawned, file=sys.stderr, end="")
    exited = res.error_in_exec if isinstance(res.error_in_exec, SystemExit) else None
    if not res.success and exited is None and debug is not None and debug.get("post_mortem"):
        note = rank_debug.post_mortem(debug, rank)  # %%pg --pdb: the user looks around before the reply goes
        if note:
            print(note, file=sys.stderr)
    out: CellReply = {"ok": bool(res.success), "before_exec": res.error_before_exec is not None}
    if not res.success:
        exc = res.error_before_exec or res.error_in_exec
        out.update({"ename": type(exc).__name__, "evalue": str(exc), "traceback": []})
        out = {**out, **error}  # IPython's formatted traceback, when it showed one
        if isinstance(exc, SyntaxError):  # str() names the cell's temp file; say the line instead
            out["evalue"] = f"{exc.msg} (line {exc.lineno})" if exc.lineno else str(exc.msg)
        if exited is not None:  # no traceback: the kernel says it in one line, "rank 2 called sys.exit(0)"
            out.update({"ename": "SystemExit", "evalue": exit_call(exited), "traceback": []})
    value = res.result if value_of is None else shell.user_ns.pop(value_of, None)
    if value is not None:
        out["value"] = pack_value(value)
    return out


class _Exit(SystemExit):
    """What ``exit()`` / ``quit()`` raise on a rank: ``sys.exit()``'s exception, naming its caller."""

    def __init__(self, name: str, code: Any) -> None:
        super().__init__(code)
        self.called = name


class _Quitter:
    """``exit`` / ``quit`` on a rank: IPython's ask the kernel to stop, which an engine ignores, so the
    cell carried on; a script's end its process (``sys.exit``), which ends the cell here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() to end this rank's cell, as sys.exit() does"

    def __call__(self, code: Any = None) -> None:
        raise _Exit(self.name, code)


def _exits_like_sys_exit(shell: Any) -> None:
    """``exit()`` / ``quit()`` raise ``SystemExit``, unless the user's code named something else so;
    IPython's "To exit: use 'exit', 'quit', or Ctrl-D." after a ``SystemExit`` is not said on a rank."""
    import warnings

    for name in ("exit", "quit"):
        now = shell.user_ns.get(name)
        if now is None or now is getattr(shell, "exiter", None):
            shell.user_ns[name] = _Quitter(name)
    warnings.filterwarnings("ignore", message=r"To exit: use 'exit', 'quit', or Ctrl-D\.", category=UserWarning)


def exit_call(exc: SystemExit) -> str:
    """How the cell ended, as the call it made: ``sys.exit(0)``, ``sys.exit()``, ``exit('bye')``."""
    name = getattr(exc, "called", "sys.exit")
    return f"{name}({'' if exc.code is None else repr(exc.code)})"


def clean_message(text: str) -> str:
    """An error message without what differs between runs and machines.

    torch prefixes C++ errors with a source location (``[/__w/pytorch/.../pair.cc:553]``)
    and names peers by address and port (``[127.0.0.1]:24230``); a DataLoader worker's error
    carries the worker's traceback, whose files are named as pgnb's tracebacks name them.
    """
    text = re.sub(r"\[[^\]\s]*\.(?:cpp|cc|h|hpp):\d+\]\s*", "", text)
    text = re.sub(r"\[?\b\d{1,3}(?:\.\d{1,3}){3}\]?:\d+", "<peer>", text)
    return _FILE.sub(lambda m: f'File "{"Cell" if "/ipykernel_" in m[1] else short_path(m[1])}"', text)


def plain_traceback(exc: BaseException, shell: Any) -> list[str]:
    """The traceback trimmed to the user's code, the same text on every run and machine.

    Cell frames and the user's own files' (``users_file``) show their line and source; library
    frames show only where (no line numbers, no absolute paths: they differ between installs).
    IPython's own frames above the cell are dropped.
    """
    import traceback

    cells = set(getattr(getattr(shell, "compile", None), "_filename_map", {}) or {})
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename in cells), 0)
    lines = ["Traceback (most recent call last):"] if frames[first:] else []
    for f in frames[first:]:
        mine = f.filename not in cells and users_file(f.filename)
        if f.filename in cells or mine:
            lines.append(f"  {short_path(f.filename) if mine else 'Cell'}, line {f.lineno}, in {f.name}")
            if f.line:
                lines.append(f"    {f.line.strip()}")
        else:
            lines.append(f"  {short_path(f.filename)}, in {f.name}")
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    lines.append(clean_message(last))
    return lines


def short_path(filename: str) -> str:
    """A source file's path as every install shows it: from the package down, no install prefix."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if "/ipykernel_" in filename:
        return "a kernel cell"  # a function defined in the notebook and sent to the ranks
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    if filename.startswith(stdlib + "/"):
        return filename[len(stdlib) + 1:]
    return os.path.basename(filename)


def users_file(filename: str) -> bool:
    """A file of the user's own (a test file, the project under test): not an installed package's, not
    Python's, not pgnb's, not a cell's. Its frames get their line and source: the user can read them."""
    if filename.startswith("<") or "/ipykernel_" in filename or any(
            m in filename for m in ("site-packages/", "dist-packages/")) or re.search(r"/lib/python3\.\d+/", filename):
        return False  # a package, a cell, or some Python's library (another host's install too)
    import sysconfig

    paths = sysconfig.get_paths()
    owned = (paths["stdlib"], paths["platstdlib"], os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return not any(filename.startswith(p.rstrip("/") + "/") for p in owned)


def pack_value(value: Any) -> PackedValue:
    """``("pickle", bytes)`` if the value can travel safely, else ``("text", why)``.

    Tensors come back on the CPU (the kernel may have no GPU); anything that
    does not pickle, or is over ``VALUE_LIMIT``, stays on the rank.
    """
    import pickle

    try:
        data = pickle.dumps(to_cpu(value, 3), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # lambdas, open files, process groups, ...
        return ("text", f"cannot be pickled ({type(e).__name__})")
    if len(data) > VALUE_LIMIT:
        return ("text", f"too big to copy ({len(data) // 2**20} MiB)")
    return ("pickle", data)
