"""The ``torch_distributed`` and ``torch_continuous`` cases: torch's own suites, torch's harness vs ``--pgnb-torch``.

- ``torch_distributed``: benchmarks/torch_distributed, torch's main distributed suite
  (``DistributedTest._DistTestBase``, 285 tests, gloo, world 2, subclassed as torch's
  test_distributed_spawn.py does), under torch's spawning (a world per test) and under
  ``pytest --pgnb-torch``. torch's side takes ~5-20 s a test on 2 cores, so ``sample=N``
  runs both sides on every k-th test only (N of them; 0: all).
- ``torch_unseen``: benchmarks/torch_unseen, four more of torch's ``DTensorContinuousTestBase`` files (worlds
  1, 2 and 4), taken after the rest was measured, the same two ways.
- ``torch_continuous``: benchmarks/torch_continuous, ``MultiProcContinuousTest`` classes at
  worlds 1, 2 and 4 (torch's own test_common_rules.py, test_init.py and test_experimental_ops.py,
  classes of ours on DTensorContinuousTestBase,
  and 20 trivial tests in one class), under torch's continuous harness (a world per class)
  and under ``pytest --pgnb-torch``.

Both: whole pytest runs in fresh interpreters (pytest's start and collection included),
torch's side first, every test's verdict compared.

    python -m benchmarks --only torch_distributed,torch_continuous,torch_unseen
    python -m benchmarks._cases torch_distributed OUT.json '{"sample": 20}'
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks.torch_suite import ROOT, run_suite, side_by_side

DISTRIBUTED = os.path.join("benchmarks", "torch_distributed")
CONTINUOUS = os.path.join("benchmarks", "torch_continuous")
UNSEEN = os.path.join("benchmarks", "torch_unseen")
#: Seconds one whole pytest run may take (torch's spawning of all 285 tests: ~30-60 min on 2 cores)
DISTRIBUTED_TIMEOUT = 5400.0


def torch_distributed(sample: int = 0) -> dict[str, Any]:
    suite: str | list[str] = DISTRIBUTED
    if sample:
        ids = _collect(DISTRIBUTED)
        step = max(1, len(ids) // sample)
        suite = ids[::step][:sample]
    out = side_by_side(run_suite(False, suite=suite, timeout=DISTRIBUTED_TIMEOUT),
                       run_suite(True, suite=suite, timeout=DISTRIBUTED_TIMEOUT))
    out["sample"] = sample
    return out


def torch_continuous() -> dict[str, Any]:
    out = side_by_side(run_suite(False, suite=CONTINUOUS), run_suite(True, suite=CONTINUOUS))
    trivial = [v["seconds"] for k, v in out["pgnb"]["verdicts"].items() if k.startswith("TrivialTest::")]
    out["trivial_median"] = statistics.median(trivial) if trivial else float("nan")
    out["trivial_tests"] = len(trivial)
    out["classes"] = len({k.split("::")[0] for k in out["pgnb"]["verdicts"]})
    return out


def torch_unseen() -> dict[str, Any]:
    """benchmarks/torch_unseen: four of torch's own ``DTensorContinuousTestBase`` files taken after pgnb's
    support for torch's continuous harness was built and measured, and never tuned for (worlds 1, 2 and 4)."""
    out = side_by_side(run_suite(False, suite=UNSEEN), run_suite(True, suite=UNSEEN))
    out["classes"] = len({k.split("::")[0] for k in out["pgnb"]["verdicts"]})
    return out


def _collect(path: str) -> list[str]:
    """The suite's node ids, in pytest's order."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", path],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return [line for line in proc.stdout.splitlines() if "::" in line]
