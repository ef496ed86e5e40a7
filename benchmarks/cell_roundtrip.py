"""``%%pg`` against ipyparallel's own ``%%px``: a trivial cell on the same 4 engines, same run.

Both magics run in one in-process IPython shell on the engines of one pgnb
world; the samples alternate (pg, px, pg, px, ...) so load on the machine
hits both alike. The target is ``%%pg`` <= 1.25x ``%%px``.

    python benchmarks/cell_roundtrip.py [--world 4] [--repeats 50]

prints one JSON object: the median seconds of each and their ratio.
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
from typing import Any

CELL = "x = 1"


def measure(world: int = 4, repeats: int = 50, warmup: int = 5) -> dict[str, Any]:
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="pgnb-bench-"))
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import pgnb
    from pgnb.notebook.current import set_current

    config = Config()
    config.HistoryManager.enabled = False  # no history database in the temporary IPYTHONDIR
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "pgnb")
    with pgnb.Sandbox(backend="gloo", world=world) as sb:
        set_current(sb)
        view = sb.client[sb.engine_ids]
        view.block = True
        view.activate()  # %%px on exactly the engines that are the ranks

        def pg() -> None:
            ip.run_cell_magic("pg", "", CELL)

        def px() -> None:
            ip.run_cell_magic("px", "", CELL)

        samples: dict[str, list[float]] = {"pg": [], "px": []}
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(warmup):
                pg()
                px()
            for _ in range(repeats):
                for name, fn in (("pg", pg), ("px", px)):
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t0)
        set_current(None)
    pg_s, px_s = statistics.median(samples["pg"]), statistics.median(samples["px"])
    return {"world": world, "repeats": repeats, "cell": CELL, "pg_median_s": round(pg_s, 5),
            "px_median_s": round(px_s, 5), "ratio": round(pg_s / px_s, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.world, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
