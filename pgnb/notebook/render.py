"""Showing a ``CellResult`` in the cell that ran it: each rank's output under ``[rank N]``, in rank order."""

from __future__ import annotations

import sys
from dataclasses import replace

from IPython.display import display

from ..core.results import CellResult


def render_cell_result(result: CellResult, streamed: bool = False) -> None:
    """Show ``result.pieces()`` in order.

    Text goes to the cell's stdout/stderr (flushed at every switch, so the
    order holds), rich outputs go through ``display``. ``streamed``: the ranks'
    own stdout and stderr were already shown as they came (a terminal), so
    only the rest follows (values, displays, errors, where ranks are blocked).
    """
    if streamed:
        result = replace(result, ranks=[replace(r, stdout="", stderr="") for r in result.ranks])
    last = None
    for kind, piece in result.pieces():
        if last is not None and last != kind:
            sys.stdout.flush()
            sys.stderr.flush()
        if kind == "display":
            display(piece, raw=True)
        else:
            (sys.stdout if kind == "stdout" else sys.stderr).write(piece)
        last = kind
    if last is not None:  # nothing shown, nothing to flush (a kernel's flush waits for its I/O thread)
        sys.stdout.flush()
        sys.stderr.flush()
