"""``%%pg --trace``: recorded sequences, clock offsets, mismatches, the trace after --timeout.

The first tests need no engines (records made by hand). The rest run on the
shared 4-rank gloo world, through the API (``Sandbox.execute(trace=True)``) and
through ``%%pg --trace``. The tests that leave ranks stuck or dead come last, on
a world of their own, and the last one also checks the recovery (``%pg_init ... --force``).
Tracing's cost is measured by ``benchmarks/trace_overhead.py``, not here;
here "off" is checked structurally: nothing of torch.distributed is wrapped.
"""

from __future__ import annotations

import math
import os
import re

import pytest
from conftest import pg, start_world
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from pgnb.core import trace_run
from pgnb.core.sandbox import dispatch_of
from pgnb.core.trace import ClockOffset, Trace, calls_from_records
from pgnb.notebook.trace import timeline
from pgnb.rank import trace as rank_trace

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PNG = b"\x89PNG\r\n\x1a\n"


# ---- no engines: records made by hand -------------------------------------------------
def _call(i, op, t0, t1, shape=(4,), dtype="float32", group=(0, 1, 2, 3), **extra):
    nbytes = 4 * math.prod(shape)
    begin = {"e": "b", "i": i, "op": op, "kind": "coll", "g": list(group), "w": len(group) == 4,
             "t": [[dtype, list(shape), nbytes]], "t0": t0, **extra}
    end = [] if t1 is None else [{"e": "e", "i": i, "t1": t1}]
    return [begin, *end]


def _trace(per_rank, running=(), offsets=None, began=None):
    """``began``: when each rank started the cell (default: all at 0.0)."""
    calls, starts = {}, {}
    for r, recs in per_rank.items():
        off = offsets[r].correction if offsets else 0.0
        t = (began or {}).get(r, 0.0)
        calls[r], starts[r] = calls_from_records(r, [{"e": "h", "t": t}, *recs], off)
    return Trace(sorted(per_rank), calls, offsets=offsets or {}, running=list(running), began=starts, read_at=10.0)


def _late(rank_late, by, others=(0.0, 0.0, 0.0, 0.0), **kw):
    """One all_reduce on 4 ranks: ``rank_late`` arrives at 1.0 + ``by``, rank r at 1.0 + others[r]."""
    starts = {r: 1.0 + (by if r == rank_late else others[r]) for r in range(4)}
    return _trace({r: _call(1, "all_reduce", starts[r], 1.0 + by + 0.01) for r in range(4)}, **kw)


def test_a_straggler_is_named_and_the_others_waits_summed():
    tr = _late(2, 1.0)
    step = tr.steps[0]
    assert step.slowest == 2 and step.total_wait == pytest.approx(3.0) and step.gap == pytest.approx(1.0)
    assert [c.wait for r in range(4) for c in tr.calls[r]] == pytest.approx([1.0, 1.0, 0.0, 1.0])
    assert tr.summary() == ("trace of ranks 0-3: 1 call each, the same on every rank\n"
                            "  #1  all_reduce(float32[4])  16 B  rank 2 arrived last; the others waited for it")
    assert tr.ok


def test_close_arrivals_name_no_straggler_and_identical_calls_fold():
    recs = {r: [x for i in range(1, 4) for x in _call(i, "all_reduce", i + 0.01 * r, i + 0.05)] for r in range(4)}
    tr = _trace(recs)
    assert "#1-#3  all_reduce(float32[4]) ×3  16 B  no clear straggler" in tr.summary()
    assert all(s.last == 3 and s.slowest is None for s in tr.steps)  # rank 3 was last, by noise only


def test_uneven_all_to_alls_fold_only_when_every_rank_sent_the_same_shapes():
    """Two all_to_all_single with split sizes whose shapes differ are two lines, not one call ×2."""
    rows = {0: (24, 22), 1: (24, 23)}
    recs = {r: [x for i, n in enumerate(rows[r], 1)
                for x in _call(i, "all_to_all_single", i + 0.01 * r, i + 0.05, shape=(n, 8), group=(0, 1),
                               uneven=True)] for r in (0, 1)}
    summary = _trace(recs).summary()
    assert "#1  all_to_all_single(float32[24,8]," in summary and "#2  all_to_all_single(float32[22,8]," in summary
    assert "×2" not in summary, summary
    same = {r: [x for i in (1, 2) for x in _call(i, "all_to_all_single", i, i + 0.05, shape=(24, 8), group=(0, 1),
                                              uneven=True)] for r in (0, 1)}
    assert "#1-#2  all_to_all_single(float32[24,8], group=[0,1]) ×2" in _trace(same).summary()


# The rule, both ways: a rank is named only when its gap is large against the noise measured in
# the same cell, and never for a gap under STRAGGLER_FLOOR; the text carries no amount of time.
def test_a_real_delay_is_named_on_a_noisy_machine():
    # the ranks started the cell 0.2 s apart, the others arrived within 0.3 s, the clocks are known
    # to 0.05 s: a 1 s delay still stands out
    offsets = {r: ClockOffset(r, 0.0, 0.05, 5) for r in range(4)}
    tr = _late(2, 1.0, others=(0.0, 0.3, 0.0, 0.1), began={0: 0.0, 1: 0.2, 2: 0.0, 3: 0.1}, offsets=offsets)
    assert tr.noise == pytest.approx(0.3) and tr.steps[0].slowest == 2
    assert "rank 2 arrived last; the others waited for it" in tr.summary()


@pytest.mark.parametrize(("why", "kw"), [
    ("the ranks started the cell 0.3 s apart", {"began": {0: 0.0, 1: 0.3, 2: 0.0, 3: 0.0}}),
    ("the other ranks arrived 0.3 s apart", {"others": (0.0, 0.3, 0.0, 0.0)}),
    ("the clocks are known only to 0.15 s", {"offsets": {r: ClockOffset(r, 0.0, 0.15, 5) for r in range(4)}}),
    ("a rank's clock offset was not measured", {"offsets": {**{r: ClockOffset(r, 0.0, 0.001, 5) for r in range(3)},
                                                            3: ClockOffset(3, 0.0, math.inf, 0)}}),
])
def test_a_gap_within_the_noise_measured_in_the_cell_is_not_named(why, kw):
    tr = _late(2, 0.5, **kw)  # 0.5 s late: named on a quiet machine (next test), not against this noise
    assert tr.steps[0].last == 2 and tr.steps[0].slowest is None, why
    assert "#1  all_reduce(float32[4])  16 B  no clear straggler" in tr.summary()
    assert tr.steps[0].gap > 0.15 and tr.steps[0].total_wait > 1.0  # the amounts are kept (the timeline draws them)


def test_the_same_gap_is_named_when_the_cell_was_quiet_and_a_small_one_never():
    assert _late(2, 0.5).steps[0].slowest == 2
    assert _late(2, 0.5, others=(0.0, 0.2, 0.0, 0.0)).steps[0].slowest is None  # 0.3 after rank 1 < 2 × 0.2
    tr = _late(2, 0.15)  # no noise measured at all, but 0.15 s is what scheduling alone can do under load
    assert tr.noise == 0.0 and tr.steps[0].slowest is None


def test_noise_in_another_step_of_the_cell_counts():
    # step 1: ranks 0-2 arrive 0.4 s apart (rank 3 last); step 2: rank 1 is 0.6 s late
    recs = {r: [*_call(1, "all_reduce", 0.4 * (r == 2) + 0.5 * (r == 3), 1.0),
                *_call(2, "all_reduce", 2.0 + 0.6 * (r == 1), 2.7)] for r in range(4)}
    tr = _trace(recs)
    assert tr.noise == pytest.approx(0.4)
    assert [s.slowest for s in tr.steps] == [None, None]
    recs[2][0]["t0"], recs[3][0]["t0"] = 0.0, 0.05  # without that spread, the cell is quiet enough to name rank 1
    assert [s.slowest for s in _trace(recs).steps] == [None, 1]


def test_different_collectives_are_a_mismatch_naming_ranks_and_call():
    recs = {r: _call(1, "all_reduce" if r < 2 else "broadcast", 0.0, None, **({"a": {"src": 0}} if r >= 2 else {}))
            for r in range(4)}
    tr = _trace(recs, running=range(4))
    assert tr.problems == ["mismatch at call #1 on the world group: ranks 0, 1 called all_reduce(float32[4]); "
                           "ranks 2, 3 called broadcast(float32[4], src=0) (different collectives)"]
    assert not tr.ok


def test_different_shapes_are_a_mismatch():
    recs = {r: _call(1, "all_reduce", 0.0, None, shape=(4,) if r else (2,)) for r in range(4)}
    assert "(different shapes)" in _trace(recs, running=range(4)).problems[0]


def test_a_missing_call_says_who_never_called_it():
    recs = {r: [x for i in range(1, 4 if r != 1 else 3) for x in _call(i, "all_reduce", i, i + 0.1 if i < 3 else None)]
            for r in range(4)}
    tr = _trace(recs, running=[0, 2, 3])
    assert tr.problems == ["mismatch at call #3 on the world group: rank 1 never called all_reduce #3; "
                           "ranks 0, 2, 3 are blocked in it"]
    assert "rank 1: all_reduce(float32[4]) ×2" in tr.summary()
    assert "rank 0: all_reduce(float32[4]) ×2, all_reduce(float32[4]) (did not return)" in tr.summary()


def test_point_to_point_pairs_and_an_unanswered_send():
    send = {"e": "b", "i": 1, "op": "send", "kind": "p2p", "dir": "send", "peer": 1, "g": [0, 1], "w": True,
            "t": [["float32", [2], 8]], "t0": 0.0}
    recv = dict(send, op="recv", dir="recv", peer=0, t0=0.5)
    tr = _trace({0: [send, {"e": "e", "i": 1, "t1": 0.6}], 1: [recv, {"e": "e", "i": 1, "t1": 0.6}]})
    assert tr.ok and "send rank 0 -> rank 1: 1 tensor, 8 B" in tr.summary()
    tr = _trace({0: [send], 1: []}, running=[0])
    assert tr.problems == ["mismatch at send #1 from rank 0 to rank 1: rank 0 called send and is blocked in it; "
                           "rank 1 never received it"]


def test_offsets_are_corrected_only_when_measured_beyond_their_uncertainty():
    offsets = {0: ClockOffset(0, 0.0004, 0.002, 5), 1: ClockOffset(1, 5.0, 0.002, 5)}
    assert offsets[0].correction == 0.0 and offsets[1].correction == 5.0
    tr = _trace({0: _call(1, "all_reduce", 1.0, 1.1, group=(0, 1)), 1: _call(1, "all_reduce", 6.0, 6.1, group=(0, 1))},
                offsets=offsets)
    assert [tr.calls[r][0].start for r in (0, 1)] == pytest.approx([1.0, 1.0])


def test_the_library_call_that_issued_a_collective_is_named_and_keeps_steps_apart():
    recs = {r: [*_call(1, "all_gather_into_tensor", 0.0, 0.1, via="fully_shard unshard of 0"),
                *_call(2, "all_gather_into_tensor", 0.2, 0.3, via="fully_shard unshard of 1")] for r in range(2)}
    tr = _trace(recs)
    assert tr.calls[0][0].described() == "all_gather_into_tensor(float32[4]) via fully_shard unshard of 0"
    lines = tr.summary().splitlines()[1:]
    assert [re.split(r"\s{2,}", line.strip())[1] for line in lines] == [  # not folded: different callers
        "all_gather_into_tensor(float32[4]) via fully_shard unshard of 0",
        "all_gather_into_tensor(float32[4]) via fully_shard unshard of 1"]


def test_the_timeline_is_a_png_with_a_deterministic_text():
    tr = _trace({r: _call(1, "all_reduce", 0.0 if r != 2 else 1.0, 1.01) for r in range(4)})
    pic = timeline(tr)
    assert pic._repr_png_().startswith(PNG)
    assert repr(pic) == "<pgnb timeline: ranks 0-3, 4 calls>"


# ---- real engines -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(world4):
    """The shared world of 4 (conftest), for the tests that leave it whole; it drives ``ip`` too."""
    return world4


@pytest.fixture(scope="module")
def own_world(request):
    """A world of 4 of the last tests' own: they leave ranks stuck or dead (stopped, leak-checked, after them)."""
    return start_world(request, backend="gloo", world=4)


@pytest.fixture
def own_ip(own_world, ip):
    """``ip`` driving ``own_world`` during one test."""
    from pgnb.notebook.current import current, set_current

    before = current()
    set_current(own_world)
    yield ip
    set_current(before)


SEQUENCE = """\
t = torch.ones(4) * rank
dist.all_reduce(t)
dist.broadcast(t, src=1)
out = [torch.zeros(2, dtype=torch.int64) for _ in range(world_size)]
dist.all_gather(out, torch.arange(2) + rank)
if rank == 0:
    dist.send(torch.ones(3), dst=3)
elif rank == 3:
    dist.recv(torch.zeros(3), src=0)
g = dist.new_group([0, 1])
if rank < 2:
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
dist.barrier()
"""


@pytest.mark.integration
def test_recorded_sequence_on_every_rank(world):
    res = world.execute(SEQUENCE, trace=True)
    assert res.error() is None
    tr = res.trace
    assert tr.ok and tr.problems == []
    labels = {r: [c.label() for c in tr.calls[r]] for r in range(4)}
    common = ["all_reduce(float32[4], op=SUM)", "broadcast(float32[4], src=1)", "all_gather(int64[2])"]
    assert labels[0] == [*common, "send(float32[3], dst=3)", "all_reduce(float32[4], op=MAX, group=[0,1])", "barrier()"]
    assert labels[1] == [*common, "all_reduce(float32[4], op=MAX, group=[0,1])", "barrier()"]
    assert labels[2] == [*common, "barrier()"]
    assert labels[3] == [*common, "recv(float32[3], src=0)", "barrier()"]
    for r in range(4):
        for c in tr.calls[r]:
            assert c.finished and c.start is not None and c.start <= c.end
        assert [c.index for c in tr.calls[r]] == list(range(1, len(tr.calls[r]) + 1))
    assert tr.calls[0][0].nbytes == 16 and tr.calls[0][0].group == (0, 1, 2, 3)
    text = tr.summary()
    assert "send rank 0 -> rank 3: 1 tensor, 12 B" in text
    assert text == world.execute(SEQUENCE, trace=True).trace.summary()  # deterministic: no timings


@pytest.mark.integration
def test_tracing_off_wraps_nothing(world):
    check = ("import pgnb.rank.trace as T\n"
             "(T.wrapped_names(), T.active_modes(), id(dist.all_reduce), id(dist.isend), id(dist.P2POp.__init__))")
    before = world.execute(check).values
    during = world.execute(check, trace=True).values
    after = world.execute(check).values
    assert all(names == [] and modes == 0 for names, modes, *_ in before + after)
    assert all("all_reduce" in names and "isend" in names and modes == 1 for names, modes, *_ in during)
    assert after == before  # the very same function objects: an untraced call runs no pgnb code


@pytest.mark.integration
def test_names_bound_before_the_trace_and_functional_collectives_are_seen(world):
    world.execute("from torch.distributed import all_reduce as bound_early")
    functional = ("funcol = torch.ops._c10d_functional\n"  # what DTensor calls (its Python module is slow to import)
                  "y = funcol.wait_tensor(funcol.all_reduce(t, 'sum', dist.group.WORLD.group_name))\n")
    res = world.execute(f"t = torch.ones(3)\nbound_early(t)\n{functional}float(y.sum())", trace=True)
    assert res.error() is None and res.values == [48.0] * 4
    tr = res.trace
    assert tr.ok and re.split(r"\s{2,}", tr.summary().splitlines()[1].strip())[1] == "all_reduce(float32[3], op=SUM) ×2"
    direct, functional = tr.calls[2]
    assert not functional.via and functional.async_op and functional.done is not None  # done: when waited for


@pytest.mark.integration
def test_a_p2pop_made_while_tracing_still_works_afterwards(world):
    code = ("peer = (rank + 1) % world_size, (rank - 1) % world_size\n"
            "ops = [dist.P2POp(dist.isend, torch.ones(2), peer[0]), dist.P2POp(dist.irecv, torch.zeros(2), peer[1])]\n"
            "for w in dist.batch_isend_irecv(ops):\n    w.wait()\n")
    res = world.execute(code, trace=True)
    assert res.error() is None and res.trace.ok
    assert res.trace.calls[0][0].label() == "batch_isend_irecv(send to 1: float32[2], recv from 3: float32[2])"
    res = world.execute("for w in dist.batch_isend_irecv(ops):\n    w.wait()\n")  # untraced now
    assert res.error() is None


@pytest.mark.integration
def test_a_rank_without_the_trace_directory_keeps_its_records_for_the_kernel(world):
    from pgnb.rank import cell

    rec = trace_run.Recording(dispatch_of(world), [0, 1, 2, 3], "/nonexistent/pgnb-trace-dir")  # as on another host
    world.run(cell.run_cell, "dist.all_reduce(torch.ones(3))", None, None, rec.engine_args(0))
    tr = rec.collect([])
    assert tr.ok and [c.label() for c in tr.calls[3]] == ["all_reduce(float32[3], op=SUM)"]


@pytest.mark.integration
def test_clock_offsets_are_measured_and_corrected(world):
    world.run(rank_trace.set_clock_skew, 5.0, ranks=[1])
    world.run(rank_trace.set_clock_skew, -3.0, ranks=[2])
    try:
        offsets = trace_run.measure_offsets(dispatch_of(world))
        assert offsets[1].offset == pytest.approx(5.0, abs=0.05)
        assert offsets[2].offset == pytest.approx(-3.0, abs=0.05)
        assert abs(offsets[0].offset) < 0.05 and offsets[0].uncertainty < 0.05
        code = "import time\nif rank == 3:\n    time.sleep(0.7)\ndist.all_reduce(torch.ones(1))"
        res = world.execute(code, trace=True)
        tr = res.trace
        starts = {r: tr.calls[r][0].start for r in range(4)}
        ends = {r: tr.calls[r][0].end for r in range(4)}
        # on the kernel's clock the one all_reduce ends at the same moment on every rank
        assert max(ends.values()) - min(ends.values()) < 0.1
        assert abs(starts[1] - starts[0]) < 0.1 and abs(starts[2] - starts[0]) < 0.1
        assert tr.steps[0].slowest == 3
        assert "rank 3 arrived last" in tr.summary()
    finally:
        world.run(rank_trace.set_clock_skew, 0.0)


@pytest.mark.integration
def test_magic_shows_summary_and_timeline_and_keeps_the_trace(ip):
    cap, err = pg(ip, "--trace", "t = torch.ones(2)\ndist.all_reduce(t)\nprint(t)")
    assert err is None
    assert cap.stdout == "".join(f"[rank {r}]\ntensor([4., 4.])\n" for r in range(4))
    summary, picture = cap.outputs
    assert summary.data == {"text/plain": "trace of ranks 0-3: 1 call each, the same on every rank\n"
                                          "  #1  all_reduce(float32[2], op=SUM)  8 B  "
                                          "no clear straggler"}
    assert picture.data["text/plain"] == "<pgnb timeline: ranks 0-3, 4 calls>"
    assert "image/png" in picture.data
    assert isinstance(ip.user_ns["_pg_trace"], Trace)


@pytest.mark.integration
def test_different_collectives_on_real_ranks(world):
    # a group with a short timeout: the mismatched ranks give up by themselves, the world stays usable
    code = ("import datetime\ng = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))\n"
            "t = torch.ones(4)\nif rank == 0:\n    dist.all_reduce(t, group=g)\n"
            "elif rank == 1:\n    dist.broadcast(t, src=0, group=g)\n")
    res = world.execute(code, trace=True)
    assert res.error() is not None
    tr = res.trace
    assert tr.problems[0] == ("mismatch at call #1 on group [0,1]: rank 0 called all_reduce(float32[4], op=SUM, "
                              "group=[0,1]); rank 1 called broadcast(float32[4], src=0, group=[0,1]) "
                              "(different collectives)")
    assert "raised RuntimeError" in tr.summary()
    assert world.execute("dist.all_reduce(torch.ones(1))").error() is None


@pytest.mark.integration
def test_ddp_gradient_all_reduce_from_its_cpp_reducer_is_seen(world):
    code = ("from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "ddp = DDP(torch.nn.Linear(4, 2))\nddp(torch.ones(2, 4)).sum().backward()")
    res = world.execute(code, trace=True)
    assert res.error() is None and res.trace.ok
    calls = res.trace.calls[1]
    assert all(c.via == "DDP __init__" for c in calls[:-1])  # its parameters broadcast from rank 0
    assert calls[-1].described() == "all_reduce(float32[10], op=SUM) via backward"  # the gradient bucket


FSDP_SETUP = """\
import datetime
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
# a group of all ranks with a short timeout: when a rank skips the step, the others give up by themselves
# (gloo's connect has that timeout too: the barrier brings the ranks, done importing, to it together)
dist.barrier()
g = dist.new_group(list(range(world_size)), timeout=datetime.timedelta(seconds=2))
mesh = DeviceMesh.from_group(g, "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
FSDP_STEP = "loss = model(torch.ones(2, 4)).sum()\nloss.backward()\nopt.step()\n"


@pytest.mark.integration
def test_an_fsdp2_step_shows_its_all_gathers_and_reduce_scatters_and_a_skipped_step(world, ip):
    assert world.execute(FSDP_SETUP).error() is None
    cap, err = pg(ip, "--trace", FSDP_STEP)
    assert err is None and cap.stderr == ""
    tr = ip.user_ns["_pg_trace"]
    assert tr.ok and tr.n_calls == 24
    group = "group=[0,1,2,3]"
    expected = [f"all_gather_into_tensor(float32[5], {group}) via fully_shard unshard of 0",
                f"all_gather_into_tensor(float32[5], {group}) via fully_shard unshard of 1",  # forward
                f"all_gather_into_tensor(float32[5], {group}) via fully_shard unshard of 1",  # backward
                f"all_gather_into_tensor(float32[5], {group}) via fully_shard unshard of 0",
                f"reduce_scatter_tensor(float32[20], op=AVG, {group}) via fully_shard post_backward of 1",
                f"reduce_scatter_tensor(float32[20], op=AVG, {group}) via fully_shard post_backward of 0"]
    assert all([c.described() for c in tr.calls[r]] == expected for r in range(4))
    summary = cap.outputs[0].data["text/plain"]
    assert summary.startswith("trace of ranks 0-3: 6 calls each, the same on every rank\n")
    assert f"reduce_scatter_tensor(float32[20], op=AVG, {group}) via fully_shard post_backward of 0" in summary

    skipped = "if rank != 3:\n" + "".join(f"    {line}\n" for line in FSDP_STEP.splitlines())
    cap, err = pg(ip, "--trace", skipped)
    assert err is not None  # ranks 0-2 time out in the all-gather rank 3 never joined
    problems = ip.user_ns["_pg_trace"].problems
    assert problems[0] == ("mismatch at call #1 on group [0,1,2,3]: rank 3 never called "
                           "all_gather_into_tensor #1; ranks 0-2 called it")
    assert world.execute("dist.all_reduce(torch.ones(1))").error() is None  # the world group is fine


# ---- last: ranks left stuck, then dead, then recovered ------------------------------------
SKIP_THIRD = """\
t = torch.ones(4)
for i in range(3):
    if rank == 1 and i == 2:
        break  # rank 1 skips the third all_reduce
    dist.all_reduce(t)
"""


@pytest.mark.integration
def test_the_trace_after_a_timeout_says_who_never_called(own_world, own_ip):
    world, ip = own_world, own_ip
    cap, err = pg(ip, "--trace --timeout 2", SKIP_THIRD)
    assert err is not None and "still running after the 2 s --timeout" in str(err)
    texts = [o.data["text/plain"] for o in cap.outputs]
    assert texts[0].splitlines()[-1] == ("mismatch at call #3 on the world group: rank 1 never called "
                                         "all_reduce #3; ranks 0, 2, 3 are blocked in it")
    assert "rank 0: all_reduce(float32[4], op=SUM) ×2, all_reduce(float32[4], op=SUM) (did not return)" in texts[0]
    assert "rank/trace.py" not in ANSI.sub("", cap.stderr)  # the stacks show the cell, not pgnb's wrapper

    stack_dir = dispatch_of(world).scratch_dir
    assert not [f for f in os.listdir(stack_dir) if f.startswith("trace-")]  # read, then removed


@pytest.mark.integration
def test_kill_a_rank_then_recover(own_world, own_ip):
    world, ip = own_world, own_ip
    with capture_output() as cap:
        ip.run_line_magic("pg_kill", "2")
    assert cap.stdout == "killed rank 2's engine (SIGKILL), as a crash or the out-of-memory killer would\n"
    assert 2 in dispatch_of(world).lost_ranks()
    cap, err = pg(ip, "", "1")
    assert err is not None and "rank 2 lost" in str(err)
    with pytest.raises(UsageError, match="already lost"):
        ip.run_line_magic("pg_kill", "2")
    with pytest.raises(UsageError, match="no rank 9"):
        ip.run_line_magic("pg_kill", "9")
    with capture_output():
        ip.run_line_magic("pg_init", "--backend gloo --world 4 --force")
    cap, err = pg(ip, "--trace", "dist.all_reduce(torch.ones(1))")
    assert err is None and ip.user_ns["_pg_trace"].ok
