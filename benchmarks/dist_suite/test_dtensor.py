"""DTensor redistributes at world 2 and 4, on torch's ``DTensorTestBase`` with ``@with_comms``."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms


class Redistribute:
    def _mesh(self):  # noqa: ANN202 - a DeviceMesh
        return init_device_mesh(self.device_type, (self.world_size,))

    @with_comms
    def test_shard_to_replicate(self) -> None:
        torch.manual_seed(0)
        full = torch.randn(self.world_size * 2, 3)
        dt = distribute_tensor(full, self._mesh(), [Shard(0)])
        self.assertEqual(dt.redistribute(placements=[Replicate()]).to_local(), full)

    @with_comms
    def test_replicate_to_shard(self) -> None:
        torch.manual_seed(0)
        full = torch.randn(self.world_size * 2, 3)
        dt = distribute_tensor(full, self._mesh(), [Replicate()]).redistribute(placements=[Shard(0)])
        self.assertEqual(dt.to_local(), full.chunk(self.world_size)[self.rank])

    @with_comms
    def test_partial_to_replicate(self) -> None:
        dt = DTensor.from_local(torch.ones(2, 2), self._mesh(), [Partial()])
        summed = torch.full((2, 2), float(self.world_size))
        self.assertEqual(dt.redistribute(placements=[Replicate()]).to_local(), summed)

    @with_comms
    def test_shard0_to_shard1(self) -> None:
        torch.manual_seed(0)
        full = torch.randn(self.world_size * 2, self.world_size * 2)
        dt = distribute_tensor(full, self._mesh(), [Shard(0)]).redistribute(placements=[Shard(1)])
        self.assertEqual(dt.to_local(), full.chunk(self.world_size, dim=1)[self.rank])


class RedistributeWorld2(Redistribute, DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2


class RedistributeWorld4(Redistribute, DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_2d_mesh_shard_replicate(self) -> None:
        torch.manual_seed(0)
        mesh = init_device_mesh(self.device_type, (2, 2), mesh_dim_names=("dp", "tp"))
        full = torch.randn(8, 4)
        dt = distribute_tensor(full, mesh, [Shard(0), Replicate()])
        self.assertEqual(dt.redistribute(placements=[Replicate(), Replicate()]).to_local(), full)


if __name__ == "__main__":
    run_tests()
