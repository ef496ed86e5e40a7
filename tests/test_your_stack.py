"""The training libraries users bring run in ``%%pg`` unchanged, with the results torchrun gives them.

The same cells (Lightning's ``Fabric`` and ``Trainer`` with ``strategy="ddp"`` and ``devices`` = the world,
HF Accelerate's ``Accelerator``, the HF ``Trainer`` on a tiny randomly initialised BERT, and the variables
torchrun gives its workers) run twice: as one script under torchrun (``python -m torch.distributed.run
--standalone``), and cell by cell in a real kernel's ``%%pg`` on a world of 2, then of 4. Each cell prints
one line per rank, "RANK NAME: RESULT"; the two runs must print the same lines. torchrun's run also says
which variables it gives (the environment it adds, by name): every one must be on pgnb's ranks too, but
``TORCHELASTIC_ERROR_FILE`` (docs/your_stack.md says why). One kernel for the module; the libraries come
from the test extra.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import GONE_WITHIN

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

#: What torchrun gives that pgnb's ranks do not (docs/your_stack.md): a file for torch's ``@record``.
NOT_ON_RANKS = {"TORCHELASTIC_ERROR_FILE"}
#: Variables whose values differ by design: the run's id and address, and who serves the store.
OWN_VALUES = {"TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}
LINE = re.compile(r"^(\d+) (\w+): (.*)$", re.M)

CELLS = {
    "env": '''
import json, os
BEFORE = json.loads(os.environ.get("PGNB_TEST_PARENT_ENV", "{}"))
TORCHRUN_VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                 "OMP_NUM_THREADS"]
RANK = int(os.environ["RANK"])
print(RANK, "env:", json.dumps({k: os.environ[k] for k in TORCHRUN_VARS}, sort_keys=True))
if BEFORE:  # torchrun's run: which variables the launcher added
    added = [k for k in os.environ if k not in BEFORE and k not in ("_", "PGNB_TEST_PARENT_ENV")]
    print(RANK, "added:", json.dumps(sorted(added)))
else:
    print(RANK, "present:", json.dumps(sorted(os.environ)))
''',
    "fabric": '''
import lightning as L
import torch
from torch import nn

torch.manual_seed(0)
fabric = L.Fabric(accelerator="cpu", devices=__WORLD__, strategy="ddp")
fabric.launch()
net = nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
net, opt = fabric.setup(net, opt)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(fabric.global_rank))
fabric.backward(net(x).pow(2).mean())
opt.step()
weights = fabric.all_gather(net.weight.detach().sum())
print(RANK, "fabric:", fabric.global_rank, fabric.world_size, type(fabric.strategy).__name__,
      [round(w, 4) for w in weights.tolist()])
''',
    "trainer": '''
import logging
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
tiny = Tiny()
trainer = L.Trainer(accelerator="cpu", devices=__WORLD__, strategy="ddp", max_epochs=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(tiny, DataLoader(data, batch_size=8))
print(RANK, "trainer:", trainer.global_rank, trainer.world_size, trainer.global_step,
      round(tiny.layer.weight.sum().item(), 4))
''',
    "accelerate": '''
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
lin = nn.Linear(4, 1)
sgd = torch.optim.SGD(lin.parameters(), lr=0.1)
lin, sgd = accelerator.prepare(lin, sgd)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(accelerator.process_index))
accelerator.backward(lin(x).pow(2).mean())
sgd.step()
gathered = accelerator.gather(torch.tensor([accelerator.process_index]))
print(RANK, "accelerate:", accelerator.distributed_type, accelerator.num_processes, type(lin).__name__,
      gathered.tolist(), round(accelerator.unwrap_model(lin).weight.sum().item(), 4))
''',
    "hf_trainer": '''
import tempfile
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

class Tokens(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (8,), generator=g), "labels": torch.tensor(i % 2)}

config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32)
with tempfile.TemporaryDirectory() as out_dir:
    args = TrainingArguments(output_dir=out_dir, use_cpu=True, per_device_train_batch_size=4, max_steps=2,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    hf = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens())
    result = hf.train()
print(RANK, "hf_trainer:", args.world_size, args.parallel_mode, result.global_step, round(result.training_loss, 4))
''',
}


def script(world: int) -> str:
    return "\n".join(textwrap.dedent(c).replace("__WORLD__", str(world)) for c in CELLS.values())


def torchrun(world: int, tmp_path) -> str:
    """The cells as one script under torchrun: what each library gives there, rank by rank."""
    path = tmp_path / f"stack_{world}.py"
    path.write_text(script(world))
    env = {**os.environ, "PGNB_TEST_PARENT_ENV": json.dumps(dict(os.environ))}
    logs = tmp_path / f"torchrun_{world}"
    # each worker's stdout to a file of its own (--redirects 1): on one pipe, the ranks' lines interleave
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          f"--nproc-per-node={world}", "--redirects=1", f"--log-dir={logs}", str(path)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    files = sorted(logs.rglob("stdout.log"))
    assert len(files) == world, files
    return "".join(f.read_text() for f in files)


def lines(text: str) -> dict[tuple[int, str], str]:
    return {(int(m[1]), m[2]): m[3] for m in LINE.finditer(text)}


@pytest.fixture(scope="module")
def kernel():
    from procs_util import MarkedKernel

    k = MarkedKernel()
    try:
        assert k.execute("%load_ext pgnb").status == "ok"
        yield k
    finally:
        k.close(kill=True)
        try:
            assert k.wait_nothing_left(GONE_WITHIN) == ([], [])
        finally:
            k.forget()


def pg(k, cell: str) -> str:
    ex = k.execute(f"%%pg --timeout 180\n{cell}", timeout=240)
    assert ex.status == "ok", ex.text()
    return "".join(o["text"] for o in ex.outputs if o.get("name") == "stdout")


@pytest.mark.parametrize("world", [2, 4])
def test_the_libraries_give_on_the_ranks_what_they_give_under_torchrun(kernel, world, tmp_path):
    expected = lines(torchrun(world, tmp_path))
    ex = kernel.execute(f"%pg_init --backend gloo --world {world}", timeout=120)
    assert ex.status == "ok", ex.text()
    got = lines("".join(pg(kernel, textwrap.dedent(c).replace("__WORLD__", str(world))) for c in CELLS.values()))

    for name in ("fabric", "trainer", "accelerate", "hf_trainer"):
        for r in range(world):
            assert got[(r, name)] == expected[(r, name)], (r, name)
    assert expected[(0, "fabric")].startswith(f"0 {world} DDPStrategy")
    assert expected[(world - 1, "accelerate")].startswith(f"DistributedType.MULTI_CPU {world} DistributedDataParallel")
    assert expected[(0, "hf_trainer")].startswith(f"{world} ParallelMode.DISTRIBUTED 2")

    for r in range(world):
        theirs, ours = json.loads(expected[(r, "env")]), json.loads(got[(r, "env")])
        assert ours == theirs, r
        assert ours["LOCAL_WORLD_SIZE"] == str(world) and ours["GROUP_WORLD_SIZE"] == "1"
        added = set(json.loads(expected[(r, "added")])) - OWN_VALUES
        assert added - NOT_ON_RANKS - set(json.loads(got[(r, "present")])) == set(), r


def test_devices_other_than_the_world_is_one_line(kernel):
    assert kernel.execute("%pg_init --backend gloo --world 4", timeout=120).status == "ok"
    ex = kernel.execute('%%pg\nimport lightning as L\nL.Fabric(accelerator="cpu", devices=3, strategy="ddp").launch()')
    assert ex.status == "error"
    # Lightning's own words, as under torchrun, in pgnb's one closing line naming the ranks
    assert ex.error["evalue"] == ("ranks 0-3 raised ValueError: You set `devices=3` and `num_nodes=1` in Lightning, "
                                  "but the product (3 * 1) does not match the world size (4)."), ex.text()
    # the engines live on: the next cell runs
    assert "ok" in pg(kernel, "print(rank, 'ok')")
