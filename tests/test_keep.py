"""``pytest --pgnb-keep``: a kept pytest process per project, its worlds warm between runs, the code as it is now.

One project, run from the command line as a developer would (each run a pytest process of its own), in
one test: the runs share the keeper's start (torch imported once) and its world of 2.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_gone

pytestmark = pytest.mark.integration

TEST = '''
import os, time
import pytest
import helper

VALUE = {value}
OUT = os.path.join(os.path.dirname(__file__), "out")


@pytest.mark.world(2, timeout=60)
def test_value(rank):
    open(os.path.join(OUT, f"rank{{rank}}"), "w").write(f"{{os.getpid()}} {{VALUE}} {{helper.HELPED}}")
    assert VALUE == 1


def test_plain():  # no world: what a run that is not handed over runs here, quickly
    pass


@pytest.mark.world(2, timeout=60)
def test_sleeps(rank):
    if os.path.exists(os.path.join(OUT, "sleep")):
        open(os.path.join(OUT, f"sleeping{{rank}}"), "w").close()
        time.sleep(60)
'''


CONFTEST = """
import os, threading
if os.environ.get("START_A_THREAD"):  # pytest with a thread of the project's: no process is forked from it
    threading.Thread(target=threading.Event().wait, daemon=True).start()
"""


def write(project: Path, value: int, helped: str = "a") -> None:
    (project / "test_kept.py").write_text(TEST.format(value=value))
    (project / "helper.py").write_text(f"HELPED = {helped!r}\n")
    (project / "conftest.py").write_text(CONFTEST)


def start(project: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pgnb-keep", *args],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(project: Path, env: dict[str, str], *args: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    proc = start(project, env, *args)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err, time.monotonic() - t0


def ranks(project: Path) -> list[list[str]]:
    return [(project / "out" / f"rank{r}").read_text().split() for r in (0, 1)]


def keeper_pid(text: str) -> int:
    found = re.search(r"kept process (\d+)", text)
    assert found, text
    return int(found.group(1))


def started_pid(err: str) -> int:
    found = re.search(r"the kept process \(pid (\d+)\) warms up", err)
    assert found, err
    return int(found.group(1))


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def test_runs_share_a_kept_process_and_its_world_and_see_each_edit(tmp_path):
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\npgnb_keep_idle = 120\n")
    # $XDG_RUNTIME_DIR too deep for a Unix socket's path (as pytest's tmp_path under xdist is): the sockets
    # go to the temporary folder instead, here a short one of this test's own
    runtime = Path(tempfile.mkdtemp(prefix="pgnb-k-", dir="/tmp"))
    deep = tmp_path / ("d" * 60) / "run"
    deep.mkdir(parents=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(deep), "TMPDIR": str(runtime),
           "IPYTHONDIR": str(tmp_path / "ipython")}
    env.pop("PYTEST_ADDOPTS", None)
    write(project, 1)
    keepers: list[int] = []
    try:
        # the first run is a cold one, here; when it ends, the kept process starts (and its world of 2)
        code, out, err, first = run(project, env, "-k", "test_value")
        assert code == 0, out + err
        assert "nothing kept for this project yet: this run runs here" in err, err
        keepers.append(started_pid(err))
        assert "kept process" not in out, out
        # forked from that run once it had collected (pytest, torch, its plugins imported), not started afresh
        assert "pytest" in psutil.Process(keepers[0]).cmdline(), psutil.Process(keepers[0]).cmdline()
        folder = runtime / f"pgnb-keep-{os.getuid()}"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # its user's only

        # edited: a module the test imports is new, here and on the ranks
        write(project, 1, helped="b")
        code, out, err, second = run(project, env, "-k", "test_value")
        assert code == 0, out + err
        assert keeper_pid(out) == keepers[0] and "run 1;" in out, out
        before = ranks(project)
        assert [r[1:] for r in before] == [["1", "b"]] * 2

        # edited again, the test module itself: the same kept process and the same ranks (its world kept)
        write(project, 2, helped="c")
        code, out, err, third = run(project, env, "-k", "test_value")
        assert code == 1, out + err
        assert "assert 2 == 1" in out, out
        assert keeper_pid(out) == keepers[0] and "run 2;" in out, out
        after = ranks(project)
        assert [r[1:] for r in after] == [["2", "c"]] * 2
        assert [r[0] for r in after] == [r[0] for r in before], "the world was not kept"
        print(f"first run {first:.1f} s (cold), then {second:.1f} s and {third:.1f} s in the kept process")
        write(project, 1)

        # one run at a time: a second client while a run sleeps runs in its own process
        (project / "out" / "sleep").touch()
        sleeper = start(project, env, "-k", "test_sleeps")
        wait_for(project / "out" / "sleeping0", sleeper)
        code, out, err, _ = run(project, env, "-k", "test_plain")
        assert "the kept process is running another run" in err, err
        assert code == 0 and "kept process" not in out, out + err

        # the sleeping run's client is killed: the keeper interrupts that run and takes the next
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait(10)
        (project / "out" / "sleep").unlink()
        code, out, err, _ = run(project, env, "-k", "test_value")
        assert code == 0, out + err
        assert keeper_pid(out + err) == keepers[0] and "run 4;" in out, out + err

        # the keeper killed: its ranks go (their reaper); the next run is a cold one, which starts a new keeper
        rank_pids = [int(r[0]) for r in ranks(project)]
        os.kill(keepers[0], signal.SIGKILL)
        assert wait_gone([keepers[0], *rank_pids], timeout=10) == []
        (project / "pytest.ini").write_text("[pytest]\npgnb_keep_idle = 3\n")
        # a cold run with a thread running cannot fork one: it starts it afresh, and says so with -v
        code, out, err, _ = run(project, {**env, "START_A_THREAD": "1"}, "-k", "test_value", "-v")
        assert code == 0, out + err
        assert "nothing kept for this project yet" in err, err
        assert "the kept process is not forked from this run (2 Python threads)" in err, err
        keepers.append(started_pid(err))
        assert "pgnb.testing.keeper" in psutil.Process(keepers[1]).cmdline(), psutil.Process(keepers[1]).cmdline()

        # left idle, it ends by itself, stopping the world it started, and removes its socket
        assert wait_gone([keepers[1]], timeout=60) == []
        assert list(folder.glob("*.sock")) == []

        # a run that cannot be handed over says why in one line and runs here
        code, out, err, _ = run(project, env, "-k", "test_plain", "-p", "xdist", "-n", "1")
        assert "pytest-xdist's workers each keep their own worlds" in err, err
        assert code == 0, out + err
    finally:
        for pid in keepers:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGTERM)
        wait_gone(keepers, timeout=20)
        shutil.rmtree(runtime, ignore_errors=True)
    assert not (deep / f"pgnb-keep-{os.getuid()}").exists()


def test_the_option_is_documented():
    docs = (Path(__file__).parent.parent / "docs" / "testing_distributed_code.md").read_text()
    assert "--pgnb-keep" in docs and "pgnb_keep_idle" in docs
