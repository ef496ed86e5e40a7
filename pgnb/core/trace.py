"""``%%pg --trace``: what every rank's torch.distributed calls did, matched across ranks (a pure model).

While a traced cell runs, each rank records its collective and point-to-point
calls (``pgnb.rank.trace``): op, group, tensor shapes and dtypes, bytes, and
when each call started and returned on the rank's own clock. The kernel reads
the records (``pgnb.core.trace_run``) and moves their times onto its own clock
with each rank's measured ``ClockOffset``.

``Trace`` matches the calls across ranks: the k-th collective a rank makes on
a group pairs with the k-th the other members make on it; the k-th send from
rank a to rank b pairs with the k-th receive on b from a. A rank that arrived
last makes the others wait; calls that do not pair (a different op, shape or
root, or a rank that never made the call) are a mismatch, named in one line
with the ranks and the call number. ``Trace`` shows as deterministic text
(the calls and shapes, who arrived last when that is clear, the mismatches;
no amounts of time); ``pgnb.notebook.trace`` draws it, with the amounts.

Who arrived last is named only when the trace proves it: the gap between the
last arrival and the one before must be large against the noise measured in
the same cell (``Trace.noise``): how far apart the ranks started the cell, how
far apart the other participants of each collective arrived, and how uncertain
the clock offsets are. A machine under load widens all three, so the named
rank (or "no clear straggler") is the same on a quiet and on a busy machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._wire import TraceRecord
from ..rank.cell import clean_message
from .text import ranks_text

#: A rank "arrived last" only when it came at least this many times the cell's measured noise
#: (``Trace.noise``) later than every other participant ...
STRAGGLER_RATIO = 2.0
#: ... and at least this many seconds later: one process of a loaded machine can be scheduled
#: late while the noise measured in its cell happens to be small (45 ms at load 8 on 2 cores; in
#: CI's stage 3, 4 ranks of an FSDP or ring-attention lesson on 2 cores came 0.2 s late to a
#: two-rank collective). Below both, who is last is noise, and the text must say the same every
#: run. Neither amount is ever printed in the text.
STRAGGLER_FLOOR = 0.5


# ---- clocks ------------------------------------------------------------------------
@dataclass(frozen=True)
class ClockOffset:
    """How far a rank's clock is ahead of the kernel's: ``rank time - kernel time``."""

    rank: int
    offset: float  # seconds
    uncertainty: float  # half the shortest round trip, seconds; inf when not measured
    samples: int

    @property
    def measured(self) -> bool:
        return self.samples > 0

    @property
    def correction(self) -> float:
        """What is subtracted from the rank's times: the offset, when the measurement can tell
        it from zero (ranks on one host share a clock; correcting them by noise would only blur)."""
        return self.offset if self.measured and abs(self.offset) > self.uncertainty else 0.0


# ---- what was recorded -------------------------------------------------------------
Tensor = tuple[str, tuple[int, ...], int]  # dtype, shape, bytes


@dataclass
class Call:
    """One torch.distributed call on one rank; times on the kernel's clock."""

    rank: int
    index: int  # 1-based, in this rank's sequence of traced calls
    op: str
    kind: str  # "collective" or "p2p"
    group: tuple[int, ...] = ()
    world: bool = True  # the default group
    tensors: tuple[Tensor, ...] = ()
    roles: tuple[tuple[str, Any], ...] = ()  # op=SUM, src=0, ...
    direction: str = ""  # p2p: "send" or "recv"
    peer: int | None = None  # p2p: the other rank (global)
    batch: tuple[tuple[str, int, tuple[Tensor, ...]], ...] = ()  # batch_isend_irecv: (direction, peer, tensors)
    async_op: bool = False
    uneven: bool = False  # shapes may differ across ranks (all_to_all with splits)
    start: float | None = None
    end: float | None = None  # None: had not returned when the trace was read
    done: float | None = None  # async: when the work completed
    error: str = ""
    note: str = ""
    via: str = ""  # the library call that issued it (``fully_shard unshard of 0``); "" when the cell did
    #: filled by matching: seconds this rank waited for the last participant to arrive
    wait: float = 0.0
    #: filled by matching: the collective's number on its group (1-based), or the p2p pair's
    number: int = 0

    @property
    def nbytes(self) -> int:
        return sum(t[2] for t in self.tensors) + sum(t[2] for b in self.batch for t in b[2])

    @property
    def finished(self) -> bool:
        return self.end is not None

    def shapes(self) -> str:
        return _tensors_text(self.tensors)

    def label(self) -> str:
        """``all_reduce(float32[4], op=SUM)``: what the call was, the same on every run."""
        parts = []
        if self.batch:
            parts = [f"{d} {'to' if d == 'send' else 'from'} {p}: {_tensors_text(t)}" for d, p, t in self.batch]
        else:
            if self.tensors:
                parts.append(self.shapes())
            if self.kind == "p2p" and self.peer is not None:
                parts.append(f"{'dst' if self.direction == 'send' else 'src'}={self.peer}")
            parts.extend(f"{k}={v}" for k, v in self.roles)
        if not self.world:
            parts.append(f"group={_ranks_list(self.group)}")
        return f"{self.op}({', '.join(parts)})"

    def described(self) -> str:
        """The label, and the library call that issued it when one did."""
        return f"{self.label()} via {self.via}" if self.via else self.label()

    def signature(self) -> tuple[Any, ...]:
        """What every participant of a collective must agree on."""
        tensors = tuple(t[0] for t in self.tensors) if self.uneven else tuple(t[:2] for t in self.tensors)
        return (self.op, tensors, self.roles)

    def short(self) -> str:
        """``all_reduce #3``: the op and its number on its group (or pair)."""
        return f"{self.op} #{self.number}" if self.number else self.op


def _tensors_text(tensors: Iterable[Tensor]) -> str:
    items = [f"{d}[{','.join(map(str, s))}]" for d, s, _ in tensors]
    if not items:
        return ""
    if len(items) > 1 and len(set(items)) == 1:
        return f"{len(items)}×{items[0]}"
    return ", ".join(items) if len(items) == 1 else "[" + ", ".join(items) + "]"


def _ranks_list(ranks: Iterable[int]) -> str:
    return "[" + ",".join(map(str, ranks)) + "]"


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def calls_from_records(rank: int, records: list[TraceRecord],
                       offset: float = 0.0) -> tuple[list[Call], float | None]:
    """Rebuild one rank's calls from its records, times moved onto the kernel's clock.

    Returns the calls and when the rank started the cell (the header's time).
    """
    calls: dict[int, Call] = {}
    began = None
    for rec in records:
        kind = rec.get("e")
        if kind == "h":
            began = float(rec["t"]) - offset
        elif kind == "b":
            calls[rec["i"]] = _call(rank, rec, offset)
        elif kind in ("e", "d") and rec.get("i") in calls:
            c = calls[rec["i"]]
            if kind == "e":
                c.end = float(rec["t1"]) - offset
                c.error = clean_message(str(rec.get("err", "")))  # no peer addresses: the text is compared
                peer = rec.get("peer")  # only recv(src=None) writes one, always a rank
                if peer is not None:
                    c.peer = int(peer)
            else:
                c.done = float(rec["t2"]) - offset
    return [calls[i] for i in sorted(calls)], began


def _call(rank: int, rec: TraceRecord, offset: float) -> Call:
    def tensors(items: Any) -> tuple[Tensor, ...]:
        return tuple((str(d), tuple(int(x) for x in s), int(b)) for d, s, b in items or [])

    p2p = rec.get("kind") == "p2p"
    return Call(
        rank=rank, index=int(rec["i"]), op=str(rec["op"]), kind="p2p" if p2p else "collective",
        group=tuple(rec.get("g") or ()), world=bool(rec.get("w", True)), tensors=tensors(rec.get("t")),
        roles=tuple(sorted((str(k), v) for k, v in (rec.get("a") or {}).items())),
        direction=str(rec.get("dir", "")), peer=rec.get("peer"),
        batch=tuple((str(d), int(p), tensors(t)) for d, p, t in rec.get("batch") or []),
        async_op=bool(rec.get("async")), uneven=bool(rec.get("uneven")),
        start=float(rec["t0"]) - offset if "t0" in rec else None, note=str(rec.get("note", "")),
        via=str(rec.get("via", "")),
    )


# ---- matching across ranks ----------------------------------------------------------
@dataclass
class Step:
    """The k-th collective on one group, across its members."""

    group: tuple[int, ...]
    world: bool
    number: int
    calls: dict[int, Call]  # member rank -> its k-th call on the group
    missing: list[int]  # traced members that never made a k-th call
    untraced: list[int]  # members that did not run the cell
    mismatch: str = ""
    slowest: int | None = None  # the rank that arrived clearly last (see ``Trace.noise``)
    last: int | None = None  # the rank that arrived last, clearly or not
    gap: float = 0.0  # seconds between the last arrival and the one before it
    spread: float = 0.0  # seconds between the first and the second-last arrival (noise, unless a real delay)
    total_wait: float = 0.0
    compared: bool = True  # False after an earlier mismatch on the same group

    @property
    def where(self) -> str:
        return "the world group" if self.world else f"group {_ranks_list(self.group)}"


@dataclass
class Trace:
    """The traced calls of every rank that ran a cell, matched across ranks."""

    ranks: list[int]
    calls: dict[int, list[Call]]
    offsets: dict[int, ClockOffset] = field(default_factory=dict)
    running: list[int] = field(default_factory=list)  # ranks still running the cell when it was read
    began: dict[int, float] = field(default_factory=dict)  # when each rank started the cell
    read_at: float = 0.0  # when the kernel read the records (kernel clock)
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why it has no records
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: seconds of timing noise measured in this cell (set by matching; see ``_noise``)
    noise: float = 0.0

    def __post_init__(self) -> None:
        if not self.steps and not self.problems:
            self._match()

    # -- matching --
    def _match(self) -> None:
        traced = set(self.ranks) - set(self.unreadable)
        for c in (c for cs in self.calls.values() for c in cs):
            c.wait, c.number = 0.0, 0
        groups: dict[tuple[int, ...], bool] = {}
        for r in sorted(traced):
            for c in self.calls.get(r, []):
                if c.kind == "collective":
                    groups.setdefault(c.group, c.world)
        for group, world in sorted(groups.items(), key=lambda g: (not g[1], g[0])):
            self._match_group(group, world, traced)
        self._match_p2p(traced)
        self._name_stragglers()
        for r in sorted(self.unreadable):
            self.problems.append(f"rank {r}: no trace ({self.unreadable[r]})")

    def _match_group(self, group: tuple[int, ...], world: bool, traced: set[int]) -> None:
        members = [r for r in group if r in traced]
        untraced = [r for r in group if r not in traced]
        seqs = {r: [c for c in self.calls.get(r, []) if c.kind == "collective" and c.group == group]
                for r in members}
        broken = False
        for k in range(1, max((len(s) for s in seqs.values()), default=0) + 1):
            calls = {r: s[k - 1] for r, s in seqs.items() if len(s) >= k}
            for c in calls.values():
                c.number = k
            step = Step(group, world, k, calls, [r for r in members if len(seqs[r]) < k], untraced)
            step.compared = not broken
            if not broken:
                step.mismatch = self._step_mismatch(step)
                if step.mismatch:
                    broken = True
                    self.problems.append(step.mismatch)
                else:
                    self._waits(list(calls.values()), step)
            self.steps.append(step)

    def _step_mismatch(self, step: Step) -> str:
        calls = step.calls
        head = f"mismatch at call #{step.number} on {step.where}: "
        by_sig: dict[tuple[Any, ...], list[int]] = {}
        for r, c in sorted(calls.items()):
            by_sig.setdefault(c.signature(), []).append(r)
        first = next(iter(calls.values()))
        if len(by_sig) > 1:
            parts = [f"{ranks_text(rs)} called {calls[rs[0]].described()}" for rs in by_sig.values()]
            why = _differ(list(calls.values()))
            return head + "; ".join(parts) + (f" ({why})" if why else "")
        name = f"{first.op} #{step.number}"
        blocked = sorted(r for r, c in calls.items() if not c.finished)
        parts = []
        if step.missing:
            done = [r for r in step.missing if r not in self.running]
            busy = [r for r in step.missing if r in self.running]
            if done:
                parts.append(f"{ranks_text(done)} never called {name}")
            for r in busy:
                parts.append(f"rank {r} had not called {name} when pgnb stopped waiting ({self._doing(r)})")
        if step.untraced and blocked:
            they = "it" if len(step.untraced) == 1 else "they"
            parts.append(f"{ranks_text(step.untraced)} did not run this cell, so {they} never called {name}")
        if not parts:
            return ""
        if blocked:
            verb = "is" if len(blocked) == 1 else "are"
            parts.append(f"{ranks_text(blocked)} {verb} blocked in it")
        elif step.missing or step.untraced:
            parts.append(f"{ranks_text(sorted(calls))} called it")
        return head + "; ".join(parts)

    def _doing(self, rank: int) -> str:
        open_calls = [c for c in self.calls.get(rank, []) if not c.finished]
        if open_calls:
            c = open_calls[-1]
            return f"it is blocked in {c.short()}" + (f" on group {_ranks_list(c.group)}" if not c.world else "")
        return "it is still running the cell"

    def _waits(self, calls: list[Call], step: Step) -> None:
        """Who arrived last, by how much, and how long each other participant waited for it."""
        if len(calls) < 2 or any(c.start is None for c in calls) or step.missing or step.untraced:
            return
        starts = sorted((c.start or 0.0, c.rank) for c in calls)
        last_start, last_rank = starts[-1]
        for c in calls:
            stop = last_start if c.end is None else min(last_start, c.end)
            c.wait = max(0.0, stop - (c.start or 0.0))
        step.total_wait = sum(c.wait for c in calls)
        step.last = last_rank
        step.gap = last_start - starts[-2][0]
        step.spread = starts[-2][0] - starts[0][0]

    def _noise(self) -> float:
        """Seconds of timing noise measured in this cell, the largest of three measures:

        - how far apart the ranks started the cell (the kernel's dispatch and each rank's
          scheduling: one rank starting late would otherwise look like a straggler);
        - how far apart the participants other than the last arrived at any collective of
          the cell (what the ranks' own scheduling spreads out between the cell's start
          and the call);
        - twice the largest clock-offset uncertainty (two ranks' times are compared; a rank
          whose offset could not be measured makes the noise infinite: nothing is named).
        """
        began = [self.began[r] for r in self.ranks if r in self.began]
        measures = [max(began) - min(began) if began else 0.0]
        measures += [s.spread for s in self.steps if s.last is not None]
        uncertain = [o.uncertainty for r, o in self.offsets.items() if r in self.ranks]
        measures.append(2 * max(uncertain, default=0.0))
        return max(measures)

    def _name_stragglers(self) -> None:
        """A step's last rank is named when its gap is large against the cell's noise."""
        self.noise = self._noise()
        for step in self.steps:
            if step.last is not None and step.gap >= max(STRAGGLER_FLOOR, STRAGGLER_RATIO * self.noise):
                step.slowest = step.last

    def _match_p2p(self, traced: set[int]) -> None:
        sends: dict[tuple[int, int], list[tuple[Call, tuple[Tensor, ...]]]] = {}
        recvs: dict[tuple[int, int], list[tuple[Call, tuple[Tensor, ...]]]] = {}
        for r in sorted(traced):
            for c in self.calls.get(r, []):
                if c.kind != "p2p":
                    continue
                parts = c.batch or ((c.direction, c.peer, c.tensors),)
                for direction, peer, tensors in parts:
                    if peer is None:
                        continue  # recv from any source that has not returned: unknown sender
                    pair = (r, peer) if direction == "send" else (peer, r)
                    (sends if direction == "send" else recvs).setdefault(pair, []).append((c, tensors))
        for src, dst in sorted(set(sends) | set(recvs)):
            if src not in traced or dst not in traced:
                continue
            out, into = sends.get((src, dst), []), recvs.get((src, dst), [])
            for k, ((s, st), (rv, rt)) in enumerate(zip(out, into, strict=False), start=1):
                s.number = s.number or k
                rv.number = rv.number or k
                if tuple(t[:2] for t in st) != tuple(t[:2] for t in rt):
                    self.problems.append(
                        f"mismatch at send #{k} from rank {src} to rank {dst}: rank {src} sent "
                        f"{_tensors_text(st)}, rank {dst} received into {_tensors_text(rt)}")
                    break
                if s.start is not None and rv.start is not None and rv.start < s.start:
                    stop = s.start if rv.end is None else min(s.start, rv.end)
                    rv.wait = max(rv.wait, stop - rv.start)
            else:
                if len(out) != len(into):
                    self.problems.append(self._pair_mismatch(src, dst, out, into))

    def _pair_mismatch(self, src: int, dst: int, out: list[Any], into: list[Any]) -> str:
        n, m = len(out), len(into)
        k = min(n, m) + 1
        for c, _ in (out if n > m else into)[min(n, m):]:
            c.number = c.number or k
        if n > m:
            c = out[m][0]
            who = f"rank {dst} never received it" if dst not in self.running else (
                f"rank {dst} had not received it when pgnb stopped waiting ({self._doing(dst)})")
            state = " and is blocked in it" if not c.finished else ""
            return (f"mismatch at send #{k} from rank {src} to rank {dst}: rank {src} called "
                    f"{c.op}{state}; {who}")
        c = into[n][0]
        who = f"rank {src} never sent it" if src not in self.running else (
            f"rank {src} had not sent it when pgnb stopped waiting ({self._doing(src)})")
        state = " and is blocked in it" if not c.finished else ""
        return f"mismatch at send #{k} from rank {src} to rank {dst}: rank {dst} called {c.op}{state}; {who}"

    # -- facts --
    @property
    def ok(self) -> bool:
        """Every call paired up and returned."""
        return not self.problems and all(c.finished and not c.error for cs in self.calls.values() for c in cs)

    @property
    def n_calls(self) -> int:
        return sum(len(cs) for cs in self.calls.values())

    # -- text --
    def summary(self) -> str:
        """The deterministic text: per-rank sequences, a line per collective, mismatches. No timings."""
        shown = [r for r in self.ranks if r not in self.unreadable]
        seqs = {r: [self._entry(c) for c in self.calls.get(r, [])] for r in shown}
        counts = {len(s) for s in seqs.values()}
        same = len({tuple(s) for s in seqs.values()}) <= 1
        head = f"trace of {ranks_text(self.ranks)}: "
        if not self.n_calls:
            head += "no torch.distributed calls"
        elif same and len(counts) == 1:
            n = counts.pop()
            head += f"{n} call{'s' if n != 1 else ''}" + (" each, the same on every rank" if len(shown) > 1 else "")
        else:
            head += "the calls of each rank"
        lines = [head]
        if not same:
            for r in shown:
                lines.append(f"  rank {r}: " + (", ".join(_runs(seqs[r])) or "no calls"))
        for line in self._step_lines():
            lines.append("  " + line)
        for line in self._p2p_lines():
            lines.append("  " + line)
        lines.extend(self.problems)
        errors = [c for cs in self.calls.values() for c in cs if c.error]
        for c in errors:
            lines.append(f"rank {c.rank}: {c.short()} raised {c.error}")
        return "\n".join(lines)

    def _entry(self, c: Call) -> str:
        text = c.described()
        if c.error:
            return text + " (raised)"
        if not c.finished:
            return text + " (did not return)"
        return text

    def _step_lines(self) -> list[str]:
        """One line per collective (runs of identical, unremarkable ones folded), in aligned columns."""
        rows: list[tuple[str, str, str, str]] = []
        run: list[Step] = []

        def flush() -> None:
            if not run:
                return
            a, b = run[0].number, run[-1].number
            num = f"#{a}" if a == b else f"#{a}-#{b}"
            first = next(iter(run[0].calls.values()))
            count = f" ×{len(run)}" if len(run) > 1 else ""
            rows.append((num, first.described() + count, _bytes_text(first.nbytes), self._timing(run[0])))
            run.clear()

        for step in self.steps:
            if not step.compared or step.mismatch:
                flush()
                continue
            key = self._step_key(step)
            if run and (self._step_key(run[-1]) != key or run[-1].group != step.group or step.slowest is not None):
                flush()
            run.append(step)
            if step.slowest is not None:
                flush()
        flush()
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
        return [f"{n:<{widths[0]}}  {op:<{widths[1]}}  {nb:>{widths[2]}}  {t}".rstrip() for n, op, nb, t in rows]

    def _step_key(self, step: Step) -> tuple[Any, ...]:
        first = next(iter(step.calls.values()))
        # every rank's shapes: uneven collectives (all_to_all with split sizes) agree on dtypes only, and
        # two of them with other shapes are not "the same call twice"
        shapes = tuple(c.shapes() for c in step.calls.values()) if first.uneven else ()
        return (first.signature(), shapes, first.via, step.group, step.slowest,
                all(c.finished for c in step.calls.values()))

    def _timing(self, step: Step) -> str:
        if len(step.calls) < 2:
            return ""
        if not all(c.finished for c in step.calls.values()):
            return "did not return"
        if step.slowest is not None:
            return f"rank {step.slowest} arrived last; the others waited for it"
        return "no clear straggler"

    def _p2p_lines(self) -> list[str]:
        pairs: dict[tuple[int, int], list[Tensor]] = {}
        for r in sorted(self.calls):
            for c in self.calls[r]:
                if c.kind != "p2p":
                    continue
                for direction, peer, tensors in c.batch or ((c.direction, c.peer, c.tensors),):
                    if direction == "send" and peer is not None:
                        pairs.setdefault((r, peer), []).extend(tensors)
        return [f"send rank {a} -> rank {b}: {len(ts)} tensor{'s' if len(ts) != 1 else ''}, "
                f"{_bytes_text(sum(t[2] for t in ts))}" for (a, b), ts in sorted(pairs.items())]

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return self.summary()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.summary()}

def _runs(items: list[str]) -> list[str]:
    """``[a, a, a, b]`` -> ``["a ×3", "b"]``."""
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j < len(items) and items[j] == items[i]:
            j += 1
        out.append(items[i] + (f" ×{j - i}" if j - i > 1 else ""))
        i = j
    return out


def _differ(calls: list[Call]) -> str:
    ops = {c.op for c in calls}
    if len(ops) > 1:
        return "different collectives"
    if len({tuple(t[0] for t in c.tensors) for c in calls}) > 1:
        return "different dtypes"
    if len({tuple(t[1] for t in c.tensors) for c in calls}) > 1:
        return "different shapes"
    if len({c.roles for c in calls}) > 1:
        return "different " + "/".join(sorted({k for c in calls for k, _ in c.roles}))
    return ""
