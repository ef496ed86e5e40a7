"""``pgnb demo`` / ``python -m pgnb demo``: the terminal face of the same core."""

from __future__ import annotations

import argparse
import sys


def _all_reduce_rank() -> str:
    import torch
    import torch.distributed as dist

    t = torch.ones(2) * dist.get_rank()
    dist.all_reduce(t)
    return str(t)


def demo(world: int, backend: str) -> int:
    from .core.report import status_table
    from .core.sandbox import Sandbox

    print(f"pgnb demo: starting a {backend} world of {world} ranks ...", flush=True)
    with Sandbox(backend=backend, world=world) as sb:
        sb.status()
        print(status_table(sb.snapshot()))
        print("\nall_reduce(ones(2) * rank), sum over ranks:")
        for rank, value in enumerate(sb.run(_all_reduce_rank)):
            print(f"  rank {rank}: {value}")
    print("\nshut down: engines and controller stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgnb", description="torch.distributed worlds on ipyparallel engines")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="start a world, show its status, all_reduce once, shut down")
    d.add_argument("--world", "-n", type=int, default=4)
    d.add_argument("--backend", "-b", default="gloo")
    sub.add_parser("nbval-sanitize", help="print the path of pgnb's nbval sanitizer file")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .errors import PgnbError

        try:
            return demo(args.world, args.backend)
        except PgnbError as e:
            print(f"pgnb: {e}", file=sys.stderr)
            return 1
    if args.command == "nbval-sanitize":
        from importlib.resources import files

        print(files("pgnb") / "nbval_sanitize.cfg")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
