"""Point-to-point at world 2 and 4: a ring of send/recv, isend/irecv, batch_isend_irecv."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _base import GlooTestCase
from torch.testing._internal.common_utils import run_tests


class PointToPoint:
    def test_send_recv_ring(self) -> None:
        self.init_group()
        right, left = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        got = torch.zeros(2)
        if self.rank % 2 == 0:
            dist.send(torch.full((2,), float(self.rank)), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(torch.full((2,), float(self.rank)), right)
        self.assertEqual(got, torch.full((2,), float(left)))
        dist.destroy_process_group()

    def test_isend_irecv(self) -> None:
        self.init_group()
        right, left = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        got = torch.zeros(3)
        reqs = [dist.isend(torch.full((3,), float(self.rank)), right), dist.irecv(got, left)]
        for r in reqs:
            r.wait()
        self.assertEqual(got, torch.full((3,), float(left)))
        dist.destroy_process_group()

    def test_batch_isend_irecv(self) -> None:
        self.init_group()
        right, left = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        got = torch.zeros(1)
        ops = [dist.P2POp(dist.isend, torch.tensor([float(self.rank)]), right), dist.P2POp(dist.irecv, got, left)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        self.assertEqual(got, torch.tensor([float(left)]))
        dist.destroy_process_group()


class PointToPointWorld2(PointToPoint, GlooTestCase):
    WORLD = 2


class PointToPointWorld4(PointToPoint, GlooTestCase):
    WORLD = 4


if __name__ == "__main__":
    run_tests()
