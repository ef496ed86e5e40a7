"""The ``inner_loop`` case: one test of torch's ``DistributedTest`` suite, run again and again from the command line.

What a developer feels after each edit: the whole ``pytest`` command, from process start, for one test
(``test_all_reduce_sum``, gloo, world 2, benchmarks/torch_distributed). Side by side, in rounds:

- torch's spawning (plain ``pytest``);
- ``pytest --pgnb-torch``, cold (a world started and stopped by the run);
- ``pytest --pgnb-torch --pgnb-keep`` with no kept process yet (the run starts it: its first run);
- the same again after touching the test file (the kept process's second run; the edit is seen): at once,
  and, in a second pair of runs, ``pause`` seconds after the first (the kept process warms up meanwhile).

Each round's keep runs use a runtime folder of their own, so the first finds nothing kept; the kept
process is ended (SIGTERM, by its pid) at the end of the round and must be gone with its ranks.

    python -m benchmarks._cases inner_loop OUT.json '{"rounds": 2}'
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.torch_suite import ROOT, run_suite

TEST = "benchmarks/torch_distributed/test_distributed_gloo.py::TestDistBackendWithSpawn::test_all_reduce_sum"
KEEP = ("--pgnb-keep",)


def inner_loop(rounds: int = 2, pause: float = 10.0) -> dict[str, Any]:
    """``pause``: seconds between the first keep run's end and the edit, for the paused second run (an edit
    takes a developer some seconds; the kept process warms up meanwhile). The unpaused one comes at once."""
    runs: dict[str, list[float]] = {"spawn": [], "cold": [], "keep_first": [], "keep_second": [],
                                    "keep_second_paused": []}
    for _ in range(rounds):
        runs["spawn"].append(_passed(run_suite(False, suite=[TEST]))["wall"])
        runs["cold"].append(_passed(run_suite(True, suite=[TEST]))["wall"])
        with tempfile.TemporaryDirectory(prefix="pgnb-bench-keep-") as runtime:
            env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
            for wait, second_key in ((0.0, "keep_second"), (pause, "keep_second_paused")):
                first = _passed(run_suite(True, suite=[TEST], extra=KEEP, env=env))
                found = re.search(r"the kept process \(pid (\d+)\) warms up", first["stderr"])
                if found is None:
                    raise RuntimeError(f"the first --pgnb-keep run started no kept process:\n{first['tail']}")
                keeper = int(found.group(1))
                try:
                    time.sleep(wait)
                    Path(ROOT, TEST.split("::")[0]).touch()  # an edit: the kept process imports it anew
                    second = _passed(run_suite(True, suite=[TEST], extra=KEEP, env=env))
                    if "nothing kept for this project yet" in second["stderr"]:
                        raise RuntimeError(f"the second run did not find the kept process:\n{second['tail']}")
                finally:
                    _end(keeper)
                runs["keep_first"].append(first["wall"])
                runs[second_key].append(second["wall"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"runs": runs, "median": med, "rounds": rounds, "pause": pause,
            "second_ratio": med["keep_second"] / med["spawn"], "first_ratio": med["keep_first"] / med["spawn"],
            "paused_ratio": med["keep_second_paused"] / med["spawn"], "cold_ratio": med["cold"] / med["spawn"]}


def _passed(run: dict[str, Any]) -> dict[str, Any]:
    if [v["outcome"] for v in run["verdicts"].values()] != ["passed"]:
        raise RuntimeError(f"the test did not pass: {run['verdicts']}\n{run['tail']}")
    return run


def _end(pid: int) -> None:
    """SIGTERM the kept process (it stops its worlds); it and its descendants must be gone within 20 s."""
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    os.kill(pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=20)
    if alive:
        raise RuntimeError(f"the kept process left {[p.pid for p in alive]} running")
