"""torch's main distributed suite, ``DistributedTest._DistTestBase``, as torch's CI runs it for gloo at world 2.

The suite ships in the torch wheel (``torch.testing._internal.distributed.distributed_test``);
torch's own ``test/distributed/test_distributed_spawn.py`` subclasses it with ``TestDistBackend``
and a ``setUp`` that spawns the processes, under ``BACKEND``, ``WORLD_SIZE`` and a ``TEMP_DIR``
holding ``barrier``. This file does the same (the environment is set here when it is not given):

    pytest benchmarks/torch_distributed                  # torch's spawning: a world per test
    pytest --pgnb-torch benchmarks/torch_distributed     # every test on one warm pgnb world
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="pgnb-dist-suite-")
    open(os.path.join(os.environ["TEMP_DIR"], "barrier"), "w").close()
    _OWNER, _FOLDER = os.getpid(), os.environ["TEMP_DIR"]

    @atexit.register
    def _remove_temp_dir() -> None:
        if os.getpid() == _OWNER:  # pytest's exit, not a process forked from it (a rank) running its handlers
            shutil.rmtree(_FOLDER, ignore_errors=True)

import torch  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
