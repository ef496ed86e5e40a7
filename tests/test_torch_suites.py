"""``pytest --pgnb-torch`` on real engines: torch's own MultiProcessTestCase classes, the same verdicts both ways.

Each inner session runs in a process of its own. One small suite (world 2: a pass, a
failure where rank 1 raises while rank 0 waits for it in a collective, a skip by
torch's TEST_SKIPS exit code, a DTensorTestBase test with @with_comms, a class that
overrides ``_run``, a test left to torch's spawning, and two MultiProcContinuousTest
classes, one of them skipped by its _init_pg) runs under torch's own harnesses and
under the plugin; every test's verdict must be the same. A hung test fails at the
plugin's timeout with every rank's stack, and the test after it passes on a fresh
world. In a continuous class, a test that fails on rank 1 while rank 0 waits in a
barrier costs only itself (torch's harness waits out its group's 120 s timeout and
skips the rest of the class), and so does a hung one.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

SUITE = textwrap.dedent('''
    import os
    import sys
    import time
    import unittest

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.testing._internal.common_distributed import (
        TEST_SKIPS, MultiProcContinuousTest, MultiProcessTestCase, skip_if_lt_x_gpu)

    os.environ["SUITE_CLASS_MARK"] = "set in the pytest process"
    # torch's intra-op threads in a fresh process (a spawned one re-imports this module: the parent's stays)
    os.environ.setdefault("SUITE_FRESH_THREADS", str(torch.get_num_threads()))
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms


    class Base(MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            os.environ["SUITE_MARK"] = "set by setUp"  # a spawned process inherits it
            # as torch's TestDistBackend does: one test's exit status is not checked, listed for every test
            listed = getattr(self, "test_any_exit_status", None)
            self.skip_return_code_checks = [getattr(listed, "__wrapped__", listed)] if listed else []
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
            self.assertEqual(torch.get_num_threads(), int(os.environ["SUITE_FRESH_THREADS"]))
            dist.destroy_process_group()

        def test_fail(self):
            self.group()
            if self.rank == 1:
                self.assertEqual(self.rank, 0, "rank 1 disagrees")
            dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1

        @skip_if_lt_x_gpu(2)
        def test_skip(self):
            pass

        def test_any_exit_status(self):  # listed in skip_return_code_checks: left to torch's spawning
            sys.exit(3)

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


    class TestContinuous(MultiProcContinuousTest):  # torch's continuous harness: one world for the class
        world_size = 2

        @classmethod
        def backend_str(cls):
            return "gloo"

        def test_collective(self):
            t = torch.ones(1) * self.rank
            dist.all_reduce(t)
            self.assertEqual(t.item(), 1.0)
            self.assertIs(self.pg, dist.group.WORLD)
            self.assertEqual(os.environ["LOCAL_RANK"], str(self.rank))  # torch's _init_pg sets it

        def test_seeded(self):
            self.assertEqual(torch.initial_seed(), 1234)  # torch's set_rng_seed() before each test
            self.assertEqual(os.environ["SUITE_CLASS_MARK"], "set in the pytest process")
            self.assertEqual(torch.get_num_threads(), int(os.environ["SUITE_FRESH_THREADS"]))

        @unittest.skip("unittest's skip mark")  # unittest skips it in pytest's process: no rank runs it
        def test_unittest_skip(self):
            raise AssertionError("a skipped test does not run")


    class TestContinuousSkipsAtInit(MultiProcContinuousTest):
        world_size = 2

        @classmethod
        def _init_pg(cls, rank, world_size, rdvz_file):
            sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

        def test_never_runs(self):
            raise AssertionError("a class whose _init_pg skipped runs no test")


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
    "TestSuite::test_any_exit_status": ("passed", ""),
    "TestOverridesRun::test_sees_override": ("passed", ""),
    "TestDTensor::test_redistribute": ("passed", ""),
    "TestContinuous::test_collective": ("passed", ""),
    "TestContinuous::test_seeded": ("passed", ""),
    "TestContinuous::test_unittest_skip": ("skipped", "unittest's skip mark"),
    "TestContinuousSkipsAtInit::test_never_runs": ("skipped", "Need at least 2 CUDA devices"),
}

CONTINUOUS = textwrap.dedent('''
    import time

    import torch
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiProcContinuousTest


    class TestFailure(MultiProcContinuousTest):
        world_size = 2

        @classmethod
        def backend_str(cls):
            return "gloo"

        def test_1_pass(self):
            dist.barrier()

        def test_2_rank_1_fails(self):
            if self.rank == 1:
                raise ValueError("rank 1 is broken")
            dist.barrier()  # rank 0 waits here for rank 1

        def test_3_next_passes(self):
            t = torch.ones(1)
            dist.all_reduce(t)
            self.assertEqual(t.item(), 2.0)


    class TestHang(MultiProcContinuousTest):
        world_size = 2

        @classmethod
        def backend_str(cls):
            return "gloo"

        def test_1_hangs(self):
            if self.rank == 0:
                dist.recv(torch.zeros(1), src=1)  # rank 1 never sends
            else:
                time.sleep(600)

        def test_2_next_passes(self):
            dist.barrier()
''')


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


def _run_suite(pytester: pytest.Pytester, mode: str, *args: str) -> tuple[pytest.RunResult, dict[str, tuple[str, str]]]:
    pytester.makepyfile(test_suite=SUITE)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", f"--junitxml={mode}.xml", *args,
                                           timeout=900)
    print(f"{mode}: {time.monotonic() - t0:.1f} s")
    return result, verdicts(pytester.path / f"{mode}.xml")


# The two halves of one check, each against EXPECTED: the same verdicts both ways. Apart, so that the
# support matrix (make matrix) runs the warm half alone, without torch's spawning (3-4 minutes here).
GC_PROBE = """
import gc, json
def pytest_runtest_setup(item):
    with open("gc.json", "w") as f:
        json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, f)
"""


def test_verdicts_on_warm_ranks(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(GC_PROBE)
    warm, got = _run_suite(pytester, "pgnb", "--pgnb-torch")
    assert got == EXPECTED, warm.stdout.str()
    # pytest's process: what collection left alive (torch among it) frozen, the collector on for the tests
    collector = json.loads((pytester.path / "gc.json").read_text())
    assert collector["enabled"] and collector["frozen"] > 100_000, collector
    out = warm.stdout.str()
    # the rank that raised comes first, with its own traceback; the rank that waited for it is its consequence
    assert "rank 1 failed first: AssertionError" in out and "rank 1 disagrees" in out
    assert "rank 0 failed only because of it" in out
    # torch's skip reason, from the ranks' TEST_SKIPS exit code
    assert "SKIPPED [1] test_suite.py" in out and "Need at least 2 CUDA devices" in out
    # the test that ends its process ran under torch's spawning, and the summary says why in one line
    # only the tests the rule names: the one whose own method is listed, not every test setUp lists it for
    assert "--pgnb-torch: 2 left to torch's own spawning" in out, out
    assert "test_suite.py::TestSuite::test_own_process: its code calls os._exit" in out
    assert ("test_suite.py::TestSuite::test_any_exit_status: it expects an exit status of its own "
            "(skip_return_code_checks)") in out, out


def test_a_failed_collection_leaves_the_collector_on(pytester: pytest.Pytester) -> None:
    import gc

    pytester.makepyfile(test_broken="def test_x(:\n    pass\n")
    assert gc.isenabled()
    result = pytester.inline_run("-p", "no:cacheprovider", "--pgnb-torch")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert gc.isenabled()


@pytest.mark.slow  # torch's own spawning of the suite (~50 s on a worker): make soak; make test runs the warm half
def test_same_verdicts_as_torch_spawning(pytester: pytest.Pytester) -> None:
    spawned, torch_own = _run_suite(pytester, "spawn")
    assert torch_own == EXPECTED, spawned.stdout.str()


def test_hung_test_costs_its_timeout_and_the_next_passes(pytester: pytest.Pytester) -> None:
    """pytest-timeout's --timeout on the command line, as a user gives it: pgnb's report (every rank's stack)
    comes before pytest-timeout's (the pytest process's threads)."""
    pytester.makepyfile(test_hang=HANG)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgnb-torch", "--durations=2",
                                           "--timeout", "7", timeout=300)
    print(f"{time.monotonic() - t0:.1f} s")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert ("the test ran past its 5 s timeout on ranks 0, 1 (pgnb's, 2 s before pytest-timeout's 7 s); "
            "pgnb replaced the world") in out, out
    assert "from pytest-timeout" not in out, out
    assert "in recv" in out and "in barrier" in out, out  # where each rank was blocked
    # the test file's own frame with its line and source (the user's file), torch's frames without
    assert re.search(r"test_hang.py, line \d+, in test_a_hangs\n\W*dist\.(recv|barrier)\(", out), out


def test_a_tests_timeout_is_pytest_timeouts_in_its_own_order(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pgnb's own setting: pytest-timeout's marker, else --timeout, else PYTEST_TIMEOUT, else its ini
    setting; the ranks' deadline a little shorter, so that pgnb's report comes first."""
    from pgnb.testing.plugin import DEFAULT_TIMEOUT, _timeouts

    pytester.makepyfile(test_bare="def test_x(): pass\n",
                        test_marked="import pytest\n@pytest.mark.timeout(3)\ndef test_x(): pass\n")

    def timeouts(*args: str, module: str = "test_bare") -> tuple[float, float]:
        col = pytester.getmodulecol(pytester.path / f"{module}.py", configargs=args)
        (item,) = pytester.genitems([col])
        return _timeouts(item)

    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    assert timeouts() == (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)
    pytester.makeini("[pytest]\ntimeout = 11\n")
    assert timeouts() == (11, 9)
    monkeypatch.setenv("PYTEST_TIMEOUT", "9")
    assert timeouts() == (9, 7)
    assert timeouts("--timeout", "7") == (7, 5)
    assert timeouts("--timeout", "7", module="test_marked") == (3, 1.5)
    assert timeouts("--timeout", "0") == (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)  # pytest-timeout: none
    assert timeouts("-p", "no:timeout") == (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)  # its settings mean nothing then


def test_continuous_failure_and_hang_cost_only_their_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_continuous=CONTINUOUS)
    pytester.makeini("[pytest]\npgnb_timeout = 5\n")
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgnb-torch", "--junitxml=c.xml",
                                           timeout=300)
    wall = time.monotonic() - t0
    print(f"{wall:.1f} s")
    out = result.stdout.str()
    assert verdicts(pytester.path / "c.xml") == {
        "TestFailure::test_1_pass": ("passed", ""),
        "TestFailure::test_2_rank_1_fails": ("failed", ""),
        "TestFailure::test_3_next_passes": ("passed", ""),  # no poison pill
        "TestHang::test_1_hangs": ("failed", ""),
        "TestHang::test_2_next_passes": ("passed", ""),
    }, out
    # the rank that raised, with its traceback, first; the rank in the barrier is its consequence, at once
    assert "rank 1 failed first: ValueError: rank 1 is broken; rank 0 failed only because of it" in out, out
    assert 'File "test_continuous.py", line 20, in test_2_rank_1_fails' in out, out
    # the hang: its timeout, every rank's stack, a fresh world for the next test
    assert "the test ran past its 5 s timeout on ranks 0, 1; pgnb replaced the world" in out, out
    assert "in recv" in out, out  # both ranks' stacks, the test file's frames with their line and source
    assert re.search(r"test_continuous.py, line 38, in test_1_hangs\n\W*dist.recv\(torch.zeros\(1\), src=1\)", out), out
    assert re.search(r"test_continuous.py, line 40, in test_1_hangs\n\W*time.sleep\(600\)", out), out
    assert wall < 120, f"{wall:.0f} s: a failure or a hang cost more than its own test"


#: A handful of torch's DistributedTest suite (benchmarks/torch_distributed: gloo, world 2), with the verdicts
#: torch's spawning gives them (the whole suite both ways: python -m benchmarks --only torch_distributed)
DISTRIBUTED = {
    "test_get_rank": "passed",
    "test_barrier_full_group": "passed",
    "test_all_reduce_sum": "passed",
    "test_broadcast": "passed",
    "test_get_rank_size_group": "passed",
    "test_all_gather_coalesced_group": "skipped",  # its ranks exit with TEST_SKIPS["small_worldsize"]
}


def test_distributed_suite_runs_warm(pytester: pytest.Pytester) -> None:
    root = Path(__file__).resolve().parent.parent
    pytester.syspathinsert(root)
    suite = root / "benchmarks" / "torch_distributed" / "test_distributed_gloo.py"
    ids = [f"{suite}::TestDistBackendWithSpawn::{name}" for name in DISTRIBUTED]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgnb-torch", "-rs", "--junitxml=d.xml", *ids,
                                           timeout=300)
    out = result.stdout.str()
    got = {k.split("::")[1]: v[0] for k, v in verdicts(pytester.path / "d.xml").items()}
    assert {k: got.get(k) for k in DISTRIBUTED} == DISTRIBUTED, out
    assert "left to torch's own spawning" not in out, out  # setUp lists test_ddp_has_finalized: not these
    assert "Skipped due to small world size." in out, out  # torch's reason, from the ranks' exit status


def _ours(ipythondir: Path, but: int) -> dict[int, str]:
    """The processes that run with ``ipythondir`` (a test's own), but ``but``: pid -> command line."""
    import psutil

    found = {}
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != but and p.environ().get("IPYTHONDIR") == str(ipythondir):
                found[p.pid] = " ".join(p.cmdline()[:4])
        except (psutil.Error, OSError):
            pass
    return found


def test_kill_9_of_pytest_during_a_continuous_class_leaves_nothing(pytester: pytest.Pytester, tmp_path) -> None:
    import signal
    import subprocess

    import psutil
    from conftest import wait_gone

    ready = tmp_path / "ready"
    ipythondir = tmp_path / "ipython"
    ipythondir.mkdir()
    pytester.makepyfile(test_k=textwrap.dedent(f"""
        import time
        from torch.testing._internal.common_distributed import MultiProcContinuousTest


        class TestSleeps(MultiProcContinuousTest):
            world_size = 2

            @classmethod
            def backend_str(cls):
                return "gloo"

            def test_sleeps(self):
                open({str(ready)!r} + str(self.rank), "w").close()
                time.sleep(120)
    """))
    temp = tmp_path / "temp"  # the run's temporary files: the class's FileStore among them
    temp.mkdir()
    env = {**os.environ, "IPYTHONDIR": str(ipythondir), "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pgnb-torch",
                             "test_k.py"], cwd=pytester.path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ours: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not all(os.path.exists(f"{ready}{r}") for r in (0, 1)) and time.monotonic() < deadline:
            assert proc.poll() is None, "the inner pytest ended early"
            time.sleep(0.1)
        assert time.monotonic() < deadline, "the test never started on both ranks"
        ours = set(_ours(ipythondir, proc.pid))  # controller, zygote, engines, nannies, reaper
        assert len(ours) >= 5, ours
        # the zygotes were forked from pytest itself (pgnb.procs.prefork): the world's, and the spare one
        forked = [p for p in ours if psutil.Process(p).ppid() == proc.pid
                  and psutil.Process(p).cmdline() == psutil.Process(proc.pid).cmdline()]
        assert len(forked) == 2, [(p, psutil.Process(p).cmdline()[:3]) for p in ours]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    left = wait_gone(ours, timeout=10)
    assert not left, [(p, psutil.Process(p).cmdline()[:3]) for p in left]
    deadline = time.monotonic() + 5  # the reaper removes the world's files once its processes are gone
    while (files := [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor")]) and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    assert not files, files  # torch's own compile cache (torchinductor_USER) is torch's, shared by every run


def _run_with_pgnb_torch(path: Path, ipythondir: Path, *args: str) -> Any:
    import subprocess

    ipythondir.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pgnb-torch", *args],
                            cwd=path, env={**os.environ, "IPYTHONDIR": str(ipythondir)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_world_takes_the_controller_started_while_pytest_collects(pytester: pytest.Pytester, tmp_path) -> None:
    pytester.makepyfile(test_h=textwrap.dedent("""
        import torch
        import torch.distributed as dist
        from torch.testing._internal.common_distributed import MultiProcContinuousTest


        class TestSum(MultiProcContinuousTest):
            world_size = 2

            @classmethod
            def backend_str(cls):
                return "gloo"

            def test_sum(self):
                t = torch.ones(1)
                dist.all_reduce(t)
                assert t.item() == 2
    """))
    proc = _run_with_pgnb_torch(pytester.path, tmp_path / "ipython", "-v", "test_h.py")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "1 passed" in out, out
    assert "pgnb: 2 zygotes forked from pytest" in out, out  # the controller started before left no thread
    assert "pgnb: the world took the controller started while pytest collected" in out, out
    assert not _ours(tmp_path / "ipython", proc.pid), "left running"


def test_kill_9_of_pytest_while_it_collects_stops_the_controller_started_ahead(pytester: pytest.Pytester,
                                                                               tmp_path) -> None:
    import signal

    from conftest import wait_gone

    collecting = tmp_path / "collecting"
    pytester.makepyfile(test_slow=textwrap.dedent(f"""
        import time
        from torch.testing._internal.common_distributed import MultiProcContinuousTest

        open({str(collecting)!r}, "w").close()
        time.sleep(120)  # still collecting when pytest is killed


        class TestNever(MultiProcContinuousTest):
            world_size = 2

            def test_never(self):
                pass
    """))
    proc = _run_with_pgnb_torch(pytester.path, tmp_path / "ipython", "-q", "test_slow.py")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (collecting.exists() and any(
                "ipyparallel.controller" in cmd or "ipcontroller" in cmd
                for cmd in _ours(tmp_path / "ipython", proc.pid).values())):
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        ours = _ours(tmp_path / "ipython", proc.pid)
        assert collecting.exists() and len(ours) >= 2, ours  # the controller (its processes) and the reaper
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    left = wait_gone(set(ours), timeout=10)
    assert not left, {p: ours[p] for p in left}


def test_the_zygote_imports_the_harness_and_pgnbs_rank_side_once(pytester: pytest.Pytester) -> None:
    """What the collected classes come from, and pgnb's side of a test on the ranks, are imported by the world's
    zygote before it forks the ranks: not by every rank at its first test."""
    from torch.testing._internal.common_distributed import MultiProcContinuousTest

    from pgnb.core import cluster
    from pgnb.testing import torch_suites

    class TestCollected(MultiProcContinuousTest):
        world_size = 2

    config = pytester.parseconfig("--pgnb-torch")
    try:
        torch_suites.collected(config, [2], [TestCollected])
        assert "pgnb.rank.torch_continuous" in cluster.ZYGOTE_PRELOAD, cluster.ZYGOTE_PRELOAD
        assert "torch.testing._internal.common_distributed" in cluster.ZYGOTE_PRELOAD, cluster.ZYGOTE_PRELOAD
        torch_suites.collected(config, [], [])  # nothing of torch's collected: nothing to import for it
        assert cluster.ZYGOTE_PRELOAD.count("pgnb.rank.torch_continuous") == 1
    finally:
        cluster.ZYGOTE_PRELOAD.clear()
