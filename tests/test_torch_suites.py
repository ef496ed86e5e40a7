"""``pytest --pgnb-torch`` on real engines: torch's own MultiProcessTestCase classes, the same verdicts both ways.

Each inner session runs in a process of its own. One small suite (world 2: a pass, a
failure where rank 1 raises while rank 0 waits for it in a collective, a skip by
torch's TEST_SKIPS exit code, a DTensorTestBase test with @with_comms, a class that
overrides ``_run``, a test left to torch's spawning) runs under torch's own
spawning and under the plugin; every test's verdict must be the same. A hung
test fails at the plugin's timeout with every rank's stack, and the test after
it passes on a fresh world.
"""

from __future__ import annotations

import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

SUITE = textwrap.dedent('''
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms


    class Base(MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            os.environ["SUITE_MARK"] = "set by setUp"  # a spawned process inherits it
            self._spawn_processes()

        def group(self):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)


    class TestSuite(Base):
        def test_pass(self):
            self.group()
            t = torch.ones(1) * self.rank
            dist.all_reduce(t)
            self.assertEqual(t.item(), 1.0)
            self.assertEqual(os.environ["SUITE_MARK"], "set by setUp")
            self.assertEqual(dist.get_world_size(), 2)
            dist.destroy_process_group()

        def test_fail(self):
            self.group()
            if self.rank == 1:
                self.assertEqual(self.rank, 0, "rank 1 disagrees")
            dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1

        @skip_if_lt_x_gpu(2)
        def test_skip(self):
            pass

        def test_own_process(self):  # ends its process: left to torch's spawning
            self.group()
            dist.barrier()
            dist.destroy_process_group()
            os._exit(0)


    class TestOverridesRun(Base):
        @classmethod
        def _run(cls, rank, test_name, file_name, parent_pipe, **kwargs):
            os.environ["SUITE_RUN"] = f"overridden on rank {rank}"
            super()._run(rank, test_name, file_name, parent_pipe, **kwargs)

        def test_sees_override(self):
            self.assertEqual(os.environ.get("SUITE_RUN"), f"overridden on rank {self.rank}")
            self.assertTrue(self.file_name)


    class TestDTensor(DTensorTestBase):
        @property
        def world_size(self):
            return 2

        @with_comms
        def test_redistribute(self):
            mesh = init_device_mesh(self.device_type, (2,))
            full = torch.arange(8.0).reshape(4, 2)
            dt = distribute_tensor(full, mesh, [Shard(0)]).redistribute(placements=[Replicate()])
            self.assertEqual(dt.to_local(), full)
''')

HANG = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiProcessTestCase


    class TestHang(MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def group(self):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

        def test_a_hangs(self):
            self.group()
            if self.rank == 0:
                dist.recv(torch.zeros(1), src=1)  # rank 1 never sends
            else:
                dist.barrier()  # and rank 0 never joins

        def test_b_after(self):
            self.group()
            dist.barrier()
            dist.destroy_process_group()
''')

EXPECTED = {
    "TestSuite::test_pass": ("passed", ""),
    "TestSuite::test_fail": ("failed", ""),
    "TestSuite::test_skip": ("skipped", "Need at least 2 CUDA devices"),
    "TestSuite::test_own_process": ("passed", ""),
    "TestOverridesRun::test_sees_override": ("passed", ""),
    "TestDTensor::test_redistribute": ("passed", ""),
}


def verdicts(path: Path) -> dict[str, tuple[str, str]]:
    """``Class::test -> (outcome, skip reason)`` from a junit xml file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                reason = (node.get("message") or "").split("\n")[0] if tag == "skipped" else ""
                break
        out[f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"] = (outcome, reason)
    return out


def test_same_verdicts_as_torch_spawning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    runs = {}
    for mode, args in (("pgnb", ["--pgnb-torch"]), ("spawn", [])):
        t0 = time.monotonic()
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", f"--junitxml={mode}.xml", *args,
                                               timeout=900)
        runs[mode] = (result, time.monotonic() - t0, verdicts(pytester.path / f"{mode}.xml"))
        print(f"{mode}: {runs[mode][1]:.1f} s")
    (warm, _, got), (spawned, _, torch_own) = runs["pgnb"], runs["spawn"]
    assert torch_own == EXPECTED, spawned.stdout.str()
    assert got == torch_own, warm.stdout.str()
    out = warm.stdout.str()
    # the rank that raised comes first, with its own traceback; the rank that waited for it is its consequence
    assert "rank 1 failed first: AssertionError" in out and "rank 1 disagrees" in out
    assert "rank 0 failed only because of it" in out
    # torch's skip reason, from the ranks' TEST_SKIPS exit code
    assert "SKIPPED [1] test_suite.py" in out and "Need at least 2 CUDA devices" in out
    # the test that ends its process ran under torch's spawning, and the summary says why in one line
    assert "--pgnb-torch: 1 left to torch's own spawning" in out
    assert "test_suite.py::TestSuite::test_own_process: its code calls os._exit" in out


def test_hung_test_costs_its_timeout_and_the_next_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hang=HANG)
    pytester.makeini("[pytest]\npgnb_timeout = 5\n")
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgnb-torch", "--durations=2", timeout=300)
    print(f"{time.monotonic() - t0:.1f} s")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "the test ran past its 5 s timeout on ranks 0, 1; pgnb replaced the world" in out, out
    assert "in recv" in out and "in barrier" in out, out  # where each rank was blocked
    assert "test_hang.py, in test_a_hangs" in out, out
