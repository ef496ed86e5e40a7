"""The one busy registry: a rank still running earlier work is refused at once by every entry point,
and a rank whose work has finished (or is just finishing) is free at once.

The registry's transitions are tested on stand-in results (no engines); the entry points on a real
world; the release after an interrupt or a ``--timeout`` in a real Jupyter kernel, as nbval runs it.
"""

from __future__ import annotations

import os
import time

import pytest
from conftest import pg

import pgnb
from pgnb.core.busy import Busy, BusyEntry
from pgnb.core.world import STATUS_TIMEOUT

HANG_RANK0 = "if rank == 0:\n    dist.all_reduce(torch.ones(1))\n"
RELEASE = "dist.all_reduce(torch.ones(1))\n"


class Result:
    """An AsyncResult stand-in that becomes ready at ``done_at`` (monotonic), or never."""

    def __init__(self, done_in: float | None) -> None:
        self.done_at = None if done_in is None else time.monotonic() + done_in

    def ready(self) -> bool:
        return self.done_at is not None and time.monotonic() >= self.done_at

    def wait(self, timeout: float) -> None:
        left = timeout if self.done_at is None else min(timeout, max(0.0, self.done_at - time.monotonic()))
        time.sleep(left)


CLIENT = object()


def _busy(done_in: float | None, engine_id: int = 10, client: object = CLIENT) -> Busy:
    b = Busy()
    b.add(0, BusyEntry(engine_id, Result(done_in), client, "cell In [3]"))
    return b


def _check(b: Busy, settle: float = 0.5) -> tuple[list[int], float]:
    t0 = time.monotonic()
    stuck = b.still_running([0, 1], [10, 11], CLIENT, settle=settle)
    return stuck, time.monotonic() - t0


# ---- transitions -----------------------------------------------------------------------
def test_finished_by_itself_is_free_at_once():
    b = _busy(0.0)
    assert _check(b)[0] == [] and 0 not in b


def test_released_by_the_other_ranks_is_free_once_its_reply_arrives():
    """The reply is on its way (the rank was just released): the check waits for it, briefly."""
    b = _busy(0.2)
    stuck, took = _check(b)
    assert stuck == [] and 0.15 < took < 0.45 and 0 not in b


def test_still_running_is_refused_after_the_bounded_wait_and_stays_recorded():
    b = _busy(None)
    stuck, took = _check(b, settle=0.3)
    assert stuck == [0] and 0.25 < took < 0.6 and 0 in b


def test_timed_out_then_finished():
    b = _busy(0.5)
    assert _check(b, settle=0.1)[0] == [0]  # still running at the first look
    time.sleep(0.5)
    assert _check(b, settle=0.1)[0] == [] and 0 not in b


def test_interrupted_or_lost_ends_with_a_result_and_is_free():
    # an interrupted cell replies with its KeyboardInterrupt; a lost engine's task fails with
    # EngineError: either way the result is ready
    assert _check(_busy(0.0))[0] == []


@pytest.mark.parametrize("change", ["engine replaced", "world restarted"])
def test_entries_of_engines_or_clients_that_are_gone_are_dropped_without_waiting(change):
    b = _busy(None, engine_id=99) if change == "engine replaced" else _busy(None, client=object())
    stuck, took = _check(b, settle=1.0)
    assert stuck == [] and took < 0.05 and 0 not in b


def test_other_ranks_are_not_held_up():
    b = _busy(None)
    t0 = time.monotonic()
    assert b.still_running([1, 2], [10, 11, 12], CLIENT, settle=1.0) == []
    assert time.monotonic() - t0 < 0.05


# ---- every entry point, on a real world ----------------------------------------------------
@pytest.fixture(scope="module")
def world(world4):
    return world4


@pytest.mark.integration
def test_a_blocked_rank_is_refused_at_once_by_every_entry_point(world, ip):
    """After `%%pg --timeout 2` leaves rank 0 blocked, every way of talking to it refuses at once, with the
    same one-line message; the other ranks stay usable; running the missing ranks frees rank 0."""
    _, err = pg(ip, "", "x = rank")
    assert err is None
    _, err = pg(ip, "--timeout 2", HANG_RANK0)
    assert err is not None and "rank 0 still running after the 2 s --timeout" in str(err)
    try:
        messages = {}
        for name, call in [
            ("%%pg", lambda: pg(ip, "", "print(rank)")[1]),
            ("%pg_show", lambda: _usage_error(lambda: ip.run_line_magic("pg_show", "x"))),
            ("Sandbox.run", lambda: _api_error(lambda: world.run(os.getpid))),
            ("pgnb.show", lambda: _api_error(lambda: pgnb.show("x", sandbox=world))),
            ("Sandbox.pull", lambda: _api_error(lambda: world.pull("x"))),
            ("Sandbox.push", lambda: _api_error(lambda: world.push(y=1))),
            ("--trace", lambda: pg(ip, "--trace", "print(rank)")[1]),
        ]:
            t0 = time.monotonic()
            err = call()
            took = time.monotonic() - t0
            assert err is not None, name
            assert took < 3.0, (name, took)  # the settle wait (1 s) and a stack dump, never the stuck cell
            messages[name] = str(err)
        assert len(set(messages.values())) == 1, messages
        msg = messages["%%pg"]
        assert msg.startswith("rank 0 still running cell In [") and "blocked in" in msg and "\n" not in msg
        assert "to replace rank 0 in place" in msg and "run the ranks it waits for" in msg
        # the others are free; status answers without waiting on rank 0
        assert world.run(os.getpid, ranks=[1, 2, 3])
        t0 = time.monotonic()
        rows = world.status()
        # it waits as long as asking a rank would (STATUS_TIMEOUT), then says the rank is busy, and with what
        assert time.monotonic() - t0 < STATUS_TIMEOUT + 2 and rows[0].error.startswith("busy: still running cell In [")
    finally:
        _, err = pg(ip, "--ranks 1-3", RELEASE)  # the missing ranks release rank 0
    assert err is None
    cap, err = pg(ip, "", "print('free', rank)")
    assert err is None and [f"free {r}" for r in range(4)] == [
        ln for ln in cap.stdout.splitlines() if ln.startswith("free")]


def _usage_error(fn):
    from IPython.core.error import UsageError

    try:
        fn()
    except UsageError as e:
        return e
    return None


def _api_error(fn):
    try:
        fn()
    except pgnb.CellTimeout as e:
        return e
    return None


# ---- the release, in a real kernel, as nbval sends the cells ---------------------------------
TRIALS = int(os.environ.get("PGNB_RELEASE_TRIALS", "5"))


def _release_trials(kernel, how: str, trials: int) -> list[str]:
    """Rank 0 alone in all_reduce, stopped by an interrupt or --timeout; ranks 1-3 release it; then an
    all-rank cell at once. Returns what went wrong, per trial (empty: every trial ran on all ranks)."""
    failures = []
    for i in range(trials):
        if how == "interrupt":
            msg_id = kernel.kc.execute("%%pg\n" + HANG_RANK0)
            time.sleep(1.0)
            kernel.km.interrupt_kernel()
            hung = kernel.collect(msg_id)
        else:
            hung = kernel.execute("%%pg --timeout 1\n" + HANG_RANK0)
        if hung.status != "error":
            failures.append(f"trial {i}: the hanging cell did not fail: {hung.text()}")
            continue
        released = kernel.execute("%%pg --ranks 1-3\n" + RELEASE)
        if released.status != "ok":
            failures.append(f"trial {i}: release failed: {released.text()}")
            continue
        after = kernel.execute("%%pg\nprint('free', rank)")
        if after.status != "ok" or [f"free {r}" for r in range(4)] != [
                ln for ln in after.text().splitlines() if ln.startswith("free")]:
            failures.append(f"trial {i}: {after.text()}")
    return failures


@pytest.mark.integration
@pytest.mark.kernel
@pytest.mark.parametrize("how", ["interrupt", "timeout"])
def test_a_released_rank_is_free_at_once(kernel4, how):
    assert _release_trials(kernel4, how, TRIALS) == []


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.kernel
@pytest.mark.parametrize("how", ["interrupt", "timeout"])
def test_a_released_rank_is_free_at_once_20_in_20(kernel4, how):
    assert _release_trials(kernel4, how, 20) == []
