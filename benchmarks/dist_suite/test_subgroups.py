"""Subgroups: new_group of some ranks, new_subgroups, a collective inside each."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _base import GlooTestCase
from torch.testing._internal.common_distributed import skip_if_small_worldsize
from torch.testing._internal.common_utils import run_tests


class Subgroups:
    def test_new_group_pair(self) -> None:
        self.init_group()
        pair = dist.new_group([0, 1])
        t = torch.ones(2)
        if self.rank in (0, 1):
            dist.all_reduce(t, group=pair)
            self.assertEqual(t, torch.full((2,), 2.0))
        dist.destroy_process_group()

    def test_new_subgroups(self) -> None:
        self.init_group()
        size = 2 if self.world_size % 2 == 0 else 1
        mine, _ = dist.new_subgroups(group_size=size)
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t, group=mine)
        first = self.rank - self.rank % size
        self.assertEqual(t, torch.tensor([float(sum(range(first, first + size)))]))
        dist.destroy_process_group()

    @skip_if_small_worldsize
    def test_group_broadcast_large_world(self) -> None:  # skipped below world 8: WORLD_SIZE from setUp's environment
        self.init_group()
        upper = dist.new_group([2, 3])
        t = torch.tensor([7.0]) if self.rank == 2 else torch.zeros(1)
        if self.rank >= 2:
            dist.broadcast(t, src=2, group=upper)
            self.assertEqual(t, torch.tensor([7.0]))
        dist.destroy_process_group()


class SubgroupsWorld2(Subgroups, GlooTestCase):
    WORLD = 2


class SubgroupsWorld4(Subgroups, GlooTestCase):
    WORLD = 4


if __name__ == "__main__":
    run_tests()
