"""One benchmark case, run in a fresh Python process: ``python -m benchmarks._cases CASE OUT.json [ARGS.json]``.

Every case starts from nothing (a fresh interpreter, a fresh temporary
IPYTHONDIR that the runner made), measures, stops what it started, checks
that every process it started is gone, and writes one JSON object to OUT.
pgnb is always driven through its real magics in an IPython
``InteractiveShell`` with ``%load_ext pgnb`` done before the clock starts;
the plain-ipyparallel cases are the script a user would write by hand.

Cases (see ``CASES``):

- ``pgnb_cold``: ``%pg_init --world N --launcher L`` from nothing, then ``%pg_shutdown``.
- ``plain_cold``: ``ipp.Cluster(n=N)`` with defaults, ``import torch``, concurrent
  ``init_process_group``, memory of its engines, then ``stop_cluster_sync()``.
- ``session``: one pgnb world of 4 for the warm rows: ``%%pg`` vs ``%%px``,
  all_reduce in ``%%pg`` vs torchrun, memory per rank, re-init, shutdown.
- ``scale``: one world of N ranks: cold init, re-init, a trivial and a printing cell (each beside
  ``%%px``), ``%pg_status``, ``%pg_show``, a traced all_reduce, memory, shutdown, nothing left.
- ``live``: live ``%%pg`` in a real Jupyter kernel: print-to-send latency, a print flood vs
  ``%%px --stream``, a trivial cell vs ``%%px``, a compute-only loop watched vs not.
- ``world_marker``: ``@pytest.mark.world(4)`` tests on a warm world: a trivial test's time, a hang's cost, and
  the test after it (``benchmarks/world_marker.py``).
- ``slurm_cold``: ``%pg_init --launcher slurm --world 4`` beside ``--launcher fork`` on the tests' one-node Slurm
  cluster, interleaved (``benchmarks/slurm_cold.py``; skipped, in one line, where no cluster can be started).
- ``torch_suite``: benchmarks/dist_suite (torch ``MultiProcessTestCase`` tests) under plain pytest
  (torch spawns processes per test) and under ``pytest --pgnb-torch`` (``benchmarks/torch_suite.py``).
- ``torch_distributed``, ``torch_continuous``: torch's ``DistributedTest`` suite under torch's spawning, and
  ``MultiProcContinuousTest`` classes under torch's continuous harness, each beside ``pytest --pgnb-torch``
  (``benchmarks/torch_harnesses.py``).
- ``torch_forked_init``: plain torch's ``init_process_group`` on N forked ranks, no pgnb: the resolver's share of a
  big world's start (``benchmarks/resolver.py``; run with and without a DNS server to ask).
- ``inner_loop``: one test of torch's ``DistributedTest`` suite from the command line: torch's spawning,
  ``--pgnb-torch`` cold, and ``--pgnb-keep``'s first and second runs (``benchmarks/inner_loop.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

if __package__ in (None, ""):  # `python benchmarks/_cases.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import baselines
from benchmarks.inner_loop import inner_loop
from benchmarks.resolver import torch_forked_init
from benchmarks.slurm_cold import slurm_cold
from benchmarks.torch_harnesses import torch_continuous, torch_distributed, torch_unseen
from benchmarks.torch_suite import torch_suite
from benchmarks.world_marker import world_marker

#: The all_reduce loop, the same code under torchrun and inside ``%%pg``: ``repeats`` blocks of
#: ``iters`` timed ops after ``warmup`` unmeasured ones; each block's time is the slowest rank's.
ALLREDUCE_SOURCE = '''
def _pgnb_bench_allreduce(numel, iters, warmup, repeats):
    import time
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    t = torch.ones(numel, dtype=torch.float32)
    dist.all_reduce(t)
    assert t[0].item() == world and t[-1].item() == world, "all_reduce gave a wrong sum"
    t.zero_()  # zeros keep the values finite however many iterations run
    for _ in range(warmup):
        dist.all_reduce(t)
    blocks = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank defines the op
        blocks.append(elapsed.item() / iters)
    return blocks
'''

TORCHRUN_SCRIPT = ALLREDUCE_SOURCE + '''
import json
import sys

import torch.distributed as dist

dist.init_process_group(backend="gloo")
out = {}
for numel, iters, warmup, repeats in json.loads(sys.argv[1]):
    out[str(numel)] = _pgnb_bench_allreduce(numel, iters, warmup, repeats)
if dist.get_rank() == 0:
    print("PGNB_RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
'''


# --------------------------------------------------------------------------- helpers


def _shell() -> Any:
    """An IPython shell with pgnb loaded (no history database in the temporary IPYTHONDIR)."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "pgnb")
    return ip


@contextlib.contextmanager
def _captured() -> Iterator[Any]:
    """Keep the magics' displays and prints out of the case's own output."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        yield cap


def _magic(ip: Any, name: str, line: str = "", cell: str | None = None) -> float:
    """Run a magic, raise if it failed, return its wall-clock seconds."""
    with _captured():
        t0 = time.perf_counter()
        if cell is None:
            ip.run_line_magic(name, line)
        else:
            ip.run_cell_magic(name, line, cell)
        return time.perf_counter() - t0


def _check_initialized(world: int) -> Any:
    import pgnb

    sb = pgnb.current()
    snap = sb.snapshot()
    states = [r.state for r in snap.ranks]
    if snap.phase != "initialized" or states != ["initialized"] * world:
        raise RuntimeError(f"world not initialized: phase {snap.phase!r}, states {states}, {snap.message}")
    return sb


def _memory(pid: int) -> dict[str, int]:
    try:
        m = psutil.Process(pid).memory_full_info()
    except psutil.NoSuchProcess:
        return {"uss": 0, "pss": 0, "rss": 0}
    return {"uss": int(m.uss), "pss": int(m.pss), "rss": int(m.rss)}


def _memory_report(engines: list[int], nannies: list[int], others: list[int]) -> dict[str, Any]:
    """Per-rank memory: the engine's own USS/PSS, and the whole world's PSS divided by the ranks.

    ``others`` are the processes that exist only to make the engines (the zygote): their
    PSS is the ranks' cost too, so ``world_pss_per_rank`` counts it.
    """
    eng = [_memory(p) for p in engines]
    nan = [_memory(p) for p in nannies]
    oth = [_memory(p) for p in others]
    n = len(engines)
    return {
        "engine_uss_mb": statistics.median(m["uss"] for m in eng) / 2**20,
        "engine_pss_mb": statistics.median(m["pss"] for m in eng) / 2**20,
        "engine_rss_mb": statistics.median(m["rss"] for m in eng) / 2**20,
        "nanny_uss_mb": statistics.median(m["uss"] for m in nan) / 2**20 if nan else 0.0,
        "rank_uss_mb": (sum(m["uss"] for m in eng + nan)) / n / 2**20,
        "world_pss_per_rank_mb": sum(m["pss"] for m in eng + nan + oth) / n / 2**20,
        "helper_uss_mb": sum(m["uss"] for m in oth) / 2**20,
        "ranks": n,
    }


def _alive(pids: list[int]) -> list[int]:
    return sorted(baselines._alive(set(pids)))


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def _pgnb_processes(sb: Any) -> tuple[list[int], list[int], list[int]]:
    """(engine pids in rank order, nanny pids, zygote pids) of a pgnb world.

    A nanny is its engine's child (``local``) or the zygote's child that is not an engine (``fork``).
    """
    engines = [r.pid for r in sb.snapshot().ranks]
    nannies = [c for pid in engines for c in _children(pid)]
    zygotes = []
    cluster = sb.cluster
    for es in (cluster.engines.values() if cluster else []):
        if getattr(es, "zygote_pid", -1) > 0:
            zygotes.append(es.zygote_pid)
            nannies += [c for c in _children(es.zygote_pid) if c not in engines]
    return engines, nannies, zygotes


def _shutdown_timed(ip: Any, sb: Any) -> dict[str, float]:
    """``%pg_shutdown``; then how long until every process of the world had exited."""
    pids = list(sb.pids)
    started = set(pids) | {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.perf_counter()
    stop = _magic(ip, "pg_shutdown")
    waited, killed = baselines._wait_gone(started)
    return {"stop": stop, "all_exited": time.perf_counter() - t0, "killed": float(killed)}


# --------------------------------------------------------------------------- cases


def pgnb_cold(world: int = 4, launcher: str = "fork", overlap: bool = True, heartbeat_ms: int = 0) -> dict[str, Any]:
    """``%pg_init --world N`` with nothing running, to all ranks initialized and the view final.

    ``overlap=False`` starts the engines only once the controller has written its connection
    files (pgnb before it overlapped them); ``heartbeat_ms`` overrides pgnb's heartbeat period.
    Both exist to measure what they change (``benchmarks/profile_init.py``).
    """
    import pgnb.core.cluster

    if not overlap:
        pgnb.core.cluster.LOCAL_LAUNCHERS = ()
    if heartbeat_ms:
        pgnb.core.cluster.HEARTBEAT_MS = heartbeat_ms
    ip = _shell()
    _trace_phases()
    line = f"--backend gloo --world {world} --launcher {launcher}"
    t0 = time.perf_counter()
    init = _magic(ip, "pg_init", line)
    sb = _check_initialized(world)
    out: dict[str, Any] = {"init": init, "phases": _phases(t0)}
    out.update(_shutdown_timed(ip, sb))
    return out


_TRACE: list[tuple[float, str, int]] = []


def _trace_phases() -> None:
    """Record when the world enters each phase (what its views are told), to split the init time."""
    from pgnb.core.world import World

    publish = World._publish

    def traced(self: Any, **changes: Any) -> None:
        publish(self, **changes)
        snap = self._snapshot
        if not _TRACE or (_TRACE[-1][1], _TRACE[-1][2]) != (snap.phase, snap.engines_up):
            _TRACE.append((time.perf_counter(), snap.phase, snap.engines_up))

    World._publish = traced


def _phases(t0: float) -> dict[str, float]:
    """Seconds from ``t0`` to the first time each phase (or engine count) was published."""
    out: dict[str, float] = {}
    for t, phase, up in _TRACE:
        key = f"{phase} ({up} up)" if phase == "starting engines" else phase
        out.setdefault(key, round(t - t0, 4))
    _TRACE.clear()
    return out


def plain_cold(n: int = 4) -> dict[str, Any]:
    """The plain script: ``Cluster(n)`` defaults, import torch, concurrent init; its memory; its stop."""
    import ipyparallel as ipp

    def pids() -> tuple[int, int]:
        import os

        import psutil

        kids = [c.pid for c in psutil.Process().children()]
        return os.getpid(), (kids[0] if kids else 0)

    before = baselines._descendants()
    cluster = client = None
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        cluster = ipp.Cluster(n=n)
        with _captured():
            client = cluster.start_and_connect_sync()
        t1 = time.perf_counter()
        client[:].execute("import torch", block=True)
        t2 = time.perf_counter()
        baselines._init_all(client)
        t3 = time.perf_counter()
        out.update(init=t3 - t0, phases={"engines_up": t1 - t0, "torch_imported": t2 - t1, "initialized": t3 - t2})
        procs = client[:].apply_sync(pids)  # each engine's pid and its nanny's (the engine's child)
        out["memory"] = _memory_report([e for e, _ in procs], [nn for _, nn in procs if nn], [])
    finally:
        started = baselines._descendants() - before
        if client is not None:
            client.close()
        ts = time.perf_counter()
        if cluster is not None:
            with _captured():
                cluster.stop_cluster_sync()
        out["stop"] = time.perf_counter() - ts
        waited, killed = baselines._wait_gone(started)
        out["all_exited"] = out["stop"] + waited
        out["killed"] = float(killed)
        baselines._reap_children()
    return out


def session(
    world: int = 4,
    cell_repeats: int = 50,
    sizes: list[list[int]] | None = None,
    reinit_cycles: int = 3,
    rounds: int = 2,
) -> dict[str, Any]:
    """The warm rows, on one pgnb world (fork launcher) in one shell."""
    import pgnb

    sizes = sizes or [[1 << 20, 40, 5, 5], [1 << 24, 5, 2, 3]]
    ip = _shell()
    out: dict[str, Any] = {"world": world}
    base = f"--backend gloo --world {world}"
    out["cold_init"] = _magic(ip, "pg_init", base)
    sb = _check_initialized(world)

    # -- memory per rank: the engines have torch imported and the group initialized
    engines, nannies, zygotes = _pgnb_processes(sb)
    out["memory"] = _memory_report(engines, nannies, zygotes)

    # -- %%pg vs %%px, alternating, on exactly the engines that are the ranks
    view = sb.client[sb.engine_ids]
    view.block = True
    view.activate()
    samples: dict[str, list[float]] = {"pg": [], "px": []}
    for i in range(5 + cell_repeats):
        for name in ("pg", "px"):
            dt = _magic(ip, name, "", "x = 1")
            if i >= 5:
                samples[name].append(dt)
    out["cell"] = {k: {"median": statistics.median(v), "samples": len(v)} for k, v in samples.items()}

    # -- all_reduce inside %%pg vs torchrun, alternating rounds
    _magic(ip, "pg", "", ALLREDUCE_SOURCE)
    spec_json = json.dumps(sizes)
    ar: dict[str, dict[str, list[float]]] = {"pg": {}, "torchrun": {}}
    cell_wall: dict[str, list[float]] = {}
    for _ in range(rounds):
        for numel, iters, warmup, repeats in sizes:
            code = f"_pgnb_bench_allreduce({numel}, {iters}, {warmup}, {repeats})"
            t0 = time.perf_counter()
            _magic(ip, "pg", "", code)
            wall = time.perf_counter() - t0
            blocks = ip.user_ns["_pg"][0]
            ar["pg"].setdefault(str(numel), []).extend(blocks)
            cell_wall.setdefault(str(numel), []).append(wall)
        for numel, blocks in _torchrun(world, spec_json).items():
            ar["torchrun"].setdefault(numel, []).extend(blocks)
    out["allreduce"] = {
        who: {numel: {"seconds_per_op": statistics.median(b), "blocks": len(b)} for numel, b in d.items()}
        for who, d in ar.items()
    }
    out["allreduce_cell_wall"] = {k: statistics.median(v) for k, v in cell_wall.items()}

    # -- re-init on live engines: another init method, another world size, and back
    steps = [
        ("pg_init", f"{base} --init-method tcp"),
        ("pg_init", f"{base} --init-method file"),
        ("pg_destroy", ""),
        ("pg_init", f"{base} --init-method env"),
        ("pg_init", "--backend gloo --world 2"),
        ("pg_init", f"{base}"),
    ]
    reinit: list[float] = []
    destroy: list[float] = []
    for _ in range(reinit_cycles):
        for name, line in steps:
            dt = _magic(ip, name, line)
            (reinit if name == "pg_init" else destroy).append(dt)
            if name == "pg_init":
                _check_initialized(pgnb.current().spec.world)
    out["reinit"] = {"median": statistics.median(reinit), "max": max(reinit), "samples": len(reinit),
                     "all": [round(x, 4) for x in reinit]}
    out["destroy"] = {"median": statistics.median(destroy), "samples": len(destroy)}
    out.update(shutdown=_shutdown_timed(ip, sb))
    return out


def _torchrun(nproc: int, spec_json: str) -> dict[str, list[float]]:
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pgnb-bench-torchrun-") as tmp:
        script = os.path.join(tmp, "allreduce.py")
        with open(script, "w") as f:
            f.write(TORCHRUN_SCRIPT)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(baselines._free_port()), script, spec_json]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=tmp, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    lines = [ln for ln in text.splitlines() if ln.startswith("PGNB_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{text[-3000:]}")
    return dict(json.loads(lines[-1].split(" ", 1)[1]))


SCALE_ALLREDUCE = ("t = torch.ones(1024) * (rank + 1)\n"
                   "dist.all_reduce(t)\n"
                   "t[0].item() == t[-1].item() == world_size * (world_size + 1) // 2")
#: What the scale case times at each world size: a magic, its line and cell; the cells with a ``%%px`` twin
#: alternate with it on the same engines.
SCALE_CELLS = {"trivial": "x = 1", "print": "print(f'rank {rank} says hello')"}


def scale(world: int = 32, cells: int = 20, queries: int = 5) -> dict[str, Any]:
    """One world of ``world`` ranks (oversubscribed on a small machine): what each step costs at that size.

    Cold init, an all_reduce checked on every rank, re-init on the live engines, a trivial cell and a
    cell printing one line per rank (each alternating with ``%%px`` on the same engines), ``%pg_status``,
    ``%pg_show`` of a 1k-float tensor, a traced all_reduce cell, memory per rank, ``%pg_shutdown``
    with nothing left.
    """
    import pgnb

    ip = _shell()
    _trace_phases()
    base = f"--backend gloo --world {world} --timeout 300"
    t0 = time.perf_counter()
    init = _magic(ip, "pg_init", base)
    sb = _check_initialized(world)
    out: dict[str, Any] = {"world": world, "init": init, "phases": _phases(t0)}
    engines, nannies, zygotes = _pgnb_processes(sb)
    out["memory"] = _memory_report(engines, nannies, zygotes)
    out["allreduce_cell"] = _magic(ip, "pg", "", SCALE_ALLREDUCE)
    out["allreduce_correct"] = ip.user_ns["_pg"] == [True] * world
    reinit = []
    for method in ("tcp", "env"):
        reinit.append(_magic(ip, "pg_init", f"{base} --init-method {method}"))
        _check_initialized(world)
    out["reinit"] = statistics.median(reinit)
    sb = pgnb.current()
    view = sb.client[sb.engine_ids]
    view.block = True
    view.activate()
    for name, code in SCALE_CELLS.items():
        samples: dict[str, list[float]] = {"pg": [], "px": []}
        for i in range(2 + cells):
            for magic in ("pg", "px"):
                dt = _magic(ip, magic, "", code)
                if i >= 2:
                    samples[magic].append(dt)
        out[name] = {k: statistics.median(v) for k, v in samples.items()}
    _magic(ip, "pg", "", "t = torch.rand(1000)")
    for name, magic, line, cell in (("status", "pg_status", "", None), ("show", "pg_show", "t", None),
                                    ("traced", "pg", "--trace", "dist.all_reduce(torch.ones(1024))")):
        out[name] = statistics.median(_magic(ip, magic, line, cell) for _ in range(queries))
    out.update(_shutdown_timed(ip, sb))
    return out


# ---- live output, in a real Jupyter kernel ------------------------------------------------------------
LATENCY_CELL = ("import time\nfor i in range({n}):\n    print(f'L {{i}} {{time.time():.6f}}', flush=True)\n"
                "    time.sleep({every})\n")
FLOOD_CELL = "for i in range({n}):\n    print(i)\n"
COMPUTE_CELL = ("import time\nt0 = time.perf_counter()\ns = 0\nfor i in range({n}):\n    s += i\n"
                "elapsed = time.perf_counter() - t0\n")


class _Kernel:
    """A Jupyter kernel on this interpreter, driven as a frontend drives it (jupyter_client)."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> tuple[float, list[dict[str, Any]], dict[str, Any]]:
        """Seconds from request to idle, every iopub message for it, and the reply."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        msgs = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            msgs.append(msg)
        took = time.perf_counter() - t0
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code.splitlines()[0]}: {reply['content'].get('evalue')}")
        return took, msgs, reply["content"]

    def value(self, expr: str) -> Any:
        _, msgs, _ = self.run(f"import json as _j\nprint(_j.dumps({expr}))")
        return json.loads("".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream"))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def live(world: int = 4, latency_lines: int = 60, flood_lines: int = 20000, flood_rounds: int = 3,
         cell_repeats: int = 30, compute_seconds: float = 10.0) -> dict[str, Any]:
    """Live %%pg in a kernel: print-to-kernel-send latency, a print flood vs ``%%px --stream``,
    a trivial cell vs ``%%px``, and what the live watch costs a compute-only loop."""
    import re

    k = _Kernel()
    out: dict[str, Any] = {"world": world}
    try:
        k.run("%load_ext pgnb")
        k.run(f"%pg_init --backend gloo --world {world}")
        k.run("import pgnb\n_v = pgnb.current().client[pgnb.current().engine_ids]\n_v.block = True\n_v.activate()")
        # -- latency: from a rank's print (its time.time()) to the kernel sending the message that carries it
        _, msgs, _ = k.run("%%pg\n" + LATENCY_CELL.format(n=latency_lines, every=0.05))
        seen: dict[tuple[str, str], float] = {}
        pattern = re.compile(r"data-rank='(\d+)'.*?</pre>", re.S)
        line = re.compile(r"L (\d+) (\d+\.\d+)")
        for m in msgs:
            if not m["msg_type"].startswith("comm"):
                continue
            date = m["header"]["date"]  # when the kernel sent it (a datetime, or ISO text)
            sent = (date if isinstance(date, datetime.datetime) else datetime.datetime.fromisoformat(
                str(date).replace("Z", "+00:00"))).timestamp()
            for lane in pattern.finditer(json.dumps(m["content"]).replace("\\n", "\n")):
                for i, stamp in line.findall(lane.group(0)):
                    seen.setdefault((lane.group(1), i), sent - float(stamp))
        lat = sorted(seen.values())
        out["latency"] = {"median": statistics.median(lat), "p95": lat[int(0.95 * (len(lat) - 1))],
                          "lines": len(lat), "expected": world * latency_lines}
        # -- throughput: a flood of short lines on every rank, %%pg (live) vs %%px --stream, alternating
        flood: dict[str, list[float]] = {"pg": [], "px": []}
        for _ in range(flood_rounds):
            flood["pg"].append(k.run("%%pg\n" + FLOOD_CELL.format(n=flood_lines))[0])
            flood["px"].append(k.run("%%px --stream\n" + FLOOD_CELL.format(n=flood_lines))[0])
        out["flood"] = {kk: statistics.median(v) for kk, v in flood.items()}
        # -- a trivial cell, %%pg (live view and all) vs %%px, alternating
        cells: dict[str, list[float]] = {"pg": [], "px": []}
        for i in range(5 + cell_repeats):
            for name in ("pg", "px"):
                dt = k.run(f"%%{name}\nx = 1")[0]
                if i >= 5:
                    cells[name].append(dt)
        out["cell"] = {kk: statistics.median(v) for kk, v in cells.items()}
        # -- a compute-only loop of about compute_seconds: %%pg (watched, sampled after 2 s) vs %%px
        k.run("%%px\n" + COMPUTE_CELL.format(n=2_000_000))
        rate = 2_000_000 / max(k.value("_v['elapsed']"))
        n = int(rate * compute_seconds)
        k.run("%%pg\n" + COMPUTE_CELL.format(n=n))
        watched = k.value("[e for e in pgnb.current().pull('elapsed')]")
        k.run("%%px\n" + COMPUTE_CELL.format(n=n))
        plain = k.value("list(_v['elapsed'])")
        out["compute"] = {"pg": statistics.median(watched), "px": statistics.median(plain), "n": n}
        k.run("%pg_shutdown")
    finally:
        k.close()
    return out


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    "pgnb_cold": pgnb_cold,
    "plain_cold": plain_cold,
    "session": session,
    "scale": scale,
    "live": live,
    "torch_suite": torch_suite,
    "torch_distributed": torch_distributed,
    "torch_continuous": torch_continuous,
    "torch_unseen": torch_unseen,
    "world_marker": world_marker,
    "slurm_cold": slurm_cold,
    "inner_loop": inner_loop,
    "torch_forked_init": torch_forked_init,
}


def main(argv: list[str]) -> int:
    name, out_path = argv[0], argv[1]
    kwargs = json.loads(argv[2]) if len(argv) > 2 else {}
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = CASES[name](**kwargs)
    # nothing this case started may outlive it (pgnb's and ipyparallel's processes alike)
    left = _alive(sorted({p.pid for p in psutil.Process().children(recursive=True)} - before))
    result["left_running"] = len(left)
    with open(out_path, "w") as f:
        json.dump(result, f)
    if left:
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    return 0


if __name__ == "__main__":
    with contextlib.redirect_stdout(io.StringIO()) if os.environ.get("PGNB_BENCH_QUIET") else contextlib.nullcontext():
        sys.exit(main(sys.argv[1:]))
