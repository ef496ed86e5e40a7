"""Run one case of ``benchmarks/_cases.py`` in a fresh interpreter and a fresh temporary IPYTHONDIR."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from benchmarks.resolver import ISOLATED_NET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE_TIMEOUT = 600.0
#: Cases that take longer: torch's own spawning runs benchmarks/dist_suite at ~5-15 s a test on 2 cores
LONG_CASES = {"torch_suite": 1800.0, "torch_distributed": 10800.0, "torch_continuous": 1800.0, "torch_unseen": 1800.0}


def run_case(name: str, isolated_net: bool = False, **kwargs: Any) -> dict[str, Any]:
    """One case in a fresh interpreter and IPYTHONDIR; whatever it leaves behind is killed by pid.

    ``isolated_net``: in a network namespace with only loopback (``benchmarks/resolver.py``).
    """
    ipython_dir = tempfile.mkdtemp(prefix="pgnb-bench-ipython-")
    fd, out_path = tempfile.mkstemp(prefix="pgnb-bench-", suffix=".json")
    os.close(fd)
    env = dict(os.environ, IPYTHONDIR=ipython_dir, PGNB_BENCH_QUIET="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    prefix = ISOLATED_NET if isolated_net else []
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "benchmarks._cases", name, out_path, json.dumps(kwargs)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timeout = LONG_CASES.get(name, CASE_TIMEOUT)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        output, _ = proc.communicate()
        raise RuntimeError(f"case {name} {kwargs} ran past {timeout:g} s:\n{output[-3000:]}") from None
    finally:
        shutil.rmtree(ipython_dir, ignore_errors=True)
    try:
        if proc.returncode != 0:
            raise RuntimeError(f"case {name} {kwargs} failed ({proc.returncode}):\n{output[-3000:]}")
        with open(out_path) as f:
            result: dict[str, Any] = json.load(f)
    finally:
        os.remove(out_path)
    result["_load"] = load
    result["_wall"] = time.perf_counter() - t0
    return result


def _kill_tree(pid: int) -> None:
    """Kill a case and every process under it (only what this runner started)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)
