"""A world that survives its ranks, in a real kernel of world 4: a lost or stuck rank is replaced in place.

Each rank holds a value (``x = rank * 10``). After ``%pg_kill 2`` (SIGKILL, as the out-of-memory killer
would), the same ``%pg_init`` gives rank 2 a new engine and an empty namespace, and ranks 0, 1 and 3 keep
their values under their own numbers (before: the process of rank 3 answered as rank 2). The same after a
``%%pg --timeout`` cell leaves rank 1 blocked in ``all_reduce``, where no interrupt reaches it. Then
``--world 6 --keep`` grows the world keeping ranks 0-3. The lost and stopped engines are gone. One kernel
for the module; its last check SIGKILLs it, as nbval does, and nothing of pgnb's may be left.
"""

from __future__ import annotations

import re

import psutil
import pytest
from conftest import GONE_WITHIN

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

INIT = "%pg_init --backend gloo --world 4"
#: each rank: its number, its x (None in an empty namespace), its pid, and an all_reduce of the ranks
ASK = ("%%pg\nimport os, torch, torch.distributed as dist\n"
       "t = torch.tensor([float(rank)]); dist.all_reduce(t)\n"
       "print('rank', rank, 'x', globals().get('x'), 'pid', os.getpid(), 'sum', int(t.item()))")
LINE = re.compile(r"^rank (\d+) x (\S+) pid (\d+) sum (\d+)$", re.M)


@pytest.fixture(scope="module")
def kernel():
    from procs_util import MarkedKernel

    k = MarkedKernel()
    try:
        assert k.execute("%load_ext pgnb").status == "ok"
        ex = k.execute(INIT, timeout=120)
        assert ex.status == "ok", ex.text()
        yield k
    finally:
        k.close(kill=True)
        try:
            assert k.wait_nothing_left(GONE_WITHIN) == ([], [])
        finally:
            k.forget()


def ask(k) -> dict[int, tuple[str, int, int]]:
    """rank -> (x, pid, sum of the ranks by all_reduce)."""
    ex = k.execute(ASK, timeout=60)
    assert ex.status == "ok", ex.text()
    return {int(m[1]): (m[2], int(m[3]), int(m[4])) for m in LINE.finditer(ex.text())}


def assert_one_engine_and_nanny_per_rank(k, world: int) -> None:
    """Nothing of a replaced engine is left: its nanny went with it (seen from outside, by process kind)."""
    kinds = k.by_kind()
    assert (len(kinds["engine"]), len(kinds["nanny"])) == (world, world), kinds


def assert_fresh(k, ranks: list[int]) -> None:
    """%pg_status says which ranks started empty and ran nothing since; so do the status view's rows."""
    ex = k.execute("%pg_status")
    assert ex.status == "ok", ex.text()
    says = f"rank {ranks[0]} fresh (started empty, nothing run there yet)" if ranks else "fresh"
    assert (says in ex.text()) == bool(ranks), ex.text()
    assert ("replaced (empty namespace)" in ex.text()) == bool(ranks), ex.text()
    rows = k.execute("import pgnb\nprint(pgnb.current().snapshot().fresh)")
    printed = "".join(o["text"] for o in rows.outputs if o["type"] == "stream")
    assert printed.strip() == str(tuple(ranks)), rows.text()


def reinit(k, line: str = INIT) -> tuple[str, float]:
    ex = k.execute(line, timeout=120)
    assert ex.status == "ok", ex.text()
    return ex.text(), ex.seconds


def test_a_lost_rank_is_replaced_in_place_and_the_others_keep_their_numbers_and_values(kernel):
    assert kernel.execute("%%pg\nx = rank * 10").status == "ok"
    before = ask(kernel)
    assert [before[r][0] for r in range(4)] == ["0", "10", "20", "30"]

    assert kernel.execute("%pg_kill 2").status == "ok"
    refused = kernel.execute("%%pg\nprint(x)")
    assert refused.error["evalue"] == ("rank 2 lost (engine killed by SIGKILL); run `%pg_init --backend gloo "
                                       "--world 4` to replace rank 2 in place (the other ranks keep their state)")

    text, seconds = reinit(kernel)
    assert "rank 2 replaced (empty namespace); ranks 0, 1, 3 kept" in text, text
    assert_fresh(kernel, [2])
    after = ask(kernel)
    assert_fresh(kernel, [])  # work went to every rank: none is fresh, the note is gone
    assert [after[r][0] for r in range(4)] == ["0", "10", "None", "30"]  # never renumbered
    assert [after[r][1] for r in (0, 1, 3)] == [before[r][1] for r in (0, 1, 3)]  # the same processes
    assert after[2][1] != before[2][1] and not psutil.pid_exists(before[2][1])
    assert {s for _, _, s in after.values()} == {6}
    pids = {pid for _, _, pid, _ in kernel.world()["rows"]}
    assert before[2][1] not in pids and after[2][1] in pids
    assert_one_engine_and_nanny_per_rank(kernel, 4)
    print(f"lost rank replaced in {seconds:.2f} s")


def test_a_rank_stuck_past_its_timeout_is_replaced_in_place(kernel):
    before = ask(kernel)
    stuck = kernel.execute("%%pg --timeout 3\nif rank == 1:\n    dist.all_reduce(torch.ones(1))")
    assert stuck.status == "error"
    assert stuck.error["evalue"].endswith("run `%pg_init --backend gloo --world 4` to replace rank 1 in place "
                                          "(the other ranks keep their state)"), stuck.error

    text, seconds = reinit(kernel)
    assert "rank 1 replaced (empty namespace); ranks 0, 2, 3 kept" in text, text
    after = ask(kernel)
    assert [after[r][0] for r in range(4)] == ["0", "None", "None", "30"]
    assert [after[r][1] for r in (0, 2, 3)] == [before[r][1] for r in (0, 2, 3)]
    assert not psutil.pid_exists(before[1][1])
    assert {s for _, _, s in after.values()} == {6}
    assert_one_engine_and_nanny_per_rank(kernel, 4)
    print(f"stuck rank replaced in {seconds:.2f} s")


def test_keep_grows_the_world_and_ranks_0_to_3_keep_their_values(kernel):
    before = ask(kernel)
    text, _ = reinit(kernel, "%pg_init --backend gloo --world 6 --keep")
    assert "ranks 4, 5 new (empty namespaces); ranks 0-3 kept" in text, text
    assert "ranks 4, 5 fresh (started empty, nothing run there yet)" in text, text
    after = ask(kernel)
    assert [after[r][0] for r in range(6)] == ["0", "None", "None", "30", "None", "None"]
    assert [after[r][1] for r in range(4)] == [before[r][1] for r in range(4)]
    assert {s for _, _, s in after.values()} == {15}
    # without --keep a new size empties every rank, as before
    text, _ = reinit(kernel, INIT)
    assert "every rank starts with an empty namespace" in text, text
    assert [v[0] for v in ask(kernel).values()] == ["None"] * 4


def test_a_smaller_world_after_a_lost_rank_gives_the_lost_number_a_new_engine(kernel):
    """World 4 -> 3 with rank 1 lost: rank 1 gets a new engine, ranks 0 and 2 keep theirs, and the old rank 3
    does not take number 1 (before: "only 2 of the 3 engines are up", and the whole world was stopped)."""
    reinit(kernel, INIT + " --force")  # 4 engines, none idle (the world of 6 left two)
    assert kernel.execute("%%pg\nx = rank * 10").status == "ok"
    before = ask(kernel)
    assert kernel.execute("%pg_kill 1").status == "ok"
    text, _ = reinit(kernel, "%pg_init --backend gloo --world 3 --keep")
    assert "rank 1 replaced (empty namespace); ranks 0, 2 kept" in text, text
    after = ask(kernel)
    assert [after[r][0] for r in range(3)] == ["0", "None", "20"]
    assert [after[r][1] for r in (0, 2)] == [before[r][1] for r in (0, 2)]
    assert after[1][1] not in {pid for _, pid, _ in before.values()}
    assert {s for _, _, s in after.values()} == {3}
