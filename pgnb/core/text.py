"""Words pgnb's messages share: how a list of ranks reads, how a rank's loss reads.

Every message that names ranks says them the same way, so a notebook's
recorded errors read alike whichever part of pgnb wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def ranks_text(ranks: Iterable[int]) -> str:
    """``[1]`` -> ``rank 1``; ``[0, 2, 3]`` -> ``ranks 0, 2, 3``; ``[0, 1, 2, 3]`` -> ``ranks 0-3``."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def one_line(ename: str, evalue: str) -> str:
    """``ename: first line of the message``: how an error reads inside a longer message."""
    first = next((ln.strip() for ln in evalue.splitlines() if ln.strip()), "")
    return f"{ename}: {first}" if first else ename


def lost_text(lost: Mapping[int, str]) -> str:
    """``{2: "engine killed by SIGKILL"}`` -> ``"rank 2 lost (engine killed by SIGKILL)"``; one clause per cause."""
    by_cause: dict[str, list[int]] = {}
    for r in sorted(lost):
        by_cause.setdefault(lost[r], []).append(r)
    return "; ".join(f"{ranks_text(rs)} lost ({cause})" for cause, rs in by_cause.items())
