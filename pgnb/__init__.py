"""pgnb: explore torch.distributed from a Jupyter notebook.

``%load_ext pgnb`` then ``%pg_init --backend gloo --world 4``; or, from plain
Python, ``with pgnb.Sandbox(backend="gloo", world=4) as sb: ...``.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    BackendUnavailable,
    CellTimeout,
    EngineStartError,
    InitError,
    InitTimeout,
    NotStartedError,
    PgnbError,
    RankError,
    RankLost,
    SpecError,
)
from .sandbox import RankStatus, Sandbox, current
from .show import show
from .spec import WorldSpec

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "CellTimeout",
    "EngineStartError",
    "InitError",
    "InitTimeout",
    "NotStartedError",
    "PgnbError",
    "RankError",
    "RankLost",
    "RankStatus",
    "Sandbox",
    "SpecError",
    "WorldSpec",
    "current",
    "show",
    "load_ipython_extension",
]


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext pgnb``: register the magics on this shell."""
    from .magics import PgMagics

    ip.register_magics(PgMagics(ip))
