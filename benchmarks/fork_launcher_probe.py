"""Compare ipyparallel's ``local`` engine launcher with pgnb's fork launcher.

For each case, in a fresh subprocess with its own temporary IPYTHONDIR:
start a Cluster (controller on loopback, delay=0, fast heartbeat), connect,
run one apply that imports torch on every engine, then measure each engine's
and each nanny's USS, and the time ``stop_cluster`` takes.

    python benchmarks/fork_launcher_probe.py                 # n = 4, 8, 32
    python benchmarks/fork_launcher_probe.py --n 4 --repeat 3 --no-nanny
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

FORK = "pgnb._forklauncher.ForkEngineSetLauncher"
#: name -> (engine launcher class, extra config)
LAUNCHERS = {
    "local": ("local", {}),
    "fork": (FORK, {}),
    # fork launcher, but each engine starts its nanny as a fresh Python (ipyparallel's way)
    "fork-popen-nanny": (FORK, {"ForkEngineSetLauncher": {"fork_nanny": False}}),
    # fork launcher, zygote started without waiting for the controller's connection info
    "fork-early": (FORK, {"Cluster": {"send_engines_connection_env": False}}),
}

CASE = r"""
import json, os, sys, time
import psutil
import ipyparallel as ipp

launcher, n, nanny = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
from traitlets.config import Config
config = Config(json.loads(sys.argv[4]))
if not nanny:
    config.EngineLauncher.engine_args = ["--IPEngine.enable_nanny=False"]
tic = time.perf_counter()
cluster = ipp.Cluster(
    n=n, engine_launcher_class=launcher, delay=0, controller_ip="127.0.0.1",
    controller_args=["--HeartMonitor.period=100"], engine_timeout=600, config=config,
)
client = cluster.start_and_connect_sync()
started = time.perf_counter()

def import_torch():
    import os, sys, time
    had = "torch" in sys.modules
    t = time.perf_counter()
    import torch  # noqa: F401
    return os.getpid(), had, time.perf_counter() - t

results = client[:].apply_sync(import_torch)
applied = time.perf_counter()

def uss(pid):
    try:
        return psutil.Process(pid).memory_full_info().uss
    except psutil.NoSuchProcess:
        return None

engine_pids = [pid for pid, _, _ in results]
# local: a nanny is its engine's child; fork: the zygote's (fork_nanny) or the engine's
nanny_pids = [c.pid for pid in engine_pids for c in psutil.Process(pid).children()]
for es in cluster.engines.values():
    if getattr(es, "zygote_pid", -1) > 0:
        nanny_pids += [c.pid for c in psutil.Process(es.zygote_pid).children() if c.pid not in engine_pids]
engine_uss = [uss(pid) for pid in engine_pids]
nanny_uss = [uss(pid) for pid in nanny_pids]
extra = {}
timing = {}
for es in cluster.engines.values():
    if getattr(es, "zygote_pid", -1) > 0:
        extra["zygote_uss"] = uss(es.zygote_pid)
        timing["zygote_import_s"] = es.zygote_ready.get("import_seconds", 0.0)
client.close()
t_stop = time.perf_counter()
cluster.stop_cluster_sync()
stopped = time.perf_counter()
print(json.dumps({
    "start_s": started - tic,
    "apply_s": applied - started,
    "total_s": applied - tic,
    "stop_s": stopped - t_stop,
    "torch_preimported": all(had for _, had, _ in results),
    "engine_uss_mb": [u / 2**20 for u in engine_uss if u],
    "nanny_uss_mb": [u / 2**20 for u in nanny_uss if u],
    **{k: v / 2**20 for k, v in extra.items() if v},
    **timing,
}))
"""


def run_case(launcher: str, n: int, nanny: bool) -> dict:
    ipython_dir = tempfile.mkdtemp(prefix="pgnb-probe-")
    env = dict(os.environ, IPYTHONDIR=ipython_dir)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    try:
        out = subprocess.run(
            [sys.executable, "-c", CASE, LAUNCHERS[launcher][0], str(n), "1" if nanny else "0",
             json.dumps(LAUNCHERS[launcher][1])],
            env=env, capture_output=True, text=True, timeout=900, check=True,
        ).stdout
    finally:
        shutil.rmtree(ipython_dir, ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, action="append", help="engines (repeatable); default 4 8 32")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-nanny", action="store_true", help="also run every case with enable_nanny=False")
    parser.add_argument("--launcher", action="append", choices=sorted(LAUNCHERS))
    parser.add_argument("--verbose", "-v", action="store_true", help="print every run")
    args = parser.parse_args()
    print(f"{'case (median of --repeat)':<30} {'start':>6} {'apply':>6} {'total':>6} {'stop':>5}  "
          f"{'engine USS MB':>14} {'nanny USS MB':>13} {'zygote':>7}")
    launchers = args.launcher or ["local", "fork"]
    for n in args.n or [4, 8, 32]:
        for nanny in [True, False] if args.no_nanny else [True]:
            # Interleave the launchers so that background load hits them alike.
            runs: dict[str, list[dict]] = {name: [] for name in launchers}
            for _ in range(args.repeat):
                for launcher in launchers:
                    load = os.getloadavg()[0]
                    run = run_case(launcher, n, nanny)
                    runs[launcher].append(run)
                    if args.verbose:
                        shown = {k: round(v, 2) for k, v in run.items() if isinstance(v, float)}
                        print(f"    {launcher} n={n} load={load:.1f}", shown, flush=True)
            for launcher in launchers:
                rs = runs[launcher]
                med = {k: statistics.median(r[k] for r in rs) for k in ("start_s", "apply_s", "total_s", "stop_s")}
                eng = statistics.median(rs[-1]["engine_uss_mb"])
                nan = statistics.median(rs[-1]["nanny_uss_mb"]) if rs[-1]["nanny_uss_mb"] else 0.0
                zyg = rs[-1].get("zygote_uss", 0.0)
                name = f"{launcher} n={n}{'' if nanny else ' no-nanny'}"
                print(f"{name:<30} {med['start_s']:6.2f} {med['apply_s']:6.2f} {med['total_s']:6.2f} "
                      f"{med['stop_s']:5.2f}  {eng:14.1f} {nan:13.1f} {zyg:7.1f}", flush=True)

if __name__ == "__main__":
    main()
