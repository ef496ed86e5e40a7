"""What a remote failure means, decided once: a rank lost, a task aborted, or the code raised.

ipyparallel reports an engine-side failure as a ``RemoteError`` carrying the
remote exception's name (``ename``); an engine that died fails its task with
``EngineError``, and requests queued behind an interrupted one end in
``TaskAborted``. Every part of pgnb that reads a failed task asks here, so a
rank is "lost" by one rule everywhere. Also the one test of "is this rank on
this host" (pids, signals and stack dumps mean something only there).
"""

from __future__ import annotations

import socket
from typing import Any, Literal, Protocol

from ..rank.cell import clean_message
from .text import one_line

#: how a remote task ended when it did not return: its engine died, it was aborted unrun, or its code raised
Outcome = Literal["lost", "aborted", "raised"]

ENGINE_DIED = "EngineError"
ABORTED = "TaskAborted"


def ename(exc: BaseException) -> str:
    """The remote exception's name (ipyparallel wraps engine-side errors in ``RemoteError``)."""
    return str(getattr(exc, "ename", None) or type(exc).__name__)


def outcome(exc: BaseException) -> Outcome:
    """``lost`` when the engine died under the task, ``aborted`` when it never ran, else ``raised``."""
    name = ename(exc)
    if name == ENGINE_DIED:
        return "lost"
    if name == ABORTED:
        return "aborted"
    return "raised"


def error_line(exc: BaseException) -> str:
    """``ename: first line of the message`` for a remote or local exception, without C++ locations or ports."""
    evalue = getattr(exc, "evalue", None)
    return one_line(ename(exc), clean_message(str(evalue if evalue is not None else exc).strip()))


def died(ar: Any) -> bool:
    """The (finished) task ``ar`` failed because its engine died."""
    if not ar.ready():
        return False
    try:
        ar.get(timeout=0)
    except Exception as e:
        return outcome(e) == "lost"
    return False


class Hosted(Protocol):
    @property
    def host(self) -> str: ...  # read-only: an EngineInfo is frozen


def is_local(where: Hosted | str) -> bool:
    """Whether a rank (anything with a ``host``, or a host name) runs on this machine."""
    host = where if isinstance(where, str) else where.host
    return host == socket.gethostname()
