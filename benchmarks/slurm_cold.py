"""The ``slurm_cold`` case: ``%pg_init --launcher slurm --world N`` beside ``--launcher fork``, on a real Slurm cluster.

The cluster is the tests' single-node one (tests/slurm_cluster.py: root and Debian's
slurm-wlm and munge), started once for the case; the profile is docs/scaling_out.md's
(tests/test_slurm.py's ``SLURM_PROFILE``). Each sample is the ``pgnb_cold`` case in a
fresh Python, the two launchers interleaved, after one unmeasured start of each.
Where no cluster can be started, the case says why in one line and measures nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from slurm_cluster import MISSING, SlurmCluster, available  # noqa: E402  (tests/ is not a package)


def _profile() -> str:
    from test_slurm import SLURM_PROFILE

    return str(SLURM_PROFILE)


def _cold(launcher: str, world: int, env: dict[str, str]) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "benchmarks._cases", "pgnb_cold", out.name,
                        json.dumps({"world": world, "launcher": launcher})], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return float(json.load(open(out.name))["init"])


def slurm_cold(world: int = 4, rounds: int = 3) -> dict[str, Any]:
    if not available():
        print(f"slurm_cold skipped: {MISSING}", file=sys.stderr)
        return {"skipped": MISSING}
    cluster = SlurmCluster().start()
    try:
        ipython_dir = tempfile.mkdtemp(prefix="pgnb-bench-slurm-")
        os.makedirs(os.path.join(ipython_dir, "profile_default"))
        with open(os.path.join(ipython_dir, "profile_default", "ipcluster_config.py"), "w") as f:
            f.write(_profile())
        env = {**os.environ, **cluster.env, "IPYTHONDIR": ipython_dir}
        for launcher in ("fork", "slurm"):  # page cache, .pyc files, the node's first job: not measured
            _cold(launcher, world, env)
        samples: dict[str, list[float]] = {"fork": [], "slurm": []}
        for _ in range(rounds):
            for launcher in samples:
                samples[launcher].append(_cold(launcher, world, env))
        left = cluster.jobs()
    finally:
        cluster.stop()
    fork, slurm = statistics.median(samples["fork"]), statistics.median(samples["slurm"])
    return {"world": world, "fork": samples["fork"], "slurm": samples["slurm"], "init": slurm,
            "ratio": slurm / fork, "jobs_left": left}
