"""What ``%%pg --trace`` costs per torch.distributed call: when on, and (nothing) when off.

Two measurements, each reported as microseconds per call, wall clock and
the calling thread's CPU time (which other load on the machine disturbs less),
median and minimum over the samples:

* **wrapper** -- one process, a gloo world of 1, ``all_reduce`` of one float
  in a tight loop: untraced, traced (``pgnb.rank.trace.start`` ... ``stop``,
  writing its trace file as ``%%pg --trace`` does), and untraced again after
  the trace. No network, so the difference is the wrapper's own cost.
* **ops** -- the same world of 1, a loop of small tensor ops (``torch.mm`` of 8x8,
  no collective): what the dispatch mode that sees functional collectives costs
  every other op of a traced cell.
* **world** -- a real 4-rank pgnb world: the same loop in a ``%%pg`` cell run
  plain (``Sandbox.execute``) and traced (``Sandbox.execute(trace=True)``),
  interleaved round by round; each rank times its own loop, the median over
  ranks and rounds is reported.

"Off" means nothing is wrapped: the benchmark checks that every
``torch.distributed`` function is the very object it was before any tracing
(so an untraced call runs no pgnb code at all), and times it anyway.

    IPYTHONDIR=$(mktemp -d) python benchmarks/trace_overhead.py [--calls 5000] [--rounds 5] [--world 4]

prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

LOOP = """
import time
t = torch.ones(1)
dist.barrier()
c0, t0 = time.thread_time(), time.perf_counter()
for _ in range({n}):
    dist.all_reduce(t)
((time.perf_counter() - t0) / {n}, (time.thread_time() - c0) / {n})
"""

_NAMES = ("all_reduce", "broadcast", "send", "recv", "isend", "irecv", "barrier", "all_gather")


def _identity(dist: Any) -> dict[str, int]:
    import torch.distributed.distributed_c10d as c10d

    return {f"{m.__name__}.{n}": id(getattr(m, n)) for m in (dist, c10d) for n in _NAMES}


def wrapper(calls: int, rounds: int) -> dict[str, Any]:
    """Per-call cost of the wrapper itself, in a world of one (no network)."""
    import torch
    import torch.distributed as dist

    from pgnb.rank import trace as rank_trace

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    t = torch.ones(1)
    before = _identity(dist)

    def loop() -> tuple[float, float]:
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t)
        return (time.perf_counter() - t0) / calls, (time.thread_time() - c0) / calls

    tmp = tempfile.mkdtemp(prefix="pgnb-bench-trace-")
    samples: dict[str, list[tuple[float, float]]] = {"never_traced": [], "traced": [], "after_trace": []}
    loop()  # warm-up
    try:
        for rnd in range(rounds):
            samples["never_traced" if rnd == 0 else "after_trace"].append(loop())
            rank_trace.start(tmp, f"bench-{rnd}.jsonl")
            try:
                samples["traced"].append(loop())
            finally:
                rank_trace.stop()
            if rnd == 0:
                samples["never_traced"].append(loop())
        same = _identity(dist) == before and not rank_trace.wrapped_names()
    finally:
        dist.destroy_process_group()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    return {
        "calls_per_sample": calls,
        **_compare(samples["never_traced"] + samples["after_trace"], samples["traced"]),
        "never_traced": _stats(samples["never_traced"]),
        "after_trace": _stats(samples["after_trace"]),
        "functions_restored": same,
    }


def ops(calls: int, rounds: int) -> dict[str, Any]:
    """Per-op cost of the dispatch mode on ops that are not collectives (a world of 1)."""
    import torch
    import torch.distributed as dist

    from pgnb.rank import trace as rank_trace

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    a = torch.ones(8, 8)

    def loop() -> tuple[float, float]:
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            torch.mm(a, a)
        return (time.perf_counter() - t0) / calls, (time.thread_time() - c0) / calls

    tmp = tempfile.mkdtemp(prefix="pgnb-bench-trace-")
    samples: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    loop()  # warm-up
    try:
        for rnd in range(rounds):
            samples["off"].append(loop())
            rank_trace.start(tmp, f"bench-ops-{rnd}.jsonl")
            try:
                samples["on"].append(loop())
            finally:
                rank_trace.stop()
        modes_after = rank_trace.active_modes()
    finally:
        dist.destroy_process_group()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    return {"calls_per_sample": calls, **_compare(samples["off"], samples["on"]), "modes_after": modes_after}


def _stats(samples: list[tuple[float, float]]) -> dict[str, float]:
    """Microseconds per call: wall (median, min) and this thread's CPU time (median, min)."""
    wall = [w for w, _ in samples]
    cpu = [c for _, c in samples]
    return {"wall_median_us": round(statistics.median(wall) * 1e6, 2), "wall_min_us": round(min(wall) * 1e6, 2),
            "cpu_median_us": round(statistics.median(cpu) * 1e6, 2), "cpu_min_us": round(min(cpu) * 1e6, 2)}


def _compare(off: list[tuple[float, float]], on: list[tuple[float, float]]) -> dict[str, Any]:
    a, b = _stats(off), _stats(on)
    return {"off": a, "on": b, "overhead_us": {k: round(b[k] - a[k], 2) for k in a}}


def world(n_ranks: int, calls: int, rounds: int) -> dict[str, Any]:
    """The same loop on every rank of a real world: plain cell vs traced cell, interleaved."""
    import pgnb

    code = LOOP.format(n=calls)
    check = "import pgnb.rank.trace as T\n(T.wrapped_names(), id(dist.all_reduce))"
    per: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with pgnb.Sandbox(backend="gloo", world=n_ranks) as sb:
        ids_before = [v[1] for v in sb.execute(check).values]
        sb.execute(code)  # warm-up
        for _ in range(rounds):
            for mode in ("off", "on"):
                res = sb.execute(code, trace=mode == "on")
                err = res.error()
                if err is not None:
                    raise err
                per[mode].extend((float(w), float(c)) for w, c in res.values)
        after = sb.execute(check).values
    restored = all(not names for names, _ in after) and [i for _, i in after] == ids_before
    return {"world": n_ranks, "calls_per_sample": calls, **_compare(per["off"], per["on"]),
            "functions_restored": restored}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="all_reduce calls per timed loop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--world", type=int, default=4, help="ranks of the real world (0: skip it)")
    args = parser.parse_args(argv)
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="pgnb-bench-"))
    out = {"wrapper": wrapper(args.calls, args.rounds), "ops": ops(args.calls, args.rounds)}
    if args.world:
        out["world"] = world(args.world, max(args.calls // 5, 100), args.rounds)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
