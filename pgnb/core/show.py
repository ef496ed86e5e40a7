"""One variable on every rank, as one table (the model behind ``%pg_show`` / ``pgnb.show``).

Each rank sends only what is shown (``pgnb.rank.values.summarize``: the
first ``MAX_ELEMENTS`` elements of a tensor, its dtype and shape), never the
whole tensor. ``RankValues`` holds one summary per rank and says what
differs across ranks; its text form is deterministic (nbval compares it).
``pgnb.notebook.show`` draws it as HTML coloured by value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._wire import ValueSummary
from ..errors import SpecError
from ..rank.values import MAX_ELEMENTS, fetch, summarize
from .text import ranks_text
from .world import World

__all__ = ["MAX_ELEMENTS", "RankValues", "gather", "summarize"]

MISSING = "(not defined)"


@dataclass(frozen=True)
class RankValues:
    """One variable across ranks: ``rows[i]`` is rank ``ranks[i]``'s summary."""

    name: str
    ranks: tuple[int, ...]
    rows: tuple[ValueSummary, ...]

    # -- facts --
    def type_text(self, row: ValueSummary) -> str:
        kind = row["kind"]
        if kind == "tensor":
            return f"{row['dtype']}[{','.join(map(str, row['shape']))}]"
        if kind == "missing":
            return MISSING
        return str(row["type"])

    @property
    def defined(self) -> list[ValueSummary]:
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

    def flagged(self, row: ValueSummary) -> bool:
        return row["kind"] != "missing" and bool(self.differs()) and self.type_text(row) != self.majority

    def numbers(self) -> list[float]:
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

    def cells(self, row: ValueSummary) -> list[str]:
        kind = row["kind"]
        if kind == "tensor":
            cells = [number_text(v) for v in row["head"]]
            if row["numel"] > len(row["head"]):
                cells.append(f"… +{row['numel'] - len(row['head'])}")
            return cells
        if kind == "scalar":
            return [number_text(row["value"])]
        if kind == "text":
            return [str(row["value"]) + ("…" if row.get("cut") else "")]
        return [MISSING]

    def columns(self) -> list[str]:
        width = max((len(self.cells(r)) for r in self.rows), default=0)
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
        head = ["rank"] + (["type"] if diff else []) + self.columns()
        table = [head]
        for rank, row in zip(self.ranks, self.rows, strict=True):
            mark = "!" if self.flagged(row) else ""
            table.append([f"{rank}{mark}"] + ([self.type_text(row)] if diff else []) + self.cells(row))
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



def number_text(v: Any) -> str:
    """A value as the table shows it: whole floats with a point (``3.``), others to 4 significant digits."""
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
           world: World | None = None) -> RankValues:
    """The per-rank view of ``what``: a variable name on ``world``'s ranks, or a list of values indexed by rank."""
    if isinstance(what, str):
        if not what.isidentifier():
            raise SpecError(f"cannot show {what!r}: give the plain name of a variable on the ranks")
        if world is None:
            raise SpecError(f"cannot show {what!r}: no world to ask (pass world=)")
        chosen = None if ranks is None else sorted(ranks)
        rows = world.run(fetch, what, ranks=chosen)
        shown = list(range(len(world.engine_ids))) if chosen is None else chosen
        return RankValues(what, tuple(shown), tuple(rows))
    values = list(what)
    shown = list(range(len(values))) if ranks is None else sorted(ranks)
    return RankValues("value", tuple(shown), tuple(summarize(values[r]) for r in shown))
