"""The fork engine launcher: real ipyparallel engines forked from a torch-importing zygote."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ipyparallel as ipp
import psutil
import pytest
from conftest import wait_gone
from ipyparallel.cluster.launcher import LauncherError
from traitlets.config import Config

from pgnb.core.waiting import poll_until
from pgnb.procs.forklauncher import ForkEngineSetLauncher

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork + prctl: Linux only"),
]

FORK = "pgnb.procs.forklauncher.ForkEngineSetLauncher"
REPO = Path(__file__).resolve().parents[1]
CLUSTER_ARGS: dict[str, Any] = dict(
    delay=0,
    controller_ip="127.0.0.1",
    controller_args=["--HeartMonitor.period=100"],
    engine_launcher_class=FORK,
)


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every cluster here lives in a throwaway IPYTHONDIR, never the user's profile."""
    path = tmp_path_factory.mktemp("ipython")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(path))
        # The engines and the subprocess script import pgnb from this checkout.
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        yield path


ClusterFactory = Callable[..., "tuple[ipp.Cluster, ipp.Client]"]


def _make_cluster_factory(request: pytest.FixtureRequest) -> ClusterFactory:
    def start(n: int, config: Config | None = None) -> tuple[ipp.Cluster, ipp.Client]:
        cluster = ipp.Cluster(n=n, config=config or Config(), **CLUSTER_ARGS)
        request.addfinalizer(cluster.stop_cluster_sync)
        client = cluster.start_and_connect_sync()
        request.addfinalizer(client.close)
        return cluster, client

    return start


@pytest.fixture(scope="module")
def module_cluster_factory(request: pytest.FixtureRequest, ipython_dir: Path) -> ClusterFactory:
    return _make_cluster_factory(request)


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest, ipython_dir: Path) -> ClusterFactory:
    return _make_cluster_factory(request)


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> tuple[ipp.Cluster, ipp.Client]:
    """Two forked engines shared by the read-only tests."""
    config = Config()
    config.ForkEngineSetLauncher.environment = {"PGNB_FORK_TEST": "from-launcher"}
    return module_cluster_factory(2, config)


def _engine_set(cluster: ipp.Cluster, engine_set_id: str | None = None) -> ForkEngineSetLauncher:
    if engine_set_id is None:
        (engine_set_id,) = cluster.engines
    launcher = cluster.engines[engine_set_id]
    assert isinstance(launcher, ForkEngineSetLauncher)
    return launcher


def _engine_facts() -> dict[str, Any]:
    import gc
    import os
    import sys

    from pgnb.rank.engine import init_rank

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "torch": "torch" in sys.modules,
        "torch.distributed": "torch.distributed" in sys.modules,
        "env": os.environ.get("PGNB_FORK_TEST"),
        "cpp_log_level": os.environ.get("TORCH_CPP_LOG_LEVEL"),
        "stdout": os.readlink("/proc/self/fd/1"),
        "stderr": os.readlink("/proc/self/fd/2"),
        # imported by the zygote before it froze what it had and forked: every rank shares it, none imports it
        "rank_code_from_zygote": gc.is_tracked(init_rank) and not any(o is init_rank for o in gc.get_objects()),
    }


def _terminate_tree(pid: int) -> None:
    """SIGTERM a process, SIGKILL it and its descendants if they linger."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        root.terminate()
    except psutil.NoSuchProcess:
        return
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _touch_then_sleep(path: str) -> None:
    import time

    open(path, "w").close()
    time.sleep(30)


# -- a running cluster ---------------------------------------------------------


def test_engines_register_and_run_with_torch_preloaded(cluster: tuple[ipp.Cluster, ipp.Client]) -> None:
    c, client = cluster
    launcher = _engine_set(c)
    assert len(client.ids) == 2
    facts = client[:].apply_sync(_engine_facts)
    assert sorted(f["pid"] for f in facts) == sorted(launcher.engine_pids.values())
    for f in facts:
        assert f["ppid"] == launcher.zygote_pid
        assert f["torch"] and f["torch.distributed"]
        assert f["env"] == "from-launcher"
        assert f["cpp_log_level"] == "ERROR"
        assert f["rank_code_from_zygote"]


def _all_reduce_rank(rank: int, store_dir: str) -> list[float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2)
    try:
        t = torch.ones(2) * (rank + 1)
        dist.all_reduce(t)
        return t.tolist()
    finally:
        dist.destroy_process_group()


def test_forked_engines_run_a_gloo_world(cluster: tuple[ipp.Cluster, ipp.Client], tmp_path: Path) -> None:
    _, client = cluster
    pending = [client[eid].apply_async(_all_reduce_rank, rank, str(tmp_path)) for rank, eid in enumerate(client.ids)]
    assert [ar.get(timeout=30) for ar in pending] == [[3.0, 3.0], [3.0, 3.0]]


def test_engine_output_goes_to_the_profile_log(cluster: tuple[ipp.Cluster, ipp.Client]) -> None:
    c, client = cluster
    log_dir = os.path.join(c.profile_dir, "log")
    for f in client[:].apply_sync(_engine_facts):
        assert f["stdout"] == f["stderr"]
        assert os.path.dirname(f["stdout"]) == log_dir
        assert os.path.basename(f["stdout"]).startswith(f"ipengine-{c.cluster_id}-")


def test_nannies_are_forked_and_relay_signals(cluster: tuple[ipp.Cluster, ipp.Client], tmp_path: Path) -> None:
    c, client = cluster
    launcher = _engine_set(c)
    zygote = psutil.Process(launcher.zygote_pid)
    nannies = [p for p in zygote.children() if p.pid not in launcher.engine_pids.values()]
    assert len(nannies) == 2
    # No fresh `python -m ipyparallel.engine.nanny`: the zygote's command line.
    assert all(p.cmdline() == zygote.cmdline() for p in nannies)
    # SIGINT through the nanny interrupts a busy engine.
    target = client.ids[0]
    started = tmp_path / "started"
    ar = client[target].apply_async(_touch_then_sleep, str(started))
    assert poll_until(started.exists, 10, step=0.05)
    client.send_signal(signal.SIGINT, targets=[target], block=True)
    with pytest.raises(ipp.error.RemoteError) as info:
        ar.get(timeout=10)
    assert info.value.ename == "KeyboardInterrupt"


def test_grow_then_lose_an_engine_set(cluster: tuple[ipp.Cluster, ipp.Client]) -> None:
    c, client = cluster
    first = _engine_set(c)
    grown_id = c.start_engines_sync(1)
    grown = _engine_set(c, grown_id)
    try:
        client.wait_for_engines(3, timeout=60)
        assert grown.zygote_pid != first.zygote_pid
        (pid,) = grown.engine_pids.values()
        # Kill the zygote: its engine dies with it (PR_SET_PDEATHSIG), the
        # nanny tells the controller, the launcher notices.
        os.kill(grown.zygote_pid, signal.SIGKILL)
        assert wait_gone([pid], 5) == []
        assert poll_until(lambda: grown.state == "after", 5, step=0.05)
        assert poll_until(lambda: len(client.ids) == 2, 10, step=0.05)
    finally:
        c.stop_engines_sync(grown_id)
    assert client[:].apply_sync(os.getpid) and first.state == "running"


# -- stopping ------------------------------------------------------------------


def test_stop_leaves_no_process(cluster_factory: ClusterFactory) -> None:
    c, client = cluster_factory(2)
    launcher = _engine_set(c)
    zygote = psutil.Process(launcher.zygote_pid)
    pids = [p.pid for p in zygote.children()] + [zygote.pid]
    assert len(pids) == 5  # 2 engines, 2 nannies, the zygote
    client.close()
    c.stop_engines_sync()
    assert wait_gone(pids, 0) == []  # stop returns only when all are gone
    # Both stopped at the first SIGTERM (a SIGKILL after the grace would show as -9).
    assert launcher.state == "after"
    assert [d["exit_code"] for d in launcher.stop_data["engines"].values()] == [0, 0]
    c.stop_cluster_sync()


def test_signal_reaches_every_engine(ipython_dir: Path) -> None:
    # No controller: engines wait for a connection file; enough to signal them.
    launcher = ForkEngineSetLauncher(profile_dir=str(ipython_dir / "standalone"), cluster_id="signal", preload=[])
    pids = asyncio.run(launcher.start(2))
    try:
        launcher.signal("KILL")
        assert poll_until(lambda: launcher.state == "after", 5, step=0.05)
        assert {d["exit_code"] for d in launcher.stop_data["engines"].values()} == {-signal.SIGKILL}
        assert [launcher.exit_status(pid) for pid in pids] == [-signal.SIGKILL] * 2
        assert wait_gone([*pids, launcher.zygote_pid], 5) == []
    finally:
        asyncio.run(launcher.stop())


def test_bad_preload_fails_start_with_the_reason(ipython_dir: Path) -> None:
    launcher = ForkEngineSetLauncher(
        profile_dir=str(ipython_dir / "standalone"), cluster_id="bad", preload=["pgnb_no_such_module"]
    )
    with pytest.raises(LauncherError, match="pgnb_no_such_module"):
        asyncio.run(launcher.start(1))
    assert wait_gone([launcher.zygote_pid], 5) == []


KILLED_PARENT = textwrap.dedent(
    """
    import json, time
    import ipyparallel as ipp
    cluster = ipp.Cluster(n=2, **{cluster_args!r})
    client = cluster.start_and_connect_sync()
    (engines,) = cluster.engines.values()
    print(json.dumps({{"zygote": engines.zygote_pid, "controller": cluster.controller.pid}}), flush=True)
    time.sleep(600)
    """
)


def test_engines_die_with_the_process_that_launched_them(ipython_dir: Path) -> None:
    script = KILLED_PARENT.format(cluster_args=CLUSTER_ARGS)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    controller = None
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the launching script did not start its cluster in 60s"
        info = json.loads(proc.stdout.readline())
        controller = info["controller"]
        zygote = psutil.Process(info["zygote"])
        pids = [p.pid for p in zygote.children()] + [zygote.pid]
        assert len(pids) == 5  # 2 engines, 2 nannies, the zygote
        proc.kill()
        proc.wait()
        assert wait_gone(pids, 10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # The controller does not watch its parent (pgnb's reaper's job, not
        # the launcher's): clean up the one this test started.
        if controller is not None:
            _terminate_tree(controller)


DORMANT = textwrap.dedent(
    """
    import json, os
    import torch
    import pgnb
    from pgnb.procs import prefork
    assert prefork.fork_dormant(1, ["torch"]) == ""
    (forked,) = [z.pid for z in prefork._dormant]
    sb = pgnb.Sandbox(world=2, backend="gloo")
    sb.start()
    parents = sb.run(os.getppid)
    pipes = sb.run(lambda: str(__import__("signal").getsignal(__import__("signal").SIGPIPE)))
    pids, left = sb.pids, prefork.dormant()
    sb.shutdown()
    print(json.dumps({"forked": forked, "parents": parents, "pids": pids, "left": left, "pipes": pipes}))
    """
)


def test_a_world_takes_the_zygote_its_process_forked(ipython_dir: Path) -> None:
    """A zygote forked from the process (pgnb.procs.prefork) forks the ranks, is among the world's processes,
    and goes with them: nothing is left, though what it forks carries no owner token."""
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
    proc = subprocess.run([sys.executable, "-c", DORMANT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.splitlines()[-1])
    assert info["parents"] == [info["forked"]] * 2 and info["forked"] in info["pids"] and info["left"] == 0
    # as in a fresh Python: a rank writing to a closed pipe gets BrokenPipeError, not a silent death
    assert info["pipes"] == [str(signal.SIG_IGN)] * 2, info
    assert len(info["pids"]) >= 7, info  # 2 engines, 2 nannies, the zygote, the controller, the reaper
    assert wait_gone(info["pids"], 5) == []


SPARES = textwrap.dedent(
    """
    import json, os, select, time
    import torch
    import pgnb
    from pgnb.procs import prefork
    assert prefork.fork_dormant(3, ["torch"]) == ""
    first, spare, unused = prefork._dormant
    def said(zygote, timeout):
        return bool(select.select([zygote.stdout], [], [], timeout)[0])
    first_ready = said(first, 60)
    spare_silent = not said(spare, 1.0) and not said(unused, 0)
    prefork._dormant.remove(unused)
    unused.close()
    tic = time.monotonic()
    unused_code = unused.wait(10)
    unused_seconds = time.monotonic() - tic
    prefork.take().close()  # the first goes: the world takes the spare
    sb = pgnb.Sandbox(world=2, backend="gloo")
    sb.start()
    parents = sb.run(os.getppid)
    sb.shutdown()
    print(json.dumps({"first_ready": first_ready, "spare_silent": spare_silent, "spare": spare.pid,
                      "parents": parents, "unused_code": unused_code, "unused_seconds": unused_seconds}))
    """
)


def test_a_spare_zygote_imports_only_once_a_world_takes_it(ipython_dir: Path) -> None:
    """Of the zygotes forked together, the first imports at once and says it is ready; a spare says nothing
    until a world takes it (its imports would compete with the first world's start), then forks that world's
    ranks; one never taken exits at once when its pipe closes."""
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
    proc = subprocess.run([sys.executable, "-c", SPARES], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.splitlines()[-1])
    assert info["first_ready"] and info["spare_silent"], info
    assert info["parents"] == [info["spare"]] * 2, info
    assert info["unused_code"] == 0 and info["unused_seconds"] < 2, info


def test_no_zygote_is_forked_beside_a_thread() -> None:
    import threading

    from pgnb.procs import prefork

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert prefork.fork_dormant(1, []) == f"{threading.active_count()} Python threads"
        assert prefork.dormant() == 0
    finally:
        stop.set()
        thread.join()


def test_an_engine_exit_skips_only_torchs_teardown_of_its_operators() -> None:
    """At an engine's exit the zygote runs the atexit work a normal exit would, less torch.library's
    finalizers (their teardown of the process's operator registrations); a user's finalizers still run."""
    script = textwrap.dedent(
        """
        import weakref, torch
        from pgnb.procs.zygote import _skip_torch_library_teardown
        class Thing: pass
        thing = Thing()
        mine = weakref.finalize(thing, print, "the user's finalizer ran")
        torchs = [f for f, info in weakref.finalize._registry.items() if info.func.__module__ == "torch.library"]
        assert torchs
        _skip_torch_library_teardown()
        assert mine.atexit and not any(f.atexit for f in torchs)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "the user's finalizer ran\n"
