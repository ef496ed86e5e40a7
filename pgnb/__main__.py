"""``pgnb demo`` / ``python -m pgnb demo``: the terminal face of the same core; ``nbval-sanitize``: nbval's file.

``python -m pgnb nbval-sanitize`` writes pgnb's sanitizer into a per-user cache
directory and prints its path. A path inside pgnb's own checkout (an editable
install) would be one of the paths pytest derives its rootdir from, so pytest
would read pgnb's settings (``pyproject.toml``) instead of the user's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

#: pgnb's own patterns, and the opt-in ones for other libraries' output (package data, both).
SANITIZER = "nbval_sanitize.cfg"
THIRD_PARTY = "nbval_sanitize_third_party.cfg"


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


def cache_dir() -> Path:
    """pgnb's per-user cache directory: ``$XDG_CACHE_HOME/pgnb``, else ``~/.cache/pgnb``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pgnb"


def sanitizer_file(third_party: bool = False) -> Path:
    """The sanitizer nbval should read, written to ``cache_dir()``: pgnb's patterns, and with
    ``third_party`` the opt-in ones after them (nbval reads one file only).

    Rewritten only when its text changed (another pgnb version wrote it), and atomically, so a
    replay that reads it meanwhile sees the old file or the new one. When the cache cannot be
    written, pgnb's packaged file itself (``third_party`` then raises the ``OSError``).
    """
    from importlib.resources import files

    package = files("pgnb")
    text = (package / SANITIZER).read_text()
    if third_party:
        text += "\n" + (package / THIRD_PARTY).read_text()
    path = cache_dir() / (THIRD_PARTY if third_party else SANITIZER)
    try:
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f".{path.name}.{os.getpid()}")
            part.write_text(text)
            os.replace(part, path)
    except OSError:
        if third_party:
            raise
        return Path(str(package / SANITIZER))
    return path


def version_line() -> str:
    """``pgnb 0.1.0 (torch 2.13.0, ipyparallel 9.2.0, Python 3.11.7)``: read from the installed metadata, so
    ``--version`` imports neither torch nor ipyparallel."""
    from importlib.metadata import PackageNotFoundError, version
    from platform import python_version

    from . import __version__

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    return f"pgnb {__version__} ({installed('torch')}, {installed('ipyparallel')}, Python {python_version()})"


def mcp_server() -> int:
    """``pgnb mcp``, or one line saying what to install."""
    from importlib.util import find_spec

    if find_spec("mcp") is None:
        print('pgnb mcp needs the MCP SDK: pip install "pgnb[mcp]"', file=sys.stderr)
        return 1
    from .agent.stdio import main as serve

    return serve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgnb", description="torch.distributed worlds on ipyparallel engines")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="start a world, show its status, all_reduce once, shut down")
    d.add_argument("--world", "-n", type=int, default=4)
    d.add_argument("--backend", "-b", default="gloo")
    s = sub.add_parser("nbval-sanitize", help="write pgnb's nbval sanitizer to a per-user cache directory and "
                       "print its path (pass it as --nbval-sanitize-with=PATH)")
    s.add_argument("--third-party", action="store_true",
                   help="also normalise other libraries' output: logging timestamps, torch multiprocessing's "
                        "process numbers, the notebook kernel's cell file paths (docs/testing_notebooks.md)")
    sub.add_parser("mcp", help="an MCP server over stdio holding one warm world, for coding agents "
                   "(docs/agents.md; needs pip install \"pgnb[mcp]\")")
    args = parser.parse_args(argv)
    if args.command == "mcp":
        return mcp_server()
    if args.command == "demo":
        from .errors import PgnbError

        try:
            return demo(args.world, args.backend)
        except PgnbError as e:
            print(f"pgnb: {e}", file=sys.stderr)
            return 1
    if args.command == "nbval-sanitize":
        try:
            print(sanitizer_file(args.third_party))
        except OSError as e:
            print(f"pgnb: cannot write the sanitizer to {cache_dir()}: {e}", file=sys.stderr)
            return 1
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
