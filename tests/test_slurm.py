"""Worlds on a real Slurm cluster: one node of the tests' own (tests/slurm_cluster.py), loopback only.

The cluster is started once for the module (~1 s) and every test's jobs are
gone when the test ends. The profile is the one docs/scaling_out.md shows
(``SLURM_PROFILE``, checked against the docs below). Without root or the
Debian packages these tests skip with one line; under ``PGNB_REQUIRE_SLURM=1``
(``make test`` as root) they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import alive, left_in, wait_gone
from kernel_util import Kernel
from slurm_cluster import CPUS as SLURM_CPUS, MISSING, SlurmCluster, available

import pgnb
from pgnb.core.sandbox import dispatch_of

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[1]
REQUIRE_VAR = "PGNB_REQUIRE_SLURM"
#: What docs/scaling_out.md tells a Slurm user to put in ipcluster_config.py, as the tests run it.
SLURM_PROFILE = """\
c = get_config()
c.Cluster.controller_ip = "127.0.0.1"        # one node; on a real cluster: "0.0.0.0" or the login node's address
c.SlurmEngineSetLauncher.queue = "debug"     # the partition
c.SlurmEngineSetLauncher.timelimit = "00:10:00"
"""
PIDS = "import pgnb, json; print(json.dumps(pgnb.current().pids))"
#: A lost engine is noticed by the liveness watcher (0.3 s period) after Slurm's SIGTERM reaches it.
LOST_WITHIN = 2.0


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(f"{reason} ({REQUIRE_VAR}=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """The module's Slurm cluster, and an IPYTHONDIR whose default profile is the docs' Slurm profile."""
    if not available():
        _unavailable(MISSING)
    cluster = SlurmCluster().start()
    ipython_dir = tmp_path_factory.mktemp("slurm-ipython")
    (ipython_dir / "profile_default").mkdir()
    (ipython_dir / "profile_default" / "ipcluster_config.py").write_text(SLURM_PROFILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", cluster.conf)
        mp.setenv("IPYTHONDIR", str(ipython_dir))
        yield cluster
    cluster.stop()


@pytest.fixture
def cluster(slurm: SlurmCluster):
    """The cluster, checked to hold no job when a test ends (its own cancelled, then a failure)."""
    yield slurm
    left = slurm.jobs()
    if left:
        slurm.run("scancel", "-u", "root")
        pytest.fail(f"jobs left in the queue: {left}")


def _facts() -> dict[str, object]:
    import os

    import torch
    import torch.distributed as dist

    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "procid": int(os.environ["SLURM_PROCID"]),
            "localid": int(os.environ["SLURM_LOCALID"]), "nodeid": int(os.environ["SLURM_NODEID"]),
            "job": os.environ["SLURM_JOB_ID"], "sum": t.tolist()}


def test_docs_show_the_profile_the_tests_run():
    text = (REPO / "docs" / "scaling_out.md").read_text()
    assert SLURM_PROFILE in text


def test_a_slurm_world_runs_and_rank_is_slurm_procid(cluster: SlurmCluster):
    sb = pgnb.Sandbox(backend="gloo", world=4, launcher="slurm", timeout=60)
    try:
        sb.start()
        facts = sb.run(_facts)
        pids = sb.pids
    finally:
        sb.shutdown()
    assert [f["rank"] for f in facts] == [0, 1, 2, 3]
    assert [f["procid"] for f in facts] == [0, 1, 2, 3]  # torch rank = SLURM_PROCID
    assert [f["localid"] for f in facts] == [0, 1, 2, 3] and {f["nodeid"] for f in facts} == {0}
    assert len({f["job"] for f in facts}) == 1  # one sbatch job
    assert [f["sum"] for f in facts] == [[10.0, 10.0]] * 4
    assert wait_gone(pids, timeout=5) == []
    assert cluster.jobs() == []  # %pg_shutdown returns once the job has left the queue


def test_a_killed_kernel_leaves_no_job_and_no_process(cluster: SlurmCluster, tmp_path: Path):
    """The reaper cancels the job: on a real cluster its engines run on other nodes, out of reach of the
    reaper's local kill, which here ends the job before the cancel does (one node, so it is asked of slurmctld).
    Nothing is left in the notebook's folder either."""
    notebook_dir = tmp_path / "notebook"
    notebook_dir.mkdir()
    k = Kernel(cwd=str(notebook_dir))
    try:
        k.execute("%load_ext pgnb")
        ex = k.execute("%pg_init --launcher slurm --world 4")
        assert ex.status == "ok", ex.text()
        pids = json.loads(k.execute(PIDS).outputs[0]["text"])
        (job,) = [line.split()[0] for line in cluster.jobs()]
    finally:
        k.kill()  # SIGKILL, as nbval does
    cancelled = f"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId={job} "  # slurmctld's record of an scancel
    deadline = time.monotonic() + 5
    while (cluster.jobs() or alive(pids) or cancelled not in cluster.log()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.jobs() == [] and alive(pids) == []
    assert cancelled in cluster.log(), "the reaper did not scancel the job"
    # ipyparallel, rebuilding the cluster from its file in the reaper, made a "log" folder in its working
    # directory, which the reaper had from the kernel
    assert left_in(notebook_dir) == []


@pytest.fixture
def profile(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``profile(line)``: this test's IPYTHONDIR, whose default profile is the docs' plus ``line``."""

    def make(line: str) -> None:
        (tmp_path / "profile_default").mkdir()
        (tmp_path / "profile_default" / "ipcluster_config.py").write_text(SLURM_PROFILE + line + "\n")
        monkeypatch.setenv("IPYTHONDIR", str(tmp_path))

    return make


def _start_fails(world: int) -> tuple[str, float, list[int]]:
    """Start a world that must not start: its one-line error, how long it took, what was left running."""
    sb = pgnb.Sandbox(backend="gloo", world=world, launcher="slurm", timeout=60)
    t0 = time.monotonic()
    with pytest.raises(pgnb.PgnbError) as info:
        sb.start()
    seconds = time.monotonic() - t0
    left = alive(sb.pids)
    sb.shutdown()
    return str(info.value), seconds, left


def test_a_partition_that_does_not_exist_is_said_at_once(cluster: SlurmCluster, profile):
    profile('c.SlurmEngineSetLauncher.queue = "nosuchpartition"')
    message, seconds, left = _start_fails(4)
    assert "Invalid partition name specified" in message and "\n" not in message  # sbatch's own words
    assert seconds < 5 and left == []


def test_more_cpus_than_the_cluster_has_is_said_with_slurms_reason(cluster: SlurmCluster):
    message, seconds, left = _start_fails(2 * SLURM_CPUS)
    assert re.fullmatch(r"Slurm job \d+ cannot start: PENDING \(PartitionConfig\), .*pgnb cancelled it", message)
    assert seconds < 5 and left == []  # not the init timeout


def test_a_pending_job_shows_its_id_state_and_reason_while_it_waits(cluster: SlurmCluster):
    from pgnb.notebook.view import _header_html

    blocker = cluster.run("sbatch", "--parsable", f"--ntasks={SLURM_CPUS}", "--output=/dev/null",
                          "--wrap", "sleep 60").stdout.strip()
    sb = pgnb.Sandbox(backend="gloo", world=4, launcher="slurm", timeout=60)
    starting = threading.Thread(target=sb.start)
    starting.start()
    try:
        seen, said = "", re.compile(r"Slurm job \d+: PENDING \((Resources|Priority)\)")  # just queued, no reason yet
        deadline = time.monotonic() + 15
        while not said.fullmatch(seen) and time.monotonic() < deadline:
            snap = sb.snapshot()
            seen = snap.waiting if snap.phase == "starting engines" else ""
            time.sleep(0.1)
        assert said.fullmatch(seen), seen
        header = _header_html(sb.snapshot())
        assert seen in header and re.search(r"\d+\.\d s</div>", header)  # and the time it has waited
        cluster.run("scancel", blocker)  # the job runs once the CPUs are free, and the world comes up
        starting.join(30)
        assert [r.state for r in sb.status()] == ["initialized"] * 4
        assert sb.snapshot().waiting == ""
    finally:
        cluster.run("scancel", blocker)
        starting.join(30)
        sb.shutdown()


@pytest.mark.parametrize("how", ["scancel", pytest.param("timelimit", marks=pytest.mark.slow)])
def test_a_job_ended_from_outside_marks_its_ranks_lost(cluster: SlurmCluster, profile, how: str):
    """Cancelled by its user, or killed at its time limit (Slurm's shortest is a minute: a soak test)."""
    profile('c.SlurmEngineSetLauncher.timelimit = "1"' if how == "timelimit" else "")
    sb = pgnb.Sandbox(backend="gloo", world=4, launcher="slurm", timeout=60)
    try:
        sb.start()
        (job,) = {f["job"] for f in sb.run(_facts)}
        if how == "scancel":
            cluster.run("scancel", job)
        t0 = time.monotonic()  # the job's end: now, or when squeue first says it is no longer running
        while len(dispatch_of(sb).lost_ranks()) < 4 and time.monotonic() - t0 < 90:
            if how == "timelimit" and "RUNNING" in cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
                t0 = time.monotonic()
            time.sleep(0.05)
        assert time.monotonic() - t0 < LOST_WITHIN
        with pytest.raises(pgnb.PgnbError) as info:
            sb.execute("print(1)")
        message = str(info.value)
        words = "was cancelled" if how == "scancel" else "reached its time limit"
        assert f"Slurm job {job} {words}" in message and "\n" not in message
    finally:
        sb.shutdown()
