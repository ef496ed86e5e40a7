"""The pieces behind the reliability suite, without engines: the liveness watcher, the stale-state sweep, and
which processes a world may signal on this machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
from conftest import wait_gone

from pgnb.core.health import Health
from pgnb.core.hosting import Hosting
from pgnb.core.liveness import Watcher, describe_exit, last_exception, logged_exception
from pgnb.core.rendezvous import EngineInfo
from pgnb.core.waiting import poll_until
from pgnb.procs import processes
from pgnb.procs.ownership import cluster_files, state_path, sweep, write_state
from pgnb.procs.processes import OWNER_ENV, process_alive as is_alive, process_state, start_time, zombie_status
from pgnb.spec import WorldSpec


def test_describe_exit():
    assert describe_exit(None) == "engine process died"
    assert describe_exit(1) == "engine exited with status 1"
    assert describe_exit(0) == "engine exited with status 0"
    assert describe_exit(-signal.SIGKILL) == "engine killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "engine killed by SIGSEGV (segmentation fault)"
    assert describe_exit(-200) == "engine killed by signal 200"


def test_a_controllers_log_names_why_its_process_died(tmp_path):
    """The line that ends the log's last traceback: what a scheduler that could not bind its port printed
    (into its controller's log) before it exited; log records around it and earlier tracebacks do not count."""
    log = (
        "2026-12-05 07:01:02.123 [IPController] ERROR | an earlier, handled error\n"
        "Traceback (most recent call last):\n  File \"hub.py\", line 3, in f\n    g()\nKeyError: 'x'\n"
        "Process TaskScheduler:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap\n'
        "    self.run()\n"
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:40123')\n"
        "2026-12-05 07:01:03.456 [IPController] INFO | client::client connected\n")
    assert last_exception(log) == "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:40123')"
    assert last_exception("2026-12-05 [IPController] INFO | started\n") == ""
    assert last_exception("Traceback (most recent call last):\n  File \"x.py\", line 1\n") == ""  # cut short
    path = tmp_path / "ipcontroller.log"
    path.write_text("x" * 100_000 + "\n" + log)  # only the tail is read
    assert logged_exception(str(path)).startswith("zmq.error.ZMQError: Address already in use")
    assert logged_exception(str(tmp_path / "missing.log")) == ""


def test_watcher_reports_each_death_once_with_its_cause():
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    before = {t for t in __import__("threading").enumerate() if t.name == "pgnb-liveness"}  # other worlds' watchers
    statuses = {}
    deaths = []
    w = Watcher(lambda pid, cause, status: deaths.append((pid, cause, time.monotonic())), statuses.get,
                period=0.05)
    try:
        w.watch({p.pid: start_time(psutil.Process(p.pid)) for p in procs})
        w.unwatch([procs[2].pid])  # pgnb stops this one itself: not a loss
        t0 = time.monotonic()
        procs[0].kill()
        statuses[procs[0].pid] = procs[0].wait()  # as the launcher's reaping thread records it
        procs[2].kill()
        procs[2].wait()
        poll_until(lambda: deaths, 2, step=0.01)
        time.sleep(0.2)  # a second report would come within this
        assert [(pid, cause) for pid, cause, _ in deaths] == [(procs[0].pid, "engine killed by SIGKILL")]
        assert deaths[0][2] - t0 < 0.5
        assert is_alive(procs[1].pid, start_time(psutil.Process(procs[1].pid)))
        assert not is_alive(procs[1].pid, 1.0)  # a reused pid is not the process we watched
    finally:
        w.stop()
        for p in procs:
            p.kill()
            p.wait()
    assert {t for t in __import__("threading").enumerate() if t.name == "pgnb-liveness"} <= before


def test_a_look_returns_after_a_death_the_thread_is_reporting_is_told():
    """A magic's look before it sends work must not pass a death the watcher's thread has taken but not yet told
    (ipyparallel 9.0's schedulers outlive their controller a moment, so a cell sent then would still run)."""
    import threading

    proc = subprocess.Popen(["sleep", "60"])
    telling, told = threading.Event(), []

    def slow_to_tell(pid, cause, status):
        telling.set()
        time.sleep(0.5)  # the views drawing the death, on a loaded machine
        told.append(pid)

    w = Watcher(slow_to_tell, period=0.02)
    try:
        w.watch({proc.pid: start_time(psutil.Process(proc.pid))})
        proc.kill()
        proc.wait()
        assert telling.wait(5)
        w.look()
        assert told == [proc.pid]
    finally:
        w.stop()
        proc.kill()
        proc.wait()


def test_a_stepped_system_clock_kills_no_watched_process(monkeypatch):
    """psutil's create_time() moves with the boot time the kernel reports, which moves when the clock is
    stepped (41 s once on a VM here: every pgnb world on it saw its controller 'die'); start_time does not."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started, created = start_time(psutil.Process(proc.pid)), psutil.Process(proc.pid).create_time()
        stepped = psutil.boot_time() + 41.0
        monkeypatch.setattr(psutil, "boot_time", lambda: stepped)
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: stepped)
        assert psutil.Process(proc.pid).create_time() != created  # the step is seen where it used to matter
        assert is_alive(proc.pid, started)
    finally:
        proc.kill()
        proc.wait()


def test_process_alive_reads_proc_once_and_agrees_with_psutil():
    """The fast path (one read of /proc/PID/stat) and psutil's answer agree: a live process, one whose pid
    has a different start (reused), a zombie nobody reaped yet, and a pid that is gone."""
    live = subprocess.Popen(["sleep", "60"])
    zombie = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        started = start_time(psutil.Process(live.pid))
        zombie_started = start_time(psutil.Process(zombie.pid))
        assert poll_until(lambda: process_state(zombie.pid) == "zombie", 5, step=0.01)
        cases = [(live.pid, started, True), (live.pid, started + 5.0, False), (zombie.pid, zombie_started, False)]
        for pid, when, alive in cases:
            assert is_alive(pid, when) is alive, (pid, when)
            assert processes._process_alive_psutil(pid, when) is alive, (pid, when)
        assert [process_state(p.pid) for p in (live, zombie)] == ["running", "zombie"]
        assert [processes._state_psutil(p.pid) for p in (live, zombie)] == ["running", "zombie"]
        assert (zombie_status(live.pid), zombie_status(zombie.pid)) == (None, 3)
        zombie.wait()
        assert not is_alive(zombie.pid, zombie_started)
        assert not processes._process_alive_psutil(zombie.pid, zombie_started)
        assert process_state(zombie.pid) == processes._state_psutil(zombie.pid) == "gone"
    finally:
        live.kill()
        live.wait()


def test_sweep_removes_only_what_a_dead_owner_left(tmp_path):
    profile = str(tmp_path / "profile_default")
    # a dead owner: its state file names a process that is gone, and one of its processes lives on
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    orphan = subprocess.Popen(["sleep", "60"], env={**os.environ, OWNER_ENV: "dead-token"})
    os.makedirs(os.path.join(profile, "security"), mode=0o700)
    os.makedirs(os.path.join(profile, "log"))
    path = state_path(profile, "111-dead")
    with open(path, "w") as f:
        json.dump({"cluster_id": "111-dead", "profile_dir": profile, "token": "dead-token",
                   "owner_pid": dead_owner.pid, "owner_started": 1.0}, f)
    for name in ("security/cluster-111-dead.json", "security/ipcontroller-111-dead-client.json",
                 "log/engines111-dead.json", "log/ipengine-111-dead-1-0.log"):
        open(os.path.join(profile, name), "w").close()
    # a live owner (this process) and a cluster pgnb did not write
    live = write_state(profile, "222-live", "live-token")
    open(os.path.join(profile, "security", "cluster-222-live.json"), "w").close()
    open(os.path.join(profile, "security", "cluster-333-foreign.json"), "w").close()
    try:
        removed = sweep(profile)
        assert wait_gone([orphan.pid], timeout=5) == []
    finally:
        orphan.kill()
        orphan.wait()
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        ["cluster-111-dead.json", "ipcontroller-111-dead-client.json", "engines111-dead.json",
         "ipengine-111-dead-1-0.log", "pgnb-111-dead.json"])
    assert cluster_files(profile, "111-dead") == []
    assert os.path.exists(live) and oct(os.stat(live).st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(os.path.join(profile, "security"))) == [
        "cluster-222-live.json", "cluster-333-foreign.json", "pgnb-222-live.json"]



def test_a_stuck_engine_on_another_host_is_never_signalled_by_its_pid_here():
    """An engine elsewhere has a pid of its host's, which names some unrelated process of this machine: a
    stuck one is stopped through its nanny, lost all the same; its pid is not one of the world's here."""
    unrelated, local = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    here = socket.gethostname()
    remote_info = EngineInfo(engine_id=1, pid=unrelated.pid, host=f"not-{here}", addr="198.18.0.2", iface="eth0",
                             nanny_pid=unrelated.pid)
    local_info = EngineInfo(engine_id=0, pid=local.pid, host=here, addr="127.0.0.1", iface="lo")
    hosting = Hosting(WorldSpec(profile="unused"), check=lambda: None)  # attached: no reaper, nothing started
    health = Health(lambda message: None, rank_of={local.pid: 0, unrelated.pid: 1}.get,
                    exit_status=lambda pid: None, respawn_reaper=lambda pid: None)
    hosting.known = {0: local_info, 1: remote_info}
    try:
        assert hosting.pids() == {local.pid}
        hosting.stop_stuck([local_info, remote_info], health, lost_as="engine stopped (stuck)")
        assert wait_gone([local.pid], timeout=5) == []
        time.sleep(0.2)  # a signal sent is delivered by now
        assert unrelated.poll() is None, "a process of this machine was signalled for an engine of another host"
        assert health.lost_ranks([local_info, remote_info]) == {0: "engine stopped (stuck)",
                                                                1: "engine stopped (stuck)"}
    finally:
        health.stop()
        for p in (unrelated, local):
            p.kill()
            p.wait()


def test_a_stop_waits_for_the_engines_only_then_kills_the_rest_at_once():
    """``kill_all(awaited=engines)``: a zygote or nanny that ignores SIGTERM (it waits for others) costs no grace."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        t0 = time.monotonic()
        processes.kill_all([polite.pid, stubborn.pid], grace=3.0, awaited=[polite.pid])
        took = time.monotonic() - t0
        assert process_state(polite.pid) == process_state(stubborn.pid) == "gone"  # kill_all reaped them too
        assert took < 1.5, took  # not the 3 s grace: only the engine was waited for
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_stop_takes_another_process_s_zombie_as_ended():
    """An engine is the zygote's child: once it has exited, ``kill_all`` does not wait for the zygote to reap
    it (psutil's wait did, up to the grace), and it sees the exit within milliseconds, not psutil's 40 ms steps."""
    parent = subprocess.Popen([sys.executable, "-c", "import os, time\n"
                               "pid = os.fork()\n"
                               "if pid == 0:\n"
                               "    time.sleep(60)\n"
                               "    os._exit(0)\n"
                               "print(pid, flush=True)\n"
                               "time.sleep(60)  # never reaps its child"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        t0 = time.monotonic()
        processes.kill_all([child], grace=3.0, awaited=[child])
        took = time.monotonic() - t0
        assert process_state(child) == "zombie"  # its parent's to reap, not ours
        assert took < 0.5, took
    finally:
        parent.kill()
        parent.wait()


def test_handles_see_an_ended_process_in_one_poll_a_zombie_too():
    """``Handles.ended``: a killed child (a zombie until reaped) has ended; a live one and a reused pid's
    stranger are told apart by the pidfd, not by the pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    handles = processes.Handles()
    try:
        started = {p.pid: start_time(psutil.Process(p.pid)) for p in (child, other)}
        for pid, st in started.items():
            handles.add(pid, st)
        assert handles.ended(started) == []
        child.kill()
        poll_until(lambda: process_state(child.pid) == "zombie", 5)
        assert handles.ended(started) == [child.pid]  # not reaped yet: ended all the same
        assert handles.ended({other.pid: started[other.pid] + 100.0}) == []  # the pidfd knows its process
        handles.remove(other.pid)  # without its pidfd, /proc answers, and a wrong start time is another process
        assert handles.ended({other.pid: started[other.pid] + 100.0}) == [other.pid]
    finally:
        handles.close()
        for p in (child, other):
            p.kill()
            p.wait()


def test_a_zygote_that_exits_after_its_last_engine_is_not_that_engines_cause():
    """A replaced rank's engine set has one engine: once it is lost, its launcher lets the zygote go (exit 0).
    Seen in one look with the engine's death, the zygote's clean exit must not become the rank's cause."""
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zygote = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    statuses: dict[int, int] = {}
    announced: list[str] = []
    health = Health(announced.append, rank_of={engine.pid: 1}.get, exit_status=statuses.get,
                    respawn_reaper=lambda pid: None)
    info = EngineInfo(engine_id=1, pid=engine.pid, host=socket.gethostname(), addr="127.0.0.1", iface="lo")
    try:
        health.watch_engines([info], {engine.pid: (zygote.pid, None)})
        health.watch_pool({"zygote": [zygote.pid]})
        engine.kill()
        statuses[engine.pid] = engine.wait()
        assert zygote.stdin is not None
        zygote.stdin.close()
        statuses[zygote.pid] = zygote.wait()
        assert statuses == {engine.pid: -signal.SIGKILL, zygote.pid: 0}
        health.look()
        assert health.lost_cause(engine.pid) == "engine killed by SIGKILL", health.lost_cause(engine.pid)
        assert not [m for m in announced if "zygote" in m], announced
    finally:
        health.stop()
        for p in (engine, zygote):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_world_s_socket_folder_is_made_where_a_socket_path_fits(tmp_path, monkeypatch):
    """Under a long TMPDIR (a test runner's, a batch job's) a rank's stack socket in the world's folder would be
    too long a path for a Unix socket: that folder is then made in /tmp; other folders of pgnb's stay in TMPDIR."""
    import tempfile

    from pgnb._wire import stack_socket
    from pgnb.core.files import MAX_SOCKET_PATH, OwnedDir

    long_temp = tmp_path / ("t" * (MAX_SOCKET_PATH - len(str(tmp_path))))
    long_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_temp))
    sockets, files = OwnedDir(prefix="pgnb-stacks-", sockets=True), OwnedDir(prefix="pgnb-store-")
    try:
        assert os.path.dirname(files.path) == str(long_temp)
        assert os.path.dirname(sockets.path) == "/tmp" and os.stat(sockets.path).st_mode & 0o777 == 0o700
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(stack_socket(sockets.path, 4194304))  # the longest pid Linux gives
    finally:
        sockets.remove()
        files.remove()
    assert not os.path.exists(sockets.path)
    short_temp = tempfile.mkdtemp(dir="/tmp")  # a TMPDIR where sockets fit: it is used
    monkeypatch.setattr(tempfile, "tempdir", short_temp)
    try:
        short = OwnedDir(prefix="pgnb-stacks-", sockets=True)
        short.remove()
    finally:
        os.rmdir(short_temp)
    assert os.path.dirname(short.path) == short_temp
