"""Sending one function call to many engines at the cost of one, and reading what each sent back.

A ``%%pg`` cell, a status query or a ``Sandbox.run`` sends the same function
and arguments to every chosen rank, each as its own apply request (so each
rank's result, output and state can be waited for, reported and kept busy on
its own). ``client[e].apply_async`` per rank would pickle the function and its
arguments again for every rank and build a ``DirectView`` for each, whose
``apply_async`` binds its arguments with ``inspect`` twice and records what it
sent in the view's history: for a trivial cell that was a third of the
kernel's own time, growing with the world (14 ms of a 32-rank cell's 86 ms).

``send`` pickles them once (ipyparallel's ``PrePickled``), sends pgnb's own
functions by name (``pgnb._wire.ByName``) rather than as code, and hands each
request to the Client's ``send_apply_request`` on the socket a ``DirectView``
uses, with the engine's identity, wrapping its future in the one-engine
``AsyncResult`` that ``client[e].apply_async`` returns: the same messages, the
same results, nothing kept in any view. That reaches two private names of
ipyparallel's Client (``_mux_stream``, the stream ``client[e]`` hands its
views, and ``_build_targets``; ipyparallel is
pinned below 10 and ``tests/test_sending.py`` checks them); without them it
falls back to ``client[e].apply_async``.

``sent_back`` reads what a rank's request has brought so far (its streams, its
displays, its value's bundle) without ipyparallel's parse of the message's four
timestamps with dateutil, which ``ar.stdout`` does on each first look: a tenth
of a millisecond per rank and cell that pgnb never reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ipyparallel.client.asyncresult import AsyncResult
from ipyparallel.serialize import PrePickled

from .._wire import ByName


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
    sent = by_name(fn)
    packed_fn = PrePickled(sent)
    packed_args = [PrePickled(a) for a in args]
    packed_kwargs = {k: PrePickled(v) for k, v in kwargs.items()}
    socket = getattr(client, "_mux_stream", None)  # what client.direct_view gives its DirectViews
    build = getattr(client, "_build_targets", None)
    name = getattr(fn, "__name__", "f")  # what the AsyncResult calls it, as apply_async would
    for rank, engine_id in pairs:
        own = packed_kwargs if per_rank is None else {
            **packed_kwargs, **{k: PrePickled(v) for k, v in per_rank(rank).items()}}
        if socket is None or build is None:
            yield rank, client[engine_id].apply_async(packed_fn, *packed_args, **own)
            continue
        try:
            (ident,), _ = build([engine_id])
        except KeyError:  # what client[engine_id] says of an engine the Client does not know
            raise IndexError(f"No such engine: {engine_id}") from None
        future = client.send_apply_request(socket, packed_fn, packed_args, own, ident=ident,
                                           metadata={"label": None})
        yield rank, AsyncResult(client, future, fname=name, targets=engine_id, owner=True)


def sent_back(ar: Any, key: str) -> Any:
    """``ar.<key>`` of a one-engine AsyncResult (``stdout``, ``stderr``, ``outputs``, ``execute_result``):
    what its engine has sent for it so far, filled in by the Client's I/O thread as it arrives."""
    found = getattr(ar, "_metadata", None)  # the one-engine result's own metadata, as ``ar.<key>`` reads it
    if isinstance(found, list) and len(found) == 1 and isinstance(found[0], dict):
        return found[0].get(key)
    return getattr(ar, key, None)
