"""A torch ``MultiProcContinuousTest`` class on a warm rank, as torch's worker process runs it.

torch's continuous harness spawns ``world_size`` processes per class; each runs
``cls._worker_loop``: it sets ``cls.rank`` and ``cls.world_size``, calls the class's
``_init_pg(rank, world_size, rdvz_file)`` (a ``TEST_SKIPS`` exit there skips every
test of the class), then runs each test id it is sent with
``cls._run_test_given_id`` (torch's seed first) until told to stop, and destroys
its group. Here the same three steps are three calls a warm rank makes:

- ``set_up``: the class's group, made by the class's own ``_init_pg``, with the
  parent's environment, directory and import path (any group the rank held is
  destroyed first);
- ``run_test``: one test; a rank whose test raised destroys its group at once (and
  lets go of ``cls.pg``, so that its connections close), so a peer waiting for it in
  a collective fails now instead of at the group's timeout;
- ``tear_down``: the group destroyed, and the rank put back as it was before
  ``set_up`` (environment, directory, import path, torch's flags, the globals of
  the class's modules: ``pgnb.rank.module_state``), as if its process had ended.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from typing import Any

from .._wire import TestReply, TorchClassRun
from . import module_state
from .rendezvous import reset_group_counter
from .torch_suites import as_spawned, destroy_groups, fd_output, test_class

#: The class set up on this rank now, and how to undo its set-up (the context as_spawned entered).
_CLASS: dict[str, Any] = {}


def set_up(run: TorchClassRun, ranks: dict[int, int]) -> TestReply:
    """``cls._worker_loop``'s set-up on the rank ``ranks[os.getpid()]``: "passed", "skipped" (with torch's
    reason) or "failed" (what ``_init_pg`` raised)."""
    import torch.distributed as dist

    tear_down()
    rank = ranks[os.getpid()]
    t0 = time.time()
    reply: TestReply = {"rank": rank, "outcome": "passed", "seconds": 0.0}
    if dist.is_initialized():  # the world's own group: the class makes its own from rdvz_file
        dist.destroy_process_group()
    reset_group_counter(dist)  # a fresh process names its first group "0"
    spawned = as_spawned(run)
    spawned.__enter__()
    _CLASS["undo"] = spawned
    with fd_output() as output:
        try:
            cls = test_class(run)
            module_state.remember(module_state.watched([c.__module__ for c in cls.__mro__]))
            _CLASS["cls"] = cls
            cls.rank, cls.world_size = rank, run["world_size"]
            cls._init_pg(rank, run["world_size"], run["rdvz_file"])
        except SystemExit as e:
            _exited(reply, e)
        except BaseException as e:  # noqa: BLE001 - the class's set-up failed: every test says so
            _failed(reply, e)
    reply["fd_output"], reply["seconds"] = output[0], time.time() - t0
    reply["clean"] = reply["outcome"] != "failed"
    return reply


def _exited(reply: TestReply, e: SystemExit) -> None:
    """A ``SystemExit`` from torch's harness: a ``TEST_SKIPS`` code is a skip with torch's reason, else a failure."""
    reason = _skip_reason(e.code)
    if reason is None:
        _failed(reply, e)
    else:
        reply.update({"outcome": "skipped", "reason": reason})


def run_test(test_id: str, rank: int) -> TestReply:
    """One test, as ``_worker_loop`` runs it: ``cls._run_test_given_id(test_id)``."""
    import torch.distributed as dist

    t0 = time.time()
    reply: TestReply = {"rank": rank, "outcome": "passed", "seconds": 0.0}
    cls = _CLASS.get("cls")
    if cls is None:
        reply.update({"outcome": "failed", "ename": "RuntimeError", "failed_at": t0,
                      "evalue": "pgnb: the test's class is not set up on this rank", "clean": False})
        return reply
    with fd_output() as output:
        try:
            cls._run_test_given_id(test_id)
        except SystemExit as e:
            _exited(reply, e)
        except BaseException as e:  # noqa: BLE001 - reported, rank by rank
            _failed(reply, e)
        if reply["outcome"] == "failed":
            # its peers may wait for it in a collective: closing the group's connections ends their wait
            # now; they close when the group is freed, and the class holds it in cls.pg
            cls.pg = None
            reply["clean"] = destroy_groups(dist)
            gc.collect()
    reply["fd_output"], reply["seconds"] = output[0], time.time() - t0
    reply.setdefault("clean", dist.is_initialized())
    return reply


def tear_down() -> bool:
    """End the class set up on this rank (if any) as its process would have ended; False if a group
    could not be destroyed."""
    import torch.distributed as dist

    undo = _CLASS.pop("undo", None)
    _CLASS.pop("cls", None)
    if undo is None:
        return True
    clean = destroy_groups(dist)
    undo.__exit__(None, None, None)
    module_state.restore()
    return clean


def _skip_reason(code: object) -> str | None:
    """torch's reason for a ``TEST_SKIPS`` exit code (None for any other exit)."""
    harness = sys.modules.get("torch.testing._internal.common_distributed")
    skips = getattr(harness, "TEST_SKIPS", {})
    return next((s.message for s in skips.values() if s.exit_code == code), None)


def _failed(reply: TestReply, error: BaseException) -> None:
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # the test's frames, not pgnb's
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb))
    lines = text.rstrip("\n").split("\n")
    reply.update({"outcome": "failed", "ename": type(error).__name__, "evalue": str(error).strip(),
                  "traceback": lines, "failed_at": time.time()})
