"""Test hosts on this machine: network namespaces on a bridge the test makes, removed afterwards.

Each host is a namespace with one address from the benchmarking range (198.18.0.0/15) on a
veth pair into a bridge that has the host side's address. Nothing is routed anywhere else, so
traffic goes only to these addresses and loopback. Each test module makes a network of its own
(its own names and subnet): two modules on two pytest-xdist workers never share one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Network:
    """Names and addresses of one network: ``hosts`` maps namespace name -> its address."""

    bridge: str
    host_addr: str
    hosts: dict[str, str]
    veth_prefix: str

    def veths(self) -> list[str]:
        return [f"{self.veth_prefix}{i}" for i in range(len(self.hosts))]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def remove(net: Network) -> None:
    for ns in net.hosts:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    subprocess.run(["ip", "link", "del", net.bridge], capture_output=True, timeout=10)
    for veth in net.veths():
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=10)


def _make(net: Network) -> None:
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("addr", "add", f"{net.host_addr}/24", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")
    for veth, (ns, addr) in zip(net.veths(), net.hosts.items(), strict=True):
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", net.bridge, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")


@contextlib.contextmanager
def made(net: Network) -> Iterator[Network]:
    """Make ``net`` (skipping the test where that cannot be done), yield it, remove it."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 to create network namespaces")
    remove(net)  # leftovers of an interrupted run
    try:
        _make(net)
    except (subprocess.CalledProcessError, OSError) as e:
        remove(net)
        pytest.skip(f"cannot create network namespaces here: {getattr(e, 'stderr', b'')!r}")
    try:
        yield net
    finally:
        remove(net)


def namespace_of(pid: int) -> str | None:
    """The network namespace (``ip netns`` name) process ``pid`` runs in, or None (the host's, or gone)."""
    try:
        ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        with contextlib.suppress(OSError):
            if os.stat(os.path.join("/run/netns", name)).st_ino == ino:
                return name
    return None
