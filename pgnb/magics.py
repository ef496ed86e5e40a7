"""The notebook face: parse the magic's arguments, delegate to the Sandbox, display.

Every ``PgnbError`` becomes a plain ``UsageError`` (IPython shows it as one
line and fails the cell); nothing here prints-and-continues.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .cells import CellResult, parse_ranks
from .errors import PgnbError
from .sandbox import Sandbox, current, set_current
from .spec import WorldSpec
from .view import StatusView, WorldReport

NOT_STARTED = "no process group yet: run %pg_init first (e.g. %pg_init --backend gloo --world 2)"
#: Older views stop following the world, so re-running cells does not pile up listeners.
LIVE_VIEWS = 4


@magics_class
class PgMagics(Magics):
    """``%pg_init``, ``%%pg``, ``%pg_status``, ``%pg_destroy``, ``%pg_shutdown``."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._views: deque[StatusView] = deque()

    def _show_view(self, sb: Sandbox, live: bool) -> StatusView:
        view = StatusView(sb, live=live)
        self._views.append(view)
        while len(self._views) > LIVE_VIEWS:
            self._views.popleft().detach()
        display(view)
        return view

    @staticmethod
    def _world() -> Sandbox:
        sb = current()
        if sb is None or not sb.engine_ids:
            raise UsageError(NOT_STARTED)
        return sb

    # ---- %pg_init ---------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("--backend", "-b", default="gloo",
              help="torch backend: gloo, nccl, mpi, ucc, or a device map like cpu:gloo,cuda:nccl")
    @argument("--world", "-n", default="2", help="world size = number of ranks (default 2)")
    @argument("--init-method", default="env",
              help="env, tcp, file, or a URL: env://, tcp://host:port, file:///path (default env)")
    @argument("--timeout", default="60",
              help="seconds; passed to torch and enforced by pgnb itself (default 60)")
    @argument("--group-name", default="", help="passed to init_process_group (shown in the view)")
    @argument("--launcher", default="local",
              help="ipyparallel engine launcher: local, fork, mpi, slurm, ssh, ... (default local)")
    @argument("--profile", default=None, help="attach to the ipyparallel cluster of this IPython profile")
    @argument("--cluster-id", default=None, help="attach to the ipyparallel cluster with this id")
    @argument("--threads", default=None, help="torch intra-op threads per rank (default cores // world)")
    @argument("--debug", default="off", help="TORCH_DISTRIBUTED_DEBUG on the ranks: off, info, detail")
    @argument("--delay-rank", default="", metavar="RANK:SECONDS",
              help="make a rank join the rendezvous late, e.g. 2:5 (for lessons)")
    @argument("--force", action="store_true", help="tear down whatever exists and start over")
    def pg_init(self, line: str) -> None:
        """Start or reuse engines and initialise the default process group on every rank."""
        args = parse_argstring(self.pg_init, line)
        try:
            spec = WorldSpec.validate(
                backend=args.backend, world=args.world, init_method=args.init_method, timeout=args.timeout,
                group_name=args.group_name, launcher=args.launcher, profile=args.profile,
                cluster_id=args.cluster_id, threads=args.threads, debug=args.debug,
                delay_ranks=args.delay_rank,
            )
        except PgnbError as e:
            raise UsageError(str(e)) from None
        sb = current()
        if sb is not None and not args.force and spec == sb.spec and sb.is_initialized:
            sb.status()  # the no-op still shows what the ranks say now
            self._show_view(sb, live=False)
            return
        if sb is None:
            sb = Sandbox(spec=spec)
            set_current(sb)
        self._show_view(sb, live=True)
        try:
            sb.init(spec, force=args.force)
        except PgnbError as e:
            raise UsageError(str(e)) from None
        display(WorldReport(sb.snapshot()))

    # ---- %%pg ---------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("--ranks", "-r", default=None, help="which ranks run the cell: 0 | 0,2 | 1-3 | 0,2-3 (default all)")
    @argument("--timeout", "-t", default=None,
              help="stop waiting after this many seconds and show where each rank is stuck")
    def pg(self, line: str, cell: str) -> None:
        """Run the cell on every rank (or --ranks); output grouped by rank, in rank order."""
        args = parse_argstring(self.pg, line)
        sb = self._world()
        try:
            ranks = parse_ranks(args.ranks, sb.spec.world)
            timeout = None if args.timeout is None else _positive_seconds(args.timeout)
        except ValueError as e:
            raise UsageError(str(e)) from None
        try:
            result = sb.execute(cell, ranks=ranks, timeout=timeout)
        except PgnbError as e:
            raise UsageError(str(e)) from None
        render_cell_result(result)
        self.shell.user_ns["_pg"] = [r.value_text for r in result.ranks]
        err = result.error()
        if err is not None:
            raise UsageError(str(err))

    # ---- %pg_status / %pg_destroy / %pg_shutdown ----------------------------
    @line_magic
    def pg_status(self, line: str) -> None:
        """Display a fresh status view (asks every rank)."""
        sb = self._world()
        sb.status()
        self._show_view(sb, live=False)

    @line_magic
    def pg_destroy(self, line: str) -> None:
        """destroy_process_group() on every rank; the engines stay for a fast re-init."""
        sb = self._world()
        try:
            sb.destroy()
        except PgnbError as e:
            raise UsageError(str(e)) from None
        display(WorldReport(sb.snapshot()))

    @line_magic
    def pg_shutdown(self, line: str) -> None:
        """Destroy the group, then stop the engines and the controller."""
        sb = current()
        if sb is None:
            return  # nothing to stop; shutting down twice is fine
        sb.shutdown()
        display(WorldReport(sb.snapshot()))


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--timeout must be a number of seconds, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--timeout must be a positive number of seconds, not {text!r}")
    return value


def render_cell_result(result: CellResult) -> None:
    """Each rank's output under a ``[rank N]`` heading, in rank order."""
    import sys

    for r in result.ranks:
        heading = f"[rank {r.rank}]" + ("" if r.state in ("finished", "failed") else f" {r.state}")
        if not (r.stdout or r.stderr or r.outputs or r.result is not None or r.state != "finished"):
            continue
        print(heading)
        if r.stdout:
            print(r.stdout, end="" if r.stdout.endswith("\n") else "\n")
        if r.stderr:
            sys.stdout.flush()
            print(r.stderr, end="" if r.stderr.endswith("\n") else "\n", file=sys.stderr)
            sys.stderr.flush()
        for bundle in r.outputs:
            sys.stdout.flush()
            display(bundle, raw=True)
        if r.result is not None:
            print(f"Out[rank {r.rank}]: {r.value_text}")
        if r.traceback:
            print("\n".join(r.traceback))
        sys.stdout.flush()
