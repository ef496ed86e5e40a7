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
import time
from pathlib import Path

import pytest
from conftest import alive, wait_gone
from kernel_util import Kernel
from slurm_cluster import MISSING, SlurmCluster, available

import pgnb

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


def test_a_killed_kernel_leaves_no_job_and_no_process(cluster: SlurmCluster):
    k = Kernel()
    try:
        k.execute("%load_ext pgnb")
        ex = k.execute("%pg_init --launcher slurm --world 4")
        assert ex.status == "ok", ex.text()
        pids = json.loads(k.execute(PIDS).outputs[0]["text"])
        assert len(cluster.jobs()) == 1
    finally:
        k.kill()  # SIGKILL, as nbval does
    deadline = time.monotonic() + 5
    while (cluster.jobs() or alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.jobs() == [] and alive(pids) == []
