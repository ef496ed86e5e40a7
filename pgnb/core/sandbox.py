"""``pgnb.Sandbox``: the facade over a world and everything built on it (no IPython).

A ``Sandbox`` is a ``World`` (start, status, run, destroy, shutdown) that also
runs notebook cells (``execute``, with ``trace=True`` for ``%%pg --trace``) and
moves values in and out of the ranks' namespaces (``push``, ``pull``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import SpecError
from ..rank import values
from .cells import DEFAULT_OPTIONS, NO_HOOKS, CellHooks, CellOptions, run_cell
from .debug import CallbackPrompter, InputFn, Prompter, post_mortem
from .live import OutputFn
from .profile_run import Profiling
from .results import CellInterrupted, CellResult
from .trace_run import Recording
from .world import World


class Sandbox(World):
    """A torch.distributed world on ipyparallel engines.

    >>> with Sandbox(backend="gloo", world=2) as sb:       # doctest: +SKIP
    ...     sb.run(lambda: __import__("torch.distributed").distributed.get_rank())
    [0, 1]

    The keywords are the options of ``pgnb.spec.WorldSpec`` (the same as ``%pg_init``'s).
    """

    def execute(self, code: str, ranks: Iterable[int] | None = None, timeout: float | None = None, *,
                trace: bool = False, profile: bool | str = False, pdb: bool = False,
                on_output: OutputFn | None = None, on_input: InputFn | None = None) -> CellResult:
        """Run a code string in each rank's namespace; a ``CellResult`` in rank order.

        A rank's error is in the result (``result.error()``), not raised; ranks still
        running at ``timeout`` are reported with their stacks. Ctrl-C interrupts the
        ranks and raises ``pgnb.CellInterrupted`` (a ``KeyboardInterrupt``).
        ``trace``: record every torch.distributed call into ``result.trace``.
        ``profile``: run torch.profiler on every rank for the cell; ``result.profile`` summarizes
        it and names the one Chrome/Perfetto trace file of all ranks (``pgnb-profiles/profile-N.json``
        for the N-th profiled cell since the kernel started, or the path given as ``profile``).
        ``on_output(rank, stream, data)`` is called as the output arrives (stream
        ``"stdout"``/``"stderr"`` with text, ``"display"`` with a mime bundle), from
        this thread, at most ten times a second in all.
        ``on_input(rank, text)`` answers a rank's ``breakpoint()``: ``text`` is what pdb
        printed, ending in its prompt ``(Pdb rank N)``; return the line to type (None
        quits the debugger). Without it a breakpoint is skipped with one line.
        ``pdb``: a rank that raises opens pdb where it raised (needs ``on_input``).
        """
        options = CellOptions(ranks=None if ranks is None else tuple(ranks), timeout=timeout,
                              trace=trace, profile=profile, pdb=pdb)
        return self.run_cell(code, options, CellHooks.calling(on_output, on_input))

    def run_cell(self, code: str, options: CellOptions = DEFAULT_OPTIONS, hooks: CellHooks = NO_HOOKS) -> CellResult:
        """``execute`` with the cell's options as one value and its hooks as one object (what ``%%pg`` calls).

        ``pgnb.core.cells.CellOptions`` also has the notebook's cell number (``label``);
        ``CellHooks`` takes any ``pgnb.core.live.LiveSink`` (which also gets every rank's
        state) and ``pgnb.core.debug.Prompter``, and what a skipped breakpoint says.
        """
        chosen = options.ranks
        recording = None
        if options.trace or options.profile:
            self.engines_for(chosen)  # refuse before measuring clocks on a busy or lost rank
        if options.trace:
            recording = Recording(self, chosen)
        profiling = None
        if options.profile:
            profiling = Profiling(self, chosen, path=options.profile if isinstance(options.profile, str) else None,
                                  offsets=None if recording is None else recording.offsets)
        try:
            result = run_cell(self, code, options, hooks, recording)
        except CellInterrupted as e:
            if profiling is not None:
                e.result.profile = profiling.finish(*_unfinished(e.result))
            raise
        if profiling is not None:
            result.profile = profiling.finish(*_unfinished(result))
        return result

    def debug(self, rank: int, on_input: Callable[[int, str], str | None] | None = None,
              prompter: Prompter | None = None) -> str:
        """pdb on ``rank`` in the frame where its last failed cell raised (post-mortem).

        The frames are kept on the rank until its next cell. Returns ``""`` when a
        debugger ran, else one line saying why not (no failed cell to look at).
        """
        if on_input is not None:
            prompter = CallbackPrompter(on_input)
        if prompter is None:
            raise SpecError("Sandbox.debug needs on_input= (or a prompter) to answer pdb's prompts")
        return post_mortem(self, rank, prompter)

    def push(self, values_: dict[str, Any] | None = None, /, *, ranks: Iterable[int] | None = None,
             timeout: float | None = None, **named: Any) -> None:
        """Copy values into every rank's namespace (or ``ranks``): ``sb.push(lr=0.1, data=t)``.

        A dict works too, for names that clash with the keywords: ``sb.push({"ranks": r})``.
        """
        ns = {**(values_ or {}), **named}
        bad = [k for k in ns if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise SpecError(f"cannot push {bad[0]!r}: a name on the ranks must be a Python identifier")
        self.run(values.push_values, ns, ranks=None if ranks is None else list(ranks), timeout=timeout)

    def pull(self, name: str, ranks: Iterable[int] | None = None, timeout: float | None = None) -> list[Any]:
        """The value of ``name`` on every rank (or ``ranks``), in rank order; tensors arrive on the CPU."""
        if not (isinstance(name, str) and name.isidentifier()):
            raise SpecError(f"cannot pull {name!r}: give the plain name of a variable on the ranks")
        return self.run(values.pull_value, name, ranks=None if ranks is None else list(ranks), timeout=timeout)


def _unfinished(result: CellResult) -> tuple[list[int], list[int]]:
    """The ranks still running the cell, and the ranks lost: neither can stop its profiler now."""
    return ([r.rank for r in result.ranks if r.state == "still running"],
            [r.rank for r in result.ranks if r.state == "lost"])
