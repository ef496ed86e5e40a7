"""``--launcher ssh`` for real: sshd in two test hosts, a key the test makes, a world of 4 across them.

The test hosts are network namespaces on a bridge (``netns_util``), each with its own host name
(a UTS namespace: ``host2``/``host3``, so pgnb sees them as other machines) and its own sshd,
listening on the namespace's address only, accepting only the key this test made. The profile is
the one docs/scaling_out.md shows (``ssh_profile``): ipyparallel's SSH launcher reaches the hosts by
name through an ssh config file (``-F``), sends the connection file and starts two engines on each;
the controller listens on the bridge address. The hosts share this machine's filesystem, so the
venv's python is at the same path there. No traffic goes to any address but these and loopback.

Skips with one line where it cannot run (not root, no sshd); as root under ``make test``
(``PGNB_REQUIRE_SSH=1``) a missing sshd fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest
from conftest import left_in
from kernel_util import Kernel
from netns_util import Network, made, namespace_of

pytestmark = [pytest.mark.integration, pytest.mark.netns]

SSHD = "/usr/sbin/sshd"
NETWORK = Network(bridge="pgnbbr1", host_addr="198.18.1.1",
                  hosts={"pgnbss2": "198.18.1.2", "pgnbss3": "198.18.1.3"}, veth_prefix="pgnbw")
#: host name (as the profile and ssh config say it) -> namespace
NAMES = {"host2": "pgnbss2", "host3": "pgnbss3"}


def ssh_profile(controller_ip: str, ssh_config: str, python: str) -> str:
    """The ``ipcluster_config.py`` docs/scaling_out.md shows for ``--launcher ssh``, with these values."""
    return (
        "c = get_config()\n"
        f"c.Cluster.controller_ip = {controller_ip!r}  # listen beyond loopback: the opt-in\n"
        "c.SSHEngineSetLauncher.engines = {'host2': 2, 'host3': 2}\n"
        f"c.SSHEngineSetLauncher.remote_python = {python!r}\n"
        f"c.SSHEngineSetLauncher.ssh_args = ['-F', {ssh_config!r}]\n"
        f"c.SSHEngineSetLauncher.scp_args = ['-F', {ssh_config!r}]\n"
    )


def _unavailable(reason: str) -> None:
    if os.environ.get("PGNB_REQUIRE_SSH") == "1":
        pytest.fail(f"{reason} (PGNB_REQUIRE_SSH=1)")
    pytest.skip(reason)


def _wait_listening(addr: str, proc: subprocess.Popen[bytes], log: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"sshd on {addr} exited: {open(log).read()}"
        try:
            socket.create_connection((addr, 22), timeout=0.5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"sshd on {addr} is not listening: {open(log).read()}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    """sshd in each test host; yields the folder with the ssh config and the sshd pids by namespace."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces and run sshd")
    if not os.path.exists(SSHD) or not shutil.which("ssh") or not shutil.which("scp"):
        _unavailable("needs openssh-server and openssh-client (apt-get install openssh-server openssh-client)")
    d = tmp_path_factory.mktemp("ssh")
    for key in ("id", "host_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True, timeout=10)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    with made(NETWORK) as net:
        sshd: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, ns in NAMES.items():
                addr = net.hosts[ns]
                (d / f"sshd-{name}.conf").write_text(
                    f"ListenAddress {addr}\nHostKey {d / 'host_key'}\nPidFile {d / f'sshd-{name}.pid'}\n"
                    f"AuthorizedKeysFile {d / 'id.pub'}\nPermitRootLogin prohibit-password\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                    "Subsystem sftp internal-sftp\n")
                log = str(d / f"sshd-{name}.log")
                # its own host name, so its engines are another machine's to pgnb; exec: the pid is sshd's
                sshd[ns] = subprocess.Popen(
                    ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                     f"hostname {name} && exec {SSHD} -D -e -f {d / f'sshd-{name}.conf'}"],
                    stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
                _wait_listening(addr, sshd[ns], log)
            (d / "ssh_config").write_text("".join(
                f"Host {name}\n  HostName {net.hosts[ns]}\n  IdentityFile {d / 'id'}\n  IdentitiesOnly yes\n"
                "  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  LogLevel ERROR\n"
                for name, ns in NAMES.items()))
            yield {"dir": d, "sshd": {ns: p.pid for ns, p in sshd.items()}}
        finally:
            for p in sshd.values():
                p.terminate()
            for p in sshd.values():
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def on_hosts(sshd: dict[str, int]) -> dict[str, list[str]]:
    """What runs in each test host besides its sshd listener: ``namespace -> ["pid cmdline", ...]``."""
    out: dict[str, list[str]] = {ns: [] for ns in sshd}
    for p in psutil.process_iter(["pid", "cmdline"]):
        ns = namespace_of(p.info["pid"])
        if ns in out and p.info["pid"] != sshd[ns]:
            out[ns].append(f"{p.info['pid']} {' '.join(p.info['cmdline'] or [])}")
    return out


def wait_hosts_empty(sshd: dict[str, int], timeout: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while any((left := on_hosts(sshd)).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


CELL = """\
import json, os, socket, torch, torch.distributed as dist
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(json.dumps({"rank": dist.get_rank(), "host": socket.gethostname(), "master": os.environ["MASTER_ADDR"],
                  "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "sum": t.tolist()}))
"""


def test_ssh_world_across_two_hosts_and_kernel_kill(ssh_hosts, tmp_path):
    """The documented profile, a real kernel: world 4 over ssh, one all_reduce; SIGKILL leaves nothing."""
    ipython_dir = tmp_path / "ipython"
    (ipython_dir / "profile_default").mkdir(parents=True)
    (ipython_dir / "profile_default" / "ipcluster_config.py").write_text(
        ssh_profile(NETWORK.host_addr, str(ssh_hosts["dir"] / "ssh_config"), sys.executable))
    sshd = ssh_hosts["sshd"]
    t0 = time.monotonic()
    notebook_dir = tmp_path / "notebook"
    notebook_dir.mkdir()
    kernel = Kernel(env={"IPYTHONDIR": str(ipython_dir)}, cwd=str(notebook_dir))
    try:
        assert kernel.execute("%load_ext pgnb").status == "ok"
        init = kernel.execute("%pg_init --launcher ssh --backend gloo --world 4", timeout=120)
        assert init.status == "ok", init.text()
        started = time.monotonic() - t0
        run = kernel.execute("%%pg\n" + CELL, timeout=60)
        assert run.status == "ok", run.text()
        facts = [json.loads(line) for o in run.outputs if o["type"] == "stream" and o["name"] == "stdout"
                 for line in o["text"].splitlines() if line.startswith("{")]
        assert sorted(f["rank"] for f in facts) == [0, 1, 2, 3], run.text()
        assert [f["sum"] for f in facts] == [[10.0, 10.0]] * 4
        assert sorted(f["host"] for f in facts) == ["host2", "host2", "host3", "host3"]
        rank0 = next(f for f in facts if f["rank"] == 0)
        # rank 0's namespace address, which the other host reaches; never loopback
        assert {f["master"] for f in facts} == {NETWORK.hosts[NAMES[rank0["host"]]]}
        assert {f["ifname"] for f in facts} == {"eth0"}
        running = on_hosts(sshd)
        assert all(len(v) >= 2 for v in running.values()), running  # two engines on each host (and nannies)
    except BaseException:
        kernel.shutdown()
        raise
    t1 = time.monotonic()
    kernel.kill()
    left = wait_hosts_empty(sshd, timeout=20)
    gone = time.monotonic() - t1
    print(f"ssh world of 4 up in {started:.1f} s; hosts empty {gone:.1f} s after SIGKILL")
    assert left == {ns: [] for ns in sshd}, f"left running on the test hosts after the kernel's SIGKILL: {left}"
    assert left_in(notebook_dir) == []  # the reaper, which started there, wrote nothing there


def test_remote_engines_die_through_their_launcher_and_nannies_and_stop_quietly(ssh_hosts, tmp_path, monkeypatch,
                                                                                capfd):
    """One world of 4 in this process, whose parts the test reaches. Engines on other hosts, whose pids and
    tokens this machine cannot see: a stuck one is stopped through its nanny and its rank is lost; the
    reaper's ``kill_launched`` (run as the reaper runs it, in a process of its own) empties both hosts;
    then the shutdown of that world of dead engines writes nothing to stderr (ssh would hand it the
    remote ``ProcessLookupError`` of each signal to a dead engine; a notebook shows stderr)."""
    import pgnb
    from pgnb.core.sandbox import dispatch_of

    ipython_dir = tmp_path / "ipython"
    (ipython_dir / "profile_default").mkdir(parents=True)
    (ipython_dir / "profile_default" / "ipcluster_config.py").write_text(
        ssh_profile(NETWORK.host_addr, str(ssh_hosts["dir"] / "ssh_config"), sys.executable)
    )
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    sshd = ssh_hosts["sshd"]
    sb = pgnb.Sandbox(launcher="ssh", world=4, timeout=60)
    try:
        sb.start()
        world, hosting = sb._world, sb._world.hosting
        assert hosting is not None
        ranks = list(world._ranks)
        assert sorted(e.host for e in ranks) == ["host2", "host2", "host3", "host3"]
        stuck = ranks[3]
        hosting.stop_stuck([stuck], world._health, lost_as="engine stopped (stuck)")
        deadline = time.monotonic() + 10
        while psutil.pid_exists(stuck.pid) and time.monotonic() < deadline:  # one pid space here: seen
            time.sleep(0.1)
        assert not psutil.pid_exists(stuck.pid)
        assert dispatch_of(sb).lost_ranks() == {3: "engine stopped (stuck)"}
        cluster_file = str(hosting.pool.cluster.cluster_file)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import sys; from pgnb.procs.reaper import kill_launched; "
                        "kill_launched(sys.argv[1])", cluster_file], check=True, timeout=60)
        took = time.monotonic() - t0
        left = wait_hosts_empty(sshd, timeout=10)
        emptied = time.monotonic() - t0
        assert left == {ns: [] for ns in sshd}, f"left running on the test hosts: {left}"
        capfd.readouterr()
    finally:
        t1 = time.monotonic()
        sb.shutdown()
        stopped = time.monotonic() - t1
    err = capfd.readouterr().err
    with capfd.disabled():
        print(f"kill_launched took {took:.1f} s, hosts empty {emptied:.1f} s after it began; "
              f"shutdown of the dead world {stopped:.1f} s")
    assert err == "", err


def test_docs_show_the_profile_this_test_runs():
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "scaling_out.md")).read()
    shown = ssh_profile("198.18.0.1", "/home/me/.ssh/pgnb_config", "/opt/venv/bin/python")
    assert shown in docs, shown
