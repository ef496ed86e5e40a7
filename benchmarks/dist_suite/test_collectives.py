"""Collectives at world 2 and 4: each test checks the result on every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _base import GlooTestCase
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_utils import run_tests


class Collectives:
    """The tests, written once; the classes below give them a world size."""

    def test_all_reduce_sum(self) -> None:
        self.init_group()
        t = torch.full((4,), float(self.rank))
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((4,), float(sum(range(self.world_size)))))
        dist.destroy_process_group()

    def test_broadcast(self) -> None:
        self.init_group()
        t = torch.arange(3.0) if self.rank == 0 else torch.zeros(3)
        dist.broadcast(t, src=0)
        self.assertEqual(t, torch.arange(3.0))
        dist.destroy_process_group()

    def test_all_gather(self) -> None:
        self.init_group()
        out = [torch.zeros(2) for _ in range(self.world_size)]
        dist.all_gather(out, torch.full((2,), float(self.rank)))
        self.assertEqual(torch.stack(out)[:, 0], torch.arange(float(self.world_size)))
        dist.destroy_process_group()

    def test_all_gather_into_tensor(self) -> None:
        self.init_group()
        out = torch.zeros(self.world_size * 2)
        dist.all_gather_into_tensor(out, torch.full((2,), float(self.rank)))
        self.assertEqual(out, torch.arange(float(self.world_size)).repeat_interleave(2))
        dist.destroy_process_group()

    def test_reduce_scatter_tensor(self) -> None:
        self.init_group()
        out = torch.zeros(2)
        dist.reduce_scatter_tensor(out, torch.ones(self.world_size * 2))
        self.assertEqual(out, torch.full((2,), float(self.world_size)))
        dist.destroy_process_group()

    def test_gather(self) -> None:
        self.init_group()
        out = [torch.zeros(1) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(torch.tensor([float(self.rank)]), out, dst=0)
        if out is not None:
            self.assertEqual(torch.cat(out), torch.arange(float(self.world_size)))
        dist.destroy_process_group()

    def test_scatter(self) -> None:
        self.init_group()
        t = torch.zeros(1)
        chunks = [torch.tensor([float(i * 10)]) for i in range(self.world_size)] if self.rank == 0 else None
        dist.scatter(t, chunks, src=0)
        self.assertEqual(t, torch.tensor([float(self.rank * 10)]))
        dist.destroy_process_group()

    def test_all_to_all_single(self) -> None:
        self.init_group()
        sent = torch.arange(float(self.world_size)) + self.rank * self.world_size
        got = torch.zeros(self.world_size)
        dist.all_to_all_single(got, sent)
        self.assertEqual(got, torch.arange(float(self.world_size)) * self.world_size + self.rank)
        dist.destroy_process_group()

    def test_all_gather_object(self) -> None:
        self.init_group()
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, {"rank": self.rank})
        self.assertEqual(out, [{"rank": r} for r in range(self.world_size)])
        dist.destroy_process_group()

    @skip_if_lt_x_gpu(2)
    def test_all_reduce_cuda(self) -> None:  # skipped here: torch's TEST_SKIPS exit code, from the ranks
        self.init_group()
        t = torch.ones(2, device=f"cuda:{self.rank}")
        dist.all_reduce(t)
        dist.destroy_process_group()


class CollectivesWorld2(Collectives, GlooTestCase):
    WORLD = 2


class CollectivesWorld4(Collectives, GlooTestCase):
    WORLD = 4


if __name__ == "__main__":
    run_tests()
