"""The ``world_marker`` case: what a ``@pytest.mark.world`` test costs on a warm world, and what a hang costs.

One fresh pytest process runs a generated test file: ``TRIVIAL`` trivial world-4
tests (their median time is the plugin's per-test overhead: one cell on every
rank, the leak checks and the reseed included; the world's start is not in any
test's time), then a test whose rank 0 hangs while the others wait in a barrier
(``timeout=HANG_TIMEOUT``), then a test that must pass on the world that
replaces the hung one. Times are pytest's own, from ``--junitxml``.

    python -m benchmarks._cases world_marker OUT.json '{"trivial": 20}'
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.torch_suite import verdicts

TRIVIAL = 60
HANG_TIMEOUT = 3.0
RUN_TIMEOUT = 300.0

TEST_FILE = '''
import time

import pytest
import torch.distributed as dist


@pytest.mark.world(4)
@pytest.mark.parametrize("i", range({trivial}))
def test_trivial(rank, world_size, i):
    assert 0 <= rank < world_size == 4


@pytest.mark.world(4, timeout={timeout})
def test_zz_hangs(rank):
    if rank == 0:
        time.sleep(60)
    dist.barrier()


@pytest.mark.world(4)
def test_zzz_after_the_hang(rank, world_size):
    t = __import__("torch").ones(1) * rank
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))
'''


def world_marker(trivial: int = TRIVIAL) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pgnb-bench-marker-") as d:
        with open(os.path.join(d, "test_marker_bench.py"), "w") as f:
            f.write(TEST_FILE.format(trivial=trivial, timeout=HANG_TIMEOUT))
        junit = os.path.join(d, "junit.xml")
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                "-c", os.devnull, "--rootdir", d, "--junitxml", junit, d]
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=d, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        wall = time.perf_counter() - t0
        found = verdicts(junit) if os.path.exists(junit) and os.path.getsize(junit) else {}
    if not found:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"the marker benchmark ran no tests ({proc.returncode}):\n{tail}")
    trivial_times = [v["seconds"] for k, v in found.items() if "test_trivial" in k and v["outcome"] == "passed"]
    hang = next(v for k, v in found.items() if "test_zz_hangs" in k)
    after = next(v for k, v in found.items() if "test_zzz_after_the_hang" in k)
    return {"wall": wall, "tests": len(found), "trivial": len(trivial_times),
            "trivial_passed": len(trivial_times) == trivial,
            "per_test_median": statistics.median(trivial_times) if trivial_times else None,
            "per_test_p90": sorted(trivial_times)[int(0.9 * (len(trivial_times) - 1))] if trivial_times else None,
            "hang_seconds": hang["seconds"], "hang_outcome": hang["outcome"], "hang_timeout": HANG_TIMEOUT,
            "after_outcome": after["outcome"], "after_seconds": after["seconds"],
            "tail": (proc.stdout + proc.stderr)[-1500:]}
