"""The core against real ipyparallel engines: init, query, re-init, failures, cleanup."""

from __future__ import annotations

import os
import time

import pytest
from conftest import alive, wait_gone

import pgnb

pytestmark = pytest.mark.integration


def _facts():
    import torch.distributed as dist

    return (dist.is_initialized(), dist.get_rank(), dist.get_world_size(), str(dist.get_backend()),
            os.environ["MASTER_ADDR"], os.environ.get("GLOO_SOCKET_IFNAME"))


def _all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(2) * dist.get_rank()
    dist.all_reduce(t)
    return t.tolist()


def test_world4_ranks_answer_for_themselves(world4):
    rows = world4.status()
    assert [r.rank for r in rows] == [0, 1, 2, 3]
    assert {r.state for r in rows} == {"initialized"}
    assert {(r.world_size, r.backend, r.device) for r in rows} == {(4, "gloo", "cpu")}
    assert len({r.pid for r in rows}) == 4
    facts = world4.run(_facts)
    assert [f[1] for f in facts] == [0, 1, 2, 3]
    assert {(f[0], f[2], f[3], f[4], f[5]) for f in facts} == {(True, 4, "gloo", "127.0.0.1", "lo")}
    assert world4.run(_all_reduce) == [[6.0, 6.0]] * 4


def test_rank_follows_sorted_engine_ids(world4):
    assert world4.engine_ids == sorted(world4.engine_ids)
    assert world4.client is not None and set(world4.engine_ids) <= set(world4.client.ids)


def test_same_spec_is_a_no_op(world4):
    pids = [r.pid for r in world4.status()]
    t0 = time.monotonic()
    world4.init(world4.spec)
    assert time.monotonic() - t0 < 1.0
    assert [r.pid for r in world4.status()] == pids


def test_threads_per_rank(world4):
    threads = world4.run(lambda: __import__("torch").get_num_threads())
    assert threads == [world4.spec.threads_per_rank] * 4


@pytest.mark.parametrize("init_method", ["env", "tcp", "file"])
@pytest.mark.parametrize("world", [1, 2])
def test_init_methods_and_small_worlds(init_method, world):
    with pgnb.Sandbox(world=world, init_method=init_method, timeout=30) as sb:
        assert [r.state for r in sb.status()] == ["initialized"] * world
        assert sb.run(_all_reduce) == [[float(sum(range(world)))] * 2] * world
        store_dir = sb.store_dir
        pids = sb.pids
    assert wait_gone(pids) == []
    if init_method == "file":
        assert store_dir and not os.path.exists(store_dir)


def test_reinit_reuses_engines_and_changes_world():
    with pgnb.Sandbox(world=2) as sb:
        first = set(sb.engine_ids)
        sb.destroy()
        assert {r.state for r in sb.snapshot().ranks} == {"destroyed"}
        assert {r.state for r in sb.status()} == {"destroyed"}
        sb.init(sb.spec.with_(init_method="tcp"))
        assert set(sb.engine_ids) == first  # destroy + init reused the engines
        sb.init(sb.spec.with_(world=3))  # grow
        assert len(sb.engine_ids) == 3 and first <= set(sb.engine_ids)
        assert sb.run(_all_reduce) == [[3.0, 3.0]] * 3
        sb.init(sb.spec.with_(world=1))  # shrink: a subset of the same engines
        assert sb.run(_facts)[0][:3] == (True, 0, 1)


def test_deadline_names_the_late_rank_and_recovers():
    sb = pgnb.Sandbox(world=2, timeout=2, delay_ranks="1:30")
    try:
        t0 = time.monotonic()
        with pytest.raises(pgnb.InitError) as info:
            sb.start()
        took = time.monotonic() - t0
        msg = str(info.value)
        assert "rank 1 did not join within the 2 s timeout" in msg
        assert "--force" in msg and "\n" not in msg
        assert took < 15, took
        rows = {r.rank: r for r in sb.snapshot().ranks}
        # rank 1's engine, stuck in its delay, was replaced: lost until the next init (rank 0's is kept)
        assert {r: row.state for r, row in rows.items()} == {0: "failed", 1: "lost"}
        assert "engine replaced" in rows[1].error, rows[1].error
        # the next init works on what is left
        sb.init(sb.spec.with_(delay_ranks=(), timeout=30.0))
        assert sb.run(_all_reduce) == [[1.0, 1.0]] * 2
    finally:
        pids = sb.pids
        sb.shutdown()
    assert wait_gone(pids) == []


def test_force_restarts_engines():
    with pgnb.Sandbox(world=2) as sb:
        old = {r.pid for r in sb.status()}
        sb.start(force=True)
        new = {r.pid for r in sb.status()}
        assert old.isdisjoint(new)
        assert wait_gone(list(old)) == []


def test_run_failure_names_the_rank(world4):
    def boom():
        import torch.distributed as dist

        if dist.get_rank() == 2:
            raise RuntimeError("only rank 2 fails")
        return dist.get_rank()

    with pytest.raises(pgnb.RankError, match=r"rank 2: RuntimeError: only rank 2 fails") as info:
        world4.run(boom)
    assert info.value.failed_ranks == [2]


def test_run_before_start_says_what_to_do():
    sb = pgnb.Sandbox(world=1)
    with pytest.raises(pgnb.NotStartedError, match="run %pg_init first"):
        sb.run(len, [])


def test_reaper_kills_everything_when_owner_dies(tmp_path):
    """A kernel killed with SIGKILL: its reaper stops every process pgnb started."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "owner.py"
    script.write_text(
        "import pgnb, sys\n"
        "sb = pgnb.Sandbox(world=2).start()\n"
        "print(' '.join(map(str, sb.pids)), flush=True)\n"
        "sys.stdin.read()\n"
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(pids) >= 6, pids  # 2 engines, 2 nannies, controller, reaper
    assert alive(pids) == pids
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert wait_gone(pids, timeout=10) == []


@pytest.mark.parametrize("launcher", ["local", "fork"])
def test_both_local_launchers(launcher):
    """ipyparallel's own local launcher stays supported beside pgnb's fork launcher."""
    with pgnb.Sandbox(world=2, launcher=launcher) as sb:
        # started while the controller booted: the engines read its connection file themselves
        assert sb.cluster.send_engines_connection_env is False
        assert sb.run(_all_reduce) == [[1.0, 1.0]] * 2
        torch_preloaded = sb.run(lambda: "torch" in __import__("sys").modules)
        assert torch_preloaded == [True, True]
        pids = sb.pids
    assert wait_gone(pids) == []


def test_a_ranks_cell_output_is_what_python_printed_outside_pytest_too(tmp_path):
    """C-level writes to fd 1/2 (torch's C++ logs) stay out of cells in JupyterLab as under nbval.

    ipykernel forwards them unless PYTEST_CURRENT_TEST is set, which nbval's kernels inherit and a
    user's JupyterLab kernel does not: run the world in a process without it.
    """
    import subprocess
    import sys

    script = tmp_path / "fd.py"
    script.write_text(
        "import pgnb\n"
        "with pgnb.Sandbox(backend='gloo', world=2) as sb:\n"
        "    r = sb.execute('import os, sys\\nos.write(2, b\"from fd 2\\\\n\"); os.write(1, b\"from fd 1\\\\n\")\\n'\n"
        "                   'print(\"py out\"); print(\"py err\", file=sys.stderr)')\n"
        "    print([(x.stdout, x.stderr) for x in r.ranks])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str([("py out\n", "py err\n")] * 2), proc.stdout


def test_a_client_that_missed_the_engines_registrations_connects_again():
    """A Client learns of an engine from the hub's notice, which is lost when the Client's subscription has
    not joined yet (a Client that connected while the engines registered; CI saw a start wait 120 s for an
    engine the hub had). The start asks the hub and connects a new Client within seconds."""
    from pgnb.core.cluster import EnginePool
    from pgnb.core.registration import HUB_LOOK

    clients = []

    class FirstClientMissesEverything(EnginePool):
        def make_cluster(self, engines=0):
            cluster = super().make_cluster(engines)
            connect = cluster.connect_client_sync

            def connect_first_deaf(*args, **kwargs):
                client = connect(*args, **kwargs)
                if not clients:  # as if every notice came before the subscription joined
                    client._notification_handlers["registration_notification"] = lambda msg: None
                    client._ids, client._engines = [], type(client._engines)()
                clients.append(client)
                return client

            cluster.connect_client_sync = connect_first_deaf
            return cluster

    pool = FirstClientMissesEverything("pgnb.fork")
    t0 = time.monotonic()
    try:
        pool.connect(2)
        took = time.monotonic() - t0
        assert len(pool.client.ids) == 2
        assert len(clients) == 2 and pool.client is clients[1]
        assert clients[0]._closed  # the stale Client is closed, not left with its sockets
        assert took < 3 * HUB_LOOK + 15, took
        # the engines it sees are those launched (ids follow registration, not the launch order)
        assert sorted(pool.client[:].apply_sync(os.getpid)) == sorted(pool._launched_engines())
    finally:
        pids = pool._launched_engines()
        pool.stop(pids)
    assert wait_gone(pids) == []
