"""Lightning and Accelerate on pgnb's ranks, beside the notebook launchers the libraries ship (docs/your_stack.md).

Each way runs in a fresh Jupyter kernel on a world of 2 (CPU, gloo), as a notebook user would: the same tiny
model trained for one step (time to the first step, from the first cell sent), then trained again in a later
cell (what the second call costs), then a cell that asks what is left of the run, then a run whose rank 1
raises (what the cell shows). The ways: pgnb (``%pg_init`` then ``%%pg`` cells with ``Trainer(strategy="ddp")``),
Lightning's ``Trainer(strategy="ddp_notebook")`` and Accelerate's ``notebook_launcher``.

    IPYTHONDIR=$(mktemp -d) .venv/bin/python -m benchmarks.your_stack     # ~1 min; prints the table
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernel_util import Kernel  # noqa: E402

SETUP = '''
import logging, warnings
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
for name in ("lightning.pytorch", "lightning.fabric"):
    logging.getLogger(name).setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

class Tiny(L.LightningModule):
    def __init__(self, fail_on=None):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fail_on = fail_on
    def training_step(self, batch, i):
        if self.global_rank == self.fail_on:
            raise ValueError("a bad batch on rank 1")
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=8)

def trainer(strategy, steps):
    return L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=steps, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
'''

ACCELERATE = '''
import torch
from torch import nn
from accelerate import Accelerator, notebook_launcher

def train(fail_on=None):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    if accelerator.process_index == fail_on:
        raise ValueError("a bad batch on rank 1")
    accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
    opt.step()
'''

WAYS = {
    "pgnb, `Trainer(strategy=\"ddp\")` in `%%pg`": {
        "first": ["%load_ext pgnb", "%pg_init --backend gloo --world 2", "%%pg\n" + SETUP,
                  "%%pg\nmodel = Tiny()\nt = trainer('ddp', 1)\nt.fit(model, loader())"],
        "again": ["%%pg\nt = trainer('ddp', 2)\nt.fit(model, loader())"],
        "left": "%%pg\nprint(rank, t.global_step, type(t.optimizers[0]).__name__)",
        "fail": "%%pg\ntrainer('ddp', 1).fit(Tiny(fail_on=1), loader())",
    },
    "Lightning, `Trainer(strategy=\"ddp_notebook\")`": {
        "first": [SETUP, "model = Tiny()\nt = trainer('ddp_notebook', 1)\nt.fit(model, loader())"],
        "again": ["t = trainer('ddp_notebook', 2)\nt.fit(model, loader())"],
        "left": "print(t.global_step, t.optimizers)",
        "fail": "trainer('ddp_notebook', 1).fit(Tiny(fail_on=1), loader())",
    },
    "Accelerate, `notebook_launcher`": {
        "first": [ACCELERATE, "notebook_launcher(train, num_processes=2)"],
        "again": ["notebook_launcher(train, num_processes=2)"],
        "left": "print('model' in globals(), 'accelerator' in globals())",
        "fail": "notebook_launcher(train, args=(1,), num_processes=2)",
    },
}


def measure(cells: dict[str, object]) -> dict[str, str]:
    k = Kernel()
    try:
        t0 = time.monotonic()
        for code in cells["first"]:  # type: ignore[attr-defined]
            ex = k.execute(code, timeout=300)
            assert ex.status == "ok", ex.text()[-2000:]
        first = time.monotonic() - t0
        t0 = time.monotonic()
        for code in cells["again"]:  # type: ignore[attr-defined]
            ex = k.execute(code, timeout=300)
            assert ex.status == "ok", ex.text()[-2000:]
        again = time.monotonic() - t0
        left = k.execute(str(cells["left"]))
        t0 = time.monotonic()
        fail = k.execute(str(cells["fail"]), timeout=300)
        failed_after = time.monotonic() - t0
        err = fail.error or {}
        words = [ln for ln in str(err.get("evalue") or "").splitlines() if ln.strip()]
        shown = f"after {failed_after:.1f} s, {err.get('ename')}: {words[0][:200] if words else ''}"
        if fail.status == "ok":
            shown = f"after {failed_after:.1f} s, the cell ends ok"
        out = "".join(o.get("text", "") for o in left.outputs if o.get("name") == "stdout").strip()
        return {"first": f"{first:.1f} s", "again": f"{again:.1f} s",
                "left": (out or (left.error or {}).get("evalue", ""))[:160], "fail": shown}
    finally:
        k.shutdown()


def main() -> None:
    import platform

    import psutil

    print(f"{platform.node()}: {psutil.cpu_count()} cores, load {psutil.getloadavg()[0]:.1f}")
    print("| way | first step (from the first cell) | a second training call | the next cell asks what is left | "
          "rank 1 raises: the cell shows |")
    print("|---|---:|---:|---|---|")
    for name, cells in WAYS.items():
        r = measure(cells)
        print(f"| {name} | {r['first']} | {r['again']} | `{r['left']}` | `{r['fail']}` |", flush=True)


if __name__ == "__main__":
    main()
