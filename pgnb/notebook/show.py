"""``%pg_show`` / ``pgnb.show``: one variable of every rank as an HTML table coloured by value.

One colour scale for the whole grid, so "all ranks hold the same" and
"rank 2 holds twice as much" are visible at a glance. The HTML renders
wherever notebooks render, widgets or not; beside it the deterministic
``text/plain`` table (``RankValues.text``) is what nbval compares.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from IPython.display import display

from ..core.sandbox import Sandbox, dispatch_of
from ..core.show import RankValues, gather, number_text
from ..errors import NotStartedError
from .current import current

#: Colour scale (viridis, five stops): low values dark blue, high values yellow.
_STOPS = ((0.267, 0.005, 0.329), (0.231, 0.322, 0.545), (0.129, 0.569, 0.549),
      (0.369, 0.788, 0.384), (0.992, 0.906, 0.145))


class ShowView:
    """What ``%pg_show`` displays: the HTML table, and the text table beside it."""

    def __init__(self, values: RankValues) -> None:
        self.values = values

    def __repr__(self) -> str:
        return self.values.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.values.text(), "text/html": to_html(self.values)}


def show(what: str | Sequence[Any], ranks: Iterable[int] | None = None, sandbox: Sandbox | None = None) -> None:
    """Display ``what`` across ranks: a variable name on the ranks (``pgnb.show("t")``),
    or per-rank values you already have (``pgnb.show(_pg)``)."""
    world = sandbox or current()
    if isinstance(what, str) and world is None:
        raise NotStartedError()
    display(ShowView(gather(what, ranks=ranks, world=None if world is None else dispatch_of(world))))


def to_html(v: RankValues) -> str:
    """A table coloured by value (one scale for all ranks); deterministic like the text.

    A module is a table of its parameters, each rank's shard coloured by the share
    of the parameter it holds."""
    if v.is_module:
        return _module_html(v)
    nums = v.numbers()
    lo, hi = (min(nums), max(nums)) if nums else (0.0, 0.0)
    lead = v.lead_columns()
    cols = v.columns()
    th = "padding:2px 8px;text-align:center;font-weight:normal;color:#666"
    out = ['<div class="pgnb-show" style="display:inline-block;font-family:monospace;font-size:12px">',
           f'<div style="margin-bottom:4px">{html.escape(v.header())}</div>',
           '<table style="border-collapse:collapse">', "<tr>", f'<th style="{th}">rank</th>']
    out.extend(f'<th style="{th}">{html.escape(c)}</th>' for c in (*lead, *cols))
    out.append("</tr>")
    for rank, row in zip(v.ranks, v.rows, strict=True):
        bad = v.flagged(row)
        style = "padding:2px 8px;text-align:right" + (";color:#c62828;font-weight:bold" if bad else "")
        out.append(f'<tr><td style="{style}">{rank}{"!" if bad else ""}</td>')
        out.extend(f'<td style="{style}">{html.escape(c)}</td>' for c in v.lead(row))
        values = row.get("head", []) if row["kind"] == "tensor" else [row.get("value")]
        for i, cell in enumerate(v.cells(row)):
            value = values[i] if i < len(values) else None
            out.append(_td(cell, value, lo, hi, row["kind"] in ("tensor", "scalar")))
        out.append("</tr>")
    out.append("</table>")
    if nums and lo != hi:
        out.append(f'<div style="margin-top:4px;color:#666">colour: {html.escape(number_text(lo))} '
                   f'{_legend()} {html.escape(number_text(hi))}</div>')
    out.append("</div>")
    return "".join(out)


def _module_html(v: RankValues) -> str:
    table = v.module_table()
    params = v.params()
    th = "padding:2px 8px;text-align:center;font-weight:normal;color:#666"
    td = "padding:2px 8px;text-align:right;border:1px solid #fff"
    out = ['<div class="pgnb-show" style="display:inline-block;font-family:monospace;font-size:12px">',
           f'<div style="margin-bottom:4px">{html.escape(v.header())}</div>',
           '<table style="border-collapse:collapse">', "<tr>"]
    out.extend(f'<th style="{th}">{html.escape(c)}</th>' for c in table[0])
    out.append("</tr>")
    ranks = [int(c.split()[1]) for c in table[0][3:]]
    for i, row in enumerate(table[1:]):
        p = params[i] if i < len(params) else None
        bad = p is not None and p.flagged
        style = td + (";color:#c62828;font-weight:bold" if bad else "")
        out.append("<tr>")
        out.extend(f'<td style="{style}">{html.escape(c)}</td>' for c in row[:3])
        for rank, cell in zip(ranks, row[3:], strict=True):
            share = None if p is None else p.share(rank)
            if share is None:
                out.append(f'<td style="{td}">{html.escape(cell)}</td>')
                continue
            r, g, b = colour(share, 0.0, 1.0)
            ink = "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#fff"
            title = f"rank {rank} holds {share:.0%} of {p.name}" if p is not None else ""
            out.append(f'<td style="{td};background:{_hex((r, g, b))};color:{ink}" title="{html.escape(title)}">'
                       f"{html.escape(cell)}</td>")
        out.append("</tr>")
    out.append("</table>")
    out.append(f'<div style="margin-top:4px;color:#666">colour: the share of each parameter a rank holds, '
               f'0 {_legend()} 1</div></div>')
    return "".join(out)


def _td(text: str, value: Any, lo: float, hi: float, numeric: bool) -> str:
    style = "padding:2px 8px;text-align:right;border:1px solid #fff"
    if numeric and isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        r, g, b = colour(float(value), lo, hi)
        ink = "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#fff"
        style += f";background:{_hex((r, g, b))};color:{ink}"
    return f'<td style="{style}">{html.escape(text)}</td>'


def colour(value: float, lo: float, hi: float) -> tuple[float, float, float]:
    """The value's colour on the shared scale (the middle colour when all values are equal)."""
    x = 0.5 if hi <= lo else (value - lo) / (hi - lo)
    x = min(max(x, 0.0), 1.0) * (len(_STOPS) - 1)
    i = min(int(x), len(_STOPS) - 2)
    f = x - i
    a, b = _STOPS[i], _STOPS[i + 1]
    return (a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f)


def _hex(rgb: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


def _legend() -> str:
    cells = "".join(f'<span style="display:inline-block;width:14px;height:10px;background:{_hex(colour(i, 0, 8))}">'
                    "</span>" for i in range(9))
    return f'<span style="vertical-align:middle">{cells}</span>'
