"""What the kernel and the ranks say to each other, typed (standard library only).

The kernel side (``pgnb.core``) sends these to the engines and reads them
back; the rank side (``pgnb.rank``) builds and answers them. Both import this
module and nothing of each other, so a message has one definition.

Rank states and world phases are ``Literal`` types: a state is one of these
strings and nothing else, and a checker sees a typo.
"""

from __future__ import annotations

import os
from typing import Any, Literal, TypedDict, get_args

#: A rank as the status view shows it: ``starting`` -> ``pending`` (rendezvous) -> ``initialized``;
#: or ``failed`` (with the error), ``destroyed``, ``lost`` (its engine died).
RankState = Literal["starting", "pending", "initialized", "failed", "destroyed", "lost"]
RANK_STATES: tuple[RankState, ...] = get_args(RankState)

#: Where a world is in its life, in order; ``failed`` can follow any step before ``initialized``.
WorldPhase = Literal[
    "new", "starting engines", "importing torch", "rendezvous", "initialized", "failed", "destroyed", "shut down"
]
WORLD_PHASES: tuple[WorldPhase, ...] = get_args(WorldPhase)

#: What one rank did with one ``%%pg`` cell.
CellState = Literal["finished", "failed", "still running", "lost"]


class EngineFacts(TypedDict):
    """``pgnb.rank.engine.describe``: who and where an engine is (asked before torch is imported)."""

    pid: int
    ppid: int
    host: str
    addr: str  # this engine's address on the route to the controller
    iface: str | None  # the network interface of that address
    launcher_rank: int | None  # MPI COMM_WORLD rank or SLURM_PROCID, when a launcher numbered the process
    nanny_pid: int | None


class _InitPlanBase(TypedDict):
    backend: str
    init_method: str
    timeout: float
    group_name: str
    threads: int  # torch intra-op threads
    env: dict[str, str]  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ... set before init
    cuda: bool
    local_rank: int
    delay: float  # seconds this rank waits before joining (lessons: a late rank)
    master_addr: str
    world_size: int


class InitPlan(_InitPlanBase, total=False):
    """``pgnb.rank.engine.init_rank``: everything one rank needs to join the world."""

    rank: int  # passed to init_process_group (absent: env:// reads RANK from ``env``)
    rank_from_env: int  # the rank env:// will read, for the record


class _RankReportBase(TypedDict):
    pid: int
    host: str
    initialized: bool


class RankReport(_RankReportBase, total=False):
    """``pgnb.rank.engine.rank_status``: what torch itself says about the rank's default group."""

    rank: int
    world_size: int
    backend: str  # dist.get_backend()
    backend_config: str  # dist.get_backend_config(): "cpu:gloo,cuda:nccl" where get_backend() says "undefined"
    device: str
    init_seconds: float | None


#: A cell's last value as it travels: ``("pickle", bytes)``, or ``("text", why it stayed on the rank)``.
PackedValue = tuple[Literal["pickle", "text"], Any]


class _CellReplyBase(TypedDict):
    ok: bool
    before_exec: bool  # the cell never ran (a SyntaxError and friends)


class CellError(TypedDict, total=False):
    """The error part of a ``CellReply`` (absent when the cell succeeded)."""

    ename: str
    evalue: str
    traceback: list[str]  # trimmed to the cell: the same text on every run and machine


class CellReply(_CellReplyBase, CellError, total=False):
    """``pgnb.rank.cell.run_cell``: how a ``%%pg`` cell ended on one rank (output travels on iopub)."""

    value: PackedValue


class TraceArgs(TypedDict):
    """``run_cell(trace=...)``: where a traced cell's rank writes its records."""

    trace_dir: str | None
    name: str
    meta: dict[str, Any]


class TraceRecord(TypedDict, total=False):
    """One line of a rank's trace file (JSON). Keys are short: a rank writes two per call.

    ``e`` says which record it is: ``"h"`` header (``pid``, ``t``, ``rank``), ``"b"`` a call
    began, ``"e"`` it returned, ``"d"`` its async work completed. Times are the rank's
    ``pgnb.rank.trace.clock()``.
    """

    e: Literal["h", "b", "e", "d"]
    i: int  # the call's number on this rank (1-based)
    t: Any  # "h": the rank's clock at the start; "b": the tensors, [[dtype, shape, bytes], ...]
    pid: int
    rank: int
    op: str  # the torch.distributed function
    kind: Literal["coll", "p2p"]
    g: list[int]  # the group's global ranks
    w: bool  # the group is the default (world) group
    a: dict[str, Any]  # the roles every rank must agree on: op, src, dst, ...
    dir: Literal["send", "recv"]
    peer: int | None
    batch: list[Any]  # batch_isend_irecv: [[direction, peer, tensors], ...]
    uneven: bool  # shapes may differ across ranks (all_to_all with splits)
    note: str
    via: str  # the library call that issued it (``fully_shard unshard of 0``), when the stack tells
    t0: float  # began
    t1: float  # returned
    t2: float  # async work completed
    err: str  # what it raised


class DebugArgs(TypedDict, total=False):
    """``run_cell(debug=...)`` / ``post_mortem``: where a rank's pdb reaches the kernel, or why it cannot."""

    path: str | None  # the kernel's Unix socket for this cell (None: nothing can answer)
    why: str  # when path is None: why a breakpoint is skipped, one line
    post_mortem: bool  # %%pg --pdb: a rank that raises opens pdb where it raised
    panel: PanelArgs  # JupyterLab's Debugger panel is on: the cell runs under pydevd (``pgnb.rank.dap``)


class PanelArgs(TypedDict):
    """A cell run while the kernel's visual debugger is on: where the rank's pydevd connects, and the
    file name and line offset that make the cell's lines the ones JupyterLab shows (``pgnb.debugger``)."""

    host: str  # the kernel's host name: a rank elsewhere cannot reach its loopback
    port: int  # the kernel's DAP listener on 127.0.0.1
    cell_file: str  # the path ``dumpCell`` gives the cell's full text (the ``%%pg`` line included)
    line_offset: int  # lines of the cell above its body (the ``%%pg`` line)
    token: str  # what the rank's pydevd answers ``pydevdAuthorize`` with: proof it is the rank, not some local process


class DTensorFacts(TypedDict):
    """Where a DTensor's local shard sits: the mesh, the placements, the global shape."""

    shape: list[int]  # the global shape (the summary's own ``shape`` is the local shard's)
    mesh: Any  # the mesh's global ranks, nested like the mesh (``[0, 1]``, ``[[0, 1], [2, 3]]``)
    dims: list[str] | None  # the mesh's dimension names
    placements: list[str]  # ``Shard(0)``, ``Replicate()``, ``Partial(sum)``, one per mesh dimension
    offset: list[int] | None  # where the local shard starts in the global tensor (None: unknown)


class ParamSummary(TypedDict):
    """One parameter of a module on one rank: its global shape and the shard this rank holds."""

    name: str
    dtype: str
    shape: list[int]  # global
    local: list[int]  # this rank's shard (the same as ``shape`` for a plain tensor)
    placements: list[str] | None  # None: a plain tensor, not a DTensor
    mesh: Any  # as in DTensorFacts (None for a plain tensor)


class _ValueSummaryBase(TypedDict):
    kind: Literal["tensor", "scalar", "text", "module", "missing"]


class ValueSummary(_ValueSummaryBase, total=False):
    """``pgnb.rank.values.fetch``: what ``%pg_show`` needs of one rank's value, never the whole value."""

    dtype: str
    shape: list[int]
    numel: int
    head: list[Any]  # the first elements, flattened
    device: str
    type: str
    value: Any
    cut: bool  # text shortened
    dtensor: DTensorFacts  # a DTensor: dtype/shape/numel/head above describe the local shard
    params: list[ParamSummary]  # a module: its first parameters
    more: int  # a module: parameters left out


class ProfileArgs(TypedDict, total=False):
    """``pgnb.rank.profile.start``: how to profile a ``%%pg --profile`` cell."""

    memory: bool  # record allocations (peak memory); default True


class ProfileSummary(TypedDict, total=False):
    """``pgnb.rank.profile.stop``: one rank's profile of a cell (times in microseconds)."""

    ok: bool
    why: str  # when not ok
    counts: dict[str, int]  # op name -> calls
    top: list[list[Any]]  # [[op, calls, self time], ...], most self time first
    comm_us: float  # in the backend's collectives (gloo:, nccl: spans)
    collectives: int  # how many such spans
    compute_us: float  # self time of every other op
    peak_bytes: int  # the most memory the profiler saw allocated
    marker_ts: float | None  # the start marker's time in the Chrome trace (its own clock)
    marker_clock: float  # the same moment on ``pgnb.rank.trace.clock()``
    pid: int
    path: str  # where the rank wrote its Chrome trace (the kernel's directory)
    trace: dict[str, Any]  # the Chrome trace itself, for a rank on another host


class TorchTestRun(TypedDict):
    """``pgnb.rank.torch_suites.run_torch_test``: one test of a torch ``MultiProcessTestCase`` class, on one rank.

    What a process torch spawns would have had: the test's class (found by module and
    qualified name, the module imported as pytest imported it), its arguments to
    ``_run``, and the parent's environment, working directory and import path.
    """

    module: str  # the class's module name
    path: str  # that module's file
    qualname: str  # the class's qualified name in it
    test_name: str
    file_name: str  # the parent's self.file_name (torch's FileStore rendezvous file)
    kwargs: dict[str, Any]  # the keywords torch passes to _run (fake_pg)
    env: dict[str, str]  # the parent's os.environ when it started the ranks
    cwd: str
    sys_path: list[str]


class TorchTestOutcome(TypedDict):
    """How one rank's run of a torch test ended: what torch's parent reads from a process it spawned."""

    rank: int
    exit_code: int  # 0, a TEST_SKIPS code, MultiProcessTestCase.TEST_ERROR_EXIT_CODE, 1 (uncaught), ...
    error: str  # what the test sent its parent pipe (the traceback torch reports), or an uncaught traceback
    ended: float  # time.time() when the test ended on this rank (who failed first)
    seconds: float  # how long the test ran on this rank
    fd_output: str  # what was written to fd 1/2 meanwhile (torch's C++ and logging output)
    clean: bool  # every process group the test left was destroyed: the rank can run the next test


class TorchClassRun(TypedDict):
    """``pgnb.rank.torch_continuous.set_up``: a torch ``MultiProcContinuousTest`` class on one rank.

    What torch's ``_worker_loop`` process would have had: the class (found as for a
    ``TorchTestRun``), the world size and rendezvous file it inits its group with,
    and the parent's environment, working directory and import path.
    """

    module: str
    path: str
    qualname: str
    world_size: int
    rdvz_file: str  # the class's FileStore file (a fresh one for every init of the class's group)
    env: dict[str, str]
    cwd: str
    sys_path: list[str]


def stack_file(stack_dir: str, pid: int) -> str:
    """Where the engine with ``pid`` writes its stack dumps (one 0600 file per engine)."""
    return os.path.join(stack_dir, f"stacks-{pid}.txt")


def stack_socket(stack_dir: str, pid: int) -> str:
    """Where the engine with ``pid`` takes stack requests (a Unix datagram socket, 0600)."""
    return os.path.join(stack_dir, f"stacks-{pid}.sock")


#: How one rank ran one test of the pytest plugin (``pgnb.rank.testing.run_test``).
TestOutcome = Literal["passed", "failed", "skipped", "xfailed", "blocked", "timeout", "unimportable"]


class TestCall(TypedDict):
    """``pgnb.rank.testing.run_test``: one test function to run on every rank, and how."""

    test_id: str  # unique in the session: names the store key a failing rank sets for the others
    nodeid: str
    module: str  # the test module's name as pytest imported it
    path: str  # its file
    base: str  # the directory its name is relative to (put on sys.path to import it)
    qualname: str  # ``test_x`` or ``TestClass.test_x``
    kwargs: bytes  # the pickled fixture and parameter values made in the pytest process (unpickled after the
    # module is imported on the rank: a value may be of a class the test module defines)
    on_rank: list[str]  # the parameters filled in on the rank: rank, world_size, device
    seed: int  # every rank's RNGs are seeded with it before the test
    timeout: float | None  # the rank stops waiting for its test after this (None: the kernel's deadline only)
    cwd: str  # the directory every test starts in (the pytest process's)
    rootdir: str  # tracebacks show paths relative to it
    pdb: bool  # pytest --pdb: a rank whose test raises opens pdb where it raised


class _TestReplyBase(TypedDict):
    rank: int
    outcome: TestOutcome
    seconds: float


class TestReply(_TestReplyBase, total=False):
    """What one rank did with a ``TestCall``."""

    ename: str
    evalue: str
    traceback: list[str]  # the test's frames (the runner's dropped), as Python prints them
    failed_at: float  # time.time() when it raised: ranks are reported in this order
    reason: str  # skipped / xfailed
    stack: list[str]  # blocked / timeout: where the test's thread waits
    blocked_by: int  # blocked: the rank whose failure this one saw
    stdout: str
    stderr: str
    fd_output: str  # what was written to fd 1/2 (C++ logs, a C extension's printf)
    leaks: list[str]  # what the test left behind, one line each (already undone)
    clean: bool  # the world can run the next test (False: the test's thread is stuck, the group is gone)
    group_count: int  # torch's group counter: ranks that disagree would name their next group differently


class CoverageRun(TypedDict):
    """``pgnb.rank.coverage.start``: measure this rank as pytest-cov measures the pytest process."""

    source: list[str] | None  # ``--cov`` values (None: ``--cov`` alone, or the config's own source)
    branch: bool | None  # ``--cov-branch`` (None: as the config says)
    config_file: str | bool  # ``--cov-config`` (``.coveragerc`` also means coverage's usual files)
    data_file: str  # the pytest process's data file, absolute: each rank saves beside it, suffixed
    topdir: str  # the directory pytest-cov measures from (relative sources and config files)
    contexts: bool  # ``--cov-context=test``: lines are labelled ``<nodeid>|run`` per test
    main_thread: bool  # also the engine's own thread (``--pgnb-torch`` runs torch's tests there)


class ByName:
    """A pgnb function as an apply request carries it: its module and name, imported on the engine.

    ipyparallel sends a function as its code object, rebuilt on every call: 5.6 KB for
    ``pgnb.rank.cell.run_cell``, pickled in the kernel and unpickled on each rank, every cell.
    pgnb's own functions are installed on the engines already, so their name is enough.
    """

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return ByName, (self.module, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"
