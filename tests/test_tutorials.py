"""Third-party torch.distributed code pasted into ``%%pg`` as tutorials write it, in a real kernel of world 2.

Code written for torchrun or ``mp.spawn`` inits the default group once at its start, destroys it at its end,
and dies. A rank lives on, so the same ``main()`` runs again and again in one rank: after ``%pg_destroy`` with
a DDP model of pgnb's group still alive, with its own DDP models kept from earlier runs, with ``tcp://`` and
another backend string. A second init while a group is up, and ``sys.exit()``, say so in one line. A
DataLoader's worker processes, forked from the engine, train and go away, and a SIGKILLed kernel leaves none.
One kernel for the module (its last test SIGKILLs it).
"""

from __future__ import annotations

import re
import time

import psutil
import pytest
from conftest import GONE_WITHIN, alive, wait_gone

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")

#: The DDP tutorial series' torchrun script, as written (gloo for the CPU), its main() one cell.
TUTORIAL = '''
import os
import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

def ddp_setup():
    init_process_group(backend="gloo")

def train(model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()

def main():
    ddp_setup()
    model = DDP(nn.Linear(4, 2))
    train(model)
    destroy_process_group()
    return model

kept = globals().get("kept", [])
kept.append(main())
print(len(kept), round(sum(p.sum().item() for p in kept[-1].parameters()), 4))
'''
#: The same with ``tcp://`` built from the environment, and rank and world size passed, as mp.spawn scripts do.
TUTORIAL_TCP = TUTORIAL.replace('''def ddp_setup():
    init_process_group(backend="gloo")''', '''def ddp_setup():
    url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    init_process_group(backend="cpu:gloo", init_method=url,
                       rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))''')
DATALOADER = '''
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), num_workers=2)
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
print("batches", len(loader), round(sum(p.sum().item() for p in model.parameters()), 4))
'''


@pytest.fixture(scope="module")
def kernel():
    from procs_util import MarkedKernel

    k = MarkedKernel()
    try:
        assert k.execute("%load_ext pgnb").status == "ok"
        ex = k.execute("%pg_init --backend gloo --world 2")
        assert ex.status == "ok", ex.text()
        yield k
    finally:
        k.close(kill=True)  # as nbval ends its kernels: pgnb's reaper must leave nothing
        try:
            assert k.wait_nothing_left(GONE_WITHIN) == ([], [])
        finally:
            k.forget()


def pg(k, cell: str, line: str = "--timeout 60"):
    """``%%pg line`` with ``cell``: its grouped text (stdout of the kernel) and the one-line error, or None."""
    ex = k.execute(f"%%pg {line}\n{cell}")
    out = "".join(o["text"] for o in ex.outputs if o.get("name") == "stdout")
    err = None if ex.error is None else ex.error["evalue"]
    assert not ABSOLUTE_PATH.search(ex.text()), ex.text()  # no path of this machine in what a rank shows
    return out, err


def status(k) -> str:
    ex = k.execute("%pg_status")
    assert ex.status == "ok", ex.text()
    return ex.outputs[-1]["data"]["text/plain"]


def rows(table: str) -> list[tuple[str, ...]]:
    """(rank, world, backend, state) of each row of a status table."""
    return [tuple(line.split()[:5]) for line in table.splitlines()[2:] if line[:1].isdigit()]


def engine_pids(k) -> list[int]:
    return [pid for _, _, pid, _ in k.world()["rows"]]


def one_value_per_rank(out: str) -> str:
    """The line both ranks printed (DDP keeps their models equal), checked to be the same on each."""
    lines = out.split("[rank 0]\n", 1)[1].split("[rank 1]\n")
    assert len(lines) == 2 and lines[0] == lines[1], out
    return lines[0].strip()


def test_a_tutorials_main_runs_after_pg_destroy_again_and_again(kernel):
    out, err = pg(kernel, "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
                          "pg_model = DDP(nn.Linear(4, 2))  # of pgnb's group, kept")
    assert err is None, out
    assert kernel.execute("%pg_destroy").status == "ok"
    for run in (1, 2, 3):
        t0 = time.monotonic()
        out, err = pg(kernel, TUTORIAL)
        assert err is None, out
        assert one_value_per_rank(out).startswith(f"{run} "), out  # trained, and the model kept
        assert time.monotonic() - t0 < 15
        out, err = pg(kernel, "print(dist.is_initialized(), os.environ['WORLD_SIZE'])")
        assert (out, err) == ("[rank 0]\nFalse 2\n[rank 1]\nFalse 2\n", None)
        assert rows(status(kernel)) == [("0", "2", "gloo", "cpu", "destroyed"), ("1", "2", "gloo", "cpu", "destroyed")]


def test_the_same_with_tcp_built_from_the_environment_and_another_backend_string(kernel):
    for run in (4, 5, 6):
        out, err = pg(kernel, TUTORIAL_TCP)
        assert err is None, out
        assert one_value_per_rank(out).startswith(f"{run} "), out
        assert "0/2 initialized (2 destroyed)" in status(kernel)


def test_the_status_says_what_a_cell_made_or_destroyed(kernel):
    out, err = pg(kernel, "ddp_setup()\nprint(dist.get_backend(), dist.get_world_size())")  # TUTORIAL_TCP's
    assert err is None, out
    table = status(kernel)
    assert "2/2 initialized" in table.splitlines()[0], table
    assert [r[1:] for r in rows(table)] == [("2", "cpu:gloo", "cpu", "initialized")] * 2, table  # as torch says
    assert pg(kernel, "destroy_process_group()") == ("", None)
    assert [r[4] for r in rows(status(kernel))] == ["destroyed", "destroyed"]
    ex = kernel.execute("%pg_init --backend gloo --world 2")  # pgnb's own group again, the same port as ever
    assert ex.status == "ok" and "2/2 initialized" in ex.text(), ex.text()
    out, err = pg(kernel, "t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nprint(t.item())")
    assert (out, err) == ("[rank 0]\n3.0\n[rank 1]\n3.0\n", None)


def test_a_second_init_and_sys_exit_say_so_in_one_line_and_the_engines_live_on(kernel):
    pids = engine_pids(kernel)
    t0 = time.monotonic()
    out, err = pg(kernel, "from torch.distributed import init_process_group\ninit_process_group(backend='gloo')")
    assert err == ("ranks 0, 1 raised ValueError: trying to initialize the default process group twice! pgnb's "
                   "group is up on this rank (backend gloo, world 2): use it as it is (dist, rank and world_size "
                   "are ready in every cell), or run %pg_destroy first")
    assert time.monotonic() - t0 < 5
    assert kernel.execute("%pg_destroy").status == "ok"
    out, err = pg(kernel, "init_process_group(backend='gloo')\ninit_process_group(backend='gloo')")
    assert err == ("ranks 0, 1 raised ValueError: trying to initialize the default process group twice! a group an "
                   "earlier init_process_group made is up on this rank (backend gloo, world 2): call "
                   "destroy_process_group() first")
    assert pg(kernel, "dist.destroy_process_group()") == ("", None)
    out, err = pg(kernel, "import sys\nsys.exit(1)")
    assert (out, err) == ("", "ranks 0, 1 called sys.exit(1)")
    assert pg(kernel, "print(rank)") == ("[rank 0]\n0\n[rank 1]\n1\n", None)
    assert engine_pids(kernel) == pids  # the same engines: none died
    assert kernel.execute("%pg_init --backend gloo --world 2").status == "ok"


def test_a_dataloader_workers_error_names_no_file_of_this_machine_and_its_workers_go(kernel):
    cell = ("from torch.utils.data import DataLoader, Dataset\n"
            "class Broken(Dataset):\n"
            "    def __len__(self):\n"
            "        return 4\n"
            "    def __getitem__(self, i):\n"
            "        return 1 / 0\n"
            "next(iter(DataLoader(Broken(), num_workers=2)))\n")
    ex = kernel.execute("%%pg --ranks 0 --timeout 60\n" + cell)
    assert ex.error["evalue"] == ("rank 0 raised ZeroDivisionError: Caught ZeroDivisionError in DataLoader worker "
                                  "process 0.")
    stderr = ex.error["stderr"]
    assert not ABSOLUTE_PATH.search(ex.text()), ex.text()
    assert '  File "torch/utils/data/_utils/worker.py", line ' in stderr, stderr  # the worker's own traceback
    assert '  File "Cell", line 6, in __getitem__\n' in stderr, stderr
    # the failed cell's frames hold the iterator, so its workers, for %pg_debug; the next cell lets them go (at
    # once: torch's shutdown of an errored iterator waits 5 s for each worker, then terminates it, as in a script)
    assert len(_workers(engine_pids(kernel))) >= 2
    t0 = time.monotonic()
    assert pg(kernel, "x = 1") == ("", None)
    assert time.monotonic() - t0 < 2
    assert wait_gone(_workers(engine_pids(kernel)), timeout=15.0) == []


def _workers(pids: list[int]) -> list[int]:
    """The processes the engines ``pids`` forked (a DataLoader's workers), still running."""
    found = []
    for pid in pids:
        try:
            found += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return alive(found)


def test_a_tutorials_main_runs_in_a_file_world_too(kernel):
    ex = kernel.execute("%pg_init --backend gloo --world 2 --init-method file")  # the same engines, a file:// store
    assert ex.status == "ok" and "2/2 initialized" in ex.text(), ex.text()
    out, err = pg(kernel, "import os\nprint(os.environ['MASTER_PORT'] != '0')")  # rank 0 listens there
    assert (out, err) == ("[rank 0]\nTrue\n[rank 1]\nTrue\n", None)
    assert kernel.execute("%pg_destroy").status == "ok"
    assert pg(kernel, "kept = []") == ("", None)
    for run in (1, 2):
        out, err = pg(kernel, TUTORIAL)
        assert err is None, out
        assert one_value_per_rank(out).startswith(f"{run} "), out
        assert "0/2 initialized (2 destroyed)" in status(kernel)
    ex = kernel.execute("%pg_init --backend gloo --world 2")
    assert ex.status == "ok" and "2/2 initialized" in ex.text(), ex.text()


def test_ranks_whose_inits_went_out_of_step_are_in_step_again_after_pg_destroy(kernel):
    assert kernel.execute("%pg_destroy").status == "ok"
    # an init on rank 1 alone fails (no rank 0 comes): rank 1 has made one init more than rank 0
    ex = kernel.execute("%%pg --ranks 1\nfrom datetime import timedelta\nfrom torch.distributed import "
                        "init_process_group\ninit_process_group(backend='gloo', timeout=timedelta(seconds=2))")
    assert ex.error["evalue"].startswith("rank 1 raised DistStoreError: wait timeout after 2000ms"), ex.text()
    assert kernel.execute("%pg_destroy").status == "ok"  # every rank counts its inits from 0 again
    t0 = time.monotonic()
    out, err = pg(kernel, TUTORIAL)
    assert err is None, out
    assert time.monotonic() - t0 < 15
    assert kernel.execute("%pg_init --backend gloo --world 2").status == "ok"


def test_a_rank_stuck_in_a_cells_own_init_is_replaced_in_place_by_the_next_init(kernel):
    assert kernel.execute("%pg_destroy").status == "ok"
    # a tutorial's setup() with a port of its own, on rank 1 alone: it waits for a rank 0 that never comes
    out, err = pg(kernel, "import os\nfrom torch.distributed import init_process_group\n"
                          "os.environ['MASTER_PORT'] = '12355'\ninit_process_group(backend='gloo')",
                  line="--ranks 1 --timeout 2")
    assert err.startswith("rank 1 still running after the 2 s --timeout, blocked in _create_c10d_store"), err
    assert err.endswith("run `%pg_init --backend gloo --world 2` to replace rank 1 in place "
                        "(the other ranks keep their state)"), err
    pids = engine_pids(kernel)
    # rank 1 never leaves the cell (SIGINT does not reach it there): the next init stops it and replaces it
    ex = kernel.execute("%pg_init --backend gloo --world 2 --timeout 5")
    assert ex.status == "ok" and "2/2 initialized" in ex.text(), ex.text()
    assert "rank 1 replaced (empty namespace); rank 0 kept" in ex.text(), ex.text()
    assert engine_pids(kernel)[0] == pids[0] and engine_pids(kernel)[1] != pids[1]  # rank 0's engine kept
    assert wait_gone([pids[1]], timeout=5.0) == []
    assert pg(kernel, "t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())") == ("[rank 0]\n2.0\n[rank 1]\n2.0\n",
                                                                                None)
    assert kernel.execute("%pg_init --backend gloo --world 2").status == "ok"


def test_a_dataloaders_workers_train_and_go_away_and_a_killed_kernel_leaves_none(kernel):
    pids = engine_pids(kernel)
    out, err = pg(kernel, DATALOADER)
    assert err is None, out
    assert one_value_per_rank(out).startswith("batches 4 "), out  # 64 samples, 2 ranks, batches of 8
    assert wait_gone(_workers(pids), timeout=10.0) == []
    # workers kept alive past the cell (persistent ones, mid-epoch): the kernel is SIGKILLed, nothing may stay
    out, err = pg(kernel, "keep = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)\n"
                          "batch = next(iter(keep))")
    assert err is None, out
    workers = _workers(pids)
    assert len(workers) == 4, workers
    kernel.close(kill=True)
    assert kernel.wait_nothing_left(GONE_WITHIN) == ([], [])
    assert alive(workers) == []
