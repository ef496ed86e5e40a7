"""Run code on ranks and gather what each rank produced, in rank order.

``run_cell`` submits the code to every chosen rank at once (collectives need
all ranks inside the call together) and waits, without a deadline unless one
is given. It returns a ``CellResult``: per rank, stdout, stderr, rich outputs,
the last expression's value and the error, in rank order whatever order they
arrived. ``CellResult.pieces()`` is the one ordered, deterministic form that
the magic shows and ``CellResult.text()`` flattens.

Each cell runs on its engine as ``_engine.run_cell`` (an apply request), not
as an ipyparallel ``execute``: an execute that fails makes the engine abort
whatever was queued behind it, so the next cell would fail with a stale
``TaskAborted``.

When ranks are still running at the deadline (or after an interrupt), pgnb
asks each stuck engine for its Python stack: every engine registered
``faulthandler`` on SIGUSR1 into a 0600 file in a 0700 directory this module
owns, and a C signal handler answers even while the rank is blocked inside a
gloo collective (which ignores SIGINT). The stack is trimmed to the frames
that matter: the cell's own code and what it called.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shlex
import signal
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _engine
from .errors import CellTimeout, RankError, RankLost
from .rendezvous import OwnedDir
from .spec import LAUNCHER_ALIASES, WorldSpec

if TYPE_CHECKING:
    from .sandbox import Sandbox

#: Seconds interrupted ranks get to stop before pgnb calls them stuck.
INTERRUPT_GRACE = 2.0
#: Seconds to wait for a rank's faulthandler dump to be written.
STACK_WAIT = 1.0
#: Frames shown at most per stuck rank (innermost kept).
STACK_FRAMES = 12

_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_CELL_FILE = re.compile(r"(^<ipython-input-)|(/ipykernel_\d+/\d+\.py$)")
_TRACER_FILE = os.path.join("pgnb", "_tracer.py")


class CellInterrupted(KeyboardInterrupt):
    """The kernel was interrupted while ranks ran a cell; ``result`` says what each rank did.

    A ``KeyboardInterrupt``, so a script calling ``Sandbox.execute`` still stops on Ctrl-C.
    """

    def __init__(self, result: CellResult) -> None:
        super().__init__(str(result.error() or "interrupted"))
        self.result = result


@dataclass(frozen=True)
class RankValue:
    """Stands in, in ``_pg``, for a last-expression value that stayed on its rank.

    Its repr is the value's text on the rank; ``reason`` says why it was not copied.
    """

    rank: int
    text: str
    reason: str

    def __repr__(self) -> str:
        return self.text


@dataclass
class RankOutput:
    rank: int
    state: str = "finished"  # finished, failed, still running, lost
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # display_data bundles
    result: dict[str, Any] | None = None  # the mime bundle of the last expression
    value: Any = None  # the last expression's value itself (or a RankValue stand-in)
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    before_exec: bool = False  # the cell never ran (SyntaxError and friends)
    stack: list[str] = field(default_factory=list)  # where a still-running rank is blocked
    blocked_in: str = ""  # the innermost frame of that stack, e.g. "all_reduce (distributed_c10d.py)"
    stack_note: str = ""  # why there is no stack

    @property
    def value_text(self) -> str | None:
        return None if self.result is None else str(self.result.get("text/plain", ""))


@dataclass
class CellResult:
    ranks: list[RankOutput]
    world: int = 0
    recover: str = "%pg_init ... --force"
    timeout: float | None = None
    interrupted: bool = False
    trace: Any = None  # a pgnb.trace.Trace when the cell ran with --trace

    @property
    def failed(self) -> list[RankOutput]:
        return [r for r in self.ranks if r.state != "finished"]

    @property
    def values(self) -> list[Any]:
        """The last expression's value per rank, indexed by rank (None: did not run or no value)."""
        out: list[Any] = [None] * max(self.world, max((r.rank + 1 for r in self.ranks), default=0))
        for r in self.ranks:
            out[r.rank] = r.value
        return out

    def _syntax_error(self) -> RankOutput | None:
        """The one SyntaxError every rank refused the cell with, if that is what happened."""
        if not self.ranks or not all(r.before_exec and r.ename in _SYNTAX_ERRORS for r in self.ranks):
            return None
        first = self.ranks[0]
        same = all((r.ename, r.evalue, r.traceback) == (first.ename, first.evalue, first.traceback)
                   for r in self.ranks)
        return first if same else None

    def pieces(self) -> list[tuple[str, Any]]:
        """What to show, in order: ``("stdout"|"stderr", text)`` or ``("display", bundle)``.

        Grouped by rank in rank order; the same cell gives the same pieces on every run.
        """
        syntax = self._syntax_error()
        if syntax is not None:  # nothing ran anywhere: say it once
            return [("stdout", f"[{_ranks_n([r.rank for r in self.ranks])}]\n"),
                    ("stderr", _lines(syntax.traceback))]
        out: list[tuple[str, Any]] = []
        with_state = self.interrupted or any(r.state == "still running" for r in self.ranks)
        peer_lost = any(r.state == "lost" for r in self.ranks)
        for r in self.ranks:
            if not with_state and r.state == "finished" and not (
                r.stdout or r.stderr or r.outputs or r.result is not None
            ):
                continue
            state = r.state
            if self.interrupted and r.ename == "KeyboardInterrupt":
                state = "interrupted"
            out.append(("stdout", f"[rank {r.rank}]" + (f" {state}" if with_state else "") + "\n"))
            if r.stdout:
                out.append(("stdout", _ended(r.stdout)))
            if r.stderr:
                out.append(("stderr", _ended(r.stderr)))
            out.extend(("display", b) for b in r.outputs)
            if r.result is not None:
                out.append(_value_piece(r))
            echo = peer_lost and r.state == "failed" and not (self.interrupted and r.ename == "KeyboardInterrupt")
            # a survivor's error echoes the lost peer; gloo words it by timing (closed, reset, read error)
            last = f"{r.ename}: its connection to the lost peer broke (gloo's wording varies with timing)"
            if r.traceback:
                out.append(("stderr", _lines([*r.traceback[:-1], last] if echo else r.traceback)))
            elif r.state == "failed" and r.ename:
                out.append(("stderr", (last if echo else f"{r.ename}: {r.evalue}") + "\n"))
            if r.stack:
                out.append(("stderr", f"rank {r.rank} is blocked here (most recent call last):\n"
                            + _lines(r.stack)))
            elif r.state == "still running" and r.stack_note:
                out.append(("stderr", f"(no stack for rank {r.rank}: {r.stack_note})\n"))
        return _merge(out)

    def text(self) -> str:
        """Everything the ranks showed, grouped by rank: the same text every run."""
        return "".join(p if kind != "display" else _ended(str(p.get("text/plain", ""))) for kind, p in self.pieces())

    def error(self) -> RankError | None:
        """The one-line error for the failed ranks, or None."""
        bad = self.failed
        if not bad:
            return None
        running = [r for r in bad if r.state == "still running"]
        lost = [r for r in bad if r.state == "lost"]
        errors = [r for r in bad if r.state == "failed" and not (self.interrupted and r.ename == "KeyboardInterrupt")]
        stopped = [r.rank for r in bad if self.interrupted and r.ename == "KeyboardInterrupt"]
        restart = f"run `{self.recover}` to restart the engines"
        syntax = self._syntax_error()
        if syntax is not None:
            return RankError(f"{syntax.ename}: {syntax.evalue}; the cell did not run on any rank",
                             [r.rank for r in bad])
        parts = []
        if self.interrupted:
            parts.append("interrupted" + (f": {_ranks_n(stopped)} stopped" if stopped else ""))
        if errors and lost:
            # a peer died mid-collective: the survivors' gloo errors are its echo, worded by timing
            parts.append(f"{_ranks(errors)} failed ({', '.join(sorted({r.ename for r in errors}))}) "
                         "because a peer was lost")
        elif errors:
            if len({(r.ename, r.evalue) for r in errors}) == 1:
                parts.append(f"{_ranks(errors)} raised {_one_line(errors[0])}")
            else:
                parts.append("; ".join(f"rank {r.rank} raised {_one_line(r)}" for r in errors))
        if lost:
            by_cause: dict[str, list[int]] = {}
            for r in lost:  # the cause is the watcher's, e.g. "engine killed by SIGSEGV (segmentation fault)"
                cause = r.evalue if r.ename == "EngineError" and r.evalue else "engine died"
                by_cause.setdefault(cause, []).append(r.rank)
            parts.append("; ".join(f"{_ranks_n(rs)} lost ({cause})" for cause, rs in by_cause.items()))
        if running:
            why = "could not be interrupted" if self.interrupted else (
                f"still running after the {self.timeout:g} s --timeout" if self.timeout else "still running")
            where = {r.blocked_in for r in running}
            blocked = f", blocked in {where.pop()}" if len(where) == 1 and "" not in where else ""
            parts.append(f"{_ranks(running)} {why}{blocked}")
            done = [r.rank for r in self.ranks if r.state == "finished"]
            if done:
                parts.append(f"{_ranks_n(done)} finished")
        if lost or running:
            parts.append(restart)
        msg = "; ".join(parts)
        failed = [r.rank for r in bad]
        if running:
            return CellTimeout(msg, failed)
        if lost:
            return RankLost(msg, failed)
        return RankError(msg, failed)


def _one_line(r: RankOutput) -> str:
    first = next((ln.strip() for ln in r.evalue.splitlines() if ln.strip()), "")
    return f"{r.ename}: {first}" if first else r.ename


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _lines(lines: list[str]) -> str:
    return _ended("\n".join(lines))


def _value_piece(r: RankOutput) -> tuple[str, Any]:
    bundle = r.result or {}
    if set(bundle) - {"text/plain"}:  # rich value: show it as the rank's own Out[] would
        labelled = dict(bundle)
        labelled["text/plain"] = f"Out[rank {r.rank}]: {bundle.get('text/plain', '')}"
        return ("display", labelled)
    return ("stdout", f"Out[rank {r.rank}]: {r.value_text}\n")


def _merge(pieces: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Join neighbouring text pieces of the same stream (fewer messages, same text)."""
    out: list[tuple[str, Any]] = []
    for kind, p in pieces:
        if out and kind != "display" and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + p)
        else:
            out.append((kind, p))
    return out


def _ranks(rows: list[RankOutput]) -> str:
    return _ranks_n([r.rank for r in rows])


def _ranks_n(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def init_command(spec: WorldSpec, force: bool = True) -> str:
    """The ``%pg_init`` line that asks for ``spec`` again (options at their default are left out)."""
    default = WorldSpec()
    words = ["%pg_init", "--backend", spec.backend, "--world", str(spec.world)]
    if spec.init_method != default.init_method:
        words += ["--init-method", spec.init_method]
    if spec.timeout != default.timeout:
        words += ["--timeout", f"{spec.timeout:g}"]
    if spec.group_name:
        words += ["--group-name", spec.group_name]
    if spec.launcher != default.launcher:
        short = {v: k for k, v in LAUNCHER_ALIASES.items()}
        words += ["--launcher", short.get(spec.launcher, spec.launcher)]
    if spec.profile is not None:
        words += ["--profile", spec.profile]
    if spec.cluster_id is not None:
        words += ["--cluster-id", spec.cluster_id]
    if spec.threads:
        words += ["--threads", str(spec.threads)]
    if spec.debug != default.debug:
        words += ["--debug", spec.debug]
    if spec.delay_ranks:
        words += ["--delay-rank", ",".join(f"{r}:{s:g}" for r, s in spec.delay_ranks)]
    if force:
        words.append("--force")
    return " ".join(shlex.quote(w) for w in words)


# ---- per-world state: the stack-dump directory and the cells still running ----
@dataclass
class _Cells:
    stack_dir: OwnedDir
    owned_by: int = 0  # id() of the reaper told to remove stack_dir
    #: rank -> (engine id, AsyncResult) of a cell still running after a timeout or interrupt
    busy: dict[int, tuple[int, Any]] = field(default_factory=dict)


_CELLS: weakref.WeakKeyDictionary[Sandbox, _Cells] = weakref.WeakKeyDictionary()


def _cells(sb: Sandbox) -> _Cells:
    state = _CELLS.get(sb)
    if state is None:
        stack_dir = OwnedDir(prefix="pgnb-stacks-")
        weakref.finalize(sb, stack_dir.remove)
        state = _CELLS[sb] = _Cells(stack_dir)
        sb.add_listener(_forget_after_shutdown)
    reaper = getattr(sb, "_reaper", None)
    if reaper is not None and state.owned_by != id(reaper):
        # if the kernel is killed, its reaper removes the directory with the rest
        with contextlib.suppress(Exception):
            reaper.own_path(state.stack_dir.path)
        state.owned_by = id(reaper)
    return state


def _forget_after_shutdown(sb: Sandbox) -> None:
    """A world that was shut down leaves no stack files (a restart makes a new directory)."""
    if sb.snapshot().phase == "shut down":
        state = _CELLS.pop(sb, None)
        sb.remove_listener(_forget_after_shutdown)
        if state is not None:
            state.stack_dir.remove()


def check_idle(sb: Sandbox, ranks: list[int] | None) -> None:
    """Refuse at once if a chosen rank is still running an earlier cell (it would queue behind it)."""
    pairs = sb.ranks_to_engines(ranks)
    state = _CELLS.get(sb)
    if state is None or not state.busy:
        return
    current = dict(pairs)
    for r in list(state.busy):
        eid, ar = state.busy[r]
        # after `%pg_init --force` the new engines reuse the ids; the old client's task never ends
        if eid not in sb.engine_ids or ar.ready() or getattr(ar, "_client", sb.client) is not sb.client:
            del state.busy[r]
    stuck = sorted(r for r in state.busy if r in current and state.busy[r][0] == current[r])
    if stuck:
        raise CellTimeout(
            f"{_ranks_n(stuck)} still running an earlier cell (timed out or not interruptible); "
            f"run `{init_command(sb.spec)}` to restart the engines, or run the ranks it waits for",
            stuck,
        )


# ---- running a cell -------------------------------------------------------
def run_cell(sb: Sandbox, code: str, ranks: list[int] | None = None, timeout: float | None = None,
             label: int | None = None, trace: bool = False) -> CellResult:
    """Run ``code`` on the ranks at once; wait until all finish (or ``timeout``); gather in rank order.

    ``label`` is the notebook cell number tracebacks show (``Cell In[label]``).
    A ``KeyboardInterrupt`` while waiting interrupts the ranks and raises
    ``CellInterrupted`` carrying the result. ``trace``: record the ranks'
    torch.distributed calls (``pgnb.trace``) into ``result.trace``.
    """
    check_idle(sb, ranks)
    pairs = sb.ranks_to_engines(ranks)
    state = _cells(sb)
    recording = None
    if trace:
        from .trace import Recording

        recording = Recording(sb, [r for r, _ in pairs], state.stack_dir.path)
    client = sb.client
    ars: list[tuple[int, Any]] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = False
    lost: dict[int, str] = {}
    try:
        for r, e in pairs:  # an interrupt even while submitting reaches the ranks already started
            if recording is None:
                ars.append((r, client[e].apply_async(_engine.run_cell, code, label, state.stack_dir.path)))
            else:
                ars.append((r, client[e].apply_async(_engine.run_cell, code, label, state.stack_dir.path,
                                                     trace=recording.engine_args(r))))
        lost = sb.wait_ranks(ars, deadline)  # also stops soon after a rank's engine dies
    except KeyboardInterrupt:
        interrupted = True
        _interrupt(sb, [(r, ar) for r, ar in ars if not ar.ready()])
    running = [r for r, ar in ars if not ar.ready() and r not in lost]
    stacks = _dump_stacks(sb, state, running, code)
    for r in running:
        state.busy[r] = (sb.engine_ids[r], dict(ars)[r])
    rows = [_collect(r, ar, stacks.get(r)) for r, ar in ars]
    for row in rows:
        if row.rank in lost:
            row.state, row.ename, row.evalue, row.traceback = "lost", "EngineError", lost[row.rank], []
    result = CellResult(rows, world=sb.spec.world, recover=init_command(sb.spec), timeout=timeout,
                        interrupted=interrupted)
    if recording is not None:
        result.trace = recording.collect([r for r, ar in ars if not ar.ready()])
    if interrupted:
        raise CellInterrupted(result)
    return result


def _wait(ars: list[tuple[int, Any]], deadline: float | None) -> None:
    for _, ar in ars:
        while not ar.ready():
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return
            ar.wait(left)  # wakes as soon as the result is in; short slices keep Ctrl-C responsive


def _is_local(info: Any) -> bool:
    return bool(info.host == socket.gethostname())


def _interrupt(sb: Sandbox, running: list[tuple[int, Any]]) -> None:
    """SIGINT the engines of the running ranks, then give them ``INTERRUPT_GRACE`` to stop."""
    for r, _ in running:
        info = sb._ranks[r]
        try:
            if _is_local(info):
                os.kill(info.pid, signal.SIGINT)
            else:  # the engine's nanny, on its own host, passes the signal on
                sb.client.send_signal("SIGINT", targets=[info.engine_id], block=False)
        except Exception:  # the engine is gone: its task fails with EngineError and is reported as lost
            pass
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting, report now
        _wait(running, time.monotonic() + INTERRUPT_GRACE)


def _dump_stacks(sb: Sandbox, state: _Cells, ranks: list[int], code: str) -> dict[int, tuple[list[str], str, str]]:
    """Ask each stuck rank for its Python stack: ``rank -> (frames, blocked_in, note)``."""
    out: dict[int, tuple[list[str], str, str]] = {}
    asked: dict[int, tuple[str, int]] = {}
    for r in ranks:
        info = sb._ranks[r]
        path = _engine.stack_file(state.stack_dir.path, info.pid)
        if not _is_local(info):
            out[r] = ([], "", f"it runs on host {info.host}")
            continue
        if not os.path.exists(path):  # not registered: SIGUSR1 would kill the engine
            out[r] = ([], "", "the engine has no stack dumps enabled")
            continue
        size = os.path.getsize(path)
        try:
            os.kill(info.pid, signal.SIGUSR1)
        except OSError:
            out[r] = ([], "", "the engine process is gone")
            continue
        asked[r] = (path, size)
    # faulthandler writes the whole dump from its signal handler at once; wait until the file stops growing
    deadline = time.monotonic() + STACK_WAIT
    dumps: dict[int, str] = {}
    seen: dict[int, str] = {}
    while asked.keys() - dumps.keys() and time.monotonic() < deadline:
        time.sleep(0.02)
        for r, (path, size) in asked.items():
            if r not in dumps:
                text = _read_from(path, size)
                if text and text == seen.get(r):
                    dumps[r] = text
                seen[r] = text
    dumps.update({r: t for r, t in seen.items() if r not in dumps and t})
    for r in asked:
        if r in dumps:
            frames, where = trim_stack(dumps[r], code)
            out[r] = (frames, where, "" if frames else "its stack shows no cell code")
        else:
            out[r] = ([], "", "it did not answer the stack request in time")
    return out


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def trim_stack(dump: str, code: str = "") -> tuple[list[str], str]:
    """The cell's frames from a faulthandler dump, most recent call last, and where it is blocked.

    The thread running the cell is the one with IPython's ``run_code`` frame;
    the frames above it (IPython, ipykernel, ipyparallel) are dropped. Each
    frame gets its source line, from ``code`` for the cell's own frames.
    """
    threads: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"].strip()))
    for frames in threads:
        cut = next((i for i, (f, _, fn) in enumerate(frames)
                    if fn == "run_code" and f.endswith(os.path.join("IPython", "core", "interactiveshell.py"))), None)
        if not cut:
            continue
        # innermost first; pgnb's own trace wrapper (%%pg --trace) is not where the user is blocked
        mine = [f for f in frames[:cut] if not f[0].endswith(_TRACER_FILE)][:STACK_FRAMES]
        cell_file = frames[cut - 1][0]
        lines = []
        for f, ln, fn in reversed(mine):
            lines.append(_frame_text(f, ln, fn, cell_file))
            src = _source_line(f, ln, cell_file, code)
            if src:
                lines.append(f"    {src}")
        f, ln, fn = mine[0]
        if f == cell_file:
            where = f"the cell, line {ln}"
        elif _CELL_FILE.search(f):
            where = f"{fn} (an earlier cell, line {ln})"
        else:
            where = f"{fn} ({os.path.basename(f)}:{ln})"
        return lines, where
    return [], ""


def _source_line(path: str, line: int, cell_file: str, code: str) -> str:
    if path == cell_file:
        lines = code.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    import linecache

    return linecache.getline(path, line).strip()


def _frame_text(path: str, line: int, func: str, cell_file: str) -> str:
    where = "" if func == "<module>" else f", in {func}"
    if path == cell_file:
        return f"  Cell, line {line}{where}"
    if _CELL_FILE.search(path):
        return f"  Earlier cell, line {line}{where}"
    return f'  File "{_short_path(path)}", line {line}{where}'


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# ---- gathering --------------------------------------------------------------
def _collect(rank: int, ar: Any, stack: tuple[list[str], str, str] | None) -> RankOutput:
    out = RankOutput(rank)
    if not ar.ready():
        out.state = "still running"
        out.stdout, out.stderr = _streams(ar)
        if stack is not None:
            out.stack, out.blocked_in, out.stack_note = stack
        return out
    out.stdout, out.stderr = _streams(ar)  # waits for the iopub messages, which can trail the reply
    try:
        reply = ar.get(timeout=0)
    except Exception as e:  # the apply itself failed: engine died, or interrupted outside the cell
        if str(getattr(e, "ename", None) or type(e).__name__) == "EngineError":  # RemoteError wraps it
            out.state, out.ename, out.evalue = "lost", "EngineError", "engine died"
            return out
        out.state = "failed"
        out.ename = str(getattr(e, "ename", type(e).__name__))
        out.evalue = str(getattr(e, "evalue", e))
    else:
        if not reply.get("ok", False):
            out.state = "failed"
            out.ename, out.evalue = str(reply.get("ename", "")), str(reply.get("evalue", ""))
            out.traceback = list(reply.get("traceback") or [])
            out.before_exec = bool(reply.get("before_exec"))
        er = _metadata(ar, "execute_result")
        if er:
            out.result = dict(er.get("data", {}))
            out.value = _unpack_value(rank, reply.get("value"), out.value_text or "")
        out.outputs = [dict(o.get("data", {})) for o in _metadata(ar, "outputs") or []]
    return out


def _metadata(ar: Any, key: str) -> Any:
    return getattr(ar, key, None)  # a one-engine AsyncResult exposes its metadata as attributes


def _unpack_value(rank: int, packed: Any, text: str) -> Any:
    if not packed:
        return None
    kind, data = packed
    if kind == "pickle":
        try:
            return pickle.loads(data)  # noqa: S301 - our own engines made it, from the cell's value
        except Exception as e:  # e.g. a class defined only on the rank
            return RankValue(rank, text, f"cannot be unpickled in the kernel ({type(e).__name__})")
    return RankValue(rank, text, str(data))


def _streams(ar: Any) -> tuple[str, str]:
    if ar.ready():
        with contextlib.suppress(Exception):  # streams are best effort once the task is done
            ar.wait_for_output(timeout=1)
    stdout, stderr = ar.stdout, ar.stderr
    if isinstance(stdout, list):
        stdout = "".join(s or "" for s in stdout)
    if isinstance(stderr, list):
        stderr = "".join(s or "" for s in stderr)
    return stdout or "", stderr or ""


def parse_ranks(spec: str | None, world: int) -> list[int] | None:
    """``"0,2-3"`` -> ``[0, 2, 3]``; None or ``"all"`` -> None (every rank).

    Raises ``ValueError`` with a one-line reason for anything else.
    """
    if spec is None or spec.strip().lower() == "all":
        return None
    text = spec.strip()
    if not text:
        raise ValueError("--ranks is empty; use e.g. 0 or 0,2 or 1-3")
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        if not _is_number(lo_s) or (dash and not _is_number(hi_s)):
            raise ValueError(f"cannot read --ranks {spec!r}: {part!r} is not a rank or a range like 1-3")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if lo > hi:
            raise ValueError(f"--ranks range {part!r} goes backwards; write {hi}-{lo}")
        if hi >= world:
            raise ValueError(f"--ranks {spec!r} names rank {hi}, but the world has ranks 0-{world - 1}")
        chosen.extend(r for r in range(lo, hi + 1) if r not in chosen)
    return sorted(chosen)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
