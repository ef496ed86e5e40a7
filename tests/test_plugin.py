"""pgnb's pytest plugin on real engines: each inner pytest session runs in a process of its own.

The inner sessions share their worlds: one session holds most cases (a world of
2 and one of 4 start once), ordered so that the cases that replace a world come
last. Timing figures (the per-test overhead) are printed, not asserted tightly:
this machine is loaded.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import wait_gone

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

#: Trivial world-4 tests the overhead is measured on (the median of their call times).
TRIVIAL = 30

MAIN = textwrap.dedent('''
    import os
    import sys
    import pytest
    import torch
    import torch.distributed as dist


    def doubled(x):  # a helper of the test's own module, used on the ranks
        return 2 * x


    @pytest.fixture
    def table():
        return {"lr": 0.5}  # made in the pytest process, sent to the ranks


    @pytest.mark.world(2)
    def test_all_reduce_2(rank, world_size):
        t = torch.ones(2) * rank
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0] and world_size == 2


    @pytest.mark.world(4)
    def test_all_reduce_4(rank, world_size, device):
        t = torch.ones(2, device=device) * rank
        dist.all_reduce(t)
        assert t.tolist() == [6.0, 6.0] and doubled(world_size) == 8


    @pytest.mark.world(4)
    @pytest.mark.parametrize("i", range(TRIVIAL))
    def test_trivial(i, rank):
        pass


    @pytest.mark.world(2)
    @pytest.mark.parametrize("n", [1, 3])
    def test_values(rank, n, table, tmp_path):
        (tmp_path / f"rank{rank}").write_text(str(n * table["lr"]))
        dist.barrier()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]  # one directory for all ranks


    @pytest.mark.world(2)
    def test_seeded(rank):
        x = torch.rand(3)
        got = [torch.zeros(3) for _ in range(2)]
        dist.all_gather(got, x)
        assert torch.equal(got[0], got[1])  # every rank reseeded identically


    @pytest.mark.world(2)
    def test_leaks_a_group(rank):
        dist.new_group([0, 1])


    @pytest.mark.world(2)
    def test_sets_an_env_var(rank):
        os.environ["PGNB_LEAKED"] = "1"
        torch.set_default_dtype(torch.float64)
        sys.path.append("/pgnb-leaked-path")


    @pytest.mark.world(2)
    def test_after_the_leaks(rank):
        assert "PGNB_LEAKED" not in os.environ
        assert torch.get_default_dtype() == torch.float32
        assert "/pgnb-leaked-path" not in sys.path
        dist.all_reduce(torch.ones(1))


    @pytest.mark.world(2)
    def test_skips_on_one_rank(rank):
        if rank == 1:
            pytest.skip("no luck on rank 1")


    @pytest.mark.world(2)
    def test_skips_everywhere(rank):
        pytest.skip("not today")


    @pytest.mark.world(2)
    def test_drives_the_world(pgnb_world):
        assert pgnb_world.run(lambda: __import__("torch.distributed").distributed.get_rank()) == [0, 1]


    @pytest.mark.world(2, timeout=2)
    def test_hangs(rank):
        if rank == 0:
            dist.recv(torch.zeros(1), src=1)  # rank 1 never sends
        print("rank", rank, "is done")


    @pytest.mark.world(2)
    @pytest.mark.timeout(3)  # pytest-timeout's: pgnb's own deadline comes first, with its report
    def test_hangs_under_pytest_timeout(rank):
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)


    @pytest.mark.world(2)
    def test_after_the_hang(rank):
        dist.all_reduce(torch.ones(1))


    def _pid_file(when, rank):  # beside this file: the outer test reads which process each rank was
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"pid-{when}-{rank}")


    @pytest.mark.world(2)
    def test_before_a_rank_dies(rank):
        with open(_pid_file("before", rank), "w") as f:
            f.write(str(os.getpid()))


    @pytest.mark.world(2)
    def test_a_rank_dies(rank):
        if rank == 1:
            os.kill(os.getpid(), 9)  # as the out-of-memory killer would


    @pytest.mark.world(2)
    def test_after_a_rank_died(rank):
        dist.all_reduce(torch.ones(1))
        with open(_pid_file("after", rank), "w") as f:
            f.write(str(os.getpid()))

''').replace("TRIVIAL", str(TRIVIAL))

BAD = textwrap.dedent('''
    import unittest
    import pytest
    import only_in_the_pytest_process  # the ranks cannot import this module


    @pytest.mark.world(0)
    def test_world_0(rank):
        pass


    @pytest.mark.world(2, backend="bogus")
    def test_unknown_backend(rank):
        pass


    @pytest.mark.world(2, backend="nccl")
    def test_nccl(rank):
        pass


    @pytest.mark.world(2)
    class TestCase(unittest.TestCase):
        def test_method(self):
            pass


    @pytest.mark.world(2)
    def test_not_importable_on_the_ranks(rank):
        pass
''')

MARKED_FIXTURE = textwrap.dedent('''
    import pytest


    @pytest.fixture
    @pytest.mark.world(2)
    def fx():
        return 1


    def test_x(fx):
        pass
''')

CONFTEST = textwrap.dedent('''
    import sys, types
    sys.modules["only_in_the_pytest_process"] = types.ModuleType("only_in_the_pytest_process")
''')


def _run(pytester: pytest.Pytester, *args: str, timeout: float = 240) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)


def _times(junit: str) -> dict[str, float]:
    return {c.get("name", ""): float(c.get("time", "0")) for c in ET.parse(junit).getroot().iter("testcase")}


def _failure(junit: str, name: str) -> str:
    case = next(c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == name)
    failure = case.find("failure")
    return "" if failure is None else (failure.text or "")


def _docs_examples() -> tuple[dict[str, str], str]:
    """The ``# test_*.py`` blocks of docs/testing_distributed_code.md by file name, and its ``text`` block."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "testing_distributed_code.md").read_text()
    files = {}
    for block in re.findall(r"```python\n(.*?)```", page, re.S):
        first = block.split("\n", 1)[0]
        if re.fullmatch(r"# test_\w+\.py", first):
            files[first[2:-3]] = block
    shown = re.search(r"```text\n(.*?)```", page, re.S)
    assert shown is not None
    return files, shown.group(1)


def test_world_tests_in_one_session(pytester: pytest.Pytester) -> None:
    """Most cases in one inner session, so its worlds start once; the docs page's examples run in it as
    written. Files run in the order given: those that replace a world come last."""
    pytester.makepyfile(test_main=MAIN)
    pytester.makepyfile(test_bad=BAD)
    pytester.makepyfile(test_marked_fixture=MARKED_FIXTURE)
    pytester.makeconftest(CONFTEST)
    docs, shown = _docs_examples()
    assert {"test_collectives", "test_fixtures", "test_driver", "test_failing"} <= set(docs)
    pytester.makepyfile(**docs)
    order = [f"{name}.py" for name in docs if name != "test_failing"] + [
        "test_bad.py", "test_marked_fixture.py", "test_main.py", "test_failing.py"]
    junit = str(pytester.path / "junit.xml")
    t0 = time.monotonic()
    result = _run(pytester, "-rA", f"--junitxml={junit}", "--continue-on-collection-errors", *order)
    wall = time.monotonic() - t0
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    times = _times(junit)
    trivial = sorted(times[f"test_trivial[{i}]"] for i in range(1, TRIVIAL))  # the first may wait for the world
    print(f"\ninner session {wall:.1f} s; trivial world-4 test median {statistics.median(trivial) * 1000:.1f} ms "
          f"(min {trivial[0] * 1000:.1f}, max {trivial[-1] * 1000:.1f}); hang {times['test_hangs']:.2f} s; "
          f"after the hang {times['test_after_the_hang']:.2f} s", file=sys.stderr)

    passed = {m.group(1) for m in re.finditer(r"^PASSED test_main.py::(\S+)", out, re.M)}
    assert {"test_all_reduce_2", "test_all_reduce_4", "test_values[1]", "test_values[3]", "test_seeded",
            "test_leaks_a_group", "test_sets_an_env_var", "test_after_the_leaks", "test_drives_the_world",
            "test_after_the_hang", "test_before_a_rank_dies", "test_after_a_rank_died"} <= passed, out
    # failed: the one-rank skip, the two hangs, the rank that dies, the test the ranks cannot import, the docs'
    # example where rank 2 raises; errors: world 0, the unknown backend, the marker on a unittest class, the
    # marker on a fixture
    assert (outcomes.get("failed"), outcomes.get("errors"), outcomes.get("skipped")) == (6, 4, 2), out
    # the docs page's examples: all pass but the failing one, whose report reads as the page shows it
    assert {"test_all_reduce", "test_broadcast[1]", "test_broadcast[8]", "test_shared_directory",
            "test_from_the_driver"} <= {m.group(1) for m in re.finditer(r"^PASSED test_\w+.py::(\S+)", out, re.M)}
    report = _failure(junit, "test_rank_2_raises")
    for line in shown.splitlines():
        if line.strip() != "...":
            assert line in report.splitlines(), (line, report)
    # leaks: named, undone, never a later test's failure
    assert re.search(r"test_leaks_a_group ranks 0, 1: left 1 process group\(s\) it created.*destroyed them", out)
    assert re.search(r"test_sets_an_env_var ranks 0, 1: changed environment variable\(s\) PGNB_LEAKED", out)
    assert "test_sets_an_env_var ranks 0, 1: changed torch's default dtype (to float64)" in out
    assert "test_sets_an_env_var ranks 0, 1: changed sys.path (added /pgnb-leaked-path); pgnb put it back" in out
    # a skip everywhere is a skip; on one rank only, an error that says which
    assert re.search(r"SKIPPED \[1\] test_main.py:\d+: not today", out), out
    assert "rank 1 skipped (no luck on rank 1) but rank 0 ran the test: a skip must agree on every rank" in out
    # the hang: its timeout, every rank's stack, the world replaced, the next test passes
    hang = _failure(junit, "test_hangs")
    assert "the test ran past its 2 s timeout on rank 0; pgnb replaced rank 0 in place" in hang, hang
    assert "dist.recv(torch.zeros(1), src=1)" in hang and "rank 1 is done" in hang, hang
    assert times["test_hangs"] <= 2 + 3, times
    under = _failure(junit, "test_hangs_under_pytest_timeout")
    assert under.startswith("the test ran past its 1.5 s timeout on rank 1 "
                            "(pgnb's, 1.5 s before pytest-timeout's 3 s); pgnb replaced rank 1 in place"), under
    # a rank killed in a test costs only that rank: the next test runs on rank 0's same process, rank 1's new one
    died = _failure(junit, "test_a_rank_dies")
    assert died.startswith("rank 1 failed first: ") and "SIGKILL" in died.splitlines()[0], died
    pids = {name: (pytester.path / f"pid-{name}").read_text()
            for name in ("before-0", "before-1", "after-0", "after-1")}
    assert pids["after-0"] == pids["before-0"] and pids["after-1"] != pids["before-1"], pids
    # (the docs' example) rank 2 first, the others as consequences, each with its own section, in the junit XML
    raised = _failure(junit, "test_rank_2_raises")
    assert raised.startswith("rank 2 failed first: ValueError: rank 2 is broken; ranks 0, 1, 3 failed only "
                             "because of it"), raised
    sections = re.findall(r"^---------- rank (\d): (.*) ----------$", raised, re.M)
    assert [r for r, _ in sections] == ["2", "0", "1", "3"], raised
    assert all("a consequence (rank 2 failed first" in label for _, label in sections[1:]), sections
    assert 'raise ValueError("rank 2 is broken")' in raised and "rank 2 about to fail" in raised
    assert "pgnb/rank" not in raised.split("---------- rank 0")[0]  # rank 2's traceback is the test's own
    # bad input: one line each, at the test, nothing hangs
    assert re.search(r"@pytest.mark.world\(0\): --world must be at least 1, not 0", out), out
    assert re.search(r"@pytest.mark.world\(2, backend='bogus'\): unknown backend 'bogus'", out), out
    assert re.search(r"SKIPPED \[1\] test_bad.py:\d+: backend 'nccl' (is not available|needs)", out), out
    assert "@pytest.mark.world cannot apply to 'test_method'" in out, out
    assert "ERROR test_marked_fixture.py - Failed: Marks cannot be applied to fixtures." in out, out  # pytest's
    assert _failure(junit, "test_not_importable_on_the_ranks").startswith(
        "the test cannot be imported on the ranks: ModuleNotFoundError: No module named "
        "'only_in_the_pytest_process'\n"), out
    # passing tests print nothing (their ranks printed nothing)
    assert "Captured rank" not in out


def test_pdb_on_a_rank_from_the_terminal(pytester: pytest.Pytester) -> None:
    """``breakpoint()`` on rank 1 (with ``-s``) and ``--pdb`` on the rank that raised: pdb in this terminal,
    the other rank waits, and the test's timeout does not count the time at the prompt."""
    pytester.makepyfile(test_d=textwrap.dedent('''
        import time
        import pytest
        import torch.distributed as dist

        @pytest.mark.world(2, timeout=3)
        def test_breakpoint(rank):
            x = 41 + rank
            if rank == 1:
                breakpoint()
            dist.barrier()

        @pytest.mark.world(2, timeout=3)
        def test_post_mortem(rank):
            y = 10 * rank
            if rank == 1:
                raise ValueError("look at y")
            dist.barrier()
    '''))
    answers = b"p x + 1\n!import time; time.sleep(4)\nc\np y\nc\n"  # 4 s at the prompt, past the 3 s timeout
    result = pytester.run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "--pdb", "test_d.py",
                          stdin=answers, timeout=240)
    out = result.stdout.str()
    assert "(Pdb rank 1) 43" in out, out
    assert re.search(r'-> raise ValueError\("look at y"\)\n\(Pdb rank 1\) 10', out), out
    assert "rank 1 failed first: ValueError: look at y; rank 0 failed only because of it" in out
    assert "(Pdb) " not in out  # pytest's own pdb (on the plugin's frames) does not open
    result.assert_outcomes(passed=1, failed=1)


def test_xdist_workers_have_their_own_worlds(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=textwrap.dedent('''
        import os
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.world(1)  # one rank each: two worlds at once, each worker's own (controllers, ports, files)
        @pytest.mark.parametrize("i", range(4))
        def test_all_reduce(i, rank):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 1
    '''))
    result = _run(pytester, "-n", "2", timeout=240)
    result.assert_outcomes(passed=4)


def test_kill_9_of_pytest_leaves_nothing(pytester: pytest.Pytester, tmp_path) -> None:
    import signal
    import subprocess

    import psutil

    ready = tmp_path / "ready"
    ipythondir = tmp_path / "ipython"
    ipythondir.mkdir()
    pytester.makepyfile(test_k=textwrap.dedent(f'''
        import os, time
        import pytest

        @pytest.mark.world(2, timeout=120)
        def test_sleeps(rank):
            open({str(ready)!r} + str(rank), "w").close()
            time.sleep(120)
    '''))
    env = {**os.environ, "IPYTHONDIR": str(ipythondir)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_k.py"],
                            cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not all(os.path.exists(f"{ready}{r}") for r in (0, 1)) and time.monotonic() < deadline:
            assert proc.poll() is None, "the inner pytest ended early"
            time.sleep(0.1)
        assert time.monotonic() < deadline, "the test never started on both ranks"
        ours = _processes_of(ipythondir) - {proc.pid}
        assert len(ours) >= 5, ours  # controller (and its schedulers), zygote, 2 engines, their nannies, reaper
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    left = wait_gone(ours, timeout=10)
    assert not left, [(p, psutil.Process(p).cmdline()[:3]) for p in left]


def _processes_of(ipythondir) -> set[int]:
    """Every process that runs with this IPYTHONDIR (controller, zygote, engines, nannies, reaper)."""
    import psutil

    out = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("IPYTHONDIR") == str(ipythondir):
                out.add(p.pid)
        except (psutil.Error, OSError):
            pass
    return out
