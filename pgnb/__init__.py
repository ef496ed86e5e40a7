"""pgnb: explore torch.distributed from a Jupyter notebook.

``%load_ext pgnb`` then ``%pg_init --backend gloo --world 4``; or, from plain
Python, ``with pgnb.Sandbox(backend="gloo", world=4) as sb: ...``.

The public names resolve lazily (PEP 562): an engine, the zygote or the
reaper that imports ``pgnb.rank`` or ``pgnb.procs`` loads nothing of the
kernel side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC = {
    "Sandbox": "pgnb.core.sandbox",
    "RankStatus": "pgnb.core.snapshot",
    "Snapshot": "pgnb.core.snapshot",
    "WorldSpec": "pgnb.spec",
    "CellResult": "pgnb.core.results",
    "RankValue": "pgnb.core.results",
    "CellInterrupted": "pgnb.core.results",
    "Trace": "pgnb.core.trace",
    "current": "pgnb.notebook.current",
    "show": "pgnb.notebook.show",
    "PgnbError": "pgnb.errors",
    "SpecError": "pgnb.errors",
    "BackendUnavailable": "pgnb.errors",
    "NotStartedError": "pgnb.errors",
    "EngineStartError": "pgnb.errors",
    "InitError": "pgnb.errors",
    "InitTimeout": "pgnb.errors",
    "RankError": "pgnb.errors",
    "CellTimeout": "pgnb.errors",
    "RankLost": "pgnb.errors",
}
#: ``pgnb.cells.RankValue`` was documented before the package was laid out by process
_MODULE_ALIASES = {"cells": "pgnb.core.results"}

__all__ = [*_PUBLIC, "load_ipython_extension"]

if TYPE_CHECKING:
    from .core.results import CellInterrupted as CellInterrupted, CellResult as CellResult, RankValue as RankValue
    from .core.sandbox import Sandbox as Sandbox
    from .core.snapshot import RankStatus as RankStatus, Snapshot as Snapshot
    from .core.trace import Trace as Trace
    from .errors import (
        BackendUnavailable as BackendUnavailable,
        CellTimeout as CellTimeout,
        EngineStartError as EngineStartError,
        InitError as InitError,
        InitTimeout as InitTimeout,
        NotStartedError as NotStartedError,
        PgnbError as PgnbError,
        RankError as RankError,
        RankLost as RankLost,
        SpecError as SpecError,
    )
    from .notebook.current import current as current
    from .notebook.show import show as show
    from .spec import WorldSpec as WorldSpec


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _MODULE_ALIASES:
        value = importlib.import_module(_MODULE_ALIASES[name])
    else:
        raise AttributeError(f"module 'pgnb' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext pgnb``: register the magics on this shell (and, in a kernel with a debugger, JupyterLab's
    Debugger panel reaches the ranks of ``%%pg`` cells)."""
    from .debugger import install
    from .notebook.exit import stop_worlds_when_exiting
    from .notebook.magics import PgMagics
    from .notebook.mcp import McpMagics

    stop_worlds_when_exiting(ip)
    ip.register_magics(PgMagics(ip, panel=install(ip)))
    ip.register_magics(McpMagics(ip))
