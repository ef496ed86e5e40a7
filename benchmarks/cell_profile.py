"""Where a trivial ``%%pg`` cell's time goes, beside ``%%px``: each process's CPU per cell, the kernel's steps.

On 2 cores a cell's wall time is mostly CPU: the kernel's (its main thread and the
Client's I/O thread), the engines' and the controller's. This runs ``x = 1`` on a
world of 4 in one IPython shell, ``%%pg`` and ``%%px`` in alternating blocks of
100 cells, and reads each process's CPU time (psutil) before and after each block.
Then it times the kernel's own steps of ``%%pg`` (the look at the world's
processes, sending, waiting, gathering) with ``time.perf_counter`` around them.

    python benchmarks/cell_profile.py [--world 4] [--blocks 3]

prints one JSON object; docs/performance.md's "Where a trivial cell's time goes" is made from it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

CELL = "x = 1"


def _cpu(procs: list[Any]) -> float:
    import psutil

    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _timed(steps: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            steps.setdefault(name, []).append(time.perf_counter() - t0)

    return wrapper


def measure(world: int = 4, blocks: int = 3, per_block: int = 100) -> dict[str, Any]:
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="pgnb-bench-"))
    import psutil
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import pgnb
    from pgnb.core import cells, dispatch
    from pgnb.core.sandbox import dispatch_of
    from pgnb.notebook.current import set_current

    config = Config()
    config.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "pgnb")
    out: dict[str, Any] = {"world": world, "cell": CELL, "cells_per_block": per_block}
    with pgnb.Sandbox(backend="gloo", world=world) as sb:
        set_current(sb)
        view = sb.client[sb.engine_ids]
        view.block = True
        view.activate()
        me = psutil.Process()
        engines = [psutil.Process(i.pid) for i in dispatch_of(sb).rank_infos]
        ours = {p.pid for p in engines}
        others = [p for p in me.children(recursive=True) if p.pid not in ours]  # controller, schedulers, zygote, ...
        magics = {"pg": lambda: ip.run_cell_magic("pg", "", CELL), "px": lambda: ip.run_cell_magic("px", "", CELL)}
        per_cell: dict[str, list[dict[str, float]]] = {"pg": [], "px": []}
        with contextlib.redirect_stdout(io.StringIO()):
            for fn in magics.values():
                for _ in range(10):
                    fn()
            for _ in range(blocks):
                for name, fn in magics.items():
                    k0, e0, o0, t0 = _cpu([me]), _cpu(engines), _cpu(others), time.perf_counter()
                    for _ in range(per_block):
                        fn()
                    per_cell[name].append({"wall": (time.perf_counter() - t0) / per_block,
                                           "kernel_cpu": (_cpu([me]) - k0) / per_block,
                                           "engines_cpu": (_cpu(engines) - e0) / per_block,
                                           "controller_cpu": (_cpu(others) - o0) / per_block})
            out["per_cell"] = {name: {k: statistics.median(b[k] for b in rows) for k in rows[0]}
                               for name, rows in per_cell.items()}
            if not hasattr(cells, "send"):  # a tree from before pgnb.core.sending: the CPU split only
                set_current(None)
                return out
            # the kernel's own steps of %%pg, timed where they are called
            steps: dict[str, list[float]] = {}
            original = (dispatch.Dispatcher.engines_for, dispatch.Dispatcher.wait_ranks, cells.send, cells._collect)
            dispatch.Dispatcher.engines_for = _timed(steps, "look and refuse", original[0])  # type: ignore[method-assign]
            dispatch.Dispatcher.wait_ranks = _timed(steps, "wait", original[1])  # type: ignore[method-assign]
            cells.send = lambda *a, **k: _timed(steps, "send", lambda: list(original[2](*a, **k)))()
            collected: list[float] = []
            cells._collect = _timed({"collect": collected}, "collect", original[3])
            totals = []
            try:
                for _ in range(per_block):
                    t0 = time.perf_counter()
                    magics["pg"]()
                    totals.append(time.perf_counter() - t0)
            finally:
                dispatch.Dispatcher.engines_for, dispatch.Dispatcher.wait_ranks, cells.send, cells._collect = original
            out["steps"] = {k: statistics.median(v) for k, v in steps.items()}
            out["steps"]["collect (all ranks)"] = statistics.median(
                sum(collected[i:i + world]) for i in range(0, len(collected), world))
            out["steps"]["whole cell"] = statistics.median(totals)
        set_current(None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.world, args.blocks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
