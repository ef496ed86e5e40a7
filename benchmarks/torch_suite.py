"""The ``torch_suite`` case: benchmarks/dist_suite under torch's own spawning and under ``pytest --pgnb-torch``.

benchmarks/dist_suite is a suite of small distributed tests written once as torch
``MultiProcessTestCase`` tests (collectives, point-to-point, subgroups, a DDP
step, DTensor redistributes; world 2 and 4; a few skip by torch's ``TEST_SKIPS``
exit codes). It runs twice in fresh pytest processes, side by side: plain
``pytest`` (torch spawns ``world_size`` processes for every test) and
``pytest --pgnb-torch`` (every test on the ranks of one warm world). The wall
time of each whole pytest run counts (interpreter start, collection, the
world's start included), and every test's verdict must be the same both ways.

    python -m benchmarks._cases torch_suite OUT.json '{"keyword": "CollectivesWorld2"}'
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join("benchmarks", "dist_suite")
#: Seconds one whole pytest run of the suite may take (torch's spawning: ~5-10 s a test on 2 cores)
RUN_TIMEOUT = 1500.0
#: Plugins of this venv that neither harness uses, off on both sides: nbval is here for pgnb's lessons, not in
#: a torch developer's environment, and its import (nbformat, jsonschema's grammars) costs every pytest run ~1 s
PLUGINS_OFF = ("-p", "no:nbval")


def verdicts(junit_xml: str) -> dict[str, dict[str, Any]]:
    """``class::test -> {"outcome", "message", "seconds"}`` from a ``--junitxml`` file."""
    out: dict[str, dict[str, Any]] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or "").split("\n")[0]
                break
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        out[name] = {"outcome": outcome, "message": message if outcome == "skipped" else "",
                     "seconds": float(case.get("time") or 0.0)}
    return out


def run_suite(pgnb: bool, keyword: str = "", suite: str | list[str] = SUITE,
              timeout: float = RUN_TIMEOUT, extra: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """One pytest run of the suite (a path, or node ids) in a fresh interpreter: its wall time and every
    test's verdict (``extra``: more options; ``env``: its environment)."""
    fd, junit = tempfile.mkstemp(prefix="pgnb-bench-suite-", suffix=".xml")
    os.close(fd)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGINS_OFF, "--junitxml", junit,
            *([suite] if isinstance(suite, str) else suite)]
    if pgnb:
        args.append("--pgnb-torch")
    if keyword:
        args += ["-k", keyword]
    args += extra
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        wall = time.perf_counter() - t0
        found = verdicts(junit) if os.path.getsize(junit) else {}
    finally:
        os.remove(junit)
    if not found:
        raise RuntimeError(f"pytest {'--pgnb-torch ' if pgnb else ''}ran no tests ({proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    per_test = [v["seconds"] for v in found.values()]
    return {"wall": wall, "returncode": proc.returncode, "verdicts": found, "tests": len(found),
            "per_test_median": statistics.median(per_test), "per_test_max": max(per_test),
            "tail": (proc.stdout + proc.stderr)[-1500:], "stderr": proc.stderr[-1500:]}


def torch_suite(keyword: str = "") -> dict[str, Any]:
    """The suite both ways, spawning first (it warms the page cache for both)."""
    return side_by_side(run_suite(False, keyword), run_suite(True, keyword))


def side_by_side(torch_run: dict[str, Any], pgnb_run: dict[str, Any]) -> dict[str, Any]:
    """Two runs of the same tests (torch's harness, then ``--pgnb-torch``): verdicts compared, wall times."""
    spawn, warm = torch_run, pgnb_run
    differ = sorted(k for k in spawn["verdicts"].keys() | warm["verdicts"].keys()
                    if {**spawn["verdicts"].get(k, {}), "seconds": 0} != {**warm["verdicts"].get(k, {}), "seconds": 0})
    outcomes = [v["outcome"] for v in spawn["verdicts"].values()]
    return {"spawn": spawn, "pgnb": warm, "same_verdicts": not differ, "differ": differ,
            "tests": spawn["tests"], "passed": outcomes.count("passed"), "skipped": outcomes.count("skipped"),
            "failed": outcomes.count("failed"), "ratio": warm["wall"] / spawn["wall"]}
