"""Every magic ends in success or one line: nothing of pgnb's internals reaches the notebook raw.

``guarded(name, doing)`` wraps a magic:

- a ``PgnbError`` becomes a plain ``UsageError`` (IPython shows it as one line);
- Ctrl-C (the stop button) becomes ``UsageError: %pg_init interrupted while <phase>; <what exists now>``:
  the world cleaned up before it raised ``pgnb.errors.Interrupted``; a bare ``KeyboardInterrupt``
  elsewhere in a magic names what the magic was doing;
- any other exception is a bug of pgnb's: one line naming pgnb, what the magic was doing and the
  recovery command, while the full traceback is kept in an ``ErrorLog`` that
  ``%pg_status --debug`` prints (the last ``KEPT`` of them, in this kernel's memory only),
  and the error itself where ``%debug``, ``%tb`` and ``pdb.pm()`` look for the last one
  (``sys.last_value`` and its kin: IPython stores the one line there, so once the cell is
  over ``ErrorLog.after_cell`` puts the error back).
"""

from __future__ import annotations

import collections
import functools
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, cast

from IPython.core.error import UsageError

from ..errors import Interrupted, PgnbError
from .current import current

_F = TypeVar("_F", bound=Callable[..., Any])

#: How many internal errors' tracebacks a kernel keeps for ``%pg_status --debug``.
KEPT = 10
#: What an internal error tells the user to run.
INTERNAL_HINT = "run `%pg_init ... --force` to start over; `%pg_status --debug` shows the traceback"


class ErrorLog:
    """The tracebacks of the last internal errors of this kernel's magics."""

    def __init__(self) -> None:
        self._entries: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=KEPT)
        #: the last internal error, and the one line the cell showed for it, until the cell is over
        self._unclaimed: tuple[UsageError, BaseException] | None = None

    def add(self, magic: str, doing: str, exc: BaseException) -> None:
        stamp = time.strftime("%H:%M:%S")
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._entries.append((stamp, f"{magic} while {doing}", text))

    def shown_as(self, line: UsageError, exc: BaseException) -> None:
        """The cell shows ``line`` for the internal error ``exc``: keep ``exc`` for ``%debug``."""
        keep_for_debugger(exc)
        self._unclaimed = (line, exc)

    def after_cell(self, shell: Any) -> None:
        """The cell is over: if its error is an internal error's one line, ``%debug`` gets the error instead."""
        if self._unclaimed is None:
            return
        line, exc = self._unclaimed
        self._unclaimed = None
        if getattr(sys, "last_value", None) is line:
            keep_for_debugger(exc, shell)

    def __len__(self) -> int:
        return len(self._entries)

    def text(self) -> str:
        if not self._entries:
            return "pgnb: no internal error in this kernel"
        parts = [f"pgnb: the last {len(self._entries)} internal error(s) of this kernel's magics, oldest first"]
        for stamp, what, text in self._entries:
            parts.append(f"--- {stamp} {what}\n{text.rstrip()}")
        return "\n".join(parts)


def keep_for_debugger(exc: BaseException, shell: Any = None) -> None:
    """Make ``exc`` the last error, for ``%debug``, ``%tb`` and ``pdb.pm()``.

    IPython's ``%debug`` prefers the traceback it formatted last, which is an
    older error's (a ``UsageError`` is shown without one): that one is dropped.
    """
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is not None and getattr(formatter, "tb", None) is not None:
        formatter.tb = None


def internal_error_line(magic: str, doing: str, exc: BaseException) -> str:
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"pgnb internal error in {magic} while {doing} ({what}); {INTERNAL_HINT}"


def _interrupted_line(magic: str, doing: str) -> str:
    """A Ctrl-C outside the world's lifecycle calls (they raise ``Interrupted``): what exists now."""
    sb = current()
    exists = "no world is running" if sb is None or not sb.engine_ids else f"the world is {sb.snapshot().phase}"
    return f"{magic} interrupted while {doing}; {exists}"


def guarded(magic: str, doing: str) -> Callable[[_F], _F]:
    """Wrap the magic ``magic`` (``%pg_init``, ``%%pg``): one line for every way it can fail.

    The instance it runs on keeps the tracebacks in its ``errors`` (an ``ErrorLog``), if it has one.
    """

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except UsageError:
                raise
            except Interrupted as e:
                raise UsageError(f"%pg_{e.action} interrupted while {e.phase}; {e.outcome}") from None
            except KeyboardInterrupt:
                raise UsageError(_interrupted_line(magic, doing)) from None
            except PgnbError as e:
                raise UsageError(str(e)) from None
            except Exception as e:
                line = UsageError(internal_error_line(magic, doing, e))
                log = getattr(self, "errors", None)
                if isinstance(log, ErrorLog):
                    log.add(magic, doing, e)
                    log.shown_as(line, e)
                else:
                    keep_for_debugger(e)
                raise line from None

        return cast(_F, run)

    return wrap
