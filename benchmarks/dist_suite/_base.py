"""The base of the benchmark suite's tests: torch's ``MultiProcessTestCase``, as torch's own suites use it.

Each test makes its own gloo group from ``self.file_name`` (a ``FileStore``), as
torch's c10d tests do, and destroys it at the end; ``world_size`` is 2 or 4 by class.
"""

from __future__ import annotations

import os

import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class GlooTestCase(MultiProcessTestCase):
    WORLD = 2

    @property
    def world_size(self) -> int:
        return self.WORLD

    def setUp(self) -> None:
        super().setUp()
        os.environ.update(BACKEND="gloo", WORLD_SIZE=str(self.world_size))  # what torch's skip decorators read
        self._spawn_processes()

    def init_group(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
