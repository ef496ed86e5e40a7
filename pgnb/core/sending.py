"""Sending one function call to many engines at the cost of one, and reading what each sent back.

A ``%%pg`` cell, a status query or a ``Sandbox.run`` sends the same function
and arguments to every chosen rank, each as its own apply request (so each
rank's result, output and state can be waited for, reported and kept busy on
its own). ``client[e].apply_async`` would pickle the function and its
arguments again for every rank and build a new ``DirectView`` each time; for a
trivial cell that was a third of the kernel's own time, growing with the world.
``send`` pickles them once (ipyparallel's ``PrePickled``), sends pgnb's own
functions by name (``pgnb._wire.ByName``) rather than as code, keeps one view
per engine for as long as its Client lives, and skips the view's own record of
what it sent (``apply_async``'s two decorators bind their arguments with
``inspect`` on every call, and a kept view's history would grow with every
cell): pgnb keeps each request's AsyncResult itself.

``sent_back`` reads what a rank's request has brought so far (its streams, its
displays, its value's bundle) without ipyparallel's parse of the message's four
timestamps with dateutil, which ``ar.stdout`` does on each first look: a tenth
of a millisecond per rank and cell that pgnb never reads.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ipyparallel.serialize import PrePickled

from .._wire import ByName

#: Client -> {engine id: its DirectView}; a Client that is closed and dropped takes its views with it.
_VIEWS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def view_of(client: Any, engine_id: int) -> Any:
    """The one ``DirectView`` on ``engine_id`` for this Client (non-blocking, as ``client[e]`` makes it)."""
    views = _VIEWS.setdefault(client, {})
    view = views.get(engine_id)
    if view is None:
        view = views[engine_id] = client[engine_id]
    return view


def by_name(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A module-level function of pgnb's as its name; any other callable (a user's, from the notebook) as it is."""
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__name__", "")
    if module.startswith("pgnb.") and getattr(fn, "__qualname__", None) == name:
        return ByName(module, name)
    return fn


def send(client: Any, pairs: Iterable[tuple[int, int]], fn: Callable[..., Any], *args: Any,
         per_rank: Callable[[int], Mapping[str, Any]] | None = None, **kwargs: Any) -> Iterator[tuple[int, Any]]:
    """``fn(*args, **kwargs)`` on each ``(rank, engine id)``, yielding ``(rank, AsyncResult)`` as each is sent
    (``ars.extend(send(...))`` keeps those already sent when a Ctrl-C interrupts it part-way).

    ``per_rank(rank)``: keyword arguments of that rank's own (e.g. where its trace goes), pickled per rank.
    """
    packed_fn = PrePickled(by_name(fn))
    packed_args = [PrePickled(a) for a in args]
    packed_kwargs = {k: PrePickled(v) for k, v in kwargs.items()}
    for rank, engine_id in pairs:
        own = packed_kwargs if per_rank is None else {**packed_kwargs, **per_rank(rank)}
        view = view_of(client, engine_id)
        # apply_async is _really_apply behind the view's history bookkeeping, which pgnb does not read
        apply = getattr(view, "_really_apply", None)
        yield rank, (apply(packed_fn, packed_args, own, block=False) if apply is not None
                     else view.apply_async(packed_fn, *packed_args, **own))


def sent_back(ar: Any, key: str) -> Any:
    """``ar.<key>`` of a one-engine AsyncResult (``stdout``, ``stderr``, ``outputs``, ``execute_result``):
    what its engine has sent for it so far, filled in by the Client's I/O thread as it arrives."""
    found = getattr(ar, "_metadata", None)  # the one-engine result's own metadata, as ``ar.<key>`` reads it
    if isinstance(found, list) and len(found) == 1 and isinstance(found[0], dict):
        return found[0].get(key)
    return getattr(ar, key, None)
