"""One variable on every rank, as one table (the model behind ``%pg_show`` / ``pgnb.show``).

Each rank sends only what is shown (``pgnb.rank.values.summarize``: the
first ``MAX_ELEMENTS`` elements of a tensor, its dtype and shape), never the
whole tensor. ``RankValues`` holds one summary per rank and says what
differs across ranks; its text form is deterministic (nbval compares it).

A DTensor is shown as each rank's local shard, with the mesh, the placements,
the global shape and the slice of the global tensor each rank holds. A module
(``torch.nn.Module``) on every rank is one table of its parameters: the
global shape, the placements, and the shape of each rank's shard (what
``fully_shard`` and ``parallelize_module`` did to it).
``pgnb.notebook.show`` draws it as HTML coloured by value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._wire import ParamSummary, ValueSummary
from ..errors import SpecError
from ..rank.values import MAX_ELEMENTS, fetch, summarize
from .dispatch import Dispatch
from .text import ranks_text

__all__ = ["MAX_ELEMENTS", "SHOW_TIMEOUT", "RankValues", "gather", "summarize"]

MISSING = "(not defined)"
#: Seconds every rank has to send its summary (a rank that holds the GIL never does; it is then reported busy).
SHOW_TIMEOUT = 10.0


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
            facts = row.get("dtensor")
            if facts is not None:
                return f"DTensor {row['dtype']}{_shape(facts['shape'])}"
            return f"{row['dtype']}{_shape(row['shape'])}"
        if kind == "missing":
            return MISSING
        return str(row["type"])

    def _identity(self, row: ValueSummary) -> str:
        """What every rank should agree on: the type text, and a DTensor's mesh shape and placements
        (not the mesh's ranks: each rank's slice of a 2-D mesh, ``mesh["tp"]``, holds other ranks)."""
        facts = row.get("dtensor")
        if facts is None:
            return self.type_text(row)
        return f"{self.type_text(row)} {_mesh_shape(facts['mesh'])} {facts['dims']} {facts['placements']}"

    @property
    def is_dtensor(self) -> bool:
        """Some rank holds a DTensor: the table shows local shards and the slices they hold."""
        return any("dtensor" in r for r in self.rows)

    @property
    def is_module(self) -> bool:
        """Every rank that has the value holds a module: the table is one of parameters."""
        rows = self.defined
        return bool(rows) and all(r["kind"] == "module" for r in rows)

    @property
    def defined(self) -> list[ValueSummary]:
        return [r for r in self.rows if r["kind"] != "missing"]

    @property
    def missing(self) -> list[int]:
        return [rank for rank, r in zip(self.ranks, self.rows, strict=True) if r["kind"] == "missing"]

    @property
    def majority(self) -> str:
        """The most common type text among the ranks that have the value (ties: the lowest rank's)."""
        texts = [self._identity(r) for r in self.defined]
        return max(texts, key=lambda t: (texts.count(t), -texts.index(t))) if texts else ""

    def differs(self) -> str:
        """``""`` when every rank that has the value holds the same type, dtype and shape; else what differs."""
        rows = self.defined
        if len({r["kind"] for r in rows}) > 1:
            return "types"
        if rows and self.is_dtensor:
            if not all("dtensor" in r for r in rows) or len({self.type_text(r) for r in rows}) > 1:
                return "types"
            if len({(_mesh_shape(r["dtensor"]["mesh"]), str(r["dtensor"]["dims"])) for r in rows}) > 1:
                return "meshes"
            if len({tuple(r["dtensor"]["placements"]) for r in rows}) > 1:
                return "placements"
            return ""  # local shards may differ in shape: that is what sharding does
        if rows and rows[0]["kind"] == "module":
            return "parameters" if any(p.flagged for p in self.params()) else ""
        if rows and rows[0]["kind"] == "tensor":
            if len({r["dtype"] for r in rows}) > 1:
                return "dtypes" if len({tuple(r["shape"]) for r in rows}) == 1 else "dtypes and shapes"
            if len({tuple(r["shape"]) for r in rows}) > 1:
                return "shapes"
        elif len({self.type_text(r) for r in rows}) > 1:
            return "types"
        return ""

    def flagged(self, row: ValueSummary) -> bool:
        return row["kind"] != "missing" and bool(self.differs()) and self._identity(row) != self.majority

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
        elif rows and self.is_dtensor:
            facts = rows[0]["dtensor"]
            meshes = list(dict.fromkeys(str(r["dtensor"]["mesh"]) for r in rows))
            head += f": {self.type_text(rows[0])}, {_mesh_text(meshes, facts['dims'])}, " \
                    f"placements {_list(facts['placements'])}"
        elif rows and self.is_module:
            head += f": {self._module_facts()}"
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
        if kind == "module":
            n = len(row.get("params", [])) + row.get("more", 0)
            return [f"{n} parameter{'s' if n != 1 else ''}"]
        return [MISSING]

    def lead_columns(self) -> list[str]:
        """The columns between ``rank`` and the values: the type when it differs; a DTensor's shard."""
        return (["type"] if self.differs() else []) + (["local", "shard"] if self.is_dtensor else [])

    def lead(self, row: ValueSummary) -> list[str]:
        out = [self.type_text(row)] if self.differs() else []
        if self.is_dtensor:
            facts = row.get("dtensor")
            out += ["", ""] if facts is None else [_shape(row["shape"]), shard_text(row["shape"], facts)]
        return out

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
        if self.is_module:
            return "\n".join([self.header(), *_aligned(self.module_table())])
        head = ["rank", *self.lead_columns(), *self.columns()]
        table = [head]
        for rank, row in zip(self.ranks, self.rows, strict=True):
            mark = "!" if self.flagged(row) else ""
            table.append([f"{rank}{mark}", *self.lead(row), *self.cells(row)])
        return "\n".join([self.header(), *_aligned(table)])

    # -- modules: one row per parameter, one column per rank --
    def params(self) -> list[ParamRow]:
        """Each parameter once (in the order the ranks list them), with every rank's shard."""
        order: list[str] = []
        found: dict[str, dict[int, ParamSummary]] = {}
        for rank, row in zip(self.ranks, self.rows, strict=True):
            for p in row.get("params", []) if row["kind"] == "module" else []:
                if p["name"] not in found:
                    order.append(p["name"])
                    found[p["name"]] = {}
                found[p["name"]][rank] = p
        having = [rank for rank, row in zip(self.ranks, self.rows, strict=True) if row["kind"] == "module"]
        out = []
        for name in order:
            per = found[name]
            first = next(iter(per.values()))
            agree = len({(p["dtype"], tuple(p["shape"]), tuple(p["placements"] or ()), str(p["mesh"]))
                         for p in per.values()}) == 1
            out.append(ParamRow(name, first, {r: per.get(r) for r in having},
                                flagged=not agree or len(per) < len(having)))
        return out

    def _module_facts(self) -> str:
        rows = self.defined
        types = sorted({str(r["type"]) for r in rows})
        n = max(len(r.get("params", [])) + r.get("more", 0) for r in rows)
        meshes = sorted({str(p["mesh"]) for r in rows for p in r.get("params", []) if p["mesh"] is not None})
        text = f"{'/'.join(types)}, {n} parameter{'s' if n != 1 else ''}"
        sharded = sum(1 for p in rows[0].get("params", []) if p["placements"] is not None)
        if not sharded:
            return text + ", plain tensors (each rank holds them whole)"
        return text + f", {sharded} DTensor{'s' if sharded != 1 else ''} on mesh {', '.join(meshes)}"

    def module_table(self) -> list[list[str]]:
        """The parameter table: name, global shape, placements, then each rank's shard shape."""
        having = [(rank, row) for rank, row in zip(self.ranks, self.rows, strict=True) if row["kind"] == "module"]
        table = [["parameter", "global", "placements", *(f"rank {r}" for r, _ in having)]]
        totals = dict.fromkeys((r for r, _ in having), 0)
        whole = 0
        for p in self.params():
            cells = []
            for r, _ in having:
                mine = p.ranks.get(r)
                cells.append("-" if mine is None else _shape(mine["local"]))
                totals[r] += 0 if mine is None else math.prod(mine["local"])
            whole += math.prod(p.first["shape"])
            table.append([p.name + ("!" if p.flagged else ""), f"{p.first['dtype']}{_shape(p.first['shape'])}",
                          "-" if p.first["placements"] is None else _list(p.first["placements"]), *cells])
        more = max((row.get("more", 0) for _, row in having), default=0)
        if more:
            table.append([f"… +{more} more", "", "", *("" for _ in having)])
        else:
            table.append(["elements", str(whole), "", *(str(totals[r]) for r, _ in having)])
        return table

    def __repr__(self) -> str:
        return self.text()



@dataclass(frozen=True)
class ParamRow:
    """One parameter of a module across ranks (``RankValues.params``)."""

    name: str
    first: ParamSummary  # the first rank's (global shape, dtype, placements)
    ranks: dict[int, ParamSummary | None]  # rank -> its shard (None: it has no such parameter)
    flagged: bool  # the ranks disagree about it, or some rank lacks it

    def share(self, rank: int) -> float | None:
        """The fraction of the parameter's elements ``rank`` holds."""
        mine = self.ranks.get(rank)
        whole = math.prod(self.first["shape"])
        return None if mine is None or not whole else math.prod(mine["local"]) / whole


def _aligned(table: list[list[str]]) -> list[str]:
    width = max(len(r) for r in table)
    for r in table:
        r.extend([""] * (width - len(r)))
    widths = [max(len(r[i]) for r in table) for i in range(width)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def _shape(shape: Sequence[int]) -> str:
    return f"[{','.join(map(str, shape))}]"


def _list(items: Sequence[str]) -> str:
    return f"[{', '.join(items)}]"


def _mesh_text(meshes: Sequence[str], dims: Sequence[str] | None) -> str:
    """``mesh [0, 1]``, or ``mesh [[0, 1], [2, 3]] (dp, tp)`` with dimension names; ``meshes [0, 1], [2, 3] (tp)``
    when the ranks hold slices of a bigger mesh."""
    return f"mesh{'es' if len(meshes) > 1 else ''} {', '.join(meshes)}" + (f" ({', '.join(dims)})" if dims else "")


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    """The shape of a mesh given as nested lists of ranks."""
    shape: list[int] = []
    while isinstance(mesh, list):
        shape.append(len(mesh))
        mesh = mesh[0] if mesh else None
    return tuple(shape)


def shard_text(local: Sequence[int], facts: Any) -> str:
    """Which part of the global tensor a rank's shard is: ``[0:3, :]``; ``all`` when it holds it whole."""
    offset = facts.get("offset")
    if offset is None or len(offset) != len(local):
        return "?"
    parts = [":" if o == 0 and n == g else f"{o}:{o + n}"
             for o, n, g in zip(offset, local, facts["shape"], strict=True)]
    text = "all" if all(p == ":" for p in parts) else f"[{', '.join(parts)}]"
    return text + (" partial" if any(p.startswith("Partial") for p in facts["placements"]) else "")


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
           world: Dispatch | None = None) -> RankValues:
    """The per-rank view of ``what``: a variable name on ``world``'s ranks (each has ``SHOW_TIMEOUT`` s to
    answer), or a list of values indexed by rank."""
    if isinstance(what, str):
        if not what.isidentifier():
            raise SpecError(f"cannot show {what!r}: give the plain name of a variable on the ranks")
        if world is None:
            raise SpecError(f"cannot show {what!r}: no world to ask (pass world=)")
        chosen = None if ranks is None else sorted(ranks)
        rows = world.run(fetch, what, ranks=chosen, timeout=SHOW_TIMEOUT)
        shown = list(range(len(world.engine_ids))) if chosen is None else chosen
        return RankValues(what, tuple(shown), tuple(rows))
    values = list(what)
    shown = list(range(len(values))) if ranks is None else sorted(ranks)
    return RankValues("value", tuple(shown), tuple(summarize(values[r]) for r in shown))
