"""Soak: many init/run/destroy and force/shutdown cycles on one kernel leak nothing (issue 7, item 6).

Slow (about 5-10 minutes on 2 cores): skipped unless ``--run-slow``; run it
with ``make soak``. The kernel gets its own ``TMPDIR`` and ``IPYTHONDIR``, so
"no leftover files" is checked exactly, whatever else runs on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import psutil
import pytest
from conftest import wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.kernel]

WORLD = 4
CYCLES = 100
FORCE_CYCLES = 20
WARM = 10  # cycles before the baseline of the kernel's memory, threads and open files
ALL_REDUCE = "%%pg\nt = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() == world_size\n"
#: open files that come and go on their own (IPython's history database journal, an eventfd)
FD_SLACK = 2


def _probe(kernel_pid):
    """What the kernel holds now: descendant processes, open fds, threads, resident memory."""
    time.sleep(0.3)  # let threads that are on their way out finish
    p = psutil.Process(kernel_pid)
    return {"processes": len(p.children(recursive=True)), "fds": p.num_fds(), "threads": p.num_threads(),
            "rss": p.memory_info().rss}


def _pgnb_files(tmpdir, ipythondir):
    """pgnb's temp dirs and everything in the profile's security folder."""
    sec = os.path.join(ipythondir, "profile_default", "security")
    return (sorted(f for f in os.listdir(tmpdir) if f.startswith("pgnb")),
            sorted(os.listdir(sec)) if os.path.isdir(sec) else [])


def _ok(k, code):
    ex = k.execute(code, timeout=300)
    assert ex.status == "ok", (code, ex.text())
    return ex


def test_soak_cycles_leak_nothing(record_property):
    """100 cycles of `%pg_init`, a `%%pg` `all_reduce` and `%pg_destroy`, then 20 of `%pg_init --force` and
    `%pg_shutdown`, on one kernel (world 4): no growth in the kernel's processes, open files or threads, no leftover
    files in pgnb's temp dirs or the profile's security folder, kernel memory within 10 % of what it was after the
    first ten cycles (the first ones import what the first cell, trace and view need).

    The kernel keeps every view it displayed (a notebook can show it again: ipywidgets' models live as
    long as their kernel), a few widgets per cycle, ~25 KB each; no Client, Cluster or socket is kept.
    """
    from kernel_util import Kernel

    tmpdir = tempfile.mkdtemp(prefix="soak-tmp-")
    ipythondir = tempfile.mkdtemp(prefix="soak-ipython-")
    k = Kernel(env={"TMPDIR": tmpdir, "IPYTHONDIR": ipythondir})
    stats = {}
    try:
        _ok(k, "%load_ext pgnb")
        t0 = time.monotonic()
        for i in range(CYCLES):
            _ok(k, f"%pg_init --world {WORLD}")
            _ok(k, ALL_REDUCE)
            _ok(k, "%pg_destroy")
            if i == 0:
                first_files = _pgnb_files(tmpdir, ipythondir)
            if i == WARM - 1:
                first = _probe(k.pid)
        last = _probe(k.pid)
        stats["cycle_s"] = round((time.monotonic() - t0) / CYCLES, 2)
        stats["rss_growth_cycles_pct"] = round(100 * (last["rss"] / first["rss"] - 1), 1)
        stats["after_first"], stats["after_last"] = first, last
        assert last["processes"] == first["processes"], stats
        assert last["fds"] <= first["fds"] + FD_SLACK, stats
        assert last["threads"] <= first["threads"], stats
        assert last["rss"] <= first["rss"] * 1.10, stats
        assert _pgnb_files(tmpdir, ipythondir) == first_files

        ex = _ok(k, "import pgnb, json; print(json.dumps(pgnb.current().pids))")
        engines = json.loads(ex.outputs[0]["text"])
        t0 = time.monotonic()
        for i in range(FORCE_CYCLES):
            _ok(k, f"%pg_init --world {WORLD} --force")
            _ok(k, "%pg_shutdown")
            probe = _probe(k.pid)
            assert probe["processes"] == 0, (i, probe)
            assert _pgnb_files(tmpdir, ipythondir) == ([], []), i
            if i == 0:
                first_down = probe
        assert wait_gone(engines) == []
        down = _probe(k.pid)
        stats["force_cycle_s"] = round((time.monotonic() - t0) / FORCE_CYCLES, 2)
        stats["rss_growth_all_pct"] = round(100 * (down["rss"] / first["rss"] - 1), 1)
        stats["after_first_shutdown"], stats["after_last_shutdown"] = first_down, down
        assert down["fds"] <= first_down["fds"] + FD_SLACK, stats
        assert down["threads"] <= first_down["threads"], stats
        assert down["rss"] <= first["rss"] * 1.10, stats
        # what the 120 worlds left in the kernel's Python heap: at most the last Client and Cluster
        ex = _ok(k, "import gc, json, ipyparallel as ipp; gc.collect(); objs = gc.get_objects(); "
                    "print(json.dumps([sum(isinstance(o, t) for o in objs) for t in (ipp.Client, ipp.Cluster)]))")
        stats["clients_clusters_kept"] = json.loads(ex.outputs[0]["text"])
        assert max(stats["clients_clusters_kept"]) <= 1, stats
    finally:
        for key, value in stats.items():
            record_property(key, value)
        print(json.dumps(stats, indent=1))
        k.shutdown()
        shutil.rmtree(tmpdir, ignore_errors=True)
        shutil.rmtree(ipythondir, ignore_errors=True)
