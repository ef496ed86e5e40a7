"""Sending one call to many ranks (``pgnb.core.sending``): by name, pickled once, read back without dateutil."""

from __future__ import annotations

import pickle

import pytest

from pgnb._wire import ByName
from pgnb.core import text
from pgnb.core.sandbox import dispatch_of
from pgnb.core.sending import by_name, send, sent_back
from pgnb.core.text import ranks_text
from pgnb.rank import cell as rank_cell, engine


def test_pgnb_functions_travel_by_name_and_a_users_as_they_are():
    sent = by_name(rank_cell.run_cell)
    assert isinstance(sent, ByName) and repr(sent) == "pgnb.rank.cell.run_cell"
    assert len(pickle.dumps(sent)) < 100  # its name, not its 5 KB of code
    back = pickle.loads(pickle.dumps(sent))
    assert (back.module, back.name) == ("pgnb.rank.cell", "run_cell")

    def users(x):
        return x

    assert by_name(users) is users  # a notebook's function goes as code, as ipyparallel sends it
    assert by_name(len) is len


def test_by_name_calls_the_function_it_names():
    assert ByName("pgnb.core.text", "ranks_text")([0, 1, 2]) == "ranks 0-2"


@pytest.mark.integration
def test_send_reaches_every_rank_and_what_came_back_reads_as_ipyparallel_says(world4):
    world = dispatch_of(world4)
    pairs = list(enumerate(world.engine_ids))
    ars = list(send(world.client, pairs, rank_cell.run_cell, "print(rank)\nrank * 2", None, world.scratch_dir,
                    debug={"path": None, "why": "no input"}))
    assert [r for r, _ in ars] == [0, 1, 2, 3]
    for r, ar in ars:
        reply = ar.get(timeout=30)
        ar.wait_for_output(timeout=5)
        assert reply["ok"] and sent_back(ar, "stdout") == f"{r}\n" == ar.stdout
        assert sent_back(ar, "execute_result") == ar.execute_result
        assert sent_back(ar, "outputs") == ar.outputs == []
    # the Client's socket and engine identities, which send uses as a DirectView does (private to ipyparallel)
    assert world.client[pairs[0][1]]._socket is world.client._mux_stream
    assert world.client._build_targets([pairs[0][1]])[1] == [pairs[0][1]]
    assert type(ars[0][1]) is type(world.client[pairs[0][1]].apply_async(engine.rank_status))
    with pytest.raises(IndexError, match="No such engine: 999"):
        list(send(world.client, [(0, 999)], engine.rank_status))
    # again, and keyword arguments of each rank's own
    again = list(send(world.client, pairs, engine.rank_status))
    assert [ar.get(timeout=30)["rank"] for _, ar in again] == [0, 1, 2, 3]
    own = list(send(world.client, pairs, text.ranks_text, per_rank=lambda r: {"ranks": [r, 7]}))
    assert [ar.get(timeout=30) for _, ar in own] == [ranks_text([r, 7]) for r in range(4)]
