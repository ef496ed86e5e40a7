"""Trivial tests in one MultiProcContinuousTest class at world 2: a test's own cost, nothing else."""

import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest


class TrivialTest(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"


for _i in range(20):
    setattr(TrivialTest, f"test_trivial_{_i:02d}", lambda self: self.assertEqual(dist.get_world_size(), 2))
