"""``pgnb.show`` / ``%pg_show``: one variable across ranks, as a grid (HTML) and a deterministic table.

Rendering is tested on values made here (no engines); gathering from real
ranks on the session's shared 4-rank world, through the API and the magic.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import pgnb
from pgnb.core.show import MAX_ELEMENTS, RankValues, gather, summarize
from pgnb.notebook.show import ShowView, colour, to_html


def view(values, name="x"):
    return RankValues(name, tuple(range(len(values))), tuple(summarize(v) for v in values))


# ---- rendering (no engines) ---------------------------------------------------------------
def test_tensors_are_a_rank_by_element_table():
    v = view([torch.arange(4.0) * r for r in range(3)], "t")
    assert v.text() == ("t on ranks 0-2: float32[4]\n"
                        "rank  [0]  [1]  [2]  [3]\n"
                        "0     0.   0.   0.   0.\n"
                        "1     0.   1.   2.   3.\n"
                        "2     0.   2.   4.   6.")
    assert repr(v) == v.text()


def test_html_colours_every_cell_on_one_scale():
    v = view([torch.tensor([0.0, 1.0]), torch.tensor([2.0, 4.0])])
    html = to_html(v)
    cells = re.findall(r"background:(#[0-9a-f]{6})", html)
    assert cells[:4] == [f"#{''.join(f'{round(c * 255):02x}' for c in colour(x, 0, 4))}" for x in (0, 1, 2, 4)]
    assert cells[0] != cells[3]  # low and high differ
    assert html == to_html(view([torch.tensor([0.0, 1.0]), torch.tensor([2.0, 4.0])]))  # deterministic
    bundle = ShowView(v)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"} and bundle["text/plain"] == v.text()


def test_differing_shapes_and_dtypes_are_flagged():
    v = view([torch.ones(3), torch.ones(3), torch.ones(2), torch.ones(3)], "s")
    lines = v.text().splitlines()
    assert lines[0] == "s on ranks 0-3: shapes differ across ranks (rows marked !)"
    assert lines[1].split() == ["rank", "type", "[0]", "[1]", "[2]"]
    assert lines[4].split() == ["2!", "float32[2]", "1.", "1."]
    assert view([torch.ones(2), torch.ones(2, dtype=torch.int64)]).differs() == "dtypes"
    assert view([torch.ones(2), 3]).differs() == "types"
    assert ";color:#c62828" in to_html(view([torch.ones(3), torch.ones(2), torch.ones(3)]))


def test_scalars_strings_and_others_are_a_column():
    assert view([0.5 * r for r in range(3)], "loss").text() == (
        "loss on ranks 0-2: float\nrank  value\n0     0.\n1     0.5\n2     1.")
    assert view(["a", "b"], "name").text() == "name on ranks 0, 1: str\nrank  value\n0     a\n1     b"
    long = view(["x" * 100])
    assert long.text().splitlines()[-1].endswith("x…")
    assert view([np.float32(1.5), np.int64(2)]).rows[0] == {"kind": "scalar", "type": "float", "value": 1.5}
    assert view([{"a": 1}]).text().splitlines()[-1] == "0     {'a': 1}"


def test_long_tensors_show_their_head_and_a_count():
    v = view([torch.arange(100)])
    row = v.text().splitlines()[-1].split()
    assert row[1:MAX_ELEMENTS + 1] == [str(i) for i in range(MAX_ELEMENTS)] and row[-2:] == ["…", "+84"]
    assert summarize(torch.arange(100))["head"] == list(range(MAX_ELEMENTS))  # only the head travels


def test_2d_tensors_label_columns_by_index_and_numpy_works():
    v = view([np.arange(4).reshape(2, 2)])
    assert v.text().splitlines()[1].split() == ["rank", "[0,0]", "[0,1]", "[1,0]", "[1,1]"]
    assert v.header() == "x on rank 0: numpy int64[2,2]"


def test_a_list_of_values_can_be_shown_directly():
    v = gather([torch.ones(2), torch.zeros(2)])
    assert v.ranks == (0, 1) and v.text().splitlines()[0] == "value on ranks 0, 1: float32[2]"


def _dt(local, head, offset, shape, placements=("Shard(0)",), mesh=(0, 1)):
    return {"kind": "tensor", "dtype": "float32", "shape": list(local), "numel": math.prod(local), "head": head,
            "device": "cpu", "dtensor": {"shape": list(shape), "mesh": list(mesh), "dims": None,
                                         "placements": list(placements), "offset": offset}}


def _module(shards, placements=("Shard(0)",)):
    return {"kind": "module", "type": "FSDPSequential", "more": 0, "params": [
        {"name": name, "dtype": "float32", "shape": shape, "local": local, "placements": list(placements),
         "mesh": [0, 1]} for name, shape, local in shards]}


def test_a_dtensor_is_its_local_shards_with_mesh_placements_and_slices():
    v = RankValues("t", (0, 1), (_dt((2,), [0.0, 1.0], [0], (5,)), _dt((3,), [2.0, 3.0, 4.0], [2], (5,))))
    assert v.text() == ("t on ranks 0, 1: DTensor float32[5], mesh [0, 1], placements [Shard(0)]\n"
                        "rank  local  shard  [0]  [1]  [2]\n"
                        "0     [2]    [0:2]  0.   1.\n"
                        "1     [3]    [2:5]  2.   3.   4.")  # uneven shards are sharding, not a mismatch
    both = RankValues("r", (0, 1), tuple(_dt((2, 2), [1.0] * 4, [0, 0], (2, 2), ("Replicate()",)) for _ in range(2)))
    assert both.text().splitlines()[2].split()[:3] == ["0", "[2,2]", "all"]
    odd = RankValues("t", (0, 1), (_dt((2,), [0.0, 1.0], [0], (4,)), _dt((4,), [0.0] * 4, [0], (4,), ("Replicate()",))))
    assert odd.text().splitlines()[0] == "t on ranks 0, 1: placements differ across ranks (rows marked !)"
    assert odd.text().splitlines()[3].startswith("1!    DTensor float32[4]  [4]    all")
    html = to_html(v)
    assert "<th" in html and ">[2:5]<" in html and html == to_html(v)
    sliced = RankValues("p", (0, 1, 2, 3), tuple(  # each rank's row of a 2x2 mesh: mesh["tp"]
        _dt((2,), [float(r)] * 2, [0], (2,), ("Partial(sum)",), mesh=(0, 1) if r < 2 else (2, 3)) for r in range(4)))
    assert sliced.text().splitlines()[:3] == [
        "p on ranks 0-3: DTensor float32[2], meshes [0, 1], [2, 3], placements [Partial(sum)]",
        "rank  local  shard        [0]  [1]",
        "0     [2]    all partial  0.   0."]


def test_a_module_is_one_table_of_parameters_and_shards():
    rows = (_module([("0.weight", [4, 5], [2, 5]), ("0.bias", [3], [2])]),
            _module([("0.weight", [4, 5], [2, 5]), ("0.bias", [3], [1])]))
    v = RankValues("model", (0, 1), rows)
    assert v.text() == ("model on ranks 0, 1: FSDPSequential, 2 parameters, 2 DTensors on mesh [0, 1]\n"
                        "parameter  global        placements  rank 0  rank 1\n"
                        "0.weight   float32[4,5]  [Shard(0)]  [2,5]   [2,5]\n"
                        "0.bias     float32[3]    [Shard(0)]  [2]     [1]\n"
                        "elements   23                        12      11")
    html = to_html(v)
    assert "rank 1 holds 33% of 0.bias" in html and html == to_html(RankValues("model", (0, 1), rows))
    bad = RankValues("model", (0, 1), (rows[0], _module([("0.weight", [4, 5], [2, 5])])))
    assert bad.text().splitlines()[0] == "model on ranks 0, 1: parameters differ across ranks (rows marked !)"
    assert bad.text().splitlines()[3].split() == ["0.bias!", "float32[3]", "[Shard(0)]", "[2]", "-"]


# ---- real ranks -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(world4):
    """The shared world of 4 drives conftest's ``ip`` shell here."""
    return world4


DTENSOR = """\
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
mesh = init_device_mesh("cpu", (world_size,))
dt = distribute_tensor(torch.arange(10.), mesh, [Shard(0)])
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
"""
#: (cell, the name it defines, that name's table from every rank)
GATHERED = {
    "tensor": ("shown = torch.arange(3.) * (rank + 1)", "shown",
               "shown on ranks 0-3: float32[3]\n"
               "rank  [0]  [1]  [2]\n"
               "0     0.   1.   2.\n"
               "1     0.   2.   4.\n"
               "2     0.   3.   6.\n"
               "3     0.   4.   8."),
    "dtensor": (DTENSOR, "dt",
                "dt on ranks 0-3: DTensor float32[10], mesh [0, 1, 2, 3], placements [Shard(0)]\n"
                "rank  local  shard   [0]  [1]  [2]\n"
                "0     [3]    [0:3]   0.   1.   2.\n"
                "1     [3]    [3:6]   3.   4.   5.\n"
                "2     [3]    [6:9]   6.   7.   8.\n"
                "3     [1]    [9:10]  9."),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", GATHERED)
def test_gathered_from_every_rank_through_api_and_magic(world4, ip, case):
    cell, name, text = GATHERED[case]
    assert world4.execute(cell).error() is None
    expected = gather(name, world=world4)
    assert expected.text() == text
    with capture_output() as cap:
        ip.run_line_magic("pg_show", name)
    assert [o.data for o in cap.outputs] == [ShowView(expected)._repr_mimebundle_()]


@pytest.mark.integration
def test_some_ranks_through_api_and_magic(world4, ip):
    assert world4.execute("word = 'r' * (rank + 1)").error() is None
    with capture_output() as cap:
        pgnb.show("word", ranks=[1, 3])
    assert cap.outputs[0].data["text/plain"] == "word on ranks 1, 3: str\nrank  value\n1     rr\n3     rrrr"
    with capture_output() as cap:
        ip.run_line_magic("pg_show", "word --ranks 0-1")
    assert cap.outputs[0].data["text/plain"].splitlines()[0] == "word on ranks 0, 1: str"


@pytest.mark.integration
def test_a_name_missing_on_some_ranks_is_shown_not_raised(world4, ip):
    world4.execute("if rank == 2:\n    only_two = 7")
    v = gather("only_two", world=world4)
    assert v.text() == ("only_two on ranks 0-3: int; not defined on ranks 0, 1, 3\n"
                        "rank  value\n0     (not defined)\n1     (not defined)\n2     7\n3     (not defined)")
    assert gather("nowhere", world=world4).header() == "nowhere on ranks 0-3: not defined on any rank"


@pytest.mark.integration
def test_sharded_modules_through_api_and_magic(world4, ip):
    assert world4.execute(DTENSOR).error() is None
    with capture_output() as cap:
        pgnb.show("model", ranks=[0, 3])
    assert cap.outputs[0].data["text/plain"] == (
        "model on ranks 0, 3: FSDPSequential, 4 parameters, 4 DTensors on mesh [0, 1, 2, 3]\n"
        "parameter  global        placements  rank 0  rank 3\n"
        "0.weight   float32[4,3]  [Shard(0)]  [1,3]   [1,3]\n"
        "0.bias     float32[4]    [Shard(0)]  [1]     [1]\n"
        "1.weight   float32[2,4]  [Shard(0)]  [1,4]   [0,4]\n"
        "1.bias     float32[2]    [Shard(0)]  [1]     [0]\n"
        "elements   26                        9       4")
    with capture_output() as cap:
        ip.run_line_magic("pg_show", "model")
    assert cap.outputs[0].data["text/plain"].splitlines()[1] == (
        "parameter  global        placements  rank 0  rank 1  rank 2  rank 3")
    assert "holds" in cap.outputs[0].data["text/html"]


@pytest.mark.integration
def test_bad_input_is_one_line(ip):
    for line, msg in (("1x", "plain name"), ("t --ranks 9", "names rank 9"), ("", "arguments")):
        with pytest.raises(UsageError, match=msg):
            ip.run_line_magic("pg_show", line)
