"""The teaching notebooks are regression tests: strict nbval, each from a fresh kernel.

Each notebook in ``notebooks/`` is replayed by ``pytest --nbval`` (strict: every
stored ``text/plain`` and stream must come back the same) with the sanitizer
pgnb ships, in a subprocess, as a user would run it (two notebooks at a time, see
``JOBS``). ``make test`` replays each notebook once, and twice in a row those of
``TIMING_DEPENDENT`` and ``NEW_LESSONS``; ``make soak`` (``--run-slow``) replays every notebook twice.
Byte-identical output across runs is asserted where it is made (test_cells, test_live,
test_recorded_outputs, test_pg_kernel); the second replay is for what only a whole
notebook shows. A deliberately broken copy must fail, so this suite cannot pass
silently.

With ``PGNB_USER_PYTHON`` set (``make test`` sets it), the replays run in the user-install
venv (``pip install .`` alone, plus nbval and pytest; see tests/test_user_install.py): nbval,
its kernel and the ranks all run that python and import pgnb from its site-packages, so
this suite is also the check that a plain install serves every notebook. Without it they
run in this python. nbval ends every kernel with SIGKILL; the last test checks that no
process pgnb started during these runs is still alive (pgnb's reaper must
have cleaned up; this test only looks, it never kills).

Refresh the stored outputs after changing a notebook (or pgnb's output) with

    IPYTHONDIR=$(mktemp -d) .venv/bin/python tests/test_notebooks.py --refresh [01_init_process_group ...]

which executes each notebook top to bottom with nbclient and saves it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from test_user_install import kernel_manager, user_env, user_python

from pgnb.procs.processes import OWNER_ENV, proc_stat, process_running

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
#: Notebooks replayed twice in ``make test`` too: what they record depends on timing, so one replay
#: that passes says less. 06 diagnoses a hang at ``--timeout`` (which frames the ranks are seen in) and
#: a killed rank (when the liveness watcher notices it, against when the next cell asks); 08 streams a
#: training loop's progress live while the ranks print (what reaches the kept output, and in which
#: order, must not depend on when the live view samples).
TIMING_DEPENDENT = {"06_failures", "08_watching_training"}
#: Replayed twice in ``make test`` too: the newest lessons of the course, until their output has been seen
#: stable over many runs (a second replay from a fresh kernel shows what one replay cannot).
NEW_LESSONS = {"17_zero_stage_by_stage", "18_context_parallelism", "19_expert_parallelism", "20_dimensions_composed",
               "21_testing_distributed_code", "22_debugger_panel"}
#: Notebooks replayed at the same time. Each one mostly waits (rendezvous, timeouts, the kernel's
#: round trips), so two at once roughly halve the wall time on 2 cores; each notebook's own runs
#: still go one after the other, each from a fresh kernel. PGNB_NOTEBOOK_JOBS=1 replays them one by one.
JOBS = max(1, int(os.environ.get("PGNB_NOTEBOOK_JOBS", "2")))
#: Seconds one notebook may take under nbval (each is meant to run in well under 2 minutes).
NOTEBOOK_TIMEOUT = 240
CELL_TIMEOUT = 120
#: Every process started from these nbval runs inherits this variable, so the leak check
#: below finds exactly this session's processes, whatever other pgnb users run meanwhile.
RUN_VAR = "PGNB_NOTEBOOK_TEST_RUN"
RUN_ID = uuid.uuid4().hex
OWNER_VAR = OWNER_ENV  # pgnb sets it on every process it launches
#: pgnb's reaper kills an owner's processes within 10 s of the owner's death.
REAP_GRACE = 20.0

MAGIC = re.compile(r"^\s*%%?pg", re.M)


def sanitizer() -> Path:
    """The sanitizer file pgnb ships, found the way users find it."""
    from importlib.resources import files

    return Path(str(files("pgnb") / "nbval_sanitize.cfg"))


@functools.cache
def replay_python() -> tuple[str, Path, dict[str, str]]:
    """The python that replays the notebooks, the sanitizer its pgnb ships, and the environment to run it in."""
    python = user_python()
    if python is None:
        return sys.executable, sanitizer(), dict(os.environ)
    env = user_env()
    # asked of the installed pgnb (cwd: not the repository root), so a wheel without it fails here
    shown = subprocess.run([python, "-m", "pgnb", "nbval-sanitize"], cwd=NOTEBOOK_DIR, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    return python, Path(shown), env


def sanitize_patterns() -> list[tuple[str, str]]:
    from nbval.plugin import get_sanitize_patterns

    return get_sanitize_patterns(sanitizer().read_text())


def _read(path: Path):
    import nbformat

    return nbformat.read(str(path), as_version=4)


def _outputs_text(cell) -> list[str]:
    """What nbval compares of a cell: streams and every non-image mime string."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append(o["text"])
        elif o["output_type"] in ("display_data", "execute_result"):
            out.extend(v for k, v in o["data"].items() if isinstance(v, str) and not k.startswith("image/"))
    return out


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def processes_of(run_id: str | None = None) -> dict[int, tuple[str, bool]]:
    """Live processes from nbval run ``run_id`` (or, if None, every process carrying PGNB_OWNER).

    pid -> (cmdline, whether it carries PGNB_OWNER). This process and its ancestors are left out.
    """
    mine = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            fields = proc_stat(pid)
            if fields is None:
                break
            pid = int(fields[1])
        except (OSError, IndexError, ValueError):
            break
        mine.add(pid)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if env is None or not process_running(pid):
            continue
        if (env.get(RUN_VAR) == run_id) if run_id is not None else (OWNER_VAR in env):
            found[pid] = (_cmdline(pid), OWNER_VAR in env)
    return found


#: What a kernel prints when a port jupyter_client chose for it was taken before the kernel bound it:
#: jupyter_client picks free ports by binding and closing them, and a kernel binds them a second later,
#: while two replays' worlds open connections; the kernel dies before nbval's first cell.
PORT_TAKEN = "Address already in use"
KERNEL_DIED = "Kernel died before replying to kernel_info"


def run_nbval(paths: list[Path], workdir: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """``pytest --nbval`` on ``paths`` in a subprocess, with a fresh IPython and Jupyter runtime dir.

    It runs ``replay_python()``, in the notebook's directory (``replay_kernel``). The kernel's own
    stderr, which nbval throws away, is kept and added to the returned ``stderr``. A replay whose kernel
    died before the first cell because a port was taken from it (jupyter_client's, not pgnb's) is
    replayed once more from a fresh kernel; ``stdout`` then starts with a line that says so.
    """
    proc, seconds, kernel_log = _nbval(paths, workdir)
    if proc.returncode != 0 and KERNEL_DIED in proc.stdout and PORT_TAKEN in kernel_log:
        first = kernel_log.strip().splitlines()[-1]
        proc, seconds, kernel_log = _nbval(paths, workdir)
        proc.stdout = f"replayed again: the first replay's kernel could not bind its port ({first})\n" + proc.stdout
    if kernel_log.strip():
        proc.stderr += f"\n--- the kernel's stderr ---\n{kernel_log[-3000:]}"
    return proc, seconds


def _nbval(paths: list[Path], workdir: Path) -> tuple[subprocess.CompletedProcess[str], float, str]:
    python, sanitize, base_env = replay_python()
    ipython_dir = Path(tempfile.mkdtemp(prefix="ipython-", dir=workdir))
    runtime_dir = Path(tempfile.mkdtemp(prefix="jupyter-runtime-", dir=workdir))
    kernels = Path(tempfile.mkdtemp(prefix="jupyter-path-", dir=workdir))
    kernel_log = replay_kernel(kernels, python)
    env = dict(base_env, IPYTHONDIR=str(ipython_dir), JUPYTER_RUNTIME_DIR=str(runtime_dir),
               JUPYTER_PATH=str(kernels), **{RUN_VAR: RUN_ID})
    cmd = [
        python, "-m", "pytest",
        "-c", os.devnull, "--rootdir", str(paths[0].parent), "-p", "no:cacheprovider",
        "--nbval", "--nbval-kernel-name", REPLAY_KERNEL, "--nbval-sanitize-with", str(sanitize),
        "--nbval-cell-timeout", str(CELL_TIMEOUT), "-q", "-rf",
        # a cell failing on purpose carries both the comment and the tag (for Run All); nbval notes the overlap
        "-W", "ignore:Overlapping options from comments and metadata:UserWarning",
        *map(str, paths),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=paths[0].parent, env=env, capture_output=True, text=True,
                          timeout=NOTEBOOK_TIMEOUT)
    seconds = time.monotonic() - t0
    return proc, seconds, kernel_log.read_text(errors="replace") if kernel_log.exists() else ""


REPLAY_KERNEL = "pgnb-replay"


def replay_kernel(root: Path, python: str) -> Path:
    """A kernelspec ``REPLAY_KERNEL`` under ``root`` (a ``JUPYTER_PATH``): ``python``'s ipykernel, as
    ``--nbval-current-env`` starts it, but with its stderr appended to a file (the path returned), not
    thrown away. ``exec``: the kernel is the process nbval signals and SIGKILLs."""
    log = root / "kernel-stderr.log"
    spec = root / "kernels" / REPLAY_KERNEL
    spec.mkdir(parents=True)
    argv = ["/bin/sh", "-c", 'exec "$0" -m ipykernel_launcher -f "$1" 2>>"$2"', python, "{connection_file}", str(log)]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "pgnb replay", "language": "python"}))
    return log


# ---- the notebooks themselves (no kernel) -------------------------------------------


LESSONS = ("01_init_process_group", "02_collectives", "03_point_to_point", "04_groups", "05_ddp", "06_failures",
           "07_seeing_collectives", "08_watching_training", "09_data_parallel_by_hand", "10_communication_cost",
           "11_device_mesh_dtensor", "12_fsdp2", "13_tensor_parallel", "14_pipeline_parallel", "15_your_trainer",
           "16_fault_tolerance", *sorted(NEW_LESSONS))


def test_the_course_is_complete():
    """Every lesson is there (any later notebook is tested the same way)."""
    assert set(LESSONS) <= {p.stem for p in NOTEBOOKS}, NOTEBOOKS


def test_sanitizer_ships_with_pgnb_and_parses():
    path = sanitizer()
    assert path.is_file()
    shown = subprocess.run([sys.executable, "-m", "pgnb", "nbval-sanitize"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert Path(shown).read_text() == path.read_text()  # a copy outside the checkout (tests/test_sanitizer_anywhere.py)
    patterns = sanitize_patterns()
    assert patterns, "nbval found no regex/replace pairs in the sanitizer"
    for regex, _ in patterns:
        re.compile(regex)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_notebook_is_a_fair_test(path):
    """Fully executed in order, ends with %pg_shutdown, and nothing pgnb shows is hidden from nbval."""
    nb = _read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "refresh the stored outputs"
    assert code[-1].source.strip() == "%pg_shutdown"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    patterns = sanitize_patterns()
    for cell in code:
        markers = {m for m in ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "NBVAL_CHECK_OUTPUT") if m in cell.source}
        if MAGIC.search(cell.source):
            assert not markers, f"a pgnb magic must not need {markers}:\n{cell.source}"
        raises = "NBVAL_RAISES_EXCEPTION" in cell.source
        # the tag lets nbclient and JupyterLab's "Run All" go past a cell that fails on purpose
        assert raises == ("raises-exception" in cell.metadata.get("tags", [])), cell.source
        for text in _outputs_text(cell):
            for regex, _ in patterns:
                assert not re.search(regex, text), f"sanitizer pattern {regex!r} would hide {text!r}"


# ---- replay under nbval -----------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("nbval")


@pytest.fixture(scope="module")
def pgnb_before():
    """Processes carrying PGNB_OWNER before these runs (other people's; only looked at, never touched)."""
    return processes_of()


@pytest.fixture(scope="module")
def replays(request, workdir, pgnb_before):
    """Every selected replay, started on first use: JOBS notebooks at a time, each notebook's runs in order.

    (run, path) -> a Future of run_nbval's (process, seconds).
    """
    wanted: dict[Path, list[int]] = {}
    for item in request.session.items:
        # a replay that will be skipped (run 2 outside make soak) is not started
        if getattr(item, "originalname", None) == "test_notebook_replays_under_strict_nbval" and \
                item.get_closest_marker("skip") is None:
            wanted.setdefault(item.callspec.params["path"], []).append(item.callspec.params["run"])
    futures = {(run, path): Future() for path, runs in wanted.items() for run in runs}

    def replay(path: Path) -> None:
        for run in sorted(wanted[path]):  # run 2 only after run 1 has finished
            future = futures[run, path]
            try:
                future.set_result(run_nbval([path], workdir))
            except BaseException as e:  # noqa: BLE001 -- the test reports it
                future.set_exception(e)

    pool = ThreadPoolExecutor(JOBS, thread_name_prefix="nbval")
    for path in wanted:
        pool.submit(replay, path)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _replay_params() -> list:
    """Run 1 of every notebook; run 2 of the timing-dependent ones, and of every one under ``make soak``."""
    params = [pytest.param(1, path, id=f"run1-{path.stem}") for path in NOTEBOOKS]
    for path in NOTEBOOKS:
        marks = () if path.stem in TIMING_DEPENDENT | NEW_LESSONS else (pytest.mark.slow,)
        params.append(pytest.param(2, path, id=f"run2-{path.stem}", marks=marks))
    return params


@pytest.mark.notebooks
@pytest.mark.integration
@pytest.mark.parametrize("run, path", _replay_params())
def test_notebook_replays_under_strict_nbval(run, path, replays):
    proc, seconds = replays[run, path].result(timeout=len(replays) * NOTEBOOK_TIMEOUT)
    print(f"{path.name} run {run}: {seconds:.1f} s ({replay_python()[0]})")
    assert proc.returncode == 0, (
        f"nbval failed on {path.name} (run {run}):\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}")
    assert re.search(r"\b\d+ passed\b", proc.stdout) and "failed" not in proc.stdout.splitlines()[-1]
    assert seconds < NOTEBOOK_TIMEOUT


@pytest.mark.notebooks
@pytest.mark.integration
def test_a_changed_expected_output_fails(workdir, pgnb_before):
    """nbval on a copy of 01 whose stored output was edited must fail, on exactly that cell.

    The copy also stops before ``%pg_shutdown``: nbval then SIGKILLs a kernel whose
    world is still running, and the leak check below proves pgnb cleaned up after it.
    """
    nb = _read(NOTEBOOK_DIR / "01_init_process_group.ipynb")
    target = next(i for i, c in enumerate(nb.cells)
                  if c.cell_type == "code" and "World size: {dist.get_world_size()}" in c.source)
    outputs = nb.cells[target].outputs
    changed = 0
    for o in outputs:
        if o["output_type"] == "stream" and "World size: 2" in o["text"]:
            o["text"] = o["text"].replace("World size: 2", "World size: 3")
            changed += 1
    assert changed, "the cell to break has no 'World size: 2' output; update this test"
    nb.cells = nb.cells[: target + 1]
    broken = workdir / "broken_copy.ipynb"
    import nbformat

    nbformat.write(nb, str(broken))
    proc, _ = run_nbval([broken], workdir)
    assert proc.returncode == 1, proc.stdout[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\b1 failed\b", last), proc.stdout[-4000:]
    assert "Cell outputs differ" in proc.stdout
    assert "World size: 3" in proc.stdout  # nbval shows the expected text it did not get


@pytest.mark.notebooks
@pytest.mark.integration
def test_nbval_kernel_is_the_user_install(workdir):
    """nbval's kernel runs the user venv's python and imports pgnb from its site-packages."""
    python = user_python()
    if python is None:
        pytest.skip("no PGNB_USER_PYTHON: the replays run in this python")
    import nbformat

    venv = Path(python).parent.parent
    probe = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        cells=[nbformat.v4.new_code_cell(
            "import sys\nfrom pathlib import Path\nimport pgnb\n"
            f"assert Path(sys.prefix) == Path({str(venv)!r}), sys.prefix\n"
            "assert Path(pgnb.__file__).is_relative_to(sys.prefix), pgnb.__file__")])
    path = workdir / "user_install_probe.ipynb"
    nbformat.write(probe, str(path))
    proc, _ = run_nbval([path], workdir)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert re.search(r"\b1 passed\b", proc.stdout.strip().splitlines()[-1]), proc.stdout[-4000:]


@pytest.mark.notebooks
@pytest.mark.integration
def test_no_process_left_behind(pgnb_before):
    """After nbval SIGKILLed every kernel: nothing started from these runs is alive.

    Every process started from these nbval runs (kernel, pgnb's reaper, ipyparallel's
    controller, engines and nannies) inherited RUN_VAR; pgnb's own processes also carry
    PGNB_OWNER. Processes that carried PGNB_OWNER before the runs belong to someone else.
    """
    deadline = time.monotonic() + REAP_GRACE
    left = processes_of(RUN_ID)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_of(RUN_ID)
    assert not set(left) & set(pgnb_before)  # cannot happen: they predate RUN_ID
    assert not left, "processes outlived their nbval kernels (pid, PGNB_OWNER?, command):\n" + "\n".join(
        f"{pid} {'pgnb' if owned else '-'} {cmd[:200]}" for pid, (cmd, owned) in sorted(left.items()))


# ---- refreshing the stored outputs ------------------------------------------------------


def refresh(paths: list[Path]) -> None:
    """Execute each notebook top to bottom in a fresh kernel (this Python) and save it."""
    import nbformat
    from nbclient import NotebookClient

    class AsNbvalSees(NotebookClient):
        def _update_display_id(self, display_id, msg):
            """Keep each output as its cell showed it: nbval compares exactly that.

            A later update of a display (pgnb turns a retired status view into a static
            report) would otherwise rewrite an earlier cell's stored output.
            """

    for path in paths:
        nb = _read(path)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
                cell.metadata.pop("execution", None)
        nb.metadata.pop("widgets", None)
        km = kernel_manager(sys.executable)
        client = AsNbvalSees(nb, km=km, timeout=CELL_TIMEOUT, store_widget_state=False,
                                resources={"metadata": {"path": str(path.parent)}})
        t0 = time.monotonic()
        try:
            client.execute()
        finally:
            if km.has_kernel:  # given a kernel manager, nbclient leaves its kernel running
                km.shutdown_kernel(now=False)
        nbformat.write(nb, str(path))
        print(f"{path.name}: {time.monotonic() - t0:.1f} s")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--refresh":
        print(__doc__)
        return 2
    names = argv[1:]
    chosen = [p for p in NOTEBOOKS if not names or p.stem in names or p.name in names]
    made = None
    if not os.environ.get("IPYTHONDIR"):  # never the user's own profile
        os.environ["IPYTHONDIR"] = made = tempfile.mkdtemp(prefix="pgnb-refresh-ipython-")
    try:
        refresh(chosen)
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
