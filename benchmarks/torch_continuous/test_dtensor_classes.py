"""Small DTensorContinuousTestBase classes at worlds 2 and 4, written for this benchmark in the style of
torch's test/distributed/tensor files (torch's own continuous files fetched here need APIs newer than
torch 2.13's: BlockShard, shard_order). Each class is one world under torch's harness."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorContinuousTestBase


class RedistributeWorld2Test(DTensorContinuousTestBase):
    world_size = 2

    def test_shard_to_replicate(self):
        mesh = self.build_device_mesh()
        full = torch.arange(24.0).reshape(6, 4)
        dt = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(dt.to_local(), full.chunk(2)[self.rank])
        self.assertEqual(dt.redistribute(mesh, [Replicate()]).to_local(), full)

    def test_replicate_to_shard(self):
        mesh = self.build_device_mesh()
        full = torch.randn(4, 6)
        dt = distribute_tensor(full, mesh, [Replicate()]).redistribute(mesh, [Shard(1)])
        self.assertEqual(dt.to_local(), full.chunk(2, dim=1)[self.rank])

    def test_partial_to_replicate(self):
        mesh = self.build_device_mesh()
        local = torch.ones(3) * (self.rank + 1)
        dt = DTensor.from_local(local, mesh, [Partial()])
        self.assertEqual(dt.redistribute(mesh, [Replicate()]).to_local(), torch.full((3,), 3.0))

    def test_uneven_shard(self):
        mesh = self.build_device_mesh()
        full = torch.arange(5.0)
        dt = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(dt.full_tensor(), full)
        self.assertEqual(dt.to_local().numel(), 3 if self.rank == 0 else 2)


class OpsWorld2Test(DTensorContinuousTestBase):
    world_size = 2

    def test_sum(self):
        mesh = self.build_device_mesh()
        full = torch.randn(8, 3)
        dt = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(dt.sum().full_tensor(), full.sum())

    def test_mm_sharded(self):
        mesh = self.build_device_mesh()
        a, b = torch.randn(4, 6), torch.randn(6, 2)
        out = distribute_tensor(a, mesh, [Shard(0)]) @ distribute_tensor(b, mesh, [Replicate()])
        self.assertEqual(out.full_tensor(), a @ b)

    def test_softmax(self):
        mesh = self.build_device_mesh()
        full = torch.randn(4, 5)
        dt = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(torch.softmax(dt, dim=1).full_tensor(), torch.softmax(full, dim=1))

    def test_all_reduce_on_class_group(self):
        t = torch.ones(2) * self.rank
        dist.all_reduce(t, group=self.pg)
        self.assertEqual(t, torch.ones(2))


class Mesh2DWorld4Test(DTensorContinuousTestBase):
    world_size = 4

    def test_2d_shard_replicate(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = torch.arange(16.0).reshape(4, 4)
        dt = distribute_tensor(full, mesh, [Shard(0), Replicate()])
        self.assertEqual(dt.full_tensor(), full)

    def test_2d_shard_shard(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        full = torch.randn(4, 4)
        dt = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
        self.assertEqual(dt.to_local().shape, (2, 2))
        self.assertEqual(dt.redistribute(mesh, [Replicate(), Replicate()]).to_local(), full)

    def test_2d_partial(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        local = torch.ones(2)
        dt = DTensor.from_local(local, mesh, [Partial(), Partial()])
        self.assertEqual(dt.full_tensor(), torch.full((2,), 4.0))
