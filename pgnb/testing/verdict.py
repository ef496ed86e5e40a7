"""What a world test did, from every rank's reply: pass, skip, or a failure report that names the cause.

A pure model (no pytest, no engines): ``decide`` turns the per-rank rows of one
test into a ``Verdict``. A failure's report has one section per rank that did
not pass: the rank that failed first comes first, with its own exception and
traceback and what it printed; ranks that failed only because another did
(blocked in a collective it never joined, a peer's closed connection, its own
timeout after the first failure) come after it, marked as consequences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from .._wire import TestReply
from ..core.text import ranks_text

Kind = Literal["passed", "failed", "skipped", "xfailed"]

#: What a rank's error says when it only echoes another rank's failure (gloo words it by timing).
_ECHOES = ("connection closed by peer", "connection reset by peer", "timed out", "timeout", "broken pipe",
           "read error", "socket closed", "aborted")


@dataclass(frozen=True)
class RankRow:
    """One rank's part in a test: its reply, or what pgnb saw when there was none."""

    rank: int
    reply: TestReply | None = None  # None: the call itself did not return one
    state: str = "finished"  # the cell's state: finished, failed, still running, lost
    error: str = ""  # when there is no reply: the cell's one-line error
    traceback: tuple[str, ...] = ()
    stack: tuple[str, ...] = ()  # still running at pgnb's own deadline: where it was blocked
    stdout: str = ""  # what the cell printed outside the test (rarely anything)
    stderr: str = ""


@dataclass
class Verdict:
    kind: Kind
    message: str = ""  # a skip or xfail reason; a failure's first line
    report: str = ""  # a failure's full text, one section per failing rank
    leaks: list[str] = field(default_factory=list)  # "rank(s) ...: what was left", one per distinct leak
    dirty: bool = False  # the world must be repaired or replaced before the next test
    #: when ``dirty`` only because these ranks were lost or are stuck while the others are clean: replace just
    #: them, in place (the others keep their engines and what the suite imported); empty: a new world
    replace: list[int] = field(default_factory=list)
    outputs: dict[int, str] = field(default_factory=dict)  # passing ranks' output, rank -> text


def decide(rows: list[RankRow], timeout: float | None, pytest_timeout: float | None = None) -> Verdict:
    """The test's verdict from every rank's row (in rank order); ``timeout``: the ranks' deadline; a longer
    ``pytest_timeout`` (the ranks' is shorter so that pgnb's report comes first): the report says both."""
    verdict = _decide(rows, timeout, pytest_timeout)
    return dataclasses.replace(verdict, replace=_to_replace(rows) if verdict.dirty else [])


def _to_replace(rows: list[RankRow]) -> list[int]:
    """The ranks to replace in place: lost, or with a thread still in the test; [] when another rank is out
    of step too (a different group count, no reply for another reason, a group it destroyed) or none is left."""
    broken = [r.rank for r in rows if (r.reply is None and r.state in ("lost", "still running"))
              or (r.reply is not None and r.reply["outcome"] in ("timeout", "blocked"))]
    kept = [r for r in rows if r.rank not in broken]
    counts = {_reply(r).get("group_count") for r in kept}
    if not broken or not kept or len(counts) > 1 or not all(r.reply is not None and r.reply.get("clean", True)
                                                             for r in kept):
        return []
    return broken


def _decide(rows: list[RankRow], timeout: float | None, pytest_timeout: float | None) -> Verdict:
    leaks = _leaks(rows)
    replies = {r.rank: r.reply for r in rows if r.reply is not None}
    counts = {rep.get("group_count") for rep in replies.values()}
    dirty = len(replies) < len(rows) or len(counts) > 1 or any(not rep.get("clean", True) for rep in replies.values())
    outcomes = {r.rank: (r.reply["outcome"] if r.reply is not None else "no reply") for r in rows}
    unimportable = [r for r in rows if outcomes[r.rank] == "unimportable"]
    if unimportable and len(unimportable) == len(rows):
        rep = _reply(unimportable[0])
        first = (rep.get("traceback") or [f"{rep.get('ename')}: {rep.get('evalue')}"])[-1]
        head = f"the test cannot be imported on the ranks: {first}"
        return Verdict("failed", head, head + "\n\n" + _section_text(unimportable[0], "cannot import the test")
                       + "\n(the ranks import the test module by its path; it must import there as it does here)",
                       leaks, dirty)
    if all(o == "passed" for o in outcomes.values()):
        return Verdict("passed", leaks=leaks, dirty=dirty, outputs=_outputs(rows))
    for kind in ("skipped", "xfailed"):
        if all(o == kind for o in outcomes.values()):
            reasons = sorted({_reply(r).get("reason", "") for r in rows})
            return Verdict(kind, reasons[0] if len(reasons) == 1 else "; ".join(reasons), leaks=leaks, dirty=dirty)
    if set(outcomes.values()) <= {"passed", "skipped", "xfailed"}:
        skipped = [r for r, o in outcomes.items() if o != "passed"]
        ran = [r for r, o in outcomes.items() if o == "passed"]
        reason = (replies[skipped[0]] or {}).get("reason", "")
        word = {"skipped": "skip", "xfailed": "xfail"}[outcomes[skipped[0]]]
        msg = (f"{ranks_text(skipped)} {outcomes[skipped[0]]} ({reason}) but {ranks_text(ran)} ran the test: "
               f"a {word} must agree on every rank")
        return Verdict("failed", msg, msg, leaks, dirty)
    return _failure(rows, outcomes, timeout, pytest_timeout, leaks, dirty=True)


def _failure(rows: list[RankRow], outcomes: dict[int, str], timeout: float | None, pytest_timeout: float | None,
             leaks: list[str], dirty: bool) -> Verdict:
    causes = [r for r in rows if _is_cause(r)]
    timed_out = [r for r in rows if outcomes[r.rank] == "timeout" or (r.reply is None and r.state == "still running")]
    if not causes and timed_out:
        secs = f"{timeout:g} s " if timeout else ""
        note = (f" (pgnb's, {pytest_timeout - timeout:g} s before pytest-timeout's {pytest_timeout:g} s)"
                if timeout and pytest_timeout and pytest_timeout > timeout else "")
        replaced = _to_replace(rows)
        head = (f"the test ran past its {secs}timeout on {ranks_text([r.rank for r in timed_out])}{note}; "
                f"pgnb replaced {f'{ranks_text(replaced)} in place' if replaced else 'the world'} (stacks below)")
        sections = [_section_text(r, "still running at the timeout") for r in rows if r in timed_out]
        sections += [_section_text(r, _label(r)) for r in rows if r not in timed_out and _shown(r)]
        return Verdict("failed", head, head + "\n\n" + "\n\n".join(sections), leaks, dirty)
    causes.sort(key=lambda r: (_reply(r).get("failed_at", float("inf")), r.rank))
    rest = [r for r in rows if r not in causes and outcomes[r.rank] != "passed"]
    first = causes[0] if causes else rest[0]
    head = f"rank {first.rank} failed first: {_one_line(first)}" if causes else _one_line(first)
    if causes and len(causes) > 1:
        head += f" (also failed: {ranks_text([r.rank for r in causes[1:]])})"
    if rest and causes:
        head += f"; {ranks_text([r.rank for r in rest])} failed only because of it"
    sections = [_section_text(r, "failed first" if r is first and causes else "failed") for r in causes]
    for r in rest:
        sections.append(_section_text(r, _consequence_label(r, first.rank if causes else None)))
    passed = [r.rank for r in rows if outcomes[r.rank] == "passed"]
    if passed:
        sections.append(f"{ranks_text(passed)} passed")
    return Verdict("failed", head, head + "\n\n" + "\n\n".join(sections), leaks, dirty)


def _is_cause(r: RankRow) -> bool:
    """This rank failed of its own accord: its own exception, not an echo of another rank's failure."""
    if r.reply is None:
        return r.state in ("failed", "lost")
    if r.reply["outcome"] != "failed":
        return False
    text = f"{r.reply.get('ename', '')}: {r.reply.get('evalue', '')}".lower()
    return not any(echo in text for echo in _ECHOES) or r.reply.get("ename") == "AssertionError"


def _consequence_label(r: RankRow, cause: int | None) -> str:
    because = f"rank {cause} failed first" if cause is not None else "another rank failed"
    if r.reply is not None and r.reply["outcome"] == "blocked":
        return f"blocked, a consequence ({because}; it waits for it here)"
    if r.reply is not None and r.reply["outcome"] == "timeout":
        return f"still running at the timeout, a consequence ({because})"
    if r.reply is None and r.state == "still running":
        return f"still running, a consequence ({because})"
    if r.reply is not None and r.reply["outcome"] in ("skipped", "xfailed"):
        return f"{r.reply['outcome']} ({r.reply.get('reason', '')})"
    return f"failed, a consequence ({because})"


def _label(r: RankRow) -> str:
    outcome = r.reply["outcome"] if r.reply is not None else r.state
    return str(outcome)


def _shown(r: RankRow) -> bool:
    return r.reply is None or r.reply["outcome"] != "passed" or bool(_printed(r))


def _one_line(r: RankRow) -> str:
    if r.reply is None:
        return r.error or r.state
    rep = r.reply
    if rep["outcome"] in ("failed", "unimportable"):
        value = str(rep.get("evalue", "")).strip().split("\n")[0]
        return f"{rep.get('ename', '')}: {value}" if value else str(rep.get("ename", ""))
    if rep["outcome"] == "blocked":
        return f"rank {r.rank} blocked after rank {rep.get('blocked_by')} failed"
    return f"rank {r.rank} {rep['outcome']}"


def _section_text(r: RankRow, label: str) -> str:
    lines = [f"---------- rank {r.rank}: {label} ----------"]
    rep = r.reply
    if rep is None:
        if r.traceback:
            lines.extend(r.traceback)
        elif r.error:
            lines.append(r.error)
        if r.stack:
            lines.append("blocked here (most recent call last):")
            lines.extend(r.stack)
    else:
        if rep.get("traceback") and rep["outcome"] in ("failed", "unimportable"):
            lines.extend(rep["traceback"])
        if rep.get("stack"):
            lines.append("the test's thread was here (most recent call last):")
            lines.extend(rep["stack"])
    lines.extend(_printed(r))
    return "\n".join(lines)


def _printed(r: RankRow) -> list[str]:
    rep = _reply(r)
    out = []
    for title, text in (("stdout", rep.get("stdout", "") + r.stdout), ("stderr", rep.get("stderr", "") + r.stderr),
                        ("fd 1/2 (C++ and other native output)", rep.get("fd_output", ""))):
        if text:
            out.append(f"--- rank {r.rank} {title} ---")
            out.append(text.rstrip("\n"))
    return out


def _outputs(rows: list[RankRow]) -> dict[int, str]:
    return {r.rank: "\n".join(_printed(r)) for r in rows if _printed(r)}


def _reply(r: RankRow) -> dict[str, Any]:
    return dict(r.reply or {})


def _leaks(rows: list[RankRow]) -> list[str]:
    """Each distinct leak once, with the ranks that left it."""
    by_text: dict[str, list[int]] = {}
    for r in rows:
        for text in _reply(r).get("leaks", []) or []:
            by_text.setdefault(text, []).append(r.rank)
    return [f"{ranks_text(ranks)}: {text}" for text, ranks in by_text.items()]
