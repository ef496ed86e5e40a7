"""``pgnb.Sandbox``: the facade over a world and everything built on it (no IPython).

A ``Sandbox`` holds a ``World`` (start, status, destroy, shutdown, the views'
snapshots) and the ``Dispatch`` over it (run), and also runs notebook cells
(``execute``, with ``trace=True`` for ``%%pg --trace``) and moves values in and
out of the ranks' namespaces (``push``, ``pull``). Its public names are the
documented ones; pgnb's own layers reach the dispatch with ``dispatch_of``.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import SpecError
from ..rank import values
from ..spec import WorldSpec, keywords_signature
from .cell_log import CellLog
from .cells import DEFAULT_OPTIONS, NO_HOOKS, CellHooks, CellOptions, run_cell
from .debug import CallbackPrompter, InputFn, Prompter, post_mortem
from .dispatch import Dispatch, Dispatcher
from .live import OutputFn
from .profile_run import Profiling
from .results import CellInterrupted, CellResult
from .snapshot import RankStatus, Snapshot
from .trace_run import Recording
from .world import STATUS_TIMEOUT, World

Listener = Callable[["Sandbox"], None]
#: Seconds a rank past its ``--timeout`` gets to reply before a re-init calls it stuck and replaces it
#: (``Busy.still_running``'s settle: a reply already on its way arrives in tens of milliseconds).
STUCK_SETTLE = 0.25
_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()


class Sandbox:
    """A torch.distributed world on ipyparallel engines.

    >>> with Sandbox(backend="gloo", world=2) as sb:       # doctest: +SKIP
    ...     sb.run(lambda: __import__("torch.distributed").distributed.get_rank())
    [0, 1]

    The keywords are the options of ``pgnb.spec.WorldSpec`` (the same as ``%pg_init``'s).
    """

    def __init__(self, *, spec: WorldSpec | None = None, **options: Any) -> None:
        self._world = World(spec=spec, **options)
        self._dispatch = Dispatcher(self._world)
        self._relays: dict[Listener, Callable[[World], None]] = {}  # a view is told of this Sandbox, not its World
        #: the cell running now and the last ones, for faces that watch from another thread (``pgnb.agent``)
        self.cells = CellLog()
        _LIVE.add(self)

    # ---- the world's lifecycle ------------------------------------------------
    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self, force: bool = False) -> Sandbox:
        """Start engines and initialise the world (a no-op if it already is); a lost or stuck rank is
        replaced in place, the others keep their ranks and namespaces."""
        return self.init(self.spec, force=force)

    def init(self, spec: WorldSpec | None = None, force: bool = False, keep: bool = False,
             replace: Iterable[int] = ()) -> Sandbox:
        """(Re-)initialise as ``spec``: same spec and healthy = no-op; ``force`` = restart engines
        (what ``%pg_init`` does; Ctrl-C raises ``pgnb.errors.Interrupted`` once the state is coherent).

        A rank lost, or stuck in earlier work (a ``--timeout`` left it in a collective), gets a new engine
        under its own number, with an empty namespace; every other rank keeps its number and namespace.
        A new size empties every rank, unless ``keep``: ranks below both sizes keep theirs.
        ``snapshot().note`` says which ranks start empty, and ``snapshot().fresh`` lists them until work is
        sent to them. ``replace``: ranks to replace in place as well, whatever state they are in (a thread
        of theirs left blocked in a collective, as the pytest plugin finds)."""
        # a lost rank is replaced anyway; stopping it again would blame its death on being stuck
        replace = [] if force else sorted({*self.stuck_ranks(), *replace} - set(self._dispatch.lost_ranks()))
        self._world.init(spec, force=force, keep=keep, replace=replace)
        return self

    def stuck_ranks(self) -> list[int]:
        """Ranks still running work pgnb sent them earlier (a cell past its ``--timeout``), after a short settle."""
        if self._world.client is None:
            return []
        # a short settle: a rank past its --timeout that is still running now is stuck, not replying
        return self._dispatch.busy.still_running(range(len(self.engine_ids)), self.engine_ids, self._world.client,
                                                 settle=STUCK_SETTLE)

    def status(self, timeout: float = STATUS_TIMEOUT) -> list[RankStatus]:
        """Ask every rank what torch says about it; rank order."""
        return self._world.status(timeout)

    def destroy(self) -> None:
        """``destroy_process_group()`` on every rank; engines stay for a fast re-init."""
        self._world.destroy()

    def shutdown(self) -> None:
        """Destroy the group, then stop the engines and controller pgnb started."""
        self._world.shutdown()

    # ---- what the world is now ----------------------------------------------
    @property
    def spec(self) -> WorldSpec:
        """The options of the world (as ``%pg_init`` took them)."""
        return self._world.spec

    @property
    def client(self) -> Any:
        """The ipyparallel ``Client`` (for ``%px`` on the same engines: ``sb.client[sb.engine_ids]``)."""
        return self._world.client

    @property
    def engine_ids(self) -> list[int]:
        """Engine id of each rank, in rank order."""
        return self._world.engine_ids

    @property
    def cluster(self) -> Any:
        """The ``ipyparallel.Cluster`` pgnb started (None when attached to one, or before start)."""
        hosting = self._world.hosting
        return hosting.pool.cluster if hosting is not None else None

    @property
    def cluster_id(self) -> str | None:
        cluster = self.cluster
        return None if cluster is None else str(cluster.cluster_id)

    @property
    def owner_token(self) -> str | None:
        """The ``PGNB_OWNER`` token every process this world launched carries (None: attached)."""
        hosting = self._world.hosting
        return hosting.reaper.token if hosting is not None and hosting.reaper is not None else None

    @property
    def reaper_pid(self) -> int | None:
        hosting = self._world.hosting
        return hosting.reaper.pid if hosting is not None and hosting.reaper is not None else None

    @property
    def store_dir(self) -> str | None:
        """The directory of pgnb's own ``file://`` store, while one exists."""
        hosting = self._world.hosting
        return hosting.store_dir if hosting is not None else None

    @property
    def scratch_dir(self) -> str:
        """This world's 0700 folder, for files that must not outlive it: removed at its shutdown, and by its
        reaper if the process that owns the world is killed."""
        return self._world.scratch_dir

    @property
    def pids(self) -> list[int]:
        """Every live process pgnb started for this world (engines, nannies, zygotes, controller, reaper)."""
        hosting = self._world.hosting
        return sorted(hosting.pids()) if hosting is not None else []

    @property
    def generation(self) -> int:
        """Which world this is: 0 before the first init, one more at every init that is not a no-op."""
        return self._world.generation

    @property
    def is_initialized(self) -> bool:
        return self._world.is_initialized

    # ---- the views ------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._world.snapshot()

    def add_listener(self, fn: Listener) -> None:
        """``fn(sandbox)`` at every change of the world (from any thread: the liveness watcher's too)."""
        relay = self._relays.setdefault(fn, lambda _world: fn(self))
        self._world.add_listener(relay)

    def remove_listener(self, fn: Listener) -> None:
        relay = self._relays.pop(fn, None)
        if relay is not None:
            self._world.remove_listener(relay)

    # ---- running code -----------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, ranks: Iterable[int] | None = None,
            timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank at once; results in rank order.

        Raises ``RankError`` naming the ranks that failed, ``RankLost`` if a rank's
        engine died, ``CellTimeout`` for ranks still running at ``timeout`` seconds.
        """
        return self._dispatch.run(fn, *args, ranks=ranks, timeout=timeout, **kwargs)

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
        with self.cells.running(code, options.ranks, options.label) as logged:
            result = self._run_cell(code, options, hooks)
            logged.done(result)
        return result

    def _run_cell(self, code: str, options: CellOptions, hooks: CellHooks) -> CellResult:
        chosen = options.ranks
        recording = None
        if options.trace or options.profile:
            self._dispatch.engines_for(chosen)  # refuse before measuring clocks on a busy or lost rank
        if options.trace:
            recording = Recording(self._dispatch, chosen)
        profiling = None
        if options.profile:
            path = options.profile if isinstance(options.profile, str) else None
            profiling = Profiling(self._dispatch, chosen, path=path,
                                  offsets=None if recording is None else recording.offsets)
        try:
            result = run_cell(self._dispatch, code, options, hooks, recording)
        except CellInterrupted as e:
            if profiling is not None:
                e.result.profile = profiling.finish(*_unfinished(e.result))
            raise
        if profiling is not None:
            result.profile = profiling.finish(*_unfinished(result))
        return result

    def debug(self, rank: int, on_input: Callable[[int, str], str | None] | Prompter) -> str:
        """pdb on ``rank`` in the frame where its last failed cell raised (post-mortem).

        ``on_input(rank, text)`` answers each of pdb's prompts (the line typed, or None to quit);
        ``%pg_debug`` passes the notebook's ``Prompter`` instead. The frames are kept on the rank
        until its next cell. Returns ``""`` when a debugger ran, else one line saying why not
        (no failed cell to look at).
        """
        prompter = CallbackPrompter(on_input) if callable(on_input) else on_input
        return post_mortem(self._dispatch, rank, prompter)

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


setattr(Sandbox.__init__, "__signature__", keywords_signature(Sandbox.__init__))  # noqa: B010 - help() shows the options


@atexit.register
def shutdown_all() -> None:
    """Shut down every Sandbox still running: at the interpreter's exit, and as soon as a kernel is asked to
    shut down (``pgnb.notebook.exit``)."""
    for sb in list(_LIVE):
        with contextlib.suppress(Exception):
            sb.shutdown()


def dispatch_of(sb: Sandbox) -> Dispatch:
    """The dispatch under ``sb`` (``pgnb.core.dispatch``), for pgnb's own layers: not public API."""
    return sb._dispatch


def _unfinished(result: CellResult) -> tuple[list[int], list[int]]:
    """The ranks still running the cell, and the ranks lost: neither can stop its profiler now."""
    return ([r.rank for r in result.ranks if r.state == "still running"],
            [r.rank for r in result.ranks if r.state == "lost"])
