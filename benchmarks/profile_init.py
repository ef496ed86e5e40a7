"""Where ``%pg_init`` and ``%%pg`` spend their time: A/B runs of single changes, and pyinstrument profiles.

    python -m benchmarks.profile_init ab [--rounds 5] [--world 4]   # overlap on/off, heartbeat 100/50 ms
    python -m benchmarks.profile_init profile [--out DIR]           # pyinstrument text profiles

``ab`` runs cold ``%pg_init`` (fork launcher) in fresh processes, the variants
interleaved round by round, and prints the median of each phase. ``profile``
needs ``pip install pyinstrument``; it writes ``pg_init_cold.txt``,
``pg_shutdown.txt``, ``pg_cell.txt`` and ``px_cell.txt`` (100 trivial cells each).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks._runner import ROOT, run_case

VARIANTS: dict[str, dict[str, Any]] = {
    "pgnb now (overlap, heartbeat 100 ms)": {},
    "controller first, then engines": {"overlap": False},
    "overlap, heartbeat 50 ms": {"heartbeat_ms": 50},
}

PROFILE = r'''
import os, sys, time
from pyinstrument import Profiler
from benchmarks._cases import _magic, _shell

out = sys.argv[1]
def save(name, p):
    with open(os.path.join(out, name), "w") as f:
        f.write(p.output_text(unicode=False, color=False))

ip = _shell()
p = Profiler(interval=0.0005)
p.start()
_magic(ip, "pg_init", "--backend gloo --world 4")
p.stop()
save("pg_init_cold.txt", p)
import pgnb
sb = pgnb.current()
view = sb.client[sb.engine_ids]
view.block = True
view.activate()
for name in ("pg", "px"):
    for _ in range(10):
        _magic(ip, name, "", "x = 1")
    p = Profiler(interval=0.0005)
    p.start()
    for _ in range(100):
        _magic(ip, name, "", "x = 1")
    p.stop()
    save(f"{name}_cell.txt", p)
p = Profiler(interval=0.0005)
p.start()
_magic(ip, "pg_shutdown")
p.stop()
save("pg_shutdown.txt", p)
'''


def ab(rounds: int, world: int) -> None:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for rnd in range(rounds):
        for name, kwargs in VARIANTS.items():
            r = run_case("pgnb_cold", world=world, launcher="fork", **kwargs)
            samples[name].append(r)
            print(f"round {rnd + 1}: {name:<40} {r['init']:.2f} s (load {r['_load']:.1f})", file=sys.stderr)
    print(f"\ncold %pg_init --world {world} (fork), median of {rounds}: seconds from the call")
    print(f"{'variant':<40} {'registered':>10} {'torch ok':>9} {'ready':>6}")
    for name, rs in samples.items():
        reg = statistics.median(r["phases"].get("importing torch", float("nan")) for r in rs)
        rdv = statistics.median(r["phases"].get("rendezvous", float("nan")) for r in rs)
        init = statistics.median(r["init"] for r in rs)
        print(f"{name:<40} {reg:10.2f} {rdv:9.2f} {init:6.2f}")


def profile(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    ipython_dir = tempfile.mkdtemp(prefix="pgnb-profile-ipython-")
    env = dict(os.environ, IPYTHONDIR=ipython_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    try:
        subprocess.run([sys.executable, "-c", PROFILE, out], cwd=ROOT, env=env, check=True)
    finally:
        shutil.rmtree(ipython_dir, ignore_errors=True)
    print(f"profiles in {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_init", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_ab = sub.add_parser("ab", help="interleaved A/B of cold %%pg_init variants")
    p_ab.add_argument("--rounds", type=int, default=5)
    p_ab.add_argument("--world", type=int, default=4)
    p_prof = sub.add_parser("profile", help="pyinstrument profiles of %%pg_init, %%pg, %%px, %%pg_shutdown")
    p_prof.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "pgnb-profiles"))
    args = parser.parse_args(argv)
    if args.what == "ab":
        ab(args.rounds, args.world)
    else:
        profile(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
