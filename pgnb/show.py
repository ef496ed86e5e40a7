"""``pgnb.show(name)`` / ``%pg_show name``: one variable, on every rank, in one view.

Tensors become a rank × element grid whose cells are coloured by value (one
scale for the whole grid, so "all ranks hold the same" and "rank 2 holds
twice as much" are visible at a glance); scalars and short strings a column.
When ranks disagree on the type, dtype or shape, the view says so and marks
the rows that differ.

The view is HTML (a table with inline colours: it renders wherever notebooks
render, widgets or not) plus a deterministic ``text/plain`` table for nbval
and terminals. Each rank sends only what is shown (the first
``MAX_ELEMENTS`` elements of a tensor, its dtype and shape), never the whole
tensor. ``summarize`` runs on the ranks, so this module imports nothing heavy
at the top.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sandbox import Sandbox

#: Elements shown per rank (the rest is counted, not sent).
MAX_ELEMENTS = 16
#: Characters of a string or another object's repr shown per rank.
MAX_TEXT = 60
#: Colour scale (viridis, five stops): low values dark blue, high values yellow.
_STOPS = ((0.267, 0.005, 0.329), (0.231, 0.322, 0.545), (0.129, 0.569, 0.549),
          (0.369, 0.788, 0.384), (0.992, 0.906, 0.145))
MISSING = "(not defined)"


# ---- on the ranks --------------------------------------------------------------------
def summarize(value: Any, limit: int = MAX_ELEMENTS) -> dict[str, Any]:
    """What the view needs of one rank's value: kind, type text, the first ``limit`` elements."""
    import sys

    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)[:limit].cpu()
        dtype = str(value.dtype).replace("torch.", "")
        return {"kind": "tensor", "dtype": dtype, "shape": list(value.shape), "numel": value.numel(),
                "head": _plain(flat.tolist()), "device": value.device.type}
    if np is not None and isinstance(value, np.ndarray):
        return {"kind": "tensor", "dtype": f"numpy {value.dtype}", "shape": list(value.shape), "numel": int(value.size),
                "head": _plain(value.reshape(-1)[:limit].tolist()), "device": "cpu"}
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return {"kind": "scalar", "type": type(value).__name__, "value": value}
    if isinstance(value, str):
        return {"kind": "text", "type": "str", "value": value[:MAX_TEXT], "cut": len(value) > MAX_TEXT}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bool, int, float)) for v in value):
        return {"kind": "tensor", "dtype": type(value).__name__, "shape": [len(value)], "numel": len(value),
                "head": list(value[:limit]), "device": "cpu"}
    text = repr(value)
    return {"kind": "text", "type": type(value).__name__, "value": text[:MAX_TEXT], "cut": len(text) > MAX_TEXT}


def _plain(values: list[Any]) -> list[Any]:
    return [v if isinstance(v, (bool, int, float)) else str(v) for v in values]


def fetch(name: str, limit: int = MAX_ELEMENTS) -> dict[str, Any]:
    """On a rank: ``summarize`` the variable ``name`` of the rank's namespace (or say it is missing)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        return {"kind": "missing"}
    return summarize(ns[name], limit)


# ---- in the kernel -----------------------------------------------------------------------
@dataclass(frozen=True)
class RankValues:
    """One variable across ranks: ``rows[i]`` is rank ``ranks[i]``'s summary."""

    name: str
    ranks: tuple[int, ...]
    rows: tuple[dict[str, Any], ...]

    # -- facts --
    def type_text(self, row: dict[str, Any]) -> str:
        kind = row["kind"]
        if kind == "tensor":
            return f"{row['dtype']}[{','.join(map(str, row['shape']))}]"
        if kind == "missing":
            return MISSING
        return str(row["type"])

    @property
    def defined(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["kind"] != "missing"]

    @property
    def missing(self) -> list[int]:
        return [rank for rank, r in zip(self.ranks, self.rows, strict=True) if r["kind"] == "missing"]

    @property
    def majority(self) -> str:
        """The most common type text among the ranks that have the value (ties: the lowest rank's)."""
        texts = [self.type_text(r) for r in self.defined]
        return max(texts, key=lambda t: (texts.count(t), -texts.index(t))) if texts else ""

    def differs(self) -> str:
        """``""`` when every rank that has the value holds the same type, dtype and shape; else what differs."""
        rows = self.defined
        if len({r["kind"] for r in rows}) > 1:
            return "types"
        if rows and rows[0]["kind"] == "tensor":
            if len({r["dtype"] for r in rows}) > 1:
                return "dtypes" if len({tuple(r["shape"]) for r in rows}) == 1 else "dtypes and shapes"
            if len({tuple(r["shape"]) for r in rows}) > 1:
                return "shapes"
        elif len({self.type_text(r) for r in rows}) > 1:
            return "types"
        return ""

    def _flagged(self, row: dict[str, Any]) -> bool:
        return row["kind"] != "missing" and bool(self.differs()) and self.type_text(row) != self.majority

    def _numbers(self) -> list[float]:
        out: list[float] = []
        for r in self.rows:
            vals = r.get("head", []) if r["kind"] == "tensor" else [r.get("value")] if r["kind"] == "scalar" else []
            out.extend(float(v) for v in vals if isinstance(v, (bool, int, float)) and math.isfinite(float(v)))
        return out

    @property
    def is_grid(self) -> bool:
        return any(r["kind"] == "tensor" for r in self.rows)

    # -- text --
    def header(self) -> str:
        from .trace import ranks_text

        head = f"{self.name} on {ranks_text(self.ranks)}"
        diff = self.differs()
        rows = self.defined
        if diff:
            head += f": {diff} differ across ranks (rows marked !)"
        elif rows:
            head += f": {self.type_text(rows[0]) if rows[0]['kind'] == 'tensor' else rows[0]['type']}"
        missing = self.missing
        if missing and rows:
            head += f"; not defined on {ranks_text(missing)}"
        elif missing:
            head += ": not defined on any rank"
        return head

    def _cells(self, row: dict[str, Any]) -> list[str]:
        kind = row["kind"]
        if kind == "tensor":
            cells = [_fmt(v) for v in row["head"]]
            if row["numel"] > len(row["head"]):
                cells.append(f"… +{row['numel'] - len(row['head'])}")
            return cells
        if kind == "scalar":
            return [_fmt(row["value"])]
        if kind == "text":
            return [str(row["value"]) + ("…" if row.get("cut") else "")]
        return [MISSING]

    def _columns(self) -> list[str]:
        width = max((len(self._cells(r)) for r in self.rows), default=0)
        if not self.is_grid:
            return ["value"]
        shapes = {tuple(r["shape"]) for r in self.rows if r["kind"] == "tensor"}
        shape = next(iter(shapes)) if len(shapes) == 1 else None
        cols = []
        for i in range(width):
            cols.append(_index(i, shape) if shape is not None and len(shape) > 1 else f"[{i}]")
        longest = max((r for r in self.rows if r["kind"] == "tensor"), key=lambda r: r["numel"])
        if longest["numel"] > len(longest["head"]) and cols:
            cols[-1] = "…"
        return cols

    def text(self) -> str:
        """The deterministic table: the same values give the same text on every run."""
        diff = self.differs()
        head = ["rank"] + (["type"] if diff else []) + self._columns()
        table = [head]
        for rank, row in zip(self.ranks, self.rows, strict=True):
            mark = "!" if self._flagged(row) else ""
            table.append([f"{rank}{mark}"] + ([self.type_text(row)] if diff else []) + self._cells(row))
        width = max(len(r) for r in table)
        for r in table:
            r.extend([""] * (width - len(r)))
        widths = [max(len(r[i]) for r in table) for i in range(width)]
        lines = [self.header()]
        for r in table:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    # -- html --
    def html(self) -> str:
        """A table coloured by value (one scale for all ranks); deterministic like the text."""
        nums = self._numbers()
        lo, hi = (min(nums), max(nums)) if nums else (0.0, 0.0)
        diff = self.differs()
        cols = self._columns()
        th = "padding:2px 8px;text-align:center;font-weight:normal;color:#666"
        out = ['<div class="pgnb-show" style="display:inline-block;font-family:monospace;font-size:12px">',
               f'<div style="margin-bottom:4px">{html.escape(self.header())}</div>',
               '<table style="border-collapse:collapse">', "<tr>", f'<th style="{th}">rank</th>']
        if diff:
            out.append(f'<th style="{th}">type</th>')
        out.extend(f'<th style="{th}">{html.escape(c)}</th>' for c in cols)
        out.append("</tr>")
        for rank, row in zip(self.ranks, self.rows, strict=True):
            bad = self._flagged(row)
            style = "padding:2px 8px;text-align:right" + (";color:#c62828;font-weight:bold" if bad else "")
            out.append(f'<tr><td style="{style}">{rank}{"!" if bad else ""}</td>')
            if diff:
                out.append(f'<td style="{style}">{html.escape(self.type_text(row))}</td>')
            values = row.get("head", []) if row["kind"] == "tensor" else [row.get("value")]
            for i, cell in enumerate(self._cells(row)):
                v = values[i] if i < len(values) else None
                out.append(_td(cell, v, lo, hi, row["kind"] in ("tensor", "scalar")))
            out.append("</tr>")
        out.append("</table>")
        if nums and lo != hi:
            out.append(f'<div style="margin-top:4px;color:#666">colour: {html.escape(_fmt(lo))} '
                       f'{_legend()} {html.escape(_fmt(hi))}</div>')
        out.append("</div>")
        return "".join(out)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


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


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == int(v) and abs(v) < 1e6:
            return f"{int(v)}."
        return f"{v:.4g}"
    return str(v)


def _index(i: int, shape: tuple[int, ...]) -> str:
    idx = []
    for n in reversed(shape):
        idx.append(i % n if n else 0)
        i //= max(n, 1)
    return "[" + ",".join(map(str, reversed(idx))) + "]"


def gather(what: str | Sequence[Any], ranks: Iterable[int] | None = None,
           sandbox: Sandbox | None = None) -> RankValues:
    """The per-rank view of ``what``: a variable name on the ranks, or a list of values indexed by rank."""
    from .errors import NotStartedError, SpecError
    from .sandbox import current

    if isinstance(what, str):
        if not what.isidentifier():
            raise SpecError(f"cannot show {what!r}: give the plain name of a variable on the ranks")
        sb = sandbox or current()
        if sb is None:
            raise NotStartedError("no process group yet: run `%pg_init` (Sandbox.start()) first")
        chosen = None if ranks is None else sorted(ranks)
        rows = sb.run(fetch, what, ranks=chosen)
        shown = list(range(len(sb.engine_ids))) if chosen is None else chosen
        return RankValues(what, tuple(shown), tuple(rows))
    values = list(what)
    shown = list(range(len(values))) if ranks is None else sorted(ranks)
    return RankValues("value", tuple(shown), tuple(summarize(values[r]) for r in shown))


def show(what: str | Sequence[Any], ranks: Iterable[int] | None = None, sandbox: Sandbox | None = None) -> None:
    """Display ``what`` across ranks: a variable name on the ranks (``pgnb.show("t")``),
    or per-rank values you already have (``pgnb.show(_pg)``)."""
    from IPython.display import display

    display(gather(what, ranks=ranks, sandbox=sandbox))
