"""Run code on ranks and gather what each rank produced, in rank order.

``run_cell`` submits the code to every chosen rank at once (collectives need
all ranks inside the call together), waits, and returns a ``CellResult``:
per-rank stdout, stderr, rich outputs, the last expression's value and the
error, in rank order whatever order they arrived. Rendering is the magic's
job; ``CellResult.text()`` is the deterministic text form.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import RECOVER_HINT, CellTimeout, RankError, RankLost

if TYPE_CHECKING:
    from .sandbox import Sandbox


@dataclass
class RankOutput:
    rank: int
    state: str = "finished"  # finished, failed, still running, lost
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # display_data bundles
    result: dict[str, Any] | None = None  # execute_result bundle of the last expression
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)

    @property
    def value_text(self) -> str | None:
        return None if self.result is None else str(self.result.get("text/plain", ""))


@dataclass
class CellResult:
    ranks: list[RankOutput]

    @property
    def failed(self) -> list[RankOutput]:
        return [r for r in self.ranks if r.state != "finished"]

    def text(self) -> str:
        """Everything the ranks printed, grouped by rank: the same bytes every run."""
        out = []
        for r in self.ranks:
            body = r.stdout + r.stderr
            if r.value_text is not None:
                body += f"Out[rank {r.rank}]: {r.value_text}\n"
            if body:
                out.append(f"[rank {r.rank}]\n{body if body.endswith(chr(10)) else body + chr(10)}")
        return "".join(out)

    def error(self) -> RankError | None:
        """The one-line error for the failed ranks, or None."""
        bad = self.failed
        if not bad:
            return None
        running = [r.rank for r in bad if r.state == "still running"]
        lost = [r.rank for r in bad if r.state == "lost"]
        errors = [r for r in bad if r.state == "failed"]
        parts = []
        if errors:
            same = len({(r.ename, r.evalue) for r in errors}) == 1
            if same:
                parts.append(f"{_ranks(errors)} raised {errors[0].ename}: {errors[0].evalue}")
            else:
                parts.append("; ".join(f"rank {r.rank} raised {r.ename}: {r.evalue}" for r in errors))
        if lost:
            parts.append(f"{_ranks_n(lost)} lost (engine died); {RECOVER_HINT}")
        if running:
            parts.append(f"{_ranks_n(running)} still running at the timeout; {RECOVER_HINT}")
        msg = "; ".join(parts)
        if running:
            return CellTimeout(msg, [r.rank for r in bad])
        if lost:
            return RankLost(msg, [r.rank for r in bad])
        return RankError(msg, [r.rank for r in bad])


def _ranks(rows: list[RankOutput]) -> str:
    return _ranks_n([r.rank for r in rows])


def _ranks_n(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def run_cell(sb: Sandbox, code: str, ranks: list[int] | None = None, timeout: float | None = None) -> CellResult:
    pairs = sb.ranks_to_engines(ranks)
    client = sb.client
    ars = [(r, client[e].execute(code, silent=False, block=False)) for r, e in pairs]
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(not ar.ready() for _, ar in ars):
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(0.002)
    return CellResult([_collect(r, ar) for r, ar in ars])


def _collect(rank: int, ar: Any) -> RankOutput:
    out = RankOutput(rank)
    if not ar.ready():
        out.state = "still running"
        out.stdout, out.stderr = _streams(ar)
        return out
    try:
        reply = ar.get(timeout=0)
    except Exception as e:
        if type(e).__name__ == "EngineError":
            out.state, out.ename, out.evalue = "lost", "EngineError", str(e)
            return out
        out.state = "failed"
        out.ename = getattr(e, "ename", type(e).__name__)
        out.evalue = str(getattr(e, "evalue", e))
        tb = getattr(e, "traceback", None)
        out.traceback = tb.splitlines() if isinstance(tb, str) else list(tb or [])
    else:
        er = getattr(reply, "execute_result", None)
        if er:
            out.result = dict(er.get("data", {}))
        out.outputs = [dict(o.get("data", {})) for o in getattr(reply, "outputs", []) or []]
    out.stdout, out.stderr = _streams(ar)
    return out


def _streams(ar: Any) -> tuple[str, str]:
    with_wait = getattr(ar, "wait_for_output", None)
    if with_wait is not None and ar.ready():
        try:
            with_wait(timeout=1)
        except Exception:  # streams are best effort once the task is done
            pass
    stdout, stderr = ar.stdout, ar.stderr
    if isinstance(stdout, list):
        stdout = "".join(stdout)
    if isinstance(stderr, list):
        stderr = "".join(stderr)
    return stdout or "", stderr or ""


def parse_ranks(spec: str | None, world: int) -> list[int] | None:
    """``"0,2-3"`` -> ``[0, 2, 3]``; None or ``"all"`` -> None (every rank).

    Raises ``ValueError`` with a one-line reason for anything else.
    """
    if spec is None or spec.strip().lower() == "all":
        return None
    text = spec.strip()
    if not text:
        raise ValueError("--ranks is empty; use e.g. 0 or 0,2 or 1-3")
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        if not _is_number(lo_s) or (dash and not _is_number(hi_s)):
            raise ValueError(f"cannot read --ranks {spec!r}: {part!r} is not a rank or a range like 1-3")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if lo > hi:
            raise ValueError(f"--ranks range {part!r} goes backwards; write {hi}-{lo}")
        if hi >= world:
            raise ValueError(f"--ranks {spec!r} names rank {hi}, but the world has ranks 0-{world - 1}")
        chosen.extend(r for r in range(lo, hi + 1) if r not in chosen)
    return sorted(chosen)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
