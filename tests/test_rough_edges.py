"""What third-party code meets in ``%%pg``: a world resized, a pulled DTensor, a cell that sets the rendezvous
variables, multi-line errors, warnings that would name the engine's temporary files.

The pure parts first (no engines), then a few short checks on the shared ``world4`` and one world of its own.
"""

from __future__ import annotations

import pytest

from pgnb.core.report import status_table
from pgnb.core.results import CellResult, RankOutput
from pgnb.core.snapshot import Snapshot, fresh_rows
from pgnb.core.text import SENTENCE_LIMIT, kept_text, one_line, resized_text, started_empty
from pgnb.rank.children import failures_text
from pgnb.rank.streams import format_warning, without_cell_files
from pgnb.spec import WorldSpec

#: torch's error for a call that matches none of its overloads: the first line ends in a colon and a list follows
OVERLOADS = ("add() received an invalid combination of arguments - got (str), but expected one of:\n"
             " * (Tensor input, Tensor other, *, Number alpha = 1, Tensor out = None)\n"
             " * (Tensor input, Number other, Number alpha = 1)\n")
NOTE = "(first line; the full message is under rank 0 above)"


# ---- one line of a multi-line error (no engines) ---------------------------------------


@pytest.mark.parametrize(("evalue", "line"), [
    ("division by zero", "E: division by zero"),
    ("Done.\nand more", "E: Done."),  # the first line is a whole sentence
    ("Expected all tensors to be on the same device, but\nfound at least two devices, cpu and cuda:0! (when x)\nmore",
     "E: Expected all tensors to be on the same device, but found at least two devices, cpu and cuda:0!"),
    (OVERLOADS, "E: add() received an invalid combination of arguments - got (str), but expected one of: "
                "(first line of the message)"),
    ("", "E"),
])
def test_one_line_keeps_a_whole_first_sentence_or_says_it_is_the_first_line(evalue, line):
    assert one_line("E", evalue) == line


def test_a_first_sentence_longer_than_the_limit_is_its_first_line_and_the_note():
    long = "word " * (SENTENCE_LIMIT // 5) + "end."
    assert one_line("E", "starts here\n" + long, where="under rank 3 above") == \
        "E: starts here (first line; the full message is under rank 3 above)"


def test_a_cells_one_line_error_says_where_the_full_message_is():
    ranks = [RankOutput(r, state="failed", ename="TypeError", evalue=OVERLOADS) for r in range(2)]
    err = str(CellResult(ranks, world=2).error())
    assert err == ("ranks 0, 1 raised TypeError: add() received an invalid combination of arguments - got (str), "
                   f"but expected one of: {NOTE}")
    assert OVERLOADS.strip() in CellResult(ranks, world=2).text()  # and there it is, whole


# ---- warnings and cell files on a rank (no engines) -------------------------------------


def test_a_warning_from_a_cell_reads_as_a_traceback_frame():
    text = format_warning(UserWarning("careful"), UserWarning, "/tmp/ipykernel_4242/1234567.py", 3,
                          'warnings.warn("careful")')
    assert text == 'Cell, line 3: UserWarning: careful\n  warnings.warn("careful")\n'
    lib = format_warning("old", FutureWarning, "/x/lib/python3.11/site-packages/torch/distributed/c10d.py", 88)
    assert lib == "torch/distributed/c10d.py: FutureWarning: old\n"


def test_cell_files_in_anything_a_rank_writes_read_as_cell():
    text = 'File "/tmp/ipykernel_99/123.py", line 3, in <module>\n/var/tmp/ipykernel_7/45.py:9: UserWarning: x\n'
    assert without_cell_files(text) == 'File "Cell", line 3, in <module>\nCell, line 9: UserWarning: x\n'
    assert without_cell_files("ipykernel_ only") == "ipykernel_ only"


def test_a_spawned_childs_coloured_traceback_reads_as_a_plain_one():
    """Python 3.13 colours tracebacks under FORCE_COLOR, which ipykernel sets in the engines' environment."""
    plain = ('Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
             '  File "/usr/lib/python3.13/multiprocessing/spawn.py", line 132, in _main\n'
             "    self = reduction.pickle.load(from_parent)\n"
             "AttributeError: Can't get attribute 'demo_basic' on <module '__main__' (built-in)>\n")
    coloured = ('Traceback (most recent call last):\n  File \x1b[35m"<string>"\x1b[0m, line \x1b[35m1\x1b[0m, '
                'in \x1b[35m<module>\x1b[0m\n  File \x1b[35m"/usr/lib/python3.13/multiprocessing/spawn.py"\x1b[0m, '
                "line \x1b[35m132\x1b[0m, in \x1b[35m_main\x1b[0m\n    self = reduction.pickle.load(from_parent)\n"
                "\x1b[1;35mAttributeError\x1b[0m: \x1b[35mCan't get attribute 'demo_basic' on <module '__main__' "
                "(built-in)>\x1b[0m\n")
    text = failures_text(plain)
    assert text.startswith("a process spawned by the cell failed:\nTraceback (most recent call last):\n"), text
    assert "  spawn.py, in _main\n" in text and "hint: 'demo_basic' was defined in a cell" in text, text
    assert failures_text(coloured) == text


def test_a_resized_world_says_so_under_its_table():
    spec = WorldSpec.validate(world=4)
    snap = Snapshot(spec, fresh_rows(spec, "initialized"), "initialized", note=resized_text(2, 4))
    assert status_table(snap).splitlines()[-1] == \
        "world size 2 -> 4: every rank starts with an empty namespace (what earlier cells defined on the ranks is gone)"
    assert resized_text(2, 4) not in status_table(Snapshot(spec, snap.ranks, "initialized"))


def test_fresh_ranks_are_those_that_started_empty_beside_kept_ones():
    """Engine ids per rank before and after a re-init: a rank is fresh only when others kept theirs."""
    assert started_empty([10, 11, 12, 13], [10, 11, 14, 13]) == [2]  # rank 2 replaced in place
    assert started_empty([10, 11, 12, 13], [10, 11, 12, 13, 14, 15]) == [4, 5]  # grown with --keep
    assert started_empty([10, 11], [10, 11]) == []  # nothing changed
    assert started_empty([], [10, 11]) == []  # a cold start: every rank is new, none is "fresh" beside others
    assert started_empty([10, 11], [12, 13]) == []  # every rank replaced
    assert kept_text([10, 11, 12, 13], [10, 11, 14, 13]) == "rank 2 replaced (empty namespace); ranks 0, 1, 3 kept"


# ---- on real ranks -----------------------------------------------------------------------


@pytest.mark.integration
def test_multi_line_error_on_the_ranks_is_one_line_with_the_note(world4):
    res = world4.execute(f"raise TypeError({OVERLOADS!r})", ranks=[0])
    assert str(res.error()) == ("rank 0 raised TypeError: add() received an invalid combination of arguments - "
                                f"got (str), but expected one of: {NOTE}")


@pytest.mark.integration
def test_warnings_and_printed_stacks_never_name_the_engines_temporary_files(world4):
    code = ("import traceback, warnings\n"
            "warnings.warn('pgnb rough edges: careful')\n"
            "traceback.print_stack(limit=1)\n")
    text = world4.execute(code, ranks=[0, 1]).text()
    assert "ipykernel_" not in text, text
    for r in (0, 1):
        part = text.split(f"[rank {r}]\n", 1)[1]
        assert part.startswith("Cell, line 2: UserWarning: pgnb rough edges: careful\n"
                               "  warnings.warn('pgnb rough edges: careful')\n"
                               '  File "Cell", line 3, in <module>\n'), text


@pytest.mark.integration
def test_a_pulled_dtensor_is_its_local_shard_and_compares_in_the_kernel(world4):
    import torch

    code = ("from torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.tensor import Shard, distribute_tensor\n"
            "rough_dt = distribute_tensor(torch.arange(8.0), init_device_mesh('cpu', (4,)), [Shard(0)])\n"
            "rough_dt\n")
    res = world4.execute(code)
    assert res.error() is None, res.text()
    try:
        for shards in (res.values, world4.pull("rough_dt"), world4.pull("rough_dt", ranks=[2])):
            assert all(type(t) is torch.Tensor for t in shards if t is not None)
        pulled = world4.pull("rough_dt")
        assert [t.tolist() for t in pulled] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
        assert bool((pulled[1] == torch.tensor([2.0, 3.0])).all())  # no process group needed here
    finally:
        world4.execute("del rough_dt")


@pytest.mark.integration
def test_a_cell_that_sets_the_rendezvous_variables_does_not_keep_them(world4):
    before = world4.execute("import os\nos.environ['MASTER_PORT'], os.environ['RANK']").values
    res = world4.execute("os.environ['MASTER_PORT'] = '12355'\nos.environ.pop('RANK')\nos.environ['MASTER_PORT']",
                         ranks=[0, 1])
    assert res.values[:2] == ["12355", "12355"]  # the cell itself sees what it set
    note = ("pgnb: this cell changed MASTER_PORT, RANK; later cells see pgnb's values again "
            "(the rendezvous variables are pgnb's)\n")
    assert res.text() == "".join(f"[rank {r}]\n{note}Out[rank {r}]: '12355'\n" for r in (0, 1))
    assert world4.execute("os.environ['MASTER_PORT'], os.environ['RANK']").values == before
    again = world4.execute("os.environ['MASTER_PORT'] = os.environ['MASTER_PORT']")  # unchanged: nothing said
    assert again.text() == ""


@pytest.mark.integration
def test_a_world_of_another_size_starts_every_rank_empty_and_says_so(make_world):
    sb = make_world(backend="gloo", world=2)
    probe = "print(sorted(n for n in ('x', 'y') if n in globals()), rank, world_size)"
    sb.execute("x = 1")
    sb.init(sb.spec.with_(world=3))  # grow
    assert sb.snapshot().note == resized_text(2, 3)
    assert sb.execute(probe).text() == "".join(f"[rank {r}]\n[] {r} 3\n" for r in range(3))
    sb.execute("y = 2")
    sb.init(sb.spec.with_(timeout=30))  # same size: the namespaces stay
    assert sb.snapshot().note == ""
    assert sb.execute(probe).text() == "".join(f"[rank {r}]\n['y'] {r} 3\n" for r in range(3))
    sb.init(sb.spec.with_(world=2))  # shrink
    assert sb.snapshot().note == resized_text(3, 2)
    assert sb.execute(probe).text() == "".join(f"[rank {r}]\n[] {r} 2\n" for r in range(2))

