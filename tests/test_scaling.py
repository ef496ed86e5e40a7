"""Beyond one machine: ipyparallel's launchers (mpi, slurm, ssh, pbs), attaching to an ipcluster,
and the rank mapping a launcher's own numbering implies.

Unit tests need no engines. The ``mpi`` tests start engines with ``mpiexec``
(OpenMPI + mpi4py); the attach tests start ``ipcluster`` as a separate process
and stop it by pid. Every cluster here runs under the session's temporary IPYTHONDIR.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, wait_gone
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import pgnb
from pgnb.core.cluster import EnginePool, mpi_environment
from pgnb.core.rendezvous import EngineInfo, engines_wanted, keep_rank_numbers, rank_order
from pgnb.errors import EngineStartError
from pgnb.rank.engine import describe
from pgnb.rank.rendezvous import CONNECT_GAP, connect_pace

HAVE_MPIEXEC = shutil.which("mpiexec") is not None
try:
    import mpi4py  # noqa: F401

    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
needs_mpi = pytest.mark.skipif(
    not (HAVE_MPIEXEC and HAVE_MPI4PY),
    reason="needs OpenMPI's mpiexec (apt: openmpi-bin libopenmpi-dev) and mpi4py in the venv (make test-venv)",
)


def _info(engine_id: int, launcher_rank: int | None) -> EngineInfo:
    return EngineInfo(engine_id=engine_id, pid=1000 + engine_id, host="h", addr="127.0.0.1", iface="lo",
                      launcher_rank=launcher_rank)


# ---- rank mapping (unit) ----------------------------------------------------------------------
def test_rank_order_follows_the_launchers_numbering_when_engine_ids_disagree():
    engines = [_info(7, 0), _info(3, 1), _info(5, 3), _info(1, 2)]
    ordered = rank_order(engines, 4, use_launcher_rank=True)
    assert [e.launcher_rank for e in ordered] == [0, 1, 2, 3]
    assert [e.engine_id for e in ordered] == [7, 3, 1, 5]
    # without a launcher numbering: position in sorted(ids)
    assert [e.engine_id for e in rank_order(engines, 4, use_launcher_rank=False)] == [1, 3, 5, 7]


def test_rank_order_picks_the_lowest_launcher_ranks_for_a_smaller_world():
    engines = [_info(0, 3), _info(1, 2), _info(2, 1), _info(3, 0)]
    assert [e.engine_id for e in rank_order(engines, 2, use_launcher_rank=True)] == [3, 2]


@pytest.mark.parametrize(("alive", "world", "wanted", "ranks"), [
    ([0, 2, 3], 3, 4, [0, 4, 2]),  # rank 1 lost, shrink: a new engine for 1; the old rank 3 never takes it
    ([0, 2, 3, 9], 3, 4, [0, 9, 2]),  # ... unless an idle engine (not a rank before) is there
    ([0, 1, 2, 3], 2, 4, [0, 1]),  # a plain shrink needs nothing new
    ([0, 1, 3], 4, 4, [0, 1, 4, 3]),  # rank 2 lost: replaced in place
    ([], 2, 2, [4, 5]),  # nothing left: a world of new engines
])
def test_a_free_rank_number_takes_a_new_engine_never_a_survivor_of_another_number(alive, world, wanted, ranks):
    previous = [_info(i, None) for i in range(4)]
    assert engines_wanted(previous, alive, world) == wanted
    pool = [_info(i, None) for i in alive] + [_info(4 + k, None) for k in range(wanted - len(alive))]
    assert [e.engine_id for e in keep_rank_numbers(previous, pool, world, use_launcher_rank=False)] == ranks


@pytest.mark.parametrize("numbers", [[0, 1, None], [0, 0, 1]], ids=["missing", "repeated"])
def test_rank_order_falls_back_to_ids_when_the_numbering_is_not_one_world(numbers):
    # repeated: engines of two mpiexec runs, or local engines that inherited the kernel's SLURM_PROCID
    engines = [_info(i, r) for i, r in zip((2, 0, 1), numbers, strict=True)]
    assert [e.engine_id for e in rank_order(engines, 3, use_launcher_rank=True)] == [0, 1, 2]


@pytest.mark.parametrize("var", ["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])
def test_engine_reports_its_launcher_rank(monkeypatch, var):
    for other in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(var, "5")
    assert describe("127.0.0.1")["launcher_rank"] == 5


def test_slurm_procid_maps_to_torch_rank():
    """Engines as a Slurm step would start them: ids in registration order, SLURM_PROCID the task number."""
    procids = {11: 2, 12: 0, 13: 3, 14: 1}
    engines = [_info(eid, procid) for eid, procid in procids.items()]
    ordered = rank_order(engines, 4, use_launcher_rank=True)
    assert {e.engine_id: rank for rank, e in enumerate(ordered)} == {12: 0, 14: 1, 11: 2, 13: 3}


# ---- many ranks on one host: store connections in turn --------------------------------------------
def test_a_hosts_ranks_past_the_sixteenth_connect_to_the_store_in_turn():
    assert [connect_pace(r) for r in (0, 1, 15)] == [0, 0, 0]
    assert connect_pace(16) == CONNECT_GAP and connect_pace(17) == 2 * CONNECT_GAP
    assert connect_pace(63) <= 0.4  # what 64 ranks on one host pay for it, at most


PACED_INITS = r"""
import datetime, json, socket, sys, time
from pgnb.core.rendezvous import EngineInfo, plans
from pgnb.rank import engine, rendezvous
from pgnb.spec import WorldSpec

slept = []
real_sleep = time.sleep
time.sleep = lambda s: (slept.append(s), real_sleep(s))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
me = EngineInfo(engine_id=0, pid=0, host="h", addr="127.0.0.1", iface="", launcher_rank=None)
out = {}
for scheme in ("file", "env"):
    spec = WorldSpec.validate(world=1, backend="gloo", init_method=scheme, timeout=20)
    (plan,) = plans(spec, [me], "127.0.0.1", port, sys.argv[1], "run")
    plan["local_rank"], plan["env"]["LOCAL_RANK"] = 24, "24"  # as the 25th rank of a host
    slept.clear()
    out[scheme] = engine.init_rank(plan)["initialized"], list(slept)
# a cell's own init to the world's address, through the store rank 0 keeps (here: this process's)
import torch.distributed as dist
dist.destroy_process_group()
server = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=20), wait_for_workers=False)
rendezvous.remember({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "LOCAL_RANK": "24"})
rendezvous.keep_store(server, server, serves=True)
slept.clear()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{server.port}", rank=0, world_size=1)
out["cell"] = dist.is_initialized(), list(slept)
print(json.dumps(out))
"""


@pytest.mark.integration
def test_a_rank_waits_its_turn_before_it_connects_to_a_tcp_store(tmp_path):
    """The 25th rank of a host, in a real init: it waits its pace before an env:// init and before a cell's own
    init to the world's store; a file:// init makes no store connection and does not wait."""
    store = tmp_path / "store"
    store.mkdir()
    proc = subprocess.run([sys.executable, "-c", PACED_INITS, str(store)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    pace = connect_pace(24)
    assert out["file"] == [True, []]
    assert out["env"] == [True, [pace]]
    assert out["cell"] == [True, [pace]]


# ---- launcher pass-through (unit: the Cluster is built, never started) -------------------------
@pytest.fixture
def profile_dir(tmp_path):
    """A profile whose ipcluster_config.py sets launcher options, as a Slurm/SSH/PBS user would."""
    (tmp_path / "ipcluster_config.py").write_text(
        "c = get_config()\n"
        "c.SlurmEngineSetLauncher.account = 'proj42'\n"
        "c.SlurmEngineSetLauncher.queue = 'gpu'\n"
        "c.SlurmEngineSetLauncher.timelimit = '01:00:00'\n"
        "c.SSHEngineSetLauncher.engines = {'node1': 2, 'node2': 2}\n"
        "c.PBSEngineSetLauncher.queue = 'batch'\n"
        "c.MPILauncher.mpi_args = ['--hostfile', '/etc/pgnb-hosts']\n"
        "c.Cluster.controller_ip = '10.1.2.3'\n"
    )
    return str(tmp_path)


@pytest.mark.parametrize(
    "launcher, class_name, option, value",
    [
        ("slurm", "SlurmEngineSetLauncher", "account", "proj42"),
        ("slurm", "SlurmEngineSetLauncher", "timelimit", "01:00:00"),
        ("ssh", "SSHEngineSetLauncher", "engines", {"node1": 2, "node2": 2}),
        ("pbs", "PBSEngineSetLauncher", "queue", "batch"),
        ("mpi", "MPIEngineSetLauncher", "mpi_args", ["--hostfile", "/etc/pgnb-hosts"]),
    ],
)
def test_launcher_name_and_profile_options_reach_ipyparallel_unchanged(profile_dir, launcher, class_name,
                                                                       option, value):
    cluster = EnginePool(launcher, profile_dir=profile_dir).make_cluster()
    cls = cluster.engine_launcher_class
    # ipyparallel's class, or pgnb's subclass of it (pgnb.slurm, pgnb's quiet SSH set), which reads its section
    assert class_name in [c.__name__ for c in cls.__mro__ if c.__module__.startswith("ipyparallel")], cls.__mro__
    launcher_obj = cls(config=cluster.config, log=cluster.log, profile_dir=profile_dir, cluster_id="t")
    assert getattr(launcher_obj, option) == value


def test_multi_host_launchers_listen_where_the_profile_says_local_ones_on_loopback(profile_dir):
    assert EnginePool("slurm", profile_dir=profile_dir).make_cluster().controller_ip == "10.1.2.3"
    assert EnginePool("ssh", profile_dir=profile_dir).make_cluster().controller_ip == "10.1.2.3"
    for launcher in ("local", "pgnb.fork", "mpi"):
        assert EnginePool(launcher, profile_dir=profile_dir).make_cluster().controller_ip == "127.0.0.1"


def test_unknown_launcher_is_one_line():
    with pytest.raises(pgnb.PgnbError, match="no engine launcher 'nosuch'"):
        EnginePool("nosuch").make_cluster()


def test_mpi_environment_allows_root_and_oversubscription_unless_the_user_said_otherwise():
    as_root = mpi_environment({}, is_root=True)
    assert as_root["OMPI_ALLOW_RUN_AS_ROOT"] == as_root["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert as_root["OMPI_MCA_rmaps_base_oversubscribe"] == "1"
    assert "PGNB_OWNER" in as_root["OMPI_MCA_mca_base_env_list"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in mpi_environment({}, is_root=False)
    assert "OMPI_MCA_rmaps_base_oversubscribe" not in mpi_environment(
        {"OMPI_MCA_rmaps_base_oversubscribe": "0"}, is_root=False)


# ---- MPI launcher (real mpiexec) ---------------------------------------------------------------
def _mpi_facts():
    import os

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return {"torch_rank": dist.get_rank(), "mpi_rank": MPI.COMM_WORLD.Get_rank(),
            "mpi_size": MPI.COMM_WORLD.Get_size(), "sum": t.tolist(), "owner": os.environ.get("PGNB_OWNER")}


@pytest.mark.mpi
@pytest.mark.integration
@needs_mpi
def test_pg_init_launcher_mpi_world_4(shell):
    t0 = time.monotonic()
    with capture_output():
        shell.run_line_magic("pg_init", "--launcher mpi --backend gloo --world 4")
    sb = pgnb.current()
    assert [r.state for r in sb.status()] == ["initialized"] * 4
    facts = sb.run(_mpi_facts)
    assert [f["torch_rank"] for f in facts] == [0, 1, 2, 3]
    assert [f["mpi_rank"] for f in facts] == [0, 1, 2, 3]  # torch rank == COMM_WORLD rank
    assert {f["mpi_size"] for f in facts} == {4}  # one mpiexec world
    assert all(f["sum"] == [10.0] * 3 for f in facts)
    # the owner token reached the mpiexec-started engines: the reaper can prove they are pgnb's
    assert {f["owner"] for f in facts} == {sb.owner_token}
    assert [r.launcher_rank for r in sb.snapshot().ranks] == [0, 1, 2, 3]
    pids = sb.pids
    with capture_output():
        shell.run_line_magic("pg_shutdown", "")
    assert wait_gone(pids) == []
    print(f"mpi world 4: {time.monotonic() - t0:.1f} s")


@pytest.mark.mpi
@pytest.mark.integration
@needs_mpi
def test_mpi_launcher_failure_is_one_line_and_fast(shell, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "0")  # the user's own setting wins
    need = (os.cpu_count() or 1) + 1
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="not enough slots"), capture_output():
        shell.run_line_magic("pg_init", f"--launcher mpi --world {need}")
    assert time.monotonic() - t0 < 60  # mpiexec's exit is noticed, not the 120 s registration deadline


# ---- attach to a cluster someone else started --------------------------------------------------
def _start_ipcluster(profile_dir: str, n: int, extra: list[str] | None = None) -> subprocess.Popen:
    """``ipcluster start`` as a separate process (its own session), as a user would run it."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "ipcluster"), "start", f"-n={n}",
           f"--profile-dir={profile_dir}", "--ip=127.0.0.1", "--daemonize=False", "--Cluster.delay=0",
           *(extra or [])]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _stop_tree(proc: subprocess.Popen) -> None:
    """Stop the ipcluster this test started (SIGINT: ipcluster stops its own engines and controller)."""
    import psutil

    try:
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = [proc.pid]
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in wait_gone(tree, timeout=10):
        os.kill(pid, signal.SIGKILL)


def _wait_engines(profile_dir: str, n: int, timeout: float = 90.0) -> None:
    import ipyparallel as ipp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = ipp.Client(profile_dir=profile_dir, timeout=5)
            break
        except (OSError, TimeoutError):
            time.sleep(0.2)
    else:
        raise TimeoutError("ipcluster wrote no connection file")
    try:
        c.wait_for_engines(n, timeout=max(1.0, deadline - time.monotonic()))
    finally:
        c.close()


@pytest.fixture(scope="module")
def ipcluster(tmp_path_factory):
    """A 2-engine ``ipcluster`` in its own profile directory, started and stopped by pid here."""
    ipython_dir = os.environ["IPYTHONDIR"]
    profile = "pgnbattach"
    profile_dir = os.path.join(ipython_dir, f"profile_{profile}")
    os.makedirs(profile_dir, exist_ok=True)
    proc = _start_ipcluster(profile_dir, 2)
    try:
        _wait_engines(profile_dir, 2)
        yield {"profile": profile, "profile_dir": profile_dir, "proc": proc}
    finally:
        _stop_tree(proc)


def _engine_pids(profile_dir: str) -> list[int]:
    import ipyparallel as ipp

    c = ipp.Client(profile_dir=profile_dir, timeout=10)
    try:
        c.wait_for_engines(2, timeout=10)
        return sorted(c[:].apply_sync(os.getpid))
    finally:
        c.close()


@pytest.mark.integration
@pytest.mark.parametrize("face", ["func", "magic"])
def test_attach_uses_the_ipclusters_engines_and_shutdown_leaves_them_running(ipcluster, shell, face):
    before = _engine_pids(ipcluster["profile_dir"])
    if face == "magic":
        with capture_output():
            shell.run_line_magic("pg_init", f"--profile {ipcluster['profile']} --world 2")
        sb = pgnb.current()
    else:
        sb = pgnb.Sandbox(profile=ipcluster["profile"], world=2).start()
    try:
        assert sorted(sb.run(os.getpid)) == before  # pgnb started no engines of its own
        assert sb.run(_sum_of_ranks) == [1.0, 1.0]
    finally:
        if face == "magic":
            with capture_output():
                shell.run_line_magic("pg_shutdown", "")
        else:
            sb.shutdown()
    time.sleep(0.5)
    assert alive(before) == before  # %pg_shutdown only destroyed and disconnected
    assert ipcluster["proc"].poll() is None
    # the engines are still usable: the process group was destroyed on them, not the engines
    assert _engine_pids(ipcluster["profile_dir"]) == before


def _sum_of_ranks():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.integration
def test_attach_to_a_smaller_cluster_says_how_many_engines_it_found(ipcluster, shell):
    with pytest.raises(UsageError, match=r"has 2 engine\(s\) but --world asks for 4"), capture_output():
        shell.run_line_magic("pg_init", f"--profile {ipcluster['profile']} --world 4")
    assert alive(_engine_pids(ipcluster["profile_dir"]))  # nothing of the ipcluster was stopped


def test_attach_to_nothing_is_one_line():
    with pytest.raises(EngineStartError, match="no ipyparallel cluster found") as err:
        EnginePool(profile=None, cluster_id="nosuchcluster").connect(1)
    msg = str(err.value)
    assert "\n" not in msg, msg  # ipyparallel's own message is three lines
    assert msg.endswith("start one with `ipcluster start -n N --cluster-id nosuchcluster`"), msg


# ---- MPI engines whose ids are not their MPI ranks --------------------------------------------
@pytest.mark.mpi
@pytest.mark.integration
@needs_mpi
def test_torch_rank_is_the_mpi_rank_when_engine_ids_disagree():
    """An MPI ipcluster whose 4 engines got ids 1..4 in registration order (id 0 was taken by an
    earlier engine set): attached, pgnb numbers the ranks by MPI rank, not by engine id."""
    import ipyparallel as ipp
    from traitlets.config import Config

    cfg = Config()
    cfg.MPILauncher.environment = mpi_environment()
    cluster = ipp.Cluster(engines="mpi", n=0, controller_ip="127.0.0.1", delay=0,
                          controller_args=["--HeartMonitor.period=100"], config=cfg, shutdown_atexit=False)
    with capture_output():
        cluster.start_controller_sync()
    client = None
    try:
        client = cluster.connect_client_sync()
        first = cluster.start_engines_sync(n=1)
        client.wait_for_engines(1, timeout=60)
        cluster.start_engines_sync(n=4)
        client.wait_for_engines(5, timeout=60)
        cluster.stop_engines_sync(first)  # its engine took id 0; the MPI world's rank 0 has another id
        deadline = time.monotonic() + 30
        while len(client.ids) > 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        ids = sorted(client.ids)
        assert len(ids) == 4 and 0 not in ids
        with pgnb.Sandbox(cluster_id=cluster.cluster_id, profile=None, world=4) as sb:
            facts = sb.run(_mpi_facts)
        by_id = {row.engine_id: row for row in sb.snapshot().ranks}
        assert any(eid != row.launcher_rank for eid, row in by_id.items())  # ids and MPI ranks disagree
        assert [f["torch_rank"] for f in facts] == [f["mpi_rank"] for f in facts] == [0, 1, 2, 3]
        assert all(f["sum"] == [10.0] * 3 for f in facts)
    finally:
        if client is not None:
            client.close()
        with capture_output():
            cluster.stop_cluster_sync()
