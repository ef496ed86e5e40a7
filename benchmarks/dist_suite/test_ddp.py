"""A DistributedDataParallel training step at world 2 and 4: gradients averaged, replicas equal after it."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _base import GlooTestCase
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.common_utils import run_tests


class DataParallel:
    def _model(self) -> DistributedDataParallel:
        torch.manual_seed(0)  # the same initial weights on every rank
        return DistributedDataParallel(torch.nn.Linear(8, 4))

    def test_ddp_step(self) -> None:
        self.init_group()
        model = self._model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(self.rank)  # different data on every rank
        model(torch.randn(16, 8)).sum().backward()
        opt.step()
        weights = [torch.zeros_like(model.module.weight) for _ in range(self.world_size)]
        dist.all_gather(weights, model.module.weight.detach())
        for w in weights[1:]:
            self.assertEqual(w, weights[0])
        del model, opt  # DDP's reducer goes before its group does
        dist.destroy_process_group()

    def test_ddp_gradient_is_mean(self) -> None:
        self.init_group()
        model = self._model()
        x = torch.full((1, 8), float(self.rank + 1))
        model(x).sum().backward()
        mean = sum(range(1, self.world_size + 1)) / self.world_size
        self.assertEqual(model.module.weight.grad, torch.full((4, 8), mean))
        del model
        dist.destroy_process_group()


class DataParallelWorld2(DataParallel, GlooTestCase):
    WORLD = 2


class DataParallelWorld4(DataParallel, GlooTestCase):
    WORLD = 4


if __name__ == "__main__":
    run_tests()
