"""Multi-host rendezvous on one machine: engines in network namespaces the test creates.

Two test hosts (namespaces ``pgnbns2``/``pgnbns3``, addresses 198.18.0.2/.3 from the
benchmarking range, on a bridge the test makes with 198.18.0.1 on the host side), two
engines in each, a controller listening on the bridge address. pgnb attaches to that
cluster and must pick rank 0's *namespace* address as MASTER_ADDR, not 127.0.0.1: a
rank in the other namespace cannot reach the first one's loopback. No traffic goes to
any address but these and loopback; everything is removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from conftest import wait_gone
from netns_util import Network, made

import pgnb
from pgnb.core.sandbox import dispatch_of

pytestmark = [pytest.mark.integration, pytest.mark.netns]

NETWORK = Network(bridge="pgnbbr0", host_addr="198.18.0.1",
                      hosts={"pgnbns2": "198.18.0.2", "pgnbns3": "198.18.0.3"}, veth_prefix="pgnbv")
HOST_ADDR, HOSTS = NETWORK.host_addr, NETWORK.hosts


@pytest.fixture(scope="module")
def test_hosts():
    with made(NETWORK) as net:
        yield net.hosts


@pytest.fixture(scope="module")
def multi_host_cluster(test_hosts, tmp_path_factory):
    """A controller on the bridge address and two engines inside each test host."""
    cluster_id = f"netns-{uuid.uuid4().hex[:6]}"
    profile = "pgnbnetns"
    ipython_dir = os.environ["IPYTHONDIR"]
    logs = tmp_path_factory.mktemp("netns-logs")
    procs = []

    def start(cmd, name):
        log = open(logs / f"{name}.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    start([sys.executable, "-m", "ipyparallel.controller", f"--profile={profile}", f"--cluster-id={cluster_id}",
           f"--ip={HOST_ADDR}", "--HeartMonitor.period=500", "--log-level=WARN"], "controller")
    engine_file = os.path.join(ipython_dir, f"profile_{profile}", "security",
                               f"ipcontroller-{cluster_id}-engine.json")
    client_file = engine_file.replace("-engine.json", "-client.json")
    deadline = time.monotonic() + 60
    while not (os.path.exists(engine_file) and os.path.exists(client_file)):
        assert procs[0].poll() is None, (logs / "controller.log").read_text()
        assert time.monotonic() < deadline, "controller did not write its connection files"
        time.sleep(0.1)
    assert json.load(open(engine_file))["interface"] == f"tcp://{HOST_ADDR}"
    for ns in test_hosts:
        for k in range(2):
            start(["ip", "netns", "exec", ns, sys.executable, "-m", "ipyparallel.engine",
                   f"--file={engine_file}", "--log-level=WARN"], f"engine-{ns}-{k}")
    yield {"profile": profile, "cluster_id": cluster_id, "pids": [p.pid for p in procs]}
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _where() -> tuple[int, str, str, str, list[float]]:
    import os
    import socket

    import torch
    import torch.distributed as dist

    t = torch.ones(2) * dist.get_rank()
    dist.all_reduce(t)
    return (dist.get_rank(), os.environ["MASTER_ADDR"], os.environ.get("GLOO_SOCKET_IFNAME", ""),
            socket.gethostname(), t.tolist())


def test_world_across_two_test_hosts(multi_host_cluster):
    sb = pgnb.Sandbox(backend="gloo", world=4, profile=multi_host_cluster["profile"],
                      cluster_id=multi_host_cluster["cluster_id"], timeout=60)
    try:
        sb.start()
        rows = sb.status()
        assert [r.state for r in rows] == ["initialized"] * 4
        facts = sb.run(_where)
        masters = {f[1] for f in facts}
        # rank 0's address as the other ranks reach it: its namespace address, never loopback
        assert len(masters) == 1 and masters.pop() in HOSTS.values()
        assert {f[2] for f in facts} == {"eth0"}  # gloo on the route to the controller
        assert [f[4] for f in facts] == [[6.0, 6.0]] * 4
        addrs = {e.addr for e in dispatch_of(sb).rank_infos}
        assert addrs == set(HOSTS.values())  # the world really spans both test hosts
    finally:
        sb.shutdown()
    # attached: pgnb stopped nothing it did not start
    assert wait_gone(multi_host_cluster["pids"], timeout=0.5) == multi_host_cluster["pids"]
