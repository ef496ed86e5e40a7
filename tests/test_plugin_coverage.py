"""``pytest --cov`` (pytest-cov) counts the lines the ranks ran: marker tests and ``--pgnb-torch`` alike.

Inner sessions measure a small package whose functions run only on the ranks,
on worlds of 2: world tests (a ring all-reduce with isend/recv; a function a
test calls before it hangs, so its world is retired; one called on the world
that replaces it), then ``--pgnb-torch`` (a function a torch
``MultiProcessTestCase`` test calls, and one a ``pgnb_world`` test runs on the
ranks, beside the ring's world test). Then
``--no-cov`` (and, marked slow, a run without pytest-cov: the same path here):
nothing of coverage is imported, here or on the ranks.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import types
import warnings

import coverage
import pytest

pytest_plugins = ["pytester"]

RINGLIB = textwrap.dedent('''
    """Distributed helpers: every function below runs on the ranks only."""
    import torch
    import torch.distributed as dist


    def ring_all_reduce(t):
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        total, send, recv = t.clone(), t.clone(), torch.empty_like(t)
        for _ in range(world - 1):
            req = dist.isend(send, right)  # TAG ring
            dist.recv(recv, left)  # TAG ring
            req.wait()  # TAG ring
            total += recv  # TAG ring
            send = recv.clone()  # TAG ring
        return total  # TAG ring


    def before_the_hang(rank):
        return rank + 1  # TAG retired


    def on_the_new_world(rank):
        return rank * 2  # TAG new world


    def from_torch_suite(rank):
        return rank - 1  # TAG torch


    def from_the_driver():
        return dist.get_rank()  # TAG driver


    def never_called():
        return "never"  # TAG never
''')

TESTS = textwrap.dedent('''
    import time

    import pytest
    import torch
    import torch.distributed as dist

    import ringlib


    @pytest.mark.world(2)
    def test_ring(rank, world_size):
        t = torch.ones(3) * (rank + 1)
        assert ringlib.ring_all_reduce(t).tolist() == [3.0] * 3


    @pytest.mark.world(2, timeout=2)
    def test_hangs(rank):
        ringlib.before_the_hang(rank)
        if rank == 0:
            time.sleep(30)
        dist.barrier()


    @pytest.mark.world(2)
    def test_after_the_hang(rank):
        assert ringlib.on_the_new_world(rank) == 2 * rank


    @pytest.mark.world(2)
    def test_drives_the_world(pgnb_world):
        assert pgnb_world.run(ringlib.from_the_driver) == [0, 1]


''')

#: --no-cov, and a run without pytest-cov: nothing of coverage on the ranks, nothing of pgnb's for it here.
NOTHING = textwrap.dedent('''
    import sys

    import pytest


    @pytest.mark.world(2)
    def test_ranks_import_no_coverage(rank):
        assert "coverage" not in sys.modules, "the ranks imported coverage"


    def test_pytest_imports_no_coverage():  # (coverage itself may be here: nbval's plugin imports it)
        assert "pgnb.testing.coverage" not in sys.modules
''')

TORCH_SUITE = textwrap.dedent('''
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiProcessTestCase

    import ringlib


    class TestSuite(MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_calls_ringlib(self):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
            self.assertEqual(ringlib.from_torch_suite(self.rank), self.rank - 1)
            dist.destroy_process_group()
''')


def _tagged(tag: str) -> set[int]:
    return {i for i, line in enumerate(RINGLIB.splitlines(), 1) if line.endswith(f"# TAG {tag}")}


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.mkpydir("ringlib").joinpath("__init__.py").write_text(RINGLIB)
    pytester.makepyfile(test_ring=TESTS, test_torch_ring=TORCH_SUITE, test_nothing=NOTHING)
    pytester.syspathinsert()
    return pytester


def _measured(project: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, set[int], set[int]]:
    """An inner ``pytest --cov=ringlib`` run: its result, and ringlib's executed and missing lines."""
    t0 = time.monotonic()
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cov=ringlib", "--cov-report=json:cov.json", "--cov-report=term-missing",
        "-rA", *args, timeout=240)
    print(f"\ninner session with --cov {' '.join(args)}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    out = result.stdout.str()
    assert "Coverage JSON written" in out and "RankCoverageWarning" not in out, out
    assert not list(project.path.glob(".coverage.*")), "a rank's data file was left uncombined"
    (data,) = json.loads((project.path / "cov.json").read_text())["files"].values()
    return result, set(data["executed_lines"]), set(data["missing_lines"])


@pytest.mark.integration
def test_cov_reports_what_the_ranks_ran(project: pytest.Pytester) -> None:
    result, executed, missing = _measured(project, "--cov-context=test", "test_ring.py::test_ring",
                                          "test_ring.py::test_hangs", "test_ring.py::test_after_the_hang")
    out = result.stdout.str()
    result.assert_outcomes(passed=2, failed=1)
    assert "FAILED test_ring.py::test_hangs" in out, out
    # the ring all-reduce on a warm world; a world retired after a hang saved its lines before it stopped;
    # the world that replaced it
    for tag in ("ring", "retired", "new world"):
        assert _tagged(tag) <= executed, (tag, _tagged(tag) - executed, out)
    # lines no rank ran stay missed
    assert _tagged("never") | _tagged("torch") | _tagged("driver") <= missing, (executed, out)
    # --cov-context=test: a rank's lines carry the test's label, as pytest-cov labels its own process's
    data = coverage.CoverageData(basename=str(project.path / ".coverage"))
    data.read()
    (path,) = data.measured_files()
    by_line = data.contexts_by_lineno(path)
    assert {c for n in _tagged("ring") for c in by_line[n]} == {"test_ring.py::test_ring|run"}, by_line
    assert {c for n in _tagged("new world") for c in by_line[n]} == {"test_ring.py::test_after_the_hang|run"}


@pytest.mark.integration
def test_cov_under_pgnb_torch(project: pytest.Pytester) -> None:
    """torch's own harness on the ranks (``--pgnb-torch``, in the engine's own thread), a world test, and a test
    that drives the world from the pytest process (``pgnb_world.run``, the engine's own thread too), on one world."""
    result, executed, missing = _measured(project, "--pgnb-torch", "test_ring.py::test_ring",
                                          "test_ring.py::test_drives_the_world", "test_torch_ring.py")
    result.assert_outcomes(passed=3)
    for tag in ("ring", "torch", "driver"):
        assert _tagged(tag) <= executed, (tag, _tagged(tag) - executed, result.stdout.str())
    assert _tagged("never") <= missing


@pytest.mark.integration
@pytest.mark.parametrize("off", [["--cov=ringlib", "--no-cov"],
                                 pytest.param(["-p", "no:pytest_cov"], marks=pytest.mark.slow)],
                         ids=["no-cov", "without"])
def test_no_cov_imports_nothing(project: pytest.Pytester, off: list[str]) -> None:
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", *off, "test_nothing.py", timeout=120)
    result.assert_outcomes(passed=2)
    assert not list(project.path.glob(".coverage*"))


def test_ranks_that_cannot_measure_say_why_in_one_line() -> None:
    """A world whose ranks cannot start coverage (e.g. not installed there): one warning line, no failure."""
    from pgnb.errors import RankError
    from pgnb.testing.coverage import RankCoverageWarning, start

    def run(*args: object, **kwargs: object) -> list[object]:
        raise RankError("rank 1 failed: ModuleNotFoundError: No module named 'coverage'\n  File ...")

    sb = types.SimpleNamespace(run=run, spec=types.SimpleNamespace(world=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start(sb, {"source": None, "branch": None, "config_file": ".coveragerc", "data_file": "/x/.coverage",
                   "topdir": "/x", "contexts": False, "main_thread": False})
    (w,) = caught
    assert w.category is RankCoverageWarning
    assert str(w.message) == ("pytest-cov cannot measure the ranks of a world of 2 (their lines count as not run): "
                              "rank 1 failed: ModuleNotFoundError: No module named 'coverage'")
