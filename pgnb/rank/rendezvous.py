"""The rendezvous variables on a rank: what pgnb set at init, put back after a cell that changed them.

``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are pgnb's: it
sets them at every init (``pgnb.rank.engine.init_rank``). A cell that rewrites them (a
tutorial's ``setup()`` doing ``os.environ["MASTER_PORT"] = "12355"``) keeps its values for
itself only: torchrun-style code in a later cell reads the world's, and the cell says so once.
Stdlib only; nothing of the kernel side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The variables of pgnb's rendezvous that no cell keeps changed.
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
_SET: dict[str, str] = {}


def remember(env: Mapping[str, str]) -> None:
    """At init: the values of ``RENDEZVOUS_VARS`` pgnb put in ``env`` (and in ``os.environ``)."""
    _SET.clear()
    _SET.update({k: env[k] for k in RENDEZVOUS_VARS if k in env})


def restore() -> str:
    """After a cell: put back what ``remember`` saw; one line naming the variables the cell changed
    or removed ("" when it changed none)."""
    changed = [k for k, v in _SET.items() if os.environ.get(k) != v]
    if not changed:
        return ""
    os.environ.update({k: _SET[k] for k in changed})
    value = "value" if len(changed) == 1 else "values"
    return (f"pgnb: this cell changed {', '.join(changed)}; later cells see pgnb's {value} again "
            "(the rendezvous variables are pgnb's)")
