"""Words pgnb's messages share: how a list of ranks reads, how a rank's loss reads.

Every message that names ranks says them the same way, so a notebook's
recorded errors read alike whichever part of pgnb wrote them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def ranks_text(ranks: Iterable[int]) -> str:
    """``[1]`` -> ``rank 1``; ``[0, 2, 3]`` -> ``ranks 0, 2, 3``; ``[0, 1, 2, 3]`` -> ``ranks 0-3``."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


#: Characters a first sentence may run to, across the message's line breaks, before ``one_line``
#: keeps only its first line (and says so): a sentence that long introduces a list, not a phrase.
SENTENCE_LIMIT = 200
_SENTENCE_END = re.compile(r"[.!?][)\]\"']*(?=\s|$)")
_ENDS_SENTENCE = re.compile(r"[.!?][)\]\"']*$")


def one_line(ename: str, evalue: str, where: str = "") -> str:
    """``ename: the message's first sentence``: how an error reads inside a longer message.

    A one-line message is kept whole. A longer one keeps its first line when that line ends a
    sentence, else its first sentence joined across the line breaks (torch wraps long sentences).
    A first line that ends no sentence within ``SENTENCE_LIMIT`` characters (``... but expected
    one of:`` and a list) is kept with a note that it is only the first line and, given
    ``where`` (``"under rank 0 above"``), where the full message is.
    """
    lines = [ln.strip() for ln in evalue.splitlines() if ln.strip()]
    if not lines:
        return ename
    return f"{ename}: {first_sentence(lines, where)}"


def first_sentence(lines: list[str], where: str = "") -> str:
    """The first sentence of a message given as its non-empty, stripped lines (see ``one_line``)."""
    first = lines[0]
    if len(lines) == 1 or _ENDS_SENTENCE.search(first):
        return first
    joined = " ".join(lines)
    end = _SENTENCE_END.search(joined, len(first))
    if end is not None and end.end() <= SENTENCE_LIMIT:
        return joined[:end.end()]
    return f"{first} (first line; the full message is {where})" if where else f"{first} (first line of the message)"


def resized_text(before: int, after: int) -> str:
    """What a re-init that changes the world's size does to the ranks' namespaces, in one line."""
    return (f"world size {before} -> {after}: every rank starts with an empty namespace "
            "(what earlier cells defined on the ranks is gone)")


def replace_text(command: str, ranks: Iterable[int]) -> str:
    """A lost or stuck rank's recovery: the same ``%pg_init`` again replaces it under its own number."""
    return f"run `{command}` to replace {ranks_text(ranks)} in place (the other ranks keep their state)"


def started_empty(before: list[int], now: list[int]) -> list[int]:
    """After a re-init (``before`` and ``now``: each rank's engine id), the ranks that start empty beside
    ranks that kept their namespaces; [] when every rank kept its own or none did."""
    fresh = [r for r, e in enumerate(now) if r >= len(before) or before[r] != e]
    return fresh if before and len(fresh) < len(now) else []


def reinit_note(world_before: int | None, world: int, keep: bool, before: list[int],
                now: list[int]) -> tuple[str, tuple[int, ...]]:
    """What a re-init did to the namespaces, in one line, and the ranks it left fresh (``before`` and
    ``now``: each rank's engine id; ``world_before`` None: a cold start)."""
    resized = world_before not in (None, world) and not keep
    return (resized_text(world_before, world) if resized and world_before is not None else kept_text(before, now),
            tuple(started_empty(before, now)))


def kept_text(before: list[int], now: list[int]) -> str:
    """After a re-init that kept engines (``before`` and ``now``: each rank's engine id), which ranks start
    empty and which kept theirs, in one line: ``rank 2 replaced (empty namespace); ranks 0, 1, 3 kept``;
    "" when no rank changed."""
    fresh = [r for r, e in enumerate(now) if r >= len(before) or before[r] != e]
    if not before or not fresh:
        return ""
    replaced, new = [r for r in fresh if r < len(before)], [r for r in fresh if r >= len(before)]
    kept = [r for r in range(len(now)) if r not in fresh]
    text = ", ".join(f"{ranks_text(rs)} {what}" for rs, what in ((replaced, "replaced"), (new, "new")) if rs)
    text += " (empty namespace)" if len(fresh) == 1 else " (empty namespaces)"
    return text + (f"; {ranks_text(kept)} kept" if kept else "")


def lost_text(lost: Mapping[int, str]) -> str:
    """``{2: "engine killed by SIGKILL"}`` -> ``"rank 2 lost (engine killed by SIGKILL)"``; one clause per cause."""
    by_cause: dict[str, list[int]] = {}
    for r in sorted(lost):
        by_cause.setdefault(lost[r], []).append(r)
    return "; ".join(f"{ranks_text(rs)} lost ({cause})" for cause, rs in by_cause.items())
