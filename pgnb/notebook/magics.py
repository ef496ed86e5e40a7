"""The magics: parse the arguments, delegate to the Sandbox, display.

Every ``PgnbError`` becomes a plain ``UsageError`` (IPython shows it as one
line and fails the cell), in one place: ``pgnb.notebook.guard.guarded``;
nothing here prints-and-continues. The options of ``%pg_init`` come from
``pgnb.spec.WorldSpec``'s fields, the one table of them; ``%%pg``'s line is
read into one ``CellOptions`` and the cell runs through ``Sandbox.run_cell``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic as _ipy_cell_magic, line_magic as _ipy_line_magic, magics_class
from IPython.core.magic_arguments import (
    argument as _ipy_argument,
    magic_arguments as _ipy_magic_arguments,
    parse_argstring,
)
from IPython.display import display

from ..core.cells import NO_INPUT, CellHooks, CellOptions, Panel
from ..core.failures import kill_rank
from ..core.results import CellInterrupted, CellResult
from ..core.sandbox import Sandbox, dispatch_of
from ..core.show import gather
from ..core.terminal import TerminalSink
from ..errors import NOT_STARTED
from ..spec import WorldSpec, option_fields, parse_ranks
from .current import current, set_current
from .guard import ErrorLog, guarded
from .live import LiveView
from .profile import ProfileView
from .render import render_cell_result
from .show import ShowView
from .trace import timeline
from .view import REPLACED, SUPERSEDED, StatusView, WorldReport

_F = TypeVar("_F", bound=Callable[..., Any])


# IPython's magic decorators, typed as what they do here: each returns the method it decorates.
# (magic_arguments and argument are unannotated; line_magic's annotation also allows @line_magic("name").)
def line_magic(method: _F) -> _F:
    return cast(_F, _ipy_line_magic(method))


def cell_magic(method: _F) -> _F:
    return cast(_F, _ipy_cell_magic(method))


def magic_arguments() -> Callable[[_F], _F]:
    """IPython's ``@magic_arguments()``: it attaches the parser and returns the magic itself."""
    return cast("Callable[[_F], _F]", _ipy_magic_arguments())


def argument(*flags: str, **options: Any) -> Callable[[_F], _F]:
    """IPython's ``@argument(...)``: it records one option and returns the magic itself."""
    return cast("Callable[[_F], _F]", _ipy_argument(*flags, **options))


def _world_options(magic: _F) -> _F:
    """The ``%pg_init`` options, one argument per field of ``WorldSpec`` (help, defaults and all)."""
    for f in reversed(option_fields()):
        given = f.metadata["given"]
        magic = argument(*f.metadata["flags"], dest=f.name, metavar=f.metadata["metavar"],
                         default=None if given is None else str(given), help=f.metadata["help"])(magic)
    return magic


@magics_class
class PgMagics(Magics):
    """``%pg_init``, ``%%pg``, ``%pg_status``, ``%pg_show``, ``%pg_debug``, ``%pg_kill``, ``%pg_destroy``,
    ``%pg_shutdown``."""

    def __init__(self, shell: Any, panel: Panel | None = None) -> None:
        super().__init__(shell)
        #: JupyterLab's Debugger panel on this kernel (``pgnb.debugger``), when there is one
        self.panel = panel
        #: the newest status view: the only one that follows its world
        self._view: StatusView | None = None
        #: tracebacks of pgnb's own internal errors in these magics (``%pg_status --debug``)
        self.errors = ErrorLog()
        #: the ranks that failed in the last %%pg cell (%pg_debug's default)
        self._failed: list[int] = []
        if shell is not None:
            shell.events.register("post_run_cell", self._after_cell)

    def _after_cell(self, result: Any) -> None:
        """IPython has stored the cell's error (a one-line UsageError): an internal error goes where %debug looks."""
        self.errors.after_cell(self.shell)

    def _show_view(self, sb: Sandbox, live: bool, spec: WorldSpec | None = None) -> StatusView:
        # The view before freezes at its world's last state, as one static HTML widget (~30 widgets
        # fewer in the kernel), and says why. Its output is not rewritten: an update_display would
        # change what a saved notebook holds but not what nbval replays.
        if self._view is not None:
            self._view.freeze(REPLACED if live else SUPERSEDED)  # live: a %pg_init about to make a new world
        view = self._view = StatusView(sb, live=live, spec=spec)
        display(view)
        return view

    @staticmethod
    def _world() -> Sandbox:
        sb = current()
        if sb is None or not sb.engine_ids:
            raise UsageError(NOT_STARTED)
        return sb

    def _shell(self) -> Any:
        if self.shell is None:  # IPython's Magics allows none; load_ipython_extension always passes its shell
            raise RuntimeError("%%pg needs the shell its magics were registered on")
        return self.shell

    # ---- %pg_init ---------------------------------------------------------
    @line_magic
    @guarded("%pg_init", "starting the world")
    @magic_arguments()
    @_world_options
    @argument("--force", action="store_true", help="tear down whatever exists and start over")
    @argument("--keep", action="store_true",
              help="with a new --world: ranks below both sizes keep their namespaces, new ranks start empty "
                   "(default: every rank starts empty)")
    def pg_init(self, line: str) -> None:
        """Start or reuse engines and initialise the default process group on every rank.

        Run again with the same options after a rank was lost or got stuck: that rank gets a new
        engine under its own number (empty namespace); the others keep their ranks and namespaces."""
        args = _parse(self.pg_init, line)
        spec = WorldSpec.validate(**{f.name: getattr(args, f.name) for f in option_fields()})
        sb = current()
        if (sb is not None and not args.force and spec == sb.spec and sb.is_initialized and not sb.stuck_ranks()
                and all(r.state == "initialized" for r in sb.status())):
            self._show_view(sb, live=False)  # a no-op shows what the ranks say now
            return
        if sb is None:
            sb = Sandbox(spec=spec)
            set_current(sb)
        self._show_view(sb, live=True, spec=spec)
        sb.init(spec, force=args.force, keep=args.keep)
        display(WorldReport(sb.snapshot()))

    # ---- %%pg ---------------------------------------------------------------
    @cell_magic
    @guarded("%%pg", "running the cell on the ranks")
    @magic_arguments()
    @argument("--ranks", "-r", default=None, help="which ranks run the cell: 0 | 0,2 | 1-3 | 0,2-3 (default all)")
    @argument("--timeout", "-t", default=None,
              help="stop waiting after this many seconds; show which ranks finished and where each "
                   "rank still running is blocked (default: wait as long as the cell runs)")
    @argument("--push", "-p", default=None, metavar="NAMES",
              help="first copy these notebook variables to the ranks, e.g. --push x,lr")
    @argument("--out", "-o", default=None, metavar="NAME",
              help="also store the per-rank values of the last expression (like _pg) in this variable")
    @argument("--trace", action="store_true",
              help="record every torch.distributed call on every rank: show the calls, who waited for whom, "
                   "mismatches, and a timeline (also after --timeout); the trace is kept in _pg_trace")
    @argument("--profile", action="store_true",
              help="run torch.profiler on every rank for the cell: a per-rank summary, and one Chrome/Perfetto "
                   "trace file of all ranks on one clock (pgnb-profiles/profile-N.json for the N-th profiled cell); "
                   "kept in _pg_profile")
    @argument("--pdb", action="store_true",
              help="a rank that raises opens pdb where it raised, in the notebook (like %%pdb on)")
    def pg(self, line: str, cell: str) -> None:
        """Run the cell on every rank (or --ranks) at once; output grouped by rank, in rank order.

        Each rank runs the cell in its own namespace, where torch, dist, rank,
        world_size and device are already defined. Output appears when the
        ranks finish: each rank's stdout, stderr, displays and last value
        (Out[rank N]) under a [rank N] heading; a rank that fails shows its
        traceback and the cell fails.

        Afterwards ``_pg`` holds the value of the cell's last expression on
        each rank: a list indexed by rank, None for ranks that did not run or
        had no value. Values are copied from the ranks (tensors arrive on the
        CPU); one that cannot be pickled, or is over 64 MiB, is a
        pgnb.RankValue that shows the rank's text of it.

        Without --timeout a cell runs as long as it needs; the interrupt
        button interrupts the ranks. A rank blocked in a collective that not
        every rank entered cannot be interrupted: pgnb shows where it is
        blocked and the %pg_init ... --force line that restarts the world.
        """
        args = _parse(self.pg, line)
        sb = self._world()
        shell = self._shell()
        options, push, out = _read_cell_line(args, sb.spec.world, shell)
        result = _run_in_notebook(shell, sb, cell, options, push, out, self.panel)
        self._failed = [r.rank for r in result.ranks if r.state == "failed"]
        err = result.error()
        if err is not None:
            raise UsageError(str(err))

    # ---- %pg_show / %pg_kill ------------------------------------------------
    @line_magic
    @guarded("%pg_show", "gathering the variable from the ranks")
    @magic_arguments()
    @argument("name", help="the variable on the ranks, e.g. t")
    @argument("--ranks", "-r", default=None, help="which ranks: 0 | 0,2 | 1-3 (default all)")
    def pg_show(self, line: str) -> None:
        """Show a variable of every rank in one view: tensors as a rank × element grid
        coloured by value, scalars and strings as a column; differing shapes or dtypes are marked."""
        args = _parse(self.pg_show, line)
        sb = self._world()
        try:
            ranks = parse_ranks(args.ranks, sb.spec.world)
            values = gather(args.name, ranks=ranks, world=dispatch_of(sb))
        except ValueError as e:  # bad --ranks, a name that is no name (a busy or lost rank: guarded says it)
            raise UsageError(str(e)) from None
        display(ShowView(values))

    @line_magic
    @guarded("%pg_debug", "debugging the rank")
    @magic_arguments()
    @argument("rank", nargs="?", default=None,
              help="the rank to debug (default: the first rank that failed in the last %%pg cell)")
    def pg_debug(self, line: str) -> None:
        """pdb on a rank, in the frame where its last failed %%pg cell raised (like %debug).

        The frames are kept on the rank until its next cell; p, pp, l, w, u, d, interact work as in pdb."""
        args = _parse(self.pg_debug, line)
        sb = self._world()
        if args.rank is None:
            if not self._failed:
                raise UsageError("no rank failed in the last %%pg cell; name one: %pg_debug RANK")
            rank = self._failed[0]
        elif args.rank.isascii() and args.rank.isdigit() and int(args.rank) < sb.spec.world:
            rank = int(args.rank)
        else:
            raise UsageError(f"%pg_debug takes one rank of 0-{sb.spec.world - 1}, not {args.rank!r}")
        prompter, no_input = _prompter(self.shell)
        if prompter is None:  # as a skipped breakpoint: say so, and the notebook goes on
            print(f"%pg_debug {rank} skipped: {no_input}")
            return
        note = sb.debug(rank, prompter)
        if note:
            raise UsageError(note)

    @line_magic
    @guarded("%pg_kill", "killing the rank's engine")
    @magic_arguments()
    @argument("rank", help="the rank whose engine to kill")
    def pg_kill(self, line: str) -> None:
        """Kill a rank's engine (SIGKILL), as a crash would: for lessons in failure.

        pgnb then reports the rank lost; the same `%pg_init` replaces it in place (the others keep their state)."""
        args = _parse(self.pg_kill, line)
        sb = self._world()
        if not (args.rank.isascii() and args.rank.isdigit()):
            raise UsageError(f"%pg_kill takes one rank number, e.g. %pg_kill 1, not {args.rank!r}")
        print(kill_rank(dispatch_of(sb), int(args.rank)))

    # ---- %pg_status / %pg_destroy / %pg_shutdown ----------------------------
    @line_magic
    @guarded("%pg_status", "asking the ranks")
    @magic_arguments()
    @argument("--debug", action="store_true",
              help="also print the tracebacks of pgnb's last internal errors in this kernel (a bug report's)")
    def pg_status(self, line: str) -> None:
        """Display a fresh status view (asks every rank)."""
        args = _parse(self.pg_status, line)  # a typo is refused, not ignored
        if args.debug:
            print(self.errors.text())
            if current() is None:
                return
        sb = self._world()
        sb.status()
        self._show_view(sb, live=False)

    @line_magic
    @guarded("%pg_destroy", "destroying the process group")
    @magic_arguments()
    def pg_destroy(self, line: str) -> None:
        """destroy_process_group() on every rank; the engines stay for a fast re-init."""
        _parse(self.pg_destroy, line)
        sb = self._world()
        sb.destroy()
        display(WorldReport(sb.snapshot()))

    @line_magic
    @guarded("%pg_shutdown", "stopping the engines and the controller")
    @magic_arguments()
    def pg_shutdown(self, line: str) -> None:
        """Destroy the group, then stop the engines and the controller."""
        _parse(self.pg_shutdown, line)
        sb = current()
        if sb is None:
            return  # nothing to stop; shutting down twice is fine
        sb.shutdown()
        display(WorldReport(sb.snapshot()))


def _read_cell_line(args: Any, world: int, shell: Any) -> tuple[CellOptions, dict[str, Any], str | None]:
    """``%%pg``'s parsed line: the cell's options, the notebook values to push first, the name for ``--out``."""
    try:
        ranks = parse_ranks(args.ranks, world)
        timeout = None if args.timeout is None else _positive_seconds(args.timeout)
        push = _names("--push", args.push)
        out = _names("--out", args.out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if len(out) > 1:
        raise UsageError(f"--out takes one variable name, not {args.out!r}")
    missing = [n for n in push if n not in shell.user_ns]
    if missing:
        raise UsageError(f"--push {missing[0]}: no variable {missing[0]!r} in the notebook; define it first")
    options = CellOptions(ranks=None if ranks is None else tuple(ranks), timeout=timeout,
                          label=shell.execution_count, trace=args.trace, profile=args.profile, pdb=args.pdb)
    return options, {n: shell.user_ns[n] for n in push}, out[0] if out else None


def _run_in_notebook(shell: Any, sb: Sandbox, cell: str, options: CellOptions, push: dict[str, Any],
                     out: str | None, panel: Panel | None = None) -> CellResult:
    """Run a ``%%pg`` cell: live while it runs, then its grouped output, its trace and profile, ``_pg``."""
    ranks = None if options.ranks is None else list(options.ranks)
    view: LiveView | None = None
    sink: LiveView | TerminalSink | None = None
    result: CellResult | None = None
    try:
        if push:
            sb.push(push, ranks=ranks)
        if getattr(shell, "kernel", None) is not None:  # a notebook: a live view, drawn once there is something to see
            view = sink = LiveView(list(range(sb.spec.world)) if ranks is None else ranks)
        elif _is_terminal(shell):
            sink = TerminalSink()
        prompter, no_input = _prompter(shell)
        result = sb.run_cell(cell, options, CellHooks(output=sink, prompter=prompter, no_input=no_input or NO_INPUT,
                                                      panel=panel))
    except CellInterrupted as e:
        result = e.result
    finally:
        if view is not None:
            view.finish(result)
        if isinstance(sink, TerminalSink):
            sink.close()
    render_cell_result(result, streamed=isinstance(sink, TerminalSink))
    if result.trace is not None:
        shell.user_ns["_pg_trace"] = result.trace
        display(result.trace)
        display(timeline(result.trace))
    if result.profile is not None:
        shell.user_ns["_pg_profile"] = result.profile
        display(ProfileView(result.profile))
    values = result.values
    shell.user_ns["_pg"] = values
    if out is not None:
        shell.user_ns[out] = values
    return result


class _Prompter:
    """A rank's pdb, answered through this shell's own input(): a notebook's stdin request, a terminal's prompt."""

    def show(self, rank: int, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def ask(self, rank: int, text: str, prompt: str) -> str | None:
        self.show(rank, text)
        return input(prompt)


def _prompter(shell: Any) -> tuple[_Prompter | None, str]:
    """Who answers a breakpoint on a rank here, or why nothing can (said in the one line a skipped one prints)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:
        if getattr(kernel, "_allow_stdin", False):
            return _Prompter(), ""
        return None, "this frontend takes no input (nbval, jupyter execute, allow_stdin=False)"
    if _is_terminal(shell):
        return _Prompter(), ""
    return None, "this IPython shell takes no input"


def _is_terminal(shell: Any) -> bool:
    """A terminal IPython (lines can appear as they come); not a kernel, nor a bare shell as in tests."""
    return type(shell).__name__ == "TerminalInteractiveShell"


def _parse(magic: Any, line: str) -> Any:
    """``parse_argstring``, with a line that cannot be split (an open quote) a one-line UsageError too."""
    try:
        return parse_argstring(magic, line)
    except ValueError as e:  # shlex: "No closing quotation"; argparse errors are UsageErrors already
        raise UsageError(f"cannot read the options {line.strip()!r}: {e}") from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--timeout must be a number of seconds, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--timeout must be a positive number of seconds, not {text!r}")
    return value


def _names(option: str, text: str | None) -> list[str]:
    """``"x, y"`` -> ``["x", "y"]``; each must be a plain Python name."""
    if text is None:
        return []
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if not n.isidentifier():
            raise ValueError(f"{option} {text!r}: {n!r} is not a variable name; use e.g. {option} x,y")
    return names
